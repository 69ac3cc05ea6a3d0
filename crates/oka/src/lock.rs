//! One `oka serve` per state directory.
//!
//! The instance holds an exclusive `flock(2)` on `<state dir>/oka.lock` for its whole life and
//! writes its pid there. The kernel drops the lock when the process dies, even by `kill -9`,
//! so a stale lock file never blocks a restart. A child the instance forked shares the lock
//! until it executes its program; so when the recorded holder is dead, the lock is waited for
//! (up to [`DEAD_HOLDER_WAIT`]) instead of refused: a restart right after a `kill -9` must not
//! fail because such a child had not executed yet.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a lock whose recorded holder is dead is waited for before it is refused.
pub const DEAD_HOLDER_WAIT: Duration = Duration::from_secs(10);

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
        let deadline = Instant::now() + DEAD_HOLDER_WAIT;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) => {
                    let mut text = String::new();
                    file.seek(SeekFrom::Start(0)).map_err(io)?;
                    let holder: Option<u32> =
                        file.read_to_string(&mut text).ok().and_then(|_| text.trim().parse().ok());
                    if holder.is_some_and(alive) || Instant::now() >= deadline {
                        return Err(LockError::Held { dir: dir.to_owned(), holder });
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(TryLockError::Error(e)) => return Err(io(e)),
            }
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(InstanceLock { _file: file })
    }
}

/// Whether process `pid` exists (a zombie counts as dead: it holds no files).
fn alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else {
        return false;
    };
    if rustix::process::test_kill_process(pid).is_err() {
        return false;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .is_none_or(|zombie| !zombie)
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
    fn a_lock_left_by_a_dead_holder_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let held = InstanceLock::acquire(dir.path()).unwrap();
        // As after a `kill -9`: the recorded holder is gone, a child it forked still shares
        // the lock for a moment.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        std::fs::write(dir.path().join("oka.lock"), format!("{dead}\n")).unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let t0 = Instant::now();
        InstanceLock::acquire(dir.path()).unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(250), "taken while still held");
        release.join().unwrap();
    }

    #[test]
    fn lock_is_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        drop(InstanceLock::acquire(dir.path()).unwrap());
        InstanceLock::acquire(dir.path()).unwrap();
    }
}
