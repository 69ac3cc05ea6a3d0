//! Building a default template's root: a pure plan of steps from its definition, and a thin
//! executor that runs them.
//!
//! # Expected flow
//!
//! 1. Build the template it is copied from first, if any (the same rules).
//! 2. Take the lock `<dir>/.<name>-<hash12>.lock` (`flock`, waiting while another process
//!    builds it), then look again: a root finished meanwhile is used as it is.
//! 3. Remove a leftover `<name>-<hash12>.partial` (a build that failed or was killed), then run
//!    the steps into a fresh one: debootstrap (or a copy of the origin template's root), the
//!    packages with apt, the scripts, a clean-up (apt's caches and lists, the build's
//!    resolv.conf and `policy-rc.d`).
//! 4. Rename `<name>-<hash12>.partial` to `<name>-<hash12>`. A failure at any step removes the
//!    partial directory, so a root under its final name is always complete.
//!
//! Commands inside the new root run under chroot in a mount namespace of their own
//! (`unshare --mount`), with `/proc`, `/dev` and the host's resolv.conf present for the build
//! only: a killed build leaves no mount behind on the host.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::definition::{self, Definition, Origin, Script};

/// Why a template could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A file system call failed.
    #[error("{op} {}: {source}", .path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A command failed; `output` is the end of what it printed.
    #[error("{what} failed ({status}){}", if .output.is_empty() { String::new() } else { format!(":\n{}", .output) })]
    Command {
        /// The step.
        what: String,
        /// How it ended.
        status: String,
        /// Its last lines.
        output: String,
    },
    /// Something the build needs is not there.
    #[error("{0}")]
    Missing(String),
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BuildError {
    let path = path.to_owned();
    move |source| BuildError::Io { op, path, source }
}

/// One step of a build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `debootstrap --variant=minbase <suite>` into the partial directory.
    Debootstrap {
        /// The suite.
        suite: &'static str,
    },
    /// A copy of a built root (`cp -a`, reflinked where the file system can).
    Copy {
        /// The template copied.
        template: &'static str,
        /// Its root.
        from: PathBuf,
    },
    /// `apt-get update`, then `apt-get install --no-install-recommends` of the packages.
    Packages(Vec<&'static str>),
    /// A script of the definition.
    Script(Script),
    /// apt's caches and lists, the build's resolv.conf and `policy-rc.d` removed; a marker
    /// `/etc/oka-template` naming the template and its hash written.
    Finish,
}

impl Step {
    /// What the step does, for progress lines and status messages.
    pub fn describe(&self) -> String {
        match self {
            Step::Debootstrap { suite } => format!("debootstrap {suite}"),
            Step::Copy { template, .. } => format!("copying {template}"),
            Step::Packages(packages) => format!("installing {} packages", packages.len()),
            Step::Script(script) => format!("running {}", script.name),
            Step::Finish => "cleaning up".to_owned(),
        }
    }
}

/// The steps that build `definition`, whose origin template (if any) is built at `origin_root`.
pub fn plan(definition: &Definition, origin_root: Option<&Path>) -> Vec<Step> {
    let mut steps = Vec::new();
    match (definition.origin, origin_root) {
        (Origin::Debian { suite }, _) => steps.push(Step::Debootstrap { suite }),
        (Origin::Template(template), Some(from)) => {
            steps.push(Step::Copy { template, from: from.to_owned() });
        }
        (Origin::Template(template), None) => {
            // The caller builds the origin first; without it, debootstrap would silently give
            // another root, so the plan says what is missing instead.
            steps.push(Step::Copy { template, from: PathBuf::new() });
        }
    }
    if !definition.packages.is_empty() {
        steps.push(Step::Packages(definition.packages.to_vec()));
    }
    steps.extend(definition.scripts.iter().copied().map(Step::Script));
    steps.push(Step::Finish);
    steps
}

/// Where a build stands, told to the caller at each step and during long ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// The template being built.
    pub template: &'static str,
    /// The step, from 1.
    pub step: usize,
    /// How many steps.
    pub steps: usize,
    /// What it does now (`installing packages 120/310`).
    pub what: String,
}

/// A built root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    /// Its directory (`<dir>/<name>-<hash12>`).
    pub root: PathBuf,
    /// How long this call took to build it; zero when it was there already.
    pub took: Duration,
    /// Its size in bytes when built by this call.
    pub size: Option<u64>,
}

/// Where a template is built: `<dir>/<name>-<hash12>`.
pub fn root_of(dir: &Path, definition: &Definition) -> PathBuf {
    dir.join(definition::dir_name(definition))
}

/// The template's root when it is built and complete (a `.partial` is never one).
pub fn find_built(dir: &Path, definition: &Definition) -> Option<PathBuf> {
    let root = root_of(dir, definition);
    root.join("etc/oka-template").is_file().then_some(root)
}

/// Roots under `dir` of a default template's older definitions (`<name>-<hash12>` with another
/// hash than today's), which nothing new uses; sandboxes made before may still run on them.
pub fn stale_roots(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let current: Vec<String> = definition::ALL.iter().map(definition::dir_name).collect();
    let mut stale: Vec<PathBuf> = entries
        .flatten()
        .filter(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let ours = definition::ALL.iter().any(|d| {
                name.strip_prefix(d.name).and_then(|rest| rest.strip_prefix('-')).is_some_and(
                    |hash| hash.len() == 12 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
                )
            });
            ours && !current.contains(&name)
        })
        .map(|entry| entry.path())
        .collect();
    stale.sort();
    stale
}

fn partial_of(root: &Path) -> PathBuf {
    let mut name = root.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// Settings of a build.
#[derive(Debug, Clone, Default)]
pub struct BuildSettings {
    /// The Debian archive; `None`: the one this machine's apt sources use for the suite.
    pub mirror: Option<String>,
    /// Install debootstrap with apt-get when it is missing (`runtime.autoInstall`).
    pub install_debootstrap: bool,
}

/// Runs one step into a partial root.
pub trait StepRunner {
    /// Runs `step` on `partial`, telling progress within the step through `within`.
    fn run(
        &self,
        step: &Step,
        partial: &Path,
        definition: &Definition,
        within: &dyn Fn(String),
    ) -> Result<(), BuildError>;
}

/// Builds `definition` (and the template it is copied from) under `dir` unless built already;
/// see the module documentation.
pub fn ensure_built(
    dir: &Path,
    definition: &Definition,
    settings: &BuildSettings,
    progress: &dyn Fn(&Progress),
) -> Result<Built, BuildError> {
    let lineage = definition::lineage(definition).ok_or_else(|| {
        BuildError::Missing(format!("template {} names an undefined origin", definition.name))
    })?;
    let runner = SystemRunner { settings: settings.clone() };
    let mut origin_root = None;
    let mut last = None;
    for each in lineage {
        let built = ensure_built_with(dir, each, origin_root.as_deref(), &runner, progress)?;
        origin_root = Some(built.root.clone());
        last = Some(built);
    }
    last.ok_or_else(|| BuildError::Missing(format!("template {} has no lineage", definition.name)))
}

/// Builds `definition` alone, its origin being at `origin_root`, with `runner`.
pub fn ensure_built_with(
    dir: &Path,
    definition: &Definition,
    origin_root: Option<&Path>,
    runner: &dyn StepRunner,
    progress: &dyn Fn(&Progress),
) -> Result<Built, BuildError> {
    if let Some(root) = find_built(dir, definition) {
        return Ok(Built { root, took: Duration::ZERO, size: None });
    }
    std::fs::create_dir_all(dir).map_err(io_err("create directory", dir))?;
    let root = root_of(dir, definition);
    let lock_path = dir.join(format!(".{}.lock", definition::dir_name(definition)));
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(io_err("open", &lock_path))?;
    if lock.try_lock().is_err() {
        tracing::info!(template = definition.name, lock = %lock_path.display(), "another process is building this template; waiting for it");
        lock.lock().map_err(io_err("lock", &lock_path))?;
    }
    if let Some(root) = find_built(dir, definition) {
        return Ok(Built { root, took: Duration::ZERO, size: None });
    }
    let started = Instant::now();
    let partial = partial_of(&root);
    remove_if_there(&partial)?;
    // A root under the final name without its marker is not one of ours: keep it aside.
    remove_if_there(&root)?;
    let steps = plan(definition, origin_root);
    let outcome = run_steps(&steps, &partial, definition, runner, progress);
    if let Err(e) = outcome {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, &root).map_err(io_err("rename", &partial))?;
    let size = tree_size(&root);
    Ok(Built { root, took: started.elapsed(), size: Some(size) })
}

fn run_steps(
    steps: &[Step],
    partial: &Path,
    definition: &Definition,
    runner: &dyn StepRunner,
    progress: &dyn Fn(&Progress),
) -> Result<(), BuildError> {
    for (index, step) in steps.iter().enumerate() {
        let report = |what: String| {
            progress(&Progress {
                template: definition.name,
                step: index + 1,
                steps: steps.len(),
                what,
            });
        };
        report(step.describe());
        runner.run(step, partial, definition, &report)?;
    }
    Ok(())
}

fn remove_if_there(path: &Path) -> Result<(), BuildError> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => std::fs::remove_dir_all(path).map_err(io_err("remove", path)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("inspect", path)(e)),
    }
}

/// The bytes of the regular files under `dir` (symlinks not followed, hard links counted
/// once per name).
pub fn tree_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => tree_size(&entry.path()),
            Ok(kind) if kind.is_file() => entry.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// The real steps: debootstrap, cp, apt-get and bash under chroot.
struct SystemRunner {
    settings: BuildSettings,
}

/// The environment of every build command.
const BUILD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where a script and its files are written inside the root during its step.
const SCRIPT_DIR: &str = "tmp/oka-template-build";

impl StepRunner for SystemRunner {
    fn run(
        &self,
        step: &Step,
        partial: &Path,
        definition: &Definition,
        within: &dyn Fn(String),
    ) -> Result<(), BuildError> {
        match step {
            Step::Debootstrap { suite } => {
                ensure_debootstrap(self.settings.install_debootstrap)?;
                let mirror = match &self.settings.mirror {
                    Some(mirror) => mirror.clone(),
                    None => crate::rootfs::machine_mirror(suite).map_err(|e| {
                        BuildError::Missing(format!("{e:#} (or set templates.mirror)"))
                    })?,
                };
                let mut command = merged([
                    "setpriv".as_ref(),
                    "--pdeathsig".as_ref(),
                    "KILL".as_ref(),
                    "--".as_ref(),
                    "debootstrap".as_ref(),
                    "--variant=minbase".as_ref(),
                    suite.as_ref(),
                    partial.as_os_str(),
                    mirror.as_ref(),
                ]);
                run_logged(&mut command, &step.describe(), &|_| {})?;
                let excludes = partial.join("etc/dpkg/dpkg.cfg.d/oka-slim");
                std::fs::write(&excludes, DPKG_EXCLUDES).map_err(io_err("write", &excludes))?;
                prepare_chroot(partial)
            }
            Step::Copy { template, from } => {
                if from.as_os_str().is_empty() {
                    return Err(BuildError::Missing(format!("template {template} is not built")));
                }
                let mut command = merged([
                    "cp".as_ref(),
                    "-a".as_ref(),
                    "--reflink=auto".as_ref(),
                    from.as_os_str(),
                    partial.as_os_str(),
                ]);
                run_logged(&mut command, &step.describe(), &|_| {})?;
                prepare_chroot(partial)
            }
            Step::Packages(packages) => {
                run_logged(
                    &mut in_chroot(partial, &["apt-get", "update", "-q"]),
                    "apt-get update",
                    &|_| {},
                )?;
                let mut args = vec!["apt-get", "install", "-y", "-q", "--no-install-recommends"];
                args.extend(packages.iter().copied());
                let counter = PackageCounter::default();
                run_logged(&mut in_chroot(partial, &args), &step.describe(), &|line| {
                    if let Some(what) = counter.see(line) {
                        within(what);
                    }
                })
            }
            Step::Script(script) => {
                let dir = partial.join(SCRIPT_DIR);
                std::fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;
                let file = dir.join(format!("{}.sh", script.name));
                std::fs::write(&file, script.text).map_err(io_err("write", &file))?;
                let inside = format!("/{SCRIPT_DIR}/{}.sh", script.name);
                // apt-get install in a script needs the lists, which a copied root lacks.
                if !has_apt_lists(partial) {
                    run_logged(
                        &mut in_chroot(partial, &["apt-get", "update", "-q"]),
                        "apt-get update",
                        &|_| {},
                    )?;
                }
                let result = run_logged(
                    &mut in_chroot(partial, &["bash", &inside]),
                    &step.describe(),
                    &|line| {
                        tracing::info!(target: "oka::templates", template = definition.name, "{line}");
                    },
                );
                let _ = std::fs::remove_dir_all(&dir);
                result
            }
            Step::Finish => finish(partial, definition),
        }
    }
}

/// Installs debootstrap with apt-get when it is missing and `install` allows it (a Debian-like
/// host); otherwise a missing one is an error naming the command that installs it.
fn ensure_debootstrap(install: bool) -> Result<(), BuildError> {
    let present = || Command::new("debootstrap").arg("--version").output().is_ok();
    if present() {
        return Ok(());
    }
    let missing = || {
        BuildError::Missing(
            "debootstrap is not installed (apt-get install debootstrap, or your distribution's \
             package)"
                .to_owned(),
        )
    };
    if !install || !Path::new("/usr/bin/apt-get").exists() {
        return Err(missing());
    }
    tracing::info!("installing debootstrap with apt-get (runtime.autoInstall)");
    let install = |update: bool| {
        let script = if update {
            "apt-get update -q && apt-get install -y -q debootstrap"
        } else {
            "apt-get install -y -q debootstrap"
        };
        let mut command = merged(["sh", "-c", script]);
        command.env("DEBIAN_FRONTEND", "noninteractive");
        run_logged(&mut command, "apt-get install debootstrap", &|_| {})
    };
    install(false).or_else(|_| install(true))?;
    if present() { Ok(()) } else { Err(missing()) }
}

/// What every chroot step needs: no service started by a package's scripts, and the host's
/// resolver (for apt, pip and npm).
fn prepare_chroot(partial: &Path) -> Result<(), BuildError> {
    use std::os::unix::fs::PermissionsExt as _;
    let policy = partial.join("usr/sbin/policy-rc.d");
    std::fs::write(&policy, "#!/bin/sh\nexit 101\n").map_err(io_err("write", &policy))?;
    std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o755))
        .map_err(io_err("chmod", &policy))?;
    let resolv = partial.join("etc/resolv.conf");
    let _ = std::fs::remove_file(&resolv);
    let host = std::fs::read("/etc/resolv.conf").unwrap_or_default();
    std::fs::write(&resolv, host).map_err(io_err("write", &resolv))?;
    // The host's trusted CAs (which may include a proxy's), for pip and npm over HTTPS.
    if let Ok(bundle) = std::fs::read(HOST_CA_BUNDLE) {
        let copy = partial.join(BUILD_CA_BUNDLE);
        std::fs::create_dir_all(partial.join("etc/ssl"))
            .map_err(io_err("create directory", &copy))?;
        std::fs::write(&copy, bundle).map_err(io_err("write", &copy))?;
    }
    Ok(())
}

/// What dpkg leaves out of a template's root: documentation, manual pages and translations
/// (about 130 MB of `base`), as Debian's own container images do; copyright files stay.
const DPKG_EXCLUDES: &str = "path-exclude=/usr/share/doc/*\n\
path-include=/usr/share/doc/*/copyright\n\
path-exclude=/usr/share/man/*\n\
path-exclude=/usr/share/info/*\n\
path-exclude=/usr/share/locale/*\n\
path-include=/usr/share/locale/locale.alias\n";

/// The host's CA bundle (Debian's path).
const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Where the build's copy of [`HOST_CA_BUNDLE`] is inside the root, until the clean-up.
const BUILD_CA_BUNDLE: &str = "etc/ssl/oka-build-ca.crt";

/// The host's proxy settings, passed to the build's commands.
const PROXY_VARIABLES: &[&str] =
    &["http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"];

fn has_apt_lists(partial: &Path) -> bool {
    std::fs::read_dir(partial.join("var/lib/apt/lists")).is_ok_and(|entries| {
        entries.flatten().any(|e| e.file_name().to_string_lossy().ends_with("_Packages"))
    })
}

/// The clean-up step: nothing of the build stays in the root.
fn finish(partial: &Path, definition: &Definition) -> Result<(), BuildError> {
    run_logged(&mut in_chroot(partial, &["apt-get", "clean"]), "apt-get clean", &|_| {})?;
    for dir in ["var/lib/apt/lists", "tmp", "var/tmp", "root/.cache", "root/.npm"] {
        let path = partial.join(dir);
        let Ok(entries) = std::fs::read_dir(&path) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let removed = match entry.file_type() {
                Ok(kind) if kind.is_dir() => std::fs::remove_dir_all(&path),
                _ => std::fs::remove_file(&path),
            };
            removed.map_err(io_err("remove", &path))?;
        }
    }
    for path in ["usr/sbin/policy-rc.d", BUILD_CA_BUNDLE] {
        let _ = std::fs::remove_file(partial.join(path));
    }
    // The runtime writes each sandbox's own resolv.conf; the template keeps an empty one.
    let resolv = partial.join("etc/resolv.conf");
    std::fs::write(&resolv, "").map_err(io_err("write", &resolv))?;
    let marker = partial.join("etc/oka-template");
    let text = format!("name={}\nhash={}\n", definition.name, definition::hash(definition));
    std::fs::write(&marker, text).map_err(io_err("write", &marker))
}

/// `argv` run under chroot in `partial`, in a mount namespace of its own with `/proc` and
/// `/dev` mounted; it dies with the build (its parent death signal).
fn in_chroot(partial: &Path, argv: &[&str]) -> Command {
    const SETUP: &str = "set -e; root=$1; shift; \
        mount -t proc proc \"$root/proc\"; \
        mount --rbind /dev \"$root/dev\"; \
        exec chroot \"$root\" \"$@\"";
    let mut full: Vec<std::ffi::OsString> = [
        "setpriv",
        "--pdeathsig",
        "KILL",
        "--",
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        SETUP,
        "sh",
    ]
    .iter()
    .map(Into::into)
    .collect();
    full.push(partial.into());
    full.extend(argv.iter().map(Into::into));
    let mut command = merged(full);
    command
        .env_clear()
        .env("PATH", BUILD_PATH)
        .env("HOME", "/root")
        .env("LC_ALL", "C.UTF-8")
        .env("DEBIAN_FRONTEND", "noninteractive");
    if partial.join(BUILD_CA_BUNDLE).is_file() {
        let bundle = format!("/{BUILD_CA_BUNDLE}");
        for name in [
            "PIP_CERT",
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "NODE_EXTRA_CA_CERTS",
            "npm_config_cafile",
        ] {
            command.env(name, &bundle);
        }
    }
    for name in PROXY_VARIABLES {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command
}

/// `argv` with its stderr joined to its stdout: one pipe, so lines stay in order and neither
/// stream can fill up.
fn merged<S: AsRef<std::ffi::OsStr>>(argv: impl IntoIterator<Item = S>) -> Command {
    let mut command = Command::new("sh");
    command.args(["-c", "exec \"$@\" 2>&1", "sh"]).args(argv);
    command
}

/// Runs `command` (made by [`merged`]), handing each line of its output to `line`, and fails
/// with its last lines when it fails.
fn run_logged(command: &mut Command, what: &str, line: &dyn Fn(&str)) -> Result<(), BuildError> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| BuildError::Missing(format!("cannot run {what}: {e}")))?;
    let mut tail = std::collections::VecDeque::new();
    if let Some(output) = child.stdout.take() {
        for text in BufReader::new(output).lines().map_while(Result::ok) {
            tracing::debug!(target: "oka::templates", "{text}");
            line(&text);
            if tail.len() == 20 {
                tail.pop_front();
            }
            tail.push_back(text);
        }
    }
    let status =
        child.wait().map_err(|e| BuildError::Missing(format!("cannot wait for {what}: {e}")))?;
    if status.success() {
        return Ok(());
    }
    Err(BuildError::Command {
        what: what.to_owned(),
        status: status.to_string(),
        output: tail.into_iter().collect::<Vec<_>>().join("\n"),
    })
}

/// Counts apt's `Unpacking` and `Setting up` lines against the number of new packages it
/// announced.
#[derive(Debug, Default)]
struct PackageCounter {
    /// (unpacked, set up, total)
    state: std::sync::Mutex<(usize, usize, usize)>,
}

impl PackageCounter {
    /// The progress to tell after `line`, when it changes enough to be worth a line (every
    /// tenth of the packages unpacked, then set up).
    fn see(&self, line: &str) -> Option<String> {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (unpacked, set_up, total) = &mut *state;
        if let Some(count) = newly_installed(line) {
            *total = count;
            return Some(format!("installing packages: {count} to install"));
        }
        let (count, verb) = if line.starts_with("Unpacking ") {
            (unpacked, "unpacked")
        } else if line.starts_with("Setting up ") {
            (set_up, "set up")
        } else {
            return None;
        };
        *count += 1;
        let every = (*total / 10).max(1);
        (*count % every == 0 || *count == *total)
            .then(|| format!("installing packages: {verb} {count}/{total}"))
    }
}

/// `N` of apt's `U upgraded, N newly installed, ...` line.
fn newly_installed(line: &str) -> Option<usize> {
    let (_, rest) = line.split_once(" upgraded, ")?;
    let (count, _) = rest.split_once(" newly installed")?;
    count.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::templates::definition::{BASE, CODE_INTERPRETER};

    #[test]
    fn the_plan_starts_from_debian_or_the_origin_and_ends_clean() {
        let base = plan(&BASE, None);
        assert_eq!(base[0], Step::Debootstrap { suite: "bookworm" });
        assert!(matches!(&base[1], Step::Packages(p) if p.contains(&"sudo")));
        assert_eq!(base.last(), Some(&Step::Finish));
        let code = plan(&CODE_INTERPRETER, Some(Path::new("/t/base-1")));
        assert_eq!(code[0], Step::Copy { template: "base", from: "/t/base-1".into() });
        assert!(matches!(&code[1], Step::Script(s) if s.name == "kernels"));
    }

    #[test]
    fn roots_of_older_definitions_are_stale_and_today_s_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let today = root_of(dir.path(), &BASE);
        for name in ["base-0123456789ab", "base-0123456789ab.partial", "mine", "base-x"] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        std::fs::create_dir(&today).unwrap();
        assert_eq!(stale_roots(dir.path()), [dir.path().join("base-0123456789ab")]);
    }

    #[test]
    fn apt_progress_is_counted_against_the_announced_total() {
        assert_eq!(
            newly_installed("0 upgraded, 312 newly installed, 0 to remove and 0 not upgraded."),
            Some(312)
        );
        let counter = PackageCounter::default();
        assert_eq!(counter.see("Reading package lists..."), None);
        assert_eq!(
            counter.see("0 upgraded, 20 newly installed, 0 to remove").as_deref(),
            Some("installing packages: 20 to install")
        );
        assert_eq!(counter.see("Unpacking a (1) ..."), None);
        assert_eq!(
            counter.see("Unpacking b (1) ...").as_deref(),
            Some("installing packages: unpacked 2/20")
        );
        assert_eq!(counter.see("Setting up a (1) ..."), None);
        assert_eq!(
            counter.see("Setting up b (1) ...").as_deref(),
            Some("installing packages: set up 2/20")
        );
    }

    /// Writes a file per step, and fails at step `fail_at` when given.
    struct FakeRunner {
        fail_at: Option<usize>,
        ran: std::sync::Mutex<usize>,
    }

    impl StepRunner for FakeRunner {
        fn run(
            &self,
            step: &Step,
            partial: &Path,
            definition: &Definition,
            _: &dyn Fn(String),
        ) -> Result<(), BuildError> {
            let mut ran = self.ran.lock().unwrap();
            *ran += 1;
            std::fs::create_dir_all(partial.join("etc")).unwrap();
            std::fs::write(partial.join(format!("step-{ran}")), step.describe()).unwrap();
            if self.fail_at == Some(*ran) {
                return Err(BuildError::Missing("the step failed".into()));
            }
            if *step == Step::Finish {
                std::fs::write(partial.join("etc/oka-template"), definition.name).unwrap();
            }
            Ok(())
        }
    }

    #[test]
    fn a_failed_build_leaves_nothing_and_a_partial_one_is_never_used() {
        let dir = tempfile::tempdir().unwrap();
        let root = root_of(dir.path(), &BASE);
        // A killed build's leftover, even a complete-looking one, is not a root.
        let partial = partial_of(&root);
        std::fs::create_dir_all(partial.join("etc")).unwrap();
        std::fs::write(partial.join("etc/oka-template"), "base").unwrap();
        assert_eq!(find_built(dir.path(), &BASE), None);
        // A failing build removes it and leaves neither name.
        let failing = FakeRunner { fail_at: Some(2), ran: Default::default() };
        let err = ensure_built_with(dir.path(), &BASE, None, &failing, &|_| {}).unwrap_err();
        assert!(err.to_string().contains("the step failed"), "{err}");
        assert!(!partial.exists() && !root.exists());
        assert_eq!(find_built(dir.path(), &BASE), None);
        // A good build renames the partial into place; a second call builds nothing.
        let good = FakeRunner { fail_at: None, ran: Default::default() };
        let seen = std::sync::Mutex::new(Vec::new());
        let built = ensure_built_with(dir.path(), &BASE, None, &good, &|p| {
            seen.lock().unwrap().push((p.step, p.steps));
        })
        .unwrap();
        assert_eq!(built.root, root);
        assert!(!partial.exists());
        assert_eq!(find_built(dir.path(), &BASE), Some(root.clone()));
        let steps = plan(&BASE, None).len();
        assert_eq!(seen.lock().unwrap().first(), Some(&(1, steps)));
        assert_eq!(*good.ran.lock().unwrap(), steps);
        let again = ensure_built_with(dir.path(), &BASE, None, &good, &|_| {}).unwrap();
        assert_eq!(again.took, Duration::ZERO);
        assert_eq!(*good.ran.lock().unwrap(), steps, "an unchanged definition is never rebuilt");
    }
}
