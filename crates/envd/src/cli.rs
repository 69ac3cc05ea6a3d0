//! The daemon's command line, parsed by hand.
//!
//! A dozen flags do not need an argument-parsing library, and the daemon idles in every sandbox:
//! clap's builder was the largest crate in its code (~0.3 MB of the ~2.3 MB it maps), and parsing
//! touches most of it, so it stayed resident for the daemon's whole life. This parser keeps the
//! syntax clap gave it: `--flag value` and `--flag=value`, environment fallbacks, `--` before the
//! init command, `--help` and `--version`, and a usage error (exit status 2) for anything else.
//!
//! [`parse`] is pure (arguments and environment in, [`Parsed`] out): the binary does the effects.

use std::net::IpAddr;
use std::path::PathBuf;

/// What the daemon was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// Run with these arguments.
    Run(Args),
    /// Print [`HELP`] and exit.
    Help,
    /// Print the version and exit.
    Version,
    /// Copy this executable to the path and exit (`--install PATH`): how a Pod's init container
    /// of a `FROM scratch` image, which has no `cp`, puts envd into a shared volume.
    Install(PathBuf),
}

/// The daemon's arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// Address to listen on (`--addr`, `$OKA_ENVD_ADDR`, default `0.0.0.0`).
    pub addr: IpAddr,
    /// Port to listen on (`--port`, `$OKA_ENVD_PORT`, default [`crate::DEFAULT_PORT`]).
    pub port: u16,
    /// An inherited, listening TCP socket to serve on instead of binding (`--listen-fd`).
    pub listen_fd: Option<i32>,
    /// Init mode (`--init`): also the duties of a sandbox's PID 1.
    pub init: bool,
    /// Daemon mode (`--detach`): bind the port, then go on in the background and exit at once
    /// (a container's `postStart` hook starts envd beside the image's entrypoint this way).
    pub detach: bool,
    /// Init mode: the command handed over, already running as our child (`--command-pid`,
    /// `--command-stdout`, `--command-stderr`, all three or none).
    pub handed_over: Option<HandedOver>,
    /// Init mode: the command to start and supervise (after `--`).
    pub command: Vec<String>,
    /// Default user of processes and file operations (`--user`, default `user`).
    pub user: String,
    /// Sandbox id, exported to processes as `E2B_SANDBOX_ID` (`--sandbox-id`, `$E2B_SANDBOX_ID`).
    pub sandbox_id: Option<String>,
    /// Template id, exported as `E2B_TEMPLATE_ID` (`--template-id`, `$E2B_TEMPLATE_ID`).
    pub template_id: Option<String>,
    /// The passwd file users are looked up in (`--passwd`, default `/etc/passwd`).
    pub passwd: PathBuf,
    /// Default working directory of processes and relative paths until `/init` sets one
    /// (`--workdir`; none: the user's home).
    pub workdir: Option<String>,
}

/// A running command handed over by the sandbox init: its pid and the read ends of its pipes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandedOver {
    /// Its pid (our child).
    pub pid: i32,
    /// Read end of its stdout pipe (inherited descriptor).
    pub stdout: i32,
    /// Read end of its stderr pipe (inherited descriptor).
    pub stderr: i32,
}

/// A command line that cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    /// A flag nobody knows.
    #[error("unknown argument '{0}'")]
    Unknown(String),
    /// A flag that takes a value came last.
    #[error("a value is required for '--{0}'")]
    MissingValue(&'static str),
    /// A value that does not parse.
    #[error("invalid value '{value}' for {what}: {reason}")]
    Invalid {
        /// The flag (`'--port'`) or the environment variable (`$OKA_ENVD_PORT`).
        what: String,
        /// The value given.
        value: String,
        /// Why it is invalid.
        reason: String,
    },
    /// A value given to a flag that takes none.
    #[error("'--{0}' takes no value")]
    UnexpectedValue(&'static str),
    /// Flags that only make sense together, or not together.
    #[error("{0}")]
    Conflict(&'static str),
}

/// The `--help` text.
pub const HELP: &str = "\
An envd-compatible in-sandbox daemon (the E2B SDKs' process and filesystem API).

Usage: oka-envd [OPTIONS] [-- <COMMAND>...]

Options:
      --addr <ADDR>            Address to listen on [env: OKA_ENVD_ADDR] [default: 0.0.0.0]
      --port <PORT>            Port to listen on [env: OKA_ENVD_PORT] [default: 49983]
      --listen-fd <FD>         Serve on this inherited, listening TCP socket instead
      --detach                 Bind the port, then run in the background (the command returns)
      --install <PATH>         Copy this executable to PATH (mode 755) and exit
      --init                   Init mode: also do the duties of a sandbox's PID 1 (reap orphans,
                               forward signals to the command, exit with its status)
      --command-pid <PID>      Init mode: pid of the already running command (our child)
      --command-stdout <FD>    Init mode: read end of the command's stdout pipe
      --command-stderr <FD>    Init mode: read end of the command's stderr pipe
      --user <USER>            Default user of processes and files (root if it does not exist)
                               [default: user]
      --sandbox-id <ID>        Exported to processes as E2B_SANDBOX_ID [env: E2B_SANDBOX_ID]
      --template-id <ID>       Exported to processes as E2B_TEMPLATE_ID [env: E2B_TEMPLATE_ID]
      --workdir <DIR>          Default working directory until /init sets one [default: home]
  -h, --help                   Print help
  -V, --version                Print version

In init mode, the words after `--` are the command to start and supervise.
";

/// Parses the arguments after the program name; `env` looks environment variables up.
pub fn parse<I, E>(args: I, env: E) -> Result<Parsed, UsageError>
where
    I: IntoIterator<Item = String>,
    E: Fn(&str) -> Option<String>,
{
    let mut addr = None;
    let mut port = None;
    let mut listen_fd = None;
    let mut init = false;
    let mut detach = false;
    let (mut pid, mut stdout, mut stderr) = (None, None, None);
    let mut command = Vec::new();
    let mut user = None;
    let mut sandbox_id = None;
    let mut template_id = None;
    let mut passwd = None;
    let mut workdir = None;

    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            command.extend(args.by_ref());
            break;
        }
        match arg.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help),
            "-V" | "--version" => return Ok(Parsed::Version),
            _ => {}
        }
        let Some(long) = arg.strip_prefix("--") else {
            return Err(UsageError::Unknown(arg));
        };
        let (name, inline) = match long.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (long, None),
        };
        let Some(flag) = FLAGS.iter().copied().find(|f| *f == name) else {
            return Err(UsageError::Unknown(arg));
        };
        if flag == "init" || flag == "detach" {
            if inline.is_some() {
                return Err(UsageError::UnexpectedValue(flag));
            }
            if flag == "init" {
                init = true;
            } else {
                detach = true;
            }
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => args.next().ok_or(UsageError::MissingValue(flag))?,
        };
        match flag {
            "addr" => addr = Some(value_of(flag, value)?),
            "port" => port = Some(value_of(flag, value)?),
            "listen-fd" => listen_fd = Some(fd_of(flag, value)?),
            "command-pid" => pid = Some(value_of::<i32>(flag, value)?),
            "command-stdout" => stdout = Some(fd_of(flag, value)?),
            "command-stderr" => stderr = Some(fd_of(flag, value)?),
            "user" => user = Some(value),
            "sandbox-id" => sandbox_id = Some(value),
            "template-id" => template_id = Some(value),
            "passwd" => passwd = Some(PathBuf::from(value)),
            "workdir" => workdir = Some(value).filter(|w| !w.is_empty()),
            "install" => return Ok(Parsed::Install(PathBuf::from(value))),
            _ => return Err(UsageError::Unknown(arg)),
        }
    }

    let addr = match addr.or(env_value("OKA_ENVD_ADDR", &env)?) {
        Some(a) => a,
        None => IpAddr::from([0, 0, 0, 0]),
    };
    let port = port.or(env_value("OKA_ENVD_PORT", &env)?).unwrap_or(crate::DEFAULT_PORT);
    let handed_over = match (pid, stdout, stderr) {
        (None, None, None) => None,
        (Some(pid), Some(stdout), Some(stderr)) => Some(HandedOver { pid, stdout, stderr }),
        _ => {
            return Err(UsageError::Conflict(
                "'--command-pid', '--command-stdout' and '--command-stderr' go together",
            ));
        }
    };
    if !init && (handed_over.is_some() || !command.is_empty()) {
        return Err(UsageError::Conflict("a command to supervise requires '--init'"));
    }
    if detach && (init || listen_fd.is_some()) {
        return Err(UsageError::Conflict(
            "'--detach' cannot be used with '--init' or '--listen-fd'",
        ));
    }
    if handed_over.is_some() && !command.is_empty() {
        return Err(UsageError::Conflict(
            "'--command-pid' and a command after '--' cannot be used together",
        ));
    }
    Ok(Parsed::Run(Args {
        addr,
        port,
        listen_fd,
        init,
        detach,
        handed_over,
        command,
        user: user.unwrap_or_else(|| "user".to_owned()),
        sandbox_id: sandbox_id.or_else(|| env("E2B_SANDBOX_ID")),
        template_id: template_id.or_else(|| env("E2B_TEMPLATE_ID")),
        passwd: passwd.unwrap_or_else(|| PathBuf::from("/etc/passwd")),
        workdir,
    }))
}

/// Every long flag.
const FLAGS: &[&str] = &[
    "addr",
    "port",
    "listen-fd",
    "init",
    "detach",
    "install",
    "command-pid",
    "command-stdout",
    "command-stderr",
    "user",
    "sandbox-id",
    "template-id",
    "passwd",
    "workdir",
];

/// `value` parsed for the flag `flag`.
fn value_of<T>(flag: &str, value: String) -> Result<T, UsageError>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    parsed(format!("'--{flag}'"), value)
}

fn parsed<T>(what: String, value: String) -> Result<T, UsageError>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    value.parse().map_err(|e: T::Err| UsageError::Invalid { what, reason: e.to_string(), value })
}

/// A descriptor number: not negative.
fn fd_of(flag: &str, value: String) -> Result<i32, UsageError> {
    match value_of::<i32>(flag, value.clone())? {
        fd if fd >= 0 => Ok(fd),
        _ => Err(UsageError::Invalid {
            what: format!("'--{flag}'"),
            value,
            reason: "not a descriptor".into(),
        }),
    }
}

/// An environment variable's value, parsed; an empty one counts as unset.
fn env_value<T, E>(name: &'static str, env: &E) -> Result<Option<T>, UsageError>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
    E: Fn(&str) -> Option<String>,
{
    match env(name).filter(|v| !v.is_empty()) {
        Some(v) => parsed(format!("${name}"), v).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Parsed, UsageError> {
        let env: Vec<(String, String)> =
            env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        parse(args.iter().map(|s| (*s).to_owned()), |k| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
    }

    fn args(a: &[&str], env: &[(&str, &str)]) -> Args {
        match run(a, env) {
            Ok(Parsed::Run(args)) => args,
            other => panic!("{a:?}: {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let a = args(&[], &[]);
        assert_eq!(a.addr, IpAddr::from([0, 0, 0, 0]));
        assert_eq!(a.port, 49983);
        assert_eq!(a.user, "user");
        assert_eq!(a.passwd, PathBuf::from("/etc/passwd"));
        assert!(!a.init && a.listen_fd.is_none() && a.handed_over.is_none());
        assert!(a.command.is_empty() && a.sandbox_id.is_none() && a.template_id.is_none());
        assert_eq!(a.workdir, None);
    }

    #[test]
    fn the_default_workdir_is_given_by_the_sandbox_init() {
        assert_eq!(args(&["--workdir=/srv/app"], &[]).workdir.as_deref(), Some("/srv/app"));
        assert_eq!(args(&["--workdir", ""], &[]).workdir, None);
    }

    #[test]
    fn values_come_separate_or_after_an_equals_sign_and_flags_win_over_the_environment() {
        let env = [("OKA_ENVD_PORT", "1"), ("OKA_ENVD_ADDR", "10.0.0.1"), ("E2B_SANDBOX_ID", "e")];
        let a =
            args(&["--port", "8080", "--addr=127.0.0.1", "--sandbox-id=s", "--user=root"], &env);
        assert_eq!((a.addr, a.port), (IpAddr::from([127, 0, 0, 1]), 8080));
        assert_eq!((a.sandbox_id.as_deref(), a.user.as_str()), (Some("s"), "root"));
        let a = args(&[], &env);
        assert_eq!((a.addr, a.port), (IpAddr::from([10, 0, 0, 1]), 1));
        assert_eq!(a.sandbox_id.as_deref(), Some("e"));
        // An empty variable is unset, as clap had it.
        assert_eq!(args(&[], &[("OKA_ENVD_PORT", "")]).port, 49983);
    }

    #[test]
    fn the_sandbox_inits_two_forms() {
        let a = args(
            &[
                "--init",
                "--listen-fd=3",
                "--command-pid=42",
                "--command-stdout=4",
                "--command-stderr",
                "5",
            ],
            &[],
        );
        assert!(a.init);
        assert_eq!(a.listen_fd, Some(3));
        assert_eq!(a.handed_over, Some(HandedOver { pid: 42, stdout: 4, stderr: 5 }));
        let a = args(&["--init", "--", "sleep", "--port", "1"], &[]);
        assert_eq!(a.command, ["sleep", "--port", "1"]);
        assert_eq!(a.port, 49983, "words after -- belong to the command");
    }

    #[test]
    fn bad_command_lines_are_usage_errors() {
        let err = |a: &[&str]| run(a, &[]).unwrap_err().to_string();
        assert_eq!(err(&["--nope"]), "unknown argument '--nope'");
        assert_eq!(err(&["serve"]), "unknown argument 'serve'");
        assert_eq!(err(&["--port"]), "a value is required for '--port'");
        assert_eq!(
            err(&["--port", "70000"]),
            "invalid value '70000' for '--port': number too large to fit in target type"
        );
        assert!(err(&["--addr", "x"]).starts_with("invalid value 'x' for '--addr'"));
        assert!(err(&["--listen-fd=-1"]).contains("not a descriptor"));
        assert_eq!(err(&["--init=yes"]), "'--init' takes no value");
        assert!(err(&["--init", "--command-pid=1"]).contains("go together"));
        assert!(err(&["--", "sleep"]).contains("requires '--init'"));
        assert!(err(&["--detach", "--init"]).contains("'--detach'"));
        assert!(args(&["--detach"], &[]).detach);
        assert_eq!(
            run(&["--install", "/.oka/bin/oka-envd"], &[]),
            Ok(Parsed::Install(PathBuf::from("/.oka/bin/oka-envd")))
        );
        assert!(
            err(&[
                "--init",
                "--command-pid=1",
                "--command-stdout=4",
                "--command-stderr=5",
                "--",
                "x"
            ])
            .contains("cannot be used together")
        );
        assert!(run(&["--port", "x"], &[("OKA_ENVD_PORT", "1")]).is_err());
        assert!(
            run(&[], &[("OKA_ENVD_PORT", "x")])
                .unwrap_err()
                .to_string()
                .starts_with("invalid value 'x' for $OKA_ENVD_PORT")
        );
    }

    #[test]
    fn help_and_version() {
        assert_eq!(run(&["--help"], &[]), Ok(Parsed::Help));
        assert_eq!(run(&["--port=1", "-h"], &[]), Ok(Parsed::Help));
        assert_eq!(run(&["-V"], &[]), Ok(Parsed::Version));
        for flag in FLAGS {
            assert!(
                HELP.contains(&format!("--{flag}")) || *flag == "passwd",
                "{flag} undocumented"
            );
        }
    }
}
