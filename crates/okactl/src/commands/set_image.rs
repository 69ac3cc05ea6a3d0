//! `set image sandboxset NAME C=IMG... [--wait]`: sets images in a SandboxSet's inline
//! template (get, modify, update; again on a conflict with another writer), then optionally
//! follows the rollout.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::Api;
use kube::api::{ApiResource, DynamicObject, PostParams};
use oka_api::SandboxSet;
use serde_json::Value;

use super::parse_images;
use super::status::{Diagnosis, SetProgress};
use crate::args::SetImageArgs;
use crate::client;
use crate::printer::Printer;

/// How often `--wait` looks (the reference's interval).
const POLL: Duration = Duration::from_secs(3);
/// After this many polls without progress, `--wait` explains what is stuck.
const STALLED_POLLS: u32 = 3;
/// How many times an update that lost a race with another writer is retried (client-go's
/// `retry.DefaultRetry` steps).
const CONFLICT_RETRIES: usize = 5;

/// The checks that need no server: the resource type and the `C=IMG` arguments.
pub fn validate(args: &SetImageArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        matches!(args.resource.as_str(), "sandboxset" | "sbs"),
        "unsupported resource type \"{}\", only 'sandboxset' (sbs) is supported",
        args.resource
    );
    parse_images(&args.images)?;
    Ok(())
}

/// Updates the images, prints which containers changed, and with `--wait` follows the rollout.
pub async fn run(
    client: &kube::Client,
    ns: &str,
    args: &SetImageArgs,
    printer: &Printer,
) -> anyhow::Result<()> {
    let name = &args.name;
    let images = parse_images(&args.images)?;
    let resource = ApiResource::erase::<SandboxSet>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    let mut attempt = 0;
    let updated = loop {
        let mut set = api.get(name).await.map_err(|err| {
            anyhow::anyhow!("failed to get sandboxset \"{name}\": {}", client::message(&err))
        })?;
        let changed = apply_images(&mut set, name, &images)?;
        match api.replace(name, &PostParams::default(), &set).await {
            Ok(_) => break changed,
            Err(err) if client::is_conflict(&err) && attempt + 1 < CONFLICT_RETRIES => {
                attempt += 1;
            }
            Err(err) => {
                anyhow::bail!("failed to update sandboxset \"{name}\": {}", client::message(&err))
            }
        }
    };
    printer.line(&format!(
        "sandboxset.agents.kruise.io/{name} image updated ({})",
        updated.join(", ")
    ));
    if args.wait {
        let typed: Api<SandboxSet> = Api::namespaced(client.clone(), ns);
        let waiting = wait(client, &typed, ns, name, printer);
        if args.timeout.is_zero() {
            waiting.await?;
        } else {
            tokio::time::timeout(args.timeout, waiting).await.map_err(|_| {
                anyhow::anyhow!(
                    "timed out waiting for sandboxset \"{name}\" update: context deadline exceeded"
                )
            })??;
        }
    }
    Ok(())
}

/// Sets the images in `set`'s inline template: the names of the containers changed,
/// containers first, then init containers, in template order.
///
/// The object is edited as JSON, not as `oka_api::SandboxSet`: a round trip through typed
/// values would drop pod fields newer than k8s-openapi's (a cluster's), and the update would
/// erase them.
fn apply_images(
    set: &mut DynamicObject,
    name: &str,
    images: &[(String, String)],
) -> anyhow::Result<Vec<String>> {
    let Some(pod) = set.data.pointer_mut("/spec/template/spec").filter(|p| p.is_object()) else {
        anyhow::bail!(
            "sandboxset \"{name}\" uses a TemplateRef; modify the referenced SandboxTemplate directly instead"
        );
    };
    let names = |pod: &Value, list: &str| -> Vec<String> {
        pod[list]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str().map(str::to_owned))
            .collect()
    };
    let known: BTreeSet<String> =
        names(pod, "containers").into_iter().chain(names(pod, "initContainers")).collect();
    if let Some((missing, _)) = images.iter().find(|(c, _)| !known.contains(c)) {
        anyhow::bail!("container \"{missing}\" not found in sandboxset \"{name}\"");
    }
    let mut changed = Vec::new();
    for list in ["containers", "initContainers"] {
        for container in pod.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
            let Some(container_name) = container["name"].as_str().map(str::to_owned) else {
                continue;
            };
            // The last argument for a container wins, as with repeated `kubectl set image`.
            if let Some((_, image)) = images.iter().rev().find(|(c, _)| *c == container_name) {
                container["image"] = Value::String(image.clone());
                changed.push(container_name);
            }
        }
    }
    Ok(changed)
}

/// Polls until the pool runs the new template everywhere and is available, printing progress
/// and, when it stalls, why.
async fn wait(
    client: &kube::Client,
    api: &Api<SandboxSet>,
    ns: &str,
    name: &str,
    printer: &Printer,
) -> anyhow::Result<()> {
    let mut diagnosis = Diagnosis::default();
    let mut last_updated = None;
    let mut unchanged = 0;
    loop {
        let set = api.get(name).await.map_err(|err| {
            anyhow::anyhow!("failed to get sandboxset \"{name}\": {}", client::message(&err))
        })?;
        let progress = SetProgress::of(&set);
        if progress.complete {
            printer.line(&format!(
                "Update completed ({}/{} updated, {}/{} available)",
                progress.updated, progress.replicas, progress.available, progress.replicas
            ));
            return Ok(());
        }
        if last_updated != Some(progress.updated) {
            last_updated = Some(progress.updated);
            unchanged = 0;
            printer.line(&progress.line(name));
        } else {
            unchanged += 1;
            if unchanged >= STALLED_POLLS {
                unchanged = 0;
                diagnosis.run(client, ns, name, printer).await?;
            }
        }
        tokio::time::sleep(POLL).await;
    }
}
