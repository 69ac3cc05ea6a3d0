//! The reference's histogram bucket layouts, by the names its metrics catalogue uses, so every
//! family that copies a reference family takes its layout from one place.

use prometheus_client::metrics::histogram::{exponential_buckets, linear_buckets};

/// E20: 0.02 s doubling 12 times (0.02 … 40.96): creation, pause, resume, deletion, the
/// manager's operations.
pub fn e20() -> impl Iterator<Item = f64> {
    exponential_buckets(0.02, 2.0, 12)
}

/// E10: 0.1 s doubling 13 times (0.1 … 409.6): the controller's recycle duration.
pub fn e10() -> impl Iterator<Item = f64> {
    exponential_buckets(0.1, 2.0, 13)
}

/// C10: 0.01 s doubling 10 times (0.01 … 5.12): the SandboxClaim controller's claim duration.
pub fn c10() -> impl Iterator<Item = f64> {
    exponential_buckets(0.01, 2.0, 10)
}

/// L11: 0, 1, … 10: the manager's claim retries.
pub fn l11() -> impl Iterator<Item = f64> {
    linear_buckets(0.0, 1.0, 11)
}

/// The Prometheus clients' default buckets (0.005 … 10 s).
pub const DEFAULT: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// oka's latency layout for fast operations (0.1 ms doubling 16 times, up to ~3.3 s): the
/// gateway's dials and first bytes, the store's commits and fsyncs.
pub fn fast() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0001, 2.0, 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_the_reference_ones() {
        let e20: Vec<f64> = e20().collect();
        assert_eq!(e20.len(), 12);
        assert!((e20[11] - 40.96).abs() < 1e-9);
        let e10: Vec<f64> = e10().collect();
        assert_eq!(e10.len(), 13);
        assert!((e10[12] - 409.6).abs() < 1e-9);
        let c10: Vec<f64> = c10().collect();
        assert!((c10[9] - 5.12).abs() < 1e-9);
        assert_eq!(l11().collect::<Vec<_>>(), (0..=10).map(f64::from).collect::<Vec<_>>());
    }
}
