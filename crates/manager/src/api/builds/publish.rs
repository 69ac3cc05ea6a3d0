//! The last part of a build: its SandboxTemplate written (the previous one kept to put back),
//! its SandboxSet created the first time, and the wait for a ready sandbox of it
//! ([`super::plan::rollout`]); a failure there puts the previous template back.

use std::time::{Duration, Instant};

use jiff::Timestamp;
use oka_api::{SandboxSet, SandboxTemplate};
use oka_store::{Preconditions, Store, StoreError};

use super::{Builds, plan};
use crate::api::AppState;
use crate::templatebuild::{BuildFailure, BuildOutput, BuildRequest};

const FINALIZE: &str = "finalize";

/// Writes the built template (and its pool, the first time) and waits for a ready sandbox of
/// it; on failure the previous template is put back (or, the first time, both removed).
pub(super) async fn publish<S: Store>(
    state: &AppState<S>,
    builds: &Builds,
    request: &BuildRequest,
    output: &BuildOutput,
) -> Result<(), BuildFailure> {
    let failure = |message: String| BuildFailure::at(FINALIZE, message);
    let template = plan::template_object(
        request,
        output,
        &builds.config.pod_annotations,
        builds.config.ready_timeout,
        Timestamp::now(),
    )
    .map_err(failure)?;
    let set = plan::set_object(request, builds.config.pool_replicas).map_err(failure)?;
    let namespace = request.namespace.as_str();
    let name = request.template_id.as_str();
    let revision_before = state
        .index
        .sandbox_set(Some(namespace), name)
        .and_then(|s| s.status.as_ref().and_then(|st| st.update_revision.clone()));
    let previous = write_template(&state.store, &template).await.map_err(failure)?;
    let created_set = match ensure_set(&state.store, &set).await {
        Ok(created) => created,
        Err(message) => {
            restore(&state.store, namespace, name, previous.as_ref(), false).await;
            return Err(failure(message));
        }
    };
    let same_spec = previous.as_ref().is_some_and(|p| p.spec == template.spec);
    let expect_new_revision = !same_spec;
    match wait_ready(
        state,
        namespace,
        name,
        revision_before,
        expect_new_revision,
        builds.config.ready_timeout,
    )
    .await
    {
        Ok(()) => Ok(()),
        Err(message) => {
            restore(&state.store, namespace, name, previous.as_ref(), created_set).await;
            Err(failure(message))
        }
    }
}

/// Creates or replaces the SandboxTemplate; the one it replaced, if any.
async fn write_template<S: Store>(
    store: &S,
    template: &SandboxTemplate,
) -> Result<Option<SandboxTemplate>, String> {
    let namespace = template.metadata.namespace.as_deref().unwrap_or_default();
    let name = template.metadata.name.as_deref().unwrap_or_default();
    for _ in 0..5 {
        match store.get::<SandboxTemplate>(namespace, name).await {
            Ok(existing) => {
                if !plan::written_by_builds(&existing.metadata) {
                    return Err(format!(
                        "the SandboxTemplate {namespace}/{name} was not made by a template build: \
                         not replaced"
                    ));
                }
                let mut updated = existing.clone();
                updated.spec = template.spec.clone();
                updated.metadata.annotations = template.metadata.annotations.clone();
                match store.update(namespace, &updated).await {
                    Ok(_) => return Ok(Some(existing)),
                    Err(StoreError::Conflict { .. }) => continue,
                    Err(e) => return Err(format!("cannot write the SandboxTemplate: {e}")),
                }
            }
            Err(StoreError::NotFound { .. }) => match store.create(namespace, template).await {
                Ok(_) => return Ok(None),
                Err(StoreError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(format!("cannot write the SandboxTemplate: {e}")),
            },
            Err(e) => return Err(format!("cannot read the SandboxTemplate: {e}")),
        }
    }
    Err(format!("the SandboxTemplate {namespace}/{name} kept changing while it was written"))
}

/// Creates the SandboxSet when missing; whether it did.
async fn ensure_set<S: Store>(store: &S, set: &SandboxSet) -> Result<bool, String> {
    let namespace = set.metadata.namespace.as_deref().unwrap_or_default();
    let name = set.metadata.name.as_deref().unwrap_or_default();
    match store.get::<SandboxSet>(namespace, name).await {
        Ok(existing) if plan::written_by_builds(&existing.metadata) => Ok(false),
        Ok(_) => Err(format!(
            "the SandboxSet {namespace}/{name} was not made by a template build: not replaced"
        )),
        Err(StoreError::NotFound { .. }) => match store.create(namespace, set).await {
            Ok(_) => Ok(true),
            Err(StoreError::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(format!("cannot write the SandboxSet: {e}")),
        },
        Err(e) => Err(format!("cannot read the SandboxSet: {e}")),
    }
}

/// Puts the previous template back (or removes the new objects of a first build).
async fn restore<S: Store>(
    store: &S,
    namespace: &str,
    name: &str,
    previous: Option<&SandboxTemplate>,
    created_set: bool,
) {
    let result = match previous {
        Some(previous) => {
            let mut back = previous.clone();
            back.metadata.resource_version = None;
            store.update(namespace, &back).await.map(drop)
        }
        None => {
            let template =
                store.delete::<SandboxTemplate>(namespace, name, &Preconditions::default()).await;
            let set = if created_set {
                store
                    .delete::<SandboxSet>(namespace, name, &Preconditions::default())
                    .await
                    .map(drop)
            } else {
                Ok(())
            };
            template.map(drop).and(set)
        }
    };
    if let Err(error) = result {
        tracing::warn!(%error, namespace, name, "cannot put back the template a failed build replaced");
    }
}

/// Waits until the pool has a ready sandbox of the new template (or is scaled to zero); fails
/// at once when a sandbox of it fails ([`plan::rollout`]).
async fn wait_ready<S: Store>(
    state: &AppState<S>,
    namespace: &str,
    name: &str,
    revision_before: Option<String>,
    expect_new_revision: bool,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(set) = state.index.sandbox_set(Some(namespace), name) {
            let members = state.index.sandboxes();
            match plan::rollout(&set, &members, revision_before.as_deref(), expect_new_revision) {
                plan::Rollout::Ready => return Ok(()),
                plan::Rollout::Failed(message) => {
                    return Err(format!("{message} (the previous template keeps serving)"));
                }
                plan::Rollout::Waiting => {}
            }
        }
        if Instant::now() >= deadline {
            let why = state
                .index
                .sandbox_set(Some(namespace), name)
                .and_then(|set| plan::not_ready_because(&set, &state.index.sandboxes()))
                .map(|why| format!("; the last word: {why}"))
                .unwrap_or_default();
            return Err(format!(
                "no sandbox of the built template became ready within {} s: check the start \
                 command and the ready command{why} (the previous template keeps serving)",
                timeout.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
