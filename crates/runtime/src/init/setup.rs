//! The init's setup stage: build the sandbox's root file system and pivot into it.
//!
//! Runs as PID 1 of the new PID namespace, in the new mount, UTS, IPC and network namespaces,
//! already placed in the sandbox's cgroups, with all host mounts still visible.
//!
//! Expected flow ([`setup`]):
//! 1. make every mount private (nothing we do may propagate to the host);
//! 2. mount the overlay (template root below, writable layer above) at `rootfs`;
//! 3. mount `/proc`, a minimal tmpfs `/dev` with `pts` and `shm`, and a tmpfs `/tmp`;
//! 4. bind host paths in order: device nodes, system directories (read-only), the init binary
//!    (read-only), and `/dev/null` over sensitive `/proc` files; each is reported back so CRIU can
//!    be given `--external mnt[...]` for it;
//!    Then the volumes: a host source (a host path, an emptyDir directory or the files of a
//!    ConfigMap or Secret in the sandbox's state) is bound with its sub-path resolved inside it
//!    and reported external like the binds; a memory emptyDir is a tmpfs mounted once at a
//!    staging path inside the root and bound from there; read-only ones are remounted;
//! 5. make `/proc/sys`, `/proc/sysrq-trigger` and friends read-only and hide `/proc/acpi`,
//!    `/proc/scsi` (host-global knobs root inside the sandbox must not write);
//! 6. set the hostname, bring `lo` up, enter a cgroup namespace rooted at the sandbox's cgroups;
//! 7. with a read-only root, remount the overlay read-only (the mounts on it stay as they
//!    are); `pivot_root` into `rootfs` and detach the old root.
//!
//! Invariant: no path inside the root is used without [`Syscalls::resolve`] (see
//! [`super::syscalls`]), so a sandbox's own writable layer cannot redirect a mount outside it.

use std::path::{Path, PathBuf};

use rustix::mount::MountFlags;

use super::protocol::{OverlayPlan, SetupPlan, VolumePlan, VolumeSourcePlan};
use super::syscalls::{Kind, Syscalls, Target, display};

/// `/proc` paths made read-only inside the sandbox (as runc's default `readonlyPaths`).
pub const READONLY_PROC_PATHS: &[&str] =
    &["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

/// `/proc` files hidden by bind-mounting the host's `/dev/null` on them (runc's `maskedPaths`
/// that are files).
pub const MASKED_PROC_FILES: &[&str] = &[
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/sched_debug",
    "/proc/timer_list",
    "/proc/timer_stats",
];

/// `/proc` directories hidden under an empty read-only tmpfs.
pub const MASKED_PROC_DIRS: &[&str] = &["/proc/acpi", "/proc/scsi"];

/// A failed setup step.
#[derive(Debug, thiserror::Error)]
#[error("{step} {path}: {source}")]
pub struct SetupError {
    /// What was being done.
    pub step: &'static str,
    /// The path it was done to.
    pub path: String,
    /// The kernel's answer.
    #[source]
    pub source: std::io::Error,
}

fn fail(step: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SetupError {
    let path = display(path);
    move |source| SetupError { step, path, source }
}

/// Builds the root described by `plan` and pivots into it. Returns the sandbox paths of the host
/// bind mounts made (the ones CRIU must be told are external).
pub fn setup(sys: &impl Syscalls, plan: &SetupPlan) -> Result<Vec<PathBuf>, SetupError> {
    let root = plan.rootfs.as_path();
    sys.make_mounts_private().map_err(fail("make mounts private", Path::new("/")))?;

    mount_overlay(sys, root, &plan.overlay).map_err(fail("mount overlay", root))?;

    let nosuid_nodev_noexec = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    mount_fs(sys, root, "/proc", "proc", nosuid_nodev_noexec, "")?;
    mount_fs(
        sys,
        root,
        "/dev",
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        "mode=755,size=65536k",
    )?;
    mount_fs(
        sys,
        root,
        "/dev/pts",
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        "newinstance,ptmxmode=0666,mode=0620",
    )?;
    mount_fs(sys, root, "/dev/shm", "tmpfs", MountFlags::NOSUID | MountFlags::NODEV, "mode=1777")?;
    for (link, dest) in [
        ("/dev/ptmx", "pts/ptmx"),
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        sys.symlink(root, Path::new(link), Path::new(dest))
            .map_err(fail("symlink", Path::new(link)))?;
    }
    let tmp_data = match plan.tmp_size {
        Some(size) => format!("mode=1777,size={size}"),
        None => "mode=1777".to_owned(),
    };
    mount_fs(sys, root, "/tmp", "tmpfs", MountFlags::NOSUID | MountFlags::NODEV, &tmp_data)?;

    let mut external = Vec::with_capacity(plan.binds.len());
    for bind in &plan.binds {
        let create = if bind.optional {
            None
        } else if bind.source.is_dir() {
            Some(Kind::Dir)
        } else {
            Some(Kind::File)
        };
        let Some(target) =
            sys.resolve(root, &bind.target, create).map_err(fail("resolve", &bind.target))?
        else {
            continue;
        };
        sys.bind(&bind.source, &target.mount_path()).map_err(fail("bind mount", &bind.target))?;
        if bind.readonly {
            remount_readonly(sys, root, &bind.target)?;
        }
        external.push(bind.target.clone());
    }

    let mut staged: Vec<&Path> = Vec::new();
    for volume in &plan.volumes {
        if mount_volume(sys, root, volume, &mut staged)? {
            external.push(volume.target.clone());
        }
    }

    for p in READONLY_PROC_PATHS {
        let p = Path::new(p);
        let Some(target) = sys.resolve(root, p, None).map_err(fail("resolve", p))? else {
            continue;
        };
        let path = target.mount_path();
        sys.bind(&path, &path).map_err(fail("bind mount", p))?;
        remount_readonly(sys, root, p)?;
    }
    for p in MASKED_PROC_DIRS {
        let p = Path::new(p);
        let Some(target) = sys.resolve(root, p, None).map_err(fail("resolve", p))? else {
            continue;
        };
        sys.mount("tmpfs", &target.mount_path(), "tmpfs", MountFlags::RDONLY, "size=0")
            .map_err(fail("mask", p))?;
    }

    sys.set_hostname(&plan.hostname).map_err(fail("sethostname", Path::new(&plan.hostname)))?;
    sys.loopback_up().map_err(fail("bring up", Path::new("lo")))?;
    sys.unshare_cgroup_namespace().map_err(fail("unshare cgroup namespace", Path::new("/")))?;
    if plan.read_only_root {
        sys.remount_readonly(root).map_err(fail("remount read-only", Path::new("/")))?;
    }
    sys.pivot_root(root).map_err(fail("pivot_root", root))?;
    Ok(external)
}

/// Mounts one volume: its source (a host path, or a tmpfs staged once inside the root) with
/// its sub-path resolved inside the source, bound to its target resolved inside the root.
/// Returns whether the mount is a host bind (external to CRIU).
fn mount_volume<'a>(
    sys: &impl Syscalls,
    root: &Path,
    volume: &'a VolumePlan,
    staged: &mut Vec<&'a Path>,
) -> Result<bool, SetupError> {
    let target_path = &volume.target;
    let (source, host) = match &volume.source {
        VolumeSourcePlan::Host(dir) => {
            let source = match &volume.sub_path {
                None => Target::Path(dir.clone()),
                Some(sub) => sys
                    .resolve(dir, sub, Some(Kind::Dir))
                    .map_err(fail("resolve sub-path", sub))?
                    .ok_or_else(|| not_found("resolve sub-path", sub))?,
            };
            (source, true)
        }
        VolumeSourcePlan::Tmpfs { staging, size, gid } => {
            if !staged.contains(&staging.as_path()) {
                let mut data = match gid {
                    Some(gid) => format!("mode=2777,gid={gid}"),
                    None => "mode=777".to_owned(),
                };
                if let Some(size) = size {
                    data.push_str(&format!(",size={size}"));
                }
                let at = sys
                    .resolve(root, staging, Some(Kind::Dir))
                    .map_err(fail("resolve", staging))?
                    .ok_or_else(|| not_found("resolve", staging))?;
                sys.mount(
                    "tmpfs",
                    &at.mount_path(),
                    "tmpfs",
                    MountFlags::NOSUID | MountFlags::NODEV,
                    &data,
                )
                .map_err(fail("mount tmpfs", staging))?;
                staged.push(staging);
            }
            let inside = match &volume.sub_path {
                None => staging.clone(),
                Some(sub) => staging.join(sub),
            };
            let source = sys
                .resolve(root, &inside, Some(Kind::Dir))
                .map_err(fail("resolve sub-path", &inside))?
                .ok_or_else(|| not_found("resolve sub-path", &inside))?;
            (source, false)
        }
    };
    let source_path = source.mount_path();
    let kind = if source_path.is_dir() { Kind::Dir } else { Kind::File };
    let target = sys
        .resolve(root, target_path, Some(kind))
        .map_err(fail("resolve", target_path))?
        .ok_or_else(|| not_found("resolve", target_path))?;
    sys.bind(&source_path, &target.mount_path()).map_err(fail("bind mount", target_path))?;
    drop(target);
    if volume.readonly {
        remount_readonly(sys, root, target_path)?;
    }
    Ok(host)
}

fn not_found(step: &'static str, path: &Path) -> SetupError {
    SetupError { step, path: display(path), source: std::io::ErrorKind::NotFound.into() }
}

/// The longest `mount(2)` data string the kernel takes: one page, its NUL included.
const MOUNT_DATA_MAX: usize = 4095;

/// Mounts the overlay of `overlay` at `target`: with one `mount(2)` and the joined options when
/// they fit in a page, else layer by layer through the new mount API (an image of many layers
/// under a long state directory). Both sides of a restore (the init and the runtime's host-side
/// mount) mount through here.
pub fn mount_overlay(
    sys: &impl Syscalls,
    target: &Path,
    overlay: &OverlayPlan,
) -> std::io::Result<()> {
    let options = overlay_options(overlay);
    if options.len() <= MOUNT_DATA_MAX {
        sys.mount("overlay", target, "overlay", MountFlags::empty(), &options)
    } else {
        sys.mount_overlay_by_layer(target, overlay)
    }
}

/// The overlayfs mount options of a sandbox root. The runtime mounts the same root on the host to
/// restore a checkpoint, so both sides build the options here.
pub fn overlay_options(overlay: &OverlayPlan) -> String {
    let lower: Vec<String> = overlay.lower.iter().map(|p| display(p)).collect();
    format!(
        "lowerdir={},upperdir={},workdir={}{}",
        lower.join(":"),
        display(&overlay.upper),
        display(&overlay.work),
        if overlay.userxattr { ",userxattr" } else { "" }
    )
}

/// Makes the bind mount at `path` read-only. The path is resolved again: a descriptor opened
/// before the bind names the directory *under* the new mount, and remounting it fails (`EINVAL`).
fn remount_readonly(sys: &impl Syscalls, root: &Path, path: &Path) -> Result<(), SetupError> {
    let target = sys.resolve(root, path, None).map_err(fail("resolve", path))?;
    let Some(target) = target else {
        return Err(SetupError {
            step: "resolve",
            path: display(path),
            source: std::io::ErrorKind::NotFound.into(),
        });
    };
    sys.remount_readonly(&target.mount_path()).map_err(fail("remount read-only", path))
}

fn mount_fs(
    sys: &impl Syscalls,
    root: &Path,
    path: &str,
    fstype: &str,
    flags: MountFlags,
    data: &str,
) -> Result<(), SetupError> {
    let p = Path::new(path);
    let target = sys.resolve(root, p, Some(Kind::Dir)).map_err(fail("resolve", p))?;
    let Some(target) = target else {
        return Err(SetupError {
            step: "resolve",
            path: path.into(),
            source: std::io::ErrorKind::NotFound.into(),
        });
    };
    sys.mount(fstype, &target.mount_path(), fstype, flags, data).map_err(|source| SetupError {
        step: "mount",
        path: path.into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::protocol::{BindPlan, OverlayPlan};
    use crate::init::syscalls::{Call, RecordingSyscalls};

    fn plan() -> SetupPlan {
        SetupPlan {
            rootfs: "/state/s1/rootfs".into(),
            overlay: OverlayPlan {
                lower: vec!["/state/templates/default".into()],
                upper: "/state/s1/upper".into(),
                work: "/state/s1/work".into(),
                userxattr: false,
            },
            binds: vec![
                BindPlan {
                    source: "/dev/null".into(),
                    target: "/dev/null".into(),
                    readonly: false,
                    optional: false,
                },
                BindPlan {
                    source: "/usr".into(),
                    target: "/usr".into(),
                    readonly: true,
                    optional: false,
                },
                BindPlan {
                    source: "/dev/null".into(),
                    target: "/proc/kcore".into(),
                    readonly: false,
                    optional: true,
                },
                BindPlan {
                    source: "/dev/null".into(),
                    target: "/proc/timer_stats".into(),
                    readonly: false,
                    optional: true,
                },
            ],
            hostname: "box".into(),
            init_path: "/.oka/init".into(),
            tmp_size: Some(1 << 20),
            volumes: vec![],
            read_only_root: false,
        }
    }

    fn index_of(calls: &[Call], pred: impl Fn(&Call) -> bool) -> usize {
        calls.iter().position(pred).expect("call not made")
    }

    #[test]
    fn setup_mounts_overlay_first_and_pivots_last() {
        let sys = RecordingSyscalls::default();
        setup(&sys, &plan()).unwrap();
        let calls = sys.calls.borrow();
        assert_eq!(calls[0], Call::MakePrivate);
        assert_eq!(
            calls[1],
            Call::Mount {
                source: "overlay".into(),
                target: "/state/s1/rootfs".into(),
                fstype: "overlay".into(),
                flags: MountFlags::empty(),
                data: "lowerdir=/state/templates/default,upperdir=/state/s1/upper,workdir=/state/s1/work".into(),
            }
        );
        assert_eq!(calls.last(), Some(&Call::PivotRoot("/state/s1/rootfs".into())));
        let proc_mount =
            index_of(&calls, |c| matches!(c, Call::Mount { fstype, .. } if fstype == "proc"));
        let mask = index_of(
            &calls,
            |c| matches!(c, Call::Bind { target, .. } if target.ends_with("proc/kcore")),
        );
        assert!(proc_mount < mask, "masks need /proc mounted first");
        let hostname = index_of(&calls, |c| matches!(c, Call::SetHostname(h) if h == "box"));
        assert!(hostname < calls.len() - 1);
        assert!(calls.contains(&Call::LoopbackUp));
        assert!(calls.contains(&Call::UnshareCgroup));
    }

    #[test]
    fn an_overlay_whose_options_exceed_a_page_is_mounted_layer_by_layer() {
        let mut plan = plan();
        let layer = |i: usize| PathBuf::from(format!("/state/images/layers/sha256/{i:064x}"));
        plan.overlay.lower = (0..60).map(layer).collect();
        assert!(overlay_options(&plan.overlay).len() > MOUNT_DATA_MAX);
        let sys = RecordingSyscalls::default();
        setup(&sys, &plan).unwrap();
        assert_eq!(
            sys.calls.borrow()[1],
            Call::OverlayByLayer {
                target: "/state/s1/rootfs".into(),
                overlay: plan.overlay.clone()
            }
        );
        // A few layers still take the one mount(2) a CRIU restore has always seen.
        plan.overlay.lower.truncate(3);
        let sys = RecordingSyscalls::default();
        setup(&sys, &plan).unwrap();
        assert!(
            matches!(&sys.calls.borrow()[1], Call::Mount { data, .. } if data.starts_with("lowerdir=/state/images/layers/sha256/"))
        );
    }

    #[test]
    fn readonly_binds_are_remounted_and_mounts_are_reported_external() {
        let sys =
            RecordingSyscalls { missing: vec!["/proc/timer_stats".into()], ..Default::default() };
        let external = setup(&sys, &plan()).unwrap();
        assert_eq!(external, [PathBuf::from("/dev/null"), "/usr".into(), "/proc/kcore".into()]);
        let calls = sys.calls.borrow();
        let bind_usr = index_of(
            &calls,
            |c| matches!(c, Call::Bind { source, .. } if source == Path::new("/usr")),
        );
        assert_eq!(calls[bind_usr + 2], Call::RemountReadonly("/state/s1/rootfs/usr".into()));
        assert!(calls.contains(&Call::RemountReadonly("/state/s1/rootfs/proc/sys".into())));
        assert!(
            !calls
                .iter()
                .any(|c| matches!(c, Call::Bind { target, .. } if target.ends_with("timer_stats")))
        );
    }

    #[test]
    fn tmp_gets_the_planned_size_and_every_sandbox_path_is_resolved_inside_the_root() {
        let sys = RecordingSyscalls::default();
        setup(&sys, &plan()).unwrap();
        let calls = sys.calls.borrow();
        assert!(calls.iter().any(|c| matches!(c,
            Call::Mount { target, data, .. } if target == Path::new("/state/s1/rootfs/tmp") && data == "mode=1777,size=1048576")));
        for call in calls.iter() {
            if let Call::Bind { target, .. } | Call::Mount { target, .. } = call {
                assert!(target.starts_with("/state/s1/rootfs"), "{call:?} outside the root");
            }
        }
    }
}
