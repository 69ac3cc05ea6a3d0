//! One `oka serve` per state directory.
//!
//! The instance holds an exclusive `flock(2)` on `<state dir>/oka.lock` for its whole life and
//! writes its pid there. The kernel drops the lock when the process dies, even by `kill -9`,
//! so a stale lock file never blocks a restart.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Why the state directory could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another live process holds the lock.
    #[error(
        "state directory {} is in use by another oka instance{}; stop it, or give this one another --state-dir",
        .dir.display(),
        .holder.map(|pid| format!(" (pid {pid})")).unwrap_or_default()
    )]
    Held {
        /// The state directory.
        dir: PathBuf,
        /// The pid recorded by the holder, when readable.
        holder: Option<u32>,
    },
    /// The directory or lock file could not be created or locked.
    #[error("cannot lock state directory {}: {source}", .dir.display())]
    Io {
        /// The state directory.
        dir: PathBuf,
        /// The underlying failure.
        #[source]
        source: std::io::Error,
    },
}

/// The held lock; dropping it releases the state directory.
#[derive(Debug)]
pub struct InstanceLock {
    _file: File,
}

impl InstanceLock {
    /// Creates `dir` if needed and takes its lock, failing at once if another process has it.
    pub fn acquire(dir: &Path) -> Result<InstanceLock, LockError> {
        let io = |source| LockError::Io { dir: dir.to_owned(), source };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join("oka.lock"))
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let holder =
                    file.read_to_string(&mut text).ok().and_then(|_| text.trim().parse().ok());
                return Err(LockError::Held { dir: dir.to_owned(), holder });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(InstanceLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_instance_is_refused_with_the_holders_pid() {
        let dir = tempfile::tempdir().unwrap();
        let _held = InstanceLock::acquire(dir.path()).unwrap();
        let err = InstanceLock::acquire(dir.path()).unwrap_err();
        match &err {
            LockError::Held { holder, .. } => assert_eq!(*holder, Some(std::process::id())),
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains("in use by another oka instance"), "{err}");
    }

    #[test]
    fn lock_is_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        drop(InstanceLock::acquire(dir.path()).unwrap());
        InstanceLock::acquire(dir.path()).unwrap();
    }
}
