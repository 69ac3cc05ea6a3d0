//! Optional features of a machine that runs sandboxes, and the one rule of which are on.
//!
//! A sandbox runs on any Linux machine where the runtime opens, but some features need more
//! than the kernel: hibernating pauses, snapshots and forks need CRIU 4.2 or newer; outbound
//! networking needs `ip` and `nft`; the code interpreter needs `oka-interpreter` and a Jupyter
//! kernel. The runtime's prober (a thin executor) fills in [`Probes`] once at start;
//! [`plan`] turns them into [`Features`]: each one available, or off with the reason and the
//! exact command that turns it on. Whoever serves a request that needs a feature asks
//! [`Features::require`] (or [`Feature::for_operation`] to learn which one an operation needs) and answers
//! its [`FeatureOff`] at once, so a missing tool is never a hang or a generic failure.
//!
//! Pure: no system call, no I/O; the probes are inputs.

use std::collections::BTreeMap;
use std::fmt;

use crate::Operation;

/// An optional feature of the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Feature {
    /// Hibernating pauses, snapshots and forks (CRIU dumps and restores).
    Hibernate,
    /// Sandboxes with outbound networking (`agents.kruise.io/network: outbound`: a veth pair
    /// and NAT).
    OutboundNetwork,
    /// The code interpreter (E2B's `run_code`, the `code-interpreter-v1` pool).
    CodeInterpreter,
}

impl Feature {
    /// Every feature, in the order the start-up summary lists them.
    pub const ALL: [Feature; 3] = [Self::Hibernate, Self::OutboundNetwork, Self::CodeInterpreter];

    /// The feature's stable name (the `feature` label of `oka_feature_available`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Hibernate => "hibernate",
            Self::OutboundNetwork => "outbound-network",
            Self::CodeInterpreter => "code-interpreter",
        }
    }

    /// What a user loses when it is off.
    pub fn uses(self) -> &'static str {
        match self {
            Self::Hibernate => "hibernating pauses, snapshots and forks",
            Self::OutboundNetwork => "sandboxes with outbound networking",
            Self::CodeInterpreter => "run_code of the code interpreter",
        }
    }

    /// The feature a runtime operation needs, if any: the CRIU ones (hibernate, restore,
    /// snapshot, clone) need [`Feature::Hibernate`]; an egress policy needs
    /// [`Feature::OutboundNetwork`]; a freeze, a stop and the rest need nothing optional.
    pub fn for_operation(operation: Operation) -> Option<Feature> {
        match operation {
            Operation::Hibernate | Operation::Restore | Operation::Snapshot | Operation::Clone => {
                Some(Self::Hibernate)
            }
            Operation::Egress => Some(Self::OutboundNetwork),
            _ => None,
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the prober found: each probe's finding (`Ok`: what was found, for the summary) or why
/// it failed (`Err`: the reason, as a sentence fragment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probes {
    /// Whether sandboxes run here at all (the runtime opened); `Err` says why not.
    pub runtime: Result<(), String>,
    /// `criu` found, new enough, and `criu check` passes.
    pub criu: Result<String, String>,
    /// `ip` and `nft` found.
    pub network_tools: Result<String, String>,
    /// `oka-interpreter` found.
    pub interpreter: Result<String, String>,
    /// A Python Jupyter kernelspec found where sandboxes see it.
    pub kernels: Result<String, String>,
}

/// Whether a feature is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// On; what was found.
    Available(String),
    /// Off.
    Off {
        /// Why.
        reason: String,
        /// The exact command or setting that turns it on.
        enable: String,
    },
}

/// A request needed a feature that is off: the answer to give, naming it and how to turn it on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} ({}) is off on this machine: {reason}; to turn it on: {enable}", feature.name(), feature.uses())]
pub struct FeatureOff {
    /// The feature.
    pub feature: Feature,
    /// Why it is off.
    pub reason: String,
    /// How to turn it on.
    pub enable: String,
}

/// How to get CRIU: the script (Debian), or a binary of one's own.
pub const ENABLE_CRIU: &str = "run `sudo scripts/install-criu.sh` (CRIU >= 4.2, built from Debian's source package), \
     or point OKA_CRIU at a criu >= 4.2 binary, then restart oka serve";
/// How to get `ip` and `nft`.
pub const ENABLE_NETWORK_TOOLS: &str =
    "run `sudo apt-get install iproute2 nftables`, then restart oka serve";
/// How to get `oka-interpreter`.
pub const ENABLE_INTERPRETER: &str = "run `cargo build --release --bins` (builds oka-interpreter beside oka), \
     or point OKA_INTERPRETER at it, then restart oka serve";
/// How to get the Jupyter kernels.
pub const ENABLE_KERNELS: &str = "run `sudo scripts/install-kernels.sh`";
/// How to get the runtime itself.
pub const ENABLE_RUNTIME: &str = "run oka serve as root, with `runtime.enabled: true`";

/// Each feature's availability on this machine.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Features {
    states: BTreeMap<Feature, Availability>,
}

/// Decides which features are on from what the prober found.
pub fn plan(probes: &Probes) -> Features {
    let off = |reason: &str, enable: &str| Availability::Off {
        reason: reason.to_owned(),
        enable: enable.to_owned(),
    };
    let states = Feature::ALL
        .into_iter()
        .map(|feature| {
            let state = if let Err(why) = &probes.runtime {
                off(&format!("sandboxes do not run here ({why})"), ENABLE_RUNTIME)
            } else {
                match feature {
                    Feature::Hibernate => match &probes.criu {
                        Ok(found) => Availability::Available(found.clone()),
                        Err(why) => off(why, ENABLE_CRIU),
                    },
                    Feature::OutboundNetwork => match &probes.network_tools {
                        Ok(found) => Availability::Available(found.clone()),
                        Err(why) => off(why, ENABLE_NETWORK_TOOLS),
                    },
                    Feature::CodeInterpreter => match (&probes.interpreter, &probes.kernels) {
                        (Err(why), _) => off(why, ENABLE_INTERPRETER),
                        (Ok(_), Err(why)) => off(why, ENABLE_KERNELS),
                        (Ok(server), Ok(kernels)) => {
                            Availability::Available(format!("{server}; {kernels}"))
                        }
                    },
                }
            };
            (feature, state)
        })
        .collect();
    Features { states }
}

impl Features {
    /// Every feature on, for callers that probe nothing (tests, a cluster's manager whose nodes
    /// answer for themselves).
    pub fn all_available() -> Self {
        let states = Feature::ALL
            .into_iter()
            .map(|f| (f, Availability::Available("assumed".to_owned())))
            .collect();
        Self { states }
    }

    /// `feature`'s availability (off when never probed).
    pub fn get(&self, feature: Feature) -> Availability {
        self.states.get(&feature).cloned().unwrap_or_else(|| Availability::Off {
            reason: "not probed".to_owned(),
            enable: ENABLE_RUNTIME.to_owned(),
        })
    }

    /// Whether `feature` is on.
    pub fn is_available(&self, feature: Feature) -> bool {
        matches!(self.get(feature), Availability::Available(_))
    }

    /// `Ok` when `feature` is on, else the error to answer.
    ///
    /// # Errors
    ///
    /// [`FeatureOff`] naming the feature, why it is off and how to turn it on.
    pub fn require(&self, feature: Feature) -> Result<(), FeatureOff> {
        match self.get(feature) {
            Availability::Available(_) => Ok(()),
            Availability::Off { reason, enable } => Err(FeatureOff { feature, reason, enable }),
        }
    }

    /// One line per feature for the start-up log: `feature hibernate: available (...)` or
    /// `feature hibernate: off (...): <reason>; to turn it on: <command>`.
    pub fn summary(&self) -> Vec<String> {
        Feature::ALL
            .into_iter()
            .map(|feature| match self.get(feature) {
                Availability::Available(found) => {
                    format!("feature {feature}: available ({found})")
                }
                Availability::Off { reason, enable } => format!(
                    "feature {feature}: off, no {}: {reason}; to turn it on: {enable}",
                    feature.uses()
                ),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_found() -> Probes {
        Probes {
            runtime: Ok(()),
            criu: Ok("criu 4.2.0 at /usr/local/sbin/criu".into()),
            network_tools: Ok("ip and nft on PATH".into()),
            interpreter: Ok("oka-interpreter at /x".into()),
            kernels: Ok("python3 kernel".into()),
        }
    }

    #[test]
    fn everything_found_is_everything_on() {
        let features = plan(&all_found());
        for f in Feature::ALL {
            assert!(features.is_available(f), "{f}");
            assert_eq!(features.require(f), Ok(()));
        }
        assert_eq!(
            features.summary()[0],
            "feature hibernate: available (criu 4.2.0 at /usr/local/sbin/criu)"
        );
    }

    #[test]
    fn missing_criu_turns_off_hibernation_only_and_says_how_to_get_it() {
        let probes = Probes { criu: Err("criu binary not found".into()), ..all_found() };
        let features = plan(&probes);
        assert!(!features.is_available(Feature::Hibernate));
        assert!(features.is_available(Feature::OutboundNetwork));
        assert!(features.is_available(Feature::CodeInterpreter));
        let error = features.require(Feature::Hibernate).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "hibernate (hibernating pauses, snapshots and forks) is off on this machine: \
                 criu binary not found; to turn it on: {ENABLE_CRIU}"
            )
        );
        assert!(error.to_string().contains("scripts/install-criu.sh"));
        assert!(error.to_string().contains("OKA_CRIU"));
        assert!(features.summary()[0].starts_with(
            "feature hibernate: off, no hibernating pauses, snapshots and forks: criu binary not found; to turn it on: run `sudo scripts/install-criu.sh`"
        ));
    }

    #[test]
    fn missing_network_tools_turn_off_outbound_networking() {
        let probes = Probes { network_tools: Err("nft not found on PATH".into()), ..all_found() };
        let error = plan(&probes).require(Feature::OutboundNetwork).unwrap_err();
        assert_eq!(error.reason, "nft not found on PATH");
        assert_eq!(error.enable, ENABLE_NETWORK_TOOLS);
    }

    #[test]
    fn the_interpreter_needs_its_server_first_then_a_kernel() {
        let no_server = Probes {
            interpreter: Err("oka-interpreter not found".into()),
            kernels: Err("no python3 kernelspec".into()),
            ..all_found()
        };
        assert_eq!(
            plan(&no_server).require(Feature::CodeInterpreter).unwrap_err().enable,
            ENABLE_INTERPRETER
        );
        let no_kernel = Probes { kernels: Err("no python3 kernelspec".into()), ..all_found() };
        let error = plan(&no_kernel).require(Feature::CodeInterpreter).unwrap_err();
        assert_eq!(error.reason, "no python3 kernelspec");
        assert_eq!(error.enable, ENABLE_KERNELS);
    }

    #[test]
    fn without_a_runtime_every_feature_is_off_for_that_reason() {
        let probes = Probes { runtime: Err("not running as root".into()), ..all_found() };
        let features = plan(&probes);
        for f in Feature::ALL {
            let error = features.require(f).unwrap_err();
            assert_eq!(error.reason, "sandboxes do not run here (not running as root)");
            assert_eq!(error.enable, ENABLE_RUNTIME);
        }
    }

    #[test]
    fn only_the_criu_operations_need_a_feature() {
        for op in [Operation::Hibernate, Operation::Restore, Operation::Snapshot, Operation::Clone]
        {
            assert_eq!(Feature::for_operation(op), Some(Feature::Hibernate), "{op}");
        }
        for op in [Operation::Pause, Operation::Resume, Operation::Stop, Operation::Ensure] {
            assert_eq!(Feature::for_operation(op), None, "{op}");
        }
        assert_eq!(Feature::for_operation(Operation::Egress), Some(Feature::OutboundNetwork));
    }

    #[test]
    fn a_feature_never_probed_is_off() {
        assert!(!Features::default().is_available(Feature::Hibernate));
        assert!(Features::all_available().is_available(Feature::Hibernate));
    }
}
