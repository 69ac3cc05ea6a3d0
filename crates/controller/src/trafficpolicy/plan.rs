//! The pure rules from TrafficPolicies and GlobalTrafficPolicies to one sandbox's egress
//! policy ([`EgressPolicy`]), and whether each policy is enforced as written (`Accepted`).
//!
//! Rules:
//! - **Which sandboxes a policy selects**: a TrafficPolicy those of its namespace, a
//!   GlobalTrafficPolicy those of every namespace, whose pod labels ([`pod_labels`]) its
//!   `selector` matches (an empty selector matches all). A selector with an unknown operator
//!   selects nothing (and the policy is not accepted).
//! - **Order**: the selecting policies by `priority`, higher first; equal priorities (which the
//!   reference leaves to the implementation) put TrafficPolicies before GlobalTrafficPolicies
//!   (the namespace's own word first), then the older policy, then by name. Their egress rules
//!   are concatenated in that order and the **first matching rule decides**; a rule with
//!   neither peers nor ports matches everything (so what follows it is unreachable), and what
//!   no rule matches is allowed (a sandbox no policy selects keeps its network as it is).
//! - **A rule** becomes one egress rule per (peer, protocol): `cidr` and `fqdn` peers (no
//!   peers: every address), ports grouped by protocol (`port` alone, `port..=endPort`; a
//!   protocol without ports: every port of it; a port without protocol: TCP, as Kubernetes
//!   ports default), `ICMP` without ports.
//! - **Not enforced** (the policy is `Accepted=False` naming them, and the parts it can be are
//!   enforced): `service` and `workload` peers (`UnresolvablePeer`: nothing here resolves
//!   Services or Pods to addresses; such a peer matches nothing, so an allow is narrower and a
//!   reject is dropped), `ingress` rules (`IngressUnsupported`: sandboxes are reached only
//!   through the gateway, which these rules do not govern), an invalid `cidr` or `fqdn`
//!   (`InvalidPeer`, the peer matches nothing).
//!
//! Pure: no IO, no clock.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use oka_api::trafficpolicy::{
    TrafficAction, TrafficPolicyPeer, TrafficPolicyRule, TrafficPolicySpec, TrafficProtocol,
};
use oka_api::{GlobalTrafficPolicy, Sandbox, TrafficPolicy, labels};
use oka_runtime_api::{Cidr, Destination, EgressAction, EgressPolicy, EgressRule, Protocol};
use oka_store::{Requirement, Selector};

/// Where a policy applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// A TrafficPolicy: its namespace.
    Namespaced,
    /// A GlobalTrafficPolicy: every namespace.
    Global,
}

/// One policy as the planner reads it.
#[derive(Clone, Copy, Debug)]
pub struct PolicyView<'a> {
    /// TrafficPolicy or GlobalTrafficPolicy.
    pub scope: Scope,
    /// The namespace of a TrafficPolicy (empty for a global one).
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
    /// When it was created.
    pub created: Option<&'a Time>,
    /// Its rules.
    pub spec: &'a TrafficPolicySpec,
}

impl<'a> PolicyView<'a> {
    /// A TrafficPolicy.
    pub fn namespaced(policy: &'a TrafficPolicy) -> Self {
        Self {
            scope: Scope::Namespaced,
            namespace: policy.metadata.namespace.as_deref().unwrap_or_default(),
            name: policy.metadata.name.as_deref().unwrap_or_default(),
            created: policy.metadata.creation_timestamp.as_ref(),
            spec: &policy.spec,
        }
    }

    /// A GlobalTrafficPolicy.
    pub fn global(policy: &'a GlobalTrafficPolicy) -> Self {
        Self {
            scope: Scope::Global,
            namespace: "",
            name: policy.metadata.name.as_deref().unwrap_or_default(),
            created: policy.metadata.creation_timestamp.as_ref(),
            spec: &policy.spec.0,
        }
    }
}

/// The labels a policy's selector sees on a sandbox: its pod template's labels, plus
/// `agents.kruise.io/sandbox-name` and `agents.kruise.io/sandbox-uid` (what the reference's
/// pods carry and the manager's policies select), plus the Sandbox's own
/// `agents.kruise.io/allow-internet-access` (the reference's GlobalTrafficPolicy selector).
pub fn pod_labels(sandbox: &Sandbox) -> BTreeMap<String, String> {
    let mut out = sandbox
        .spec
        .template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    if let Some(name) = &sandbox.metadata.name {
        out.insert(labels::SANDBOX_NAME.to_owned(), name.clone());
    }
    if let Some(uid) = &sandbox.metadata.uid {
        out.insert(labels::SANDBOX_UID.to_owned(), uid.clone());
    }
    if let Some(internet) =
        sandbox.metadata.labels.as_ref().and_then(|l| l.get(labels::ALLOW_INTERNET_ACCESS))
    {
        out.insert(labels::ALLOW_INTERNET_ACCESS.to_owned(), internet.clone());
    }
    out
}

/// `selector` as a store selector; `None` for an operator Kubernetes does not have.
pub fn selector_of(selector: &LabelSelector) -> Option<Selector> {
    let mut requirements: Vec<Requirement> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| Requirement::Equals(k.clone(), v.clone()))
        .collect();
    for expression in selector.match_expressions.iter().flatten() {
        let key = expression.key.clone();
        let values = expression.values.clone().unwrap_or_default();
        requirements.push(match expression.operator.as_str() {
            "In" => Requirement::In(key, values),
            "NotIn" => Requirement::NotIn(key, values),
            "Exists" => Requirement::Exists(key),
            "DoesNotExist" => Requirement::DoesNotExist(key),
            _ => return None,
        });
    }
    Some(Selector::new(requirements))
}

/// Whether `policy` selects a sandbox of namespace `namespace` with pod labels `labels`.
pub fn selects(
    policy: &PolicyView<'_>,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    (policy.scope == Scope::Global || policy.namespace == namespace)
        && selector_of(&policy.spec.selector).is_some_and(|s| s.matches(Some(labels)))
}

/// The evaluation order of two policies selecting the same sandbox (see the module rules).
fn order(a: &PolicyView<'_>, b: &PolicyView<'_>) -> Ordering {
    b.spec
        .priority
        .cmp(&a.spec.priority)
        .then(a.scope.cmp(&b.scope))
        .then_with(|| match (a.created, b.created) {
            (Some(x), Some(y)) => x.0.cmp(&y.0),
            _ => Ordering::Equal,
        })
        .then(a.namespace.cmp(b.namespace))
        .then(a.name.cmp(b.name))
}

/// The egress policy of `sandbox` under `policies` (any mix of kinds and namespaces; those
/// that do not select it are ignored); `None` when none selects it.
pub fn effective_egress(sandbox: &Sandbox, policies: &[PolicyView<'_>]) -> Option<EgressPolicy> {
    let namespace = sandbox.metadata.namespace.as_deref().unwrap_or_default();
    let labels = pod_labels(sandbox);
    let mut selecting: Vec<&PolicyView<'_>> =
        policies.iter().filter(|p| selects(p, namespace, &labels)).collect();
    if selecting.is_empty() {
        return None;
    }
    selecting.sort_by(|a, b| order(a, b));
    let mut policy = EgressPolicy::allow_all();
    for view in selecting {
        for rule in view.spec.egress.iter().flat_map(|d| &d.rules) {
            let translated = translate_rule(rule);
            policy.rules.extend(translated.rules);
            if let Some(action) = translated.catch_all {
                policy.default = action;
                return Some(policy);
            }
        }
    }
    Some(policy)
}

/// One policy rule as egress rules.
#[derive(Debug, Default, PartialEq)]
struct Translated {
    rules: Vec<EgressRule>,
    /// The rule matches everything: its action is the default of what follows.
    catch_all: Option<EgressAction>,
    /// What is not enforced, as (reason, what).
    unenforced: Vec<(&'static str, String)>,
}

fn action_of(action: TrafficAction) -> EgressAction {
    match action {
        TrafficAction::Allow => EgressAction::Allow,
        TrafficAction::Reject => EgressAction::Deny,
    }
}

/// The destinations of a peer; `Err` (reason, what) for one that cannot be enforced.
fn destination(peer: &TrafficPolicyPeer) -> Result<Destination, (&'static str, String)> {
    if let Some(cidr) = &peer.cidr {
        return cidr
            .parse::<Cidr>()
            .map(Destination::Cidr)
            .map_err(|e| ("InvalidPeer", format!("cidr {cidr:?}: {e}")));
    }
    if let Some(fqdn) = &peer.fqdn {
        return match Destination::parse(fqdn) {
            Ok(d @ Destination::Domain(_)) => Ok(d),
            Ok(Destination::Cidr(_)) => {
                Err(("InvalidPeer", format!("fqdn {fqdn:?} is an address")))
            }
            Err(e) => Err(("InvalidPeer", format!("fqdn {fqdn:?}: {e}"))),
        };
    }
    if let Some(service) = &peer.service {
        return Err(("UnresolvablePeer", format!("service {:?}", service.name)));
    }
    if let Some(workload) = &peer.workload {
        return Err(("UnresolvablePeer", format!("workload in {:?}", workload.namespace)));
    }
    Err(("InvalidPeer", "a peer with no cidr, fqdn, service or workload".to_owned()))
}

/// The (protocol, port ranges) pairs of a rule's ports (no ranges: every port of the
/// protocol); empty: every protocol and port.
fn port_groups(rule: &TrafficPolicyRule) -> Vec<(Protocol, Vec<(u16, u16)>)> {
    /// A protocol, whether an entry named it without a port, its port ranges.
    type Group = (Protocol, bool, Vec<(u16, u16)>);
    let mut groups: Vec<Group> = Vec::new();
    for port in &rule.ports {
        let protocol = match port.protocol.unwrap_or(TrafficProtocol::Tcp) {
            TrafficProtocol::Tcp => Protocol::Tcp,
            TrafficProtocol::Udp => Protocol::Udp,
            TrafficProtocol::Sctp => Protocol::Sctp,
            TrafficProtocol::Icmp => Protocol::Icmp,
        };
        let index = groups.iter().position(|(p, ..)| *p == protocol).unwrap_or_else(|| {
            groups.push((protocol, false, Vec::new()));
            groups.len() - 1
        });
        let group = &mut groups[index];
        match port.port {
            None => group.1 = true,
            Some(first) => {
                let clamp = |p: i32| u16::try_from(p.clamp(1, 65535)).unwrap_or(u16::MAX);
                let last = port.end_port.unwrap_or(first).max(first);
                group.2.push((clamp(first), clamp(last)));
            }
        }
    }
    groups
        .into_iter()
        .map(|(protocol, all, ranges)| {
            let every_port = all || protocol == Protocol::Icmp;
            (protocol, if every_port { Vec::new() } else { ranges })
        })
        .collect()
}

fn translate_rule(rule: &TrafficPolicyRule) -> Translated {
    let action = action_of(rule.action);
    let mut out = Translated::default();
    let mut destinations = Vec::new();
    for peer in &rule.to {
        match destination(peer) {
            Ok(d) => destinations.push(d),
            Err(why) => out.unenforced.push(why),
        }
    }
    if rule.to.is_empty() {
        if rule.ports.is_empty() {
            out.catch_all = Some(action);
            return out;
        }
        destinations.push(Destination::Cidr(Cidr {
            addr: std::net::Ipv4Addr::UNSPECIFIED.into(),
            prefix: 0,
        }));
    }
    let groups = port_groups(rule);
    for destination in destinations {
        if groups.is_empty() {
            out.rules.push(EgressRule::new(action, destination));
            continue;
        }
        for (protocol, ports) in &groups {
            out.rules.push(EgressRule {
                action,
                destination: destination.clone(),
                protocol: Some(*protocol),
                ports: ports.clone(),
            });
        }
    }
    out
}

/// Whether a policy is enforced as written: `Ok(())`, or `Err((reason, message))` naming what
/// is not.
pub fn acceptance(spec: &TrafficPolicySpec) -> Result<(), (&'static str, String)> {
    if selector_of(&spec.selector).is_none() {
        return Err(("InvalidSelector", "the selector has an unknown operator".to_owned()));
    }
    let mut problems: Vec<(&'static str, String)> = Vec::new();
    for rule in spec.egress.iter().flat_map(|d| &d.rules) {
        problems.extend(translate_rule(rule).unenforced);
    }
    if spec.ingress.as_ref().is_some_and(|d| !d.rules.is_empty()) {
        problems.push((
            "IngressUnsupported",
            "ingress rules (sandboxes are reached only through the gateway)".to_owned(),
        ));
    }
    match problems.first() {
        None => Ok(()),
        Some((reason, _)) => {
            let what: Vec<String> = problems.iter().map(|(_, w)| w.clone()).collect();
            Err((reason, format!("not enforced: {}", what.join("; "))))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use oka_api::GlobalTrafficPolicySpec;

    fn sandbox(namespace: &str, name: &str, template_labels: &[(&str, &str)]) -> Sandbox {
        let mut s = Sandbox::new(name, oka_api::SandboxSpec::default());
        s.metadata.namespace = Some(namespace.into());
        s.metadata.uid = Some(format!("uid-{name}"));
        let labels = template_labels.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        s.spec.template = Some(k8s_openapi::api::core::v1::PodTemplateSpec {
            metadata: Some(ObjectMeta { labels: Some(labels), ..ObjectMeta::default() }),
            spec: None,
        });
        s
    }

    fn spec(yaml: &str) -> TrafficPolicySpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn tp(namespace: &str, name: &str, yaml: &str) -> TrafficPolicy {
        let mut p = TrafficPolicy::new(name, spec(yaml));
        p.metadata.namespace = Some(namespace.into());
        p
    }

    fn gtp(name: &str, yaml: &str) -> GlobalTrafficPolicy {
        GlobalTrafficPolicy::new(name, GlobalTrafficPolicySpec(spec(yaml)))
    }

    fn summary(p: &EgressPolicy) -> Vec<String> {
        let mut out: Vec<String> = p
            .rules
            .iter()
            .map(|r| {
                let proto = r.protocol.map(|p| format!(" {}", p.name())).unwrap_or_default();
                let ports: Vec<String> = r.ports.iter().map(|(a, b)| format!("{a}-{b}")).collect();
                format!("{:?} {}{proto} {}", r.action, r.destination, ports.join(","))
                    .trim_end()
                    .to_owned()
            })
            .collect();
        out.push(format!("default {:?}", p.default));
        out
    }

    #[test]
    fn higher_priority_first_and_the_first_catch_all_ends_the_list() {
        let s = sandbox("team", "s1", &[("app", "agent")]);
        let low = tp(
            "team",
            "low",
            "priority: 10\nselector: {}\negress: {rules: [{action: allow, to: [{cidr: 1.1.1.1/32}]}, {action: reject}]}",
        );
        let high = tp(
            "team",
            "high",
            "priority: 2000\nselector: {matchLabels: {app: agent}}\negress: {rules: [{action: reject, to: [{cidr: 1.1.1.1/32}]}]}",
        );
        let views = [PolicyView::namespaced(&low), PolicyView::namespaced(&high)];
        let p = effective_egress(&s, &views).unwrap();
        assert_eq!(
            summary(&p),
            ["Deny 1.1.1.1/32", "Allow 1.1.1.1/32", "default Deny"],
            "the higher priority's reject comes first"
        );
    }

    #[test]
    fn selectors_namespaces_and_global_policies() {
        let s = sandbox("team", "s1", &[("app", "agent")]);
        let other_ns = tp("other", "x", "selector: {}\negress: {rules: [{action: reject}]}");
        let unselected = tp(
            "team",
            "y",
            "selector: {matchLabels: {app: web}}\negress: {rules: [{action: reject}]}",
        );
        assert_eq!(
            effective_egress(
                &s,
                &[PolicyView::namespaced(&other_ns), PolicyView::namespaced(&unselected)]
            ),
            None,
            "another namespace's policy and an unmatched selector select nothing"
        );
        let by_name = tp(
            "team",
            "e2b",
            "priority: 100\nselector: {matchLabels: {agents.kruise.io/sandbox-name: s1}}\negress: {rules: [{action: allow, to: [{fqdn: pypi.org}]}]}",
        );
        let global = gtp(
            "no-lan",
            "selector: {matchExpressions: [{key: app, operator: In, values: [agent]}]}\negress: {rules: [{action: reject, to: [{cidr: 8.8.8.8/32}]}]}",
        );
        let views = [PolicyView::namespaced(&by_name), PolicyView::global(&global)];
        let p = effective_egress(&s, &views).unwrap();
        assert_eq!(summary(&p), ["Deny 8.8.8.8/32", "Allow pypi.org", "default Allow"]);
        // Equal priorities: the namespace's policy before the global one.
        let global_same = gtp(
            "g",
            "priority: 100\nselector: {}\negress: {rules: [{action: reject, to: [{cidr: 9.9.9.9/32}]}]}",
        );
        let views = [PolicyView::global(&global_same), PolicyView::namespaced(&by_name)];
        let p = effective_egress(&s, &views).unwrap();
        assert_eq!(summary(&p), ["Allow pypi.org", "Deny 9.9.9.9/32", "default Allow"]);
    }

    #[test]
    fn ports_group_by_protocol_and_default_to_tcp() {
        let s = sandbox("team", "s1", &[]);
        let p = tp(
            "team",
            "ports",
            "selector: {}\negress: {rules: [{action: allow, to: [{cidr: 203.0.113.0/24}], ports: [{port: 443}, {protocol: UDP, port: 5000, endPort: 5010}, {protocol: TCP, port: 80}, {protocol: ICMP}]}, {action: reject}]}",
        );
        let got = summary(&effective_egress(&s, &[PolicyView::namespaced(&p)]).unwrap());
        assert_eq!(
            got,
            [
                "Allow 203.0.113.0/24 tcp 443-443,80-80",
                "Allow 203.0.113.0/24 udp 5000-5010",
                "Allow 203.0.113.0/24 icmp",
                "default Deny"
            ]
        );
        // Ports without peers: every address on those ports.
        let q = tp(
            "team",
            "q",
            "selector: {}\negress: {rules: [{action: reject, ports: [{protocol: UDP}]}]}",
        );
        let got = summary(&effective_egress(&s, &[PolicyView::namespaced(&q)]).unwrap());
        assert_eq!(got, ["Deny 0.0.0.0/0 udp", "default Allow"]);
    }

    #[test]
    fn what_cannot_be_enforced_is_named_and_left_out() {
        let spec = spec(
            "selector: {}\ningress: {rules: [{action: allow}]}\negress: {rules: [{action: allow, to: [{service: {name: db}}, {cidr: 198.51.100.7/32}]}]}",
        );
        let (reason, message) = acceptance(&spec).unwrap_err();
        assert_eq!(reason, "UnresolvablePeer");
        assert!(message.contains("service \"db\"") && message.contains("ingress"), "{message}");
        let p = TrafficPolicy::new("x", spec);
        let mut p = p;
        p.metadata.namespace = Some("team".into());
        let got = summary(
            &effective_egress(&sandbox("team", "s", &[]), &[PolicyView::namespaced(&p)]).unwrap(),
        );
        assert_eq!(got, ["Allow 198.51.100.7/32", "default Allow"]);
        assert_eq!(
            acceptance(&super::tests::spec("selector: {}\negress: {rules: [{action: reject}]}")),
            Ok(())
        );
        let bad = super::tests::spec(
            "selector: {matchExpressions: [{key: a, operator: Near}]}\negress: {rules: [{action: reject}]}",
        );
        assert_eq!(acceptance(&bad).unwrap_err().0, "InvalidSelector");
    }

    #[test]
    fn e2b_rules_translate_as_the_manager_planned_them() {
        let s = sandbox("team", "s1", &[]);
        let p = tp(
            "team",
            "tp-x",
            "priority: 100\nselector: {matchLabels: {agents.kruise.io/sandbox-name: s1}}\negress: {rules: [{action: allow, to: [{cidr: 1.1.1.1/32}, {fqdn: pypi.org}]}, {action: reject, to: [{cidr: 0.0.0.0/0}]}]}",
        );
        let got = effective_egress(&s, &[PolicyView::namespaced(&p)]).unwrap();
        assert_eq!(
            summary(&got),
            ["Allow 1.1.1.1/32", "Allow pypi.org", "Deny 0.0.0.0/0", "default Allow"]
        );
    }
}
