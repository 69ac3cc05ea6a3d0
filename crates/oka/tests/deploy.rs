//! The installation of oka on a cluster (`deploy/`): the Helm chart, the plain manifests, the
//! CRDs and the container build files, checked with the real tools a platform team uses.
//!
//! - The committed CRDs (the chart's `crds/` and `deploy/kubernetes/crds.yaml`) are exactly what
//!   `oka crds` prints, and the plain manifests are exactly the chart's render with
//!   `deploy/kubernetes-values.yaml` (`deploy/generate.sh` regenerates both).
//! - For the default values and every example of `deploy/helm/examples/` (the combinations the
//!   README documents): `helm lint`, `helm template` at Kubernetes 1.33 and 1.36, each render
//!   validated strictly against that version's own schemas (`kubernetes-validate --strict`),
//!   and the rules a platform team relies on: every ServiceAccount bound, no wildcard in RBAC and
//!   every verb explained by the comment above it, probes and resource requests everywhere,
//!   restricted security contexts (but the node agent), the images the values name, the shared
//!   names (Services, ports, webhook paths), and a config file `oka` itself accepts.
//! - The CRDs are installed on a real API server (`crates/store/tests/support/apiserver.rs`) and
//!   the chart's default SandboxSets are created against them and read back; the manager and
//!   the gateway run there on the chart's config file (its listeners moved to free loopback
//!   ports), the manager with the admin key from its mounted file; as root, so does the node
//!   agent, registered under the name and relay address the DaemonSet's environment gives.
//! - The container build files: `FROM scratch` with static binaries the build produces, a
//!   non-root user, exec-form entrypoints; and, as root with buildah (which `scripts/test.sh`
//!   installs), the scratch images are built and their binaries run in the image's empty root.
//!
//! Needs `.venv/kube-tools` (`scripts/setup-kube-tools.sh`).

// Test helpers panic on failure: in a test, a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../store/tests/support/apiserver.rs"]
mod apiserver;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const OKA: &str = env!("CARGO_BIN_EXE_oka");
/// The Kubernetes versions we target: the oldest supported, and a newer one.
const KUBE_VERSIONS: [&str; 2] = ["1.33.0", "1.36.0"];
const NAMESPACE: &str = "sandbox-system";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// A tool of `.venv/kube-tools/bin`, or a failure that says how to install it.
fn kube_tool(name: &str) -> PathBuf {
    let path = repo().join(".venv/kube-tools/bin").join(name);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup-kube-tools.sh (helm and kubernetes-validate)",
        path.display()
    );
    path
}

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The chart's values cases: the defaults, and each file of `deploy/helm/examples/`.
fn cases() -> Vec<(String, Option<PathBuf>)> {
    let mut cases = vec![("default".to_owned(), None)];
    let mut examples: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy/helm/examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    examples.sort();
    for path in examples {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        cases.push((name, Some(path)));
    }
    cases
}

fn helm_template(values: &[&Path], kube_version: &str) -> String {
    let mut command = Command::new(kube_tool("helm"));
    command
        .current_dir(repo())
        .args(["template", "oka", "deploy/helm/oka", "--namespace", NAMESPACE])
        .args(["--kube-version", kube_version]);
    for file in values {
        command.arg("--values").arg(file);
    }
    run(&mut command)
}

/// The YAML documents of a stream, as JSON values (empty documents dropped).
fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .filter(|doc: &Value| !doc.is_null())
        .collect()
}

fn kind_of(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

fn name_of(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter().find(|d| kind_of(d) == kind && name_of(d) == name)
}

fn get<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    find(docs, kind, name).unwrap_or_else(|| panic!("no {kind} {name} in the render"))
}

/// The Pod templates of the Deployments and DaemonSets, by workload name.
fn workloads(docs: &[Value]) -> BTreeMap<String, &Value> {
    docs.iter()
        .filter(|d| matches!(kind_of(d), "Deployment" | "DaemonSet"))
        .map(|d| (name_of(d).to_owned(), &d["spec"]["template"]["spec"]))
        .collect()
}

fn strings(value: &Value) -> Vec<&str> {
    value.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

/// Splits a rendered stream as `deploy/generate.sh` does: the chart's objects, and the
/// post-install pools.
fn split_render(rendered: &str) -> (String, String) {
    let header = "# Generated by deploy/generate.sh from deploy/helm/oka: do not edit.\n";
    let docs: Vec<&str> =
        rendered.split("\n---\n").filter(|d| !d.trim().is_empty() && d.trim() != "---").collect();
    let mut rest = header.to_owned();
    let mut pools = header.to_owned();
    for doc in docs {
        let doc = doc.trim_matches('\n');
        let doc = doc.strip_prefix("---\n").unwrap_or(doc);
        let out = if doc.contains("helm.sh/hook: post-install") { &mut pools } else { &mut rest };
        out.push_str("---\n");
        out.push_str(doc);
        out.push('\n');
    }
    (rest, pools)
}

#[test]
fn committed_crds_are_what_oka_crds_prints() {
    let printed = run(Command::new(OKA).arg("crds"));
    for file in ["deploy/helm/oka/crds/crds.yaml", "deploy/kubernetes/crds.yaml"] {
        let committed = std::fs::read_to_string(repo().join(file)).unwrap();
        assert!(committed == printed, "{file} is not `oka crds`: run deploy/generate.sh");
    }
    let names: Vec<String> = documents(&printed).iter().map(|d| name_of(d).to_owned()).collect();
    assert!(names.contains(&"sandboxnodes.agents.kruise.io".to_owned()), "{names:?}");
    assert!(names.contains(&"sandboxsets.agents.kruise.io".to_owned()), "{names:?}");
}

#[test]
fn plain_manifests_are_the_charts_render() {
    let values = repo().join("deploy/kubernetes-values.yaml");
    let (objects, pools) = split_render(&helm_template(&[&values], "1.33.0"));
    let committed = std::fs::read_to_string(repo().join("deploy/kubernetes/oka.yaml")).unwrap();
    assert!(committed == objects, "deploy/kubernetes/oka.yaml is stale: run deploy/generate.sh");
    let committed =
        std::fs::read_to_string(repo().join("deploy/kubernetes/pools/pools.yaml")).unwrap();
    assert!(
        committed == pools,
        "deploy/kubernetes/pools/pools.yaml is stale: run deploy/generate.sh"
    );
    // kubectl apply -f deploy/kubernetes/ makes the namespace first and needs no Secret of the
    // chart's making: the operator creates the admin key and the relay token.
    let docs = documents(&objects);
    assert_eq!(kind_of(&docs[0]), "Namespace");
    assert_eq!(name_of(&docs[0]), NAMESPACE);
    assert_eq!(
        docs[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted",
        "no node agent by default: every Pod of the namespace meets `restricted`"
    );
    assert!(docs.iter().all(|d| kind_of(d) != "Secret"), "no generated Secret is committed");
    assert!(docs.iter().all(|d| kind_of(d) != "SandboxSet"), "pools wait for the controller");
    assert_eq!(documents(&pools).iter().filter(|d| kind_of(d) == "SandboxSet").count(), 1);
}

#[test]
fn every_documented_values_case_lints_renders_and_validates() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (name, file) in cases() {
        if file.is_some() {
            assert!(
                readme.contains(&format!("deploy/helm/examples/{name}.yaml")),
                "the README's install section does not document deploy/helm/examples/{name}.yaml"
            );
        }
        let values: Vec<&Path> = file.iter().map(PathBuf::as_path).collect();
        let mut lint = Command::new(kube_tool("helm"));
        lint.current_dir(repo()).args(["lint", "--strict", "deploy/helm/oka"]);
        for file in &values {
            lint.arg("--values").arg(file);
        }
        run(&mut lint);
        for version in KUBE_VERSIONS {
            let rendered = helm_template(&values, version);
            let path = dir.path().join(format!("{name}-{version}.yaml"));
            std::fs::write(&path, &rendered).unwrap();
            let output = Command::new(kube_tool("kubernetes-validate"))
                .args(["--strict", "--quiet", "-k", version])
                .arg(&path)
                .output()
                .unwrap();
            let report = String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr);
            assert!(
                output.status.success() && !report.contains("ERROR"),
                "{name} at Kubernetes {version} does not validate:\n{report}"
            );
            // Only our own kinds lack a schema there; they are checked on a real API server.
            for line in report.lines().filter(|l| l.contains("Couldn't find schema")) {
                assert!(line.contains("agents.kruise.io/v1alpha1"), "{name}: {line}");
            }
            let docs = documents(&rendered);
            check_render(&name, &docs, &rendered);
        }
    }
}

/// What every render must be, whatever the values.
fn check_render(case: &str, docs: &[Value], rendered: &str) {
    check_names(case, docs);
    check_rbac(case, docs, rendered);
    check_workloads(case, docs);
    check_config(case, docs);
}

/// The names the other components and the shared contract rely on.
fn check_names(case: &str, docs: &[Value]) {
    let node = find(docs, "DaemonSet", "oka-node").is_some();
    for deployment in ["oka-controller", "oka-manager", "oka-gateway"] {
        get(docs, "Deployment", deployment);
        get(docs, "PodDisruptionBudget", deployment);
    }
    let controller = get(docs, "Deployment", "oka-controller");
    if !case.contains("replicas") {
        assert_eq!(controller["spec"]["replicas"], 2, "{case}: a leader and a standby");
    }
    let mut accounts = vec!["oka-controller", "oka-manager", "oka-gateway"];
    if node {
        accounts.push("oka-node");
    }
    let found: BTreeSet<&str> =
        docs.iter().filter(|d| kind_of(d) == "ServiceAccount").map(name_of).collect();
    assert_eq!(found, accounts.iter().copied().collect(), "{case}");
    // Services: port → the named container port the contract says.
    for (service, port, target, container_port) in [
        ("oka-manager", 80, "http", 8080),
        ("oka-gateway", 80, "traffic", 8081),
        ("oka-webhook", 443, "webhook", 9443),
    ] {
        let svc = get(docs, "Service", service);
        let ports = svc["spec"]["ports"].as_array().unwrap();
        assert_eq!(ports.len(), 1, "{case}: {service}");
        assert_eq!(ports[0]["port"], port, "{case}: {service}");
        assert_eq!(ports[0]["targetPort"], target, "{case}: {service}");
        let selector = &svc["spec"]["selector"]["app.kubernetes.io/component"];
        let workload = format!("oka-{}", selector.as_str().unwrap());
        let pod = &get(docs, "Deployment", &workload)["spec"]["template"];
        assert_eq!(
            pod["metadata"]["labels"]["app.kubernetes.io/component"], *selector,
            "{case}: {service} selects {workload}'s Pods"
        );
        let declared = pod["spec"]["containers"][0]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == target && p["containerPort"] == container_port);
        assert!(declared, "{case}: {workload} has no port {target} = {container_port}");
    }
    // The webhooks: the reference's paths, served by oka-webhook, caBundle left to the
    // controller.
    let mutating = get(docs, "MutatingWebhookConfiguration", "oka-mutating-webhook");
    let validating = get(docs, "ValidatingWebhookConfiguration", "oka-validating-webhook");
    let mut paths = BTreeSet::new();
    for hook in mutating["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .chain(validating["webhooks"].as_array().unwrap())
    {
        let service = &hook["clientConfig"]["service"];
        assert_eq!(service["name"], "oka-webhook", "{case}");
        assert_eq!(service["namespace"], NAMESPACE, "{case}");
        assert!(hook["clientConfig"].get("caBundle").is_none(), "{case}: injected at run time");
        paths.insert(service["path"].as_str().unwrap().to_owned());
    }
    let want: BTreeSet<String> = [
        "/default-sandboxset",
        "/default-sandboxtemplate",
        "/validate-sandboxset",
        "/validate-sandboxtemplate",
        "/validate-sandboxupdateops",
        "/validate-poolautoscaler",
        "/validate-pod-delete",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(paths, want, "{case}");
    let pod_delete = validating["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["rules"][0]["operations"][0] == "DELETE")
        .unwrap();
    assert_eq!(
        pod_delete["objectSelector"]["matchExpressions"][0]["key"], "agents.kruise.io/created-by",
        "{case}: only sandboxes' Pods"
    );
}

/// Least privilege: every ServiceAccount bound, no wildcard, every verb explained.
fn check_rbac(case: &str, docs: &[Value], rendered: &str) {
    let accounts: Vec<&str> =
        docs.iter().filter(|d| kind_of(d) == "ServiceAccount").map(name_of).collect();
    for account in &accounts {
        let bound = docs.iter().filter(|d| kind_of(d).ends_with("RoleBinding")).any(|b| {
            b["subjects"].as_array().unwrap().iter().any(|s| {
                s["kind"] == "ServiceAccount"
                    && s["name"] == *account
                    && s["namespace"] == NAMESPACE
            })
        });
        assert!(bound, "{case}: ServiceAccount {account} is bound to no role");
    }
    for binding in docs.iter().filter(|d| kind_of(d).ends_with("RoleBinding")) {
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap();
        let role = binding["roleRef"]["name"].as_str().unwrap();
        assert!(find(docs, role_kind, role).is_some(), "{case}: {role_kind} {role} is missing");
        for subject in binding["subjects"].as_array().unwrap() {
            let name = subject["name"].as_str().unwrap();
            assert!(accounts.contains(&name), "{case}: {} binds unknown {name}", name_of(binding));
        }
    }
    for role in docs.iter().filter(|d| matches!(kind_of(d), "Role" | "ClusterRole")) {
        for rule in role["rules"].as_array().unwrap() {
            for field in ["apiGroups", "resources", "verbs", "resourceNames"] {
                assert!(
                    !strings(&rule[field]).iter().any(|v| v.contains('*')),
                    "{case}: wildcard in {} {}: {rule}",
                    kind_of(role),
                    name_of(role)
                );
            }
            assert!(!strings(&rule["verbs"]).is_empty(), "{case}: {rule}");
            let resources = strings(&rule["resources"]);
            if resources.iter().any(|r| r.ends_with("webhookconfigurations")) {
                assert_eq!(
                    strings(&rule["resourceNames"]),
                    ["oka-mutating-webhook", "oka-validating-webhook"],
                    "{case}: only oka's webhook configurations"
                );
            }
            if resources.contains(&"secrets") {
                let verbs = strings(&rule["verbs"]);
                assert!(
                    verbs == ["create"]
                        || verbs == ["list", "watch"]
                        || !strings(&rule["resourceNames"]).is_empty(),
                    "{case}: Secrets are named ({rule})"
                );
                if verbs.contains(&"list") || verbs.contains(&"watch") {
                    assert_eq!(
                        name_of(role),
                        "oka-controller",
                        "{case}: only the controller lists Secrets (the webhook certificate): {rule}"
                    );
                }
                assert_eq!(kind_of(role), "Role", "{case}: Secrets of oka's namespace only");
            }
        }
    }
    // Each `verbs:` line is preceded by a comment naming every verb it grants.
    let lines: Vec<&str> = rendered.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let Some(list) = line.trim().strip_prefix("verbs: [") else { continue };
        let mut comment = String::new();
        for above in lines[..i].iter().rev() {
            let above = above.trim();
            if let Some(text) = above.strip_prefix('#') {
                comment.insert_str(0, &format!("{text} "));
            } else if above.starts_with("resourceNames:") && comment.is_empty() {
                continue;
            } else {
                break;
            }
        }
        let words: BTreeSet<&str> =
            comment.split(|c: char| !c.is_ascii_alphabetic()).filter(|w| !w.is_empty()).collect();
        for verb in list.trim_end_matches(']').split(',').map(str::trim) {
            assert!(words.contains(verb), "{case}: verb {verb} is not explained: {line}");
        }
    }
}

/// Probes, requests, security contexts and images of the Deployments and the DaemonSet.
fn check_workloads(case: &str, docs: &[Value]) {
    let values = case_values(case);
    for (workload, pod) in workloads(docs) {
        let account = pod["serviceAccountName"].as_str().unwrap();
        assert_eq!(account, workload, "{case}: each component its own ServiceAccount");
        for container in pod["containers"].as_array().unwrap() {
            for probe in ["livenessProbe", "readinessProbe"] {
                assert!(
                    container[probe]["httpGet"]["path"].is_string(),
                    "{case}: {workload} {probe}"
                );
            }
            assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
            assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
            let requests = &container["resources"]["requests"];
            assert!(
                requests["cpu"].is_string() && requests["memory"].is_string(),
                "{case}: {workload}"
            );
            let image = container["image"].as_str().unwrap();
            let component = workload.trim_start_matches("oka-");
            assert_eq!(image, values.image(component), "{case}: {workload}'s image");
            let security = &container["securityContext"];
            if workload == "oka-node" {
                assert_eq!(security["privileged"], true, "{case}: the node agent runs sandboxes");
                continue;
            }
            assert_eq!(security["readOnlyRootFilesystem"], true, "{case}: {workload}");
            assert_eq!(security["allowPrivilegeEscalation"], false, "{case}: {workload}");
            assert_eq!(security["runAsNonRoot"], true, "{case}: {workload}");
            assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"], "{case}: {workload}");
            assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault", "{case}: {workload}");
            assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{case}: {workload}");
        }
    }
}

/// What a case's values file sets that the checks compare with (the chart's defaults
/// otherwise).
struct CaseValues(Value);

impl CaseValues {
    fn image(&self, component: &str) -> String {
        let image = &self.0[component]["image"];
        let default = if matches!(component, "node" | "envd") {
            format!("oka-{component}")
        } else {
            "oka".to_owned()
        };
        let repository = image["repository"].as_str().map_or(default, str::to_owned);
        let tag = image["tag"].as_str().unwrap_or("0.1.0");
        format!("{repository}:{tag}")
    }
}

fn case_values(case: &str) -> CaseValues {
    let path = repo().join(format!("deploy/helm/examples/{case}.yaml"));
    let text = std::fs::read_to_string(path).unwrap_or_default();
    CaseValues(serde_yaml::from_str::<Option<Value>>(&text).unwrap().unwrap_or(Value::Null))
}

/// The ConfigMap's config file: the names the contract fixes, and `oka` itself reads it.
fn check_config(case: &str, docs: &[Value]) {
    let config_map = get(docs, "ConfigMap", "oka-config");
    let text = config_map["data"]["config.yaml"].as_str().unwrap();
    let config: Value = serde_yaml::from_str(text).unwrap();
    assert_eq!(config["api"]["listen"], "0.0.0.0:8080", "{case}");
    assert_eq!(config["gateway"]["listen"], "0.0.0.0:8081", "{case}");
    let cluster = &config["cluster"];
    assert_eq!(cluster["namespace"], NAMESPACE, "{case}");
    assert_eq!(cluster["webhook"]["listen"], "0.0.0.0:9443", "{case}");
    assert_eq!(cluster["webhook"]["secretName"], "oka-webhook-certs", "{case}");
    assert_eq!(cluster["webhook"]["serviceName"], "oka-webhook", "{case}");
    let values = case_values(case);
    let runtime = values.0["defaultRuntime"].as_str().unwrap_or("pod");
    assert_eq!(cluster["defaultRuntime"], runtime, "{case}");
    assert_eq!(
        cluster["pods"]["envdImage"],
        values.image("envd"),
        "{case}: the Pod runtime's envd"
    );
    if let Some(addr) = values.0["redis"]["addr"].as_str() {
        assert_eq!(config["quota"]["redisAddr"], addr, "{case}");
        let manager = &get(docs, "Deployment", "oka-manager")["spec"]["template"]["spec"];
        let env: Vec<&str> = manager["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert_eq!(env, ["QUOTA_REDIS_USERNAME", "QUOTA_REDIS_PASSWORD"], "{case}");
    }
    if let Some(endpoint) = values.0["tracing"]["endpoint"].as_str() {
        assert_eq!(config["tracing"]["endpoint"], endpoint, "{case}");
        assert_eq!(config["tracing"]["mode"], values.0["tracing"]["mode"], "{case}");
    }
    for component in ["controller", "manager", "gateway", "node"] {
        oka_accepts_config(case, component, text);
    }
}

/// Runs `oka <component>` on the config file with a kubeconfig that does not exist: a config
/// `oka` accepts gets as far as reading the kubeconfig.
fn oka_accepts_config(case: &str, component: &str, text: &str) {
    let (_, stderr) = accepted_config(component, text);
    assert!(
        stderr.contains("cannot read the kubeconfig /nonexistent/kubeconfig"),
        "{case}: oka {component} does not accept the chart's config:\n{stderr}"
    );
}

/// `text` as `oka <component>` reads it, and what `oka` said of it.
fn accepted_config(component: &str, text: &str) -> (Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, text).unwrap();
    let output = Command::new(OKA)
        .args([component, "--config"])
        .arg(&path)
        .args(["--kubeconfig", "/nonexistent/kubeconfig", "--state-dir"])
        .arg(dir.path().join("state"))
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    (serde_yaml::from_str(text).unwrap(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// A child process, stopped (SIGTERM, then SIGKILL) when dropped.
struct KillOnDrop(std::process::Child);

impl KillOnDrop {
    fn stop(&mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.0.id().to_string()).status();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while self.0.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A GET on loopback with an `X-API-Key`: the status.
fn get_with_key(port: u16, path: &str, key: &str) -> u16 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\nX-API-Key: {key}\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn the_manager_and_the_gateway_run_on_the_charts_config() {
    use support::cluster::{ADMIN_KEY, Component};
    let mut crds = oka_api::cluster_crds();
    crds.push(apiserver::lease_stand_in());
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let Some(server) = rt.block_on(apiserver::ApiServer::start(&crds)) else { return };
    let docs = documents(&helm_template(&[], "1.33.0"));
    let text = get(&docs, "ConfigMap", "oka-config")["data"]["config.yaml"].as_str().unwrap();
    let (mut config, _) = accepted_config("manager", text);
    // Where the chart mounts the admin key and the relay token, files of this test; the
    // listeners on free loopback ports.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("admin-key"), format!("{ADMIN_KEY}\n")).unwrap();
    std::fs::write(dir.path().join("relay-token"), "0123456789abcdef".repeat(4)).unwrap();
    assert_eq!(config["api"]["adminKeyFile"], "/etc/oka/admin-key/key");
    assert_eq!(config["cluster"]["relayTokenFile"], "/etc/oka/relay-token/token");
    config["api"]["adminKeyFile"] = dir.path().join("admin-key").display().to_string().into();
    config["cluster"]["relayTokenFile"] =
        dir.path().join("relay-token").display().to_string().into();
    config["stateDir"] = dir.path().join("state").display().to_string().into();
    let mut components = Vec::new();
    for component in ["manager", "gateway"] {
        let port = support::free_port();
        config["api"]["listen"] = format!("127.0.0.1:{port}").into();
        config["gateway"]["listen"] = format!("127.0.0.1:{}", support::free_port()).into();
        let file = dir.path().join(format!("{component}.yaml"));
        std::fs::write(&file, serde_yaml::to_string(&config).unwrap()).unwrap();
        let args = [component, "--config", file.to_str().unwrap(), "--kubeconfig"]
            .into_iter()
            .map(str::to_owned)
            .chain([server.kubeconfig().display().to_string()])
            .collect::<Vec<_>>();
        components.push(Component::start(component, &args, dir.path(), port));
    }
    for component in &components {
        component.wait_ready(std::time::Duration::from_secs(60));
    }
    // The admin key is the mounted file's.
    let manager = &components[0];
    assert_eq!(get_with_key(manager.port, "/sandboxes", ADMIN_KEY), 200, "{}", manager.log());
    // Another key is not let in (a 500 here rather than a 401: this server has no Secrets to
    // look API keys up in).
    let other = "e2b_ffffffffffffffffffffffffffffffffffffffff";
    assert_ne!(get_with_key(manager.port, "/sandboxes", other), 200);
}

/// As root: `oka node` on the chart's config registers its SandboxNode under the name and the
/// relay address the DaemonSet passes in its environment.
#[test]
fn the_node_agent_registers_as_the_daemonset_says() {
    use oka_api::sandboxnode::SandboxNode;
    use oka_store::Store as _;
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: the node agent needs root");
        return;
    }
    let mut crds = oka_api::cluster_crds();
    crds.push(apiserver::lease_stand_in());
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let Some(server) = rt.block_on(apiserver::ApiServer::start(&crds)) else { return };
    let docs =
        documents(&helm_template(&[&repo().join("deploy/helm/examples/node.yaml")], "1.33.0"));
    let daemonset = get(&docs, "DaemonSet", "oka-node");
    let env = &daemonset["spec"]["template"]["spec"]["containers"][0]["env"];
    let names: Vec<&str> =
        env.as_array().unwrap().iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(names, ["OKA_NODE_NAME", "POD_IP", "OKA_NODE_RELAY_ADDRESS"]);
    let text = get(&docs, "ConfigMap", "oka-config")["data"]["config.yaml"].as_str().unwrap();
    let (mut config, _) = accepted_config("node", text);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::write(dir.path().join("relay-token"), "0123456789abcdef".repeat(4)).unwrap();
    config["cluster"]["relayTokenFile"] =
        dir.path().join("relay-token").display().to_string().into();
    config["stateDir"] = state.display().to_string().into();
    let port = support::free_port();
    config["api"]["listen"] = format!("127.0.0.1:{port}").into();
    let relay = support::free_port();
    config["cluster"]["node"]["relayListen"] = format!("127.0.0.1:{relay}").into();
    let file = dir.path().join("node.yaml");
    std::fs::write(&file, serde_yaml::to_string(&config).unwrap()).unwrap();
    // What the DaemonSet's environment says, as the kubelet expands it.
    let address = format!("127.0.0.1:{relay}");
    let log = dir.path().join("node.log");
    let child = Command::new(OKA)
        .args(["node", "--config"])
        .arg(&file)
        .arg("--kubeconfig")
        .arg(server.kubeconfig())
        .env("OKA_NODE_NAME", "worker-7")
        .env("OKA_NODE_RELAY_ADDRESS", &address)
        .env("NO_COLOR", "1")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut node = KillOnDrop(child);
    let log = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while support::cluster::http_get(port, "/readyz").map(|r| r.0) != Some(200) {
        assert!(std::time::Instant::now() < deadline, "the node agent is not ready:\n{}", log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let store = rt.block_on(async { oka_store::kubernetes::KubeStore::new(server.client().await) });
    let registered: SandboxNode = rt.block_on(store.get(NAMESPACE, "worker-7")).unwrap();
    assert_eq!(registered.spec.relay_address, address, "{}", log());
    let labels = registered.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("zone").map(String::as_str), Some("a"), "node.labels of the values");
    node.stop();
    support::remove_sandboxes(&state, OKA);
}

#[test]
fn mistaken_values_are_refused_naming_the_key() {
    for (set, named) in [
        ("defaultRuntime=vm", "defaultRuntime"),
        ("manager.replica=3", "replica"),
        ("tracing.mode=jaeger", "mode"),
        ("controller.replicas=0", "replicas"),
        ("node.enabled=false,defaultRuntime=node", "node.enabled"),
    ] {
        let output = Command::new(kube_tool("helm"))
            .current_dir(repo())
            .args(["template", "oka", "deploy/helm/oka", "--kube-version", "1.33.0", "--set", set])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "--set {set} was accepted");
        assert!(stderr.contains(named), "--set {set}: the error does not name {named}: {stderr}");
    }
}

#[test]
fn crds_install_on_a_real_api_server_and_take_the_charts_pools() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes/crds.yaml")).unwrap();
    let crds: Vec<CustomResourceDefinition> =
        documents(&text).into_iter().map(|d| serde_json::from_value(d).unwrap()).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let Some(server) = rt.block_on(apiserver::ApiServer::start(&crds)) else { return };
    rt.block_on(async {
        let client = server.client().await;
        let gvk = GroupVersionKind::gvk("agents.kruise.io", "v1alpha1", "SandboxSet");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "sandboxsets");
        for (case, file) in cases() {
            let values: Vec<&Path> = file.iter().map(PathBuf::as_path).collect();
            let rendered = helm_template(&values, "1.33.0");
            let pools: Vec<Value> =
                documents(&rendered).into_iter().filter(|d| kind_of(d) == "SandboxSet").collect();
            assert!(!pools.is_empty(), "{case}: the chart creates pools");
            for pool in pools {
                // Each case in a namespace of its own (this server has no namespace lifecycle).
                let mut namespace = pool["metadata"]["namespace"].as_str().unwrap().to_owned();
                if case != "default" {
                    namespace = format!("{case}-{namespace}");
                }
                let api: Api<DynamicObject> =
                    Api::namespaced_with(client.clone(), &namespace, &resource);
                let mut object: DynamicObject = serde_json::from_value(pool.clone()).unwrap();
                object.metadata.namespace = Some(namespace.clone());
                let name = name_of(&pool).to_owned();
                let stored = api
                    .create(&PostParams::default(), &object)
                    .await
                    .unwrap_or_else(|e| panic!("{case}: pool {name}: {e}\n{}", server.log_tail()));
                let stored = serde_json::to_value(&stored).unwrap();
                assert_kept(&pool["spec"], &stored["spec"], &format!("{case}: pool {name}"));
            }
        }
        // The default pool was stored: its template and size are what the values say.
        let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &resource);
        let base = serde_json::to_value(api.get("base").await.unwrap()).unwrap();
        assert_eq!(base["spec"]["replicas"], 2);
        let container = &base["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["resources"]["limits"]["memory"], "512Mi");
    });
}

/// Every field of `written` is in `stored` with the same value (the server may add defaults).
fn assert_kept(written: &Value, stored: &Value, what: &str) {
    match (written, stored) {
        (Value::Object(w), Value::Object(s)) => {
            for (key, value) in w {
                let kept = s.get(key).unwrap_or_else(|| panic!("{what}: {key} was dropped"));
                assert_kept(value, kept, &format!("{what}.{key}"));
            }
        }
        (Value::Array(w), Value::Array(s)) => {
            assert_eq!(w.len(), s.len(), "{what}");
            for (i, (w, s)) in w.iter().zip(s).enumerate() {
                assert_kept(w, s, &format!("{what}[{i}]"));
            }
        }
        _ => assert_eq!(written, stored, "{what}"),
    }
}

/// The `FROM`, `COPY`, `USER` and `ENTRYPOINT` instructions of a Containerfile.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut joined = String::new();
    for line in text.lines() {
        let line = line.trim_end();
        if line.trim_start().starts_with('#') || line.is_empty() {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(start) => joined.push_str(start),
            None => {
                joined.push_str(line);
                joined.push('\n');
            }
        }
    }
    joined
        .lines()
        .filter_map(|l| l.trim().split_once(' '))
        .map(|(i, rest)| (i.to_uppercase(), rest.trim().to_owned()))
        .collect()
}

#[test]
fn container_files_take_the_static_binaries_the_build_makes() {
    let build_static = std::fs::read_to_string(repo().join("scripts/build-static.sh")).unwrap();
    let chart = std::fs::read_to_string(repo().join("deploy/helm/oka/values.yaml")).unwrap();
    for (file, base, user_root) in [
        ("Containerfile.oka", "scratch", false),
        ("Containerfile.envd", "scratch", false),
        ("Containerfile.node", "docker.io/library/debian:bookworm-slim", true),
    ] {
        let text = std::fs::read_to_string(repo().join("deploy/images").join(file)).unwrap();
        let instructions = instructions(&text);
        let from: Vec<&str> =
            instructions.iter().filter(|(i, _)| i == "FROM").map(|(_, r)| r.as_str()).collect();
        assert_eq!(from, [base], "{file}");
        for (_, rest) in instructions.iter().filter(|(i, _)| i == "COPY") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            // The CA bundle is the build machine's (deploy/images/build.sh copies it).
            for source in words[..words.len() - 1].iter().filter(|s| **s != "ca-certificates.crt") {
                assert!(
                    build_static.contains(&format!("=$dir/{source}\"")),
                    "{file}: {source} is not a binary scripts/build-static.sh prints the path of"
                );
            }
        }
        let user = instructions.iter().rfind(|(i, _)| i == "USER").map(|(_, r)| r.clone());
        let user = user.unwrap_or_else(|| panic!("{file}: no USER"));
        assert_eq!(user.starts_with("0:") || user == "root", user_root, "{file}: USER {user}");
        let entrypoint = instructions.iter().rfind(|(i, _)| i == "ENTRYPOINT").unwrap();
        let exec: Vec<String> = serde_json::from_str(&entrypoint.1)
            .unwrap_or_else(|_| panic!("{file}: ENTRYPOINT is not in exec form"));
        assert!(exec[0].starts_with('/'), "{file}: {exec:?}");
    }
    // The images the chart names by default are the ones these files build.
    for repository in ["repository: oka\n", "repository: oka-node\n", "repository: oka-envd\n"] {
        assert!(chart.contains(repository), "values.yaml: {repository}");
    }
}

/// As root with buildah: the scratch images build from the static binaries (no registry), and
/// each binary runs in its image's own root, which holds nothing else.
#[test]
fn scratch_images_build_and_their_binaries_run_alone() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: building images needs root");
        return;
    }
    let Some(dir) = std::env::var_os("OKA_TEST_STATIC_DIR").map(PathBuf::from) else {
        eprintln!("skipped: OKA_TEST_STATIC_DIR is not set (scripts/test.sh sets it)");
        return;
    };
    let buildah = ["/usr/bin/buildah", "/usr/local/bin/buildah"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("buildah is missing: scripts/test.sh installs it (apt-get install buildah)");
    let work = tempfile::tempdir().unwrap();
    let context = work.path().join("context");
    std::fs::create_dir(&context).unwrap();
    for binary in ["oka", "oka-init", "oka-envd"] {
        std::fs::copy(dir.join(binary), context.join(binary)).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (scripts/build-static.sh --with-oka builds it)",
                dir.join(binary).display()
            )
        });
    }
    std::fs::copy("/etc/ssl/certs/ca-certificates.crt", context.join("ca-certificates.crt"))
        .expect("the CA bundle (ca-certificates)");
    let storage = [
        "--root".to_owned(),
        work.path().join("storage").display().to_string(),
        "--runroot".to_owned(),
        work.path().join("run").display().to_string(),
        "--storage-driver".to_owned(),
        "vfs".to_owned(),
    ];
    let buildah = |args: &[&str]| run(Command::new(&buildah).args(&storage).args(args));
    for (file, binary, args) in [
        ("Containerfile.oka", "/usr/local/bin/oka", &["--version"][..]),
        ("Containerfile.envd", "/usr/local/bin/oka-envd", &["--help"][..]),
    ] {
        let path = repo().join("deploy/images").join(file);
        let tag = format!("localhost/oka-test-{}", file.trim_start_matches("Containerfile."));
        buildah(&[
            "bud",
            "--quiet",
            "--isolation",
            "chroot",
            "-f",
            path.to_str().unwrap(),
            "-t",
            &tag,
            context.to_str().unwrap(),
        ]);
        let inspect: Value =
            serde_json::from_str(&buildah(&["inspect", "--type", "image", &tag])).unwrap();
        let config = &inspect["OCIv1"]["config"];
        assert_eq!(config["User"], "65532:65532", "{file}");
        assert_eq!(strings(&config["Entrypoint"]), [binary], "{file}");
        let container = buildah(&["from", "--quiet", &tag]).trim().to_owned();
        let root = PathBuf::from(buildah(&["mount", &container]).trim());
        let entries: Vec<String> = walk(&root);
        assert!(
            entries.iter().all(|e| e.starts_with("usr") || e.starts_with("etc")),
            "{file}: only the binaries and the CA bundle: {entries:?}"
        );
        let output = Command::new("chroot").arg(&root).arg(binary).args(args).output().unwrap();
        assert!(
            output.status.success(),
            "{file}: {binary} does not run in its image: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        buildah(&["umount", &container]);
        buildah(&["rm", &container]);
    }
}

/// The paths under `root`, relative, files and directories.
fn walk(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            out.push(path.strip_prefix(root).unwrap().display().to_string());
            if path.is_dir() && !path.is_symlink() {
                stack.push(path);
            }
        }
    }
    out
}
