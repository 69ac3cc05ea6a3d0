//! `oka serve`, end to end: a real `oka serve` on a temporary state directory with a stocked
//! warm pool of real sandboxes, driven over loopback by plain HTTP/1.1 keep-alive clients
//! (a raw `TcpStream`, so the client adds next to nothing).
//!
//! 1. Create latency at the client over `OKA_BENCH_CREATES` (default 1,000) sequential creates,
//!    each killed right after, paced so the pool's refill keeps up; the server's own share from
//!    the create's `Server-Timing` header (claim, envd `/init`, the wait for the gateway's route,
//!    handler total). Every other create asks for an egress policy (`network.denyOut`, the
//!    pool being outbound when nftables is here), so the two are compared in the same run.
//! 2. Create to the first command's output: create, then `process.Process/Start` of `echo hi`
//!    through the gateway until the first stdout event, `OKA_BENCH_FIRST` (default 200) times.
//! 3. Claims per second with 32 concurrent clients: creates only from the stocked pool, killed
//!    afterwards; with the CPU the burst cost per claim and the server's share of its creates.
//!    `OKA_BENCH_BURSTS` (default 3) bursts, each from a restocked pool, and their median: one
//!    burst on this noisy machine says little.
//!
//! Knobs (environment): `OKA_BENCH_CREATES`, `OKA_BENCH_FIRST`, `OKA_BENCH_BURSTS`,
//! `OKA_BENCH_POOL` (1,024, so that the burst of step 3 is over 1,020 creates; ~5 GB of memory),
//! `OKA_BENCH_CLIENTS` (32), `OKA_BENCH_RATE` (sequential creates per second; default 80% of the
//! refill rate measured while the pool first filled), `OKA_BENCH_PERF_CTL` (a `perf record
//! --control fifo:` path: the bench writes `enable` there as each burst starts and `disable` as it
//! ends, so a profile started with `-D -1` holds the bursts only), `OKA_BENCH_PERF_BURSTS` (which
//! bursts, counted from 1 and comma-separated, the profile holds; all when unset),
//! `OKA_BENCH_SETTLE` (seconds to wait after the pool is restocked before each burst; 0),
//! `OKA_BENCH_OKA` (the `oka` binary to run, `oka-envd` beside it; to compare two builds).
//!
//! Creates ask for `create-on-no-stock: false`, so an empty pool answers 503 at once instead of
//! starting a new sandbox; the bench counts those answers and retries.
//! Run with `cargo bench -p oka --bench serve` as root (real sandboxes); otherwise it prints
//! SKIPPED. `oka-envd` must be built beside `oka` (`cargo build --release -p oka-envd`).

#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::print_stderr)]

mod common;

use common::{Client, ENVD_PORT, Serve, env_usize, envelope, fmt, oka, percentile, row};

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs us without it: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED serve bench: real sandboxes need root");
        return;
    }
    let envd = Path::new(&oka()).with_file_name("oka-envd");
    if !envd.exists() {
        eprintln!(
            "{} is missing: build it first with `cargo build --release -p oka-envd`",
            envd.display()
        );
        std::process::exit(1);
    }
    let creates = env_usize("OKA_BENCH_CREATES", 1000);
    let first = env_usize("OKA_BENCH_FIRST", 200);
    let pool = env_usize("OKA_BENCH_POOL", 1024);
    let clients = env_usize("OKA_BENCH_CLIENTS", 32);

    let serve = Serve::start(pool, &envd);
    let cpu_before = machine_cpu();
    let fill = serve.wait_stocked(pool, Duration::from_secs(300));
    let fill_rate = pool as f64 / fill.as_secs_f64();
    println!(
        "pool of {pool} filled in {:.1} s ({fill_rate:.0} sandboxes/s, {:.1} ms of CPU per sandbox)",
        fill.as_secs_f64(),
        machine_cpu().saturating_sub(cpu_before).as_secs_f64() * 1e3 / pool as f64
    );
    println!("`oka serve` holds {:.0} MB resident", process_rss(serve.child.id()) as f64 / 1e6);

    let latency = bench_create_latency(&serve, creates, fill_rate);
    serve.wait_stocked(pool, Duration::from_secs(300));
    let first_output = bench_first_output(&serve, first, fill_rate);
    let mut bursts = Vec::new();
    let settle = Duration::from_secs(env_usize("OKA_BENCH_SETTLE", 0) as u64);
    for n in 1..=env_usize("OKA_BENCH_BURSTS", 3).max(1) {
        serve.wait_stocked(pool, Duration::from_secs(300));
        std::thread::sleep(settle);
        let profiled = perf_burst(n);
        bursts.push(bench_concurrent_claims(
            &serve,
            clients,
            pool.saturating_sub(4).max(1),
            profiled,
        ));
    }

    println!();
    println!("oka serve, end to end (pool {pool}, loopback, release build)");
    println!("| measure | n | p50 | p99 | max |");
    println!("|---|---|---|---|---|");
    row("create, at the client", &latency.client);
    row("create, server total (Server-Timing)", &latency.server.total);
    row("  of which claim", &latency.server.claim);
    row("  of which envd /init", &latency.server.init);
    row("  of which the wait for the gateway's route", &latency.server.route);
    row("create with an egress policy, at the client", &latency.client_policy);
    row("create with an egress policy, server total", &latency.server_policy.total);
    row("create → first stdout of `echo hi`", &first_output.total);
    row("  of which Process/Start → first stdout", &first_output.command);
    println!();
    println!(
        "sequential creates: {} in {:.1} s ({:.0}/s paced to the refill), {} answers 503 (pool empty)",
        latency.client.len() + latency.client_policy.len(),
        latency.wall.as_secs_f64(),
        (latency.client.len() + latency.client_policy.len()) as f64 / latency.wall.as_secs_f64(),
        latency.empty
    );
    println!(
        "first output: {} runs, {} answers 503 (pool empty)",
        first_output.total.len(),
        first_output.empty
    );
    for (i, burst) in bursts.iter().enumerate() {
        print_burst(i + 1, burst, clients);
    }
    let mut rates: Vec<f64> = bursts.iter().map(Burst::rate).collect();
    rates.sort_by(f64::total_cmp);
    println!(
        "claims/s over {} bursts: median {:.0} (min {:.0}, max {:.0})",
        rates.len(),
        rates[rates.len() / 2],
        rates[0],
        rates[rates.len() - 1]
    );
}

/// One burst's rate, latency, CPU and server share.
fn print_burst(n: usize, burst: &Burst, clients: usize) {
    println!(
        "burst {n}: {} creates by {clients} clients in {:.1} ms = {:.0} claims/s \
         (client latency p50 {}, p99 {}), {} answers 503",
        burst.latencies.len(),
        burst.wall.as_secs_f64() * 1e3,
        burst.rate(),
        fmt(percentile(&burst.latencies, 50.0)),
        fmt(percentile(&burst.latencies, 99.0)),
        burst.empty
    );
    let per_claim = |cpu: Duration| cpu.as_secs_f64() * 1e3 / burst.latencies.len().max(1) as f64;
    println!(
        "  CPU per claim during the burst: {:.2} ms machine-wide (the bench's clients, `oka serve`, \
         the sandboxes and the refill), of which {:.2} ms in `oka serve`, {:.2} ms in the bench's \
         clients and {:.2} ms elsewhere (the sandboxes, the kernel's own threads)",
        per_claim(burst.machine_cpu),
        per_claim(burst.serve_cpu),
        per_claim(burst.bench_cpu),
        per_claim(burst.machine_cpu.saturating_sub(burst.serve_cpu + burst.bench_cpu)),
    );
    println!("  the pool's refill started {} sandboxes during the burst", burst.refilled);
    println!(
        "  disk during the burst: {:.1} MB written, {} flushes, busy {:.0} % of the time",
        burst.disk.written as f64 / 1e6,
        burst.disk.flushes,
        100.0 * burst.disk.busy.as_secs_f64() / burst.wall.as_secs_f64().max(1e-9),
    );
    let p50_p99 = |samples: &[Duration]| {
        format!("{} / {}", fmt(percentile(samples, 50.0)), fmt(percentile(samples, 99.0)))
    };
    println!(
        "  server's share during the burst, p50 / p99: total {}, claim {}, envd /init {}, route {}",
        p50_p99(&burst.server.total),
        p50_p99(&burst.server.claim),
        p50_p99(&burst.server.init),
        p50_p99(&burst.server.route),
    );
}

struct Latency {
    client: Vec<Duration>,
    server: ServerShare,
    /// Creates with an egress policy.
    client_policy: Vec<Duration>,
    server_policy: ServerShare,
    empty: usize,
    wall: Duration,
}

/// Paces a loop to a rate, slowing down whenever the pool was found empty.
struct Pacer {
    interval: Duration,
    next: Instant,
}

impl Pacer {
    /// Starts at `OKA_BENCH_RATE` creates per second when set, else at 80% of the refill rate
    /// measured while the pool filled.
    fn new(fill_rate: f64) -> Self {
        let rate = std::env::var("OKA_BENCH_RATE")
            .ok()
            .and_then(|r| r.parse::<f64>().ok())
            .filter(|r| *r > 0.0)
            .unwrap_or(0.8 * fill_rate);
        Self { interval: Duration::from_secs_f64(1.0 / rate), next: Instant::now() }
    }

    fn wait(&mut self) {
        let now = Instant::now();
        if self.next > now {
            std::thread::sleep(self.next - now);
        }
        self.next = Instant::now().max(self.next) + self.interval;
    }

    fn slow_down(&mut self) {
        self.interval = self.interval.mul_f64(1.25);
    }
}

fn bench_create_latency(serve: &Serve, n: usize, fill_rate: f64) -> Latency {
    let mut api = serve.api_client();
    let mut out = Latency {
        client: Vec::with_capacity(n),
        server: ServerShare::default(),
        client_policy: Vec::with_capacity(n),
        server_policy: ServerShare::default(),
        empty: 0,
        wall: Duration::ZERO,
    };
    let mut pacer = Pacer::new(fill_rate);
    let started = Instant::now();
    while out.client.len() + out.client_policy.len() < n {
        pacer.wait();
        let policy = out.client_policy.len() < out.client.len();
        let body = if policy { common::CREATE_BODY_WITH_POLICY } else { common::CREATE_BODY };
        let t = Instant::now();
        let Some(created) = serve.create_with(&mut api, body) else {
            out.empty += 1;
            pacer.slow_down();
            continue;
        };
        let (client, server) = if policy {
            (&mut out.client_policy, &mut out.server_policy)
        } else {
            (&mut out.client, &mut out.server)
        };
        client.push(t.elapsed());
        server.record(&created.server_timing);
        serve.kill(&mut api, &created.id);
    }
    out.wall = started.elapsed();
    out
}

/// The server's share of creates, from their `Server-Timing` headers: the claim, envd's
/// `/init`, the wait for the gateway's route, and the handler's total.
#[derive(Default)]
struct ServerShare {
    claim: Vec<Duration>,
    init: Vec<Duration>,
    route: Vec<Duration>,
    total: Vec<Duration>,
}

impl ServerShare {
    fn record(&mut self, header: &str) {
        let timing = server_timing(header);
        self.claim.push(timing("claim"));
        self.init.push(timing("init"));
        self.route.push(timing("route"));
        self.total.push(timing("total"));
    }

    fn extend(&mut self, other: ServerShare) {
        self.claim.extend(other.claim);
        self.init.extend(other.init);
        self.route.extend(other.route);
        self.total.extend(other.total);
    }
}

/// A `Server-Timing` header's durations by name.
fn server_timing(header: &str) -> impl Fn(&str) -> Duration + '_ {
    move |name| {
        header
            .split(',')
            .filter_map(|metric| {
                let mut parts = metric.trim().split(';');
                (parts.next()? == name).then_some(())?;
                parts.find_map(|p| p.trim().strip_prefix("dur=")?.parse::<f64>().ok())
            })
            .next()
            .map_or(Duration::ZERO, |ms| Duration::from_secs_f64(ms / 1e3))
    }
}

struct FirstOutput {
    total: Vec<Duration>,
    command: Vec<Duration>,
    empty: usize,
}

fn bench_first_output(serve: &Serve, n: usize, fill_rate: f64) -> FirstOutput {
    let mut api = serve.api_client();
    let mut gateway = Client::connect(serve.gateway);
    let mut out = FirstOutput { total: Vec::new(), command: Vec::new(), empty: 0 };
    let mut pacer = Pacer::new(fill_rate);
    let start = envelope(
        br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{}},"stdin":false}"#,
    );
    while out.total.len() < n {
        pacer.wait();
        let t = Instant::now();
        let Some(created) = serve.create(&mut api) else {
            out.empty += 1;
            pacer.slow_down();
            continue;
        };
        let c = Instant::now();
        let id = created.id.clone();
        let headers = [
            ("E2b-Sandbox-Id", id.as_str()),
            ("E2b-Sandbox-Port", ENVD_PORT),
            ("X-Access-Token", created.token.as_str()),
            ("Content-Type", "application/connect+json"),
            ("Connect-Protocol-Version", "1"),
        ];
        let (stdout, at) =
            gateway.stream_until_stdout("POST", "/process.Process/Start", &headers, &start);
        assert_eq!(stdout, "aGkK", "expected stdout \"hi\\n\" from {id}");
        out.total.push(at - t);
        out.command.push(at - c);
        serve.kill(&mut api, &id);
    }
    out
}

struct Burst {
    latencies: Vec<Duration>,
    server: ServerShare,
    empty: usize,
    wall: Duration,
    /// CPU time the whole machine spent (every process and the kernel) during the burst.
    machine_cpu: Duration,
    /// Of which `oka serve` itself (its threads; the sandboxes are other processes).
    serve_cpu: Duration,
    /// Of which this bench (its 32 clients).
    bench_cpu: Duration,
    /// What the disks did during the burst.
    disk: DiskStat,
    /// Sandboxes the pool's refill started during the burst.
    refilled: usize,
}

impl Burst {
    /// Creates per second over the burst.
    fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.wall.as_secs_f64()
    }
}

/// CPU time the machine has spent busy so far: user, nice, system, irq and softirq of every
/// CPU (`/proc/stat`, in clock ticks of 10 ms). Steal time is the host's, not ours.
fn machine_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap())
        .collect();
    let busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6];
    Duration::from_millis(busy * 10)
}

/// Counters of the machine's disks (`/sys/block/*/stat` of the ones that are not loop, RAM or
/// device-mapper devices), summed.
#[derive(Debug, Default, Clone, Copy)]
struct DiskStat {
    /// Bytes written.
    written: u64,
    /// Cache flushes completed (what an `fsync` asks of the device).
    flushes: u64,
    /// Time the disks had I/O in flight (`io_ticks`).
    busy: Duration,
}

impl DiskStat {
    fn since(&self, before: &DiskStat) -> DiskStat {
        DiskStat {
            written: self.written.saturating_sub(before.written),
            flushes: self.flushes.saturating_sub(before.flushes),
            busy: self.busy.saturating_sub(before.busy),
        }
    }
}

fn disk_stat() -> DiskStat {
    let mut total = DiskStat::default();
    let Ok(disks) = std::fs::read_dir("/sys/block") else { return total };
    for disk in disks.flatten() {
        let name = disk.file_name().to_string_lossy().into_owned();
        if ["loop", "ram", "zram", "dm-"].iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(disk.path().join("stat")) else { continue };
        let f: Vec<u64> = stat.split_whitespace().filter_map(|v| v.parse().ok()).collect();
        // Fields, from 1 (Documentation/block/stat.rst): 7 sectors written, 10 io_ticks (ms),
        // 16 flush requests completed (kernels since 5.5).
        total.written += f.get(6).copied().unwrap_or(0) * 512;
        total.busy += Duration::from_millis(f.get(9).copied().unwrap_or(0));
        total.flushes += f.get(15).copied().unwrap_or(0);
    }
    total
}

/// Whether burst `n` (from 1) is profiled: `OKA_BENCH_PERF_BURSTS` lists the bursts to profile
/// (comma-separated); all of them when it is unset.
fn perf_burst(n: usize) -> bool {
    std::env::var("OKA_BENCH_PERF_BURSTS")
        .map_or(true, |list| list.split(',').any(|b| b.trim().parse() == Ok(n)))
}

/// Sends `command` to the `perf record` control FIFO named by `OKA_BENCH_PERF_CTL`, if any.
fn perf_control(command: &str) {
    if let Some(path) = std::env::var_os("OKA_BENCH_PERF_CTL") {
        let mut fifo = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        writeln!(fifo, "{command}").unwrap();
    }
}

/// The resident memory of process `pid`, in bytes (`VmRSS`).
fn process_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0);
    kib * 1024
}

/// CPU time (user + system) process `pid` has used so far.
fn process_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    // utime and stime, fields 14 and 15 of stat(5), in clock ticks.
    Duration::from_millis((f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()) * 10)
}

/// `clients` threads, each on its own connection, create `total` sandboxes together as fast as
/// they can from the stocked pool; all are killed afterwards.
fn bench_concurrent_claims(serve: &Serve, clients: usize, total: usize, profiled: bool) -> Burst {
    let next = AtomicUsize::new(0);
    let empty = AtomicUsize::new(0);
    let results = Mutex::new((Vec::new(), Vec::new(), ServerShare::default()));
    let barrier = Barrier::new(clients + 1);
    let sandboxes_before = serve.runtime_sandboxes();
    let (started, machine_before, serve_before, bench_before, disk_before) =
        std::thread::scope(|scope| {
            for _ in 0..clients {
                scope.spawn(|| {
                    let mut api = serve.api_client();
                    barrier.wait();
                    let mut mine = Vec::new();
                    let mut ids = Vec::new();
                    let mut server = ServerShare::default();
                    while next.fetch_add(1, Ordering::Relaxed) < total {
                        let t = Instant::now();
                        match serve.create(&mut api) {
                            Some(created) => {
                                mine.push(t.elapsed());
                                server.record(&created.server_timing);
                                ids.push(created.id);
                            }
                            None => {
                                empty.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    let mut r = results.lock().unwrap();
                    r.0.extend(mine);
                    r.1.extend(ids);
                    r.2.extend(server);
                });
            }
            if profiled {
                perf_control("enable");
            }
            barrier.wait();
            (
                Instant::now(),
                machine_cpu(),
                process_cpu(serve.child.id()),
                process_cpu(std::process::id()),
                disk_stat(),
            )
        });
    // The scope has joined every client.
    let wall = started.elapsed();
    if profiled {
        perf_control("disable");
    }
    let machine_cpu = machine_cpu().saturating_sub(machine_before);
    let serve_cpu = process_cpu(serve.child.id()).saturating_sub(serve_before);
    let bench_cpu = process_cpu(std::process::id()).saturating_sub(bench_before);
    let disk = disk_stat().since(&disk_before);
    let refilled = serve.runtime_sandboxes().saturating_sub(sandboxes_before);
    let (latencies, ids, server) = results.into_inner().unwrap();
    let mut api = serve.api_client();
    for id in &ids {
        serve.kill(&mut api, id);
    }
    Burst {
        latencies,
        server,
        empty: empty.into_inner(),
        wall,
        machine_cpu,
        serve_cpu,
        bench_cpu,
        disk,
        refilled,
    }
}
