//! Fault injection: the store on an in-memory redb backend whose writes can be made to fail.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use kube::{CustomResource, Resource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{EmbeddedOptions, EmbeddedStore};
use crate::{Preconditions, Selector, Store, StoreError};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "test.oka.dev",
    version = "v1",
    kind = "Thing",
    namespaced,
    status = "ThingStatus",
    derive = "PartialEq"
)]
struct ThingSpec {
    size: i32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
struct ThingStatus {
    ok: bool,
}

/// Bytes in memory, shared between successive opens; writes fail while `fail` is set, and
/// only `fsync` fails (after the bytes were written) while `fail_sync` is.
#[derive(Debug, Clone, Default)]
struct FaultyBackend {
    data: Arc<RwLock<Vec<u8>>>,
    fail: Arc<AtomicBool>,
    fail_sync: Arc<AtomicBool>,
}

impl FaultyBackend {
    fn check(&self) -> std::io::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            Err(std::io::Error::other("injected write failure"))
        } else {
            Ok(())
        }
    }

    fn range(offset: u64, len: usize, size: usize) -> std::io::Result<std::ops::Range<usize>> {
        let start = usize::try_from(offset).map_err(std::io::Error::other)?;
        let end = start + len;
        if end > size {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "out of range"));
        }
        Ok(start..end)
    }
}

impl redb::StorageBackend for FaultyBackend {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.data.read().unwrap_or_else(PoisonError::into_inner).len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let data = self.data.read().unwrap_or_else(PoisonError::into_inner);
        out.copy_from_slice(&data[Self::range(offset, out.len(), data.len())?]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.check()?;
        let len = usize::try_from(len).map_err(std::io::Error::other)?;
        self.data.write().unwrap_or_else(PoisonError::into_inner).resize(len, 0);
        Ok(())
    }

    fn sync_data(&self) -> std::io::Result<()> {
        if self.fail_sync.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("injected fsync failure"));
        }
        self.check()
    }

    fn write(&self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        self.check()?;
        let mut data = self.data.write().unwrap_or_else(PoisonError::into_inner);
        let range = Self::range(offset, bytes.len(), data.len())?;
        data[range].copy_from_slice(bytes);
        Ok(())
    }
}

fn thing(name: &str) -> Thing {
    Thing::new(name, ThingSpec { size: 1 })
}

#[tokio::test]
async fn failed_commit_publishes_nothing_and_stops_writes() {
    let backend = FaultyBackend::default();
    let store =
        EmbeddedStore::open_with_backend(backend.clone(), EmbeddedOptions::default(), false)
            .unwrap();
    let a = store.create("ns", &thing("a")).await.unwrap();
    let mut watch = store.watch::<Thing>(None, &Selector::everything(), "").await.unwrap();

    backend.fail.store(true, Ordering::SeqCst);
    let err = store.create("ns", &thing("b")).await.unwrap_err();
    assert!(matches!(err, StoreError::Internal(ref m) if m.contains("may or may not")), "{err}");
    // Nothing of the failed batch is visible.
    assert!(store.get::<Thing>("ns", "b").await.unwrap_err().is_not_found());
    assert_eq!(store.resource_version(), "1");
    let list = store.list::<Thing>(None, &Selector::everything()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert!(futures::FutureExt::now_or_never(futures::StreamExt::next(&mut watch)).is_none());

    // A store that cannot read its backend again stops writing, even once the fault is gone,
    // until it is reopened...
    backend.fail.store(false, Ordering::SeqCst);
    let err = store.delete::<Thing>("ns", "a", &Preconditions::default()).await.unwrap_err();
    assert!(matches!(err, StoreError::Internal(ref m) if m.contains("reopen")), "{err}");
    // ...but still serves reads.
    assert_eq!(store.get::<Thing>("ns", "a").await.unwrap(), a);
    drop(watch);
    drop(store);

    // Reopened, it holds what was acknowledged, and its counter goes on from there.
    let store =
        EmbeddedStore::open_with_backend(backend.clone(), EmbeddedOptions::default(), false)
            .unwrap();
    assert_eq!(store.get::<Thing>("ns", "a").await.unwrap(), a);
    assert!(store.get::<Thing>("ns", "b").await.unwrap_err().is_not_found());
    let c = store.create("ns", &thing("c")).await.unwrap();
    assert_eq!(c.meta().resource_version.as_deref(), Some("2"));
}

#[tokio::test]
async fn failed_commit_fails_every_write_of_its_batch() {
    let backend = FaultyBackend::default();
    let store =
        EmbeddedStore::open_with_backend(backend.clone(), EmbeddedOptions::default(), false)
            .unwrap();
    store.create("ns", &thing("taken")).await.unwrap();
    backend.fail.store(true, Ordering::SeqCst);
    let writes: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.create("ns", &thing(&format!("t{i}"))).await })
        })
        .collect();
    for write in writes {
        let err = write.await.unwrap().unwrap_err();
        assert!(matches!(err, StoreError::Internal(_)), "{err}");
    }
    assert_eq!(store.list::<Thing>(None, &Selector::everything()).await.unwrap().items.len(), 1);
}

/// Writes until one fails, with the store able to reopen its backend; returns the store, the
/// watch started before the failure, and the error.
async fn fail_a_commit(
    backend: &FaultyBackend,
    flag: &AtomicBool,
) -> (EmbeddedStore, crate::WatchStream<Thing>, StoreError) {
    let store = EmbeddedStore::open_with_backend(backend.clone(), EmbeddedOptions::default(), true)
        .unwrap();
    store.create("ns", &thing("a")).await.unwrap();
    let watch = store.watch::<Thing>(None, &Selector::everything(), "1").await.unwrap();
    flag.store(true, Ordering::SeqCst);
    let err = store.create("ns", &thing("b")).await.unwrap_err();
    assert!(matches!(err, StoreError::Internal(ref m) if m.contains("may or may not")), "{err}");
    flag.store(false, Ordering::SeqCst);
    (store, watch, err)
}

/// Retries `create` of `name` while the writer refuses writes until it has recovered.
async fn create_when_recovered(store: &EmbeddedStore, name: &str) -> Thing {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match store.create("ns", &thing(name)).await {
            Err(StoreError::Unavailable(_)) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            other => return other.unwrap(),
        }
    }
}

#[tokio::test]
async fn a_failed_commit_that_landed_is_published_once_the_file_is_read_again() {
    let backend = FaultyBackend::default();
    let (store, mut watch, _) = fail_a_commit(&backend, &backend.fail_sync).await;
    // The bytes reached the backend, only the fsync failed: the batch is on "disk". It is not
    // shown until the writer has read the file again (at the next write)...
    assert!(store.get::<Thing>("ns", "b").await.unwrap_err().is_not_found());
    let c = create_when_recovered(&store, "c").await;
    // ...and then it is, in order, before the next write.
    let b = store.get::<Thing>("ns", "b").await.unwrap();
    assert_eq!(b.meta().resource_version.as_deref(), Some("2"));
    assert_eq!(c.meta().resource_version.as_deref(), Some("3"));
    for expected in ["b", "c"] {
        let event = futures::StreamExt::next(&mut watch).await.unwrap().unwrap();
        let crate::WatchEvent::Added(thing) = event else { panic!("{event:?}") };
        assert_eq!(thing.meta().name.as_deref(), Some(expected));
    }
    drop(store);
    let reopened =
        EmbeddedStore::open_with_backend(backend, EmbeddedOptions::default(), false).unwrap();
    assert_eq!(reopened.resource_version(), "3");
    assert_eq!(reopened.get::<Thing>("ns", "b").await.unwrap(), b);
}

#[tokio::test]
async fn a_failed_commit_that_did_not_land_is_forgotten_once_the_file_is_read_again() {
    let backend = FaultyBackend::default();
    let (store, mut watch, _) = fail_a_commit(&backend, &backend.fail).await;
    let c = create_when_recovered(&store, "c").await;
    assert!(store.get::<Thing>("ns", "b").await.unwrap_err().is_not_found());
    assert_eq!(c.meta().resource_version.as_deref(), Some("2"));
    let event = futures::StreamExt::next(&mut watch).await.unwrap().unwrap();
    let crate::WatchEvent::Added(thing) = event else { panic!("{event:?}") };
    assert_eq!(thing.meta().name.as_deref(), Some("c"));
}
