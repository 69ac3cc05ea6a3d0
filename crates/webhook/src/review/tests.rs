//! Unit tests of the review handling, with reviews shaped as kube-apiserver 1.33 sends them.

use base64::Engine as _;
use serde_json::{Value, json};

use super::*;

const CONTROLLER: &str = "system:serviceaccount:sandbox-system:oka-controller";

/// An `AdmissionReview` as the API server builds it for `operation` on `resource`.
fn review(resource: &str, operation: &str, object: Value, old: Value) -> Value {
    let (group, version, kind) = match resource {
        "pods" | "pods/eviction" => ("", "v1", "Pod"),
        "sandboxsets" => ("agents.kruise.io", "v1alpha1", "SandboxSet"),
        "sandboxtemplates" => ("agents.kruise.io", "v1alpha1", "SandboxTemplate"),
        "sandboxupdateops" => ("agents.kruise.io", "v1alpha1", "SandboxUpdateOps"),
        _ => ("agents.kruise.io", "v1alpha1", "PoolAutoscaler"),
    };
    let (resource, sub) = resource.split_once('/').unwrap_or((resource, ""));
    let named = if object.is_object() { &object } else { &old };
    let options = match operation {
        "CREATE" => json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}),
        "UPDATE" => json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}),
        _ => {
            json!({"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", "propagationPolicy": "Background"})
        }
    };
    let mut request = json!({
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": kind},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "name": named.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
        "namespace": "default",
        "operation": operation,
        "userInfo": {"username": "admin", "uid": "014fbff9a07c", "groups": ["system:authenticated"]},
        "object": object,
        "oldObject": old,
        "dryRun": false,
        "options": options,
    });
    if !sub.is_empty() {
        request["subResource"] = Value::from(sub);
        request["requestSubResource"] = Value::from(sub);
        request["kind"] = json!({"group": "policy", "version": "v1", "kind": "Eviction"});
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

fn settings() -> Settings {
    Settings { allowed_pod_deleters: [CONTROLLER.to_owned()].into() }
}

fn run(path: WebhookPath, body: &Value, facts: &Facts) -> Value {
    let review = Review::parse(body).unwrap();
    answer(path, &review, facts, &settings())
}

fn pool(spec: Value) -> Value {
    json!({"apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxSet",
           "metadata": {"name": "p", "namespace": "default"}, "spec": spec})
}

#[test]
fn a_mutating_answer_is_a_json_patch_only_when_something_changed() {
    let object = pool(
        json!({"replicas": 1, "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1"}]}}}),
    );
    let answer = run(
        WebhookPath::DefaultSandboxSet,
        &review("sandboxsets", "CREATE", object.clone(), Value::Null),
        &Facts::default(),
    );
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(answer["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch: Value = serde_json::from_slice(&patch).unwrap();
    let mut patched = object.clone();
    oka_kubeapi::json_patch::apply(&mut patched, &patch).unwrap();
    let mut expected = object;
    oka_admission::mutating::mutate("SandboxSet", Operation::Create, &mut expected);
    assert_eq!(patched, expected);

    // The defaulted object again: nothing to patch.
    let again = run(
        WebhookPath::DefaultSandboxSet,
        &review("sandboxsets", "UPDATE", patched.clone(), patched),
        &Facts::default(),
    );
    assert_eq!(again["response"]["allowed"], true);
    assert!(again["response"].get("patch").is_none());
    assert!(again["response"].get("patchType").is_none());
}

#[test]
fn a_sandbox_template_is_defaulted_on_create_only() {
    let template = json!({"apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxTemplate",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"template": {"spec": {"containers": [{"name": "a", "image": "i"}]}}}});
    let created = run(
        WebhookPath::DefaultSandboxTemplate,
        &review("sandboxtemplates", "CREATE", template.clone(), Value::Null),
        &Facts::default(),
    );
    assert_eq!(created["response"]["patchType"], "JSONPatch");
    let updated = run(
        WebhookPath::DefaultSandboxTemplate,
        &review("sandboxtemplates", "UPDATE", template.clone(), template),
        &Facts::default(),
    );
    assert!(updated["response"].get("patch").is_none());
}

#[test]
fn a_denial_carries_422_and_the_field_errors_without_the_api_servers_prefix() {
    let object = pool(json!({"replicas": -1, "templateRef": {"name": "t"}}));
    let answer = run(
        WebhookPath::ValidateSandboxSet,
        &review("sandboxsets", "CREATE", object, Value::Null),
        &Facts::default(),
    );
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(
        answer["response"]["status"],
        json!({"metadata": {}, "code": 422, "message": "spec.replicas: Invalid value: -1: replicas cannot be negative"})
    );
    let good = pool(json!({"replicas": 1, "templateRef": {"name": "t"}}));
    let allowed = run(
        WebhookPath::ValidateSandboxSet,
        &review("sandboxsets", "CREATE", good, Value::Null),
        &Facts::default(),
    );
    assert_eq!(allowed["response"]["allowed"], true);
    assert!(allowed["response"].get("warnings").is_none());
}

#[test]
fn warnings_reach_the_answer() {
    let object = pool(json!({"replicas": 1,
        "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
        "volumeClaimTemplates": [{"metadata": {"name": "www"}}]}));
    let answer = run(
        WebhookPath::ValidateSandboxSet,
        &review("sandboxsets", "UPDATE", object.clone(), object),
        &Facts::default(),
    );
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(
        answer["response"]["warnings"][0].as_str().unwrap().split(':').next(),
        Some("spec.volumeClaimTemplates[0].metadata.name")
    );
}

#[test]
fn update_ops_keep_their_selector_and_one_runs_per_namespace() {
    let ops = json!({"apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxUpdateOps",
        "metadata": {"name": "u", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}}});
    let body = review("sandboxupdateops", "CREATE", ops.clone(), Value::Null);
    let parsed = Review::parse(&body).unwrap();
    assert_eq!(
        lookups(WebhookPath::ValidateSandboxUpdateOps, &parsed, &settings()),
        [Lookup::UpdateOps { namespace: "default".into() }]
    );
    let active = Facts {
        update_ops: vec![json!({"metadata": {"name": "v"}, "status": {"phase": "Updating"}})],
        ..Facts::default()
    };
    let denied = run(WebhookPath::ValidateSandboxUpdateOps, &body, &active);
    assert_eq!(
        denied["response"]["status"]["message"],
        "spec: Forbidden: there is an active SandboxUpdateOps in the same namespace: v"
    );
    assert_eq!(
        run(WebhookPath::ValidateSandboxUpdateOps, &body, &Facts::default())["response"]["allowed"],
        true
    );

    let mut changed = ops.clone();
    changed["spec"]["selector"] = json!({"matchLabels": {"a": "c"}});
    let update = review("sandboxupdateops", "UPDATE", changed, ops);
    let parsed = Review::parse(&update).unwrap();
    assert!(
        lookups(WebhookPath::ValidateSandboxUpdateOps, &parsed, &settings()).is_empty(),
        "an update reads no other"
    );
    let denied = run(WebhookPath::ValidateSandboxUpdateOps, &update, &Facts::default());
    assert_eq!(denied["response"]["status"]["code"], 422);
    assert_eq!(
        denied["response"]["status"]["message"],
        "spec.selector: Forbidden: selector is immutable"
    );
}

#[test]
fn one_pool_autoscaler_per_sandbox_set() {
    let pas = |name: &str| {
        json!({"apiVersion": "agents.kruise.io/v1alpha1", "kind": "PoolAutoscaler",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"scaleTargetRef": {"name": "pool"}, "minReplicas": 0, "maxReplicas": 3}})
    };
    let body = review("poolautoscalers", "CREATE", pas("second"), Value::Null);
    let facts = Facts { pool_autoscalers: vec![pas("first")], ..Facts::default() };
    let denied = run(WebhookPath::ValidatePoolAutoscaler, &body, &facts);
    assert_eq!(
        denied["response"]["status"]["message"],
        "spec.scaleTargetRef.name: Invalid value: \"pool\": PoolAutoscaler first already targets this SandboxSet"
    );
    let alone = Facts { pool_autoscalers: vec![pas("second")], ..Facts::default() };
    assert_eq!(
        run(WebhookPath::ValidatePoolAutoscaler, &body, &alone)["response"]["allowed"],
        true
    );
}

fn sandbox_pod(deleting: bool) -> Value {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sbx", "namespace": "default",
            "labels": {"agents.kruise.io/created-by": "sandbox"},
            "ownerReferences": [{"apiVersion": "agents.kruise.io/v1alpha1", "kind": "Sandbox", "name": "sbx", "uid": "u-1", "controller": true}]},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}});
    if deleting {
        pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    pod
}

fn sandbox(uid: &str, deleting: bool) -> Value {
    let mut sandbox = json!({"metadata": {"name": "sbx", "namespace": "default", "uid": uid}});
    if deleting {
        sandbox["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    sandbox
}

#[test]
fn a_pod_of_a_live_sandbox_is_deleted_only_through_it() {
    let delete = review("pods", "DELETE", Value::Null, sandbox_pod(false));
    let parsed = Review::parse(&delete).unwrap();
    assert_eq!(
        lookups(WebhookPath::ValidatePodDelete, &parsed, &settings()),
        [Lookup::Sandbox { namespace: "default".into(), name: "sbx".into() }]
    );
    let live = Facts { sandbox: Some(sandbox("u-1", false)), ..Facts::default() };
    let denied = run(WebhookPath::ValidatePodDelete, &delete, &live);
    assert_eq!(
        denied["response"]["status"],
        json!({"metadata": {}, "code": 403, "reason": "Forbidden",
               "message": "cannot delete/evict pod default/sbx: corresponding sandbox exists. Please delete the sandbox instead"})
    );
    let allowed = |body: &Value, facts: &Facts| {
        run(WebhookPath::ValidatePodDelete, body, facts)["response"]["allowed"] == true
    };
    assert!(allowed(&delete, &Facts::default()), "no sandbox");
    assert!(
        allowed(&delete, &Facts { sandbox: Some(sandbox("u-2", false)), ..Facts::default() }),
        "another sandbox of the name"
    );
    assert!(
        allowed(&delete, &Facts { sandbox: Some(sandbox("u-1", true)), ..Facts::default() }),
        "the sandbox is going"
    );
    assert!(
        allowed(&review("pods", "DELETE", Value::Null, sandbox_pod(true)), &live),
        "the pod is going"
    );
    let mut foreign = sandbox_pod(false);
    foreign["metadata"]["labels"] = json!({});
    assert!(allowed(&review("pods", "DELETE", Value::Null, foreign), &live), "not a sandbox's pod");

    let mut by_controller = delete.clone();
    by_controller["request"]["userInfo"]["username"] = Value::from(CONTROLLER);
    let parsed = Review::parse(&by_controller).unwrap();
    assert!(lookups(WebhookPath::ValidatePodDelete, &parsed, &settings()).is_empty());
    assert!(allowed(&by_controller, &live), "the controller itself");
}

#[test]
fn an_eviction_reads_the_pod_it_names() {
    let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "sbx", "namespace": "default"}});
    let body = review("pods/eviction", "CREATE", eviction, Value::Null);
    let parsed = Review::parse(&body).unwrap();
    assert_eq!(
        lookups(WebhookPath::ValidatePodDelete, &parsed, &settings()),
        [
            Lookup::Pod { namespace: "default".into(), name: "sbx".into() },
            Lookup::Sandbox { namespace: "default".into(), name: "sbx".into() }
        ]
    );
    let live = Facts {
        pod: Some(sandbox_pod(false)),
        sandbox: Some(sandbox("u-1", false)),
        ..Facts::default()
    };
    assert_eq!(
        run(WebhookPath::ValidatePodDelete, &body, &live)["response"]["status"]["code"],
        403
    );
    let gone = Facts { sandbox: Some(sandbox("u-1", false)), ..Facts::default() };
    assert_eq!(run(WebhookPath::ValidatePodDelete, &body, &gone)["response"]["allowed"], true);
}

#[test]
fn the_review_is_echoed_and_a_body_without_uid_is_refused() {
    let mut body = review(
        "sandboxsets",
        "CREATE",
        pool(json!({"replicas": 1, "templateRef": {"name": "t"}})),
        Value::Null,
    );
    body["apiVersion"] = Value::from("admission.k8s.io/v1beta1");
    body["request"]["dryRun"] = Value::Bool(true);
    let answer = run(WebhookPath::ValidateSandboxSet, &body, &Facts::default());
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(Review::parse(&json!({"request": {}})), Err(NotAReview("no request.uid")));
    assert_eq!(Review::parse(&json!({})), Err(NotAReview("no request")));
    assert_eq!(WebhookPath::parse("/validate-pod-delete"), Some(WebhookPath::ValidatePodDelete));
    assert_eq!(WebhookPath::parse("/nope"), None);
}
