//! `create sandboxupdateops C=IMG... -l SELECTOR`: a SandboxUpdateOps whose patch sets the
//! images on every sandbox the selector picks (checked to pick at least one first).

use std::str::FromStr as _;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};
use oka_api::sandboxupdateops::SandboxUpdateOpsSpec;
use oka_api::{Sandbox, SandboxUpdateOps};
use oka_store::selector::{Requirement, Selector};

use super::parse_images;
use crate::client;
use crate::printer::Printer;

/// Creates the SandboxUpdateOps and says which.
pub async fn update_ops(
    client: &kube::Client,
    ns: &str,
    images: &[String],
    selector: &str,
    printer: &Printer,
) -> anyhow::Result<()> {
    anyhow::ensure!(!selector.is_empty(), "--selector (-l) is required");
    let mut images = parse_images(images)?;
    let parsed = Selector::from_str(selector).map_err(|err| {
        let reason = match err {
            oka_store::StoreError::Invalid(reason) => reason,
            other => other.to_string(),
        };
        anyhow::anyhow!("invalid label selector \"{selector}\": {reason}")
    })?;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let matching = sandboxes
        .list(&ListParams::default().labels(&parsed.to_string()).limit(1))
        .await
        .map_err(|err| anyhow::anyhow!("failed to list sandboxes: {}", client::message(&err)))?;
    anyhow::ensure!(
        !matching.items.is_empty(),
        "no sandboxes found matching selector \"{selector}\" in namespace \"{ns}\""
    );
    images.sort();
    images.dedup_by(|a, b| a.0 == b.0);
    let containers: Vec<serde_json::Value> = images
        .iter()
        .map(|(name, image)| serde_json::json!({ "name": name, "image": image }))
        .collect();
    let ops = SandboxUpdateOps {
        metadata: ObjectMeta {
            generate_name: Some("suo-".to_owned()),
            namespace: Some(ns.to_owned()),
            ..Default::default()
        },
        spec: SandboxUpdateOpsSpec {
            selector: label_selector(&parsed),
            patch: Some(serde_json::json!({ "spec": { "containers": containers } })),
            ..Default::default()
        },
        status: None,
    };
    let api: Api<SandboxUpdateOps> = Api::namespaced(client.clone(), ns);
    let created = api.create(&PostParams::default(), &ops).await.map_err(|err| {
        anyhow::anyhow!("failed to create SandboxUpdateOps: {}", client::message(&err))
    })?;
    let listed: Vec<String> = images.iter().map(|(c, i)| format!("{c}={i}")).collect();
    printer.line(&format!(
        "sandboxupdateops.agents.kruise.io/{} created (selector: {selector}, images: {})",
        created.metadata.name.unwrap_or_default(),
        listed.join(", ")
    ));
    Ok(())
}

/// `selector` as a LabelSelector, as Go's `metav1.ParseToLabelSelector` builds it: equalities
/// become `matchLabels`, everything else `matchExpressions` (`!=` is `NotIn` one value).
fn label_selector(selector: &Selector) -> LabelSelector {
    let mut match_labels = std::collections::BTreeMap::new();
    let mut expressions = Vec::new();
    let expression = |key: &str, operator: &str, values: Option<Vec<String>>| {
        LabelSelectorRequirement { key: key.to_owned(), operator: operator.to_owned(), values }
    };
    for requirement in selector.requirements() {
        match requirement {
            Requirement::Equals(k, v) => {
                match_labels.insert(k.clone(), v.clone());
            }
            Requirement::NotEquals(k, v) => {
                expressions.push(expression(k, "NotIn", Some(vec![v.clone()])));
            }
            Requirement::In(k, vs) => expressions.push(expression(k, "In", Some(vs.clone()))),
            Requirement::NotIn(k, vs) => {
                expressions.push(expression(k, "NotIn", Some(vs.clone())));
            }
            Requirement::Exists(k) => expressions.push(expression(k, "Exists", None)),
            Requirement::DoesNotExist(k) => {
                expressions.push(expression(k, "DoesNotExist", None));
            }
        }
    }
    LabelSelector {
        match_labels: (!match_labels.is_empty()).then_some(match_labels),
        match_expressions: (!expressions.is_empty()).then_some(expressions),
    }
}
