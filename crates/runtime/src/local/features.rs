//! The prober of the machine's optional features: looks once for what each needs (CRIU, `ip`
//! and `nft`, `oka-interpreter` and a Jupyter kernel) and fills in the pure model's
//! [`Probes`]; [`oka_runtime_api::features::plan`] decides what is on.
//!
//! Blocking: runs `criu --version` and `criu check` (about a second); call it on the blocking
//! pool.

use std::path::{Path, PathBuf};

use oka_runtime_api::features::{Feature, FeatureOff, Probes};

use super::criu::{self, Criu, CriuError};

/// Where the code interpreter's kernels are looked for: the places sandboxes see the host's
/// kernelspecs (`scripts/install-kernels.sh` installs into the first).
const KERNELSPEC_DIRS: &[&str] =
    &["/usr/local/share/jupyter/kernels", "/usr/share/jupyter/kernels"];

/// The tools outbound networking runs.
const NETWORK_TOOLS: &[&str] = &["ip", "nft"];

/// Probes everything; `criu_binary` as [`super::LocalConfig::criu_binary`] (`None`: located as
/// the runtime locates it), `interpreter` the `oka-interpreter` found, if any. `runtime` says
/// whether sandboxes run here at all.
pub fn probe(
    runtime: Result<(), String>,
    criu_binary: Option<&Path>,
    interpreter: Option<&Path>,
) -> Probes {
    Probes {
        runtime,
        criu: probe_criu(criu_binary),
        network_tools: probe_network_tools(),
        interpreter: interpreter.map(|p| format!("oka-interpreter at {}", p.display())).ok_or_else(
            || "oka-interpreter not found beside oka nor in $OKA_INTERPRETER".to_owned(),
        ),
        kernels: probe_kernels(),
    }
}

/// `criu` found, at least [`criu::MIN_VERSION`], and `criu check` passes.
fn probe_criu(binary: Option<&Path>) -> Result<String, String> {
    let criu = match binary {
        Some(binary) => Criu::new(binary),
        None => Criu::locate().map_err(|e| criu_reason(&e, None))?,
    };
    let version = criu.check().map_err(|e| criu_reason(&e, Some(criu.binary())))?;
    Ok(format!("criu {version} at {}", criu.binary().display()))
}

/// Why CRIU cannot be used, as the feature's reason (the way to install it is said apart);
/// `tried` is the binary that failed, `None` when none was found to try.
pub fn criu_reason(error: &CriuError, tried: Option<&Path>) -> String {
    match (error, tried) {
        (CriuError::NotFound, Some(binary)) => {
            format!("criu not found: {} is not an executable file", binary.display())
        }
        (CriuError::NotFound, None) => format!(
            "criu not found (looked at ${}, PATH, /usr/local/sbin, /usr/local/bin, /usr/sbin)",
            criu::CRIU_ENV
        ),
        (CriuError::TooOld { binary, found }, _) => {
            format!("{} is criu {found}, older than {}", binary.display(), criu::MIN_VERSION)
        }
        (other, _) => other.to_string(),
    }
}

/// The error a CRIU operation answers when CRIU cannot be used (`tried`: as for
/// [`criu_reason`]): names the feature and how to turn it on.
pub fn criu_off(error: &CriuError, tried: Option<&Path>) -> FeatureOff {
    FeatureOff {
        feature: Feature::Hibernate,
        reason: criu_reason(error, tried),
        enable: oka_runtime_api::features::ENABLE_CRIU.to_owned(),
    }
}

/// The error an outbound sandbox answers when `tool` is missing.
pub fn network_tool_off(tool: &str) -> FeatureOff {
    FeatureOff {
        feature: Feature::OutboundNetwork,
        reason: format!("`{tool}` not found on PATH"),
        enable: oka_runtime_api::features::ENABLE_NETWORK_TOOLS.to_owned(),
    }
}

fn probe_network_tools() -> Result<String, String> {
    let missing: Vec<&str> =
        NETWORK_TOOLS.iter().copied().filter(|tool| find_on_path(tool).is_none()).collect();
    match missing.as_slice() {
        [] => Ok(format!("{} on PATH", NETWORK_TOOLS.join(" and "))),
        tools => Err(format!("{} not found on PATH", tools.join(" and "))),
    }
}

fn probe_kernels() -> Result<String, String> {
    KERNELSPEC_DIRS
        .iter()
        .map(|dir| Path::new(dir).join("python3/kernel.json"))
        .find(|spec| spec.is_file())
        .map(|spec| format!("python3 kernel at {}", spec.display()))
        .ok_or_else(|| {
            format!(
                "no python3 Jupyter kernel in {} (run_code has no kernel)",
                KERNELSPEC_DIRS.join(" or ")
            )
        })
}

/// `tool` on `PATH`, where the runtime runs it from.
fn find_on_path(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|dir| dir.join(tool)).find(|p| p.is_file())
}
