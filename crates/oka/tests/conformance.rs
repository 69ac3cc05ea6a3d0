//! oka's E2B API against its own description (`crates/manager/openapi.yaml`, served at
//! `GET /openapi.yaml`): schemathesis generates requests for every documented operation and
//! sends them to a live `oka serve` with real sandboxes, and every answer must be documented:
//! no 5xx (501 only where the document says so), a documented status, content type and
//! headers, a body of the documented schema. The document follows E2B's `spec/openapi.yml`
//! for every field it shares, so this is also the check that our answers are E2B's.
//!
//! The run is `tests/conformance/run.py` (it makes running and paused sandboxes first, so the
//! generated requests reach them), bounded by a fixed number of examples per operation and a
//! fixed seed (`OKA_SEED` overrides it). Needs root (real sandboxes) and the schemathesis venv
//! of `scripts/setup-schemathesis.sh`; without the venv it fails, without root it prints
//! SKIPPED.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const OKA: &str = env!("CARGO_BIN_EXE_oka");
/// The warm pool's size: the run's own sandboxes, and a few for the generated creates.
const POOL: u32 = 4;

fn schemathesis_python() -> PathBuf {
    let root = std::env::var_os("OKA_E2B_VENV_ROOT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv"),
        PathBuf::from,
    );
    let python = root.join("schemathesis/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-schemathesis.sh first (scripts/test.sh does)",
        python.display()
    );
    python
}

#[test]
fn every_answer_matches_the_api_description() {
    if !is_root() {
        eprintln!("SKIPPED every_answer_matches_the_api_description: real sandboxes need root");
        return;
    }
    let python = schemathesis_python();
    let config =
        format!("defaultPool:\n  replicas: {POOL}\ncodeInterpreterPool:\n  enabled: false\n");
    let serve = support::OkaServe::start(OKA, &config, &[]);
    serve.wait_sandboxes(POOL as usize, Duration::from_secs(60));
    let reports = serve.state.path().join("schemathesis");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/run.py");
    // schemathesis keeps a cache in its working directory: the run's, not the source tree.
    std::fs::create_dir_all(&reports).unwrap();
    let started = Instant::now();
    let out = Command::new(python)
        .arg(script)
        .current_dir(&reports)
        .env("OKA_API", format!("http://127.0.0.1:{}", serve.api))
        .env("E2B_API_KEY", serve.key())
        .env("OKA_POOL", "base")
        .env("OKA_REPORT_DIR", &reports)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "answers that break the API description ({})\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- oka serve\n{}",
        out.status,
        serve.log()
    );
    eprintln!("{stdout}\nconformance run: {:.0?}", started.elapsed());
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}
