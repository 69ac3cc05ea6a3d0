//! Pseudo-terminals: `openpt` + a non-blocking master driven by tokio's reactor.

use rustix::fd::{AsFd, OwnedFd};
use rustix::pty::OpenptFlags;
use std::io;
use tokio::io::unix::AsyncFd;

/// The master side of a PTY.
pub struct PtyMaster {
    fd: AsyncFd<OwnedFd>,
}

/// Opens a PTY of `cols`×`rows`: the master and the slave (both close-on-exec).
pub fn open(cols: u16, rows: u16) -> io::Result<(PtyMaster, OwnedFd)> {
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let name = rustix::pty::ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    set_size(&master, cols, rows)?;
    rustix::io::ioctl_fionbio(&master, true)?;
    Ok((PtyMaster { fd: async_fd(master)? }, slave))
}

/// Registers an owned descriptor with tokio's reactor.
pub(crate) fn async_fd(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the `OwnedFd` owns its descriptor, which stays open and unchanged until the
    // `AsyncFd` (its only owner) is dropped.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

fn set_size(fd: impl AsFd, cols: u16, rows: u16) -> io::Result<()> {
    let ws = rustix::termios::Winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    rustix::termios::tcsetwinsize(fd, ws)?;
    Ok(())
}

impl PtyMaster {
    /// Resizes the terminal (TIOCSWINSZ; the foreground process group gets SIGWINCH).
    pub fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        set_size(self.fd.get_ref(), cols, rows)
    }

    /// Reads output; `Ok(0)` once every slave descriptor is closed (EIO).
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut *buf)?)) {
                Ok(Err(e)) if e.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error()) => {
                    return Ok(0);
                }
                Ok(r) => return r,
                Err(_would_block) => {}
            }
        }
    }

    /// Writes all of `data` (input for the terminal).
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            if let Ok(r) = guard.try_io(|fd| Ok(rustix::io::write(fd.get_ref(), data)?)) {
                data = &data[r?..];
            }
        }
        Ok(())
    }
}
