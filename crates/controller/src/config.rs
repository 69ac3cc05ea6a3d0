//! A controller's settings: how the runner runs it ([`oka_cache::Config`]: workers, backoff,
//! debounce) and where it records its series. Apart from the runner's own config because the
//! runner, in `oka-cache`, knows no controller's metrics.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::ControllerMetrics;

/// How a controller runs, and where it records its series.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The runner's settings.
    pub runner: oka_cache::Config,
    /// Where the controller records its series ([`crate::metrics`]); none records nothing.
    pub metrics: Option<Arc<ControllerMetrics>>,
}

impl From<oka_cache::Config> for Config {
    fn from(runner: oka_cache::Config) -> Self {
        Self { runner, metrics: None }
    }
}

impl Config {
    /// This config with `workers` workers ([`oka_cache::Config::workers`]).
    pub fn workers(mut self, workers: usize) -> Self {
        self.runner = self.runner.workers(workers);
        self
    }

    /// This config with changes debounced by `debounce` ([`oka_cache::Config::debounce`]).
    pub fn debounce(mut self, debounce: Duration) -> Self {
        self.runner = self.runner.debounce(debounce);
        self
    }

    /// This config with the debounce stretched for slow reconciles
    /// ([`oka_cache::Config::debounce_scale`]).
    pub fn debounce_scale(mut self, scale: u32) -> Self {
        self.runner = self.runner.debounce_scale(scale);
        self
    }

    /// This config with its series recorded into `metrics`.
    pub fn metrics(mut self, metrics: Arc<ControllerMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }
}
