//! The CustomResourceDefinitions of every kind, as objects and as YAML.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::ApiError;
use crate::checkpoint::Checkpoint;
use crate::poolautoscaler::PoolAutoscaler;
use crate::sandbox::Sandbox;
use crate::sandboxclaim::SandboxClaim;
use crate::sandboxset::SandboxSet;
use crate::sandboxtemplate::SandboxTemplate;
use crate::sandboxupdateops::SandboxUpdateOps;
use crate::trafficpolicy::{GlobalTrafficPolicy, TrafficPolicy};

/// The CRD of every kind this crate defines, sorted by `metadata.name`
/// (`checkpoints.agents.kruise.io`, `globaltrafficpolicies...`, `poolautoscalers...`,
/// `sandboxclaims...`, `sandboxes...`,
/// `sandboxsets...`, `sandboxtemplates...`, `sandboxupdateops...`).
///
/// Use these rather than `Kind::crd()`: they are normalized to match the reference's
/// controller-gen output (no `nullable`, `anyOf` for int-or-string fields, `listKind`, the
/// `apiVersion`/`kind`/`metadata` root properties).
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        Checkpoint::crd(),
        optional_spec(GlobalTrafficPolicy::crd()),
        PoolAutoscaler::crd(),
        SandboxClaim::crd(),
        Sandbox::crd(),
        SandboxSet::crd(),
        SandboxTemplate::crd(),
        SandboxUpdateOps::crd(),
        optional_spec(TrafficPolicy::crd()),
    ];
    crds.iter_mut().for_each(crate::schema::finalize);
    crds.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    crds
}

/// `crd` without `spec` among the root's required properties, as the reference's kinds whose
/// Go `spec` field is `omitempty` (the traffic policies) have it.
fn optional_spec(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        if let Some(root) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut())
            && let Some(required) = root.required.as_mut()
        {
            required.retain(|r| r != "spec");
            if required.is_empty() {
                root.required = None;
            }
        }
    }
    crd
}

/// What a cluster installs: [`crds`] and oka's own kinds (SandboxNode), sorted by name.
pub fn cluster_crds() -> Vec<CustomResourceDefinition> {
    let mut crds = crds();
    let mut node = crate::sandboxnode::SandboxNode::crd();
    crate::schema::finalize(&mut node);
    crds.push(node);
    crds.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    crds
}

/// [`cluster_crds`] as one multi-document YAML stream: each CRD starts with `---`.
///
/// # Errors
///
/// [`ApiError::CrdRender`] if a CRD cannot be rendered; that does not happen for these types
/// (the tests render every one).
pub fn try_crds_yaml() -> Result<String, ApiError> {
    let mut out = String::new();
    for crd in cluster_crds() {
        let yaml = serde_yaml::to_string(&crd).map_err(|e| ApiError::CrdRender {
            name: crd.metadata.name.clone().unwrap_or_default(),
            message: e.to_string(),
        })?;
        out.push_str("---\n");
        out.push_str(&yaml);
    }
    Ok(out)
}

/// [`cluster_crds`] as one multi-document YAML stream, for `oka crds | kubectl apply -f -`.
///
/// # Panics
///
/// Only if [`try_crds_yaml`] fails, which it does not for these types: the CRDs are plain data
/// with string map keys, and the tests render and parse back every one.
pub fn crds_yaml() -> String {
    match try_crds_yaml() {
        Ok(yaml) => yaml,
        Err(e) => panic!("{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_parses_back_to_the_same_crds() {
        let yaml = crds_yaml();
        let parsed: Vec<CustomResourceDefinition> = serde_yaml::Deserializer::from_str(&yaml)
            .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
            .collect();
        assert_eq!(parsed, cluster_crds());
        assert!(yaml.starts_with("---\n"));
    }

    #[test]
    fn order_is_stable_and_sorted() {
        let names: Vec<_> = crds().into_iter().filter_map(|c| c.metadata.name).collect();
        assert_eq!(
            names,
            [
                "checkpoints.agents.kruise.io",
                "globaltrafficpolicies.agents.kruise.io",
                "poolautoscalers.agents.kruise.io",
                "sandboxclaims.agents.kruise.io",
                "sandboxes.agents.kruise.io",
                "sandboxsets.agents.kruise.io",
                "sandboxtemplates.agents.kruise.io",
                "sandboxupdateops.agents.kruise.io",
                "trafficpolicies.agents.kruise.io",
            ]
        );
    }
}
