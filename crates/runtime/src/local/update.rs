//! `update`: change a sandbox in place, as far as Linux lets a running sandbox change.
//!
//! Expected flow: lock the slot; a spec equal to the recorded one changes nothing; a spec that
//! differs only in its resource limits gets them written to the sandbox's cgroups (when it has
//! processes; a stopped or hibernated sandbox gets them when it starts again), then the record
//! takes the new spec, so the next `ensure` with it matches. A spec whose root filesystem
//! differs (and perhaps its limits, nothing else) answers `RestartRequired` with nothing
//! changed: a new root cannot slide under running processes, and the caller restarts the
//! sandbox on it (the sandbox controller deletes the instance and ensures it again, Kubernetes'
//! in-place image update, where the container restarts on the new image). Anything else that
//! differs (the command, environment, network, user namespace, volumes but for the contents of
//! their files, security context) is refused, naming the fields,
//! with nothing changed: the reference forbids those in place too.
//!
//! A memory limit below what the sandbox uses now is refused by the kernel; the limits already
//! written stay, the record does not change, and the error says why.
//!
//! `checkpoint_restore` moves a sandbox onto a new root with its processes: hibernate (CRIU dump
//! of the tree, memory included), record the new spec and the new root's lower layer, restore.
//! The processes are the old ones, so only the root and the limits may change, and the root
//! only between directories (the default root's host binds are part of the checkpoint's mounts).
//! A restore that fails on the new root records the old spec again and restores onto it, so the
//! sandbox is never left on a root it cannot run on.

use std::sync::Arc;

use super::inspect::refresh;
use super::{Inner, blocking, from_cgroup, from_state};
use oka_runtime_api::{Operation, RootFs, RuntimeError, SandboxSpec, UpdateOutcome};

/// The fields of `new` that differ from `old` and cannot change in place.
pub(super) fn fixed_differences(old: &SandboxSpec, new: &SandboxSpec) -> Vec<&'static str> {
    let mut fields = Vec::new();
    if old.process != new.process {
        fields.push("process (command, args, environment, working directory, user)");
    }
    if old.root != new.root {
        fields.push("root filesystem");
    }
    if old.hostname != new.hostname {
        fields.push("hostname");
    }
    if old.network != new.network {
        fields.push("network");
    }
    if old.user_namespace != new.user_namespace {
        fields.push("user namespace");
    }
    if old.from_snapshot != new.from_snapshot {
        fields.push("snapshot");
    }
    // New contents of a ConfigMap's or Secret's files are taken at the next start.
    let without_contents = |spec: &SandboxSpec| {
        let mut mounts = spec.mounts.clone();
        for mount in &mut mounts {
            if let oka_runtime_api::MountSource::Files { files, .. } = &mut mount.source {
                files.clear();
            }
        }
        mounts
    };
    if without_contents(old) != without_contents(new) {
        fields.push("volumes");
    }
    if old.security != new.security {
        fields.push("security context");
    }
    fields
}

pub(super) async fn checkpoint_restore(
    inner: &Arc<Inner>,
    spec: &SandboxSpec,
) -> Result<(), RuntimeError> {
    spec.validate()?;
    let refuse =
        |reason: String| RuntimeError::Unsupported { operation: Operation::Update, reason };
    let old = {
        let Some(guard) = inner.lock(&spec.id, false).await else {
            return Err(RuntimeError::NotFound(spec.id.clone()));
        };
        let guard = refresh(inner, guard).await?;
        let Some(record) = guard.record.as_ref() else {
            return Err(RuntimeError::NotFound(spec.id.clone()));
        };
        let fixed: Vec<&str> = fixed_differences(&record.spec, spec)
            .into_iter()
            .filter(|f| *f != "root filesystem")
            .collect();
        if !fixed.is_empty() {
            return Err(refuse(format!(
                "a checkpoint-restore keeps the sandbox's processes, so only its root filesystem \
                 and limits can change; this change also touches the {}",
                fixed.join(", ")
            )));
        }
        match (&record.spec.root, &spec.root) {
            (RootFs::Default, RootFs::Default)
            | (
                RootFs::Directory(_) | RootFs::Layers(_),
                RootFs::Directory(_) | RootFs::Layers(_),
            ) => {}
            _ => {
                return Err(refuse(
                    "a checkpoint-restore moves a sandbox between root directories or images, or \
                     keeps the default root; it cannot switch to or from the default root"
                        .into(),
                ));
            }
        }
        record.spec.clone()
    };
    super::hibernate::hibernate(inner, &spec.id).await?;
    set_spec(inner, spec).await?;
    match super::hibernate::restore(inner, &spec.id).await {
        Ok(_) => {
            tracing::debug!(id = %spec.id, "sandbox moved onto its new root with its processes");
            Ok(())
        }
        Err(error) => {
            tracing::warn!(id = %spec.id, %error, "restore on the new root failed; back to the old");
            set_spec(inner, &old).await?;
            super::hibernate::restore(inner, &spec.id).await?;
            Err(error)
        }
    }
}

/// Records `spec` (and its root's lower layer) as the hibernated sandbox's.
async fn set_spec(inner: &Arc<Inner>, spec: &SandboxSpec) -> Result<(), RuntimeError> {
    let Some(guard) = inner.lock(&spec.id, false).await else {
        return Err(RuntimeError::NotFound(spec.id.clone()));
    };
    let mut guard = refresh(inner, guard).await?;
    let lower = inner.template_for(&spec.root).map_err(super::LocalError::from)?.lower;
    let new = spec.clone();
    let inner2 = Arc::clone(inner);
    blocking(move || -> Result<(), RuntimeError> {
        let Some(record) = guard.record.as_mut() else { return Ok(()) };
        record.spec = new;
        record.lower = lower;
        inner2.store.write(record).map_err(from_state)
    })
    .await?
}

pub(super) async fn update(
    inner: &Arc<Inner>,
    spec: &SandboxSpec,
) -> Result<UpdateOutcome, RuntimeError> {
    spec.validate()?;
    let Some(guard) = inner.lock(&spec.id, false).await else {
        return Err(RuntimeError::NotFound(spec.id.clone()));
    };
    let mut guard = refresh(inner, guard).await?;
    let Some(record) = guard.record.as_ref() else {
        return Err(RuntimeError::NotFound(spec.id.clone()));
    };
    if record.spec == *spec {
        return Ok(UpdateOutcome::Unchanged);
    }
    let fixed = fixed_differences(&record.spec, spec);
    if fixed == ["root filesystem"] {
        return Ok(UpdateOutcome::RestartRequired {
            reason: format!(
                "the root filesystem changes from {} to {}: the sandbox restarts on it",
                record.spec.root, spec.root
            ),
        });
    }
    if !fixed.is_empty() {
        return Err(RuntimeError::Unsupported {
            operation: Operation::Update,
            reason: format!(
                "only resource limits change in place; this change also touches the {}",
                fixed.join(", ")
            ),
        });
    }
    if let Some(controller) = inner.cgroups.missing_for(&spec.resources) {
        return Err(RuntimeError::Unsupported {
            operation: Operation::Update,
            reason: format!(
                "the {controller} limit needs the {controller} cgroup controller, which this \
                 runtime's cgroup hierarchy does not offer"
            ),
        });
    }
    let new = spec.clone();
    let inner2 = Arc::clone(inner);
    blocking(move || -> Result<(), RuntimeError> {
        let Some(record) = guard.record.as_mut() else { return Ok(()) };
        if let Some(instance) = &record.instance {
            instance.cgroup.update(&record.spec.resources, &new.resources).map_err(from_cgroup)?;
        }
        record.spec = new;
        inner2.store.write(record).map_err(from_state)
    })
    .await??;
    tracing::debug!(id = %spec.id, "sandbox limits updated in place");
    Ok(UpdateOutcome::Updated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oka_runtime_api::{Medium, Mount, MountSource, SandboxId, VolumeFile};

    #[test]
    fn volumes_and_the_security_context_cannot_change_in_place_but_file_contents_can() {
        let files = |content: &[u8]| Mount {
            target: "/cfg".into(),
            source: MountSource::Files {
                volume: "cfg".into(),
                files: vec![VolumeFile { path: "k".into(), mode: 0o644, content: content.into() }],
            },
            sub_path: None,
            read_only: true,
        };
        let mut old = SandboxSpec::new(SandboxId::new("s").unwrap(), vec!["sh".into()]);
        old.mounts = vec![files(b"1")];
        let mut new = old.clone();
        new.mounts = vec![files(b"2")];
        assert_eq!(fixed_differences(&old, &new), Vec::<&str>::new());
        new.mounts.push(Mount {
            target: "/scratch".into(),
            source: MountSource::EmptyDir { volume: "scratch".into(), medium: Medium::Disk },
            sub_path: None,
            read_only: false,
        });
        new.security.read_only_root = true;
        assert_eq!(fixed_differences(&old, &new), ["volumes", "security context"]);
    }
}
