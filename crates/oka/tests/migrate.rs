//! Taking over a cluster that ran OpenKruise Agents: a store state written exactly as the
//! reference's controllers and manager write it is adopted by oka's controllers and E2B API
//! without rolling a pool or disturbing a claim.
//!
//! The state (namespace `default`), from the reference's documented formats and samples
//! (`upstream-api-controllers.md` §1–§3, the `code-interpreter` sample pool, whose revision
//! `f97c77999` is the reference's own): the SandboxSet with the status the reference writes,
//! its materialised SandboxTemplate `code-interpreter-f97c77999`, two available members
//! (controller ownerReference, `template-hash`, `sandbox-claimed: "false"`; one labelled with
//! the reference's legacy v0.3 revision, which it counts as up to date), a SandboxClaim
//! Completed with its one sandbox (claimed: ownerReferences cleared, lock, owner = the claim's
//! uid, claim timestamp, `claim-name`), a sandbox claimed through the E2B API by a key of the
//! reference's key Secret, and that Secret.
//!
//! The Sandboxes are Pod-backed in the reference; which runtime adopts them is not this test's
//! subject (no sandbox controller runs here): it checks the controllers' writes (pools,
//! revisions, claims) and the E2B API (keys, claimed sandboxes, claims from the pool).
//!
//! Where it runs: the SandboxSet and SandboxClaim controllers and the manager's E2B API, in
//! this process, on the store tests' real API server (`crates/store/tests/support/apiserver.rs`).
//! That server has no core API, so the key Secret alone lives on an embedded store beside it
//! ([`SplitStore`]). Skipped, with a reason, when the API server binaries are missing.

// Test helpers panic on failure: in a test, a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../store/tests/support/apiserver.rs"]
mod apiserver;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::Either;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use oka_api::{Sandbox, SandboxClaim, SandboxSet, SandboxTemplate};
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::kubernetes::KubeStore;
use oka_store::{Object, Preconditions, Selector, Store};
use serde_json::{Value, json};

const NS: &str = "default";
const SYSTEM_NS: &str = "sandbox-system";
const POOL: &str = "code-interpreter";
/// The reference's revision of the sample pool.
const REVISION: &str = "f97c77999";
/// oka's configured admin key (the reference's admin key is another, in its Secret).
const OKA_ADMIN_KEY: &str = "e2b_0123456789abcdef0123456789abcdef01234567";
const REFERENCE_ADMIN_KEY: &str = "some-api-key";
const TEAM_KEY: &str = "5d0c8a1e-3f57-4b8e-9a51-2f6f0c7d9e14";
const TEAM_KEY_ID: &str = "0b8e9d8c-7f1a-4c39-8d0e-51c2a3b4d5e6";
const TEAM_ID: &str = "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";

/// Secrets on an embedded store, every other kind on the API server.
#[derive(Clone)]
struct SplitStore {
    server: KubeStore,
    secrets: EmbeddedStore,
}

fn is_secret<K: Object>() -> bool {
    K::kind(&()) == "Secret"
}

macro_rules! split {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        if is_secret::<K>() {
            Either::Left($self.secrets.$method::<K>($($arg),*))
        } else {
            Either::Right($self.server.$method::<K>($($arg),*))
        }
    };
}

impl Store for SplitStore {
    fn create<K: Object>(
        &self,
        namespace: &str,
        obj: &K,
    ) -> impl Future<Output = oka_store::Result<K>> + Send {
        split!(self.create(namespace, obj))
    }

    fn get<K: Object>(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = oka_store::Result<K>> + Send {
        split!(self.get(namespace, name))
    }

    fn list<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
    ) -> impl Future<Output = oka_store::Result<oka_store::ObjectList<K>>> + Send {
        split!(self.list(namespace, selector))
    }

    fn update<K: Object>(
        &self,
        namespace: &str,
        obj: &K,
    ) -> impl Future<Output = oka_store::Result<K>> + Send {
        split!(self.update(namespace, obj))
    }

    fn update_status<K: Object>(
        &self,
        namespace: &str,
        obj: &K,
    ) -> impl Future<Output = oka_store::Result<K>> + Send {
        split!(self.update_status(namespace, obj))
    }

    fn delete<K: Object>(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> impl Future<Output = oka_store::Result<oka_store::Deleted<K>>> + Send {
        split!(self.delete(namespace, name, preconditions))
    }

    fn watch<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
        resource_version: &str,
    ) -> impl Future<Output = oka_store::Result<oka_store::WatchStream<K>>> + Send {
        split!(self.watch(namespace, selector, resource_version))
    }
}

/// The `spec` of the reference's sample SandboxSet `file`.
fn sample(file: &str) -> Value {
    let path = format!("{}/../api/tests/reference/samples/{file}", env!("CARGO_MANIFEST_DIR"));
    let set: Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    set["spec"].clone()
}

/// Creates `value` (a JSON object of kind `K`), then writes `status` through the status
/// subresource, as the reference's controllers do.
async fn put<K: Object>(store: &KubeStore, mut value: Value) -> K {
    let status = value.as_object_mut().unwrap().remove("status");
    let created: K = store.create(NS, &serde_json::from_value::<K>(value).unwrap()).await.unwrap();
    let Some(status) = status else { return created };
    let mut with_status = serde_json::to_value(&created).unwrap();
    with_status["status"] = status;
    store.update_status(NS, &serde_json::from_value::<K>(with_status).unwrap()).await.unwrap()
}

fn rfc3339(ago: Duration) -> String {
    let at = jiff::Timestamp::now() - jiff::SignedDuration::try_from(ago).unwrap();
    at.round(jiff::Unit::Second).unwrap().to_string()
}

fn pool_owner(set: &SandboxSet) -> Value {
    json!([{
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "SandboxSet",
        "name": set.metadata.name.clone().unwrap(),
        "uid": set.metadata.uid.clone().unwrap(),
        "controller": true,
        "blockOwnerDeletion": true,
    }])
}

/// A Sandbox as the reference's pool creates it and its sandbox controller runs it.
fn reference_sandbox(name: &str, template: &Value, volume_claims: &Value, ip: &str) -> Value {
    reference_member(
        name,
        POOL,
        POOL,
        REVISION,
        json!({"template": template, "volumeClaimTemplates": volume_claims}),
        ip,
    )
}

/// A Sandbox of pool `pool` (label `sandbox-template: template_label`, `template-hash:
/// revision`) with `spec`, running at `ip`.
fn reference_member(
    name: &str,
    pool: &str,
    template_label: &str,
    revision: &str,
    spec: Value,
    ip: &str,
) -> Value {
    let typed: oka_api::SandboxSpec = serde_json::from_value(spec.clone()).unwrap();
    let sandbox_revision = oka_controller::revision::sandbox_revision(&typed);
    json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {
                "agents.kruise.io/sandbox-pool": pool,
                "agents.kruise.io/sandbox-template": template_label,
                "agents.kruise.io/sandbox-claimed": "false",
                "agents.kruise.io/template-hash": revision,
            },
        },
        "spec": spec,
        "status": {
            "observedGeneration": 1,
            "phase": "Running",
            "conditions": [{
                "type": "Ready",
                "status": "True",
                "reason": "PodReady",
                "message": "",
                "lastTransitionTime": rfc3339(Duration::from_secs(3600)),
            }],
            "podInfo": {"nodeName": "worker-1", "podIP": ip, "podUID": uuid::Uuid::new_v4().to_string()},
            "nodeName": "worker-1",
            "sandboxIp": ip,
            "updateRevision": sandbox_revision,
        },
    })
}

/// Turns a member into a claimed sandbox, as the reference's claim writes it.
fn claimed(mut sandbox: Value, owner: &str, claim: Option<&str>) -> Value {
    let metadata = &mut sandbox["metadata"];
    metadata["labels"]["agents.kruise.io/sandbox-claimed"] = json!("true");
    if let Some(claim) = claim {
        metadata["labels"]["agents.kruise.io/claim-name"] = json!(claim);
    }
    metadata["annotations"] = json!({
        "agents.kruise.io/lock": uuid::Uuid::new_v4().to_string(),
        "agents.kruise.io/owner": owner,
        "agents.kruise.io/claim-timestamp": rfc3339(Duration::from_secs(600)),
    });
    metadata["ownerReferences"] = json!([]);
    metadata["finalizers"] = json!(["agents.kruise.io/sandbox"]);
    let labels = &mut sandbox["spec"]["template"]["metadata"]["labels"];
    *labels = json!({"agents.kruise.io/owner": owner});
    let spec: oka_api::SandboxSpec =
        serde_json::from_value(json!({"template": sandbox["spec"]["template"]})).unwrap();
    sandbox["status"]["updateRevision"] = json!(oka_controller::revision::sandbox_revision(&spec));
    sandbox
}

fn reference_secret() -> Secret {
    let admin_id = oka_manager::api::auth::ADMIN_KEY_ID;
    let admin = format!(
        r#"{{"createdAt":"2026-05-01T10:00:00.123456789+08:00","id":"{admin_id}","key":"{REFERENCE_ADMIN_KEY}","mask":{{"maskedValuePrefix":"","maskedValueSuffix":"","prefix":"","valueLength":0}},"name":"admin","createdBy":null,"lastUsed":null}}"#
    );
    let team = format!(
        r#"{{"createdAt":"2026-05-02T08:30:00Z","id":"{TEAM_KEY_ID}","key":"{TEAM_KEY}","mask":{{"maskedValuePrefix":"","maskedValueSuffix":"","prefix":"","valueLength":0}},"name":"ci","createdBy":{{"email":"","id":"{admin_id}"}},"team":{{"id":"{TEAM_ID}","name":"{NS}"}},"lastUsed":null}}"#
    );
    let mut secret = Secret::default();
    secret.metadata.name = Some("e2b-key-store".into());
    secret.metadata.namespace = Some(SYSTEM_NS.into());
    secret.type_ = Some("Opaque".into());
    secret.data = Some(BTreeMap::from([
        (admin_id.to_owned(), ByteString(admin.into_bytes())),
        (TEAM_KEY_ID.to_owned(), ByteString(team.into_bytes())),
    ]));
    secret
}

/// The resourceVersion of every object of kind `K` in [`NS`], by name.
async fn versions<K: Object>(store: &KubeStore) -> BTreeMap<String, String> {
    store
        .list::<K>(Some(NS), &Selector::everything())
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| {
            let meta = o.meta();
            (meta.name.clone().unwrap(), meta.resource_version.clone().unwrap())
        })
        .collect()
}

struct Reply {
    status: u16,
    json: Value,
}

async fn send(
    router: &axum::Router,
    method: &str,
    uri: &str,
    key: &str,
    body: Option<Value>,
) -> Reply {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let request = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "localhost:8080")
        .header("x-api-key", key)
        .body(body.map_or_else(axum::body::Body::empty, |b| axum::body::Body::from(b.to_string())))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Reply { status, json }
}

#[test]
fn a_reference_cluster_is_taken_over_without_rolling_a_pool_or_losing_a_claim() {
    // The reference's objects are large JSON literals: the test's frame needs more than the
    // default test thread's stack in a debug build.
    std::thread::Builder::new()
        .stack_size(32 << 20)
        .spawn(|| {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(Box::pin(take_over()));
        })
        .unwrap()
        .join()
        .unwrap();
}

async fn take_over() {
    let Some(server) = apiserver::ApiServer::start(&oka_api::crds()).await else { return };
    let kube = KubeStore::new(server.client().await);
    let dir = tempfile::tempdir().unwrap();
    let secrets =
        EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default()).unwrap();

    // The reference's state.
    let spec = sample("sandboxset-code-interpreter.yaml");
    let template = spec["template"].clone();
    let volume_claims = spec["volumeClaimTemplates"].clone();
    let set: SandboxSet = put(
        &kube,
        json!({
            "apiVersion": "agents.kruise.io/v1alpha1",
            "kind": "SandboxSet",
            "metadata": {"name": POOL, "namespace": NS,
                         "annotations": {"e2b.agents.kruise.io/should-init-envd": "true"}},
            "spec": spec,
        }),
    )
    .await;
    let set_status = json!({
        "observedGeneration": 1,
        "replicas": 2,
        "availableReplicas": 2,
        "updateRevision": REVISION,
        "currentRevision": format!("{POOL}-{REVISION}"),
        "updatedReplicas": 2,
        "updatedAvailableReplicas": 2,
        "selector": format!("agents.kruise.io/sandbox-claimed=false,agents.kruise.io/sandbox-pool={POOL}"),
    });
    let mut with_status = serde_json::to_value(&set).unwrap();
    with_status["status"] = set_status.clone();
    let set: SandboxSet =
        kube.update_status(NS, &serde_json::from_value(with_status).unwrap()).await.unwrap();
    let mut materialised_owner = pool_owner(&set);
    materialised_owner[0]["blockOwnerDeletion"] = json!(false);
    put::<SandboxTemplate>(
        &kube,
        json!({
            "apiVersion": "agents.kruise.io/v1alpha1",
            "kind": "SandboxTemplate",
            "metadata": {"name": format!("{POOL}-{REVISION}"), "namespace": NS,
                         "ownerReferences": materialised_owner},
            "spec": {"template": template, "volumeClaimTemplates": volume_claims},
        }),
    )
    .await;
    // The second member was made by the reference's release v0.3: it carries the legacy
    // revision, which the reference still counts as up to date.
    let legacy = oka_controller::revision::legacy_sandbox_set_revision(&set.spec).unwrap();
    for (name, ip, hash) in [
        ("code-interpreter-7xk2p", "10.0.0.11", REVISION),
        ("code-interpreter-9qv4m", "10.0.0.12", legacy.as_str()),
    ] {
        let mut member = reference_sandbox(name, &template, &volume_claims, ip);
        member["metadata"]["ownerReferences"] = pool_owner(&set);
        member["metadata"]["labels"]["agents.kruise.io/template-hash"] = json!(hash);
        put::<Sandbox>(&kube, member).await;
    }
    let claim: SandboxClaim = put(
        &kube,
        json!({
            "apiVersion": "agents.kruise.io/v1alpha1",
            "kind": "SandboxClaim",
            "metadata": {"name": "claim-a", "namespace": NS},
            "spec": {"templateName": POOL, "replicas": 1, "claimTimeout": "1m",
                     "ttlAfterCompleted": "60m", "createOnNoStock": true, "waitReadyTimeout": "30s"},
            "status": {
                "observedGeneration": 1,
                "phase": "Completed",
                "message": "Successfully claimed 1/1 sandboxes",
                "claimedReplicas": 1,
                "claimStartTime": rfc3339(Duration::from_secs(600)),
                "completionTime": rfc3339(Duration::from_secs(599)),
                "conditions": [{"type": "Completed", "status": "True", "reason": "AllReplicasClaimed",
                                "message": "Successfully claimed 1/1 sandboxes",
                                "lastTransitionTime": rfc3339(Duration::from_secs(599))}],
            },
        }),
    )
    .await;
    let claim_uid = claim.metadata.uid.clone().unwrap();
    put::<Sandbox>(
        &kube,
        claimed(
            reference_sandbox("code-interpreter-c1aim", &template, &volume_claims, "10.0.0.21"),
            &claim_uid,
            Some("claim-a"),
        ),
    )
    .await;
    let e2b_sandbox = "code-interpreter-e2b0k";
    put::<Sandbox>(
        &kube,
        claimed(
            reference_sandbox(e2b_sandbox, &template, &volume_claims, "10.0.0.22"),
            TEAM_KEY_ID,
            None,
        ),
    )
    .await;
    secrets.create(SYSTEM_NS, &reference_secret()).await.unwrap();

    // A second pool, whose template is a SandboxTemplate of the user's (`templateRef`): no
    // materialised template, `currentRevision` is the template's name, members refer to it.
    let desktop = sample("sandboxset-desktop.yaml");
    put::<SandboxTemplate>(
        &kube,
        json!({
            "apiVersion": "agents.kruise.io/v1alpha1",
            "kind": "SandboxTemplate",
            "metadata": {"name": "desktop-tpl", "namespace": NS},
            "spec": {"template": desktop["template"]},
        }),
    )
    .await;
    let desktop_spec = json!({"replicas": 1, "templateRef": {"name": "desktop-tpl"},
                              "persistentContents": ["filesystem"]});
    let desktop_set: SandboxSet = put(
        &kube,
        json!({
            "apiVersion": "agents.kruise.io/v1alpha1",
            "kind": "SandboxSet",
            "metadata": {"name": "desktop", "namespace": NS},
            "spec": desktop_spec,
        }),
    )
    .await;
    let referenced: oka_api::SandboxTemplateSpec =
        serde_json::from_value(json!({"template": desktop["template"]})).unwrap();
    let desktop_revision =
        oka_controller::revision::sandbox_set_revision(&desktop_set.spec, Some(&referenced));
    let desktop_status = json!({
        "observedGeneration": 1,
        "replicas": 1,
        "availableReplicas": 1,
        "updateRevision": desktop_revision,
        "currentRevision": "desktop-tpl",
        "updatedReplicas": 1,
        "updatedAvailableReplicas": 1,
        "selector": "agents.kruise.io/sandbox-claimed=false,agents.kruise.io/sandbox-pool=desktop",
    });
    let mut with_status = serde_json::to_value(&desktop_set).unwrap();
    with_status["status"] = desktop_status.clone();
    let desktop_set: SandboxSet =
        kube.update_status(NS, &serde_json::from_value(with_status).unwrap()).await.unwrap();
    let mut member = reference_member(
        "desktop-h4wq9",
        "desktop",
        "desktop-tpl",
        &desktop_revision,
        json!({"templateRef": {"name": "desktop-tpl"}, "persistentContents": ["filesystem"]}),
        "10.0.0.31",
    );
    member["metadata"]["ownerReferences"] = pool_owner(&desktop_set);
    put::<Sandbox>(&kube, member).await;
    let sandboxes_before = versions::<Sandbox>(&kube).await;
    let templates_before = versions::<SandboxTemplate>(&kube).await;
    let claims_before = versions::<SandboxClaim>(&kube).await;
    assert_eq!(sandboxes_before.len(), 5);

    // oka's controllers take over.
    let store = SplitStore { server: kube.clone(), secrets: secrets.clone() };
    let informers = oka_cache::Informers::new(store.clone());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let config = oka_controller::Config::default().workers(2);
    let sets = tokio::spawn(oka_controller::sandboxset::run_sandbox_set_controller(
        informers.clone(),
        config.clone(),
        oka_controller::Clock::system(),
        until(stopped.clone()),
    ));
    let claims = tokio::spawn(oka_controller::sandboxclaim::run_sandbox_claim_controller(
        informers.clone(),
        config,
        oka_controller::Clock::system(),
        Arc::new(oka_controller::sandboxclaim::NoClaimer),
        until(stopped.clone()),
    ));
    // Let them reconcile everything (several passes) and settle.
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Nothing rolled, nothing rewritten: every object as the reference left it.
    assert_eq!(versions::<Sandbox>(&kube).await, sandboxes_before, "a sandbox was written");
    assert_eq!(versions::<SandboxTemplate>(&kube).await, templates_before);
    assert_eq!(versions::<SandboxClaim>(&kube).await, claims_before, "the claim was written");
    let set_now: SandboxSet = kube.get(NS, POOL).await.unwrap();
    let status_now = serde_json::to_value(set_now.status.as_ref().unwrap()).unwrap();
    assert_eq!(status_now, set_status, "the pool's status changed");
    let desktop_now: SandboxSet = kube.get(NS, "desktop").await.unwrap();
    let status_now = serde_json::to_value(desktop_now.status.as_ref().unwrap()).unwrap();
    assert_eq!(status_now, desktop_status, "the templateRef pool's status changed");
    let claim_now: SandboxClaim = kube.get(NS, "claim-a").await.unwrap();
    assert_eq!(serde_json::to_value(&claim_now.status).unwrap()["phase"], "Completed");

    // The E2B API: the reference's keys, raw and encoded, reach the sandbox their key claimed.
    let index = oka_manager::Index::spawn(informers.clone());
    index.wait_ready().await;
    let manager_config = oka_manager::api::ManagerConfig::new(
        oka_manager::api::ApiKey::parse(OKA_ADMIN_KEY).unwrap(),
    );
    let router = oka_manager::api::app(oka_manager::api::AppState::new(
        store.clone(),
        Arc::clone(&index),
        manager_config,
    ));
    let e2b_id = format!("{NS}--{e2b_sandbox}");
    let path = format!("/kruise/api/sandboxes/{e2b_id}");
    let encoded_team_key = oka_manager::api::key_compat::encode(TEAM_KEY);
    for key in [TEAM_KEY, encoded_team_key.as_str()] {
        let reply = send(&router, "GET", &path, key, None).await;
        assert_eq!(reply.status, 200, "{key}: {}", reply.json);
        assert_eq!(reply.json["sandboxID"], e2b_id.as_str());
        assert_eq!(reply.json["state"], "running");
    }
    // The reference's admin key sees it too.
    let reply = send(&router, "GET", &path, REFERENCE_ADMIN_KEY, None).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    let compat = send(&router, "GET", "/kruise/api/api-keys/compatible", TEAM_KEY, None).await;
    assert_eq!(compat.json, json!({"key": encoded_team_key}));

    // The pool's members are still claimable: a create takes one of the reference's members,
    // and the pool refills at the same revision.
    let members: Vec<String> = sandboxes_before
        .keys()
        .filter(|n| n.starts_with("code-interpreter-"))
        .filter(|n| !n.ends_with("c1aim") && !n.ends_with("e2b0k"))
        .cloned()
        .collect();
    let created = send(
        &router,
        "POST",
        "/kruise/api/sandboxes",
        &encoded_team_key,
        Some(json!({"templateID": POOL})),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.json);
    // The ID oka hands out (label `agents.kruise.io/sandbox-id`, written by the claim).
    let id = created.json["sandboxID"].as_str().unwrap();
    let all = kube.list::<Sandbox>(Some(NS), &Selector::everything()).await.unwrap().items;
    let taken = all
        .iter()
        .find(|s| {
            s.metadata.labels.as_ref().and_then(|l| l.get("agents.kruise.io/sandbox-id"))
                == Some(&id.to_owned())
        })
        .and_then(|s| s.metadata.name.clone())
        .unwrap_or_default();
    assert!(members.contains(&taken), "{id} ({taken}) is not one of {members:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pool: Vec<Sandbox> = kube
            .list::<Sandbox>(Some(NS), &Selector::everything())
            .await
            .unwrap()
            .items
            .iter()
            .map(|s| (**s).clone())
            .filter(|s| {
                let labels = s.metadata.labels.clone().unwrap_or_default();
                labels.get("agents.kruise.io/sandbox-pool").is_some_and(|p| p == POOL)
                    && labels.get("agents.kruise.io/sandbox-claimed").is_none_or(|c| c != "true")
            })
            .collect();
        if pool.len() == 2 {
            for member in &pool {
                let labels = member.metadata.labels.clone().unwrap_or_default();
                let hash = labels["agents.kruise.io/template-hash"].as_str();
                assert!(hash == REVISION || hash == legacy, "{hash}");
            }
            break;
        }
        assert!(Instant::now() < deadline, "the pool did not refill: {}", pool.len());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let set_now: SandboxSet = kube.get(NS, POOL).await.unwrap();
    assert_eq!(set_now.status.unwrap().update_revision.as_deref(), Some(REVISION));
    // The claim's sandbox is still its own.
    let claimed_now: Sandbox = kube.get(NS, "code-interpreter-c1aim").await.unwrap();
    assert_eq!(
        claimed_now.metadata.annotations.unwrap()["agents.kruise.io/owner"],
        claim_uid.as_str()
    );

    let _ = stop.send(true);
    for task in [sets, claims] {
        tokio::time::timeout(Duration::from_secs(20), task).await.unwrap().unwrap();
    }
    informers.shutdown();
}
