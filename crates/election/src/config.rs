//! What an elector is configured with, its defaults and the rules that keep it safe.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// How long a lease is good for after its holder last renewed it, as others observe it.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long a leader keeps trying to renew before it gives leadership up.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often a leader renews, and a standby looks at the lease.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// One election: which Lease, who this replica is, and its timing.
///
/// # The timing rules
///
/// - A standby takes the lease only when `lease_duration` (as written in the Lease by its
///   holder) has passed since it last *saw the Lease change*, measured on its own monotonic
///   clock. It never compares the Lease's `renewTime` with its own wall clock: replicas'
///   clocks disagree, and the only thing this scheme assumes is that they tick at about the
///   same rate.
/// - The leader gives leadership up when no renewal succeeded for `renew_deadline`, counted
///   from the moment the last successful renewal *started*. Since a standby can only have seen
///   that renewal after it started, and waits `lease_duration` from then, the old leader stops
///   at least `lease_duration - renew_deadline` before anyone else may start: that margin is
///   the time the caller has to stop its leader work, and covers clock rate drift. Hence
///   `renew_deadline < lease_duration`.
/// - `retry_period < renew_deadline`, so a leader gets several attempts to renew before it
///   gives up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionConfig {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity, unique among the candidates (see [`unique_identity`]).
    pub identity: String,
    /// How long the lease is good for after its last observed change. Written to the Lease
    /// in whole seconds (rounded up), as `leaseDurationSeconds`.
    pub lease_duration: Duration,
    /// How long a leader keeps trying to renew before leadership is lost.
    pub renew_deadline: Duration,
    /// How often the leader renews and a standby retries.
    pub retry_period: Duration,
}

impl ElectionConfig {
    /// A configuration for the Lease `namespace/name` with the default timing (15 s lease,
    /// 10 s renew deadline, 2 s retry period, as client-go and controller-runtime use).
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        ElectionConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }

    /// Checks the rules in the type's documentation.
    ///
    /// # Errors
    ///
    /// The first rule broken, as a [`ConfigError`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.namespace.is_empty() || self.name.is_empty() {
            return Err(ConfigError::NoLease);
        }
        if self.identity.is_empty() {
            return Err(ConfigError::NoIdentity);
        }
        if self.lease_duration < Duration::from_secs(1) {
            return Err(ConfigError::LeaseDurationTooShort { lease_duration: self.lease_duration });
        }
        if self.lease_duration_seconds().is_none() {
            return Err(ConfigError::LeaseDurationTooLong { lease_duration: self.lease_duration });
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(ConfigError::RenewDeadlineNotBelowLeaseDuration {
                renew_deadline: self.renew_deadline,
                lease_duration: self.lease_duration,
            });
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err(ConfigError::RetryPeriodNotBelowRenewDeadline {
                retry_period: self.retry_period,
                renew_deadline: self.renew_deadline,
            });
        }
        Ok(())
    }

    /// `lease_duration` in whole seconds, rounded up, as the Lease records it.
    pub(crate) fn lease_duration_seconds(&self) -> Option<i32> {
        let secs =
            self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(secs).ok()
    }
}

/// Why an [`ElectionConfig`] is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The Lease's namespace or name is empty.
    #[error("the lease's namespace and name must not be empty")]
    NoLease,
    /// The identity is empty: an empty `holderIdentity` means "nobody holds the lease".
    #[error("the identity must not be empty")]
    NoIdentity,
    /// The Lease records its duration in whole seconds.
    #[error("lease duration {lease_duration:?} is shorter than one second")]
    LeaseDurationTooShort {
        /// The configured lease duration.
        lease_duration: Duration,
    },
    /// The duration does not fit the Lease's `leaseDurationSeconds` (an i32).
    #[error("lease duration {lease_duration:?} does not fit in leaseDurationSeconds")]
    LeaseDurationTooLong {
        /// The configured lease duration.
        lease_duration: Duration,
    },
    /// A leader must give up before a standby may take over.
    #[error(
        "renew deadline {renew_deadline:?} must be shorter than lease duration {lease_duration:?}"
    )]
    RenewDeadlineNotBelowLeaseDuration {
        /// The configured renew deadline.
        renew_deadline: Duration,
        /// The configured lease duration.
        lease_duration: Duration,
    },
    /// A leader must get more than one attempt to renew within the deadline.
    #[error(
        "retry period {retry_period:?} must be non-zero and shorter than renew deadline {renew_deadline:?}"
    )]
    RetryPeriodNotBelowRenewDeadline {
        /// The configured retry period.
        retry_period: Duration,
        /// The configured renew deadline.
        renew_deadline: Duration,
    },
}

/// An identity unique to this process: the host's name (a Pod's name on Kubernetes), `_`, and
/// 16 random hex digits, so two processes on one host, or a restarted Pod with the same name,
/// never share one (client-go's recommendation).
pub fn unique_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "oka".to_owned());
    format!("{host}_{:016x}", random_u64())
}

/// A random number from the standard library's per-process random hash keys: enough for an
/// identity suffix and for jitter, without a random number crate.
pub(crate) fn random_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ElectionConfig {
        ElectionConfig::new("ns", "oka-controllers", "a")
    }

    #[test]
    fn defaults_are_client_go_s_and_valid() {
        let c = config();
        assert_eq!(c.lease_duration, Duration::from_secs(15));
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_secs(2));
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.lease_duration_seconds(), Some(15));
    }

    #[test]
    fn timing_that_could_let_two_replicas_lead_is_refused() {
        let check = |lease: u64, renew: u64, retry: u64| {
            ElectionConfig {
                lease_duration: Duration::from_millis(lease),
                renew_deadline: Duration::from_millis(renew),
                retry_period: Duration::from_millis(retry),
                ..config()
            }
            .validate()
        };
        assert!(matches!(
            check(10_000, 10_000, 2_000),
            Err(ConfigError::RenewDeadlineNotBelowLeaseDuration { .. })
        ));
        assert!(matches!(
            check(10_000, 12_000, 2_000),
            Err(ConfigError::RenewDeadlineNotBelowLeaseDuration { .. })
        ));
        assert!(matches!(
            check(15_000, 10_000, 10_000),
            Err(ConfigError::RetryPeriodNotBelowRenewDeadline { .. })
        ));
        assert!(matches!(
            check(15_000, 10_000, 0),
            Err(ConfigError::RetryPeriodNotBelowRenewDeadline { .. })
        ));
        assert!(matches!(check(500, 400, 100), Err(ConfigError::LeaseDurationTooShort { .. })));
        assert_eq!(check(2_000, 1_000, 250), Ok(()));
    }

    #[test]
    fn an_empty_identity_or_lease_name_is_refused() {
        assert_eq!(
            ElectionConfig { identity: String::new(), ..config() }.validate(),
            Err(ConfigError::NoIdentity)
        );
        assert_eq!(
            ElectionConfig { name: String::new(), ..config() }.validate(),
            Err(ConfigError::NoLease)
        );
    }

    #[test]
    fn a_fractional_lease_duration_is_written_rounded_up() {
        let c = ElectionConfig { lease_duration: Duration::from_millis(1_500), ..config() };
        assert_eq!(c.lease_duration_seconds(), Some(2));
    }

    #[test]
    fn identities_are_unique_per_call() {
        let (a, b) = (unique_identity(), unique_identity());
        assert_ne!(a, b);
        assert!(a.contains('_'), "{a}");
    }
}
