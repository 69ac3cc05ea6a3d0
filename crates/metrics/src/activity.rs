//! The last traffic to each port of each sandbox, in whole seconds since the Unix epoch: what
//! `activity` probes read to judge a sandbox idle. One registry type for whoever sees the
//! traffic: the gateway (`oka serve`, per request) and the node agent's relay (on a cluster, per
//! byte moved); each documents when it records.
//!
//! Rules: a later record only ever moves a time forward; entries older than [`KEEP`] (the
//! longest activity window, a day, plus an hour) are dropped by [`Activity::prune`], so IDs of
//! deleted sandboxes do not accumulate.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long an entry is kept after its last traffic.
pub const KEEP: Duration = Duration::from_secs(86_400 + 3_600);

/// The last traffic time per sandbox ID and port. Cheap to share (`Arc`); every method takes
/// one short lock.
#[derive(Debug, Default)]
pub struct Activity {
    seen: Mutex<HashMap<String, Vec<(u16, i64)>>>,
}

/// Whole seconds since the Unix epoch, now.
pub fn now_seconds() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl Activity {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records traffic to `port` of sandbox `id` now.
    pub fn touch(&self, id: &str, port: u16) {
        self.touch_at(id, port, now_seconds());
    }

    /// Records traffic to `port` of sandbox `id` at `second` (Unix seconds).
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

    /// The last traffic time (Unix seconds) to sandbox `id`, on any port, or only on `ports`
    /// when that is not empty.
    pub fn last(&self, id: &str, ports: &[i32]) -> Option<i64> {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.get(id)?
            .iter()
            .filter(|(p, _)| ports.is_empty() || ports.contains(&i32::from(*p)))
            .map(|(_, at)| *at)
            .max()
    }

    /// Drops entries whose last traffic is older than [`KEEP`].
    pub fn prune(&self) {
        let oldest = now_seconds().saturating_sub(i64::try_from(KEEP.as_secs()).unwrap_or(0));
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.retain(|_, ports| {
            ports.retain(|(_, at)| *at >= oldest);
            !ports.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_is_the_latest_request_on_the_ports_asked_for() {
        let a = Activity::new();
        assert_eq!(a.last("s", &[]), None);
        a.touch_at("s", 8000, 100);
        a.touch_at("s", 49983, 200);
        a.touch_at("s", 8000, 50);
        assert_eq!(a.last("s", &[]), Some(200));
        assert_eq!(a.last("s", &[8000]), Some(100));
        assert_eq!(a.last("s", &[1]), None);
        assert_eq!(a.last("other", &[]), None);
    }

    #[test]
    fn prune_drops_old_entries() {
        let a = Activity::new();
        a.touch_at("old", 1, 10);
        a.touch("new", 1);
        a.prune();
        assert_eq!(a.last("old", &[]), None);
        assert!(a.last("new", &[]).is_some());
    }
}
