//! What oka says about itself: the Prometheus helpers every component's `metrics` module uses,
//! and health.
//!
//! Why a crate of its own: the controllers and the manager both record series the reference
//! gives one name with a `source` label (`sandbox_pause_duration_seconds{source="k8s"}` from the
//! controller, `{source="e2b"}` from the manager). One exposition may hold a family name only
//! once, and the two crates know nothing of each other, so the families they share live here
//! ([`Shared`]), created once by the assembly and handed to both.
//!
//! - [`buckets`]: the reference's bucket layouts (E20, E10, C10, L11, the client default).
//! - [`Shared`], [`SourcedHistogram`]: the histograms both sources record.
//! - [`DurationHistogram`]: a histogram of durations observed without a lock, for hot paths.
//! - [`scrape`]: encoding a registry as OpenMetrics or the Prometheus text format, chosen from a
//!   scraper's `Accept` header.
//! - [`health`]: liveness and readiness (`/healthz`, `/readyz`) of every listener.
//!
//! Each component owns its own families in its `metrics` module (a struct registered into the
//! [`Registry`] the assembly passes in); `oka serve` serves the registry on `/metrics`.

#![forbid(unsafe_code)]

pub mod activity;
mod atomic;
pub mod buckets;
pub mod health;
pub mod labels;
pub mod scrape;
mod sourced;

pub use atomic::DurationHistogram;
pub use prometheus_client;
pub use prometheus_client::registry::Registry;
pub use sourced::{Shared, Source, SourcedHistogram};

/// Seconds since the Unix epoch of a point in time given as seconds and nanoseconds, as the
/// reference's timestamp gauges report it (a float of seconds).
pub fn unix_seconds(seconds: i64, nanos: i32) -> f64 {
    seconds as f64 + f64::from(nanos) / 1e9
}
