//! `scale sandboxset NAME --replicas N`: a JSON merge patch of `spec.replicas`, as the
//! reference sends it (not the /scale subresource, so it works where that is not served).

use kube::Api;
use kube::api::{Patch, PatchParams};
use oka_api::SandboxSet;

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
