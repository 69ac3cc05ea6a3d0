//! Admission webhook benchmark: latency (p50, p99) of one AdmissionReview answered over a kept
//! TLS connection, as the API server sends them: the defaulting webhook of a SandboxSet create
//! (`/default-sandboxset`, a JSON patch back), its validation (`/validate-sandboxset`, Kubernetes'
//! pod template rules), and as the baseline, in the same run and interleaved, a review that
//! no rule applies to (a pod DELETE of a pod no sandbox made: TLS, HTTP, the review parsed and
//! answered).
//!
//! `cargo bench -p oka-webhook --bench admission` (env `ROUNDS`, default 3000).
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::Instant;

use hdrhistogram::Histogram;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_webhook::metrics::AdmissionMetrics;
use oka_webhook::review::Settings;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::client::TlsStream;

const SERVER_NAME: &str = "oka-webhook.sandbox-system.svc";

fn rounds() -> usize {
    std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000)
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap()
}

fn report(what: &str, h: &Histogram<u64>) {
    // Recorded in nanoseconds, shown in microseconds.
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!("{what:<52} n={:<6} p50 {:>8.1} µs  p99 {:>8.1} µs", h.len(), us(0.5), us(0.99));
}

fn main() {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(run(rounds()));
}

/// A SandboxSet create as the API server sends it to the webhooks.
fn review(uid: usize) -> String {
    let pool = json!({"apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxSet",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 2, "template": {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "main", "image": "nginx:1.27",
                "ports": [{"containerPort": 80}],
                "resources": {"limits": {"cpu": "1", "memory": "512Mi"}},
                "readinessProbe": {"httpGet": {"path": "/", "port": 80}}}]}}}});
    let gvk = json!({"group": "agents.kruise.io", "version": "v1alpha1", "kind": "SandboxSet"});
    let gvr =
        json!({"group": "agents.kruise.io", "version": "v1alpha1", "resource": "sandboxsets"});
    json!({
        "kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": format!("705ab4f5-6393-11e8-b7cc-{uid:012x}"),
            "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": "web", "namespace": "default", "operation": "CREATE",
            "userInfo": {"username": "admin", "groups": ["system:authenticated"]},
            "object": pool, "oldObject": Value::Null, "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    })
    .to_string()
}

/// A pod DELETE as the API server sends it, of a pod no sandbox made: allowed at once.
fn pod_delete_review(uid: usize) -> String {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-0", "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "main", "image": "nginx:1.27"}]}});
    let gvk = json!({"group": "", "version": "v1", "kind": "Pod"});
    let gvr = json!({"group": "", "version": "v1", "resource": "pods"});
    json!({
        "kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": format!("805ab4f5-6393-11e8-b7cc-{uid:012x}"),
            "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": "web-0", "namespace": "default", "operation": "DELETE",
            "userInfo": {"username": "admin", "groups": ["system:authenticated"]},
            "object": Value::Null, "oldObject": pod, "dryRun": false,
            "options": {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    })
    .to_string()
}

/// Posts `body` to `path` on the kept connection; the answer's status.
async fn post(tls: &mut TlsStream<tokio::net::TcpStream>, path: &str, body: &str) -> u16 {
    let head = format!(
        "POST {path}?timeout=10s HTTP/1.1\r\nHost: {SERVER_NAME}:443\r\n\
         Content-Type: application/json\r\nAccept: application/json, */*\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(body.as_bytes()).await.unwrap();
    tls.flush().await.unwrap();
    // The head, then exactly Content-Length bytes of body: the connection stays open.
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        tls.read_exact(&mut byte).await.unwrap();
        answer.push(byte[0]);
    }
    let head = String::from_utf8(answer).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(str::to_owned))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; length];
    tls.read_exact(&mut body).await.unwrap();
    head.split(' ').nth(1).unwrap().parse().unwrap()
}

async fn run(rounds: usize) {
    let dir = tempfile::tempdir().unwrap();
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default()).unwrap();
    let not_after = jiff::Timestamp::now()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date()
        .checked_add(jiff::Span::new().days(365))
        .unwrap();
    let (ca, server) =
        oka_kubeapi::tls::issue_ca_and_server("bench", &[SERVER_NAME.to_owned()], not_after)
            .unwrap();
    let cert = Arc::new(oka_kubeapi::tls::ReloadableCert::default());
    cert.set(oka_kubeapi::tls::certified_key(&server.cert, &server.key).unwrap());
    let router =
        oka_webhook::server::router(store, Settings::default(), AdmissionMetrics::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(oka_webhook::server::serve(listener, cert, router, std::future::pending()));

    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca.cert.as_bytes()).unwrap()).unwrap();
    // The ring provider, as the API server harness's client in the tests uses.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(SERVER_NAME.to_owned()).unwrap(), tcp)
        .await
        .unwrap();

    let (mut baseline, mut defaulting, mut validating) = (histogram(), histogram(), histogram());
    // Warm up, then interleave the three so drift (other load) hits them alike.
    for round in 0..rounds + 200 {
        let (pool, pod) = (review(round), pod_delete_review(round));
        for (path, body, histogram) in [
            ("/validate-pod-delete", &pod, &mut baseline),
            ("/default-sandboxset", &pool, &mut defaulting),
            ("/validate-sandboxset", &pool, &mut validating),
        ] {
            let started = Instant::now();
            let status = post(&mut tls, path, body).await;
            let took = started.elapsed();
            assert_eq!(status, 200, "{path}");
            if round >= 200 {
                histogram.record(took.as_nanos() as u64).unwrap();
            }
        }
    }
    println!("AdmissionReview of a SandboxSet create, one kept TLS connection on loopback:");
    report("baseline: a pod DELETE review no rule applies to", &baseline);
    report("/default-sandboxset (pod defaults, JSON patch back)", &defaulting);
    report("/validate-sandboxset (pod template validation)", &validating);
}
