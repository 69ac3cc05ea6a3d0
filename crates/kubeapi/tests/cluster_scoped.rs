//! Cluster-scoped custom resources (GlobalTrafficPolicy) through the Kubernetes API: served at
//! `/apis/<group>/<version>/<plural>[/<name>[/status]]`, never under a namespace, admitted by
//! the CRD's schema and CEL rules, shown without a namespace, and kept across a restart.

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
const GTPS: &str = "/apis/agents.kruise.io/v1alpha1/globaltrafficpolicies";

async fn send_as(
    app: &axum::Router,
    method: Method,
    uri: &str,
    content_type: &str,
    accept: &str,
    body: String,
) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", content_type)
        .header("accept", accept)
        .body(Body::from(body))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn send(app: &axum::Router, method: Method, uri: &str, body: &Value) -> (StatusCode, Value) {
    let body = if body.is_null() { String::new() } else { body.to_string() };
    send_as(app, method, uri, "application/json", "application/json", body).await
}

fn config() -> KubeApiConfig {
    KubeApiConfig {
        admin_token: TOKEN.into(),
        server_address: "127.0.0.1:0".into(),
        team_keys: None,
        namespaces: Vec::new(),
    }
}

fn gtp(name: &str, priority: i64) -> Value {
    json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "GlobalTrafficPolicy",
        "metadata": {"name": name},
        "spec": {
            "priority": priority,
            "selector": {"matchLabels": {"agents.kruise.io/allow-internet-access": "false"}},
            "egress": {"rules": [{"action": "reject", "to": [{"cidr": "0.0.0.0/0"}]}]},
        },
    })
}

#[tokio::test]
async fn a_cluster_scoped_kind_is_served_at_cluster_paths_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store = EmbeddedStore::open(&path, EmbeddedOptions::default()).unwrap();
    let app = router(store.clone(), config());

    // Discovery: a cluster-scoped resource with its short name and status subresource.
    let (status, list) =
        send(&app, Method::GET, "/apis/agents.kruise.io/v1alpha1", &Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    let resources = list["resources"].as_array().unwrap();
    let entry = resources.iter().find(|r| r["name"] == "globaltrafficpolicies").unwrap();
    assert_eq!(entry["namespaced"], false);
    assert_eq!(entry["shortNames"], json!(["gtp"]));
    assert!(entry["verbs"].as_array().unwrap().contains(&json!("deletecollection")));
    let sub = resources.iter().find(|r| r["name"] == "globaltrafficpolicies/status").unwrap();
    assert_eq!(sub["namespaced"], false);

    // Create: answered without a namespace, admitted with the CRD's defaults.
    let (status, created) = send(&app, Method::POST, GTPS, &gtp("no-internet", 500)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert!(created["metadata"].get("namespace").is_none(), "{created}");
    assert_eq!(created["spec"]["priority"], 500);
    let (status, again) = send(&app, Method::POST, GTPS, &gtp("no-internet", 500)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        again["message"],
        "globaltrafficpolicies.agents.kruise.io \"no-internet\" already exists"
    );

    // The schema and CEL rules admit it: an empty spec breaks `has(ingress) || has(egress)`,
    // a negative priority the schema's minimum.
    let mut bare = gtp("bare", 1);
    bare["spec"] = json!({"selector": {}});
    let (status, refused) = send(&app, Method::POST, GTPS, &bare).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .starts_with("GlobalTrafficPolicy.agents.kruise.io \"bare\" is invalid"),
        "{refused}"
    );
    let (status, refused) = send(&app, Method::POST, GTPS, &gtp("negative", -1)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");

    // Get, list, table.
    let one = format!("{GTPS}/no-internet");
    let (status, got) = send(&app, Method::GET, &one, &Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got["metadata"]["uid"], created["metadata"]["uid"]);
    assert!(got["metadata"].get("namespace").is_none());
    let (status, listed) = send(&app, Method::GET, GTPS, &Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["kind"], "GlobalTrafficPolicyList");
    assert_eq!(listed["items"].as_array().unwrap().len(), 1);
    let table_accept = "application/json;as=Table;v=v1;g=meta.k8s.io";
    let (status, table) =
        send_as(&app, Method::GET, GTPS, "application/json", table_accept, String::new()).await;
    assert_eq!(status, StatusCode::OK);
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["Name", "Priority", "Age"]);
    assert_eq!(table["rows"][0]["cells"][0], "no-internet");
    assert_eq!(table["rows"][0]["cells"][1], 500);

    // Watch: the events' objects carry no namespace either.
    let request = Request::builder()
        .uri(format!("{GTPS}?watch=1&resourceVersion=0&timeoutSeconds=1"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let events: Vec<Value> = String::from_utf8(bytes.to_vec())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let added = events.iter().find(|e| e["type"] == "ADDED").unwrap();
    assert_eq!(added["object"]["metadata"]["name"], "no-internet");
    assert!(added["object"]["metadata"].get("namespace").is_none(), "{added}");

    // A namespaced path for a cluster-scoped kind, and a cluster path naming an object of a
    // namespaced kind, are not found, as on the API server.
    let namespaced = "/apis/agents.kruise.io/v1alpha1/namespaces/default/globaltrafficpolicies";
    let (status, _) = send(&app, Method::GET, namespaced, &Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = send(&app, Method::POST, namespaced, &gtp("x", 1)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) =
        send(&app, Method::GET, "/apis/agents.kruise.io/v1alpha1/sandboxes/x", &Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, missing) = send(&app, Method::GET, &format!("{GTPS}/nope"), &Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(missing["message"], "globaltrafficpolicies.agents.kruise.io \"nope\" not found");

    // The reserved filing namespace is no Namespace a client sees.
    let (_, namespaces) = send(&app, Method::GET, "/api/v1/namespaces", &Value::Null).await;
    let names: Vec<&str> = namespaces["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&oka_store::CLUSTER_NAMESPACE), "{names:?}");

    // Merge patch, server-side apply, the status subresource.
    let merge = "application/merge-patch+json";
    let patch = json!({"spec": {"priority": 700}}).to_string();
    let (status, patched) =
        send_as(&app, Method::PATCH, &one, merge, "application/json", patch).await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(patched["spec"]["priority"], 700);
    assert_eq!(patched["metadata"]["generation"], 2);
    let applied = serde_json::to_string(&gtp("applied", 10)).unwrap();
    let (status, applied) = send_as(
        &app,
        Method::PATCH,
        &format!("{GTPS}/applied?fieldManager=kubectl"),
        "application/apply-patch+yaml",
        "application/json",
        applied,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{applied}");
    assert!(applied["metadata"].get("namespace").is_none(), "{applied}");
    let mut with_status = patched.clone();
    with_status["status"] = json!({"conditions": [{
        "type": "Accepted", "status": "True", "reason": "Accepted", "message": "ok",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]});
    let (status, written) = send(&app, Method::PUT, &format!("{one}/status"), &with_status).await;
    assert_eq!(status, StatusCode::OK, "{written}");
    assert_eq!(written["status"]["conditions"][0]["type"], "Accepted");
    let (_, got) = send(&app, Method::GET, &format!("{one}/status"), &Value::Null).await;
    assert_eq!(got["status"]["conditions"][0]["reason"], "Accepted");

    // Durable: a new server over the same store file serves what the first wrote.
    drop(app);
    store.close().unwrap();
    let store = EmbeddedStore::open(&path, EmbeddedOptions::default()).unwrap();
    let app = router(store, config());
    let (status, got) = send(&app, Method::GET, &one, &Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["spec"]["priority"], 700);
    assert_eq!(got["status"]["conditions"][0]["type"], "Accepted");

    // Delete one, then the collection.
    let (status, _) = send(&app, Method::DELETE, &one, &Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send(&app, Method::GET, &one, &Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, gone) = send(&app, Method::DELETE, GTPS, &Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{gone}");
    assert_eq!(gone["items"].as_array().unwrap().len(), 1);
    let (_, listed) = send(&app, Method::GET, GTPS, &Value::Null).await;
    assert_eq!(listed["items"], json!([]));
}
