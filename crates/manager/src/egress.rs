//! E2B's network options as a sandbox's egress policy: the pure rule from a create's
//! `allow_internet_access` and `network.allowOut/denyOut` (or a `PUT /sandboxes/{id}/network`)
//! to an [`EgressPolicy`], with E2B's validation, and the seam ([`EgressApplier`]) through
//! which the manager has it enforced where the sandbox runs.
//!
//! The rule (E2B's, which the reference writes as a TrafficPolicy): `allowOut` entries are
//! allow rules, then `denyOut` entries deny rules, so an allowed address wins over a denied
//! one; `allow_internet_access: false` (or the Sandbox label
//! `agents.kruise.io/allow-internet-access: "false"`) makes the default deny. Entries are IP
//! addresses, CIDR networks or domain names (allow only; no wildcards), at most
//! [`MAX_ENTRIES`] per list.
//!
//! Why the manager applies the policy itself, before the create answers, rather than a
//! controller after it: a warm-pool sandbox is running before its claim, so its policy can only
//! start at the claim, and the SDK's first command follows the 201 at once; one runtime call
//! (about 20 ms on a 2-core VM, most of it one `nft -f`; `cargo bench -p oka --bench serve`
//! compares creates with and without a policy) is the shortest way
//! to have it in force by then. The runtime keeps the policy with the sandbox, so stops,
//! hibernation and restarts of `oka serve` keep it.

use futures::future::BoxFuture;
use oka_api::Sandbox;
use oka_runtime_api::{Destination, EgressAction, EgressPolicy, EgressRule};

/// Most entries `allowOut` or `denyOut` may have.
pub const MAX_ENTRIES: usize = 100;

/// The policy of E2B's options, or why they are refused (the reference's 400 messages).
pub fn plan_policy(
    allow_internet: bool,
    allow_out: &[String],
    deny_out: &[String],
) -> Result<EgressPolicy, String> {
    let mut policy =
        if allow_internet { EgressPolicy::allow_all() } else { EgressPolicy::deny_all() };
    for (list, name, action) in
        [(allow_out, "allowOut", EgressAction::Allow), (deny_out, "denyOut", EgressAction::Deny)]
    {
        if list.len() > MAX_ENTRIES {
            return Err(format!("{name} list exceeds maximum of {MAX_ENTRIES} entries"));
        }
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
            if action == EgressAction::Deny && matches!(destination, Destination::Domain(_)) {
                return Err(format!("domains are not supported in denyOut: {entry:?}"));
            }
            policy.rules.push(EgressRule::new(action, destination));
        }
    }
    Ok(policy)
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

    /// Makes `policy` the egress policy of `sandbox`; returns once it is in force.
    fn apply<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        policy: &'a EgressPolicy,
    ) -> BoxFuture<'a, Result<(), String>>;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn s(list: &[&str]) -> Vec<String> {
        list.iter().map(|e| (*e).to_owned()).collect()
    }

    #[test]
    fn allow_rules_come_first_and_no_internet_is_a_default_of_deny() {
        let p = plan_policy(true, &s(&["1.1.1.1", "pypi.org"]), &s(&["0.0.0.0/0"])).unwrap();
        assert_eq!(p.default, EgressAction::Allow);
        let rules: Vec<_> = p.rules.iter().map(|r| (r.action, r.destination.to_string())).collect();
        assert_eq!(
            rules,
            [
                (EgressAction::Allow, "1.1.1.1/32".to_owned()),
                (EgressAction::Allow, "pypi.org".to_owned()),
                (EgressAction::Deny, "0.0.0.0/0".to_owned()),
            ]
        );
        assert_eq!(plan_policy(false, &[], &[]).unwrap(), EgressPolicy::deny_all());
        assert!(!asks_for_policy(None, &[], &[]));
        assert!(!asks_for_policy(Some(true), &[], &[]));
        assert!(asks_for_policy(Some(false), &[], &[]));
        assert!(asks_for_policy(None, &[], &s(&["10.0.0.0/8"])));
    }

    #[test]
    fn bad_entries_are_refused_by_name() {
        let err = plan_policy(true, &s(&["*.example.com"]), &[]).unwrap_err();
        assert!(err.starts_with("invalid allowOut entry: \"*.example.com\" wildcard"), "{err}");
        let err = plan_policy(true, &[], &s(&["10.0.0.0/33"])).unwrap_err();
        assert!(err.contains("\"10.0.0.0/33\" is not a valid CIDR, IP, or domain"), "{err}");
        let err = plan_policy(true, &[], &s(&["example.com"])).unwrap_err();
        assert_eq!(err, "domains are not supported in denyOut: \"example.com\"");
        let many: Vec<String> = (0..101).map(|i| format!("10.0.0.{}", i % 250)).collect();
        assert_eq!(
            plan_policy(true, &many, &[]).unwrap_err(),
            "allowOut list exceeds maximum of 100 entries"
        );
    }
}
