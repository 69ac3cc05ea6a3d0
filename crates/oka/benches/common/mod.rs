//! What the `oka` benches share: `oka serve` on a temporary state directory, a raw HTTP/1.1
//! keep-alive client (a `TcpStream`, so the client adds next to nothing), Connect envelopes and
//! the percentiles the tables print.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

#[path = "../../tests/support/mod.rs"]
pub mod support;

/// The `oka` binary cargo built beside the benches.
pub const OKA: &str = env!("CARGO_BIN_EXE_oka");

/// The `oka` binary to run: `OKA_BENCH_OKA` when set (to compare two builds in one session),
/// otherwise the one cargo built beside this bench.
pub fn oka() -> String {
    std::env::var("OKA_BENCH_OKA").unwrap_or_else(|_| OKA.to_owned())
}

/// envd's port inside every sandbox.
pub const ENVD_PORT: &str = "49983";
/// The create body: the default pool, and a 503 instead of a new sandbox when it is empty.
pub const CREATE_BODY: &str =
    r#"{"templateID":"base","metadata":{"e2b.agents.kruise.io/create-on-no-stock":"false"}}"#;

/// A create body as [`CREATE_BODY`] with an egress policy (E2B's `network.denyOut`).
pub const CREATE_BODY_WITH_POLICY: &str = r#"{"templateID":"base","metadata":{"e2b.agents.kruise.io/create-on-no-stock":"false"},"network":{"denyOut":["198.51.100.0/24"]}}"#;

/// An environment variable as a number, else `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

pub fn row(name: &str, samples: &[Duration]) {
    println!(
        "| {name} | {} | {} | {} | {} |",
        samples.len(),
        fmt(percentile(samples, 50.0)),
        fmt(percentile(samples, 99.0)),
        fmt(samples.iter().max().copied().unwrap_or_default())
    );
}

pub fn fmt(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

pub fn percentile(samples: &[Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The Connect envelope of one message: flags 0, big-endian length, payload.
pub fn envelope(payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A created sandbox.
pub struct Created {
    pub id: String,
    pub token: String,
    pub server_timing: String,
}

/// `oka serve` ([`support::OkaServe`]) with a default pool of `replicas` and warnings-only logs,
/// and the bench's own calls.
pub struct Serve {
    inner: support::OkaServe,
    /// The admin key.
    pub key: String,
}

impl std::ops::Deref for Serve {
    type Target = support::OkaServe;
    fn deref(&self) -> &support::OkaServe {
        &self.inner
    }
}

impl Serve {
    pub fn start(replicas: usize, envd: &Path) -> Self {
        Self::start_with(replicas, envd, "")
    }

    /// [`Serve::start`] with `extra` YAML appended to the configuration.
    pub fn start_with(replicas: usize, envd: &Path, extra: &str) -> Self {
        let config = format!(
            "defaultPool:\n  replicas: {replicas}\ncodeInterpreterPool:\n  enabled: false\n\
             log:\n  filter: warn\n{extra}"
        );
        let inner = support::OkaServe::start(&oka(), &config, &[("OKA_ENVD", envd.as_os_str())]);
        let key = inner.key();
        Self { inner, key }
    }

    /// Waits until the runtime holds exactly `pool` sandboxes (the pool refilled, the killed
    /// ones gone) and one probe create finds stock; returns how long that took.
    pub fn wait_stocked(&self, pool: usize, limit: Duration) -> Duration {
        let started = Instant::now();
        let deadline = started + limit;
        while self.runtime_sandboxes() != pool {
            assert!(Instant::now() < deadline, "the pool did not fill:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        // The last sandboxes may still be starting: one probe create (killed at once) must find
        // stock, then the pool must be whole again.
        let mut api = self.api_client();
        loop {
            assert!(Instant::now() < deadline, "the pool never had stock:\n{}", self.log());
            if let Some(created) = self.create(&mut api) {
                self.kill(&mut api, &created.id);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        while self.runtime_sandboxes() != pool {
            assert!(Instant::now() < deadline, "the pool did not refill:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        started.elapsed()
    }

    pub fn api_client(&self) -> Client {
        Client::connect(self.api)
    }

    /// One create; `None` when the pool was empty (503).
    pub fn create(&self, api: &mut Client) -> Option<Created> {
        self.create_with(api, CREATE_BODY)
    }

    /// A create with `body`; `None` when the pool is empty (503).
    pub fn create_with(&self, api: &mut Client, body: &str) -> Option<Created> {
        let response = api.request(
            "POST",
            "/v2/sandboxes",
            &[("X-API-Key", &self.key), ("Content-Type", "application/json")],
            body.as_bytes(),
        );
        if response.status == 503 {
            return None;
        }
        assert_eq!(
            response.status,
            201,
            "create: {}\n{}",
            String::from_utf8_lossy(&response.body),
            self.log()
        );
        let body: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
        Some(Created {
            id: body["sandboxID"].as_str().unwrap().to_owned(),
            token: body["envdAccessToken"].as_str().unwrap_or_default().to_owned(),
            server_timing: response.header("server-timing").unwrap_or_default().to_owned(),
        })
    }

    pub fn kill(&self, api: &mut Client, id: &str) {
        let response =
            api.request("DELETE", &format!("/sandboxes/{id}"), &[("X-API-Key", &self.key)], b"");
        assert_eq!(response.status, 204, "kill {id}: {}", String::from_utf8_lossy(&response.body));
    }
}

/// One HTTP/1.1 keep-alive connection.
pub struct Client {
    port: u16,
    reader: BufReader<TcpStream>,
}

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

impl Client {
    pub fn connect(port: u16) -> Self {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_nodelay(true).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        Self { port, reader: BufReader::new(stream) }
    }

    pub fn send(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\n",
            self.port,
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body);
        self.reader.get_mut().write_all(&bytes).unwrap();
    }

    /// The status line and headers.
    pub fn read_head(&mut self) -> (u16, Vec<(String, String)>) {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            panic!("bad status line {line:?}");
        });
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            let trimmed = line.trim_end();
            if trimmed.is_empty() {
                break;
            }
            if let Some((name, value)) = trimmed.split_once(':') {
                headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
            }
        }
        (status, headers)
    }

    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        self.send(method, path, headers, body);
        let (status, headers) = self.read_head();
        let mut response = Response { status, headers, body: Vec::new() };
        if let Some(length) = response.header("content-length") {
            let mut body = vec![0u8; length.parse().unwrap()];
            self.reader.read_exact(&mut body).unwrap();
            response.body = body;
        } else if response.header("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
            while let Some(chunk) = self.read_chunk() {
                response.body.extend_from_slice(&chunk);
            }
        }
        response
    }

    /// One chunk of a chunked body; `None` after the last.
    pub fn read_chunk(&mut self) -> Option<Vec<u8>> {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or("0"), 16).unwrap();
        let mut chunk = vec![0u8; size];
        self.reader.read_exact(&mut chunk).unwrap();
        line.clear();
        self.reader.read_line(&mut line).unwrap();
        (size > 0).then_some(chunk)
    }

    /// A Connect server-streaming call: the first `stdout` data (base64) and when it arrived;
    /// the rest of the stream is drained so the connection can be reused.
    pub fn stream_until_stdout(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (String, Instant) {
        self.send(method, path, headers, body);
        let (status, response_headers) = self.read_head();
        let chunked =
            response_headers.iter().any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
        if !(status == 200 && chunked) {
            let length = response_headers
                .iter()
                .find(|(n, _)| n == "content-length")
                .map_or(0, |(_, v)| v.parse().unwrap_or(0));
            let mut body = vec![0u8; length];
            let _ = self.reader.read_exact(&mut body);
            panic!(
                "Process/Start answered {status} {response_headers:?}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        let mut buffer = Vec::new();
        let mut first = None;
        while let Some(chunk) = self.read_chunk() {
            buffer.extend_from_slice(&chunk);
            while first.is_none() && buffer.len() >= 5 {
                let len = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
                if buffer.len() < 5 + len {
                    break;
                }
                let message: serde_json::Value =
                    serde_json::from_slice(&buffer[5..5 + len]).unwrap_or_default();
                buffer.drain(..5 + len);
                if let Some(stdout) = message["event"]["data"]["stdout"].as_str() {
                    first = Some((stdout.to_owned(), Instant::now()));
                }
            }
        }
        first.expect("the stream ended without stdout")
    }
}
