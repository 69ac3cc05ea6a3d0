//! Gateway benchmark: the cost the gateway adds, measured against the same upstream reached
//! directly and through nginx in the same run, each proxy under the same conditions.
//!
//! # Setup
//!
//! Every party is its own process; this binary re-executes itself for the roles
//! (`OKA_BENCH_ROLE`):
//!
//! - **upstream**: the test suite's hyper HTTP/1.1 server ("inside the sandbox") on a
//!   single-threaded tokio runtime, shared by every case;
//! - **gateway**: the real gateway (embedded store, route table, dialer, pool) on a tokio
//!   runtime with `W` worker threads, logging as `oka serve` does (`fmt` + `EnvFilter` at
//!   `info`, to a sink; `OKA_BENCH_LOG` overrides the filter);
//! - **nginx** (`OKA_BENCH_NGINX`, else `nginx` on `PATH` or in `/usr/sbin`): a reverse proxy to
//!   the same upstream with `worker_processes W`, upstream keep-alive, buffering off;
//! - **load**: `wrk` (`OKA_BENCH_WRK`, else `wrk` on `PATH`), one thread.
//!
//! `W` is 1, then 2 (`OKA_BENCH_WORKERS=1,2` to choose; `OKA_BENCH_CURRENT=1` puts the gateway
//! on a current-thread runtime instead, for comparison). For each, in one run:
//!
//! - latency of a small `GET` on one keep-alive connection (p50, p99), from this process's
//!   hyper client (single-threaded), direct vs through each proxy, in slices that alternate
//!   the targets;
//! - throughput of small `GET`s from `wrk` over 16 keep-alive connections, in rounds that
//!   alternate the targets (median and range; `OKA_BENCH_ROUNDS`, default 3), with wrk's
//!   p50/p99 under that load and the CPU time the serving process(es) used per request, and the
//!   gateway's rate over nginx's within each round (median and range);
//! - throughput of a 64 MiB streamed response body (best of 3).
//!
//! Without nginx or wrk, their rows are skipped with the reason printed.
//!
//! Run with `cargo bench -p oka-gateway --bench gateway` (Debian: `apt-get install wrk
//! nginx-light`).
#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

const ID: &str = "benchsandbox";
const PORT: u16 = 49983;
const SMALL: &str = "/small";
const LATENCY_REQUESTS: usize = 20_000;
const LATENCY_SLICES: usize = 10;
const WARMUP: usize = 2_000;
const CONNECTIONS: usize = 16;
const ROUNDS: usize = 3;
const ROUND_SECONDS: u64 = 3;
const BIG: usize = 64 << 20;

const ROLE: &str = "OKA_BENCH_ROLE";
const UPSTREAM: &str = "OKA_BENCH_UPSTREAM";
const WORKERS: &str = "OKA_BENCH_WORKERS";

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("upstream") => serve_upstream(),
        Ok("gateway") => serve_gateway(),
        _ => bench(),
    }
}

// ---------------------------------------------------------------------------------------
// The child roles: print the listening address on stdout, serve until stdin closes.

async fn until_stdin_closes() {
    tokio::task::spawn_blocking(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
    })
    .await
    .unwrap();
}

fn announce(addr: SocketAddr) {
    use std::io::Write;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{addr}").unwrap();
    stdout.flush().unwrap();
}

fn serve_upstream() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let up = upstream().await;
        announce(up.addr);
        until_stdin_closes().await;
    });
}

fn serve_gateway() {
    let workers: usize = std::env::var(WORKERS).unwrap().parse().unwrap();
    let upstream_addr: SocketAddr = std::env::var(UPSTREAM).unwrap().parse().unwrap();
    let filter = std::env::var("OKA_BENCH_LOG").unwrap_or_else(|_| "info".to_owned());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(filter).unwrap())
        .with_writer(std::io::sink)
        .init();
    let runtime = if std::env::var_os("OKA_BENCH_CURRENT").is_some() {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap()
    };
    runtime.block_on(async {
        let (store, _dir) = store();
        create(&store, &running("bench", ID)).await;
        let dialer = MapDialer::default();
        dialer.map("bench", PORT, upstream_addr);
        let gw = gateway(&store, &dialer, config()).await;
        announce(gw.addr);
        until_stdin_closes().await;
        gw.stop().await;
    });
}

/// A child process of this binary in a role; it exits when dropped (its stdin closes).
struct Role {
    child: std::process::Child,
    addr: SocketAddr,
}

impl Role {
    fn spawn(role: &str, env: &[(&str, String)]) -> Role {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(ROLE, role)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.trim().parse().unwrap_or_else(|_| panic!("{role}: no address: {line:?}"));
        Role { child, addr }
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
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

// ---------------------------------------------------------------------------------------
// nginx.

/// nginx as a reverse proxy to `upstream` with a master and `workers` worker processes, on a
/// free loopback port; stopped on drop.
struct Nginx {
    child: std::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // The master stops its workers on TERM (a KILL would orphan them).
        let termed = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .is_ok_and(|s| s.success());
        if !termed {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// `$env` if set (and `None` when it names no file), else `name` on `PATH` or in `/usr/sbin`.
fn find_binary(env: &str, name: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .chain([PathBuf::from("/usr/sbin")])
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    })
}

async fn nginx(binary: &Path, upstream: SocketAddr, workers: usize) -> Nginx {
    let dir = tempfile::tempdir().unwrap();
    let addr = closed_port().await;
    let d = dir.path().display();
    let conf = format!(
        "worker_processes {workers};\nmaster_process on;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
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
    let child = Command::new(binary)
        .arg("-p")
        .arg(dir.path())
        .arg("-e")
        .arg(dir.path().join("error.log"))
        .arg("-c")
        .arg(&conf_path)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
    let nginx = Nginx { child, addr, _dir: dir };
    // The master listens before it forks the workers: wait for a real answer.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(stream) = TcpStream::connect(addr).await {
            let mut sender = handshake(stream).await;
            get(&mut sender, &upstream.to_string(), SMALL).await;
            break;
        }
        assert!(Instant::now() < deadline, "nginx did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let every worker start.
    tokio::time::sleep(Duration::from_millis(200)).await;
    nginx
}

// ---------------------------------------------------------------------------------------
// CPU time of the serving processes.

/// utime + stime of `pid` and of its child processes (nginx's workers).
fn cpu_time(pid: u32) -> Duration {
    fn stat(path: &Path) -> Option<(u32, u64)> {
        let text = std::fs::read_to_string(path).ok()?;
        // After "pid (comm)": state ppid ... utime(14) stime(15), counted from 1.
        let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
        let ppid = fields.get(1)?.parse().ok()?;
        let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        Some((ppid, ticks))
    }
    let mut ticks = stat(&PathBuf::from(format!("/proc/{pid}/stat"))).map_or(0, |(_, t)| t);
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            if entry.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
                && let Some((ppid, t)) = stat(&entry.path().join("stat"))
                && ppid == pid
            {
                ticks += t;
            }
        }
    }
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

// ---------------------------------------------------------------------------------------
// The in-process client: latency on one connection, and the streamed body.

async fn handshake(stream: TcpStream) -> SendRequest<Full<Bytes>> {
    stream.set_nodelay(true).unwrap();
    let (sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    sender
}

async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    handshake(TcpStream::connect(addr).await.unwrap()).await
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

/// Small-`GET` latency of each target on its own keep-alive connection, in slices that
/// alternate the targets so that the machine's load drifts through all of them alike.
async fn latencies(targets: &[Target]) -> Vec<hdrhistogram::Histogram<u64>> {
    let mut senders = Vec::new();
    for t in targets {
        let mut sender = connect(t.addr).await;
        for _ in 0..WARMUP {
            get(&mut sender, &t.host, SMALL).await;
        }
        senders.push(sender);
    }
    let mut histograms: Vec<_> =
        targets.iter().map(|_| hdrhistogram::Histogram::<u64>::new(3).unwrap()).collect();
    for _ in 0..LATENCY_SLICES {
        for ((t, sender), histogram) in targets.iter().zip(&mut senders).zip(&mut histograms) {
            for _ in 0..LATENCY_REQUESTS / LATENCY_SLICES {
                let start = Instant::now();
                get(sender, &t.host, SMALL).await;
                histogram.record(start.elapsed().as_nanos() as u64).unwrap();
            }
        }
    }
    histograms
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

// ---------------------------------------------------------------------------------------
// wrk.

/// Prints one parseable line at the end of a wrk run.
const WRK_SCRIPT: &str = r#"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("OKA %d %d %.1f %.1f %d\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout))
end
"#;

struct WrkRun {
    rate: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us_per_request: f64,
}

fn wrk(binary: &Path, script: &Path, addr: SocketAddr, host: &str, serving: &[u32]) -> WrkRun {
    let cpu = || serving.iter().map(|pid| cpu_time(*pid)).sum::<Duration>();
    let before = cpu();
    let output = Command::new(binary)
        .args(["-t1", &format!("-c{CONNECTIONS}"), &format!("-d{ROUND_SECONDS}s")])
        .arg("-s")
        .arg(script)
        .args(["-H", &format!("Host: {host}")])
        .arg(format!("http://{addr}{SMALL}"))
        .output()
        .unwrap();
    let used = cpu() - before;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("OKA "))
        .unwrap_or_else(|| panic!("wrk: {stdout}{}", String::from_utf8_lossy(&output.stderr)));
    let f: Vec<f64> = line.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let (requests, duration_us, p50_us, p99_us, errors) = (f[0], f[1], f[2], f[3], f[4]);
    assert_eq!(errors, 0.0, "wrk saw errors against {host}: {stdout}");
    WrkRun {
        rate: requests / (duration_us / 1e6),
        p50_us,
        p99_us,
        cpu_us_per_request: used.as_secs_f64() * 1e6 / requests,
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

// ---------------------------------------------------------------------------------------
// The run.

struct Target {
    name: &'static str,
    addr: SocketAddr,
    host: String,
    /// The processes that serve it (their CPU time is counted).
    serving: Vec<u32>,
}

fn us(nanos: u64) -> f64 {
    nanos as f64 / 1000.0
}

fn bench() {
    let workers: Vec<usize> = std::env::var(WORKERS)
        .unwrap_or_else(|_| "1,2".to_owned())
        .split(',')
        .map(|w| w.trim().parse().unwrap())
        .collect();
    let nginx_binary = find_binary("OKA_BENCH_NGINX", "nginx");
    let wrk_binary = find_binary("OKA_BENCH_WRK", "wrk");
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), WRK_SCRIPT).unwrap();

    let up = Role::spawn("upstream", &[]);
    let direct_host = up.addr.to_string();
    let gw_host = format!("{PORT}-{ID}.{DOMAIN}");
    println!(
        "upstream: hyper, own process, 1 thread; load: {}",
        wrk_binary
            .as_ref()
            .map_or("no wrk".into(), |p| format!("{} -t1 -c{CONNECTIONS}", p.display()))
    );

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for w in workers {
        let gw =
            Role::spawn("gateway", &[(UPSTREAM, up.addr.to_string()), (WORKERS, w.to_string())]);
        let nginx = nginx_binary.as_ref().map(|b| runtime.block_on(nginx(b, up.addr, w)));
        let runtime_kind = if std::env::var_os("OKA_BENCH_CURRENT").is_some() {
            "current-thread tokio".to_owned()
        } else {
            format!("tokio, {w} worker thread(s)")
        };
        println!(
            "\n== gateway: {runtime_kind}; nginx: worker_processes {w}{} ==",
            if nginx.is_none() { " (no nginx)" } else { "" }
        );
        let mut targets = vec![
            Target {
                name: "direct",
                addr: up.addr,
                host: direct_host.clone(),
                serving: vec![up.child.id()],
            },
            Target {
                name: "gateway",
                addr: gw.addr,
                host: gw_host.clone(),
                serving: vec![gw.child.id()],
            },
        ];
        if let Some(nginx) = &nginx {
            targets.push(Target {
                name: "nginx",
                addr: nginx.addr,
                host: direct_host.clone(),
                serving: vec![nginx.child.id()],
            });
        }

        println!(
            "small GET latency, one keep-alive connection each, {LATENCY_REQUESTS} requests \
             (in {LATENCY_SLICES} alternating slices):"
        );
        let histograms = runtime.block_on(latencies(&targets));
        let mut direct: Option<(f64, f64)> = None;
        for (t, h) in targets.iter().zip(&histograms) {
            let (p50, p99) = (us(h.value_at_quantile(0.5)), us(h.value_at_quantile(0.99)));
            let added = direct.map_or(String::new(), |(d50, d99)| {
                format!("   added p50 {:6.1} µs  p99 {:7.1} µs", p50 - d50, p99 - d99)
            });
            println!("  {:8} p50 {p50:7.1} µs   p99 {p99:7.1} µs{added}", t.name);
            direct.get_or_insert((p50, p99));
        }

        match &wrk_binary {
            None => {
                println!("small GET throughput: skipped (no wrk: install it or set OKA_BENCH_WRK)")
            }
            Some(wrk_binary) => {
                let rounds: usize = std::env::var("OKA_BENCH_ROUNDS")
                    .ok()
                    .and_then(|r| r.parse().ok())
                    .unwrap_or(ROUNDS);
                println!(
                    "small GET throughput, wrk -t1 -c{CONNECTIONS}, {rounds} rounds of {ROUND_SECONDS} s \
                     (median [min–max]), wrk's p50/p99, CPU of the serving process(es) per request:"
                );
                let mut runs: Vec<Vec<WrkRun>> = targets.iter().map(|_| Vec::new()).collect();
                for _ in 0..rounds {
                    for (t, runs) in targets.iter().zip(&mut runs) {
                        runs.push(wrk(wrk_binary, script.path(), t.addr, &t.host, &t.serving));
                    }
                }
                let mut rates = Vec::new();
                for (t, runs) in targets.iter().zip(&runs) {
                    let rate = median(runs.iter().map(|r| r.rate).collect());
                    let min = runs.iter().map(|r| r.rate).fold(f64::MAX, f64::min);
                    let max = runs.iter().map(|r| r.rate).fold(0.0, f64::max);
                    let p50 = median(runs.iter().map(|r| r.p50_us).collect());
                    let p99 = median(runs.iter().map(|r| r.p99_us).collect());
                    let cpu = median(runs.iter().map(|r| r.cpu_us_per_request).collect());
                    let share = rates.first().map_or(String::new(), |d: &f64| {
                        format!(" {:3.0}% of direct", 100.0 * rate / d)
                    });
                    println!(
                        "  {:8} {rate:7.0} req/s [{min:.0}–{max:.0}]{share}   p50 {p50:6.1} µs  \
                         p99 {p99:7.1} µs   CPU {cpu:5.1} µs/req",
                        t.name
                    );
                    rates.push(rate);
                }
                if let [_, gw, nginx] = &runs[..] {
                    // Each round runs the gateway and nginx back to back: the ratio within a
                    // round is the steadier figure on a noisy machine.
                    let paired: Vec<f64> =
                        gw.iter().zip(nginx).map(|(g, n)| 100.0 * g.rate / n.rate).collect();
                    let min = paired.iter().copied().fold(f64::MAX, f64::min);
                    let max = paired.iter().copied().fold(0.0, f64::max);
                    println!(
                        "  gateway / nginx: {:.0}% of the medians; per round {:.0}% [{min:.0}–{max:.0}]",
                        100.0 * rates[1] / rates[2],
                        median(paired),
                    );
                }
            }
        }

        println!("64 MiB streamed body (best of 3):");
        let mut base = None;
        for t in &targets {
            let rate = runtime.block_on(stream_rate(t.addr, &t.host));
            let share = base
                .map_or(String::new(), |b: f64| format!(" ({:.0}% of direct)", 100.0 * rate / b));
            base.get_or_insert(rate);
            println!("  {:8} {rate:6.0} MiB/s{share}", t.name);
        }
        drop(nginx);
        drop(gw);
    }
    if nginx_binary.is_none() {
        println!("\n(no nginx: its rows were skipped; install it or set OKA_BENCH_NGINX)");
    }
}
