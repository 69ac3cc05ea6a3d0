//! Shared helpers of the runtime's integration tests: a root gate, a runtime on a fresh state
//! directory, spec builders, and polling with a deadline (never a fixed sleep).

#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use oka_runtime::local::{LocalConfig, LocalRuntime};
use oka_runtime_api::{Runtime, SandboxId, SandboxSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `true` when running as root; otherwise prints why the test is skipped.
pub fn root_or_skip(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    eprintln!(
        "SKIPPED {test}: the local runtime tests need root (namespaces, mounts, cgroups); CI runs them as root"
    );
    false
}

/// The `oka-init` binary cargo built for these tests.
pub fn init_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_oka-init"))
}

/// A runtime on a fresh temporary state directory, with its own cgroup name.
pub async fn runtime(name: &str) -> (LocalRuntime, tempfile::TempDir) {
    let dir = tempfile::Builder::new().prefix("oka-rt-").tempdir().expect("temp dir");
    let rt =
        LocalRuntime::open(config(dir.path().join("state"), name)).await.expect("open runtime");
    (rt, dir)
}

/// The config tests use: cgroup name `oka-test-<name>`, whose cgroups are removed when the test
/// process exits.
pub fn config(state_dir: PathBuf, name: &str) -> LocalConfig {
    let mut config = LocalConfig::new(state_dir, init_binary());
    config.cgroup_name = format!("oka-test-{name}");
    remove_cgroups_at_exit(&config.cgroup_name);
    config
}

/// The runtime cgroup names this test process used.
static CGROUP_NAMES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Removes the runtime cgroups called `name` from every hierarchy when the test process exits
/// (each only if no sandbox is left in it, as `LocalRuntime::remove_cgroups` does), so that test
/// runs leave no `oka-test-*` directories behind, whichever way a test opened its runtimes.
fn remove_cgroups_at_exit(name: &str) {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    // SAFETY: `remove_registered` is an `extern "C" fn()` that does not unwind.
    REGISTER.call_once(|| unsafe {
        libc::atexit(remove_registered);
    });
    CGROUP_NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(name.to_owned());
}

extern "C" fn remove_registered() {
    let names =
        CGROUP_NAMES.lock().map(|names| names.clone()).unwrap_or_else(|p| p.into_inner().clone());
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else { return };
    for hierarchy in hierarchies.flatten() {
        for name in &names {
            // A cgroup with a sandbox (or a task) left in it refuses; that is kept.
            let _ = std::fs::remove_dir(hierarchy.path().join(name));
        }
    }
}

/// A spec running `sh -c script` on the default root.
pub fn sh(id: &str, script: &str) -> SandboxSpec {
    SandboxSpec::new(id_of(id), vec!["/bin/sh".into(), "-c".into(), script.into()])
}

/// A sandbox id.
pub fn id_of(id: &str) -> SandboxId {
    SandboxId::new(id).expect("valid id")
}

/// Polls `check` until it returns `Some`, failing the test after `timeout`.
pub async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Connects to `port` in sandbox `id`, sends `request`, and reads the answer until EOF.
pub async fn exchange(
    rt: &LocalRuntime,
    id: &SandboxId,
    port: u16,
    request: &[u8],
) -> std::io::Result<Vec<u8>> {
    let mut stream = rt.connect(id, port).await.map_err(std::io::Error::other)?;
    stream.write_all(request).await?;
    stream.shutdown().await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
        .await
        .map_err(|_| std::io::Error::other("read timed out"))??;
    Ok(out)
}

/// Reads `path` (absolute, inside the sandbox) from sandbox `id`'s writable layer.
pub async fn read_upper(rt: &LocalRuntime, id: &SandboxId, path: &str) -> Option<String> {
    let upper = rt.paths(id).await?.upper;
    std::fs::read_to_string(upper.join(path.trim_start_matches('/'))).ok()
}

/// Waits until the sandbox wrote `path` (inside the sandbox) with a last line equal to `marker`
/// and returns the file's content.
pub async fn wait_for_file(rt: &LocalRuntime, id: &SandboxId, path: &str, marker: &str) -> String {
    poll(&format!("{path} ending with {marker}"), Duration::from_secs(20), || async {
        read_upper(rt, id, path).await.filter(|s| s.lines().last() == Some(marker))
    })
    .await
}

/// Sends an HTTP GET for `/` to `port` in sandbox `id`; returns the response if it connected.
pub async fn http_get(rt: &LocalRuntime, id: &SandboxId, port: u16) -> Option<String> {
    let req = b"GET / HTTP/1.0\r\nHost: sandbox\r\n\r\n";
    exchange(rt, id, port, req).await.ok().map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Python's HTTP server on `127.0.0.1:port`, serving `/tmp`.
pub fn http_server(id: &str, port: u16) -> SandboxSpec {
    SandboxSpec::new(
        id_of(id),
        vec![
            "python3".into(),
            "-m".into(),
            "http.server".into(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--directory".into(),
            "/tmp".into(),
            port.to_string(),
        ],
    )
}

/// A Python HTTP server on `127.0.0.1:port` that counts `GET /count` requests in memory and
/// answers `count=N`; other paths answer `ok` without counting. It holds `mb` MiB of touched
/// anonymous memory and prints `hit N` on stdout for each count.
pub fn counter_server(id: &str, port: u16, mb: u32) -> SandboxSpec {
    counter_server_with(id, port, mb, "")
}

/// [`counter_server`] that first runs the Python statements `preamble`.
pub fn counter_server_with(id: &str, port: u16, mb: u32, preamble: &str) -> SandboxSpec {
    const SERVER: &str = r#"
import http.server, sys
blob = bytearray(int(sys.argv[1]) << 20)
blob[::4096] = b"\x01" * len(range(0, len(blob), 4096))
count = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global count
        if self.path == "/count":
            count += 1
            body = f"count={count}\n".encode()
            print(f"hit {count}", flush=True)
        else:
            body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), H).serve_forever()
"#;
    SandboxSpec::new(
        id_of(id),
        vec![
            "python3".into(),
            "-c".into(),
            format!("{preamble}\n{SERVER}"),
            mb.to_string(),
            port.to_string(),
        ],
    )
}

/// The body of `GET path` from `port` in sandbox `id`, if it answered 200.
pub async fn http_body(rt: &LocalRuntime, id: &SandboxId, port: u16, path: &str) -> Option<String> {
    let req = format!("GET {path} HTTP/1.0\r\nHost: sandbox\r\n\r\n");
    let out = exchange(rt, id, port, req.as_bytes()).await.ok()?;
    let text = String::from_utf8_lossy(&out).into_owned();
    if !text.starts_with("HTTP/1.0 200") {
        return None;
    }
    text.split_once("\r\n\r\n").map(|(_, body)| body.to_owned())
}

/// Waits until the server of [`counter_server`] answers.
pub async fn wait_for_server(rt: &LocalRuntime, id: &SandboxId, port: u16) {
    poll("the server to answer", Duration::from_secs(20), || http_body(rt, id, port, "/ping"))
        .await;
}

/// Host mounts under `dir`, from `/proc/self/mountinfo`.
pub fn host_mounts_under(dir: &std::path::Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("read mountinfo")
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&dir)))
        .map(str::to_owned)
        .collect()
}
