//! A Kubernetes-compatible API over the oka [`Store`], so `kubectl` and other unmodified
//! Kubernetes clients manage the objects `oka serve` runs on.
//!
//! It serves discovery (legacy and aggregated) and OpenAPI v3, every `agents.kruise.io/v1alpha1`
//! kind (the cluster-scoped GlobalTrafficPolicy at `/apis/<group>/<version>/<plural>`, filed in
//! the store where [`resources::Resource::filed_under`] says) and the core kinds the system keeps (Namespaces, Secrets, ConfigMaps, Events, Leases): get, list and
//! watch with selectors and paging, create, update, patch (JSON, merge, strategic for the core
//! kinds, server-side apply), delete and deletecollection, `dryRun`, the `status` and `scale`
//! subresources, Tables, and errors as `Status` objects. Every client write is admitted by
//! `oka-admission` (the reference's mutating and validating webhooks included, except for
//! writes through the `status` and `scale` subresources, as on a cluster). Namespaces are objects too ([`namespaces`]): an object is created only in
//! one that exists, and deleting one deletes what it holds.
//!
//! # Architecture invariant
//!
//! This crate knows the Store, the API types and admission only (never E2B, the manager or the
//! runtime; team keys come in through [`auth::Authenticator`]): every name, short name, printer
//! column and subresource of the `agents.kruise.io` kinds comes from the CRDs `oka_api::crds`
//! generates, so what `kubectl` sees here is what it sees on a cluster with those CRDs
//! installed.

#![forbid(unsafe_code)]

pub mod auth;
mod handlers;
pub mod json_patch;
pub mod listing;
pub mod merge;
pub mod namespaces;
pub mod openapi;
pub mod protobuf;
pub mod resources;
pub mod runtime;
pub mod ssa;
pub mod status;
pub mod table;
pub mod tls;
mod typed;
mod watch;

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use oka_store::Store;
use serde_json::Value;

pub use merge::merge_patch;
pub use status::ApiStatus;

/// What the API needs besides the store.
#[derive(Clone)]
pub struct KubeApiConfig {
    /// The bearer token that grants everything (the admin key).
    pub admin_token: String,
    /// `host:port` clients reach this API at, for `/api`'s `serverAddressByClientCIDRs`.
    pub server_address: String,
    /// The other tokens: a team's API keys, each confined to its namespace (which exists
    /// while the team has a key).
    pub team_keys: Option<Arc<dyn auth::Authenticator>>,
    /// The namespaces the platform itself keeps objects in (its API key store's): they always
    /// exist, besides Kubernetes' own.
    pub namespaces: Vec<String>,
}

impl std::fmt::Debug for KubeApiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeApiConfig")
            .field("server_address", &self.server_address)
            .field("team_keys", &self.team_keys.is_some())
            .finish_non_exhaustive()
    }
}

/// The shared state of the handlers.
pub(crate) struct KubeApi<S> {
    pub(crate) store: S,
    pub(crate) config: KubeApiConfig,
    pub(crate) resources: Vec<resources::Resource>,
    /// The OpenAPI v3 document of the group version, and `/openapi/v3`.
    pub(crate) openapi: (Value, Value),
    /// Admission of every write.
    pub(crate) admission: oka_admission::Admission,
    /// Lists being paged through with `continue`.
    pub(crate) snapshots: listing::Snapshots,
}

/// The Kubernetes-compatible API over `store`. Call it within a Tokio runtime: it starts
/// finishing the orphaning and namespace deletes a stopped server left half done, and writes
/// a Namespace for every namespace that holds objects.
pub fn router<S: Store>(store: S, config: KubeApiConfig) -> Router {
    let resources = resources::resources();
    let admission = oka_admission::Admission::new();
    let document =
        openapi::group_version_document(&resources, |kind| admission.schema(kind).cloned());
    let root = openapi::root(&document);
    let api = Arc::new(KubeApi {
        store,
        config,
        resources,
        snapshots: listing::Snapshots::default(),
        admission,
        openapi: (document, root),
    });
    tokio::spawn(handlers::finish_pending_orphans(Arc::clone(&api)));
    tokio::spawn(namespaces::reconcile_at_start(Arc::clone(&api)));
    handlers::routes(api)
}

/// A kubeconfig for the admin: one cluster at `server` (an `https://` URL) trusted by the CA
/// `ca_pem`, one user with the bearer `token`, one context named `oka`, current.
pub fn kubeconfig(server: &str, ca_pem: &str, token: &str) -> String {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: oka\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
         users:\n\
         - name: oka-admin\n  user:\n    token: {token}\n\
         contexts:\n\
         - name: oka\n  context:\n    cluster: oka\n    user: oka-admin\n    namespace: default\n\
         current-context: oka\n"
    )
}

/// `value` as an `application/json` response.
pub(crate) fn json_response(code: StatusCode, value: &Value) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = (code, body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
