//! Root file systems: the default template root and the mount plan of a sandbox.
//!
//! The default template root is built once under `<state>/templates/default-v1` from the host's
//! system directories only: on a merged-`/usr` system it holds the same top-level symlinks as the
//! host (`bin -> usr/bin`, `lib -> usr/lib`, ...), an empty `usr` on which every sandbox
//! bind-mounts the host's `/usr` read-only, and a generated `/etc`. It never contains the host's
//! `/home`, `/root`, `/var`, `/srv` or `/etc` wholesale; from the host's `/etc` it copies only the
//! loader cache and configuration (`ld.so.cache`, `ld.so.conf*`), the `alternatives` symlinks, and
//! the `protocols`/`services` tables, which carry no secrets and which `bash`, `python3` and
//! the usual tools need.
//!
//! Packages keep their configuration in `/etc` and link to it from `/usr` (Debian's R has
//! `/usr/lib/R/etc/Renviron -> /etc/R/Renviron`, its JDK `conf/*` -> `/etc/java-17-openjdk/*`,
//! OpenSSL `certs -> /etc/ssl/certs`): a sandbox that sees the host's `/usr` needs those parts
//! of `/etc` too. So every absolute symlink in the host's `/usr` that points into `/etc` names a
//! path that sandboxes get, bound read-only from the host ([`etc_binds`]): the largest
//! directory above it (up to `/etc/<name>`) whose whole content any host user may read, or the
//! path alone when that is readable, else nothing. `/etc/ssl/private` (not world-readable) is
//! never bound, `/etc/ssl/certs` is; `/etc/shadow`, `/etc/ssh` and the like are not linked from
//! `/usr` and never considered; paths the template writes itself (`passwd`, `alternatives`, ...)
//! stay the template's. The walk of `/usr` (about half a second) is kept in
//! `<templates>/default-etc-binds` and made again when the host's package database
//! (`/var/lib/dpkg/status`) is newer, so a package installed later is seen on the next start.
//!
//! Assumptions: `/usr` holds everything `bash` and `python3` need (true of merged-`/usr` Debian
//! and Ubuntu); the host's `/usr` has no submounts (it is bound non-recursively).
//!
//! Invariants:
//! - the template is built in a temporary directory and renamed into place, so a crash never
//!   leaves a half-built template under its final name;
//! - paths used in overlay options contain no `,` or `:` (checked when the runtime opens and when
//!   a spec names a root directory).

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use crate::init::protocol::{BindPlan, OverlayPlan, SetupPlan};
use crate::init::setup::MASKED_PROC_FILES;

use super::state::SandboxRecord;

/// Name of the default template directory; bump the version when its content changes.
pub const DEFAULT_TEMPLATE: &str = "default-v1";

/// Where the init binary is bind-mounted inside every sandbox.
pub const INIT_PATH: &str = "/.oka/init";

/// Device nodes bind-mounted from the host into every sandbox's `/dev`.
pub const DEVICES: &[&str] =
    &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"];

/// Host top-level entries that merged-`/usr` systems make symlinks into `/usr`.
const SYSTEM_TOP_LEVEL: &[&str] = &["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Why a root file system could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    /// A file system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A path cannot be used in overlay mount options.
    #[error("path {0} cannot be an overlay layer: it contains ',' or ':'")]
    UnusablePath(PathBuf),
    /// A root directory (or image layer) named by a spec is not a directory.
    #[error("root filesystem {0} is not a directory")]
    NotADirectory(PathBuf),
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> RootfsError {
    let path = path.to_owned();
    move |source| RootfsError::Io { op, path, source }
}

/// Checks that `path` can appear in overlay options.
pub fn check_layer_path(path: &Path) -> Result<(), RootfsError> {
    let s = path.as_os_str().as_encoded_bytes();
    if s.iter().any(|b| matches!(b, b',' | b':' | b'\n')) {
        return Err(RootfsError::UnusablePath(path.to_owned()));
    }
    Ok(())
}

/// A root below sandboxes: the overlay's lower layers and the host directories bound on top.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// Lower layers, uppermost first.
    pub lower: Vec<PathBuf>,
    /// `(host path, sandbox path)` pairs bind-mounted read-only.
    pub binds: Vec<(PathBuf, PathBuf)>,
}

impl Template {
    /// A template from a root directory (for example a debootstrap tree).
    pub fn directory(dir: &Path) -> Result<Self, RootfsError> {
        check_layer_path(dir)?;
        if !dir.is_dir() {
            return Err(RootfsError::NotADirectory(dir.to_owned()));
        }
        Ok(Self { lower: vec![dir.to_owned()], binds: vec![] })
    }

    /// A template from image layers given **bottom first** (as [`oka_runtime_api::RootFs::Layers`]
    /// names them); the overlay wants them uppermost first. Each must be a directory whose path
    /// can appear in the overlay's options (the host-side mount of a restore uses the joined
    /// `lowerdir=` string whenever it fits).
    pub fn layers(layers: &[PathBuf]) -> Result<Self, RootfsError> {
        for layer in layers {
            check_layer_path(layer)?;
            if !layer.is_dir() {
                return Err(RootfsError::NotADirectory(layer.to_owned()));
            }
        }
        Ok(Self { lower: layers.iter().rev().cloned().collect(), binds: vec![] })
    }
}

/// Builds the default template root under `templates` if it is not there yet, and returns it.
pub fn ensure_default_template(templates: &Path) -> Result<Template, RootfsError> {
    fs::create_dir_all(templates).map_err(io_err("create directory", templates))?;
    let dir = templates.join(DEFAULT_TEMPLATE);
    let mut binds = host_binds();
    if dir.is_dir() {
        binds.extend(etc_binds(templates, &dir));
        return Ok(Template { lower: vec![dir], binds });
    }
    // Leftovers of a build interrupted by a crash.
    if let Ok(entries) = fs::read_dir(templates) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&format!(".{DEFAULT_TEMPLATE}.tmp")) {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    let tmp = templates.join(format!(".{DEFAULT_TEMPLATE}.tmp-{}", std::process::id()));
    build_default_template(&tmp, &binds)?;
    fs::rename(&tmp, &dir).map_err(io_err("rename", &tmp))?;
    tracing::debug!(?dir, "default template root built");
    binds.extend(etc_binds(templates, &dir));
    Ok(Template { lower: vec![dir], binds })
}

/// The file beside the templates that keeps the host `/etc` paths of [`etc_binds`].
const ETC_BINDS: &str = "default-etc-binds";

/// The host's package database: newer than [`ETC_BINDS`] means packages changed since.
const PACKAGE_DB: &str = "/var/lib/dpkg/status";

/// The host `/etc` paths that packages under the host's `/usr` link to, as `(host, sandbox)`
/// binds (see the module doc), from the list kept beside the templates while it is current.
/// Failures cost the binds, never the template: a sandbox then lacks some configuration.
fn etc_binds(templates: &Path, template: &Path) -> Vec<(PathBuf, PathBuf)> {
    let kept = templates.join(ETC_BINDS);
    let modified = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    let current = match (modified(&kept), modified(Path::new(PACKAGE_DB))) {
        (Some(kept), Some(packages)) => kept >= packages,
        (kept, _) => kept.is_some(),
    };
    let paths: Vec<PathBuf> = match fs::read_to_string(&kept) {
        Ok(list) if current => list.lines().map(PathBuf::from).collect(),
        _ => {
            let t0 = std::time::Instant::now();
            let mut targets = Vec::new();
            links_into_etc(Path::new("/usr"), &mut targets);
            let generated = |p: &Path| {
                p.strip_prefix("/etc").is_ok_and(|rel| {
                    rel.components().next().is_some_and(|first| {
                        fs::symlink_metadata(template.join("etc").join(first)).is_ok()
                    })
                })
            };
            let paths = plan_etc_binds(&targets, is_public, generated);
            tracing::debug!(?paths, elapsed = ?t0.elapsed(), "host /etc paths for the default root");
            let body: String = paths.iter().map(|p| format!("{}\n", p.display())).collect();
            let tmp = templates.join(format!(".{ETC_BINDS}.tmp-{}", std::process::id()));
            if let Err(e) = fs::write(&tmp, body).and_then(|()| fs::rename(&tmp, &kept)) {
                tracing::warn!(path = ?kept, "cannot keep the host /etc paths: {e}");
            }
            paths
        }
    };
    paths.into_iter().filter(|p| p.exists()).map(|p| (p.clone(), p)).collect()
}

/// Collects the targets of the absolute symlinks under `dir` that point into `/etc`, without
/// following symlinks. Unreadable directories are skipped.
fn links_into_etc(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            links_into_etc(&e.path(), out);
        } else if kind.is_symlink()
            && let Ok(target) = fs::read_link(e.path())
            && target.starts_with("/etc/")
        {
            out.push(target);
        }
    }
}

/// Which host paths to bind for the link `targets` into `/etc`: for each, the first of
/// `/etc/<name>`, `/etc/<name>/<next>`, ... down to the target itself that is `public`; none when
/// the target is not, nor when `generated` (a path the template writes itself). A target under
/// a path chosen already adds nothing; the result is sorted.
fn plan_etc_binds(
    targets: &[PathBuf],
    public: impl Fn(&Path) -> bool,
    generated: impl Fn(&Path) -> bool,
) -> Vec<PathBuf> {
    let mut chosen: Vec<PathBuf> = Vec::new();
    for target in targets {
        let Ok(rel) = target.strip_prefix("/etc") else { continue };
        if rel.as_os_str().is_empty() || generated(target) {
            continue;
        }
        let mut candidate = PathBuf::from("/etc");
        for part in rel.components() {
            let std::path::Component::Normal(part) = part else { break };
            candidate.push(part);
            if chosen.iter().any(|c| candidate.starts_with(c)) {
                break;
            }
            if public(&candidate) {
                chosen.push(candidate);
                break;
            }
        }
    }
    chosen.sort();
    chosen
}

/// Whether any host user may read all of `path`: a regular file readable by others, or a
/// directory others may list and enter whose every entry is public in turn (symlinks count as
/// public: what they point to is bound only if it is chosen itself).
fn is_public(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(meta) = fs::symlink_metadata(path) else { return false };
    let mode = meta.permissions().mode();
    if meta.is_file() {
        return mode & 0o004 != 0;
    }
    if !meta.is_dir() || mode & 0o005 != 0o005 {
        return false;
    }
    let Ok(entries) = fs::read_dir(path) else { return false };
    entries.flatten().all(|e| e.file_type().is_ok_and(|t| t.is_symlink()) || is_public(&e.path()))
}

/// Host directories bound read-only into sandboxes on the default root: `/usr`, and any
/// top-level system directory that is a real directory rather than a symlink into `/usr`.
fn host_binds() -> Vec<(PathBuf, PathBuf)> {
    let mut binds = vec![(PathBuf::from("/usr"), PathBuf::from("/usr"))];
    for name in SYSTEM_TOP_LEVEL {
        let host = Path::new("/").join(name);
        if fs::symlink_metadata(&host).is_ok_and(|m| m.is_dir()) {
            binds.push((host.clone(), host));
        }
    }
    binds
}

fn build_default_template(root: &Path, binds: &[(PathBuf, PathBuf)]) -> Result<(), RootfsError> {
    let _ = fs::remove_dir_all(root);
    let mkdir = |rel: &str, mode: u32| -> Result<PathBuf, RootfsError> {
        let p = root.join(rel);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(&p)
            .map_err(io_err("create directory", &p))?;
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", &p))?;
        Ok(p)
    };
    mkdir("", 0o755)?;
    for (rel, mode) in [
        ("usr", 0o755),
        ("dev", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("tmp", 0o1777),
        ("run", 0o755),
        ("var", 0o755),
        ("var/tmp", 0o1777),
        ("var/lib", 0o755),
        ("var/cache", 0o755),
        ("var/log", 0o755),
        ("mnt", 0o755),
        ("opt", 0o755),
        ("srv", 0o755),
        ("media", 0o755),
        ("root", 0o700),
        ("home", 0o755),
        ("etc", 0o755),
    ] {
        mkdir(rel, mode)?;
    }
    for name in SYSTEM_TOP_LEVEL {
        let host = Path::new("/").join(name);
        let Ok(meta) = fs::symlink_metadata(&host) else { continue };
        let p = root.join(name);
        if meta.file_type().is_symlink() {
            let dest = fs::read_link(&host).map_err(io_err("read link", &host))?;
            symlink(&dest, &p).map_err(io_err("symlink", &p))?;
        } else if binds.iter().any(|(h, _)| *h == host) {
            mkdir(name, 0o755)?;
        }
    }

    let home = mkdir("home/user", 0o750)?;
    if let Ok(entries) = fs::read_dir("/etc/skel") {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_file()) {
                let to = home.join(e.file_name());
                fs::copy(e.path(), &to).map_err(io_err("copy", &to))?;
                chown(&to, 1000, 1000)?;
            }
        }
    }
    chown(&home, 1000, 1000)?;

    let etc = root.join("etc");
    let write = |name: &str, body: &str, mode: u32| -> Result<(), RootfsError> {
        let p = etc.join(name);
        fs::write(&p, body).map_err(io_err("write", &p))?;
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", &p))
    };
    write(
        "passwd",
        "root:x:0:0:root:/root:/bin/bash\n\
         daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
         user:x:1000:1000:user:/home/user:/bin/bash\n\
         nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        0o644,
    )?;
    write(
        "group",
        "root:x:0:\ndaemon:x:1:\ntty:x:5:\nsudo:x:27:user\nusers:x:100:user\nuser:x:1000:\nnogroup:x:65534:\n",
        0o644,
    )?;
    write("shadow", "root:*:19000:0:99999:7:::\nuser:*:19000:0:99999:7:::\n", 0o600)?;
    write("hosts", DEFAULT_HOSTS, 0o644)?;
    write("hostname", "sandbox\n", 0o644)?;
    write("resolv.conf", "# no network by default\noptions timeout:1 attempts:1\n", 0o644)?;
    write(
        "nsswitch.conf",
        "passwd: files\ngroup: files\nshadow: files\ngshadow: files\nhosts: files dns\nnetworks: files\n\
         protocols: files\nservices: files\nethers: files\nrpc: files\n",
        0o644,
    )?;
    write(
        "profile",
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         if [ \"$(id -u)\" -eq 0 ]; then PS1='# '; else PS1='$ '; fi\n",
        0o644,
    )?;
    for file in ["ld.so.cache", "ld.so.conf", "protocols", "services"] {
        let from = Path::new("/etc").join(file);
        if from.is_file() {
            let to = etc.join(file);
            fs::copy(&from, &to).map_err(io_err("copy", &from))?;
        }
    }
    copy_dir_files(Path::new("/etc/ld.so.conf.d"), &etc.join("ld.so.conf.d"))?;
    copy_dir_symlinks(Path::new("/etc/alternatives"), &etc.join("alternatives"))?;
    for (link, dest) in [
        ("mtab", "../proc/self/mounts"),
        ("os-release", "../usr/lib/os-release"),
        ("localtime", "/usr/share/zoneinfo/Etc/UTC"),
    ] {
        let p = etc.join(link);
        symlink(dest, &p).map_err(io_err("symlink", &p))?;
    }
    Ok(())
}

/// `/etc/hosts` of the default template.
const DEFAULT_HOSTS: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";

fn copy_dir_files(from: &Path, to: &Path) -> Result<(), RootfsError> {
    let Ok(entries) = fs::read_dir(from) else { return Ok(()) };
    fs::create_dir_all(to).map_err(io_err("create directory", to))?;
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_file()) {
            let dest = to.join(e.file_name());
            fs::copy(e.path(), &dest).map_err(io_err("copy", &dest))?;
        }
    }
    Ok(())
}

fn copy_dir_symlinks(from: &Path, to: &Path) -> Result<(), RootfsError> {
    let Ok(entries) = fs::read_dir(from) else { return Ok(()) };
    fs::create_dir_all(to).map_err(io_err("create directory", to))?;
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_symlink()) {
            let src = e.path();
            let dest = fs::read_link(&src).map_err(io_err("read link", &src))?;
            let link = to.join(e.file_name());
            symlink(&dest, &link).map_err(io_err("symlink", &link))?;
        }
    }
    Ok(())
}

fn chown(path: &Path, uid: u32, gid: u32) -> Result<(), RootfsError> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(io_err("chown", path))
}

/// Writes the per-sandbox files into a *fresh* writable layer: `/etc/hostname` and an
/// `/etc/hosts` naming the hostname. Never called on a layer a sandbox has written to (it could
/// hold symlinks pointing anywhere on the host).
pub fn prepare_fresh_upper(
    upper: &Path,
    lower: &[PathBuf],
    hostname: &str,
) -> Result<(), RootfsError> {
    let etc = upper.join("etc");
    fs::create_dir(&etc).map_err(io_err("create directory", &etc))?;
    let base_hosts = lower
        .iter()
        .find_map(|l| fs::read_to_string(l.join("etc/hosts")).ok())
        .unwrap_or_else(|| DEFAULT_HOSTS.to_owned());
    let hosts = format!("{}127.0.1.1\t{hostname}\n", ensure_newline(&base_hosts));
    let p = etc.join("hosts");
    fs::write(&p, hosts).map_err(io_err("write", &p))?;
    let p = etc.join("hostname");
    fs::write(&p, format!("{hostname}\n")).map_err(io_err("write", &p))?;
    Ok(())
}

fn ensure_newline(s: &str) -> String {
    if s.is_empty() || s.ends_with('\n') { s.to_owned() } else { format!("{s}\n") }
}

/// The setup stage's plan for `record` on `template`, with the init binary at `init_binary`.
pub fn setup_plan(record: &SandboxRecord, template: &Template, init_binary: &Path) -> SetupPlan {
    let mut binds: Vec<BindPlan> = DEVICES
        .iter()
        .map(|d| BindPlan { source: d.into(), target: d.into(), readonly: false, optional: false })
        .collect();
    binds.extend(template.binds.iter().map(|(host, target)| BindPlan {
        source: host.clone(),
        target: target.clone(),
        readonly: true,
        optional: false,
    }));
    binds.push(BindPlan {
        source: init_binary.to_owned(),
        target: INIT_PATH.into(),
        readonly: true,
        optional: false,
    });
    binds.extend(MASKED_PROC_FILES.iter().map(|p| BindPlan {
        source: "/dev/null".into(),
        target: p.into(),
        readonly: false,
        optional: true,
    }));
    SetupPlan {
        rootfs: record.paths.rootfs.clone(),
        overlay: OverlayPlan {
            lower: record.lower.clone(),
            upper: record.paths.upper.clone(),
            work: record.paths.work.clone(),
            userxattr: record.spec.user_namespace != oka_runtime_api::UserNamespace::Host,
        },
        binds,
        hostname: record.spec.hostname.clone(),
        init_path: INIT_PATH.into(),
        tmp_size: record.spec.resources.memory_bytes,
        volumes: Vec::new(),
        read_only_root: record.spec.security.read_only_root,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_template_has_accounts_and_no_host_private_directories() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED default template test: chown to uid 1000 needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let t = ensure_default_template(tmp.path()).unwrap();
        let root = &t.lower[0];
        let passwd = fs::read_to_string(root.join("etc/passwd")).unwrap();
        assert!(passwd.contains("user:x:1000:1000:user:/home/user:/bin/bash"));
        assert!(passwd.starts_with("root:x:0:0:"));
        assert!(root.join("home/user").is_dir());
        assert_eq!(fs::read_dir(root.join("root")).unwrap().count(), 0);
        assert_eq!(fs::read_dir(root.join("usr")).unwrap().count(), 0, "usr is only a mount point");
        assert!(fs::read_dir(root.join("var/lib")).unwrap().next().is_none());
        assert!(t.binds.contains(&("/usr".into(), "/usr".into())));
        // A second call reuses the template.
        assert_eq!(ensure_default_template(tmp.path()).unwrap(), t);
    }

    #[test]
    fn etc_binds_take_the_largest_public_directory_and_never_a_private_path() {
        let public_paths = ["/etc/R", "/etc/R/Renviron", "/etc/ssl/certs", "/etc/ssl/openssl.cnf"];
        let public = |p: &Path| public_paths.iter().any(|q| Path::new(q) == p);
        let generated = |p: &Path| p.starts_with("/etc/alternatives");
        let targets: Vec<PathBuf> = [
            "/etc/R/Renviron",
            "/etc/R/ldpaths",
            "/etc/ssl/certs",
            "/etc/ssl/certs/java/cacerts",
            "/etc/ssl/openssl.cnf",
            "/etc/ssl/private",
            "/etc/alternatives/java",
            "/etc",
            "/usr/lib/x",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        let want: Vec<PathBuf> = ["/etc/R", "/etc/ssl/certs", "/etc/ssl/openssl.cnf"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(plan_etc_binds(&targets, public, generated), want);
    }

    #[test]
    fn the_host_etc_offered_to_sandboxes_is_readable_by_anyone() {
        let tmp = tempfile::tempdir().unwrap();
        let template = tmp.path().join("t");
        fs::create_dir_all(template.join("etc/alternatives")).unwrap();
        let binds = etc_binds(tmp.path(), &template);
        for (host, target) in &binds {
            assert_eq!(host, target);
            assert!(host.starts_with("/etc/") && is_public(host), "{host:?}");
            assert!(!host.starts_with("/etc/alternatives"), "{host:?}");
        }
        assert!(!binds.iter().any(|(h, _)| h.starts_with("/etc/ssl/private")), "{binds:?}");
        if Path::new("/usr/lib/R/etc/Renviron").is_symlink() {
            assert!(binds.iter().any(|(h, _)| h == Path::new("/etc/R")), "{binds:?}");
        }
        // Kept beside the templates, and read back.
        assert!(tmp.path().join(ETC_BINDS).is_file());
        assert_eq!(etc_binds(tmp.path(), &template), binds);
    }

    #[test]
    fn image_layers_are_stacked_uppermost_first_and_must_exist() {
        let tmp = tempfile::tempdir().unwrap();
        let (bottom, top) = (tmp.path().join("bottom"), tmp.path().join("top"));
        fs::create_dir(&bottom).unwrap();
        fs::create_dir(&top).unwrap();
        let t = Template::layers(&[bottom.clone(), top.clone()]).unwrap();
        assert_eq!(t.lower, [top, bottom.clone()]);
        assert!(t.binds.is_empty());
        let missing = tmp.path().join("missing");
        assert!(matches!(
            Template::layers(&[bottom.clone(), missing]),
            Err(RootfsError::NotADirectory(_))
        ));
        assert!(matches!(
            Template::layers(&[bottom, tmp.path().join("a:b")]),
            Err(RootfsError::UnusablePath(_))
        ));
    }

    #[test]
    fn layer_paths_with_option_separators_are_refused() {
        assert!(check_layer_path(Path::new("/a,b")).is_err());
        assert!(check_layer_path(Path::new("/a:b")).is_err());
        assert!(check_layer_path(Path::new("/var/lib/oka")).is_ok());
    }
}
