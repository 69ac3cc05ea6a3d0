//! OCI images end to end: `oka serve` (as root: real sandboxes) with a real registry on
//! loopback (Debian's `docker-registry`, which scripts/test.sh installs, driven by oka-image's
//! test support). A SandboxSet whose template names `127.0.0.1:<port>/test/app:1` pulls it once
//! and runs its members on the image's layers, with the image's command, environment and
//! working directory and a whiteout of a lower layer honoured (read through envd in a claimed
//! sandbox); a Sandbox naming an image the registry lacks shows `ImagePullBackOff` with the
//! registry's answer and the kubelet's Events, and never runs on another root.
//!
//! The default templates on an image (`templates.images`): their pools pull the image from
//! the registry and become ready with no root built, an E2B create runs on the image's files,
//! `code-interpreter-v1` still runs oka's code interpreter server, and a registry that wants
//! credentials is pulled from with `templates.imagePullSecrets`. Removing the setting once the
//! root is built moves the unedited template to the root, and setting it again moves it back,
//! each time with the pool rolled over (`oka serve` restarted on the same state).

#![allow(clippy::unwrap_used)]

mod support;

#[path = "../../image/tests/support/mod.rs"]
mod registry;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use registry::{Entry, Registry, TestImage, TestLayer, sha256};
use serde_json::Value;
use support::{
    OkaServe, kubectl, kubectl_binary, kubectl_json as json, run_in_sandbox, wait_until,
};

const OKA: &str = env!("CARGO_BIN_EXE_oka");

/// Whether this machine can run these tests; under CI it must.
fn runnable(test: &str) -> bool {
    let root = rustix::process::geteuid().is_root();
    let kubectl = Command::new(kubectl_binary())
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    let registry = Path::new(registry::REGISTRY_BIN).exists();
    if root && kubectl && registry {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: CI runs as root with kubectl and docker-registry (scripts/test.sh)"
    );
    eprintln!("SKIPPED {test}: needs root, kubectl and docker-registry (scripts/test.sh)");
    false
}

/// `(reason, message)` of the Events about the object `name`.
fn events_of(serve: &OkaServe, name: &str) -> Vec<(String, String)> {
    let events = json(serve, &["get", "events"]);
    events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["involvedObject"]["name"] == name)
        .map(|e| {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (text(&e["reason"]), text(&e["message"]))
        })
        .collect()
}

fn ready_reason(sandbox: &Value) -> (String, String) {
    let conditions = sandbox["status"]["conditions"].as_array().cloned().unwrap_or_default();
    conditions
        .iter()
        .find(|c| c["type"] == "Ready")
        .map(|c| {
            (
                c["reason"].as_str().unwrap_or_default().to_owned(),
                c["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .unwrap_or_default()
}

/// The code interpreter server beside `oka`, when it was built.
fn interpreter() -> Option<PathBuf> {
    Some(Path::new(OKA).with_file_name("oka-interpreter")).filter(|p| p.exists())
}

/// Host files a sandbox of the image needs: the shell and the tools its command uses, and the
/// shared libraries of those, of the init (`oka`), of the agent runtime (`oka-envd`) and of the
/// code interpreter server (`oka-interpreter`, when built).
fn base_files() -> Vec<PathBuf> {
    let envd = Path::new(OKA).with_file_name("oka-envd");
    let tools: Vec<PathBuf> =
        ["/bin/sh", "/bin/cat", "/bin/sleep"].iter().map(|p| PathBuf::from(*p)).collect();
    let mut files = tools.clone();
    for binary in tools.iter().cloned().chain([PathBuf::from(OKA), envd]).chain(interpreter()) {
        let out = Command::new("ldd").arg(&binary).output().unwrap();
        for word in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if word.starts_with('/') {
                files.push(word.into());
            }
        }
    }
    files.sort();
    files.dedup();
    files
}

/// The test image: a base layer of `base_files` (each at its path, resolved), accounts and
/// `/app/old.txt`; an app layer with `/app/hello.txt` and a whiteout of `/app/old.txt`; a
/// config whose command writes what the sandbox sees to `/facts`.
fn test_image() -> TestImage {
    let mut base = vec![Entry::Dir("app", 0o755)];
    base.extend(host_entries());
    base.push(Entry::File(
        "etc/passwd".into(),
        b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/app:/bin/sh\n".to_vec(),
        0o644,
        0,
    ));
    base.push(Entry::File("etc/group".into(), b"root:x:0:\napp:x:1000:\n".to_vec(), 0o644, 0));
    base.push(Entry::File("app/old.txt".into(), b"old\n".to_vec(), 0o644, 0));
    let app = vec![
        Entry::Dir("app", 0o755),
        Entry::File("app/hello.txt".into(), b"hello from the app layer\n".to_vec(), 0o644, 0),
        Entry::Whiteout("app/old.txt"),
    ];
    let layers = vec![TestLayer::build(&base), TestLayer::build(&app)];
    let script = "read line < hello.txt; \
                  if [ -e old.txt ]; then old=visible; else old=hidden; fi; \
                  echo \"$GREETING|$(pwd)|$line|$old\" > /facts; exec /bin/sleep 100000";
    image_of(
        layers,
        &serde_json::json!({
            "Entrypoint": ["/bin/sh", "-c"],
            "Cmd": [script],
            "Env": ["PATH=/usr/bin:/bin", "GREETING=hello-from-image"],
            "WorkingDir": "/app"
        }),
    )
}

/// The entries of a layer with `base_files` (each at its path, resolved) and the directories a
/// sandbox needs (`bin`, `etc`, `root`, `tmp`).
fn host_entries() -> Vec<Entry> {
    let mut base = vec![
        Entry::Dir("bin", 0o755),
        Entry::Dir("etc", 0o755),
        Entry::Dir("root", 0o700),
        Entry::Dir("tmp", 0o1777),
    ];
    let mut dirs: Vec<String> = Vec::new();
    for file in base_files() {
        let relative = file.strip_prefix("/").unwrap();
        for parent in relative.ancestors().skip(1).collect::<Vec<_>>().into_iter().rev() {
            let parent = parent.to_string_lossy().into_owned();
            if !parent.is_empty()
                && !dirs.contains(&parent)
                && !["bin", "etc"].contains(&parent.as_str())
            {
                dirs.push(parent.clone());
                base.push(Entry::Dir(Box::leak(parent.into_boxed_str()), 0o755));
            }
        }
        let content = std::fs::read(&file).unwrap();
        base.push(Entry::File(relative.to_string_lossy().into_owned(), content, 0o755, 0));
    }
    base
}

/// The image of `layers` with the run settings `run` (the config's `config`).
fn image_of(layers: Vec<TestLayer>, run: &Value) -> TestImage {
    let diff_ids: Vec<String> = layers.iter().map(|l| sha256(&l.tar)).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": registry::host_arch(),
        "os": "linux",
        "config": run,
        "rootfs": { "type": "layers", "diff_ids": diff_ids }
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": registry::OCI_MANIFEST,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": sha256(&config),
            "size": config.len()
        },
        "layers": layers.iter().map(|l| serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": sha256(&l.gz),
            "size": l.gz.len()
        })).collect::<Vec<_>>()
    }))
    .unwrap();
    TestImage { layers, config, manifest }
}

fn serve() -> OkaServe {
    let config = "defaultPool:\n  enabled: false\ncodeInterpreterPool:\n  enabled: false\n";
    let serve = OkaServe::start(OKA, config, &[]);
    wait_until(&serve, "the Kubernetes API", Duration::from_secs(30), || {
        TcpStream::connect(("127.0.0.1", serve.kube)).is_ok()
            && serve.state.path().join("kubeconfig").exists()
    });
    serve
}

#[test]
fn a_pool_runs_an_image_from_a_registry_and_a_missing_image_backs_off() {
    if !runnable("a_pool_runs_an_image_from_a_registry_and_a_missing_image_backs_off") {
        return;
    }
    let registry = Registry::start(None);
    let image = test_image();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let digest = runtime.block_on(registry.push_image("test/app", "1", &image));
    let reference = format!("{}/test/app:1", registry.host);
    let serve = serve();

    let pool = format!(
        "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxSet\nmetadata:\n  name: app\nspec:\n  \
         replicas: 2\n  template:\n    spec:\n      containers:\n      - name: main\n        \
         image: {reference}\n"
    );
    kubectl(&serve, &["apply", "-f", "-"], Some(&pool));
    wait_until(&serve, "the image pool", Duration::from_secs(120), || {
        json(&serve, &["get", "sbs", "app"])["status"]["availableReplicas"].as_i64() == Some(2)
    });
    let layer = format!("/v2/test/app/blobs/{}", sha256(&image.layers[0].gz));
    assert_eq!(registry.get_count(&[layer]), 1, "one pull for the pool:\n{}", registry.log());
    let members = json(&serve, &["get", "sbx", "-l", "agents.kruise.io/sandbox-pool=app"]);
    for member in members["items"].as_array().unwrap() {
        let image_id = &member["status"]["podInfo"]["annotations"]["agents.kruise.io/image-id"];
        assert_eq!(
            image_id.as_str(),
            Some(format!("{}/test/app@{digest}", registry.host).as_str())
        );
    }
    let name = members["items"][0]["metadata"]["name"].as_str().unwrap().to_owned();
    let events = events_of(&serve, &name);
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Pulling" && *m == format!("Pulling image \"{reference}\"")),
        "{events:?}"
    );
    assert!(
        events.iter().any(|(r, m)| r == "Pulled"
            && m.starts_with(&format!("Successfully pulled image \"{reference}\" in "))),
        "{events:?}"
    );

    // Claimed, the sandbox answers through envd: what its command saw.
    let claim = "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxClaim\nmetadata:\n  name: mine\n\
                 spec:\n  templateName: app\n  createOnNoStock: false\n";
    kubectl(&serve, &["apply", "-f", "-"], Some(claim));
    wait_until(&serve, "the claim", Duration::from_secs(120), || {
        json(&serve, &["get", "sbc", "mine"])["status"]["phase"] == "Completed"
    });
    let claimed = json(&serve, &["get", "sbx", "-l", "agents.kruise.io/claim-name=mine"]);
    let sandbox = &claimed["items"][0];
    let id = sandbox["metadata"]["labels"]["agents.kruise.io/sandbox-id"].as_str().unwrap();
    let token = sandbox["metadata"]["annotations"]["agents.kruise.io/runtime-access-token"]
        .as_str()
        .unwrap();
    assert_eq!(
        run_in_sandbox(&serve, id, token, "cat /facts"),
        "hello-from-image|/app|hello from the app layer|hidden\n"
    );

    // A missing image: ErrImagePull, then ImagePullBackOff with the registry's answer, the
    // kubelet's Events, and no sandbox on another root. Counted once the pool has replaced the
    // claimed sandbox (two pool members and the claimed one), so the refill is not counted.
    wait_until(&serve, "the pool's refill", Duration::from_secs(120), || {
        json(&serve, &["get", "sbs", "app"])["status"]["availableReplicas"].as_i64() == Some(2)
            && serve.runtime_sandboxes() == 3
    });
    let before = serve.runtime_sandboxes();
    let missing = format!("{}/test/missing:1", registry.host);
    let sandbox = format!(
        "apiVersion: agents.kruise.io/v1alpha1\nkind: Sandbox\nmetadata:\n  name: missing\nspec:\n  \
         template:\n    spec:\n      containers:\n      - name: main\n        image: {missing}\n"
    );
    kubectl(&serve, &["apply", "-f", "-"], Some(&sandbox));
    wait_until(&serve, "ImagePullBackOff", Duration::from_secs(60), || {
        ready_reason(&json(&serve, &["get", "sbx", "missing"])).0 == "ImagePullBackOff"
    });
    let object = json(&serve, &["get", "sbx", "missing"]);
    assert_eq!(object["status"]["phase"], "Pending");
    let (_, message) = ready_reason(&object);
    assert!(message.starts_with(&format!("Back-off pulling image \"{missing}\": ")), "{message}");
    assert!(message.contains("not found"), "{message}");
    let events = events_of(&serve, "missing");
    assert!(
        events.contains(&("Pulling".into(), format!("Pulling image \"{missing}\""))),
        "{events:?}"
    );
    assert!(
        events.iter().any(|(r, m)| r == "Failed"
            && m.starts_with(&format!("Failed to pull image \"{missing}\": "))),
        "{events:?}"
    );
    assert!(
        events.contains(&("BackOff".into(), format!("Back-off pulling image \"{missing}\""))),
        "{events:?}"
    );
    assert_eq!(serve.runtime_sandboxes(), before, "never created on another root");
}

/// The image `templates.images` names in the test below: the host's shell and tools and the
/// libraries oka's programs need (`base_files`), the accounts `root` and `user` with
/// `/home/user`, and `/etc/oka-image`; no `ENTRYPOINT` or `CMD`, so `base`'s sandboxes are the
/// agent runtime alone.
fn base_template_image() -> TestImage {
    let mut entries = host_entries();
    entries.extend([
        Entry::Dir("home", 0o755),
        Entry::Dir("home/user", 0o755),
        Entry::File(
            "etc/passwd".into(),
            b"root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n".to_vec(),
            0o644,
            0,
        ),
        Entry::File("etc/group".into(), b"root:x:0:\nuser:x:1000:\n".to_vec(), 0o644, 0),
        Entry::File("etc/oka-image".into(), b"base from the registry\n".to_vec(), 0o644, 0),
    ]);
    image_of(
        vec![TestLayer::build(&entries)],
        &serde_json::json!({ "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"] }),
    )
}

/// One HTTP/1.1 request to the E2B API: the status and the body.
fn http(port: u16, method: &str, path: &str, key: &str, body: &str) -> (u16, String) {
    request(port, &format!("{method} {path}"), &format!("X-API-Key: {key}\r\n"), body)
}

/// One HTTP/1.1 request (`line` is the method and path, `headers` end with CRLF) to a local
/// port: the status and the body.
fn request(port: u16, line: &str, headers: &str, body: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        stream,
        "{line} HTTP/1.1\r\nHost: localhost\r\n{headers}\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

/// An E2B create of `template`: the sandbox's ID and envd access token.
fn create(serve: &OkaServe, template: &str) -> (String, String) {
    let body = format!(r#"{{"templateID":"{template}"}}"#);
    let (status, body) = http(serve.api, "POST", "/sandboxes", &serve.key(), &body);
    assert_eq!(status, 201, "{body}\n{}", serve.log());
    let created: Value = serde_json::from_str(&body).unwrap();
    let text = |field: &str| created[field].as_str().unwrap().to_owned();
    (text("sandboxID"), text("envdAccessToken"))
}

#[test]
fn the_default_templates_run_on_a_registry_image_without_a_build() {
    if !runnable("the_default_templates_run_on_a_registry_image_without_a_build") {
        return;
    }
    let interpreter = interpreter().is_some();
    if !interpreter {
        assert!(std::env::var_os("CI").is_none(), "CI builds oka-interpreter beside oka");
        eprintln!("oka-interpreter is not built beside oka: code-interpreter-v1 not checked");
    }
    let registry = Registry::start(None);
    let image = base_template_image();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let digest = runtime.block_on(registry.push_image("oka/base", "1", &image));
    let reference = format!("{}/oka/base:1", registry.host);
    // An empty templates directory: a build would show there (and in the log).
    let templates = tempfile::tempdir().unwrap();
    let config = format!(
        "defaultPool:\n  replicas: 1\ncodeInterpreterPool:\n  replicas: 1\n\
         templates:\n  dir: {}\n  images:\n    base: {reference}\n    \
         code-interpreter-v1: {reference}\n",
        templates.path().display()
    );
    let serve = OkaServe::start(OKA, &config, &[]);
    wait_until(&serve, "the Kubernetes API", Duration::from_secs(30), || {
        TcpStream::connect(("127.0.0.1", serve.kube)).is_ok()
            && serve.state.path().join("kubeconfig").exists()
    });

    // The default template names the image; its pool pulls it and fills.
    let template = json(&serve, &["get", "sandboxtemplate", "base"]);
    assert_eq!(template["spec"]["template"]["spec"]["containers"][0]["image"], reference.as_str());
    assert_eq!(template["spec"]["template"]["spec"]["containers"][0]["command"], Value::Null);
    assert!(
        template["metadata"]["annotations"]["agents.kruise.io/managed-spec-hash"].is_string(),
        "{template}"
    );
    wait_until(&serve, "the base pool on the image", Duration::from_secs(120), || {
        json(&serve, &["get", "sbs", "base"])["status"]["availableReplicas"].as_i64() == Some(1)
    });
    let members = json(&serve, &["get", "sbx", "-l", "agents.kruise.io/sandbox-pool=base"]);
    let member = &members["items"][0];
    assert_eq!(
        member["status"]["podInfo"]["annotations"]["agents.kruise.io/image-id"].as_str(),
        Some(format!("{}/oka/base@{digest}", registry.host).as_str())
    );
    let name = member["metadata"]["name"].as_str().unwrap();
    let events = events_of(&serve, name);
    assert!(
        events.iter().any(|(r, m)| r == "Pulled"
            && m.starts_with(&format!("Successfully pulled image \"{reference}\" in "))),
        "{events:?}"
    );

    // No root was built, nor a build started.
    let log = serve.log();
    assert!(log.contains(&format!("runs on the image {reference} (templates.images)")), "{log}");
    assert!(!log.contains("building the default templates"), "{log}");
    assert_eq!(std::fs::read_dir(templates.path()).unwrap().count(), 0, "nothing built");

    // An E2B create of `base` runs on the image's files.
    let (id, token) = create(&serve, "base");
    assert_eq!(
        run_in_sandbox(&serve, &id, &token, "cat /etc/oka-image"),
        "base from the registry\n"
    );

    // code-interpreter-v1 on the same image still runs oka's code interpreter server.
    if interpreter {
        let template = json(&serve, &["get", "sandboxtemplate", "code-interpreter-v1"]);
        let container = &template["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"], reference.as_str());
        assert_eq!(container["command"], serde_json::json!(["/.oka/interpreter"]));
        wait_until(&serve, "the code interpreter pool", Duration::from_secs(120), || {
            json(&serve, &["get", "sbs", "code-interpreter-v1"])["status"]["availableReplicas"]
                .as_i64()
                == Some(1)
        });
        let (id, token) = create(&serve, "code-interpreter-v1");
        assert_eq!(
            run_in_sandbox(&serve, &id, &token, "cat /etc/oka-image"),
            "base from the registry\n"
        );
        let headers = format!("E2b-Sandbox-Id: {id}\r\nE2b-Sandbox-Port: 49999\r\n");
        let mut health = (0, String::new());
        wait_until(&serve, "the code interpreter's /health", Duration::from_secs(30), || {
            health = request(serve.gateway, "GET /health", &headers, "");
            health.0 == 200
        });
        assert!(health.1.contains("\"OK\""), "{health:?}");
    }

    // `oka templates list` says where it comes from.
    let list = Command::new(OKA)
        .args(["templates", "list", "--config"])
        .arg(serve.state.path().join("config.yaml"))
        .output()
        .unwrap();
    assert!(list.status.success(), "{}", String::from_utf8_lossy(&list.stderr));
    let list = String::from_utf8_lossy(&list.stdout);
    for name in ["base ", "code-interpreter-v1 "] {
        let line = list.lines().find(|l| l.starts_with(name)).unwrap_or_default();
        assert!(line.contains(&format!("image      {reference} (templates.images)")), "{list}");
    }
}

#[test]
fn the_default_template_pulls_its_image_with_the_configured_pull_secret() {
    if !runnable("the_default_template_pulls_its_image_with_the_configured_pull_secret") {
        return;
    }
    let registry = Registry::start(Some(("alice", "s3cret")));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(registry.push_image("oka/base", "1", &base_template_image()));
    let reference = format!("{}/oka/base:1", registry.host);
    let templates = tempfile::tempdir().unwrap();
    let config = format!(
        "defaultPool:\n  replicas: 1\ncodeInterpreterPool:\n  enabled: false\n\
         templates:\n  dir: {}\n  images:\n    base: {reference}\n  \
         imagePullSecrets: [registry-login]\n",
        templates.path().display()
    );
    let serve = OkaServe::start(OKA, &config, &[]);
    wait_until(&serve, "the Kubernetes API", Duration::from_secs(30), || {
        TcpStream::connect(("127.0.0.1", serve.kube)).is_ok()
            && serve.state.path().join("kubeconfig").exists()
    });
    let template = json(&serve, &["get", "sandboxtemplate", "base"]);
    assert_eq!(
        template["spec"]["template"]["spec"]["imagePullSecrets"],
        serde_json::json!([{ "name": "registry-login" }])
    );
    // The Secret is made after the pool: its first pull is refused, the next one (after the
    // kubelet's backoff) uses it.
    kubectl(
        &serve,
        &[
            "create",
            "secret",
            "docker-registry",
            "registry-login",
            &format!("--docker-server={}", registry.host),
            "--docker-username=alice",
            "--docker-password=s3cret",
        ],
        None,
    );
    wait_until(&serve, "the base pool on the private image", Duration::from_secs(120), || {
        json(&serve, &["get", "sbs", "base"])["status"]["availableReplicas"].as_i64() == Some(1)
    });
    let (id, token) = create(&serve, "base");
    assert_eq!(
        run_in_sandbox(&serve, &id, &token, "cat /etc/oka-image"),
        "base from the registry\n"
    );
}

/// `(image of the template base, [(member, its image-id or "", available)])`.
fn base_pool(serve: &OkaServe) -> (String, Vec<(String, String)>) {
    let template = json(serve, &["get", "sandboxtemplate", "base"]);
    let image = template["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let members = json(serve, &["get", "sbx", "-l", "agents.kruise.io/sandbox-pool=base"]);
    let members = members["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let id = &m["status"]["podInfo"]["annotations"]["agents.kruise.io/image-id"];
            (
                m["metadata"]["name"].as_str().unwrap().to_owned(),
                id.as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    (image, members)
}

/// Waits until `base`'s pool has one available member, and no other, whose image-id `holds`.
fn wait_base_rolled(serve: &OkaServe, what: &str, holds: impl Fn(&str) -> bool) {
    wait_until(serve, what, Duration::from_secs(120), || {
        let (_, members) = base_pool(serve);
        let set = json(serve, &["get", "sbs", "base"]);
        members.len() == 1
            && holds(&members[0].1)
            && set["status"]["availableReplicas"].as_i64() == Some(1)
    });
}

#[test]
fn switching_base_between_its_image_and_a_built_root_moves_its_unedited_template() {
    if !runnable("switching_base_between_its_image_and_a_built_root_moves_its_unedited_template") {
        return;
    }
    let registry = Registry::start(None);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(registry.push_image("oka/base", "1", &base_template_image()));
    let reference = format!("{}/oka/base:1", registry.host);
    let templates = tempfile::tempdir().unwrap();
    let config = |image: bool| {
        let images =
            if image { format!("  images:\n    base: {reference}\n") } else { String::new() };
        format!(
            "defaultPool:\n  replicas: 1\ncodeInterpreterPool:\n  enabled: false\n\
             templates:\n  dir: {}\n{images}",
            templates.path().display()
        )
    };
    // What an E2B create of `base` runs on; the sandbox is killed after.
    let on = |serve: &OkaServe| {
        let (id, token) = create(serve, "base");
        let script = "if [ -e /etc/oka-image ]; then echo image; else echo root; fi";
        let on = run_in_sandbox(serve, &id, &token, script);
        let (status, body) =
            http(serve.api, "DELETE", &format!("/sandboxes/{id}"), &serve.key(), "");
        assert_eq!(status, 204, "{body}");
        on
    };

    // On the image.
    let mut serve = OkaServe::start(OKA, &config(true), &[]);
    wait_until(&serve, "the Kubernetes API", Duration::from_secs(30), || {
        TcpStream::connect(("127.0.0.1", serve.kube)).is_ok()
            && serve.state.path().join("kubeconfig").exists()
    });
    assert_eq!(base_pool(&serve).0, reference);
    wait_base_rolled(&serve, "base on the image", |id| !id.is_empty());
    assert_eq!(on(&serve), "image\n");

    // The setting removed, its root built (here: the host's programs where `oka templates list`
    // says the root goes): the unedited template moves to the root and the pool rolls over.
    let list =
        Command::new(OKA).args(["templates", "list", "--dir"]).arg(templates.path()).output();
    let list = String::from_utf8(list.unwrap().stdout).unwrap();
    let line = list.lines().find(|l| l.starts_with("base ")).unwrap();
    assert!(line.contains("not built"), "{list}");
    let root_path = PathBuf::from(line.split_whitespace().last().unwrap());
    let root = support::host_root();
    std::fs::rename(root.path(), &root_path).unwrap();
    std::fs::write(root_path.join("etc/oka-template"), "base").unwrap();
    serve.restart(&config(false));
    wait_until(&serve, "the template on the root", Duration::from_secs(30), || {
        base_pool(&serve).0 == root_path.to_str().unwrap()
    });
    assert!(serve.log().contains("moved oka serve's unedited SandboxTemplate"), "{}", serve.log());
    wait_base_rolled(&serve, "base rolled to its root", str::is_empty);
    assert_eq!(on(&serve), "root\n");

    // Back on the image.
    serve.restart(&config(true));
    wait_until(&serve, "the template on the image", Duration::from_secs(30), || {
        base_pool(&serve).0 == reference
    });
    wait_base_rolled(&serve, "base rolled to the image", |id| !id.is_empty());
    assert_eq!(on(&serve), "image\n");
}
