//! The one thing the init reads of an ELF file: the dynamic loader it names (`PT_INTERP`).
//!
//! The init and the agent runtime daemon are executed from inside the sandbox's root, so a
//! dynamically linked build runs with that root's loader and C library. A root without them (an
//! Alpine or `scratch`-style image) makes `execve` fail with a bare `ENOENT` for a file that is
//! plainly there; [`missing_loader`] turns that into the reason and the remedy.

use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// `p_type` of the program header that names the loader.
const PT_INTERP: u32 = 3;
/// Bounds that no real executable comes near; anything past them is not parsed.
const MAX_PROGRAM_HEADERS: u16 = 256;
const MAX_INTERP_LEN: u64 = 4096;

/// The dynamic loader the 64-bit little-endian ELF executable at `path` names, or `None` for a
/// static executable, a script or anything else that is not such a file.
///
/// # Errors
///
/// Reading `path` failed.
pub fn interpreter(path: &Path) -> io::Result<Option<PathBuf>> {
    let file = std::fs::File::open(path)?;
    let mut header = [0u8; 64];
    if read_exact_at(&file, &mut header, 0)?.is_none() {
        return Ok(None);
    }
    // ELF magic, 64-bit class, little-endian data.
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Ok(None);
    }
    let (phoff, phentsize, phnum) =
        (u64_at(&header, 0x20), u16_at(&header, 0x36), u16_at(&header, 0x38));
    if phentsize < 56 || phnum > MAX_PROGRAM_HEADERS {
        return Ok(None);
    }
    for i in 0..u64::from(phnum) {
        let mut ph = [0u8; 56];
        let at = phoff.saturating_add(i * u64::from(phentsize));
        if read_exact_at(&file, &mut ph, at)?.is_none() {
            return Ok(None);
        }
        if u32_at(&ph, 0) != PT_INTERP {
            continue;
        }
        let (offset, size) = (u64_at(&ph, 0x08), u64_at(&ph, 0x20));
        if size == 0 || size > MAX_INTERP_LEN {
            return Ok(None);
        }
        let mut name = vec![0u8; usize::try_from(size).unwrap_or(0)];
        if read_exact_at(&file, &mut name, offset)?.is_none() {
            return Ok(None);
        }
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        name.truncate(end);
        return Ok(Some(PathBuf::from(<std::ffi::OsString as OsStringExt>::from_vec(name))));
    }
    Ok(None)
}

/// The little-endian integers at `at` of a header read whole (the callers' offsets are in bounds).
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(bytes)
}

/// Fills `buf` from `offset`; `None` when the file ends first.
fn read_exact_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> io::Result<Option<()>> {
    match file.read_exact_at(buf, offset) {
        Ok(()) => Ok(Some(())),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// Why the executable at `path` cannot run in the current root, when the reason is a dynamic
/// loader the root does not have: the message names it and the remedy. `None` when the
/// executable names no loader, the loader is there, or `path` cannot be read.
pub fn missing_loader(path: &Path) -> Option<String> {
    let loader = interpreter(path).ok()??;
    if loader.exists() {
        return None;
    }
    Some(format!(
        "{} is linked against the C library and needs the dynamic loader {}, which this sandbox's \
         root does not have: use a root with a C library compatible with the host's, or static \
         builds of oka-init and oka-envd (scripts/build-static.sh)",
        path.display(),
        loader.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_executable_names_its_loader_and_the_loader_is_there() {
        // The test binary itself: cargo links it dynamically.
        let exe = std::env::current_exe().unwrap();
        let loader = interpreter(&exe).unwrap().expect("a dynamically linked test binary");
        assert!(loader.is_absolute() && loader.exists(), "{loader:?}");
        assert_eq!(missing_loader(&exe), None);
    }

    #[test]
    fn scripts_short_files_and_other_formats_name_no_loader() {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in [
            ("script", b"#!/bin/sh\necho hi\n".to_vec()),
            ("empty", vec![]),
            ("magic only", b"\x7fELF".to_vec()),
            ("32-bit", [b"\x7fELF\x01\x01".as_slice(), &[0u8; 58]].concat()),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            assert_eq!(interpreter(&path).unwrap(), None, "{name}");
            assert_eq!(missing_loader(&path), None, "{name}");
        }
    }

    #[test]
    fn a_loader_the_root_lacks_is_named_with_the_remedy() {
        // The test binary with its loader's path rewritten to one that does not exist (same
        // length, so the headers stay valid).
        let exe = std::env::current_exe().unwrap();
        let loader = interpreter(&exe).unwrap().unwrap();
        let loader = loader.as_os_str().as_encoded_bytes();
        let mut bytes = std::fs::read(&exe).unwrap();
        let at = bytes.windows(loader.len()).position(|w| w == loader).unwrap();
        let missing = b"/nonexistent-loader-of-oka-tests";
        let replacement: Vec<u8> =
            missing.iter().copied().cycle().take(loader.len()).collect::<Vec<u8>>();
        bytes[at..at + loader.len()].copy_from_slice(&replacement);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("moved");
        std::fs::write(&path, bytes).unwrap();
        let why = missing_loader(&path).expect("the loader is missing");
        assert!(why.contains(std::str::from_utf8(&replacement).unwrap()), "{why}");
        assert!(why.contains("static builds of oka-init and oka-envd"), "{why}");
    }
}
