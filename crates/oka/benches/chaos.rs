//! Chaos: `oka serve` killed with `kill -9` at random moments under a load of E2B API operations,
//! and restarted on the same state directory each time; what a client was told must hold after.
//!
//! A few client threads create sandboxes from the warm pool (some with a short timeout), run
//! commands in them through the gateway and envd, set short timeouts, pause, resume and kill
//! them. Every answered operation goes into a client-side ledger of what must now be true (this
//! sandbox exists and runs, is paused, is gone; after its timeout, is gone). An operation whose
//! answer was lost (the server died under it) leaves its sandbox unknown until the next check
//! observes it. A seeded random number generator picks the operations and the moment of each
//! kill (`OKA_CHAOS_SEED`, else the clock; printed); the threads' interleaving is the machine's.
//!
//! After each restart the clients hold, and the bench measures the time until the API answers
//! and the pool is back to its desired available replicas, then checks, polling for up to
//! [`SETTLE`] so asynchronous work can finish:
//! - acknowledged writes lost: a created sandbox missing (before its timeout), a killed one
//!   still there, a paused one not paused, a resumed one not running, a timed-out one still
//!   there well after its timeout, or a 404 to an operation on a sandbox the ledger says exists;
//! - sandboxes handed out twice: one ID answered to two creates, or two IDs on one Sandbox;
//! - instances leaked: runtime instances (`<state>/runtime/sandboxes/<id>`) of no Sandbox
//!   object; and orphans: Sandbox objects `Running` without a live instance;
//! - restarts refused: `oka serve` exiting at once instead of starting on its state directory
//!   (noted with its last log line, and started again so the run goes on);
//! - requests that hung: no answer within [`HANG`] ([`HANG_SLOW`] for pause and resume, whose
//!   server waits up to 50 s by design).
//!
//! Then one corruption case: a copy of the stopped store with one byte flipped must make
//! `oka serve` refuse to start, naming the store file.
//!
//! `OKA_CHAOS_ROUNDS` kills (default 5), `OKA_CHAOS_CLIENTS` threads (default 3),
//! `OKA_CHAOS_POOL` warm sandboxes (default 6). Exits non-zero when any figure but the
//! convergence time is not 0. Run with `cargo bench -p oka --bench chaos` as root, after
//! `cargo build --release --bins`; otherwise it prints SKIPPED.

#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::print_stderr)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::support::{self, OkaServe};
use common::{env_usize, fmt, oka, percentile};

/// A request not answered within this is counted as hung.
const HANG: Duration = Duration::from_secs(30);
/// The bound for pause and resume, which the server answers within 50 s by design.
const HANG_SLOW: Duration = Duration::from_secs(60);
/// How long the checks poll for asynchronous work (deletes, timeouts) to finish.
const SETTLE: Duration = Duration::from_secs(30);
/// The short timeout of some creates and of the set-timeout operation, in seconds.
const SHORT_TIMEOUT: u64 = 4;
/// How long after its timeout a sandbox may still be seen.
const TIMEOUT_GRACE: Duration = Duration::from_secs(20);
/// How many sandboxes each client holds at most.
const PER_CLIENT: usize = 3;

/// SplitMix64: a seeded, dependency-free generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What the ledger says must be true of a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Running,
    Paused,
    Gone,
    /// An answer was lost: the next check observes it.
    Unknown,
}

#[derive(Debug)]
struct Entry {
    token: String,
    expect: Expect,
    /// When its (short) timeout ends, if it has one.
    expires: Option<Instant>,
    /// Whether that timeout is only maybe set (its request got no answer): then after it the
    /// sandbox may be either gone or there.
    maybe_ends: bool,
}

/// Why a request got no answer.
#[derive(Debug)]
enum Fail {
    /// Refused, reset or closed: the server is down or died under it.
    Io(String),
    /// No answer within the bound.
    Hung,
}

#[derive(Default)]
struct Findings {
    lost: Vec<String>,
    double: Vec<String>,
    leaked: Vec<String>,
    orphaned: Vec<String>,
    hung: Vec<String>,
    not_converged: Vec<String>,
    /// Restarts where `oka serve` exited at once (its last log line).
    refused: Vec<String>,
    /// Informational: commands that failed on a sandbox the ledger says runs, the server up.
    command_failures: Vec<String>,
}

struct Shared {
    ledger: Mutex<HashMap<String, Entry>>,
    findings: Mutex<Findings>,
    acked: Mutex<BTreeMap<&'static str, usize>>,
    /// The clients stop issuing operations while set.
    hold: AtomicBool,
    /// How many clients are holding.
    parked: AtomicUsize,
    stop: AtomicBool,
    /// Whether the server is known to be down (failures then are expected).
    down: AtomicBool,
    api: u16,
    gateway: u16,
    key: String,
}

impl Shared {
    fn ack(&self, op: &'static str) {
        *self.acked.lock().unwrap().entry(op).or_default() += 1;
    }
    fn finding(&self, f: impl FnOnce(&mut Findings)) {
        f(&mut self.findings.lock().unwrap());
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED chaos bench: real sandboxes need root");
        return;
    }
    let envd = Path::new(&oka()).with_file_name("oka-envd");
    if !envd.exists() {
        eprintln!("{} is missing: build it with `cargo build --release --bins`", envd.display());
        std::process::exit(1);
    }
    let rounds = env_usize("OKA_CHAOS_ROUNDS", 5);
    let clients = env_usize("OKA_CHAOS_CLIENTS", 3).max(1);
    let pool = env_usize("OKA_CHAOS_POOL", 6).max(1);
    let seed =
        std::env::var("OKA_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    println!(
        "chaos: seed {seed} (OKA_CHAOS_SEED={seed} repeats the choices), {rounds} kills, {clients} clients, pool {pool}"
    );
    let mut rng = Rng(seed);

    let config = format!(
        "defaultPool:\n  replicas: {pool}\ncodeInterpreterPool:\n  enabled: false\nlog:\n  filter: warn\n"
    );
    let mut serve = OkaServe::start(&oka(), &config, &[("OKA_ENVD", envd.as_os_str())]);
    let shared = Arc::new(Shared {
        ledger: Mutex::new(HashMap::new()),
        findings: Mutex::new(Findings::default()),
        acked: Mutex::new(BTreeMap::new()),
        hold: AtomicBool::new(true),
        parked: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        down: AtomicBool::new(false),
        api: serve.api,
        gateway: serve.gateway,
        key: serve.key(),
    });
    if let Err(why) = converge(&serve, pool, Duration::from_secs(300)) {
        eprintln!("the first start did not converge: {why}\n{}", serve.log());
        std::process::exit(1);
    }

    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let shared = Arc::clone(&shared);
            let seed = seed ^ (i as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407);
            std::thread::spawn(move || client(&shared, seed))
        })
        .collect();
    let mut converged = Vec::new();
    release(&shared);
    for round in 1..=rounds {
        let under_load = Duration::from_millis(1500 + rng.below(5000));
        std::thread::sleep(under_load);
        // kill -9.
        shared.down.store(true, Ordering::SeqCst);
        let _ = serve.child.kill();
        let _ = serve.child.wait();
        hold(&shared, clients);
        eprintln!("round {round}: killed oka serve after {under_load:?} of load; restarting");
        let restarted = Instant::now();
        let refusals = restart(&mut serve);
        for refusal in &refusals {
            eprintln!("round {round}: oka serve refused to start: {refusal}");
        }
        shared.finding(|f| {
            f.refused.extend(refusals.into_iter().map(|r| format!("round {round}: {r}")));
        });
        match converge(&serve, pool, Duration::from_secs(120)) {
            Ok(_) => {
                let took = restarted.elapsed();
                eprintln!("round {round}: converged in {}", fmt(took));
                converged.push(took);
            }
            Err(why) => {
                shared.finding(|f| f.not_converged.push(format!("round {round}: {why}")));
            }
        }
        shared.down.store(false, Ordering::SeqCst);
        check(&serve, &shared, &format!("after restart {round}"));
        release(&shared);
    }
    // The last stretch of load without a kill, then the final check.
    std::thread::sleep(Duration::from_secs(3));
    hold(&shared, clients);
    shared.stop.store(true, Ordering::SeqCst);
    release(&shared);
    for thread in threads {
        let _ = thread.join();
    }
    check(&serve, &shared, "at the end");

    // Corruption: stop the server cleanly, then start one on a copy of its store with a byte
    // flipped.
    let _ = Command::new("kill").arg("-TERM").arg(serve.child.id().to_string()).status();
    let _ = serve.child.wait();
    let corruption = corruption_case(serve.state.path(), &envd);

    let clean = report(seed, &shared, &converged, rounds, &corruption, &serve);
    // Started again so that dropping it stops a live process and removes its sandboxes.
    respawn(&mut serve);
    let _ = wait_listening(&serve);
    drop(serve);
    if !clean {
        std::process::exit(1);
    }
}

/// Starts `oka serve` again after a kill; when it exits at once (refuses to start), notes its
/// last log line and starts it again, a few times, so the run goes on; what it refused with.
fn restart(serve: &mut OkaServe) -> Vec<String> {
    let mut refusals = Vec::new();
    for _ in 0..50 {
        respawn(serve);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = serve.child.try_wait() {
                let log = serve.log();
                let last = log.lines().last().unwrap_or_default().trim().to_owned();
                refusals.push(format!("exited with {status}: {last}"));
                std::thread::sleep(Duration::from_millis(100));
                break;
            }
            if TcpStream::connect(("127.0.0.1", serve.api)).is_ok() || Instant::now() >= deadline {
                return refusals;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    refusals
}

/// Waits (at most a minute) until the API listens.
fn wait_listening(serve: &OkaServe) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", serve.api)).is_err() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Starts `oka serve` again on its state directory, configuration and ports (the log goes on in
/// the same file), and waits until it listens.
fn respawn(serve: &mut OkaServe) {
    let state = serve.state.path();
    let log = std::fs::OpenOptions::new().append(true).open(state.join("serve.log")).unwrap();
    let envd = Path::new(&oka()).with_file_name("oka-envd");
    serve.child = Command::new(oka())
        .arg("serve")
        .arg("--state-dir")
        .arg(state)
        .arg("--config")
        .arg(state.join("config.yaml"))
        .env("NO_COLOR", "1")
        .env("OKA_ENVD", envd)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
}

/// Waits until the API answers and the default pool has its desired available replicas; how
/// long that took from now.
fn converge(serve: &OkaServe, pool: usize, limit: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    let key = serve.key();
    loop {
        if started.elapsed() > limit {
            return Err(format!("the API did not answer within {limit:?}"));
        }
        let answer = http(serve.api, "GET", "/sandboxes", &[("X-API-Key", &key)], b"", HANG);
        if matches!(answer, Ok((200, _))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    loop {
        if started.elapsed() > limit {
            return Err(format!("the pool was not back to {pool} available within {limit:?}"));
        }
        let set = kubectl_json(serve.state.path(), &["get", "sandboxset", "-n", "default", "base"]);
        let available = set
            .as_ref()
            .and_then(|s| s["status"]["availableReplicas"].as_u64())
            .unwrap_or_default();
        if available as usize >= pool {
            return Ok(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn hold(shared: &Shared, clients: usize) {
    shared.hold.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + HANG_SLOW * 2;
    while shared.parked.load(Ordering::SeqCst) < clients && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn release(shared: &Shared) {
    shared.hold.store(false, Ordering::SeqCst);
}

/// One client: operations on its own sandboxes until told to stop.
fn client(shared: &Shared, seed: u64) {
    let mut rng = Rng(seed);
    let mut mine: Vec<String> = Vec::new();
    let mut counter = 0u64;
    loop {
        if shared.hold.load(Ordering::SeqCst) {
            shared.parked.fetch_add(1, Ordering::SeqCst);
            while shared.hold.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            shared.parked.fetch_sub(1, Ordering::SeqCst);
            if shared.stop.load(Ordering::SeqCst) {
                return;
            }
        }
        // Forget what is gone (or timed out).
        {
            let ledger = shared.ledger.lock().unwrap();
            mine.retain(|id| {
                ledger.get(id).is_some_and(|e| {
                    e.expect != Expect::Gone && e.expires.is_none_or(|t| Instant::now() < t)
                })
            });
        }
        let expect_of = |id: &str| shared.ledger.lock().unwrap().get(id).map(|e| e.expect);
        let roll = rng.below(100);
        if mine.len() < PER_CLIENT && (mine.is_empty() || roll < 30) {
            let short = rng.below(100) < 25;
            if let Some(id) = create(shared, short) {
                mine.push(id);
            }
            continue;
        }
        if mine.is_empty() {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let id = mine[rng.below(mine.len() as u64) as usize].clone();
        let Some(expect) = expect_of(&id) else { continue };
        let has_timeout =
            shared.ledger.lock().unwrap().get(&id).is_some_and(|e| e.expires.is_some());
        counter += 1;
        match (expect, rng.below(100)) {
            (Expect::Running, 0..40) => command(shared, &id, counter),
            (Expect::Running, 40..60) => kill(shared, &id),
            (Expect::Running, 60..85) if !has_timeout => pause(shared, &id),
            (Expect::Running, 85..100) if !has_timeout => set_timeout(shared, &id),
            (Expect::Paused, 0..70) => resume(shared, &id),
            (Expect::Paused, _) => kill(shared, &id),
            (Expect::Running, _) => command(shared, &id, counter),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Records a request's failure: a hang is a finding; an I/O error leaves the sandbox unknown.
fn failed(shared: &Shared, what: &str, id: Option<&str>, fail: Fail) {
    match fail {
        Fail::Hung => shared.finding(|f| f.hung.push(what.to_owned())),
        Fail::Io(_) => {}
    }
    if let Some(id) = id {
        set_expect(shared, id, Expect::Unknown);
    }
}

fn set_expect(shared: &Shared, id: &str, expect: Expect) {
    if let Some(entry) = shared.ledger.lock().unwrap().get_mut(id) {
        entry.expect = expect;
    }
}

/// A 404 to an operation on a sandbox the ledger says exists (and has not timed out).
fn unexpected_404(shared: &Shared, id: &str, op: &str) {
    let ledger = shared.ledger.lock().unwrap();
    let Some(entry) = ledger.get(id) else { return };
    let live = matches!(entry.expect, Expect::Running | Expect::Paused);
    let timed_out = entry.expires.is_some_and(|t| Instant::now() >= t);
    if live && !timed_out {
        let expect = entry.expect;
        drop(ledger);
        shared.finding(|f| {
            f.lost.push(format!("{op} {id}: 404 though the ledger says {expect:?}"));
        });
    }
    drop(shared.ledger.lock().map(|mut l| {
        if let Some(e) = l.get_mut(id) {
            e.expect = Expect::Unknown;
        }
    }));
}

/// The earliest moment the server may end a sandbox given [`SHORT_TIMEOUT`] by a request sent
/// at `sent`: it counts from when it handled the request, and its end times are whole seconds
/// (Kubernetes timestamps), so up to a second early. The check allows [`TIMEOUT_GRACE`] after
/// it before it must be gone.
fn earliest_end(sent: Instant) -> Instant {
    sent + Duration::from_secs(SHORT_TIMEOUT) - Duration::from_secs(1)
}

fn create(shared: &Shared, short: bool) -> Option<String> {
    let timeout = if short { SHORT_TIMEOUT } else { 3600 };
    let body = format!(
        r#"{{"templateID":"base","timeout":{timeout},"metadata":{{"e2b.agents.kruise.io/create-on-no-stock":"false"}}}}"#
    );
    let sent = Instant::now();
    let answer = api(shared, "POST", "/sandboxes", body.as_bytes(), HANG);
    let (status, body) = match answer {
        Ok(answer) => answer,
        Err(fail) => {
            failed(shared, "create", None, fail);
            return None;
        }
    };
    if status != 201 {
        // The pool is empty (503) or the server is starting: back off a little.
        std::thread::sleep(Duration::from_millis(100));
        return None;
    }
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let id = body["sandboxID"].as_str()?.to_owned();
    let token = body["envdAccessToken"].as_str().unwrap_or_default().to_owned();
    shared.ack("create");
    let mut ledger = shared.ledger.lock().unwrap();
    if ledger.contains_key(&id) {
        drop(ledger);
        shared.finding(|f| f.double.push(format!("create answered {id} a second time")));
        return None;
    }
    let expires = short.then(|| earliest_end(sent));
    ledger.insert(id.clone(), Entry { token, expect: Expect::Running, expires, maybe_ends: false });
    Some(id)
}

fn kill(shared: &Shared, id: &str) {
    let path = format!("/sandboxes/{id}");
    transition(shared, id, "kill", ("DELETE", &path, b""), HANG, 204, Expect::Gone);
}

fn pause(shared: &Shared, id: &str) {
    let path = format!("/sandboxes/{id}/pause");
    // 202 (still pausing), 409 (not pausable yet), 5xx: the next check observes it.
    transition(shared, id, "pause", ("POST", &path, b"{}"), HANG_SLOW, 204, Expect::Paused);
}

fn resume(shared: &Shared, id: &str) {
    let path = format!("/sandboxes/{id}/resume");
    let body = br#"{"timeout":3600}"#;
    transition(shared, id, "resume", ("POST", &path, body), HANG_SLOW, 201, Expect::Running);
}

/// One state-changing call on sandbox `id`: its `ok` answer makes the ledger expect `then`; a
/// 404 is an unexpected loss; any other answer leaves the state for the next check to observe.
fn transition(
    shared: &Shared,
    id: &str,
    what: &'static str,
    (method, path, body): (&str, &str, &[u8]),
    hang: Duration,
    ok: u16,
    then: Expect,
) {
    match api(shared, method, path, body, hang) {
        Ok((status, _)) if status == ok => {
            shared.ack(what);
            set_expect(shared, id, then);
        }
        Ok((404, _)) => unexpected_404(shared, id, what),
        Ok(_) => set_expect(shared, id, Expect::Unknown),
        Err(fail) => failed(shared, what, Some(id), fail),
    }
}

fn set_timeout(shared: &Shared, id: &str) {
    let body = format!(r#"{{"timeout":{SHORT_TIMEOUT}}}"#);
    let sent = Instant::now();
    match api(shared, "POST", &format!("/sandboxes/{id}/timeout"), body.as_bytes(), HANG) {
        Ok((status, _)) if (200..300).contains(&status) => {
            shared.ack("set timeout");
            let expires = earliest_end(sent);
            if let Some(e) = shared.ledger.lock().unwrap().get_mut(id) {
                e.expires = Some(expires);
                e.maybe_ends = false;
            }
        }
        Ok((404, _)) => unexpected_404(shared, id, "set timeout"),
        // Unknown whether the new end time was written: it may time out now.
        Ok(_) | Err(Fail::Io(_)) => {
            let mut ledger = shared.ledger.lock().unwrap();
            if let Some(e) = ledger.get_mut(id) {
                e.expect = Expect::Unknown;
                e.expires = Some(earliest_end(sent));
                e.maybe_ends = true;
            }
        }
        Err(Fail::Hung) => failed(shared, "set timeout", Some(id), Fail::Hung),
    }
}

/// `echo` through the gateway and envd; a wrong or missing answer with the server up is noted.
fn command(shared: &Shared, id: &str, n: u64) {
    use base64::Engine as _;
    let Some(token) = shared.ledger.lock().unwrap().get(id).map(|e| e.token.clone()) else {
        return;
    };
    let word = format!("chaos-{n}");
    let request = serde_json::json!({
        "process": {"cmd": "/bin/sh", "args": ["-c", format!("echo {word}")], "envs": {}},
        "stdin": false,
    })
    .to_string();
    let body = common::envelope(request.as_bytes());
    let headers = [
        ("E2b-Sandbox-Id", id),
        ("E2b-Sandbox-Port", common::ENVD_PORT),
        ("X-Access-Token", token.as_str()),
        ("Content-Type", "application/connect+json"),
        ("Connect-Protocol-Version", "1"),
    ];
    let answer = http(shared.gateway, "POST", "/process.Process/Start", &headers, &body, HANG);
    let outcome = match answer {
        Ok((200, payload)) => {
            let mut stdout = Vec::new();
            let mut rest = payload.as_slice();
            while rest.len() >= 5 {
                let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
                let Some(message) = rest.get(5..5 + len) else { break };
                let message: serde_json::Value =
                    serde_json::from_slice(message).unwrap_or_default();
                if let Some(data) = message["event"]["data"]["stdout"].as_str() {
                    stdout.extend(
                        base64::engine::general_purpose::STANDARD.decode(data).unwrap_or_default(),
                    );
                }
                rest = &rest[5 + len..];
            }
            if String::from_utf8_lossy(&stdout).trim() == word {
                shared.ack("command");
                return;
            }
            format!("stdout {:?}", String::from_utf8_lossy(&stdout))
        }
        Ok((status, body)) => format!("{status} {}", String::from_utf8_lossy(&body)),
        Err(Fail::Hung) => {
            shared.finding(|f| f.hung.push(format!("command in {id}")));
            return;
        }
        Err(Fail::Io(e)) => e,
    };
    let still_running = shared.ledger.lock().unwrap().get(id).is_some_and(|e| {
        e.expect == Expect::Running && e.expires.is_none_or(|t| Instant::now() < t)
    });
    if still_running && !shared.down.load(Ordering::SeqCst) {
        shared.finding(|f| f.command_failures.push(format!("{id}: {outcome}")));
    }
}

fn api(
    shared: &Shared,
    method: &str,
    path: &str,
    body: &[u8],
    bound: Duration,
) -> Result<(u16, Vec<u8>), Fail> {
    let headers = [("X-API-Key", shared.key.as_str()), ("Content-Type", "application/json")];
    http(shared.api, method, path, &headers, body, bound)
}

/// One request on its own connection (`Connection: close`): the status and the (de-chunked)
/// body, or why there was none.
fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    bound: Duration,
) -> Result<(u16, Vec<u8>), Fail> {
    let started = Instant::now();
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Fail::Hung,
        _ => Fail::Io(e.to_string()),
    };
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(io)?;
    stream.set_read_timeout(Some(bound)).map_err(io)?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).map_err(io)?;
    stream.write_all(body).map_err(io)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if started.elapsed() > bound {
            return Err(Fail::Hung);
        }
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => return Err(io(e)),
        }
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| Fail::Io("no complete answer".into()))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Fail::Io(format!("bad status line {head:?}")))?;
    let mut rest = &raw[split + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Ok((status, rest.to_vec()));
    }
    let mut out = Vec::new();
    loop {
        let end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| Fail::Io("truncated chunked body".into()))?;
        let size_text = String::from_utf8_lossy(&rest[..end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("0").trim(), 16)
            .map_err(|_| Fail::Io("bad chunk size".into()))?;
        if size == 0 {
            break;
        }
        let chunk =
            rest.get(end + 2..end + 2 + size).ok_or_else(|| Fail::Io("truncated chunk".into()))?;
        out.extend_from_slice(chunk);
        rest = rest.get(end + 4 + size..).unwrap_or_default();
    }
    Ok((status, out))
}

/// `kubectl <args> -o json` against the server's Kubernetes API; `None` on any failure.
fn kubectl_json(state: &Path, args: &[&str]) -> Option<serde_json::Value> {
    let out = Command::new(support::kubectl_binary())
        .arg("--kubeconfig")
        .arg(state.join("kubeconfig"))
        .arg("--request-timeout=20s")
        .args(args)
        .args(["-o", "json"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
}

/// What the ledger check found in one pass.
#[derive(Default)]
struct Pass {
    lost: Vec<String>,
    double: Vec<String>,
    leaked: Vec<String>,
    orphaned: Vec<String>,
}

impl Pass {
    fn clean(&self) -> bool {
        self.lost.is_empty()
            && self.double.is_empty()
            && self.leaked.is_empty()
            && self.orphaned.is_empty()
    }
}

/// Checks the ledger and the runtime against the store, polling up to [`SETTLE`] for
/// asynchronous work; records what is still wrong then, and resolves unknown entries.
fn check(serve: &OkaServe, shared: &Shared, when: &str) {
    let deadline = Instant::now() + SETTLE;
    let pass = loop {
        let pass = check_once(serve, shared, false);
        if pass.clean() || Instant::now() >= deadline {
            break pass;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    // Resolve the unknowns from what is observed now.
    check_once(serve, shared, true);
    let tag =
        |items: Vec<String>| items.into_iter().map(|i| format!("{when}: {i}")).collect::<Vec<_>>();
    let Pass { lost, double, leaked, orphaned } = pass;
    shared.finding(|f| {
        f.lost.extend(tag(lost));
        f.double.extend(tag(double));
        f.leaked.extend(tag(leaked));
        f.orphaned.extend(tag(orphaned));
    });
}

fn check_once(serve: &OkaServe, shared: &Shared, resolve: bool) -> Pass {
    let mut pass = Pass::default();
    let entries: Vec<(String, Expect, Option<Instant>, bool)> = shared
        .ledger
        .lock()
        .unwrap()
        .iter()
        .map(|(id, e)| (id.clone(), e.expect, e.expires, e.maybe_ends))
        .collect();
    // The Sandbox objects, by public ID and by runtime ID.
    let Some(list) = kubectl_json(serve.state.path(), &["get", "sandboxes", "-A"]) else {
        pass.lost.push("kubectl get sandboxes failed".into());
        return pass;
    };
    let objects: Vec<oka_api::Sandbox> = list["items"]
        .as_array()
        .map(|items| items.iter().filter_map(|i| serde_json::from_value(i.clone()).ok()).collect())
        .unwrap_or_default();
    let mut by_public: HashMap<String, Vec<&oka_api::Sandbox>> = HashMap::new();
    for object in &objects {
        by_public.entry(oka_api::public_id::of(object)).or_default().push(object);
    }
    let mut observed_alive = Vec::new();
    for (id, expect, expires, maybe_ends) in entries {
        let answer = http(
            shared.api,
            "GET",
            &format!("/sandboxes/{id}"),
            &[("X-API-Key", &shared.key)],
            b"",
            HANG,
        );
        let observed = match answer {
            Ok((200, body)) => {
                let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                match body["state"].as_str() {
                    Some("paused") => Expect::Paused,
                    Some("running") => Expect::Running,
                    other => {
                        pass.lost.push(format!("{id}: state {other:?}"));
                        continue;
                    }
                }
            }
            Ok((404, _)) => Expect::Gone,
            Ok((status, body)) => {
                pass.lost
                    .push(format!("GET {id}: {status} {}", String::from_utf8_lossy(&body).trim()));
                continue;
            }
            Err(fail) => {
                if matches!(fail, Fail::Hung) {
                    shared.finding(|f| f.hung.push(format!("GET {id}")));
                }
                pass.lost.push(format!("GET {id}: {fail:?}"));
                continue;
            }
        };
        if observed != Expect::Gone {
            observed_alive.push(id.clone());
        }
        let now = Instant::now();
        let expected = match expires {
            // A timeout whose request got no answer may or may not have been set.
            Some(t) if maybe_ends && now >= t => Expect::Unknown,
            Some(t) if now >= t + TIMEOUT_GRACE => Expect::Gone,
            // Around its timeout either is right.
            Some(t) if now >= t => Expect::Unknown,
            _ => expect,
        };
        if expected != Expect::Unknown && observed != expected {
            let why = match expires {
                Some(t) if now >= t => format!(" (timed out {:?} ago)", now - t),
                _ => String::new(),
            };
            pass.lost.push(format!("{id}: acknowledged {expected:?}{why}, observed {observed:?}"));
        }
        if resolve && expect == Expect::Unknown {
            set_expect(shared, &id, observed);
        }
    }
    // Handed out twice: one public ID on two objects, or two IDs on one object.
    let mut uids: HashMap<String, String> = HashMap::new();
    for id in &observed_alive {
        let owners = by_public.get(id).map_or(&[][..], |v| v.as_slice());
        if owners.len() > 1 {
            pass.double.push(format!("{id} names {} Sandbox objects", owners.len()));
        }
        for owner in owners {
            let uid = owner.metadata.uid.clone().unwrap_or_default();
            if let Some(other) = uids.insert(uid.clone(), id.clone()) {
                pass.double.push(format!("{id} and {other} are one Sandbox ({uid})"));
            }
        }
    }
    // Runtime against store.
    let known: HashMap<String, &oka_api::Sandbox> = objects
        .iter()
        .filter_map(|o| oka_api::runtime_id::runtime_id(o).ok().map(|id| (id, o)))
        .collect();
    let instances = runtime_instances(serve.state.path());
    for (id, alive) in &instances {
        if !known.contains_key(id) {
            let process = if *alive { "a live process" } else { "no process" };
            pass.leaked.push(format!("runtime instance {id} ({process}) has no Sandbox"));
        }
    }
    for (runtime_id, object) in &known {
        let deleting = object.metadata.deletion_timestamp.is_some();
        let running = object.status.as_ref().and_then(|s| s.phase.as_ref())
            == Some(&oka_api::SandboxPhase::Running);
        if running && !deleting && instances.get(runtime_id) != Some(&true) {
            let what =
                if instances.contains_key(runtime_id) { "a dead instance" } else { "no instance" };
            pass.orphaned.push(format!(
                "Sandbox {} is Running with {what}",
                object.metadata.name.as_deref().unwrap_or_default()
            ));
        }
    }
    pass
}

/// The local runtime's instances recorded under the state directory, and whether each has a
/// live process.
fn runtime_instances(state: &Path) -> HashMap<String, bool> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir(state.join("runtime/sandboxes")) else { return out };
    for entry in dir.flatten() {
        let id = entry.file_name().to_string_lossy().into_owned();
        let record: serde_json::Value = std::fs::read(entry.path().join("state.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let alive = record["instance"]["pid"]
            .as_i64()
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        out.insert(id, alive);
    }
    out
}

/// What the corruption case found.
struct Corruption {
    detected: bool,
    how: String,
}

/// Starts `oka serve` on a copy of the (stopped) store with one byte flipped in the middle of
/// the file; when that is not detected, on a copy with a byte flipped inside a stored object
/// (a Sandbox's name). Detected: it exits non-zero within 30 s, its log naming the store file.
fn corruption_case(state: &Path, envd: &Path) -> Corruption {
    let store = std::fs::read(state.join("store.redb")).unwrap();
    let middle = store.len() / 2;
    let mut first = store.clone();
    first[middle] ^= 0xFF;
    let (detected, log) = start_on_store(&first, envd);
    if detected {
        return Corruption {
            detected: true,
            how: format!("byte {middle} of {} flipped: {}", store.len(), first_error_line(&log)),
        };
    }
    let needle = b"SandboxSet";
    let at = store.windows(needle.len()).position(|w| w == needle);
    let Some(at) = at else {
        return Corruption {
            detected: false,
            how: format!("byte {middle} flipped, not detected; no object found to flip"),
        };
    };
    let mut second = store;
    second[at + 3] ^= 0x01;
    let (detected, log2) = start_on_store(&second, envd);
    Corruption {
        detected,
        how: format!(
            "byte {middle} (middle) flipped: {}; byte {} (inside a stored SandboxSet) flipped: {}",
            if log.is_empty() {
                "not detected, it started".to_owned()
            } else {
                first_error_line(&log)
            },
            at + 3,
            if log2.is_empty() {
                "not detected, it started".to_owned()
            } else {
                first_error_line(&log2)
            }
        ),
    }
}

fn first_error_line(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    // A panic (redb may panic on a file corrupted outside it): its location and message.
    if let Some(at) = lines.iter().position(|l| l.contains("panicked at")) {
        let message = lines.get(at + 1).copied().unwrap_or_default();
        return format!("crashed: {} {}", lines[at].trim(), message.trim());
    }
    lines
        .iter()
        .rev()
        .find(|l| l.to_ascii_lowercase().contains("error") || l.contains("store.redb"))
        .map_or_else(|| "(no error line)".to_owned(), |l| l.trim().to_owned())
}

/// Runs `oka serve` on a fresh state directory holding `store`; whether it refused (non-zero
/// exit naming the store file), and its log when it exited.
fn start_on_store(store: &[u8], envd: &Path) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let state: PathBuf = dir.path().to_owned();
    std::fs::write(state.join("store.redb"), store).unwrap();
    let config = format!(
        "defaultPool:\n  replicas: 1\ncodeInterpreterPool:\n  enabled: false\nlog:\n  filter: warn\n{}\
         api:\n  listen: 127.0.0.1:0\ngateway:\n  listen: 127.0.0.1:0\nkubeApi:\n  listen: 127.0.0.1:0\n",
        support::templates_config()
    );
    std::fs::write(state.join("config.yaml"), config).unwrap();
    let log_path = state.join("serve.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(oka())
        .arg("serve")
        .arg("--state-dir")
        .arg(&state)
        .arg("--config")
        .arg(state.join("config.yaml"))
        .env("NO_COLOR", "1")
        .env("OKA_ENVD", envd)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    support::remove_sandboxes(&state, &oka());
    match status {
        Some(status) if !status.success() => (log.contains("store.redb"), log),
        Some(_) => (false, log),
        None => (false, String::new()),
    }
}

/// Prints the table and what was found; whether every figure that must be 0 is.
fn report(
    seed: u64,
    shared: &Shared,
    converged: &[Duration],
    rounds: usize,
    corruption: &Corruption,
    serve: &OkaServe,
) -> bool {
    let findings = shared.findings.lock().unwrap();
    let acked = shared.acked.lock().unwrap();
    let ops: Vec<String> = acked.iter().map(|(op, n)| format!("{op} {n}")).collect();
    println!();
    println!("Chaos: {rounds} kill -9 of oka serve under load, restarted on the same state dir");
    println!("operations acknowledged: {}", ops.join(", "));
    println!("| figure | value |");
    println!("|---|---|");
    println!("| acknowledged writes lost | {} |", findings.lost.len());
    println!("| sandboxes handed out twice | {} |", findings.double.len());
    println!("| runtime instances leaked (no Sandbox) | {} |", findings.leaked.len());
    println!("| Sandboxes Running without an instance | {} |", findings.orphaned.len());
    println!("| requests that hung (> 30 s; pause, resume > 60 s) | {} |", findings.hung.len());
    println!("| restarts refused (oka serve exited at start) | {} |", findings.refused.len());
    println!("| restarts that did not converge (120 s) | {} |", findings.not_converged.len());
    println!(
        "| converge after restart p50 / p99 (API answers, pool back to its replicas) | {} / {} |",
        fmt(percentile(converged, 50.0)),
        fmt(percentile(converged, 99.0))
    );
    println!("| store corruption detected | {} |", if corruption.detected { "yes" } else { "no" });
    println!("corruption case: {}", corruption.how);
    println!(
        "commands that failed on a sandbox the ledger says runs, the server up (informational): {}",
        findings.command_failures.len()
    );
    for failure in findings.command_failures.iter().take(10) {
        println!("  {failure}");
    }
    let mut bad = false;
    for (name, items) in [
        ("lost", &findings.lost),
        ("handed out twice", &findings.double),
        ("leaked", &findings.leaked),
        ("orphaned", &findings.orphaned),
        ("hung", &findings.hung),
        ("restart refused", &findings.refused),
        ("not converged", &findings.not_converged),
    ] {
        for item in items {
            bad = true;
            println!("{name}: {item}");
        }
    }
    if !corruption.detected {
        bad = true;
    }
    let kept = std::env::temp_dir().join(format!("oka-chaos-{seed}.log"));
    let _ = std::fs::write(&kept, serve.log());
    println!("oka serve's log is kept in {}", kept.display());
    if bad {
        println!("FAILED");
    }
    !bad
}
