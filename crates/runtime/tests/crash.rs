//! Crash safety: nothing leaks across create/delete or hibernate/restore cycles; a runtime killed
//! with SIGKILL is replaced by one that re-adopts its live sandboxes (restored ones included),
//! keeps its hibernated ones, and cleans up after dead and half-made ones.
//!
//! These run real sandboxes and need root; they print a SKIPPED line otherwise.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions may unwrap too

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use oka_runtime::local::cgroup::CgroupPaths;
use oka_runtime::local::state::{
    Phase, Resource, STATE_VERSION, SandboxPaths, SandboxRecord, StateStore,
};
use oka_runtime::local::{LocalError, LocalRuntime, become_subreaper};
use oka_runtime_api::{Runtime, SandboxState};

/// What the leak test counts.
#[derive(Debug, PartialEq, Eq)]
struct Footprint {
    mounts: usize,
    children: usize,
    fds: usize,
    sandbox_cgroups: usize,
    sandbox_dirs: usize,
}

/// Counts what this test process and its runtime hold. Mounts are counted under `root` only (the
/// test's temporary directory): tests in other processes make and remove mounts of their own in
/// the same mount namespace at the same time.
fn footprint(root: &Path, cgroup_parents: &[PathBuf], sandboxes: &Path) -> Footprint {
    let me = std::process::id().to_string();
    let children = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            let after = &stat[stat.rfind(')').unwrap() + 1..];
            after.split_whitespace().nth(1) == Some(me.as_str())
        })
        .count();
    let count_dirs = |dir: &Path| {
        std::fs::read_dir(dir)
            .map(|d| d.flatten().filter(|e| e.path().is_dir()).count())
            .unwrap_or(0)
    };
    Footprint {
        mounts: host_mounts_under(root).len(),
        children,
        fds: std::fs::read_dir("/proc/self/fd").unwrap().count(),
        sandbox_cgroups: cgroup_parents.iter().map(|p| count_dirs(p)).sum(),
        sandbox_dirs: count_dirs(sandboxes),
    }
}

impl Footprint {
    /// Whether this holds nothing more than `baseline`: the same mounts, children, cgroups and
    /// sandbox directories, and no more descriptors. Descriptors may be fewer: the runtime's
    /// lazily made ones (blocking-pool threads' pidfds, a connection being closed) can be open
    /// when the baseline is taken and gone later; a leak only ever adds.
    fn holds_no_more_than(&self, baseline: &Footprint) -> bool {
        self.mounts == baseline.mounts
            && self.children == baseline.children
            && self.fds <= baseline.fds
            && self.sandbox_cgroups == baseline.sandbox_cgroups
            && self.sandbox_dirs == baseline.sandbox_dirs
    }
}

/// Polls `measure` until it holds no more than `want`; on timeout fails with both values.
async fn settle(what: &str, want: &Footprint, measure: impl Fn() -> Footprint) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = measure();
        if now.holds_no_more_than(want) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}: have {now:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn parents(paths: &CgroupPaths) -> Vec<PathBuf> {
    paths.dirs().iter().map(|d| d.parent().unwrap().to_path_buf()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_create_delete_cycles_leak_no_mount_cgroup_process_or_descriptor() {
    if !root_or_skip("a_hundred_create_delete_cycles_leak_no_mount_cgroup_process_or_descriptor") {
        return;
    }
    let (rt, dir) = runtime("leak").await;
    let sandboxes = dir.path().join("state/sandboxes");
    // A first cycle to learn where the cgroups go and to warm up lazily created things
    // (blocking-pool threads, the reactor's descriptors).
    let warm = sh("warm", "exec sleep 1000");
    rt.ensure(&warm).await.unwrap();
    let cgroup_parents = parents(&rt.cgroup_paths(&warm.id).await.unwrap());
    rt.delete(&warm.id).await.unwrap();
    let before = footprint(dir.path(), &cgroup_parents, &sandboxes);
    assert_eq!(before.sandbox_cgroups, 0);

    for i in 0..100 {
        let spec = sh(&format!("cycle-{i}"), "sleep 1000 & exec sleep 1000");
        let status = rt.ensure(&spec).await.unwrap();
        assert_eq!(status.state, SandboxState::Running);
        rt.delete(&spec.id).await.unwrap();
    }
    settle("the footprint to return to where it was", &before, || {
        footprint(dir.path(), &cgroup_parents, &sandboxes)
    })
    .await;
    assert!(rt.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_hibernate_restore_cycles_leak_no_mount_cgroup_process_or_descriptor() {
    if !root_or_skip("ten_hibernate_restore_cycles_leak_no_mount_cgroup_process_or_descriptor") {
        return;
    }
    let (rt, dir) = runtime("hibleak").await;
    let sandboxes = dir.path().join("state/sandboxes");
    let spec = counter_server("cycler", 8000, 4);
    let id = spec.id.clone();
    rt.ensure(&spec).await.unwrap();
    wait_for_server(&rt, &id, 8000).await;
    let cgroup_parents = parents(&rt.cgroup_paths(&id).await.unwrap());
    // A first cycle warms up what is created lazily (the CRIU probe, blocking-pool threads).
    rt.hibernate(&id).await.unwrap();
    rt.restore(&id).await.unwrap();
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=1\n"));
    let fp = || footprint(dir.path(), &cgroup_parents, &sandboxes);
    let before = poll("the warm-up to settle", Duration::from_secs(10), || {
        let a = fp();
        async move { (a == fp()).then_some(a) }
    })
    .await;
    assert_eq!((before.sandbox_cgroups, before.sandbox_dirs), (cgroup_parents.len(), 1));

    for i in 2..12 {
        rt.hibernate(&id).await.unwrap();
        let restored = rt.restore(&id).await.unwrap();
        assert_eq!(restored.state, SandboxState::Running);
        let want = format!("count={i}\n");
        assert_eq!(http_body(&rt, &id, 8000, "/count").await, Some(want));
    }
    settle("the footprint to return to where it was", &before, fp).await;
    // One tree in the sandbox: the init and python.
    let cgroups = rt.cgroup_paths(&id).await.unwrap();
    assert_eq!(cgroups.processes().unwrap().len(), 2);
    rt.delete(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernated_sandbox_survives_a_runtime_restart_and_restores() {
    if !root_or_skip("hibernated_sandbox_survives_a_runtime_restart_and_restores") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let spec = counter_server("sleeper", 8000, 0);
    let id = spec.id.clone();
    let rt = LocalRuntime::open(config(state.clone(), "hibrestart")).await.unwrap();
    rt.ensure(&spec).await.unwrap();
    wait_for_server(&rt, &id, 8000).await;
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=1\n"));
    rt.hibernate(&id).await.unwrap();
    drop(rt);

    let rt = LocalRuntime::open(config(state.clone(), "hibrestart")).await.unwrap();
    let listed: Vec<(String, SandboxState)> =
        rt.list().await.unwrap().into_iter().map(|s| (s.id.to_string(), s.state)).collect();
    assert_eq!(listed, [("sleeper".to_owned(), SandboxState::Hibernated)]);
    let restored = rt.restore(&id).await.unwrap();
    assert_eq!(restored.state, SandboxState::Running);
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=2\n"));
    drop(rt);

    // A restored sandbox is re-adopted like any other (its pid and start time are recorded).
    let rt = LocalRuntime::open(config(state.clone(), "hibrestart")).await.unwrap();
    let status = rt.inspect(&id).await.unwrap();
    assert_eq!((status.state, status.pid), (SandboxState::Running, restored.pid));
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=3\n"));
    rt.hibernate(&id).await.unwrap();
    rt.restore(&id).await.unwrap();
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=4\n"));
    rt.delete(&id).await.unwrap();
    assert_eq!(std::fs::read_dir(state.join("sandboxes")).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_finishes_a_hibernate_interrupted_by_a_crash() {
    if !root_or_skip("open_finishes_a_hibernate_interrupted_by_a_crash") {
        return;
    }
    become_subreaper().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let store = StateStore::open(&state).unwrap();
    let rt = LocalRuntime::open(config(state.clone(), "hibcrash")).await.unwrap();
    let (dumped, interrupted) = (counter_server("dumped", 8000, 0), counter_server("cut", 8000, 0));
    for spec in [&dumped, &interrupted] {
        rt.ensure(spec).await.unwrap();
        wait_for_server(&rt, &spec.id, 8000).await;
        assert_eq!(http_body(&rt, &spec.id, 8000, "/count").await.as_deref(), Some("count=1\n"));
    }
    // `dumped`: the runtime died after `criu dump` succeeded, before recording it. The record
    // still says running, with the instance and an incomplete checkpoint.
    let sandbox_dir = store.sandbox_dir(&dumped.id);
    let running = store.read(&sandbox_dir).unwrap();
    rt.hibernate(&dumped.id).await.unwrap();
    let mut crashed = store.read(&sandbox_dir).unwrap();
    assert_eq!(crashed.phase, Phase::Hibernated);
    crashed.phase = Phase::Running;
    crashed.instance = running.instance.clone();
    crashed.checkpoint.as_mut().unwrap().complete = false;
    store.write(&crashed).unwrap();
    // `cut`: the runtime died while `criu dump` ran, and the dump did not complete.
    let cut_dir = store.sandbox_dir(&interrupted.id);
    let mut cut = store.read(&cut_dir).unwrap();
    let mut checkpoint = crashed.checkpoint.clone().unwrap();
    checkpoint.dir = cut.paths.checkpoint();
    checkpoint.images = cut.paths.checkpoint().join("images");
    std::fs::create_dir_all(&checkpoint.images).unwrap();
    std::fs::write(checkpoint.images.join("pages-1.img"), b"partial").unwrap();
    cut.resources.push(Resource::Dir(checkpoint.dir.clone()));
    cut.checkpoint = Some(checkpoint);
    store.write(&cut).unwrap();
    let cut_pid = rt.inspect(&interrupted.id).await.unwrap().pid;
    // And a spent checkpoint whose removal in the background the crash cut short.
    let spent = cut_dir.join("checkpoint.spent-1-0/images");
    std::fs::create_dir_all(&spent).unwrap();
    std::fs::write(spent.join("pages-1.img"), b"old").unwrap();
    drop(rt);

    let rt = LocalRuntime::open(config(state.clone(), "hibcrash")).await.unwrap();
    assert_eq!(rt.inspect(&dumped.id).await.unwrap().state, SandboxState::Hibernated);
    rt.restore(&dumped.id).await.unwrap();
    assert_eq!(http_body(&rt, &dumped.id, 8000, "/count").await.as_deref(), Some("count=2\n"));
    let status = rt.inspect(&interrupted.id).await.unwrap();
    assert_eq!((status.state, status.pid), (SandboxState::Running, cut_pid));
    assert!(!cut_dir.join("checkpoint").exists(), "the partial checkpoint is removed");
    assert!(!cut_dir.join("checkpoint.spent-1-0").exists(), "so is the spent one");
    assert_eq!(store.read(&cut_dir).unwrap().checkpoint, None);
    let body = http_body(&rt, &interrupted.id, 8000, "/count").await;
    assert_eq!(body.as_deref(), Some("count=2\n"));
    rt.hibernate(&interrupted.id).await.expect("and it hibernates normally");
    for spec in [&dumped, &interrupted] {
        rt.delete(&spec.id).await.unwrap();
    }
}

/// The helper side of the kill -9 test for restored sandboxes, run in a child process (this
/// test binary executed again with `OKA_HIBERNATE_STATE` set): opens a runtime, starts a counting
/// server, counts once, hibernates and restores it, counts again, prints `READY <pid>` and waits
/// to be killed. Without the variable it does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_helper() {
    let Ok(state) = std::env::var("OKA_HIBERNATE_STATE") else { return };
    let rt = LocalRuntime::open(config(state.into(), "hibkill")).await.unwrap();
    let spec = counter_server("phoenix", 8000, 0);
    rt.ensure(&spec).await.unwrap();
    wait_for_server(&rt, &spec.id, 8000).await;
    assert_eq!(http_body(&rt, &spec.id, 8000, "/count").await.as_deref(), Some("count=1\n"));
    rt.hibernate(&spec.id).await.unwrap();
    let restored = rt.restore(&spec.id).await.unwrap();
    assert_eq!(http_body(&rt, &spec.id, 8000, "/count").await.as_deref(), Some("count=2\n"));
    println!("READY {}", restored.pid.unwrap());
    std::future::pending::<()>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_killed_after_a_restore_is_replaced_by_one_that_readopts_the_restored_sandbox() {
    if !root_or_skip(
        "a_runtime_killed_after_a_restore_is_replaced_by_one_that_readopts_the_restored_sandbox",
    ) {
        return;
    }
    // The restored init is the helper's child; once the helper dies it comes to us.
    become_subreaper().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let pid = run_helper_until_ready("restore_helper", "OKA_HIBERNATE_STATE", &state);

    let rt = LocalRuntime::open(config(state.clone(), "hibkill")).await.unwrap();
    let id = id_of("phoenix");
    let status = rt.inspect(&id).await.unwrap();
    assert_eq!((status.state, status.pid), (SandboxState::Running, Some(pid)));
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=3\n"));
    // A re-adopted sandbox hibernates and restores too.
    rt.hibernate(&id).await.unwrap();
    poll("the re-adopted init to be reaped", Duration::from_secs(10), || async {
        (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    })
    .await;
    rt.restore(&id).await.unwrap();
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=4\n"));
    rt.delete(&id).await.unwrap();
    assert_eq!(std::fs::read_dir(state.join("sandboxes")).unwrap().count(), 0);
}

/// Runs this test binary's `helper` test in a child process with `env` set to `state`, waits for
/// its `READY <pid>` line, kills it with SIGKILL and returns the pid.
fn run_helper_until_ready(helper: &str, env: &str, state: &Path) -> u32 {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", helper, "--nocapture", "--test-threads", "1"])
        .env(env, state)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let pid: u32 = loop {
        let line = lines.next().expect("helper ended before READY").unwrap();
        // libtest prints "test <name> ... " without a newline before our line.
        if let Some((_, pid)) = line.split_once("READY ") {
            break pid.trim().parse().unwrap();
        }
    };
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    pid
}

/// The helper side of the re-adoption test, run in a child process (this test binary executed
/// again with `OKA_READOPT_STATE` set): opens a runtime, starts a sandbox serving HTTP, prints
/// `READY <pid>` and waits to be killed. Without the variable it does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readoption_helper() {
    let Ok(state) = std::env::var("OKA_READOPT_STATE") else { return };
    let rt = LocalRuntime::open(config(state.into(), "readopt")).await.unwrap();
    let spec = http_server("survivor", 8000);
    let status = rt.ensure(&spec).await.unwrap();
    poll("http server to answer", Duration::from_secs(20), || http_get(&rt, &spec.id, 8000)).await;
    println!("READY {}", status.pid.unwrap());
    std::future::pending::<()>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_killed_with_sigkill_is_replaced_by_one_that_readopts_its_sandbox() {
    if !root_or_skip("a_runtime_killed_with_sigkill_is_replaced_by_one_that_readopts_its_sandbox") {
        return;
    }
    // Orphaned sandbox inits come to us, not to the host's slow PID 1.
    become_subreaper().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let pid = run_helper_until_ready("readoption_helper", "OKA_READOPT_STATE", &state);

    let rt = LocalRuntime::open(config(state.clone(), "readopt")).await.unwrap();
    let id = id_of("survivor");
    let status = rt.inspect(&id).await.unwrap();
    assert_eq!(status.state, SandboxState::Running);
    assert_eq!(status.pid, Some(pid), "the same init, not a new one");
    let response = poll("the re-adopted sandbox to answer", Duration::from_secs(20), || {
        http_get(&rt, &id, 8000)
    })
    .await;
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
    rt.pause(&id).await.unwrap();
    rt.resume(&id).await.unwrap();

    let cgroups = rt.cgroup_paths(&id).await.unwrap();
    rt.delete(&id).await.unwrap();
    assert!(cgroups.dirs().iter().all(|d| !d.exists()), "cgroups removed");
    assert_eq!(std::fs::read_dir(state.join("sandboxes")).unwrap().count(), 0);
    poll("the init to be gone", Duration::from_secs(10), || async {
        (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_stops_sandboxes_whose_processes_died_and_removes_half_created_ones() {
    if !root_or_skip("open_stops_sandboxes_whose_processes_died_and_removes_half_created_ones") {
        return;
    }
    become_subreaper().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let rt = LocalRuntime::open(config(state.clone(), "recover")).await.unwrap();
    let spec = sh("dies", "echo kept > /root/kept; exec sleep 1000");
    let status = rt.ensure(&spec).await.unwrap();
    wait_for_file(&rt, &spec.id, "/root/kept", "kept").await;
    let cgroups = rt.cgroup_paths(&spec.id).await.unwrap();
    drop(rt);

    // The sandbox dies while no runtime watches it.
    let pid = status.pid.unwrap() as i32;
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    poll("the init to be reaped", Duration::from_secs(10), || async {
        let gone = rustix::process::waitpid(
            rustix::process::Pid::from_raw(pid),
            rustix::process::WaitOptions::NOHANG,
        )
        .map(|r| r.is_some())
        .unwrap_or(true);
        gone.then_some(())
    })
    .await;

    // A create that crashed half-way: its record and directories exist, nothing else.
    let store = StateStore::open(&state).unwrap();
    let half_id = id_of("half");
    let paths = SandboxPaths::new(store.sandbox_dir(&half_id));
    let half = SandboxRecord {
        version: STATE_VERSION,
        spec: sh("half", "true"),
        phase: Phase::Creating,
        created: false,
        paths: paths.clone(),
        lower: vec![],
        resources: vec![Resource::Dir(paths.dir.clone())],
        instance: None,
        checkpoint: None,
        network: None,
        egress: None,
    };
    store.write(&half).unwrap();
    std::fs::create_dir(&paths.upper).unwrap();
    // And a directory with no state file at all.
    std::fs::create_dir(state.join("sandboxes/stray")).unwrap();

    let rt = LocalRuntime::open(config(state.clone(), "recover")).await.unwrap();
    let status = rt.inspect(&spec.id).await.unwrap();
    assert_eq!(status.state, SandboxState::Stopped);
    assert!(cgroups.dirs().iter().all(|d| !d.exists()), "the dead sandbox's cgroups are removed");
    assert_eq!(
        read_upper(&rt, &spec.id, "/root/kept").await.as_deref(),
        Some("kept\n"),
        "its layer is kept"
    );
    assert_eq!(rt.inspect(&half_id).await.unwrap().state, SandboxState::Gone);
    assert!(!paths.dir.exists());
    assert!(!state.join("sandboxes/stray").exists());
    let names: BTreeMap<String, SandboxState> =
        rt.list().await.unwrap().into_iter().map(|s| (s.id.to_string(), s.state)).collect();
    assert_eq!(names, BTreeMap::from([("dies".to_owned(), SandboxState::Stopped)]));

    // It starts again on the kept layer.
    rt.ensure(&spec).await.unwrap();
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Running);
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_runtime_on_the_same_state_directory_is_refused() {
    if !root_or_skip("a_second_runtime_on_the_same_state_directory_is_refused") {
        return;
    }
    let (rt, dir) = runtime("lock").await;
    let second = LocalRuntime::open(config(dir.path().join("state"), "lock")).await;
    assert!(
        matches!(
            second.as_ref().map_err(|e| e.backend_error::<LocalError>()),
            Err(Some(LocalError::Locked(_)))
        ),
        "{second:?}"
    );
    drop(rt);
    LocalRuntime::open(config(dir.path().join("state"), "lock"))
        .await
        .expect("free once the first is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hibernated_sandbox_restores_after_the_init_binary_is_replaced() {
    if !root_or_skip("a_hibernated_sandbox_restores_after_the_init_binary_is_replaced") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let init = dir.path().join("oka-init");
    std::fs::copy(init_binary(), &init).unwrap();
    let mut config = config(dir.path().join("state"), "upgrade");
    config.init_binary = init.clone();
    let spec = counter_server("upgraded", 8000, 0);
    let rt = LocalRuntime::open(config.clone()).await.unwrap();
    rt.ensure(&spec).await.unwrap();
    wait_for_server(&rt, &spec.id, 8000).await;
    assert_eq!(http_body(&rt, &spec.id, 8000, "/count").await.as_deref(), Some("count=1\n"));
    rt.hibernate(&spec.id).await.unwrap();
    drop(rt);

    // An upgrade replaces the binary with a different one (a new file of another size).
    let mut upgraded = std::fs::read(init_binary()).unwrap();
    upgraded.extend_from_slice(b"\0upgraded");
    std::fs::remove_file(&init).unwrap();
    std::fs::write(&init, upgraded).unwrap();
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let rt = LocalRuntime::open(config).await.unwrap();
    rt.restore(&spec.id).await.unwrap();
    assert_eq!(http_body(&rt, &spec.id, 8000, "/count").await.as_deref(), Some("count=2\n"));
    // New sandboxes start with the new binary.
    let fresh = counter_server("fresh", 8000, 0);
    rt.ensure(&fresh).await.unwrap();
    wait_for_server(&rt, &fresh.id, 8000).await;
    for id in [&spec.id, &fresh.id] {
        rt.delete(id).await.unwrap();
    }
}
