//! `oka reset`: stop every sandbox of a state directory and remove its state, while `oka serve`
//! is down.
//!
//! Sandboxes outlive `oka serve` by design (a restart re-adopts them), so stopping `oka serve`
//! leaves them running. This is the way to end them all and start afresh.
//!
//! # Expected flow
//!
//! 1. Take the state directory's instance lock: while an `oka serve` runs on it, refuse and name
//!    its pid.
//! 2. Open the local runtime on the directory's `runtime/` (as `oka serve` does: the same
//!    cgroup name), which re-adopts the live sandboxes and cleans up after dead ones, and list
//!    them on stdout.
//! 3. Unless `--yes`, ask on the terminal (refuse when stdin is not one); `--dry-run` stops
//!    after the list.
//! 4. Delete every sandbox (processes, mounts, cgroups, network), then the runtime's own
//!    cgroups, then everything in the state directory: the store (objects, API keys), the
//!    templates, the snapshots. A sandbox that cannot be deleted stops the reset before any
//!    state is removed, so it can be run again.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use oka_runtime::local::{LocalConfig, LocalRuntime};
use oka_runtime_api::Runtime as _;

use crate::config::Config;
use crate::lock::InstanceLock;

/// Flags of `oka reset`.
#[derive(Debug, clap::Args)]
pub struct ResetArgs {
    /// The YAML config file `oka serve` runs with (for its `stateDir`).
    #[arg(long, short = 'c', env = "OKA_CONFIG")]
    config: Option<PathBuf>,
    /// The state directory to reset [default: the config's, else /var/lib/oka as root].
    #[arg(long, env = "OKA_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Do not ask before removing.
    #[arg(long, short = 'y')]
    yes: bool,
    /// List the sandboxes and the state that would be removed, and remove nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Runs `oka reset`; see the [module documentation](self).
pub fn reset(args: &ResetArgs) -> anyhow::Result<()> {
    let mut config = Config::load(args.config.as_deref())?;
    if let Some(dir) = &args.state_dir {
        config.state_dir.clone_from(dir);
    }
    let dir = config.state_dir;
    if !dir.exists() {
        eprintln!("nothing to reset: {} does not exist", dir.display());
        return Ok(());
    }
    let lock = InstanceLock::acquire(&dir)?;
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let runtime = tokio.block_on(open_runtime(&dir))?;
    let sandboxes = match &runtime {
        Some(runtime) => tokio.block_on(runtime.list()).context("cannot list the sandboxes")?,
        None => Vec::new(),
    };
    let mut out = std::io::stdout().lock();
    for sandbox in &sandboxes {
        writeln!(out, "{}\t{}", sandbox.id, sandbox.state)?;
    }
    drop(out);
    eprintln!(
        "{} sandbox{} and the state in {} (store, API keys, templates, snapshots) {}",
        sandboxes.len(),
        if sandboxes.len() == 1 { "" } else { "es" },
        dir.display(),
        if args.dry_run { "would be removed" } else { "will be removed" }
    );
    if args.dry_run {
        return Ok(());
    }
    if !args.yes && !confirmed()? {
        bail!("nothing removed");
    }
    if let Some(runtime) = &runtime {
        for sandbox in &sandboxes {
            tokio.block_on(runtime.delete(&sandbox.id)).with_context(|| {
                format!("cannot delete sandbox {}; nothing else removed", sandbox.id)
            })?;
        }
        runtime.remove_cgroups();
    }
    drop(runtime);
    remove_state(&dir)?;
    drop(lock);
    let _ = std::fs::remove_file(dir.join("oka.lock"));
    eprintln!("removed {} sandboxes and the state in {}", sandboxes.len(), dir.display());
    Ok(())
}

/// The local runtime of state directory `dir`, when it has one; it needs root.
async fn open_runtime(dir: &Path) -> anyhow::Result<Option<LocalRuntime>> {
    let state = dir.join("runtime");
    if !state.exists() {
        return Ok(None);
    }
    if !rustix::process::geteuid().is_root() {
        bail!(
            "{} holds sandboxes, and only root can stop them: run `sudo oka reset`",
            dir.display()
        );
    }
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let init = LocalConfig::find_init_binary().unwrap_or(exe);
    let mut config = LocalConfig::new(state, init);
    config.cgroup_name = crate::serve::cgroup_name(dir);
    let runtime = LocalRuntime::open(config).await.context("cannot open the local runtime")?;
    Ok(Some(runtime))
}

/// Asks on the terminal; `false` unless the answer is yes.
fn confirmed() -> anyhow::Result<bool> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        bail!("refusing to remove without a terminal to ask on: add --yes");
    }
    eprint!("remove them? [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// Removes everything in `dir` but the instance lock (held until the end).
fn remove_state(dir: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry?;
        if entry.file_name() == "oka.lock" {
            continue;
        }
        let path = entry.path();
        let removed = if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.with_context(|| format!("cannot remove {}", path.display()))?;
    }
    Ok(())
}
