//! Paused retention: how long a paused sandbox is kept before it is deleted.
//!
//! The annotation `agents.kruise.io/reserve-paused-sandbox-duration` (and the E2B header that
//! overrides it for one pause) holds a Go duration or `forever`. The sandbox controller sets the
//! shutdown timer of a pause from it; the manager writes and reads it on pause, resume, timeout
//! changes and fork; the gateway's wake moves the timers by [`FOREVER`]. One rule, here.

use jiff::SignedDuration;

use crate::{Sandbox, annotations};

/// `forever`: 100 years.
pub const FOREVER: SignedDuration = SignedDuration::from_hours(100 * 365 * 24);

/// A retention as written: `forever` ([`annotations::RESERVE_FOREVER`]) or a positive Go
/// duration; `None` for anything else (zero, negative, not a duration, too large).
pub fn parse(value: &str) -> Option<SignedDuration> {
    if value == annotations::RESERVE_FOREVER {
        return Some(FOREVER);
    }
    let duration = crate::parse_go_duration(value).ok()?;
    (!duration.is_zero()).then(|| SignedDuration::try_from(duration).ok()).flatten()
}

/// The sandbox's paused retention: `None` without the annotation; a value that does not
/// [`parse`] counts as [`FOREVER`], as the reference does.
pub fn of(sandbox: &Sandbox) -> Option<SignedDuration> {
    let value =
        sandbox.metadata.annotations.as_ref()?.get(annotations::RESERVE_PAUSED_SANDBOX_DURATION)?;
    Some(parse(value).unwrap_or(FOREVER))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forever_and_positive_durations_parse() {
        assert_eq!(FOREVER, SignedDuration::from_secs(100 * 365 * 24 * 3600));
        assert_eq!(parse("forever"), Some(FOREVER));
        assert_eq!(parse("1h"), Some(SignedDuration::from_hours(1)));
        for bad in ["0s", "-1s", "soon", "", "Forever"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_sandbox_without_a_valid_retention_keeps_forever() {
        let mut sandbox = Sandbox::new("s", crate::SandboxSpec::default());
        assert_eq!(of(&sandbox), None);
        for (value, expected) in [("30m", SignedDuration::from_mins(30)), ("soon", FOREVER)] {
            sandbox.metadata.annotations = Some(
                [(annotations::RESERVE_PAUSED_SANDBOX_DURATION.to_owned(), value.to_owned())]
                    .into(),
            );
            assert_eq!(of(&sandbox), Some(expected), "{value}");
        }
    }
}
