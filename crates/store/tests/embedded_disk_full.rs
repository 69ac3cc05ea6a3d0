//! A full disk stops the store's writes only until space is freed: no restart, nothing
//! acknowledged lost, and what a reopen finds is what readers were shown.
//!
//! The store lives on a small tmpfs the test mounts (so it needs root; without it the test
//! prints SKIPPED). A filler file takes the rest of the space; writes then fail (the batch that
//! hit the full disk with "may or may not be durable", the later ones as unavailable, which
//! callers retry); once the filler is deleted, writes succeed again within the writer's
//! recovery interval, and every acknowledged write is there, before and after a reopen.

// Test helpers panic on failure: in a test, a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use kube::Resource;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::{Selector, Store, StoreError};

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(status.success(), "mount tmpfs on {}", dir.display());
        Tmpfs(dir.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system of `dir` with one file, until the kernel says it is full.
fn fill(dir: &Path) -> PathBuf {
    let filler = dir.join("filler");
    let mut file = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0x55u8; 64 << 10];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
            Err(e) => panic!("filling {}: {e}", filler.display()),
        }
    }
    // Any last partial page.
    while file.write(&[0x55]).is_ok_and(|n| n == 1) {}
    filler
}

/// Whether this process runs as root (`/proc/self` belongs to the process's effective user).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn big(name: &str) -> Widget {
    let mut w = widget(name);
    w.spec.color = "c".repeat(8 << 10);
    w
}

async fn contents(store: &EmbeddedStore) -> BTreeMap<String, String> {
    let list = store.list::<Widget>(Some(NS), &Selector::everything()).await.unwrap();
    list.items
        .iter()
        .map(|w| (w.meta().name.clone().unwrap(), w.meta().resource_version.clone().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_resume_once_space_is_freed_and_nothing_acknowledged_is_lost() {
    if !is_root() {
        eprintln!(
            "SKIPPED writes_resume_once_space_is_freed_and_nothing_acknowledged_is_lost: mounting a tmpfs needs root"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _fs = Tmpfs::mount(dir.path(), "16m");
    let path = dir.path().join("store.redb");
    let store = EmbeddedStore::open(&path, EmbeddedOptions::default()).unwrap();
    let mut acknowledged = BTreeMap::new();
    for i in 0..20 {
        let w = store.create(NS, &big(&format!("before-{i}"))).await.unwrap();
        acknowledged
            .insert(w.meta().name.clone().unwrap(), w.meta().resource_version.clone().unwrap());
    }

    let filler = fill(dir.path());
    let mut errors = Vec::new();
    for i in 0..2000 {
        match store.create(NS, &big(&format!("full-{i}"))).await {
            Ok(w) => {
                acknowledged.insert(
                    w.meta().name.clone().unwrap(),
                    w.meta().resource_version.clone().unwrap(),
                );
            }
            Err(e) => {
                errors.push(e);
                if errors.len() == 10 {
                    break;
                }
            }
        }
    }
    assert_eq!(errors.len(), 10, "a full disk never failed a write");
    assert!(
        matches!(&errors[0], StoreError::Internal(m) if m.contains("may or may not be durable")),
        "the batch that hit the full disk: {:?}",
        errors[0]
    );
    // Later writes are refused as unavailable (retryable) between the writer's attempts to
    // read its file again; a write after a successful attempt may hit the full disk again.
    assert!(
        errors.iter().any(|e| matches!(e, StoreError::Unavailable(_))),
        "no write was refused as unavailable: {errors:?}"
    );
    assert!(
        errors.iter().all(|e| matches!(e, StoreError::Unavailable(_))
            || matches!(e, StoreError::Internal(m) if m.contains("may or may not be durable"))),
        "{errors:?}"
    );
    // Reads go on.
    let seen = contents(&store).await;
    for name in acknowledged.keys() {
        assert!(seen.contains_key(name), "{name} acknowledged, not listed while the disk is full");
    }

    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    let resumed = loop {
        match store.create(NS, &big("after-free")).await {
            Ok(w) => break w,
            Err(StoreError::Unavailable(_)) if freed.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("writes did not resume after space was freed: {e}"),
        }
    };
    println!("writes resumed {:?} after space was freed", freed.elapsed());
    acknowledged.insert(
        resumed.meta().name.clone().unwrap(),
        resumed.meta().resource_version.clone().unwrap(),
    );
    for i in 0..10 {
        let w = store.create(NS, &big(&format!("after-{i}"))).await.unwrap();
        acknowledged
            .insert(w.meta().name.clone().unwrap(), w.meta().resource_version.clone().unwrap());
    }

    // What readers see holds every acknowledged write, and a reopen finds exactly that.
    let shown = contents(&store).await;
    for (name, rv) in &acknowledged {
        assert_eq!(shown.get(name), Some(rv), "{name}");
    }
    store.close().unwrap();
    let reopened = EmbeddedStore::open(&path, EmbeddedOptions::default()).unwrap();
    assert_eq!(contents(&reopened).await, shown, "a reopen finds what readers were shown");
    reopened.close().unwrap();
}
