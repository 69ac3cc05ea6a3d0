//! The quota model, pure: what a key's quota says ([`QuotaSpec`]), what one sandbox costs
//! ([`Entry`]), which sandboxes count ([`live`], [`running`]), and the exact bytes the shared
//! Redis keys hold ([`Entry::to_json`], [`limits_json`]), so oka and reference managers can share
//! one Redis.
//!
//! # Rules
//!
//! - A quota is `{"limits": [{dimension, scope, limit}]}`: dimension `sandbox.count`,
//!   `limits.cpu` (millicores) or `limits.memory` (MiB); scope `all` or `running`; `limit >= 0`
//!   (0 is a hard zero). Absent, `null`, `{}` or an empty list: unlimited. A negative limit, a
//!   repeated (dimension, scope), another dimension or scope, or an unknown field: invalid.
//! - A sandbox costs 1 `sandbox.count`, and the sum of its containers' **limits** (CPU in
//!   millicores rounded up, memory in MiB rounded up) in the two other dimensions.
//! - It counts in scope `all` while it is live, and in `running` while it is live and
//!   `spec.paused` is not true. Live: not being deleted, phase neither `Terminating` nor
//!   `Recycling`, and not handed back to its pool (`cleanup` on a sandbox with
//!   `cleanup-enabled`). Failed and Succeeded sandboxes that are not deleted still count.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use oka_api::quantity::{self, Amount, QuantityError, Rounding};
use oka_api::{Sandbox, SandboxPhase, annotations};
use serde::{Deserialize, Serialize};

/// A metered resource axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Dimension {
    /// One per sandbox.
    #[serde(rename = "sandbox.count")]
    SandboxCount,
    /// CPU limits, millicores.
    #[serde(rename = "limits.cpu")]
    LimitsCpu,
    /// Memory limits, MiB.
    #[serde(rename = "limits.memory")]
    LimitsMemory,
}

impl Dimension {
    /// Every dimension, in the order of the Redis sum keys (`KEYS[2..4]` of the scripts).
    pub const ALL: [Dimension; 3] =
        [Dimension::SandboxCount, Dimension::LimitsCpu, Dimension::LimitsMemory];

    /// Its wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::SandboxCount => "sandbox.count",
            Dimension::LimitsCpu => "limits.cpu",
            Dimension::LimitsMemory => "limits.memory",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == text)
    }
}

/// The lifecycle window a limit applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Scope {
    /// Every live sandbox.
    #[serde(rename = "all")]
    All,
    /// Live sandboxes that are not paused.
    #[serde(rename = "running")]
    Running,
}

impl Scope {
    /// Both scopes.
    pub const ALL: [Scope; 2] = [Scope::All, Scope::Running];

    /// Its wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::All => "all",
            Scope::Running => "running",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// One limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaLimit {
    /// What is metered.
    pub dimension: Dimension,
    /// Over which sandboxes.
    pub scope: Scope,
    /// At most this much (never negative).
    pub limit: i64,
}

/// A key's quota, validated; never empty (an empty quota is `None`: unlimited).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaSpec {
    /// The limits, in the order given.
    pub limits: Vec<QuotaLimit>,
}

/// Why a quota is invalid (400 on key create). The texts follow the reference's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidQuota {
    /// Not the JSON shape, or an unknown field.
    #[error("invalid quota spec: unmarshal quota: {0}")]
    Decode(String),
    /// Another dimension.
    #[error("invalid quota spec: unsupported quota dimension {0:?}")]
    Dimension(String),
    /// Another scope.
    #[error("invalid quota spec: unsupported quota scope {0:?}")]
    Scope(String),
    /// A negative limit.
    #[error("invalid quota spec: quota limit must be non-negative")]
    Negative,
    /// The same (dimension, scope) twice.
    #[error("invalid quota spec: duplicate quota limit for dimension {0:?} and scope {1:?}")]
    Duplicate(String, String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireSpec {
    #[serde(default)]
    limits: Option<Vec<WireLimit>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireLimit {
    #[serde(default)]
    dimension: String,
    #[serde(default)]
    scope: String,
    #[serde(default)]
    limit: i64,
}

impl QuotaSpec {
    /// Validates a quota as given in JSON; `Ok(None)` for an unlimited one (absent, `null`,
    /// `{}`, no limits).
    ///
    /// # Errors
    ///
    /// [`InvalidQuota`], whose text names what is wrong.
    pub fn from_json(value: Option<&serde_json::Value>) -> Result<Option<QuotaSpec>, InvalidQuota> {
        let Some(value) = value.filter(|v| !v.is_null()) else { return Ok(None) };
        let wire = WireSpec::deserialize(value).map_err(|e| InvalidQuota::Decode(e.to_string()))?;
        let mut limits: Vec<QuotaLimit> = Vec::new();
        for limit in wire.limits.unwrap_or_default() {
            let dimension = Dimension::parse(&limit.dimension)
                .ok_or_else(|| InvalidQuota::Dimension(limit.dimension.clone()))?;
            let scope = Scope::parse(&limit.scope)
                .ok_or_else(|| InvalidQuota::Scope(limit.scope.clone()))?;
            if limit.limit < 0 {
                return Err(InvalidQuota::Negative);
            }
            if limits.iter().any(|l| l.dimension == dimension && l.scope == scope) {
                return Err(InvalidQuota::Duplicate(limit.dimension, limit.scope));
            }
            limits.push(QuotaLimit { dimension, scope, limit: limit.limit });
        }
        Ok((!limits.is_empty()).then_some(QuotaSpec { limits }))
    }

    /// The limit of (dimension, scope), if any.
    pub fn limit(&self, dimension: Dimension, scope: Scope) -> Option<i64> {
        self.limits.iter().find(|l| l.dimension == dimension && l.scope == scope).map(|l| l.limit)
    }
}

/// The limits as the acquire script's `ARGV[4]`: `{"<dimension>":{"<scope>":limit}}`, keys
/// sorted (Go's `encoding/json` of the reference's map); empty for no limits.
pub fn limits_json(spec: Option<&QuotaSpec>) -> String {
    let Some(spec) = spec.filter(|s| !s.limits.is_empty()) else { return String::new() };
    let mut map: BTreeMap<&str, BTreeMap<&str, i64>> = BTreeMap::new();
    for limit in &spec.limits {
        map.entry(limit.dimension.as_str()).or_default().insert(limit.scope.as_str(), limit.limit);
    }
    serde_json::to_string(&map).unwrap_or_default()
}

/// What one sandbox costs, and in which conditional scopes it counts (`all` is implicit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Entry {
    /// CPU limits, millicores.
    pub cpu_milli: i64,
    /// Memory limits, MiB.
    pub memory_mib: i64,
    /// Whether it counts in scope `running`.
    pub running: bool,
}

impl Entry {
    /// Its amount in `dimension`: 1 for the count.
    pub fn amount(&self, dimension: Dimension) -> i64 {
        match dimension {
            Dimension::SandboxCount => 1,
            Dimension::LimitsCpu => self.cpu_milli,
            Dimension::LimitsMemory => self.memory_mib,
        }
    }

    /// Whether it counts in `scope`.
    pub fn counts_in(&self, scope: Scope) -> bool {
        match scope {
            Scope::All => true,
            Scope::Running => self.running,
        }
    }

    /// The canonical JSON the Redis hash `q:live:{K}` holds, byte for byte what the reference
    /// writes: `{"d":{...},"s":[...]}`, zero amounts left out of `d` (keys sorted), `s` the
    /// conditional scopes sorted, `{}` and `[]` when empty.
    pub fn to_json(&self) -> String {
        let mut d = Vec::new();
        if self.cpu_milli != 0 {
            d.push(format!("\"limits.cpu\":{}", self.cpu_milli));
        }
        if self.memory_mib != 0 {
            d.push(format!("\"limits.memory\":{}", self.memory_mib));
        }
        let s = if self.running { "\"running\"" } else { "" };
        format!("{{\"d\":{{{}}},\"s\":[{s}]}}", d.join(","))
    }

    /// Reads an entry as the reference does: unknown dimensions and scopes ignored, `all`
    /// implicit.
    ///
    /// # Errors
    ///
    /// The JSON error when `raw` is not an entry.
    pub fn from_json(raw: &str) -> Result<Entry, serde_json::Error> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            d: Option<BTreeMap<String, i64>>,
            #[serde(default)]
            s: Option<Vec<String>>,
        }
        let wire: Wire = serde_json::from_str(raw)?;
        let d = wire.d.unwrap_or_default();
        Ok(Entry {
            cpu_milli: d.get("limits.cpu").copied().unwrap_or(0),
            memory_mib: d.get("limits.memory").copied().unwrap_or(0),
            running: wire.s.unwrap_or_default().iter().any(|s| s == "running"),
        })
    }
}

/// What a sandbox costs besides the count: the sum of its containers' limits (CPU millicores
/// rounded up, memory MiB rounded up), from its pod template (its own or its
/// SandboxTemplate's). No template or no limits: 0.
pub fn footprint(template: Option<&PodTemplateSpec>) -> (i64, i64) {
    let containers = template.and_then(|t| t.spec.as_ref()).map(|s| s.containers.as_slice());
    let mut cpu = 0i64;
    let mut memory = 0i64;
    for container in containers.unwrap_or_default() {
        let limits = container.resources.as_ref().and_then(|r| r.limits.as_ref());
        // Rounded up; a limit that does not parse, is negative or does not fit counts as 0.
        let get = |name: &str, unit_of: fn(&Amount) -> Result<u64, QuantityError>| {
            limits
                .and_then(|l| l.get(name))
                .and_then(|q| quantity::parse(&q.0).ok())
                .and_then(|q| unit_of(&q).ok())
                .map_or(0, |v| i64::try_from(v).unwrap_or(i64::MAX))
        };
        cpu = cpu.saturating_add(get("cpu", |q| q.millis(Rounding::Up)));
        memory = memory.saturating_add(get("memory", |q| {
            q.in_units_of(crate::api::models::MIB, Rounding::Up)
        }));
    }
    (cpu, memory)
}

/// Whether `sandbox` counts against its owner's quota at all (see the module rules).
pub fn live(sandbox: &Sandbox) -> bool {
    sandbox.metadata.deletion_timestamp.is_none()
        && !matches!(sandbox.phase(), Some(SandboxPhase::Terminating | SandboxPhase::Recycling))
        && !oka_api::recycle_requested(sandbox)
}

/// Whether `sandbox` counts in scope `running`: live and not paused.
pub fn running(sandbox: &Sandbox) -> bool {
    live(sandbox) && !sandbox.is_paused()
}

/// (owner, lock) of a sandbox an API key claimed: annotations `agents.kruise.io/owner` and
/// `agents.kruise.io/lock`, both non-empty.
pub fn owner_and_lock(sandbox: &Sandbox) -> Option<(&str, &str)> {
    let notes = sandbox.metadata.annotations.as_ref()?;
    let owner = notes.get(annotations::OWNER).filter(|o| !o.is_empty())?;
    let lock = notes.get(annotations::LOCK).filter(|l| !l.is_empty())?;
    Some((owner, lock))
}

/// The entry of `sandbox` given its footprint `(cpu, memory)`.
pub fn entry_of(sandbox: &Sandbox, (cpu_milli, memory_mib): (i64, i64)) -> Entry {
    Entry { cpu_milli, memory_mib, running: running(sandbox) }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn quotas_validate_as_the_reference() {
        assert_eq!(QuotaSpec::from_json(None), Ok(None));
        assert_eq!(QuotaSpec::from_json(Some(&json!(null))), Ok(None));
        assert_eq!(QuotaSpec::from_json(Some(&json!({}))), Ok(None));
        assert_eq!(QuotaSpec::from_json(Some(&json!({"limits": []}))), Ok(None));
        let spec = QuotaSpec::from_json(Some(&json!({"limits": [
            {"dimension": "sandbox.count", "scope": "all", "limit": 0},
            {"dimension": "limits.cpu", "scope": "running", "limit": 2000},
        ]})))
        .unwrap()
        .unwrap();
        assert_eq!(spec.limit(Dimension::SandboxCount, Scope::All), Some(0));
        assert_eq!(spec.limit(Dimension::LimitsCpu, Scope::Running), Some(2000));
        assert_eq!(spec.limit(Dimension::LimitsCpu, Scope::All), None);
        let bad = |v: serde_json::Value| QuotaSpec::from_json(Some(&v)).unwrap_err().to_string();
        let one = |d: &str, s: &str, l: i64| json!({"limits": [{"dimension": d, "scope": s, "limit": l}]});
        assert!(bad(one("gpu", "all", 1)).contains("dimension"));
        assert!(bad(one("sandbox.count", "paused", 1)).contains("scope"));
        assert!(bad(one("sandbox.count", "all", -1)).contains("limit"));
        assert!(bad(json!({"limits": [], "extra": 1})).contains("unknown"));
        assert!(bad(json!({"limits": [{"dimension": "sandbox.count", "scope": "all", "limit": 1, "x": 1}]})).contains("unknown"));
        let twice = json!({"limits": [
            {"dimension": "sandbox.count", "scope": "all", "limit": 1},
            {"dimension": "sandbox.count", "scope": "all", "limit": 2},
        ]});
        assert!(bad(twice).contains("duplicate"));
    }

    #[test]
    fn wire_json_is_byte_compatible() {
        assert_eq!(Entry::default().to_json(), r#"{"d":{},"s":[]}"#);
        let e = Entry { cpu_milli: 500, memory_mib: 512, running: true };
        assert_eq!(e.to_json(), r#"{"d":{"limits.cpu":500,"limits.memory":512},"s":["running"]}"#);
        let e2 = Entry { cpu_milli: 0, memory_mib: 64, running: false };
        assert_eq!(e2.to_json(), r#"{"d":{"limits.memory":64},"s":[]}"#);
        for entry in [Entry::default(), e, e2] {
            assert_eq!(Entry::from_json(&entry.to_json()).unwrap(), entry);
        }
        // The reference's decoder ignores what it does not know.
        let odd = r#"{"d":{"limits.cpu":3,"gpu":9},"s":["running","all","x"]}"#;
        assert_eq!(
            Entry::from_json(odd).unwrap(),
            Entry { cpu_milli: 3, memory_mib: 0, running: true }
        );
        let spec = QuotaSpec {
            limits: vec![
                QuotaLimit { dimension: Dimension::SandboxCount, scope: Scope::Running, limit: 2 },
                QuotaLimit { dimension: Dimension::LimitsMemory, scope: Scope::All, limit: 1024 },
                QuotaLimit { dimension: Dimension::SandboxCount, scope: Scope::All, limit: 5 },
            ],
        };
        assert_eq!(
            limits_json(Some(&spec)),
            r#"{"limits.memory":{"all":1024},"sandbox.count":{"all":5,"running":2}}"#
        );
        assert_eq!(limits_json(None), "");
    }

    #[test]
    fn footprint_sums_container_limits_rounded_up() {
        let template: PodTemplateSpec = serde_json::from_value(json!({"spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "250m", "memory": "100Mi"}, "requests": {"cpu": "8"}}},
            {"name": "b", "resources": {"limits": {"cpu": "0.0015", "memory": "1000000"}}},
            {"name": "c"},
        ]}}))
        .unwrap();
        assert_eq!(footprint(Some(&template)), (252, 101));
        assert_eq!(footprint(None), (0, 0));
    }

    #[test]
    fn live_and_running_follow_the_seed() {
        use oka_api::SandboxPhase::*;
        let base = || Sandbox::test().name("s").phase(Running).ready();
        assert!(live(&base().build()) && running(&base().build()));
        let paused = base().build();
        let mut paused = paused;
        paused.spec.paused = Some(true);
        assert!(live(&paused) && !running(&paused));
        assert!(!live(&base().deleting().build()));
        assert!(!live(&base().phase(Recycling).build()));
        assert!(!live(&base().phase(Terminating).build()));
        assert!(live(&base().phase(Failed).build()), "failed but kept still counts");
        let handed_back = base()
            .annotation(annotations::CLEANUP, "true")
            .annotation(annotations::CLEANUP_ENABLED, "true")
            .build();
        assert!(!live(&handed_back));
        assert!(live(&base().annotation(annotations::CLEANUP, "true").build()));
    }
}
