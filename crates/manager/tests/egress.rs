//! E2B's network options through the API: a create's `allow_internet_access` and
//! `network.allowOut/denyOut` and `PUT /sandboxes/{id}/network` become the sandbox's
//! TrafficPolicy (the reference's shape), which the applier is asked to enforce before the
//! answer, with E2B's 400s, the reference's 500 (the
//! sandbox killed) when it cannot be enforced, and 501 naming the feature when it is off.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use axum::body::Body;
use futures::future::BoxFuture;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use oka_api::trafficpolicy::TrafficAction;
use oka_api::{Sandbox, TrafficPolicy};
use oka_manager::egress::EgressApplier;
use serde_json::{Value, json};
use tower::ServiceExt;

/// Records what it is asked; `off` makes it unavailable, `fail` makes every apply fail.
#[derive(Default)]
struct Recorder {
    applied: Mutex<Vec<(String, TrafficPolicy)>>,
    off: bool,
    fail: bool,
}

impl EgressApplier for Recorder {
    fn available(&self) -> Result<(), String> {
        if self.off {
            Err("outbound-network is off: no nft; to turn it on: apt".into())
        } else {
            Ok(())
        }
    }
    fn apply<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        policy: &'a TrafficPolicy,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            if self.fail {
                return Err("nft said no".into());
            }
            let name = sandbox.metadata.name.clone().unwrap_or_default();
            self.applied.lock().unwrap().push((name, policy.clone()));
            Ok(())
        })
    }
}

async fn api(recorder: &Arc<Recorder>) -> common::Api {
    let applier = Arc::clone(recorder) as Arc<dyn EgressApplier>;
    common::api_with_state(2, |_| {}, move |state| state.with_egress(applier)).await
}

async fn call(router: &axum::Router, method: &str, uri: &str, body: Value) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "api.example.test:3000")
        .header("X-API-Key", common::KEY)
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Each rule's action and peers.
fn rules(policy: &TrafficPolicy) -> Vec<(TrafficAction, Vec<String>)> {
    let rules = policy.spec.egress.iter().flat_map(|d| &d.rules);
    rules
        .map(|r| {
            let to = r.to.iter().map(|p| p.cidr.clone().or(p.fqdn.clone()).unwrap()).collect();
            (r.action, to)
        })
        .collect()
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn a_create_with_network_rules_has_them_in_force_before_it_answers() {
    let recorder = Arc::new(Recorder::default());
    let api = api(&recorder).await;
    let body = json!({"templateID": "base", "allow_internet_access": false,
        "network": {"allowOut": ["198.51.100.7", "api.example.com"], "denyOut": ["10.0.0.0/8"]}});
    let (status, created) = call(&api.router, "POST", "/sandboxes", body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(
        created["network"],
        json!({"allowOut": ["198.51.100.7", "api.example.com"], "denyOut": ["10.0.0.0/8"]})
    );
    let applied = recorder.applied.lock().unwrap().clone();
    assert_eq!(applied.len(), 1);
    let (_, policy) = &applied[0];
    assert_eq!(
        rules(policy),
        [
            (TrafficAction::Allow, strings(&["198.51.100.7/32", "api.example.com"])),
            (TrafficAction::Reject, strings(&["10.0.0.0/8"])),
            (TrafficAction::Reject, vec![]),
        ]
    );
    // The reference's object, in the store for kubectl and the controller.
    assert_eq!(policy.metadata.name.as_deref().map(|n| n.starts_with("tp-")), Some(true));
    assert_eq!(policy.spec.priority, 100);
    let id = created["sandboxID"].as_str().unwrap();
    assert_eq!(policy.metadata.annotations.as_ref().unwrap()["agents.kruise.io/sandbox-id"], id);
    let stored = oka_store::Store::list::<TrafficPolicy>(
        &api.store,
        Some("default"),
        &oka_store::Selector::everything(),
    )
    .await
    .unwrap();
    assert_eq!(stored.items.len(), 1);

    // PUT replaces the rules; the create's allow_internet_access: false stays.
    let uri = format!("/sandboxes/{id}/network");
    let (status, _) = call(&api.router, "PUT", &uri, json!({"allowOut": ["203.0.113.0/24"]})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, policy) = recorder.applied.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        rules(&policy),
        [(TrafficAction::Allow, strings(&["203.0.113.0/24"])), (TrafficAction::Reject, vec![])]
    );
    let (_, described) = call(&api.router, "GET", &format!("/sandboxes/{id}"), json!({})).await;
    assert_eq!(described["network"], json!({"allowOut": ["203.0.113.0/24"]}));
    let stored = oka_store::Store::list::<TrafficPolicy>(
        &api.store,
        Some("default"),
        &oka_store::Selector::everything(),
    )
    .await
    .unwrap();
    assert_eq!(stored.items.len(), 1, "the same policy, updated");

    let (status, error) =
        call(&api.router, "PUT", &uri, json!({"denyOut": ["evil.example.com"]})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error["message"], "domains are not supported in denyOut: \"evil.example.com\"");
    let (status, _) = call(&api.router, "PUT", "/sandboxes/nope/network", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(recorder.applied.lock().unwrap().len(), 2, "nothing applied for refusals");

    // A create without rules asks for nothing.
    let (status, _) = call(&api.router, "POST", "/sandboxes", json!({"templateID": "base"})).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(recorder.applied.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn bad_entries_are_400_before_anything_is_claimed() {
    let recorder = Arc::new(Recorder::default());
    let api = api(&recorder).await;
    for (network, message) in [
        (
            json!({"allowOut": ["*.example.com"]}),
            "invalid allowOut entry: \"*.example.com\" wildcard",
        ),
        (
            json!({"denyOut": ["1.2.3.4/40"]}),
            "invalid denyOut entry: \"1.2.3.4/40\" is not a valid CIDR",
        ),
    ] {
        let body = json!({"templateID": "base", "network": network});
        let (status, error) = call(&api.router, "POST", "/sandboxes", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
        assert!(error["message"].as_str().unwrap().starts_with(message), "{error}");
    }
    let (status, _) = call(&api.router, "GET", "/sandboxes", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let claimed = oka_store::Store::list::<Sandbox>(
        &api.store,
        Some("default"),
        &oka_store::Selector::everything(),
    )
    .await
    .unwrap();
    let owned = claimed.items.iter().filter(|s| {
        s.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(oka_api::labels::ALLOW_INTERNET_ACCESS))
    });
    assert_eq!(owned.count(), 0, "no sandbox was claimed");
}

#[tokio::test]
async fn rules_where_they_cannot_be_enforced_are_refused_naming_the_feature() {
    let recorder = Arc::new(Recorder { off: true, ..Recorder::default() });
    let api = api(&recorder).await;
    let body = json!({"templateID": "base", "network": {"denyOut": ["0.0.0.0/0"]}});
    let (status, error) = call(&api.router, "POST", "/sandboxes", body).await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED);
    assert!(error["message"].as_str().unwrap().contains("outbound-network is off"), "{error}");
    // No internet where nothing has internet is already true.
    let body = json!({"templateID": "base", "allow_internet_access": false});
    let (status, _) = call(&api.router, "POST", "/sandboxes", body).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(recorder.applied.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_policy_that_fails_kills_the_sandbox_and_answers_500() {
    let recorder = Arc::new(Recorder { fail: true, ..Recorder::default() });
    let api = api(&recorder).await;
    let body = json!({"templateID": "base", "network": {"denyOut": ["0.0.0.0/0"]}});
    let (status, error) = call(&api.router, "POST", "/sandboxes", body).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let message = error["message"].as_str().unwrap();
    assert!(
        message.starts_with("failed to create network policy: nft said no; clean up sandbox: true; sandboxResource=default/"),
        "{message}"
    );
}
