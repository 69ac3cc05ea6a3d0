//! Acknowledged writes survive `kill -9`.
//!
//! The test binary re-invokes itself as a writer process (`crash_writer_child`, which does
//! nothing unless `OKA_STORE_CRASH_DB` is set): sixteen tasks create and update objects as fast
//! as the store takes them and print `ACK <name> <rv>` once the store has returned `Ok`. The
//! test kills the process with SIGKILL mid-load, reopens the database and checks that every
//! acknowledged write is there with at least the acknowledged resourceVersion, that no stored
//! version is above the counter, and that the counter keeps increasing after the reopen.
//! Several rounds run on the same file, each killed at a different point.

// Test helpers panic on failure: in a test, a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use kube::Resource;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::{Selector, Store};

const DB_ENV: &str = "OKA_STORE_CRASH_DB";
const ROUND_ENV: &str = "OKA_STORE_CRASH_ROUND";
const WRITERS: usize = 16;
/// How many acknowledgements each round waits for before the kill.
const KILL_AFTER: [usize; 4] = [500, 1500, 800, 2500];
/// A round that takes longer than this has hung: the child is killed and the test fails.
const ROUND_DEADLINE: Duration = Duration::from_secs(60);

/// The writer process. Runs only when re-invoked by `acknowledged_writes_survive_sigkill`.
#[test]
fn crash_writer_child() {
    let Ok(path) = std::env::var(DB_ENV) else { return };
    let round: usize = std::env::var(ROUND_ENV).unwrap().parse().unwrap();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let store = EmbeddedStore::open(Path::new(&path), EmbeddedOptions::default()).unwrap();
        let mut tasks = Vec::new();
        for t in 0..WRITERS {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let hot = format!("r{round}-w{t}-hot");
                let mut hot_obj = store.create(NS, &widget(&hot)).await.unwrap();
                ack(&hot, hot_obj.rv());
                for i in 0.. {
                    let name = format!("r{round}-w{t}-{i}");
                    let created = store.create(NS, &widget(&name)).await.unwrap();
                    ack(&name, created.rv());
                    hot_obj.spec.size = i;
                    hot_obj = store.update(NS, &hot_obj).await.unwrap();
                    ack(&hot, hot_obj.rv());
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
}

/// Prints one acknowledgement as a single write (atomic on a pipe), after the store said Ok.
fn ack(name: &str, rv: u64) {
    let line = format!("ACK {name} {rv}\n");
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes()).unwrap();
    out.flush().unwrap();
}

/// Kills the child if the test fails before it does.
struct KillOnDrop(Arc<Mutex<Child>>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let mut child = self.0.lock().unwrap();
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Runs one writer process on `path`, kills it after `kill_after` acknowledgements and returns
/// every acknowledged `(name, rv)`.
fn run_round(path: &Path, round: usize, kill_after: usize) -> Vec<(String, u64)> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["crash_writer_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(DB_ENV, path)
        .env(ROUND_ENV, round.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let child = Arc::new(Mutex::new(child));
    let _guard = KillOnDrop(Arc::clone(&child));
    let watchdog = {
        let child = Arc::clone(&child);
        std::thread::spawn(move || {
            let start = Instant::now();
            while start.elapsed() < ROUND_DEADLINE {
                std::thread::sleep(Duration::from_millis(100));
                if child.lock().unwrap().try_wait().unwrap().is_some() {
                    return;
                }
            }
            let _ = child.lock().unwrap().kill();
        })
    };

    let mut reader = BufReader::new(stdout);
    let mut acks = Vec::new();
    let mut killed = false;
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).unwrap() == 0 {
            break;
        }
        // A line cut short by the kill was never acknowledged in full: ignore it.
        let Some(text) = line.strip_suffix(b"\n") else { continue };
        let text = std::str::from_utf8(text).unwrap();
        let Some(rest) = text.strip_prefix("ACK ") else { continue };
        let (name, rv) = rest.split_once(' ').unwrap();
        acks.push((name.to_owned(), rv.parse().unwrap()));
        if !killed && acks.len() >= kill_after {
            child.lock().unwrap().kill().unwrap();
            killed = true;
        }
    }
    let status = child.lock().unwrap().wait().unwrap();
    watchdog.join().unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "round {round}: the writer should die by SIGKILL, not {status}"
    );
    assert!(acks.len() >= kill_after, "round {round}: only {} acknowledgements", acks.len());
    acks
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    if std::env::var(DB_ENV).is_ok() {
        return; // Inside the writer process.
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let mut acked: BTreeMap<String, u64> = BTreeMap::new();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for (round, kill_after) in KILL_AFTER.into_iter().enumerate() {
        let acks = run_round(&path, round, kill_after);
        let round_max = acks.iter().map(|(_, rv)| *rv).max().unwrap();
        for (name, rv) in acks {
            let entry = acked.entry(name).or_insert(0);
            *entry = (*entry).max(rv);
        }
        runtime.block_on(async {
            let store = EmbeddedStore::open(&path, EmbeddedOptions::default()).unwrap();
            let store_rv: u64 = store.resource_version().parse().unwrap();
            assert!(
                store_rv >= round_max,
                "round {round}: counter {store_rv} below acknowledged {round_max}"
            );
            let all = store.list::<Widget>(None, &Selector::everything()).await.unwrap();
            let stored: BTreeMap<String, u64> =
                all.items.iter().map(|w| (w.meta().name.clone().unwrap(), w.rv())).collect();
            for (name, rv) in &acked {
                let Some(found) = stored.get(name) else {
                    panic!("round {round}: acknowledged {name} (rv {rv}) is lost");
                };
                assert!(found >= rv, "round {round}: {name} has rv {found}, acknowledged {rv}");
            }
            assert!(
                stored.values().all(|rv| *rv <= store_rv),
                "round {round}: an object is above the counter"
            );
            let after = store.create(NS, &widget(&format!("after-round-{round}"))).await.unwrap();
            assert_eq!(
                after.rv(),
                store_rv + 1,
                "round {round}: the counter continues after reopen"
            );
            acked.insert(format!("after-round-{round}"), after.rv());
            store.close().unwrap();
        });
        eprintln!("round {round}: {} objects acknowledged so far, all present", acked.len());
    }
}
