//! `restart sandbox NAME -c C... | --all [--failure-policy Fail|Ignore]`.
//!
//! The reference creates an OpenKruise ContainerRecreateRequest for the sandbox's pod; oka runs
//! no such controller. It makes every check the reference makes, in its order and with its
//! messages, then asks oka's sandbox controller for the restart: the annotation
//! `agents.kruise.io/restart-requested-at` (the time of the request), written with the
//! sandbox's resourceVersion as a precondition. The controller ends the sandbox's processes and
//! starts its command again on the same files (same sandbox, same ID), records the request in
//! `agents.kruise.io/restarted-at`, and tells it with a `SandboxRestarted` Event.
//!
//! A local sandbox runs its template's first container only, so `-c` names that one (or
//! `--all` restarts what runs); a request while another is pending is refused, as the
//! reference refuses a second active ContainerRecreateRequest.

use kube::Api;
use oka_api::{Sandbox, SandboxPhase, SandboxTemplate, annotations};

use super::go_list;
use crate::args::RestartArgs;
use crate::client;
use crate::printer::Printer;

/// Checks the request, then asks the sandbox controller for it (see the module documentation).
pub async fn run(
    client: &kube::Client,
    ns: &str,
    args: &RestartArgs,
    printer: &Printer,
) -> anyhow::Result<()> {
    let name = &args.name;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let sandbox = api.get(name).await.map_err(|err| {
        anyhow::anyhow!("failed to get sandbox \"{name}\": {}", client::message(&err))
    })?;
    let phase = sandbox.status.as_ref().and_then(|s| s.phase.clone());
    if phase != Some(SandboxPhase::Running) {
        let phase = phase.map(|p| p.to_string()).unwrap_or_default();
        anyhow::bail!("sandbox \"{name}\" is not running (current phase: {phase})");
    }
    let policy = &args.failure_policy;
    anyhow::ensure!(
        matches!(policy.as_str(), "Fail" | "Ignore"),
        "invalid failure-policy \"{policy}\": must be Fail or Ignore"
    );
    anyhow::ensure!(
        !args.all || args.containers.is_empty(),
        "--all cannot be used together with -c"
    );
    let (containers, init_containers) = container_names(client, ns, &sandbox).await?;
    let chosen = if args.all {
        containers.clone()
    } else if args.containers.is_empty() {
        anyhow::bail!(
            "no containers specified: use -c <name> or --all to restart. Available containers: {}",
            go_list(&containers)
        );
    } else {
        for container in &args.containers {
            anyhow::ensure!(
                containers.contains(container) || init_containers.contains(container),
                "container \"{container}\" not found in sandbox \"{name}\""
            );
        }
        args.containers.clone()
    };
    // A local sandbox runs its template's first container only: that is what restarts.
    let runs = containers.first().cloned().unwrap_or_default();
    if let Some(container) = args.containers.iter().find(|c| **c != runs) {
        anyhow::bail!(
            "container \"{container}\" does not run in sandbox \"{name}\": oka runs a sandbox's \
             first container only (\"{runs}\"); restart that one, or use --all"
        );
    }
    let annotations = sandbox.metadata.annotations.clone().unwrap_or_default();
    if let Some(requested) = annotations.get(annotations::RESTART_REQUESTED_AT)
        && annotations.get(annotations::RESTARTED_AT) != Some(requested)
    {
        anyhow::bail!(
            "a restart of sandbox \"{name}\" is already pending (requested at {requested}); \
             wait for it to complete"
        );
    }
    let requested = jiff::Timestamp::now().to_string();
    let patch = serde_json::json!({"metadata": {
        "annotations": {annotations::RESTART_REQUESTED_AT: requested},
        "resourceVersion": sandbox.metadata.resource_version,
    }});
    api.patch(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
        .await
        .map_err(|err| {
            anyhow::anyhow!(
                "failed to request a restart of sandbox \"{name}\": {}",
                client::message(&err)
            )
        })?;
    printer.line(&format!(
        "sandbox.agents.kruise.io/{name} restart requested (containers: {})",
        go_list(&chosen)
    ));
    Ok(())
}

/// The names of the containers and of the init containers of `sandbox`'s template: its own,
/// or the SandboxTemplate's its `templateRef` names.
async fn container_names(
    client: &kube::Client,
    ns: &str,
    sandbox: &Sandbox,
) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    let template = match (&sandbox.spec.template, &sandbox.spec.template_ref) {
        (Some(template), _) => template.clone(),
        (None, Some(reference)) => {
            let api: Api<SandboxTemplate> = Api::namespaced(client.clone(), ns);
            let referenced = api.get(&reference.name).await.map_err(|err| {
                anyhow::anyhow!(
                    "failed to get SandboxTemplate \"{}\" referenced by sandbox \"{name}\": {}",
                    reference.name,
                    client::message(&err)
                )
            })?;
            referenced.spec.template.ok_or_else(|| {
                anyhow::anyhow!("SandboxTemplate \"{}\" has no template defined", reference.name)
            })?
        }
        (None, None) => anyhow::bail!("sandbox \"{name}\" has no template or templateRef"),
    };
    let pod = template.spec.unwrap_or_default();
    let names = |list: &[k8s_openapi::api::core::v1::Container]| {
        list.iter().map(|c| c.name.clone()).collect::<Vec<_>>()
    };
    Ok((names(&pod.containers), names(pod.init_containers.as_deref().unwrap_or_default())))
}
