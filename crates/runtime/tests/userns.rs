//! Sandboxes in a user namespace of their own (`UserNamespace::Remapped`), against the real
//! kernel (as root): root inside is an unprivileged id outside.

#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::MetadataExt;

use common::*;
use oka_runtime_api::{Runtime, RuntimeError, SandboxState, UserNamespace};

const BASE: u32 = 1_200_000;

/// The `Uid:` line of `/proc/<pid>/status`: real, effective, saved, fs uid.
fn host_uids(pid: u32) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().skip(1).map(|u| u.parse().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_root_is_an_unprivileged_host_id_and_owns_what_it_writes() {
    if !root_or_skip("sandbox_root_is_an_unprivileged_host_id_and_owns_what_it_writes") {
        return;
    }
    let (rt, _dir) = runtime("userns").await;
    let mut spec = sh(
        "userns",
        "id -u > /uid; id -g >> /uid; \
         bash -c 'echo from-bash' > /shells; python3 -c 'print(\"from-python\")' >> /shells; \
         mkdir /made && echo x > /made/file; \
         cat /proc/self/uid_map | tr -s ' ' > /map; \
         echo END >> /shells; exec sleep 1000",
    );
    spec.user_namespace = UserNamespace::Remapped { host_base: BASE, size: 65_536 };
    let status = rt.ensure(&spec).await.unwrap();
    let shells = wait_for_file(&rt, &spec.id, "/shells", "END").await;
    assert_eq!(shells, "from-bash\nfrom-python\nEND\n", "bash and python3 run");
    assert_eq!(read_upper(&rt, &spec.id, "/uid").await.as_deref(), Some("0\n0\n"));
    let map = read_upper(&rt, &spec.id, "/map").await.unwrap();
    assert_eq!(map.split_whitespace().collect::<Vec<_>>(), ["0", &BASE.to_string(), "65536"]);

    // On the host, the init runs as the mapped id, not as root.
    let pid = status.pid.unwrap();
    assert_eq!(host_uids(pid), [BASE; 4]);

    // What it wrote in its writable layer belongs to the mapped id on the host.
    let upper = rt.paths(&spec.id).await.unwrap().upper;
    for path in ["uid", "made", "made/file"] {
        let meta = std::fs::metadata(upper.join(path)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (BASE, BASE), "{path}");
    }
    // Its cgroup is delegated to it (the directory, not the limit files).
    let cgroups = rt.cgroup_paths(&spec.id).await.unwrap();
    for dir in cgroups.dirs() {
        assert_eq!(std::fs::metadata(dir).unwrap().uid(), BASE, "{}", dir.display());
        assert_eq!(std::fs::metadata(dir.join("cgroup.procs")).unwrap().uid(), BASE);
    }

    // Pause and resume work as for any sandbox.
    rt.pause(&spec.id).await.unwrap();
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Paused);
    rt.resume(&spec.id).await.unwrap();
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remapped_sandbox_hibernates_and_restores_with_its_memory_and_its_ids() {
    if !root_or_skip("a_remapped_sandbox_hibernates_and_restores_with_its_memory_and_its_ids") {
        return;
    }
    let (rt, _dir) = runtime("userns-criu").await;
    let base = BASE + 65_536;
    let mut spec = counter_server_with("userns-criu", 8000, 1, "open('/before', 'w').write('x')");
    spec.user_namespace = UserNamespace::Remapped { host_base: base, size: 65_536 };
    rt.ensure(&spec).await.unwrap();
    wait_for_server(&rt, &spec.id, 8000).await;
    assert_eq!(http_body(&rt, &spec.id, 8000, "/count").await.as_deref(), Some("count=1\n"));

    rt.hibernate(&spec.id).await.unwrap();
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Hibernated);
    let restored = rt.restore(&spec.id).await.unwrap();
    assert_eq!(http_body(&rt, &spec.id, 8000, "/count").await.as_deref(), Some("count=2\n"));
    // Still in its user namespace: the same mapped ids, its cgroups delegated again.
    assert_eq!(host_uids(restored.pid.unwrap()), [base; 4]);
    for dir in rt.cgroup_paths(&spec.id).await.unwrap().dirs() {
        assert_eq!(std::fs::metadata(dir).unwrap().uid(), base, "{}", dir.display());
    }
    let upper = rt.paths(&spec.id).await.unwrap().upper;
    assert_eq!(std::fs::metadata(upper.join("before")).unwrap().uid(), base);
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_that_maps_host_root_is_refused() {
    if !root_or_skip("a_range_that_maps_host_root_is_refused") {
        return;
    }
    let (rt, _dir) = runtime("userns-bad").await;
    let mut spec = sh("userns-bad", "exec sleep 1000");
    spec.user_namespace = UserNamespace::Remapped { host_base: 0, size: 65_536 };
    let err = rt.ensure(&spec).await.unwrap_err();
    assert!(matches!(err, RuntimeError::InvalidSpec(_)), "{err:?}");
    assert!(rt.list().await.unwrap().is_empty());
}
