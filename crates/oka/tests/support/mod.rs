//! Helpers shared by the tests and benchmarks that start a real `oka serve`: a free loopback
//! port, `oka serve` itself ([`OkaServe`]), and the removal of the sandboxes a run leaves behind.

#![allow(dead_code, clippy::unwrap_used)]

pub mod cluster;
pub mod otlp;

use std::net::TcpListener;
use std::path::Path;

/// A free loopback port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Sandboxes outlive `oka serve` by design: deletes what one left in `state` with a runtime of
/// our own on the same state directory (and the cgroup name `oka serve` derives from it), then
/// that runtime's own cgroups.
/// `init` is the init binary to name in the runtime's config (the `oka` binary).
pub fn remove_sandboxes(state: &Path, init: &str) {
    use oka_runtime::local::{LocalConfig, LocalRuntime};
    use oka_runtime_api::Runtime as _;
    let Ok(canonical) = std::fs::canonicalize(state) else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut config = LocalConfig::new(state.join("runtime"), init);
        config.cgroup_name = format!(
            "oka-{:08x}",
            oka_controller::revision::fnv1_32(canonical.as_os_str().as_encoded_bytes())
        );
        let Ok(runtime) = LocalRuntime::open(config).await else { return };
        for sandbox in runtime.list().await.unwrap_or_default() {
            let _ = runtime.delete(&sandbox.id).await;
        }
        runtime.remove_cgroups();
    });
}

/// Where the default templates' roots are built once per machine (`scripts/test.sh` runs
/// `oka templates build --dir` there); `$OKA_TEMPLATES_DIR` overrides it.
pub fn templates_dir() -> std::path::PathBuf {
    std::env::var_os("OKA_TEMPLATES_DIR")
        .map_or_else(|| "/var/cache/oka/templates".into(), std::path::PathBuf::from)
}

/// The config section that points `oka serve` at [`templates_dir`], so a test's default pools
/// run on the built roots instead of building them in its fresh state directory.
pub fn templates_config() -> String {
    format!("templates:\n  dir: {}\n", templates_dir().display())
}

/// `oka serve` on a fresh state directory with `config` (YAML) and an API and a gateway port of
/// its own; stopped with SIGTERM and its sandboxes removed on drop (also when a test panics).
pub struct OkaServe {
    /// The running `oka serve`.
    pub child: std::process::Child,
    /// Its state directory (and `config.yaml`, `serve.log`, `admin-key`).
    pub state: tempfile::TempDir,
    /// The E2B API's port.
    pub api: u16,
    /// The gateway's port.
    pub gateway: u16,
    /// The Kubernetes-compatible API's port.
    pub kube: u16,
    /// The `oka` binary that runs.
    oka: String,
}

impl OkaServe {
    /// Starts `oka` (the binary's path) as `oka serve` with `config` plus the three ports and
    /// the environment `envs`, and waits until its E2B API, gateway (when it runs sandboxes) and
    /// Kubernetes API listen.
    /// A free port probed here can be taken by another process before `oka serve` binds it (any
    /// outgoing connection may get it from the ephemeral range): such a start is retried on new
    /// ports, a few times.
    pub fn start(oka: &str, config: &str, envs: &[(&str, &std::ffi::OsStr)]) -> Self {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::try_start(oka, config, envs) {
                Ok(serve) => return serve,
                Err(log) if attempt < 4 && log.contains("Address already in use") => {
                    eprintln!("oka serve lost a port to another process; starting it again");
                }
                Err(log) => panic!("oka serve did not listen:\n{log}"),
            }
        }
    }

    /// One start: the running `oka serve`, or its log when it exited or never listened.
    fn try_start(
        oka: &str,
        config: &str,
        envs: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Self, String> {
        use std::process::{Command, Stdio};
        use std::time::{Duration, Instant};
        let state = tempfile::tempdir().unwrap();
        let (api, gateway, kube) = (free_port(), free_port(), free_port());
        // Without a runtime there is no gateway to wait for.
        let with_gateway = !config.contains("runtime:\n  enabled: false");
        let templates =
            if config.contains("templates:") { String::new() } else { templates_config() };
        // The listeners go into the sections the test's config has, or new ones.
        let mut config = config.to_owned();
        for (section, port) in [("api", api), ("gateway", gateway)] {
            let head = format!("{section}:\n");
            let listen = format!("{head}  listen: 127.0.0.1:{port}\n");
            if config.starts_with(&head) {
                config = config.replacen(&head, &listen, 1);
            } else if config.contains(&format!("\n{head}")) {
                config = config.replacen(&format!("\n{head}"), &format!("\n{listen}"), 1);
            } else {
                config.push_str(&listen);
            }
        }
        let config = format!("{config}{templates}kubeApi:\n  listen: 127.0.0.1:{kube}\n");
        let config_path = state.path().join("config.yaml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(state.path().join("serve.log")).unwrap();
        let mut command = Command::new(oka);
        command
            .arg("serve")
            .arg("--state-dir")
            .arg(state.path())
            .arg("--config")
            .arg(&config_path)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log);
        for (name, value) in envs {
            command.env(name, value);
        }
        let child = command.spawn().unwrap();
        let mut serve = Self { child, state, api, gateway, kube, oka: oka.to_owned() };
        let deadline = Instant::now() + Duration::from_secs(60);
        let listening = |port: u16| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        while !(listening(api) && (!with_gateway || listening(gateway)) && listening(kube)) {
            if serve.child.try_wait().ok().flatten().is_some() || Instant::now() >= deadline {
                return Err(serve.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(serve)
    }

    /// Stops it (SIGTERM) and starts it again on the same state directory and ports with
    /// `config` (as [`OkaServe::start`]'s); its sandboxes outlive the stop and are taken over.
    /// The log goes on in the same file.
    pub fn restart(&mut self, config: &str) {
        use std::process::{Command, Stdio};
        use std::time::{Duration, Instant};
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
        let templates =
            if config.contains("templates:") { String::new() } else { templates_config() };
        let config = format!(
            "{config}{templates}api:\n  listen: 127.0.0.1:{}\ngateway:\n  listen: 127.0.0.1:{}\nkubeApi:\n  listen: 127.0.0.1:{}\n",
            self.api, self.gateway, self.kube
        );
        let config_path = self.state.path().join("config.yaml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.state.path().join("serve.log"))
            .unwrap();
        self.child = Command::new(&self.oka)
            .arg("serve")
            .arg("--state-dir")
            .arg(self.state.path())
            .arg("--config")
            .arg(&config_path)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let listening = |port: u16| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        while !(listening(self.api) && listening(self.kube)) {
            assert!(
                self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline,
                "oka serve did not listen again:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The admin key it generated.
    pub fn key(&self) -> String {
        std::fs::read_to_string(self.state.path().join("admin-key")).unwrap().trim().to_owned()
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.state.path().join("serve.log")).unwrap_or_default()
    }

    /// How many sandboxes its runtime holds.
    pub fn runtime_sandboxes(&self) -> usize {
        std::fs::read_dir(self.state.path().join("runtime/sandboxes")).map_or(0, |d| d.count())
    }

    /// Waits until its runtime holds at least `count` sandboxes.
    pub fn wait_sandboxes(&self, count: usize, within: std::time::Duration) {
        let deadline = std::time::Instant::now() + within;
        while self.runtime_sandboxes() < count {
            assert!(std::time::Instant::now() < deadline, "the pool did not fill:\n{}", self.log());
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

impl Drop for OkaServe {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
        remove_sandboxes(self.state.path(), &self.oka);
    }
}

/// A root directory for sandboxes with the host's programs, for a test that used the runtime's
/// default root through a template: templates applied through the API need an `image`, and any
/// `image` but an absolute path is an OCI image to pull. The host's `/usr` is hard-linked in
/// (`cp -al`: nothing is copied, so it takes seconds; the temporary directory must be on the
/// file system of `/usr`), with merged-`/usr` links, accounts `root` and `user` (1000) and the
/// directories a sandbox expects.
pub fn host_root() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt as _;
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let status = std::process::Command::new("cp")
        .args(["-al", "/usr"])
        .arg(root.path().join("usr"))
        .status()
        .unwrap();
    assert!(
        status.success(),
        "cp -al /usr: the test's temporary directory must share /usr's file system"
    );
    for name in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
        let host = std::path::Path::new("/").join(name);
        if let Ok(target) = std::fs::read_link(&host) {
            std::os::unix::fs::symlink(target, root.path().join(name)).unwrap();
        }
    }
    for (dir, mode) in [
        ("etc", 0o755),
        ("root", 0o700),
        ("home/user", 0o755),
        ("tmp", 0o1777),
        ("proc", 0o555),
        ("dev", 0o755),
    ] {
        let path = root.path().join(dir);
        std::fs::create_dir_all(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::os::unix::fs::chown(root.path().join("home/user"), Some(1000), Some(1000)).unwrap();
    std::fs::write(
        root.path().join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(root.path().join("etc/group"), "root:x:0:\nuser:x:1000:\n").unwrap();
    for file in ["ld.so.cache", "ld.so.conf"] {
        let _ = std::fs::copy(
            std::path::Path::new("/etc").join(file),
            root.path().join("etc").join(file),
        );
    }
    root
}

/// The kubectl to run: `$KUBECTL`, else `kubectl` on the `PATH` (`scripts/test.sh` installs it).
pub fn kubectl_binary() -> String {
    std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_owned())
}

/// kubectl `args` (with `stdin`) against `serve`'s Kubernetes API; its stdout, failing the test
/// with kubectl's stderr and `serve`'s log on an error.
pub fn kubectl(serve: &OkaServe, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new(kubectl_binary())
        .arg("--kubeconfig")
        .arg(serve.state.path().join("kubeconfig"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        serve.log()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// [`kubectl`] with `-o json`, parsed.
pub fn kubectl_json(serve: &OkaServe, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&kubectl(serve, &all, None)).unwrap()
}

/// One HTTP/1.1 request to `127.0.0.1:port` (JSON body, connection closed after); the status
/// code and the body.
pub fn http(port: u16, method: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{headers}\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// Waits until `check` holds, failing with `serve`'s log after `within`.
pub fn wait_until(
    serve: &OkaServe,
    what: &str,
    within: std::time::Duration,
    mut check: impl FnMut() -> bool,
) {
    let deadline = std::time::Instant::now() + within;
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}:\n{}",
            serve.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Runs `sh -c script` in sandbox `id` through the gateway and envd (`process.Process/Start`,
/// Connect JSON) with its access token; its stdout.
pub fn run_in_sandbox(serve: &OkaServe, id: &str, token: &str, script: &str) -> String {
    use base64::Engine as _;
    use std::io::{Read as _, Write as _};
    let request = serde_json::json!({
        "process": {"cmd": "/bin/sh", "args": ["-c", script], "envs": {}},
        "stdin": false,
    })
    .to_string();
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(request.len()).unwrap().to_be_bytes());
    body.extend_from_slice(request.as_bytes());
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", serve.gateway)).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /process.Process/Start HTTP/1.1\r\nHost: 127.0.0.1\r\nE2b-Sandbox-Id: {id}\r\n\
         E2b-Sandbox-Port: 49983\r\nX-Access-Token: {token}\r\n\
         Content-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&body).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let split = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "{}\n{}",
        String::from_utf8_lossy(&response),
        serve.log()
    );
    let mut raw = &response[split + 4..];
    let mut payload = Vec::new();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        loop {
            let end = raw.windows(2).position(|w| w == b"\r\n").unwrap();
            let size = usize::from_str_radix(std::str::from_utf8(&raw[..end]).unwrap(), 16);
            let size = size.unwrap();
            if size == 0 {
                break;
            }
            payload.extend_from_slice(&raw[end + 2..end + 2 + size]);
            raw = &raw[end + 4 + size..];
        }
    } else {
        payload = raw.to_vec();
    }
    let mut stdout = Vec::new();
    let mut rest = payload.as_slice();
    while rest.len() >= 5 {
        let len = u32::from_be_bytes(rest[1..5].try_into().unwrap()) as usize;
        let message: serde_json::Value = serde_json::from_slice(&rest[5..5 + len]).unwrap();
        if let Some(data) = message["event"]["data"]["stdout"].as_str() {
            stdout.extend(base64::engine::general_purpose::STANDARD.decode(data).unwrap());
        }
        rest = &rest[5 + len..];
    }
    String::from_utf8(stdout).unwrap()
}
