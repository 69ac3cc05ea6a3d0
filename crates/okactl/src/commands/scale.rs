//! `scale sandboxset NAME --replicas N`: a JSON merge patch of `spec.replicas`, as the
//! reference sends it (not the /scale subresource, so it works where that is not served).
//! When a PoolAutoscaler manages the pool, a warning says the new size may not last.

use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use oka_api::{PoolAutoscaler, SandboxSet};

use crate::client;
use crate::printer::Printer;

/// `--replicas` must not be negative.
pub fn validate(replicas: i32) -> anyhow::Result<()> {
    anyhow::ensure!(replicas >= 0, "--replicas must be >= 0, got {replicas}");
    Ok(())
}

/// Patches the SandboxSet and says so.
pub async fn run(
    client: &kube::Client,
    ns: &str,
    name: &str,
    replicas: i32,
    printer: &Printer,
) -> anyhow::Result<()> {
    let api: Api<SandboxSet> = Api::namespaced(client.clone(), ns);
    let patch = serde_json::json!({ "spec": { "replicas": replicas } });
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {
            printer.line(&format!("sandboxset.agents.kruise.io/{name} scaled to {replicas}"));
            if let Some(autoscaler) = autoscaler_of(client, ns, name).await {
                printer.warn(&format!(
                    "PoolAutoscaler \"{autoscaler}\" manages sandboxset \"{name}\": its bounds apply at once, a capacity policy overrides this size at its next sample, a cron policy at its next fire"
                ));
            }
            Ok(())
        }
        Err(err) if client::is_not_found(&err) => {
            anyhow::bail!("sandboxset \"{name}\" not found")
        }
        Err(err) => {
            anyhow::bail!("failed to scale sandboxset \"{name}\": {}", client::message(&err))
        }
    }
}

/// The active (not suspended) PoolAutoscaler of SandboxSet `name`, if one can be listed.
async fn autoscaler_of(client: &kube::Client, ns: &str, name: &str) -> Option<String> {
    let api: Api<PoolAutoscaler> = Api::namespaced(client.clone(), ns);
    let list = api.list(&ListParams::default()).await.ok()?;
    list.items
        .into_iter()
        .find(|pa| !pa.spec.suspend && pa.spec.scale_target_ref.name == name)
        .and_then(|pa| pa.metadata.name)
}
