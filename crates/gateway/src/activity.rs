//! The gateway's record of traffic: the last time a request was routed to each sandbox, per
//! port, which the probe runner's `activity` probes read (`oka serve` hands them this registry
//! through `oka_controller::probe::ActivitySource`; the gateway knows nothing of probes).
//!
//! # Rules
//!
//! - A request counts once the route table knows its sandbox ID, whatever happens next: also a
//!   request refused because the sandbox is paused (the wake-on-request signal the seed spec
//!   asks for) or whose token is wrong.
//! - Times are whole seconds since the Unix epoch; a later request only ever moves a time
//!   forward.
//! - Entries older than [`KEEP`] (the longest activity window, a day, plus an hour) are dropped
//!   by the gateway's sweep, so IDs of deleted sandboxes do not accumulate.
//!
//! # Where oka differs from the proposal, and why
//!
//! The proposal flushes `lastSeen` into the annotation `agents.kruise.io/last-activity-time`
//! every 30 s from each gateway replica. `oka serve` runs the gateway and the controllers in one
//! process, so the runner reads the registry directly: no store write per active sandbox, and
//! no flush delay in the window. The annotation is still read by the runner (a writer outside
//! the process may set it).

pub use oka_metrics::activity::{Activity, KEEP};
