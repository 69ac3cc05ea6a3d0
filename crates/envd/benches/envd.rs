//! Benchmarks of the `oka-envd` binary (not timed tests; figures go to `docs/benchmarks.md`):
//!
//! - idle resident memory of the daemon;
//! - the round trip of `commands.run("true")` (Start `bash -l -c true` over the wire) split into the
//!   daemon's own overhead (Start of `/bin/true` over the wire minus a local spawn of it) and bash's
//!   start-up (a local `bash -l -c true` minus a local `/bin/true`);
//! - upload and download of a 100 MB file through `/files` against a plain disk copy; the upload
//!   twice, from the client's memory (`write`) and from the file on disk (`sendfile`), each timed
//!   operation after a `sync` so that no writeback of an earlier round lands in it.
//!
//! `cargo bench -p oka-envd` (set `OKA_BENCH_RUNS` for more or fewer round trips, default 200,
//! `OKA_BENCH_FILE_RUNS` for the 100 MB transfers, default 7, and `OKA_ENVD_BIN` to bench another
//! build of the daemon).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Daemon {
    child: std::process::Child,
    addr: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_daemon() -> Daemon {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // OKA_ENVD_BIN benches another build of the daemon (e.g. an older one, for before/after).
    let bin =
        std::env::var("OKA_ENVD_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_oka-envd").into());
    let child = Command::new(bin)
        .args(["--addr", "127.0.0.1", "--port", &port.to_string()])
        .env("OKA_LOG", "warn")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    // The guard kills and reaps the daemon on every path, including a failed start.
    let daemon = Daemon { child, addr };
    for _ in 0..200 {
        if TcpStream::connect(&daemon.addr).is_ok() {
            return daemon;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("daemon did not start");
}

/// Writes every dirty page back (and lets the flush settle) before a timed file operation, so
/// each starts from the same state: otherwise the page cache's periodic writeback of the previous
/// rounds' 100 MB files lands, at random, inside one of the timed operations and competes for the
/// two cores (p99 times were 2-3x the p50).
fn settle() {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::thread::sleep(Duration::from_millis(50));
}

/// CPU time (user + system) the calling thread has used so far.
fn thread_cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let r = unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut r);
        r
    };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Duration::from_micros(us(r.ru_utime) + us(r.ru_stime))
}

/// CPU time (user + system) the process has used so far.
fn cpu_time(pid: u32) -> Duration {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = s.rsplit_once(')').unwrap().1.split_whitespace().collect();
    // utime and stime, fields 14 and 15 of stat(5), in clock ticks (100 a second on Linux).
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// A minimal keep-alive HTTP/1.1 client.
struct Conn {
    r: BufReader<TcpStream>,
}

impl Conn {
    fn new(addr: &str) -> Self {
        let s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        Self { r: BufReader::with_capacity(1 << 20, s) }
    }

    /// Sends `head`, then the whole of `file` as the body with `sendfile(2)`, as a client that
    /// uploads a file from disk can (no copy of it through the client's memory).
    fn send_file(&mut self, head: &str, file: &std::fs::File) {
        use std::os::fd::AsRawFd as _;
        let s = self.r.get_mut();
        s.write_all(head.as_bytes()).unwrap();
        let mut left = file.metadata().unwrap().len() as usize;
        let mut offset: libc::off_t = 0;
        while left > 0 {
            // SAFETY: both descriptors are open for the call; offset is ours.
            let n = unsafe { libc::sendfile(s.as_raw_fd(), file.as_raw_fd(), &mut offset, left) };
            assert!(n > 0, "sendfile: {}", std::io::Error::last_os_error());
            left -= n as usize;
        }
    }

    fn send(&mut self, head: &str, body: &[u8]) {
        let s = self.r.get_mut();
        s.write_all(head.as_bytes()).unwrap();
        if !body.is_empty() {
            s.write_all(body).unwrap();
        }
    }

    /// Reads one response; returns the status and the body length, passing body bytes to `sink`.
    fn response(&mut self, mut sink: impl FnMut(&[u8])) -> (u16, usize) {
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        let status: u16 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let (mut len, mut chunked) = (None, false);
        loop {
            line.clear();
            self.r.read_line(&mut line).unwrap();
            let l = line.trim_end().to_ascii_lowercase();
            if l.is_empty() {
                break;
            }
            if let Some(v) = l.strip_prefix("content-length:") {
                len = Some(v.trim().parse::<usize>().unwrap());
            }
            if l.starts_with("transfer-encoding:") && l.contains("chunked") {
                chunked = true;
            }
        }
        let mut total = 0;
        let mut buf = vec![0u8; 1 << 20];
        let mut read_n = |r: &mut BufReader<TcpStream>, mut n: usize, total: &mut usize| {
            while n > 0 {
                let k = r.read(&mut buf[..n.min(1 << 20)]).unwrap();
                assert!(k > 0, "connection closed");
                sink(&buf[..k]);
                n -= k;
                *total += k;
            }
        };
        if chunked {
            loop {
                line.clear();
                self.r.read_line(&mut line).unwrap();
                let n = usize::from_str_radix(line.trim(), 16).unwrap();
                if n == 0 {
                    line.clear();
                    self.r.read_line(&mut line).unwrap();
                    break;
                }
                read_n(&mut self.r, n, &mut total);
                line.clear();
                self.r.read_line(&mut line).unwrap();
            }
        } else if let Some(n) = len {
            read_n(&mut self.r, n, &mut total);
        }
        (status, total)
    }
}

fn start_request(cmd: &str, args: &[&str]) -> (String, Vec<u8>) {
    let msg =
        serde_json::json!({"process": {"cmd": cmd, "args": args}, "stdin": false}).to_string();
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
    body.extend_from_slice(msg.as_bytes());
    let head = format!(
        "POST /process.Process/Start HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    (head, body)
}

fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    let p = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    (p(0.5), p(0.99))
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let runs: usize =
        std::env::var("OKA_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let d = start_daemon();
    std::thread::sleep(Duration::from_millis(500));
    let idle = rss_kib(d.child.id());
    println!("idle RSS of oka-envd: {idle} KiB ({:.2} MB)", idle as f64 / 1024.0);

    // Round trips.
    let mut conn = Conn::new(&d.addr);
    let mut wire = |cmd: &str, args: &[&str]| {
        let (head, body) = start_request(cmd, args);
        let mut v = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            conn.send(&head, &body);
            let (st, _) = conn.response(|_| {});
            v.push(t.elapsed());
            assert_eq!(st, 200);
        }
        percentiles(v)
    };
    let bash_wire = wire("/bin/bash", &["-l", "-c", "true"]);
    let true_wire = wire("/bin/true", &[]);
    let local = |cmd: &str, args: &[&str]| {
        let mut v = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            let st = Command::new(cmd)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .output()
                .unwrap();
            v.push(t.elapsed());
            assert!(st.status.success());
        }
        percentiles(v)
    };
    let bash_local = local("/bin/bash", &["-l", "-c", "true"]);
    let true_local = local("/bin/true", &[]);
    println!("\nround trips over {runs} runs (p50 / p99):");
    println!(
        "  commands.run(\"true\") over the wire (bash -l -c true): {} / {}",
        ms(bash_wire.0),
        ms(bash_wire.1)
    );
    println!(
        "  Start /bin/true over the wire:                        {} / {}",
        ms(true_wire.0),
        ms(true_wire.1)
    );
    println!(
        "  local spawn bash -l -c true:                          {} / {}",
        ms(bash_local.0),
        ms(bash_local.1)
    );
    println!(
        "  local spawn /bin/true:                                {} / {}",
        ms(true_local.0),
        ms(true_local.1)
    );
    println!(
        "  => daemon overhead (wire /bin/true - local /bin/true): {} p50; bash start-up (bash - /bin/true, local): {} p50",
        ms(true_wire.0.saturating_sub(true_local.0)),
        ms(bash_local.0.saturating_sub(true_local.0)),
    );
    let busy = rss_kib(d.child.id());
    println!("RSS after {} round trips: {busy} KiB", 2 * runs);

    // 100 MB upload / download against a disk copy, each repeated (p50 / p99 over the rounds).
    const SIZE: usize = 100 << 20;
    let rounds: usize =
        std::env::var("OKA_BENCH_FILE_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(7);
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..SIZE).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let src = dir.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();
    let up_path = dir.path().join("up.bin");
    let copy_path = dir.path().join("copy.bin");
    let mut conn = Conn::new(&d.addr);
    let head = format!(
        "POST /files?path={} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: {SIZE}\r\n\r\n",
        up_path.display()
    );
    let (mut copy, mut copy_rw, mut up, mut up_file, mut down) =
        (vec![], vec![], vec![], vec![], vec![]);
    // CPU time of the daemon and of this (client) thread, per kind of transfer.
    let mut cpu = [[Duration::ZERO; 2]; 3];
    let mut meter = |kind: usize, start: (Duration, Duration)| {
        cpu[kind][0] += cpu_time(d.child.id()) - start.0;
        cpu[kind][1] += thread_cpu_time() - start.1;
    };
    let now = || (cpu_time(d.child.id()), thread_cpu_time());
    for _ in 0..rounds {
        let _ = std::fs::remove_file(&copy_path);
        settle();
        let t = Instant::now();
        std::fs::copy(&src, &copy_path).unwrap();
        copy.push(t.elapsed());
        let _ = std::fs::remove_file(&copy_path);
        settle();
        let t = Instant::now();
        {
            let mut r = std::fs::File::open(&src).unwrap();
            let mut w = std::fs::File::create(&copy_path).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = r.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                w.write_all(&buf[..n]).unwrap();
            }
        }
        copy_rw.push(t.elapsed());
        // Kind 0 sends the body from memory, kind 1 the file with sendfile.
        for kind in 0..2 {
            let _ = std::fs::remove_file(&up_path);
            let src_file = std::fs::File::open(&src).unwrap();
            settle();
            let c0 = now();
            let t = Instant::now();
            if kind == 0 {
                conn.send(&head, &data);
            } else {
                conn.send_file(&head, &src_file);
            }
            let (st, _) = conn.response(|_| {});
            if kind == 0 { &mut up } else { &mut up_file }.push(t.elapsed());
            meter(kind, c0);
            assert_eq!(st, 200);
            assert_eq!(std::fs::metadata(&up_path).unwrap().len(), SIZE as u64);
        }
        settle();
        let c0 = now();
        let t = Instant::now();
        conn.send(&format!("GET /files?path={} HTTP/1.1\r\nHost: x\r\n\r\n", src.display()), &[]);
        let (st, n) = conn.response(|_| {});
        down.push(t.elapsed());
        meter(2, c0);
        assert_eq!((st, n), (200, SIZE));
    }
    // Within one round the transfers and the copies run back to back, so their ratio is far
    // steadier than a ratio of medians on a machine whose speed drifts from minute to minute.
    let per_round = |kind: &[Duration], base: &[Duration]| {
        let mut r: Vec<f64> =
            kind.iter().zip(base).map(|(k, b)| 100.0 * b.as_secs_f64() / k.as_secs_f64()).collect();
        r.sort_by(f64::total_cmp);
        let median = r.get(r.len() / 2).copied().unwrap_or_default();
        let (lo, hi) =
            (r.first().copied().unwrap_or_default(), r.last().copied().unwrap_or_default());
        format!("median {median:.0} % (rounds {lo:.0}–{hi:.0} %)")
    };
    let rounds_line = format!(
        "  per round, against that round's copy_file_range: upload {}; upload (sendfile) {}; download {}",
        per_round(&up, &copy),
        per_round(&up_file, &copy),
        per_round(&down, &copy)
    );
    let mbps = |d: Duration| SIZE as f64 / (1 << 20) as f64 / d.as_secs_f64();
    // p50 and p99 of the times; as throughput the p99 time is the slow end.
    let show = |v: Vec<Duration>| {
        let (p50, p99) = percentiles(v);
        (p50, format!("{:.0} / {:.0} MB/s (p50 / p99 time)", mbps(p50), mbps(p99)))
    };
    let (copy, copy_s) = show(copy);
    let (copy_rw, copy_rw_s) = show(copy_rw);
    let (up, up_s) = show(up);
    let (up_file, up_file_s) = show(up_file);
    let (down, down_s) = show(down);
    println!("\n100 MB file, {rounds} rounds:");
    println!("  disk copy, std::fs::copy (in-kernel copy_file_range): {copy_s}");
    println!("  disk copy, read/write loop with a 1 MiB buffer:       {copy_rw_s}");
    let pct = |d: Duration, base: Duration| 100.0 * base.as_secs_f64() / d.as_secs_f64();
    println!(
        "  upload   POST /files (octet-stream): {up_s}; p50 = {:.0} % of copy_file_range, {:.0} % of read/write",
        pct(up, copy),
        pct(up, copy_rw)
    );
    println!(
        "  upload, the client sending the file (sendfile): {up_file_s}; p50 = {:.0} % of copy_file_range, {:.0} % of read/write",
        pct(up_file, copy),
        pct(up_file, copy_rw)
    );
    println!(
        "  download GET /files:                 {down_s}; p50 = {:.0} % of copy_file_range, {:.0} % of read/write",
        pct(down, copy),
        pct(down, copy_rw)
    );
    println!("{rounds_line}");
    // CPU per MB, the figures the host's load disturbs least. One thread on each side moves a
    // TCP stream, so the busier side bounds the throughput: at c ms per MB, 1000 / c MB/s.
    let per_mb = |c: Duration| c.as_secs_f64() * 1e3 / (rounds.max(1) * (SIZE >> 20)) as f64;
    println!("  CPU per MB, daemon / client (the bound it sets):");
    for (name, [daemon, client]) in
        ["upload (write)", "upload (sendfile)", "download"].iter().zip(cpu)
    {
        let (daemon, client) = (per_mb(daemon), per_mb(client));
        println!(
            "    {name:18} {daemon:.2} / {client:.2} ms (at most {:.0} MB/s)",
            1e3 / daemon.max(client).max(1e-9)
        );
    }
    println!("RSS after the transfers: {} KiB", rss_kib(d.child.id()));
}
