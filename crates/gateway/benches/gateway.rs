//! Gateway benchmark: the cost the gateway adds, measured against the same upstream reached
//! directly in the same run.
//!
//! - latency of a small `GET` on one keep-alive connection (p50, p99), direct vs through;
//! - throughput of small `GET`s over 16 keep-alive connections, direct vs through;
//! - throughput of a 64 MiB streamed response body, direct vs through.
//!
//! With an nginx binary (environment `OKA_BENCH_NGINX`, else `nginx` on `PATH`), the same
//! loads also go through nginx (one process, upstream keep-alive, buffering off) as a reverse
//! proxy to the same upstream.
//!
//! Run with `cargo bench -p oka-gateway --bench gateway`.
#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

const ID: &str = "benchsandbox";
const LATENCY_REQUESTS: usize = 20_000;
const WARMUP: usize = 2_000;
const CONNECTIONS: usize = 16;
const REQUESTS_PER_CONNECTION: usize = 4_000;
const BIG: usize = 64 << 20;

async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    sender
}

async fn get(sender: &mut SendRequest<Full<Bytes>>, host: &str, path: &str) -> usize {
    sender.ready().await.unwrap();
    let request =
        http::Request::get(path).header("host", host).body(Full::new(Bytes::new())).unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut n = 0;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            n += data.len();
        }
    }
    n
}

async fn latency(addr: SocketAddr, host: &str) -> hdrhistogram::Histogram<u64> {
    let mut sender = connect(addr).await;
    for _ in 0..WARMUP {
        get(&mut sender, host, "/").await;
    }
    let mut histogram = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    for _ in 0..LATENCY_REQUESTS {
        let start = Instant::now();
        get(&mut sender, host, "/").await;
        histogram.record(start.elapsed().as_nanos() as u64).unwrap();
    }
    histogram
}

async fn throughput(addr: SocketAddr, host: &str) -> f64 {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let host = host.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            for _ in 0..REQUESTS_PER_CONNECTION {
                get(&mut sender, &host, "/").await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    (CONNECTIONS * REQUESTS_PER_CONNECTION) as f64 / start.elapsed().as_secs_f64()
}

async fn stream_rate(addr: SocketAddr, host: &str) -> f64 {
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let mut sender = connect(addr).await;
        let start = Instant::now();
        let n = get(&mut sender, host, &format!("/big?n={BIG}")).await;
        assert_eq!(n, BIG);
        best = best.min(start.elapsed());
    }
    BIG as f64 / (1 << 20) as f64 / best.as_secs_f64()
}

/// nginx as a reverse proxy to `upstream`, on a free loopback port; killed on drop.
struct Nginx {
    child: std::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nginx_binary() -> Option<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("OKA_BENCH_NGINX") {
        return Some(path.into());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .chain([std::path::PathBuf::from("/usr/sbin")])
            .map(|dir| dir.join("nginx"))
            .find(|path| path.is_file())
    })
}

async fn nginx(upstream: SocketAddr) -> Option<Nginx> {
    let binary = nginx_binary()?;
    let dir = tempfile::tempdir().unwrap();
    let addr = closed_port().await;
    let d = dir.path().display();
    let conf = format!(
        "worker_processes 1;\nmaster_process off;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 10000000;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         upstream sandbox {{ server {upstream}; keepalive 64; keepalive_requests 10000000; }}\n\
         server {{\n    listen {addr};\n    location / {{\n      proxy_pass http://sandbox;\n\
         proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n\
         proxy_set_header Host $host;\n      proxy_buffering off;\n\
         proxy_request_buffering off;\n    }}\n  }}\n}}\n"
    );
    let conf_path = dir.path().join("nginx.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let child = std::process::Command::new(&binary)
        .arg("-p")
        .arg(dir.path())
        .arg("-e")
        .arg(dir.path().join("error.log"))
        .arg("-c")
        .arg(&conf_path)
        .spawn()
        .ok()?;
    let nginx = Nginx { child, addr, _dir: dir };
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "nginx did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Some(nginx)
}

fn us(nanos: u64) -> f64 {
    nanos as f64 / 1000.0
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let (store, _dir) = store();
        create(&store, &running("bench", ID)).await;
        let up = upstream().await;
        let dialer = MapDialer::default();
        dialer.map("bench", 49983, up.addr);
        let gw = gateway(&store, &dialer, config()).await;
        let direct_host = up.addr.to_string();
        let gw_host = format!("49983-{ID}.{DOMAIN}");

        let nginx = nginx(up.addr).await;
        let mut targets =
            vec![("direct", up.addr, direct_host.clone()), ("gateway", gw.addr, gw_host)];
        if let Some(nginx) = &nginx {
            targets.push(("nginx", nginx.addr, direct_host.clone()));
        }

        println!("small GET latency, one keep-alive connection, {LATENCY_REQUESTS} requests:");
        let mut p50s = Vec::new();
        for (name, addr, host) in &targets {
            let h = latency(*addr, host).await;
            let (p50, p99) = (us(h.value_at_quantile(0.5)), us(h.value_at_quantile(0.99)));
            let added = p50s.first().map_or(String::new(), |direct: &(f64, f64)| {
                format!("   added p50 {:6.1} µs  p99 {:7.1} µs", p50 - direct.0, p99 - direct.1)
            });
            println!("  {name:8} p50 {p50:7.1} µs   p99 {p99:7.1} µs{added}");
            p50s.push((p50, p99));
        }

        println!("small GET throughput, {CONNECTIONS} keep-alive connections:");
        let mut base = None;
        for (name, addr, host) in &targets {
            let rate = throughput(*addr, host).await;
            let share = base
                .map_or(String::new(), |b: f64| format!(" ({:.0}% of direct)", 100.0 * rate / b));
            base.get_or_insert(rate);
            println!("  {name:8} {rate:8.0} req/s{share}");
        }

        println!("64 MiB streamed body (best of 3):");
        let mut base = None;
        for (name, addr, host) in &targets {
            let rate = stream_rate(*addr, host).await;
            let share = base
                .map_or(String::new(), |b: f64| format!(" ({:.0}% of direct)", 100.0 * rate / b));
            base.get_or_insert(rate);
            println!("  {name:8} {rate:6.0} MiB/s{share}");
        }
        if nginx.is_none() {
            println!("(no nginx found: set OKA_BENCH_NGINX to compare with it)");
        }
        gw.stop().await;
    });
}
