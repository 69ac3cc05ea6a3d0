//! API keys and teams: `/api-keys`, `/teams`, and team (namespace) scoping of sandboxes.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use http::StatusCode;
use k8s_openapi::api::core::v1::Secret;
use oka_store::Store;
use oka_store::embedded::EmbeddedStore;
use serde_json::{Value, json};

use common::{KEY, error_of, send};

fn router(store: &EmbeddedStore, index: &Arc<oka_manager::Index>) -> axum::Router {
    let config =
        oka_manager::api::ManagerConfig::new(oka_manager::api::ApiKey::parse(KEY).unwrap());
    oka_manager::api::app(oka_manager::api::AppState::new(store.clone(), Arc::clone(index), config))
}

async fn setup() -> (EmbeddedStore, tempfile::TempDir, Arc<oka_manager::Index>, axum::Router) {
    let (store, dir) = common::store();
    for namespace in ["team-a", "team-b"] {
        let set = common::create_pool(&store, namespace, "base").await;
        common::stock(&store, &set, 2).await;
    }
    let index = oka_manager::Index::spawn(store.clone());
    index.wait_ready().await;
    common::wait_members(&index, "team-a", "base", 2).await;
    common::wait_members(&index, "team-b", "base", 2).await;
    let router = router(&store, &index);
    (store, dir, index, router)
}

async fn new_key(router: &axum::Router, key: &str, body: Value) -> common::Reply {
    send(router, "POST", "/api-keys", Some(key), &[], Some(body)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_keys_are_e2b_keys_stored_hashed_and_scoped_to_their_team() {
    let (store, _dir, index, router) = setup().await;
    let reply = new_key(&router, KEY, json!({"name": "ci", "teamName": "team-a"})).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    let key_a = reply.json["key"].as_str().unwrap().to_owned();
    let hex = key_a.strip_prefix("e2b_").unwrap();
    assert!(
        hex.len() == 40 && hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );
    let id_a = reply.json["id"].as_str().unwrap().to_owned();
    assert_eq!(reply.json["name"], "ci");
    assert_eq!(reply.json["team"]["name"], "team-a");
    assert_eq!(reply.json["createdBy"]["id"], oka_manager::api::auth::ADMIN_KEY_ID);
    assert_eq!(reply.json["mask"]["prefix"], "e2b_");
    assert_eq!(reply.json["mask"]["valueLength"], 40);
    assert_eq!(reply.json["lastUsed"], Value::Null);

    // Stored hashed: the Secret holds the SHA-256, never the key.
    let secret = store.get::<Secret>("sandbox-system", "e2b-key-store").await.unwrap();
    let record: Value = serde_json::from_slice(&secret.data.as_ref().unwrap()[&id_a].0).unwrap();
    assert_eq!(record["keyHash"], oka_manager::api::keys::key_hash(&key_a));
    let raw = serde_json::to_string(&secret).unwrap();
    assert!(!raw.contains(hex), "the key itself is not stored");

    // A second key, for team-b, created by the admin.
    let key_b = new_key(&router, KEY, json!({"name": "b", "teamName": "team-b"})).await.json["key"]
        .as_str()
        .unwrap()
        .to_owned();

    // team-a's key creates from team-a's pool; team-b cannot see that sandbox.
    let created = send(
        &router,
        "POST",
        "/v2/sandboxes",
        Some(&key_a),
        &[],
        Some(json!({"templateID": "base"})),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.json);
    let id = created.json["sandboxID"].as_str().unwrap();
    assert!(
        created.json["metadata"]["e2b.agents.kruise.io/sandbox-resource"]
            .as_str()
            .unwrap()
            .starts_with("team-a/")
    );
    let path = format!("/sandboxes/{id}");
    assert_eq!(send(&router, "GET", &path, Some(&key_a), &[], None).await.status, StatusCode::OK);
    assert_eq!(
        send(&router, "GET", &path, Some(KEY), &[], None).await.status,
        StatusCode::OK,
        "admin sees all"
    );
    assert_eq!(
        send(&router, "GET", &path, Some(&key_b), &[], None).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        send(&router, "DELETE", &path, Some(&key_b), &[], None).await.status,
        StatusCode::NOT_FOUND
    );
    let listed = send(&router, "GET", "/v2/sandboxes", Some(&key_b), &[], None).await;
    assert_eq!(listed.json, json!([]));
    let listed = send(&router, "GET", "/v2/sandboxes", Some(&key_a), &[], None).await;
    assert_eq!(listed.json.as_array().unwrap().len(), 1);
    let listed = send(&router, "GET", "/v2/sandboxes", Some(KEY), &[], None).await;
    assert_eq!(listed.json.as_array().unwrap().len(), 1);

    // Lists: team-a sees its key only (without the key itself); admin sees all and itself.
    let listed = send(&router, "GET", "/api-keys", Some(&key_a), &[], None).await;
    let items = listed.json.as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["id"], id_a.as_str());
    assert!(items[0].get("key").is_none());
    let listed = send(&router, "GET", "/kruise/api/api-keys", Some(KEY), &[], None).await;
    assert_eq!(listed.json.as_array().unwrap().len(), 3);
    // Every key has a creation time, the admin key (from configuration) included.
    for key in listed.json.as_array().unwrap() {
        let created = key["createdAt"].as_str().unwrap();
        assert!(created.parse::<jiff::Timestamp>().is_ok(), "{key}");
    }
    let teams = send(&router, "GET", "/teams", Some(&key_a), &[], None).await;
    assert_eq!(
        teams.json,
        json!([{"teamID": record["team"]["id"].clone(), "name": "team-a", "apiKey": "", "isDefault": true}])
    );
    let teams = send(&router, "GET", "/teams", Some(KEY), &[], None).await;
    assert_eq!(teams.json.as_array().unwrap().len(), 3);
    let compatible = send(&router, "GET", "/api-keys/compatible", Some(&key_a), &[], None).await;
    assert_eq!(compatible.json, json!({"key": key_a}));

    // Another manager over the same store knows the keys.
    let other = router_over(&store, &index);
    assert_eq!(send(&other, "GET", &path, Some(&key_a), &[], None).await.status, StatusCode::OK);

    // Deleting: 204, then the key is refused everywhere.
    let reply = send(&router, "DELETE", &format!("/api-keys/{id_a}"), Some(KEY), &[], None).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let reply = send(&router, "GET", "/v2/sandboxes", Some(&key_a), &[], None).await;
    assert_eq!(
        (reply.status, error_of(&reply)),
        (StatusCode::UNAUTHORIZED, json!({"code": 401, "message": "Invalid API Key"}))
    );
    let reply = send(&router, "DELETE", &format!("/api-keys/{id_a}"), Some(KEY), &[], None).await;
    assert_eq!(
        (reply.status, error_of(&reply)),
        (StatusCode::NOT_FOUND, json!({"code": 404, "message": "API key not found"}))
    );
}

fn router_over(store: &EmbeddedStore, index: &Arc<oka_manager::Index>) -> axum::Router {
    router(store, index)
}

#[tokio::test]
async fn key_rules_answer_the_reference_statuses() {
    let (_store, _dir, _index, router) = setup().await;
    let key_a = new_key(&router, KEY, json!({"name": "a", "teamName": "team-a"})).await.json["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let id_b = new_key(&router, KEY, json!({"name": "b", "teamName": "team-b"})).await.json["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let cases = [
        (KEY, json!({"name": ""}), 400, "api-key name is required"),
        (KEY, json!({"name": "x", "teamName": "a--b"}), 400, ""),
        (KEY, json!({"name": "x", "teamName": "Bad_Team"}), 400, ""),
        (KEY, json!({"name": "x", "bogus": 1}), 400, ""),
        (
            &key_a,
            json!({"name": "x", "teamName": "team-b"}),
            403,
            "You are not allowed to create an API key for another team",
        ),
        (
            &key_a,
            json!({"name": "x", "quota": {"limits": []}}),
            403,
            "only admin can set api-key quota",
        ),
    ];
    for (key, body, code, message) in cases {
        let reply = new_key(&router, key, body.clone()).await;
        assert_eq!(reply.status.as_u16(), code, "{body}: {}", reply.json);
        if !message.is_empty() {
            assert_eq!(error_of(&reply)["message"], message, "{body}");
        }
    }
    // A team key creates keys for its own team; they are team-a's.
    let reply = new_key(&router, &key_a, json!({"name": "mine"})).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(reply.json["team"]["name"], "team-a");
    // Deleting the admin key or another team's key: 403.
    let admin = format!("/api-keys/{}", oka_manager::api::auth::ADMIN_KEY_ID);
    let reply = send(&router, "DELETE", &admin, Some(KEY), &[], None).await;
    assert_eq!(
        error_of(&reply),
        json!({"code": 403, "message": "the well-known admin api-key cannot be deleted"})
    );
    let reply =
        send(&router, "DELETE", &format!("/api-keys/{id_b}"), Some(&key_a), &[], None).await;
    assert_eq!(
        error_of(&reply),
        json!({"code": 403, "message": "You are not allowed to delete this API key"})
    );
    // A team key cannot claim from another team's pool: its namespace has none by that name.
    let reply = send(
        &router,
        "POST",
        "/sandboxes",
        Some(&key_a),
        &[],
        Some(json!({"templateID": "other"})),
    )
    .await;
    assert_eq!(
        error_of(&reply),
        json!({"code": 400, "message": "Template or Checkpoint not found"})
    );
}
