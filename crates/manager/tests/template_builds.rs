//! E2B template builds through the API, as the SDKs' `Template.build` drives them: the request,
//! the file link and its upload, the start, the status with `logsOffset` paging until ready or
//! error, the SandboxTemplate and SandboxSet written, tags, the refusals, and a restart in the
//! middle of a build. The builder is a test double behind the `TemplateBuilder` seam (the real
//! one, with the real SDK, is tested in the `oka` crate); a stand-in pool controller writes the
//! SandboxSet status a real one would (a new revision, one ready sandbox). The real Python and
//! JS SDK builders drive it over TCP too (`scripts/setup-e2b-sdk.sh` installs them).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use http::StatusCode;
use oka_api::{SandboxSet, SandboxSetSpec, SandboxSetStatus, SandboxTemplate};
use oka_manager::templatebuild::{
    BuildBase, BuildFailure, BuildLog, BuildOutput, BuildRequest, TemplateBuildConfig,
    TemplateBuilder,
};
use oka_store::embedded::EmbeddedStore;
use oka_store::{Selector, Store, StoreError};
use serde_json::{Value, json};

use common::{KEY, Reply, call, error_of, send};
use oka_manager::api::templates::{PendingTemplate, PendingTemplates};

/// The double: logs 150 lines (more than one status page), fails a step whose RUN command
/// contains `exit 1`, blocks forever on `sleep forever`, and answers an image named after the
/// build. It keeps every request and the COPY archives' contents it read.
#[derive(Default)]
struct FakeBuilder {
    requests: Mutex<Vec<BuildRequest>>,
    copied: Mutex<Vec<Vec<u8>>>,
    unavailable: Option<String>,
}

impl TemplateBuilder for FakeBuilder {
    fn available(&self) -> Result<(), String> {
        self.unavailable.clone().map_or(Ok(()), Err)
    }

    fn build<'a>(
        &'a self,
        request: BuildRequest,
        log: BuildLog,
    ) -> BoxFuture<'a, Result<BuildOutput, BuildFailure>> {
        Box::pin(async move {
            self.requests.lock().unwrap().push(request.clone());
            for line in 0..150 {
                log.info(format!("line {line}"));
            }
            for (index, step) in request.steps.iter().enumerate() {
                if let Some(files) = &step.files {
                    self.copied.lock().unwrap().push(std::fs::read(files).unwrap());
                }
                if step.kind == "RUN" && step.args[0].contains("sleep forever") {
                    futures::future::pending::<()>().await;
                }
                if step.kind == "RUN" && step.args[0].contains("exit 1") {
                    log.error("command exited with status 1");
                    return Err(BuildFailure::at_step(index, "command `exit 1` failed: status 1"));
                }
            }
            Ok(BuildOutput {
                image: format!("oka.local/{}:{}", request.template_id, request.build_id),
            })
        })
    }
}

struct Harness {
    store: EmbeddedStore,
    index: Arc<oka_manager::Index>,
    router: axum::Router,
    builder: Arc<FakeBuilder>,
    builds_dir: PathBuf,
    _pool_controller: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// The `base` template and pool as `oka serve` writes them, an API with template builds, and
/// the stand-in pool controller.
async fn harness(
    builder: FakeBuilder,
    configure: impl FnOnce(&mut TemplateBuildConfig),
) -> Harness {
    let (store, dir) = common::store();
    let base: SandboxTemplate = serde_json::from_value(json!({
        "apiVersion": oka_api::API_VERSION, "kind": "SandboxTemplate",
        "metadata": {"name": "base", "namespace": "default"},
        "spec": {"template": {"spec": {"containers": [{"name": "sandbox", "image": "/roots/base-1"}]}}},
    }))
    .unwrap();
    store.create("default", &base).await.unwrap();
    let mut set = SandboxSet::new(
        "base",
        SandboxSetSpec {
            replicas: 0,
            template_ref: Some(serde_json::from_value(json!({"name": "base"})).unwrap()),
            ..Default::default()
        },
    );
    set.metadata.namespace = Some("default".into());
    store.create("default", &set).await.unwrap();
    let index = oka_manager::Index::spawn(store.clone());
    index.wait_ready().await;
    let builder = Arc::new(builder);
    let builds_dir = dir.path().join("template-builds");
    let router = router(&store, &index, &builder, &builds_dir, configure);
    let pool_controller = tokio::spawn(stand_in_pool_controller(store.clone()));
    Harness {
        store,
        index,
        router,
        builder,
        builds_dir,
        _pool_controller: pool_controller,
        _dir: dir,
    }
}

fn router(
    store: &EmbeddedStore,
    index: &Arc<oka_manager::Index>,
    builder: &Arc<FakeBuilder>,
    dir: &std::path::Path,
    configure: impl FnOnce(&mut TemplateBuildConfig),
) -> axum::Router {
    let mut config =
        oka_manager::api::ManagerConfig::new(oka_manager::api::ApiKey::parse(KEY).unwrap());
    // An empty pool answers 503 at once: a create shows which pool it reached.
    config.create.enabled = false;
    // A template oka serve is still building.
    config.pending_templates = Some(PendingTemplates::new(|id| {
        (id == "later").then(|| PendingTemplate::Building {
            message: "template later is being built (40%)".into(),
            retry_after_secs: 5,
        })
    }));
    let mut builds = TemplateBuildConfig::new(Arc::clone(builder) as Arc<dyn TemplateBuilder>, dir);
    builds.ready_timeout = Duration::from_secs(10);
    configure(&mut builds);
    let state = oka_manager::api::AppState::new(store.clone(), Arc::clone(index), config)
        .with_template_builds(builds)
        .unwrap();
    oka_manager::api::app(state)
}

/// What the SandboxSet controller reports of a pool whose template changed: a new revision
/// (the template spec's hash) and, unless its start command says `never-ready`, one ready
/// sandbox of it.
async fn stand_in_pool_controller(store: EmbeddedStore) {
    loop {
        let sets = store.list::<SandboxSet>(Some("default"), &Selector::default()).await.unwrap();
        for set in sets.items.iter().map(|s| (**s).clone()) {
            let Some(reference) = &set.spec.template_ref else { continue };
            let template = match store.get::<SandboxTemplate>("default", &reference.name).await {
                Ok(template) => template,
                Err(StoreError::NotFound { .. }) => continue,
                Err(e) => panic!("{e}"),
            };
            let spec = serde_json::to_string(&template.spec).unwrap();
            let revision = format!("{:016x}", fnv(&spec));
            let ready =
                i32::from(!spec.contains("never-ready") && !spec.contains("fails-to-start"));
            if spec.contains("fails-to-start") {
                fail_a_member(&store, &set, &revision).await;
            }
            let status = SandboxSetStatus {
                update_revision: Some(revision),
                updated_available_replicas: Some(ready),
                ..Default::default()
            };
            if set.status.as_ref() != Some(&status) {
                let mut set = set.clone();
                set.status = Some(status);
                let _ = store.update_status("default", &set).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A member of `set` at `revision` that failed to start, as the sandbox controller reports one.
async fn fail_a_member(store: &EmbeddedStore, set: &SandboxSet, revision: &str) {
    let pool = set.metadata.name.clone().unwrap();
    let mut sandbox = oka_api::Sandbox::test()
        .name(&format!("{pool}-failed"))
        .namespace("default")
        .pooled(&pool)
        .label(oka_api::labels::TEMPLATE_HASH, revision)
        .phase(oka_api::SandboxPhase::Failed)
        .build();
    sandbox.metadata.uid = None;
    sandbox.status.get_or_insert_default().message = Some("exec /bin/bash: not found".into());
    let status = sandbox.status.clone();
    if let Ok(mut created) = store.create("default", &sandbox).await {
        created.status = status;
        store.update_status("default", &created).await.unwrap();
    }
}

fn fnv(text: &str) -> u64 {
    text.bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

async fn request_build(router: &axum::Router, body: Value) -> Value {
    let reply = call(router, "POST", "/v3/templates", Some(body)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.json);
    reply.json
}

/// Polls the status as the SDK does (offset advanced by the entries received) until the build
/// ends and a last poll brings nothing new; the final status and every entry's message.
async fn wait_build(router: &axum::Router, template: &str, build: &str) -> (Value, Vec<String>) {
    let mut offset = 0;
    let mut messages = Vec::new();
    for _ in 0..1000 {
        let reply = call(
            router,
            "GET",
            &format!("/templates/{template}/builds/{build}/status?logsOffset={offset}"),
            None,
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
        let entries = reply.json["logEntries"].as_array().unwrap().clone();
        assert!(entries.len() <= 100, "a page has at most 100 entries");
        assert_eq!(reply.json["logs"].as_array().unwrap().len(), entries.len());
        offset += entries.len();
        for entry in &entries {
            assert!(entry["timestamp"].as_str().unwrap().parse::<jiff::Timestamp>().is_ok());
            assert!(["debug", "info", "warn", "error"].contains(&entry["level"].as_str().unwrap()));
            messages.push(entry["message"].as_str().unwrap().to_owned());
        }
        let status = reply.json["status"].as_str().unwrap();
        if (status == "ready" || status == "error") && entries.is_empty() {
            return (reply.json, messages);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the build {build} never ended");
}

fn sha(text: &str) -> String {
    let digest = <sha2::Sha256 as sha2::Digest>::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The path of a fresh upload link for `hash`.
async fn link_path(router: &axum::Router, template: &str, hash: &str) -> String {
    let link = call(router, "GET", &format!("/templates/{template}/files/{hash}"), None).await;
    assert_eq!(link.status, StatusCode::CREATED, "{}", link.json);
    link.json["url"].as_str().unwrap().strip_prefix("http://localhost:3000").unwrap().to_owned()
}

async fn put(router: &axum::Router, path: &str, body: Vec<u8>) -> Reply {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let request = http::Request::builder()
        .method("PUT")
        .uri(path)
        .header("host", "localhost:3000")
        .body(axum::body::Body::from(body))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Reply { status, headers, json }
}

async fn wait_index_set(index: &oka_manager::Index, name: &str) -> Arc<SandboxSet> {
    for _ in 0..500 {
        if let Some(set) = index.sandbox_set(Some("default"), name) {
            return set;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the index never showed the pool {name}");
}

#[tokio::test]
async fn the_sdk_flow_builds_a_template_that_becomes_a_warm_pool() {
    let h = harness(FakeBuilder::default(), |c| {
        c.pool_annotations_for_test();
    })
    .await;
    let created = request_build(
        &h.router,
        json!({"name": "py-env", "tags": ["v1"], "cpuCount": 2, "memoryMB": 1024}),
    )
    .await;
    let build = created["buildID"].as_str().unwrap().to_owned();
    assert!(uuid::Uuid::parse_str(&build).is_ok());
    assert_eq!(created["templateID"], "py-env");
    assert_eq!(created["names"], json!(["py-env"]));
    assert_eq!(created["aliases"], json!(["py-env"]));
    assert_eq!(created["tags"], json!(["default", "v1"]));

    // The file link: absent, then uploaded through its one-time link with no API key.
    let hash = sha("app.py");
    let link = call(&h.router, "GET", &format!("/templates/py-env/files/{hash}"), None).await;
    assert_eq!(link.status, StatusCode::CREATED);
    assert_eq!(link.json["present"], false);
    let url = link.json["url"].as_str().unwrap().to_owned();
    let path = url
        .strip_prefix("http://localhost:3000/template-files/")
        .map(|t| format!("/template-files/{t}"))
        .unwrap();
    let token = path.rsplit('/').next().unwrap();
    assert!(token.len() >= 64, "the token is unguessable: {token}");
    let wrong = put(&h.router, "/template-files/0123456789abcdef", b"x".to_vec()).await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);
    assert_eq!(put(&h.router, &path, b"archive bytes".to_vec()).await.status, StatusCode::OK);
    assert_eq!(
        put(&h.router, &path, b"again".to_vec()).await.status,
        StatusCode::FORBIDDEN,
        "one time"
    );
    let stored = h.builds_dir.join("uploads/default").join(&hash);
    assert_eq!(std::fs::read(&stored).unwrap(), b"archive bytes");
    let link = call(&h.router, "GET", &format!("/templates/py-env/files/{hash}"), None).await;
    assert_eq!(link.json["present"], true);
    // Archives are not held to the API's JSON body limit, only to the configured one.
    let big = vec![7u8; 3 << 20];
    let reply =
        put(&h.router, &link_path(&h.router, "py-env", &sha("big")).await, big.clone()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    assert_eq!(std::fs::read(h.builds_dir.join("uploads/default").join(sha("big"))).unwrap(), big);
    // Behind the customized prefix the link keeps it; a TLS front end's scheme is kept.
    let link = send(
        &h.router,
        "GET",
        &format!("/kruise/api/templates/py-env/files/{hash}"),
        Some(KEY),
        &[("x-forwarded-proto", "https")],
        None,
    )
    .await;
    assert!(
        link.json["url"]
            .as_str()
            .unwrap()
            .starts_with("https://localhost:3000/kruise/api/template-files/")
    );

    let start = json!({
        "fromImage": "e2bdev/base", "force": false,
        "steps": [
            {"type": "RUN", "args": ["apt-get update", "root"], "force": false, "forceUpload": null},
            {"type": "COPY", "args": ["app.py", "/app/", "", ""], "filesHash": hash, "force": false, "forceUpload": null},
            {"type": "ENV", "args": ["MODE", "prod"], "force": false, "forceUpload": null},
            {"type": "WORKDIR", "args": ["/app"], "force": false, "forceUpload": null},
            {"type": "USER", "args": ["user"], "force": false, "forceUpload": null},
        ],
        "startCmd": "python -m http.server 8000",
        "readyCmd": "curl -s localhost:8000",
    });
    let uri = format!("/v2/templates/py-env/builds/{build}");
    let reply = call(&h.router, "POST", &uri, Some(start.clone())).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.json);
    let again = call(&h.router, "POST", &uri, Some(start)).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.json);

    let (status, messages) = wait_build(&h.router, "py-env", &build).await;
    assert_eq!(status["status"], "ready", "{status}");
    assert!(status.get("reason").is_none());
    let lines: Vec<_> = messages.iter().filter(|m| m.starts_with("line ")).cloned().collect();
    let expected: Vec<_> = (0..150).map(|i| format!("line {i}")).collect();
    assert_eq!(lines, expected, "every entry once, in order, across pages");
    assert!(messages.last().unwrap().contains("py-env is ready"), "{messages:?}");

    // What the builder was handed.
    let request = h.builder.requests.lock().unwrap()[0].clone();
    assert_eq!(
        request.base,
        BuildBase::Template { name: "base".into(), image: "/roots/base-1".into() }
    );
    assert_eq!(
        (request.namespace.as_str(), request.cpu_count, request.memory_mb),
        ("default", Some(2), Some(1024))
    );
    let kinds: Vec<_> = request.steps.iter().map(|s| s.kind.as_str()).collect();
    assert_eq!(kinds, ["RUN", "COPY", "ENV", "WORKDIR", "USER"]);
    assert_eq!(request.steps[0].args, ["apt-get update", "root"]);
    assert_eq!(request.steps[1].files.as_deref(), Some(stored.as_path()));
    assert_eq!(h.builder.copied.lock().unwrap()[0], b"archive bytes");

    // The template and its pool.
    let template = h.store.get::<SandboxTemplate>("default", "py-env").await.unwrap();
    let value = serde_json::to_value(&template).unwrap();
    let container = &value["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], format!("oka.local/py-env:{build}"));
    assert_eq!(container["imagePullPolicy"], "IfNotPresent");
    assert_eq!(
        container["command"],
        json!(["/bin/bash", "-l", "-c", "python -m http.server 8000"])
    );
    // The ready check is a startup probe within the build's ready timeout (10 s here).
    assert_eq!(
        container["startupProbe"],
        json!({
            "exec": { "command": ["/bin/bash", "-l", "-c", "curl -s localhost:8000"] },
            "periodSeconds": 1,
            "timeoutSeconds": 10,
            "failureThreshold": 10,
        })
    );
    assert!(container.get("readinessProbe").is_none());
    assert_eq!(container["resources"]["limits"], json!({"cpu": "2", "memory": "1024Mi"}));
    assert_eq!(
        value["spec"]["template"]["metadata"]["annotations"]["agents.kruise.io/network"],
        "outbound"
    );
    assert_eq!(
        value["metadata"]["annotations"]["agents.kruise.io/template-build-id"],
        build.as_str()
    );
    let set = h.store.get::<SandboxSet>("default", "py-env").await.unwrap();
    assert_eq!(set.spec.replicas, 1);
    assert_eq!(set.spec.template_ref.as_ref().unwrap().name, "py-env");

    // The SDK's Template.exists, and the template among the others.
    let alias = call(&h.router, "GET", "/templates/aliases/py-env", None).await;
    assert_eq!(alias.status, StatusCode::OK);
    assert_eq!(alias.json["templateID"], "py-env");
    let got = call(&h.router, "GET", "/templates/py-env", None).await;
    assert_eq!(
        (got.json["cpuCount"].as_i64(), got.json["memoryMB"].as_i64()),
        (Some(2), Some(1024))
    );

    // Tags.
    let tags = call(&h.router, "GET", "/templates/py-env/tags", None).await;
    assert_eq!(tags.status, StatusCode::OK);
    let names: Vec<_> =
        tags.json.as_array().unwrap().iter().map(|t| t["tag"].as_str().unwrap()).collect();
    assert_eq!(names, ["default", "v1"]);
    assert!(tags.json.as_array().unwrap().iter().all(|t| t["buildID"] == build.as_str()));
    let assigned = call(
        &h.router,
        "POST",
        "/templates/tags",
        Some(json!({"target": "py-env:v1", "tags": ["prod"]})),
    )
    .await;
    assert_eq!(assigned.status, StatusCode::CREATED, "{}", assigned.json);
    assert_eq!(assigned.json, json!({"tags": ["prod"], "buildID": build}));
    let removed = call(
        &h.router,
        "DELETE",
        "/templates/tags",
        Some(json!({"name": "py-env", "tags": ["prod"]})),
    )
    .await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT);
    let removed = call(
        &h.router,
        "DELETE",
        "/templates/tags",
        Some(json!({"name": "py-env", "tags": ["prod"]})),
    )
    .await;
    assert_eq!(
        error_of(&removed),
        json!({"code": 404, "message": "tag \"prod\" of template py-env not found"})
    );
    let missing = call(
        &h.router,
        "POST",
        "/templates/tags",
        Some(json!({"target": "py-env:v9", "tags": ["x"]})),
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);

    // A second build replaces the pool's template; the pool is kept as it is.
    let second = request_build(&h.router, json!({"name": "py-env:v2"})).await;
    let second_build = second["buildID"].as_str().unwrap().to_owned();
    let reply = call(
        &h.router,
        "POST",
        &format!("/v2/templates/py-env/builds/{second_build}"),
        Some(json!({"fromTemplate": "py-env", "steps": [{"type": "RUN", "args": ["echo two"]}]})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.json);
    let (status, _) = wait_build(&h.router, "py-env", &second_build).await;
    assert_eq!(status["status"], "ready", "{status}");
    let request = h.builder.requests.lock().unwrap()[1].clone();
    assert_eq!(
        request.base,
        BuildBase::Template { name: "py-env".into(), image: format!("oka.local/py-env:{build}") }
    );
    let template = h.store.get::<SandboxTemplate>("default", "py-env").await.unwrap();
    let value = serde_json::to_value(&template).unwrap();
    assert_eq!(
        value["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("oka.local/py-env:{second_build}")
    );
    assert!(value["spec"]["template"]["spec"]["containers"][0].get("command").is_none());
    let tags = call(&h.router, "GET", "/templates/py-env/tags", None).await;
    let v2 = tags.json.as_array().unwrap().iter().find(|t| t["tag"] == "v2").unwrap().clone();
    assert_eq!(v2["buildID"], second_build.as_str());

    // `Sandbox.create("name:tag")`: the tag of the build the pool serves reaches the pool (empty
    // here: 503); an older build's tag and an unknown tag are refused by name.
    let reply =
        call(&h.router, "POST", "/v2/sandboxes", Some(json!({"templateID": "py-env:v2"}))).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{}", reply.json);
    let reply =
        call(&h.router, "POST", "/v2/sandboxes", Some(json!({"templateID": "py-env:v1"}))).await;
    let message = error_of(&reply)["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains(&format!("names build {build}, but its pool serves build {second_build}")),
        "{message}"
    );
    let reply =
        call(&h.router, "POST", "/v2/sandboxes", Some(json!({"templateID": "py-env:nope"}))).await;
    assert_eq!(
        error_of(&reply),
        json!({"code": 400, "message": "tag \"nope\" of template py-env not found"})
    );

    // Template.delete: the pool, its template and its builds go; base is not the API's to delete.
    let reply = call(&h.router, "DELETE", "/templates/py-env", None).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.json);
    assert!(matches!(
        h.store.get::<SandboxSet>("default", "py-env").await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        h.store.get::<SandboxTemplate>("default", "py-env").await,
        Err(StoreError::NotFound { .. })
    ));
    let reply =
        call(&h.router, "GET", &format!("/templates/py-env/builds/{build}/status"), None).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert!(!h.builds_dir.join("builds/default/py-env").exists());
    let reply = call(&h.router, "DELETE", "/templates/base", None).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
}

trait TestConfig {
    fn pool_annotations_for_test(&mut self);
}

impl TestConfig for TemplateBuildConfig {
    fn pool_annotations_for_test(&mut self) {
        self.pod_annotations.insert("agents.kruise.io/network".into(), "outbound".into());
    }
}

#[tokio::test]
async fn a_failed_build_names_its_step_and_leaves_the_previous_template_serving() {
    let h = harness(FakeBuilder::default(), |c| c.ready_timeout = Duration::from_secs(3)).await;
    // A first build that fails writes nothing.
    let created = request_build(&h.router, json!({"name": "broken"})).await;
    let build = created["buildID"].as_str().unwrap();
    let steps = json!([{"type": "RUN", "args": ["echo ok"]}, {"type": "RUN", "args": ["exit 1"]}]);
    let reply = call(
        &h.router,
        "POST",
        &format!("/v2/templates/broken/builds/{build}"),
        Some(json!({"fromImage": "debian:12", "steps": steps})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED);
    let (status, messages) = wait_build(&h.router, "broken", build).await;
    assert_eq!(status["status"], "error");
    assert_eq!(status["reason"]["message"], "command `exit 1` failed: status 1");
    assert_eq!(status["reason"]["step"], "2", "the SDK's number of steps[1]");
    let reason_entries: Vec<_> = status["reason"]["logEntries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    assert!(reason_entries.contains(&"command exited with status 1"), "{reason_entries:?}");
    assert!(messages.iter().any(|m| m.contains("Build failed")));
    let request = h.builder.requests.lock().unwrap()[0].clone();
    assert_eq!(request.base, BuildBase::Image { reference: "debian:12".into(), credentials: None });
    assert!(matches!(
        h.store.get::<SandboxTemplate>("default", "broken").await,
        Err(StoreError::NotFound { .. })
    ));

    // A good build, then one whose sandboxes never become ready: the good one keeps serving.
    let good = request_build(&h.router, json!({"name": "app"})).await["buildID"]
        .as_str()
        .unwrap()
        .to_owned();
    call(
        &h.router,
        "POST",
        &format!("/v2/templates/app/builds/{good}"),
        Some(json!({"fromTemplate": "base"})),
    )
    .await;
    assert_eq!(wait_build(&h.router, "app", &good).await.0["status"], "ready");
    let bad = request_build(&h.router, json!({"name": "app"})).await["buildID"]
        .as_str()
        .unwrap()
        .to_owned();
    let reply = call(
        &h.router,
        "POST",
        &format!("/v2/templates/app/builds/{bad}"),
        Some(json!({"fromTemplate": "base", "startCmd": "never-ready"})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED);
    let (status, _) = wait_build(&h.router, "app", &bad).await;
    assert_eq!(status["status"], "error");
    assert_eq!(status["reason"]["step"], "finalize");
    assert!(status["reason"]["message"].as_str().unwrap().contains("start command"), "{status}");
    let template = h.store.get::<SandboxTemplate>("default", "app").await.unwrap();
    let annotations = template.metadata.annotations.unwrap();
    assert_eq!(annotations["agents.kruise.io/template-build-id"], good);
    let value = serde_json::to_value(&template.spec).unwrap();
    assert_eq!(
        value["template"]["spec"]["containers"][0]["image"],
        format!("oka.local/app:{good}")
    );
    assert!(h.store.get::<SandboxSet>("default", "app").await.is_ok());

    // A sandbox of the new template that fails fails the build at once, with its message.
    let failing = request_build(&h.router, json!({"name": "app"})).await["buildID"]
        .as_str()
        .unwrap()
        .to_owned();
    let started = std::time::Instant::now();
    call(
        &h.router,
        "POST",
        &format!("/v2/templates/app/builds/{failing}"),
        Some(json!({"fromTemplate": "base", "startCmd": "fails-to-start"})),
    )
    .await;
    let (status, _) = wait_build(&h.router, "app", &failing).await;
    assert_eq!(status["status"], "error");
    let message = status["reason"]["message"].as_str().unwrap();
    assert!(
        message.contains("failed to start (app-failed): exec /bin/bash: not found"),
        "{message}"
    );
    assert!(started.elapsed() < Duration::from_secs(3), "not after the ready timeout");
    let template = h.store.get::<SandboxTemplate>("default", "app").await.unwrap();
    assert_eq!(template.metadata.annotations.unwrap()["agents.kruise.io/template-build-id"], good);

    // A first build whose sandboxes never become ready removes what it wrote.
    let first = request_build(&h.router, json!({"name": "never"})).await["buildID"]
        .as_str()
        .unwrap()
        .to_owned();
    call(
        &h.router,
        "POST",
        &format!("/v2/templates/never/builds/{first}"),
        Some(json!({"fromTemplate": "base", "startCmd": "never-ready"})),
    )
    .await;
    assert_eq!(wait_build(&h.router, "never", &first).await.0["status"], "error");
    assert!(matches!(
        h.store.get::<SandboxTemplate>("default", "never").await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        h.store.get::<SandboxSet>("default", "never").await,
        Err(StoreError::NotFound { .. })
    ));
}

#[tokio::test]
async fn mistakes_are_refused_with_the_e2b_error_and_a_message_naming_them() {
    let h = harness(FakeBuilder::default(), |c| c.max_upload_bytes = 1024).await;
    let refused = |reply: Reply, code: u16, contains: &str| {
        let body = error_of(&reply);
        assert_eq!(body["code"], code, "{body}");
        assert!(body["message"].as_str().unwrap().contains(contains), "{body}");
    };
    refused(
        call(&h.router, "POST", "/v3/templates", Some(json!({"name": "My_Env"}))).await,
        400,
        "must be a Kubernetes name",
    );
    refused(
        call(&h.router, "POST", "/v3/templates", Some(json!({"name": "ok", "tags": ["bad tag"]})))
            .await,
        400,
        "invalid tag",
    );
    refused(
        call(&h.router, "POST", "/v3/templates", Some(json!({"name": "ok", "gpu": 1}))).await,
        400,
        "unknown field `gpu`",
    );
    refused(
        call(&h.router, "POST", "/v3/templates", Some(json!({"name": "base"}))).await,
        409,
        "not made by a template build",
    );

    let build = request_build(&h.router, json!({"name": "ok"})).await["buildID"]
        .as_str()
        .unwrap()
        .to_owned();
    let start = |body: Value| {
        let router = h.router.clone();
        let uri = format!("/v2/templates/ok/builds/{build}");
        async move { call(&router, "POST", &uri, Some(body)).await }
    };
    refused(
        start(json!({"fromImage": "x", "steps": [{"type": "ARG", "args": ["a"]}]})).await,
        400,
        "unknown step type \"ARG\"",
    );
    let hash = sha("never uploaded");
    refused(
        start(json!({"fromImage": "x", "steps": [{"type": "COPY", "args": ["a", "/b"], "filesHash": hash}]})).await,
        400,
        "step 1 (COPY a): its files",
    );
    refused(start(json!({"fromImage": "x", "fromImageRegistry": {"type": "gcp", "serviceAccountJson": "{}"}})).await, 400, "fromImageRegistry of type gcp");
    refused(start(json!({"fromTemplate": "nope"})).await, 400, "template \"nope\" not found");
    refused(start(json!({"fromTemplate": "later"})).await, 503, "being built (40%)");
    refused(start(json!({"fromImage": "x", "startCmd": " "})).await, 400, "startCmd is empty");
    refused(
        call(
            &h.router,
            "POST",
            "/v2/templates/ok/builds/00000000-0000-4000-8000-000000000000",
            Some(json!({"fromImage": "x"})),
        )
        .await,
        404,
        "not found",
    );
    refused(
        call(
            &h.router,
            "POST",
            &format!("/v2/templates/other/builds/{build}"),
            Some(json!({"fromImage": "x"})),
        )
        .await,
        404,
        "not found",
    );
    refused(
        call(&h.router, "GET", &format!("/templates/ok/builds/{build}x/status"), None).await,
        404,
        "not found",
    );
    refused(
        call(&h.router, "GET", &format!("/templates/nope/files/{hash}"), None).await,
        404,
        "Template not found: nope",
    );
    refused(
        call(&h.router, "GET", "/templates/ok/files/..%2Fetc", None).await,
        400,
        "invalid files hash",
    );
    refused(call(&h.router, "GET", "/templates/nope/tags", None).await, 404, "Template not found");
    let path = link_path(&h.router, "ok", &sha("too big")).await;
    refused(put(&h.router, &path, vec![0; 1025]).await, 400, "larger than the limit of 1024 bytes");
    assert!(!h.builds_dir.join("uploads/default").join(sha("too big")).exists());
    let leftovers = std::fs::read_dir(h.builds_dir.join("uploads/default")).unwrap().count();
    assert_eq!(leftovers, 0, "no partial file is left");
    refused(
        call(&h.router, "POST", "/templates/tags", Some(json!({"target": "ok", "tags": []}))).await,
        400,
        "at least one tag",
    );
    refused(
        call(&h.router, "GET", &format!("/templates/ok/builds/{build}/logs"), None).await,
        501,
        "logsOffset",
    );
    // Still waiting: its status says so.
    let status =
        call(&h.router, "GET", &format!("/templates/ok/builds/{build}/status"), None).await;
    assert_eq!(status.json["status"], "waiting");
    // Without a key nothing is served but the upload link.
    let anonymous =
        send(&h.router, "POST", "/v3/templates", None, &[], Some(json!({"name": "x"}))).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn one_build_of_a_template_runs_at_a_time_and_a_restart_marks_it_interrupted() {
    let h = harness(FakeBuilder::default(), |_| {}).await;
    let first = request_build(&h.router, json!({"name": "slow"})).await["buildID"]
        .as_str()
        .unwrap()
        .to_owned();
    let second = request_build(&h.router, json!({"name": "slow"})).await["buildID"]
        .as_str()
        .unwrap()
        .to_owned();
    let body =
        json!({"fromTemplate": "base", "steps": [{"type": "RUN", "args": ["sleep forever"]}]});
    let reply =
        call(&h.router, "POST", &format!("/v2/templates/slow/builds/{first}"), Some(body.clone()))
            .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED);
    let busy =
        call(&h.router, "POST", &format!("/v2/templates/slow/builds/{second}"), Some(body)).await;
    assert_eq!(error_of(&busy)["code"], 409);
    assert!(
        error_of(&busy)["message"]
            .as_str()
            .unwrap()
            .contains("a build of template slow is running")
    );
    let third = call(&h.router, "POST", "/v3/templates", Some(json!({"name": "slow"}))).await;
    assert_eq!(error_of(&third)["code"], 409, "told before uploading anything");
    // The builder is under way: 150 lines and more logged.
    let mut offset = 0;
    for _ in 0..1000 {
        let reply = call(
            &h.router,
            "GET",
            &format!("/templates/slow/builds/{first}/status?logsOffset={offset}"),
            None,
        )
        .await;
        assert_eq!(reply.json["status"], "building");
        offset += reply.json["logEntries"].as_array().unwrap().len();
        if offset >= 151 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(offset, 151);

    // oka serve restarts: a new API over the same store and directory.
    let router = router(&h.store, &h.index, &h.builder, &h.builds_dir, |_| {});
    let reply = call(
        &router,
        "GET",
        &format!("/templates/slow/builds/{first}/status?logsOffset={offset}"),
        None,
    )
    .await;
    assert_eq!(reply.json["status"], "error", "{}", reply.json);
    assert!(reply.json["reason"]["message"].as_str().unwrap().contains("interrupted"));
    let entries = reply.json["logEntries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "the offset still counts the entries from before: {entries:?}");
    assert_eq!(entries[0]["level"], "error");
    // The earlier entries are still there from the start.
    let all = call(
        &router,
        "GET",
        &format!("/templates/slow/builds/{first}/status?logsOffset=0&limit=5"),
        None,
    )
    .await;
    assert_eq!(all.json["logEntries"][1]["message"], "line 0");
    // The next build of the template runs.
    let reply = call(
        &router,
        "POST",
        &format!("/v2/templates/slow/builds/{second}"),
        Some(json!({"fromTemplate": "base"})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.json);
    assert_eq!(wait_build(&router, "slow", &second).await.0["status"], "ready");
    wait_index_set(&h.index, "slow").await;
}

#[tokio::test]
async fn without_a_builder_or_where_it_cannot_run_builds_answer_501() {
    let api = common::api(0).await;
    let reply = call(&api.router, "POST", "/v3/templates", Some(json!({"name": "x"}))).await;
    assert_eq!(error_of(&reply)["code"], 501);
    assert!(error_of(&reply)["message"].as_str().unwrap().contains("not enabled"));
    let reply = call(&api.router, "GET", "/templates/x/tags", None).await;
    assert_eq!(error_of(&reply)["code"], 501);

    let unavailable = FakeBuilder {
        unavailable: Some("builds need user namespaces".into()),
        ..FakeBuilder::default()
    };
    let h = harness(unavailable, |_| {}).await;
    let reply = call(&h.router, "POST", "/v3/templates", Some(json!({"name": "x"}))).await;
    assert_eq!(error_of(&reply), json!({"code": 501, "message": "builds need user namespaces"}));
}

/// The venv of the real Python SDK (`scripts/setup-e2b-sdk.sh`).
fn sdk_python() -> PathBuf {
    let root = std::env::var_os("OKA_E2B_VENV_ROOT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv"),
        PathBuf::from,
    );
    let python = root.join("e2b-latest/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-e2b-sdk.sh first (it installs the e2b SDK venvs)",
        python.display()
    );
    python
}

/// The real Python SDK's builder against the API over TCP: its requests parse, its upload
/// reaches the link (a gzip tar of the copied file), its log callback sees the build's entries,
/// a failing step raises with the build's message, and `Template.exists`, `assign_tags` and
/// `get_tags` read what the build wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_python_sdk_builds_through_the_api() {
    let python = sdk_python();
    let h = harness(FakeBuilder::default(), |_| {}).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let router = h.router.clone();
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let context = tempfile::tempdir().unwrap();
    std::fs::write(context.path().join("app.py"), "print('hello')\n").unwrap();
    let script = r#"
import os, sys
from e2b import Template, wait_for_port
from e2b.exceptions import BuildException

logs = []
template = (
    Template(file_context_path=os.environ["CONTEXT"])
    .from_template("base")
    .run_cmd("echo hi")
    .copy("app.py", "/app/")
    .set_envs({"MODE": "prod"})
    .set_workdir("/app")
    .set_user("user")
    .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000))
)
info = Template.build(template, "sdk-env", tags=["v1"], cpu_count=2, memory_mb=512,
                      on_build_logs=lambda e: logs.append(e.message))
print("BUILD", info.template_id, info.build_id)
assert any(m == "line 149" for m in logs), logs
assert any("sdk-env is ready" in m for m in logs), logs
assert Template.exists("sdk-env")
assert not Template.exists("no-such-template")
tagged = Template.assign_tags("sdk-env:v1", "prod")
assert tagged.tags == ["prod"], tagged
assert sorted(t.tag for t in Template.get_tags("sdk-env")) == ["default", "prod", "v1"]

failing = Template().from_image("debian:12").run_cmd("echo ok").run_cmd("exit 1")
try:
    Template.build(failing, "sdk-broken")
    sys.exit("the failing build did not raise")
except BuildException as e:
    assert "exit 1" in str(e), e
print("all checks passed")
"#;
    let out = tokio::process::Command::new(python)
        .arg("-c")
        .arg(script)
        .env("E2B_API_URL", format!("http://{address}"))
        .env("E2B_API_KEY", KEY)
        .env("CONTEXT", context.path())
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .output()
        .await
        .unwrap();
    server.abort();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "the SDK flow failed ({})\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    // What the SDK sent, as the builder got it: the steps and the uploaded archive (gzip).
    let request = h.builder.requests.lock().unwrap()[0].clone();
    assert_eq!(request.template_id, "sdk-env");
    let kinds: Vec<_> = request.steps.iter().map(|s| s.kind.as_str()).collect();
    assert_eq!(kinds, ["RUN", "COPY", "ENV", "WORKDIR", "USER"]);
    assert_eq!(request.steps[1].args[..2], ["app.py", "/app/"]);
    assert_eq!(request.start_cmd.as_deref(), Some("python3 -m http.server 8000"));
    assert!(request.ready_cmd.as_deref().unwrap().contains("8000"), "{:?}", request.ready_cmd);
    assert_eq!((request.cpu_count, request.memory_mb), (Some(2), Some(512)));
    let archive = h.builder.copied.lock().unwrap()[0].clone();
    assert_eq!(archive[..2], [0x1f, 0x8b], "a gzip archive");
    let set = h.store.get::<SandboxSet>("default", "sdk-env").await.unwrap();
    assert_eq!(set.spec.template_ref.unwrap().name, "sdk-env");
}

/// The real JS SDK's builder against the API over TCP (its upload is a streamed `fetch` PUT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_js_sdk_builds_through_the_api() {
    let root = std::env::var_os("OKA_E2B_VENV_ROOT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv"),
        PathBuf::from,
    );
    let sdk = root.join("e2b-js");
    assert!(
        sdk.join("node_modules/e2b/package.json").exists() && sdk.join("node").exists(),
        "{} is missing: run scripts/setup-e2b-sdk.sh first (it installs the e2b JS SDK)",
        sdk.display()
    );
    let h = harness(FakeBuilder::default(), |_| {}).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let router = h.router.clone();
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let context = tempfile::tempdir().unwrap();
    std::fs::write(context.path().join("app.js"), "console.log('hello')\n").unwrap();
    let script = r#"
import { createRequire } from 'node:module'
import path from 'node:path'
const require = createRequire(path.join(process.env.OKA_E2B_JS, 'package.json'))
const { Template, waitForPort } = require('e2b')

const logs = []
const template = Template({ fileContextPath: process.env.CONTEXT })
  .fromTemplate('base')
  .runCmd('echo hi')
  .copy('app.js', '/app/')
  .setEnvs({ MODE: 'prod' })
  .setWorkdir('/app')
  .setStartCmd('node /app/app.js', waitForPort(3000))
const info = await Template.build(template, 'js-env', { onBuildLogs: (e) => logs.push(e.message) })
if (info.templateId !== 'js-env') throw new Error(`templateId ${info.templateId}`)
if (!logs.includes('line 149')) throw new Error(`logs: ${logs}`)
if (!(await Template.exists('js-env'))) throw new Error('js-env does not exist')
let failed = false
try {
  await Template.build(Template().fromImage('debian:12').runCmd('exit 1'), 'js-broken')
} catch (e) {
  failed = String(e).includes('exit 1')
}
if (!failed) throw new Error('the failing build did not raise with its message')
console.log('all checks passed')
"#;
    let out = tokio::process::Command::new(sdk.join("node"))
        .arg("--input-type=module")
        .arg("-e")
        .arg(script)
        .env("OKA_E2B_JS", &sdk)
        .env("E2B_API_URL", format!("http://{address}"))
        .env("E2B_API_KEY", KEY)
        .env("CONTEXT", context.path())
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .output()
        .await
        .unwrap();
    server.abort();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "the SDK flow failed ({})\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    let request = h.builder.requests.lock().unwrap()[0].clone();
    let kinds: Vec<_> = request.steps.iter().map(|s| s.kind.as_str()).collect();
    assert_eq!(kinds, ["RUN", "COPY", "ENV", "WORKDIR"]);
    assert!(!h.builder.copied.lock().unwrap()[0].is_empty(), "the archive arrived");
}
