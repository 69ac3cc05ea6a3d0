//! Returning a used sandbox to its warm pool (the reference's "recycling", the reuse spec's
//! "reuse"): the pure parts.
//!
//! # Expected flow
//!
//! The manager's `DELETE` of a Running sandbox whose pod template carries
//! `agents.kruise.io/cleanup-enabled: "true"` (or the alias `reuse-enabled`) sets
//! `agents.kruise.io/cleanup: "true"` instead of deleting it. The sandbox planner then:
//!
//! 1. Running and [`recycle_requested`] ⇒ phase `Recycling`, `Recycling=False/RecyclingStarted`,
//!    `Ready=False`, and the instance is deleted: its processes and its writable layer go, so
//!    nothing of the last user (files, processes, envd's access token) reaches the next one.
//!    (The reference keeps the instance and calls a cleanup hook that does nothing in its
//!    community edition; a fresh instance is the only reset that leaves nothing behind.)
//! 2. `RecyclingStarted` and no instance ⇒ `RecyclingCompleted` and a fresh instance from the
//!    sandbox's template.
//! 3. `RecyclingCompleted` and the instance runs ⇒ the metadata goes back to what a pool member
//!    has ([`returned_to_pool`]: the controller ownerReference to the SandboxSet, `sandbox-claimed
//!    =false`, the claim's labels, annotations and timers gone), then phase Running, `Ready`,
//!    `Recycling=True/RecyclingSucceeded` and the reuse count one higher. The pool's index sees an
//!    available member again.
//!
//! Every step writes the status before the runtime verb it plans, and each verb is idempotent,
//! so a crash at any point repeats at most the last step.
//!
//! A sandbox with persistent volume claims, or a paused one, is not recycled:
//! `Recycling=False/RecyclingRejected` says why, and it stays as it is. A recycle that fails (no
//! pool label, still recycling [`RECYCLE_TIMEOUT`] after it started: `RecyclingTimeout`; its pool
//! gone, or the pool moved to another revision since the sandbox was made: `RecyclingFailed`)
//! deletes the sandbox, or, with `agents.kruise.io/cleanup-retain-on-failure: <duration>`, keeps
//! it (phase Recycling) until its `shutdownTime`, now + that duration.
//!
//! Where this differs from the reference: no grace period between the cleanup and the return
//! (the reference waits `--recycle-grace-period`, 10 s, for its asynchronous cleanup to settle;
//! oka's cleanup is a fresh instance, complete once it runs, so the sandbox is available again
//! at once).

use std::collections::BTreeMap;

use jiff::SignedDuration;
use oka_api::{Sandbox, SandboxSet, annotations, labels};

/// How long a recycle may take before the sandbox is deleted instead (the reference's
/// `--recycle-timeout`).
pub const RECYCLE_TIMEOUT: SignedDuration = SignedDuration::from_secs(60);

pub use oka_api::recycle_requested;

/// Whether the sandbox has persistent volume claims (`volumeClaimTemplates`, or volumes of its
/// template that are claims): such a sandbox cannot be recycled, its data would reach the next
/// user.
pub fn has_volume_claims(sandbox: &Sandbox) -> bool {
    let templates = sandbox.spec.volume_claim_templates.as_ref().is_some_and(|v| !v.is_empty());
    let volumes = sandbox
        .spec
        .template
        .as_ref()
        .and_then(|t| t.spec.as_ref())
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.persistent_volume_claim.is_some()));
    templates || volumes
}

/// Why `sandbox` may not go back to `set`: it was made from another revision than the pool's
/// current one (label `agents.kruise.io/template-hash` ≠ `status.updateRevision`; not checked
/// while the pool reports none).
pub fn stale_for(sandbox: &Sandbox, set: &SandboxSet) -> Option<String> {
    let current = set.status.as_ref().and_then(|s| s.update_revision.as_deref())?;
    let own = sandbox.metadata.labels.as_ref().and_then(|l| l.get(labels::TEMPLATE_HASH));
    (!current.is_empty() && own.map(String::as_str) != Some(current)).then(|| {
        format!(
            "the sandbox's template-hash {} is not its pool's revision {current}",
            own.map_or("(none)", String::as_str)
        )
    })
}

/// `agents.kruise.io/cleanup-retain-on-failure`: how long a sandbox whose recycle failed is
/// kept (a positive Go duration); `None` (deleted at once) when unset or invalid.
pub fn retain_on_failure(sandbox: &Sandbox) -> Option<SignedDuration> {
    let value =
        sandbox.metadata.annotations.as_ref()?.get(annotations::CLEANUP_RETAIN_ON_FAILURE)?;
    oka_api::parse_go_duration(value)
        .ok()
        .and_then(|d| SignedDuration::try_from(d).ok())
        .filter(|d| d.is_positive())
}

/// The pool the sandbox came from (label `agents.kruise.io/sandbox-pool`).
pub fn pool_of(sandbox: &Sandbox) -> Option<&str> {
    sandbox
        .metadata
        .labels
        .as_ref()?
        .get(labels::SANDBOX_POOL)
        .map(String::as_str)
        .filter(|p| !p.is_empty())
}

/// The caller's label and annotation keys the claim recorded in `updated-metadata-in-claim`
/// (`{"labels":[…],"annotations":[…]}`); none when it is missing or malformed.
fn updated_in_claim(sandbox: &Sandbox) -> (Vec<String>, Vec<String>) {
    let Some(json) = sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::UPDATED_METADATA_IN_CLAIM))
    else {
        return (Vec::new(), Vec::new());
    };
    let value: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let keys = |field: &str| -> Vec<String> {
        value[field]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|k| k.as_str().map(str::to_owned))
            .collect()
    };
    (keys("labels"), keys("annotations"))
}

/// `sandbox` as a member of `set` again (pure): the inverse of the manager's claim. The
/// resourceVersion is kept, so the update fails if the sandbox changed since it was read.
pub fn returned_to_pool(sandbox: &Sandbox, set: &SandboxSet) -> Sandbox {
    let mut returned = sandbox.clone();
    let meta = &mut returned.metadata;
    let (claim_labels, claim_annotations) = updated_in_claim(sandbox);
    let label_map = meta.labels.get_or_insert_with(BTreeMap::new);
    for key in
        claim_labels.iter().map(String::as_str).chain([labels::SANDBOX_ID, labels::CLAIM_NAME])
    {
        label_map.remove(key);
    }
    label_map.insert(labels::SANDBOX_CLAIMED.into(), labels::FALSE.into());
    if let Some(notes) = meta.annotations.as_mut() {
        for key in claim_annotations
            .iter()
            .map(String::as_str)
            .chain(annotations::CLEARED_ON_RECYCLE.iter().copied())
        {
            notes.remove(key);
        }
        if notes.is_empty() {
            meta.annotations = None;
        }
    }
    let owners = meta.owner_references.get_or_insert_with(Vec::new);
    owners.retain(|o| o.controller != Some(true));
    owners.push(crate::sandboxset::pool_owner_reference(set));
    returned.spec.shutdown_time = None;
    returned.spec.pause_time = None;
    // A claim may have chosen another pause (E2B's filesystem-only timeout pause).
    returned.spec.pause_strategy.clone_from(&set.spec.pause_strategy);
    returned
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claimed() -> Sandbox {
        serde_json::from_value(json!({
            "apiVersion": oka_api::API_VERSION,
            "kind": "Sandbox",
            "metadata": {
                "name": "pool-abc", "namespace": "default", "resourceVersion": "7",
                "labels": {
                    "agents.kruise.io/sandbox-pool": "pool",
                    "agents.kruise.io/sandbox-claimed": "true",
                    "agents.kruise.io/sandbox-id": "i123",
                    "agents.kruise.io/template-hash": "r1",
                    "team": "blue",
                },
                "annotations": {
                    "agents.kruise.io/cleanup-enabled": "true",
                    "agents.kruise.io/cleanup": "true",
                    "agents.kruise.io/owner": "key-1",
                    "agents.kruise.io/lock": "l-1",
                    "e2b.agents.kruise.io/envd-access-token": "secret",
                    "agents.kruise.io/updated-metadata-in-claim": "{\"labels\":[\"team\"],\"annotations\":[\"note\"]}",
                    "note": "from the caller",
                    "kept": "from the template",
                },
            },
            "spec": {
                "shutdownTime": "2026-12-02T10:00:00Z",
                "pauseTime": "2026-12-02T09:00:00Z",
            },
        }))
        .unwrap()
    }

    fn set() -> SandboxSet {
        serde_json::from_value(json!({
            "apiVersion": oka_api::API_VERSION,
            "kind": "SandboxSet",
            "metadata": { "name": "pool", "namespace": "default", "uid": "set-uid" },
            "spec": { "replicas": 1 },
        }))
        .unwrap()
    }

    #[test]
    fn a_returned_sandbox_is_a_pool_member_with_nothing_of_its_claim() {
        let before = claimed();
        assert!(recycle_requested(&before));
        assert_eq!(pool_of(&before), Some("pool"));
        let after = returned_to_pool(&before, &set());
        let l = after.metadata.labels.as_ref().unwrap();
        assert_eq!(l[labels::SANDBOX_CLAIMED], "false");
        assert!(!l.contains_key(labels::SANDBOX_ID) && !l.contains_key("team"));
        assert_eq!(l[labels::TEMPLATE_HASH], "r1");
        let a = after.metadata.annotations.as_ref().unwrap();
        assert_eq!(a.keys().collect::<Vec<_>>(), ["agents.kruise.io/cleanup-enabled", "kept"]);
        assert!(!recycle_requested(&after), "the trigger cannot fire again");
        let owner = after.controller_ref().unwrap();
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("SandboxSet", "pool", "set-uid")
        );
        assert!(after.spec.shutdown_time.is_none() && after.spec.pause_time.is_none());
        assert_eq!(after.metadata.resource_version.as_deref(), Some("7"));
        // Pure and idempotent: returning a returned sandbox changes nothing.
        assert_eq!(returned_to_pool(&after, &set()), after);
    }

    #[test]
    fn recycling_needs_both_the_trigger_and_the_capability() {
        let mut only_trigger = claimed();
        only_trigger.metadata.annotations.as_mut().unwrap().remove(annotations::CLEANUP_ENABLED);
        assert!(!recycle_requested(&only_trigger));
        let mut alias = claimed();
        let a = alias.metadata.annotations.as_mut().unwrap();
        a.remove(annotations::CLEANUP);
        a.insert(annotations::REUSE.into(), "true".into());
        assert!(recycle_requested(&alias));
    }
}
