//! oka's admission webhooks on a Kubernetes cluster, served by every `oka controller` replica.
//!
//! On `oka serve` the Kubernetes-compatible API (`oka-kubeapi`) runs `oka-admission`'s rules
//! itself; on a cluster the API server calls webhooks for them instead. This crate is those
//! webhooks, at the reference's paths:
//!
//! | path | webhook | objects |
//! |---|---|---|
//! | `/default-sandboxset` | mutating `md-sbs.kb.io` | sandboxsets CREATE, UPDATE |
//! | `/default-sandboxtemplate` | mutating `md-sbt.kb.io` | sandboxtemplates CREATE |
//! | `/validate-sandboxset` | `v-sbs.kb.io` | sandboxsets CREATE, UPDATE |
//! | `/validate-sandboxtemplate` | `v-sbt.kb.io` | sandboxtemplates CREATE |
//! | `/validate-sandboxupdateops` | `v-suo.kb.io` | sandboxupdateops CREATE, UPDATE |
//! | `/validate-poolautoscaler` | `v-pas.kb.io` | poolautoscalers CREATE, UPDATE |
//! | `/validate-pod-delete` | `v-pod-delete.kb.io`, `v-pod-eviction.kb.io` | pods DELETE, pods/eviction CREATE |
//!
//! - [`review`]: one `AdmissionReview` in, one out; pure (what a rule reads from the cluster
//!   is asked for and handed in). [`patch`] is the mutating webhooks' JSON Patch.
//! - [`certs`]: the self-signed CA and serving certificate, in a Secret with the reference's
//!   key names; [`provision`]: the controller that keeps the Secret, serves its certificate
//!   and writes its CA into the webhook configurations ([`inject`]).
//! - [`server`]: the HTTPS server (TLS from `oka-kubeapi`, the certificate reloaded when the
//!   Secret changes); [`metrics`]: the reference's series of the reviews answered.

#![forbid(unsafe_code)]

pub mod certs;
pub mod inject;
pub mod metrics;
pub mod patch;
pub mod provision;
pub mod review;
pub mod server;

/// Why the webhooks' certificates or configurations could not be kept.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The store (the Secret, or what a rule reads) failed.
    #[error(transparent)]
    Store(#[from] oka_store::StoreError),
    /// A certificate could not be made, read or served.
    #[error(transparent)]
    Tls(#[from] oka_kubeapi::tls::TlsError),
    /// A webhook configuration could not be read or written.
    #[error("{kind} {name}: {source}")]
    Configuration {
        /// `MutatingWebhookConfiguration` or `ValidatingWebhookConfiguration`.
        kind: String,
        /// Its name.
        name: String,
        /// The API server's answer.
        source: kube::Error,
    },
    /// A webhook configuration has no webhook pointing at the Service.
    #[error("{kind} {name} has no webhook whose clientConfig.service is the webhook Service")]
    NoWebhookOfService {
        /// `MutatingWebhookConfiguration` or `ValidatingWebhookConfiguration`.
        kind: String,
        /// Its name.
        name: String,
    },
    /// Other writers kept changing the object between our read and our write.
    #[error("{0} kept changing under our writes")]
    Contended(String),
    /// An object did not convert to or from JSON.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// The server's socket failed.
    #[error("io: {0}")]
    Io(std::io::Error),
}
