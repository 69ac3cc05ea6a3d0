//! Leader election on a `coordination.k8s.io/v1` Lease, through the [`oka_store::Store`] seam.
//!
//! oka runs its controllers as several replicas; exactly one of them, the leader, may act.
//! This crate elects it the way client-go's `tools/leaderelection` does, so oka's replicas
//! and any other client-go style tool agree on what a Lease means: `holderIdentity` is the
//! leader, `leaseDurationSeconds` how long others wait, `renewTime` and `acquireTime` when it
//! renewed and took it, `leaseTransitions` how many times it changed hands.
//!
//! # Expected flow
//!
//! 1. Every replica runs [`run_leader_elected`] (or [`Elector::run`]) with the same Lease and a
//!    unique identity ([`unique_identity`]). Each one, every `retry_period` (with up to 20 %
//!    jitter), reads the Lease; it creates it when missing, and takes it when nobody holds it
//!    (empty `holderIdentity`) or when it has expired.
//! 2. The replica that wins calls `lead` once with a [`Leadership`], and renews the Lease every
//!    `retry_period` while `lead`'s future runs.
//! 3. When no renewal succeeds for `renew_deadline`, or another replica is seen holding the
//!    Lease, leadership is **lost**: [`Leadership::lost`] resolves, the elector never writes
//!    the Lease again, and the caller must stop every leader action (oka's binary exits
//!    non-zero, as controller-runtime does). [`Outcome::Lost`] says so.
//! 4. On shutdown, [`Leadership::lost`] resolves too; once `lead`'s future has ended the
//!    Lease is **released** (empty holder, `leaseDurationSeconds: 1`, transitions kept, as
//!    client-go's `ReleaseOnCancel`), so a standby takes over at its next retry instead of
//!    waiting for the lease to expire.
//!
//! # Guarantees
//!
//! - Every write is a compare-and-swap on the Lease's `resourceVersion`: of two replicas
//!   that read the same Lease, at most one write succeeds; the other gets a Conflict, reads
//!   again and retries next period.
//! - Expiry is judged by **observed** time: a standby records the instant, on its own
//!   monotonic clock, at which it last saw the Lease's record change, and takes the Lease only
//!   when the record's `leaseDurationSeconds` has passed since. It never compares `renewTime`
//!   with its own clock, because replicas' wall clocks disagree.
//! - The leader counts `renew_deadline` from the start of its last successful renewal, and a
//!   standby's observation of that renewal comes after it; so the old leader has given up at
//!   least `lease_duration - renew_deadline` (5 s by default) before any standby may take
//!   over. No leader action is taken twice at once, provided the caller stops within that
//!   margin.
//!
//! # Assumptions
//!
//! - The replicas' monotonic clocks tick at about the same rate (offsets do not matter).
//! - Identities are unique; an empty identity is refused.
//!
//! # Observability
//!
//! [`Elector::is_leader`] is a `watch` of "this replica leads", for a
//! `leader_election_master_status` gauge (controller-runtime's name) and a readiness check.
//! Logs: acquired (with the transitions), lost, released at `info`/`error`; while standing
//! by, who holds the Lease at `debug`, when it changes and at most once a minute otherwise.

#![forbid(unsafe_code)]

mod config;
mod elector;
mod error;

use std::future::Future;

pub use config::{
    ConfigError, DEFAULT_LEASE_DURATION, DEFAULT_RENEW_DEADLINE, DEFAULT_RETRY_PERIOD,
    ElectionConfig, unique_identity,
};
pub use elector::{Elector, LeaderState, Leadership, Outcome};
pub use error::ElectionError;

/// Runs one election: waits until this replica leads, calls `lead` once, keeps leading
/// while `lead`'s future runs, and returns once it has ended. See the crate documentation
/// for the rules; [`Elector`] is the same with an [`Elector::is_leader`] watch.
///
/// `shutdown` resolving while standing by returns [`Outcome::NeverLed`] at once; while
/// leading it makes [`Leadership::lost`] resolve, and the Lease is released after `lead`'s
/// future ends.
///
/// # Errors
///
/// [`ElectionError::Config`] when `config` breaks a timing rule, [`ElectionError::Store`]
/// when the store refuses the Lease as malformed.
pub async fn run_leader_elected<S, F, Fut, T>(
    store: S,
    config: ElectionConfig,
    shutdown: impl Future<Output = ()>,
    lead: F,
) -> Result<Outcome<T>, ElectionError>
where
    S: oka_store::Store,
    F: FnOnce(Leadership) -> Fut,
    Fut: Future<Output = T>,
{
    Elector::new(store, config)?.run(shutdown, lead).await
}
