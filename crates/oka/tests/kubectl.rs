//! The real `kubectl` against `oka serve`'s Kubernetes-compatible API, with the kubeconfig
//! `oka serve` writes: discovery, tables from the CRDs' printer columns, `-o yaml`, label
//! selectors, `apply` of the reference samples (create, then update through the
//! last-applied annotation), `scale`, `delete`, the API server's error messages, and
//! TrafficPolicies and cluster-scoped GlobalTrafficPolicies (their CEL rules, table and
//! `Accepted` condition).
//! No sandbox runs (`runtime.enabled: false`), so no root is needed; scripts/test.sh installs
//! kubectl (`$KUBECTL` names another one).

#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::process::Command;

use support::OkaServe;

/// The reference's samples, as vendored for oka-api's tests.
const SAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../api/tests/reference/samples");

fn kubectl_binary() -> String {
    std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_owned())
}

/// Runs kubectl with `args` (and `stdin`) against `serve`: its exit status, stdout and stderr.
fn kubectl(serve: &OkaServe, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    use std::io::Write;
    let kubeconfig = serve.state.path().join("kubeconfig");
    let mut child = Command::new(kubectl_binary())
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// kubectl's stdout, failing the test with its stderr and the server's log when it fails.
fn ok(serve: &OkaServe, args: &[&str]) -> String {
    let (success, stdout, stderr) = kubectl(serve, args, None);
    assert!(success, "kubectl {args:?} failed: {stderr}\n{}", serve.log());
    stdout
}

/// The rows of a kubectl table: the cells of each line, split on runs of spaces.
fn rows(table: &str) -> Vec<Vec<String>> {
    table.lines().map(|l| l.split_whitespace().map(str::to_owned).collect()).collect()
}

fn kubectl_available() -> bool {
    Command::new(kubectl_binary())
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `oka serve` without a runtime, once its Kubernetes API listens (it starts after the E2B
/// API, which `start` waits for; its kubeconfig is written, at once, once it listens).
fn serve_without_runtime() -> OkaServe {
    serve_without_runtime_and("")
}

/// [`serve_without_runtime`] with more configuration.
fn serve_without_runtime_and(config: &str) -> OkaServe {
    let config = format!("runtime:\n  enabled: false\n{config}");
    let serve = OkaServe::start(env!("CARGO_BIN_EXE_oka"), &config, &[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", serve.kube)).is_err()
        || !serve.state.path().join("kubeconfig").exists()
    {
        assert!(std::time::Instant::now() < deadline, "no Kubernetes API:\n{}", serve.log());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    serve
}

/// Fails under CI when kubectl is missing (scripts/test.sh installs it); skips elsewhere.
fn require_kubectl(test: &str) -> bool {
    if kubectl_available() {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "{test}: no kubectl, and CI must run this test");
    eprintln!("SKIPPED {test}: no kubectl (scripts/test.sh installs it)");
    false
}

#[test]
fn kubectl_manages_oka_serve() {
    if !require_kubectl("kubectl_manages_oka_serve") {
        return;
    }
    let serve = serve_without_runtime();
    let kubeconfig = std::fs::read_to_string(serve.state.path().join("kubeconfig")).unwrap();
    assert!(kubeconfig.contains(&serve.key()), "the kubeconfig carries the admin key");

    // Discovery: every kind with its short name, from the CRDs.
    let resources = ok(&serve, &["api-resources", "--api-group=agents.kruise.io"]);
    for (name, short, kind) in [
        ("sandboxes", "sbx", "Sandbox"),
        ("sandboxsets", "sbs", "SandboxSet"),
        ("sandboxclaims", "sbc", "SandboxClaim"),
        ("sandboxtemplates", "sbt", "SandboxTemplate"),
        ("sandboxupdateops", "suo", "SandboxUpdateOps"),
    ] {
        let row = vec![
            name.to_owned(),
            short.to_owned(),
            "agents.kruise.io/v1alpha1".to_owned(),
            "true".to_owned(),
            kind.to_owned(),
        ];
        assert!(rows(&resources).contains(&row), "{name} missing:\n{resources}");
    }

    // Discovery is aggregated: kubectl learns every resource from /api and /apis alone.
    let (success, _, log) = kubectl(&serve, &["api-resources", "-v=6"], None);
    assert!(success, "{log}");
    assert!(log.contains("GET https://127.0.0.1"), "{log}");
    assert!(!log.contains("/apis/agents.kruise.io/v1alpha1?"), "{log}");

    // explain reads the OpenAPI v3 schemas of the CRDs.
    let explained = ok(&serve, &["explain", "sandboxset.spec.replicas"]);
    assert!(explained.contains("KIND:       SandboxSet"), "{explained}");
    assert!(explained.contains("FIELD: replicas <integer>"), "{explained}");
    let explained = ok(&serve, &["explain", "sbx.metadata.labels"]);
    assert!(explained.contains("FIELD: labels <map[string]string>"), "{explained}");

    // The default pool as a table with the CRD's printer columns.
    let table = ok(&serve, &["get", "sandboxsets"]);
    let table = rows(&table);
    assert_eq!(
        table[0],
        [
            "NAME",
            "REPLICAS",
            "AVAILABLE",
            "UPDATEDREPLICAS",
            "UPDATEDAVAILABLEREPLICAS",
            "UPDATEREVISION",
            "AGE"
        ]
    );
    assert_eq!(table[1][0], "base");
    let yaml = ok(&serve, &["get", "sbs", "base", "-o", "yaml"]);
    let base: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(base["kind"], "SandboxSet");
    assert_eq!(base["spec"]["replicas"], 2);

    // The pool's sandboxes, by label selector.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let sandboxes = loop {
        let out =
            ok(&serve, &["get", "sbx", "-l", "agents.kruise.io/sandbox-pool=base", "-o", "name"]);
        if out.lines().count() == 2 || std::time::Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(sandboxes.lines().count(), 2, "{sandboxes}");
    assert!(
        sandboxes.lines().all(|l| l.starts_with("sandbox.agents.kruise.io/base-")),
        "{sandboxes}"
    );
    let none =
        ok(&serve, &["get", "sbx", "-l", "agents.kruise.io/sandbox-pool=other", "-o", "name"]);
    assert_eq!(none, "");
    let sbx_table = ok(&serve, &["get", "sbx"]);
    assert!(sbx_table.starts_with("NAME "), "{sbx_table}");
    assert!(sbx_table.contains("CLAIMED"), "{sbx_table}");

    // apply: the reference samples, unchanged, are created; applied again with a change, updated.
    let samples = Path::new(SAMPLES);
    for sample in [
        "sandbox.yaml",
        "sandboxclaim.yaml",
        "sandboxset-code-interpreter.yaml",
        "sandboxset-desktop.yaml",
    ] {
        let file = samples.join(sample);
        let out = ok(&serve, &["apply", "-f", file.to_str().unwrap()]);
        assert!(out.trim_end().ends_with(" created"), "{sample}: {out}");
    }
    let desktop = std::fs::read_to_string(samples.join("sandboxset-desktop.yaml")).unwrap();
    let changed = desktop.replacen("replicas: 2", "replicas: 4", 1);
    let (success, out, err) = kubectl(&serve, &["apply", "-f", "-"], Some(&changed));
    assert!(success, "{err}");
    assert_eq!(out.trim(), "sandboxset.agents.kruise.io/desktop configured");
    let replicas = ok(&serve, &["get", "sbs", "desktop", "-o", "jsonpath={.spec.replicas}"]);
    assert_eq!(replicas, "4");
    let applied = ok(&serve, &["get", "sbs", "desktop", "-o", "yaml"]);
    assert!(applied.contains("kubectl.kubernetes.io/last-applied-configuration"), "{applied}");
    // What was stored is the template md-sbs.kb.io defaults; what the sample sets stays.
    let stored: serde_json::Value = serde_yaml::from_str(&applied).unwrap();
    let pod = &stored["spec"]["template"]["spec"];
    let (init, main) = (&pod["initContainers"][0], &pod["containers"][0]);
    assert_eq!(stored["spec"]["updateStrategy"]["maxUnavailable"], "20%", "{applied}");
    assert_eq!(pod["automountServiceAccountToken"], false, "{applied}");
    assert_eq!(pod["dnsPolicy"], "ClusterFirst");
    assert_eq!(pod["schedulerName"], "default-scheduler");
    assert_eq!(pod["terminationGracePeriodSeconds"], 1);
    assert_eq!(init["imagePullPolicy"], "IfNotPresent");
    assert_eq!(init["terminationMessagePath"], "/dev/termination-log");
    assert_eq!(main["imagePullPolicy"], "IfNotPresent");
    assert_eq!(main["terminationMessagePolicy"], "File");
    assert_eq!(main["startupProbe"]["httpGet"]["scheme"], "HTTP");
    assert_eq!(main["startupProbe"]["successThreshold"], 1);
    assert_eq!(main["startupProbe"]["failureThreshold"], 20);

    // create of what exists: the API server's AlreadyExists.
    let claim = samples.join("sandboxclaim.yaml");
    let (success, _, err) = kubectl(&serve, &["create", "-f", claim.to_str().unwrap()], None);
    assert!(!success);
    assert_eq!(
        err.trim(),
        "Error from server (AlreadyExists): error when creating \"".to_owned()
            + claim.to_str().unwrap()
            + "\": sandboxclaims.agents.kruise.io \"sandboxclaim-sample\" already exists"
    );

    // scale through the scale subresource.
    assert_eq!(
        ok(&serve, &["scale", "sbs", "base", "--replicas=3"]).trim(),
        "sandboxset.agents.kruise.io/base scaled"
    );
    assert_eq!(ok(&serve, &["get", "sbs", "base", "-o", "jsonpath={.spec.replicas}"]), "3");
    // The default pool went into the store without admission, and a scale write runs no
    // webhook: its template is not defaulted, so its revision holds.
    let base_template = ok(&serve, &["get", "sbs", "base", "-o", "jsonpath={.spec.template.spec}"]);
    assert!(!base_template.contains("dnsPolicy"), "{base_template}");

    // patch: a merge patch applies; a strategic one is refused, as for custom resources on a
    // cluster.
    let patched = ok(
        &serve,
        &[
            "patch",
            "sbs",
            "code-interpreter",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"replicas":1}}"#,
        ],
    );
    assert_eq!(patched.trim(), "sandboxset.agents.kruise.io/code-interpreter patched");
    assert_eq!(
        ok(&serve, &["get", "sbs", "code-interpreter", "-o", "jsonpath={.spec.replicas}"]),
        "1"
    );
    let (success, _, err) = kubectl(
        &serve,
        &["patch", "sbs", "code-interpreter", "-p", r#"{"spec":{"replicas":2}}"#],
        None,
    );
    assert!(!success);
    // kubectl names the patch type and the kind before the server's message.
    assert!(
        err.trim().ends_with(
            "the body of the request was in an unknown format - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        ),
        "{err}"
    );

    // replace with a stale resourceVersion: the API server's Conflict.
    let json = ok(&serve, &["get", "sbs", "code-interpreter", "-o", "json"]);
    let (success, _, err) = kubectl(&serve, &["replace", "-f", "-"], Some(&json));
    assert!(success, "{err}");
    let (success, _, err) = kubectl(&serve, &["replace", "-f", "-"], Some(&json));
    assert!(!success);
    assert_eq!(
        err.trim(),
        "Error from server (Conflict): error when replacing \"STDIN\": Operation cannot be fulfilled \
         on sandboxsets.agents.kruise.io \"code-interpreter\": the object has been modified; please \
         apply your changes to the latest version and try again"
    );

    // delete, then the API server's NotFound.
    assert_eq!(
        ok(&serve, &["delete", "sbs", "desktop"]).trim(),
        "sandboxset.agents.kruise.io \"desktop\" deleted"
    );
    let (success, _, err) = kubectl(&serve, &["get", "sbs", "desktop"], None);
    assert!(!success);
    assert_eq!(
        err.trim(),
        "Error from server (NotFound): sandboxsets.agents.kruise.io \"desktop\" not found"
    );

    // A client that connects and never speaks TLS holds no one up.
    let _silent = std::net::TcpStream::connect(("127.0.0.1", serve.kube)).unwrap();
    let started = std::time::Instant::now();
    ok(&serve, &["get", "sbs", "base"]);
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());

    // Another token is refused.
    let (success, _, err) = kubectl(
        &serve,
        &["get", "sbs", "--token", "e2b_0000000000000000000000000000000000000000"],
        None,
    );
    assert!(!success);
    assert!(err.contains("Unauthorized") || err.contains("provide credentials"), "{err}");

    let kubeconfig_line = format!("KUBECONFIG={}", serve.state.path().join("kubeconfig").display());
    assert!(serve.log().contains(&kubeconfig_line), "{}", serve.log());
}

/// A kubectl that runs in the background (a watch), its stdout read line by line.
struct Background {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Background {
    fn start(serve: &OkaServe, args: &[&str]) -> Self {
        use std::io::BufRead;
        let mut child = Command::new(kubectl_binary())
            .arg("--kubeconfig")
            .arg(serve.state.path().join("kubeconfig"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Background { child, lines }
    }

    /// The next line, within 20 seconds.
    fn line(&self) -> String {
        self.lines.recv_timeout(std::time::Duration::from_secs(20)).expect("a line from kubectl")
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn kubectl_watches_pages_and_selects() {
    if !require_kubectl("kubectl_watches_pages_and_selects") {
        return;
    }
    let serve = serve_without_runtime();

    // `get -w`: the table first, then a row for each change, as it happens.
    let watch = Background::start(&serve, &["get", "sbs", "-w"]);
    assert!(watch.line().starts_with("NAME "));
    assert_eq!(rows(&watch.line())[0][0], "base");
    let json_watch =
        Background::start(&serve, &["get", "sbs", "base", "--watch-only", "-o", "json"]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    ok(&serve, &["scale", "sbs", "base", "--replicas=5"]);
    let scaled = loop {
        let row = rows(&watch.line()).remove(0);
        if row[1] == "5" {
            break row;
        }
    };
    assert_eq!(scaled[0], "base");
    let mut text = String::new();
    let object = loop {
        text.push_str(&json_watch.line());
        text.push('\n');
        if let Ok(object) = serde_json::from_str::<serde_json::Value>(&text) {
            if object["spec"]["replicas"] == 5 {
                break object;
            }
            text.clear();
        }
    };
    assert_eq!(object["kind"], "SandboxSet");

    // A watch from a resourceVersion replays what came after it, as JSON lines; one the store
    // has not reached is refused as the API server refuses it.
    let list = ok(&serve, &["get", "--raw", "/apis/agents.kruise.io/v1alpha1/sandboxsets"]);
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    let rv: u64 = list["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
    ok(&serve, &["scale", "sbs", "base", "--replicas=6"]);
    let events = ok(
        &serve,
        &[
            "get",
            "--raw",
            &format!(
                "/apis/agents.kruise.io/v1alpha1/namespaces/default/sandboxsets?watch=1&resourceVersion={rv}&timeoutSeconds=1"
            ),
        ],
    );
    let events: Vec<serde_json::Value> =
        events.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(!events.is_empty());
    assert!(events.iter().all(|e| e["type"] == "MODIFIED"), "{events:?}");
    assert_eq!(events[0]["object"]["spec"]["replicas"], 6, "{events:?}");
    let (success, _, err) = kubectl(
        &serve,
        &[
            "get",
            "--raw",
            &format!(
                "/apis/agents.kruise.io/v1alpha1/sandboxsets?watch=1&resourceVersion={}",
                rv + 100_000
            ),
        ],
        None,
    );
    assert!(!success);
    assert!(err.contains("Error from server (Timeout): Too large resource version"), "{err}");

    // Pages: kubectl follows `continue` through a list of one item per page.
    for n in 0..4 {
        let name = format!("extra-{n}");
        let yaml = format!(
            "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxSet\nmetadata:\n  name: {name}\nspec:\n  replicas: 0\n  template:\n    spec:\n      containers:\n      - name: main\n        image: busybox\n"
        );
        let (success, _, err) = kubectl(&serve, &["create", "-f", "-"], Some(&yaml));
        assert!(success, "{err}");
    }
    let all = ok(&serve, &["get", "sbs", "-o", "name"]);
    let paged = ok(&serve, &["get", "sbs", "-o", "name", "--chunk-size=1"]);
    assert_eq!(all.lines().count(), 5, "{all}");
    assert_eq!(paged, all);
    let page = ok(&serve, &["get", "--raw", "/apis/agents.kruise.io/v1alpha1/sandboxsets?limit=2"]);
    let page: serde_json::Value = serde_json::from_str(&page).unwrap();
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    assert_eq!(page["metadata"]["remainingItemCount"], 3);

    // Field selectors: the name and namespace, and the API server's error for anything else.
    let one =
        ok(&serve, &["get", "sbs", "-o", "name", "--field-selector", "metadata.name=extra-2"]);
    assert_eq!(one.trim(), "sandboxset.agents.kruise.io/extra-2");
    let (success, _, err) =
        kubectl(&serve, &["get", "sbs", "--field-selector", "spec.replicas=1"], None);
    assert!(!success);
    assert!(err.trim().ends_with("field label not supported: spec.replicas"), "{err}");
}

#[test]
fn kubectl_patches_dry_runs_and_deletes_with_a_policy() {
    if !require_kubectl("kubectl_patches_dry_runs_and_deletes_with_a_policy") {
        return;
    }
    let serve = serve_without_runtime();
    let replicas =
        |serve: &OkaServe| ok(serve, &["get", "sbs", "base", "-o", "jsonpath={.spec.replicas}"]);

    // JSON patch: applied in order; a failing `test` or a missing path changes nothing.
    let out = ok(
        &serve,
        &[
            "patch",
            "sbs",
            "base",
            "--type",
            "json",
            "-p",
            r#"[{"op":"replace","path":"/spec/replicas","value":3}]"#,
        ],
    );
    assert_eq!(out.trim(), "sandboxset.agents.kruise.io/base patched");
    assert_eq!(replicas(&serve), "3");
    let (success, _, err) = kubectl(
        &serve,
        &[
            "patch",
            "sbs",
            "base",
            "--type",
            "json",
            "-p",
            r#"[{"op":"replace","path":"/spec/replicas","value":7},{"op":"test","path":"/spec/replicas","value":9}]"#,
        ],
        None,
    );
    assert!(!success);
    assert!(err.contains("testing value /spec/replicas failed"), "{err}");
    assert_eq!(replicas(&serve), "3");

    // Admission: a field the schema does not know fails under kubectl's default (strict)
    // validation and is pruned with a warning under --validate=warn; a value of the wrong type
    // is Invalid, with the field's path.
    let typo = "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxSet\nmetadata:\n  name: typo\nspec:\n  replicass: 2\n  replicas: 0\n  template:\n    spec:\n      containers:\n      - name: main\n        image: busybox\n";
    let (success, _, err) = kubectl(&serve, &["apply", "-f", "-"], Some(typo));
    assert!(!success);
    assert_eq!(
        err.trim(),
        "Error from server (BadRequest): error when creating \"STDIN\": SandboxSet in version \
         \"v1alpha1\" cannot be handled as a SandboxSet: strict decoding error: unknown field \
         \"spec.replicass\""
    );
    let (success, out, err) = kubectl(&serve, &["apply", "--validate=warn", "-f", "-"], Some(typo));
    assert!(success, "{err}");
    assert_eq!(out.trim(), "sandboxset.agents.kruise.io/typo created");
    assert!(err.contains("Warning: unknown field \"spec.replicass\""), "{err}");
    let spec = ok(&serve, &["get", "sbs", "typo", "-o", "jsonpath={.spec}"]);
    assert!(!spec.contains("replicass"), "{spec}");
    let (success, _, err) = kubectl(
        &serve,
        &["patch", "sbs", "typo", "--type", "merge", "-p", r#"{"spec":{"replicas":"two"}}"#],
        None,
    );
    assert!(!success);
    assert_eq!(
        err.trim(),
        "The SandboxSet \"typo\" is invalid: \n\
         * spec.replicas: Invalid value: \"string\": \
         spec.replicas in body must be of type integer: \"string\"\n\
         * <nil>: Invalid value: \"null\": some validation rules were not checked because the \
         object was invalid; correct the existing errors to complete validation"
    );

    // The reference's webhook rules, worded as the API server words a webhook's denial.
    let negative = "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxSet\nmetadata:\n  name: neg\nspec:\n  replicas: -1\n  templateRef:\n    name: base\n";
    let (success, _, err) = kubectl(&serve, &["create", "-f", "-"], Some(negative));
    assert!(!success);
    assert_eq!(
        err.trim(),
        "Error from server: error when creating \"STDIN\": admission webhook \"v-sbs.kb.io\" denied \
         the request: spec.replicas: Invalid value: -1: replicas cannot be negative"
    );
    // Its pod template validation: Kubernetes' own rules for a PodTemplateSpec.
    let bad_port = "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxSet\nmetadata:\n  name: bad-port\nspec:\n  replicas: 1\n  template:\n    spec:\n      containers:\n      - name: main\n        image: busybox\n        ports:\n        - containerPort: 70000\n";
    let (success, _, err) = kubectl(&serve, &["apply", "-f", "-"], Some(bad_port));
    assert!(!success);
    assert_eq!(
        err.trim(),
        "Error from server: error when creating \"STDIN\": admission webhook \"v-sbs.kb.io\" denied \
         the request: spec.template.spec.containers[0].ports[0].containerPort: Invalid value: \
         70000: must be between 1 and 65535, inclusive"
    );
    let ops = |name: &str| {
        format!(
            "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxUpdateOps\nmetadata:\n  name: {name}\nspec:\n  paused: true\n  selector:\n    matchLabels:\n      a: b\n  patch:\n    metadata:\n      labels:\n        upgraded: \"yes\"\n"
        )
    };
    // A running sandbox the first ops selects and, paused, does not start upgrading: it stays
    // active.
    let target = "apiVersion: agents.kruise.io/v1alpha1\nkind: Sandbox\nmetadata:\n  name: target\n  labels:\n    a: b\nspec:\n  template:\n    spec:\n      containers:\n      - name: main\n        image: busybox\n";
    let (success, _, err) = kubectl(&serve, &["create", "-f", "-"], Some(target));
    assert!(success, "{err}");
    let running = r#"{"status":{"phase":"Running"}}"#;
    ok(
        &serve,
        &["patch", "sbx", "target", "--subresource=status", "--type", "merge", "-p", running],
    );
    let (success, _, err) = kubectl(&serve, &["create", "-f", "-"], Some(&ops("u1")));
    assert!(success, "{err}");
    wait_for(&serve, &["get", "suo", "u1", "-o", "jsonpath={.status.phase}"], "u1 updating", |o| {
        o == "Updating"
    });
    let (success, _, err) = kubectl(&serve, &["create", "-f", "-"], Some(&ops("u2")));
    assert!(!success);
    assert!(
        err.trim().ends_with(
            "admission webhook \"v-suo.kb.io\" denied the request: spec: Forbidden: there is an \
             active SandboxUpdateOps in the same namespace: u1"
        ),
        "{err}"
    );
    let (success, _, err) = kubectl(
        &serve,
        &[
            "patch",
            "suo",
            "u1",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"selector":{"matchLabels":{"a":"c"}}}}"#,
        ],
        None,
    );
    assert!(!success);
    assert_eq!(
        err.trim(),
        "Error from server: admission webhook \"v-suo.kb.io\" denied the request: spec.selector: \
         Forbidden: selector is immutable"
    );
    ok(&serve, &["delete", "suo", "u1"]);
    ok(&serve, &["delete", "sbx", "target"]);

    // dryRun=All: every answer, no write.
    let out = ok(&serve, &["scale", "sbs", "base", "--replicas=9", "--dry-run=server"]);
    assert_eq!(out.trim(), "sandboxset.agents.kruise.io/base scaled (server dry run)");
    assert_eq!(replicas(&serve), "3");
    let out = ok(&serve, &["delete", "sbs", "base", "--dry-run=server"]);
    assert_eq!(out.trim(), "sandboxset.agents.kruise.io \"base\" deleted (server dry run)");
    let claim = Path::new(SAMPLES).join("sandboxclaim.yaml");
    let out =
        ok(&serve, &["create", "-f", claim.to_str().unwrap(), "--dry-run=server", "-o", "name"]);
    assert_eq!(out.trim(), "sandboxclaim.agents.kruise.io/sandboxclaim-sample");
    let (_, none, _) = kubectl(&serve, &["get", "sbc", "-o", "name"], None);
    assert_eq!(none, "", "a dry-run create writes nothing");

    // The status subresource takes patches.
    ok(&serve, &["create", "-f", claim.to_str().unwrap()]);
    let out = ok(
        &serve,
        &[
            "patch",
            "sbc",
            "sandboxclaim-sample",
            "--subresource=status",
            "--type",
            "merge",
            "-p",
            r#"{"status":{"message":"set by hand"}}"#,
        ],
    );
    assert_eq!(out.trim(), "sandboxclaim.agents.kruise.io/sandboxclaim-sample patched");
    let message =
        ok(&serve, &["get", "sbc", "sandboxclaim-sample", "-o", "jsonpath={.status.message}"]);
    assert_eq!(message, "set by hand");

    // The CRDs' CEL rules: a claim's replicas are immutable (a transition rule, checked
    // against the stored claim).
    let (success, _, err) = kubectl(
        &serve,
        &[
            "patch",
            "sbc",
            "sandboxclaim-sample",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"replicas":5}}"#,
        ],
        None,
    );
    assert!(!success);
    assert_eq!(
        err.trim(),
        "The SandboxClaim \"sandboxclaim-sample\" is invalid: spec.replicas: Invalid value: \
         \"integer\": replicas is immutable"
    );

    // Orphan keeps the pool's sandboxes without their owner; the default deletes them with it.
    let owned = |serve: &OkaServe| {
        ok(
            serve,
            &[
                "get",
                "sbx",
                "-o",
                "jsonpath={range .items[*]}{.metadata.ownerReferences[0].name}{\"\\n\"}{end}",
            ],
        )
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while owned(&serve).lines().filter(|l| *l == "base").count() < 3 {
        assert!(std::time::Instant::now() < deadline, "the pool did not fill:\n{}", serve.log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    ok(&serve, &["delete", "sbs", "base", "--cascade=orphan"]);
    let left = owned(&serve);
    assert_eq!(left.lines().count(), 3, "{left}");
    assert!(left.lines().all(str::is_empty), "{left}");

    let yaml = "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxSet\nmetadata:\n  name: other\nspec:\n  replicas: 1\n  template:\n    spec:\n      containers:\n      - name: main\n        image: busybox\n";
    let (success, _, err) = kubectl(&serve, &["create", "-f", "-"], Some(yaml));
    assert!(success, "{err}");
    while !owned(&serve).lines().any(|l| l == "other") {
        assert!(std::time::Instant::now() < deadline, "the pool did not fill:\n{}", serve.log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Foreground: kubectl waits for the pool, which goes once its sandboxes are gone.
    assert_eq!(
        ok(&serve, &["delete", "sbs", "other", "--cascade=foreground"]).trim(),
        "sandboxset.agents.kruise.io \"other\" deleted"
    );
    assert!(!owned(&serve).lines().any(|l| l == "other"), "the pool's sandboxes stayed");
    let (success, _, err) = kubectl(&serve, &["get", "sbs", "other"], None);
    assert!(!success && err.contains("NotFound"), "{err}");
    // Background (the default): the pool goes at once, its sandboxes right after.
    let (success, _, err) =
        kubectl(&serve, &["create", "-f", "-"], Some(&yaml.replace("name: other", "name: third")));
    assert!(success, "{err}");
    while !owned(&serve).lines().any(|l| l == "third") {
        assert!(std::time::Instant::now() < deadline, "the pool did not fill:\n{}", serve.log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    ok(&serve, &["delete", "sbs", "third"]);
    while owned(&serve).lines().any(|l| l == "third") {
        assert!(
            std::time::Instant::now() < deadline,
            "the pool's sandboxes stayed:\n{}",
            serve.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// POSTs `body` to the E2B API of `serve` with the admin key, expecting 201: the answer's JSON.
fn e2b_post(serve: &OkaServe, path: &str, body: &str) -> serde_json::Value {
    let (code, answer) = e2b_call(serve, "POST", path, body);
    assert_eq!(code, 201, "{answer}");
    serde_json::from_str(&answer).unwrap()
}

#[test]
fn a_team_key_is_confined_to_its_namespace() {
    if !require_kubectl("a_team_key_is_confined_to_its_namespace") {
        return;
    }
    let serve = serve_without_runtime();
    let created = e2b_post(&serve, "/api-keys", r#"{"name":"ci","teamName":"team-a"}"#);
    let key = created["key"].as_str().unwrap().to_owned();
    let as_team = |args: &[&str]| {
        let mut all = vec!["--token", key.as_str()];
        all.extend_from_slice(args);
        kubectl(&serve, &all, None)
    };
    let (success, out, err) = as_team(&["get", "sbs", "-n", "team-a"]);
    assert!(success, "{err}");
    assert_eq!((out.as_str(), err.trim()), ("", "No resources found in team-a namespace."));
    let pool = "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxSet\nmetadata:\n  name: mine\nspec:\n  replicas: 0\n  template:\n    spec:\n      containers:\n      - name: main\n        image: busybox\n";
    let (success, out, err) =
        kubectl(&serve, &["--token", &key, "-n", "team-a", "apply", "-f", "-"], Some(pool));
    assert!(success, "{err}");
    assert_eq!(out.trim(), "sandboxset.agents.kruise.io/mine created");

    // Elsewhere, RBAC's answer.
    let (success, _, err) = as_team(&["get", "sbs", "-n", "default"]);
    assert!(!success);
    assert_eq!(
        err.trim(),
        "Error from server (Forbidden): sandboxsets.agents.kruise.io is forbidden: User \"team-a\" \
         cannot list resource \"sandboxsets\" in API group \"agents.kruise.io\" in the namespace \
         \"default\""
    );
    let (success, _, err) = as_team(&["get", "sbx", "-A"]);
    assert!(!success);
    assert!(err.trim().ends_with("at the cluster scope"), "{err}");
    let (success, _, err) = as_team(&["scale", "sbs", "base", "-n", "default", "--replicas=9"]);
    assert!(!success);
    assert!(
        err.contains("cannot get resource \"sandboxsets\"") || err.contains("cannot patch"),
        "{err}"
    );
    assert_eq!(ok(&serve, &["get", "sbs", "base", "-o", "jsonpath={.spec.replicas}"]), "2");
    // The admin still sees the team's pool.
    assert_eq!(
        ok(&serve, &["get", "sbs", "mine", "-n", "team-a", "-o", "name"]).trim(),
        "sandboxset.agents.kruise.io/mine"
    );
}

#[test]
fn kubectl_manages_the_core_kinds_the_system_keeps() {
    if !require_kubectl("kubectl_manages_the_core_kinds_the_system_keeps") {
        return;
    }
    let serve = serve_without_runtime();
    // kubectl sends built-in kinds as protobuf and patches them strategically.
    assert_eq!(
        ok(&serve, &["create", "configmap", "cfg", "--from-literal=a=b"]).trim(),
        "configmap/cfg created"
    );
    assert_eq!(
        ok(&serve, &["create", "secret", "generic", "s1", "--from-literal=x=y"]).trim(),
        "secret/s1 created"
    );
    assert_eq!(ok(&serve, &["get", "secret", "s1", "-o", "jsonpath={.data.x}"]), "eQ==");
    let secrets = rows(&ok(&serve, &["get", "secrets"]));
    assert_eq!(secrets[0], ["NAME", "TYPE", "DATA", "AGE"]);
    assert_eq!(secrets[1][..3], ["s1", "Opaque", "1"]);
    assert_eq!(ok(&serve, &["label", "cm", "cfg", "team=x"]).trim(), "configmap/cfg labeled");
    assert_eq!(ok(&serve, &["get", "cm", "-l", "team=x", "-o", "name"]).trim(), "configmap/cfg");
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\ndata:\n  k: v\n";
    let (success, out, err) = kubectl(&serve, &["apply", "-f", "-"], Some(cm));
    assert!(success, "{err}");
    assert_eq!(out.trim(), "configmap/applied created");
    let (success, out, err) =
        kubectl(&serve, &["apply", "-f", "-"], Some(&cm.replace("k: v", "k: w")));
    assert!(success, "{err}");
    assert_eq!(out.trim(), "configmap/applied configured");
    assert_eq!(ok(&serve, &["get", "cm", "applied", "-o", "jsonpath={.data.k}"]), "w");
    let lease = "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: leader\nspec:\n  holderIdentity: me\n  leaseDurationSeconds: 15\n";
    let (success, _, err) = kubectl(&serve, &["apply", "-f", "-"], Some(lease));
    assert!(success, "{err}");
    let leases = rows(&ok(&serve, &["get", "leases"]));
    assert_eq!(leases[0], ["NAME", "HOLDER", "AGE"]);
    assert_eq!(leases[1][..2], ["leader", "me"]);
    assert_eq!(ok(&serve, &["delete", "cm", "cfg"]).trim(), "configmap \"cfg\" deleted");
    // A group serves its own resources only.
    let (success, _, err) =
        kubectl(&serve, &["get", "--raw", "/api/v1/namespaces/default/sandboxes"], None);
    assert!(!success);
    assert!(err.contains("NotFound"), "{err}");
    // Events take the API server's field selectors.
    let (success, _, err) = kubectl(
        &serve,
        &["get", "events", "--field-selector", "involvedObject.kind=Sandbox,type=Warning"],
        None,
    );
    assert!(success, "{err}");
}

#[test]
fn kubectl_describes_a_sandbox_with_its_events() {
    if !require_kubectl("kubectl_describes_a_sandbox_with_its_events") {
        return;
    }
    if !Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n") {
        eprintln!(
            "SKIPPED kubectl_describes_a_sandbox_with_its_events: the local runtime needs root"
        );
        return;
    }
    let serve = OkaServe::start(env!("CARGO_BIN_EXE_oka"), "", &[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let started = loop {
        let (_, out, _) = kubectl(
            &serve,
            &["get", "events", "--field-selector", "reason=SandboxRunning", "-o", "name"],
            None,
        );
        // The base pool's two (a code-interpreter pool runs too where oka-interpreter is built).
        if out.lines().filter(|l| l.starts_with("event/base-")).count() >= 2 {
            break out;
        }
        assert!(std::time::Instant::now() < deadline, "no events:\n{}", serve.log());
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    // Each event is about a pool's sandbox (the events of one are named after it).
    assert!(
        started
            .lines()
            .all(|l| l.starts_with("event/base-") || l.starts_with("event/code-interpreter-v1-")),
        "{started}"
    );
    let events = rows(&ok(&serve, &["get", "events"]));
    assert_eq!(events[0], ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]);
    let sandbox = ok(
        &serve,
        &[
            "get",
            "sbx",
            "-l",
            "agents.kruise.io/sandbox-pool=base",
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ],
    );
    let described = ok(&serve, &["describe", "sbx", &sandbox]);
    let tail: Vec<Vec<String>> = rows(&described[described.find("Events:").unwrap()..]);
    assert!(
        tail.iter().any(|r| r.starts_with(&["Normal".into(), "SandboxRunning".into()])
            && r.ends_with(&["Sandbox".into(), "started".into()])),
        "{described}"
    );
    // A restart (what `okactl restart sbx` asks for): the same sandbox, new processes.
    let id = ok(&serve, &["get", "sbx", &sandbox, "-o", "jsonpath={.status.podInfo.podUID}"]);
    let init_pid = || {
        let record = walk_find(serve.state.path(), &format!("sandboxes/{id}/state.json"))
            .unwrap_or_else(|| panic!("no state of {id}"));
        let state: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(record).unwrap()).unwrap();
        state.pointer("/instance/pid").and_then(serde_json::Value::as_u64)
    };
    let before = init_pid();
    assert!(before.is_some(), "no init pid of {id}");
    let requested = "agents.kruise.io/restart-requested-at=2026-12-05T10:00:00.5Z";
    ok(&serve, &["annotate", "sbx", &sandbox, requested]);
    loop {
        let done = ok(
            &serve,
            &[
                "get",
                "sbx",
                &sandbox,
                "-o",
                "jsonpath={.metadata.annotations.agents\\.kruise\\.io/restarted-at} {.status.phase}",
            ],
        );
        let after = init_pid();
        if done == "2026-12-05T10:00:00.5Z Running" && after.is_some() && after != before {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not restarted: {done}\n{}", serve.log());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let described = ok(&serve, &["describe", "sbx", &sandbox]);
    assert!(described.contains("SandboxRestarted"), "{described}");

    // A sandbox deleted with kubectl is gone, and its pool makes another.
    assert_eq!(
        ok(&serve, &["delete", "sbx", &sandbox]).trim(),
        format!("sandbox.agents.kruise.io \"{sandbox}\" deleted")
    );
    loop {
        let base = "agents.kruise.io/sandbox-pool=base";
        let names = ok(&serve, &["get", "sbx", "-l", base, "-o", "name"]);
        let running =
            ok(&serve, &["get", "sbx", "-l", base, "-o", "jsonpath={.items[*].status.phase}"]);
        if !names.contains(&sandbox)
            && running.split_whitespace().filter(|p| *p == "Running").count() == 2
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no replacement:\n{names}\n{}", serve.log());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn the_python_kubernetes_client_manages_oka_serve() {
    let root = std::env::var_os("OKA_E2B_VENV_ROOT").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv"),
        std::path::PathBuf::from,
    );
    let python = root.join("e2b-latest/bin/python");
    let has_client = Command::new(&python)
        .args(["-c", "import kubernetes"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_client {
        assert!(
            std::env::var_os("CI").is_none(),
            "{} has no kubernetes client: scripts/setup-e2b-sdk.sh installs it",
            python.display()
        );
        eprintln!("SKIPPED: no Python kubernetes client (scripts/setup-e2b-sdk.sh installs it)");
        return;
    }
    let serve = serve_without_runtime();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kube/python_client.py");
    let out = Command::new(&python)
        .arg(&script)
        .env("KUBECONFIG", serve.state.path().join("kubeconfig"))
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(
        out.status.success() && text(&out.stdout).trim() == "ok",
        "{}{}\n{}",
        text(&out.stdout),
        text(&out.stderr),
        serve.log()
    );
}

/// POSTs `body` to the E2B API of `serve` with the admin key: the status code and the body.
fn e2b_call(serve: &OkaServe, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", serve.api)).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nX-API-Key: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        serve.key(),
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let code = answer.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (code, body)
}

#[test]
fn a_pool_scaled_with_kubectl_during_a_burst_of_creates_loses_and_doubles_none() {
    if !require_kubectl("a_pool_scaled_with_kubectl_during_a_burst_of_creates") {
        return;
    }
    if !Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n") {
        eprintln!("SKIPPED: the local runtime needs root");
        return;
    }
    let serve = std::sync::Arc::new(OkaServe::start(env!("CARGO_BIN_EXE_oka"), "", &[]));
    serve.wait_sandboxes(2, std::time::Duration::from_secs(60));
    let creates = 16;
    let burst: Vec<_> = (0..creates)
        .map(|_| {
            let serve = std::sync::Arc::clone(&serve);
            std::thread::spawn(move || {
                e2b_call(&serve, "POST", "/sandboxes", r#"{"templateID":"base","timeout":300}"#)
            })
        })
        .collect();
    ok(&serve, &["scale", "sbs", "base", "--replicas=6"]);
    std::thread::sleep(std::time::Duration::from_millis(200));
    ok(&serve, &["scale", "sbs", "base", "--replicas=1"]);
    let mut ids = std::collections::BTreeSet::new();
    for create in burst {
        let (code, body) = create.join().unwrap();
        assert_eq!(code, 201, "{body}\n{}", serve.log());
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            ids.insert(answer["sandboxID"].as_str().unwrap().to_owned()),
            "a sandbox was given twice: {body}"
        );
    }
    assert_eq!(ids.len(), creates);
    // Each is one claimed Sandbox, running; the pool keeps its one unclaimed sandbox.
    let claimed =
        ok(&serve, &["get", "sbx", "-l", "agents.kruise.io/sandbox-claimed=true", "-o", "name"]);
    assert_eq!(claimed.lines().count(), creates, "{claimed}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let pool = ok(
            &serve,
            &[
                "get",
                "sbx",
                "-l",
                "agents.kruise.io/sandbox-pool=base,agents.kruise.io/sandbox-claimed=false",
                "-o",
                "name",
            ],
        );
        if pool.lines().count() == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the pool did not settle at 1:\n{pool}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    for id in &ids {
        let (code, body) = e2b_call(&serve, "GET", &format!("/sandboxes/{id}"), "");
        assert_eq!(code, 200, "{id}: {body}");
    }
}

#[test]
fn an_api_key_added_to_the_key_store_secret_works_at_once() {
    if !require_kubectl("an_api_key_added_to_the_key_store_secret_works_at_once") {
        return;
    }
    let serve = serve_without_runtime();
    let key = "e2b_00112233445566778899aabbccddeeff00112233";
    let hash = Command::new("sh")
        .args(["-c", &format!("printf %s {key} | sha256sum | cut -d' ' -f1")])
        .output()
        .unwrap();
    let hash = String::from_utf8(hash.stdout).unwrap().trim().to_owned();
    let record = serde_json::json!({
        "id": "7d0c1c52-9a7e-4a59-9a64-2f5d8d3c1b11",
        "name": "added with kubectl",
        "keyHash": hash,
        "mask": {"maskedValuePrefix": "00", "maskedValueSuffix": "2233", "prefix": "e2b_", "valueLength": 40},
        "createdAt": "2026-01-01T00:00:00Z",
        "createdBy": null,
        "team": {"id": "a3c8f1b2-0000-4000-8000-000000000001", "name": "team-b"},
    });
    // The key is unknown first.
    let unknown = |serve: &OkaServe| {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", serve.api)).unwrap();
        write!(
            stream,
            "GET /sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer[9..12].to_owned()
    };
    assert_eq!(unknown(&serve), "401");
    let out = ok(
        &serve,
        &[
            "create",
            "secret",
            "generic",
            "e2b-key-store",
            "-n",
            "sandbox-system",
            &format!("--from-literal=7d0c1c52-9a7e-4a59-9a64-2f5d8d3c1b11={record}"),
        ],
    );
    assert_eq!(out.trim(), "secret/e2b-key-store created");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while unknown(&serve) != "200" {
        assert!(std::time::Instant::now() < deadline, "the key added as a Secret is not taken");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // And on the Kubernetes API, as the team's token.
    let (success, out, err) =
        kubectl(&serve, &["--token", key, "get", "sbs", "-n", "team-b"], None);
    assert!(success, "{err}");
    assert_eq!((out.as_str(), err.trim()), ("", "No resources found in team-b namespace."));
}

#[test]
fn kubectl_applies_server_side_with_field_managers_and_conflicts() {
    if !require_kubectl("kubectl_applies_server_side_with_field_managers_and_conflicts") {
        return;
    }
    let serve = serve_without_runtime();
    // The container is written with the defaults md-sbs.kb.io gives it: the template is
    // schemaless, so `containers` is an atomic list, and a manager applying it without them
    // would change the defaulted list its first applier owns (a conflict, as on a cluster).
    let pool = |replicas: u32| {
        format!(
            "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxSet\nmetadata:\n  name: ssa\n  labels:\n    team: a\nspec:\n  replicas: {replicas}\n  template:\n    spec:\n      containers:\n      - name: main\n        image: busybox\n        imagePullPolicy: Always\n        terminationMessagePath: /dev/termination-log\n        terminationMessagePolicy: File\n"
        )
    };
    // alice applies the label too; bob does not.
    let apply = |manager: &str, replicas: u32, force: bool| {
        let mut args = vec!["apply", "--server-side", "--field-manager", manager, "-f", "-"];
        if force {
            args.push("--force-conflicts");
        }
        let mut config = pool(replicas);
        if manager != "alice" {
            config = config.replace("  labels:\n    team: a\n", "");
        }
        kubectl(&serve, &args, Some(&config))
    };
    let (success, out, err) = apply("alice", 0, false);
    assert!(success, "{err}");
    assert_eq!(out.trim(), "sandboxset.agents.kruise.io/ssa serverside-applied");
    let (success, out, err) = apply("alice", 0, false);
    assert!(success && out.trim() == "sandboxset.agents.kruise.io/ssa serverside-applied", "{err}");
    // Another manager changing alice's field: a conflict, until forced.
    let (success, _, err) = apply("bob", 2, false);
    assert!(!success);
    assert!(
        err.starts_with(
            "error: Apply failed with 1 conflict: conflict with \"alice\": .spec.replicas\n"
        ),
        "{err}"
    );
    let (success, _, err) = apply("bob", 2, true);
    assert!(success, "{err}");
    assert_eq!(ok(&serve, &["get", "sbs", "ssa", "-o", "jsonpath={.spec.replicas}"]), "2");
    let managed = ok(&serve, &["get", "sbs", "ssa", "--show-managed-fields", "-o", "json"]);
    let managed: serde_json::Value = serde_json::from_str(&managed).unwrap();
    let entries = managed["metadata"]["managedFields"].as_array().unwrap();
    let owner_of_replicas: Vec<&str> = entries
        .iter()
        .filter(|e| e["fieldsV1"]["f:spec"].get("f:replicas").is_some())
        .map(|e| e["manager"].as_str().unwrap())
        .collect();
    assert_eq!(owner_of_replicas, ["bob"]);
    assert!(entries.iter().all(|e| e["operation"] == "Apply" && e["fieldsType"] == "FieldsV1"));
    // A label alice stops applying goes: no one else applied it.
    let unlabelled = pool(2).replace("  labels:\n    team: a\n", "");
    let (success, _, err) = kubectl(
        &serve,
        &["apply", "--server-side", "--field-manager", "alice", "-f", "-"],
        Some(&unlabelled),
    );
    assert!(success, "{err}");
    let labels = ok(&serve, &["get", "sbs", "ssa", "-o", "jsonpath={.metadata.labels}"]);
    assert!(!labels.contains("team"), "{labels}");
    // A write that is not an apply owns what it changed, for its field manager.
    ok(
        &serve,
        &[
            "patch",
            "sbs",
            "ssa",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"replicas":5}}"#,
            "--field-manager",
            "ops",
        ],
    );
    let (success, _, err) = apply("bob", 2, false);
    assert!(!success);
    assert!(
        err.starts_with(
            "error: Apply failed with 1 conflict: conflict with \"ops\" using agents.kruise.io/v1alpha1: .spec.replicas\n"
        ),
        "{err}"
    );
}

#[test]
fn kubectl_creates_and_deletes_namespaces() {
    if !require_kubectl("kubectl_creates_and_deletes_namespaces") {
        return;
    }
    let serve = serve_without_runtime();
    assert_eq!(ok(&serve, &["create", "namespace", "team-a"]).trim(), "namespace/team-a created");
    let namespaces = rows(&ok(&serve, &["get", "namespaces"]));
    assert_eq!(namespaces[0], ["NAME", "STATUS", "AGE"]);
    let names: Vec<&str> = namespaces[1..].iter().map(|row| row[0].as_str()).collect();
    for name in ["default", "kube-node-lease", "kube-public", "kube-system", "team-a"] {
        assert!(names.contains(&name), "{namespaces:?}");
    }
    assert_eq!(
        ok(&serve, &["get", "ns", "team-a", "-o", "jsonpath={.status.phase} {.metadata.labels}"]),
        r#"Active {"kubernetes.io/metadata.name":"team-a"}"#
    );
    assert_eq!(
        ok(&serve, &["label", "ns", "team-a", "tier=gold"]).trim(),
        "namespace/team-a labeled"
    );
    assert_eq!(
        ok(&serve, &["get", "ns", "-l", "tier=gold", "-o", "name"]).trim(),
        "namespace/team-a"
    );

    // Objects go into a namespace that exists, as on a cluster.
    let pool = "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxSet\nmetadata:\n  name: pool\nspec:\n  replicas: 0\n  template:\n    spec:\n      containers:\n      - name: main\n        image: busybox\n";
    let (success, _, err) = kubectl(&serve, &["apply", "-n", "nowhere", "-f", "-"], Some(pool));
    assert!(!success);
    assert!(err.contains(r#"namespaces "nowhere" not found"#), "{err}");
    let (success, out, err) = kubectl(&serve, &["apply", "-n", "team-a", "-f", "-"], Some(pool));
    assert!(success, "{err}");
    assert_eq!(out.trim(), "sandboxset.agents.kruise.io/pool created");
    ok(&serve, &["create", "configmap", "-n", "team-a", "settings", "--from-literal=a=b"]);

    let (success, _, err) = kubectl(&serve, &["delete", "ns", "default"], None);
    assert!(!success);
    assert!(err.contains("this namespace may not be deleted"), "{err}");
    let (success, _, err) = kubectl(&serve, &["create", "ns", "Team_B"], None);
    assert!(!success);
    assert!(err.contains("a lowercase RFC 1123 label must consist of"), "{err}");

    // Deleting a namespace deletes what it holds; kubectl waits until it is gone.
    let (success, out, err) = kubectl(&serve, &["delete", "ns", "team-a", "--timeout=60s"], None);
    assert!(success, "{err}\n{}", serve.log());
    assert_eq!(out.trim(), r#"namespace "team-a" deleted"#);
    let (success, _, err) = kubectl(&serve, &["get", "ns", "team-a"], None);
    assert!(!success);
    assert!(err.contains(r#"namespaces "team-a" not found"#), "{err}");
    assert_eq!(ok(&serve, &["get", "sbs,cm", "-n", "team-a", "-o", "name"]).trim(), "");
    // The name is free again.
    assert_eq!(ok(&serve, &["create", "namespace", "team-a"]).trim(), "namespace/team-a created");
}

/// The first file under `dir` whose path ends with `suffix`.
fn walk_find(dir: &Path, suffix: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.to_string_lossy().ends_with(suffix) {
            return Some(path);
        }
        if entry.file_type().is_ok_and(|t| t.is_dir() && !t.is_symlink())
            && let Some(found) = walk_find(&path, suffix)
        {
            return Some(found);
        }
    }
    None
}

/// A SandboxUpdateOps upgrades standalone sandboxes one at a time by patching their template;
/// the sandbox controller replaces each instance (Recreate) and the ops completes.
#[test]
fn a_sandbox_update_ops_upgrades_sandboxes_with_kubectl() {
    if !require_kubectl("a_sandbox_update_ops_upgrades_sandboxes_with_kubectl") {
        return;
    }
    if !Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n") {
        eprintln!("SKIPPED a_sandbox_update_ops_upgrades_sandboxes_with_kubectl: needs root");
        return;
    }
    // The host's programs as a root directory: an image that is not a path is pulled.
    let root = support::host_root();
    let image = format!("image: {}", root.path().display());
    let serve = OkaServe::start(env!("CARGO_BIN_EXE_oka"), "", &[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let sandbox = |name: &str| {
        format!(
            "apiVersion: agents.kruise.io/v1alpha1\nkind: Sandbox\nmetadata:\n  name: {name}\n  labels:\n    app: agent\nspec:\n  template:\n    spec:\n      containers:\n      - name: main\n        image: busybox\n        command: [\"sleep\", \"infinity\"]\n"
        )
        .replace("image: busybox", &image)
    };
    for name in ["agent-a", "agent-b"] {
        let (success, _, err) = kubectl(&serve, &["apply", "-f", "-"], Some(&sandbox(name)));
        assert!(success, "{err}");
    }
    let phases = |serve: &OkaServe| {
        ok(serve, &["get", "sbx", "-l", "app=agent", "-o", "jsonpath={.items[*].status.phase}"])
    };
    while phases(&serve) != "Running Running" {
        assert!(std::time::Instant::now() < deadline, "not running:\n{}", serve.log());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let ops = "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxUpdateOps\nmetadata:\n  name: add-env\nspec:\n  selector:\n    matchLabels:\n      app: agent\n  patch:\n    spec:\n      containers:\n      - name: main\n        env:\n        - name: UPGRADED\n          value: \"yes\"\n";
    let (success, out, err) = kubectl(&serve, &["apply", "-f", "-"], Some(ops));
    assert!(success, "{err}");
    assert_eq!(out.trim(), "sandboxupdateops.agents.kruise.io/add-env created");
    loop {
        let status = ok(
            &serve,
            &[
                "get",
                "suo",
                "add-env",
                "-o",
                "jsonpath={.status.phase} {.status.updatedReplicas}/{.status.replicas}",
            ],
        );
        if status == "Completed 2/2" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not upgraded: {status}\n{}", serve.log());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    for name in ["agent-a", "agent-b"] {
        let upgraded = ok(
            &serve,
            &[
                "get",
                "sbx",
                name,
                "-o",
                "jsonpath={.status.phase} {.status.conditions[?(@.type==\"Upgrading\")].reason} {.spec.template.spec.containers[0].env[0].value}",
            ],
        );
        assert_eq!(upgraded, "Running Succeeded yes", "{name}");
    }
    let described = ok(&serve, &["describe", "suo", "add-env"]);
    assert!(described.contains("SandboxUpgrading"), "{described}");
    // Deleting the ops releases its sandboxes.
    ok(&serve, &["delete", "suo", "add-env"]);
    assert_eq!(
        ok(&serve, &["get", "sbx", "-l", "agents.kruise.io/update-ops", "-o", "name"]).trim(),
        ""
    );
    // Without an upgradePolicy a template change is made in place: a new memory limit applies
    // to the running processes; a new command cannot, and says so.
    while !ok(&serve, &["get", "sbx", "agent-a", "-o", "jsonpath={.spec.upgradePolicy}"]).is_empty()
    {
        assert!(std::time::Instant::now() < deadline, "the upgradePolicy stays");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let limit = r#"[{"op":"add","path":"/spec/template/spec/containers/0/resources","value":{"limits":{"memory":"96Mi"}}}]"#;
    ok(&serve, &["patch", "sbx", "agent-a", "--type", "json", "-p", limit]);
    let inplace = |serve: &OkaServe| {
        ok(
            serve,
            &[
                "get",
                "sbx",
                "agent-a",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"InplaceUpdate\")].status}/{.status.conditions[?(@.type==\"InplaceUpdate\")].message}",
            ],
        )
    };
    while inplace(&serve) != "True/" {
        assert!(
            std::time::Instant::now() < deadline,
            "not updated: {}\n{}",
            inplace(&serve),
            serve.log().lines().filter(|l| l.contains("agent-a")).collect::<Vec<_>>().join("\n")
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // A sandbox with its own network address reports it, as a pod its IP.
    let net: &str = &"apiVersion: agents.kruise.io/v1alpha1\nkind: Sandbox\nmetadata:\n  name: net\nspec:\n  template:\n    metadata:\n      annotations:\n        agents.kruise.io/network: outbound\n    spec:\n      containers:\n      - name: main\n        image: busybox\n        command: [\"sleep\", \"infinity\"]\n".replace("image: busybox", &image);
    let (success, _, err) = kubectl(&serve, &["apply", "-f", "-"], Some(net));
    assert!(success, "{err}");
    let ip = wait_for(
        &serve,
        &["get", "sbx", "net", "-o", "jsonpath={.status.sandboxIp} {.status.podInfo.podIP}"],
        "an address",
        |o| !o.trim().is_empty(),
    );
    let (sandbox_ip, pod_ip) = ip.trim().split_once(' ').unwrap();
    assert!(sandbox_ip.parse::<std::net::Ipv4Addr>().is_ok() && sandbox_ip == pod_ip, "{ip}");
    let command = r#"[{"op":"replace","path":"/spec/template/spec/containers/0/command","value":["sleep","999"]}]"#;
    ok(&serve, &["patch", "sbx", "agent-a", "--type", "json", "-p", command]);
    while !inplace(&serve).starts_with("False/only resource limits change in place") {
        assert!(std::time::Instant::now() < deadline, "not refused: {}", inplace(&serve));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Each step was told as an Event.
    let described = wait_for(&serve, &["describe", "sbx", "agent-a"], "events", |o| {
        o.contains("InplaceUpdateFailed")
    });
    for reason in ["UpgradePodReplaced", "UpgradeSucceeded", "InplaceUpdateSucceeded"] {
        assert!(described.contains(reason), "{reason}: {described}");
    }
}

#[test]
fn a_sandbox_update_ops_runs_upgrade_hooks_with_kubectl() {
    if !require_kubectl("a_sandbox_update_ops_runs_upgrade_hooks_with_kubectl") {
        return;
    }
    if !Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n") {
        eprintln!("SKIPPED a_sandbox_update_ops_runs_upgrade_hooks_with_kubectl: needs root");
        return;
    }
    // The host's programs as a root directory: an image that is not a path is pulled.
    let root = support::host_root();
    let image = format!("image: {}", root.path().display());
    let serve = OkaServe::start(env!("CARGO_BIN_EXE_oka"), "", &[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let sandbox: &str = &"apiVersion: agents.kruise.io/v1alpha1\nkind: Sandbox\nmetadata:\n  name: hooked\n  labels:\n    app: hooked\nspec:\n  template:\n    spec:\n      containers:\n      - name: main\n        image: busybox\n        command: [\"sleep\", \"infinity\"]\n".replace("image: busybox", &image);
    let (success, _, err) = kubectl(&serve, &["apply", "-f", "-"], Some(sandbox));
    assert!(success, "{err}");
    while ok(&serve, &["get", "sbx", "hooked", "-o", "jsonpath={.status.phase}"]) != "Running" {
        assert!(std::time::Instant::now() < deadline, "not running:\n{}", serve.log());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let ops = |name: &str, value: &str, pre: &str, post: &str| {
        format!(
            "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxUpdateOps\nmetadata:\n  name: {name}\nspec:\n  selector:\n    matchLabels:\n      app: hooked\n  patch:\n    spec:\n      containers:\n      - name: main\n        env:\n        - name: UPGRADED\n          value: \"{value}\"\n  lifecycle:\n    preUpgrade:\n      exec:\n        command: {pre}\n      timeoutSeconds: 20\n    postUpgrade:\n      exec:\n        command: {post}\n"
        )
    };
    let suo_status = |serve: &OkaServe, name: &str| {
        ok(
            serve,
            &[
                "get",
                "suo",
                name,
                "-o",
                "jsonpath={.status.phase} {.status.updatedReplicas}/{.status.replicas}",
            ],
        )
    };
    // The preUpgrade hook runs in the old sandbox; the postUpgrade one in the new sandbox, whose
    // files start afresh (Recreate), as root: it fails unless all of that holds.
    let pre = r#"["sh", "-c", "echo pre > /tmp/pre-ran"]"#;
    let post = r#"["sh", "-c", "test ! -e /tmp/pre-ran && test $(id -u) = 0"]"#;
    let (success, _, err) =
        kubectl(&serve, &["apply", "-f", "-"], Some(&ops("hooks-ok", "yes", pre, post)));
    assert!(success, "{err}");
    while suo_status(&serve, "hooks-ok") != "Completed 1/1" {
        let sandbox = ok(&serve, &["get", "sbx", "hooked", "-o", "jsonpath={.status.conditions}"]);
        assert!(
            std::time::Instant::now() < deadline,
            "not upgraded: {}\n{sandbox}\n{}",
            suo_status(&serve, "hooks-ok"),
            serve.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let upgraded = ok(
        &serve,
        &[
            "get",
            "sbx",
            "hooked",
            "-o",
            "jsonpath={.status.phase} {.status.conditions[?(@.type==\"Upgrading\")].reason}",
        ],
    );
    assert_eq!(upgraded, "Running Succeeded");
    ok(&serve, &["delete", "suo", "hooks-ok"]);
    while !ok(&serve, &["get", "sbx", "hooked", "-o", "jsonpath={.spec.upgradePolicy}"]).is_empty()
    {
        assert!(std::time::Instant::now() < deadline, "the upgradePolicy stays");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    // A preUpgrade hook that exits 3 fails the upgrade, and the ops with it.
    let failing = r#"["sh", "-c", "echo about to fail; exit 3"]"#;
    let (success, _, err) = kubectl(
        &serve,
        &["apply", "-f", "-"],
        Some(&ops("hooks-fail", "again", failing, r#"["true"]"#)),
    );
    assert!(success, "{err}");
    while !suo_status(&serve, "hooks-fail").starts_with("Failed") {
        assert!(
            std::time::Instant::now() < deadline,
            "not failed: {}\n{}",
            suo_status(&serve, "hooks-fail"),
            serve.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let failed = ok(
        &serve,
        &[
            "get",
            "sbx",
            "hooked",
            "-o",
            "jsonpath={.metadata.labels.agents\\.kruise\\.io/upgrade-failed} {.status.conditions[?(@.type==\"Upgrading\")].reason}",
        ],
    );
    assert_eq!(failed, "true PreUpgradeFailed");
    let message = ok(
        &serve,
        &[
            "get",
            "sbx",
            "hooked",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Upgrading\")].message}",
        ],
    );
    assert!(message.contains("exited with code 3"), "{message}");
    assert!(message.contains("about to fail"), "{message}");
    let described = ok(&serve, &["describe", "sbx", "hooked"]);
    assert!(described.contains("PreUpgradeFailed"), "{described}");
}

/// Polls `kubectl args` until its output satisfies `check`, for at most 20 s.
fn wait_for(serve: &OkaServe, args: &[&str], what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let out = ok(serve, args);
        if check(out.trim()) {
            return out;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: last {out:?}\n{}", serve.log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_pool_autoscaler_applied_with_kubectl_scales_its_pool_within_bounds() {
    if !require_kubectl("a_pool_autoscaler_applied_with_kubectl_scales_its_pool_within_bounds") {
        return;
    }
    // No runtime: the pool's sandboxes stay creating, so none is ever available and the
    // capacity policy asks for more; the in-flight guard and the bounds keep it in check.
    let serve = serve_without_runtime_and(
        "controllers:\n  poolAutoscaler:\n    samplingInterval: 5s\n    observationWindow: 30s\n",
    );
    let resources = ok(&serve, &["api-resources", "--api-group=agents.kruise.io"]);
    let row: Vec<String> =
        ["poolautoscalers", "pas", "agents.kruise.io/v1alpha1", "true", "PoolAutoscaler"]
            .map(str::to_owned)
            .into();
    assert!(rows(&resources).contains(&row), "{resources}");
    let replicas = ["get", "sbs", "base", "-o", "jsonpath={.spec.replicas}"];
    wait_for(
        &serve,
        &["get", "sbs", "base", "-o", "jsonpath={.status.replicas}"],
        "the base pool",
        |r| r == "2",
    );

    let autoscaler = "apiVersion: agents.kruise.io/v1alpha1
kind: PoolAutoscaler
metadata: {name: keep-warm, namespace: default}
spec:
  scaleTargetRef: {kind: SandboxSet, name: base}
  minReplicas: 2
  maxReplicas: 4
  capacityPolicy:
    targetAvailable: 1
    tolerance: 0
    scaleDown: {stabilizationWindowSeconds: 0}
";
    let (success, out, err) = kubectl(&serve, &["apply", "-f", "-"], Some(autoscaler));
    assert!(success, "{err}");
    assert_eq!(out.trim(), "poolautoscaler.agents.kruise.io/keep-warm created");
    // 2 in use (creating) + a target of 1 available.
    wait_for(&serve, &replicas, "the scale-up", |r| r == "3");
    let table = wait_for(&serve, &["get", "pas"], "the status", |t| {
        rows(t).get(1).is_some_and(|r| r.get(4).is_some_and(|d| d == "3"))
    });
    let table = rows(&table);
    assert_eq!(
        table[0],
        ["NAME", "TARGET", "MIN", "MAX", "CURRENT", "DESIRED", "AVAILABLE", "SUSPENDED", "AGE"]
    );
    assert_eq!(table[1][..4], ["keep-warm", "base", "2", "4"]);
    assert_eq!(table[1][6..8], ["0", "false"]);
    let described = ok(&serve, &["describe", "pas", "keep-warm"]);
    assert!(described.contains("SuccessfulRescale"), "{described}");
    assert!(
        described.contains("New size: 3; reason: available 0 below lower watermark 1"),
        "{described}"
    );

    // One autoscaler per pool; a schedule that does not parse is refused too.
    let second = autoscaler.replace("keep-warm", "second");
    let (success, _, err) = kubectl(&serve, &["apply", "-f", "-"], Some(&second));
    assert!(!success);
    assert!(
        err.contains("admission webhook \"v-pas.kb.io\" denied the request: spec.scaleTargetRef.name: Invalid value: \"base\": PoolAutoscaler keep-warm already targets this SandboxSet"),
        "{err}"
    );
    let cron = "apiVersion: agents.kruise.io/v1alpha1
kind: PoolAutoscaler
metadata: {name: nightly, namespace: default}
spec:
  scaleTargetRef: {kind: SandboxSet, name: elsewhere}
  maxReplicas: 4
  cronPolicies: [{name: night, schedule: '0 22 * *', targetReplicas: 1}]
";
    let (success, _, err) = kubectl(&serve, &["apply", "-f", "-"], Some(cron));
    assert!(!success);
    assert!(
        err.contains(
            "spec.cronPolicies[0].schedule: Invalid value: \"0 22 * *\": expected 5 fields"
        ),
        "{err}"
    );

    // Manual scales outside the bounds are corrected at once.
    ok(&serve, &["scale", "sbs", "base", "--replicas=10"]);
    wait_for(&serve, &replicas, "the maximum", |r| {
        r.parse::<i32>().is_ok_and(|n| (2..=4).contains(&n))
    });
    ok(&serve, &["scale", "sbs", "base", "--replicas=0"]);
    wait_for(&serve, &replicas, "the minimum", |r| {
        r.parse::<i32>().is_ok_and(|n| (2..=4).contains(&n))
    });

    // Suspended, it leaves the pool alone, bounds included.
    ok(
        &serve,
        &["patch", "pas", "keep-warm", "--type=merge", "-p", r#"{"spec":{"suspend":true}}"#],
    );
    wait_for(
        &serve,
        &["get", "pas", "keep-warm", "-o", "jsonpath={.status.suspended}"],
        "suspended",
        |s| s == "true",
    );
    ok(&serve, &["scale", "sbs", "base", "--replicas=7"]);
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert_eq!(ok(&serve, &replicas).trim(), "7");
}

#[test]
fn a_pool_autoscaler_keeps_real_sandboxes_available() {
    if !require_kubectl("a_pool_autoscaler_keeps_real_sandboxes_available") {
        return;
    }
    if !Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n") {
        eprintln!(
            "SKIPPED a_pool_autoscaler_keeps_real_sandboxes_available: the local runtime needs root"
        );
        return;
    }
    let serve = OkaServe::start(
        env!("CARGO_BIN_EXE_oka"),
        "controllers:\n  poolAutoscaler:\n    samplingInterval: 5s\n    observationWindow: 30s\n",
        &[],
    );
    let available = ["get", "sbs", "base", "-o", "jsonpath={.status.availableReplicas}"];
    wait_for(&serve, &available, "the base pool", |a| a == "2");
    let autoscaler = "apiVersion: agents.kruise.io/v1alpha1
kind: PoolAutoscaler
metadata: {name: keep-warm, namespace: default}
spec:
  scaleTargetRef: {kind: SandboxSet, name: base}
  minReplicas: 2
  maxReplicas: 6
  capacityPolicy: {targetAvailable: 4, tolerance: 1}
";
    let (success, _, err) = kubectl(&serve, &["apply", "-f", "-"], Some(autoscaler));
    assert!(success, "{err}");
    // 2 available is below 4 - 1: the pool grows to 4, and its new sandboxes become available.
    wait_for(
        &serve,
        &["get", "sbs", "base", "-o", "jsonpath={.spec.replicas}"],
        "the scale-up",
        |r| r == "4",
    );
    wait_for(&serve, &available, "the new sandboxes", |a| a == "4");
    let table = wait_for(&serve, &["get", "pas", "keep-warm"], "the status", |t| {
        rows(t).get(1).is_some_and(|r| r[4..7] == ["4", "4", "4"])
    });
    assert_eq!(rows(&table)[1][..4], ["keep-warm", "base", "2", "6"]);
    let described = ok(&serve, &["describe", "pas", "keep-warm"]);
    assert!(
        described.contains("New size: 4; reason: available 2 below lower watermark 3"),
        "{described}"
    );
    // Claims take sandboxes out of the pool: the pool is refilled, and 4 stay within the band.
    for _ in 0..2 {
        let (code, body) =
            e2b_call(&serve, "POST", "/sandboxes", r#"{"templateID":"base","timeout":60}"#);
        assert_eq!(code, 201, "{body}");
    }
    wait_for(&serve, &available, "the refill", |a| {
        a.parse::<i32>().is_ok_and(|n| (3..=6).contains(&n))
    });
    let replicas: i32 = ok(&serve, &["get", "sbs", "base", "-o", "jsonpath={.spec.replicas}"])
        .trim()
        .parse()
        .unwrap();
    assert!((2..=6).contains(&replicas), "{replicas}");
}

/// A pool whose template is edited with kubectl rolls its unclaimed members to the new
/// revision; a sandbox claimed before keeps running, untouched.
#[test]
fn a_pool_rolls_to_a_new_template_and_leaves_claimed_sandboxes_alone() {
    if !require_kubectl("a_pool_rolls_to_a_new_template_and_leaves_claimed_sandboxes_alone") {
        return;
    }
    if !Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n") {
        eprintln!(
            "SKIPPED a_pool_rolls_to_a_new_template_and_leaves_claimed_sandboxes_alone: root"
        );
        return;
    }
    // The host's programs as a root directory: an image that is not a path is pulled.
    let root = support::host_root();
    let image = format!("image: {}", root.path().display());
    let serve = OkaServe::start(env!("CARGO_BIN_EXE_oka"), "", &[]);
    let pool: &str = &"apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxSet\nmetadata:\n  name: roll\nspec:\n  replicas: 3\n  template:\n    spec:\n      containers:\n      - name: main\n        image: busybox\n        command: [\"sleep\", \"infinity\"]\n".replace("image: busybox", &image);
    let (success, _, err) = kubectl(&serve, &["apply", "-f", "-"], Some(pool));
    assert!(success, "{err}");
    let members = "agents.kruise.io/sandbox-pool=roll,agents.kruise.io/sandbox-claimed!=true";
    wait_for(
        &serve,
        &["get", "sbs", "roll", "-o", "jsonpath={.status.availableReplicas}"],
        "stocked",
        |o| o == "3",
    );
    // Claim one through the E2B API: it leaves the pool.
    let claimed = e2b_post(&serve, "/sandboxes", r#"{"templateID":"roll","timeout":300}"#);
    let claimed_id = claimed["sandboxID"].as_str().unwrap().to_owned();
    let claimed_name = wait_for(
        &serve,
        &[
            "get",
            "sbx",
            "-l",
            &format!("agents.kruise.io/sandbox-id={claimed_id}"),
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ],
        "the claimed sandbox",
        |o| !o.is_empty(),
    );
    let claimed_hash = ok(
        &serve,
        &[
            "get",
            "sbx",
            claimed_name.trim(),
            "-o",
            "jsonpath={.metadata.labels.agents\\.kruise\\.io/template-hash}",
        ],
    );
    let old_revision =
        ok(&serve, &["get", "sbs", "roll", "-o", "jsonpath={.status.updateRevision}"]);
    let env = r#"[{"op":"add","path":"/spec/template/spec/containers/0/env","value":[{"name":"ROLLED","value":"1"}]}]"#;
    ok(&serve, &["patch", "sbs", "roll", "--type", "json", "-p", env]);
    let revision = wait_for(
        &serve,
        &["get", "sbs", "roll", "-o", "jsonpath={.status.updateRevision}"],
        "a new revision",
        |o| !o.is_empty() && o != old_revision.trim(),
    );
    wait_for(
        &serve,
        &[
            "get",
            "sbs",
            "roll",
            "-o",
            "jsonpath={.status.updatedReplicas}/{.status.updatedAvailableReplicas}/{.status.replicas}",
        ],
        "rolled",
        |o| o == "3/3/3",
    );
    let hashes = ok(
        &serve,
        &[
            "get",
            "sbx",
            "-l",
            members,
            "-o",
            "jsonpath={.items[*].metadata.labels.agents\\.kruise\\.io/template-hash}",
        ],
    );
    assert!(hashes.split_whitespace().all(|h| h == revision.trim()), "{hashes} vs {revision}");
    // The claimed sandbox is the same, still running, on its old revision.
    let still = ok(
        &serve,
        &[
            "get",
            "sbx",
            claimed_name.trim(),
            "-o",
            "jsonpath={.status.phase} {.metadata.labels.agents\\.kruise\\.io/template-hash}",
        ],
    );
    assert_eq!(still, format!("Running {}", claimed_hash.trim()));
}

/// Probes against a real sandbox (root): a Sandbox applied with kubectl runs
/// `python3 -m http.server 8000`; its httpGet probe on 8000 turns
/// `probe.agents.kruise.io/web` True, and a tcpSocket probe on a closed port turns
/// `probe.agents.kruise.io/closed` False after its failureThreshold, with the runner's reasons.
#[test]
fn probes_report_conditions_of_a_real_sandbox() {
    if !require_kubectl("probes_report_conditions_of_a_real_sandbox") {
        return;
    }
    if !Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n") {
        eprintln!("SKIPPED probes_report_conditions_of_a_real_sandbox: needs root");
        return;
    }
    // The host's programs as a root directory: an image that is not a path is pulled.
    let root = support::host_root();
    let image = format!("image: {}", root.path().display());
    let serve = OkaServe::start(env!("CARGO_BIN_EXE_oka"), "", &[]);
    let sandbox: &str = &"apiVersion: agents.kruise.io/v1alpha1\nkind: Sandbox\nmetadata:\n  name: web\nspec:\n  template:\n    spec:\n      containers:\n      - name: main\n        image: python\n        command: [\"python3\", \"-m\", \"http.server\", \"8000\"]\n  probes:\n  - name: web\n    httpGet: {port: 8000, path: /}\n    periodSeconds: 5\n  - name: closed\n    tcpSocket: {port: 9}\n    periodSeconds: 5\n    failureThreshold: 2\n  - name: alive\n    exec: {command: [\"test\", \"-d\", \"/tmp\"]}\n    periodSeconds: 5\n  - name: broken\n    exec: {command: [\"sh\", \"-c\", \"echo no >&2; exit 4\"]}\n    periodSeconds: 5\n    failureThreshold: 2\n".replace("image: python", &image);
    let (success, _, err) = kubectl(&serve, &["apply", "-f", "-"], Some(sandbox));
    assert!(success, "{err}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let condition = |name: &str| {
        let path = format!(
            "jsonpath={{.status.conditions[?(@.type==\"probe.agents.kruise.io/{name}\")].status}}/{{.status.conditions[?(@.type==\"probe.agents.kruise.io/{name}\")].reason}}"
        );
        ok(&serve, &["get", "sbx", "web", "-o", &path])
    };
    loop {
        let (web, closed) = (condition("web"), condition("closed"));
        let (alive, broken) = (condition("alive"), condition("broken"));
        if web == "True/ProbeSucceeded"
            && closed == "False/ProbeFailed"
            && alive == "True/ProbeSucceeded"
            && broken == "False/ProbeFailed"
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "probes not reported: web {web:?}, closed {closed:?}, alive {alive:?}, broken {broken:?}\n{}",
            serve.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let message = ok(
        &serve,
        &[
            "get",
            "sbx",
            "web",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"probe.agents.kruise.io/web\")].message}",
        ],
    );
    assert_eq!(message, "HTTP 200");
    let broken = ok(
        &serve,
        &[
            "get",
            "sbx",
            "web",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"probe.agents.kruise.io/broken\")].message}",
        ],
    );
    assert_eq!(broken, "exit code 4: no");
    // `kubectl wait` works on the condition type, as the seed spec promises.
    ok(&serve, &["wait", "--for=condition=probe.agents.kruise.io/web", "sbx/web", "--timeout=10s"]);
}

#[test]
fn kubectl_manages_traffic_policies() {
    if !require_kubectl("kubectl_manages_traffic_policies") {
        return;
    }
    let serve = serve_without_runtime();
    let applied = |yaml: &str| kubectl(&serve, &["apply", "-f", "-"], Some(yaml));
    let (success, _, stderr) = applied(
        "apiVersion: agents.kruise.io/v1alpha1\nkind: TrafficPolicy\nmetadata: {name: bad, namespace: default}\nspec:\n  selector: {}\n  egress: {rules: [{action: allow, to: [{cidr: 10.0.0.0/8, fqdn: a.example}]}]}\n",
    );
    assert!(!success);
    assert!(
        stderr.contains("exactly one of cidr, fqdn, service, or workload must be set"),
        "{stderr}"
    );
    let (success, _, stderr) = applied(
        "apiVersion: agents.kruise.io/v1alpha1\nkind: TrafficPolicy\nmetadata: {name: db, namespace: default}\nspec:\n  selector: {matchLabels: {app: agent}}\n  egress: {rules: [{action: allow, to: [{service: {name: db}}], ports: [{protocol: TCP, port: 5432}]}, {action: reject}]}\n",
    );
    assert!(success, "{stderr}");
    let table = ok(&serve, &["get", "tp"]);
    let table_rows = rows(&table);
    assert_eq!(table_rows[0], ["NAME", "PRIORITY", "AGE"], "{table}");
    assert_eq!(table_rows[1][..2], ["db".to_owned(), "1000".to_owned()], "the default priority");
    // The controller says what it cannot enforce.
    support::wait_until(&serve, "Accepted=False", std::time::Duration::from_secs(20), || {
        let json = ok(&serve, &["get", "trafficpolicy", "db", "-o", "json"]);
        let policy: serde_json::Value = serde_json::from_str(&json).unwrap();
        policy.pointer("/status/conditions/0/reason")
            == Some(&serde_json::json!("UnresolvablePeer"))
    });
    ok(&serve, &["delete", "tp", "db"]);
}

#[test]
fn kubectl_manages_global_traffic_policies() {
    if !require_kubectl("kubectl_manages_global_traffic_policies") {
        return;
    }
    let serve = serve_without_runtime();
    let applied = |yaml: &str| kubectl(&serve, &["apply", "-f", "-"], Some(yaml));
    // The CRD's CEL rules hold for the cluster-scoped kind too.
    let (success, _, stderr) = applied(
        "apiVersion: agents.kruise.io/v1alpha1\nkind: GlobalTrafficPolicy\nmetadata: {name: bad}\nspec:\n  selector: {}\n  egress: {rules: [{action: allow, to: [{cidr: 10.0.0.0/8, fqdn: a.example}]}]}\n",
    );
    assert!(!success);
    assert!(
        stderr.contains("exactly one of cidr, fqdn, service, or workload must be set"),
        "{stderr}"
    );
    let (success, stdout, stderr) = applied(
        "apiVersion: agents.kruise.io/v1alpha1\nkind: GlobalTrafficPolicy\nmetadata: {name: no-internet}\nspec:\n  priority: 10\n  selector: {matchLabels: {agents.kruise.io/allow-internet-access: \"false\"}}\n  egress: {rules: [{action: reject, to: [{cidr: 0.0.0.0/0}]}]}\n",
    );
    assert!(success, "{stderr}");
    assert!(
        stdout.contains("globaltrafficpolicy.agents.kruise.io/no-internet created"),
        "{stdout}"
    );
    // Cluster-scoped: listed without a namespace column, whatever namespace kubectl is in.
    let table = ok(&serve, &["get", "gtp"]);
    let table_rows = rows(&table);
    assert_eq!(table_rows[0], ["NAME", "PRIORITY", "AGE"], "{table}");
    assert_eq!(table_rows[1][..2], ["no-internet".to_owned(), "10".to_owned()], "{table}");
    let all = ok(&serve, &["get", "globaltrafficpolicies", "-A"]);
    assert!(!all.contains("NAMESPACE"), "{all}");
    let (success, _, stderr) =
        kubectl(&serve, &["get", "gtp", "no-internet", "-n", "kube-system"], None);
    assert!(success, "a namespace flag is ignored for a cluster-scoped kind: {stderr}");
    // A re-apply updates it through the last-applied annotation; a patch too.
    let (success, stdout, stderr) = applied(
        "apiVersion: agents.kruise.io/v1alpha1\nkind: GlobalTrafficPolicy\nmetadata: {name: no-internet}\nspec:\n  priority: 20\n  selector: {matchLabels: {agents.kruise.io/allow-internet-access: \"false\"}}\n  egress: {rules: [{action: reject, to: [{cidr: 0.0.0.0/0}]}]}\n",
    );
    assert!(success, "{stderr}");
    assert!(stdout.contains("configured"), "{stdout}");
    ok(
        &serve,
        &[
            "patch",
            "gtp",
            "no-internet",
            "--type=merge",
            "-p",
            r#"{"metadata":{"labels":{"team":"net"}}}"#,
        ],
    );
    let json = ok(&serve, &["get", "gtp", "-l", "team=net", "-o", "json"]);
    let list: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(list["items"][0]["spec"]["priority"], 20, "{json}");
    assert!(list["items"][0]["metadata"].get("namespace").is_none(), "{json}");
    // The controller writes its Accepted condition: True, then False once it names a peer
    // nothing here resolves.
    let condition = |reason: &str| {
        let json = ok(&serve, &["get", "gtp", "no-internet", "-o", "json"]);
        let policy: serde_json::Value = serde_json::from_str(&json).unwrap();
        policy.pointer("/status/conditions/0/reason") == Some(&serde_json::json!(reason))
    };
    support::wait_until(&serve, "Accepted=True", std::time::Duration::from_secs(20), || {
        condition("Accepted")
    });
    ok(
        &serve,
        &[
            "patch",
            "gtp",
            "no-internet",
            "--type=merge",
            "-p",
            r#"{"spec":{"egress":{"rules":[{"action":"allow","to":[{"service":{"name":"db","namespace":"x"}}]}]}}}"#,
        ],
    );
    support::wait_until(&serve, "Accepted=False", std::time::Duration::from_secs(20), || {
        condition("UnresolvablePeer")
    });
    // A namespaced URL for it is not found, as on a cluster.
    let (success, _, stderr) = kubectl(
        &serve,
        &[
            "get",
            "--raw",
            "/apis/agents.kruise.io/v1alpha1/namespaces/default/globaltrafficpolicies",
        ],
        None,
    );
    assert!(!success);
    assert!(stderr.contains("NotFound") || stderr.contains("not found"), "{stderr}");
    ok(&serve, &["delete", "gtp", "no-internet"]);
    let (_, stdout, stderr) = kubectl(&serve, &["get", "gtp"], None);
    assert!(stdout.is_empty() && stderr.contains("No resources found"), "{stdout}{stderr}");
}
