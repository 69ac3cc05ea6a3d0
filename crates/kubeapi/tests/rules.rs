//! The CRDs' CEL rules through the Kubernetes API: a write that breaks one is refused with the
//! API server's 422, and a transition rule compares an update with the stored object.

// Test code: a panic is how a helper reports a failed request.
#![allow(clippy::unwrap_used)]

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt as _;
use oka_kubeapi::{KubeApiConfig, router};
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use serde_json::{Value, json};
use tower::ServiceExt as _;

const TOKEN: &str = "admin";
const CLAIMS: &str = "/apis/agents.kruise.io/v1alpha1/namespaces/default/sandboxclaims";

async fn send(app: &axum::Router, method: Method, uri: &str, body: &Value) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn claim(replicas: i64, claim_timeout: &str) -> Value {
    json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "SandboxClaim",
        "metadata": {"name": "c"},
        "spec": {"templateName": "pool", "replicas": replicas, "claimTimeout": claim_timeout},
    })
}

#[tokio::test]
async fn rules_refuse_writes_with_the_api_servers_status() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        EmbeddedStore::open(&dir.path().join("s.redb"), EmbeddedOptions::default()).unwrap();
    let config = KubeApiConfig {
        admin_token: TOKEN.into(),
        server_address: "127.0.0.1:0".into(),
        team_keys: None,
        namespaces: Vec::new(),
    };
    let app = router(store, config);

    let (status, body) = send(&app, Method::POST, CLAIMS, &claim(2, "100ms")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["message"],
        "SandboxClaim.agents.kruise.io \"c\" is invalid: spec.claimTimeout: Invalid value: \"string\": claimTimeout must be at least 1 second"
    );
    assert_eq!(body["details"]["causes"][0]["field"], "spec.claimTimeout");

    let (status, body) = send(&app, Method::POST, CLAIMS, &claim(2, "1m")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // replicas is immutable: an update is compared with the stored claim.
    let uri = format!("{CLAIMS}/c");
    let mut changed = body.clone();
    changed["spec"]["replicas"] = json!(3);
    let (status, refused) = send(&app, Method::PUT, &uri, &changed).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(
        refused["message"],
        "SandboxClaim.agents.kruise.io \"c\" is invalid: spec.replicas: Invalid value: \"integer\": replicas is immutable"
    );
    let patch = Request::builder()
        .method(Method::PATCH)
        .uri(&uri)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/merge-patch+json")
        .body(Body::from(json!({"spec": {"replicas": 5}}).to_string()))
        .unwrap();
    let response = app.clone().oneshot(patch).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);

    // A status write ignores the spec it carries, as the API server's does.
    let mut status_write = body.clone();
    status_write["spec"]["replicas"] = json!(7);
    status_write["status"] = json!({"phase": "Claiming"});
    let (status, written) = send(&app, Method::PUT, &format!("{uri}/status"), &status_write).await;
    assert_eq!(status, StatusCode::OK, "{written}");
    assert_eq!(written["spec"]["replicas"], 2);
    assert_eq!(written["status"]["phase"], "Claiming");
    let body = written;

    let mut relabelled = body.clone();
    relabelled["metadata"]["labels"] = json!({"team": "a"});
    let (status, body) = send(&app, Method::PUT, &uri, &relabelled).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}
