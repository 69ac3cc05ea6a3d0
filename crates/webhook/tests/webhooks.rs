//! The webhooks as a cluster's API server calls them: `AdmissionReview`s built as
//! kube-apiserver 1.33 builds them, posted over TLS to the server the certificate controller
//! provisions, with a client that trusts only the CA it wrote to the Secret and checks the
//! Service's name `oka-webhook.sandbox-system.svc`.
//!
//! The API server is the store tests' real, CRD-only `apiextensions-apiserver`
//! (`crates/store/tests/support/apiserver.rs`) with oka's CRDs, where the rules read the
//! objects they need (SandboxUpdateOps, PoolAutoscalers, Sandboxes). It has no
//! `admissionregistration.k8s.io`, so the two webhook configuration kinds are **stand-in
//! CRDs** of the same group, version, names and scope (as the Lease stand-in), and the CA
//! injection is a real update of them; it cannot call webhooks itself, so the test posts the
//! reviews. It has no core API either: the Secret lives in an embedded oka store, through the
//! same `Store` trait the controller uses on a cluster.

// Test helpers panic on failure: in a test, a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../store/tests/support/apiserver.rs"]
mod apiserver;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use apiserver::ApiServer;
use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use oka_admission::{Admission, AdmissionError, FieldValidation, Operation};
use oka_kubeapi::tls::ReloadableCert;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::kubernetes::KubeStore;
use oka_store::{Preconditions, Store};
use oka_webhook::certs;
use oka_webhook::provision::{ProvisionOptions, Provisioner};
use oka_webhook::review::Settings;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NAMESPACE: &str = "sandbox-system";
const SERVICE: &str = "oka-webhook";
const SERVER_NAME: &str = "oka-webhook.sandbox-system.svc";
const SECRET: &str = "oka-webhook-certs";
const MUTATING: &str = "oka-mutating-webhook";
const VALIDATING: &str = "oka-validating-webhook";
const CONTROLLER: &str = "system:serviceaccount:sandbox-system:oka-controller";

/// A cluster-scoped stand-in CRD for a built-in `admissionregistration.k8s.io/v1` kind.
fn configuration_stand_in(kind: &str, plural: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{plural}.admissionregistration.k8s.io"),
            "annotations": {"api-approved.kubernetes.io": "unapproved, test stand-in for a built-in kind"},
        },
        "spec": {
            "group": "admissionregistration.k8s.io",
            "scope": "Cluster",
            "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind, "listKind": format!("{kind}List")},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "webhooks": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                }}},
            }],
        },
    }))
    .unwrap()
}

fn configuration_resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind))
}

/// A webhook of a configuration, as the deployment declares it.
fn webhook(name: &str, path: &str, service: &str) -> Value {
    json!({
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "clientConfig": {"service": {"namespace": NAMESPACE, "name": service, "path": path, "port": 443}},
    })
}

/// The webhook configurations' `caBundle`s of the webhooks pointing at our Service.
async fn ca_bundles(client: &kube::Client) -> Vec<String> {
    let mut bundles = Vec::new();
    for (kind, name) in
        [("MutatingWebhookConfiguration", MUTATING), ("ValidatingWebhookConfiguration", VALIDATING)]
    {
        let api = Api::<DynamicObject>::all_with(client.clone(), &configuration_resource(kind));
        let config = api.get(name).await.unwrap();
        for webhook in config.data["webhooks"].as_array().unwrap() {
            if webhook["clientConfig"]["service"]["name"] == SERVICE {
                bundles.push(
                    webhook["clientConfig"]["caBundle"].as_str().unwrap_or_default().to_owned(),
                );
            } else {
                assert!(
                    webhook["clientConfig"].get("caBundle").is_none(),
                    "another Service's webhook is left alone"
                );
            }
        }
    }
    bundles
}

async fn create_configurations(client: &kube::Client) {
    for (kind, name, hooks) in [
        (
            "MutatingWebhookConfiguration",
            MUTATING,
            vec![
                webhook("md-sbs.kb.io", "/default-sandboxset", SERVICE),
                webhook("md-sbt.kb.io", "/default-sandboxtemplate", SERVICE),
            ],
        ),
        (
            "ValidatingWebhookConfiguration",
            VALIDATING,
            vec![
                webhook("v-sbs.kb.io", "/validate-sandboxset", SERVICE),
                webhook("v-sbt.kb.io", "/validate-sandboxtemplate", SERVICE),
                webhook("v-suo.kb.io", "/validate-sandboxupdateops", SERVICE),
                webhook("v-pas.kb.io", "/validate-poolautoscaler", SERVICE),
                webhook("v-pod-delete.kb.io", "/validate-pod-delete", SERVICE),
                webhook("other.example.com", "/other", "someone-else"),
            ],
        ),
    ] {
        let resource = configuration_resource(kind);
        let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
        let mut object = DynamicObject::new(name, &resource);
        object.data = json!({"webhooks": hooks});
        api.create(&PostParams::default(), &object).await.unwrap();
    }
}

/// An `AdmissionReview` exactly as kube-apiserver 1.33 sends it for `operation` on
/// `resource` (`sandboxsets`, `pods`, ...) in `default`, by `user`.
fn review(resource: &str, operation: &str, object: Value, old: Value, user: &str) -> Value {
    let (group, version, kind) = match resource {
        "pods" => ("", "v1", "Pod"),
        "sandboxsets" => ("agents.kruise.io", "v1alpha1", "SandboxSet"),
        "sandboxtemplates" => ("agents.kruise.io", "v1alpha1", "SandboxTemplate"),
        "sandboxupdateops" => ("agents.kruise.io", "v1alpha1", "SandboxUpdateOps"),
        "poolautoscalers" => ("agents.kruise.io", "v1alpha1", "PoolAutoscaler"),
        other => panic!("no such resource {other}"),
    };
    let named = if object.is_object() { &object } else { &old };
    let options = match operation {
        "CREATE" => {
            json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl-client-side-apply", "fieldValidation": "Strict"})
        }
        "UPDATE" => {
            json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl-edit", "fieldValidation": "Strict"})
        }
        _ => {
            json!({"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", "propagationPolicy": "Background"})
        }
    };
    json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": uuid(),
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": resource},
            "name": named["metadata"]["name"],
            "namespace": "default",
            "operation": operation,
            "userInfo": {
                "username": user,
                "uid": "a6b3c1d2-0000-4000-8000-000000000001",
                "groups": ["system:authenticated"],
                "extra": {"authentication.kubernetes.io/credential-id": ["X509SHA256=4f1c"]},
            },
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": options,
        },
    })
}

fn uuid() -> String {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("705ab4f5-6393-11e8-b7cc-{:012x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A TLS client trusting only `ca_pem`, checking `SERVER_NAME`.
fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap()).unwrap();
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// The TLS connection to the webhook server, as the API server opens it.
async fn connect(
    port: u16,
    ca_pem: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    connect_as(port, ca_pem, SERVER_NAME).await
}

/// A TLS connection that expects the server to be `name`.
async fn connect_as(
    port: u16,
    ca_pem: &str,
    name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let connector = tokio_rustls::TlsConnector::from(client_config(ca_pem));
    connector.connect(ServerName::try_from(name.to_owned()).unwrap(), tcp).await
}

/// Posts `review` to `path`; the answer's HTTP status and body.
async fn post(port: u16, ca_pem: &str, path: &str, review: &Value) -> (u16, Value) {
    let mut tls = connect(port, ca_pem).await.unwrap();
    let body = review.to_string();
    let head = format!(
        "POST {path}?timeout=10s HTTP/1.1\r\nHost: {SERVER_NAME}:443\r\nUser-Agent: kube-apiserver-admission\r\n\
         Content-Type: application/json\r\nAccept: application/json, */*\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(body.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let text = String::from_utf8(answer).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// The answer's JSON patch applied to `object`.
fn patched(object: &Value, answer: &Value) -> Value {
    assert_eq!(answer["response"]["patchType"], "JSONPatch", "{answer}");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(answer["response"]["patch"].as_str().unwrap())
        .unwrap();
    let mut object = object.clone();
    oka_kubeapi::json_patch::apply(&mut object, &serde_json::from_slice(&patch).unwrap()).unwrap();
    object
}

/// The object as the API server hands it to the webhooks: pruned and defaulted by its
/// schema (a dry-run create returns it).
async fn as_sent(client: &kube::Client, plural: &str, kind: &str, object: &Value) -> Value {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("agents.kruise.io", "v1alpha1", kind),
        plural,
    );
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), "default", &resource);
    let object: DynamicObject = serde_json::from_value(object.clone()).unwrap();
    let created =
        api.create(&PostParams { dry_run: true, ..PostParams::default() }, &object).await.unwrap();
    let mut value = serde_json::to_value(created).unwrap();
    // What the API server adds on create (uid, creationTimestamp, ...), not the client's.
    value["metadata"] = object_meta(object_meta_of(&value));
    value
}

fn object_meta_of(value: &Value) -> Value {
    value["metadata"].clone()
}

fn object_meta(meta: Value) -> Value {
    json!({"name": meta["name"], "namespace": meta["namespace"]})
}

/// The secret's bundle in `store`, when there is one.
async fn secret_bundle(store: &EmbeddedStore) -> Option<certs::CertBundle> {
    let secret = store.get::<Secret>(NAMESPACE, SECRET).await.ok()?;
    certs::CertBundle::from_secret_data(secret.data.as_ref()?)
}

async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_servers_reviews_are_answered_over_tls_with_the_generated_ca() {
    let mut crds = oka_api::crds();
    crds.push(configuration_stand_in(
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
    ));
    crds.push(configuration_stand_in(
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
    ));
    let _ = tracing_subscriber::fmt()
        .with_env_filter("oka_webhook=debug")
        .with_test_writer()
        .try_init();
    let Some(server) = ApiServer::start(&crds).await else { return };
    let client = server.client().await;
    let kube_store = KubeStore::new(client.clone());
    create_configurations(&client).await;
    let dir = tempfile::tempdir().unwrap();
    let secrets =
        EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default()).unwrap();

    // Two replicas, as the Deployment runs them: one writes the Secret, both serve it.
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let cert = Arc::new(ReloadableCert::default());
        let provisioner = Provisioner::new(
            secrets.clone(),
            client.clone(),
            ProvisionOptions {
                namespace: NAMESPACE.into(),
                secret_name: SECRET.into(),
                service_name: SERVICE.into(),
                mutating_configuration: MUTATING.into(),
                validating_configuration: VALIDATING.into(),
                // Longer than the test: every change below is followed through the watches.
                resync: Duration::from_secs(3600),
            },
            Arc::clone(&cert),
        );
        let ready = provisioner.ready();
        tokio::spawn(provisioner.run(std::future::pending()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let settings = Settings { allowed_pod_deleters: [CONTROLLER.to_owned()].into() };
        let router = oka_webhook::server::router(
            kube_store.clone(),
            settings,
            oka_webhook::metrics::AdmissionMetrics::default(),
        );
        tokio::spawn(oka_webhook::server::serve(listener, cert, router, std::future::pending()));
        replicas.push((port, ready));
    }
    for (_, ready) in &replicas {
        eventually("the replicas to be ready", async || ready.load(Ordering::SeqCst).then_some(()))
            .await;
    }
    let bundle = secret_bundle(&secrets).await.expect("the Secret was written");
    let ca = bundle.ca_cert.clone();
    let expected_bundle = base64::engine::general_purpose::STANDARD.encode(&ca);
    let bundles = ca_bundles(&client).await;
    assert_eq!(bundles.len(), 7);
    assert!(
        bundles.iter().all(|b| *b == expected_bundle),
        "the CA is in every webhook of the Service"
    );
    let port = replicas[0].0;
    for (other, _) in &replicas {
        connect(*other, &ca).await.expect("every replica serves the Secret's certificate");
        connect_as(*other, &ca, "oka-webhook.sandbox-system.svc.cluster.local").await.unwrap();
        assert!(
            connect_as(*other, &ca, "oka-webhook.elsewhere.svc").await.is_err(),
            "the certificate is for the Service's names only"
        );
    }

    // A valid SandboxSet: allowed, with the defaults as a JSON patch, which give what
    // `oka serve`'s API stores for the same object.
    let pool = json!({"apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxSet",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 2, "template": {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "main", "image": "nginx:1.27", "ports": [{"containerPort": 80}],
                "readinessProbe": {"httpGet": {"path": "/", "port": 80}}}]}}}});
    let sent = as_sent(&client, "sandboxsets", "SandboxSet", &pool).await;
    let (status, answer) = post(
        port,
        &ca,
        "/default-sandboxset",
        &review("sandboxsets", "CREATE", sent.clone(), Value::Null, "admin"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["response"]["allowed"], true);
    let defaulted = patched(&sent, &answer);
    let mut stored_by_oka = pool.clone();
    Admission::new()
        .admit("SandboxSet", Operation::Create, &mut stored_by_oka, None, FieldValidation::Strict)
        .unwrap();
    assert_eq!(defaulted["spec"], stored_by_oka["spec"]);
    let (_, validated) = post(
        port,
        &ca,
        "/validate-sandboxset",
        &review("sandboxsets", "CREATE", defaulted.clone(), Value::Null, "admin"),
    )
    .await;
    assert_eq!(validated["response"]["allowed"], true, "{validated}");
    let (_, again) = post(
        port,
        &ca,
        "/default-sandboxset",
        &review("sandboxsets", "UPDATE", defaulted.clone(), defaulted, "admin"),
    )
    .await;
    assert!(again["response"].get("patch").is_none(), "a defaulted pool needs no patch");

    // An invalid one: denied with the reference's message; the API server's prefix, added
    // to it, gives what `oka serve` answers.
    let mut invalid = pool.clone();
    invalid["spec"]["templateRef"] = json!({"name": "other"});
    let sent = as_sent(&client, "sandboxsets", "SandboxSet", &invalid).await;
    let request = review("sandboxsets", "CREATE", sent, Value::Null, "admin");
    let (status, answer) = post(port, &ca, "/validate-sandboxset", &request).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["uid"], request["request"]["uid"]);
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["status"]["code"], 422);
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert_eq!(
        message,
        "spec.templateRef: Forbidden: template and templateRef are mutually exclusive"
    );
    let mut by_oka = invalid.clone();
    let Err(AdmissionError::Denied(denial)) = Admission::new().admit(
        "SandboxSet",
        Operation::Create,
        &mut by_oka,
        None,
        FieldValidation::Strict,
    ) else {
        panic!("oka serve denies it too")
    };
    assert_eq!(
        format!("admission webhook \"v-sbs.kb.io\" denied the request: {message}"),
        denial.message()
    );

    // A SandboxTemplate create: defaulted, and valid.
    let template = json!({"apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxTemplate",
        "metadata": {"name": "tpl", "namespace": "default"},
        "spec": {"template": {"spec": {"containers": [{"name": "main", "image": "python:3.12"}]}}}});
    let sent = as_sent(&client, "sandboxtemplates", "SandboxTemplate", &template).await;
    let (_, answer) = post(
        port,
        &ca,
        "/default-sandboxtemplate",
        &review("sandboxtemplates", "CREATE", sent.clone(), Value::Null, "admin"),
    )
    .await;
    let defaulted = patched(&sent, &answer);
    assert_eq!(defaulted["spec"]["template"]["spec"]["automountServiceAccountToken"], false);
    // The reference sets `Always` on regular containers before Kubernetes looks at the tag.
    assert_eq!(defaulted["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"], "Always");
    let (_, answer) = post(
        port,
        &ca,
        "/validate-sandboxtemplate",
        &review("sandboxtemplates", "CREATE", defaulted, Value::Null, "admin"),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true);

    // A SandboxUpdateOps: a second one while the first runs, and a change of the first's
    // immutable selector, are denied.
    let ops = |name: &str| {
        json!({"apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxUpdateOps",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "patch": {"spec": {"containers": [{"name": "main", "image": "nginx:1.28"}]}}}})
    };
    let first: oka_api::SandboxUpdateOps = serde_json::from_value(ops("first")).unwrap();
    let first = kube_store.create("default", &first).await.unwrap();
    let first = serde_json::to_value(first).unwrap();
    let (_, answer) = post(
        port,
        &ca,
        "/validate-sandboxupdateops",
        &review("sandboxupdateops", "CREATE", ops("second"), Value::Null, "admin"),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(
        answer["response"]["status"]["message"],
        "spec: Forbidden: there is an active SandboxUpdateOps in the same namespace: first"
    );
    let mut changed = first.clone();
    changed["spec"]["selector"] = json!({"matchLabels": {"app": "api"}});
    let (_, answer) = post(
        port,
        &ca,
        "/validate-sandboxupdateops",
        &review("sandboxupdateops", "UPDATE", changed, first.clone(), "admin"),
    )
    .await;
    assert_eq!(answer["response"]["status"]["code"], 422);
    assert_eq!(
        answer["response"]["status"]["message"],
        "spec.selector: Forbidden: selector is immutable"
    );

    // A second PoolAutoscaler for the same pool.
    let autoscaler = |name: &str| {
        json!({"apiVersion": "agents.kruise.io/v1alpha1", "kind": "PoolAutoscaler",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"scaleTargetRef": {"apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxSet", "name": "web"}, "minReplicas": 1, "maxReplicas": 5}})
    };
    let (_, answer) = post(
        port,
        &ca,
        "/validate-poolautoscaler",
        &review("poolautoscalers", "CREATE", autoscaler("one"), Value::Null, "admin"),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let one: oka_api::PoolAutoscaler = serde_json::from_value(autoscaler("one")).unwrap();
    kube_store.create("default", &one).await.unwrap();
    let (_, answer) = post(
        port,
        &ca,
        "/validate-poolautoscaler",
        &review("poolautoscalers", "CREATE", autoscaler("two"), Value::Null, "admin"),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(
        answer["response"]["status"]["message"],
        "spec.scaleTargetRef.name: Invalid value: \"web\": PoolAutoscaler one already targets this SandboxSet"
    );

    // The pod of a live sandbox: deleted only by the controller, or once the sandbox goes.
    let sandbox: oka_api::Sandbox = serde_json::from_value(
        json!({"apiVersion": "agents.kruise.io/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": "sbx-1", "namespace": "default"},
        "spec": {"template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}}}),
    )
    .unwrap();
    let sandbox = kube_store.create("default", &sandbox).await.unwrap();
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sbx-1", "namespace": "default", "uid": "p-1",
            "labels": {"agents.kruise.io/created-by": "sandbox"},
            "ownerReferences": [{"apiVersion": "agents.kruise.io/v1alpha1", "kind": "Sandbox", "name": "sbx-1",
                "uid": sandbox.metadata.uid.clone().unwrap(), "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}});
    let (_, answer) = post(
        port,
        &ca,
        "/validate-pod-delete",
        &review("pods", "DELETE", Value::Null, pod.clone(), "alice"),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["status"]["code"], 403);
    assert_eq!(
        answer["response"]["status"]["message"],
        "cannot delete/evict pod default/sbx-1: corresponding sandbox exists. Please delete the sandbox instead"
    );
    let (_, answer) = post(
        port,
        &ca,
        "/validate-pod-delete",
        &review("pods", "DELETE", Value::Null, pod.clone(), CONTROLLER),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true, "the controller deletes its pods");
    kube_store
        .delete::<oka_api::Sandbox>("default", "sbx-1", &Preconditions::default())
        .await
        .unwrap();
    let (_, answer) = post(
        port,
        &ca,
        "/validate-pod-delete",
        &review("pods", "DELETE", Value::Null, pod, "alice"),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true, "the sandbox is gone");

    // A body that is not a review.
    let (status, _) =
        post(port, &ca, "/validate-sandboxset", &json!({"kind": "AdmissionReview"})).await;
    assert_eq!(status, 400);

    // `helm upgrade` resets a caBundle: the next resync writes it again.
    let validating = Api::<DynamicObject>::all_with(
        client.clone(),
        &configuration_resource("ValidatingWebhookConfiguration"),
    );
    let mut config = validating.get(VALIDATING).await.unwrap();
    config.data["webhooks"][0]["clientConfig"].as_object_mut().unwrap().remove("caBundle");
    validating.replace(VALIDATING, &PostParams::default(), &config).await.unwrap();
    eventually("the caBundle to be written again", async || {
        ca_bundles(&client).await.iter().all(|b| *b == expected_bundle).then_some(())
    })
    .await;

    // Rotation: the Secret is deleted; a new CA and certificate are made, served by every
    // replica and injected.
    secrets.delete::<Secret>(NAMESPACE, SECRET, &Preconditions::default()).await.unwrap();
    let rotated = eventually("a new Secret", async || {
        secret_bundle(&secrets).await.filter(|b| b.ca_cert != ca)
    })
    .await;
    let new_bundle = base64::engine::general_purpose::STANDARD.encode(&rotated.ca_cert);
    eventually("the new CA in the configurations", async || {
        ca_bundles(&client).await.iter().all(|b| *b == new_bundle).then_some(())
    })
    .await;
    for (port, _) in &replicas {
        let port = *port;
        eventually("the new certificate to be served", async || {
            connect(port, &rotated.ca_cert).await.ok().map(|_| ())
        })
        .await;
        assert!(connect(port, &ca).await.is_err(), "the old CA no longer verifies the server");
    }
    let (_, answer) = post(
        port,
        &rotated.ca_cert,
        "/validate-sandboxset",
        &review("sandboxsets", "CREATE", pool, Value::Null, "admin"),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true);

    // A certificate that expires within six months is replaced in place (an update of the
    // Secret, which the other replica may race).
    let today = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC).date();
    let names = certs::service_names(SERVICE, NAMESPACE);
    let soon = today.checked_add(jiff::Span::new().days(30)).unwrap();
    let (ca, server) = oka_kubeapi::tls::issue_ca_and_server("expiring", &names, soon).unwrap();
    let expiring =
        certs::CertBundle { ca_cert: ca.cert, ca_key: ca.key, cert: server.cert, key: server.key };
    let mut secret = secrets.get::<Secret>(NAMESPACE, SECRET).await.unwrap();
    secret.data = Some(expiring.to_secret_data());
    secrets.update(NAMESPACE, &secret).await.unwrap();
    let renewed = eventually("the expiring certificate to be replaced", async || {
        secret_bundle(&secrets).await.filter(|b| b.ca_cert != expiring.ca_cert)
    })
    .await;
    renewed.check(&names, std::time::SystemTime::now()).unwrap();
    eventually("the renewed certificate to be served", async || {
        connect(port, &renewed.ca_cert).await.ok().map(|_| ())
    })
    .await;
}
