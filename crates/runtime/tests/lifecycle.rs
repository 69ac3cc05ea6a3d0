//! Lifecycle of local sandboxes: create, run, pause, resume, connect, stop, delete.
//!
//! These run real sandboxes and need root; they print a SKIPPED line otherwise.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions may unwrap too

mod common;

use std::time::Duration;

use common::*;
use oka_runtime::local::cgroup::Controller;
use oka_runtime::local::criu::CriuError;
use oka_runtime::local::{LocalError, LocalRuntime};
use oka_runtime_api::{
    ExitInfo, Operation, RootFs, Runtime, RuntimeError, SandboxState, UpdateOutcome, User,
};

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
    // `list` (the controllers' poll) tells frozen from running too, without reading usage.
    let listed: std::collections::HashMap<_, _> =
        rt.list().await.unwrap().into_iter().map(|s| (s.id.clone(), s)).collect();
    assert_eq!(listed[&paused].state, SandboxState::Paused);
    assert_eq!(listed[&reference].state, SandboxState::Running);
    assert!(listed.values().all(|s| s.usage.is_none() && s.pid.is_some()));
    assert!(rt.inspect(&reference).await.unwrap().usage.is_some(), "inspect reads usage");
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
    // A port nobody listens on is refused, not hung: the typed closed port.
    let refused = rt.connect(&spec.id, 8001).await;
    assert!(
        matches!(&refused, Err(RuntimeError::PortClosed { id, port: 8001 }) if *id == spec.id),
        "{refused:?}"
    );
    // Paused, the kernel still completes the handshake; resumed, it answers again.
    rt.pause(&spec.id).await.unwrap();
    rt.resume(&spec.id).await.unwrap();
    let again =
        poll("http server after resume", Duration::from_secs(20), || http_get(&rt, &spec.id, 8000))
            .await;
    assert!(again.starts_with("HTTP/1.0 200"));
    // The sockets were made in the sandbox's network namespace by a helper thread, which is
    // back in the host's: no thread of this process is left in the sandbox's.
    let host = std::fs::read_link("/proc/self/ns/net").unwrap();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let task = task.unwrap().path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if let Ok(ns) = std::fs::read_link(task.join("ns/net")) {
            assert_eq!(
                ns,
                host,
                "thread {} ({}) is in another network namespace",
                task.display(),
                comm.trim()
            );
        }
    }
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
async fn hibernate_then_restore_keeps_a_python_servers_in_memory_state() {
    if !root_or_skip("hibernate_then_restore_keeps_a_python_servers_in_memory_state") {
        return;
    }
    let (rt, dir) = runtime("hibernate").await;
    let mut spec = counter_server("counter", 8000, 0);
    spec.resources.memory_bytes = Some(256 << 20);
    spec.resources.pids = Some(64);
    let id = spec.id.clone();
    assert!(matches!(rt.hibernate(&id).await, Err(RuntimeError::NotFound(_))));
    assert!(matches!(rt.restore(&id).await, Err(RuntimeError::NotFound(_))));
    let first = rt.ensure(&spec).await.unwrap();
    wait_for_server(&rt, &id, 8000).await;
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=1\n"));
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=2\n"));
    let err = rt.restore(&id).await.map(|s| s.state);
    assert_eq!(err.unwrap(), SandboxState::Running, "restoring a running sandbox is a no-op");
    let old_pid = first.pid.unwrap();
    let cgroups = rt.cgroup_paths(&id).await.unwrap();
    let memory_before = rt.inspect(&id).await.unwrap().usage.unwrap().memory_bytes.unwrap();
    assert!(memory_before > 4 << 20, "python's memory is charged: {memory_before}");

    rt.hibernate(&id).await.unwrap();
    let status = rt.inspect(&id).await.unwrap();
    assert_eq!(status.state, SandboxState::Hibernated);
    assert_eq!((status.pid, status.usage), (None, None));
    assert_eq!(status.last_exit, None, "the dump's kill is not an exit of the sandbox");
    assert!(!std::path::Path::new(&format!("/proc/{old_pid}")).exists(), "the init is reaped");
    assert!(cgroups.dirs().iter().all(|d| !d.exists()), "memory freed: the cgroups are gone");
    let sandbox_dir = rt.paths(&id).await.unwrap().dir;
    assert!(sandbox_dir.join("checkpoint/images/inventory.img").is_file());
    rt.hibernate(&id).await.expect("hibernating a hibernated sandbox is a no-op");
    let refused = rt.connect(&id, 8000).await;
    assert!(
        matches!(refused, Err(RuntimeError::InvalidState { state: SandboxState::Hibernated, .. })),
        "{refused:?}"
    );
    assert!(matches!(rt.pause(&id).await, Err(RuntimeError::InvalidState { .. })));
    assert!(matches!(rt.ensure(&spec).await, Err(RuntimeError::InvalidState { .. })));

    let restored = rt.restore(&id).await.unwrap();
    assert_eq!(restored.state, SandboxState::Running);
    let pid = restored.pid.unwrap();
    assert_ne!(pid, old_pid);
    assert_eq!(rt.restore(&id).await.unwrap().pid, Some(pid), "a second restore is a no-op");
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=3\n"));
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=4\n"));

    // Our child (the runtime reaps it), back in its own cgroups with the spec's limits.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let ppid = stat[stat.rfind(')').unwrap() + 1..].split_whitespace().nth(1).unwrap();
    assert_eq!(ppid, std::process::id().to_string());
    let cgroups = rt.cgroup_paths(&id).await.unwrap();
    let in_cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for (controller, dir) in &cgroups.v1 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
        assert!(procs.lines().any(|p| p == pid.to_string()), "{controller:?}: {in_cgroups}");
        if *controller == Controller::Memory {
            let limit = std::fs::read_to_string(dir.join("memory.limit_in_bytes")).unwrap();
            assert_eq!(limit.trim(), (256u64 << 20).to_string());
        }
    }
    // The host mount used for the restore is gone; so is the spent checkpoint.
    assert_eq!(host_mounts_under(&sandbox_dir), Vec::<String>::new());
    assert!(!sandbox_dir.join("checkpoint").exists());
    poll("the spent images to be removed", Duration::from_secs(10), || async {
        let left = std::fs::read_dir(&sandbox_dir)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("checkpoint"));
        (!left).then_some(())
    })
    .await;
    // The restored init writes to a pipe whose read end the runtime holds.
    let stdout = std::fs::read_link(format!("/proc/{pid}/fd/1")).unwrap();
    assert!(stdout.to_string_lossy().starts_with("pipe:["), "{stdout:?}");
    let ours = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == stdout));
    assert!(ours, "nobody in the runtime holds {stdout:?}");

    // It hibernates and restores again, and a paused-then-resumed restored sandbox still serves.
    rt.hibernate(&id).await.unwrap();
    rt.restore(&id).await.unwrap();
    rt.pause(&id).await.unwrap();
    rt.resume(&id).await.unwrap();
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=5\n"));
    rt.delete(&id).await.unwrap();
    assert_eq!(std::fs::read_dir(dir.path().join("state/sandboxes")).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernate_a_paused_sandbox() {
    if !root_or_skip("hibernate_a_paused_sandbox") {
        return;
    }
    let (rt, _dir) = runtime("hibpaused").await;
    let spec = counter_server("paused-counter", 8000, 0);
    let id = spec.id.clone();
    rt.ensure(&spec).await.unwrap();
    wait_for_server(&rt, &id, 8000).await;
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=1\n"));
    rt.pause(&id).await.unwrap();
    assert_eq!(rt.inspect(&id).await.unwrap().state, SandboxState::Paused);
    // A frozen tree cannot be seized with ptrace: the dump must go through the freezer.
    rt.hibernate(&id).await.unwrap();
    assert_eq!(rt.inspect(&id).await.unwrap().state, SandboxState::Hibernated);
    let restored = rt.restore(&id).await.unwrap();
    assert_eq!(restored.state, SandboxState::Running, "a restored sandbox runs");
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=2\n"));
    rt.delete(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_of_a_hibernated_sandbox_removes_its_checkpoint() {
    if !root_or_skip("delete_of_a_hibernated_sandbox_removes_its_checkpoint") {
        return;
    }
    let (rt, dir) = runtime("delhib").await;
    let spec = counter_server("gone-soon", 8000, 8);
    rt.ensure(&spec).await.unwrap();
    wait_for_server(&rt, &spec.id, 8000).await;
    let cgroups = rt.cgroup_paths(&spec.id).await.unwrap();
    rt.hibernate(&spec.id).await.unwrap();
    let sandbox_dir = rt.paths(&spec.id).await.unwrap().dir;
    let images = sandbox_dir.join("checkpoint/images");
    let image_bytes: u64 =
        std::fs::read_dir(&images).unwrap().flatten().map(|e| e.metadata().unwrap().len()).sum();
    assert!(image_bytes > 8 << 20, "the images hold python's 8 MiB: {image_bytes}");

    rt.delete(&spec.id).await.unwrap();
    assert!(!sandbox_dir.exists(), "checkpoint, writable layer and state file are gone");
    assert_eq!(std::fs::read_dir(dir.path().join("state/sandboxes")).unwrap().count(), 0);
    assert!(cgroups.dirs().iter().all(|d| !d.exists()));
    assert_eq!(host_mounts_under(&sandbox_dir), Vec::<String>::new());
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Gone);
    assert!(matches!(rt.restore(&spec.id).await, Err(RuntimeError::NotFound(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_of_a_hibernated_sandbox_discards_its_checkpoint() {
    if !root_or_skip("stop_of_a_hibernated_sandbox_discards_its_checkpoint") {
        return;
    }
    let (rt, _dir) = runtime("stophib").await;
    let spec = counter_server("stop-hib", 8000, 0);
    rt.ensure(&spec).await.unwrap();
    wait_for_server(&rt, &spec.id, 8000).await;
    assert_eq!(http_body(&rt, &spec.id, 8000, "/count").await.as_deref(), Some("count=1\n"));
    rt.hibernate(&spec.id).await.unwrap();
    rt.stop(&spec.id, Duration::from_secs(5)).await.unwrap();
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Stopped);
    let sandbox_dir = rt.paths(&spec.id).await.unwrap().dir;
    assert!(!sandbox_dir.join("checkpoint").exists());
    assert!(matches!(
        rt.restore(&spec.id).await,
        Err(RuntimeError::InvalidState { state: SandboxState::Stopped, .. })
    ));
    // Started afresh: the count starts again.
    rt.ensure(&spec).await.unwrap();
    wait_for_server(&rt, &spec.id, 8000).await;
    assert_eq!(http_body(&rt, &spec.id, 8000, "/count").await.as_deref(), Some("count=1\n"));
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_hibernate_leaves_the_sandbox_running_or_paused_and_serving() {
    if !root_or_skip("a_failed_hibernate_leaves_the_sandbox_running_or_paused_and_serving") {
        return;
    }
    let (rt, _dir) = runtime("badhib").await;
    // CRIU 4.2 cannot checkpoint AF_VSOCK sockets.
    let preamble = "import socket\n\
        try:\n    vsock = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM); have = 'yes'\n\
        except OSError:\n    have = 'no'\n\
        open('/root/vsock', 'w').write(have + '\\n')";
    let spec = counter_server_with("unfreezable", 8000, 0, preamble);
    let id = spec.id.clone();
    rt.ensure(&spec).await.unwrap();
    let have = poll("the vsock probe", Duration::from_secs(20), || async {
        read_upper(&rt, &id, "/root/vsock").await.filter(|s| s.ends_with('\n'))
    })
    .await;
    if have.trim() != "yes" {
        eprintln!("SKIPPED: no AF_VSOCK on this machine");
        rt.delete(&id).await.unwrap();
        return;
    }
    wait_for_server(&rt, &id, 8000).await;
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=1\n"));
    let sandbox_dir = rt.paths(&id).await.unwrap().dir;

    let err = rt.hibernate(&id).await.unwrap_err();
    let Some(LocalError::Criu { source: CriuError::Failed { errors, log, .. }, .. }) =
        err.backend_error::<LocalError>()
    else {
        panic!("unexpected error {err}");
    };
    assert!(errors.iter().any(|e| e.contains("Unknown socket")), "{errors:?}");
    assert!(err.to_string().contains("criu dump failed"), "{err}");
    assert!(err.is_retryable());
    assert!(log.is_file(), "the log is kept: {}", log.display());
    assert!(!sandbox_dir.join("checkpoint/images").exists(), "partial images are removed");
    assert_eq!(rt.inspect(&id).await.unwrap().state, SandboxState::Running);
    // Running, with its network unlocked and its memory intact.
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=2\n"));

    // A paused sandbox stays paused.
    rt.pause(&id).await.unwrap();
    assert!(rt.hibernate(&id).await.is_err());
    assert_eq!(rt.inspect(&id).await.unwrap().state, SandboxState::Paused);
    rt.resume(&id).await.unwrap();
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=3\n"));
    rt.delete(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_restore_leaves_the_sandbox_hibernated_with_nothing_mounted() {
    if !root_or_skip("a_failed_restore_leaves_the_sandbox_hibernated_with_nothing_mounted") {
        return;
    }
    let (rt, _dir) = runtime("badrestore").await;
    let spec = counter_server("bad-restore", 8000, 4);
    rt.ensure(&spec).await.unwrap();
    wait_for_server(&rt, &spec.id, 8000).await;
    assert_eq!(http_body(&rt, &spec.id, 8000, "/count").await.as_deref(), Some("count=1\n"));
    let cgroups = rt.cgroup_paths(&spec.id).await.unwrap();
    rt.hibernate(&spec.id).await.unwrap();
    let sandbox_dir = rt.paths(&spec.id).await.unwrap().dir;
    let images = sandbox_dir.join("checkpoint/images");
    // Take the memory pages away: CRIU fails once it has created the processes.
    let pages = std::fs::read_dir(&images)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("pages-"))
        .unwrap();
    let aside = sandbox_dir.join("pages-aside");
    std::fs::rename(&pages, &aside).unwrap();

    let err = rt.restore(&spec.id).await.unwrap_err();
    let Some(LocalError::Criu { source: CriuError::Failed { errors, log, .. }, .. }) =
        err.backend_error::<LocalError>()
    else {
        panic!("unexpected error {err}");
    };
    assert!(!errors.is_empty(), "the error carries CRIU's error lines: {err}");
    assert!(err.to_string().contains("criu restore failed"), "{err}");
    assert!(log.is_file(), "the log is kept: {}", log.display());
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Hibernated);
    assert_eq!(host_mounts_under(&sandbox_dir), Vec::<String>::new(), "nothing half-mounted");
    assert!(cgroups.dirs().iter().all(|d| !d.exists()), "no cgroup left");
    let me = std::process::id().to_string();
    let zombies: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            let after: Vec<&str> =
                stat[stat.rfind(')').unwrap() + 1..].split_whitespace().collect();
            after[0] == "Z" && after[1] == me
        })
        .collect();
    assert_eq!(zombies, Vec::<String>::new(), "no unreaped restored process");

    std::fs::rename(&aside, &pages).unwrap();
    let restored = rt.restore(&spec.id).await.unwrap();
    assert_eq!(restored.state, SandboxState::Running);
    assert_eq!(http_body(&rt, &spec.id, 8000, "/count").await.as_deref(), Some("count=2\n"));
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_sandboxes_hibernate_and_restore_concurrently() {
    if !root_or_skip("different_sandboxes_hibernate_and_restore_concurrently") {
        return;
    }
    let (rt, _dir) = runtime("hibconc").await;
    let specs: Vec<_> = (0..4).map(|i| counter_server(&format!("conc-{i}"), 8000, 2)).collect();
    for spec in &specs {
        rt.ensure(spec).await.unwrap();
    }
    for spec in &specs {
        wait_for_server(&rt, &spec.id, 8000).await;
    }
    for round in 1..=2 {
        let hibernates = specs.iter().map(|s| {
            let (rt, id) = (rt.clone(), s.id.clone());
            async move { rt.hibernate(&id).await }
        });
        for result in futures_join_all(hibernates).await {
            result.unwrap();
        }
        let restores = specs.iter().map(|s| {
            let (rt, id) = (rt.clone(), s.id.clone());
            async move { rt.restore(&id).await }
        });
        for result in futures_join_all(restores).await {
            assert_eq!(result.unwrap().state, SandboxState::Running);
        }
        for spec in &specs {
            let want = format!("count={round}\n");
            assert_eq!(http_body(&rt, &spec.id, 8000, "/count").await, Some(want));
        }
    }
    for spec in &specs {
        rt.delete(&spec.id).await.unwrap();
    }
}

/// Runs the futures concurrently (as tasks on the runtime) and returns their outputs in order.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_criu_hibernate_is_unsupported_and_the_sandbox_runs_on() {
    if !root_or_skip("without_criu_hibernate_is_unsupported_and_the_sandbox_runs_on") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path().join("state"), "nocriu");
    config.criu_binary = Some(dir.path().join("no-such-criu"));
    let rt = LocalRuntime::open(config).await.unwrap();
    let spec = sh("no-criu", "exec sleep 1000");
    rt.ensure(&spec).await.unwrap();
    let err = rt.hibernate(&spec.id).await.unwrap_err();
    assert!(
        matches!(&err, RuntimeError::Unsupported { operation: Operation::Hibernate, reason } if reason.contains("criu not found") && reason.contains("hibernate (hibernating pauses, snapshots and forks) is off") && reason.contains("scripts/install-criu.sh")),
        "{err}"
    );
    assert!(!err.is_retryable());
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Running);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_binary_is_mounted_read_only_and_runs_at_normal_cpu_weight() {
    if !root_or_skip("a_tool_binary_is_mounted_read_only_and_runs_at_normal_cpu_weight") {
        return;
    }
    let dir = tempfile::Builder::new().prefix("oka-rt-").tempdir().unwrap();
    let tool = dir.path().join("hello-tool");
    std::fs::write(&tool, "#!/bin/sh\necho \"tool $1\" > /root/out\necho rw > /.oka/hello 2>/dev/null || echo read-only >> /root/out\necho END >> /root/out\nexec sleep infinity\n").unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut config = config(dir.path().join("state"), "tool");
    config.tools.insert("hello".into(), tool.clone());
    let rt = LocalRuntime::open(config).await.unwrap();
    let id = id_of("tool");
    let spec = oka_runtime_api::SandboxSpec::new(
        id.clone(),
        vec![oka_runtime::local::tool_path("hello").display().to_string(), "ran".into()],
    );
    rt.ensure(&spec).await.unwrap();
    let out = wait_for_file(&rt, &id, "/root/out", "END").await;
    assert_eq!(out, "tool ran\nread-only\nEND\n");
    // Sandboxes start at background CPU weight; a running one has the normal weight.
    let cgroups = rt.cgroup_paths(&id).await.unwrap();
    for (controller, dir) in &cgroups.v1 {
        if *controller == Controller::Cpu {
            let shares = std::fs::read_to_string(dir.join("cpu.shares")).unwrap();
            assert_eq!(shares.trim(), "1024", "a running sandbox keeps the background weight");
        }
    }
    if let Some(dir) =
        cgroups.v2.as_ref().filter(|_| cgroups.v2_controllers.contains(&Controller::Cpu))
    {
        assert_eq!(std::fs::read_to_string(dir.join("cpu.weight")).unwrap().trim(), "100");
    }
    rt.delete(&id).await.unwrap();

    let mut bad = common::config(dir.path().join("state2"), "tool-bad");
    bad.tools.insert("envd".into(), dir.path().join("hello-tool"));
    let err = LocalRuntime::open(bad).await.unwrap_err();
    assert!(err.to_string().contains("tool name \"envd\""), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_beyond_the_parallel_limit_wait_their_turn_and_all_run() {
    if !root_or_skip("starts_beyond_the_parallel_limit_wait_their_turn_and_all_run") {
        return;
    }
    let dir = tempfile::Builder::new().prefix("oka-rt-").tempdir().unwrap();
    let mut config = config(dir.path().join("state"), "turns");
    config.max_parallel_starts = 1;
    let rt = LocalRuntime::open(config).await.unwrap();
    let ids: Vec<_> = (0..4).map(|i| format!("turns-{i}")).collect();
    let mut starting = tokio::task::JoinSet::new();
    for id in &ids {
        let (rt, spec) =
            (rt.clone(), sh(id, "echo up > /root/out; echo END >> /root/out; exec sleep infinity"));
        starting.spawn(async move { rt.ensure(&spec).await });
    }
    while let Some(status) = starting.join_next().await {
        assert_eq!(status.unwrap().unwrap().state, SandboxState::Running);
    }
    for id in &ids {
        assert_eq!(wait_for_file(&rt, &id_of(id), "/root/out", "END").await, "up\nEND\n");
    }
    for id in &ids {
        rt.delete(&id_of(id)).await.unwrap();
    }
}

/// Nice value of every thread of this process (field 19 of `/proc/self/task/*/stat`).
fn thread_nice_values() -> Vec<i32> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.unwrap().path().join("stat")).ok())
        .map(|stat| {
            let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
            fields[16].parse().unwrap()
        })
        .collect()
}

/// The runtime starts sandboxes at background priority (nice 19) on its blocking threads and
/// puts every thread back afterwards: nothing else the process runs later on those threads
/// (file IO, other requests) is left slowed down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_sandboxes_leaves_no_thread_at_background_priority() {
    if !root_or_skip("starting_sandboxes_leaves_no_thread_at_background_priority") {
        return;
    }
    let (rt, _dir) = runtime("nice").await;
    let specs: Vec<_> = (0..4).map(|i| sh(&format!("nice-{i}"), "exec sleep 1000")).collect();
    for spec in &specs {
        rt.ensure(spec).await.unwrap();
    }
    let nice = thread_nice_values();
    assert!(nice.iter().all(|&n| n == 0), "nice values of this process's threads: {nice:?}");
    for spec in &specs {
        rt.delete(&spec.id).await.unwrap();
    }
}

/// Directories named `name` under `/sys/fs/cgroup`, at most `depth` levels down.
fn cgroup_dirs_named(name: &str, dir: &std::path::Path, depth: usize) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if entry.file_name() == name {
            found.push(entry.path());
        } else if depth > 1 {
            found.extend(cgroup_dirs_named(name, &entry.path(), depth - 1));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_going_away_removes_its_cgroups_once_no_sandbox_is_left() {
    if !root_or_skip("a_runtime_going_away_removes_its_cgroups_once_no_sandbox_is_left") {
        return;
    }
    let (rt, _dir) = runtime("cgroups-gone").await;
    let root = std::path::Path::new("/sys/fs/cgroup");
    let spec = sh("kept", "exec sleep 1000");
    rt.ensure(&spec).await.unwrap();
    let parents = cgroup_dirs_named("oka-test-cgroups-gone", root, 4);
    assert!(!parents.is_empty(), "the runtime's cgroups exist");
    assert!(!rt.remove_cgroups(), "a sandbox is still in them");
    assert_eq!(cgroup_dirs_named("oka-test-cgroups-gone", root, 4), parents, "all kept");
    rt.delete(&spec.id).await.unwrap();
    assert!(rt.remove_cgroups());
    assert!(cgroup_dirs_named("oka-test-cgroups-gone", root, 4).is_empty(), "{parents:?}");
}

/// The memory limit a sandbox's cgroup enforces now, read from the cgroup files its record names.
fn memory_limit(dir: &std::path::Path, id: &oka_runtime_api::SandboxId) -> Option<String> {
    let record = dir.join("state/sandboxes").join(id.as_str()).join("state.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(record).ok()?).ok()?;
    let mut paths = Vec::new();
    fn strings(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::String(s) if s.starts_with("/sys/fs/cgroup") => out.push(s.clone()),
            serde_json::Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
            serde_json::Value::Object(m) => m.values().for_each(|v| strings(v, out)),
            _ => {}
        }
    }
    strings(&json, &mut paths);
    paths.iter().find_map(|p| {
        let p = std::path::Path::new(p);
        std::fs::read_to_string(p.join("memory.limit_in_bytes"))
            .or_else(|_| std::fs::read_to_string(p.join("memory.max")))
            .ok()
            .map(|s| s.trim().to_owned())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_changes_limits_in_place_and_refuses_anything_else() {
    if !root_or_skip("update_changes_limits_in_place_and_refuses_anything_else") {
        return;
    }
    let (rt, dir) = runtime("update").await;
    let mut spec = sh("update", "exec sleep 1000");
    spec.resources.memory_bytes = Some(64 << 20);
    let before = rt.ensure(&spec).await.unwrap();
    assert_eq!(memory_limit(dir.path(), &spec.id).as_deref(), Some("67108864"));
    assert_eq!(rt.update(&spec).await.unwrap(), UpdateOutcome::Unchanged, "the same spec");
    spec.resources.memory_bytes = Some(128 << 20);
    assert_eq!(rt.update(&spec).await.unwrap(), UpdateOutcome::Updated);
    assert_eq!(memory_limit(dir.path(), &spec.id).as_deref(), Some("134217728"));
    let after = rt.inspect(&spec.id).await.unwrap();
    assert_eq!(after.pid, before.pid, "the processes run on");
    // The new spec is the sandbox's now.
    assert_eq!(rt.ensure(&spec).await.unwrap().pid, before.pid);
    let mut other = spec.clone();
    other.process = sh("update", "exec sleep 999").process;
    let Err(RuntimeError::Unsupported { reason, .. }) = rt.update(&other).await else {
        panic!("a command change must be refused");
    };
    assert!(reason.contains("process"), "{reason}");
    // A new root cannot slide under running processes: the caller restarts the sandbox on it.
    let mut moved = spec.clone();
    let root = tempfile::tempdir().unwrap();
    moved.root = RootFs::Directory(root.path().to_owned());
    let Ok(UpdateOutcome::RestartRequired { reason }) = rt.update(&moved).await else {
        panic!("a root change needs a restart");
    };
    assert!(reason.contains("root filesystem"), "{reason}");
    assert_eq!(rt.inspect(&spec.id).await.unwrap().pid, before.pid, "nothing changed");
    assert_eq!(rt.ensure(&spec).await.unwrap().pid, before.pid, "the old spec is still its");
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_restore_moves_a_sandbox_onto_a_new_spec_with_its_processes() {
    if !root_or_skip("checkpoint_restore_moves_a_sandbox_onto_a_new_spec_with_its_processes") {
        return;
    }
    let (rt, dir) = runtime("cr").await;
    let mut spec = counter_server("cr", 8000, 0);
    spec.resources.memory_bytes = Some(256 << 20);
    let id = spec.id.clone();
    rt.ensure(&spec).await.unwrap();
    wait_for_server(&rt, &id, 8000).await;
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=1\n"));
    // New limits: the processes move with their memory.
    spec.resources.memory_bytes = Some(384 << 20);
    rt.checkpoint_restore(&spec).await.unwrap();
    assert_eq!(rt.inspect(&id).await.unwrap().state, SandboxState::Running);
    wait_for_server(&rt, &id, 8000).await;
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=2\n"));
    assert_eq!(memory_limit(dir.path(), &id).as_deref(), Some("402653184"));
    assert_eq!(
        rt.ensure(&spec).await.unwrap().state,
        SandboxState::Running,
        "the new spec is its own"
    );
    // A new command cannot be given to old processes.
    let mut other = spec.clone();
    other.process = sh("cr", "exec sleep 5").process;
    let Err(RuntimeError::Unsupported { reason, .. }) = rt.checkpoint_restore(&other).await else {
        panic!("a command change must be refused");
    };
    assert!(reason.contains("process"), "{reason}");
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=3\n"));
    rt.delete(&id).await.unwrap();
}
