//! oka's cluster components as processes on this machine, for the tests and benchmarks that
//! run them against a real API server (`tests/cluster.rs`, `benches/cluster.rs`): each
//! component with a config file of its own, killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The namespace of the SandboxNodes and the Lease.
pub const NAMESPACE: &str = "sandbox-system";
/// The managers' admin key.
pub const ADMIN_KEY: &str = "e2b_0123456789abcdef0123456789abcdef01234567";

/// One component process; killed on drop.
pub struct Component {
    /// Its name (and its log's).
    pub name: String,
    args: Vec<String>,
    child: Option<Child>,
    log: PathBuf,
    /// Its `api.listen` port (metrics and health; the manager's E2B API).
    pub port: u16,
}

impl Component {
    pub fn start(name: &str, args: &[String], dir: &Path, port: u16) -> Self {
        let mut component = Component {
            name: name.to_owned(),
            args: args.to_vec(),
            child: None,
            log: dir.join(format!("{name}.log")),
            port,
        };
        component.spawn();
        component
    }

    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_oka"))
            .args(&self.args)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// Its process ID while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET <path>` on its port: status and body.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.port, path)
    }

    pub fn wait_ready(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while self.get("/readyz").map(|r| r.0) != Some(200) {
            assert!(Instant::now() < deadline, "{} not ready:\n{}", self.name, self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `leader_election_master_status` as it reports it.
    pub fn leading(&self) -> bool {
        self.get("/metrics").is_some_and(|(_, body)| {
            body.lines().any(|l| {
                l.starts_with("leader_election_master_status{") && l.trim_end().ends_with(" 1")
            })
        })
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A plain HTTP/1.0 GET on loopback.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Some((status, body))
}

/// The config file of one component: `pool` replicas in the default pool, `api` and `gateway`
/// its listeners, `node` the node agent's name and relay port.
pub fn config(
    dir: &Path,
    kubeconfig: &Path,
    pool: usize,
    api: u16,
    gateway: u16,
    node: Option<(&str, u16)>,
) -> PathBuf {
    let mut text = format!(
        "api:\n  listen: 127.0.0.1:{api}\n  adminKey: {ADMIN_KEY}\n\
         gateway:\n  listen: 127.0.0.1:{gateway}\n\
         defaultPool:\n  replicas: {pool}\n\
         cluster:\n  kubeconfig: {kubeconfig}\n  namespace: {NAMESPACE}\n  relayTokenFile: {token}\n  \
         nodeLostAfter: 15s\n  defaultRuntime: node\n  \
         leaderElection:\n    leaseDuration: 10s\n    renewDeadline: 7s\n    retryPeriod: 1s\n  \
         webhook:\n    enabled: false\n",
        kubeconfig = kubeconfig.display(),
        token = dir.join("relay-token").display(),
    );
    // The webhooks need Secrets, which the CRD-only API server does not serve
    // (`crates/webhook/tests/webhooks.rs` tests them against it with the Secret elsewhere).
    // Room for the pool and what is claimed from it, on one node alone.
    let capacity = pool * 4 + 16;
    let name = match node {
        Some((name, relay)) => {
            text.push_str(&format!(
                "  node:\n    name: {name}\n    relayListen: 127.0.0.1:{relay}\n    relayAddress: 127.0.0.1:{relay}\n    \
                 labels:\n      oka.test/node: {name}\n    capacity:\n      sandboxes: \"{capacity}\"\n"
            ));
            name.to_owned()
        }
        None => format!("c{api}"),
    };
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The last lines of every component's log in `dir`.
pub fn logs_of(dir: &Path) -> String {
    let mut text = String::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries.into_iter().filter(|p| p.extension().is_some_and(|e| e == "log")) {
        let log = std::fs::read_to_string(&path).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        text.push_str(&format!("--- {} ---\n{}\n", path.display(), tail.join("\n")));
    }
    text
}
