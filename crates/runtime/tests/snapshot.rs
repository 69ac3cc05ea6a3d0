//! Snapshots of running sandboxes and sandboxes created from them (root, real CRIU).

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use oka_runtime::local::LocalRuntime;
use oka_runtime_api::{Runtime, RuntimeError, SandboxState};

/// The counter server with a file written into its root before it starts serving.
fn server(id: &str) -> oka_runtime_api::SandboxSpec {
    counter_server_with(id, 8000, 8, "open('/root/before.txt', 'w').write('written before')")
}

/// [`server`] created from snapshot `snap`.
fn clone_of(id: &str, snap: &oka_runtime_api::SandboxId) -> oka_runtime_api::SandboxSpec {
    oka_runtime_api::SandboxSpec { from_snapshot: Some(snap.clone()), ..server(id) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_a_running_server_clones_into_independent_sandboxes() {
    if !root_or_skip("a_snapshot_of_a_running_server_clones_into_independent_sandboxes") {
        return;
    }
    let (rt, dir) = runtime("snapshot").await;
    let spec = server("origin");
    let id = spec.id.clone();
    let snap = id_of("snap-1");
    assert!(matches!(rt.snapshot(&id, &snap).await, Err(RuntimeError::NotFound(_))));
    rt.ensure(&spec).await.unwrap();
    wait_for_server(&rt, &id, 8000).await;
    for n in 1..=3 {
        let body = http_body(&rt, &id, 8000, "/count").await;
        assert_eq!(body.as_deref(), Some(format!("count={n}\n").as_str()));
    }

    let info = rt.snapshot(&id, &snap).await.unwrap();
    assert_eq!((&info.name, &info.source), (&snap, &id));
    assert!(info.image_bytes > 8 << 20, "the server's memory is in the images: {info:?}");
    let again = rt.snapshot(&id, &snap).await.unwrap();
    assert_eq!(again, info, "a second snapshot under the same name is the same snapshot");

    // The original goes on running and counting.
    assert_eq!(rt.inspect(&id).await.unwrap().state, SandboxState::Running);
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=4\n"));

    // Two clones start from the snapshot's count, independently of each other.
    let (clone_a, clone_b) = (clone_of("clone-a", &snap), clone_of("clone-b", &snap));
    let a = rt.ensure(&clone_a).await.unwrap();
    let b = rt.ensure(&clone_b).await.unwrap();
    assert_eq!((a.state, b.state), (SandboxState::Running, SandboxState::Running));
    assert_eq!(http_body(&rt, &clone_a.id, 8000, "/count").await.as_deref(), Some("count=4\n"));
    assert_eq!(http_body(&rt, &clone_a.id, 8000, "/count").await.as_deref(), Some("count=5\n"));
    assert_eq!(http_body(&rt, &clone_b.id, 8000, "/count").await.as_deref(), Some("count=4\n"));
    assert_eq!(http_body(&rt, &id, 8000, "/count").await.as_deref(), Some("count=5\n"));
    let again = rt.ensure(&clone_a).await.unwrap();
    assert_eq!(again.pid, a.pid, "creating an existing clone again is a no-op");

    // Files written before the snapshot are in the clones; their layers are their own.
    for clone in [&clone_a.id, &clone_b.id] {
        let before = read_upper(&rt, clone, "root/before.txt").await;
        assert_eq!(before.as_deref(), Some("written before"));
    }
    let upper_a = rt.paths(&clone_a.id).await.unwrap().upper;
    std::fs::write(upper_a.join("root/only-a.txt"), "a").unwrap();
    assert_eq!(read_upper(&rt, &clone_b.id, "root/only-a.txt").await, None);

    // A clone is an ordinary sandbox: it hibernates and restores.
    rt.hibernate(&clone_b.id).await.unwrap();
    rt.restore(&clone_b.id).await.unwrap();
    assert_eq!(http_body(&rt, &clone_b.id, 8000, "/count").await.as_deref(), Some("count=5\n"));

    // Deleting the snapshot leaves the clones running; deleting everything leaves nothing.
    rt.delete_snapshot(&snap).await.unwrap();
    rt.delete_snapshot(&snap).await.expect("deleting a gone snapshot succeeds");
    assert_eq!(http_body(&rt, &clone_a.id, 8000, "/count").await.as_deref(), Some("count=6\n"));
    let missing = rt.ensure(&clone_of("clone-c", &snap)).await;
    assert!(missing.is_err(), "{missing:?}");
    assert_eq!(rt.inspect(&id_of("clone-c")).await.unwrap().state, SandboxState::Gone);
    let state = dir.path().join("state");
    for sandbox in [&id, &clone_a.id, &clone_b.id] {
        rt.delete(sandbox).await.unwrap();
    }
    assert_eq!(std::fs::read_dir(state.join("sandboxes")).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(state.join("snapshots")).unwrap().count(), 0);
    assert_eq!(host_mounts_under(&state), Vec::<String>::new());
    assert!(rt.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sandbox_is_snapshotted_and_stays_paused() {
    if !root_or_skip("a_paused_sandbox_is_snapshotted_and_stays_paused") {
        return;
    }
    let (rt, dir) = runtime("snapshot-paused").await;
    let spec = server("paused");
    rt.ensure(&spec).await.unwrap();
    wait_for_server(&rt, &spec.id, 8000).await;
    assert_eq!(http_body(&rt, &spec.id, 8000, "/count").await.as_deref(), Some("count=1\n"));
    rt.pause(&spec.id).await.unwrap();
    let snap = id_of("paused-snap");
    rt.snapshot(&spec.id, &snap).await.unwrap();
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Paused);
    let clone = clone_of("paused-clone", &snap);
    rt.ensure(&clone).await.unwrap();
    assert_eq!(http_body(&rt, &clone.id, 8000, "/count").await.as_deref(), Some("count=2\n"));
    rt.resume(&spec.id).await.unwrap();
    assert_eq!(http_body(&rt, &spec.id, 8000, "/count").await.as_deref(), Some("count=2\n"));
    // A snapshot of a stopped or hibernated sandbox is refused.
    rt.hibernate(&spec.id).await.unwrap();
    let refused = rt.snapshot(&spec.id, &id_of("other")).await;
    assert!(matches!(refused, Err(RuntimeError::InvalidState { .. })), "{refused:?}");
    rt.delete(&spec.id).await.unwrap();
    rt.delete(&clone.id).await.unwrap();
    rt.delete_snapshot(&snap).await.unwrap();
    let state = dir.path().join("state");
    assert_eq!(std::fs::read_dir(state.join("snapshots")).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(state.join("sandboxes")).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_outlive_the_runtime_and_incomplete_ones_are_removed_on_open() {
    if !root_or_skip("snapshots_outlive_the_runtime_and_incomplete_ones_are_removed_on_open") {
        return;
    }
    let dir = tempfile::Builder::new().prefix("oka-rt-").tempdir().unwrap();
    let state = dir.path().join("state");
    let rt = LocalRuntime::open(config(state.clone(), "snaprestart")).await.unwrap();
    let spec = server("kept");
    rt.ensure(&spec).await.unwrap();
    wait_for_server(&rt, &spec.id, 8000).await;
    assert_eq!(http_body(&rt, &spec.id, 8000, "/count").await.as_deref(), Some("count=1\n"));
    let snap = id_of("kept-snap");
    rt.snapshot(&spec.id, &snap).await.unwrap();
    rt.delete(&spec.id).await.unwrap();
    drop(rt);
    // What a crash in the middle of a snapshot leaves: a directory without a complete record.
    std::fs::create_dir_all(state.join("snapshots/torn/images")).unwrap();

    let rt = LocalRuntime::open(config(state.clone(), "snaprestart")).await.unwrap();
    assert!(!state.join("snapshots/torn").exists());
    let clone = clone_of("kept-clone", &snap);
    rt.ensure(&clone).await.unwrap();
    assert_eq!(http_body(&rt, &clone.id, 8000, "/count").await.as_deref(), Some("count=2\n"));
    rt.delete(&clone.id).await.unwrap();
    rt.delete_snapshot(&snap).await.unwrap();
    assert_eq!(std::fs::read_dir(state.join("snapshots")).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(state.join("sandboxes")).unwrap().count(), 0);
}
