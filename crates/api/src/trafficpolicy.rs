//! `TrafficPolicy` (`trafficpolicies.agents.kruise.io`, short name `tp`, namespaced) and
//! `GlobalTrafficPolicy` (`globaltrafficpolicies.agents.kruise.io`, `gtp`, cluster-scoped):
//! ordered allow/reject rules for the traffic of the sandboxes whose pod labels a policy's
//! selector matches, exactly the reference's schema.
//!
//! Rules of the kinds (the CRD's, checked at admission by its CEL rules):
//! - a spec has `ingress` or `egress` (or both), and a `selector`; an empty selector selects
//!   every sandbox in the policy's scope (its namespace; for a GlobalTrafficPolicy, all);
//! - `priority` (default 1000, at least 0) orders the policies of a sandbox, **higher first**;
//! - each rule is `allow` or `reject`, with optional peers (`to` for egress, `from` for
//!   ingress; each exactly one of `cidr`, `fqdn`, `service`, `workload`) and ports (`protocol`
//!   TCP|UDP|ICMP|SCTP, `port`, `endPort` ≥ `port`, which needs `port`); a rule with neither
//!   peers nor ports matches all traffic of its direction;
//! - `status.conditions` carries `Accepted`, written by the controller that enforces them.
//!
//! The manager writes one TrafficPolicy per sandbox created with E2B network options
//! ([`E2B_PRIORITY`], selector [`labels::SANDBOX_NAME`](crate::labels::SANDBOX_NAME)).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// The priority of a policy that does not name one.
pub const DEFAULT_PRIORITY: i32 = 1000;
/// The priority of the TrafficPolicy the manager writes for a sandbox's E2B network options.
pub const E2B_PRIORITY: i32 = 100;
/// The condition type saying whether a policy is enforced as written.
pub const CONDITION_ACCEPTED: &str = "Accepted";

/// The rules of a TrafficPolicy (and of a GlobalTrafficPolicy).
// `printcolumn(...)` repeats `type_ = ...` by design; clippy's duplicated_attributes lint reads
// the kube attribute's nested lists as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "agents.kruise.io",
    version = "v1alpha1",
    kind = "TrafficPolicy",
    plural = "trafficpolicies",
    singular = "trafficpolicy",
    shortname = "tp",
    namespaced,
    status = "TrafficPolicyStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "TrafficPolicy defines bidirectional traffic rules for selected pods.",
    printcolumn(name = "Priority", type_ = "integer", json_path = ".spec.priority"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.ingress) || has(self.egress)",
        "message": "at least one of ingress or egress must be specified",
    },
]))]
pub struct TrafficPolicySpec {
    /// Evaluation order among the policies of a sandbox: higher first.
    #[serde(default = "default_priority")]
    #[schemars(range(min = 0))]
    pub priority: i32,
    /// The sandboxes (by pod labels) it applies to; empty selects all in scope.
    #[schemars(schema_with = "crate::schema::label_selector")]
    pub selector: LabelSelector,
    /// Rules for inbound traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<TrafficPolicyDirection>,
    /// Rules for outbound traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<TrafficPolicyDirection>,
}

impl Default for TrafficPolicySpec {
    fn default() -> Self {
        Self {
            priority: DEFAULT_PRIORITY,
            selector: LabelSelector::default(),
            ingress: None,
            egress: None,
        }
    }
}

fn default_priority() -> i32 {
    DEFAULT_PRIORITY
}

/// The rules of a GlobalTrafficPolicy: those of a TrafficPolicy, its selector looking at every
/// namespace.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "agents.kruise.io",
    version = "v1alpha1",
    kind = "GlobalTrafficPolicy",
    plural = "globaltrafficpolicies",
    singular = "globaltrafficpolicy",
    shortname = "gtp",
    status = "TrafficPolicyStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "GlobalTrafficPolicy defines bidirectional traffic rules cluster-wide.",
    printcolumn(name = "Priority", type_ = "integer", json_path = ".spec.priority"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(transparent)]
#[schemars(transparent)]
pub struct GlobalTrafficPolicySpec(pub TrafficPolicySpec);

/// One direction's rules.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficPolicyDirection {
    /// The ordered rules; the first that matches decides.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50), extend("x-kubernetes-list-type" = "atomic"))]
    pub rules: Vec<TrafficPolicyRule>,
}

/// What a rule does with the traffic it matches.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TrafficAction {
    /// Let it through.
    Allow,
    /// Refuse it.
    Reject,
}

/// One rule: an action and optional peers and ports (none: all traffic of the direction).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficPolicyRule {
    /// Allow or reject.
    pub action: TrafficAction,
    /// Source peers (ingress), ORed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20), extend("x-kubernetes-list-type" = "atomic"))]
    pub from: Vec<TrafficPolicyPeer>,
    /// Destination peers (egress), ORed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20), extend("x-kubernetes-list-type" = "atomic"))]
    pub to: Vec<TrafficPolicyPeer>,
    /// Protocol/port combinations, ORed; empty: every port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20), extend("x-kubernetes-list-type" = "atomic"))]
    pub ports: Vec<TrafficPolicyPort>,
}

impl TrafficPolicyRule {
    /// A rule of `action` with no peers and no ports.
    pub fn new(action: TrafficAction) -> Self {
        Self { action, from: Vec::new(), to: Vec::new(), ports: Vec::new() }
    }
}

/// A source or destination: exactly one of its fields.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "[has(self.cidr), has(self.fqdn), has(self.service), has(self.workload)].filter(x, x).size() == 1",
        "message": "exactly one of cidr, fqdn, service, or workload must be set",
    },
]))]
pub struct TrafficPolicyPeer {
    /// An IP network (`10.0.0.0/8`) or address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 43))]
    pub cidr: Option<String>,
    /// A domain name (`api.example.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub fqdn: Option<String>,
    /// A Kubernetes Service and its endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<TrafficPolicyServiceRef>,
    /// Pods by namespace and labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<TrafficPolicyWorkloadRef>,
}

/// `peer.service`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficPolicyServiceRef {
    /// The Service's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Its namespace; the policy's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
}

/// `peer.workload`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficPolicyWorkloadRef {
    /// The pods' namespace.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// The pods' labels.
    #[schemars(extend("maxProperties" = 10))]
    pub selector: BTreeMap<String, String>,
}

/// A transport protocol of a port entry.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum TrafficProtocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// ICMP (no ports).
    Icmp,
    /// SCTP.
    Sctp,
}

/// A protocol/port combination of a rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.endPort) || has(self.port)", "message": "endPort requires port to be set"},
    {
        "rule": "!has(self.endPort) || self.endPort >= self.port",
        "message": "endPort must be greater than or equal to port",
    },
]))]
pub struct TrafficPolicyPort {
    /// Last port of a range (inclusive); needs `port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub end_port: Option<i32>,
    /// Destination port; absent: every port of the protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// The protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<TrafficProtocol>,
}

/// What the enforcing controller reports.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficPolicyStatus {
    /// `Accepted`: whether the policy is enforced as written (False names what is not).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_at_most_20")]
    pub conditions: Vec<Condition>,
}

fn conditions_at_most_20(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = crate::schema::conditions(generator);
    schema.insert("maxItems".to_owned(), 20.into());
    schema
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_reference_shape_reads_and_writes_back() {
        let yaml = r#"
priority: 100
selector: {matchLabels: {agents.kruise.io/sandbox-name: s1}}
egress:
  rules:
  - action: allow
    to: [{cidr: 10.0.0.0/8}, {fqdn: pypi.org}]
    ports: [{protocol: TCP, port: 443}, {protocol: UDP, port: 5000, endPort: 5010}]
  - action: reject
"#;
        let spec: TrafficPolicySpec = serde_yaml::from_str(yaml).unwrap();
        assert_eq!(spec.priority, 100);
        let rules = &spec.egress.as_ref().unwrap().rules;
        assert_eq!(rules[0].ports[1].end_port, Some(5010));
        assert_eq!(rules[1], TrafficPolicyRule::new(TrafficAction::Reject));
        let back = serde_json::to_value(&spec).unwrap();
        assert_eq!(back["egress"]["rules"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(back["egress"]["rules"][1], serde_json::json!({"action": "reject"}));
        let defaulted: TrafficPolicySpec =
            serde_yaml::from_str("selector: {}\negress: {}").unwrap();
        assert_eq!(defaulted.priority, DEFAULT_PRIORITY);
        let global: GlobalTrafficPolicySpec = serde_yaml::from_str(yaml).unwrap();
        assert_eq!(global.0, spec);
    }
}
