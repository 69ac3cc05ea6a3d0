//! `status sandboxset NAME` and `status sandboxupdateops NAME`: one progress line each; for a
//! SandboxSet that is not complete, why its sandboxes are stuck.

use std::collections::BTreeSet;

use kube::Api;
use kube::api::ListParams;
use oka_api::{Sandbox, SandboxPhase, SandboxSet, SandboxUpdateOps};

use crate::client;
use crate::printer::Printer;

/// How far a SandboxSet's rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetProgress {
    /// `spec.replicas`.
    pub replicas: i32,
    /// `status.updatedReplicas`.
    pub updated: i32,
    /// `status.updatedAvailableReplicas`.
    pub available: i32,
    /// Updated and available everywhere, in a status written for the current spec.
    pub complete: bool,
}

impl SetProgress {
    /// The progress `set`'s status shows.
    ///
    /// Complete needs `observedGeneration` to have reached `generation` as well (the
    /// reference does not check it): right after `set image` the status still counts the old
    /// template's sandboxes as updated, and `--wait` would end before the rollout began.
    pub fn of(set: &SandboxSet) -> Self {
        let status = set.status.clone().unwrap_or_default();
        let replicas = set.spec.replicas;
        let updated = status.updated_replicas.unwrap_or(0);
        let available = status.updated_available_replicas.unwrap_or(0);
        let observed =
            status.observed_generation.unwrap_or(0) >= set.metadata.generation.unwrap_or(0);
        let complete = observed && updated >= replicas && available >= replicas;
        Self { replicas, updated, available, complete }
    }

    /// The reference's line: `%-30s %-10s %d/%d updated  %d/%d available`.
    pub fn line(&self, name: &str) -> String {
        let state = if self.complete { "Complete" } else { "Updating" };
        format!(
            "{name:<30} {state:<10} {}/{} updated  {}/{} available",
            self.updated, self.replicas, self.available, self.replicas
        )
    }
}

/// Why a pool's sandboxes are stuck; each explanation is printed once per run.
#[derive(Debug, Default)]
pub struct Diagnosis {
    printed: BTreeSet<String>,
}

impl Diagnosis {
    /// Prints `  Sandbox <name> is <Phase>: <why>` for each Pending or Failed sandbox of the
    /// pool `set` not explained yet.
    ///
    /// The pool's members are found by `agents.kruise.io/sandbox-pool` (the reference uses
    /// `sandbox-template`, which names the SandboxTemplate when the pool has a templateRef).
    /// Why: `status.message`; else the `Ready=False` condition's message (oka has no pod, so
    /// no `PodScheduled` or container states: its Ready condition says why the runtime could
    /// not start it); else `unknown reason`.
    pub async fn run(
        &mut self,
        client: &kube::Client,
        ns: &str,
        set: &str,
        printer: &Printer,
    ) -> anyhow::Result<()> {
        let api: Api<Sandbox> = Api::namespaced(client.clone(), ns);
        let selector = format!("{}={set}", oka_api::labels::SANDBOX_POOL);
        let sandboxes =
            api.list(&ListParams::default().labels(&selector)).await.map_err(|err| {
                anyhow::anyhow!("failed to list sandboxes: {}", client::message(&err))
            })?;
        for sandbox in sandboxes {
            let status = sandbox.status.clone().unwrap_or_default();
            let phase = match status.phase {
                None | Some(SandboxPhase::Pending) => "Pending",
                Some(SandboxPhase::Failed) => "Failed",
                Some(_) => continue,
            };
            let ready_false = status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == oka_api::conditions::sandbox::READY && c.status == "False")
                .map(|c| c.message.clone());
            let why = [status.message.clone(), ready_false]
                .into_iter()
                .flatten()
                .find(|m| !m.is_empty())
                .unwrap_or_else(|| "unknown reason".to_owned());
            let name = sandbox.metadata.name.unwrap_or_default();
            let line = format!("  Sandbox {name} is {phase}: {why}");
            if self.printed.insert(line.clone()) {
                printer.line(&line);
            }
        }
        Ok(())
    }
}

/// `status sandboxset NAME`: the progress line, then the diagnosis when not complete. Exits 0
/// even when stuck, as the reference does.
pub async fn sandbox_set(
    client: &kube::Client,
    ns: &str,
    name: &str,
    printer: &Printer,
) -> anyhow::Result<()> {
    let api: Api<SandboxSet> = Api::namespaced(client.clone(), ns);
    let set = api.get(name).await.map_err(|err| {
        anyhow::anyhow!("failed to get sandboxset \"{name}\": {}", client::message(&err))
    })?;
    let progress = SetProgress::of(&set);
    printer.line(&progress.line(name));
    if !progress.complete {
        Diagnosis::default().run(client, ns, name, printer).await?;
    }
    Ok(())
}

/// `status sandboxupdateops NAME`: the progress line; a Failed one is an error (the user
/// manual's behaviour; the reference's code exits 0).
pub async fn update_ops(
    client: &kube::Client,
    ns: &str,
    name: &str,
    printer: &Printer,
) -> anyhow::Result<()> {
    let api: Api<SandboxUpdateOps> = Api::namespaced(client.clone(), ns);
    let ops = api.get(name).await.map_err(|err| {
        anyhow::anyhow!("failed to get sandboxupdateops \"{name}\": {}", client::message(&err))
    })?;
    let status = ops.status.unwrap_or_default();
    let phase = status.phase.as_ref().map(|p| p.to_string()).unwrap_or_default();
    printer.line(&format!(
        "{name:<30} {phase:<10} {}/{} updated  {} updating  {} failed",
        status.updated_replicas, status.replicas, status.updating_replicas, status.failed_replicas
    ));
    anyhow::ensure!(phase != "Failed", "sandboxupdateops \"{name}\" is in Failed phase");
    Ok(())
}
