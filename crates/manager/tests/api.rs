//! The REST API through `app(state).oneshot(...)`, over the real embedded store, plus one
//! test over real HTTP on loopback.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use jiff::Timestamp;
use oka_api::{Sandbox, annotations};
use oka_store::Store;
use serde_json::{Value, json};
use tower::ServiceExt;

use common::KEY;

struct Reply {
    status: StatusCode,
    headers: http::HeaderMap,
    json: Value,
}

async fn call(router: &axum::Router, method: &str, uri: &str, body: Option<Value>) -> Reply {
    call_with(router, method, uri, Some(KEY), body.map(|b| b.to_string())).await
}

async fn call_with(
    router: &axum::Router,
    method: &str,
    uri: &str,
    key: Option<&str>,
    body: Option<String>,
) -> Reply {
    let mut request =
        Request::builder().method(method).uri(uri).header("host", "api.example.test:3000");
    if let Some(key) = key {
        request = request.header("X-API-Key", key);
    }
    let request = request.body(body.map_or_else(Body::empty, Body::from)).unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    Reply { status, headers, json }
}

/// The error body, without its request ID (checked to be 32 hex digits).
#[track_caller]
fn error_of(reply: &Reply) -> Value {
    let mut json = reply.json.clone();
    let id = json.as_object_mut().unwrap().remove("request_id").unwrap();
    let id = id.as_str().unwrap();
    assert_eq!(id.len(), 32, "{id}");
    assert_eq!(reply.headers["x-request-id"], id);
    assert_eq!(reply.headers["content-type"], "application/json");
    json
}

async fn create(router: &axum::Router, body: Value) -> Value {
    let reply = call(router, "POST", "/sandboxes", Some(body)).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    reply.json
}

fn ts(value: &Value) -> Timestamp {
    value.as_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn create_claims_from_the_pool_and_answers_the_e2b_sandbox() {
    let api = common::api(2).await;
    let body = json!({"templateID": "base", "timeout": 120,
        "metadata": {"userId": "123", "label:app": "demo"}, "envVars": {"FOO": "bar"}});
    let reply = call(&api.router, "POST", "/sandboxes", Some(body)).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    assert!(reply.headers.contains_key("x-request-id"));
    let mut got = reply.json.clone();
    let object = got.as_object_mut().unwrap();
    let id = object.remove("sandboxID").unwrap();
    let token = object.remove("envdAccessToken").unwrap();
    let started = object.remove("startedAt").unwrap();
    let end = object.remove("endAt").unwrap();
    let resource = object["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("e2b.agents.kruise.io/sandbox-resource")
        .unwrap();
    assert_eq!(
        got,
        json!({"templateID": "base", "clientID": "", "envdVersion": "0.6.13",
            "domain": "example.test:3000", "cpuCount": 1, "memoryMB": 128, "diskSizeMB": 0,
            "alias": "base", "metadata": {"userId": "123", "app": "demo"}, "state": "running",
            "lifecycle": {"autoResume": false, "onTimeout": "kill"}})
    );
    let id = id.as_str().unwrap();
    assert_eq!(id.len(), 13);
    assert!(id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
    assert_eq!(token.as_str().unwrap().len(), 36);
    // The end time is whole seconds (a Kubernetes time); the start has microseconds.
    assert!((119..=120).contains(&(ts(&end) - ts(&started)).get_seconds()));
    let resource = resource.as_str().unwrap();
    assert!(resource.starts_with("default/base-"), "{resource}");

    // The store holds the claim: owner, lock, init request with the env vars and token.
    let name = resource.trim_start_matches("default/");
    let stored = api.store.get::<Sandbox>("default", name).await.unwrap();
    let notes = stored.metadata.annotations.unwrap();
    assert_eq!(notes[annotations::OWNER], oka_manager::api::auth::ADMIN_KEY_ID);
    assert_eq!(notes[annotations::LOCK].len(), 36);
    let init: Value = serde_json::from_str(&notes[annotations::INIT_RUNTIME_REQUEST]).unwrap();
    assert_eq!(init, json!({"envVars": {"FOO": "bar"}, "accessToken": token}));

    // The same through the customized prefix and the v2 path: the host is kept.
    let reply =
        call(&api.router, "POST", "/kruise/api/v2/sandboxes", Some(json!({"templateID": "base"})))
            .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    assert_eq!(reply.json["domain"], "api.example.test:3000");
    let lasts = (ts(&reply.json["endAt"]) - ts(&reply.json["startedAt"])).get_seconds();
    assert!((299..=300).contains(&lasts), "{lasts}");
}

/// A gateway stand-in whose routes appear when the test opens them.
struct HeldRoutes {
    asked: std::sync::Mutex<Vec<String>>,
    open: tokio::sync::watch::Sender<bool>,
}

impl oka_manager::api::RouteWaiter for HeldRoutes {
    fn wait_routed<'a>(
        &'a self,
        sandbox_id: &'a str,
        _timeout: std::time::Duration,
    ) -> futures::future::BoxFuture<'a, bool> {
        self.asked.lock().unwrap().push(sandbox_id.to_owned());
        let mut open = self.open.subscribe();
        Box::pin(async move { open.wait_for(|open| *open).await.is_ok() })
    }
}

#[tokio::test]
async fn create_answers_only_once_the_gateway_routes_the_sandbox() {
    let routes = std::sync::Arc::new(HeldRoutes {
        asked: std::sync::Mutex::default(),
        open: tokio::sync::watch::Sender::new(false),
    });
    let api = common::api_with_state(1, |_| {}, {
        let routes = std::sync::Arc::clone(&routes);
        |state| state.with_routes(routes)
    })
    .await;
    let router = api.router.clone();
    let pending = tokio::spawn(async move {
        call(&router, "POST", "/sandboxes", Some(json!({"templateID": "base"}))).await
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while routes.asked.lock().unwrap().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the create never asked for its route");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!pending.is_finished(), "the create answered before its sandbox was routed");

    routes.open.send_replace(true);
    let reply = pending.await.unwrap();
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    assert_eq!(*routes.asked.lock().unwrap(), [reply.json["sandboxID"].as_str().unwrap()]);
    // Server-Timing names the wait (held for at least the 100 ms above).
    let timing = reply.headers["server-timing"].to_str().unwrap();
    let route: f64 = timing
        .split(", ")
        .find_map(|metric| metric.strip_prefix("route;dur="))
        .unwrap_or_else(|| panic!("no route metric in {timing}"))
        .parse()
        .unwrap();
    assert!(route >= 100.0, "{timing}");
}

#[tokio::test]
async fn create_options_never_timeout_auto_pause_skip_init() {
    let api = common::api(3).await;
    let never = create(
        &api.router,
        json!({"templateID": "base",
        "metadata": {"e2b.agents.kruise.io/never-timeout": "true"}}),
    )
    .await;
    assert_eq!(never["endAt"], "0001-01-01T00:00:00Z");
    let paused =
        create(&api.router, json!({"templateID": "base", "timeout": 60, "autoPause": true})).await;
    assert!((59..=60).contains(&(ts(&paused["endAt"]) - ts(&paused["startedAt"])).get_seconds()));
    let skipped = create(
        &api.router,
        json!({"templateID": "base",
        "metadata": {"e2b.agents.kruise.io/skip-init-runtime": "true"}}),
    )
    .await;
    assert!(skipped.get("envdAccessToken").is_none(), "{skipped}");
}

#[tokio::test]
async fn create_rejects_bad_requests_with_the_reference_messages() {
    let api = common::api(1).await;
    let cases = [
        (json!({"templateID": "nope"}), 400, "Template or Checkpoint not found"),
        (json!({}), 400, "Template or Checkpoint not found"),
        (json!({"templateID": "base", "timeout": -1}), 400, "timeout should between 0 and 2592000"),
        (
            json!({"templateID": "base", "timeout": 2_592_001}),
            400,
            "timeout should between 0 and 2592000",
        ),
        (
            json!({"templateID": "base", "metadata": {"agents.kruise.io/owner": "x"}}),
            400,
            "Forbidden metadata key [agents.kruise.io/owner]: cannot contain prefixes: [e2b.agents.kruise.io/ agents.kruise.io/]",
        ),
        (
            json!({"templateID": "base", "metadata": {"e2b.agents.kruise.io/csi-volume-name": "x"}}),
            400,
            "Bad extension param: e2b.agents.kruise.io/csi-volume-name is not supported",
        ),
        (
            json!({"templateID": "base", "metadata": {"e2b.agents.kruise.io/image": "X"}}),
            400,
            "Bad extension param: invalid image [X]: repository name must be lowercase",
        ),
        (
            json!({"templateID": "base", "metadata": {"e2b.agents.kruise.io/cpu-limit": "1Gi"}}),
            400,
            "memory inplace update is not supported",
        ),
        (
            json!({"templateID": "base", "metadata": {"e2b.agents.kruise.io/cpu-request": "x"}}),
            400,
            "Bad extension param: invalid quantity for e2b.agents.kruise.io/cpu-request [x]: \
             quantities must match the regular expression \
             '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        ),
    ];
    for (body, code, message) in cases {
        let reply = call(&api.router, "POST", "/sandboxes", Some(body.clone())).await;
        assert_eq!(reply.status.as_u16(), code, "{body}");
        assert_eq!(error_of(&reply), json!({"code": code, "message": message}), "{body}");
    }
    // Malformed JSON: 400 in the E2B format.
    let reply =
        call_with(&api.router, "POST", "/sandboxes", Some(KEY), Some("{not json".into())).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let body = error_of(&reply);
    assert_eq!(body["code"], 400);
    assert!(body["message"].as_str().unwrap().starts_with("Invalid request body: "), "{body}");
    // Nothing was claimed by any of these.
    assert_eq!(api.index.pool_members("default", "base").len(), 1);
}

#[tokio::test]
async fn drained_pool_answers_503_with_retry_after_at_once() {
    let api = common::api(1).await;
    create(&api.router, json!({"templateID": "base"})).await;
    let started = std::time::Instant::now();
    let body = json!({"templateID": "base",
        "metadata": {"e2b.agents.kruise.io/create-on-no-stock": "false"}});
    let reply = call(&api.router, "POST", "/sandboxes", Some(body)).await;
    assert!(started.elapsed() < std::time::Duration::from_millis(200));
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.headers["retry-after"], "1");
    assert_eq!(
        error_of(&reply),
        json!({"code": 503, "message": "no available sandbox in pool default/base; retry later"})
    );
}

#[tokio::test]
async fn auth_unknown_routes_and_methods_answer_in_the_e2b_error_format() {
    let api = common::api(0).await;
    let unauthorized = json!({"code": 401, "message": "Invalid API Key"});
    let reply = call_with(&api.router, "GET", "/v2/sandboxes", None, None).await;
    assert_eq!((reply.status, error_of(&reply)), (StatusCode::UNAUTHORIZED, unauthorized.clone()));
    let bad = "e2b_ffffffffffffffffffffffffffffffffffffffff";
    let reply = call_with(&api.router, "GET", "/kruise/api/sandboxes/x", Some(bad), None).await;
    assert_eq!((reply.status, error_of(&reply)), (StatusCode::UNAUTHORIZED, unauthorized));

    for uri in ["/nope", "/sandboxes/x/y", "/kruise/api/nope", "/v3/sandboxes"] {
        let reply = call(&api.router, "GET", uri, None).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{uri}");
        assert_eq!(error_of(&reply), json!({"code": 404, "message": "Not found"}), "{uri}");
    }
    for (method, uri) in [
        ("PUT", "/sandboxes"),
        ("PATCH", "/kruise/api/sandboxes/x"),
        ("GET", "/sandboxes/x/timeout"),
    ] {
        let reply = call(&api.router, method, uri, None).await;
        assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "{method} {uri}");
        assert_eq!(
            error_of(&reply),
            json!({"code": 405, "message": "Method not allowed"}),
            "{method} {uri}"
        );
    }
    // The caller's request ID is kept, in the header and in the body.
    let request = Request::builder()
        .uri("/sandboxes/missing")
        .header("x-api-key", KEY)
        .header("x-request-id", "my-request")
        .body(Body::empty())
        .unwrap();
    let response = api.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.headers()["x-request-id"], "my-request");
    let body: Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        body,
        json!({"code": 404, "message": "Sandbox route not found, maybe it is crashed or killed: missing",
            "request_id": "my-request"})
    );
    // axum's own rejections answer the error body too: a path segment that is not UTF-8, a
    // body over the size limit.
    let reply = call(&api.router, "GET", "/sandboxes/%FF", None).await;
    assert_eq!(
        error_of(&reply),
        json!({"code": 400, "message": "Invalid URL: Invalid UTF-8 in `id`"})
    );
    let big = format!("{{\"templateID\": \"{}\"}}", "a".repeat(3 << 20));
    let reply = call_with(&api.router, "POST", "/v2/sandboxes", Some(KEY), Some(big)).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(reply.headers["content-type"], "application/json");
    assert_eq!(reply.json["code"], 413, "{}", reply.json);
    // Health is E2B's 204; the API's description is served without a key.
    let reply = call_with(&api.router, "GET", "/health", None, None).await;
    assert_eq!((reply.status, reply.json), (StatusCode::NO_CONTENT, Value::Null));
    let reply = call_with(&api.router, "GET", "/openapi.yaml", None, None).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers["content-type"], "application/yaml");
    let Value::String(text) = reply.json else { panic!("not text: {:?}", reply.json) };
    assert!(text.starts_with("openapi: 3.0.3\n"), "{text}");
    assert!(text.contains("\n  /v2/sandboxes:\n"), "documents the create");
}

#[tokio::test]
async fn describe_kill_and_timeout() {
    let api = common::api(2).await;
    let created = create(&api.router, json!({"templateID": "base", "metadata": {"k": "v"}})).await;
    let id = created["sandboxID"].as_str().unwrap();
    let reply = call(&api.router, "GET", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json, created, "describe shows what create answered");

    // Timeout: may shorten; bad input is 400; the end time moves.
    let reply = call(
        &api.router,
        "POST",
        &format!("/sandboxes/{id}/timeout"),
        Some(json!({"timeout": 45})),
    )
    .await;
    assert_eq!((reply.status, reply.json.clone()), (StatusCode::NO_CONTENT, Value::Null));
    let after = call(&api.router, "GET", &format!("/kruise/api/sandboxes/{id}"), None).await.json;
    let left = (ts(&after["endAt"]) - Timestamp::now()).get_seconds();
    assert!((43..=45).contains(&left), "{left}");
    for (body, message) in [
        (json!({"timeout": -1}), "timeout should between 0 and 2592000"),
        (json!({"timeout": 2_592_001}), "timeout should between 0 and 2592000"),
    ] {
        let reply =
            call(&api.router, "POST", &format!("/sandboxes/{id}/timeout"), Some(body)).await;
        assert_eq!(
            (reply.status, error_of(&reply)),
            (StatusCode::BAD_REQUEST, json!({"code": 400, "message": message}))
        );
    }
    let reply =
        call(&api.router, "POST", &format!("/sandboxes/{id}/timeout"), Some(json!({}))).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);

    // Kill: 204, then 404 for everything about it.
    let reply = call(&api.router, "DELETE", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let gone = json!({"code": 404, "message": format!("Sandbox route not found, maybe it is crashed or killed: {id}")});
    for (method, uri, body) in [
        ("GET", format!("/sandboxes/{id}"), None),
        ("DELETE", format!("/sandboxes/{id}"), None),
        ("POST", format!("/sandboxes/{id}/timeout"), Some(json!({"timeout": 60}))),
    ] {
        let reply = call(&api.router, method, &uri, body).await;
        assert_eq!(
            (reply.status, error_of(&reply)),
            (StatusCode::NOT_FOUND, gone.clone()),
            "{method} {uri}"
        );
    }
    let name = created["metadata"]["e2b.agents.kruise.io/sandbox-resource"].as_str().unwrap();
    let error =
        api.store.get::<Sandbox>("default", name.trim_start_matches("default/")).await.unwrap_err();
    assert!(error.is_not_found(), "{error}");
}

#[tokio::test]
async fn kill_hands_a_recyclable_sandbox_back_to_its_pool() {
    let (store, _dir) = common::store();
    let set = common::create_pool(&store, "default", "base").await;
    let members = common::stock(&store, &set, 1).await;
    let mut member = members[0].clone();
    member
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(annotations::CLEANUP_ENABLED.into(), "true".into());
    store.update("default", &member).await.unwrap();
    let index = oka_manager::Index::spawn(store.clone());
    index.wait_ready().await;
    let config =
        oka_manager::api::ManagerConfig::new(oka_manager::api::ApiKey::parse(KEY).unwrap());
    let router = oka_manager::api::app(oka_manager::api::AppState::new(
        store.clone(),
        index.clone(),
        config,
    ));
    common::wait_members(&index, "default", "base", 1).await;
    // The index may still hold the version before the annotation; wait for it.
    for _ in 0..200 {
        if index.pool_members("default", "base")[0]
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(annotations::CLEANUP_ENABLED))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let created = create(&router, json!({"templateID": "base"})).await;
    let id = created["sandboxID"].as_str().unwrap();
    let reply = call(&router, "DELETE", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let stored =
        store.get::<Sandbox>("default", member.metadata.name.as_deref().unwrap()).await.unwrap();
    assert_eq!(stored.metadata.annotations.unwrap()[annotations::CLEANUP], "true");
    let reply = call(&router, "GET", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn list_filters_and_paginates() {
    let api = common::api(5).await;
    let mut ids = BTreeSet::new();
    for i in 0..5 {
        let team = if i % 2 == 0 { "red" } else { "blue" };
        let created = create(
            &api.router,
            json!({"templateID": "base", "metadata": {"team": team, "n": i.to_string()}}),
        )
        .await;
        ids.insert(created["sandboxID"].as_str().unwrap().to_owned());
    }
    // Pages of 2 over v2, following X-Next-Token.
    let mut seen = Vec::new();
    let mut uri = "/v2/sandboxes?limit=2".to_owned();
    let mut pages = 0;
    loop {
        let reply = call(&api.router, "GET", &uri, None).await;
        assert_eq!(reply.status, StatusCode::OK);
        pages += 1;
        for item in reply.json.as_array().unwrap() {
            assert!(item.get("envdAccessToken").is_none());
            assert_eq!(item["state"], "running");
            seen.push(item["sandboxID"].as_str().unwrap().to_owned());
        }
        match reply.headers.get("x-next-token") {
            Some(token) => {
                uri = format!("/v2/sandboxes?limit=2&nextToken={}", token.to_str().unwrap())
            }
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), 5);
    assert_eq!(seen.iter().cloned().collect::<BTreeSet<_>>(), ids);

    // Metadata filters: the SDK's encoded form, plain extra keys, and both paths.
    let count = |reply: &Reply| reply.json.as_array().unwrap().len();
    let reply = call(&api.router, "GET", "/v2/sandboxes?metadata=team%3Dred", None).await;
    assert_eq!(count(&reply), 3);
    let reply =
        call(&api.router, "GET", "/kruise/api/sandboxes?metadata=team%3Dred%26n%3D2", None).await;
    assert_eq!(count(&reply), 1);
    let reply = call(&api.router, "GET", "/sandboxes?team=blue", None).await;
    assert_eq!(count(&reply), 2);
    let reply = call(&api.router, "GET", "/v2/sandboxes?state=paused", None).await;
    assert_eq!(count(&reply), 0);
    let reply =
        call(&api.router, "GET", "/v2/sandboxes?state=running,paused&order=desc", None).await;
    assert_eq!(count(&reply), 5);
    let reply = call(&api.router, "GET", "/v2/sandboxes?state=dead", None).await;
    assert_eq!(
        (reply.status, error_of(&reply)),
        (
            StatusCode::BAD_REQUEST,
            json!({"code": 400, "message": "Only 'running' and 'paused' state are supported, not: 'dead'"})
        )
    );
    let reply = call(&api.router, "GET", "/v2/sandboxes?limit=500", None).await;
    assert_eq!(error_of(&reply)["message"], "Invalid limit: 500, must be between 1 and 100");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_the_sdk_flow_over_real_http_on_loopback() {
    let api = common::api(3).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, api.router).await });
    let mut client = common::Client::connect(addr).await;
    let (status, _, body) = client
        .send("POST", "/v2/sandboxes", Some(r#"{"templateID":"base","metadata":{},"envVars":{}}"#))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let created: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(created["domain"], addr.to_string());
    let id = created["sandboxID"].as_str().unwrap();
    let (status, _, body) = client.send("GET", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), created);
    let (status, _, _) = client.send("DELETE", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, _) = client.send("DELETE", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    server.abort();
}

/// Waits until `GET /sandboxes/{id}` shows `state`.
async fn wait_state(router: &axum::Router, id: &str, state: &str) {
    for _ in 0..400 {
        let reply = call(router, "GET", &format!("/sandboxes/{id}"), None).await;
        if reply.json["state"] == state {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("{id} never became {state}");
}

async fn stored(api: &common::Api, created: &Value) -> Sandbox {
    let resource = created["metadata"]["e2b.agents.kruise.io/sandbox-resource"].as_str().unwrap();
    api.store.get::<Sandbox>("default", resource.trim_start_matches("default/")).await.unwrap()
}

#[tokio::test]
async fn connect_to_a_running_sandbox_only_extends_its_end() {
    let api = common::api(1).await;
    let created = create(&api.router, json!({"templateID": "base", "timeout": 300})).await;
    let id = created["sandboxID"].as_str().unwrap();
    for (uri, body) in [
        (format!("/sandboxes/{id}/connect"), json!({"timeout": 30})),
        (format!("/v2/sandboxes/{id}/connect"), json!({})),
        (format!("/kruise/api/v2/sandboxes/{id}/connect"), json!({"timeout": 60})),
    ] {
        let reply = call(&api.router, "POST", &uri, Some(body)).await;
        assert_eq!(reply.status, StatusCode::OK, "{uri}");
        assert_eq!(reply.json["endAt"], created["endAt"], "a shorter connect never shortens");
        assert_eq!(reply.json["envdAccessToken"], created["envdAccessToken"]);
    }
    let reply = call(
        &api.router,
        "POST",
        &format!("/sandboxes/{id}/connect"),
        Some(json!({"timeout": 900})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let left = (ts(&reply.json["endAt"]) - Timestamp::now()).get_seconds();
    assert!((898..=900).contains(&left), "{left}");
    let reply = call(
        &api.router,
        "POST",
        &format!("/sandboxes/{id}/connect"),
        Some(json!({"timeout": -5})),
    )
    .await;
    assert_eq!(
        error_of(&reply),
        json!({"code": 400, "message": "timeout should between 0 and 2592000"})
    );
    let reply = call(&api.router, "POST", "/v2/sandboxes/nope/connect", Some(json!({}))).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_resumes_a_paused_sandbox_and_answers_201() {
    let api = common::api(1).await;
    let created = create(&api.router, json!({"templateID": "base", "timeout": 60})).await;
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    // Pause it as the sandbox controller would: spec.paused, then phase Paused.
    let mut sandbox = stored(&api, &created).await;
    sandbox.spec.paused = Some(true);
    let mut sandbox = api.store.update("default", &sandbox).await.unwrap();
    // While pausing (spec.paused, phase still Running), connect waits for the pause to end,
    // then resumes (as E2B).
    wait_state(&api.router, &id, "paused").await;
    let router = api.router.clone();
    let uri = format!("/v2/sandboxes/{id}/connect");
    let waiting =
        tokio::spawn(
            async move { call(&router, "POST", &uri, Some(json!({"timeout": 60}))).await },
        );
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "connect waits for the pause in progress");
    // A stand-in controller: once spec.paused is cleared, the sandbox runs again.
    let store = api.store.clone();
    let name = sandbox.metadata.name.clone().unwrap();
    let controller = tokio::spawn(async move {
        loop {
            let mut current = store.get::<Sandbox>("default", &name).await.unwrap();
            if current.spec.paused == Some(false) {
                current.status.as_mut().unwrap().phase = Some(oka_api::SandboxPhase::Running);
                store.update_status("default", &current).await.unwrap();
                return current;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    });
    // The pause completes.
    let status = sandbox.status.as_mut().unwrap();
    status.phase = Some(oka_api::SandboxPhase::Paused);
    let paused = oka_api::conditions::sandbox::PAUSED;
    oka_api::conditions::set(
        status.conditions.get_or_insert_default(),
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: paused.into(),
            status: oka_api::conditions::TRUE.into(),
            reason: "FreezePauseSucceed".into(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::now(),
            ),
            observed_generation: None,
        },
    );
    api.store.update_status("default", &sandbox).await.unwrap();
    let reply = waiting.await.unwrap();
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    assert_eq!(reply.json["state"], "running");
    // Resumed with the asked 60 s (E2B has no floor), written in the same write that cleared
    // paused.
    let resumed = controller.await.unwrap();
    let left = (resumed.spec.shutdown_time.unwrap().0 - Timestamp::now()).get_seconds();
    assert!((58..=60).contains(&left), "{left} s left");
    let reply = call(
        &api.router,
        "POST",
        &format!("/sandboxes/{id}/connect"),
        Some(json!({"timeout": 60})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
}

async fn create_with_key(router: &axum::Router, key: &str) -> Reply {
    create_with_key_and_body(router, key, json!({"templateID": "base"})).await
}

async fn create_with_key_and_body(router: &axum::Router, key: &str, body: Value) -> Reply {
    let request = Request::builder()
        .method("POST")
        .uri("/v2/sandboxes")
        .header("host", "localhost:3000")
        .header("x-api-key", KEY)
        .header("idempotency-key", key)
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Reply { status, headers, json: serde_json::from_slice(&bytes).unwrap() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_makes_a_retried_create_return_the_same_sandbox() {
    let api = common::api(3).await;
    let first = create_with_key(&api.router, "retry-1").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = create_with_key(&api.router, "retry-1").await;
    assert_eq!((again.status, &again.json), (StatusCode::CREATED, &first.json));
    // The same key with another request is refused (E2B's 409), and claims nothing.
    let body = json!({"templateID": "base", "timeout": 60});
    let other = create_with_key_and_body(&api.router, "retry-1", body).await;
    assert_eq!(
        error_of(&other),
        json!({"code": 409, "message": "Idempotency-Key retry-1 was used with another request body"})
    );
    // Concurrent duplicates of a new key all get one sandbox.
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let router = api.router.clone();
            tokio::spawn(async move { create_with_key(&router, "burst").await })
        })
        .collect();
    let mut ids = BTreeSet::new();
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::CREATED);
        ids.insert(reply.json["sandboxID"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 1);
    assert_ne!(ids.first().unwrap(), first.json["sandboxID"].as_str().unwrap());
    assert_eq!(api.index.pool_members("default", "base").len(), 1, "two keys, two claims");
    let reply = create_with_key(&api.router, "Not_Valid").await;
    assert_eq!(
        error_of(&reply),
        json!({"code": 400, "message": "Invalid Idempotency-Key: must match [a-z0-9-]{1,255}"})
    );
}

#[tokio::test]
async fn timeouts_follow_the_configured_bounds() {
    // (api.minTimeout, request, path kind, timeout, status)
    let cases = [
        (0, "create", 5, StatusCode::CREATED),
        (0, "create", 1, StatusCode::CREATED),
        (30, "create", 5, StatusCode::BAD_REQUEST),
        (30, "create", 30, StatusCode::CREATED),
        (0, "timeout", 0, StatusCode::NO_CONTENT),
        (0, "timeout", 5, StatusCode::NO_CONTENT),
        (30, "timeout", 5, StatusCode::BAD_REQUEST),
        (0, "connect", 5, StatusCode::OK),
        (30, "connect", 5, StatusCode::BAD_REQUEST),
    ];
    for (min, what, timeout, status) in cases {
        let api = common::api_with(2, |config| config.min_timeout_secs = min).await;
        let body = json!({"templateID": "base", "timeout": timeout});
        let reply = if what == "create" {
            call(&api.router, "POST", "/v2/sandboxes", Some(body)).await
        } else {
            let created = create(&api.router, json!({"templateID": "base", "timeout": 600})).await;
            let id = created["sandboxID"].as_str().unwrap();
            let uri = format!("/sandboxes/{id}/{what}");
            call(&api.router, "POST", &uri, Some(json!({"timeout": timeout}))).await
        };
        assert_eq!(reply.status, status, "min {min}: {what} {timeout}: {}", reply.json);
        if status == StatusCode::BAD_REQUEST {
            let message = format!("timeout should between {min} and 2592000");
            assert_eq!(error_of(&reply)["message"], message);
        }
    }
    // `/timeout` 0 ends the sandbox now: its end time is the present.
    let api = common::api(1).await;
    let created = create(&api.router, json!({"templateID": "base", "timeout": 600})).await;
    let id = created["sandboxID"].as_str().unwrap();
    let reply =
        call(&api.router, "POST", &format!("/sandboxes/{id}/timeout"), Some(json!({"timeout": 0})))
            .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let name = created["metadata"]["e2b.agents.kruise.io/sandbox-resource"].as_str().unwrap();
    let stored: Sandbox =
        api.store.get("default", name.trim_start_matches("default/")).await.unwrap();
    assert!(stored.spec.shutdown_time.unwrap().0 <= Timestamp::now());
}

#[tokio::test]
async fn operations_oka_does_not_serve_answer_501_and_say_so() {
    let api = common::api(1).await;
    let created = create(&api.router, json!({"templateID": "base"})).await;
    let id = created["sandboxID"].as_str().unwrap();
    // (method, path, status, message start)
    let cases = [
        ("POST", "/v3/templates".to_owned(), 501, "building templates through the E2B API"),
        ("GET", "/templates/base/builds/b1/status".to_owned(), 501, "building templates"),
        ("GET", "/templates/base/tags".to_owned(), 501, "building templates"),
        ("PUT", "/template-files/token".to_owned(), 501, "building templates"),
        ("POST", "/v2/templates".to_owned(), 501, "this version of E2B's template-build API"),
        ("GET", "/volumes".to_owned(), 501, "volumes are not supported"),
        ("GET", "/secrets".to_owned(), 501, "secrets are not supported"),
        ("GET", format!("/v2/sandboxes/{id}/logs"), 501, "sandbox logs are not supported"),
        ("GET", "/sandboxes/metrics?sandbox_ids=a".to_owned(), 501, "metrics of several"),
        ("PUT", format!("/sandboxes/{id}/network"), 501, "network rules"),
        ("PUT", "/sandboxes/nope/network".to_owned(), 404, "Sandbox route not found"),
        ("GET", "/templates/aliases/base".to_owned(), 200, ""),
        ("GET", "/templates/aliases/nope".to_owned(), 404, "Template alias not found: nope"),
    ];
    for (method, path, status, message) in cases {
        let reply = call(&api.router, method, &path, Some(json!({}))).await;
        assert_eq!(reply.status.as_u16(), status, "{method} {path}: {}", reply.json);
        if status == 200 {
            assert_eq!(reply.json, json!({"templateID": "base", "public": false}));
        } else {
            let got = error_of(&reply)["message"].as_str().unwrap().to_owned();
            assert!(got.starts_with(message), "{method} {path}: {got}");
        }
    }
    // The key is checked first.
    let reply = call_with(&api.router, "GET", "/volumes", Some("e2b_0000"), None).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn create_refuses_what_it_cannot_honour_and_names_it() {
    let api = common::api(2).await;
    let cases = [
        (json!({"mcp": {"github": {}}}), "mcp"),
        (json!({"iam": {"tokens": {"a": {"audience": "x"}}}}), "iam"),
        (json!({"volumeMounts": [{"name": "v", "path": "/data"}]}), "volumeMounts"),
        (json!({"network": {"egressProxy": {"url": "x"}}}), "network.egressProxy"),
    ];
    for (extra, field) in cases {
        let mut body = extra.clone();
        body["templateID"] = json!("base");
        let reply = call(&api.router, "POST", "/v2/sandboxes", Some(body)).await;
        assert_eq!(
            error_of(&reply),
            json!({"code": 400, "message": format!("{field} is not supported by oka yet: leave it out of the create")}),
            "{extra}"
        );
    }
    // What asks for nothing is fine: empty, null, and what oka honours.
    let body = json!({"templateID": "base", "mcp": null, "iam": {}, "volumeMounts": [],
        "secure": true, "network": {"allowPublicTraffic": true, "allowOut": []}});
    let reply = call(&api.router, "POST", "/v2/sandboxes", Some(body)).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
}
