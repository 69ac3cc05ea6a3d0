//! The rules of a sandbox's end, in one place: which timeouts are accepted, and what happens
//! when the time is up (E2B's lifecycle of a create).
//!
//! Everything here is pure: the handlers parse the request, call these rules, and write what
//! they decide.
//!
//! # Timeouts
//!
//! A timeout is whole seconds from now, accepted within `minTimeout..=maxTimeout`
//! ([`TimeoutBounds`]). E2B accepts any timeout from 0 (its SDKs' own tests create sandboxes
//! with `timeout=5`), so the default minimum is 0; the reference's 30 s is the setting
//! `api.minTimeout: 30s`. The same bounds hold for a create, `/timeout`, `/connect` and
//! `/resume`. A create or a resume without a timeout, or with 0, gets [`DEFAULT_TIMEOUT_SECS`]
//! (the SDKs always send one; 0 is the reference's "default", and a resume that ends at once
//! would be paused or killed again before it ran); `/timeout` with 0 ends the sandbox now: its
//! timeout action (kill or pause) is applied at once.
//!
//! # Lifecycle
//!
//! The newest SDKs turn `lifecycle={"on_timeout": ..., "auto_resume": ...}` into three fields
//! of the create: `autoPause` (pause instead of kill at the end time), `autoPauseMemory` (the
//! pause keeps the memory, the default, or only the files) and `autoResume.enabled` (traffic
//! through the gateway resumes the paused sandbox). [`plan_lifecycle`] checks them as E2B does
//! and decides; how each pause maps onto a pause strategy of the runtime is
//! [`PauseMemory::strategy`].

use oka_api::common::{PauseStrategy, PauseStrategyType};

use super::ApiError;
use super::models::AutoResume;

/// The create timeout when none (or 0) is given, seconds.
pub const DEFAULT_TIMEOUT_SECS: i64 = 300;

/// The accepted range of a timeout, seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeoutBounds {
    /// The shortest (`api.minTimeout`; default 0, as E2B).
    pub min: i64,
    /// The longest (default 30 days).
    pub max: i64,
}

impl TimeoutBounds {
    /// `timeout` when it is within the bounds.
    ///
    /// # Errors
    ///
    /// 400 `timeout should between <min> and <max>` (the reference's words) otherwise.
    pub fn check(self, timeout: i64) -> Result<i64, ApiError> {
        if (self.min..=self.max).contains(&timeout) {
            Ok(timeout)
        } else {
            Err(ApiError::BadRequest(format!(
                "timeout should between {} and {}",
                self.min, self.max
            )))
        }
    }

    /// The timeout of a create: absent or 0 is [`DEFAULT_TIMEOUT_SECS`], anything else must be
    /// within the bounds.
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check).
    pub fn create(self, timeout: Option<i64>) -> Result<i64, ApiError> {
        match timeout {
            None | Some(0) => Ok(DEFAULT_TIMEOUT_SECS.clamp(self.min, self.max)),
            Some(timeout) => self.check(timeout),
        }
    }

    /// The timeout of a resume (`/connect` of a paused sandbox, `/resume`): absent or 0 is
    /// [`DEFAULT_TIMEOUT_SECS`], as for a create; anything else must be within the bounds.
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check).
    pub fn resume(self, timeout: Option<i64>) -> Result<i64, ApiError> {
        self.create(timeout)
    }
}

/// What a pause keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseMemory {
    /// Memory and files: the same processes carry on after the resume (E2B `mode: "full"`).
    Full,
    /// Files only: the processes end, and start again on the same files at the resume
    /// (E2B `mode: "filesystem"`, `keep_memory: false`).
    Filesystem,
}

impl PauseMemory {
    /// `true` (or absent) is [`Full`](Self::Full), `false` [`Filesystem`](Self::Filesystem):
    /// the `memory` flag of the API.
    pub fn from_flag(memory: Option<bool>) -> Self {
        if memory == Some(false) { Self::Filesystem } else { Self::Full }
    }

    /// The pause strategy that keeps what this asks for, given the strategy of the sandbox's
    /// template: `Full` keeps the template's memory-keeping strategy (a freeze when it names
    /// none, a hibernation when it says `Hibernate`; a template that says `Stop` gets a freeze,
    /// since the caller asked for the memory); `Filesystem` is `Stop`.
    pub fn strategy(self, template: Option<&PauseStrategy>) -> Option<PauseStrategy> {
        match self {
            Self::Full => template.filter(|s| s.type_ != Some(PauseStrategyType::Stop)).cloned(),
            Self::Filesystem => Some(PauseStrategy {
                type_: Some(PauseStrategyType::Stop),
                ..PauseStrategy::default()
            }),
        }
    }

    /// The value of the annotation that records it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Filesystem => "filesystem",
        }
    }

    /// The value of the annotation read back (`full` when absent or unknown).
    pub fn parse(value: Option<&str>) -> Self {
        if value == Some("filesystem") { Self::Filesystem } else { Self::Full }
    }
}

/// What happens when a sandbox's time is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimeout {
    /// It is deleted (E2B's default).
    Kill,
    /// It is paused, keeping what the [`PauseMemory`] says.
    Pause(PauseMemory),
}

/// The lifecycle a create asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifecycle {
    /// What happens at the end time.
    pub on_timeout: OnTimeout,
    /// Whether a request through the gateway resumes the paused sandbox. Without it only
    /// `connect` (or `/resume`) wakes it.
    pub auto_resume: bool,
}

/// The lifecycle of a create from its `autoPause`, `autoPauseMemory` and `autoResume`.
///
/// # Errors
///
/// 400 when the fields contradict each other, as the SDKs refuse them: `autoPauseMemory`
/// without `autoPause: true`, or `autoResume` with a filesystem-only pause (such a sandbox can
/// only be resumed explicitly, since its processes restart).
pub fn plan_lifecycle(
    auto_pause: Option<bool>,
    auto_pause_memory: Option<bool>,
    auto_resume: Option<AutoResume>,
) -> Result<Lifecycle, ApiError> {
    let auto_resume = auto_resume.is_some_and(AutoResume::enabled);
    let on_timeout = match (auto_pause, auto_pause_memory) {
        (Some(true), memory) => OnTimeout::Pause(PauseMemory::from_flag(memory)),
        (_, None) => OnTimeout::Kill,
        (_, Some(_)) => {
            return Err(ApiError::BadRequest(
                "autoPauseMemory is only allowed when autoPause is true".into(),
            ));
        }
    };
    if auto_resume && on_timeout == OnTimeout::Pause(PauseMemory::Filesystem) {
        return Err(ApiError::BadRequest(
            "autoResume cannot be enabled with autoPauseMemory false: a filesystem-only pause \
             must be resumed explicitly with connect"
                .into(),
        ));
    }
    Ok(Lifecycle { on_timeout, auto_resume })
}

#[cfg(test)]
mod tests {
    use super::*;

    const E2B: TimeoutBounds = TimeoutBounds { min: 0, max: 86_400 };
    const REFERENCE: TimeoutBounds = TimeoutBounds { min: 30, max: 86_400 };

    #[test]
    fn timeout_bounds() {
        // (bounds, what, timeout, expected)
        type Case = (TimeoutBounds, &'static str, Option<i64>, Result<i64, &'static str>);
        let cases: &[Case] = &[
            (E2B, "create", Some(5), Ok(5)),
            (E2B, "create", Some(1), Ok(1)),
            (E2B, "create", None, Ok(300)),
            (E2B, "create", Some(0), Ok(300)),
            (E2B, "create", Some(-1), Err("timeout should between 0 and 86400")),
            (E2B, "create", Some(86_401), Err("timeout should between 0 and 86400")),
            (E2B, "check", Some(0), Ok(0)),
            (E2B, "check", Some(5), Ok(5)),
            (E2B, "resume", Some(5), Ok(5)),
            (E2B, "resume", None, Ok(300)),
            (E2B, "resume", Some(0), Ok(300)),
            (REFERENCE, "create", Some(5), Err("timeout should between 30 and 86400")),
            (REFERENCE, "create", Some(0), Ok(300)),
            (REFERENCE, "create", Some(30), Ok(30)),
            (REFERENCE, "check", Some(0), Err("timeout should between 30 and 86400")),
            (REFERENCE, "resume", Some(29), Err("timeout should between 30 and 86400")),
            (REFERENCE, "resume", None, Ok(300)),
        ];
        for (bounds, what, timeout, expected) in cases {
            let got = match *what {
                "create" => bounds.create(*timeout),
                "resume" => bounds.resume(*timeout),
                _ => bounds.check(timeout.unwrap_or_default()),
            };
            let got = got.map_err(|e| e.to_string());
            assert_eq!(got, expected.map_err(str::to_owned), "{bounds:?} {what} {timeout:?}");
        }
    }

    #[test]
    fn lifecycle_rules() {
        let on = Some(AutoResume::Object { enabled: true });
        let off = Some(AutoResume::Object { enabled: false });
        let full = OnTimeout::Pause(PauseMemory::Full);
        let files = OnTimeout::Pause(PauseMemory::Filesystem);
        // (autoPause, autoPauseMemory, autoResume) → (onTimeout, autoResume) or the error
        type Case = (
            Option<bool>,
            Option<bool>,
            Option<AutoResume>,
            Result<(OnTimeout, bool), &'static str>,
        );
        let cases: &[Case] = &[
            (None, None, None, Ok((OnTimeout::Kill, false))),
            (Some(false), None, None, Ok((OnTimeout::Kill, false))),
            (Some(true), None, None, Ok((full, false))),
            (Some(true), Some(true), None, Ok((full, false))),
            (Some(true), Some(false), None, Ok((files, false))),
            (Some(true), None, on, Ok((full, true))),
            (Some(true), None, off, Ok((full, false))),
            (Some(true), None, Some(AutoResume::Bool(true)), Ok((full, true))),
            (None, None, on, Ok((OnTimeout::Kill, true))),
            (Some(true), Some(false), off, Ok((files, false))),
            (Some(true), Some(false), on, Err("autoResume cannot be enabled")),
            (Some(false), Some(true), None, Err("autoPauseMemory is only allowed")),
            (None, Some(false), None, Err("autoPauseMemory is only allowed")),
        ];
        for (pause, memory, resume, expected) in cases {
            let got = plan_lifecycle(*pause, *memory, *resume);
            match (got, expected) {
                (Ok(got), Ok((on_timeout, auto_resume))) => {
                    assert_eq!((got.on_timeout, got.auto_resume), (*on_timeout, *auto_resume));
                }
                (Err(got), Err(start)) => {
                    assert!(got.to_string().starts_with(start), "{got} for {pause:?} {memory:?}");
                }
                (got, expected) => {
                    panic!("{pause:?} {memory:?} {resume:?}: {got:?}, want {expected:?}")
                }
            }
        }
    }

    #[test]
    fn pause_memory_strategies() {
        let of = |t| Some(PauseStrategy { type_: Some(t), ..PauseStrategy::default() });
        let hibernate = of(PauseStrategyType::Hibernate);
        let stop = of(PauseStrategyType::Stop);
        assert_eq!(PauseMemory::Full.strategy(None), None);
        assert_eq!(PauseMemory::Full.strategy(hibernate.as_ref()), hibernate);
        assert_eq!(PauseMemory::Full.strategy(stop.as_ref()), None);
        assert_eq!(PauseMemory::Filesystem.strategy(None), stop);
        assert_eq!(PauseMemory::Filesystem.strategy(hibernate.as_ref()), stop);
        for memory in [PauseMemory::Full, PauseMemory::Filesystem] {
            assert_eq!(PauseMemory::parse(Some(memory.as_str())), memory);
        }
    }
}
