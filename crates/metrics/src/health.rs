//! Liveness and readiness, answered the same way on every listener of `oka serve`.
//!
//! `/healthz` says the process serves requests (it answers, so it is alive). `/readyz` says
//! whether every readiness check passes: the assembly adds one per thing that must be done
//! before requests can be served well (the store open, the controllers' caches synced, …). The
//! bodies are Kubernetes' short form: `ok`, or the failing checks one per line.

use std::sync::{Arc, PoisonError, RwLock};

type Check = Box<dyn Fn() -> bool + Send + Sync>;

/// The readiness checks of one process; cheap to clone.
#[derive(Clone, Default)]
pub struct Health(Arc<RwLock<Vec<(String, Check)>>>);

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let checks = self.0.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_list().entries(checks.iter().map(|(name, _)| name)).finish()
    }
}

/// An answer to a health request: status code, body.
pub type Answer = (u16, String);

impl Health {
    /// Adds the readiness check `name`, passing while `check` returns true.
    pub fn add_check(
        &self,
        name: impl Into<String>,
        check: impl Fn() -> bool + Send + Sync + 'static,
    ) {
        self.0.write().unwrap_or_else(PoisonError::into_inner).push((name.into(), Box::new(check)));
    }

    /// The names of the checks that fail now.
    pub fn failing(&self) -> Vec<String> {
        let checks = self.0.read().unwrap_or_else(PoisonError::into_inner);
        checks.iter().filter(|(_, check)| !check()).map(|(name, _)| name.clone()).collect()
    }

    /// The answer to `GET /healthz`: always 200 `ok`.
    pub fn healthz(&self) -> Answer {
        (200, "ok\n".to_owned())
    }

    /// The answer to `GET /readyz`: 200 `ok`, or 503 naming each failing check.
    pub fn readyz(&self) -> Answer {
        let failing = self.failing();
        if failing.is_empty() {
            return (200, "ok\n".to_owned());
        }
        let mut body = String::new();
        for name in failing {
            body.push_str("[-]");
            body.push_str(&name);
            body.push_str(" failed\n");
        }
        body.push_str("readyz check failed\n");
        (503, body)
    }

    /// The answer for a request path, when it is one of the health paths.
    pub fn answer(&self, path: &str) -> Option<Answer> {
        match path {
            "/healthz" | "/livez" => Some(self.healthz()),
            "/readyz" => Some(self.readyz()),
            _ => None,
        }
    }
}

/// Whether `path` is one of the health paths.
pub fn is_health_path(path: &str) -> bool {
    matches!(path, "/healthz" | "/livez" | "/readyz")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn readiness_follows_the_checks() {
        let health = Health::default();
        assert_eq!(health.readyz().0, 200);
        let synced = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&synced);
        health.add_check("caches", move || flag.load(Ordering::Relaxed));
        let (code, body) = health.readyz();
        assert_eq!(code, 503);
        assert!(body.contains("[-]caches failed"), "{body}");
        assert_eq!(health.healthz().0, 200);
        synced.store(true, Ordering::Relaxed);
        assert_eq!(health.answer("/readyz"), Some((200, "ok\n".to_owned())));
        assert_eq!(health.answer("/other"), None);
    }
}
