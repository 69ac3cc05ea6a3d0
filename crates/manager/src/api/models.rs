//! The JSON models of the E2B API, with the reference's field names and rules
//! (`upstream-dataplane-e2b.md` §3.3, `e2b-protocol.md` §2.3).

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ResourceRequirements;
use oka_api::quantity::{self, Rounding};
use oka_api::{Sandbox, SandboxState, StateReason, annotations, labels, sandbox_state};
use serde::{Deserialize, Serialize};

use crate::index::sandbox_id;

/// `endAt` of a sandbox that never times out (Go's zero time).
pub const NEVER: &str = "0001-01-01T00:00:00Z";
/// The metadata key the response always carries: `<namespace>/<name>` of the Sandbox object.
pub const SANDBOX_RESOURCE: &str = "e2b.agents.kruise.io/sandbox-resource";
/// The Sandbox annotation holding the E2B network rules in force (`{"allowOut", "denyOut"}`
/// JSON), written by a create or `PUT /sandboxes/{id}/network` with rules, shown as `network`.
pub const NETWORK_RULES: &str = "e2b.agents.kruise.io/network";

/// E2B's `network` of a sandbox: the rules in force.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkRules {
    /// Allowed destinations.
    #[serde(rename = "allowOut", default, skip_serializing_if = "Vec::is_empty")]
    pub allow_out: Vec<String>,
    /// Denied destinations.
    #[serde(rename = "denyOut", default, skip_serializing_if = "Vec::is_empty")]
    pub deny_out: Vec<String>,
}

/// `POST /sandboxes` and `POST /v2/sandboxes` (`NewSandbox` / `NewSandboxV2`). What oka cannot
/// honour yet (`mcp`, `iam`, `volumeMounts`, `network` fields other than `allowPublicTraffic`,
/// `allowOut` and `denyOut`) is
/// refused by [`NewSandboxRequest::unsupported`]; `secure` (always true here: the agent runtime
/// always requires its access token) and unknown fields are ignored.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NewSandboxRequest {
    /// The SandboxSet (warm pool) to claim from.
    #[serde(rename = "templateID", default)]
    pub template_id: String,
    /// Seconds until the sandbox is killed (or paused with `autoPause`); 0 or absent: 300.
    #[serde(default)]
    pub timeout: Option<i64>,
    /// Pause instead of kill at the timeout.
    #[serde(rename = "autoPause", default)]
    pub auto_pause: Option<bool>,
    /// What the timeout pause keeps: the memory (`true`, the default) or only the files.
    #[serde(rename = "autoPauseMemory", default)]
    pub auto_pause_memory: Option<bool>,
    /// User metadata, and the `e2b.agents.kruise.io/` extensions.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// The agent runtime's global environment.
    #[serde(rename = "envVars", default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// `allow_internet_access` (snake_case, as the SDK sends it): recorded as the label
    /// `agents.kruise.io/allow-internet-access` (`"false"` only when false), as the reference,
    /// and `false` denies every destination no `allowOut` entry allows (`crate::egress`).
    #[serde(default)]
    pub allow_internet_access: Option<bool>,
    /// E2B `network`: `allowPublicTraffic`, `allowOut`, `denyOut`.
    #[serde(default)]
    pub network: Option<NetworkRequest>,
    /// E2B `autoResume`: `{"enabled": bool}` (a bare bool is accepted too).
    #[serde(rename = "autoResume", default)]
    pub auto_resume: Option<AutoResume>,
    /// E2B's MCP gateway: not supported.
    #[serde(default)]
    pub mcp: Option<serde_json::Value>,
    /// E2B's IAM tokens: not supported.
    #[serde(default)]
    pub iam: Option<serde_json::Value>,
    /// E2B volumes: not supported.
    #[serde(rename = "volumeMounts", default)]
    pub volume_mounts: Option<serde_json::Value>,
}

impl NewSandboxRequest {
    /// The first field of the request oka cannot honour, by its JSON path, or `None`. A field
    /// that is absent, null or empty asks for nothing.
    pub fn unsupported(&self) -> Option<String> {
        let asks = |value: &Option<serde_json::Value>| match value {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::Array(items)) => !items.is_empty(),
            Some(serde_json::Value::Object(fields)) => !fields.is_empty(),
            Some(_) => true,
        };
        if asks(&self.mcp) {
            return Some("mcp".into());
        }
        if asks(&self.iam) {
            return Some("iam".into());
        }
        if asks(&self.volume_mounts) {
            return Some("volumeMounts".into());
        }
        let network = self.network.as_ref()?;
        network
            .other
            .iter()
            .find(|(_, v)| asks(&Some((*v).clone())))
            .map(|(k, _)| format!("network.{k}"))
    }
}

/// E2B's `network` of a create.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NetworkRequest {
    /// `false`: requests through the gateway need the `trafficAccessToken` of the create answer.
    #[serde(rename = "allowPublicTraffic", default)]
    pub allow_public_traffic: Option<bool>,
    /// Destinations allowed (addresses, CIDR networks, domain names), winning over `denyOut`.
    #[serde(rename = "allowOut", default)]
    pub allow_out: Option<Vec<String>>,
    /// Destinations denied (addresses, CIDR networks).
    #[serde(rename = "denyOut", default)]
    pub deny_out: Option<Vec<String>>,
    /// The other fields (`rules`, `egressProxy`, `dnsServers`,
    /// `maskRequestHost`, `httpsPorts`): refused when they ask for something.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// E2B's `autoResume`: `{"enabled": bool}`, or a bare bool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum AutoResume {
    /// `{"enabled": bool}`.
    Object {
        /// Whether traffic resumes the paused sandbox.
        #[serde(default)]
        enabled: bool,
    },
    /// A bare bool.
    Bool(bool),
}

impl AutoResume {
    /// Whether auto-resume is on.
    pub fn enabled(self) -> bool {
        match self {
            AutoResume::Object { enabled } | AutoResume::Bool(enabled) => enabled,
        }
    }
}

/// `POST /sandboxes/{id}/resume` (SDK 1.x): `{"timeout", "autoPause"}`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResumeRequest {
    /// Seconds from now.
    #[serde(default)]
    pub timeout: Option<i64>,
    /// Pause instead of kill at the new timeout.
    #[serde(rename = "autoPause", default)]
    pub auto_pause: Option<bool>,
    /// `false`: start afresh on the files, as [`ConnectRequest::memory`].
    #[serde(default)]
    pub memory: Option<bool>,
}

/// `lifecycle` of a sandbox's JSON (E2B `SandboxDetail`): both keys always present.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifecycle {
    /// Whether a request to the paused sandbox resumes it.
    #[serde(rename = "autoResume")]
    pub auto_resume: bool,
    /// `"pause"` (auto-pause at the end time) or `"kill"`.
    #[serde(rename = "onTimeout")]
    pub on_timeout: String,
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Clone, Deserialize)]
pub struct TimeoutRequest {
    /// Seconds from now.
    pub timeout: i64,
}

/// `POST /sandboxes/{id}/connect` (v1 requires `timeout`; v2 may send `{}`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConnectRequest {
    /// Seconds from now; absent: 300.
    #[serde(default)]
    pub timeout: Option<i64>,
    /// `false`: a paused sandbox starts afresh on its files (E2B's `on_resume="reboot"`), its
    /// memory discarded; absent or `true`: it carries on where it was.
    #[serde(default)]
    pub memory: Option<bool>,
}

/// A sandbox as the API shows it (`Sandbox`, `SandboxDetail`, `ListedSandbox`), in the
/// reference's field order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxJson {
    /// The pool (SandboxSet) it came from.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Its public ID.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Always empty.
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// The claim time (RFC 3339).
    #[serde(rename = "startedAt")]
    pub started_at: String,
    /// The pause time if set, else the shutdown time; [`NEVER`] when neither.
    #[serde(rename = "endAt")]
    pub end_at: String,
    /// The agent runtime version the SDK gates features on.
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    /// The agent runtime's access token (create, get; not list).
    #[serde(rename = "envdAccessToken", skip_serializing_if = "Option::is_none", default)]
    pub envd_access_token: Option<String>,
    /// The traffic access token (create answers only, when `network.allowPublicTraffic` is
    /// false); the gateway requires it in `e2b-traffic-access-token`.
    #[serde(rename = "trafficAccessToken", skip_serializing_if = "Option::is_none", default)]
    pub traffic_access_token: Option<String>,
    /// The domain sandbox hosts live under.
    pub domain: String,
    /// CPU limit of the first container, whole CPUs (rounded up, at least 1).
    #[serde(rename = "cpuCount")]
    pub cpu_count: i64,
    /// Memory limit of the first container, MiB (rounded up; 128, E2B's minimum, when unset).
    #[serde(rename = "memoryMB")]
    pub memory_mb: i64,
    /// Ephemeral storage limit of the first container, MiB.
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: i64,
    /// The template's name (the pool), which the SDKs show as the sandbox's `name`.
    pub alias: String,
    /// User metadata plus [`SANDBOX_RESOURCE`].
    pub metadata: BTreeMap<String, String>,
    /// `running` or `paused`.
    pub state: String,
    /// Auto-resume and what happens at the end time.
    pub lifecycle: Lifecycle,
    /// The network rules in force ([`NETWORK_RULES`]), when any were given.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub network: Option<NetworkRules>,
}

/// The state the API shows, or `None` when the sandbox is not viewable (creating, dead, handed
/// back to its pool):
/// `running` and `paused` as derived, and a claimed sandbox that is running but momentarily
/// not Ready shown as `running`, as the reference does.
pub fn visible_state(sandbox: &Sandbox, now: Timestamp) -> Option<SandboxState> {
    if being_recycled(sandbox) {
        return None;
    }
    let derived = sandbox_state(sandbox, now);
    match derived.state {
        SandboxState::Running | SandboxState::Paused => Some(derived.state),
        SandboxState::Dead if derived.reason == StateReason::RunningResourceClaimedButNotReady => {
            Some(SandboxState::Running)
        }
        _ => None,
    }
}

/// Whether a kill handed `sandbox` back to its pool (`agents.kruise.io/cleanup` or `reuse` on a
/// sandbox whose template enables it) or it is recycling: gone for its user, as a deleted one,
/// though the object lives on.
fn being_recycled(sandbox: &Sandbox) -> bool {
    sandbox.phase() == Some(&oka_api::SandboxPhase::Recycling)
        || oka_api::recycle_requested(sandbox)
}

/// The response metadata: labels then annotations (annotations win) without the
/// `agents.kruise.io/` and `e2b.agents.kruise.io/` keys, the entries of
/// `agents.kruise.io/e2b-metadata` (keys annotations cannot hold), plus [`SANDBOX_RESOURCE`] last.
pub fn response_metadata(sandbox: &Sandbox) -> BTreeMap<String, String> {
    let meta = &sandbox.metadata;
    let mut out: BTreeMap<String, String> = meta
        .labels
        .iter()
        .flatten()
        .chain(meta.annotations.iter().flatten())
        .filter(|(k, _)| !annotations::is_reserved(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(json) = annotation(sandbox, annotations::E2B_METADATA)
        && let Ok(unqualified) = serde_json::from_str::<BTreeMap<String, String>>(json)
    {
        out.extend(unqualified);
    }
    out.insert(
        SANDBOX_RESOURCE.into(),
        format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        ),
    );
    out
}

fn annotation<'a>(sandbox: &'a Sandbox, key: &str) -> Option<&'a str> {
    sandbox.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The runtime access token recorded on the sandbox (legacy key as a fallback).
pub fn access_token(sandbox: &Sandbox) -> Option<String> {
    annotation(sandbox, annotations::RUNTIME_ACCESS_TOKEN)
        .or_else(|| annotation(sandbox, annotations::ENVD_ACCESS_TOKEN))
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
}

/// The claim time (RFC 3339); without one, the object's creation, else the Unix epoch: always
/// a date-time, which the SDKs parse.
pub fn started_at(sandbox: &Sandbox) -> String {
    annotation(sandbox, annotations::CLAIM_TIMESTAMP)
        .and_then(|t| t.parse::<Timestamp>().ok())
        .or_else(|| sandbox.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .to_string()
}

/// `endAt`: for a paused sandbox, when it paused (E2B's answer; its timers then only bound how
/// long it is kept); otherwise the pause time if set, else the shutdown time; [`NEVER`] when
/// neither.
fn end_at(sandbox: &Sandbox, state: SandboxState) -> String {
    let paused_at = (state == SandboxState::Paused)
        .then(|| sandbox.condition(oka_api::conditions::sandbox::PAUSED))
        .flatten()
        .filter(|c| oka_api::conditions::is_true(c))
        .map(|c| c.last_transition_time.0);
    let end = sandbox.spec.pause_time.as_ref().or(sandbox.spec.shutdown_time.as_ref());
    paused_at.or_else(|| end.map(|t| t.0)).map_or_else(|| NEVER.into(), |t| t.to_string())
}

/// Renders `sandbox` for the API. `token`: include `envdAccessToken`; `resources`: (CPUs,
/// memory MiB, disk MiB) of its pod template ([`template_resources`]).
pub fn sandbox_json(
    sandbox: &Sandbox,
    state: SandboxState,
    domain: &str,
    envd_version: &str,
    token: bool,
    resources: (i64, i64, i64),
) -> SandboxJson {
    let (cpu, memory, disk) = resources;
    let template_id = sandbox
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::SANDBOX_POOL))
        .cloned()
        .unwrap_or_default();
    SandboxJson {
        alias: template_id.clone(),
        template_id,
        sandbox_id: sandbox_id(sandbox).unwrap_or_default(),
        client_id: String::new(),
        started_at: started_at(sandbox),
        end_at: end_at(sandbox, state),
        envd_version: envd_version.into(),
        envd_access_token: if token { access_token(sandbox) } else { None },
        traffic_access_token: None,
        domain: domain.into(),
        cpu_count: cpu,
        memory_mb: memory,
        disk_size_mb: disk,
        metadata: response_metadata(sandbox),
        state: state.as_str().into(),
        lifecycle: Lifecycle {
            auto_resume: match annotation(sandbox, annotations::AUTO_RESUME) {
                Some(value) => value == "true",
                None => sandbox.spec.pause_time.is_some(),
            },
            on_timeout: if sandbox.spec.pause_time.is_some() { "pause" } else { "kill" }.into(),
        },
        network: annotation(sandbox, NETWORK_RULES).and_then(|j| serde_json::from_str(j).ok()),
    }
}

/// The fewest CPUs the API shows: E2B's description requires at least 1.
pub const MIN_CPU_COUNT: i64 = 1;
/// The least memory the API shows, MiB: E2B's description requires at least 128.
pub const MIN_MEMORY_MB: i64 = 128;

/// (CPUs, memory MiB, disk MiB) of a pod template's first container: limits, else requests;
/// CPUs rounded up. A template that names no CPU or memory (the sandbox may use the node's)
/// shows [`MIN_CPU_COUNT`] and [`MIN_MEMORY_MB`], never 0, which E2B's description forbids; a
/// memory limit below E2B's minimum is shown as it is.
pub fn template_resources(
    template: Option<&k8s_openapi::api::core::v1::PodTemplateSpec>,
) -> (i64, i64, i64) {
    let Some(container) = template.and_then(|t| t.spec.as_ref()).and_then(|s| s.containers.first())
    else {
        return (MIN_CPU_COUNT, MIN_MEMORY_MB, 0);
    };
    let empty = ResourceRequirements::default();
    let resources = container.resources.as_ref().unwrap_or(&empty);
    let get = |name: &str| {
        let limit = resources.limits.as_ref().and_then(|l| l.get(name));
        let (quantity, is_limit) = match limit {
            Some(q) => (Some(q), true),
            None => (resources.requests.as_ref().and_then(|r| r.get(name)), false),
        };
        quantity.and_then(|q| quantity::parse(&q.0).ok()).map(|v| (v, is_limit))
    };
    let as_i64 = |value: Result<u64, _>| value.ok().and_then(|v| i64::try_from(v).ok());
    // Whole CPUs: the millicores (to the nearest), rounded up.
    let cpu = get("cpu")
        .and_then(|(v, _)| as_i64(v.millis(Rounding::Nearest)))
        .map_or(0, |millis| millis.saturating_add(999) / 1000);
    let mib = |name| {
        get(name).map_or(0, |(v, is_limit)| {
            let rounding = if is_limit { Rounding::Up } else { Rounding::Down };
            as_i64(v.in_units_of(MIB, rounding)).unwrap_or(0)
        })
    };
    let memory = match mib("memory") {
        0 => MIN_MEMORY_MB,
        memory => memory,
    };
    (cpu.max(MIN_CPU_COUNT), memory, mib("ephemeral-storage"))
}

/// A mebibyte, the unit E2B shows memory and disk in.
pub const MIB: u128 = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_handed_back_to_its_pool_is_gone_for_its_user() {
        use oka_api::SandboxPhase;
        let now = Timestamp::from_second(1_767_225_600).unwrap();
        let running = || Sandbox::test().claimed().phase(SandboxPhase::Running).ready();
        assert_eq!(visible_state(&running().build(), now), Some(SandboxState::Running));
        let cases = [
            running().phase(SandboxPhase::Recycling).build(),
            running()
                .annotation(annotations::CLEANUP_ENABLED, "true")
                .annotation(annotations::CLEANUP, "true")
                .build(),
            running()
                .annotation(annotations::REUSE_ENABLED, "true")
                .annotation(annotations::REUSE, "true")
                .build(),
        ];
        for sandbox in cases {
            assert_eq!(visible_state(&sandbox, now), None, "{:?}", sandbox.metadata.annotations);
        }
    }

    #[test]
    fn resources_as_e2b_describes_them() {
        use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let template = |limits: &[(&str, &str)]| PodTemplateSpec {
            spec: Some(PodSpec {
                containers: vec![Container {
                    resources: Some(ResourceRequirements {
                        limits: Some(
                            limits
                                .iter()
                                .map(|(k, v)| ((*k).into(), Quantity((*v).into())))
                                .collect(),
                        ),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        // (limits, (CPUs, memory MiB, disk MiB))
        type Case = (&'static [(&'static str, &'static str)], (i64, i64, i64));
        let cases: &[Case] = &[
            (&[("cpu", "2"), ("memory", "1Gi")], (2, 1024, 0)),
            (&[("cpu", "500m"), ("memory", "512Mi")], (1, 512, 0)),
            (&[("cpu", "1500m"), ("memory", "64Mi")], (2, 64, 0)),
            (&[("ephemeral-storage", "1Gi")], (1, 128, 1024)),
            (&[], (1, 128, 0)),
        ];
        for (limits, expected) in cases {
            assert_eq!(template_resources(Some(&template(limits))), *expected, "{limits:?}");
        }
        assert_eq!(template_resources(None), (1, 128, 0));
    }
}
