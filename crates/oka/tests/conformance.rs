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
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const OKA: &str = env!("CARGO_BIN_EXE_oka");
/// The warm pool's size: the run's own sandboxes, and a few for the generated creates.
const POOL: u32 = 4;

/// `oka serve` on a fresh state directory; stopped with SIGTERM and its sandboxes removed on drop.
struct Serve {
    child: Child,
    state: tempfile::TempDir,
    api: u16,
}

impl Serve {
    fn start() -> Self {
        let state = tempfile::tempdir().unwrap();
        let (api, gateway) = (support::free_port(), support::free_port());
        let config = format!(
            "defaultPool:\n  replicas: {POOL}\ncodeInterpreterPool:\n  enabled: false\n\
             api:\n  listen: 127.0.0.1:{api}\ngateway:\n  listen: 127.0.0.1:{gateway}\n"
        );
        let config_path = state.path().join("config.yaml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(state.path().join("serve.log")).unwrap();
        let child = Command::new(OKA)
            .arg("serve")
            .arg("--state-dir")
            .arg(state.path())
            .arg("--config")
            .arg(&config_path)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let serve = Self { child, state, api };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", api)).is_err()
            || count_dirs(&serve.state.path().join("runtime/sandboxes")) < POOL as usize
        {
            assert!(Instant::now() < deadline, "oka serve did not start:\n{}", serve.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        serve
    }

    fn key(&self) -> String {
        std::fs::read_to_string(self.state.path().join("admin-key")).unwrap().trim().to_owned()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.state.path().join("serve.log")).unwrap_or_default()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
        support::remove_sandboxes(self.state.path(), OKA);
    }
}

fn count_dirs(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

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
    let serve = Serve::start();
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
