//! The local runtime on the unified (cgroup v2) hierarchy alone (`LocalConfig::cgroup_v2_only`),
//! as a pure v2 host would run it, against the real kernel (as root).
//!
//! Our machines are hybrid: every controller is bound to a v1 hierarchy and the unified mount
//! offers only `hugetlb`. So what these tests can exercise on v2 is what needs no controller:
//! placing the tree in a v2 cgroup, `cgroup.freeze` for pause and resume, `cgroup.kill` for delete,
//! usage from `cpu.stat`, CRIU's `--cgroup-root` without a controller for hibernate and restore.
//! CPU, memory and PID limits on v2 (`cpu.max`, `memory.max`, `pids.max`) are tested only where the
//! unified hierarchy offers the controller; elsewhere a spec asking for them must be refused with
//! a typed error, which is tested instead.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use oka_runtime::local::LocalRuntime;
use oka_runtime_api::{Operation, Runtime, RuntimeError, SandboxState};

async fn v2_runtime(name: &str) -> (LocalRuntime, tempfile::TempDir) {
    let dir = tempfile::Builder::new().prefix("oka-v2-").tempdir().unwrap();
    let mut config = config(dir.path().join("state"), name);
    config.cgroup_v2_only = true;
    (LocalRuntime::open(config).await.unwrap(), dir)
}

/// Controllers the unified hierarchy offers to our own cgroup.
fn unified_controllers() -> Vec<String> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let own = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap().trim_start_matches('/');
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mount = mountinfo
        .lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            post.starts_with("cgroup2 ").then(|| pre.split(' ').nth(4).unwrap().to_owned())
        })
        .unwrap();
    let path = std::path::Path::new(&mount).join(own).join("cgroup.controllers");
    std::fs::read_to_string(path).unwrap().split_whitespace().map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cgroup_v2_a_sandbox_runs_pauses_resumes_hibernates_and_is_removed() {
    if !root_or_skip("on_cgroup_v2_a_sandbox_runs_pauses_resumes_hibernates_and_is_removed") {
        return;
    }
    let (rt, _dir) = v2_runtime("v2").await;
    let spec = sh(
        "v2",
        "i=0; while true; do i=$((i+1)); echo $i > /tmp/n; echo $i >> /root/ticks; sleep 0.01; done",
    );
    let status = rt.ensure(&spec).await.unwrap();
    let pid = status.pid.unwrap();
    let cgroups = rt.cgroup_paths(&spec.id).await.unwrap();
    assert!(cgroups.v1.is_empty(), "no v1 hierarchy is used: {cgroups:?}");
    let dir = cgroups.v2.clone().unwrap();
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
    assert!(procs.lines().any(|p| p == pid.to_string()), "the init is in {}", dir.display());
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(own.lines().any(|l| l.starts_with("0::")), "{own}");
    let usage = rt.inspect(&spec.id).await.unwrap().usage.unwrap();
    assert!(usage.cpu.is_some(), "CPU time from cpu.stat: {usage:?}");

    // Pause with cgroup.freeze: the loop stops; resume: it goes on.
    let ticks = |rt: &LocalRuntime| {
        let rt = rt.clone();
        let id = spec.id.clone();
        async move { read_upper(&rt, &id, "/root/ticks").await.map_or(0, |s| s.lines().count()) }
    };
    poll("the loop to tick", Duration::from_secs(20), || async {
        (ticks(&rt).await > 2).then_some(())
    })
    .await;
    rt.pause(&spec.id).await.unwrap();
    assert_eq!(std::fs::read_to_string(dir.join("cgroup.freeze")).unwrap().trim(), "1");
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Paused);
    let frozen_at = ticks(&rt).await;
    let later = std::time::Instant::now() + Duration::from_millis(200);
    while std::time::Instant::now() < later {
        assert_eq!(ticks(&rt).await, frozen_at, "nothing runs while frozen");
        tokio::task::yield_now().await;
    }
    rt.resume(&spec.id).await.unwrap();
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Running);
    poll("the loop to go on", Duration::from_secs(20), || async {
        (ticks(&rt).await > frozen_at).then_some(())
    })
    .await;

    // Hibernate (while paused) and restore with CRIU's v2 --cgroup-root: back in a v2 cgroup,
    // running, still counting.
    // A v1 cgroup that exists at dump time and is gone by the restore (as another sandbox's
    // would be) is not brought back: CRIU dumps only the hierarchies the sandbox has cgroups in.
    let own_cpu = std::fs::read_to_string("/proc/self/cgroup")
        .unwrap()
        .lines()
        .any(|l| l.ends_with(":cpu:/") || l.ends_with(":cpu,cpuacct:/"));
    let stranger = std::path::Path::new("/sys/fs/cgroup/cpu")
        .join(format!("oka-v2-stranger-{}", std::process::id()));
    let probe_stranger =
        own_cpu && std::path::Path::new("/sys/fs/cgroup/cpu/cgroup.procs").exists();
    if probe_stranger {
        std::fs::create_dir(&stranger).unwrap();
    }
    // Paused first: CRIU collects the frozen tree through v2 `cgroup.freeze` (`--freeze-cgroup`).
    rt.pause(&spec.id).await.unwrap();
    rt.hibernate(&spec.id).await.unwrap();
    if probe_stranger {
        std::fs::remove_dir(&stranger).unwrap();
    }
    assert!(!dir.exists(), "the v2 cgroup goes with the processes");
    let restored = rt.restore(&spec.id).await.unwrap();
    let pid = restored.pid.unwrap();
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
    assert!(procs.lines().any(|p| p == pid.to_string()), "restored into {}", dir.display());
    let resurrected = stranger.exists();
    let _ = std::fs::remove_dir(&stranger);
    assert!(!resurrected, "a v1 cgroup removed after the dump came back with the restore");
    let after_restore = ticks(&rt).await;
    poll("the restored loop to go on", Duration::from_secs(20), || async {
        (ticks(&rt).await > after_restore).then_some(())
    })
    .await;

    // Delete kills through cgroup.kill and removes the cgroup.
    rt.delete(&spec.id).await.unwrap();
    assert!(!dir.exists());
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "the init is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cgroup_v2_limits_apply_where_the_controller_is_offered_and_are_refused_elsewhere() {
    if !root_or_skip(
        "on_cgroup_v2_limits_apply_where_the_controller_is_offered_and_are_refused_elsewhere",
    ) {
        return;
    }
    let (rt, _dir) = v2_runtime("v2-limits").await;
    let available = unified_controllers();
    let mut spec = sh("v2-limits", "exec sleep 1000");
    spec.resources.pids = Some(64);
    spec.resources.memory_bytes = Some(64 << 20);
    spec.resources.cpu_millis = Some(500);
    let wanted = ["cpu", "memory", "pids"];
    if wanted.iter().all(|c| available.iter().any(|a| a == c)) {
        rt.ensure(&spec).await.unwrap();
        let dir = rt.cgroup_paths(&spec.id).await.unwrap().v2.unwrap();
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap().trim().to_owned();
        assert_eq!(read("pids.max"), "64");
        assert_eq!(read("memory.max"), (64u64 << 20).to_string());
        assert_eq!(read("cpu.max"), "50000 100000");
        rt.delete(&spec.id).await.unwrap();
    } else {
        eprintln!("unified hierarchy offers {available:?}: checking that limits are refused");
        let err = rt.ensure(&spec).await.unwrap_err();
        assert!(
            matches!(&err, RuntimeError::Unsupported { operation: Operation::Ensure, reason } if reason.contains("cgroup controller")),
            "{err:?}"
        );
        assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Gone);
        assert!(rt.list().await.unwrap().is_empty(), "nothing was created");
    }
}
