//! Admission of the reference samples and of objects that break each kind of rule.

use serde_json::{Value, json};

use super::*;

const SAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../api/tests/reference/samples");

fn sample(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{SAMPLES}/{name}")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn messages(e: AdmissionError) -> Vec<String> {
    match e {
        AdmissionError::Invalid(errors) => {
            errors.iter().map(|e| format!("{}: {}", e.field, e.body())).collect()
        }
        other => panic!("not invalid: {other:?}"),
    }
}

#[test]
fn the_reference_samples_are_admitted_strictly() {
    let admission = Admission::new();
    for entry in std::fs::read_dir(SAMPLES).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let mut obj: Value = serde::Deserialize::deserialize(doc).unwrap();
            if obj.is_null() {
                continue;
            }
            let kind = obj["kind"].as_str().unwrap().to_owned();
            let admitted =
                admission.admit(&kind, Operation::Create, &mut obj, None, FieldValidation::Strict);
            assert_eq!(admitted, Ok(Admitted::default()), "{}", path.display());
        }
    }
}

#[test]
fn unknown_fields_are_pruned_warned_or_refused() {
    let admission = Admission::new();
    let mut obj = sample("sandboxset-desktop.yaml");
    obj["spec"]["replicass"] = json!(3);
    obj["metadata"]["labelz"] = json!({"a": "b"});
    let mut strict = obj.clone();
    let e = admission.admit(
        "SandboxSet",
        Operation::Create,
        &mut strict,
        None,
        FieldValidation::Strict,
    );
    assert_eq!(
        e.unwrap_err().to_string(),
        "strict decoding error: unknown field \"metadata.labelz\", unknown field \"spec.replicass\""
    );
    let admitted = admission
        .admit("SandboxSet", Operation::Create, &mut obj, None, FieldValidation::Warn)
        .unwrap();
    assert_eq!(
        admitted.warnings,
        ["unknown field \"metadata.labelz\"", "unknown field \"spec.replicass\""]
    );
    assert!(obj["spec"].get("replicass").is_none());
    assert!(obj["metadata"].get("labelz").is_none());
}

#[test]
fn defaults_fill_absent_fields() {
    let admission = Admission::new();
    let mut obj = json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "SandboxSet",
        "metadata": {"name": "p"},
        "spec": {
            "replicas": 1,
            "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
            "probes": [{"name": "alive", "activity": {}}],
            "autoPausePolicy": {"pause": {"probeName": "alive"}},
        },
    });
    admission
        .admit("SandboxSet", Operation::Create, &mut obj, None, FieldValidation::Strict)
        .unwrap();
    let policy = &obj["spec"]["autoPausePolicy"];
    assert_eq!(policy["minPausedSeconds"], 30);
    assert_eq!(policy["minRunningSeconds"], 60);
    assert_eq!(policy["pause"]["status"], "False");
}

#[test]
fn schema_errors_read_as_the_api_server_writes_them() {
    let admission = Admission::new();
    let mut obj = json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "SandboxSet",
        "metadata": {"name": "Bad_Name", "labels": {"ok": "bad value!"}},
        "spec": {
            "replicas": "three",
            "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
            "probes": [{"name": "alive", "activity": {}}],
            "autoPausePolicy": {"pause": {"probeName": "alive", "status": "Maybe", "forSeconds": -1}},
        },
    });
    let e =
        admission.admit("SandboxSet", Operation::Create, &mut obj, None, FieldValidation::Strict);
    let messages = messages(e.unwrap_err());
    let expected = [
        "metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        "spec.autoPausePolicy.pause.forSeconds: Invalid value: -1: spec.autoPausePolicy.pause.forSeconds in body should be greater than or equal to 0",
        "spec.autoPausePolicy.pause.status: Unsupported value: \"Maybe\": supported values: \"True\", \"False\"",
        "spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\"",
    ];
    for line in expected {
        assert!(messages.iter().any(|m| m == line), "missing {line}\nin {messages:#?}");
    }
    assert!(
        messages.iter().any(|m| m.starts_with("metadata.labels: Invalid value: \"bad value!\": a valid label")),
        "{messages:#?}"
    );
    let mut nameless = json!({"apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxClaim", "metadata": {}, "spec": {}});
    let e = admission.admit(
        "SandboxClaim",
        Operation::Create,
        &mut nameless,
        None,
        FieldValidation::Strict,
    );
    let messages = self::messages(e.unwrap_err());
    assert!(
        messages.contains(
            &"metadata.name: Required value: name or generateName is required".to_owned()
        ),
        "{messages:#?}"
    );
}
