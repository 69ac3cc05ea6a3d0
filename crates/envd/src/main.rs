//! The `oka-envd` binary: the envd-compatible daemon as a plain process (or a sidecar), or, with
//! `--init`, as PID 1 of a local sandbox (see [`oka_envd::pid1`]).

use oka_envd::cli::{self, Args, Parsed};
use std::net::SocketAddr;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

fn main() -> std::process::ExitCode {
    one_malloc_arena();
    detect_cpu_features();
    let Some(words) = std::env::args_os().skip(1).map(|a| a.into_string().ok()).collect() else {
        eprintln!("error: an argument is not valid UTF-8");
        return std::process::ExitCode::from(2);
    };
    let args = match cli::parse::<Vec<String>, _>(words, |name| std::env::var(name).ok()) {
        Ok(Parsed::Run(args)) => args,
        Ok(Parsed::Help) => {
            print!("{}", cli::HELP);
            return std::process::ExitCode::SUCCESS;
        }
        Ok(Parsed::Version) => {
            println!("oka-envd {}", env!("CARGO_PKG_VERSION"));
            return std::process::ExitCode::SUCCESS;
        }
        Ok(Parsed::Install(path)) => {
            return match install(&path) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("oka-envd: cannot install to {}: {e}", path.display());
                    std::process::ExitCode::FAILURE
                }
            };
        }
        Err(e) => {
            eprintln!("error: {e}\n\nFor more information, try '--help'.");
            return std::process::ExitCode::from(2);
        }
    };
    // In init mode stderr is the sandbox's output as the runtime sees it: only warnings.
    let default_filter = if args.init { Level::WARN } else { Level::INFO };
    // `Targets` (`warn`, `oka_envd=debug,hyper=info`) rather than `EnvFilter`: the same syntax
    // for what the daemon needs, without the regex engine `EnvFilter` links in (~0.3 MB of code).
    let filter = std::env::var("OKA_LOG")
        .ok()
        .and_then(|v| v.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(default_filter));
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(filter)
        .init();
    match run(args) {
        Ok(code) => oka_envd::pid1::exit(code),
        Err(e) => {
            eprintln!("oka-envd: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs now, at start-up, the CPU feature detection that the request parser (httparse's SIMD
/// paths) would run on the first request. In a virtual machine each `cpuid` it executes exits to
/// the hypervisor, and the first request a pool sandbox serves is the claim's `/init`, which
/// waits for it; a pool sandbox starts long before it is claimed. (The standard library caches
/// every feature at the first query.)
fn detect_cpu_features() {
    #[cfg(target_arch = "x86_64")]
    let _ = std::arch::is_x86_feature_detected!("sse4.2");
}

/// Keeps glibc's allocator to one arena. By default every thread that allocates (here: the
/// blocking threads of file transfers) gets an arena of its own, whose pages stay resident after
/// the thread is gone; the daemon allocates little, so sharing one costs nothing measurable.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it is called before any thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Copies this executable to `path` (through a temporary file beside it, then a rename, so a
/// reader never sees half a binary), mode 755.
fn install(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let exe = std::env::current_exe()?;
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    std::fs::copy(&exe, &partial)?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&partial, path)
}

/// Goes on in the background: the parent exits with 0 at once; the child leads a session of
/// its own with its standard streams on the container's (PID 1's) output when it can open
/// them, else `/dev/null`, so the caller (a `postStart` exec, which waits for its streams to
/// close) returns. Called while the process has one thread.
fn detach() -> std::io::Result<()> {
    // SAFETY: the process is single-threaded here (no runtime exists yet), so fork is safe.
    match unsafe { libc::fork() } {
        -1 => return Err(std::io::Error::last_os_error()),
        0 => {}
        _ => std::process::exit(0),
    }
    // SAFETY: setsid has no memory-safety preconditions.
    unsafe { libc::setsid() };
    let open =
        |path: &str, write: bool| std::fs::OpenOptions::new().read(!write).write(write).open(path);
    let null_in = open("/dev/null", false)?;
    let out = open("/proc/1/fd/1", true).or_else(|_| open("/dev/null", true))?;
    let err = open("/proc/1/fd/2", true).or_else(|_| open("/dev/null", true))?;
    for (file, fd) in [(&null_in, 0), (&out, 1), (&err, 2)] {
        use std::os::fd::AsRawFd as _;
        // SAFETY: both descriptors are valid; dup2 replaces the standard stream.
        if unsafe { libc::dup2(file.as_raw_fd(), fd) } == -1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn run(args: Args) -> Result<i32, Box<dyn std::error::Error>> {
    // Descriptors handed over by the init are taken first, before anything can be started that
    // would inherit them.
    let detached = if args.detach {
        // Bound before the parent returns, so a `postStart` hook that returned means envd's port
        // is open.
        let listener = std::net::TcpListener::bind(SocketAddr::new(args.addr, args.port))?;
        detach()?;
        Some(listener)
    } else {
        None
    };
    let listener = match args.listen_fd {
        // SAFETY: the descriptor was inherited across exec for us; nothing else owns it.
        Some(fd) => Some(std::net::TcpListener::from(unsafe {
            oka_envd::pid1::take_fd("listening socket", fd)?
        })),
        None => detached,
    };
    let command = match args.handed_over {
        // SAFETY: as above.
        Some(c) => Some(unsafe { oka_envd::pid1::adopt_command(c.pid, c.stdout, c.stderr)? }),
        None => None,
    };
    if args.init {
        oka_envd::pid1::block_handled()?;
        oka_envd::pid1::adopt()?;
    }
    let command = match command {
        None if !args.command.is_empty() => Some(oka_envd::pid1::spawn_command(&args.command)?),
        c => c,
    };
    // One runtime thread; file work runs on blocking threads, which end after a short idle time
    // so an idle daemon is one thread again soon after a transfer (tokio's default keeps them 10 s).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_keep_alive(std::time::Duration::from_secs(2))
        .build()?;
    let config = oka_envd::Config {
        default_user: args.user,
        passwd: args.passwd,
        sandbox_id: args.sandbox_id,
        template_id: args.template_id,
        // As the sandbox's init, its environment is the container's (the sandbox init passes
        // it on); per-user variables are set for each process.
        container_env: if args.init {
            std::env::vars()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "HOME" | "USER" | "LOGNAME" | "PWD" | "SHLVL" | "_")
                })
                .collect()
        } else {
            std::collections::BTreeMap::new()
        },
        default_workdir: args.workdir,
        ..Default::default()
    };
    let addr = SocketAddr::new(args.addr, args.port);
    let init = args.init;
    rt.block_on(async move {
        let listener = match listener {
            Some(l) => {
                l.set_nonblocking(true)?;
                tokio::net::TcpListener::from_std(l)?
            }
            None => tokio::net::TcpListener::bind(addr).await?,
        };
        let local = listener.local_addr()?;
        tracing::info!(addr = %local, version = oka_envd::ENVD_VERSION, init, "oka-envd listening");
        let state = oka_envd::AppState::new(config);
        if init {
            let server = oka_envd::serve(listener, state.clone(), std::future::pending());
            let server = tokio::spawn(async move {
                if let Err(e) = server.await {
                    tracing::error!(error = %e, "serving stopped");
                }
            });
            let code = oka_envd::pid1::supervise(state, command).await?;
            server.abort();
            return Ok(code);
        }
        let shutdown = async {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => return std::future::pending().await,
                };
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
        };
        oka_envd::serve(listener, state, shutdown).await?;
        Ok(0)
    })
}
