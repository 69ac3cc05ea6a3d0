//! Create-on-no-stock: an empty pool creates a new sandbox (rate limited, bounded wait), or
//! answers 503 with `Retry-After` at once.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use http::StatusCode;
use oka_api::{Sandbox, annotations, labels};
use oka_store::{Selector, Store};
use serde_json::json;

use common::{call, create, error_of};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_pool_creates_a_new_claimed_sandbox_once_it_runs() {
    let api = common::api(0).await;
    let _controller = common::stand_in_controller(&api.store);
    let created = create(&api.router, json!({"templateID": "base", "metadata": {"k": "v"}})).await;
    assert_eq!(created["state"], "running");
    let id = created["sandboxID"].as_str().unwrap();
    let resource = created["metadata"]["e2b.agents.kruise.io/sandbox-resource"].as_str().unwrap();
    let stored =
        api.store.get::<Sandbox>("default", resource.trim_start_matches("default/")).await.unwrap();
    assert!(stored.metadata.owner_references.is_none(), "not a pool member");
    let l = stored.metadata.labels.as_ref().unwrap();
    assert_eq!(
        (l[labels::SANDBOX_POOL].as_str(), l[labels::SANDBOX_CLAIMED].as_str()),
        ("base", "true")
    );
    let a = stored.metadata.annotations.as_ref().unwrap();
    assert_eq!(a[annotations::SANDBOX_PRIORITY], "100");
    assert_eq!(a["k"], "v");
    let reply = call(&api.router, "GET", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn switched_off_the_empty_pool_answers_503_at_once() {
    let api = common::api_with(0, |c| c.create.enabled = false).await;
    let started = Instant::now();
    let reply =
        call(&api.router, "POST", "/v2/sandboxes", Some(json!({"templateID": "base"}))).await;
    assert!(started.elapsed() < Duration::from_millis(500));
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.headers["retry-after"], "1");
    assert_eq!(error_of(&reply)["code"], 503);
    let all = api.store.list::<Sandbox>(None, &Selector::everything()).await.unwrap();
    assert!(all.items.is_empty(), "nothing created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_beyond_the_rate_answer_503_with_retry_after() {
    let api = common::api_with(0, |c| c.max_create_qps = 1).await;
    let _controller = common::stand_in_controller(&api.store);
    create(&api.router, json!({"templateID": "base"})).await;
    let started = Instant::now();
    let reply =
        call(&api.router, "POST", "/v2/sandboxes", Some(json!({"templateID": "base"}))).await;
    assert!(started.elapsed() < Duration::from_millis(500));
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{}", reply.json);
    assert_eq!(reply.headers["retry-after"], "1");
    assert!(error_of(&reply)["message"].as_str().unwrap().contains("rate limited"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_sandbox_that_fails_is_deleted_and_the_create_fails() {
    let api = common::api(0).await;
    let _controller = common::stand_in_controller_with(&api.store, true);
    let reply =
        call(&api.router, "POST", "/v2/sandboxes", Some(json!({"templateID": "base"}))).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", reply.json);
    let message = error_of(&reply)["message"].as_str().unwrap().to_owned();
    assert!(message.starts_with("Failed to create sandbox: cannot create a new sandbox in pool default/base: it ended (Failed)"), "{message}");
    let all = api.store.list::<Sandbox>(None, &Selector::everything()).await.unwrap();
    assert!(all.items.is_empty(), "the failed sandbox was deleted: {:?}", all.items);
}

#[tokio::test(start_paused = true)]
async fn a_new_sandbox_that_never_runs_is_deleted_after_the_bounded_wait() {
    let api = common::api_with(0, |c| c.create.ready_timeout = Duration::from_secs(5)).await;
    let reply =
        call(&api.router, "POST", "/v2/sandboxes", Some(json!({"templateID": "base"}))).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", reply.json);
    assert!(error_of(&reply)["message"].as_str().unwrap().ends_with("it did not run within 5s"));
    let all = api.store.list::<Sandbox>(None, &Selector::everything()).await.unwrap();
    assert!(all.items.is_empty());
}

#[tokio::test(start_paused = true)]
async fn wait_ready_timeout_seconds_bounds_the_wait_of_one_create() {
    let api = common::api(0).await;
    let body = json!({"templateID": "base",
        "metadata": {"e2b.agents.kruise.io/wait-ready-timeout-seconds": "2"}});
    let reply = call(&api.router, "POST", "/v2/sandboxes", Some(body)).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", reply.json);
    assert!(error_of(&reply)["message"].as_str().unwrap().ends_with("it did not run within 2s"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retries_with_one_idempotency_key_create_one_new_sandbox() {
    let api = common::api(0).await;
    let _controller = common::stand_in_controller(&api.store);
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let router = api.router.clone();
            tokio::spawn(async move {
                common::send(
                    &router,
                    "POST",
                    "/v2/sandboxes",
                    Some(common::KEY),
                    &[("idempotency-key", "once")],
                    Some(json!({"templateID": "base"})),
                )
                .await
            })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
        ids.insert(reply.json["sandboxID"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 1);
    let all = api.store.list::<Sandbox>(None, &Selector::everything()).await.unwrap();
    assert_eq!(all.items.len(), 1, "one sandbox created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_sandbox_starts_its_clock_once_it_runs() {
    let api = common::api(0).await;
    // The controller is late: the sandbox starts well after the create began.
    let store = api.store.clone();
    let late = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(3000)).await;
        common::stand_in_controller(&store)
    });
    let created = create(&api.router, json!({"templateID": "base", "timeout": 1})).await;
    let resource = created["metadata"]["e2b.agents.kruise.io/sandbox-resource"].as_str().unwrap();
    let stored =
        api.store.get::<Sandbox>("default", resource.trim_start_matches("default/")).await.unwrap();
    // Not long past its 1 s end (3 s after the create began): the end counts from when it
    // ran (whole seconds, so within a second of now).
    let end = stored.spec.shutdown_time.unwrap().0;
    let left = (end - jiff::Timestamp::now()).get_milliseconds();
    assert!((-1000..=1000).contains(&left), "{left} ms left");
    drop(late);
}
