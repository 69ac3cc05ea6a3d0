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

/// The reference's records, as its Secret backend writes them (Go's `encoding/json` of
/// `CreatedTeamAPIKey`: field order, `createdBy: null`, no `team` on its admin entry).
const REFERENCE_ADMIN_KEY: &str = "some-api-key";
const REFERENCE_TEAM_KEY: &str = "5d0c8a1e-3f57-4b8e-9a51-2f6f0c7d9e14";
const REFERENCE_TEAM_KEY_ID: &str = "0b8e9d8c-7f1a-4c39-8d0e-51c2a3b4d5e6";
const REFERENCE_TEAM_ID: &str = "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";

fn reference_records() -> std::collections::BTreeMap<String, Vec<u8>> {
    let admin = format!(
        r#"{{"createdAt":"2026-05-01T10:00:00.123456789+08:00","id":"{admin_id}","key":"{REFERENCE_ADMIN_KEY}","mask":{{"maskedValuePrefix":"","maskedValueSuffix":"","prefix":"","valueLength":0}},"name":"admin","createdBy":null,"lastUsed":null}}"#,
        admin_id = oka_manager::api::auth::ADMIN_KEY_ID,
    );
    let team = format!(
        r#"{{"createdAt":"2026-05-02T08:30:00Z","id":"{REFERENCE_TEAM_KEY_ID}","key":"{REFERENCE_TEAM_KEY}","mask":{{"maskedValuePrefix":"","maskedValueSuffix":"","prefix":"","valueLength":0}},"name":"ci","createdBy":{{"email":"","id":"{admin_id}"}},"team":{{"id":"{REFERENCE_TEAM_ID}","name":"team-a"}},"lastUsed":null,"quota":{{"limits":[{{"dimension":"sandbox.count","scope":"all","limit":5}}]}}}}"#,
        admin_id = oka_manager::api::auth::ADMIN_KEY_ID,
    );
    // An entry with an empty key must never let an empty header in.
    let empty = r#"{"createdAt":"2026-05-02T08:30:00Z","id":"e0000000-0000-4000-8000-000000000000","key":"","mask":{},"name":"empty","createdBy":null,"lastUsed":null}"#;
    [
        (oka_manager::api::auth::ADMIN_KEY_ID.to_owned(), admin.into_bytes()),
        (REFERENCE_TEAM_KEY_ID.to_owned(), team.into_bytes()),
        ("e0000000-0000-4000-8000-000000000000".to_owned(), empty.as_bytes().to_vec()),
        ("not-a-key".to_owned(), b"left by someone else".to_vec()),
    ]
    .into_iter()
    .collect()
}

async fn put_reference_secret(store: &EmbeddedStore) {
    let mut secret = Secret::default();
    secret.metadata.name = Some("e2b-key-store".into());
    secret.metadata.namespace = Some("sandbox-system".into());
    secret.type_ = Some("Opaque".into());
    secret.data = Some(
        reference_records().into_iter().map(|(k, v)| (k, k8s_openapi::ByteString(v))).collect(),
    );
    store.create("sandbox-system", &secret).await.unwrap();
}

async fn stored_data(store: &EmbeddedStore) -> std::collections::BTreeMap<String, Vec<u8>> {
    let secret = store.get::<Secret>("sandbox-system", "e2b-key-store").await.unwrap();
    secret.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_secret_is_taken_over_raw_and_compat_encoded_and_kept_byte_for_byte() {
    use oka_manager::api::key_compat::encode;
    let (store, _dir, _index, router) = setup().await;
    put_reference_secret(&store).await;
    let encoded_team_key = encode(REFERENCE_TEAM_KEY);
    let encoded_admin_key = encode(REFERENCE_ADMIN_KEY);

    // The team key, raw and encoded, is team-a's: it claims from team-a's pool.
    for key in [REFERENCE_TEAM_KEY, encoded_team_key.as_str()] {
        let created = send(
            &router,
            "POST",
            "/kruise/api/sandboxes",
            Some(key),
            &[],
            Some(json!({"templateID": "base"})),
        )
        .await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.json);
        let id = created.json["sandboxID"].as_str().unwrap();
        let path = format!("/kruise/api/sandboxes/{id}");
        for key in [REFERENCE_TEAM_KEY, encoded_team_key.as_str()] {
            let got = send(&router, "GET", &path, Some(key), &[], None).await;
            assert_eq!(got.status, StatusCode::OK, "{}", got.json);
        }
        assert!(
            created.json["metadata"]["e2b.agents.kruise.io/sandbox-resource"]
                .as_str()
                .unwrap()
                .starts_with("team-a/")
        );
    }
    let teams = send(&router, "GET", "/teams", Some(REFERENCE_TEAM_KEY), &[], None).await;
    assert_eq!(
        teams.json,
        json!([{"teamID": REFERENCE_TEAM_ID, "name": "team-a", "apiKey": "", "isDefault": true}])
    );
    // Its stored quota is its quota.
    let listed = send(&router, "GET", "/api-keys", Some(REFERENCE_TEAM_KEY), &[], None).await;
    assert_eq!(listed.json.as_array().unwrap().len(), 1, "{}", listed.json);
    assert_eq!(listed.json[0]["quota"]["limits"][0]["limit"], 5);

    // The reference's admin key, raw and encoded, is the admin; listed once, beside oka's key.
    for key in [REFERENCE_ADMIN_KEY, encoded_admin_key.as_str(), KEY] {
        let listed = send(&router, "GET", "/kruise/api/api-keys", Some(key), &[], None).await;
        assert_eq!(listed.status, StatusCode::OK, "{}", listed.json);
        let ids: Vec<&str> =
            listed.json.as_array().unwrap().iter().map(|k| k["id"].as_str().unwrap()).collect();
        let admins = ids.iter().filter(|id| **id == oka_manager::api::auth::ADMIN_KEY_ID).count();
        assert_eq!(admins, 1, "{ids:?}");
        assert!(ids.contains(&REFERENCE_TEAM_KEY_ID));
    }

    // `/api-keys/compatible`: the encoding of a raw reference key, however it was sent; oka's
    // keys as they are.
    for (key, answer) in [
        (REFERENCE_TEAM_KEY, encoded_team_key.as_str()),
        (encoded_team_key.as_str(), encoded_team_key.as_str()),
        (REFERENCE_ADMIN_KEY, encoded_admin_key.as_str()),
        (KEY, KEY),
    ] {
        let reply =
            send(&router, "GET", "/kruise/api/api-keys/compatible", Some(key), &[], None).await;
        assert_eq!(reply.json, json!({"key": answer}));
    }

    // Not keys: a broken encoding, the empty value, an inert value.
    let mut broken = encoded_team_key.clone();
    let last = if broken.ends_with('0') { '1' } else { '0' };
    broken.pop();
    broken.push(last);
    for key in [broken.as_str(), "", "e2b_abc123"] {
        let reply = send(&router, "GET", "/v2/sandboxes", Some(key), &[], None).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{key:?}");
    }

    // A write (a key created) leaves every other entry byte for byte, and stores no plain text.
    let before = reference_records();
    let created =
        new_key(&router, REFERENCE_ADMIN_KEY, json!({"name": "new", "teamName": "team-a"})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.json);
    let new_id = created.json["id"].as_str().unwrap().to_owned();
    let new_key_text = created.json["key"].as_str().unwrap().to_owned();
    assert_eq!(created.json["team"]["id"], REFERENCE_TEAM_ID, "the team keeps its ID");
    let data = stored_data(&store).await;
    for (id, bytes) in &before {
        assert_eq!(data.get(id), Some(bytes), "{id} rewritten");
    }
    let record: Value = serde_json::from_slice(&data[&new_id]).unwrap();
    assert_eq!(record["keyHash"], oka_manager::api::keys::key_hash(&new_key_text));
    let inert = record["key"].as_str().unwrap();
    assert!(inert.starts_with(oka_manager::api::keys::INERT_KEY_PREFIX), "{inert:?}");
    assert!(!String::from_utf8_lossy(&data[&new_id]).contains(&new_key_text[4..]));
    assert_eq!(record["lastUsed"], Value::Null);
    // The new key is a key.
    let reply = send(&router, "GET", "/v2/sandboxes", Some(&new_key_text), &[], None).await;
    assert_eq!(reply.status, StatusCode::OK);

    // Deleting the reference's team key removes its entry alone; its admin entry stays.
    let reply = send(
        &router,
        "DELETE",
        &format!("/api-keys/{REFERENCE_TEAM_KEY_ID}"),
        Some(KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let admin = format!("/api-keys/{}", oka_manager::api::auth::ADMIN_KEY_ID);
    let reply = send(&router, "DELETE", &admin, Some(REFERENCE_ADMIN_KEY), &[], None).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    let data = stored_data(&store).await;
    assert!(!data.contains_key(REFERENCE_TEAM_KEY_ID));
    for (id, bytes) in before.iter().filter(|(id, _)| id.as_str() != REFERENCE_TEAM_KEY_ID) {
        assert_eq!(data.get(id), Some(bytes), "{id} rewritten");
    }
    let reply = send(&router, "GET", "/v2/sandboxes", Some(REFERENCE_TEAM_KEY), &[], None).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
}
