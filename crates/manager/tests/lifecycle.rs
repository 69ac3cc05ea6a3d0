//! Pause, resume and connect-resume through the API, over the real embedded store, with a
//! stand-in for the sandbox controller's phase reports.
#![allow(clippy::unwrap_used)]

mod common;

use http::StatusCode;
use jiff::Timestamp;
use oka_api::{Sandbox, SandboxPhase, annotations};
use oka_store::Store;
use serde_json::json;

use common::{call, create, error_of, send};

async fn stored(api: &common::Api, created: &serde_json::Value) -> Sandbox {
    let resource = created["metadata"]["e2b.agents.kruise.io/sandbox-resource"].as_str().unwrap();
    api.store.get::<Sandbox>("default", resource.trim_start_matches("default/")).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_waits_for_the_controller_then_409_when_already_paused() {
    let api = common::api(2).await;
    let _controller = common::stand_in_controller(&api.store);
    let created = create(&api.router, json!({"templateID": "base", "timeout": 60})).await;
    let id = created["sandboxID"].as_str().unwrap();
    let reply = call(&api.router, "POST", &format!("/sandboxes/{id}/pause"), Some(json!({}))).await;
    assert_eq!((reply.status, reply.json.clone()), (StatusCode::NO_CONTENT, json!(null)));
    // Answered only once the controller reported it paused.
    let sandbox = stored(&api, &created).await;
    assert_eq!(sandbox.phase(), Some(&SandboxPhase::Paused));
    assert!(sandbox.is_paused());
    // Paused retention defaults to forever: the shutdown time moved a century out.
    let end = sandbox.spec.shutdown_time.unwrap().0;
    assert!((end - Timestamp::now()).get_seconds() > 50 * 365 * 86_400);
    assert_eq!(
        sandbox.metadata.annotations.unwrap()[annotations::RESERVE_PAUSED_SANDBOX_DURATION],
        "forever"
    );
    let info = call(&api.router, "GET", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(info.json["state"], "paused");
    // A paused sandbox's end is when it paused (E2B), not its retention.
    let end: Timestamp = info.json["endAt"].as_str().unwrap().parse().unwrap();
    assert!((Timestamp::now() - end).get_seconds().abs() <= 2, "{end}");
    let listed = call(&api.router, "GET", "/v2/sandboxes?state=paused", None).await;
    assert_eq!(listed.json.as_array().unwrap().len(), 1);

    // Again: 409, which the SDK reads as "already paused".
    let reply = call(&api.router, "POST", &format!("/kruise/api/sandboxes/{id}/pause"), None).await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    let message = error_of(&reply)["message"].as_str().unwrap().to_owned();
    assert!(
        message.starts_with(&format!(
            "Failed to pause sandbox: Conflict: sandbox {id} is already paused"
        )),
        "{message}"
    );

    // Unknown: 404. A bad retention header: 400, nothing written.
    let reply = call(&api.router, "POST", "/sandboxes/nope/pause", None).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    let other = create(&api.router, json!({"templateID": "base"})).await;
    let other_id = other["sandboxID"].as_str().unwrap();
    let reply = send(
        &api.router,
        "POST",
        &format!("/sandboxes/{other_id}/pause"),
        Some(common::KEY),
        &[("x-e2b-kruise-reserve-paused-sandbox-duration", "soon")],
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(!stored(&api, &other).await.is_paused());
    // A retention from the header bounds the paused sandbox's life.
    let reply = send(
        &api.router,
        "POST",
        &format!("/sandboxes/{other_id}/pause"),
        Some(common::KEY),
        &[("x-e2b-kruise-reserve-paused-sandbox-duration", "1h")],
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let left =
        (stored(&api, &other).await.spec.shutdown_time.unwrap().0 - Timestamp::now()).get_seconds();
    assert!((3590..=3600).contains(&left), "{left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_answers_201_once_running_and_409_when_not_paused() {
    let api = common::api(1).await;
    let _controller = common::stand_in_controller(&api.store);
    let created = create(&api.router, json!({"templateID": "base", "timeout": 60})).await;
    let id = created["sandboxID"].as_str().unwrap();
    let reply =
        call(&api.router, "POST", &format!("/sandboxes/{id}/resume"), Some(json!({}))).await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    assert!(error_of(&reply)["message"].as_str().unwrap().contains("SandboxIsRunning"));
    let reply = call(&api.router, "POST", &format!("/sandboxes/{id}/pause"), None).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let reply = call(
        &api.router,
        "POST",
        &format!("/sandboxes/{id}/resume"),
        Some(json!({"timeout": 600, "autoPause": true})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    assert_eq!(reply.json["state"], "running");
    assert_eq!(reply.json["sandboxID"], id);
    assert_eq!(reply.json["envdAccessToken"], created["envdAccessToken"]);
    assert_eq!(reply.json["lifecycle"], json!({"autoResume": false, "onTimeout": "pause"}));
    let sandbox = stored(&api, &created).await;
    assert_eq!(sandbox.phase(), Some(&SandboxPhase::Running));
    let pause_in = (sandbox.spec.pause_time.unwrap().0 - Timestamp::now()).get_seconds();
    assert!((598..=600).contains(&pause_in), "{pause_in}");
    let reply = call(&api.router, "POST", "/sandboxes/nope/resume", None).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_then_connect_resumes_with_201_then_200() {
    let api = common::api(1).await;
    let _controller = common::stand_in_controller(&api.store);
    let created = create(&api.router, json!({"templateID": "base"})).await;
    let id = created["sandboxID"].as_str().unwrap();
    assert_eq!(created["lifecycle"], json!({"autoResume": false, "onTimeout": "kill"}));
    let reply = call(&api.router, "POST", &format!("/sandboxes/{id}/pause"), None).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let reply =
        call(&api.router, "POST", &format!("/v2/sandboxes/{id}/connect"), Some(json!({}))).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    assert_eq!(reply.json["state"], "running");
    let left = (reply.json["endAt"].as_str().unwrap().parse::<Timestamp>().unwrap()
        - Timestamp::now())
    .get_seconds();
    assert!((298..=300).contains(&left), "resumed with the default 300 s: {left}");
    let reply =
        call(&api.router, "POST", &format!("/v2/sandboxes/{id}/connect"), Some(json!({}))).await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn create_records_the_lifecycle_the_sdk_sends() {
    let api = common::api(6).await;
    let stop = Some("Stop");
    // (create body, lifecycle shown, auto-resume annotation, pause timer set, pause strategy)
    let cases = [
        (json!({}), (false, "kill"), "false", false, None),
        (json!({"autoPause": true}), (false, "pause"), "false", true, None),
        (
            json!({"autoPause": true, "autoPauseMemory": true}),
            (false, "pause"),
            "false",
            true,
            None,
        ),
        (
            json!({"autoPause": true, "autoResume": {"enabled": true}}),
            (true, "pause"),
            "true",
            true,
            None,
        ),
        (
            json!({"autoPause": true, "autoPauseMemory": false}),
            (false, "pause"),
            "false",
            true,
            stop,
        ),
        (json!({"autoResume": {"enabled": true}}), (true, "kill"), "true", false, None),
    ];
    for (body, (auto_resume, on_timeout), note, timer, strategy) in cases {
        let mut request = body.clone();
        request["templateID"] = json!("base");
        let created = create(&api.router, request).await;
        assert_eq!(
            created["lifecycle"],
            json!({"autoResume": auto_resume, "onTimeout": on_timeout}),
            "{body}"
        );
        let sandbox = stored(&api, &created).await;
        assert_eq!(sandbox.spec.pause_time.is_some(), timer, "{body}");
        let kind = sandbox.spec.pause_strategy.as_ref().and_then(|s| s.type_.as_ref());
        assert_eq!(kind.map(|k| k.as_str()), strategy, "{body}");
        let notes = sandbox.metadata.annotations.unwrap();
        assert_eq!(notes[annotations::AUTO_RESUME], note, "{body}");
        if timer {
            assert_eq!(notes[annotations::RESERVE_PAUSED_SANDBOX_DURATION], "forever");
        }
        let files_only = notes.get(annotations::AUTO_PAUSE_MEMORY).map(String::as_str);
        assert_eq!(files_only, strategy.map(|_| "filesystem"), "{body}");
        // The annotations are internal: not in the user's metadata.
        assert!(created["metadata"].get(annotations::AUTO_RESUME).is_none());
    }
    // What the SDKs refuse, the API refuses too, and claims nothing.
    for (body, message) in [
        (
            json!({"templateID": "base", "autoPause": false, "autoPauseMemory": true}),
            "autoPauseMemory is only allowed when autoPause is true",
        ),
        (
            json!({"templateID": "base", "autoPause": true, "autoPauseMemory": false,
                   "autoResume": {"enabled": true}}),
            "autoResume cannot be enabled with autoPauseMemory false: a filesystem-only pause \
             must be resumed explicitly with connect",
        ),
    ] {
        let reply = call(&api.router, "POST", "/v2/sandboxes", Some(body.clone())).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(error_of(&reply)["message"], message, "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_keeps_what_it_asks_for_and_the_resume_restores_the_timeout_choice() {
    let api = common::api(1).await;
    let _controller = common::stand_in_controller(&api.store);
    let body = json!({"templateID": "base", "autoPause": true, "autoPauseMemory": false});
    let created = create(&api.router, body).await;
    let id = created["sandboxID"].as_str().unwrap();
    let strategy = |s: &Sandbox| {
        s.spec.pause_strategy.as_ref().and_then(|p| p.type_.as_ref()).map(|t| t.as_str().to_owned())
    };
    // An explicit pause that keeps the memory: a freeze (the pool names no strategy).
    let uri = format!("/sandboxes/{id}/pause");
    let reply = call(&api.router, "POST", &uri, Some(json!({"memory": true}))).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.json);
    assert_eq!(strategy(&stored(&api, &created).await), None);
    // The resume restores the timeout's filesystem-only pause.
    let uri = format!("/sandboxes/{id}/connect");
    let reply = call(&api.router, "POST", &uri, Some(json!({"timeout": 5}))).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    assert_eq!(strategy(&stored(&api, &created).await).as_deref(), Some("Stop"));
    // An explicit pause of the files only: `Stop`.
    let uri = format!("/sandboxes/{id}/pause");
    let reply = call(&api.router, "POST", &uri, Some(json!({"memory": false}))).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.json);
    assert_eq!(strategy(&stored(&api, &created).await).as_deref(), Some("Stop"));
}

#[tokio::test]
async fn no_public_traffic_issues_a_traffic_token_stored_hashed() {
    let api = common::api(2).await;
    let created = create(
        &api.router,
        json!({"templateID": "base", "network": {"allowPublicTraffic": false},
            "allow_internet_access": false}),
    )
    .await;
    let sandbox = stored(&api, &created).await;
    assert_eq!(sandbox.metadata.labels.unwrap()[oka_api::labels::ALLOW_INTERNET_ACCESS], "false");
    let token = created["trafficAccessToken"].as_str().unwrap().to_owned();
    let notes = stored(&api, &created).await.metadata.annotations.unwrap();
    assert_eq!(notes[annotations::ENABLE_JWT_AUTH], "true");
    assert_eq!(
        notes[annotations::TRAFFIC_ACCESS_TOKEN_SHA256],
        oka_manager::api::keys::key_hash(&token)
    );
    assert!(!serde_json::to_string(&notes).unwrap().contains(&token), "only the hash is kept");
    let id = created["sandboxID"].as_str().unwrap();
    let info = call(&api.router, "GET", &format!("/sandboxes/{id}"), None).await;
    assert!(info.json.get("trafficAccessToken").is_none(), "shown once, in the create answer");
    let public = create(&api.router, json!({"templateID": "base", "network": {}})).await;
    assert!(public.get("trafficAccessToken").is_none());
    let notes = stored(&api, &public).await.metadata.annotations.unwrap();
    assert!(!notes.contains_key(annotations::ENABLE_JWT_AUTH));
}

#[tokio::test]
async fn create_takes_the_paused_retention_extension() {
    let api = common::api(1).await;
    let created = create(
        &api.router,
        json!({"templateID": "base", "autoPause": true, "timeout": 60,
            "metadata": {"e2b.agents.kruise.io/reserve-paused-sandbox-duration": "1h"}}),
    )
    .await;
    let sandbox = stored(&api, &created).await;
    let pause = sandbox.spec.pause_time.unwrap().0;
    let shutdown = sandbox.spec.shutdown_time.unwrap().0;
    assert_eq!((shutdown - pause).get_seconds(), 3600);
    assert_eq!(
        sandbox.metadata.annotations.unwrap()[annotations::RESERVE_PAUSED_SANDBOX_DURATION],
        "1h"
    );
    let reply = call(
        &api.router,
        "POST",
        "/v2/sandboxes",
        Some(json!({"templateID": "base",
            "metadata": {"e2b.agents.kruise.io/reserve-paused-sandbox-duration": "0s"}})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(error_of(&reply)["message"].as_str().unwrap().starts_with("Bad extension param: "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_hibernation_is_reported_at_once_not_after_the_wait() {
    use futures::StreamExt;
    use oka_api::conditions::sandbox::{PAUSED, paused_reason};
    let api = common::api(1).await;
    let created = create(&api.router, json!({"templateID": "base"})).await;
    let id = created["sandboxID"].as_str().unwrap();
    // A controller whose hibernation fails: phase Paused, SandboxPaused=False/CheckpointFailed.
    let store = api.store.clone();
    // Watching before the pause request, so its write is seen.
    let everything = oka_store::Selector::everything();
    let mut events = store.watch::<Sandbox>(None, &everything, "").await.unwrap();
    let controller = tokio::spawn(async move {
        while let Some(Ok(oka_store::WatchEvent::Modified(s))) = events.next().await {
            if !s.is_paused() || s.phase() != Some(&SandboxPhase::Running) {
                continue;
            }
            let mut next = (*s).clone();
            let status = next.status.as_mut().unwrap();
            status.phase = Some(SandboxPhase::Paused);
            status.conditions.get_or_insert_default().push(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                    type_: PAUSED.into(),
                    status: "False".into(),
                    reason: paused_reason::CHECKPOINT_FAILED.into(),
                    message: "criu is missing".into(),
                    observed_generation: None,
                    last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        Timestamp::now(),
                    ),
                },
            );
            store.update_status("default", &next).await.unwrap();
        }
    });
    let started = std::time::Instant::now();
    let reply = call(&api.router, "POST", &format!("/sandboxes/{id}/pause"), None).await;
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    let message = error_of(&reply)["message"].as_str().unwrap().to_owned();
    assert!(
        message.starts_with("Failed to pause sandbox: CheckpointFailed: criu is missing"),
        "{message}"
    );
    controller.abort();
}

/// An agent runtime that takes `/init` but answers nothing else (hung).
struct Unresponsive;

impl oka_manager::SandboxInitializer for Unresponsive {
    fn init<'a>(
        &'a self,
        _sandbox: &'a Sandbox,
        _env_vars: &'a std::collections::BTreeMap<String, String>,
        _access_token: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(), oka_manager::init::InitError>> {
        Box::pin(async { Ok(()) })
    }

    fn metrics<'a>(
        &'a self,
        _sandbox: &'a Sandbox,
        _access_token: Option<&'a str>,
    ) -> futures::future::BoxFuture<
        'a,
        Result<Option<serde_json::Value>, oka_manager::init::InitError>,
    > {
        Box::pin(async { Err(oka_manager::init::InitError("no answer".into())) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_that_needs_a_healthy_guest_is_refused_when_it_does_not_answer() {
    let api = common::api_with_state(
        1,
        |_| {},
        |state| state.with_initializer(std::sync::Arc::new(Unresponsive)),
    )
    .await;
    let _controller = common::stand_in_controller(&api.store);
    let created = create(&api.router, json!({"templateID": "base"})).await;
    let id = created["sandboxID"].as_str().unwrap();
    let uri = format!("/sandboxes/{id}/pause");
    for body in [json!({"requireHealthyGuest": true}), json!({"memory": false})] {
        let reply = call(&api.router, "POST", &uri, Some(body.clone())).await;
        assert_eq!(
            error_of(&reply),
            json!({"code": 503, "message": format!("Sandbox '{id}' cannot be paused: its guest agent does not respond")}),
            "{body}"
        );
        assert!(!stored(&api, &created).await.is_paused(), "it runs on: {body}");
    }
    // A plain pause does not ask.
    let reply = call(&api.router, "POST", &uri, Some(json!({}))).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_pause_while_pausing_waits_for_the_same_pause() {
    let api = common::api(1).await;
    let created = create(&api.router, json!({"templateID": "base"})).await;
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    let mut sandbox = stored(&api, &created).await;
    sandbox.spec.paused = Some(true);
    api.store.update("default", &sandbox).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !api.index.by_id(&id).is_some_and(|s| s.is_paused()) {
        assert!(std::time::Instant::now() < deadline, "the index never saw the pause");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    // The controller (stand-in) finishes the pause a moment later: both answers are 204.
    let router = api.router.clone();
    let uri = format!("/sandboxes/{id}/pause");
    let second = tokio::spawn(async move { call(&router, "POST", &uri, None).await });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!second.is_finished(), "it waits for the pause in progress");
    let _controller = common::stand_in_controller(&api.store);
    assert_eq!(second.await.unwrap().status, StatusCode::NO_CONTENT);
    let reply = call(&api.router, "POST", &format!("/sandboxes/{id}/pause"), None).await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "paused now: 409");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_pause_is_marked_as_the_apis_and_a_resume_clears_any_marker() {
    let api = common::api(1).await;
    let _controller = common::stand_in_controller(&api.store);
    let created = create(&api.router, json!({"templateID": "base", "timeout": 60})).await;
    let id = created["sandboxID"].as_str().unwrap();
    let marker = |s: &Sandbox| {
        s.metadata.annotations.as_ref().and_then(|a| a.get(annotations::PAUSED_BY)).cloned()
    };
    let reply = call(&api.router, "POST", &format!("/sandboxes/{id}/pause"), None).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let paused = stored(&api, &created).await;
    assert_eq!(marker(&paused).as_deref(), Some(annotations::PAUSED_BY_API));
    let reply = call(&api.router, "POST", &format!("/sandboxes/{id}/resume"), None).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    assert_eq!(marker(&stored(&api, &created).await), None);

    // A sandbox the auto-pause policy paused (its marker): a user's connect resumes it and
    // takes it back from the policy.
    let mut policy_paused = stored(&api, &created).await;
    policy_paused.spec.paused = Some(true);
    policy_paused
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(annotations::PAUSED_BY.into(), annotations::PAUSED_BY_AUTO_PAUSE_POLICY.into());
    api.store.update("default", &policy_paused).await.unwrap();
    let wait = std::time::Instant::now();
    while stored(&api, &created).await.phase() != Some(&SandboxPhase::Paused) {
        assert!(wait.elapsed().as_secs() < 10, "the stand-in did not pause it");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let reply = call(
        &api.router,
        "POST",
        &format!("/sandboxes/{id}/connect"),
        Some(json!({"timeout": 60})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    let resumed = stored(&api, &created).await;
    assert!(!resumed.is_paused());
    assert_eq!(marker(&resumed), None);
}
