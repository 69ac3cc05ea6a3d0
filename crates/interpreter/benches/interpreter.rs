//! Benchmarks of `oka-interpreter` (not timed tests; figures go to `docs/benchmarks.md`):
//!
//! - python kernel start time (process start to `kernel_info_reply` + first iopub message);
//! - the round trip of `run_code("1+1")`: `POST /execute` to the binary over one keep-alive
//!   HTTP/1.1 connection, until `end_of_execution`, against `Kernel::execute("1+1")` with our own
//!   kernel client on a kernel of the same kernelspec (the difference is the server's overhead);
//! - the server's idle resident memory (without its kernel).
//!
//! `cargo bench -p oka-interpreter` (`OKA_BENCH_RUNS` round trips, default 300). Needs ipykernel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::BodyExt;
use oka_interpreter::kernel::{self, Kernel, Launch};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn report(name: &str, h: &Histogram<u64>) {
    println!(
        "{name:<44} p50 {:>8.3} ms  p99 {:>8.3} ms  (n={})",
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.len()
    );
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

async fn spec() -> Option<kernel::KernelSpec> {
    let specs = kernel::discover(&kernel::search_path(&[]));
    match kernel::find_spec(&specs, "python") {
        Some(s) => Some(s.clone()),
        None => kernel::python_fallback().await,
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(bench());
}

async fn bench() {
    let runs: usize =
        std::env::var("OKA_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    let Some(spec) = spec().await else {
        println!("SKIPPED: ipykernel is not installed");
        return;
    };
    let launch = Launch {
        uid_gid: None,
        home: None,
        user: None,
        cwd: std::env::temp_dir(),
        start_timeout: Duration::from_secs(60),
        env: Default::default(),
    };

    let mut start = Histogram::<u64>::new(3).unwrap();
    for _ in 0..5 {
        let t = Instant::now();
        let k = Kernel::start(&spec, &launch).await.unwrap();
        start.record(t.elapsed().as_micros() as u64).unwrap();
        k.shutdown().await;
    }
    report("kernel start (python3, ipykernel)", &start);

    // The server, its default python kernel started eagerly.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut server = Command::new(env!("CARGO_BIN_EXE_oka-interpreter"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--envd-url", "http://127.0.0.1:9"])
        .env("RUST_LOG", "warn")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = server.id();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let stream = loop {
        if let Ok(s) = tokio::net::TcpStream::connect(addr).await {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let body = Bytes::from_static(br#"{"code":"1+1"}"#);
    let mut execute = async || {
        let req = http::Request::post("/execute")
            .header("host", "bench")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(body.clone()))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        let b = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(b.ends_with(b"{\"type\":\"end_of_execution\"}\n"));
    };
    // Warm up (waits for the eager kernel).
    for _ in 0..10 {
        execute().await;
    }
    let mut k = Kernel::start(&spec, &launch).await.unwrap();
    for _ in 0..10 {
        k.execute("1+1", false, None).await.unwrap();
    }
    let mut via_server = Histogram::<u64>::new(3).unwrap();
    let mut direct = Histogram::<u64>::new(3).unwrap();
    for _ in 0..runs {
        let t = Instant::now();
        execute().await;
        via_server.record(t.elapsed().as_micros() as u64).unwrap();
        let t = Instant::now();
        k.execute("1+1", false, None).await.unwrap();
        direct.record(t.elapsed().as_micros() as u64).unwrap();
    }
    report("run_code(\"1+1\") via oka-interpreter (HTTP)", &via_server);
    report("Kernel::execute(\"1+1\") direct (ZMQ)", &direct);
    println!(
        "server overhead                              p50 {:>8.3} ms",
        (via_server.value_at_quantile(0.5) as f64 - direct.value_at_quantile(0.5) as f64) / 1000.0
    );
    println!("oka-interpreter RSS (server alone)           {} KiB", rss_kib(pid));
    k.shutdown().await;
    let _ = Command::new("kill").arg(pid.to_string()).status();
    let _ = server.wait();
}
