//! The startup check (a container's `startupProbe`, E2B's ready command) on real sandboxes: a
//! sandbox is reported running only once its check passed; a check that never passes fails the
//! start with the check's output; every start of the command checks again, a resume does not.
//!
//! These run real sandboxes and need root; they print a SKIPPED line otherwise.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions may unwrap too

mod common;

use std::time::{Duration, Instant};

use common::*;
use oka_runtime_api::{
    CheckAction, EnvVar, Runtime, RuntimeError, SandboxState, StartupCheck, User,
};

fn exec(script: &str) -> CheckAction {
    CheckAction::Exec { command: vec!["/bin/sh".into(), "-c".into(), script.into()] }
}

fn every_second(action: CheckAction, failure_threshold: u32) -> StartupCheck {
    StartupCheck { period_seconds: 1, failure_threshold, ..StartupCheck::new(action) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_runs_only_once_its_check_passes_as_the_commands_user() {
    if !root_or_skip("a_sandbox_runs_only_once_its_check_passes_as_the_commands_user") {
        return;
    }
    let (rt, _dir) = runtime("startup-pass").await;
    let mut spec = sh("startup-pass", "sleep 2; touch \"$MARKER\"; exec sleep 1000");
    spec.process.user = Some(User::DEFAULT_USER);
    spec.process.working_dir = Some("/home/user".into());
    spec.process.env = vec![EnvVar::new("MARKER", "/home/user/ready")];
    // The check sees the command's environment, working directory and user.
    let check = "test -f ready && test \"$MARKER\" = \"$PWD/ready\" && test \"$(id -u)\" = 1000";
    spec.process.startup_check = Some(every_second(exec(check), 10));
    let t0 = Instant::now();
    let status = rt.ensure(&spec).await.unwrap();
    assert_eq!(status.state, SandboxState::Running);
    assert!(t0.elapsed() >= Duration::from_millis(1500), "ready before the marker existed");
    assert!(
        read_upper(&rt, &spec.id, "/home/user/ready").await.is_some(),
        "reported running while its check could not pass"
    );
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_check_waits_for_the_server() {
    if !root_or_skip("an_http_check_waits_for_the_server") {
        return;
    }
    let (rt, _dir) = runtime("startup-http").await;
    let mut spec = http_server("startup-http", 8000);
    let server = spec.argv().join(" ");
    spec.process.command = vec!["/bin/sh".into(), "-c".into(), format!("sleep 1; exec {server}")];
    let action = CheckAction::HttpGet { port: 8000, path: "/".into() };
    spec.process.startup_check = Some(every_second(action, 20));
    rt.ensure(&spec).await.unwrap();
    // No retry: the server answers the moment the sandbox is running.
    let answer = http_get(&rt, &spec.id, 8000).await.unwrap_or_default();
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_that_never_passes_fails_the_start_with_what_it_said() {
    if !root_or_skip("a_check_that_never_passes_fails_the_start_with_what_it_said") {
        return;
    }
    let (rt, _dir) = runtime("startup-fail").await;
    let mut spec = sh("startup-fail", "exec sleep 1000");
    let check = "echo checking; echo 'nothing listens on 8000' >&2; exit 3";
    spec.process.startup_check = Some(every_second(exec(check), 2));
    let err = rt.ensure(&spec).await.unwrap_err();
    let RuntimeError::StartupCheckFailed { message, .. } = &err else {
        panic!("expected StartupCheckFailed, got {err:?}");
    };
    assert!(message.starts_with("Startup probe failed: exec "), "{message}");
    for part in ["exited with code 3", "checking", "nothing listens on 8000", "failure 2 of 2"] {
        assert!(message.contains(part), "{part:?} missing from {message}");
    }
    assert!(!err.is_retryable(), "the same spec fails the same way");
    // A sandbox that never ran is not left behind.
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Gone);

    // A check that hangs is killed at its timeout, and counts as a failure.
    let mut spec = sh("startup-hang", "exec sleep 1000");
    spec.process.startup_check = Some(every_second(exec("echo started; exec sleep 100"), 1));
    let t0 = Instant::now();
    let err = rt.ensure(&spec).await.unwrap_err().to_string();
    assert!(err.contains("timed out after 1s: started"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10), "the hanging check was not cut short");

    // A port nobody listens on.
    let mut spec = sh("startup-tcp", "exec sleep 1000");
    spec.process.startup_check = Some(every_second(CheckAction::TcpSocket { port: 9 }, 1));
    let err = rt.ensure(&spec).await.unwrap_err().to_string();
    assert!(err.contains("dial tcp 127.0.0.1:9"), "{err}");

    // A command that ends before its check passed fails the start, saying so.
    let mut spec = sh("startup-exit", "exit 4");
    spec.process.startup_check = Some(every_second(exec("exit 1"), 30));
    let err = rt.ensure(&spec).await.unwrap_err().to_string();
    assert!(
        err.contains("the command exited with code 4 before its startup probe passed"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_start_checks_again_and_a_resume_does_not() {
    if !root_or_skip("every_start_checks_again_and_a_resume_does_not") {
        return;
    }
    let (rt, _dir) = runtime("startup-again").await;
    let mut spec = sh("startup-again", "echo start >> /root/starts; exec sleep 1000");
    spec.process.startup_check = Some(every_second(exec("echo check >> /root/checks"), 3));
    let checks = || async { read_upper(&rt, &spec.id, "/root/checks").await.unwrap_or_default() };
    rt.ensure(&spec).await.unwrap();
    assert_eq!(checks().await, "check\n");

    rt.pause(&spec.id).await.unwrap();
    rt.resume(&spec.id).await.unwrap();
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Running);
    assert_eq!(checks().await, "check\n", "a resume must not check again");

    rt.stop(&spec.id, Duration::from_secs(5)).await.unwrap();
    rt.ensure(&spec).await.unwrap();
    assert_eq!(checks().await, "check\ncheck\n", "a new start checks again");
    let starts = read_upper(&rt, &spec.id, "/root/starts").await.unwrap_or_default();
    assert_eq!(starts, "start\nstart\n");
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_ends_a_start_that_waits_for_its_check() {
    if !root_or_skip("a_delete_ends_a_start_that_waits_for_its_check") {
        return;
    }
    let (rt, _dir) = runtime("startup-delete").await;
    let mut spec = sh("startup-delete", "exec sleep 1000");
    spec.process.startup_check = Some(every_second(exec("exit 1"), 600));
    let starting = {
        let (rt, spec) = (rt.clone(), spec.clone());
        tokio::spawn(async move { rt.ensure(&spec).await })
    };
    // The start holds the sandbox's lock while its check runs, so the test only waits (a
    // read of the sandbox's files would wait for the lock too).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!starting.is_finished(), "the start did not wait for its check");
    let t0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(30), rt.delete(&spec.id))
        .await
        .expect("the delete waited for the check")
        .unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10), "the delete waited for the check");
    assert!(starting.await.unwrap().is_err());
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Gone);
}
