//! `oka serve` as its users run it: the real binary, a temporary state directory, signals.

// Test helpers outside `#[test]` functions may unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const OKA: &str = env!("CARGO_BIN_EXE_oka");

/// A running `oka serve` with its stderr lines forwarded to a channel.
struct Serve {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Serve {
    /// Starts `oka serve` without the local runtime: these tests are about the process, and
    /// sandboxes (which outlive `oka serve` by design) would outlive the test's directory.
    fn start(state_dir: &Path, extra: &[&str]) -> Serve {
        let config = state_dir.join("no-runtime.yaml");
        std::fs::write(&config, "runtime:\n  enabled: false\napi:\n  listen: 127.0.0.1:0\nkubeApi:\n  listen: 127.0.0.1:0\n")
            .unwrap();
        let mut child = Command::new(OKA)
            .arg("serve")
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--config")
            .arg(&config)
            .args(extra)
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Serve { child, lines, seen: Vec::new() }
    }

    /// Waits for a stderr line containing `needle`.
    fn wait_for(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("no line with {needle:?} in time; saw:\n{}", self.seen.join("\n")),
            }
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "oka serve did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn serve_prints_where_it_serves_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut serve = Serve::start(dir.path(), &[]);
    let line = serve.wait_for("oka serve is running");
    assert!(line.contains(&dir.path().join("store.redb").display().to_string()), "{line}");
    serve.signal("TERM");
    serve.wait_for("oka::serve: stopped");
    assert!(serve.wait_exit().success());
}

#[test]
fn serve_stops_cleanly_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let mut serve = Serve::start(dir.path(), &[]);
    serve.wait_for("oka serve is running");
    serve.signal("INT");
    assert!(serve.wait_exit().success());
}

#[test]
fn second_instance_on_the_same_state_dir_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Serve::start(dir.path(), &[]);
    first.wait_for("oka serve is running");

    let second =
        Command::new(OKA).arg("serve").arg("--state-dir").arg(dir.path()).output().unwrap();
    assert_eq!(second.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("in use by another oka instance"), "{stderr}");
    assert!(stderr.contains(&format!("pid {}", first.child.id())), "{stderr}");
}

#[test]
fn restart_after_kill_9_serves_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Serve::start(dir.path(), &[]);
    first.wait_for("oka serve is running");
    first.signal("KILL");
    first.wait_exit();

    let mut second = Serve::start(dir.path(), &["--log-format", "json"]);
    let line = second.wait_for("oka serve is running");
    let json: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(json["level"], "INFO");
    second.signal("TERM");
    assert!(second.wait_exit().success());
}

#[test]
fn bad_config_file_is_refused_with_its_path_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("oka.yaml");
    std::fs::write(&config, "stateDirectory: /nowhere\n").unwrap();
    let out = Command::new(OKA).arg("serve").arg("--config").arg(&config).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&config.display().to_string()), "{stderr}");
    assert!(stderr.contains("stateDirectory"), "{stderr}");
}

#[test]
fn crds_prints_every_kind_and_survives_a_closed_pipe() {
    let out = Command::new(OKA).arg("crds").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for plural in [
        "sandboxes",
        "sandboxsets",
        "sandboxclaims",
        "sandboxtemplates",
        "sandboxupdateops",
        "checkpoints",
        "poolautoscalers",
    ] {
        assert!(text.contains(&format!("name: {plural}.agents.kruise.io")), "{plural} missing");
    }
    // `oka crds | head -1`: the reader goes away; oka must not panic.
    let mut child = Command::new(OKA)
        .arg("crds")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_damaged_store_is_refused_at_start_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Serve::start(dir.path(), &[]);
    first.wait_for("oka serve is running");
    first.signal("TERM");
    assert!(first.wait_exit().success());

    // One byte changed in every stored copy of an object's text (the live one among them),
    // as a failing disk or a stray write would.
    let store = dir.path().join("store.redb");
    let mut bytes = std::fs::read(&store).unwrap();
    let needle = b"\"apiVersion\"";
    let at: Vec<usize> = bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| w == needle)
        .map(|(i, _)| i)
        .collect();
    assert!(!at.is_empty(), "no object text in the store file");
    for i in at {
        bytes[i + 1] ^= 0x20;
    }
    std::fs::write(&store, &bytes).unwrap();

    let mut second = Serve::start(dir.path(), &[]);
    let said = second.wait_for("is damaged");
    assert!(said.contains(&format!("the store database {} is damaged", store.display())), "{said}");
    assert!(said.contains("restore it from a backup"), "{said}");
    assert_eq!(second.wait_exit().code(), Some(1));
}
