//! When traffic last flowed through the relay to each port of each sandbox: on a cluster every
//! byte between the gateway and a sandbox passes through its node's relay, so the node agent's
//! `activity` probes (the auto-pause policy's idleness) read it here, as `oka serve`'s read its
//! gateway's. The registry is [`oka_metrics::activity::Activity`], keyed by runtime ID.
//!
//! A pipe records at most once a second (a clock read per read of the pipe, a lock only when
//! the second changed), so a busy stream costs next to nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

pub use oka_metrics::activity::Activity;
use oka_metrics::activity::now_seconds;

/// One pipe's recorder.
#[derive(Debug)]
pub(crate) struct PipeActivity {
    activity: Arc<Activity>,
    id: String,
    port: u16,
    last: AtomicI64,
}

impl PipeActivity {
    /// A recorder for the pipe to `port` of sandbox `id`; its opening counts as traffic.
    pub(crate) fn new(activity: Arc<Activity>, id: String, port: u16) -> Self {
        let pipe = Self { activity, id, port, last: AtomicI64::new(0) };
        pipe.saw_traffic();
        pipe
    }

    /// Bytes moved now.
    pub(crate) fn saw_traffic(&self) {
        let now = now_seconds();
        if self.last.swap(now, Ordering::Relaxed) != now {
            self.activity.touch_at(&self.id, self.port, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_records_its_opening_and_its_traffic() {
        let activity = Arc::new(Activity::default());
        let pipe = PipeActivity::new(Arc::clone(&activity), "sbx".into(), 49983);
        let opened = activity.last("sbx", &[49983]).unwrap();
        assert!(opened > 1_700_000_000);
        pipe.saw_traffic();
        assert!(activity.last("sbx", &[49983]).unwrap() >= opened);
        assert_eq!(activity.last("sbx", &[1]), None);
    }
}
