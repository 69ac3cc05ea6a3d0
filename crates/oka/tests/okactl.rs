//! okactl against a real `oka serve` (no runtime, so no root): every command's output, error
//! messages and exit codes, compared with the text the reference's okactl (or kubectl, for
//! `get` and `delete`) prints.
//!
//! okactl is another package's binary, and cargo builds only this package's binaries for its
//! tests, so [`okactl_binary`] runs `cargo build -p okactl` first (a no-op when it is up to
//! date) into the same target directory, and uses the binary beside `oka`. `$OKACTL` names a
//! prebuilt one instead. Objects okactl cannot create are posted with curl, with the CA and
//! the admin key `oka serve` wrote.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{Value, json};
use support::OkaServe;

/// The okactl binary, built once per test run.
fn okactl_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(path) = std::env::var_os("OKACTL") {
            return PathBuf::from(path);
        }
        let oka = Path::new(env!("CARGO_BIN_EXE_oka"));
        let okactl = oka.with_file_name("okactl");
        if is_fresh(&okactl) {
            return okactl;
        }
        // target/<profile>/oka: build okactl with the same profile ("debug" is `dev`).
        let profile = oka.parent().and_then(Path::file_name).unwrap().to_str().unwrap();
        let profile = if profile == "debug" { "dev" } else { profile };
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "okactl", "--bin", "okactl", "--profile", profile])
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .status()
            .unwrap();
        assert!(status.success(), "cargo build -p okactl failed");
        okactl
    })
}

/// Whether `binary` exists and is newer than every source it is built from (okactl's,
/// oka-api's, oka-store's, the lock file). A workspace build (CI's) builds it with the
/// workspace's features; `cargo build -p okactl` would build its dependencies a second time
/// with its own, so an up-to-date binary is used as it is.
fn is_fresh(binary: &Path) -> bool {
    fn newest(path: &Path) -> std::time::SystemTime {
        let Ok(meta) = std::fs::metadata(path) else { return std::time::SystemTime::UNIX_EPOCH };
        let own = meta.modified().unwrap_or(std::time::SystemTime::UNIX_EPOCH);
        if !meta.is_dir() {
            return own;
        }
        std::fs::read_dir(path)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| newest(&entry.path()))
            .fold(own, std::cmp::max)
    }
    let Ok(built) = std::fs::metadata(binary).and_then(|m| m.modified()) else { return false };
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    [
        "crates/okactl",
        "crates/api/src",
        "crates/api/Cargo.toml",
        "crates/store/src",
        "crates/store/Cargo.toml",
        "Cargo.lock",
        "Cargo.toml",
    ]
    .iter()
    .all(|source| newest(&root.join(source)) <= built)
}

/// What one okactl run did.
#[derive(Debug, PartialEq)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs okactl with `args` against `serve` (its kubeconfig through `--kubeconfig`).
fn okactl(serve: &OkaServe, args: &[&str]) -> Run {
    let kubeconfig = serve.state.path().join("kubeconfig");
    let mut command = Command::new(okactl_binary());
    command.arg("--kubeconfig").arg(kubeconfig);
    run(command.args(args))
}

fn run(command: &mut Command) -> Run {
    let out = command.env_remove("KUBERNETES_SERVICE_HOST").output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: text(&out.stdout),
        stderr: text(&out.stderr),
    }
}

/// Asserts that okactl `args` succeeds and prints exactly `stdout`.
fn ok(serve: &OkaServe, args: &[&str], stdout: &str) {
    let run = okactl(serve, args);
    assert_eq!(run, Run { code: 0, stdout: stdout.to_owned(), stderr: String::new() }, "{args:?}");
}

/// Asserts that okactl `args` fails with exit code 1 and exactly `Error: <message>`.
fn fails(serve: &OkaServe, args: &[&str], message: &str) {
    let run = okactl(serve, args);
    let expected = Run { code: 1, stdout: String::new(), stderr: format!("Error: {message}\n") };
    assert_eq!(run, expected, "{args:?}");
}

/// okactl's stdout, failing the test when it fails.
fn stdout(serve: &OkaServe, args: &[&str]) -> String {
    let run = okactl(serve, args);
    assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
    run.stdout
}

/// An object as `okactl get -o json` prints it.
fn object(serve: &OkaServe, kind: &str, name: &str) -> Value {
    serde_json::from_str(&stdout(serve, &["get", kind, name, "-o", "json"])).unwrap()
}

/// A request to `serve`'s Kubernetes API with curl: its answer.
fn curl(serve: &OkaServe, method: &str, path: &str, content_type: &str, body: &Value) -> Value {
    let out = Command::new("curl")
        .args(["-sS", "-X", method, "--cacert"])
        .arg(serve.state.path().join("kube-ca.crt"))
        .args(["-H", &format!("Authorization: Bearer {}", serve.key())])
        .args(["-H", &format!("Content-Type: {content_type}"), "--data-binary"])
        .arg(body.to_string())
        .arg(format!("https://127.0.0.1:{}{path}", serve.kube))
        .output()
        .unwrap();
    assert!(out.status.success(), "curl: {}", String::from_utf8_lossy(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_ne!(answer["kind"], "Status", "{method} {path}: {answer}");
    answer
}

const API: &str = "/apis/agents.kruise.io/v1alpha1/namespaces/default";

/// `oka serve` without a runtime, once its Kubernetes API listens and its kubeconfig exists.
fn serve_without_runtime() -> OkaServe {
    let serve = OkaServe::start(env!("CARGO_BIN_EXE_oka"), "runtime:\n  enabled: false\n", &[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", serve.kube)).is_err()
        || !serve.state.path().join("kubeconfig").exists()
    {
        assert!(std::time::Instant::now() < deadline, "no Kubernetes API:\n{}", serve.log());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    serve
}

/// Waits until `okactl args` prints `lines` lines.
fn wait_lines(serve: &OkaServe, args: &[&str], lines: usize) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = stdout(serve, args);
        if out.lines().count() == lines {
            return out;
        }
        assert!(std::time::Instant::now() < deadline, "{args:?}: {out}\n{}", serve.log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn usage_errors_exit_1_without_a_server() {
    let cases: &[(&[&str], &str)] = &[
        (&["frobnicate"], "unknown command \"frobnicate\" for \"okactl\""),
        (&["scale", "deployment", "x"], "unknown command \"deployment\" for \"okactl scale\""),
        (&["get", "sbs", "--bogus"], "unknown flag: --bogus"),
        (&["get", "sbs", "-z"], "unknown shorthand flag: 'z' in -z"),
        (&["scale", "sbs", "base"], "required flag(s) \"replicas\" not set"),
        (
            &["scale", "sbs", "base", "--replicas", "x"],
            "invalid argument \"x\" for \"--replicas\" flag: invalid digit found in string",
        ),
        (
            &["completion", "tcsh"],
            "invalid argument \"tcsh\" for SHELL: must be one of bash, elvish, fish, powershell, zsh",
        ),
        (
            &["set", "image", "sbs", "web", "app=a:2", "--timeout", "5q"],
            "invalid argument \"5q\" for \"--timeout\" flag: invalid duration \"5q\": unknown unit",
        ),
        (&["create", "suo", "a=b"], "required flag(s) \"selector\" not set"),
        (&["scale", "sbs", "base", "--replicas", "-1"], "--replicas must be >= 0, got -1"),
        (
            &["set", "image", "deployment", "web", "app=a:2"],
            "unsupported resource type \"deployment\", only 'sandboxset' (sbs) is supported",
        ),
        (
            &["set", "image", "sbs", "web", "app=a:2", "=b"],
            "invalid container=image argument \"=b\", expected format CONTAINER=IMAGE",
        ),
    ];
    for (args, message) in cases {
        let run = run(Command::new(okactl_binary()).args(*args));
        let expected =
            Run { code: 1, stdout: String::new(), stderr: format!("Error: {message}\n") };
        assert_eq!(run, expected, "{args:?}");
    }
    let help = run(Command::new(okactl_binary()).arg("--help"));
    assert_eq!(help.code, 0);
    for command in ["scale", "set", "status", "restart", "create", "get", "delete", "completion"] {
        assert!(help.stdout.contains(&format!("\n  {command} ")), "{command}: {}", help.stdout);
    }
    assert!(help.stdout.contains("\nResource Commands:\n"), "{}", help.stdout);
    assert!(help.stdout.contains("\nOther Commands:\n  completion  "), "{}", help.stdout);
    // Subcommands with their aliases, as cobra lists them; a group alone prints its help.
    let scale = run(Command::new(okactl_binary()).arg("scale"));
    assert_eq!(scale.code, 0);
    assert!(scale.stdout.contains("\n  sandboxset (sbs)  Scale a SandboxSet"), "{}", scale.stdout);
    let restart = run(Command::new(okactl_binary()).args(["restart", "sbx", "--help"]));
    assert!(restart.stdout.contains("which oka does not run"), "{}", restart.stdout);
    let completion = run(Command::new(okactl_binary()).args(["completion", "bash"]));
    assert_eq!(completion.code, 0);
    assert!(completion.stdout.contains("_okactl()"), "{}", completion.stdout);
    // No kubeconfig: the loading error, exit 1.
    let missing =
        run(Command::new(okactl_binary()).args(["--kubeconfig", "/nonexistent", "get", "sbs"]));
    assert_eq!(missing.code, 1);
    assert!(
        missing.stderr.starts_with("Error: cannot read kubeconfig /nonexistent"),
        "{missing:?}"
    );
}

#[test]
fn okactl_manages_oka_serve() {
    let serve = serve_without_runtime();

    // KUBECONFIG is read when --kubeconfig is not given; --context picks a context.
    let kubeconfig = serve.state.path().join("kubeconfig");
    let from_env = run(Command::new(okactl_binary())
        .env("KUBECONFIG", &kubeconfig)
        .args(["get", "sbs", "base", "-o", "name"]));
    assert_eq!(from_env.stdout, "sandboxset.agents.kruise.io/base\n", "{from_env:?}");
    ok(
        &serve,
        &["--context", "oka", "get", "sbs", "base", "-o", "name"],
        "sandboxset.agents.kruise.io/base\n",
    );
    let other = okactl(&serve, &["--context", "nope", "get", "sbs"]);
    assert_eq!(other.code, 1);
    assert!(other.stderr.starts_with("Error: cannot load kubeconfig"), "{other:?}");

    // scale: a merge patch of spec.replicas.
    ok(
        &serve,
        &["scale", "sbs", "base", "--replicas", "3"],
        "sandboxset.agents.kruise.io/base scaled to 3\n",
    );
    assert_eq!(object(&serve, "sbs", "base")["spec"]["replicas"], 3);
    ok(
        &serve,
        &["scale", "sandboxset", "base", "--replicas=2"],
        "sandboxset.agents.kruise.io/base scaled to 2\n",
    );
    fails(&serve, &["scale", "sbs", "nope", "--replicas", "1"], "sandboxset \"nope\" not found");
    // A pool a PoolAutoscaler manages: scaled, with a warning that the size may not last.
    curl(
        &serve,
        "POST",
        &format!("{API}/poolautoscalers"),
        "application/json",
        &json!({
            "apiVersion": "agents.kruise.io/v1alpha1",
            "kind": "PoolAutoscaler",
            "metadata": {"name": "guard"},
            "spec": {"scaleTargetRef": {"kind": "SandboxSet", "name": "base"}, "minReplicas": 1, "maxReplicas": 5},
        }),
    );
    let warned = okactl(&serve, &["scale", "sbs", "base", "--replicas", "2"]);
    assert_eq!(
        warned,
        Run {
            code: 0,
            stdout: "sandboxset.agents.kruise.io/base scaled to 2\n".into(),
            stderr: "Warning: PoolAutoscaler \"guard\" manages sandboxset \"base\": its bounds apply at once, a capacity policy overrides this size at its next sample, a cron policy at its next fire\n".into(),
        }
    );
    stdout(&serve, &["delete", "pas", "guard"]);
    fails(
        &serve,
        &["-n", "elsewhere", "scale", "sbs", "base", "--replicas", "1"],
        "sandboxset \"base\" not found",
    );

    // A pool with an inline template: containers app and sidecar, init container setup.
    curl(
        &serve,
        "POST",
        &format!("{API}/sandboxsets"),
        "application/json",
        &json!({
            "apiVersion": "agents.kruise.io/v1alpha1",
            "kind": "SandboxSet",
            "metadata": {"name": "web"},
            "spec": {"replicas": 1, "template": {"spec": {
                "initContainers": [{"name": "setup", "image": "setup:1"}],
                "containers": [{"name": "app", "image": "app:1"}, {"name": "sidecar", "image": "side:1"}],
            }}},
        }),
    );

    // set image: containers then init containers, in template order.
    ok(
        &serve,
        &["set", "image", "sbs", "web", "setup=setup:2", "sidecar=side:2", "app=app:2"],
        "sandboxset.agents.kruise.io/web image updated (app, sidecar, setup)\n",
    );
    let web = object(&serve, "sbs", "web");
    let pod = &web["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["image"], "app:2");
    assert_eq!(pod["containers"][1]["image"], "side:2");
    assert_eq!(pod["initContainers"][0]["image"], "setup:2");
    ok(
        &serve,
        &["set", "image", "sandboxset", "web", "app=app:3"],
        "sandboxset.agents.kruise.io/web image updated (app)\n",
    );
    fails(
        &serve,
        &["set", "image", "sbs", "web", "db=db:1"],
        "container \"db\" not found in sandboxset \"web\"",
    );
    fails(
        &serve,
        &["set", "image", "sbs", "nope", "app=app:2"],
        "failed to get sandboxset \"nope\": sandboxsets.agents.kruise.io \"nope\" not found",
    );
    // The default pool names a SandboxTemplate.
    fails(
        &serve,
        &["set", "image", "sbs", "base", "app=app:2"],
        "sandboxset \"base\" uses a TemplateRef; modify the referenced SandboxTemplate directly instead",
    );
    // --wait: no runtime runs, so the update never completes.
    let waited =
        okactl(&serve, &["set", "image", "sbs", "web", "app=app:4", "-w", "--timeout", "2s"]);
    assert_eq!(waited.code, 1, "{waited:?}");
    let mut lines = waited.stdout.lines();
    assert_eq!(lines.next(), Some("sandboxset.agents.kruise.io/web image updated (app)"));
    let progress = lines.next().unwrap();
    assert!(progress.starts_with(&format!("{:<30} Updating   ", "web")), "{progress:?}");
    assert!(progress.ends_with(" available"), "{progress:?}");
    assert_eq!(
        waited.stderr,
        "Error: timed out waiting for sandboxset \"web\" update: context deadline exceeded\n"
    );

    // --wait ends when the pool's status, written for the new template, counts every replica
    // updated and available: at once for an empty pool.
    ok(
        &serve,
        &["scale", "sbs", "web", "--replicas", "0"],
        "sandboxset.agents.kruise.io/web scaled to 0\n",
    );
    let waited =
        okactl(&serve, &["set", "image", "sbs", "web", "app=app:5", "--wait", "--timeout", "30s"]);
    assert_eq!(waited.code, 0, "{waited:?}");
    assert!(
        waited.stdout.starts_with("sandboxset.agents.kruise.io/web image updated (app)\n"),
        "{waited:?}"
    );
    assert!(
        waited.stdout.ends_with("\nUpdate completed (0/0 updated, 0/0 available)\n"),
        "{waited:?}"
    );

    ok(
        &serve,
        &["status", "sbs", "web"],
        &format!("{:<30} {:<10} 0/0 updated  0/0 available\n", "web", "Complete"),
    );

    // status sbs: the line, then why each sandbox is stuck; exit 0.
    wait_lines(
        &serve,
        &["get", "sbx", "-l", "agents.kruise.io/sandbox-pool=base", "-o", "name"],
        2,
    );
    let status = stdout(&serve, &["status", "sbs", "base"]);
    let lines: Vec<&str> = status.lines().collect();
    assert_eq!(lines.len(), 3, "{status}");
    assert!(lines[0].starts_with(&format!("{:<30} {:<10} ", "base", "Updating")), "{status}");
    assert!(lines[0].ends_with("/2 available"), "{status}");
    for line in &lines[1..] {
        assert!(line.starts_with("  Sandbox base-"), "{status}");
        assert!(line.ends_with(" is Pending: unknown reason"), "{status}");
    }
    fails(
        &serve,
        &["status", "sbs", "nope"],
        "failed to get sandboxset \"nope\": sandboxsets.agents.kruise.io \"nope\" not found",
    );

    // create suo: images sorted by container, the selector as matchLabels.
    let created = stdout(
        &serve,
        &[
            "create",
            "suo",
            "sidecar=side:9",
            "app=app:9",
            "-l",
            "agents.kruise.io/sandbox-pool=base",
        ],
    );
    let name = created
        .strip_prefix("sandboxupdateops.agents.kruise.io/")
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_owned();
    assert!(name.starts_with("suo-"), "{created}");
    assert_eq!(
        created,
        format!(
            "sandboxupdateops.agents.kruise.io/{name} created (selector: agents.kruise.io/sandbox-pool=base, images: app=app:9, sidecar=side:9)\n"
        )
    );
    let ops = object(&serve, "suo", &name);
    assert_eq!(
        ops["spec"]["selector"],
        json!({"matchLabels": {"agents.kruise.io/sandbox-pool": "base"}})
    );
    assert_eq!(
        ops["spec"]["patch"],
        json!({"spec": {"containers": [{"name": "app", "image": "app:9"}, {"name": "sidecar", "image": "side:9"}]}})
    );
    fails(
        &serve,
        &["create", "suo", "app=app:9", "-l", "pool=none"],
        "no sandboxes found matching selector \"pool=none\" in namespace \"default\"",
    );
    fails(
        &serve,
        &["create", "suo", "app=app:9", "-l", "a in (b"],
        "invalid label selector \"a in (b\": label selector `a in (b`: expected `,` at position 7",
    );
    fails(
        &serve,
        &["create", "sandboxupdateops", "app", "-l", "a=b"],
        "invalid container=image argument \"app\", expected format CONTAINER=IMAGE",
    );

    // status suo: the line; a Failed one is an error after it.
    let line = stdout(&serve, &["status", "suo", &name]);
    assert!(line.starts_with(&format!("{name:<30} ")), "{line}");
    assert!(line.contains(" updated  ") && line.ends_with(" failed\n"), "{line}");
    curl(
        &serve,
        "PATCH",
        &format!("{API}/sandboxupdateops/{name}/status"),
        "application/merge-patch+json",
        &json!({"status": {"phase": "Failed", "replicas": 2, "updatedReplicas": 1, "failedReplicas": 1, "updatingReplicas": 0}}),
    );
    let failed = okactl(&serve, &["status", "sandboxupdateops", &name]);
    assert_eq!(
        failed,
        Run {
            code: 1,
            stdout: format!("{name:<30} {:<10} 1/2 updated  0 updating  1 failed\n", "Failed"),
            stderr: format!("Error: sandboxupdateops \"{name}\" is in Failed phase\n"),
        }
    );
    fails(
        &serve,
        &["status", "suo", "nope"],
        "failed to get sandboxupdateops \"nope\": sandboxupdateops.agents.kruise.io \"nope\" not found",
    );

    // restart: every check, then what oka does not support yet.
    curl(
        &serve,
        "POST",
        &format!("{API}/sandboxes"),
        "application/json",
        &json!({
            "apiVersion": "agents.kruise.io/v1alpha1",
            "kind": "Sandbox",
            "metadata": {"name": "box"},
            "spec": {"template": {"spec": {
                "initContainers": [{"name": "setup", "image": "setup:1"}],
                "containers": [{"name": "app", "image": "app:1"}, {"name": "tool", "image": "tool:1"}],
            }}},
        }),
    );
    fails(
        &serve,
        &["restart", "sbx", "box", "--all"],
        "sandbox \"box\" is not running (current phase: )",
    );
    curl(
        &serve,
        "PATCH",
        &format!("{API}/sandboxes/box/status"),
        "application/merge-patch+json",
        &json!({"status": {"phase": "Running"}}),
    );
    fails(
        &serve,
        &["restart", "sbx", "nope", "--all"],
        "failed to get sandbox \"nope\": sandboxes.agents.kruise.io \"nope\" not found",
    );
    fails(
        &serve,
        &["restart", "sbx", "box", "--all", "--failure-policy", "Retry"],
        "invalid failure-policy \"Retry\": must be Fail or Ignore",
    );
    fails(
        &serve,
        &["restart", "sbx", "box"],
        "no containers specified: use -c <name> or --all to restart. Available containers: [app tool]",
    );
    fails(
        &serve,
        &["restart", "sbx", "box", "--all", "-c", "app"],
        "--all cannot be used together with -c",
    );
    fails(
        &serve,
        &["restart", "sandbox", "box", "-c", "app,db"],
        "container \"db\" not found in sandbox \"box\"",
    );
    fails(
        &serve,
        &["restart", "sbx", "box", "-c", "setup", "-c", "tool", "--failure-policy", "Ignore"],
        "container \"setup\" does not run in sandbox \"box\": oka runs a sandbox's first \
         container only (\"app\"); restart that one, or use --all",
    );
    ok(
        &serve,
        &["restart", "sbx", "box", "--all"],
        "sandbox.agents.kruise.io/box restart requested (containers: [app tool])\n",
    );
    let boxed: Value =
        serde_json::from_str(&stdout(&serve, &["get", "sbx", "box", "-o", "json"])).unwrap();
    let requested = boxed["metadata"]["annotations"]["agents.kruise.io/restart-requested-at"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(requested.starts_with("20") && requested.ends_with('Z'), "{requested}");
    // No sandbox controller runs here: the request stays pending, and a second one waits.
    fails(
        &serve,
        &["restart", "sbx", "box", "-c", "app"],
        &format!(
            "a restart of sandbox \"box\" is already pending (requested at {requested}); wait \
             for it to complete"
        ),
    );

    // get: kubectl's tables, names, JSON; delete: kubectl's lines.
    let table = stdout(&serve, &["get", "sbs"]);
    let header = "NAME   REPLICAS   AVAILABLE   UPDATEDREPLICAS   UPDATEDAVAILABLEREPLICAS   UPDATEREVISION   AGE";
    assert_eq!(table.lines().next(), Some(header), "{table}");
    assert_eq!(
        table.lines().nth(1).unwrap().split_whitespace().take(2).collect::<Vec<_>>(),
        ["base", "2"]
    );
    assert!(stdout(&serve, &["get", "sbs", "-A"]).starts_with("NAMESPACE   NAME   REPLICAS   "));
    if let Some(kubectl) = kubectl_table(&serve, &["get", "sbx", "-o", "wide"]) {
        // Same second, same ages: retried when a second boundary falls between the two.
        let mut same = false;
        for _ in 0..3 {
            let ours = stdout(&serve, &["get", "sbx", "-o", "wide"]);
            if ours == kubectl_table(&serve, &["get", "sbx", "-o", "wide"]).unwrap() {
                same = true;
                break;
            }
        }
        assert!(same, "okactl and kubectl print different tables:\n{kubectl}");
    }
    ok(&serve, &["get", "sandboxes", "box", "-o", "name"], "sandbox.agents.kruise.io/box\n");
    // -w: the table, then a row per change.
    watch_shows_changes(&serve);
    let listed: Value = serde_json::from_str(&stdout(
        &serve,
        &["get", "sbs", "-o", "json", "-l", "agents.kruise.io/none!=x"],
    ))
    .unwrap();
    assert_eq!(listed["kind"], "List");
    assert_eq!(listed["items"].as_array().unwrap().len(), 2);
    assert_eq!(listed["items"][0]["kind"], "SandboxSet");
    let yaml = stdout(&serve, &["get", "sbs", "web", "-o", "yaml"]);
    assert!(yaml.starts_with("apiVersion: agents.kruise.io/v1alpha1\n"), "{yaml}");
    let empty = okactl(&serve, &["get", "checkpoints"]);
    assert_eq!(
        empty,
        Run {
            code: 0,
            stdout: String::new(),
            stderr: "No resources found in default namespace.\n".to_owned()
        }
    );
    fails(&serve, &["get", "sbs", "nope"], "sandboxsets.agents.kruise.io \"nope\" not found");
    let unknown = okactl(&serve, &["get", "pods"]);
    assert_eq!(unknown.code, 1);
    assert!(
        unknown.stderr.starts_with("Error: the server doesn't have a resource type \"pods\""),
        "{unknown:?}"
    );

    ok(&serve, &["delete", "sbs", "web"], "sandboxset.agents.kruise.io \"web\" deleted\n");
    let deleted = okactl(&serve, &["delete", "suo", "nope", &name]);
    assert_eq!(
        deleted,
        Run {
            code: 1,
            stdout: format!("sandboxupdateops.agents.kruise.io \"{name}\" deleted\n"),
            stderr: "Error: sandboxupdateops.agents.kruise.io \"nope\" not found\n".to_owned(),
        }
    );
    fails(&serve, &["delete", "sbs", "web"], "sandboxsets.agents.kruise.io \"web\" not found");
}

/// kubectl's stdout for `args`, when kubectl is installed (scripts/test.sh installs it).
fn kubectl_table(serve: &OkaServe, args: &[&str]) -> Option<String> {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_owned());
    let out = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(serve.state.path().join("kubeconfig"))
        .args(args)
        .output()
        .ok()?;
    assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8(out.stdout).unwrap())
}

/// `get sbs base -w` prints the table, then the row again when the pool is scaled.
fn watch_shows_changes(serve: &OkaServe) {
    use std::io::BufRead as _;
    use std::time::Duration;
    let mut child = Command::new(okactl_binary())
        .arg("--kubeconfig")
        .arg(serve.state.path().join("kubeconfig"))
        .args(["get", "sbs", "base", "-w"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Lines through a channel, so a missing one fails the test instead of hanging it.
    let (tx, lines) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next =
        || lines.recv_timeout(Duration::from_secs(10)).expect("okactl get -w printed no line");
    let cells = |row: &str| row.split_whitespace().take(2).map(str::to_owned).collect::<Vec<_>>();
    let header = next();
    assert!(header.starts_with("NAME   REPLICAS   "), "{header}");
    assert_eq!(cells(&next()), ["base", "2"]);
    ok(
        serve,
        &["scale", "sbs", "base", "--replicas", "4"],
        "sandboxset.agents.kruise.io/base scaled to 4\n",
    );
    while cells(&next()) != ["base", "4"] {}
    child.kill().unwrap();
    child.wait().unwrap();
    ok(
        serve,
        &["scale", "sbs", "base", "--replicas", "2"],
        "sandboxset.agents.kruise.io/base scaled to 2\n",
    );
}
