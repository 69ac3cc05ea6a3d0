//! Lifecycle of local sandboxes: create, run, pause, resume, connect, stop, delete.
//!
//! These run real sandboxes and need root; they print a SKIPPED line otherwise.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions may unwrap too

mod common;

use std::time::Duration;

use common::*;
use oka_runtime::{ExitInfo, Operation, Runtime, RuntimeError, SandboxState, User};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_root_runs_bash_python3_and_knows_the_user_account() {
    if !root_or_skip("default_root_runs_bash_python3_and_knows_the_user_account") {
        return;
    }
    let (rt, _dir) = runtime("tools").await;
    let id = id_of("tools");
    let script = r#"exec > /root/out 2>&1
python3 -c 'import http.server, json, sqlite3, ssl, pwd; print(pwd.getpwuid(1000).pw_dir)'
bash -lc 'echo "bash $BASH_VERSION"' | cut -c1-4
awk 'BEGIN { print "awk" }'
ls -ld /home/user | awk '{ print $3 }'
echo END"#;
    rt.ensure(&sh("tools", script)).await.unwrap();
    let out = wait_for_file(&rt, &id, "/root/out", "END").await;
    assert_eq!(out, "/home/user\nbash\nawk\nuser\nEND\n");
    rt.delete(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensure_is_idempotent_and_refuses_a_different_spec_under_the_same_id() {
    if !root_or_skip("ensure_is_idempotent_and_refuses_a_different_spec_under_the_same_id") {
        return;
    }
    let (rt, _dir) = runtime("idem").await;
    let spec = sh("idem", "exec sleep 1000");
    let first = rt.ensure(&spec).await.unwrap();
    let second = rt.ensure(&spec).await.unwrap();
    assert_eq!(first.state, SandboxState::Running);
    assert_eq!(first.pid, second.pid, "a second ensure must not start another instance");
    let other = sh("idem", "exec sleep 999");
    assert!(matches!(rt.ensure(&other).await, Err(RuntimeError::SpecMismatch(_))));
    assert_eq!(rt.list().await.unwrap().len(), 1);
    rt.delete(&spec.id).await.unwrap();
    rt.delete(&spec.id).await.expect("deleting a gone sandbox succeeds");
    assert!(rt.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_a_counter_and_resume_continues_it() {
    if !root_or_skip("pause_stops_a_counter_and_resume_continues_it") {
        return;
    }
    let (rt, _dir) = runtime("pause").await;
    let counter = "i=0; while :; do i=$((i+1)); echo $i > /root/c.tmp; mv /root/c.tmp /root/c; sleep 0.01; done";
    let (paused, reference) = (id_of("paused"), id_of("reference"));
    rt.ensure(&sh("paused", counter)).await.unwrap();
    rt.ensure(&sh("reference", counter)).await.unwrap();
    let read = |id| {
        let rt = rt.clone();
        async move { read_upper(&rt, &id, "/root/c").await.and_then(|s| s.trim().parse::<u64>().ok()) }
    };
    poll("counter to start", Duration::from_secs(10), || async {
        read(paused.clone()).await.filter(|&c| c > 2)
    })
    .await;

    rt.pause(&paused).await.unwrap();
    rt.pause(&paused).await.expect("pausing a paused sandbox is a no-op");
    assert_eq!(rt.inspect(&paused).await.unwrap().state, SandboxState::Paused);
    let frozen_at = read(paused.clone()).await.unwrap();
    // Let the unpaused reference count 20 more ticks: time enough for the paused one to move.
    let start = read(reference.clone()).await.unwrap_or(0);
    poll("reference counter to advance", Duration::from_secs(20), || async {
        read(reference.clone()).await.filter(|&c| c >= start + 20)
    })
    .await;
    assert_eq!(read(paused.clone()).await.unwrap(), frozen_at, "a paused sandbox must not advance");

    rt.resume(&paused).await.unwrap();
    rt.resume(&paused).await.expect("resuming a running sandbox is a no-op");
    assert_eq!(rt.inspect(&paused).await.unwrap().state, SandboxState::Running);
    poll("counter to continue", Duration::from_secs(10), || async {
        read(paused.clone()).await.filter(|&c| c > frozen_at)
    })
    .await;
    rt.delete(&paused).await.unwrap();
    rt.delete(&reference).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_reaches_a_python_http_server_inside_the_sandbox() {
    if !root_or_skip("connect_reaches_a_python_http_server_inside_the_sandbox") {
        return;
    }
    let (rt, _dir) = runtime("connect").await;
    let spec = http_server("web", 8000);
    rt.ensure(&spec).await.unwrap();
    let response =
        poll("http server to answer", Duration::from_secs(20), || http_get(&rt, &spec.id, 8000))
            .await;
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
    // A port nobody listens on is refused, not hung.
    let refused = rt.connect(&spec.id, 8001).await;
    assert!(matches!(refused, Err(RuntimeError::Local(_))), "{refused:?}");
    // Paused, the kernel still completes the handshake; resumed, it answers again.
    rt.pause(&spec.id).await.unwrap();
    rt.resume(&spec.id).await.unwrap();
    let again =
        poll("http server after resume", Duration::from_secs(20), || http_get(&rt, &spec.id, 8000))
            .await;
    assert!(again.starts_with("HTTP/1.0 200"));
    rt.delete(&spec.id).await.unwrap();
    assert!(matches!(rt.connect(&spec.id, 8000).await, Err(RuntimeError::NotFound(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_keeps_the_writable_layer_and_ensure_starts_the_command_again() {
    if !root_or_skip("stop_keeps_the_writable_layer_and_ensure_starts_the_command_again") {
        return;
    }
    let (rt, _dir) = runtime("stop").await;
    let spec = sh("stopper", "echo run >> /root/runs; echo ready > /root/state; exec sleep 1000");
    rt.ensure(&spec).await.unwrap();
    wait_for_file(&rt, &spec.id, "/root/state", "ready").await;
    rt.stop(&spec.id, Duration::from_secs(5)).await.unwrap();
    let status = rt.inspect(&spec.id).await.unwrap();
    assert_eq!(status.state, SandboxState::Stopped);
    assert_eq!(status.pid, None);
    assert!(rt.cgroup_paths(&spec.id).await.is_none(), "a stopped sandbox owns no cgroups");
    rt.stop(&spec.id, Duration::from_secs(5)).await.expect("stopping a stopped sandbox is a no-op");
    let err = rt.pause(&spec.id).await.unwrap_err();
    assert!(matches!(
        err,
        RuntimeError::InvalidState {
            state: SandboxState::Stopped,
            operation: Operation::Pause,
            ..
        }
    ));

    rt.ensure(&spec).await.unwrap();
    poll("second run", Duration::from_secs(10), || async {
        read_upper(&rt, &spec.id, "/root/runs").await.filter(|s| s == "run\nrun\n")
    })
    .await;
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_forwards_sigterm_to_the_command_through_the_init() {
    if !root_or_skip("stop_forwards_sigterm_to_the_command_through_the_init") {
        return;
    }
    let (rt, _dir) = runtime("sigterm").await;
    let script = "trap 'echo terminated > /root/term; exit 0' TERM; echo up > /root/up; while :; do sleep 0.05; done";
    let spec = sh("term", script);
    rt.ensure(&spec).await.unwrap();
    wait_for_file(&rt, &spec.id, "/root/up", "up").await;
    rt.stop(&spec.id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(read_upper(&rt, &spec.id, "/root/term").await.as_deref(), Some("terminated\n"));
    assert_eq!(rt.inspect(&spec.id).await.unwrap().last_exit, Some(ExitInfo::Code(0)));
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_exit_stops_the_sandbox_with_its_exit_code() {
    if !root_or_skip("command_exit_stops_the_sandbox_with_its_exit_code") {
        return;
    }
    let (rt, _dir) = runtime("exit").await;
    let spec = sh("exiter", "echo bye > /root/bye; exit 3");
    rt.ensure(&spec).await.unwrap();
    let status = poll("sandbox to stop", Duration::from_secs(10), || async {
        rt.inspect(&spec.id).await.ok().filter(|s| s.state == SandboxState::Stopped)
    })
    .await;
    assert_eq!(status.last_exit, Some(ExitInfo::Code(3)));
    assert_eq!(read_upper(&rt, &spec.id, "/root/bye").await.as_deref(), Some("bye\n"));
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_program_fails_the_create_and_leaves_nothing_behind() {
    if !root_or_skip("a_missing_program_fails_the_create_and_leaves_nothing_behind") {
        return;
    }
    let (rt, dir) = runtime("missing").await;
    let mut spec = sh("missing", "unused");
    spec.process.command = vec!["no-such-program".into()];
    let err = rt.ensure(&spec).await.unwrap_err();
    assert!(
        matches!(&err, RuntimeError::CommandFailed { message, .. } if message.contains("no-such-program")),
        "{err}"
    );
    assert!(!err.is_retryable());
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Gone);
    let sandboxes = dir.path().join("state/sandboxes");
    assert_eq!(std::fs::read_dir(&sandboxes).unwrap().count(), 0, "no sandbox directory left");

    let mut spec = sh("badcwd", "true");
    spec.process.working_dir = Some("/does/not/exist".into());
    let err = rt.ensure(&spec).await.unwrap_err();
    assert!(
        matches!(&err, RuntimeError::CommandFailed { message, .. } if message.contains("/does/not/exist")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_runs_as_the_requested_user_in_the_requested_directory() {
    if !root_or_skip("the_command_runs_as_the_requested_user_in_the_requested_directory") {
        return;
    }
    let (rt, _dir) = runtime("user").await;
    let mut spec =
        sh("user", "echo \"$(id -u):$(id -g) $(pwd) $HOME\" > /home/user/who; exec sleep 1000");
    spec.process.user = Some(User::DEFAULT_USER);
    spec.process.working_dir = Some("/home/user".into());
    rt.ensure(&spec).await.unwrap();
    let who =
        wait_for_file(&rt, &spec.id, "/home/user/who", "1000:1000 /home/user /home/user").await;
    assert_eq!(who, "1000:1000 /home/user /home/user\n");
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernate_and_restore_answer_unsupported_until_criu_lands() {
    if !root_or_skip("hibernate_and_restore_answer_unsupported_until_criu_lands") {
        return;
    }
    let (rt, _dir) = runtime("hibernate").await;
    let spec = sh("sleeper", "exec sleep 1000");
    assert!(matches!(rt.hibernate(&spec.id).await, Err(RuntimeError::NotFound(_))));
    rt.ensure(&spec).await.unwrap();
    let err = rt.hibernate(&spec.id).await.unwrap_err();
    assert!(
        matches!(err, RuntimeError::Unsupported { operation: Operation::Hibernate, .. }),
        "{err}"
    );
    let err = rt.restore(&spec.id).await.unwrap_err();
    assert!(
        matches!(err, RuntimeError::InvalidState { state: SandboxState::Running, .. }),
        "{err}"
    );
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_settles_while_the_sandbox_forks_without_pause() {
    if !root_or_skip("pause_settles_while_the_sandbox_forks_without_pause") {
        return;
    }
    let (rt, _dir) = runtime("forky").await;
    // A loop that is always forking: the v1 freezer can stay FREEZING on such a tree unless the
    // runtime retries.
    let spec = sh("forky", "echo up > /root/up; while :; do /bin/true; done");
    rt.ensure(&spec).await.unwrap();
    wait_for_file(&rt, &spec.id, "/root/up", "up").await;
    for _ in 0..20 {
        rt.pause(&spec.id).await.unwrap();
        assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Paused);
        rt.resume(&spec.id).await.unwrap();
    }
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_of_a_paused_sandbox_kills_and_removes_it() {
    if !root_or_skip("delete_of_a_paused_sandbox_kills_and_removes_it") {
        return;
    }
    let (rt, dir) = runtime("delpaused").await;
    let spec = sh("frozen", "sleep 1000 & exec sleep 1000");
    let status = rt.ensure(&spec).await.unwrap();
    rt.pause(&spec.id).await.unwrap();
    let cgroups = rt.cgroup_paths(&spec.id).await.unwrap();
    rt.delete(&spec.id).await.unwrap();
    assert!(cgroups.dirs().iter().all(|d| !d.exists()));
    assert!(!std::path::Path::new(&format!("/proc/{}", status.pid.unwrap())).exists());
    assert_eq!(std::fs::read_dir(dir.path().join("state/sandboxes")).unwrap().count(), 0);
}
