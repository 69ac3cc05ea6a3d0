//! What this API serves, read from the CRDs `oka-api` generates (never re-typed), and the
//! discovery documents built from it.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

use crate::table::Column;

/// The verbs every `agents.kruise.io` resource takes here.
const VERBS: [&str; 8] =
    ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
/// The verbs of the `status` and `scale` subresources.
const SUB_VERBS: [&str; 3] = ["get", "patch", "update"];

/// The scale subresource of a CRD: where its replica counts live.
#[derive(Debug, Clone, PartialEq)]
pub struct Scale {
    /// `.spec.replicas`.
    pub spec_replicas_path: String,
    /// `.status.replicas`.
    pub status_replicas_path: String,
    /// `.status.selector`, when the CRD names one.
    pub label_selector_path: Option<String>,
}

/// One `agents.kruise.io/v1alpha1` resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    /// `sandboxsets`.
    pub plural: String,
    /// `sandboxset`.
    pub singular: String,
    /// `SandboxSet`.
    pub kind: String,
    /// `SandboxSetList`.
    pub list_kind: String,
    /// `sbs`.
    pub short_names: Vec<String>,
    /// The CRD's printer columns (kubectl's default table).
    pub columns: Vec<Column>,
    /// Whether the CRD has a status subresource.
    pub status: bool,
    /// The CRD's scale subresource.
    pub scale: Option<Scale>,
}

impl Resource {
    /// `sandboxsets.agents.kruise.io`, as error messages name it.
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.plural, oka_api::GROUP)
    }

    fn from_crd(crd: &CustomResourceDefinition) -> Option<Self> {
        let names = &crd.spec.names;
        let version = crd.spec.versions.iter().find(|v| v.name == oka_api::VERSION)?;
        let columns = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| Column {
                name: c.name.clone(),
                type_: c.type_.clone(),
                format: c.format.clone().unwrap_or_default(),
                description: c.description.clone().unwrap_or_default(),
                priority: c.priority.unwrap_or(0),
                json_path: c.json_path.clone(),
            })
            .collect();
        let subresources = version.subresources.as_ref();
        Some(Resource {
            plural: names.plural.clone(),
            singular: names.singular.clone().unwrap_or_else(|| names.kind.to_lowercase()),
            kind: names.kind.clone(),
            list_kind: names.list_kind.clone().unwrap_or_else(|| format!("{}List", names.kind)),
            short_names: names.short_names.clone().unwrap_or_default(),
            columns,
            status: subresources.is_some_and(|s| s.status.is_some()),
            scale: subresources.and_then(|s| s.scale.as_ref()).map(|s| Scale {
                spec_replicas_path: s.spec_replicas_path.clone(),
                status_replicas_path: s.status_replicas_path.clone(),
                label_selector_path: s.label_selector_path.clone(),
            }),
        })
    }
}

/// Every resource of `agents.kruise.io/v1alpha1`, from [`oka_api::crds`].
pub fn resources() -> Vec<Resource> {
    oka_api::crds().iter().filter_map(Resource::from_crd).collect()
}

/// `GET /apis/agents.kruise.io/v1alpha1`: an `APIResourceList` with each kind and its
/// subresources.
pub fn group_resource_list(resources: &[Resource]) -> Value {
    let mut list = Vec::new();
    for r in resources {
        list.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": true,
            "kind": r.kind,
            "verbs": VERBS,
            "shortNames": r.short_names,
        }));
        if r.status {
            list.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": true,
                "kind": r.kind,
                "verbs": SUB_VERBS,
            }));
        }
        if r.scale.is_some() {
            list.push(json!({
                "name": format!("{}/scale", r.plural),
                "singularName": "",
                "namespaced": true,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": SUB_VERBS,
            }));
        }
    }
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": oka_api::API_VERSION,
        "resources": list,
    })
}

/// The media type of aggregated discovery (`apidiscovery.k8s.io/v2`), which current kubectl
/// asks for first: one answer instead of one request per group version.
pub const AGGREGATED_MEDIA_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// `GET /apis` as an `APIGroupDiscoveryList`: every resource of the group, in one document.
pub fn aggregated_groups(resources: &[Resource]) -> Value {
    let gvk =
        |kind: &str| json!({"group": oka_api::GROUP, "version": oka_api::VERSION, "kind": kind});
    let entries: Vec<Value> = resources
        .iter()
        .map(|r| {
            let mut subresources = Vec::new();
            if r.status {
                subresources.push(json!({"subresource": "status", "responseKind": gvk(&r.kind), "verbs": SUB_VERBS}));
            }
            if r.scale.is_some() {
                subresources.push(json!({
                    "subresource": "scale",
                    "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
                    "verbs": SUB_VERBS,
                }));
            }
            json!({
                "resource": r.plural,
                "responseKind": gvk(&r.kind),
                "scope": "Namespaced",
                "singularResource": r.singular,
                "verbs": VERBS,
                "shortNames": r.short_names,
                "subresources": subresources,
            })
        })
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": [{
            "metadata": {"name": oka_api::GROUP, "creationTimestamp": null},
            "versions": [{"version": oka_api::VERSION, "resources": entries, "freshness": "Current"}],
        }],
    })
}

/// `GET /api` as an `APIGroupDiscoveryList`: the core group's namespaces.
pub fn aggregated_core() -> Value {
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": [{
            "metadata": {"creationTimestamp": null},
            "versions": [{
                "version": "v1",
                "resources": [{
                    "resource": "namespaces",
                    "responseKind": {"group": "", "version": "v1", "kind": "Namespace"},
                    "scope": "Cluster",
                    "singularResource": "namespace",
                    "verbs": ["get", "list"],
                    "shortNames": ["ns"],
                }],
                "freshness": "Current",
            }],
        }],
    })
}

/// `GET /apis`: the one group this server serves.
pub fn group_list() -> Value {
    let version = json!({"groupVersion": oka_api::API_VERSION, "version": oka_api::VERSION});
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [{
            "name": oka_api::GROUP,
            "versions": [version.clone()],
            "preferredVersion": version,
        }],
    })
}

/// `GET /api`: the core group's one version.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

/// `GET /api/v1`: namespaces, read only.
pub fn core_resource_list() -> Value {
    json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [{
            "name": "namespaces",
            "singularName": "namespace",
            "namespaced": false,
            "kind": "Namespace",
            "verbs": ["get", "list"],
            "shortNames": ["ns"],
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_served_with_its_crd_names() {
        let resources = resources();
        let plurals: Vec<_> = resources.iter().map(|r| r.plural.as_str()).collect();
        assert_eq!(
            plurals,
            [
                "checkpoints",
                "poolautoscalers",
                "sandboxclaims",
                "sandboxes",
                "sandboxsets",
                "sandboxtemplates",
                "sandboxupdateops"
            ]
        );
        let sbs = resources.iter().find(|r| r.kind == "SandboxSet").unwrap();
        assert_eq!(sbs.short_names, ["sbs"]);
        assert_eq!(sbs.scale.as_ref().unwrap().spec_replicas_path, ".spec.replicas");
        let list = group_resource_list(&resources);
        let names: Vec<_> =
            list["resources"].as_array().unwrap().iter().map(|r| r["name"].clone()).collect();
        assert!(names.contains(&json!("sandboxsets/scale")));
        assert!(names.contains(&json!("sandboxes/status")));
    }
}
