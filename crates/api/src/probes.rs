//! Sandbox probes and the auto-pause policy (`spec.probes`, `spec.autoPausePolicy`).
//!
//! These are oka extensions (seed-extensions §2); the reference has no such fields. They live on
//! Sandbox, SandboxSet and SandboxTemplate specs (the pool copies them onto each sandbox like
//! `runtimes`) and are left out of both revision hashes, so adding them does not roll a pool.
//!
//! A probe's result is reported as the condition `probe.agents.kruise.io/<name>` (see
//! [`probe_condition_type`]); the policy turns those conditions into pause and resume decisions.
//! Defaults below are schema defaults and are also applied when deserializing.

use k8s_openapi::api::core::v1::{ExecAction, HTTPGetAction, TCPSocketAction};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ApiError;

/// Prefix of the condition type that carries a probe's result.
pub const PROBE_CONDITION_PREFIX: &str = "probe.agents.kruise.io/";

/// Maximum number of probes on one spec.
pub const MAX_PROBES: usize = 8;

/// The condition type reporting probe `name`: `probe.agents.kruise.io/<name>`.
pub fn probe_condition_type(name: &str) -> String {
    format!("{PROBE_CONDITION_PREFIX}{name}")
}

/// The probe name of a condition type written by [`probe_condition_type`], if it is one.
pub fn probe_name_of_condition(condition_type: &str) -> Option<&str> {
    condition_type.strip_prefix(PROBE_CONDITION_PREFIX).filter(|n| !n.is_empty())
}

/// Adds the CEL rules that tie `autoPausePolicy` to `probes` to a spec schema (Sandbox,
/// SandboxSet and SandboxTemplate specs): the pause rule names a probe, the resume rule names an
/// external probe. Every string these rules compare has a `maxLength` and `probes` has
/// `maxItems`, which keeps the API server's CEL cost estimate far below its limit.
pub(crate) fn add_policy_validations(schema: &mut schemars::Schema) {
    schema.insert(
        "x-kubernetes-validations".to_owned(),
        serde_json::json!([
            {
                "rule": "!has(self.autoPausePolicy) || (has(self.probes) && self.probes.exists(p, p.name == self.autoPausePolicy.pause.probeName))",
                "message": "autoPausePolicy.pause.probeName must name an entry of probes",
            },
            {
                "rule": "!has(self.autoPausePolicy) || !has(self.autoPausePolicy.resume) || (has(self.probes) && self.probes.exists(p, p.name == self.autoPausePolicy.resume.probeName && (has(p.activity) || (has(p.httpGet) && has(p.httpGet.host) && p.httpGet.host != '') || (has(p.tcpSocket) && has(p.tcpSocket.host) && p.tcpSocket.host != ''))))",
                "message": "autoPausePolicy.resume.probeName must name an external probe (activity, or httpGet/tcpSocket with a host)",
            },
        ]),
    );
}

closed_string_enum! {
    /// Where an activity probe learns about activity.
    pub enum ActivitySource {
        /// Requests routed to the sandbox by the gateway or the manager proxy, reported through
        /// the `agents.kruise.io/last-activity-time` annotation.
        Traffic => "Traffic",
    }
}

closed_string_enum! {
    /// The condition status a pause or resume rule waits for. `Unknown` is deliberately not
    /// allowed: an unknown probe result must never trigger an action.
    pub enum RuleConditionStatus {
        /// The probe condition is `True`.
        True => "True",
        /// The probe condition is `False`.
        False => "False",
    }
}

closed_string_enum! {
    /// Which paused sandboxes a resume rule may wake.
    pub enum ResumeScope {
        /// Only sandboxes this policy paused (annotation `agents.kruise.io/paused-by`).
        PolicyPaused => "PolicyPaused",
        /// Any paused sandbox, also those paused by a user, the E2B API or `pauseTime`.
        AnyPause => "AnyPause",
    }
}

/// One entry of `spec.probes`.
///
/// Exactly one of `exec`, `httpGet`, `tcpSocket` and `activity` must be set. Thresholds follow
/// kubelet semantics.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "(has(self.exec) ? 1 : 0) + (has(self.httpGet) ? 1 : 0) + (has(self.tcpSocket) ? 1 : 0) + (has(self.activity) ? 1 : 0) == 1",
        "message": "exactly one of exec, httpGet, tcpSocket or activity must be set",
    },
    {
        "rule": "self.timeoutSeconds <= self.periodSeconds",
        "message": "timeoutSeconds must not exceed periodSeconds",
    },
]))]
pub struct SandboxProbe {
    /// Name of the probe (a DNS-1123 label), unique in the list; the condition type is
    /// `probe.agents.kruise.io/<name>`.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// Run a command inside the sandbox through the agent runtime; success is exit code 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::exec_action")]
    pub exec: Option<ExecAction>,
    /// HTTP GET from the controller; success is a status in [200, 400). Without `host` the
    /// sandbox's IP is used. `path`, header values and `host` may use `$(SANDBOX_NAME)`,
    /// `$(SANDBOX_NAMESPACE)` and `$(SANDBOX_ID)`; `path` defaults to `/`, `scheme` to `HTTP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HTTPGetAction>,
    /// TCP connect from the controller; success is an established connection. Without `host`
    /// the sandbox's IP is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TCPSocketAction>,
    /// Recent-activity check; success is activity within the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<ActivityProbe>,
    /// Seconds to wait after the sandbox became Ready (or was claimed) before the first probe.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub initial_delay_seconds: i32,
    /// Seconds between probes.
    #[serde(default = "default_period_seconds")]
    #[schemars(range(min = 5, max = 3600))]
    pub period_seconds: i32,
    /// Seconds after which a probe attempt counts as failed; at most `periodSeconds`.
    #[serde(default = "default_timeout_seconds")]
    #[schemars(range(min = 1))]
    pub timeout_seconds: i32,
    /// Consecutive successes that make the condition `True`.
    #[serde(default = "default_one")]
    #[schemars(range(min = 1))]
    pub success_threshold: i32,
    /// Consecutive failures that make the condition `False`.
    #[serde(default = "default_failure_threshold")]
    #[schemars(range(min = 1))]
    pub failure_threshold: i32,
}

impl Default for SandboxProbe {
    fn default() -> Self {
        Self {
            name: String::new(),
            exec: None,
            http_get: None,
            tcp_socket: None,
            activity: None,
            initial_delay_seconds: 0,
            period_seconds: SandboxProbe::DEFAULT_PERIOD_SECONDS,
            timeout_seconds: SandboxProbe::DEFAULT_TIMEOUT_SECONDS,
            success_threshold: SandboxProbe::DEFAULT_SUCCESS_THRESHOLD,
            failure_threshold: SandboxProbe::DEFAULT_FAILURE_THRESHOLD,
        }
    }
}

/// The one handler a probe sets, borrowed from the probe.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ProbeHandler<'a> {
    /// `exec`.
    Exec(&'a ExecAction),
    /// `httpGet`.
    HttpGet(&'a HTTPGetAction),
    /// `tcpSocket`.
    TcpSocket(&'a TCPSocketAction),
    /// `activity`.
    Activity(&'a ActivityProbe),
}

impl SandboxProbe {
    /// Default of `periodSeconds`.
    pub const DEFAULT_PERIOD_SECONDS: i32 = 10;
    /// Default of `timeoutSeconds`.
    pub const DEFAULT_TIMEOUT_SECONDS: i32 = 1;
    /// Default of `successThreshold`.
    pub const DEFAULT_SUCCESS_THRESHOLD: i32 = 1;
    /// Default of `failureThreshold`.
    pub const DEFAULT_FAILURE_THRESHOLD: i32 = 3;

    /// The probe's handler.
    ///
    /// # Errors
    ///
    /// [`ApiError::ProbeHandler`] unless exactly one handler is set (the CRD's CEL rule rejects
    /// such objects, but an object that skipped admission can still carry one).
    pub fn handler(&self) -> Result<ProbeHandler<'_>, ApiError> {
        let handlers = [
            self.exec.as_ref().map(ProbeHandler::Exec),
            self.http_get.as_ref().map(ProbeHandler::HttpGet),
            self.tcp_socket.as_ref().map(ProbeHandler::TcpSocket),
            self.activity.as_ref().map(ProbeHandler::Activity),
        ];
        let mut set = handlers.into_iter().flatten();
        let first = set.next();
        let rest = set.count();
        match first {
            Some(handler) if rest == 0 => Ok(handler),
            _ => Err(ApiError::ProbeHandler {
                name: self.name.clone(),
                count: usize::from(first.is_some()) + rest,
            }),
        }
    }

    /// Whether the probe is external: it observes the sandbox from outside (an `activity` probe,
    /// or `httpGet`/`tcpSocket` with an explicit `host`) and therefore still works while the
    /// sandbox is paused. Only external probes may drive a resume rule.
    pub fn is_external(&self) -> bool {
        self.activity.is_some()
            || self
                .http_get
                .as_ref()
                .is_some_and(|h| h.host.as_deref().is_some_and(|s| !s.is_empty()))
            || self
                .tcp_socket
                .as_ref()
                .is_some_and(|t| t.host.as_deref().is_some_and(|s| !s.is_empty()))
    }

    /// The condition type that carries this probe's result.
    pub fn condition_type(&self) -> String {
        probe_condition_type(&self.name)
    }
}

fn default_period_seconds() -> i32 {
    SandboxProbe::DEFAULT_PERIOD_SECONDS
}

fn default_timeout_seconds() -> i32 {
    SandboxProbe::DEFAULT_TIMEOUT_SECONDS
}

fn default_one() -> i32 {
    1
}

fn default_failure_threshold() -> i32 {
    SandboxProbe::DEFAULT_FAILURE_THRESHOLD
}

/// `probes[].activity`: succeeds while the sandbox saw activity within the window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActivityProbe {
    /// Where activity is observed.
    #[serde(default = "default_activity_source")]
    pub source: ActivitySource,
    /// How recent the last activity must be, in seconds.
    #[serde(default = "default_window_seconds")]
    #[schemars(range(min = 60, max = 86400))]
    pub window_seconds: i32,
    /// Only requests to these sandbox ports count; empty means every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<i32>>,
}

impl ActivityProbe {
    /// Default of `windowSeconds`.
    pub const DEFAULT_WINDOW_SECONDS: i32 = 300;
}

impl Default for ActivityProbe {
    fn default() -> Self {
        Self {
            source: ActivitySource::Traffic,
            window_seconds: ActivityProbe::DEFAULT_WINDOW_SECONDS,
            ports: None,
        }
    }
}

fn default_activity_source() -> ActivitySource {
    ActivitySource::Traffic
}

fn default_window_seconds() -> i32 {
    ActivityProbe::DEFAULT_WINDOW_SECONDS
}

/// `spec.autoPausePolicy`: pause and resume the sandbox from probe conditions.
///
/// Without a policy, probes only report conditions.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoPausePolicy {
    /// When to pause.
    pub pause: PauseRule,
    /// When to resume; absent means never resume automatically.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<ResumeRule>,
    /// No auto-pause sooner than this many seconds after the sandbox last became Ready.
    #[serde(default = "default_min_running_seconds")]
    #[schemars(range(min = 0))]
    pub min_running_seconds: i32,
    /// No auto-resume sooner than this many seconds after a pause completed.
    #[serde(default = "default_min_paused_seconds")]
    #[schemars(range(min = 0))]
    pub min_paused_seconds: i32,
}

impl AutoPausePolicy {
    /// Default of `minRunningSeconds`.
    pub const DEFAULT_MIN_RUNNING_SECONDS: i32 = 60;
    /// Default of `minPausedSeconds`.
    pub const DEFAULT_MIN_PAUSED_SECONDS: i32 = 30;

    /// A policy with this pause rule, no resume rule and default hold times.
    pub fn new(pause: PauseRule) -> Self {
        Self {
            pause,
            resume: None,
            min_running_seconds: Self::DEFAULT_MIN_RUNNING_SECONDS,
            min_paused_seconds: Self::DEFAULT_MIN_PAUSED_SECONDS,
        }
    }
}

fn default_min_running_seconds() -> i32 {
    AutoPausePolicy::DEFAULT_MIN_RUNNING_SECONDS
}

fn default_min_paused_seconds() -> i32 {
    AutoPausePolicy::DEFAULT_MIN_PAUSED_SECONDS
}

/// `autoPausePolicy.pause`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PauseRule {
    /// The probe whose condition decides; must name an entry of `spec.probes`.
    #[schemars(length(min = 1, max = 63))]
    pub probe_name: String,
    /// The condition status that means "pause-worthy".
    #[serde(default = "status_false")]
    pub status: RuleConditionStatus,
    /// How long, in seconds, that status must hold.
    #[serde(default)]
    #[schemars(range(min = 0, max = 604800))]
    pub for_seconds: i32,
}

impl PauseRule {
    /// A rule on `probe_name` with the defaults: status `False`, held for 0 seconds.
    pub fn new(probe_name: impl Into<String>) -> Self {
        Self { probe_name: probe_name.into(), status: RuleConditionStatus::False, for_seconds: 0 }
    }
}

/// `autoPausePolicy.resume`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResumeRule {
    /// The probe whose condition decides; must name an external entry of `spec.probes` (an
    /// activity probe, or httpGet/tcpSocket with a host).
    #[schemars(length(min = 1, max = 63))]
    pub probe_name: String,
    /// The condition status that means "resume".
    #[serde(default = "status_true")]
    pub status: RuleConditionStatus,
    /// How long, in seconds, that status must hold.
    #[serde(default)]
    #[schemars(range(min = 0, max = 604800))]
    pub for_seconds: i32,
    /// Which paused sandboxes the rule may wake.
    #[serde(default = "scope_policy_paused")]
    pub scope: ResumeScope,
}

impl ResumeRule {
    /// A rule on `probe_name` with the defaults: status `True`, held for 0 seconds, scope
    /// `PolicyPaused`.
    pub fn new(probe_name: impl Into<String>) -> Self {
        Self {
            probe_name: probe_name.into(),
            status: RuleConditionStatus::True,
            for_seconds: 0,
            scope: ResumeScope::PolicyPaused,
        }
    }
}

fn status_false() -> RuleConditionStatus {
    RuleConditionStatus::False
}

fn status_true() -> RuleConditionStatus {
    RuleConditionStatus::True
}

fn scope_policy_paused() -> ResumeScope {
    ResumeScope::PolicyPaused
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use serde_json::json;

    use super::*;

    #[test]
    fn defaults_apply_when_deserializing() {
        let probe: SandboxProbe =
            serde_json::from_value(json!({"name": "p", "activity": {}})).unwrap();
        assert_eq!(
            probe,
            SandboxProbe {
                name: "p".into(),
                activity: Some(ActivityProbe::default()),
                ..SandboxProbe::default()
            }
        );
        let policy: AutoPausePolicy = serde_json::from_value(json!({
            "pause": {"probeName": "a"},
            "resume": {"probeName": "b"},
        }))
        .unwrap();
        assert_eq!(
            policy,
            AutoPausePolicy {
                resume: Some(ResumeRule::new("b")),
                ..AutoPausePolicy::new(PauseRule::new("a"))
            }
        );
    }

    #[test]
    fn handler_requires_exactly_one() {
        let none = SandboxProbe { name: "p".into(), ..SandboxProbe::default() };
        assert_eq!(none.handler(), Err(ApiError::ProbeHandler { name: "p".into(), count: 0 }));
        let two = SandboxProbe {
            activity: Some(ActivityProbe::default()),
            exec: Some(ExecAction { command: Some(vec!["true".into()]) }),
            ..none.clone()
        };
        assert_eq!(two.handler(), Err(ApiError::ProbeHandler { name: "p".into(), count: 2 }));
        let three = SandboxProbe {
            tcp_socket: Some(TCPSocketAction { port: IntOrString::Int(80), host: None }),
            ..two.clone()
        };
        assert_eq!(three.handler(), Err(ApiError::ProbeHandler { name: "p".into(), count: 3 }));
        let one = SandboxProbe { activity: Some(ActivityProbe::default()), ..none };
        assert!(matches!(one.handler(), Ok(ProbeHandler::Activity(_))));
    }

    #[test]
    fn external_probes() {
        let tcp = |host: Option<&str>| SandboxProbe {
            name: "t".into(),
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(80),
                host: host.map(str::to_owned),
            }),
            ..SandboxProbe::default()
        };
        assert!(!tcp(None).is_external());
        assert!(!tcp(Some("")).is_external());
        assert!(tcp(Some("dispatcher.svc")).is_external());
        let http = |host: Option<&str>| SandboxProbe {
            name: "h".into(),
            http_get: Some(HTTPGetAction {
                port: IntOrString::Int(80),
                host: host.map(str::to_owned),
                ..HTTPGetAction::default()
            }),
            ..SandboxProbe::default()
        };
        assert!(!http(None).is_external());
        assert!(http(Some("10.0.0.1")).is_external());
        let exec = SandboxProbe {
            name: "e".into(),
            exec: Some(ExecAction::default()),
            ..SandboxProbe::default()
        };
        assert!(!exec.is_external());
        let activity = SandboxProbe {
            name: "a".into(),
            activity: Some(ActivityProbe::default()),
            ..SandboxProbe::default()
        };
        assert!(activity.is_external());
    }

    #[test]
    fn condition_type_round_trips() {
        assert_eq!(probe_condition_type("jupyter-http"), "probe.agents.kruise.io/jupyter-http");
        assert_eq!(
            probe_name_of_condition("probe.agents.kruise.io/jupyter-http"),
            Some("jupyter-http")
        );
        assert_eq!(probe_name_of_condition("probe.agents.kruise.io/"), None);
        assert_eq!(probe_name_of_condition("Ready"), None);
    }
}
