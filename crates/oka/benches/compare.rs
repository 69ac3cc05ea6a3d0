//! The published comparison: oka's figures beside the physical floor measured in the same run on
//! the same machine, and beside the peers' published numbers, written as a Markdown report with
//! one SVG chart per capability (`docs/comparison.md`, `docs/comparison/*.svg`).
//!
//! Each capability is measured on a real `oka serve` with a warm pool of real sandboxes, over
//! loopback with a raw HTTP/1.1 client, and each is set beside its floor: the least the machine
//! can do for what the capability must do at the least, measured in the same run, before and
//! after the capability (so the machine's drift hits both):
//! - a durable write: `write` of 4 KiB and `fdatasync` in the state directory's file system;
//! - a loopback round trip: 64 bytes there and back on an open TCP connection;
//! - a process: fork, exec and wait of `/bin/true`.
//!
//! | capability | what it must do at the least | floor |
//! |---|---|---|
//! | create from a warm pool (E2B `POST /v2/sandboxes`) | record the claim durably, answer | durable write + round trip |
//! | create → first output of a command | the create, then start a process and read its output | durable write + process + 2 round trips |
//! | pause (memory kept) | record it durably, freeze | durable write + round trip |
//! | resume | record it durably, thaw | durable write + round trip |
//! | a request to envd through the gateway | one more hop than a direct request | round trip |
//!
//! The peers' numbers are quoted from their own publications (the source is named beside each);
//! they come from other machines and setups, so they set the scale, not a race.
//!
//! `OKA_COMPARE_N` samples per capability (default 200; pause and resume a quarter of it),
//! `OKA_COMPARE_POOL` warm sandboxes (default 16), `OKA_COMPARE_OUT` where the report goes
//! (default `docs/` of the repository). Run as root with `cargo build --release --bins` then
//! `cargo bench -p oka --bench compare`; otherwise it prints SKIPPED.

#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::print_stderr)]

mod common;

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Client, ENVD_PORT, Serve, env_usize, envelope, fmt, oka, percentile};

/// A published number of a peer.
struct Peer {
    who: &'static str,
    /// Seconds, as published.
    p50: f64,
    /// Tail as published (p95 or p99), if any.
    tail: Option<f64>,
    /// What was measured and where it was published.
    note: &'static str,
}

/// One capability's row of the report.
struct Capability {
    slug: &'static str,
    title: &'static str,
    oka: Vec<Duration>,
    floor_name: &'static str,
    floor: Vec<Duration>,
    peers: Vec<Peer>,
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED compare bench: real sandboxes need root");
        return;
    }
    let envd = Path::new(&oka()).with_file_name("oka-envd");
    assert!(envd.exists(), "{} is missing: `cargo build --release --bins`", envd.display());
    let n = env_usize("OKA_COMPARE_N", 200).max(8);
    let pool = env_usize("OKA_COMPARE_POOL", 16).max(4);
    let out = std::env::var_os("OKA_COMPARE_OUT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs"),
        PathBuf::from,
    );

    let serve = Serve::start(pool, &envd);
    serve.wait_stocked(pool, Duration::from_secs(300));
    let state = serve.state.path().to_owned();

    // The floors, first half.
    let mut floors = Floors::default();
    floors.measure(&state, n / 2);

    let create = bench_create(&serve, n);
    serve.wait_stocked(pool, Duration::from_secs(300));
    let first_output = bench_first_output(&serve, n / 2);
    serve.wait_stocked(pool, Duration::from_secs(300));
    let (pause, resume) = bench_pause_resume(&serve, n / 4);
    let (through_gateway, direct) = bench_gateway_hop(&serve, n * 5);

    // The floors, second half.
    floors.measure(&state, n / 2);

    let durable_and_trip = floors.sum(&[&floors.fsync, &floors.rtt]);
    let output_floor = floors.sum(&[&floors.fsync, &floors.process, &floors.rtt, &floors.rtt]);
    let capabilities = vec![
        Capability {
            slug: "create",
            title: "Create from a warm pool (E2B create, at the client)",
            oka: create,
            floor_name: "durable write + loopback round trip",
            floor: durable_and_trip.clone(),
            peers: vec![
                Peer {
                    who: "CubeSandbox",
                    p50: 0.0478,
                    tail: Some(0.0574),
                    note: "create, serial; average and p95 on a 96-core host (CubeSandbox blog, 2026-06-01, self-bench)",
                },
                Peer {
                    who: "agent-sandbox",
                    p50: 0.064,
                    tail: Some(0.080),
                    note: "warm claim to Ready, parallelism 1; p50 and p95 (cocoonstack/sandbox-operator#33, 3rd-party)",
                },
                Peer {
                    who: "OpenKruise Agents",
                    p50: 0.080,
                    tail: None,
                    note: "claim, manager side; illustrative figure of its tracing proposal",
                },
                Peer {
                    who: "E2B (self-hosted)",
                    p50: 0.150,
                    tail: None,
                    note: "single create (e2b-dev/infra#1750, user report)",
                },
            ],
        },
        Capability {
            slug: "first-output",
            title: "Create → first output of a command (time to interactive)",
            oka: first_output,
            floor_name: "durable write + process start + 2 loopback round trips",
            floor: output_floor,
            peers: vec![
                Peer {
                    who: "Daytona",
                    p50: 0.11,
                    tail: Some(0.29),
                    note: "time to interactive, median and p99 (ComputeSDK, Apr 2026, 3rd-party)",
                },
                Peer {
                    who: "E2B",
                    p50: 0.44,
                    tail: Some(0.99),
                    note: "time to interactive, median and p99 (ComputeSDK, Apr 2026, 3rd-party)",
                },
                Peer {
                    who: "Blaxel",
                    p50: 1.05,
                    tail: Some(1.15),
                    note: "time to interactive, median and p99 (ComputeSDK, Apr 2026, 3rd-party)",
                },
            ],
        },
        Capability {
            slug: "pause",
            title: "Pause, memory kept (E2B pause)",
            oka: pause,
            floor_name: "durable write + loopback round trip",
            floor: durable_and_trip.clone(),
            peers: vec![
                Peer {
                    who: "CubeSandbox",
                    p50: 0.558,
                    tail: None,
                    note: "pause with a full copy of 2 GiB of memory (CubeSandbox blog, self-bench): a snapshot, not a freeze",
                },
                Peer {
                    who: "OpenKruise Agents",
                    p50: 15.0,
                    tail: None,
                    note: "pause is a Pod delete and resume a recreate, ≈15 s (openkruise/agents#732)",
                },
            ],
        },
        Capability {
            slug: "resume",
            title: "Resume (E2B resume)",
            oka: resume,
            floor_name: "durable write + loopback round trip",
            floor: durable_and_trip,
            peers: vec![
                Peer {
                    who: "Blaxel",
                    p50: 0.025,
                    tail: None,
                    note: "standby resume \"under 25 ms\" (vendor claim)",
                },
                Peer {
                    who: "CubeSandbox",
                    p50: 0.042,
                    tail: None,
                    note: "resume, single (CubeSandbox blog, self-bench)",
                },
                Peer {
                    who: "E2B", p50: 1.0, tail: None, note: "resume ≈1 s (E2B documentation)"
                },
                Peer {
                    who: "OpenKruise Agents",
                    p50: 15.0,
                    tail: None,
                    note: "Pod recreate ≈15 s (openkruise/agents#732)",
                },
            ],
        },
        Capability {
            slug: "gateway",
            title: "A request to envd through the gateway (GET /health)",
            oka: through_gateway,
            floor_name: "loopback round trip",
            floor: floors.rtt.clone(),
            peers: vec![
                Peer {
                    who: "Firecracker virtio-net",
                    p50: 0.000_06,
                    tail: None,
                    note: "added network latency of the VMM (firecracker SPECIFICATION.md)",
                },
                Peer {
                    who: "Envoy sidecar hop",
                    p50: 0.001,
                    tail: Some(0.005),
                    note: "typically 1–5 ms with mTLS and telemetry (soft source)",
                },
            ],
        },
    ];

    let report = render(&capabilities, &floors, &direct, pool);
    std::fs::create_dir_all(out.join("comparison")).unwrap();
    for capability in &capabilities {
        std::fs::write(out.join(format!("comparison/{}.svg", capability.slug)), chart(capability))
            .unwrap();
    }
    std::fs::write(out.join("comparison.md"), &report).unwrap();
    println!("{report}");
    println!("written to {}", out.join("comparison.md").display());
}

/// The floors' samples.
#[derive(Default)]
struct Floors {
    fsync: Vec<Duration>,
    rtt: Vec<Duration>,
    process: Vec<Duration>,
}

impl Floors {
    fn measure(&mut self, dir: &Path, n: usize) {
        let file = std::fs::File::create(dir.join("floor-fsync")).unwrap();
        let page = vec![0x5au8; 4096];
        for _ in 0..n {
            let t = Instant::now();
            file.write_all_at(&page, 0).unwrap();
            file.sync_data().unwrap();
            self.fsync.push(t.elapsed());
        }
        drop(file);
        let _ = std::fs::remove_file(dir.join("floor-fsync"));

        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let echo = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_nodelay(true).unwrap();
            let mut buf = [0u8; 64];
            while s.read_exact(&mut buf).is_ok() {
                s.write_all(&buf).unwrap();
            }
        });
        let mut client = TcpStream::connect(addr).unwrap();
        client.set_nodelay(true).unwrap();
        let mut buf = [7u8; 64];
        for _ in 0..n * 10 {
            let t = Instant::now();
            client.write_all(&buf).unwrap();
            client.read_exact(&mut buf).unwrap();
            self.rtt.push(t.elapsed());
        }
        drop(client);
        echo.join().unwrap();

        for _ in 0..n {
            let t = Instant::now();
            let status = std::process::Command::new("/bin/true").status().unwrap();
            self.process.push(t.elapsed());
            assert!(status.success());
        }
    }

    /// Samples of the sum of independent floors: the i-th sample of each, over the shortest.
    fn sum(&self, parts: &[&Vec<Duration>]) -> Vec<Duration> {
        let n = parts.iter().map(|p| p.len()).min().unwrap_or(0);
        (0..n).map(|i| parts.iter().map(|p| p[i]).sum()).collect()
    }
}

fn bench_create(serve: &Serve, n: usize) -> Vec<Duration> {
    let mut api = serve.api_client();
    let mut samples = Vec::new();
    while samples.len() < n {
        let t = Instant::now();
        let Some(created) = serve.create(&mut api) else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        samples.push(t.elapsed());
        serve.kill(&mut api, &created.id);
        // Paced so the pool's refill keeps up.
        std::thread::sleep(Duration::from_millis(40));
    }
    samples
}

fn bench_first_output(serve: &Serve, n: usize) -> Vec<Duration> {
    let mut api = serve.api_client();
    let mut gateway = Client::connect(serve.gateway);
    let start = envelope(
        br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{}},"stdin":false}"#,
    );
    let mut samples = Vec::new();
    while samples.len() < n {
        let t = Instant::now();
        let Some(created) = serve.create(&mut api) else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let headers = envd_headers(&created.id, &created.token);
        let (stdout, at) =
            gateway.stream_until_stdout("POST", "/process.Process/Start", &headers, &start);
        assert_eq!(stdout, "aGkK", "expected stdout \"hi\\n\"");
        samples.push(at - t);
        serve.kill(&mut api, &created.id);
        std::thread::sleep(Duration::from_millis(60));
    }
    samples
}

fn envd_headers<'a>(id: &'a str, token: &'a str) -> [(&'static str, &'a str); 5] {
    [
        ("E2b-Sandbox-Id", id),
        ("E2b-Sandbox-Port", ENVD_PORT),
        ("X-Access-Token", token),
        ("Content-Type", "application/connect+json"),
        ("Connect-Protocol-Version", "1"),
    ]
}

/// Pauses and resumes one sandbox `n` times each, alternately.
fn bench_pause_resume(serve: &Serve, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    let mut api = serve.api_client();
    let created = serve.create(&mut api).expect("a warm sandbox");
    let key = [("X-API-Key", serve.key.as_str()), ("Content-Type", "application/json")];
    let (mut pauses, mut resumes) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        let r = api.request("POST", &format!("/sandboxes/{}/pause", created.id), &key, b"{}");
        assert_eq!(r.status, 204, "pause: {}", String::from_utf8_lossy(&r.body));
        pauses.push(t.elapsed());
        let t = Instant::now();
        let r = api.request(
            "POST",
            &format!("/sandboxes/{}/resume", created.id),
            &key,
            br#"{"timeout":300}"#,
        );
        assert_eq!(r.status, 201, "resume: {}", String::from_utf8_lossy(&r.body));
        resumes.push(t.elapsed());
    }
    serve.kill(&mut api, &created.id);
    (pauses, resumes)
}

/// `GET /health` of one sandbox's envd through the gateway and, as the baseline, straight to
/// the gateway's own health endpoint (same client, same connection handling, no sandbox hop).
fn bench_gateway_hop(serve: &Serve, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    let mut api = serve.api_client();
    let created = serve.create(&mut api).expect("a warm sandbox");
    let mut gateway = Client::connect(serve.gateway);
    let headers = [("E2b-Sandbox-Id", created.id.as_str()), ("E2b-Sandbox-Port", ENVD_PORT)];
    let (mut through, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        let r = gateway.request("GET", "/health", &headers, b"");
        through.push(t.elapsed());
        assert!(r.status == 204 || r.status == 200, "envd /health: {}", r.status);
        let t = Instant::now();
        let r = gateway.request("GET", "/healthz", &[], b"");
        direct.push(t.elapsed());
        assert_eq!(r.status, 200);
    }
    serve.kill(&mut api, &created.id);
    (through, direct)
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A duration given in seconds, in the unit that reads best.
fn human(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 0.001 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

fn render(
    capabilities: &[Capability],
    floors: &Floors,
    direct: &[Duration],
    pool: usize,
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# oka beside its floor and its peers\n");
    let _ = writeln!(
        md,
        "Generated by `cargo bench -p oka --bench compare` (as root, after `cargo build --release \
         --bins`) on a 2-vCPU virtual machine with 24 GiB of memory, ext4 on a virtio disk: a \
         real `oka serve` with a warm pool of {pool} real sandboxes, driven over loopback. Every \
         oka figure is set beside the **physical floor** measured in the same run on the same \
         machine (the least the machine can do for what the capability must do at the least), \
         so it reads as a ratio to that floor, and beside the peers' published numbers, which \
         come from other machines and setups and set the scale, not a race. The benchmark \
         report ([benchmarks.md](benchmarks.md)) has every other figure.\n"
    );
    let _ = writeln!(md, "## The floors, this run\n");
    let _ = writeln!(md, "| floor | n | p50 | p99 |\n|---|---|---|---|");
    for (name, samples) in [
        ("durable write: 4 KiB `write` + `fdatasync` in the state directory", &floors.fsync),
        ("loopback round trip: 64 B there and back on an open TCP connection", &floors.rtt),
        ("process: fork, exec and wait of `/bin/true`", &floors.process),
    ] {
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} |",
            samples.len(),
            fmt(percentile(samples, 50.0)),
            fmt(percentile(samples, 99.0))
        );
    }
    let _ = writeln!(md, "\n## Summary\n");
    let _ = writeln!(
        md,
        "| capability | oka p50 | oka p99 | floor p50 | oka ÷ floor (p50) | peers (p50, as published) |\n|---|---|---|---|---|---|"
    );
    for c in capabilities {
        let (p50, p99, floor) =
            (percentile(&c.oka, 50.0), percentile(&c.oka, 99.0), percentile(&c.floor, 50.0));
        let peers: Vec<String> =
            c.peers.iter().map(|p| format!("{} {}", p.who, human(p.p50))).collect();
        let _ = writeln!(
            md,
            "| [{}](#{}) | **{}** | {} | {} | {:.1}× | {} |",
            c.title,
            c.slug,
            fmt(p50),
            fmt(p99),
            fmt(floor),
            secs(p50) / secs(floor).max(1e-9),
            peers.join("; ")
        );
    }
    for c in capabilities {
        let _ = writeln!(md, "\n<a id=\"{}\"></a>\n## {}\n", c.slug, c.title);
        let _ = writeln!(md, "![{}](comparison/{}.svg)\n", c.title, c.slug);
        let _ = writeln!(md, "| who | p50 | tail | source |\n|---|---|---|---|");
        let _ = writeln!(
            md,
            "| **oka** | **{}** | p99 {} | this run, n = {} |",
            fmt(percentile(&c.oka, 50.0)),
            fmt(percentile(&c.oka, 99.0)),
            c.oka.len()
        );
        let _ = writeln!(
            md,
            "| floor: {} | {} | p99 {} | this run, n = {} |",
            c.floor_name,
            fmt(percentile(&c.floor, 50.0)),
            fmt(percentile(&c.floor, 99.0)),
            c.floor.len()
        );
        for p in &c.peers {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                p.who,
                human(p.p50),
                p.tail.map_or("—".to_owned(), human),
                p.note
            );
        }
        if c.slug == "gateway" {
            let _ = writeln!(
                md,
                "\nThe same client's request to the gateway's own `/healthz` (no sandbox hop) \
                 took {} p50, {} p99 in this run: the sandbox hop (a dial-free pooled \
                 connection into the sandbox's network namespace, envd's answer) is the \
                 difference.",
                fmt(percentile(direct, 50.0)),
                fmt(percentile(direct, 99.0))
            );
        }
    }
    md
}

/// A horizontal bar chart on a logarithmic scale: oka's p50 (with its p99 as a whisker), the
/// floor, and each peer's published p50 (tail as a whisker where published).
fn chart(c: &Capability) -> String {
    struct Bar {
        label: String,
        p50: f64,
        tail: Option<f64>,
        color: &'static str,
    }
    let mut bars = vec![
        Bar {
            label: "oka".into(),
            p50: secs(percentile(&c.oka, 50.0)),
            tail: Some(secs(percentile(&c.oka, 99.0))),
            color: "#1f6feb",
        },
        Bar {
            label: "floor".into(),
            p50: secs(percentile(&c.floor, 50.0)),
            tail: Some(secs(percentile(&c.floor, 99.0))),
            color: "#8b949e",
        },
    ];
    for p in &c.peers {
        bars.push(Bar { label: p.who.into(), p50: p.p50, tail: p.tail, color: "#d29922" });
    }
    let lo = bars.iter().map(|b| b.p50).fold(f64::INFINITY, f64::min).max(1e-6);
    let hi = bars.iter().map(|b| b.tail.unwrap_or(b.p50).max(b.p50)).fold(0.0, f64::max);
    let (min_exp, max_exp) = (lo.log10().floor(), hi.log10().ceil().max(lo.log10().floor() + 1.0));
    let (left, width, row_h, top) = (170.0, 560.0, 26.0, 30.0);
    let x = |s: f64| left + (s.max(1e-9).log10() - min_exp) / (max_exp - min_exp) * width;
    let height = top + row_h * bars.len() as f64 + 30.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"760\" height=\"{height:.0}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"10\" y=\"18\" font-weight=\"bold\">{}: p50, whisker to p99 (or the tail published); log scale</text>\n",
        escape(c.title)
    );
    let mut e = min_exp;
    while e <= max_exp {
        let gx = x(10f64.powf(e));
        let _ = writeln!(
            svg,
            "<line x1=\"{gx:.1}\" y1=\"{top}\" x2=\"{gx:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{gx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#555\">{}</text>",
            height - 25.0,
            height - 10.0,
            human(10f64.powf(e))
        );
        e += 1.0;
    }
    for (i, b) in bars.iter().enumerate() {
        let y = top + row_h * i as f64 + 4.0;
        let w = (x(b.p50) - left).max(1.0);
        // The value goes past the whisker, so the two never overlap.
        let label_x = x(b.tail.unwrap_or(b.p50).max(b.p50)).max(left + w) + 6.0;
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\
             <rect x=\"{left}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"16\" fill=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#333\">{}</text>",
            left - 8.0,
            y + 12.0,
            escape(&b.label),
            b.color,
            label_x,
            y + 12.0,
            human(b.p50)
        );
        if let Some(t) = b.tail.filter(|t| *t > b.p50) {
            let _ = writeln!(
                svg,
                "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#333\"/>\
                 <line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#333\"/>",
                left + w,
                y + 8.0,
                x(t),
                y + 8.0,
                x(t),
                y + 3.0,
                x(t),
                y + 13.0
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
