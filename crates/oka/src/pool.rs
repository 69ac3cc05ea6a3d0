//! The warm pools that `oka serve` keeps with no configuration: a SandboxTemplate and a
//! SandboxSet, both named `base` (by default), on the root of the default template `base`
//! ([`crate::templates`]); and, when `oka-interpreter` is installed, the same pair named
//! `code-interpreter-v1`, on that template's root, whose sandboxes run the code interpreter
//! server (the template `e2b_code_interpreter.Sandbox.create()` asks for). A pool's root
//! ([`PoolRoot`]) is named by the container's `image`: a built root by its absolute path, an OCI
//! image (`templates.images`) by its reference, pulled as for any template; with none (no
//! runtime here) it is the runtime's default root.
//!
//! They are created once when missing and never overwritten, so an operator's edits (scaling
//! the set, changing the template) survive restarts. Deleting them is how to turn the pool off
//! for good; `defaultPool.replicas: 0` in the config keeps the objects but empties the pool.
//!
//! The one exception is a SandboxTemplate oka wrote and nobody changed since, when oka's
//! default changes (a new template root, or a switch between a built root and an image):
//! [`plan_template`]. oka marks the templates it writes
//! with [`MANAGED_SPEC_HASH`], the hash of the spec it wrote; one whose spec still has that hash
//! (or, written before the mark existed, still is exactly the old default on the runtime's
//! default root) is moved to the new spec, and its pool rolls its sandboxes over as for any
//! template change. An edited one is left as it is, with a log line saying how to get the new
//! default (delete the template).

use std::path::Path;

use oka_api::{SandboxSet, SandboxTemplate};
use oka_store::{Store, StoreError};
use serde_json::json;
use sha2::{Digest as _, Sha256};
use tracing::{info, warn};

use crate::config::DefaultPoolConfig;

/// The default pool's command where there is no agent runtime: an idle process, so its
/// sandboxes still run.
pub const IDLE_COMMAND: &[&str] = &["/bin/sh", "-c", "exec sleep infinity"];

/// What a default pool's sandboxes run on: the container's `image`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolRoot<'a> {
    /// No `image`: the runtime's default root (the host's system directories).
    Default,
    /// A root built here (`image` is its absolute path).
    Directory(&'a Path),
    /// An OCI image (`image` is its reference), pulled with `pull_secrets` (the names of
    /// Secrets in the pool's namespace, the pod template's `imagePullSecrets`).
    Image {
        /// The image reference.
        reference: &'a str,
        /// The Secrets it is pulled with.
        pull_secrets: &'a [String],
    },
}

impl std::fmt::Display for PoolRoot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolRoot::Default => f.write_str("the default root"),
            PoolRoot::Directory(root) => write!(f, "the root {}", root.display()),
            PoolRoot::Image { reference, .. } => write!(f, "the image {reference}"),
        }
    }
}

/// Creates the default SandboxTemplate and SandboxSet when they do not exist yet. With
/// `agent_runtime` (envd is installed) the template has no command: each sandbox is the agent
/// runtime alone (one process, PID 1) and whatever the SDK runs in it. Without it, a template
/// without a command could not run, so it runs [`IDLE_COMMAND`].
pub async fn ensure_default_pool<S: Store>(
    store: &S,
    config: &DefaultPoolConfig,
    agent_runtime: bool,
    root: PoolRoot<'_>,
) -> Result<(), StoreError> {
    let command = if agent_runtime { &[][..] } else { IDLE_COMMAND };
    ensure_pool(store, config, command, root).await
}

/// Creates a SandboxTemplate running `command` (none: the agent runtime alone) on `root` and a
/// SandboxSet of it, both named and sized by `config`, when they do not exist yet; moves an
/// unedited template of oka's to `root` ([`plan_template`]).
pub async fn ensure_pool<S: Store>(
    store: &S,
    config: &DefaultPoolConfig,
    command: &[&str],
    root: PoolRoot<'_>,
) -> Result<(), StoreError> {
    let namespace = config.namespace.as_str();
    let template = default_template(config, command, root)?;
    let legacy = legacy_template(config, command)?;
    let existing = match store.get::<SandboxTemplate>(namespace, &config.name).await {
        Ok(existing) => Some(existing),
        Err(StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e),
    };
    match plan_template(existing.as_ref(), &template, &legacy) {
        TemplateAction::Create => match store.create(namespace, &template).await {
            Ok(_) => {
                info!(namespace, name = %config.name, "created a SandboxTemplate of oka serve")
            }
            Err(StoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e),
        },
        TemplateAction::Keep => {}
        TemplateAction::KeepEdited => warn!(
            namespace,
            name = %config.name,
            root = %root,
            "the SandboxTemplate was edited since oka serve wrote it: left as it is, not moved to \
             {root}; delete it (kubectl delete sandboxtemplate) to get the new default"
        ),
        TemplateAction::Replace => {
            let mut updated = existing.unwrap_or_else(|| template.clone());
            updated.spec = template.spec.clone();
            updated
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(MANAGED_SPEC_HASH.to_owned(), spec_hash(&template));
            store.update(namespace, &updated).await?;
            info!(
                namespace,
                name = %config.name,
                root = %root,
                "moved oka serve's unedited SandboxTemplate to its new default, {root}"
            );
        }
    }
    let set = default_set(config)?;
    match store.create(namespace, &set).await {
        Ok(_) => info!(
            namespace,
            name = %config.name,
            replicas = config.replicas,
            "created a SandboxSet of oka serve"
        ),
        Err(StoreError::AlreadyExists { .. }) => {}
        Err(e) => return Err(e),
    }
    Ok(())
}

/// The annotation on a SandboxTemplate oka serve wrote: the hash of the spec it wrote
/// ([`spec_hash`]), so a later start can tell whether anyone changed it since.
pub const MANAGED_SPEC_HASH: &str = "agents.kruise.io/managed-spec-hash";

/// What to do with a default pool's SandboxTemplate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateAction {
    /// There is none: create it.
    Create,
    /// It is what oka would write, or not oka's to change.
    Keep,
    /// oka wrote it and someone changed it since: keep it, and say so.
    KeepEdited,
    /// oka wrote it, nobody changed it, and oka's default changed: replace its spec.
    Replace,
}

/// The rule for a default pool's template: `existing` (if any) against what oka would write
/// now (`desired`, marked with its spec hash) and what oka wrote before templates were marked
/// (`legacy`: the same pool on the runtime's default root, unmarked).
pub fn plan_template(
    existing: Option<&SandboxTemplate>,
    desired: &SandboxTemplate,
    legacy: &SandboxTemplate,
) -> TemplateAction {
    let Some(existing) = existing else { return TemplateAction::Create };
    let current = spec_hash(existing);
    if current == spec_hash(desired) {
        return TemplateAction::Keep;
    }
    let mark = existing.metadata.annotations.as_ref().and_then(|a| a.get(MANAGED_SPEC_HASH));
    let managed_by_oka = existing
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY))
        .is_some_and(|v| v == MANAGED_BY_OKA_SERVE);
    match mark {
        Some(mark) if *mark == current => TemplateAction::Replace,
        Some(_) => TemplateAction::KeepEdited,
        None if managed_by_oka && current == spec_hash(legacy) => TemplateAction::Replace,
        None if managed_by_oka => TemplateAction::KeepEdited,
        None => TemplateAction::Keep,
    }
}

/// The label on the objects oka serve creates.
const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Its value.
const MANAGED_BY_OKA_SERVE: &str = "oka-serve";

/// The hash of a template's spec, hex (SHA-256 of its JSON).
pub fn spec_hash(template: &SandboxTemplate) -> String {
    let json = serde_json::to_vec(&template.spec).unwrap_or_default();
    Sha256::digest(&json).iter().map(|b| format!("{b:02x}")).collect()
}

/// The template: `root` (an absolute path or an image reference in `image`, with the image's
/// pull Secrets; none: the runtime's default root), `command` if any, and limits; marked with
/// its spec hash when it names a root or an image.
fn default_template(
    config: &DefaultPoolConfig,
    command: &[&str],
    root: PoolRoot<'_>,
) -> Result<SandboxTemplate, StoreError> {
    let mut container = json!({
        "name": "sandbox",
        "workingDir": "/home/user",
        "resources": {
            "limits": { "cpu": config.cpu, "memory": config.memory },
        },
    });
    let mut pod = json!({});
    match root {
        PoolRoot::Default => {}
        PoolRoot::Directory(root) => container["image"] = json!(root.display().to_string()),
        PoolRoot::Image { reference, pull_secrets } => {
            container["image"] = json!(reference);
            if !pull_secrets.is_empty() {
                let secrets: Vec<_> =
                    pull_secrets.iter().map(|name| json!({ "name": name })).collect();
                pod["imagePullSecrets"] = json!(secrets);
            }
        }
    }
    if !command.is_empty() {
        container["command"] = json!(command);
    }
    pod["containers"] = json!([container]);
    let object = json!({
        "apiVersion": oka_api::API_VERSION,
        "kind": "SandboxTemplate",
        "metadata": {
            "name": config.name,
            "namespace": config.namespace,
            "labels": { "app.kubernetes.io/managed-by": "oka-serve" },
        },
        "spec": {
            "template": {
                "spec": pod,
            },
        },
    });
    let mut object = object;
    if config.outbound {
        let outbound = oka_api::annotations::NETWORK_OUTBOUND;
        object["spec"]["template"]["metadata"] =
            json!({ "annotations": { oka_api::annotations::NETWORK: outbound } });
    }
    let mut template: SandboxTemplate = serde_json::from_value(object)
        .map_err(|e| StoreError::Invalid(format!("default template: {e}")))?;
    if root != PoolRoot::Default {
        let hash = spec_hash(&template);
        template
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(MANAGED_SPEC_HASH.to_owned(), hash);
    }
    Ok(template)
}

/// The template oka serve wrote before it marked its templates (on the runtime's default root,
/// unmarked), to recognise an unedited one of an older installation. Frozen: it must stay what
/// that version wrote, whatever [`default_template`] becomes.
fn legacy_template(
    config: &DefaultPoolConfig,
    command: &[&str],
) -> Result<SandboxTemplate, StoreError> {
    let mut container = json!({
        "name": "sandbox",
        "workingDir": "/home/user",
        "resources": {
            "limits": { "cpu": config.cpu, "memory": config.memory },
        },
    });
    if !command.is_empty() {
        container["command"] = json!(command);
    }
    let object = json!({
        "apiVersion": oka_api::API_VERSION,
        "kind": "SandboxTemplate",
        "metadata": {
            "name": config.name,
            "namespace": config.namespace,
            "labels": { MANAGED_BY: MANAGED_BY_OKA_SERVE },
        },
        "spec": { "template": { "spec": { "containers": [container] } } },
    });
    serde_json::from_value(object)
        .map_err(|e| StoreError::Invalid(format!("legacy default template: {e}")))
}

/// The pool: `replicas` warm sandboxes from the template above, at most `maxStarting` of them
/// starting at once.
fn default_set(config: &DefaultPoolConfig) -> Result<SandboxSet, StoreError> {
    let object = json!({
        "apiVersion": oka_api::API_VERSION,
        "kind": "SandboxSet",
        "metadata": {
            "name": config.name,
            "namespace": config.namespace,
            "labels": { "app.kubernetes.io/managed-by": "oka-serve" },
        },
        "spec": {
            "replicas": config.replicas,
            "templateRef": { "name": config.name },
            "scaleStrategy": { "maxUnavailable": config.max_starting.max(1) },
        },
    });
    serde_json::from_value(object).map_err(|e| StoreError::Invalid(format!("default pool: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_objects_are_valid_api_objects() {
        let config = DefaultPoolConfig::default();
        let template = default_template(&config, &[], PoolRoot::Default).unwrap();
        let set = default_set(&config).unwrap();
        assert_eq!(set.spec.replicas, config.replicas);
        let scale = serde_json::to_value(&set.spec.scale_strategy).unwrap();
        assert_eq!(scale["maxUnavailable"], 32, "at most 32 sandboxes starting at once");
        assert_eq!(set.spec.template_ref.as_ref().map(|r| r.name.as_str()), Some("base"));
        let pod = template.spec.template.unwrap().spec.unwrap();
        assert_eq!(pod.containers[0].command, None, "the agent runtime alone");
        assert_eq!(pod.containers[0].working_dir.as_deref(), Some("/home/user"));
        let with = default_template(&config, &["server", "--port=1"], PoolRoot::Default).unwrap();
        let pod = with.spec.template.unwrap().spec.unwrap();
        assert_eq!(pod.containers[0].command, Some(vec!["server".into(), "--port=1".into()]));
    }

    #[test]
    fn an_outbound_pool_says_so_on_its_pod_template() {
        let network = |outbound: bool| {
            let config = DefaultPoolConfig { outbound, ..DefaultPoolConfig::default() };
            let template =
                default_template(&config, &[], PoolRoot::Default).unwrap().spec.template.unwrap();
            template
                .metadata
                .and_then(|m| m.annotations?.get(oka_api::annotations::NETWORK).cloned())
        };
        assert_eq!(network(true).as_deref(), Some(oka_api::annotations::NETWORK_OUTBOUND));
        assert_eq!(network(false), None);
    }

    #[tokio::test]
    async fn the_default_pool_runs_an_idle_command_only_without_the_agent_runtime() {
        use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
        let command = |agent_runtime: bool| async move {
            let dir = tempfile::tempdir().unwrap();
            let store = EmbeddedStore::open(&dir.path().join("s.redb"), EmbeddedOptions::default())
                .unwrap();
            let config = DefaultPoolConfig::default();
            ensure_default_pool(&store, &config, agent_runtime, PoolRoot::Default).await.unwrap();
            let template: SandboxTemplate =
                store.get(&config.namespace, &config.name).await.unwrap();
            template.spec.template.unwrap().spec.unwrap().containers[0].command.clone()
        };
        assert_eq!(command(true).await, None);
        let idle = IDLE_COMMAND.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(command(false).await, Some(idle));
    }

    #[tokio::test]
    async fn an_unedited_template_moves_to_the_new_root_and_an_edited_one_stays() {
        use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
        let dir = tempfile::tempdir().unwrap();
        let store =
            EmbeddedStore::open(&dir.path().join("s.redb"), EmbeddedOptions::default()).unwrap();
        let config = DefaultPoolConfig::default();
        let image = |store: EmbeddedStore| async move {
            let t: SandboxTemplate = store.get("default", "base").await.unwrap();
            t.spec.template.unwrap().spec.unwrap().containers[0].image.clone()
        };
        // An installation from before template roots: the default root, unmarked.
        store.create("default", &legacy_template(&config, &[]).unwrap()).await.unwrap();
        assert_eq!(image(store.clone()).await, None);
        // The first start with a built root moves it there (the store's copy hashes as written).
        ensure_default_pool(&store, &config, true, PoolRoot::Directory(Path::new("/t/base-1")))
            .await
            .unwrap();
        assert_eq!(image(store.clone()).await.as_deref(), Some("/t/base-1"));
        // A new definition: moved again, since nobody edited it.
        ensure_default_pool(&store, &config, true, PoolRoot::Directory(Path::new("/t/base-2")))
            .await
            .unwrap();
        assert_eq!(image(store.clone()).await.as_deref(), Some("/t/base-2"));
        // An operator edits it: a later default leaves it alone.
        let mut edited: SandboxTemplate = store.get("default", "base").await.unwrap();
        let pod = edited.spec.template.as_mut().unwrap().spec.as_mut().unwrap();
        pod.containers[0].image = Some("/srv/my-root".into());
        store.update("default", &edited).await.unwrap();
        ensure_default_pool(&store, &config, true, PoolRoot::Directory(Path::new("/t/base-3")))
            .await
            .unwrap();
        assert_eq!(image(store.clone()).await.as_deref(), Some("/srv/my-root"));
    }

    #[tokio::test]
    async fn switching_between_a_built_root_and_an_image_moves_an_unedited_template() {
        use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
        let dir = tempfile::tempdir().unwrap();
        let store =
            EmbeddedStore::open(&dir.path().join("s.redb"), EmbeddedOptions::default()).unwrap();
        let config = DefaultPoolConfig::default();
        let pod = |store: EmbeddedStore| async move {
            let t: SandboxTemplate = store.get("default", "base").await.unwrap();
            t.spec.template.unwrap().spec.unwrap()
        };
        let secrets = ["registry-login".to_owned()];
        let image =
            PoolRoot::Image { reference: "127.0.0.1:5000/oka/base:1", pull_secrets: &secrets };
        // A built root first, then an image: moved to the image, with its pull Secret.
        ensure_default_pool(&store, &config, true, PoolRoot::Directory(Path::new("/t/base-1")))
            .await
            .unwrap();
        ensure_default_pool(&store, &config, true, image).await.unwrap();
        let on_image = pod(store.clone()).await;
        assert_eq!(on_image.containers[0].image.as_deref(), Some("127.0.0.1:5000/oka/base:1"));
        let secrets: Vec<_> =
            on_image.image_pull_secrets.unwrap().into_iter().map(|s| s.name).collect();
        assert_eq!(secrets, ["registry-login"]);
        assert_eq!(on_image.containers[0].command, None, "the agent runtime alone");
        // The same image again: kept as it is.
        let before: SandboxTemplate = store.get("default", "base").await.unwrap();
        ensure_default_pool(&store, &config, true, image).await.unwrap();
        let after: SandboxTemplate = store.get("default", "base").await.unwrap();
        assert_eq!(before.metadata.resource_version, after.metadata.resource_version);
        // Back to a built root: moved again, without the pull Secret.
        ensure_default_pool(&store, &config, true, PoolRoot::Directory(Path::new("/t/base-1")))
            .await
            .unwrap();
        let on_root = pod(store.clone()).await;
        assert_eq!(on_root.containers[0].image.as_deref(), Some("/t/base-1"));
        assert_eq!(on_root.image_pull_secrets, None);
        // Edited by an operator: a switch to an image leaves it alone.
        let mut edited: SandboxTemplate = store.get("default", "base").await.unwrap();
        let spec = edited.spec.template.as_mut().unwrap().spec.as_mut().unwrap();
        spec.containers[0].working_dir = Some("/srv".into());
        store.update("default", &edited).await.unwrap();
        ensure_default_pool(&store, &config, true, image).await.unwrap();
        assert_eq!(pod(store.clone()).await.containers[0].image.as_deref(), Some("/t/base-1"));
    }

    #[test]
    fn a_template_that_is_not_oka_s_is_never_replaced() {
        let config = DefaultPoolConfig::default();
        let desired =
            default_template(&config, &[], PoolRoot::Directory(Path::new("/t/base-1"))).unwrap();
        let legacy = legacy_template(&config, &[]).unwrap();
        let mut foreign = legacy.clone();
        foreign.metadata.labels = None;
        assert_eq!(plan_template(Some(&foreign), &desired, &legacy), TemplateAction::Keep);
        assert_eq!(plan_template(Some(&legacy), &desired, &legacy), TemplateAction::Replace);
        assert_eq!(plan_template(Some(&desired), &desired, &legacy), TemplateAction::Keep);
        assert_eq!(plan_template(None, &desired, &legacy), TemplateAction::Create);
    }
}
