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

/// An outside world for sandboxes: a network namespace joined to the host by a veth pair
/// (`198.51.100.20/30`), holding `198.51.100.88` and `203.0.113.88` (documentation ranges,
/// routed from the host to it) with an HTTP server on each. Removed on drop.
struct Outside {
    netns: String,
    host_if: String,
    servers: Vec<std::process::Child>,
}

impl Outside {
    const A: &str = "198.51.100.88";
    const B: &str = "203.0.113.88";

    fn new() -> (Self, u16) {
        let ip = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().unwrap();
            assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        let pid = std::process::id();
        let me = Self {
            netns: format!("oka-out-{pid}"),
            host_if: format!("okout{}", pid % 100_000),
            servers: Vec::new(),
        };
        ip(&["netns", "add", &me.netns]);
        ip(&[
            "link",
            "add",
            &me.host_if,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &me.netns,
        ]);
        ip(&["addr", "add", "198.51.100.21/30", "dev", &me.host_if]);
        ip(&["link", "set", &me.host_if, "up"]);
        ip(&["-n", &me.netns, "addr", "add", "198.51.100.22/30", "dev", "eth0"]);
        ip(&["-n", &me.netns, "link", "set", "eth0", "up"]);
        ip(&["-n", &me.netns, "link", "set", "lo", "up"]);
        ip(&["-n", &me.netns, "route", "add", "default", "via", "198.51.100.21"]);
        for addr in [Self::A, Self::B] {
            ip(&["-n", &me.netns, "addr", "add", &format!("{addr}/32"), "dev", "lo"]);
            ip(&["route", "add", &format!("{addr}/32"), "via", "198.51.100.22"]);
        }
        let port = support::free_port();
        let mut me = me;
        for addr in [Self::A, Self::B] {
            let child = Command::new("ip")
                .args(["netns", "exec", &me.netns, "python3", "-m", "http.server"])
                .args([&port.to_string(), "--bind", addr])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            me.servers.push(child);
        }
        // Python starts slowly on a busy machine: wait until both answer from the host.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        for addr in [Self::A, Self::B] {
            let target: std::net::SocketAddr = format!("{addr}:{port}").parse().unwrap();
            while std::net::TcpStream::connect_timeout(&target, std::time::Duration::from_secs(1))
                .is_err()
            {
                assert!(std::time::Instant::now() < deadline, "{target} never listened");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        (me, port)
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        for child in &mut self.servers {
            let _ = child.kill();
            let _ = child.wait();
        }
        for addr in [Self::A, Self::B] {
            let _ = Command::new("ip").args(["route", "del", &format!("{addr}/32")]).output();
        }
        let _ = Command::new("ip").args(["link", "del", &self.host_if]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.netns]).output();
    }
}

#[test]
fn egress_policies_hold_for_the_python_sdk() {
    if !is_root() {
        eprintln!("SKIPPED egress_policies_hold_for_the_python_sdk: real sandboxes need root");
        return;
    }
    let (_outside, port) = Outside::new();
    let host = std::net::TcpListener::bind(("0.0.0.0", 0)).unwrap();
    let host_port = host.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in host.incoming() {
            drop(stream);
        }
    });
    let serve = Serve::start_with(
        "defaultPool:\n  replicas: 3\n  outbound: true\ncodeInterpreterPool:\n  enabled: false\n",
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/egress.py");
    let mut command = Command::new(venv_python("e2b-latest"));
    command
        .arg(&script)
        .env("OKA_A", format!("{}:{port}", Outside::A))
        .env("OKA_B", format!("{}:{port}", Outside::B))
        .env("OKA_HOST_PORT", host_port.to_string())
        .env("OKA_KUBECTL", support::kubectl_binary())
        .env("OKA_KUBECONFIG", serve.state.path().join("kubeconfig"));
    serve.run_flow("e2b-latest", "egress", command);
    // The runtime's table goes with its last outbound sandbox: a test run leaves none.
    let canonical = std::fs::canonicalize(serve.state.path()).unwrap();
    let hash = oka_controller::revision::fnv1_32(canonical.as_os_str().as_encoded_bytes());
    let table = format!("oka_oka_{hash:08x}");
    let listed = Command::new("nft").args(["list", "table", "inet", &table]).output().unwrap();
    assert!(listed.status.success(), "table {table} while the sandboxes run");
    drop(serve);
    let listed = Command::new("nft").args(["list", "table", "inet", &table]).output().unwrap();
    assert!(!listed.status.success(), "table {table} left behind");
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
