//! Unpacking one layer (a tar, gzipped or not) into a directory that overlayfs stacks as a
//! lower layer: AUFS whiteouts `.wh.<name>` become overlay whiteouts (a 0:0 character device),
//! opaque markers `.wh..wh..opq` the `trusted.overlay.opaque=y` xattr on their directory;
//! regular files, directories, symlinks, hardlinks within the layer, devices and fifos keep
//! their ownership, mode, mtime and PAX `SCHILY.xattr.*` attributes. A path that would leave
//! the layer (`..`, absolute, through a symlink of the layer) is refused, and so is a hardlink
//! to such a path. Blocking; the caller runs it on a blocking thread, into a fresh directory.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write as _};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, CWD, FileType, Mode, Timespec, Timestamps};
use sha2::{Digest as _, Sha256};

use crate::manifest::hex;

/// The prefix of an AUFS whiteout in a layer tar.
const WHITEOUT_PREFIX: &str = ".wh.";
/// The AUFS opaque-directory marker.
const OPAQUE_MARKER: &str = ".wh..wh..opq";
/// The xattr overlayfs reads an opaque directory from.
const OVERLAY_OPAQUE_XATTR: &str = "trusted.overlay.opaque";

/// What unpacking produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpacked {
    /// `sha256:<hex>` of the uncompressed tar (the layer's diff id).
    pub diff_id: String,
    /// Bytes of regular-file content written.
    pub size: u64,
}

/// Why a layer could not be unpacked.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// The archive names a path outside the layer.
    #[error("entry {path:?} escapes the layer ({why})")]
    Escape {
        /// The entry's path as written.
        path: String,
        /// What makes it escape.
        why: &'static str,
    },
    /// A zstd layer (no zstd decoder is built in).
    #[error("zstd-compressed layers are not supported; push the image with gzip layers")]
    Zstd,
    /// The archive is broken, or the source failed while reading.
    #[error("reading the layer: {0}")]
    Read(#[source] io::Error),
    /// Writing a file failed.
    #[error("{path}: {source}")]
    Write {
        /// The path in the layer.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// Reads through to `inner`, hashing every byte.
struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Unpacks the layer read from `source` (its compression sniffed: gzip, zstd refused, else a
/// plain tar) into `dest`, an empty directory.
pub fn unpack_layer(source: impl Read, dest: &Path) -> Result<Unpacked, UnpackError> {
    let mut source = BufReader::with_capacity(256 * 1024, source);
    let magic = source.fill_buf().map_err(UnpackError::Read)?;
    if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Err(UnpackError::Zstd);
    }
    if magic.starts_with(&[0x1f, 0x8b]) {
        unpack_tar(flate2::bufread::MultiGzDecoder::new(source), dest)
    } else {
        unpack_tar(source, dest)
    }
}

/// Unpacks an uncompressed tar stream into `dest`.
pub fn unpack_tar(source: impl Read, dest: &Path) -> Result<Unpacked, UnpackError> {
    let mut reader = HashingReader { inner: source, hasher: Sha256::new() };
    let mut writer = LayerWriter {
        root: dest.to_path_buf(),
        safe_dirs: HashSet::new(),
        dir_times: Vec::new(),
        size: 0,
        buffer: vec![0; 256 * 1024],
    };
    {
        let mut archive = tar::Archive::new(&mut reader);
        let entries = archive.entries().map_err(UnpackError::Read)?;
        for entry in entries {
            let entry = entry.map_err(UnpackError::Read)?;
            writer.entry(entry)?;
        }
    }
    // The diff id covers the whole stream, the archive's trailing padding included.
    io::copy(&mut reader, &mut io::sink()).map_err(UnpackError::Read)?;
    let size = writer.size;
    writer.finish()?;
    Ok(Unpacked { diff_id: format!("sha256:{}", hex(&reader.hasher.finalize())), size })
}

struct LayerWriter {
    root: PathBuf,
    /// Directories (relative) known to be real directories of the layer, not symlinks.
    safe_dirs: HashSet<PathBuf>,
    /// Directories whose mtime is set at the end (creating children changes it).
    dir_times: Vec<(PathBuf, u64)>,
    size: u64,
    /// File content passes through here (larger than `io::copy`'s, fewer write calls).
    buffer: Vec<u8>,
}

fn write_err(path: &Path) -> impl FnOnce(io::Error) -> UnpackError + '_ {
    move |source| UnpackError::Write { path: path.display().to_string(), source }
}

fn errno(path: &Path) -> impl FnOnce(rustix::io::Errno) -> UnpackError + '_ {
    move |e| UnpackError::Write { path: path.display().to_string(), source: e.into() }
}

/// The entry's path as a clean relative path: `./` and `/`-free, no `..`; `None` for the root.
fn clean_path(raw: &Path) -> Result<Option<PathBuf>, UnpackError> {
    let shown = || raw.display().to_string();
    let mut out = PathBuf::new();
    for component in raw.components() {
        match component {
            Component::Normal(c) => out.push(c),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(UnpackError::Escape { path: shown(), why: "a `..` component" });
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(UnpackError::Escape { path: shown(), why: "an absolute path" });
            }
        }
    }
    Ok(if out.as_os_str().is_empty() { None } else { Some(out) })
}

impl LayerWriter {
    fn entry<R: Read>(&mut self, mut entry: tar::Entry<'_, R>) -> Result<(), UnpackError> {
        let raw = entry.path().map_err(UnpackError::Read)?.into_owned();
        let kind = entry.header().entry_type();
        let Some(rel) = clean_path(&raw)? else {
            // The layer's root directory: its attributes are the lower directory's own.
            if kind.is_dir() {
                self.attributes(&mut entry, Path::new(""), true)?;
            }
            return Ok(());
        };
        let name = rel.file_name().map(OsStr::as_bytes).unwrap_or_default();
        let parent = rel.parent().unwrap_or(Path::new("")).to_path_buf();
        if name.starts_with(WHITEOUT_PREFIX.as_bytes()) {
            self.ensure_parent(&parent, &raw)?;
            let dir = self.root.join(&parent);
            if name == OPAQUE_MARKER.as_bytes() {
                rustix::fs::lsetxattr(
                    &dir,
                    OVERLAY_OPAQUE_XATTR,
                    b"y",
                    rustix::fs::XattrFlags::empty(),
                )
                .map_err(errno(&rel))?;
            } else if name.starts_with(b".wh..wh.") {
                // AUFS metadata (`.wh..wh.plnk`, `.wh..wh.aufs`): no meaning in overlay.
            } else {
                let hidden = &name[WHITEOUT_PREFIX.len()..];
                let target = parent.join(OsStr::from_bytes(hidden));
                let full = self.root.join(&target);
                self.remove_existing(&full, &target)?;
                rustix::fs::mknodat(CWD, &full, FileType::CharacterDevice, Mode::empty(), 0)
                    .map_err(errno(&target))?;
                let header = entry.header();
                let (uid, gid) = (header.uid().unwrap_or(0), header.gid().unwrap_or(0));
                chown(&full, uid, gid).map_err(errno(&target))?;
            }
            return Ok(());
        }
        self.ensure_parent(&parent, &raw)?;
        let full = self.root.join(&rel);
        match kind {
            tar::EntryType::Directory => {
                match fs::symlink_metadata(&full) {
                    Ok(meta) if meta.is_dir() => {}
                    Ok(_) => {
                        self.remove_existing(&full, &rel)?;
                        mkdir(&full).map_err(write_err(&rel))?;
                    }
                    Err(_) => mkdir(&full).map_err(write_err(&rel))?,
                }
                self.safe_dirs.insert(rel.clone());
                self.attributes(&mut entry, &rel, true)?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let create =
                    || fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&full);
                let mut file = match create() {
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        self.remove_existing(&full, &rel)?;
                        create()
                    }
                    other => other,
                }
                .map_err(write_err(&rel))?;
                let mut written = 0u64;
                loop {
                    let n = match entry.read(&mut self.buffer) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(UnpackError::Read(e)),
                    };
                    file.write_all(&self.buffer[..n]).map_err(write_err(&rel))?;
                    written += n as u64;
                }
                self.size += written;
                self.file_attributes(&mut entry, &rel, &file)?;
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(UnpackError::Read)?
                    .ok_or_else(|| UnpackError::Read(io::Error::other("symlink without a target")))?
                    .into_owned();
                self.remove_existing(&full, &rel)?;
                std::os::unix::fs::symlink(&target, &full).map_err(write_err(&rel))?;
                self.attributes(&mut entry, &rel, false)?;
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(UnpackError::Read)?
                    .ok_or_else(|| {
                        UnpackError::Read(io::Error::other("hardlink without a target"))
                    })?
                    .into_owned();
                let Some(target_rel) = clean_path(&target)? else {
                    return Err(UnpackError::Escape {
                        path: raw.display().to_string(),
                        why: "a hardlink to the root",
                    });
                };
                let target_parent = target_rel.parent().unwrap_or(Path::new("")).to_path_buf();
                self.check_parent(&target_parent, &target)?;
                let target_full = self.root.join(&target_rel);
                if fs::symlink_metadata(&target_full).is_ok_and(|m| m.is_dir()) {
                    return Err(UnpackError::Read(io::Error::other(format!(
                        "hardlink {} to a directory",
                        rel.display()
                    ))));
                }
                if target_full != full {
                    self.remove_existing(&full, &rel)?;
                    fs::hard_link(&target_full, &full).map_err(write_err(&rel))?;
                }
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                let header = entry.header();
                let file_type = match kind {
                    tar::EntryType::Char => FileType::CharacterDevice,
                    tar::EntryType::Block => FileType::BlockDevice,
                    _ => FileType::Fifo,
                };
                let major = header.device_major().ok().flatten().unwrap_or(0);
                let minor = header.device_minor().ok().flatten().unwrap_or(0);
                self.remove_existing(&full, &rel)?;
                rustix::fs::mknodat(
                    CWD,
                    &full,
                    file_type,
                    Mode::empty(),
                    rustix::fs::makedev(major, minor),
                )
                .map_err(errno(&rel))?;
                self.attributes(&mut entry, &rel, false)?;
            }
            other => {
                tracing::debug!(path = %rel.display(), kind = ?other, "skipping a tar entry of this kind");
            }
        }
        Ok(())
    }

    /// Makes sure every directory above `parent` is a real directory of the layer (creating
    /// missing ones, 0755 root-owned as Docker does), never a symlink.
    fn ensure_parent(&mut self, parent: &Path, raw: &Path) -> Result<(), UnpackError> {
        let mut sofar = PathBuf::new();
        for component in parent.components() {
            sofar.push(component);
            if self.safe_dirs.contains(&sofar) {
                continue;
            }
            let full = self.root.join(&sofar);
            match fs::symlink_metadata(&full) {
                Ok(meta) if meta.is_dir() => {}
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(UnpackError::Escape {
                        path: raw.display().to_string(),
                        why: "a path through a symlink",
                    });
                }
                Ok(_) => {
                    return Err(UnpackError::Write {
                        path: raw.display().to_string(),
                        source: io::Error::other(format!("{} is not a directory", sofar.display())),
                    });
                }
                Err(_) => mkdir(&full).map_err(write_err(&sofar))?,
            }
            self.safe_dirs.insert(sofar.clone());
        }
        Ok(())
    }

    /// Like `ensure_parent`, without creating anything (a hardlink's target must exist).
    fn check_parent(&mut self, parent: &Path, raw: &Path) -> Result<(), UnpackError> {
        let mut sofar = PathBuf::new();
        for component in parent.components() {
            sofar.push(component);
            if self.safe_dirs.contains(&sofar) {
                continue;
            }
            match fs::symlink_metadata(self.root.join(&sofar)) {
                Ok(meta) if meta.is_dir() => {
                    self.safe_dirs.insert(sofar.clone());
                }
                _ => {
                    return Err(UnpackError::Escape {
                        path: raw.display().to_string(),
                        why: "a hardlink through a symlink or to a missing file",
                    });
                }
            }
        }
        Ok(())
    }

    /// Removes what is at `full` (a later entry replaces an earlier one of the same layer).
    fn remove_existing(&mut self, full: &Path, rel: &Path) -> Result<(), UnpackError> {
        match fs::symlink_metadata(full) {
            Ok(meta) if meta.is_dir() => {
                self.safe_dirs.retain(|d| !d.starts_with(rel));
                fs::remove_dir_all(full).map_err(write_err(rel))
            }
            Ok(_) => fs::remove_file(full).map_err(write_err(rel)),
            Err(_) => Ok(()),
        }
    }

    /// Ownership, mode, xattrs and mtime of the entry just written.
    fn attributes<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        rel: &Path,
        is_dir: bool,
    ) -> Result<(), UnpackError> {
        let full = self.root.join(rel);
        let header = entry.header();
        let (uid, gid) = (header.uid().unwrap_or(0), header.gid().unwrap_or(0));
        let mode = header.mode().unwrap_or(if is_dir { 0o755 } else { 0o644 }) & 0o7777;
        let mtime = header.mtime().unwrap_or(0);
        let is_symlink = header.entry_type() == tar::EntryType::Symlink;
        chown(&full, uid, gid).map_err(errno(rel))?;
        // After chown, which clears set-id bits.
        if !is_symlink {
            fs::set_permissions(&full, fs::Permissions::from_mode(mode)).map_err(write_err(rel))?;
        }
        if let Some(extensions) = entry.pax_extensions().map_err(UnpackError::Read)? {
            for extension in extensions {
                let extension = extension.map_err(UnpackError::Read)?;
                let Some(name) = extension.key_bytes().strip_prefix(b"SCHILY.xattr.") else {
                    continue;
                };
                let name = OsStr::from_bytes(name);
                if let Err(e) = rustix::fs::lsetxattr(
                    &full,
                    name,
                    extension.value_bytes(),
                    rustix::fs::XattrFlags::empty(),
                ) {
                    // A filesystem without xattrs of that namespace: the file is still usable.
                    tracing::debug!(path = %rel.display(), xattr = ?name, error = %e, "xattr not set");
                }
            }
        }
        if is_dir {
            self.dir_times.push((rel.to_path_buf(), mtime));
        } else {
            set_mtime(&full, mtime).map_err(errno(rel))?;
        }
        Ok(())
    }

    /// `attributes` for a regular file, through its open descriptor (no path lookups).
    fn file_attributes<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        rel: &Path,
        file: &fs::File,
    ) -> Result<(), UnpackError> {
        let header = entry.header();
        let (uid, gid) = (header.uid().unwrap_or(0), header.gid().unwrap_or(0));
        let mode = header.mode().unwrap_or(0o644) & 0o7777;
        let mtime = header.mtime().unwrap_or(0);
        match rustix::fs::fchown(file, Some(uid_of(uid)), Some(gid_of(gid))) {
            Err(rustix::io::Errno::PERM) if !rustix::process::geteuid().is_root() => {}
            other => other.map_err(errno(rel))?,
        }
        // After chown, which clears set-id bits.
        rustix::fs::fchmod(file, Mode::from_raw_mode(mode)).map_err(errno(rel))?;
        if let Some(extensions) = entry.pax_extensions().map_err(UnpackError::Read)? {
            for extension in extensions {
                let extension = extension.map_err(UnpackError::Read)?;
                let Some(name) = extension.key_bytes().strip_prefix(b"SCHILY.xattr.") else {
                    continue;
                };
                let name = OsStr::from_bytes(name);
                let flags = rustix::fs::XattrFlags::empty();
                if let Err(e) = rustix::fs::fsetxattr(file, name, extension.value_bytes(), flags) {
                    tracing::debug!(path = %rel.display(), xattr = ?name, error = %e, "xattr not set");
                }
            }
        }
        rustix::fs::futimens(file, &timestamps(mtime)).map_err(errno(rel))?;
        Ok(())
    }

    /// Directory mtimes, deepest first, once nothing is created in them any more.
    fn finish(mut self) -> Result<(), UnpackError> {
        self.dir_times.sort_by_key(|(path, _)| std::cmp::Reverse(path.components().count()));
        for (rel, mtime) in &self.dir_times {
            let full = self.root.join(rel);
            if fs::symlink_metadata(&full).is_ok_and(|m| m.is_dir()) {
                set_mtime(&full, *mtime).map_err(errno(rel))?;
            }
        }
        Ok(())
    }
}

fn mkdir(path: &Path) -> io::Result<()> {
    fs::DirBuilder::new().mode(0o755).create(path)
}

fn uid_of(id: u64) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(u32::try_from(id).unwrap_or(u32::MAX))
}

fn gid_of(id: u64) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(u32::try_from(id).unwrap_or(u32::MAX))
}

fn chown(path: &Path, uid: u64, gid: u64) -> rustix::io::Result<()> {
    match rustix::fs::chownat(
        CWD,
        path,
        Some(uid_of(uid)),
        Some(gid_of(gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    ) {
        // Unprivileged: files stay the caller's own.
        Err(rustix::io::Errno::PERM) if !rustix::process::geteuid().is_root() => Ok(()),
        other => other,
    }
}

fn timestamps(mtime: u64) -> Timestamps {
    let time = Timespec { tv_sec: i64::try_from(mtime).unwrap_or(i64::MAX), tv_nsec: 0 };
    Timestamps { last_access: time, last_modification: time }
}

fn set_mtime(path: &Path, mtime: u64) -> rustix::io::Result<()> {
    rustix::fs::utimensat(CWD, path, &timestamps(mtime), AtFlags::SYMLINK_NOFOLLOW)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_with(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        build(&mut builder);
        builder.into_inner().unwrap()
    }

    fn header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_mtime(1_000_000);
        h
    }

    fn unpack(bytes: &[u8]) -> (tempfile::TempDir, Result<Unpacked, UnpackError>) {
        let dir = tempfile::tempdir().unwrap();
        let result = unpack_layer(bytes, dir.path());
        (dir, result)
    }

    #[test]
    fn refuses_paths_escaping_the_layer() {
        for name in ["../evil", "a/../../evil", "/etc/evil"] {
            let bytes = tar_with(|b| {
                let mut h = header(tar::EntryType::Regular, 1, 0o644);
                // set_path refuses `..`; write the name bytes as a hostile archive would.
                let gnu = h.as_gnu_mut().unwrap();
                gnu.name[..name.len()].copy_from_slice(name.as_bytes());
                h.set_cksum();
                b.append(&h, &b"x"[..]).unwrap();
            });
            let (_dir, result) = unpack(&bytes);
            assert!(matches!(result, Err(UnpackError::Escape { .. })), "{name}: {result:?}");
        }
        // Through a symlink of the layer.
        let bytes = tar_with(|b| {
            let mut link = header(tar::EntryType::Symlink, 0, 0o777);
            b.append_link(&mut link, "out", "/tmp").unwrap();
            let mut file = header(tar::EntryType::Regular, 1, 0o644);
            b.append_data(&mut file, "out/evil", &b"x"[..]).unwrap();
        });
        let (_dir, result) = unpack(&bytes);
        assert!(
            matches!(result, Err(UnpackError::Escape { why: "a path through a symlink", .. })),
            "{result:?}"
        );
        // A hardlink through a symlink.
        let bytes = tar_with(|b| {
            let mut link = header(tar::EntryType::Symlink, 0, 0o777);
            b.append_link(&mut link, "etc", "/etc").unwrap();
            let mut hard = header(tar::EntryType::Link, 0, 0o644);
            b.append_link(&mut hard, "passwd", "etc/passwd").unwrap();
        });
        let (_dir, result) = unpack(&bytes);
        assert!(matches!(result, Err(UnpackError::Escape { .. })), "{result:?}");
    }

    #[test]
    fn files_links_modes_and_the_diff_id() {
        let bytes = tar_with(|b| {
            let mut dir = header(tar::EntryType::Directory, 0, 0o750);
            b.append_data(&mut dir, "./bin/", io::empty()).unwrap();
            let mut file = header(tar::EntryType::Regular, 5, 0o4755);
            b.append_data(&mut file, "./bin/tool", &b"hello"[..]).unwrap();
            let mut hard = header(tar::EntryType::Link, 0, 0o755);
            b.append_link(&mut hard, "bin/tool2", "./bin/tool").unwrap();
            let mut sym = header(tar::EntryType::Symlink, 0, 0o777);
            b.append_link(&mut sym, "usr/bin/tool", "../../bin/tool").unwrap();
        });
        let (dir, result) = unpack(&bytes);
        let unpacked = result.unwrap();
        assert_eq!(unpacked.diff_id, crate::manifest::sha256_digest(&bytes));
        assert_eq!(unpacked.size, 5);
        let root = dir.path();
        use std::os::unix::fs::MetadataExt as _;
        let tool = fs::metadata(root.join("bin/tool")).unwrap();
        assert_eq!(tool.mode() & 0o7777, 0o4755);
        assert_eq!(tool.nlink(), 2);
        assert_eq!(tool.mtime(), 1_000_000);
        assert_eq!(fs::metadata(root.join("bin")).unwrap().mode() & 0o7777, 0o750);
        assert_eq!(fs::metadata(root.join("bin")).unwrap().mtime(), 1_000_000);
        assert_eq!(fs::read_link(root.join("usr/bin/tool")).unwrap(), Path::new("../../bin/tool"));
        assert_eq!(fs::read(root.join("bin/tool2")).unwrap(), b"hello");
    }

    #[test]
    fn pax_xattrs_are_set() {
        let record = |key: &str, value: &str| {
            // A PAX record: "<length> <key>=<value>\n", the length counting itself.
            let body = format!(" {key}={value}\n");
            let len = (1..).find(|n: &usize| *n == n.to_string().len() + body.len()).unwrap();
            format!("{len}{body}")
        };
        let pax = record("SCHILY.xattr.user.oka", "layer");
        let bytes = tar_with(|b| {
            let mut h = header(tar::EntryType::XHeader, pax.len() as u64, 0o644);
            h.set_path("PaxHeaders/f").unwrap();
            h.set_cksum();
            b.append(&h, pax.as_bytes()).unwrap();
            let mut file = header(tar::EntryType::Regular, 1, 0o644);
            b.append_data(&mut file, "f", &b"x"[..]).unwrap();
        });
        let (dir, result) = unpack(&bytes);
        result.unwrap();
        let mut value = [0u8; 16];
        match rustix::fs::lgetxattr(dir.path().join("f"), "user.oka", &mut value) {
            Ok(n) => assert_eq!(&value[..n], b"layer"),
            // A filesystem without user xattrs cannot show it; the unpack still succeeded.
            Err(e) => assert_eq!(e, rustix::io::Errno::NOTSUP, "{e}"),
        }
    }

    #[test]
    fn refuses_zstd_and_broken_archives() {
        let (_dir, result) = unpack(&[0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0]);
        assert!(matches!(result, Err(UnpackError::Zstd)));
        let mut bytes = tar_with(|b| {
            let mut file = header(tar::EntryType::Regular, 1000, 0o644);
            b.append_data(&mut file, "big", &[7u8; 1000][..]).unwrap();
        });
        bytes.truncate(700);
        let (_dir, result) = unpack(&bytes);
        assert!(matches!(result, Err(UnpackError::Read(_))), "{result:?}");
    }
}
