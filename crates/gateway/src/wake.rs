//! Wake on request: the pure rules deciding whether a request may resume a paused sandbox,
//! and the resume write.
//!
//! # Rules
//!
//! - Annotation `agents.kruise.io/auto-resume` (E2B's `autoResume: {enabled}`, recorded by
//!   the manager at create): `"true"` resumes on any request (unless the pause kept only the
//!   files, pause strategy `Stop`: E2B never resumes such a sandbox for traffic), `"false"`
//!   never.
//! - Absent: only an **auto-paused** sandbox is resumed: one the auto-pause policy paused
//!   (`agents.kruise.io/paused-by: auto-pause-policy`), or one its `pauseTime` timer paused
//!   (no `paused-by` marker and `spec.pauseTime` reached). A sandbox paused explicitly is not
//!   woken by traffic; the E2B pause API marks its pauses `paused-by: api`.
//!
//! # The write
//!
//! [`resumed`] is the update: `spec.paused: false`, the `paused-by` marker removed, and, when
//! the sandbox has a `pauseTime` (the E2B "pause at timeout" mode), its end moved to
//! `now + resume_timeout` (and `shutdownTime` to that plus 100 years), as the manager's
//! `connect` does, so the timer does not pause it again at once. The executor applies it
//! with the sandbox's resourceVersion as precondition; on a conflict it re-reads and
//! re-decides, and writes nothing when the sandbox is no longer paused (first writer wins).

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use oka_api::common::PauseStrategyType;
use oka_api::{Sandbox, annotations};

/// The retention of a paused sandbox in the E2B "pause at timeout" mode.
const FOREVER: SignedDuration = oka_api::retention::FOREVER;

fn annotation<'a>(sandbox: &'a Sandbox, key: &str) -> Option<&'a str> {
    sandbox.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Whether a request to the paused `sandbox` may resume it at `now` (see the module rules).
pub fn may_wake(sandbox: &Sandbox, now: Timestamp) -> bool {
    let files_only = sandbox
        .spec
        .pause_strategy
        .as_ref()
        .is_some_and(|s| s.type_ == Some(PauseStrategyType::Stop));
    match annotation(sandbox, annotations::AUTO_RESUME) {
        // A pause that kept only the files restarts the processes: E2B resumes it only when
        // asked (connect), never for traffic.
        Some("true") => return !files_only,
        Some("false") => return false,
        _ => {}
    }
    match annotation(sandbox, annotations::PAUSED_BY) {
        Some(by) => by == annotations::PAUSED_BY_AUTO_PAUSE_POLICY,
        None => sandbox.spec.pause_time.as_ref().is_some_and(|t| t.0 <= now),
    }
}

fn whole_seconds(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// The resume update of `sandbox` at `now`, or `None` when it is not paused (nothing to
/// write).
pub fn resumed(
    sandbox: &Sandbox,
    now: Timestamp,
    resume_timeout: SignedDuration,
) -> Option<Sandbox> {
    if !sandbox.is_paused() {
        return None;
    }
    let mut update = sandbox.clone();
    update.spec.paused = Some(false);
    if let Some(notes) = update.metadata.annotations.as_mut() {
        notes.remove(annotations::PAUSED_BY);
    }
    if update.spec.pause_time.is_some() {
        let end = whole_seconds(now.saturating_add(resume_timeout).unwrap_or(Timestamp::MAX));
        update.spec.pause_time = Some(Time(end));
        update.spec.shutdown_time =
            Some(Time(end.saturating_add(FOREVER).unwrap_or(Timestamp::MAX)));
    }
    Some(update)
}

#[cfg(test)]
mod tests {
    use oka_api::SandboxPhase;

    use super::*;

    fn now() -> Timestamp {
        Timestamp::from_second(1_767_225_600).unwrap()
    }

    fn paused() -> oka_api::testing::SandboxBuilder {
        Sandbox::test().claimed().phase(SandboxPhase::Paused).paused()
    }

    #[test]
    fn annotation_decides_when_present() {
        let s = paused().annotation(annotations::AUTO_RESUME, "true").build();
        assert!(may_wake(&s, now()));
        let s = paused()
            .annotation(annotations::AUTO_RESUME, "false")
            .pause_at(now() - SignedDuration::from_secs(1))
            .build();
        assert!(!may_wake(&s, now()));
        let mut files_only = paused().annotation(annotations::AUTO_RESUME, "true").build();
        files_only.spec.pause_strategy = Some(oka_api::common::PauseStrategy {
            type_: Some(PauseStrategyType::Stop),
            ..Default::default()
        });
        assert!(
            !may_wake(&files_only, now()),
            "a filesystem-only pause is resumed by connect only"
        );
    }

    #[test]
    fn absent_annotation_wakes_only_auto_paused() {
        let past = now() - SignedDuration::from_secs(10);
        let future = now() + SignedDuration::from_secs(10);
        assert!(may_wake(&paused().pause_at(past).build(), now()), "timer pause");
        assert!(!may_wake(&paused().pause_at(future).build(), now()), "paused before its timer");
        assert!(!may_wake(&paused().build(), now()), "no timer: an explicit pause");
        let policy = paused()
            .annotation(annotations::PAUSED_BY, annotations::PAUSED_BY_AUTO_PAUSE_POLICY)
            .build();
        assert!(may_wake(&policy, now()));
        let api = paused()
            .annotation(annotations::PAUSED_BY, annotations::PAUSED_BY_API)
            .pause_at(past)
            .build();
        assert!(!may_wake(&api, now()), "marked as an explicit pause");
    }

    #[test]
    fn resumed_unpauses_and_moves_the_timer() {
        let s = paused()
            .pause_at(now() - SignedDuration::from_secs(10))
            .annotation(annotations::PAUSED_BY, annotations::PAUSED_BY_AUTO_PAUSE_POLICY)
            .build();
        let u = resumed(&s, now(), SignedDuration::from_secs(300)).unwrap();
        assert_eq!(u.spec.paused, Some(false));
        assert_eq!(u.spec.pause_time.unwrap().0, now() + SignedDuration::from_secs(300));
        assert!(u.spec.shutdown_time.unwrap().0 > now() + SignedDuration::from_hours(24 * 365));
        assert!(!u.metadata.annotations.unwrap().contains_key(annotations::PAUSED_BY));
        // Without a timer only the flag changes.
        let s = paused().annotation(annotations::AUTO_RESUME, "true").build();
        let u = resumed(&s, now(), SignedDuration::from_secs(300)).unwrap();
        assert_eq!(
            (u.spec.paused, u.spec.pause_time, u.spec.shutdown_time),
            (Some(false), None, None)
        );
        // Not paused: nothing to write.
        assert!(resumed(&Sandbox::test().claimed().build(), now(), SignedDuration::ZERO).is_none());
    }
}
