//! Fixture builders for tests (this crate's, and other crates' with the `testing` feature).
//!
//! ```
//! # #[cfg(feature = "testing")] {
//! use oka_api::{Sandbox, SandboxPhase};
//! let sandbox = Sandbox::test().pooled("pool").phase(SandboxPhase::Running).ready().build();
//! assert!(sandbox.is_controlled_by_sandbox_set() && sandbox.is_ready());
//! # }
//! ```

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};

use crate::labels;
use crate::sandbox::{Sandbox, SandboxPhase, SandboxSpec, SandboxStatus};
use crate::sandboxset::SANDBOX_SET_KIND;

impl Sandbox {
    /// Starts a fixture: `default/sbx-test`, no owner, an empty status (no phase, no conditions).
    pub fn test() -> SandboxBuilder {
        SandboxBuilder {
            sandbox: Sandbox {
                metadata: ObjectMeta {
                    name: Some("sbx-test".into()),
                    namespace: Some("default".into()),
                    uid: Some("sbx-test-uid".into()),
                    ..ObjectMeta::default()
                },
                spec: SandboxSpec::default(),
                status: Some(SandboxStatus::default()),
            },
        }
    }
}

/// Builds a [`Sandbox`] fixture step by step; see [`Sandbox::test`].
#[derive(Clone, Debug)]
#[must_use]
pub struct SandboxBuilder {
    sandbox: Sandbox,
}

impl SandboxBuilder {
    /// Sets the name (and a matching UID).
    pub fn name(mut self, name: &str) -> Self {
        self.sandbox.metadata.name = Some(name.into());
        self.sandbox.metadata.uid = Some(format!("{name}-uid"));
        self
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.sandbox.metadata.namespace = Some(namespace.into());
        self
    }

    /// Makes it an unclaimed member of pool `sandbox_set`: controller ownerReference to that
    /// SandboxSet, labels `sandbox-pool=<name>` and `sandbox-claimed=false`.
    pub fn pooled(self, sandbox_set: &str) -> Self {
        self.owner(OwnerReference {
            api_version: crate::API_VERSION.into(),
            kind: SANDBOX_SET_KIND.into(),
            name: sandbox_set.into(),
            uid: format!("{sandbox_set}-uid"),
            controller: Some(true),
            block_owner_deletion: Some(true),
        })
        .label(labels::SANDBOX_POOL, sandbox_set)
        .label(labels::SANDBOX_CLAIMED, labels::FALSE)
    }

    /// Makes it claimed: drops SandboxSet ownerReferences, label `sandbox-claimed=true`.
    pub fn claimed(mut self) -> Self {
        if let Some(owners) = self.sandbox.metadata.owner_references.as_mut() {
            owners.retain(|o| o.kind != SANDBOX_SET_KIND);
        }
        self.label(labels::SANDBOX_CLAIMED, labels::TRUE)
    }

    /// Appends an ownerReference.
    pub fn owner(mut self, owner: OwnerReference) -> Self {
        self.sandbox.metadata.owner_references.get_or_insert_with(Vec::new).push(owner);
        self
    }

    /// Sets a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.sandbox
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    /// Sets an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.sandbox
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    /// Sets `status.phase`.
    pub fn phase(mut self, phase: SandboxPhase) -> Self {
        self.status().phase = Some(phase);
        self
    }

    /// Sets condition `Ready=True`.
    pub fn ready(self) -> Self {
        self.condition(crate::conditions::sandbox::READY, crate::conditions::TRUE)
    }

    /// Sets condition `Ready=False`.
    pub fn not_ready(self) -> Self {
        self.condition(crate::conditions::sandbox::READY, crate::conditions::FALSE)
    }

    /// Sets a condition of this type and status (reason `Test`, transition at the Unix epoch).
    pub fn condition(mut self, type_: &str, status: &str) -> Self {
        let condition = Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "Test".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        };
        let list = self.status().conditions.get_or_insert_with(Vec::new);
        list.retain(|c| c.type_ != type_);
        list.push(condition);
        self
    }

    /// Sets `spec.paused: true`.
    pub fn paused(self) -> Self {
        self.paused_flag(true)
    }

    /// Sets `spec.paused` explicitly.
    pub fn paused_flag(mut self, paused: bool) -> Self {
        self.sandbox.spec.paused = Some(paused);
        self
    }

    /// Sets `metadata.deletionTimestamp` (to the Unix epoch).
    pub fn deleting(mut self) -> Self {
        self.sandbox.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        self
    }

    /// Sets `spec.shutdownTime`.
    pub fn shutdown_at(mut self, at: Timestamp) -> Self {
        self.sandbox.spec.shutdown_time = Some(Time(at));
        self
    }

    /// Sets `spec.pauseTime`.
    pub fn pause_at(mut self, at: Timestamp) -> Self {
        self.sandbox.spec.pause_time = Some(Time(at));
        self
    }

    /// Removes the status altogether.
    pub fn no_status(mut self) -> Self {
        self.sandbox.status = None;
        self
    }

    /// The sandbox.
    pub fn build(self) -> Sandbox {
        self.sandbox
    }

    fn status(&mut self) -> &mut SandboxStatus {
        self.sandbox.status.get_or_insert_with(SandboxStatus::default)
    }
}

impl From<SandboxBuilder> for Sandbox {
    fn from(builder: SandboxBuilder) -> Self {
        builder.build()
    }
}
