//! The Pod runtime's Pods (and PVCs) validated against the Pod schema of the Kubernetes
//! versions oka targets (1.33 and 1.36), with Kubernetes' own OpenAPI schemas as JSON Schema
//! (`kubernetes-validate --strict`: unknown fields are errors): the Pods built from the
//! reference's samples and from templates with volumes, init containers, runtime classes,
//! resources, probes and security contexts, with and without a command.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::PodTemplateSpec;
use oka_api::{Sandbox, SandboxSet, SandboxSpec};
use oka_controller::podruntime::{PodOptions, build_claims, build_pod};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn validator() -> PathBuf {
    let tool = repo().join(".venv/kube-tools/bin/kubernetes-validate");
    assert!(
        tool.exists(),
        "{} is missing: run scripts/setup-kube-tools.sh (the test script does)",
        tool.display()
    );
    tool
}

fn sandbox(name: &str, spec: SandboxSpec) -> Sandbox {
    let mut s = Sandbox::new(name, spec);
    s.metadata.namespace = Some("default".into());
    s.metadata.uid = Some("0b5e7e1c-0000-4000-8000-000000000001".into());
    s
}

/// The reference's samples, as the sandboxes their pools (or they themselves) make.
fn samples() -> Vec<(String, Sandbox)> {
    let dir = repo().join("crates/api/tests/reference/samples");
    let mut out = Vec::new();
    for file in ["sandboxset-code-interpreter.yaml", "sandboxset-desktop.yaml"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let set: SandboxSet = serde_yaml::from_str(&text).unwrap();
        let spec = SandboxSpec {
            template: set.spec.template.clone(),
            volume_claim_templates: set.spec.volume_claim_templates.clone(),
            ..SandboxSpec::default()
        };
        out.push((file.to_owned(), sandbox("sample-0", spec)));
    }
    let text = std::fs::read_to_string(dir.join("sandbox.yaml")).unwrap();
    let sample: Sandbox = serde_yaml::from_str(&text).unwrap();
    out.push(("sandbox.yaml".to_owned(), sandbox("sandbox-sample", sample.spec)));
    out
}

/// Templates a user writes: volumes, init containers, runtime classes, resources.
fn templates() -> Vec<(String, Sandbox)> {
    let yaml = [
        (
            "volumes-and-init",
            r#"
metadata:
  labels: {app: agent}
  annotations: {team: a}
spec:
  initContainers:
  - name: fetch
    image: busybox:1.36
    command: [sh, -c, "echo hi > /work/hello"]
    volumeMounts: [{name: work, mountPath: /work}]
  containers:
  - name: agent
    image: python:3.12-slim
    command: [python, -m, http.server, "8000"]
    ports: [{containerPort: 8000, name: http}]
    env: [{name: MODE, value: test}, {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]
    volumeMounts:
    - {name: work, mountPath: /work}
    - {name: config, mountPath: /etc/agent, readOnly: true}
    - {name: token, mountPath: /var/run/token}
    readinessProbe: {httpGet: {path: /, port: 8000}, periodSeconds: 2}
  volumes:
  - {name: work, emptyDir: {sizeLimit: 1Gi}}
  - {name: config, configMap: {name: agent-config}}
  - {name: token, secret: {secretName: agent-token, defaultMode: 256}}
"#,
        ),
        (
            "runtime-class-and-resources",
            r#"
spec:
  runtimeClassName: gvisor
  nodeSelector: {pool: sandboxes}
  tolerations: [{key: sandboxes, operator: Exists, effect: NoSchedule}]
  securityContext: {runAsNonRoot: false, fsGroup: 1000}
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: ubuntu:24.04
    args: [sleep, infinity]
    resources:
      requests: {cpu: 500m, memory: 512Mi}
      limits: {cpu: "2", memory: 2Gi, ephemeral-storage: 4Gi}
    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [NET_RAW]}}
"#,
        ),
        (
            "node-class-stripped",
            r#"
spec:
  runtimeClassName: oka-node
  containers:
  - {name: main, image: debian:12, command: [sleep, infinity]}
"#,
        ),
        (
            "sidecar-and-existing-hook",
            r#"
spec:
  initContainers:
  - name: proxy
    image: envoyproxy/envoy:v1.31
    restartPolicy: Always
  containers:
  - name: main
    image: node:22
    command: [node, server.js]
    lifecycle: {postStart: {exec: {command: [/bin/setup]}}, preStop: {sleep: {seconds: 2}}}
"#,
        ),
    ];
    yaml.iter()
        .map(|(name, text)| {
            let template: PodTemplateSpec = serde_yaml::from_str(text).unwrap();
            let spec = SandboxSpec { template: Some(template), ..SandboxSpec::default() };
            ((*name).to_owned(), sandbox(&format!("{name}-0"), spec))
        })
        .collect()
}

#[test]
fn pods_and_claims_validate_against_kubernetes_1_33_and_1_36_strictly() {
    let tool = validator();
    let dir = tempfile::tempdir().unwrap();
    let options = PodOptions { envd_image: "registry.example/oka-envd:0.1.0".into() };
    let mut files = Vec::new();
    for (name, sandbox) in samples().into_iter().chain(templates()) {
        let template = sandbox.spec.template.clone().unwrap();
        let pod = build_pod(&sandbox, &template, "5f7b9d8c6", &options)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut value = serde_json::to_value(&pod).unwrap();
        value["apiVersion"] = "v1".into();
        value["kind"] = "Pod".into();
        let path = dir.path().join(format!("{name}.pod.json"));
        std::fs::write(&path, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
        files.push(path);
        for (i, claim) in build_claims(&sandbox).into_iter().enumerate() {
            let mut value = serde_json::to_value(&claim).unwrap();
            value["apiVersion"] = "v1".into();
            value["kind"] = "PersistentVolumeClaim".into();
            let path = dir.path().join(format!("{name}.claim{i}.json"));
            std::fs::write(&path, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
            files.push(path);
        }
    }
    assert!(files.len() >= 9, "{files:?}");
    for version in ["1.33.0", "1.36.0"] {
        let output = std::process::Command::new(&tool)
            .args(["-k", version, "--strict", "--quiet"])
            .args(&files)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "Kubernetes {version} refuses a Pod:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
