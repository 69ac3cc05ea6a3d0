//! Shared harness: the real `oka-interpreter` binary on a free port, a stand-in envd serving
//! `/envs`, and a small HTTP/1.1 client.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use bytes::Bytes;
use http_body_util::BodyExt;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Whether a python Jupyter kernel can run here; prints why not.
pub fn have_ipykernel() -> bool {
    let ok = ["python3", "/usr/bin/python3"].iter().any(|py| {
        Command::new(py)
            .args(["-c", "import ipykernel"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !ok {
        println!(
            "SKIPPED: ipykernel is not installed (apt-get install -y --no-install-recommends python3-ipykernel)"
        );
    }
    ok
}

/// Whether the kernels of `scripts/install-kernels.sh` are installed (python with matplotlib,
/// pandas and e2b-charts; JavaScript, TypeScript, R, bash, Java). As root, which is how
/// `scripts/test.sh` runs after installing them, their absence is a failure; else it prints why
/// the checks that need them are skipped.
pub fn have_all_kernels() -> bool {
    let dir = Path::new("/usr/local/share/jupyter/kernels");
    let missing: Vec<&str> = ["python3", "javascript", "typescript", "r", "bash", "java"]
        .into_iter()
        .filter(|k| !dir.join(k).join("kernel.json").is_file())
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        !rustix::process::geteuid().is_root(),
        "kernels {missing:?} are missing in {}: run scripts/install-kernels.sh",
        dir.display()
    );
    println!("SKIPPED (kernels {missing:?} missing): run scripts/install-kernels.sh as root");
    false
}

/// The current user's name (from /etc/passwd), for `--kernel-user`.
pub fn me() -> String {
    let uid = rustix::process::geteuid().as_raw().to_string();
    std::fs::read_to_string("/etc/passwd")
        .unwrap()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 2 && f[2] == uid).then(|| f[0].to_string())
        })
        .unwrap()
}

/// A running `oka-interpreter`; killed on drop.
pub struct Server {
    pub addr: SocketAddr,
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM, so it kills its kernels; then make sure.
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Server {
    /// Starts the binary against `envd` with extra environment.
    pub async fn start(envd: &str, env: &[(&str, &Path)]) -> Server {
        Self::start_as(envd, env, &me()).await
    }

    /// Starts the binary with kernels running as `user`.
    pub async fn start_as(envd: &str, env: &[(&str, &Path)], user: &str) -> Server {
        let port = free_port();
        let cwd = std::env::temp_dir();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_oka-interpreter"));
        cmd.args(["--listen", &format!("127.0.0.1:{port}"), "--envd-url", envd])
            .args(["--kernel-user", user])
            .arg("--cwd")
            .arg(&cwd)
            .env("RUST_LOG", "oka_interpreter=debug")
            .stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let s = Server { addr: ([127, 0, 0, 1], port).into(), child };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = s.get("/health").await
                && r.0 == 200
            {
                return s;
            }
            assert!(Instant::now() < deadline, "oka-interpreter did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// GET.
    pub async fn get(&self, path: &str) -> Result<(u16, String), String> {
        request(self.addr, "GET", path, &[], "").await
    }

    /// POST JSON.
    pub async fn post(&self, path: &str, body: &str) -> (u16, String) {
        request(self.addr, "POST", path, &[], body).await.unwrap()
    }

    /// POST /execute; returns the status and the parsed NDJSON lines (asserting the framing).
    pub async fn execute(&self, body: serde_json::Value) -> (u16, Vec<serde_json::Value>) {
        self.execute_with(body, &[]).await
    }

    /// POST /execute with headers.
    pub async fn execute_with(
        &self,
        body: serde_json::Value,
        headers: &[(&str, &str)],
    ) -> (u16, Vec<serde_json::Value>) {
        let (status, text) =
            request(self.addr, "POST", "/execute", headers, &body.to_string()).await.unwrap();
        if status != 200 {
            return (status, vec![serde_json::from_str(&text).unwrap()]);
        }
        assert!(text.ends_with('\n'), "NDJSON must end with a newline: {text:?}");
        let lines = text
            .split_terminator('\n')
            .map(|l| {
                assert!(!l.trim().is_empty(), "blank NDJSON line in {text:?}");
                serde_json::from_str(l).unwrap()
            })
            .collect();
        (status, lines)
    }
}

/// One HTTP/1.1 request on a fresh connection; returns the status and the whole body.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<(u16, String), String> {
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(http_body_util::Full::new(Bytes::from(body.to_owned()))).unwrap();
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A stand-in for envd's `GET /envs`: answers the current map when the token matches.
#[derive(Clone)]
pub struct FakeEnvd {
    pub url: String,
    pub envs: Arc<Mutex<BTreeMap<String, String>>>,
    pub token: Arc<Mutex<Option<String>>>,
}

impl FakeEnvd {
    pub async fn start() -> FakeEnvd {
        let envs: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
        let token: Arc<Mutex<Option<String>>> = Arc::default();
        let (e, t) = (envs.clone(), token.clone());
        let app = axum::Router::new().route(
            "/envs",
            axum::routing::get(move |h: http::HeaderMap| {
                let (e, t) = (e.clone(), t.clone());
                async move {
                    let want = t.lock().unwrap().clone();
                    let got = h.get("x-access-token").and_then(|v| v.to_str().ok());
                    if want.is_some() && want.as_deref() != got {
                        return (http::StatusCode::UNAUTHORIZED, "{}".to_string());
                    }
                    let body = serde_json::to_string(&*e.lock().unwrap()).unwrap();
                    (http::StatusCode::OK, body)
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await });
        FakeEnvd { url, envs, token }
    }
}

/// Lines of a given type.
pub fn of_type<'a>(lines: &'a [serde_json::Value], t: &str) -> Vec<&'a serde_json::Value> {
    lines.iter().filter(|l| l["type"] == t).collect()
}

/// The texts of the lines of a given type (`stdout`, `stderr`), joined: a stream's chunking is
/// the kernel's, not part of the API.
pub fn joined(lines: &[serde_json::Value], t: &str) -> String {
    of_type(lines, t).iter().filter_map(|l| l["text"].as_str()).collect()
}

/// The main result's text, if any.
pub fn main_text(lines: &[serde_json::Value]) -> Option<String> {
    lines
        .iter()
        .find(|l| l["type"] == "result" && l["is_main_result"] == true)
        .and_then(|l| l["text"].as_str().map(String::from))
}
