//! The single-machine backend (`oka serve` without Redis): the reference's key model kept in
//! memory, one ledger per owner (entries by lock, sums by dimension and scope), changed only
//! through the pure [`plan_acquire`] and [`plan_release`], under one lock, so an acquire is
//! atomic as the Lua script is.
//!
//! Nothing here is written to disk: the truth is in the embedded store, whose claimed
//! sandboxes carry their owner and lock. At start the anti-drift driver's first pass rebuilds
//! the ledger from the store's live sandboxes, and the quota takes no admission decision
//! before that pass ends ([`super::Quota::wait_ready`]), so a `kill -9` of `oka serve`
//! neither loses nor leaks a count: an acquire whose sandbox was never written is simply not
//! rebuilt.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use futures::future::BoxFuture;

use super::model::{Dimension, Entry, Scope};
use super::rules::{AcquirePlan, apply_delta, plan_acquire, plan_release};
use super::{AcquireParams, BackendError, QuotaBackend};

#[derive(Debug, Default)]
struct Ledger {
    entries: HashMap<String, Entry>,
    sums: HashMap<(Dimension, Scope), i64>,
}

impl Ledger {
    fn sum(&self, dimension: Dimension, scope: Scope) -> i64 {
        self.sums.get(&(dimension, scope)).copied().unwrap_or(0)
    }

    fn apply(&mut self, deltas: Vec<super::rules::Delta>) {
        for (dimension, scope, delta) in deltas {
            let sum = self.sums.entry((dimension, scope)).or_default();
            *sum = apply_delta(*sum, delta);
        }
    }
}

/// The in-memory backend; see the [module documentation](self).
#[derive(Debug, Default)]
pub struct LocalBackend {
    owners: Mutex<HashMap<String, Ledger>>,
}

impl LocalBackend {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// The sum of (dimension, scope) of `user` (0 when none).
    pub fn sum(&self, user: &str, dimension: Dimension, scope: Scope) -> i64 {
        let owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        owners.get(user).map_or(0, |l| l.sum(dimension, scope))
    }

    fn acquire_now(&self, params: &AcquireParams) -> Result<(), BackendError> {
        let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        let ledger = owners.entry(params.user.clone()).or_default();
        let plan = plan_acquire(
            ledger.entries.get(&params.lock),
            &params.entry,
            params.enforce,
            params.limits.as_ref(),
            |d, s| ledger.sum(d, s),
        );
        match plan {
            AcquirePlan::Rejected => Err(BackendError::Exceeded),
            AcquirePlan::Apply { deltas, write_entry } => {
                ledger.apply(deltas);
                if write_entry {
                    ledger.entries.insert(params.lock.clone(), params.entry);
                }
                Ok(())
            }
        }
    }

    fn release_now(&self, user: &str, lock: &str) {
        let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ledger) = owners.get_mut(user) {
            let deltas = plan_release(ledger.entries.get(lock));
            ledger.apply(deltas);
            ledger.entries.remove(lock);
        }
    }
}

impl QuotaBackend for LocalBackend {
    fn acquire<'a>(&'a self, params: &'a AcquireParams) -> BoxFuture<'a, Result<(), BackendError>> {
        let result = self.acquire_now(params);
        Box::pin(async move { result })
    }

    fn release<'a>(
        &'a self,
        user: &'a str,
        lock: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.release_now(user, lock);
        Box::pin(async { Ok(()) })
    }

    fn list_entries<'a>(
        &'a self,
        user: &'a str,
    ) -> BoxFuture<'a, Result<HashMap<String, Entry>, BackendError>> {
        let owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        let entries = owners.get(user).map(|l| l.entries.clone()).unwrap_or_default();
        Box::pin(async move { Ok(entries) })
    }

    fn cleanup<'a>(&'a self, user: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        self.owners.lock().unwrap_or_else(PoisonError::into_inner).remove(user);
        Box::pin(async { Ok(()) })
    }

    fn name(&self) -> &'static str {
        "embedded"
    }
}
