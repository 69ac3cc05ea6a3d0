//! A damaged store file is refused at open with an error that names it, never trusted.
//!
//! The test fills a store (creates, updates, deletes), closes it, and then, for bytes spread
//! over the whole file, flips one byte of a copy and opens the copy. Every open must either
//! fail with an error naming the file, or succeed with exactly the objects that were written
//! (a flipped byte in space the file does not use changes nothing). A panic, or an open that
//! succeeds with different objects, is silent damage and fails the test.

// Test helpers panic on failure: in a test, a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::Path;

use common::*;
use kube::Resource;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::{Preconditions, Selector, Store};

/// What a store holds, as a user sees it: every widget's name, spec size and resourceVersion.
type Contents = BTreeMap<String, (i32, String)>;

async fn contents(store: &EmbeddedStore) -> Result<Contents, String> {
    let list =
        store.list::<Widget>(Some(NS), &Selector::everything()).await.map_err(|e| e.to_string())?;
    Ok(list
        .items
        .iter()
        .map(|w| {
            let meta = w.meta();
            (
                meta.name.clone().unwrap(),
                (w.spec.size, meta.resource_version.clone().unwrap_or_default()),
            )
        })
        .collect())
}

/// Fills a new store at `path` and returns what it holds once closed.
async fn fill(path: &Path) -> Contents {
    let store = EmbeddedStore::open(path, EmbeddedOptions::default()).unwrap();
    for i in 0..150 {
        let mut w = widget(&format!("widget-{i:03}"));
        w.spec.color = "a colour long enough to fill pages ".repeat(4);
        store.create(NS, &w).await.unwrap();
    }
    for i in (0..150).step_by(3) {
        let mut w: Widget = store.get(NS, &format!("widget-{i:03}")).await.unwrap();
        w.spec.size = i + 1000;
        store.update(NS, &w).await.unwrap();
    }
    for i in (0..150).step_by(7) {
        store
            .delete::<Widget>(NS, &format!("widget-{i:03}"), &Preconditions::default())
            .await
            .unwrap();
    }
    let held = contents(&store).await.unwrap();
    store.close().unwrap();
    held
}

/// How an open of a damaged copy ended.
enum Opened {
    Refused(String),
    Intact,
    Changed(String),
    Panicked(String),
}

async fn open_copy(path: &Path, expected: &Contents) -> Opened {
    let opened = std::panic::catch_unwind(AssertUnwindSafe(|| {
        EmbeddedStore::open(path, EmbeddedOptions::default())
    }));
    let store = match opened {
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            return Opened::Panicked(message);
        }
        Ok(Err(e)) => return Opened::Refused(e.to_string()),
        Ok(Ok(store)) => store,
    };
    let held = contents(&store).await;
    store.close().unwrap();
    let held = match held {
        Ok(held) => held,
        Err(e) => return Opened::Changed(format!("a list fails: {e}")),
    };
    if &held == expected {
        Opened::Intact
    } else {
        let differ: Vec<_> = expected
            .iter()
            .filter(|(name, value)| held.get(*name) != Some(value))
            .map(|(name, _)| name.clone())
            .chain(held.keys().filter(|name| !expected.contains_key(*name)).cloned())
            .take(5)
            .collect();
        Opened::Changed(format!(
            "{} objects instead of {}; differ: {differ:?}",
            held.len(),
            expected.len()
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_anywhere_is_refused_by_name_or_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let original = dir.path().join("store.redb");
    let expected = fill(&original).await;
    assert!(expected.len() > 100);
    let bytes = std::fs::read(&original).unwrap();
    let copy = dir.path().join("damaged.redb");

    // Every 509th byte (a prime, so the positions fall at every offset within a page), and the
    // first bytes of the file (its header and commit slots).
    let positions: Vec<usize> = (0..64).chain((64..bytes.len()).step_by(509)).collect();
    let (mut refused, mut intact) = (0, 0);
    let mut defects = Vec::new();
    for &at in &positions {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x5a;
        std::fs::write(&copy, &damaged).unwrap();
        match open_copy(&copy, &expected).await {
            Opened::Refused(message) => {
                refused += 1;
                if !message.contains(&copy.display().to_string()) {
                    defects.push(format!("byte {at}: refused without naming the file: {message}"));
                }
            }
            Opened::Intact => intact += 1,
            Opened::Changed(what) => defects.push(format!("byte {at}: opened changed: {what}")),
            Opened::Panicked(message) => defects.push(format!("byte {at}: panicked: {message}")),
        }
    }
    println!(
        "{} positions in a {} byte file: {refused} refused by name, {intact} intact, {} defects",
        positions.len(),
        bytes.len(),
        defects.len()
    );
    assert!(refused > 0, "no damage was detected at all");
    assert!(defects.is_empty(), "silent damage:\n{}", defects.join("\n"));
}
