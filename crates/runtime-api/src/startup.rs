//! The startup check: what must succeed inside a sandbox before it is reported ready.
//!
//! It is Kubernetes' `startupProbe` (and E2B's ready command): the check runs after the command
//! started, every [`StartupCheck::period_seconds`], until its first success; the sandbox is not
//! ready before. After [`StartupCheck::failure_threshold`] failures in a row the start fails, and
//! the command is ended. It runs once per start of the command: a restart checks again, a resume
//! or a restore from hibernation (the command kept running) does not.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::spec::SpecError;

/// Kubernetes' default `periodSeconds`.
pub const DEFAULT_PERIOD_SECONDS: u32 = 10;
/// Kubernetes' default `timeoutSeconds`.
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 1;
/// Kubernetes' default `failureThreshold`.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;
/// A check run until its first success before the sandbox is ready.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartupCheck {
    /// What is checked.
    pub action: CheckAction,
    /// Seconds after the command started before the first attempt.
    pub initial_delay_seconds: u32,
    /// Seconds from the start of one attempt to the start of the next; at least 1.
    pub period_seconds: u32,
    /// Seconds an attempt may take before it counts as failed; at least 1.
    pub timeout_seconds: u32,
    /// Failed attempts in a row after which the start fails; at least 1.
    pub failure_threshold: u32,
}

impl StartupCheck {
    /// A check of `action` with Kubernetes' defaults (no delay, every 10 s, 1 s timeout, 3
    /// attempts).
    pub fn new(action: CheckAction) -> Self {
        Self {
            action,
            initial_delay_seconds: 0,
            period_seconds: DEFAULT_PERIOD_SECONDS,
            timeout_seconds: DEFAULT_TIMEOUT_SECONDS,
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
        }
    }

    /// The longest the check can take from the command's start to its last verdict. As in
    /// Kubernetes, any bound is allowed (E2B's ready command may wait long in each attempt, and
    /// a slow first start is the reason for a startup probe); a caller adding it to an instant
    /// must allow for one beyond any clock ([`std::time::Instant::checked_add`]).
    pub fn bound(&self) -> Duration {
        let per_attempt =
            u64::from(self.period_seconds.max(1)).max(u64::from(self.timeout_seconds.max(1)));
        let total = u64::from(self.initial_delay_seconds)
            .saturating_add(u64::from(self.failure_threshold).saturating_mul(per_attempt + 1));
        Duration::from_secs(total)
    }

    /// Checks the values Kubernetes rejects and what the runtime cannot run.
    pub fn validate(&self) -> Result<(), SpecError> {
        let invalid = |reason| Err(SpecError::StartupCheck(reason));
        if self.period_seconds == 0 {
            return invalid("periodSeconds must be at least 1");
        }
        if self.timeout_seconds == 0 {
            return invalid("timeoutSeconds must be at least 1");
        }
        if self.failure_threshold == 0 {
            return invalid("failureThreshold must be at least 1");
        }
        match &self.action {
            CheckAction::Exec { command } => {
                if command.first().is_none_or(String::is_empty) {
                    return invalid("exec.command must name a program");
                }
                if command.iter().any(|a| a.contains('\0')) {
                    return invalid("exec.command contains a NUL byte");
                }
            }
            CheckAction::TcpSocket { port } | CheckAction::HttpGet { port, .. } if *port == 0 => {
                return invalid("port must be between 1 and 65535");
            }
            CheckAction::TcpSocket { .. } => {}
            CheckAction::HttpGet { path, .. } => {
                if !path.starts_with('/') || path.chars().any(|c| c.is_ascii_control() || c == ' ')
                {
                    return invalid(
                        "httpGet.path must start with / and hold no spaces or control characters",
                    );
                }
            }
        }
        Ok(())
    }
}

/// What a [`StartupCheck`] does once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckAction {
    /// Runs a program inside the sandbox as the command's user, with its environment and
    /// working directory; exit code 0 is a success.
    Exec {
        /// Program then arguments; the program is looked up in the command's `PATH`.
        command: Vec<String>,
    },
    /// Connects to a TCP port on the sandbox's loopback; an accepted connection is a success.
    TcpSocket {
        /// The port.
        port: u16,
    },
    /// Sends `GET path` over HTTP/1.1 to a port on the sandbox's loopback; a status from 200
    /// to 399 is a success.
    HttpGet {
        /// The port.
        port: u16,
        /// The path with its query, starting with `/`.
        path: String,
    },
}

impl std::fmt::Display for CheckAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exec { command } => write!(f, "exec {command:?}"),
            Self::TcpSocket { port } => write!(f, "tcp-socket :{port}"),
            Self::HttpGet { port, path } => write!(f, "http-get http://:{port}{path}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_bound_is_allowed_and_saturates() {
        // E2B's ready command as a build writes it: each attempt may wait as long as the build.
        let ready = StartupCheck {
            period_seconds: 1,
            timeout_seconds: 300,
            failure_threshold: 300,
            ..StartupCheck::new(CheckAction::Exec { command: vec!["true".into()] })
        };
        assert_eq!(ready.validate(), Ok(()));
        assert_eq!(ready.bound(), Duration::from_secs(300 * 301));
        let most = StartupCheck {
            initial_delay_seconds: u32::MAX,
            timeout_seconds: u32::MAX,
            failure_threshold: u32::MAX,
            ..ready
        };
        assert_eq!(most.validate(), Ok(()));
        assert!(most.bound() > Duration::from_secs(u64::from(u32::MAX) * u64::from(u32::MAX)));
    }

    #[test]
    fn kubernetes_defaults_and_invalid_values() {
        let exec = CheckAction::Exec { command: vec!["true".into()] };
        let check = StartupCheck::new(exec.clone());
        assert_eq!(
            (check.initial_delay_seconds, check.period_seconds, check.timeout_seconds),
            (0, 10, 1)
        );
        assert_eq!(check.failure_threshold, 3);
        assert_eq!(check.validate(), Ok(()));
        for broken in [
            StartupCheck { period_seconds: 0, ..check.clone() },
            StartupCheck { timeout_seconds: 0, ..check.clone() },
            StartupCheck { failure_threshold: 0, ..check.clone() },
            StartupCheck::new(CheckAction::Exec { command: vec![] }),
            StartupCheck::new(CheckAction::TcpSocket { port: 0 }),
            StartupCheck::new(CheckAction::HttpGet { port: 80, path: "x".into() }),
        ] {
            assert!(
                matches!(broken.validate(), Err(SpecError::StartupCheck(_))),
                "{broken:?} accepted"
            );
        }
    }

    #[test]
    fn the_bound_covers_every_attempt() {
        let check = StartupCheck {
            initial_delay_seconds: 5,
            period_seconds: 1,
            timeout_seconds: 2,
            failure_threshold: 30,
            ..StartupCheck::new(CheckAction::TcpSocket { port: 80 })
        };
        assert!(check.bound() >= Duration::from_secs(5 + 30 * 2));
    }
}
