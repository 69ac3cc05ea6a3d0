//! E2B's network options as a sandbox's TrafficPolicy, as the reference writes it: the pure
//! rule from a create's `allow_internet_access` and `network.allowOut/denyOut` (or a
//! `PUT /sandboxes/{id}/network`) to a [`TrafficPolicySpec`], with E2B's validation, the
//! object the manager writes, and the seam ([`EgressApplier`]) through which the manager has
//! the sandbox's resulting egress policy enforced where it runs.
//!
//! The rule (E2B's): `allowOut` entries are allow rules, then `denyOut` entries reject rules,
//! so an allowed address wins over a denied one; `allow_internet_access: false` (or the Sandbox
//! label `agents.kruise.io/allow-internet-access: "false"`) adds a last reject of everything.
//! Entries are IP addresses, CIDR networks or domain names (allow only; no wildcards), at most
//! [`MAX_ENTRIES`] per list. The TrafficPolicy controller
//! (`oka_controller::trafficpolicy`) turns it into the runtime's egress policy; the manager
//! applies the same result itself (the same planner, through the applier) before it answers.
//!
//! Why the manager applies the policy itself, before the create answers, rather than only the
//! controller after it: a warm-pool sandbox is running before its claim, so its policy can only
//! start at the claim, and the SDK's first command follows the 201 at once; one runtime call
//! (about 20 ms on a 2-core VM, most of it one `nft -f`; `cargo bench -p oka --bench serve`
//! compares creates with and without a policy) is the shortest way
//! to have it in force by then. The runtime keeps the policy with the sandbox, so stops,
//! hibernation and restarts of `oka serve` keep it.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use oka_api::trafficpolicy::{
    E2B_PRIORITY, TrafficAction, TrafficPolicyDirection, TrafficPolicyPeer, TrafficPolicyRule,
    TrafficPolicySpec,
};
use oka_api::{Sandbox, TrafficPolicy, annotations, labels};
use oka_runtime_api::Destination;

/// Most entries `allowOut` or `denyOut` may have.
pub const MAX_ENTRIES: usize = 100;

/// The rules of E2B's options as the reference's TrafficPolicy spec (priority
/// [`E2B_PRIORITY`], selecting the sandbox by `agents.kruise.io/sandbox-name`): an allow rule
/// naming every `allowOut` entry, a reject rule naming every `denyOut` entry, and without
/// internet access a last reject rule for everything; or why they are refused (the
/// reference's 400 messages).
pub fn plan_traffic_policy(
    sandbox_name: &str,
    allow_internet: bool,
    allow_out: &[String],
    deny_out: &[String],
) -> Result<TrafficPolicySpec, String> {
    let mut rules = Vec::new();
    for (list, name, action) in [
        (allow_out, "allowOut", TrafficAction::Allow),
        (deny_out, "denyOut", TrafficAction::Reject),
    ] {
        if list.len() > MAX_ENTRIES {
            return Err(format!("{name} list exceeds maximum of {MAX_ENTRIES} entries"));
        }
        let mut peers = Vec::new();
        for entry in list {
            if entry.contains('*') {
                return Err(format!(
                    "invalid {name} entry: {entry:?} wildcard domains are not supported: \
                     name each host"
                ));
            }
            let destination = Destination::parse(entry).map_err(|e| {
                format!("invalid {name} entry: {entry:?} is not a valid CIDR, IP, or domain ({e})")
            })?;
            peers.push(match destination {
                Destination::Cidr(cidr) => TrafficPolicyPeer {
                    cidr: Some(cidr.to_string()),
                    ..TrafficPolicyPeer::default()
                },
                Destination::Domain(domain) if action == TrafficAction::Allow => {
                    TrafficPolicyPeer { fqdn: Some(domain), ..TrafficPolicyPeer::default() }
                }
                Destination::Domain(_) => {
                    return Err(format!("domains are not supported in denyOut: {entry:?}"));
                }
            });
        }
        if !peers.is_empty() {
            rules.push(TrafficPolicyRule { to: peers, ..TrafficPolicyRule::new(action) });
        }
    }
    if !allow_internet {
        rules.push(TrafficPolicyRule::new(TrafficAction::Reject));
    }
    Ok(TrafficPolicySpec {
        priority: E2B_PRIORITY,
        selector: LabelSelector {
            match_labels: Some(BTreeMap::from([(
                labels::SANDBOX_NAME.to_owned(),
                sandbox_name.to_owned(),
            )])),
            match_expressions: None,
        },
        ingress: None,
        egress: Some(TrafficPolicyDirection { rules }),
    })
}

/// The TrafficPolicy of `sandbox`'s E2B network options, as the reference writes it:
/// `generateName: tp-` in the sandbox's namespace, annotation `agents.kruise.io/sandbox-id`,
/// a controller owner reference to the Sandbox that does not block its deletion.
pub fn traffic_policy_for(
    sandbox: &Sandbox,
    sandbox_id: &str,
    spec: TrafficPolicySpec,
) -> TrafficPolicy {
    let owner = OwnerReference {
        api_version: oka_api::API_VERSION.to_owned(),
        kind: "Sandbox".to_owned(),
        name: sandbox.metadata.name.clone().unwrap_or_default(),
        uid: sandbox.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(false),
    };
    TrafficPolicy {
        metadata: ObjectMeta {
            generate_name: Some("tp-".to_owned()),
            namespace: sandbox.metadata.namespace.clone(),
            annotations: Some(BTreeMap::from([(
                annotations::SANDBOX_ID.to_owned(),
                sandbox_id.to_owned(),
            )])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

/// Whether `policy` is the E2B network policy of `sandbox` (owned by it, annotated with a
/// sandbox ID).
pub fn is_policy_of(policy: &TrafficPolicy, sandbox: &Sandbox) -> bool {
    policy.metadata.namespace == sandbox.metadata.namespace
        && policy
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(annotations::SANDBOX_ID))
        && policy
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && Some(&o.uid) == sandbox.metadata.uid.as_ref())
}

/// E2B's `allowOut`/`denyOut` of a TrafficPolicy the manager wrote: the peers of its allow
/// rules, then of its reject rules (a rule without peers is the internet access, not an
/// entry).
pub fn network_of(spec: &TrafficPolicySpec) -> (Vec<String>, Vec<String>) {
    let (mut allow, mut deny) = (Vec::new(), Vec::new());
    for rule in spec.egress.iter().flat_map(|d| &d.rules) {
        let list = match rule.action {
            TrafficAction::Allow => &mut allow,
            TrafficAction::Reject => &mut deny,
        };
        list.extend(rule.to.iter().filter_map(|p| p.cidr.clone().or_else(|| p.fqdn.clone())));
    }
    (allow, deny)
}

/// Whether a create asks for an egress policy at all: `allow_internet_access: false` or a
/// rule. Without one the sandbox keeps its template's network as it is.
pub fn asks_for_policy(
    allow_internet: Option<bool>,
    allow_out: &[String],
    deny_out: &[String],
) -> bool {
    allow_internet == Some(false) || !allow_out.is_empty() || !deny_out.is_empty()
}

/// Enforces egress policies where sandboxes run (the runtime that runs them).
pub trait EgressApplier: Send + Sync + 'static {
    /// `Ok` when policies can be enforced here; else the message naming the missing feature
    /// and how to turn it on.
    fn available(&self) -> Result<(), String>;

    /// Makes the egress policy of `sandbox` what its TrafficPolicies give with `policy` (just
    /// written, perhaps not yet in any cache) among them; returns once it is in force.
    fn apply<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        policy: &'a TrafficPolicy,
    ) -> BoxFuture<'a, Result<(), String>>;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn s(list: &[&str]) -> Vec<String> {
        list.iter().map(|e| (*e).to_owned()).collect()
    }

    fn rules(spec: &TrafficPolicySpec) -> Vec<(TrafficAction, Vec<String>)> {
        spec.egress
            .iter()
            .flat_map(|d| &d.rules)
            .map(|r| {
                let to = r.to.iter().map(|p| p.cidr.clone().or(p.fqdn.clone()).unwrap()).collect();
                (r.action, to)
            })
            .collect()
    }

    #[test]
    fn allow_list_then_reject_list_then_no_internet_as_the_reference_writes_them() {
        let p = plan_traffic_policy("s1", true, &s(&["1.1.1.1", "pypi.org"]), &s(&["0.0.0.0/0"]))
            .unwrap();
        assert_eq!(p.priority, 100);
        assert_eq!(
            p.selector.match_labels.as_ref().unwrap()["agents.kruise.io/sandbox-name"],
            "s1"
        );
        assert_eq!(
            rules(&p),
            [
                (TrafficAction::Allow, s(&["1.1.1.1/32", "pypi.org"])),
                (TrafficAction::Reject, s(&["0.0.0.0/0"])),
            ]
        );
        assert_eq!(network_of(&p), (s(&["1.1.1.1/32", "pypi.org"]), s(&["0.0.0.0/0"])));
        let reject_only = plan_traffic_policy("s1", false, &[], &[]).unwrap();
        assert_eq!(rules(&reject_only), [(TrafficAction::Reject, vec![])]);
        assert_eq!(network_of(&reject_only), (vec![], vec![]));
        assert!(!asks_for_policy(None, &[], &[]));
        assert!(!asks_for_policy(Some(true), &[], &[]));
        assert!(asks_for_policy(Some(false), &[], &[]));
        assert!(asks_for_policy(None, &[], &s(&["10.0.0.0/8"])));
    }

    #[test]
    fn the_object_is_the_references() {
        let mut sandbox = Sandbox::new("s1", oka_api::SandboxSpec::default());
        sandbox.metadata.namespace = Some("team".into());
        sandbox.metadata.uid = Some("u1".into());
        let spec = plan_traffic_policy("s1", false, &[], &[]).unwrap();
        let tp = traffic_policy_for(&sandbox, "abc123", spec);
        assert_eq!(tp.metadata.generate_name.as_deref(), Some("tp-"));
        assert_eq!(
            tp.metadata.annotations.as_ref().unwrap()["agents.kruise.io/sandbox-id"],
            "abc123"
        );
        let owner = &tp.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.controller, owner.block_owner_deletion), (Some(true), Some(false)));
        assert!(is_policy_of(&tp, &sandbox));
        sandbox.metadata.uid = Some("u2".into());
        assert!(!is_policy_of(&tp, &sandbox), "another sandbox of the same name");
    }

    #[test]
    fn bad_entries_are_refused_by_name() {
        let plan =
            |allow: &[&str], deny: &[&str]| plan_traffic_policy("s", true, &s(allow), &s(deny));
        let err = plan(&["*.example.com"], &[]).unwrap_err();
        assert!(err.starts_with("invalid allowOut entry: \"*.example.com\" wildcard"), "{err}");
        let err = plan(&[], &["10.0.0.0/33"]).unwrap_err();
        assert!(err.contains("\"10.0.0.0/33\" is not a valid CIDR, IP, or domain"), "{err}");
        let err = plan(&[], &["example.com"]).unwrap_err();
        assert_eq!(err, "domains are not supported in denyOut: \"example.com\"");
        let many: Vec<String> = (0..101).map(|i| format!("10.0.0.{}", i % 250)).collect();
        assert_eq!(
            plan_traffic_policy("s", true, &many, &[]).unwrap_err(),
            "allowOut list exceeds maximum of 100 entries"
        );
    }
}
