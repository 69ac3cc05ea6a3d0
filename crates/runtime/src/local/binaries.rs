//! Pinned copies of the binaries placed inside sandboxes (the init and envd).
//!
//! A sandbox bind-mounts the init and the envd binary from the host. Were those the paths the
//! daemon was configured with, replacing them (upgrading `oka`, rebuilding it) would break every
//! hibernated sandbox: CRIU checks on restore that a mapped file is the one it dumped, and
//! fails with "File .oka/init has bad size". So [`pin`] copies each binary once into
//! `<state dir>/bin/`, under a name derived from the file's identity (size, modification time,
//! inode), and sandboxes mount the copy. A copy is never changed afterwards; checkpoints record
//! the copy they were made with, so an upgrade gives new sandboxes a new copy while hibernated
//! ones restore with theirs.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Returns the pinned copy of `binary` in `bin_dir` (same permission bits), copying it there
/// first when missing.
pub fn pin(binary: &Path, bin_dir: &Path) -> std::io::Result<PathBuf> {
    let meta = std::fs::metadata(binary)?;
    let name = binary.file_name().and_then(|n| n.to_str()).unwrap_or("binary");
    let identity = fnv1a_64(
        format!("{}:{}:{}:{}", meta.len(), meta.mtime(), meta.mtime_nsec(), meta.ino()).as_bytes(),
    );
    let pinned = bin_dir.join(format!("{name}-{identity:016x}"));
    if pinned.is_file() {
        return Ok(pinned);
    }
    std::fs::DirBuilder::new().recursive(true).mode(0o711).create(bin_dir)?;
    // Copy to a temporary name, then rename: a crash never leaves a partial copy under the
    // final name.
    let partial = bin_dir.join(format!(".{name}-{identity:016x}.partial"));
    let _ = std::fs::remove_file(&partial);
    {
        let mut from = std::fs::File::open(binary)?;
        let mut to = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(meta.mode() & 0o7777)
            .open(&partial)?;
        std::io::copy(&mut from, &mut to)?;
        to.sync_all()?;
    }
    std::fs::rename(&partial, &pinned)?;
    Ok(pinned)
}

/// FNV-1a, 64 bits: stable across builds (unlike std's hasher).
fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_binary_is_copied_once_and_a_replaced_one_gets_a_new_copy() {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("oka-init");
        std::fs::write(&binary, b"first build").unwrap();
        let bin = dir.path().join("state/bin");
        let first = pin(&binary, &bin).unwrap();
        assert_eq!(std::fs::read(&first).unwrap(), b"first build");
        assert_eq!(pin(&binary, &bin).unwrap(), first);

        // An upgrade replaces the file (a new inode, as installers and cargo do).
        std::fs::remove_file(&binary).unwrap();
        std::fs::write(&binary, b"second build, longer").unwrap();
        let second = pin(&binary, &bin).unwrap();
        assert_ne!(second, first);
        assert_eq!(std::fs::read(&first).unwrap(), b"first build");
        assert_eq!(std::fs::read(&second).unwrap(), b"second build, longer");
    }

    #[test]
    fn the_copy_keeps_the_permission_bits() {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("tool");
        std::fs::write(&binary, b"data").unwrap();
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o640)).unwrap();
        let pinned = pin(&binary, &dir.path().join("bin")).unwrap();
        assert_eq!(std::fs::metadata(pinned).unwrap().mode() & 0o7777, 0o640);
    }
}
