//! The Pod runtime against kube's mock service: every request a sandbox's life makes (create,
//! Ready, pause, resume, deletion) asserted by method, path, query and body, answered as the
//! API server answers. A Pod cannot run without a kubelet here, so the scenario plays the
//! kubelet too: it puts the Pod it "ran" (Running, Ready, an IP) into the Pod cache the
//! controller reads. The reconcile is driven directly, with hand-filled caches standing in
//! for the informers (the informers themselves are `oka-cache`'s, tested there).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaimSpec, Pod, PodCondition, PodSpec, PodStatus, PodTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::client::Body;
use oka_api::common::PersistentVolumeClaimTemplate;
use oka_api::runtime_choice::SandboxRuntime;
use oka_api::{Sandbox, SandboxSpec};
use oka_cache::Cache;
use oka_controller::Clock;
use oka_controller::events::EventRecorder;
use oka_controller::podruntime::{
    PodOptions, PodRuntimeContext, PodRuntimeOptions, reconcile_pod_sandbox,
};
use oka_store::kubernetes::KubeStore;
use serde_json::{Value, json};

type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;
type Handle = tower_test::mock::Handle<Request<Body>, Response<ResponseBody>>;
type Responder = tower_test::mock::SendResponse<Response<ResponseBody>>;

const SANDBOX: &str = "/apis/agents.kruise.io/v1alpha1/namespaces/default/sandboxes/s1";
const PODS: &str = "/api/v1/namespaces/default/pods";
const POD: &str = "/api/v1/namespaces/default/pods/s1";
const CLAIMS: &str = "/api/v1/namespaces/default/persistentvolumeclaims";
const FIELD_MANAGER: (&str, &str) = ("fieldManager", "oka");

struct ApiServer(Handle);

struct Call {
    body: Value,
    respond: Responder,
}

impl ApiServer {
    async fn expect(&mut self, method: Method, path: &str, query: &[(&str, &str)]) -> Call {
        let next = tokio::time::timeout(Duration::from_secs(5), self.0.next_request());
        let (request, respond) = next
            .await
            .unwrap_or_else(|_| panic!("no {method} {path} within 5s"))
            .unwrap_or_else(|| panic!("the client went away before {method} {path}"));
        assert_eq!(request.method(), method, "method of {}", request.uri());
        assert_eq!(request.uri().path(), path, "path of {method} {}", request.uri());
        let mut got: Vec<(String, String)> = request
            .uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.to_owned(), v.to_owned())
            })
            .collect();
        let mut want: Vec<(String, String)> =
            query.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "query of {method} {}", request.uri());
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let body =
            if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
        Call { body, respond }
    }

    /// Asserts that no request is waiting.
    async fn quiet(&mut self) {
        let next = tokio::time::timeout(Duration::from_millis(100), self.0.next_request()).await;
        assert!(
            next.is_err(),
            "an unexpected request: {:?}",
            next.ok().flatten().map(|r| r.0.uri().clone())
        );
    }
}

impl Call {
    fn reply(self, code: u16, body: Value) {
        let response = Response::builder()
            .status(code)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())).boxed_unsync())
            .unwrap();
        self.respond.send_response(response);
    }

    /// Answers with the body it got, stored at `rv` (what the API server does with a PUT).
    fn store(self, rv: &str) -> Value {
        let mut stored = self.body.clone();
        stored["metadata"]["resourceVersion"] = json!(rv);
        self.reply(200, stored.clone());
        stored
    }
}

fn template() -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some([("app".to_owned(), "demo".to_owned())].into()),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                image: Some("python:3.12".into()),
                command: Some(vec!["python".into(), "-m".into(), "http.server".into()]),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
    }
}

fn sandbox() -> Sandbox {
    let mut s = Sandbox::new(
        "s1",
        SandboxSpec {
            template: Some(template()),
            volume_claim_templates: Some(vec![PersistentVolumeClaimTemplate {
                metadata: ObjectMeta { name: Some("www".into()), ..ObjectMeta::default() },
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    ..PersistentVolumeClaimSpec::default()
                }),
                ..PersistentVolumeClaimTemplate::default()
            }]),
            ..SandboxSpec::default()
        },
    );
    s.metadata.namespace = Some("default".into());
    s.metadata.uid = Some("sbx-uid".into());
    s.metadata.generation = Some(1);
    s.metadata.resource_version = Some("1".into());
    s
}

/// The Pod as the kubelet runs it: scheduled, Running, Ready, with an IP.
fn running(created: &Value) -> Pod {
    let mut pod: Pod = serde_json::from_value(created.clone()).unwrap();
    // The kubelet's status write: a later version than the create's.
    let version = pod.metadata.resource_version.clone().unwrap_or_default();
    pod.metadata.resource_version = Some(format!("{version}1"));
    pod.spec.as_mut().unwrap().node_name = Some("worker-1".into());
    pod.status = Some(PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some("10.244.1.7".into()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..PodCondition::default()
        }]),
        ..PodStatus::default()
    });
    pod
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

#[tokio::test]
async fn a_sandbox_s_life_on_a_pod_in_requests() {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<ResponseBody>>();
    let store = KubeStore::new(kube::Client::new(service, "default"));
    let pods: Cache<Pod> = Cache::default();
    let options = PodRuntimeOptions {
        pods: PodOptions { envd_image: "oka-envd:test".into() },
        default_runtime: SandboxRuntime::Pod,
        initializer: None,
    };
    let now: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
    let ctx = Arc::new(PodRuntimeContext::new(
        store,
        pods.clone(),
        Cache::default(),
        Clock::from_fn(move || now),
        options,
        EventRecorder::disabled(),
    ));
    let mut api = ApiServer(handle);
    let reconcile = |s: Value| {
        let sandbox: Sandbox = serde_json::from_value(s).unwrap();
        tokio::spawn(reconcile_pod_sandbox(Arc::new(sandbox), Arc::clone(&ctx)))
    };

    // 1. Create: the finalizer, the status (Pending), the PVC, the Pod.
    let task = reconcile(serde_json::to_value(sandbox()).unwrap());
    let call = api.expect(Method::PUT, SANDBOX, &[FIELD_MANAGER]).await;
    assert_eq!(call.body["metadata"]["finalizers"], json!(["agents.kruise.io/sandbox"]));
    let hash = call.body["metadata"]["annotations"]["sandbox.agents.kruise.io/hash-immutable-part"]
        .clone();
    assert_eq!(hash.as_str().map(str::len), Some(9), "{hash}");
    assert_eq!(call.body["metadata"]["resourceVersion"], "1");
    call.store("2");
    let call = api.expect(Method::PUT, &format!("{SANDBOX}/status"), &[FIELD_MANAGER]).await;
    assert_eq!(call.body["status"]["phase"], "Pending");
    let revision = call.body["status"]["updateRevision"].as_str().unwrap().to_owned();
    assert_eq!(call.body["metadata"]["resourceVersion"], "2");
    call.store("3");
    let call = api.expect(Method::POST, CLAIMS, &[FIELD_MANAGER]).await;
    assert_eq!(call.body["metadata"]["name"], "www-s1");
    assert_eq!(call.body["metadata"]["ownerReferences"][0]["uid"], "sbx-uid");
    assert_eq!(call.body["spec"]["accessModes"], json!(["ReadWriteOnce"]));
    let claim = call.body.clone();
    call.reply(201, claim);
    let call = api.expect(Method::POST, PODS, &[FIELD_MANAGER]).await;
    let pod = &call.body;
    assert_eq!(pod["apiVersion"], "v1");
    assert_eq!(pod["kind"], "Pod");
    assert_eq!(pod["metadata"]["name"], "s1");
    assert_eq!(pod["metadata"]["labels"]["agents.kruise.io/created-by"], "sandbox");
    assert_eq!(pod["metadata"]["labels"]["pod-template-hash"], revision.as_str());
    assert_eq!(pod["metadata"]["labels"]["agents.kruise.io/sandbox-uid"], "sbx-uid");
    assert_eq!(pod["metadata"]["labels"]["app"], "demo");
    assert_eq!(pod["metadata"]["annotations"]["agents.kruise.io/created-by"], "sandbox");
    assert_eq!(
        pod["metadata"]["ownerReferences"],
        json!([{"apiVersion": "agents.kruise.io/v1alpha1", "kind": "Sandbox", "name": "s1",
                "uid": "sbx-uid", "controller": true, "blockOwnerDeletion": true}])
    );
    assert_eq!(pod["spec"]["initContainers"][0]["image"], "oka-envd:test");
    assert_eq!(
        pod["spec"]["containers"][0]["command"],
        json!(["/.oka/bin/oka-envd", "--init", "--", "python", "-m", "http.server"])
    );
    assert_eq!(
        pod["spec"]["volumes"],
        json!([{"name": "www", "persistentVolumeClaim": {"claimName": "www-s1"}},
               {"name": "oka-envd", "emptyDir": {}}])
    );
    let mut created = call.body.clone();
    created["metadata"]["uid"] = json!("pod-uid-1");
    created["metadata"]["resourceVersion"] = json!("100");
    call.reply(201, created.clone());
    task.await.unwrap().unwrap();
    api.quiet().await;

    // 2. The kubelet runs it: Running, Ready, sandboxIp and podInfo.
    pods.apply(Arc::new(running(&created)));
    let mut current = serde_json::to_value(sandbox()).unwrap();
    current["metadata"]["finalizers"] = json!(["agents.kruise.io/sandbox"]);
    current["metadata"]["annotations"] =
        json!({"sandbox.agents.kruise.io/hash-immutable-part": hash.clone()});
    current["metadata"]["resourceVersion"] = json!("3");
    current["status"] =
        json!({"phase": "Pending", "observedGeneration": 1, "updateRevision": revision});
    let task = reconcile(current.clone());
    let call = api.expect(Method::PUT, &format!("{SANDBOX}/status"), &[FIELD_MANAGER]).await;
    let status = call.body["status"].clone();
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["sandboxIp"], "10.244.1.7");
    assert_eq!(status["nodeName"], "worker-1");
    assert_eq!(
        status["podInfo"],
        json!({"podIP": "10.244.1.7", "nodeName": "worker-1", "podUID": "pod-uid-1"})
    );
    assert_eq!(condition(&status, "Ready")["status"], "True");
    assert_eq!(condition(&status, "Ready")["reason"], "PodReady");
    current = call.store("4");
    task.await.unwrap().unwrap();
    api.quiet().await;

    // 3. Pause: Paused (SandboxPaused False), then the Pod's DELETE (read first, uid-checked).
    current["spec"]["paused"] = json!(true);
    current["metadata"]["resourceVersion"] = json!("5");
    let task = reconcile(current.clone());
    let call = api.expect(Method::PUT, &format!("{SANDBOX}/status"), &[FIELD_MANAGER]).await;
    assert_eq!(call.body["status"]["phase"], "Paused");
    assert_eq!(condition(&call.body["status"], "SandboxPaused")["status"], "False");
    assert_eq!(condition(&call.body["status"], "Ready")["status"], "False");
    current = call.store("6");
    let call = api.expect(Method::GET, POD, &[]).await;
    call.reply(200, serde_json::to_value(running(&created)).unwrap());
    let call = api.expect(Method::DELETE, POD, &[]).await;
    assert_eq!(call.body["preconditions"]["uid"], "pod-uid-1");
    let mut deleting = serde_json::to_value(running(&created)).unwrap();
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    call.reply(200, deleting);
    task.await.unwrap().unwrap();
    api.quiet().await;

    // The Pod is gone: SandboxPaused=True/StopPauseSucceed.
    pods.delete(&running(&created));
    let task = reconcile(current.clone());
    let call = api.expect(Method::PUT, &format!("{SANDBOX}/status"), &[FIELD_MANAGER]).await;
    let paused = condition(&call.body["status"], "SandboxPaused").clone();
    assert_eq!(
        (paused["status"].as_str(), paused["reason"].as_str()),
        (Some("True"), Some("StopPauseSucceed"))
    );
    current = call.store("7");
    task.await.unwrap().unwrap();
    api.quiet().await;

    // 4. Resume: Resuming, the PVC kept (already there), the Pod POSTed again.
    current["spec"]["paused"] = json!(false);
    current["metadata"]["resourceVersion"] = json!("8");
    let task = reconcile(current.clone());
    let call = api.expect(Method::PUT, &format!("{SANDBOX}/status"), &[FIELD_MANAGER]).await;
    assert_eq!(call.body["status"]["phase"], "Resuming");
    assert_eq!(condition(&call.body["status"], "SandboxResumed")["reason"], "CreatePod");
    current = call.store("9");
    let call = api.expect(Method::POST, CLAIMS, &[FIELD_MANAGER]).await;
    call.reply(
        409,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "AlreadyExists",
               "message": "persistentvolumeclaims \"www-s1\" already exists", "code": 409,
               "details": {"name": "www-s1", "kind": "persistentvolumeclaims"}}),
    );
    let call = api.expect(Method::POST, PODS, &[FIELD_MANAGER]).await;
    assert_eq!(call.body["metadata"]["name"], "s1");
    assert_eq!(call.body["metadata"]["labels"]["pod-template-hash"], revision.as_str());
    let mut recreated = call.body.clone();
    recreated["metadata"]["uid"] = json!("pod-uid-2");
    recreated["metadata"]["resourceVersion"] = json!("200");
    call.reply(201, recreated.clone());
    task.await.unwrap().unwrap();
    api.quiet().await;

    // Running again once the new Pod runs.
    pods.apply(Arc::new(running(&recreated)));
    let task = reconcile(current.clone());
    let call = api.expect(Method::PUT, &format!("{SANDBOX}/status"), &[FIELD_MANAGER]).await;
    assert_eq!(call.body["status"]["phase"], "Running");
    assert_eq!(call.body["status"]["podInfo"]["podUID"], "pod-uid-2");
    assert!(
        call.body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["type"] != "SandboxPaused")
    );
    current = call.store("10");
    task.await.unwrap().unwrap();
    api.quiet().await;

    // 5. Deletion: the Pod is deleted, then the finalizer released.
    current["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    current["metadata"]["resourceVersion"] = json!("11");
    let task = reconcile(current.clone());
    let call = api.expect(Method::GET, POD, &[]).await;
    call.reply(200, serde_json::to_value(running(&recreated)).unwrap());
    let call = api.expect(Method::DELETE, POD, &[]).await;
    assert_eq!(call.body["preconditions"]["uid"], "pod-uid-2");
    call.reply(
        200,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}),
    );
    task.await.unwrap().unwrap();
    api.quiet().await;
    pods.delete(&running(&recreated));
    let task = reconcile(current.clone());
    let call = api.expect(Method::PUT, SANDBOX, &[FIELD_MANAGER]).await;
    assert_eq!(call.body["metadata"]["finalizers"], json!([]));
    call.store("12");
    task.await.unwrap().unwrap();
    api.quiet().await;
}
