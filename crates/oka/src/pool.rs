//! The warm pools that `oka serve` keeps with no configuration: a SandboxTemplate and a
//! SandboxSet, both named `base` (by default), on the runtime's default root; and, when
//! `oka-interpreter` is installed, the same pair named `code-interpreter-v1`, whose sandboxes run
//! the code interpreter server (the template `e2b_code_interpreter.Sandbox.create()` asks for).
//!
//! They are created once when missing and never overwritten, so an operator's edits (scaling
//! the set, changing the template) survive restarts. Deleting them is how to turn the pool off
//! for good; `defaultPool.replicas: 0` in the config keeps the objects but empties the pool.

use oka_api::{SandboxSet, SandboxTemplate};
use oka_store::{Store, StoreError};
use serde_json::json;
use tracing::info;

use crate::config::DefaultPoolConfig;

/// The default pool's command where there is no agent runtime: an idle process, so its
/// sandboxes still run.
pub const IDLE_COMMAND: &[&str] = &["/bin/sh", "-c", "exec sleep infinity"];

/// Creates the default SandboxTemplate and SandboxSet when they do not exist yet. With
/// `agent_runtime` (envd is installed) the template has no command: each sandbox is the agent
/// runtime alone (one process, PID 1) and whatever the SDK runs in it. Without it, a template
/// without a command could not run, so it runs [`IDLE_COMMAND`].
pub async fn ensure_default_pool<S: Store>(
    store: &S,
    config: &DefaultPoolConfig,
    agent_runtime: bool,
) -> Result<(), StoreError> {
    let command = if agent_runtime { &[][..] } else { IDLE_COMMAND };
    ensure_pool(store, config, command).await
}

/// Creates a SandboxTemplate running `command` (none: the agent runtime alone) and a SandboxSet
/// of it, both named and sized by `config`, when they do not exist yet.
pub async fn ensure_pool<S: Store>(
    store: &S,
    config: &DefaultPoolConfig,
    command: &[&str],
) -> Result<(), StoreError> {
    let namespace = config.namespace.as_str();
    let template = default_template(config, command)?;
    match store.create(namespace, &template).await {
        Ok(_) => info!(namespace, name = %config.name, "created a SandboxTemplate of oka serve"),
        Err(StoreError::AlreadyExists { .. }) => {}
        Err(e) => return Err(e),
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

/// The template: the runtime's default root (no image), `command` if any, and limits.
fn default_template(
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
            "labels": { "app.kubernetes.io/managed-by": "oka-serve" },
        },
        "spec": {
            "template": {
                "spec": {
                    "containers": [container],
                },
            },
        },
    });
    let mut object = object;
    if config.outbound {
        let outbound = oka_api::annotations::NETWORK_OUTBOUND;
        object["spec"]["template"]["metadata"] =
            json!({ "annotations": { oka_api::annotations::NETWORK: outbound } });
    }
    serde_json::from_value(object)
        .map_err(|e| StoreError::Invalid(format!("default template: {e}")))
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
        let template = default_template(&config, &[]).unwrap();
        let set = default_set(&config).unwrap();
        assert_eq!(set.spec.replicas, config.replicas);
        let scale = serde_json::to_value(&set.spec.scale_strategy).unwrap();
        assert_eq!(scale["maxUnavailable"], 32, "at most 32 sandboxes starting at once");
        assert_eq!(set.spec.template_ref.as_ref().map(|r| r.name.as_str()), Some("base"));
        let pod = template.spec.template.unwrap().spec.unwrap();
        assert_eq!(pod.containers[0].command, None, "the agent runtime alone");
        assert_eq!(pod.containers[0].working_dir.as_deref(), Some("/home/user"));
        let with = default_template(&config, &["server", "--port=1"]).unwrap();
        let pod = with.spec.template.unwrap().spec.unwrap();
        assert_eq!(pod.containers[0].command, Some(vec!["server".into(), "--port=1".into()]));
    }

    #[test]
    fn an_outbound_pool_says_so_on_its_pod_template() {
        let network = |outbound: bool| {
            let config = DefaultPoolConfig { outbound, ..DefaultPoolConfig::default() };
            let template = default_template(&config, &[]).unwrap().spec.template.unwrap();
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
            ensure_default_pool(&store, &config, agent_runtime).await.unwrap();
            let template: SandboxTemplate =
                store.get(&config.namespace, &config.name).await.unwrap();
            template.spec.template.unwrap().spec.unwrap().containers[0].command.clone()
        };
        assert_eq!(command(true).await, None);
        let idle = IDLE_COMMAND.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(command(false).await, Some(idle));
    }
}
