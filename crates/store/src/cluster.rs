//! Cluster-scoped kinds in a store of namespaced ones.
//!
//! # Rule
//!
//! The store files every object under a namespace. A cluster-scoped kind `K`
//! (GlobalTrafficPolicy) is stored as [`Clustered<K>`], filed under [`CLUSTER_NAMESPACE`]: a
//! reserved namespace that only cluster-scoped kinds use, so it never holds an object of a
//! namespaced kind and is never a Namespace of its own. Clients never see it: a
//! [`Clustered<K>`] serializes without `metadata.namespace` (as the API server writes a
//! cluster-scoped object), and reads back with [`CLUSTER_NAMESPACE`] whatever it said.
//!
//! On the API server ([`crate::kubernetes::KubeStore`]) the same type addresses the kind's
//! cluster-scoped URL (`/apis/<group>/<version>/<plural>`), whatever namespace the call names,
//! so code written over [`Clustered<K>`] runs on both backends unchanged.
//!
//! Namespaces are the one exception: `oka-kubeapi` files each under its own name, the layout
//! its stores have always had.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::{ClusterResourceScope, NamespaceResourceScope};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The namespace every cluster-scoped object is filed under: a DNS label (as the store wants)
/// that only [`Clustered`] kinds use.
pub const CLUSTER_NAMESPACE: &str = "oka-cluster-scoped";

/// A cluster-scoped object as the store keeps it: filed under [`CLUSTER_NAMESPACE`], served
/// without a namespace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Clustered<K>(pub K);

impl<K> Clustered<K>
where
    K: Resource<DynamicType = (), Scope = ClusterResourceScope>,
{
    /// `obj`, filed under [`CLUSTER_NAMESPACE`].
    pub fn new(mut obj: K) -> Self {
        obj.meta_mut().namespace = Some(CLUSTER_NAMESPACE.to_owned());
        Clustered(obj)
    }
}

impl<K> Resource for Clustered<K>
where
    K: Resource<DynamicType = (), Scope = ClusterResourceScope>,
{
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &()) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }

    /// The cluster-scoped URL: the namespace the store files it under is not the API server's.
    fn url_path(dt: &(), _namespace: Option<&str>) -> String {
        K::url_path(dt, None)
    }

    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

impl<K> Serialize for Clustered<K>
where
    K: Resource<DynamicType = (), Scope = ClusterResourceScope> + Serialize + Clone,
{
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut obj = self.0.clone();
        obj.meta_mut().namespace = None;
        obj.serialize(serializer)
    }
}

impl<'de, K> Deserialize<'de> for Clustered<K>
where
    K: Resource<DynamicType = (), Scope = ClusterResourceScope> + DeserializeOwned,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        K::deserialize(deserializer).map(Clustered::new)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::Node;

    #[test]
    fn it_is_filed_under_the_reserved_namespace_and_served_without_one() {
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "namespace": "elsewhere"},
        });
        let node: Clustered<Node> = serde_json::from_value(json).unwrap();
        assert_eq!(node.meta().namespace.as_deref(), Some(CLUSTER_NAMESPACE));
        let back = serde_json::to_value(&node).unwrap();
        assert!(back["metadata"].get("namespace").is_none(), "{back}");
        assert_eq!(back["kind"], "Node");
        assert_eq!(Clustered::<Node>::url_path(&(), Some(CLUSTER_NAMESPACE)), "/api/v1/nodes");
        assert_eq!(Clustered::<Node>::kind(&()), "Node");
    }
}
