//! A real `redis-server` for the quota tests and benches: started on a free loopback port in a
//! temp dir (no persistence, so a restart after `kill -9` comes back empty, as a lost Redis
//! does), killed with SIGKILL on demand and on drop.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server`.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
}

/// Whether `redis-server` is installed (scripts/test.sh installs it).
pub fn available() -> bool {
    Command::new("redis-server").arg("--version").output().is_ok_and(|o| o.status.success())
}

impl RedisServer {
    /// Starts one on a free port; `None` when `redis-server` is not installed.
    pub fn start() -> Option<Self> {
        if !available() {
            eprintln!("skipped: redis-server is not installed (scripts/test.sh installs it)");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut server = Self { child: None, port, dir: tempfile::tempdir().unwrap() };
        server.restart();
        Some(server)
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts it again on the same port (after [`RedisServer::kill_9`]); waits until it listens.
    pub fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL, and waits until it is gone.
    pub fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A connection for checks.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        let client = redis::Client::open(format!("redis://{}", self.addr())).unwrap();
        client.get_multiplexed_async_connection().await.unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill_9();
    }
}
