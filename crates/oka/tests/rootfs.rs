//! `oka rootfs build` with the real debootstrap, as root (as CI runs).

// Test helpers outside `#[test]` functions may unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::process::Command;

const OKA: &str = env!("CARGO_BIN_EXE_oka");

/// Root and debootstrap are what the command needs; without them the test says so and skips.
fn can_run() -> bool {
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n");
    let debootstrap = Command::new("debootstrap").arg("--version").output().is_ok();
    if !(root && debootstrap) {
        eprintln!("skipped: needs root and debootstrap (scripts/test.sh installs it)");
    }
    root && debootstrap
}

#[test]
fn build_makes_a_debian_root_with_python_and_a_user_account() {
    if !can_run() {
        return;
    }
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("root");
    let out = Command::new(OKA).args(["rootfs", "build"]).arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let passwd = std::fs::read_to_string(dir.join("etc/passwd")).unwrap();
    assert!(passwd.lines().any(|l| l.starts_with("user:x:1000:1000::/home/user:")), "{passwd}");
    assert!(dir.join("home/user").is_dir());
    assert!(dir.join("usr/bin/python3").exists());
    assert!(!parent.path().join("root.partial").exists());
    // The root works: run python3 in it.
    let out =
        Command::new("chroot").arg(&dir).args(["python3", "-c", "print(6*7)"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");
}

#[test]
fn failed_build_leaves_nothing_behind() {
    if !can_run() {
        return;
    }
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("root");
    // Nothing listens on port 9 of loopback: debootstrap fails at once.
    let out = Command::new(OKA)
        .args(["rootfs", "build", "--mirror", "http://127.0.0.1:9/debian"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(!dir.exists());
    assert!(!parent.path().join("root.partial").exists());
}

#[test]
fn existing_directory_is_refused() {
    let parent = tempfile::tempdir().unwrap();
    let out = Command::new(OKA).args(["rootfs", "build"]).arg(parent.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
}
