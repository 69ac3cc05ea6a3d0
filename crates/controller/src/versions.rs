//! [`WrittenVersions`]: remembers the resourceVersion a controller last wrote per object, so a
//! reconcile that starts from a cache older than its own last write is skipped instead of
//! planning from stale state (the reference's "resourceVersion expectations").
//!
//! # Expected flow
//!
//! The executor records every object it writes. When a reconcile starts, the cached object is
//! compared with the record: older ⇒ the cache has not caught up with our own write yet, and
//! the informer will enqueue the key again when it does, so the reconcile does nothing now.
//! Equal or newer ⇒ the record is dropped and the reconcile proceeds.
//!
//! # Assumptions
//!
//! resourceVersions are decimal counters that grow with every write (the embedded store's
//! are; etcd's are in practice). A version that does not parse is never considered stale.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use kube::Resource;

use oka_cache::ObjectKey;

/// The last resourceVersion written per object; see the [module documentation](self).
#[derive(Debug, Default)]
pub struct WrittenVersions {
    written: Mutex<HashMap<ObjectKey, (Option<String>, u64)>>,
}

impl WrittenVersions {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, (Option<String>, u64)>> {
        self.written.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Remembers the version of an object just written.
    pub fn record<K: Resource>(&self, obj: &K) {
        let meta = obj.meta();
        if let Some(rv) = meta.resource_version.as_deref().and_then(|rv| rv.parse().ok()) {
            self.map().insert(ObjectKey::of(obj), (meta.uid.clone(), rv));
        }
    }

    /// Whether `obj` (from a cache) is older than the version last written for it.
    pub fn is_stale<K: Resource>(&self, obj: &K) -> bool {
        let key = ObjectKey::of(obj);
        let meta = obj.meta();
        let mut map = self.map();
        let Some((uid, written)) = map.get(&key) else { return false };
        let cached: Option<u64> = meta.resource_version.as_deref().and_then(|rv| rv.parse().ok());
        match cached {
            Some(cached) if *uid == meta.uid && cached < *written => true,
            _ => {
                map.remove(&key);
                false
            }
        }
    }

    /// Forgets an object (it was removed).
    pub fn forget(&self, key: &ObjectKey) {
        self.map().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use oka_api::Sandbox;

    use super::*;

    fn at(rv: &str) -> Sandbox {
        let mut sandbox = Sandbox::test().name("a").build();
        sandbox.metadata.resource_version = Some(rv.into());
        sandbox
    }

    #[test]
    fn a_cache_older_than_our_write_is_stale_until_it_catches_up() {
        let versions = WrittenVersions::default();
        assert!(!versions.is_stale(&at("5")), "nothing written yet");
        versions.record(&at("7"));
        assert!(versions.is_stale(&at("6")));
        assert!(!versions.is_stale(&at("7")));
        // Caught up: the record is gone, so even an older version is not stale any more.
        assert!(!versions.is_stale(&at("6")));
    }

    #[test]
    fn another_object_of_the_same_name_is_never_stale() {
        let versions = WrittenVersions::default();
        versions.record(&at("9"));
        let mut other = at("3");
        other.metadata.uid = Some("another".into());
        assert!(!versions.is_stale(&other));
        versions.record(&at("9"));
        versions.forget(&ObjectKey::of(&at("9")));
        assert!(!versions.is_stale(&at("1")));
    }
}
