//! The agent runtime daemon (`oka-envd`) as PID 1 of local sandboxes: the init hands over to it,
//! and it serves the E2B process API on port 49983 while it reaps, forwards SIGTERM and exits
//! with the command's status.
//!
//! The daemon binary is cargo's `oka-envd`, beside this package's `oka-init` in the target
//! directory (`cargo nextest run -p oka-runtime -p oka-envd`, or the whole workspace, builds
//! both). These run real sandboxes and need root; they print a SKIPPED line otherwise.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use oka_runtime::local::LocalRuntime;
use oka_runtime_api::{ExitInfo, Runtime, SandboxId, SandboxState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ENVD_PORT: u16 = 49983;

/// The `oka-envd` binary: `$OKA_ENVD` (to measure a release build), else the one cargo built
/// beside `oka-init`.
fn envd_binary() -> PathBuf {
    if let Some(path) = std::env::var_os(oka_runtime::local::LocalConfig::ENVD_ENV) {
        return path.into();
    }
    let path = PathBuf::from(env!("CARGO_BIN_EXE_oka-init")).with_file_name("oka-envd");
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build -p oka-envd` (or run the tests with `-p oka-envd` too)",
        path.display()
    );
    path
}

async fn envd_runtime(name: &str) -> (LocalRuntime, tempfile::TempDir) {
    let dir = tempfile::Builder::new().prefix("oka-rt-").tempdir().unwrap();
    let mut config = config(dir.path().join("state"), name);
    config.envd_binary = Some(envd_binary());
    (LocalRuntime::open(config).await.unwrap(), dir)
}

/// One HTTP/1.1 request to the daemon; returns the status and the (de-chunked) body. `stop_at`
/// ends reading early once the body contains it (the connection is then dropped).
async fn request(
    rt: &LocalRuntime,
    id: &SandboxId,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
    stop_at: Option<&str>,
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut stream = rt.connect(id, ENVD_PORT).await.map_err(std::io::Error::other)?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: sandbox\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let read = async {
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
            if let Some(marker) = stop_at
                && String::from_utf8_lossy(&raw).contains(marker)
            {
                break;
            }
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .map_err(|_| std::io::Error::other("read timed out"))??;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| {
        std::io::Error::other(format!("no header end in {:?}", String::from_utf8_lossy(&raw)))
    })?;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut rest = &raw[split + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Ok((status, rest.to_vec()));
    }
    let mut body = Vec::new();
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let len = usize::from_str_radix(String::from_utf8_lossy(&rest[..eol]).trim(), 16)
            .map_err(std::io::Error::other)?;
        if len == 0 {
            break;
        }
        let chunk = rest.get(eol + 2..eol + 2 + len).unwrap_or(&rest[(eol + 2).min(rest.len())..]);
        body.extend_from_slice(chunk);
        rest = rest.get(eol + 4 + len..).unwrap_or(&[]);
    }
    Ok((status, body))
}

/// The Connect envelopes of a streaming answer, as JSON.
fn envelopes(mut body: &[u8]) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    while body.len() >= 5 {
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        let Some(payload) = body.get(5..5 + len) else { break };
        out.push(serde_json::from_slice(payload).unwrap());
        body = &body[5 + len..];
    }
    out
}

fn envelope(json: &serde_json::Value) -> Vec<u8> {
    let payload = serde_json::to_vec(json).unwrap();
    let mut out = vec![0u8];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    out
}

fn base64_decode(s: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c).unwrap() as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// Runs `sh -c script` through the daemon's `process.Process/Start` as its default user; returns
/// stdout and the exit code.
async fn run(rt: &LocalRuntime, id: &SandboxId, script: &str) -> (String, i64) {
    let req = serde_json::json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}});
    let (status, body) = request(
        rt,
        id,
        "POST",
        "/process.Process/Start",
        "application/connect+json",
        &envelope(&req),
        None,
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let mut stdout = Vec::new();
    let mut code = None;
    for e in envelopes(&body) {
        if let Some(data) = e["event"]["data"]["stdout"].as_str() {
            stdout.extend(base64_decode(data));
        }
        if let Some(end) = e["event"].get("end") {
            code = Some(end["exitCode"].as_i64().unwrap_or(0));
        }
    }
    let code = code.unwrap_or_else(|| panic!("no end event in {:?}", envelopes(&body)));
    (String::from_utf8(stdout).unwrap(), code)
}

/// Starts `sh -c script` through the daemon in the background with `tag`, as the default user or
/// as root; returns its pid once started (the stream is then dropped; the process runs on).
async fn start_background(
    rt: &LocalRuntime,
    id: &SandboxId,
    tag: &str,
    script: &str,
    as_root: bool,
) -> u64 {
    let req = serde_json::json!({
        "process": {"cmd": "/bin/sh", "args": ["-c", script]},
        "tag": tag,
    });
    let body = envelope(&req);
    // Basic auth `root:` selects the user.
    let content_type = if as_root {
        "application/connect+json\r\nAuthorization: Basic cm9vdDo="
    } else {
        "application/connect+json"
    };
    let (status, body) =
        request(rt, id, "POST", "/process.Process/Start", content_type, &body, Some("\"pid\""))
            .await
            .unwrap();
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&body);
    let at = text.find("\"pid\":").unwrap() + 6;
    text[at..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap()
}

/// `process.Process/List`: `(pid, tag)` of the running processes.
async fn list(rt: &LocalRuntime, id: &SandboxId) -> Vec<(u64, String)> {
    let (status, body) =
        request(rt, id, "POST", "/process.Process/List", "application/json", b"{}", None)
            .await
            .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    v["processes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    let pid = p["pid"].as_u64().unwrap_or(0);
                    (pid, p["tag"].as_str().unwrap_or_default().to_owned())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until the daemon answers `/health`.
async fn wait_for_envd(rt: &LocalRuntime, id: &SandboxId) {
    poll("envd to answer /health", Duration::from_secs(20), || async {
        let r = request(rt, id, "GET", "/health", "text/plain", b"", None).await.ok()?;
        (r.0 / 100 == 2).then_some(())
    })
    .await;
}

/// `(state, ppid)` of every process on the host whose parent is `parent`.
fn children_of(parent: u32) -> Vec<(u32, char, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(close) = stat.rfind(')') else { continue };
        let comm = stat[stat.find('(').unwrap_or(0) + 1..close].to_owned();
        let mut f = stat[close + 1..].split_whitespace();
        let state = f.next().and_then(|s| s.chars().next()).unwrap_or('?');
        if f.next().and_then(|p| p.parse::<u32>().ok()) == Some(parent) {
            out.push((pid, state, comm));
        }
    }
    out
}

fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envd_is_pid_1_and_runs_processes_as_user_in_home() {
    if !root_or_skip("envd_is_pid_1_and_runs_processes_as_user_in_home") {
        return;
    }
    let (rt, _dir) = envd_runtime("envd-pid1").await;
    let spec = sh("envd-pid1", "echo started; exec sleep 1000");
    let t0 = std::time::Instant::now();
    let status = rt.ensure(&spec).await.unwrap();
    let ready = t0.elapsed();
    let pid = status.pid.unwrap();
    wait_for_envd(&rt, &spec.id).await;
    eprintln!("create -> ready {ready:?}, -> envd answers /health {:?}", t0.elapsed());
    // Idle resident memory of the daemon as PID 1 (the figure `docs/benchmarks.md` reports).
    let rss = vm_rss_kib(pid);
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let anon = rollup.lines().find(|l| l.starts_with("Anonymous:")).unwrap_or("Anonymous: ?");
    eprintln!("oka-envd as PID 1, idle: VmRSS {rss} KiB ({anon} of it private)");
    assert!(rss < 16 * 1024, "envd as PID 1 uses {rss} KiB");

    let (cmdline, code) = run(&rt, &spec.id, "tr '\\0' ' ' < /proc/1/cmdline").await;
    assert_eq!(code, 0);
    assert!(cmdline.starts_with("oka-envd --init "), "{cmdline:?}");
    let host_cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(host_cmdline.starts_with("oka-envd\0--init\0"), "{host_cmdline:?}");

    let (who, code) = run(&rt, &spec.id, "id -un; id -u; pwd; echo $HOME").await;
    assert_eq!((who.as_str(), code), ("user\n1000\n/home/user\n/home/user\n", 0));
    let (_, code) = run(&rt, &spec.id, "exit 7").await;
    assert_eq!(code, 7);
    // Processes of the daemon are not protected from the OOM killer as PID 1 is.
    let (score, _) = run(&rt, &spec.id, "cat /proc/self/oom_score_adj").await;
    assert_eq!(score.trim(), "0");

    // The daemon's own output goes to pipes the runtime holds; the command's goes through it.
    let stdout = std::fs::read_link(format!("/proc/{pid}/fd/1")).unwrap();
    assert!(stdout.to_string_lossy().starts_with("pipe:["), "{stdout:?}");
    let ours = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == stdout));
    assert!(ours, "nobody in the runtime holds {stdout:?}");
    let sleep = children_of(pid).into_iter().find(|(_, _, comm)| comm == "sleep").unwrap();
    let command_stdout = std::fs::read_link(format!("/proc/{}/fd/1", sleep.0)).unwrap();
    assert!(command_stdout.to_string_lossy().starts_with("pipe:["));
    assert_ne!(command_stdout, stdout, "the command writes to the daemon, which relays");
    eprintln!("oka-envd as PID 1, after 4 processes: VmRSS {} KiB", vm_rss_kib(pid));
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envd_as_pid_1_reaps_orphans() {
    if !root_or_skip("envd_as_pid_1_reaps_orphans") {
        return;
    }
    let (rt, _dir) = envd_runtime("envd-reap").await;
    // The command leaves orphans behind too.
    let spec = sh("envd-reap", "for i in 1 2 3; do (sleep 0.05 &); done; exec sleep 1000");
    let pid = rt.ensure(&spec).await.unwrap().pid.unwrap();
    wait_for_envd(&rt, &spec.id).await;
    let (_, code) = run(&rt, &spec.id, "for i in 1 2 3 4 5; do sleep 0.05 & done; exit 0").await;
    assert_eq!(code, 0);
    let (_, code) = run(&rt, &spec.id, "sh -c 'sleep 0.05 &'; (exit 3) & wait").await;
    assert_eq!(code, 0);
    poll("the orphans to be reaped", Duration::from_secs(10), || async {
        let children = children_of(pid);
        let zombies_or_sleepers =
            children.iter().filter(|(_, state, comm)| *state == 'Z' || comm == "sleep").count();
        // Only the command (`sleep 1000`) is left, and no zombie.
        (zombies_or_sleepers == 1 && children.len() == 1).then_some(())
    })
    .await;
    // The daemon still runs processes and sees their exits.
    assert_eq!(run(&rt, &spec.id, "exit 5").await.1, 5);
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Running);
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_forwards_sigterm_through_envd_to_the_command_and_its_processes() {
    if !root_or_skip("stop_forwards_sigterm_through_envd_to_the_command_and_its_processes") {
        return;
    }
    let (rt, _dir) = envd_runtime("envd-term").await;
    // The command waits on SIGTERM until the daemon's background process got it too.
    let script = "trap 'while [ ! -e /home/user/bg-term ]; do sleep 0.01; done; echo terminated > /root/term; exit 0' TERM; \
                  echo up > /root/up; while :; do sleep 0.05; done";
    let spec = sh("envd-term", script);
    rt.ensure(&spec).await.unwrap();
    wait_for_file(&rt, &spec.id, "/root/up", "up").await;
    wait_for_envd(&rt, &spec.id).await;
    // Written under another name and renamed, so the command never sees a file not yet filled.
    let bg = "trap 'echo got > /home/user/bg-term.new; mv /home/user/bg-term.new /home/user/bg-term; exit 0' TERM; echo ready > /home/user/bg-up; while :; do sleep 0.05; done";
    start_background(&rt, &spec.id, "bg", bg, false).await;
    wait_for_file(&rt, &spec.id, "/home/user/bg-up", "ready").await;
    rt.stop(&spec.id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(read_upper(&rt, &spec.id, "/root/term").await.as_deref(), Some("terminated\n"));
    assert_eq!(read_upper(&rt, &spec.id, "/home/user/bg-term").await.as_deref(), Some("got\n"));
    assert_eq!(rt.inspect(&spec.id).await.unwrap().last_exit, Some(ExitInfo::Code(0)));

    // Started again, the command runs under a fresh daemon.
    rt.ensure(&spec).await.unwrap();
    wait_for_envd(&rt, &spec.id).await;
    assert_eq!(run(&rt, &spec.id, "true").await.1, 0);
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_envd_the_command_exit_ends_the_sandbox_with_its_code() {
    if !root_or_skip("with_envd_the_command_exit_ends_the_sandbox_with_its_code") {
        return;
    }
    let (rt, _dir) = envd_runtime("envd-exit").await;
    let spec = sh("envd-exit", "echo bye > /root/bye; exit 3");
    rt.ensure(&spec).await.unwrap();
    let status = poll("sandbox to stop", Duration::from_secs(10), || async {
        rt.inspect(&spec.id).await.ok().filter(|s| s.state == SandboxState::Stopped)
    })
    .await;
    assert_eq!(status.last_exit, Some(ExitInfo::Code(3)));
    assert_eq!(read_upper(&rt, &spec.id, "/root/bye").await.as_deref(), Some("bye\n"));

    // A missing program still fails the create, before anything is handed over.
    let mut spec = sh("envd-missing", "unused");
    spec.process.command = vec!["no-such-program".into()];
    let err = rt.ensure(&spec).await.unwrap_err();
    assert!(err.to_string().contains("no-such-program"), "{err}");
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Gone);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envd_as_pid_1_hibernates_and_restores_with_its_processes() {
    if !root_or_skip("envd_as_pid_1_hibernates_and_restores_with_its_processes") {
        return;
    }
    let (rt, _dir) = envd_runtime("envd-criu").await;
    let spec = sh("envd-criu", "exec sleep 1000");
    rt.ensure(&spec).await.unwrap();
    wait_for_envd(&rt, &spec.id).await;
    // As root: CRIU reads every process's rlimits with prlimit(2), which for a process of another
    // uid needs CAP_SYS_RESOURCE, which some hosts (containers, our CI machine) withhold.
    let script = "echo kept > /home/user/kept; exec sleep 1000";
    let bg = start_background(&rt, &spec.id, "keeper", script, true).await;
    wait_for_file(&rt, &spec.id, "/home/user/kept", "kept").await;
    assert!(list(&rt, &spec.id).await.contains(&(bg, "keeper".to_owned())));

    rt.hibernate(&spec.id).await.unwrap();
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Hibernated);
    let restored = rt.restore(&spec.id).await.unwrap();
    assert_eq!(restored.state, SandboxState::Running);
    wait_for_envd(&rt, &spec.id).await;
    assert!(list(&rt, &spec.id).await.contains(&(bg, "keeper".to_owned())));
    let (out, code) = run(&rt, &spec.id, "echo after; cat /home/user/kept").await;
    assert_eq!((out.as_str(), code), ("after\nkept\n", 0));

    // Twice, and stop still ends it through the restored daemon.
    rt.hibernate(&spec.id).await.unwrap();
    rt.restore(&spec.id).await.unwrap();
    wait_for_envd(&rt, &spec.id).await;
    assert_eq!(run(&rt, &spec.id, "exit 4").await.1, 4);
    rt.stop(&spec.id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Stopped);
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_binary_that_cannot_run_fails_the_create_and_leaves_nothing_behind() {
    if !root_or_skip("a_daemon_binary_that_cannot_run_fails_the_create_and_leaves_nothing_behind") {
        return;
    }
    let dir = tempfile::Builder::new().prefix("oka-rt-").tempdir().unwrap();
    let not_executable = dir.path().join("oka-envd");
    std::fs::write(&not_executable, "not a program").unwrap();
    let mut config = config(dir.path().join("state"), "envd-broken");
    config.envd_binary = Some(not_executable);
    let rt = LocalRuntime::open(config).await.unwrap();
    let spec = sh("envd-broken", "exec sleep 1000");
    let err = rt.ensure(&spec).await.unwrap_err();
    assert!(err.to_string().contains("find envd"), "{err}");
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Gone);
    let sandboxes = dir.path().join("state/sandboxes");
    assert_eq!(std::fs::read_dir(&sandboxes).unwrap().count(), 0, "no sandbox directory left");
}

/// The helper side of the re-adoption test, run in a child process (this test binary executed
/// again with `OKA_ENVD_READOPT_STATE` set): opens a runtime with envd, starts a sandbox whose
/// command writes to stdout all the time, prints `READY <pid>` and waits to be killed. Without
/// the variable it does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envd_readoption_helper() {
    let Ok(state) = std::env::var("OKA_ENVD_READOPT_STATE") else { return };
    let mut config = config(state.into(), "envd-readopt");
    config.envd_binary = Some(envd_binary());
    let rt = LocalRuntime::open(config).await.unwrap();
    let spec = sh("envd-chatty", "while :; do echo tick; sleep 0.01; done");
    let status = rt.ensure(&spec).await.unwrap();
    wait_for_envd(&rt, &spec.id).await;
    println!("READY {}", status.pid.unwrap());
    std::future::pending::<()>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envd_outlives_a_killed_runtime_and_its_broken_output_pipes() {
    if !root_or_skip("envd_outlives_a_killed_runtime_and_its_broken_output_pipes") {
        return;
    }
    // Orphaned sandbox inits come to us, not to the host's slow PID 1.
    oka_runtime::local::become_subreaper().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut helper = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "envd_readoption_helper", "--nocapture", "--test-threads", "1"])
        .env("OKA_ENVD_READOPT_STATE", &state)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(helper.stdout.take().unwrap()));
    let pid: u32 = loop {
        let line = lines.next().expect("helper ended before READY").unwrap();
        if let Some((_, pid)) = line.split_once("READY ") {
            break pid.trim().parse().unwrap();
        }
    };
    helper.kill().unwrap(); // SIGKILL: the read ends of the daemon's stdout and stderr close.
    helper.wait().unwrap();

    let mut config = config(state.clone(), "envd-readopt");
    config.envd_binary = Some(envd_binary());
    let rt = LocalRuntime::open(config).await.unwrap();
    let id = id_of("envd-chatty");
    assert_eq!(rt.inspect(&id).await.unwrap().pid, Some(pid), "the same daemon, re-adopted");
    wait_for_envd(&rt, &id).await;
    // The command goes on writing into the daemon, which drops what nobody reads.
    for _ in 0..5 {
        assert_eq!(run(&rt, &id, "sleep 0.05; echo ok").await, ("ok\n".to_owned(), 0));
    }
    let status = rt.inspect(&id).await.unwrap();
    assert_eq!((status.state, status.pid), (SandboxState::Running, Some(pid)));
    assert!(children_of(pid).iter().any(|(_, state, _)| *state != 'Z'), "the command runs");
    rt.delete(&id).await.unwrap();
    assert_eq!(std::fs::read_dir(state.join("sandboxes")).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_command_the_daemon_is_the_sandbox_alone() {
    if !root_or_skip("without_a_command_the_daemon_is_the_sandbox_alone") {
        return;
    }
    let (rt, _dir) = envd_runtime("envd-alone").await;
    let mut spec = sh("envd-alone", "unused");
    spec.process.command.clear();
    spec.process.args.clear();
    let pid = rt.ensure(&spec).await.unwrap().pid.unwrap();
    wait_for_envd(&rt, &spec.id).await;
    let host_cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(host_cmdline.starts_with("oka-envd\0--init\0"), "{host_cmdline:?}");
    assert!(!host_cmdline.contains("--command-pid"), "{host_cmdline:?}");
    assert_eq!(children_of(pid), vec![], "PID 1 has no child before the API starts one");
    let (out, code) = run(&rt, &spec.id, "echo hi; id -un").await;
    assert_eq!((out.as_str(), code), ("hi\nuser\n", 0));
    // A background process survives a hibernation, as with a command.
    let bg = start_background(&rt, &spec.id, "keeper", "exec sleep 1000", true).await;
    rt.hibernate(&spec.id).await.unwrap();
    rt.restore(&spec.id).await.unwrap();
    wait_for_envd(&rt, &spec.id).await;
    assert!(list(&rt, &spec.id).await.contains(&(bg, "keeper".to_owned())));
    // SIGTERM ends the daemon, and with it the sandbox, cleanly.
    rt.stop(&spec.id, Duration::from_secs(10)).await.unwrap();
    let status = rt.inspect(&spec.id).await.unwrap();
    assert_eq!((status.state, status.last_exit), (SandboxState::Stopped, Some(ExitInfo::Code(0))));
    rt.delete(&spec.id).await.unwrap();

    // A runtime without the daemon has nothing to run instead: refused, nothing left behind.
    let dir = tempfile::Builder::new().prefix("oka-rt-").tempdir().unwrap();
    let plain = LocalRuntime::open(config(dir.path().join("state"), "envd-none")).await.unwrap();
    let err = plain.ensure(&spec).await.unwrap_err();
    assert!(
        matches!(
            err,
            oka_runtime_api::RuntimeError::InvalidSpec(oka_runtime_api::SpecError::EmptyCommand)
        ),
        "{err}"
    );
    assert_eq!(plain.inspect(&spec.id).await.unwrap().state, SandboxState::Gone);
    let sandboxes = dir.path().join("state/sandboxes");
    let left = std::fs::read_dir(&sandboxes).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "no sandbox directory left");
}

/// A sandbox root with no C library at all (as a `scratch` image has): directories, a `passwd`
/// with the default user, nothing to execute.
fn root_without_a_c_library(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    for d in ["dev", "proc", "tmp", "etc", "home/user"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::fs::set_permissions(dir.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::os::unix::fs::chown(dir.join("home/user"), Some(1000), Some(1000)).unwrap();
    std::fs::write(
        dir.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n",
    )
    .unwrap();
}

/// The static builds of `scripts/build-static.sh --debug`, which `scripts/test.sh` makes and
/// names in `$OKA_TEST_STATIC_DIR`; `None` (the case is skipped) when they were not built.
fn static_binaries() -> Option<(PathBuf, PathBuf)> {
    let dir = PathBuf::from(std::env::var_os("OKA_TEST_STATIC_DIR")?);
    Some((dir.join("oka-init"), dir.join("oka-envd")))
}

#[tokio::test]
async fn a_root_without_a_c_library_needs_static_builds_and_says_so() {
    if !root_or_skip("a_root_without_a_c_library_needs_static_builds_and_says_so") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    root_without_a_c_library(root.path());
    let spec = |id: &str| {
        let mut spec = oka_runtime_api::SandboxSpec::new(id_of(id), vec![]);
        spec.root = oka_runtime_api::RootFs::Directory(root.path().to_owned());
        spec
    };
    let open = |name: &str, init: PathBuf, envd: PathBuf| {
        let dir = tempfile::Builder::new().prefix("oka-rt-").tempdir().unwrap();
        let mut config = config(dir.path().join("state"), name);
        config.init_binary = init;
        config.envd_binary = Some(envd);
        async move { (LocalRuntime::open(config).await.unwrap(), dir) }
    };

    // The builds cargo made for the tests are dynamically linked: the init cannot start there,
    // and the error names the missing loader and the remedy (it used to be a bare "No such file
    // or directory" for /.oka/init, which is there).
    let (rt, _state) = open("nolibc-dyn", init_binary(), envd_binary()).await;
    let err = rt.ensure(&spec("nolibc-dyn")).await.unwrap_err().to_string();
    assert!(err.contains("dynamic loader") && err.contains("static builds"), "{err}");
    rt.remove_cgroups();

    let Some((static_init, static_envd)) = static_binaries() else {
        eprintln!(
            "SKIPPED the static half of a_root_without_a_c_library_needs_static_builds_and_says_so: \
             set OKA_TEST_STATIC_DIR (scripts/build-static.sh --debug; scripts/test.sh does both)"
        );
        return;
    };
    // A static init with a dynamic envd: refused before the sandbox is reported ready.
    let (rt, _state) = open("nolibc-mixed", static_init.clone(), envd_binary()).await;
    let err = rt.ensure(&spec("nolibc-mixed")).await.unwrap_err().to_string();
    assert!(err.contains("find envd") && err.contains("dynamic loader"), "{err}");
    rt.remove_cgroups();

    // Both static: envd is PID 1 of the libc-less root and serves files.
    let (rt, _state) = open("nolibc-static", static_init, static_envd).await;
    let id = spec("nolibc-static").id;
    rt.ensure(&spec("nolibc-static")).await.unwrap();
    wait_for_envd(&rt, &id).await;
    let (status, body) = request(
        &rt,
        &id,
        "POST",
        "/files?path=/home/user/hello.txt",
        "application/octet-stream",
        b"from a root without libc",
        None,
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (status, body) =
        request(&rt, &id, "GET", "/files?path=/home/user/hello.txt", "text/plain", b"", None)
            .await
            .unwrap();
    assert_eq!((status, body.as_slice()), (200, b"from a root without libc".as_slice()));
    rt.delete(&id).await.unwrap();
    rt.remove_cgroups();
}
