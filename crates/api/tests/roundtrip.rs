//! Test B: every sample object survives a trip through the typed kinds.
//!
//! Each document of `tests/reference/samples/*.yaml` (the reference's samples) and
//! `tests/fixtures/*.yaml` (oka extensions and fully populated objects) is deserialized into its
//! typed kind and serialized back. The result must equal the input plus exactly what the API
//! server would add — the `default:`s of our generated CRD schema, applied with structural
//! defaulting — and nothing else, except the normalizations listed in [`NORMALIZATIONS`], each
//! pinned to one JSON pointer of one object.
//!
//! This also proves that serde applies the same defaults as the CRD schema: a default missing on
//! either side shows up as a difference. [`every_schema_default_is_exercised`] makes sure the
//! fixtures leave out every defaulted field at least once.

// Test code: a panic is how a helper reports a broken fixture.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use oka_api::{
    Checkpoint, PoolAutoscaler, Sandbox, SandboxClaim, SandboxSet, SandboxTemplate,
    SandboxUpdateOps,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use common::{
    apply_defaults, json_diff, our_crds, root_schema, walk_schema, yaml_documents, yaml_files,
};

/// What a typed sub-object legitimately changes, and why. (file, object name, JSON pointer,
/// value after the round trip or `None` when the field is dropped.)
const NORMALIZATIONS: &[(&str, &str, &str, Option<&str>, &str)] = &[
    // `ImagePullPolicy` (capital I) is a typo in the reference sample, not a Container field.
    // The API server keeps it (spec.template is schemaless), but every typed reader drops it:
    // the reference's Go controller decodes the template into corev1.PodTemplateSpec with the
    // case-sensitive Kubernetes JSON decoder, and so do we with k8s-openapi's PodTemplateSpec.
    (
        "sandboxset-code-interpreter.yaml",
        "code-interpreter",
        "/spec/template/spec/containers/0/ImagePullPolicy",
        None,
        "unknown Container field",
    ),
    // `cpu: 1` is a YAML integer. resource.Quantity always serializes as a string (Go's
    // Quantity.MarshalJSON, k8s-openapi's Quantity), so the typed round trip writes "1".
    (
        "sandboxset-code-interpreter.yaml",
        "code-interpreter",
        "/spec/template/spec/containers/0/resources/requests/cpu",
        Some("1"),
        "Quantity is a string",
    ),
    (
        "sandboxset-code-interpreter.yaml",
        "code-interpreter",
        "/spec/template/spec/containers/0/resources/limits/cpu",
        Some("1"),
        "Quantity is a string",
    ),
    (
        "sandboxset-desktop.yaml",
        "desktop",
        "/spec/template/spec/containers/0/resources/requests/cpu",
        Some("1"),
        "Quantity is a string",
    ),
    (
        "sandboxset-desktop.yaml",
        "desktop",
        "/spec/template/spec/containers/0/resources/limits/cpu",
        Some("1"),
        "Quantity is a string",
    ),
];

/// Deserializes into `K` and serializes back.
fn through<K: Serialize + DeserializeOwned>(doc: &Value) -> Result<Value, String> {
    let typed: K = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

fn round_trip(kind: &str, doc: &Value) -> Result<Value, String> {
    match kind {
        "Sandbox" => through::<Sandbox>(doc),
        "SandboxSet" => through::<SandboxSet>(doc),
        "SandboxClaim" => through::<SandboxClaim>(doc),
        "SandboxTemplate" => through::<SandboxTemplate>(doc),
        "SandboxUpdateOps" => through::<SandboxUpdateOps>(doc),
        "Checkpoint" => through::<Checkpoint>(doc),
        "PoolAutoscaler" => through::<PoolAutoscaler>(doc),
        "TrafficPolicy" => through::<oka_api::TrafficPolicy>(doc),
        "GlobalTrafficPolicy" => through::<oka_api::GlobalTrafficPolicy>(doc),
        other => Err(format!("no typed kind {other}")),
    }
}

struct Outcome {
    /// (kind, schema path) of every default the expectation had to add.
    defaults_applied: BTreeSet<(String, String)>,
    /// Normalizations that were used.
    normalizations_used: BTreeSet<usize>,
    failures: Vec<String>,
    objects: usize,
}

fn check_file(path: &Path, outcome: &mut Outcome) {
    let crds = our_crds();
    let file = path.file_name().unwrap().to_string_lossy().into_owned();
    for doc in yaml_documents(path) {
        outcome.objects += 1;
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        let name = doc["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let what = format!("{file} {kind}/{name}");
        assert_eq!(doc["apiVersion"], "agents.kruise.io/v1alpha1", "{what}");

        let actual = match round_trip(&kind, &doc) {
            Ok(v) => v,
            Err(e) => {
                outcome.failures.push(format!("{what}: {e}"));
                continue;
            }
        };

        let mut expected = doc.clone();
        let Some(crd) = crds.get(&kind) else {
            outcome.failures.push(format!("{what}: no CRD"));
            continue;
        };
        for schema_path in apply_defaults(root_schema(crd), &mut expected) {
            outcome.defaults_applied.insert((kind.clone(), schema_path));
        }
        for (i, (n_file, n_name, pointer, after, _why)) in NORMALIZATIONS.iter().enumerate() {
            if *n_file != file || *n_name != name {
                continue;
            }
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            let Some(parent) = expected.pointer_mut(parent).and_then(Value::as_object_mut) else {
                outcome.failures.push(format!("{what}: normalization target {pointer} not found"));
                continue;
            };
            if !parent.contains_key(key) {
                outcome.failures.push(format!("{what}: normalization target {pointer} not found"));
                continue;
            }
            match after {
                Some(v) => parent.insert(key.to_owned(), json!(v)),
                None => parent.remove(key),
            };
            outcome.normalizations_used.insert(i);
        }

        let diff = json_diff(&expected, &actual);
        if !diff.is_empty() {
            outcome.failures.push(format!("{what} (expected vs actual):\n  {}", diff.join("\n  ")));
        }
    }
}

fn run_all() -> Outcome {
    let mut outcome = Outcome {
        defaults_applied: BTreeSet::new(),
        normalizations_used: BTreeSet::new(),
        failures: Vec::new(),
        objects: 0,
    };
    for path in yaml_files("reference/samples").into_iter().chain(yaml_files("fixtures")) {
        check_file(&path, &mut outcome);
    }
    outcome
}

#[test]
fn samples_and_fixtures_round_trip() {
    let outcome = run_all();
    assert!(outcome.failures.is_empty(), "{}", outcome.failures.join("\n"));
    let unused: Vec<_> = (0..NORMALIZATIONS.len())
        .filter(|i| !outcome.normalizations_used.contains(i))
        .map(|i| NORMALIZATIONS[i])
        .collect();
    assert!(unused.is_empty(), "normalizations no longer needed: {unused:?}");
    // 4 reference samples + the fixtures.
    assert!(outcome.objects >= 4 + 3 + 4 + 1 + 7 + 4, "only {} objects checked", outcome.objects);
}

#[test]
fn every_schema_default_is_exercised() {
    let outcome = run_all();
    let mut missing = Vec::new();
    for (kind, crd) in our_crds() {
        walk_schema(root_schema(&crd), "", &mut |path, node| {
            if node.get("default").is_some()
                && !outcome.defaults_applied.contains(&(kind.clone(), path.to_owned()))
            {
                missing.push(format!("{kind}{path}"));
            }
        });
    }
    assert!(
        missing.is_empty(),
        "no fixture leaves these defaulted fields out:\n{}",
        missing.join("\n")
    );
}

/// The reference samples, typed: spot checks that values land in the right fields.
#[test]
fn reference_samples_read_as_expected() {
    let docs = yaml_documents(&common::tests_dir("reference/samples/sandboxclaim.yaml"));
    let claim: SandboxClaim = serde_json::from_value(docs[0].clone()).unwrap();
    assert_eq!(claim.spec.template_name, "python-pool");
    assert_eq!(claim.spec.replicas, 3);
    assert_eq!(claim.spec.claim_timeout(), Ok(std::time::Duration::from_secs(600)));
    assert_eq!(claim.spec.ttl_after_completed(), Ok(Some(std::time::Duration::from_secs(3600))));
    assert!(claim.spec.create_on_no_stock, "schema default true applies when absent");
    assert_eq!(claim.spec.wait_ready_timeout(), Ok(std::time::Duration::from_secs(30)));
    assert!(!claim.spec.skip_init_runtime);

    let docs = yaml_documents(&common::tests_dir("reference/samples/sandbox.yaml"));
    let sandbox: Sandbox = serde_json::from_value(docs[0].clone()).unwrap();
    let template = sandbox.spec.template.as_ref().unwrap();
    let pod = template.spec.as_ref().unwrap();
    assert_eq!(pod.containers[0].image.as_deref(), Some("nginx:latest"));
    let pvc = &sandbox.spec.volume_claim_templates.as_ref().unwrap()[0];
    assert_eq!(pvc.metadata.name.as_deref(), Some("www"));
    assert_eq!(pvc.spec.as_ref().unwrap().storage_class_name.as_deref(), Some("alicloud-disk-ssd"));

    let docs = yaml_documents(&common::tests_dir("reference/samples/sandboxset-desktop.yaml"));
    let set: SandboxSet = serde_json::from_value(docs[0].clone()).unwrap();
    assert_eq!(set.spec.replicas, 2);
    let init = &set
        .spec
        .template
        .as_ref()
        .unwrap()
        .spec
        .as_ref()
        .unwrap()
        .init_containers
        .as_ref()
        .unwrap()[0];
    assert_eq!(init.restart_policy.as_deref(), Some("Always"));
}

/// The extension fixtures, typed.
#[test]
fn extension_fixtures_read_as_expected() {
    use oka_api::probes::{ProbeHandler, ResumeScope, RuleConditionStatus};

    let docs = yaml_documents(&common::tests_dir("fixtures/probes.yaml"));
    let sandbox: Sandbox = serde_json::from_value(docs[0].clone()).unwrap();
    let probe = &sandbox.spec.probes.as_ref().unwrap()[0];
    assert!(matches!(probe.handler(), Ok(ProbeHandler::Activity(a)) if a.window_seconds == 300));
    assert_eq!((probe.period_seconds, probe.timeout_seconds, probe.failure_threshold), (15, 1, 3));
    assert_eq!(probe.condition_type(), "probe.agents.kruise.io/activity-detector");
    let policy = sandbox.spec.auto_pause_policy.as_ref().unwrap();
    assert_eq!(policy.pause.status, RuleConditionStatus::False);
    assert_eq!(policy.pause.for_seconds, 600);
    let resume = policy.resume.as_ref().unwrap();
    assert_eq!(
        (resume.status, resume.scope),
        (RuleConditionStatus::True, ResumeScope::PolicyPaused)
    );
    assert_eq!((policy.min_running_seconds, policy.min_paused_seconds), (120, 30));

    let set: SandboxSet = serde_json::from_value(docs[1].clone()).unwrap();
    let probes = set.spec.probes.as_ref().unwrap();
    assert!(!probes[0].is_external(), "exec runs inside the sandbox");
    assert!(probes[1].is_external(), "httpGet with a host is external");

    let docs = yaml_documents(&common::tests_dir("fixtures/reuse.yaml"));
    let sandbox: Sandbox = serde_json::from_value(docs[0].clone()).unwrap();
    assert_eq!(sandbox.reuse_count(), 2);
    assert!(sandbox.is_controlled_by_sandbox_set());
    let lifecycle = sandbox.spec.lifecycle.as_ref().unwrap();
    assert_eq!(lifecycle.pre_upgrade.as_ref().unwrap().timeout_seconds, 60);
    assert_eq!(lifecycle.post_upgrade.as_ref().unwrap().timeout_seconds, 120);

    let docs = yaml_documents(&common::tests_dir("fixtures/poolautoscalers.yaml"));
    let pa: PoolAutoscaler = serde_json::from_value(docs[0].clone()).unwrap();
    assert_eq!(pa.spec.scale_target_ref.api_version, "agents.kruise.io/v1alpha1");
    assert_eq!(pa.spec.cron_policies.as_ref().unwrap().len(), 3);
    let pa: PoolAutoscaler = serde_json::from_value(docs[2].clone()).unwrap();
    assert_eq!(pa.spec.min_replicas, 0);
    let capacity = pa.spec.capacity_policy.as_ref().unwrap();
    assert_eq!(
        (capacity.scale_up_window_seconds(), capacity.scale_down_window_seconds()),
        (0, 300)
    );
}

/// An unknown phase written by someone else survives a round trip unchanged.
#[test]
fn unknown_phase_round_trips() {
    let doc = json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "s"},
        "spec": {},
        "status": {"phase": "Pausing"},
    });
    let sandbox: Sandbox = serde_json::from_value(doc.clone()).unwrap();
    assert_eq!(sandbox.phase(), Some(&oka_api::SandboxPhase::Other("Pausing".into())));
    assert_eq!(serde_json::to_value(&sandbox).unwrap(), doc);
}

/// A closed spec enum rejects values the CRD's `enum:` rejects.
#[test]
fn closed_enums_reject_unknown_values() {
    let doc = json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "s"},
        "spec": {"pauseStrategy": {"type": "Freeze"}},
    });
    let err = serde_json::from_value::<Sandbox>(doc).unwrap_err().to_string();
    assert!(err.contains("unknown PauseStrategyType value \"Freeze\""), "{err}");
}
