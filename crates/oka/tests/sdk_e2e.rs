//! The official `e2b` SDKs (Python: newest release and newest 2.8.x; JavaScript: newest) against
//! `oka serve`, end to
//! end: real sandboxes from the warm pool, the manager's API, the gateway, envd as PID 1 of each
//! sandbox. The flow is `tests/sdk/e2e.py` (and the same in `e2e.mjs`): create, commands, files, list, timeout, pause,
//! resume by connect, kill; `tests/sdk/code_interpreter.py` runs `e2b-code-interpreter` on the
//! `code-interpreter-v1` pool.
//!
//! Needs root (real sandboxes) and the SDK venvs of `scripts/setup-e2b-sdk.sh`; without the venvs
//! it fails, without root it prints SKIPPED.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const OKA: &str = env!("CARGO_BIN_EXE_oka");
/// The warm pool's size.
const POOL: u32 = 3;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn venv_root() -> PathBuf {
    std::env::var_os("OKA_E2B_VENV_ROOT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv"),
        PathBuf::from,
    )
}

fn venv_python(name: &str) -> PathBuf {
    let python = venv_root().join(name).join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-e2b-sdk.sh first (it installs the e2b SDK venvs)",
        python.display()
    );
    python
}

/// `oka serve` (see [`support::OkaServe`]) with the SDK flows to run against it.
struct Serve(support::OkaServe);

impl std::ops::Deref for Serve {
    type Target = support::OkaServe;
    fn deref(&self) -> &support::OkaServe {
        &self.0
    }
}

impl Serve {
    fn start(replicas: u32) -> Self {
        Self::start_with(&format!(
            "defaultPool:\n  replicas: {replicas}\ncodeInterpreterPool:\n  enabled: false\n"
        ))
    }

    /// `oka serve` with `config` (YAML) plus its own API and gateway ports.
    fn start_with(config: &str) -> Self {
        Self(support::OkaServe::start(OKA, config, &[]))
    }

    /// Runs the Python SDK script `script` (in `tests/sdk/`) with the venv `venv`.
    fn run_python_flow(&self, venv: &str, script: &str, run: &str) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk").join(script);
        let mut command = Command::new(venv_python(venv));
        command.arg(&script).env("OKA_POOL", POOL.to_string());
        self.run_flow(venv, run, command);
    }

    /// Runs the JavaScript SDK flow with the npm project of the setup script.
    fn run_js_flow(&self, run: &str) {
        let sdk = venv_root().join("e2b-js");
        assert!(
            sdk.join("node_modules/e2b/package.json").exists() && sdk.join("node").exists(),
            "{} is missing: run scripts/setup-e2b-sdk.sh first (it installs the e2b JS SDK)",
            sdk.display()
        );
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/e2e.mjs");
        let mut command = Command::new(sdk.join("node"));
        command.arg(&script).env("OKA_E2B_JS", &sdk);
        self.run_flow("e2b-js", run, command);
    }

    /// Runs the README's Python example as printed.
    fn run_readme_example(&self) {
        let readme =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
                .unwrap();
        let example: String = readme
            .lines()
            .skip_while(|line| *line != "# example.py")
            .take_while(|line| *line != "```")
            .map(|line| format!("{line}\n"))
            .collect();
        assert!(example.contains("Sandbox.create"), "no example.py block in the README");
        let mut command = Command::new(venv_python("e2b-latest"));
        command.arg("-c").arg(format!("{example}\nprint('all checks passed')"));
        let out = self.run_flow("readme", "readme", command);
        assert!(out.contains("hello from user in /home/user"), "{out}");
        assert!(out.contains("kept across pause and resume"), "{out}");
    }

    /// Runs one SDK flow; panics with its output and the server log when it fails.
    fn run_flow(&self, sdk: &str, run: &str, mut command: Command) -> String {
        let out = command
            .env("E2B_API_URL", format!("http://127.0.0.1:{}", self.api))
            .env("E2B_SANDBOX_URL", format!("http://127.0.0.1:{}", self.gateway))
            .env("E2B_API_KEY", self.key())
            .env("OKA_RUN_ID", run)
            .env_remove("E2B_DOMAIN")
            .env_remove("E2B_DEBUG")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains("all checks passed"),
            "{sdk}: the SDK flow failed ({})\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- oka serve\n{}",
            out.status,
            self.log()
        );
        eprintln!("{sdk}:\n{stdout}");
        stdout.into_owned()
    }
}

#[test]
fn python_sdks_drive_oka_serve_end_to_end() {
    if !is_root() {
        eprintln!("SKIPPED python_sdks_drive_oka_serve_end_to_end: real sandboxes need root");
        return;
    }
    let serve = Serve::start(POOL);
    serve.wait_sandboxes(POOL as usize, Duration::from_secs(60));
    serve.run_python_flow("e2b-latest", "e2e.py", "latest");
    serve.run_python_flow("e2b-2.8", "e2e.py", "old");
    serve.run_js_flow("js");
    serve.run_python_flow("e2b-latest", "edges.py", "edges");
    serve.run_python_flow("e2b-latest", "snapshot.py", "snapshot");
    serve.run_readme_example();
}

/// Fails with what to run when the default templates' roots are not built where the tests
/// point `oka serve` ([`support::templates_dir`]).
fn assert_templates_built() {
    let out = Command::new(OKA)
        .args(["templates", "list", "--dir"])
        .arg(support::templates_dir())
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !list.contains("not built"),
        "the default templates are not built in {}:\n{list}\nrun `oka templates build --dir {0}` \
         (scripts/test.sh does)",
        support::templates_dir().display()
    );
}

/// The default templates through the real SDKs: `base` has sudo for `user`, Python with pip,
/// Node.js, git, curl and gcc; `code-interpreter-v1` imports pandas, matplotlib and numpy and
/// plots to a PNG; neither has what only the host installed (`tests/sdk/templates.py`).
#[test]
fn the_default_templates_are_debian_with_their_tools_and_not_the_host() {
    if !is_root() {
        eprintln!(
            "SKIPPED the_default_templates_are_debian_with_their_tools_and_not_the_host: real sandboxes need root"
        );
        return;
    }
    assert_templates_built();
    let interpreter = Path::new(OKA).with_file_name("oka-interpreter");
    assert!(
        interpreter.is_file(),
        "{} is missing: `cargo build -p oka-interpreter`",
        interpreter.display()
    );
    // Files the host has (scripts/test.sh installs both) and the templates do not: were the
    // host's /usr visible, the script's absence checks would fail.
    let host_only = ["/usr/sbin/debootstrap", "/usr/bin/buildah"];
    for path in host_only {
        assert!(Path::new(path).exists(), "the host has no {path}: scripts/test.sh installs it");
    }
    let serve =
        Serve::start_with("defaultPool:\n  replicas: 1\ncodeInterpreterPool:\n  replicas: 1\n");
    serve.wait_sandboxes(2, Duration::from_secs(60));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/templates.py");
    let mut command = Command::new(venv_python("e2b-latest"));
    command.arg(&script).env("OKA_HOST_ONLY", host_only.join(":"));
    serve.run_flow("templates", "templates", command);
}

/// The `e2b-code-interpreter` SDK's `run_code` against the `code-interpreter-v1` pool, whose
/// sandboxes run `oka-interpreter` with the Jupyter kernels of the template's root.
#[test]
fn the_code_interpreter_sdk_runs_code_in_oka_serve() {
    if !is_root() {
        eprintln!(
            "SKIPPED the_code_interpreter_sdk_runs_code_in_oka_serve: real sandboxes need root"
        );
        return;
    }
    assert_templates_built();
    let interpreter = Path::new(OKA).with_file_name("oka-interpreter");
    assert!(
        interpreter.is_file(),
        "{} is missing: build it with `cargo build -p oka-interpreter` (the workspace test run builds it)",
        interpreter.display()
    );
    let serve =
        Serve::start_with("defaultPool:\n  replicas: 0\ncodeInterpreterPool:\n  replicas: 1\n");
    serve.wait_sandboxes(1, Duration::from_secs(60));
    serve.run_python_flow("e2b-latest", "code_interpreter.py", "code-interpreter");
}

/// Runs the JavaScript SDK flow `script` (in `tests/sdk/`) with the npm project of the setup
/// script.
fn run_js_script(serve: &Serve, script: &str, run: &str) {
    let sdk = venv_root().join("e2b-js");
    assert!(
        sdk.join("node_modules/e2b/package.json").exists() && sdk.join("node").exists(),
        "{} is missing: run scripts/setup-e2b-sdk.sh first (it installs the e2b JS SDK)",
        sdk.display()
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk").join(script);
    let mut command = Command::new(sdk.join("node"));
    command.arg(&script).env("OKA_E2B_JS", &sdk);
    serve.run_flow("e2b-js", run, command);
}

/// A sandbox killed while a command and a watch stream, a file read waits in envd and an upload
/// is half sent: every SDK call fails with the SDK's "the sandbox is gone" error
/// (`tests/sdk/killed.py`, `killed.mjs`), which needs the gateway's not-found 502 on the health
/// probe the SDKs send after a broken stream.
#[test]
fn a_sandbox_killed_during_requests_fails_them_as_gone() {
    if !is_root() {
        eprintln!(
            "SKIPPED a_sandbox_killed_during_requests_fails_them_as_gone: real sandboxes need root"
        );
        return;
    }
    let serve = Serve::start(2);
    serve.wait_sandboxes(2, Duration::from_secs(60));
    serve.run_python_flow("e2b-latest", "killed.py", "killed-latest");
    serve.run_python_flow("e2b-2.8", "killed.py", "killed-old");
    run_js_script(&serve, "killed.mjs", "killed-js");
}

/// A sandbox restarted through the Kubernetes API keeps its ID, files and claim (environment
/// variables, access token): the SDK goes on working with new processes; one upgraded by a
/// CheckpointRestore SandboxUpdateOps keeps its processes and their memory.
#[test]
fn a_restarted_sandbox_keeps_working_for_the_sdk() {
    if !is_root() {
        eprintln!(
            "SKIPPED a_restarted_sandbox_keeps_working_for_the_sdk: real sandboxes need root"
        );
        return;
    }
    let serve = Serve::start(1);
    serve.wait_sandboxes(1, Duration::from_secs(60));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/restart.py");
    let mut command = Command::new(venv_python("e2b-latest"));
    command.arg(&script).env("KUBECONFIG", serve.state.path().join("kubeconfig"));
    serve.run_flow("e2b-latest", "restart", command);
    // A CheckpointRestore upgrade keeps the processes, with their memory.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/checkpoint_restore.py");
    let mut command = Command::new(venv_python("e2b-latest"));
    command.arg(&script).env("KUBECONFIG", serve.state.path().join("kubeconfig"));
    serve.run_flow("e2b-latest", "checkpoint-restore", command);
}

/// The `@e2b/code-interpreter` JavaScript SDK (`tests/sdk/code_interpreter.mjs`) against the
/// `code-interpreter-v1` pool, with the kernels of its template's root.
#[test]
fn the_code_interpreter_js_sdk_runs_code_in_oka_serve() {
    if !is_root() {
        eprintln!(
            "SKIPPED the_code_interpreter_js_sdk_runs_code_in_oka_serve: real sandboxes need root"
        );
        return;
    }
    assert_templates_built();
    let interpreter = Path::new(OKA).with_file_name("oka-interpreter");
    assert!(
        interpreter.is_file(),
        "{} is missing: `cargo build -p oka-interpreter`",
        interpreter.display()
    );
    let sdk = venv_root().join("e2b-js");
    assert!(
        sdk.join("node_modules/@e2b/code-interpreter/package.json").exists(),
        "{} has no @e2b/code-interpreter: run scripts/setup-e2b-sdk.sh first",
        sdk.display()
    );
    let serve =
        Serve::start_with("defaultPool:\n  replicas: 0\ncodeInterpreterPool:\n  replicas: 1\n");
    serve.wait_sandboxes(1, Duration::from_secs(60));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/code_interpreter.mjs");
    let mut command = Command::new(sdk.join("node"));
    command.arg(&script).env("OKA_E2B_JS", &sdk);
    serve.run_flow("code-interpreter-js", "code-interpreter-js", command);
}

/// E2B parity (`tests/sdk/parity.py`): short timeouts, `set_timeout(0)`, the lifecycle of a
/// create (pause or kill, memory or files only, auto-resume), the list's order and paging, and
/// fork, with the newest Python and JavaScript SDKs; what the 2.8.x SDK has (timeouts and the
/// list) with it.
#[test]
fn e2b_parity_with_the_python_and_js_sdks() {
    if !is_root() {
        eprintln!("SKIPPED e2b_parity_with_the_python_and_js_sdks: real sandboxes need root");
        return;
    }
    let serve = Serve::start(4);
    serve.wait_sandboxes(4, Duration::from_secs(60));
    serve.run_python_flow("e2b-latest", "parity.py", "parity-latest");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/parity.py");
    let mut command = Command::new(venv_python("e2b-2.8"));
    command.arg(&script).env("OKA_PARITY_OLD", "1");
    serve.run_flow("e2b-2.8", "parity-old", command);
    run_js_script(&serve, "parity.mjs", "parity-js");
}
