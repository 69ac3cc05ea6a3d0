//! The optional features at `oka serve`'s start: probed once (the runtime's prober), told in
//! one log line each, exported as `oka_feature_available{feature}`, and enforced on the E2B
//! API, so a request that needs a feature that is off is answered at once with an error naming
//! it and how to turn it on. What a feature lacks is installed in the background where it can
//! be (`runtime.autoInstall` on Debian: CRIU built from Debian's source package, Debian's
//! `nftables`), and the feature turns on when it is there.
//!
//! The rule of which operation needs which feature lives in the pure model
//! ([`oka_runtime_api::features`]). The manager asks the board before each snapshot and fork
//! (its `SnapshotGate`, after the API key is checked) and answers 501 with the
//! [`FeatureOff`](oka_runtime_api::features::FeatureOff) message; a hibernating pause is refused by the runtime with the same
//! message, which the Sandbox's `SandboxPaused` condition carries and the pause answers at
//! once.

use std::sync::{Arc, RwLock};

use oka_runtime_api::features::{Availability, Feature, Features, Probes};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tracing::{info, warn};

/// `feature`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FeatureLabels {
    feature: &'static str,
}

/// The features as they are now: decided at start, changed when an install turns one on;
/// read by the manager before snapshots and forks, and exported as `oka_feature_available{feature}`.
pub struct FeatureBoard {
    features: RwLock<Arc<Features>>,
    gauge: Family<FeatureLabels, Gauge>,
}

impl FeatureBoard {
    /// Decides the features from `probes`, logs one line per feature and registers
    /// `oka_feature_available{feature}` (1 on, 0 off).
    pub fn announce(probes: &Probes, registry: &mut oka_metrics::Registry) -> Arc<Self> {
        let board = Arc::new(Self {
            features: RwLock::new(Arc::new(Features::default())),
            gauge: Family::default(),
        });
        registry.register(
            "oka_feature_available",
            "1 when an optional feature of this machine is on (hibernate: CRIU; outbound-network: ip and nft; code-interpreter: oka-interpreter and a Jupyter kernel), 0 when off (the start-up log says why and how to turn it on)",
            board.gauge.clone(),
        );
        board.set(oka_runtime_api::features::plan(probes));
        board
    }

    /// The features now.
    pub fn current(&self) -> Arc<Features> {
        let features = self.features.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(&features)
    }

    /// Replaces the features, logging the line of each that changed (every one the first time).
    fn set(&self, features: Features) {
        let before = self.current();
        let first = *before == Features::default();
        let lines = features.summary();
        for (feature, line) in Feature::ALL.into_iter().zip(lines) {
            if !first && before.get(feature) == features.get(feature) {
                continue;
            }
            match features.get(feature) {
                Availability::Available(_) => info!(feature = feature.name(), "{line}"),
                Availability::Off { .. } => warn!(feature = feature.name(), "{line}"),
            }
            let on = i64::from(features.is_available(feature));
            self.gauge.get_or_create(&FeatureLabels { feature: feature.name() }).set(on);
        }
        *self.features.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Arc::new(features);
    }
}

/// `scripts/install-criu.sh` and the library it sources, carried in the binary so that
/// `oka serve` can run them wherever the binary is (written to a temporary directory in the
/// same layout).
const INSTALL_CRIU: &str = include_str!("../../../scripts/install-criu.sh");
const DEBIAN_ARCHIVE_LIB: &str = include_str!("../../../scripts/lib/debian-archive.sh");

/// Whether `oka serve` should install CRIU itself: sandboxes run here (`runtime_runs`: root,
/// the runtime open), hibernation is off, `$OKA_CRIU` names no binary of the user's own (one
/// they chose is never replaced), and this is a Debian-like machine (the script knows only
/// `apt-get`).
pub fn should_install_criu(
    features: &Features,
    runtime_runs: bool,
    criu_env_set: bool,
    apt_get: bool,
) -> bool {
    runtime_runs && !features.is_available(Feature::Hibernate) && !criu_env_set && apt_get
}

/// Installs CRIU in the background with the embedded `scripts/install-criu.sh` (its progress
/// goes to the log line by line), then probes again with `probe` and publishes what it finds:
/// hibernation turns on without a restart. A failure says so and how to do it by hand.
pub fn install_criu_in_background(
    board: Arc<FeatureBoard>,
    probe: impl FnOnce() -> Probes + Send + 'static,
) {
    info!(
        "installing CRIU >= 4.2 for hibernation, snapshots and forks (runtime.autoInstall; \
         a few minutes the first time: Debian packages, then a build); oka serve is usable meanwhile"
    );
    // A thread of its own, not the blocking pool: a shutdown never waits for an install (the
    // script goes on by itself, and the next start finds its result or runs it again).
    let spawned = std::thread::Builder::new().name("install-criu".into()).spawn(move || {
        match run_install_criu() {
            Ok(()) => info!("CRIU installed"),
            Err(why) => warn!(
                "CRIU could not be installed ({why}); hibernation stays off: {}",
                oka_runtime_api::features::ENABLE_CRIU
            ),
        }
        board.set(oka_runtime_api::features::plan(&probe()));
    });
    if let Err(error) = spawned {
        warn!(%error, "cannot start the CRIU install; hibernation stays off");
    }
}

/// Whether `oka serve` should install nftables (and iproute2) itself: sandboxes run here,
/// outbound networking is off, and `apt-get` exists. Debian's `nftables` package is all it
/// takes, so unlike CRIU there is no build.
pub fn should_install_network_tools(
    features: &Features,
    runtime_runs: bool,
    apt_get: bool,
) -> bool {
    runtime_runs && !features.is_available(Feature::OutboundNetwork) && apt_get
}

/// Installs Debian's `nftables` and `iproute2` in the background with `apt-get` (after an
/// `apt-get update` if the package lists do not know them), its output in the log line by
/// line, then probes again with `probe` and publishes what it finds: outbound networking and
/// egress policies turn on without a restart.
pub fn install_network_tools_in_background(
    board: Arc<FeatureBoard>,
    probe: impl FnOnce() -> Probes + Send + 'static,
) {
    info!(
        "installing nftables and iproute2 for outbound sandboxes and egress policies \
         (runtime.autoInstall; Debian packages); oka serve is usable meanwhile"
    );
    let spawned = std::thread::Builder::new().name("install-nftables".into()).spawn(move || {
        let install = || {
            run_logged(
                std::process::Command::new("apt-get")
                    // A CRIU install may hold dpkg's lock: wait for it.
                    .args(["-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q"])
                    .args(["--no-install-recommends", "nftables", "iproute2"])
                    .env("DEBIAN_FRONTEND", "noninteractive"),
                "apt-get install nftables iproute2",
            )
        };
        let outcome = install().or_else(|_| {
            let mut update = std::process::Command::new("apt-get");
            update.args(["-o", "DPkg::Lock::Timeout=600", "update", "-q"]);
            run_logged(&mut update, "apt-get update").and_then(|()| install())
        });
        match outcome {
            Ok(()) => info!("nftables installed"),
            Err(why) => warn!(
                "nftables could not be installed ({why}); outbound networking stays off: {}",
                oka_runtime_api::features::ENABLE_NETWORK_TOOLS
            ),
        }
        board.set(oka_runtime_api::features::plan(&probe()));
    });
    if let Err(error) = spawned {
        warn!(%error, "cannot start the nftables install; outbound networking stays off");
    }
}

/// Runs `command` with stdout and stderr on one pipe, each line logged as it comes.
fn run_logged(command: &mut std::process::Command, what: &str) -> Result<(), String> {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let (reader, writer) = std::io::pipe().map_err(|e| format!("cannot make a pipe: {e}"))?;
    let writer2 = writer.try_clone().map_err(|e| format!("cannot make a pipe: {e}"))?;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(writer2)
        .spawn()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    // The command's ends must go, or the reader never sees the end of the output.
    command.stdout(Stdio::null()).stderr(Stdio::null());
    for line in BufReader::new(reader).lines().map_while(Result::ok) {
        info!(target: "oka::install", "{line}");
    }
    let status = child.wait().map_err(|e| format!("cannot wait for {what}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{what}: {status}")) }
}

/// Runs the script with `bash`, each line of its output (its own progress, apt's, the
/// build's) logged as it comes.
fn run_install_criu() -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("oka-install-criu-{}", std::process::id()));
    let outcome = run_install_criu_in(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

fn run_install_criu_in(dir: &std::path::Path) -> Result<(), String> {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).map_err(|e| format!("cannot make {}: {e}", lib.display()))?;
    let write = |path: std::path::PathBuf, text: &str| {
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    write(lib.join("debian-archive.sh"), DEBIAN_ARCHIVE_LIB)?;
    let script = dir.join("install-criu.sh");
    write(script.clone(), INSTALL_CRIU)?;
    // One pipe for both streams, so the lines stay in order and neither pipe can fill up.
    let mut child = Command::new("bash")
        .args(["-c", "exec bash \"$0\" 2>&1"])
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run bash: {e}"))?;
    if let Some(output) = child.stdout.take() {
        for line in BufReader::new(output).lines().map_while(Result::ok) {
            info!(target: "oka::install_criu", "{line}");
        }
    }
    let status = child.wait().map_err(|e| format!("cannot wait for the install: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("the install script {status}")) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oka_runtime_api::features::{Probes, plan};

    fn probes(criu: Result<String, String>) -> Probes {
        Probes {
            runtime: Ok(()),
            criu,
            network_tools: Ok("ip and nft".into()),
            interpreter: Ok("oka-interpreter".into()),
            kernels: Ok("python3".into()),
        }
    }

    #[test]
    fn the_embedded_install_script_runs_and_leaves_an_installed_criu_alone() {
        // Only where CRIU is already there: elsewhere the script would install it (minutes).
        if oka_runtime::local::criu::check().is_err() {
            eprintln!("skipped: no CRIU >= 4.2 here, the script would build one");
            return;
        }
        assert_eq!(run_install_criu(), Ok(()));
    }

    #[test]
    fn nftables_is_installed_only_when_outbound_networking_is_off_and_apt_get_exists() {
        let mut missing = probes(Ok("criu 4.2".into()));
        missing.network_tools = Err("nft not found on PATH".into());
        let missing = plan(&missing);
        assert!(should_install_network_tools(&missing, true, true));
        assert!(!should_install_network_tools(&missing, true, false), "no apt-get: only say how");
        assert!(!should_install_network_tools(&missing, false, true), "no sandboxes here");
        let present = plan(&probes(Ok("criu 4.2".into())));
        assert!(!should_install_network_tools(&present, true, true));
    }

    #[test]
    fn a_logged_command_reports_its_exit() {
        assert_eq!(run_logged(std::process::Command::new("true").arg("x"), "true"), Ok(()));
        let failed = run_logged(&mut std::process::Command::new("false"), "false").unwrap_err();
        assert!(failed.starts_with("false: exit status: 1"), "{failed}");
    }

    #[test]
    fn criu_is_installed_only_when_missing_not_chosen_by_the_user_and_installable() {
        let missing = plan(&probes(Err("criu not found".into())));
        assert!(should_install_criu(&missing, true, false, true));
        assert!(!should_install_criu(&missing, true, true, true), "the user's OKA_CRIU is kept");
        assert!(!should_install_criu(&missing, true, false, false), "no apt-get: only say how");
        assert!(!should_install_criu(&missing, false, false, true), "nothing to hibernate here");
        let present = plan(&probes(Ok("criu 4.2".into())));
        assert!(!should_install_criu(&present, true, false, true));
    }
}
