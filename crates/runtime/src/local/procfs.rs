//! Reading `/proc/<pid>/stat`: identifying a process across pid reuse.
//!
//! A pid alone names a process only while it lives; after it exits the number is reused. The
//! start time (field 22 of `/proc/<pid>/stat`, clock ticks since boot) does not repeat for one
//! pid within a boot, so `(pid, start time)` identifies a process for the life of the machine.

use std::fs;
use std::io;

/// The start time of `pid` in clock ticks since boot, `None` if there is no such process.
pub fn start_time(pid: i32) -> io::Result<Option<u64>> {
    let stat = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    Ok(parse_start_time(&stat))
}

/// The state letter of `pid` (`R`, `S`, `Z`, ...), `None` if there is no such process.
pub fn state(pid: i32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().next()?.chars().next()
}

/// The pid of the process tracing `pid` (`TracerPid` of `/proc/<pid>/status`; 0 when untraced),
/// `None` if there is no such process.
pub fn tracer(pid: i32) -> Option<i32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("TracerPid:")).and_then(|v| v.trim().parse().ok())
}

/// Field 22 of a `/proc/<pid>/stat` line. The command name (field 2) may contain spaces and
/// parentheses, so fields are counted after the last `)`.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // After ')' come fields 3, 4, ...; field 22 is the 20th of them.
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Whether `pid` is alive (not a zombie) and started at `start`.
pub fn is_same_process(pid: i32, start: u64) -> bool {
    matches!(start_time(pid), Ok(Some(s)) if s == start) && state(pid) != Some('Z')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_survives_odd_command_names() {
        let line =
            "1234 (a b) c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(line), Some(987654));
    }

    #[test]
    fn our_own_process_has_a_start_time() {
        let me = std::process::id() as i32;
        let start = start_time(me).unwrap().unwrap();
        assert!(is_same_process(me, start));
        assert!(!is_same_process(me, start + 1));
        assert_eq!(tracer(me), Some(0));
    }
}
