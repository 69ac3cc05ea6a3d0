//! Templates (SandboxSets) and snapshots (Checkpoints) through the API.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use futures::StreamExt;
use http::StatusCode;
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use oka_api::{
    Checkpoint, CheckpointPhase, CheckpointStatus, SandboxSet, SandboxSetSpec, SandboxTemplate,
    annotations, labels,
};
use oka_store::embedded::EmbeddedStore;
use oka_store::{Selector, Store, WatchEvent};
use serde_json::json;

use common::{call, create, error_of, send};

#[tokio::test]
async fn templates_are_the_sandbox_sets() {
    let api = common::api(1).await;
    let limits = BTreeMap::from([
        ("cpu".to_owned(), Quantity("2".into())),
        ("memory".to_owned(), Quantity("1Gi".into())),
    ]);
    let template = PodTemplateSpec {
        metadata: None,
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    limits: Some(limits),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
    };
    let mut set =
        SandboxSet::new("big", SandboxSetSpec { template: Some(template), ..Default::default() });
    set.metadata.namespace = Some("default".into());
    api.store.create("default", &set).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while api.index.sandbox_set(Some("default"), "big").is_none() {
        assert!(std::time::Instant::now() < deadline);
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let reply = call(&api.router, "GET", "/templates", None).await;
    assert_eq!(reply.status, StatusCode::OK);
    let items = reply.json.as_array().unwrap();
    let names: Vec<_> = items.iter().map(|t| t["templateID"].as_str().unwrap()).collect();
    assert_eq!(names, ["base", "big"]);
    let big = &items[1];
    assert_eq!((big["cpuCount"].as_i64(), big["memoryMB"].as_i64()), (Some(2), Some(1024)));
    assert_eq!(big["buildStatus"], "ready");
    assert_eq!(big["aliases"], json!(["big"]));
    assert!(big.get("builds").is_none());
    let reply = call(&api.router, "GET", "/kruise/api/templates/big", None).await;
    assert_eq!(reply.status, StatusCode::OK);
    // Build IDs are UUIDs, as E2B's: the pool's uid, the same in the template and its build.
    let build = reply.json["builds"][0]["buildID"].as_str().unwrap();
    assert!(uuid::Uuid::parse_str(build).is_ok(), "{build}");
    assert_eq!(reply.json["builds"][0]["buildID"], big["buildID"]);
    assert_eq!(reply.json["builds"][0]["status"], "ready");
    let reply = call(&api.router, "GET", "/templates/nope", None).await;
    assert_eq!(error_of(&reply), json!({"code": 404, "message": "Template not found: nope"}));
    let reply = call(&api.router, "DELETE", "/templates/base", None).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn without_a_checkpoint_controller_snapshots_answer_501_and_write_nothing() {
    let api = common::api(1).await;
    let created = create(&api.router, json!({"templateID": "base"})).await;
    let id = created["sandboxID"].as_str().unwrap();
    let reply =
        call(&api.router, "POST", &format!("/sandboxes/{id}/snapshots"), Some(json!({}))).await;
    assert_eq!(reply.status, StatusCode::NOT_IMPLEMENTED, "{}", reply.json);
    let checkpoints = api.store.list::<Checkpoint>(None, &Selector::everything()).await.unwrap();
    assert!(checkpoints.items.is_empty());
    let reply = call(&api.router, "GET", "/snapshots", None).await;
    assert_eq!((reply.status, reply.json), (StatusCode::OK, json!([])));
    let reply = call(&api.router, "POST", "/sandboxes/nope/snapshots", None).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    // Without an agent runtime to ask (the no-op initializer), metrics are an empty list.
    let reply = call(&api.router, "GET", &format!("/sandboxes/{id}/metrics"), None).await;
    assert_eq!((reply.status, reply.json), (StatusCode::OK, json!([])));
    let reply = call(&api.router, "GET", "/sandboxes/nope/metrics", None).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
}

/// A stand-in checkpoint controller: Checkpoints succeed with ID `snap-<name>` (or fail).
async fn checkpoint_controller(store: &EmbeddedStore, fail: bool) -> tokio::task::JoinHandle<()> {
    let store = store.clone();
    // Watching before returning: a Checkpoint created right after is seen.
    let mut events = store.watch::<Checkpoint>(None, &Selector::everything(), "").await.unwrap();
    tokio::spawn(async move {
        while let Some(Ok(event)) = events.next().await {
            let (WatchEvent::Added(c) | WatchEvent::Modified(c)) = event else { continue };
            if c.status.is_some() {
                continue;
            }
            let mut next = (*c).clone();
            let name = next.metadata.name.clone().unwrap();
            next.status = Some(if fail {
                CheckpointStatus {
                    phase: Some(CheckpointPhase::Failed),
                    message: Some("no".into()),
                    ..Default::default()
                }
            } else {
                CheckpointStatus {
                    phase: Some(CheckpointPhase::Succeeded),
                    checkpoint_id: Some(format!("snap-{name}")),
                    ..Default::default()
                }
            });
            let _ = store.update_status("default", &next).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_create_list_paginate_and_delete() {
    let api = common::api_with(2, |c| c.snapshots.enabled = true).await;
    let controller = checkpoint_controller(&api.store, false).await;
    let created = create(&api.router, json!({"templateID": "base", "envVars": {"A": "1"}})).await;
    let id = created["sandboxID"].as_str().unwrap();
    let other = create(&api.router, json!({"templateID": "base"})).await;
    let other_id = other["sandboxID"].as_str().unwrap();
    let reply = send(
        &api.router,
        "POST",
        &format!("/sandboxes/{id}/snapshots"),
        Some(common::KEY),
        &[("x-e2b-kruise-snapshot-keep-running", "true"), ("x-e2b-kruise-snapshot-ttl", "1h")],
        Some(json!({"name": "mine"})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    let snapshot = reply.json["snapshotID"].as_str().unwrap().to_owned();
    assert_eq!(reply.json["names"], json!(["mine"]));
    let name = snapshot.trim_start_matches("snap-").to_owned();
    let checkpoint = api.store.get::<Checkpoint>("default", &name).await.unwrap();
    let notes = checkpoint.metadata.annotations.clone().unwrap();
    assert_eq!(notes[annotations::SANDBOX_ID], id);
    assert_eq!(notes[annotations::OWNER], oka_manager::api::auth::ADMIN_KEY_ID);
    assert!(notes[annotations::INIT_RUNTIME_REQUEST].contains("\"A\":\"1\""));
    assert_eq!(checkpoint.spec.keep_running, Some(true));
    assert_eq!(checkpoint.spec.ttl_after_finished.as_deref(), Some("1h"));
    let template = api.store.get::<SandboxTemplate>("default", &name).await.unwrap();
    assert_eq!(template.metadata.owner_references.unwrap()[0].kind, "Checkpoint");

    let second = call(&api.router, "POST", &format!("/sandboxes/{other_id}/snapshots"), None).await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert_eq!(second.json["names"], json!([]), "no name: an empty list, never null");
    let named = call(&api.router, "GET", "/snapshots?name=mine", None).await;
    assert_eq!(named.json, json!([{"snapshotID": snapshot, "names": ["mine"]}]));
    // Pages of one, and the sandboxID filter.
    let first_page = call(&api.router, "GET", "/snapshots?limit=1", None).await;
    assert_eq!(first_page.json.as_array().unwrap().len(), 1);
    let token = first_page.headers["x-next-token"].to_str().unwrap().to_owned();
    let second_page =
        call(&api.router, "GET", &format!("/snapshots?limit=1&nextToken={token}"), None).await;
    assert_eq!(second_page.json.as_array().unwrap().len(), 1);
    assert!(second_page.headers.get("x-next-token").is_none());
    assert_ne!(first_page.json, second_page.json);
    let filtered = call(&api.router, "GET", &format!("/snapshots?sandboxID={id}"), None).await;
    assert_eq!(filtered.json, json!([{"snapshotID": snapshot, "names": ["mine"]}]));

    // Creating from the snapshot: a claimed Sandbox from the snapshot's template, restored
    // from it, with the snapshot's envd access token (the restored envd keeps it).
    let runner = common::stand_in_controller(&api.store);
    let reply =
        call(&api.router, "POST", "/v2/sandboxes", Some(json!({"templateID": snapshot}))).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    let clone_id = reply.json["sandboxID"].as_str().unwrap();
    // ... and by its name.
    let by_name =
        call(&api.router, "POST", "/v2/sandboxes", Some(json!({"templateID": "mine"}))).await;
    assert_eq!(by_name.status, StatusCode::CREATED, "{}", by_name.json);
    assert_ne!(clone_id, id);
    assert_eq!(reply.json["envdAccessToken"], created["envdAccessToken"]);
    let clones =
        api.store.list::<oka_api::Sandbox>(Some("default"), &Selector::everything()).await.unwrap();
    let clone = clones
        .items
        .iter()
        .find(|s| {
            s.metadata.labels.as_ref().unwrap().get(labels::SANDBOX_ID).map(String::as_str)
                == Some(clone_id)
        })
        .unwrap();
    let notes = clone.metadata.annotations.as_ref().unwrap();
    assert_eq!(notes[annotations::RESTORE_FROM], snapshot);
    assert_eq!(clone.metadata.labels.as_ref().unwrap()[labels::SANDBOX_TEMPLATE], name);
    drop(runner);

    // Delete through /templates/{id}: 204, both objects gone; again: 404.
    let reply = call(&api.router, "DELETE", &format!("/templates/{snapshot}"), None).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    assert!(api.store.get::<Checkpoint>("default", &name).await.unwrap_err().is_not_found());
    assert!(api.store.get::<SandboxTemplate>("default", &name).await.unwrap_err().is_not_found());
    let reply = call(&api.router, "DELETE", &format!("/templates/{snapshot}"), None).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    controller.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_or_late_snapshot_leaves_nothing_behind() {
    let api = common::api_with(1, |c| c.snapshots.enabled = true).await;
    let created = create(&api.router, json!({"templateID": "base"})).await;
    let id = created["sandboxID"].as_str().unwrap();
    // Nobody processes it, and the caller waits 0 s.
    let reply = send(
        &api.router,
        "POST",
        &format!("/sandboxes/{id}/snapshots"),
        Some(common::KEY),
        &[("x-e2b-kruise-snapshot-wait-success-seconds", "0")],
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(error_of(&reply)["message"].as_str().unwrap().contains("did not succeed within 0s"));
    // The controller fails it.
    let controller = checkpoint_controller(&api.store, true).await;
    let reply = call(&api.router, "POST", &format!("/sandboxes/{id}/snapshots"), None).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(error_of(&reply)["message"].as_str().unwrap().contains("failed: no"), "{}", reply.json);
    let everything = Selector::everything();
    assert!(api.store.list::<Checkpoint>(None, &everything).await.unwrap().items.is_empty());
    assert!(api.store.list::<SandboxTemplate>(None, &everything).await.unwrap().items.is_empty());
    // Bad headers: 400.
    let reply = send(
        &api.router,
        "POST",
        &format!("/sandboxes/{id}/snapshots"),
        Some(common::KEY),
        &[("x-e2b-kruise-snapshot-persistent-contents", "disk")],
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    controller.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_makes_new_sandboxes_from_a_snapshot_of_the_running_one() {
    let api = common::api_with(1, |c| c.snapshots.enabled = true).await;
    let controller = checkpoint_controller(&api.store, false).await;
    let runner = common::stand_in_controller(&api.store);
    let body = json!({"templateID": "base", "envVars": {"A": "1"}, "metadata": {"userId": "7"},
        "autoPause": true});
    let source = create(&api.router, body).await;
    let id = source["sandboxID"].as_str().unwrap();
    let uri = format!("/sandboxes/{id}/fork");
    let reply = call(&api.router, "POST", &uri, Some(json!({"count": 2, "timeout": 60}))).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    let forks = reply.json.as_array().unwrap();
    assert_eq!(forks.len(), 2);
    let mut ids = std::collections::BTreeSet::from([id.to_owned()]);
    for fork in forks {
        let sandbox = &fork["sandbox"];
        assert!(fork.get("error").is_none(), "{fork}");
        assert!(ids.insert(sandbox["sandboxID"].as_str().unwrap().to_owned()), "a fresh ID");
        assert_ne!(sandbox["envdAccessToken"], source["envdAccessToken"], "a fresh token");
        assert_eq!(sandbox["templateID"], "base");
        assert_eq!(sandbox["metadata"]["userId"], "7");
        assert_eq!(sandbox["lifecycle"], json!({"autoResume": false, "onTimeout": "pause"}));
        let end: jiff::Timestamp = sandbox["endAt"].as_str().unwrap().parse().unwrap();
        let lasts = (end - jiff::Timestamp::now()).get_seconds();
        assert!((58..=60).contains(&lasts), "its own timeout: {lasts}");
    }
    // The snapshot is gone; the source still runs, its end untouched.
    let checkpoints = api.store.list::<Checkpoint>(None, &Selector::everything()).await.unwrap();
    assert!(checkpoints.items.iter().all(|c| c.metadata.deletion_timestamp.is_some()));
    let info = call(&api.router, "GET", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(
        (info.json["state"].clone(), info.json["endAt"].clone()),
        (json!("running"), source["endAt"].clone())
    );
    // The rules: count 1..=100; unknown 404; paused 409.
    let reply = call(&api.router, "POST", &uri, Some(json!({"count": 0}))).await;
    assert_eq!(error_of(&reply), json!({"code": 400, "message": "Count must be at least 1"}));
    let reply = call(&api.router, "POST", &uri, Some(json!({"count": 101}))).await;
    assert_eq!(
        error_of(&reply),
        json!({"code": 400, "message": "Count cannot be greater than 100"})
    );
    let reply = call(&api.router, "POST", "/sandboxes/nope/fork", None).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    let reply = call(&api.router, "POST", &format!("/sandboxes/{id}/pause"), None).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let reply = call(&api.router, "POST", &uri, None).await;
    assert_eq!(
        error_of(&reply),
        json!({"code": 409, "message": format!("Sandbox '{id}' is paused and cannot be forked; resume it first")})
    );
    drop(runner);
    controller.abort();
}

#[tokio::test]
async fn resources_come_from_a_referenced_sandbox_template() {
    let api = common::api(1).await;
    let limits = BTreeMap::from([
        ("cpu".to_owned(), Quantity("3".into())),
        ("memory".to_owned(), Quantity("3Gi".into())),
    ]);
    let pod = PodTemplateSpec {
        metadata: None,
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    limits: Some(limits),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
    };
    let mut template = SandboxTemplate::new(
        "tpl",
        oka_api::SandboxTemplateSpec { template: Some(pod), ..Default::default() },
    );
    template.metadata.namespace = Some("default".into());
    api.store.create("default", &template).await.unwrap();
    let reference =
        Some(oka_api::common::SandboxTemplateRef { name: "tpl".into(), ..Default::default() });
    let mut set = SandboxSet::new(
        "reffed",
        SandboxSetSpec { template_ref: reference.clone(), ..Default::default() },
    );
    set.metadata.namespace = Some("default".into());
    let mut set = api.store.create("default", &set).await.unwrap();
    set.status = Some(oka_api::SandboxSetStatus {
        update_revision: Some("rev-1".into()),
        ..Default::default()
    });
    let set = api.store.update_status("default", &set).await.unwrap();
    // A member as the pool controller makes them: referencing the template.
    let mut member = oka_api::Sandbox::test()
        .name("reffed-0")
        .namespace("default")
        .pooled("reffed")
        .label(labels::TEMPLATE_HASH, "rev-1")
        .phase(oka_api::SandboxPhase::Running)
        .ready()
        .build();
    member.metadata.uid = None;
    member.spec.template_ref = reference;
    if let Some(owner) = member.metadata.owner_references.as_mut().and_then(|o| o.first_mut()) {
        owner.uid = set.metadata.uid.clone().unwrap();
    }
    let status = member.status.clone();
    let mut member = api.store.create("default", &member).await.unwrap();
    member.status = status;
    api.store.update_status("default", &member).await.unwrap();
    common::wait_members(&api.index, "default", "reffed", 1).await;
    // The index follows the template's watch a moment behind.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let info = loop {
        let reply = call(&api.router, "GET", "/templates/reffed", None).await;
        if reply.json["cpuCount"] == 3 || std::time::Instant::now() > deadline {
            break reply.json;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    assert_eq!((info["cpuCount"].as_i64(), info["memoryMB"].as_i64()), (Some(3), Some(3072)));
    let created = create(&api.router, json!({"templateID": "reffed"})).await;
    assert_eq!((created["cpuCount"].as_i64(), created["memoryMB"].as_i64()), (Some(3), Some(3072)));
}

#[tokio::test]
async fn a_pod_sandbox_refuses_snapshots_and_forks_at_once_and_a_node_one_takes_them() {
    use oka_api::runtime_choice::SandboxRuntime;
    let api = common::api_with(1, |c| {
        c.snapshots.enabled = true;
        c.cluster_default_runtime = Some(SandboxRuntime::Pod);
    })
    .await;
    let created = create(&api.router, json!({"templateID": "base"})).await;
    let id = created["sandboxID"].as_str().unwrap();
    let refusal = |what: &str| {
        json!({"code": 400, "message": format!(
            "sandbox {id} runs as a Pod: {what} need the node runtime (annotation agents.kruise.io/runtime: node)"
        )})
    };
    let started = std::time::Instant::now();
    let reply =
        call(&api.router, "POST", &format!("/sandboxes/{id}/snapshots"), Some(json!({}))).await;
    assert_eq!(error_of(&reply), refusal("snapshots"));
    let reply = call(&api.router, "POST", &format!("/sandboxes/{id}/fork"), None).await;
    assert_eq!(error_of(&reply), refusal("forks"));
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "answered at once");
    let checkpoints = api.store.list::<Checkpoint>(None, &Selector::everything()).await.unwrap();
    assert!(checkpoints.items.is_empty(), "nothing written");

    // The same sandbox annotated for the node runtime is snapshotted.
    let controller = checkpoint_controller(&api.store, false).await;
    let sandbox = api.index.by_id(id).unwrap();
    let namespace = sandbox.metadata.namespace.clone().unwrap();
    let mut annotated = api
        .store
        .get::<oka_api::Sandbox>(&namespace, sandbox.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    annotated
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(annotations::RUNTIME.into(), annotations::RUNTIME_NODE.into());
    api.store.update(&namespace, &annotated).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let seen = api.index.by_id(id).unwrap();
        let notes = seen.metadata.annotations.clone().unwrap_or_default();
        if notes.get(annotations::RUNTIME).map(String::as_str) == Some(annotations::RUNTIME_NODE) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the index never saw the annotation");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let reply =
        call(&api.router, "POST", &format!("/sandboxes/{id}/snapshots"), Some(json!({}))).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    controller.abort();
}
