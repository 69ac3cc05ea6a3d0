//! E2B template builds end to end with the real Python SDK's builder (`tests/sdk/template_build.py`):
//! `oka serve` builds a template from its `base` template in a real sandbox (commands, copied
//! files with modes, env, working directory, user, a start command with a port check), the
//! result is a locally built image in the image store, and a sandbox created by the template's
//! name has all of it. A failing command fails the build with the SDK's `BuildException`.
//!
//! Needs root (real sandboxes), the default templates' roots (`oka templates build`, which
//! `scripts/test.sh` runs), `oka-envd` beside `oka` and the SDK venv of
//! `scripts/setup-e2b-sdk.sh`; without root it prints SKIPPED.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

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
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/template_build.py");
    let out = Command::new(venv_python())
        .arg(&script)
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
        "the SDK build flow failed ({})\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- oka serve\n{}",
        out.status,
        serve.log()
    );
    eprintln!("{stdout}");
    // The built layers hold what the steps made, not what the runtime puts in every sandbox.
    let layers = serve.state.path().join("images/layers");
    let mut built = Vec::new();
    for layer in std::fs::read_dir(&layers).unwrap().flatten().filter(|e| e.path().is_dir()) {
        let path = layer.path();
        assert!(path.join("opt/made/file").exists(), "{} is not the build's layer", path.display());
        for runtime_file in ["etc/hostname", "etc/hosts", "etc/resolv.conf", ".oka"] {
            assert!(!path.join(runtime_file).exists(), "{runtime_file} in {}", path.display());
        }
        let mut top: Vec<String> = std::fs::read_dir(&path)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        top.sort();
        eprintln!("built layer {}: {top:?}", path.display());
        built.push(path);
    }
    assert_eq!(built.len(), 1, "one layer for the build and its cached twin: {built:?}");
    // Nothing of the builds stays in the runtime: their sandboxes are deleted.
    let runtime = serve.state.path().join("runtime/sandboxes");
    let leftovers: Vec<String> = std::fs::read_dir(&runtime)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(
        !leftovers.iter().any(|n| n.starts_with("oka-build-")),
        "build sandboxes left behind: {leftovers:?}"
    );
}
