//! `KubeStore` against a real Kubernetes API server: the shared `Store` suite (`suite/`), plus
//! oka's own CRDs and samples on that server.
//!
//! The server is `apiextensions-apiserver` on etcd (`support/apiserver.rs`; built once per
//! machine by `scripts/build-apiserver.sh`, which `scripts/test.sh` runs as root). Each test gets
//! its own server, so tests share nothing. Without the binaries and not as root, every test
//! here is skipped with a message saying how to build them.
//!
//! What this server cannot show: it has only the CRD API, so the kinds of the core API
//! (Namespaces, Events, Secrets, Leases, Pods) are not tested here; it runs no
//! kube-controller-manager, so there is no garbage collector and owner cascade is not tested
//! (the suite's cascade test says so and returns); and it has no namespace lifecycle, so objects
//! are created in namespaces that were never created.

// Test helpers panic on failure: in a test, a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[macro_use]
mod suite;
mod support;

use std::time::Duration;

use common::{Gadget, NS, Widget, widget};
use kube::CustomResourceExt;
use oka_store::kubernetes::KubeStore;
use oka_store::{Object, Selector, Store, StoreError};
use serde_json::Value;
use support::apiserver::ApiServer;

/// The suite's backend: a fresh API server with the test kinds' CRDs.
struct Kube {
    server: ApiServer,
    store: KubeStore,
}

impl Kube {
    async fn start() -> Option<Kube> {
        let server = ApiServer::start(&[Widget::crd(), Gadget::crd()]).await?;
        let store = KubeStore::new(server.client().await);
        Some(Kube { server, store })
    }
}

/// How long the watch-session test asks the server to keep each watch request open.
const SHORT_WATCH: Duration = Duration::from_secs(1);

impl suite::Backend for Kube {
    type Store = KubeStore;

    fn store(&self) -> &KubeStore {
        &self.store
    }

    fn settle(&self) -> Duration {
        // Events travel etcd → watch cache → HTTP stream: on loopback within milliseconds.
        Duration::from_millis(300)
    }

    fn cascades(&self) -> bool {
        // The garbage collector is kube-controller-manager's; this server runs none.
        false
    }

    async fn expire_history(&self) {
        // Nothing to do: the watch cache of a custom resource starts at the revision its CRD
        // was first served at, so version "1" is already older than anything it holds.
    }

    async fn short_watch_sessions(&self) -> (KubeStore, Duration) {
        let store = KubeStore::new(self.server.client().await).with_watch_timeout(SHORT_WATCH);
        (store, SHORT_WATCH)
    }
}

store_suite!(Kube::start());

// === oka's kinds on a real API server ===

/// Every key and value of `sent` is in `got` (the server may add defaults, never drop fields).
fn assert_subset(path: &str, sent: &Value, got: &Value) {
    match (sent, got) {
        (Value::Object(s), Value::Object(g)) => {
            for (key, value) in s {
                let child = format!("{path}.{key}");
                let other = g.get(key).unwrap_or_else(|| panic!("{child} was dropped"));
                assert_subset(&child, value, other);
            }
        }
        (Value::Array(s), Value::Array(g)) => {
            assert_eq!(s.len(), g.len(), "{path}: length");
            for (i, (a, b)) in s.iter().zip(g).enumerate() {
                assert_subset(&format!("{path}[{i}]"), a, b);
            }
        }
        _ => assert_eq!(sent, got, "{path}"),
    }
}

/// Creates `doc` as a `K` in `ns`, writes its status, reads it back and checks nothing was
/// dropped.
async fn round_trip<K: Object>(store: &KubeStore, ns: &str, doc: &Value) {
    let mut typed: K = serde_json::from_value(doc.clone()).unwrap();
    typed.meta_mut().namespace = None;
    let name = typed.meta().name.clone().unwrap();
    let sent = serde_json::to_value(&typed).unwrap();
    let created = store.create(ns, &typed).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    if sent.get("status").is_some() {
        let mut with_status: K = serde_json::from_value(sent.clone()).unwrap();
        *with_status.meta_mut() = created.meta().clone();
        store.update_status(ns, &with_status).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let read: K = store.get(ns, &name).await.unwrap();
    let got = serde_json::to_value(&read).unwrap();
    for part in ["spec", "status"] {
        if let Some(sent_part) = sent.get(part) {
            assert_subset(&format!("{} {name} .{part}", K::kind(&())), sent_part, &got[part]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oka_crds_accept_the_reference_samples_and_every_field_round_trips() {
    let Some(server) = ApiServer::start(&oka_api::crds()).await else { return };
    let store = KubeStore::new(server.client().await);
    let api = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../api/tests");
    let files = [
        "reference/samples/sandbox.yaml",
        "reference/samples/sandboxclaim.yaml",
        "reference/samples/sandboxset-code-interpreter.yaml",
        "reference/samples/sandboxset-desktop.yaml",
        "fixtures/kinds.yaml",
        "fixtures/defaults.yaml",
        "fixtures/poolautoscalers.yaml",
        "fixtures/probes.yaml",
        "fixtures/reuse.yaml",
    ];
    let mut kinds = std::collections::BTreeSet::new();
    for (i, file) in files.iter().enumerate() {
        // A namespace per file: fixtures of different files share names.
        let ns = format!("file-{i}");
        let text = std::fs::read_to_string(api.join(file)).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let doc: Value = serde::Deserialize::deserialize(doc).unwrap();
            let kind = doc["kind"].as_str().unwrap().to_owned();
            match kind.as_str() {
                "Sandbox" => round_trip::<oka_api::Sandbox>(&store, &ns, &doc).await,
                "SandboxClaim" => round_trip::<oka_api::SandboxClaim>(&store, &ns, &doc).await,
                "SandboxSet" => round_trip::<oka_api::SandboxSet>(&store, &ns, &doc).await,
                "SandboxTemplate" => {
                    round_trip::<oka_api::SandboxTemplate>(&store, &ns, &doc).await
                }
                "SandboxUpdateOps" => {
                    round_trip::<oka_api::SandboxUpdateOps>(&store, &ns, &doc).await
                }
                "Checkpoint" => round_trip::<oka_api::Checkpoint>(&store, &ns, &doc).await,
                "PoolAutoscaler" => round_trip::<oka_api::PoolAutoscaler>(&store, &ns, &doc).await,
                "TrafficPolicy" => round_trip::<oka_api::TrafficPolicy>(&store, &ns, &doc).await,
                // Cluster-scoped: filed under the reserved namespace, sent to the cluster URL.
                "GlobalTrafficPolicy" => {
                    round_trip::<oka_store::Clustered<oka_api::GlobalTrafficPolicy>>(
                        &store,
                        oka_store::CLUSTER_NAMESPACE,
                        &doc,
                    )
                    .await
                }
                other => panic!("{file}: unexpected kind {other}"),
            }
            kinds.insert(kind);
        }
    }
    assert_eq!(kinds.len(), oka_api::crds().len(), "every kind is checked: {kinds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_without_its_crd_is_reported_as_such_not_as_a_missing_object() {
    let Some(server) = ApiServer::start(&[Widget::crd()]).await else { return };
    let store = KubeStore::new(server.client().await);
    store.create(NS, &widget("a")).await.unwrap();
    let err = store.get::<Gadget>(NS, "a").await.unwrap_err();
    assert!(
        matches!(err, StoreError::Internal(ref m) if m.contains("gadgets.v1beta1.other.oka.dev")),
        "{err:?}"
    );
    let err = store.watch::<Gadget>(None, &Selector::everything(), "").await.err().unwrap();
    assert!(matches!(err, StoreError::Internal(_)), "{err:?}");
}
