//! E2B template builds end to end with the real Python SDK's builder (`tests/sdk/template_build.py`):
//! `oka serve` builds a template from its `base` template in a real sandbox (commands, copied
//! files with modes, env, working directory, user, a start command with a port check), the
//! result is a locally built image in the image store, and a sandbox created by the template's
//! name has all of it. A failing command fails the build with the SDK's `BuildException`; an
//! unchanged build is answered from the cache. `from_image` of an image pushed to a registry on
//! loopback (Debian's `docker-registry`, `tests/sdk/template_build_image.py`) builds on the
//! image's layers and env. With the default template `base` on an image of a registry that
//! wants credentials (`templates.images`, `templates.imagePullSecrets`), a build `from_template`
//! of it runs on the image its pool pulled (`tests/sdk/template_build_default_image.py`).
//!
//! Needs root (real sandboxes), the default templates' roots (`oka templates build`, which
//! `scripts/test.sh` runs), `oka-envd` beside `oka` and the SDK venv of
//! `scripts/setup-e2b-sdk.sh`; without root it prints SKIPPED.

#![allow(clippy::unwrap_used)]

mod support;

#[path = "../../image/tests/support/mod.rs"]
mod registry;

use std::path::{Path, PathBuf};
use std::process::Command;

use registry::{Entry, Registry, TestImage, TestLayer, sha256};

const OKA: &str = env!("CARGO_BIN_EXE_oka");

fn venv_python() -> PathBuf {
    let root = std::env::var_os("OKA_E2B_VENV_ROOT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv"),
        PathBuf::from,
    );
    let python = root.join("e2b-latest/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-e2b-sdk.sh first (it installs the e2b SDK venvs)",
        python.display()
    );
    python
}

/// Runs the SDK script `script` (in `tests/sdk/`) against `serve` with `envs`; its stdout.
fn run_script(serve: &support::OkaServe, script: &str, envs: &[(&str, &str)]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk").join(script);
    let out = Command::new(venv_python())
        .arg(&script)
        .envs(envs.iter().copied())
        .env("E2B_API_URL", format!("http://127.0.0.1:{}", serve.api))
        .env("E2B_SANDBOX_URL", format!("http://127.0.0.1:{}", serve.gateway))
        .env("E2B_API_KEY", serve.key())
        .env("OKA_RUN_ID", "tb")
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "{} failed ({})\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- oka serve\n{}",
        script.display(),
        out.status,
        serve.log()
    );
    eprintln!("{stdout}");
    stdout.into_owned()
}

/// A small image of host binaries: bash and the tools a build's steps and envd need, with
/// their shared libraries; `FROM_IMAGE=from-image` in its env, `/etc/image-release`.
fn tools_image() -> TestImage {
    tools_image_with(b"root:x:0:0:root:/root:/bin/bash\n", b"root:x:0:\n", Vec::new())
}

/// [`tools_image`] with these account files and further entries.
fn tools_image_with(passwd: &[u8], group: &[u8], extra: Vec<Entry>) -> TestImage {
    let envd = Path::new(OKA).with_file_name("oka-envd");
    let tools = ["/bin/bash", "/bin/sh", "/bin/cat", "/bin/mkdir", "/bin/chown", "/bin/sleep"];
    let mut files: Vec<PathBuf> = tools.iter().map(PathBuf::from).collect();
    for binary in files.clone().into_iter().chain([PathBuf::from(OKA), envd]) {
        let out = Command::new("ldd").arg(&binary).output().unwrap();
        for word in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if word.starts_with('/') {
                files.push(word.into());
            }
        }
    }
    files.sort();
    files.dedup();
    let mut entries =
        vec![Entry::Dir("bin", 0o755), Entry::Dir("etc", 0o755), Entry::Dir("root", 0o700)];
    let mut dirs: Vec<String> = vec!["bin".into(), "etc".into()];
    for file in files {
        let relative = file.strip_prefix("/").unwrap();
        for parent in relative.ancestors().skip(1).collect::<Vec<_>>().into_iter().rev() {
            let parent = parent.to_string_lossy().into_owned();
            if !parent.is_empty() && !dirs.contains(&parent) {
                dirs.push(parent.clone());
                entries.push(Entry::Dir(Box::leak(parent.into_boxed_str()), 0o755));
            }
        }
        let content = std::fs::read(&file).unwrap();
        entries.push(Entry::File(relative.to_string_lossy().into_owned(), content, 0o755, 0));
    }
    entries.push(Entry::File("etc/passwd".into(), passwd.to_vec(), 0o644, 0));
    entries.push(Entry::File("etc/group".into(), group.to_vec(), 0o644, 0));
    entries.push(Entry::File("etc/image-release".into(), b"test image\n".to_vec(), 0o644, 0));
    entries.extend(extra);
    let layers = vec![TestLayer::build(&entries)];
    let diff_ids: Vec<String> = layers.iter().map(|l| sha256(&l.tar)).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": registry::host_arch(),
        "os": "linux",
        "config": { "Env": ["PATH=/usr/bin:/bin", "FROM_IMAGE=from-image"] },
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

#[test]
fn the_python_sdk_builds_a_template_from_a_registry_image() {
    if !rustix::process::geteuid().is_root() || !Path::new(registry::REGISTRY_BIN).exists() {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root with docker-registry");
        eprintln!("SKIPPED: needs root and docker-registry (scripts/test.sh)");
        return;
    }
    let registry = Registry::start(None);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(registry.push_image("test/tools", "1", &tools_image()));
    let reference = format!("{}/test/tools:1", registry.host);
    let serve = support::OkaServe::start(
        OKA,
        "defaultPool:\n  enabled: false\ncodeInterpreterPool:\n  enabled: false\n",
        &[],
    );
    run_script(&serve, "template_build_image.py", &[("OKA_TEST_IMAGE", reference.as_str())]);
}

#[test]
fn the_python_sdk_builds_from_the_default_template_base_on_a_private_image() {
    if !rustix::process::geteuid().is_root() || !Path::new(registry::REGISTRY_BIN).exists() {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root with docker-registry");
        eprintln!("SKIPPED: needs root and docker-registry (scripts/test.sh)");
        return;
    }
    // `base` on an image of a registry that wants credentials, which its pool pulls with
    // templates.imagePullSecrets; a build from `base` runs on the stored image.
    let registry = Registry::start(Some(("alice", "s3cret")));
    let image = tools_image_with(
        b"root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\n",
        b"root:x:0:\nuser:x:1000:\n",
        vec![Entry::Dir("home", 0o755), Entry::Dir("home/user", 0o755), Entry::Dir("tmp", 0o1777)],
    );
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(registry.push_image("oka/base", "1", &image));
    let reference = format!("{}/oka/base:1", registry.host);
    let templates = tempfile::tempdir().unwrap();
    let config = format!(
        "defaultPool:\n  replicas: 1\ncodeInterpreterPool:\n  enabled: false\n\
         templates:\n  dir: {}\n  images:\n    base: {reference}\n  \
         imagePullSecrets: [registry-login]\n",
        templates.path().display()
    );
    let serve = support::OkaServe::start(OKA, &config, &[]);
    let kube = || std::net::TcpStream::connect(("127.0.0.1", serve.kube)).is_ok();
    support::wait_until(&serve, "the Kubernetes API", std::time::Duration::from_secs(30), || {
        kube() && serve.state.path().join("kubeconfig").exists()
    });
    support::kubectl(
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
    let available = || {
        support::kubectl_json(&serve, &["get", "sbs", "base"])["status"]["availableReplicas"]
            .as_i64()
            == Some(1)
    };
    support::wait_until(
        &serve,
        "base on the private image",
        std::time::Duration::from_secs(120),
        available,
    );
    run_script(&serve, "template_build_default_image.py", &[]);
}

#[test]
fn a_build_past_the_time_limit_fails_and_leaves_no_sandbox() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: template builds run in real sandboxes, which need root");
        return;
    }
    let config = format!(
        "{}  buildTimeLimit: 3s\ndefaultPool:\n  replicas: 0\ncodeInterpreterPool:\n  enabled: false\n",
        support::templates_config()
    );
    let serve = support::OkaServe::start(OKA, &config, &[]);
    run_script(&serve, "template_build_timeout.py", &[]);
    assert_no_build_sandboxes(&serve);
}

/// No build sandbox stays in `serve`'s runtime.
fn assert_no_build_sandboxes(serve: &support::OkaServe) {
    let runtime = serve.state.path().join("runtime/sandboxes");
    let leftovers: Vec<String> = std::fs::read_dir(&runtime)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(
        !leftovers.iter().any(|n| n.starts_with("oka-build-")),
        "build sandboxes left behind: {leftovers:?}"
    );
}

#[test]
fn the_python_sdk_builds_a_template_that_sandboxes_then_run() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: template builds run in real sandboxes, which need root");
        return;
    }
    let envd = Path::new(OKA).with_file_name("oka-envd");
    assert!(envd.is_file(), "{} is missing: `cargo build -p oka-envd`", envd.display());
    let out = Command::new(OKA)
        .args(["templates", "list", "--dir"])
        .arg(support::templates_dir())
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !list.contains("not built"),
        "the default templates are not built in {}:\n{list}\nrun `oka templates build --dir {0}`",
        support::templates_dir().display()
    );
    let serve = support::OkaServe::start(
        OKA,
        "defaultPool:\n  replicas: 1\n  outbound: true\ncodeInterpreterPool:\n  enabled: false\n",
        &[],
    );
    run_script(&serve, "template_build.py", &[]);
    // The built layers hold what the steps made, not what the runtime puts in every sandbox.
    let layers = serve.state.path().join("images/layers");
    let mut built = Vec::new();
    for layer in std::fs::read_dir(&layers).unwrap().flatten().filter(|e| e.path().is_dir()) {
        let path = layer.path();
        for runtime_file in ["etc/hostname", "etc/hosts", "etc/resolv.conf", ".oka"] {
            assert!(!path.join(runtime_file).exists(), "{runtime_file} in {}", path.display());
        }
        built.push(path);
    }
    // The template's layer (its cached twin shares it) and its child's; none of the failed build.
    assert_eq!(built.len(), 2, "{built:?}");
    assert!(built.iter().any(|l| l.join("opt/made/file").is_file()), "{built:?}");
    assert!(built.iter().any(|l| l.join("home/user/second").is_file()), "{built:?}");
    // Nothing of the builds stays in the runtime: their sandboxes are deleted.
    assert_no_build_sandboxes(&serve);
}
