//! What the default templates' builds are doing, for the E2B API to tell a user who asks for
//! a template that is not there yet.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use super::build::Progress;

/// The state of one template's build.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Building: the last progress seen (of this template or of the one it is copied from).
    Building { progress: Option<Progress>, started: Instant },
    /// Built; its pool exists or is being created.
    Ready,
    /// The build failed with this message.
    Failed(String),
}

/// The builds of this process, by template name.
#[derive(Debug, Default)]
pub struct TemplateBuilds {
    states: Mutex<BTreeMap<String, State>>,
}

/// Seconds a client is told to wait before asking again for a template being built.
pub const RETRY_AFTER_SECS: u64 = 10;

/// What the E2B API answers a create of a template that is not there: it is being built (a
/// 503 with `Retry-After`), or its build failed (a 503 naming why).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// Being built; the message says how far.
    Building(String),
    /// Its build failed; the message says why and what to do.
    Failed(String),
}

impl TemplateBuilds {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<String, State>) -> T) -> T {
        f(&mut self.states.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// `name` is being built from now.
    pub fn start(&self, name: &str) {
        self.with(|s| {
            s.insert(name.to_owned(), State::Building { progress: None, started: Instant::now() })
        });
    }

    /// `name`'s build is at `progress`.
    pub fn progress(&self, name: &str, progress: &Progress) {
        self.with(|s| {
            if let Some(State::Building { progress: last, .. }) = s.get_mut(name) {
                *last = Some(progress.clone());
            }
        });
    }

    /// `name` is built.
    pub fn ready(&self, name: &str) {
        self.with(|s| s.insert(name.to_owned(), State::Ready));
    }

    /// `name`'s build failed with `error`.
    pub fn failed(&self, name: &str, error: String) {
        self.with(|s| s.insert(name.to_owned(), State::Failed(error)));
    }

    /// The templates being built now.
    pub fn building(&self) -> Vec<String> {
        self.with(|s| {
            s.iter()
                .filter(|(_, state)| matches!(state, State::Building { .. }))
                .map(|(name, _)| name.clone())
                .collect()
        })
    }

    /// Why `name` cannot be created from yet; `None` when this process builds nothing by that
    /// name (it is ready, or not a default template).
    pub fn not_ready(&self, name: &str) -> Option<NotReady> {
        self.with(|s| match s.get(name)? {
            State::Ready => None,
            State::Failed(error) => Some(NotReady::Failed(format!(
                "template {name} could not be built: {error}; fix the cause and restart oka serve, \
                 or build it with `oka templates build {name}`"
            ))),
            State::Building { progress, started } => {
                let elapsed = started.elapsed().as_secs();
                let at = match progress {
                    Some(p) if p.template == name => {
                        format!("step {}/{}: {}", p.step, p.steps, p.what)
                    }
                    Some(p) => format!(
                        "first its origin {}, step {}/{}: {}",
                        p.template, p.step, p.steps, p.what
                    ),
                    None => "starting".to_owned(),
                };
                Some(NotReady::Building(format!(
                    "template {name} is being built ({at}), started {elapsed} s ago; \
                     the first start of oka serve builds it once, retry in a few minutes"
                )))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_is_told_with_its_step_until_ready_or_failed() {
        let builds = TemplateBuilds::default();
        assert_eq!(builds.not_ready("base"), None, "not a template built here");
        builds.start("base");
        assert_eq!(builds.building(), ["base"]);
        builds.progress(
            "base",
            &Progress {
                template: "base",
                step: 3,
                steps: 5,
                what: "installing packages 7/70".into(),
            },
        );
        let Some(NotReady::Building(text)) = builds.not_ready("base") else { panic!() };
        assert!(
            text.starts_with(
                "template base is being built (step 3/5: installing packages 7/70), started 0 s ago"
            ),
            "{text}"
        );
        builds.ready("base");
        assert_eq!(builds.not_ready("base"), None);
        assert!(builds.building().is_empty());
        builds.failed("code-interpreter-v1", "debootstrap failed".into());
        let Some(NotReady::Failed(text)) = builds.not_ready("code-interpreter-v1") else {
            panic!()
        };
        assert!(
            text.contains("debootstrap failed") && text.contains("oka templates build"),
            "{text}"
        );
    }
}
