//! `oka reset` as its users run it: after `oka serve` stopped, its sandboxes still run; the reset
//! ends them and removes the state directory's content, and asks first.
//!
//! Needs root (real sandboxes); without it prints SKIPPED.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const OKA: &str = env!("CARGO_BIN_EXE_oka");

fn reset(state: &Path, args: &[&str]) -> Output {
    Command::new(OKA)
        .arg("reset")
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The processes in the cgroups `oka serve` makes for `state`'s sandboxes.
fn sandbox_processes(state: &Path) -> usize {
    let canonical = std::fs::canonicalize(state).unwrap();
    let name = format!(
        "oka-{:08x}/",
        oka_controller::revision::fnv1_32(canonical.as_os_str().as_encoded_bytes())
    );
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|p| p.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .filter(|p| {
            std::fs::read_to_string(p.path().join("cgroup")).is_ok_and(|c| c.contains(&name))
        })
        .count()
}

#[test]
fn reset_ends_the_sandboxes_oka_serve_left_and_removes_the_state() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED reset_ends_the_sandboxes_oka_serve_left_and_removes_the_state: root");
        return;
    }
    let mut serve = support::OkaServe::start(
        OKA,
        "defaultPool:\n  replicas: 2\ncodeInterpreterPool:\n  enabled: false\n",
        &[],
    );
    serve.wait_sandboxes(2, Duration::from_secs(60));
    let state = serve.state.path().to_owned();

    // While oka serve runs: refused, naming it.
    let out = reset(&state, &["--yes"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("in use by another oka instance"), "{stderr}");
    assert!(stderr.contains(&format!("(pid {})", serve.child.id())), "{stderr}");

    // Stopped: its sandboxes run on.
    Command::new("kill").arg("-TERM").arg(serve.child.id().to_string()).status().unwrap();
    serve.child.wait().unwrap();
    assert!(sandbox_processes(&state) >= 2, "the sandboxes outlive oka serve");

    // A dry run lists them and removes nothing; without --yes and no terminal, nothing either.
    let out = reset(&state, &["--dry-run"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(listed.lines().count(), 2, "{listed}");
    assert!(listed.lines().all(|l| l.ends_with("\trunning")), "{listed}");
    let out = reset(&state, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("add --yes"), "{stderr}");
    assert_eq!(serve.runtime_sandboxes(), 2, "nothing removed");

    let out = reset(&state, &["--yes"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("removed 2 sandboxes"), "{stderr}");
    assert_eq!(sandbox_processes(&state), 0, "every sandbox ended");
    let left: Vec<_> =
        std::fs::read_dir(&state).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "the state is gone: {left:?}");
    // Again: nothing to do.
    let out = reset(&state, &["--yes"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
