//! What this API serves and the discovery documents built from it: every
//! `agents.kruise.io/v1alpha1` kind, read from the CRDs `oka-api` generates (never re-typed),
//! and the core kinds the system itself keeps in its store (Namespaces, Secrets, ConfigMaps,
//! Events, and `coordination.k8s.io` Leases), described here as the API server describes them.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

use crate::table::Column;

/// The verbs every resource takes here.
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

/// One resource this API serves.
#[derive(Debug, Clone)]
pub struct Resource {
    /// The API group: `agents.kruise.io`, `coordination.k8s.io`, or `""` (core).
    pub group: String,
    /// The group's version: `v1alpha1`, `v1`.
    pub version: String,
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
    /// The table's columns (kubectl's default table), the name first where there is one.
    pub columns: Vec<Column>,
    /// Whether it has a status subresource.
    pub status: bool,
    /// Its scale subresource.
    pub scale: Option<Scale>,
    /// The fields a field selector takes besides `metadata.name` and `metadata.namespace`: the
    /// field's name and its JSON pointer.
    pub fields: Vec<(String, String)>,
    /// Whether a CRD schema admits its writes (the `agents.kruise.io` kinds).
    pub crd: bool,
    /// Whether its objects live in a namespace (all but Namespaces and the cluster-scoped CRD
    /// kinds, GlobalTrafficPolicy).
    pub namespaced: bool,
}

impl Resource {
    /// `sandboxsets.agents.kruise.io` (`secrets` in the core group), as error messages name it.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `agents.kruise.io/v1alpha1`, or `v1` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The verbs it takes: every one, but a Namespace has no `deletecollection`.
    pub fn verbs(&self) -> Vec<&'static str> {
        VERBS.iter().copied().filter(|v| !self.is_namespace() || *v != "deletecollection").collect()
    }

    /// Whether it is the core Namespace kind (deleted by emptying it first).
    pub fn is_namespace(&self) -> bool {
        self.group.is_empty() && self.kind == "Namespace"
    }

    /// The store namespace an object of this resource is filed under: a namespaced object's
    /// own namespace (`namespace`, from the request path), a Namespace's own name, and
    /// [`oka_store::CLUSTER_NAMESPACE`] for every other cluster-scoped kind. Every handler asks
    /// this, so where cluster-scoped objects live is decided here alone.
    pub fn filed_under(&self, namespace: Option<&str>, name: &str) -> String {
        match (self.namespaced, self.is_namespace()) {
            (true, _) => namespace.unwrap_or_default().to_owned(),
            (false, true) => name.to_owned(),
            (false, false) => oka_store::CLUSTER_NAMESPACE.to_owned(),
        }
    }

    /// The fields a field selector takes, with their JSON pointers.
    pub fn selectable_fields(&self) -> Vec<(String, String)> {
        let mut fields = vec![
            ("metadata.name".to_owned(), "/metadata/name".to_owned()),
            ("metadata.namespace".to_owned(), "/metadata/namespace".to_owned()),
        ];
        fields.extend(self.fields.iter().cloned());
        fields
    }

    fn from_crd(crd: &CustomResourceDefinition) -> Option<Self> {
        let names = &crd.spec.names;
        let version = crd.spec.versions.iter().find(|v| v.name == oka_api::VERSION)?;
        let printer = version.additional_printer_columns.iter().flatten().map(|c| Column {
            name: c.name.clone(),
            type_: c.type_.clone(),
            format: c.format.clone().unwrap_or_default(),
            description: c.description.clone().unwrap_or_default(),
            priority: c.priority.unwrap_or(0),
            json_path: c.json_path.clone(),
            compute: None,
        });
        let columns = std::iter::once(Column::name()).chain(printer).collect();
        let subresources = version.subresources.as_ref();
        Some(Resource {
            group: oka_api::GROUP.to_owned(),
            version: oka_api::VERSION.to_owned(),
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
            fields: Vec::new(),
            crd: true,
            namespaced: crd.spec.scope == "Namespaced",
        })
    }

    /// A core or `coordination.k8s.io` kind.
    fn builtin(
        group: &str,
        plural: &str,
        kind: &str,
        short: &[&str],
        columns: Vec<Column>,
    ) -> Self {
        Resource {
            group: group.to_owned(),
            version: "v1".to_owned(),
            plural: plural.to_owned(),
            singular: kind.to_lowercase(),
            kind: kind.to_owned(),
            list_kind: format!("{kind}List"),
            short_names: short.iter().map(|s| (*s).to_owned()).collect(),
            columns,
            status: false,
            scale: None,
            fields: Vec::new(),
            crd: false,
            namespaced: true,
        }
    }
}

fn column(name: &str, type_: &str, json_path: &str, priority: i32) -> Column {
    Column {
        name: name.to_owned(),
        type_: type_.to_owned(),
        format: String::new(),
        description: String::new(),
        priority,
        json_path: json_path.to_owned(),
        compute: None,
    }
}

fn computed(
    name: &str,
    type_: &str,
    compute: fn(&Value) -> Option<Value>,
    priority: i32,
) -> Column {
    Column { compute: Some(compute), ..column(name, type_, "", priority) }
}

fn age() -> Column {
    column("Age", "date", ".metadata.creationTimestamp", 0)
}

/// How many keys a Secret's or ConfigMap's `data` and `binaryData` hold.
fn data_count(obj: &Value) -> Option<Value> {
    let count = |key: &str| obj.get(key).and_then(Value::as_object).map_or(0, serde_json::Map::len);
    Some(json!(count("data") + count("binaryData")))
}

/// When an Event was last seen: its last timestamp, its event time, or its creation.
fn event_last_seen(obj: &Value) -> Option<Value> {
    ["/lastTimestamp", "/eventTime", "/firstTimestamp", "/metadata/creationTimestamp"]
        .iter()
        .find_map(|p| obj.pointer(p).filter(|v| v.is_string()).cloned())
}

/// An Event's object as kubectl prints it: `sandbox/base-x7k2p`.
fn event_object(obj: &Value) -> Option<Value> {
    let text = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or_default();
    Some(json!(format!(
        "{}/{}",
        text("/involvedObject/kind").to_lowercase(),
        text("/involvedObject/name")
    )))
}

/// The core kinds the system keeps in its store.
fn builtins() -> Vec<Resource> {
    let mut secret = Resource::builtin(
        "",
        "secrets",
        "Secret",
        &[],
        vec![
            Column::name(),
            column("Type", "string", ".type", 0),
            computed("Data", "string", data_count, 0),
            age(),
        ],
    );
    let configmap = Resource::builtin(
        "",
        "configmaps",
        "ConfigMap",
        &["cm"],
        vec![Column::name(), computed("Data", "string", data_count, 0), age()],
    );
    let mut event = Resource::builtin(
        "",
        "events",
        "Event",
        &["ev"],
        vec![
            computed("Last Seen", "date", event_last_seen, 0),
            column("Type", "string", ".type", 0),
            column("Reason", "string", ".reason", 0),
            computed("Object", "string", event_object, 0),
            column("Message", "string", ".message", 0),
            column("Count", "integer", ".count", 1),
            Column { priority: 1, ..Column::name() },
        ],
    );
    event.fields = [
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ]
    .iter()
    .map(|f| {
        let pointer = match *f {
            "source" => "/source/component".to_owned(),
            f => format!("/{}", f.replace('.', "/")),
        };
        ((*f).to_owned(), pointer)
    })
    .collect();
    secret.fields = vec![("type".to_owned(), "/type".to_owned())];
    let lease = Resource::builtin(
        "coordination.k8s.io",
        "leases",
        "Lease",
        &[],
        vec![Column::name(), column("Holder", "string", ".spec.holderIdentity", 0), age()],
    );
    let mut namespace = Resource::builtin(
        "",
        "namespaces",
        "Namespace",
        &["ns"],
        vec![Column::name(), column("Status", "string", ".status.phase", 0), age()],
    );
    namespace.namespaced = false;
    namespace.status = true;
    namespace.fields = vec![("status.phase".to_owned(), "/status/phase".to_owned())];
    vec![namespace, configmap, event, secret, lease]
}

/// Every resource served: the `agents.kruise.io` kinds from [`oka_api::crds`] (namespaced
/// and cluster-scoped, as each CRD's `scope` says), then the core and `coordination.k8s.io`
/// kinds.
pub fn resources() -> Vec<Resource> {
    let mut all: Vec<Resource> = oka_api::crds().iter().filter_map(Resource::from_crd).collect();
    all.extend(builtins());
    all
}

/// The group versions served besides the core group: (group, version).
pub fn group_versions(resources: &[Resource]) -> Vec<(String, String)> {
    let mut groups: Vec<(String, String)> = Vec::new();
    for r in resources.iter().filter(|r| !r.group.is_empty()) {
        let gv = (r.group.clone(), r.version.clone());
        if !groups.contains(&gv) {
            groups.push(gv);
        }
    }
    groups
}

/// `GET /api/v1` or `GET /apis/<group>/<version>`: an `APIResourceList` of that group
/// version's kinds and their subresources.
pub fn resource_list(resources: &[Resource], group: &str, version: &str) -> Value {
    let mut list = Vec::new();
    for r in resources.iter().filter(|r| r.group == group && r.version == version) {
        list.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs(),
            "shortNames": r.short_names,
        }));
        if r.status {
            list.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
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
    let group_version =
        if group.is_empty() { version.to_owned() } else { format!("{group}/{version}") };
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": list,
    })
}

/// The media type of aggregated discovery (`apidiscovery.k8s.io/v2`), which current kubectl
/// asks for first: one answer instead of one request per group version.
pub const AGGREGATED_MEDIA_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// One group's entry of an `APIGroupDiscoveryList`.
fn aggregated_group(resources: &[Resource], group: &str, version: &str) -> Value {
    let gvk = |kind: &str| json!({"group": group, "version": version, "kind": kind});
    let mut entries: Vec<Value> = Vec::new();
    for r in resources.iter().filter(|r| r.group == group && r.version == version) {
        let mut subresources = Vec::new();
        if r.status {
            subresources.push(
                json!({"subresource": "status", "responseKind": gvk(&r.kind), "verbs": SUB_VERBS}),
            );
        }
        if r.scale.is_some() {
            subresources.push(json!({
                "subresource": "scale",
                "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
                "verbs": SUB_VERBS,
            }));
        }
        entries.push(json!({
            "resource": r.plural,
            "responseKind": gvk(&r.kind),
            "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
            "singularResource": r.singular,
            "verbs": r.verbs(),
            "shortNames": r.short_names,
            "subresources": subresources,
        }));
    }
    let mut metadata = json!({"creationTimestamp": null});
    if !group.is_empty() {
        metadata["name"] = json!(group);
    }
    json!({
        "metadata": metadata,
        "versions": [{"version": version, "resources": entries, "freshness": "Current"}],
    })
}

/// `GET /apis` as an `APIGroupDiscoveryList`: every group but the core one, in one document.
pub fn aggregated_groups(resources: &[Resource]) -> Value {
    let items: Vec<Value> =
        group_versions(resources).iter().map(|(g, v)| aggregated_group(resources, g, v)).collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    })
}

/// `GET /api` as an `APIGroupDiscoveryList`: the core group.
pub fn aggregated_core(resources: &[Resource]) -> Value {
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": [aggregated_group(resources, "", "v1")],
    })
}

/// `GET /apis`: the groups this server serves besides the core one.
pub fn group_list(resources: &[Resource]) -> Value {
    let groups: Vec<Value> = group_versions(resources)
        .iter()
        .map(|(group, version)| {
            let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
            json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /api`: the core group's one version.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
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
                "globaltrafficpolicies",
                "poolautoscalers",
                "sandboxclaims",
                "sandboxes",
                "sandboxsets",
                "sandboxtemplates",
                "sandboxupdateops",
                "trafficpolicies",
                "namespaces",
                "configmaps",
                "events",
                "secrets",
                "leases",
            ]
        );
        let sbs = resources.iter().find(|r| r.kind == "SandboxSet").unwrap();
        assert_eq!(sbs.short_names, ["sbs"]);
        assert_eq!(sbs.scale.as_ref().unwrap().spec_replicas_path, ".spec.replicas");
        let list = resource_list(&resources, oka_api::GROUP, oka_api::VERSION);
        let names: Vec<_> =
            list["resources"].as_array().unwrap().iter().map(|r| r["name"].clone()).collect();
        assert!(names.contains(&json!("sandboxsets/scale")));
        assert!(names.contains(&json!("sandboxes/status")));
        assert!(!names.contains(&json!("secrets")));
        let core = resource_list(&resources, "", "v1");
        let names: Vec<_> =
            core["resources"].as_array().unwrap().iter().map(|r| r["name"].clone()).collect();
        assert_eq!(
            names,
            [
                json!("namespaces"),
                json!("namespaces/status"),
                json!("configmaps"),
                json!("events"),
                json!("secrets")
            ]
        );
        let gtp = resources.iter().find(|r| r.kind == "GlobalTrafficPolicy").unwrap();
        assert!(!gtp.namespaced);
        assert_eq!(gtp.short_names, ["gtp"]);
        assert!(gtp.verbs().contains(&"deletecollection"));
        assert_eq!(gtp.filed_under(Some("x"), "g"), oka_store::CLUSTER_NAMESPACE);
        let namespaces = &core["resources"][0];
        assert_eq!(namespaces["namespaced"], false);
        assert!(!namespaces["verbs"].as_array().unwrap().contains(&json!("deletecollection")));
        assert_eq!(
            group_versions(&resources),
            [
                (oka_api::GROUP.to_owned(), oka_api::VERSION.to_owned()),
                ("coordination.k8s.io".to_owned(), "v1".to_owned())
            ]
        );
    }

    #[test]
    fn computed_columns_read_as_the_api_server_prints_them() {
        let secret = json!({"data": {"a": "", "b": ""}, "binaryData": {"c": ""}});
        assert_eq!(data_count(&secret), Some(json!(3)));
        let event = json!({"involvedObject": {"kind": "Sandbox", "name": "base-x"}});
        assert_eq!(event_object(&event), Some(json!("sandbox/base-x")));
    }
}
