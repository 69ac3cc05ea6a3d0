//! One cache machinery for everything that follows the store: the list+watch loop and the
//! in-memory copy of a kind it keeps, with named secondary indexes; the keyed work queue; and
//! the controller runner that joins them.
//!
//! The controllers, the manager's claim index and the gateway's route table all need the same
//! thing: the objects of a kind, kept current by a list then a watch, relisted when the watch
//! falls behind, and looked up by something other than their name (a pool's claim candidates,
//! a sandbox's public ID). This crate is that thing, written once, as client-go's
//! `tools/cache` (reflector, indexer) and `workqueue`, and kube-runtime's `reflector` and
//! `Controller`, are kept apart from any controller. It knows no kind by name and depends on
//! the store alone, so the gateway and the manager use it without depending on the
//! controllers or the runtime.
//!
//! # Modules
//!
//! - [`cache`]: [`Cache`], the objects of one kind by [`ObjectKey`], with secondary indexes
//!   ([`Cache::add_index`], [`Cache::by_index`]) and read-your-writes ([`Cache::apply`],
//!   [`Cache::delete`]).
//! - [`reflector`]: [`Informer`], the list+watch loop that fills a [`Cache`] and reports each
//!   [`Change`].
//! - [`shared`]: [`Informers`], the informers of one process shared by all their users (one
//!   list+watch and one cache per kind and scope), and [`SharedInformer`].
//! - [`queue`]: the keyed work queue (dedup, per-key serialization, delayed requeue, backoff).
//! - [`controller`]: the runner ([`Controller`], [`Action`], [`Config`], counters): informers
//!   feed the queue, workers call a reconcile function.
//!
//! # Architecture invariant
//!
//! Depends on `oka-store` (and `oka-telemetry` for reconcile spans), never on a controller, the
//! manager, the gateway or the runtime; it drives any [`oka_store::Object`] through any
//! [`oka_store::Store`].

#![forbid(unsafe_code)]

pub mod cache;
pub mod controller;
pub mod queue;
pub mod reflector;
pub mod shared;

pub use cache::{Cache, CacheError, Change, HandlerId, IndexFn, Indexed, ObjectKey};
pub use controller::{
    Action, Config, Controller, ControllerStats, StatsSnapshot, default_error_policy, owner_keys,
};
pub use queue::{Lease, QueueConfig, QueueStats, WorkQueue};
pub use reflector::{Informer, WatchConfig, WatchStats};
pub use shared::{Informers, SharedInformer};
