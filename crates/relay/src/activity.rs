//! When traffic last flowed through the relay to each port of each sandbox: on a cluster every
//! byte between the gateway and a sandbox passes through its node's relay, so the node agent's
//! `activity` probes (the auto-pause policy's idleness) read it here, as `oka serve`'s read
//! its gateway's.
//!
//! Times are Unix seconds. A pipe records at most once a second (a clock read per read of the
//! pipe, a lock only when the second changed), so a busy stream costs next to nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a port's last traffic is remembered: longer than any activity window.
pub const KEEP: Duration = Duration::from_secs(24 * 3600);

/// The last traffic per sandbox (runtime ID) and port.
#[derive(Debug, Default)]
pub struct Activity {
    seen: Mutex<HashMap<String, Vec<(u16, i64)>>>,
}

impl Activity {
    /// Records traffic to `port` of sandbox `id` at `second`.
    pub fn touch_at(&self, id: &str, port: u16, second: i64) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let ports = match seen.get_mut(id) {
            Some(ports) => ports,
            None => seen.entry(id.to_owned()).or_default(),
        };
        match ports.iter_mut().find(|(p, _)| *p == port) {
            Some((_, at)) => *at = (*at).max(second),
            None => ports.push((port, second)),
        }
    }

    /// The last traffic (Unix seconds) to sandbox `id`, on any port, or only on `ports`.
    pub fn last(&self, id: &str, ports: &[i32]) -> Option<i64> {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.get(id)?
            .iter()
            .filter(|(p, _)| ports.is_empty() || ports.contains(&i32::from(*p)))
            .map(|(_, at)| *at)
            .max()
    }

    /// Drops the sandboxes whose last traffic is older than [`KEEP`].
    pub fn prune(&self) {
        let oldest = now_seconds().saturating_sub(i64::try_from(KEEP.as_secs()).unwrap_or(0));
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.retain(|_, ports| ports.iter().any(|(_, at)| *at >= oldest));
    }
}

/// One pipe's recorder.
#[derive(Debug)]
pub(crate) struct PipeActivity {
    activity: Arc<Activity>,
    id: String,
    port: u16,
    last: AtomicI64,
}

impl PipeActivity {
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

fn now_seconds() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_traffic_per_port_is_kept() {
        let activity = Activity::default();
        activity.touch_at("a", 49983, 100);
        activity.touch_at("a", 8080, 120);
        activity.touch_at("a", 49983, 90);
        assert_eq!(activity.last("a", &[]), Some(120));
        assert_eq!(activity.last("a", &[49983]), Some(100));
        assert_eq!(activity.last("a", &[1]), None);
        assert_eq!(activity.last("b", &[]), None);
        activity.touch_at("old", 1, 1);
        activity.prune();
        assert_eq!(activity.last("old", &[]), None);
        assert_eq!(activity.last("a", &[]), None, "120 s after the epoch is long gone too");
    }

    #[test]
    fn a_pipe_records_its_opening_and_its_traffic() {
        let activity = Arc::new(Activity::default());
        let pipe = PipeActivity::new(Arc::clone(&activity), "sbx".into(), 49983);
        let opened = activity.last("sbx", &[49983]).unwrap();
        assert!(opened > 1_700_000_000);
        pipe.saw_traffic();
        assert!(activity.last("sbx", &[49983]).unwrap() >= opened);
    }
}
