//! Benchmarks of the local runtime: create → ready, pause, resume, delete.
//!
//! `cargo bench -p oka-runtime --bench runtime` (as root). Prints p50 / p99 / max over `N`
//! samples of each operation:
//! - create → ready: `ensure` of a new sandbox running `sleep`, until the init reports the command
//!   executed (namespaces, overlay root, cgroups, pivot, exec);
//! - pause / resume: freezer round trips on a sandbox running a shell loop;
//! - delete: kill, reap, remove cgroups and the writable layer.
//!
//! Aims (issue 3): create → ready under 20 ms p50, pause and resume under 5 ms.
//!
//! Measured on the 2-vCPU dev VM (kernel 6.18, hybrid cgroups, state on ext4), release build, a
//! quiet machine (another engineer's build running doubles the create figures):
//!
//! | operation | p50 | p99 | max |
//! |---|---|---|---|
//! | create → ready | 10.5 ms | 24.0 ms | 24.0 ms |
//! | pause | 0.29 ms | 1.5 ms | 3.9 ms |
//! | resume | 0.16 ms | 0.29 ms | 1.2 ms |
//! | delete | 5.3 ms | 9.0 ms | 12.3 ms |

use std::time::{Duration, Instant};

use oka_runtime::local::{LocalConfig, LocalRuntime};
use oka_runtime::{Runtime, SandboxId, SandboxSpec};

const N: usize = 100;

fn main() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED runtime bench: the local runtime needs root");
        return;
    }
    let rt =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("tokio runtime: {e}");
                std::process::exit(1);
            }
        };
    if let Err(e) = rt.block_on(run()) {
        eprintln!("bench failed: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::Builder::new().prefix("oka-bench-").tempdir()?;
    let mut config = LocalConfig::new(dir.path().join("state"), env!("CARGO_BIN_EXE_oka-init"));
    config.cgroup_name = "oka-bench".into();
    let runtime = LocalRuntime::open(config).await?;

    // Warm-up: page cache, blocking-pool threads.
    for i in 0..5 {
        let spec = spec(&format!("warm-{i}"), "exec sleep 1000")?;
        runtime.ensure(&spec).await?;
        runtime.delete(&spec.id).await?;
    }

    let mut create = Vec::with_capacity(N);
    let mut delete = Vec::with_capacity(N);
    for i in 0..N {
        let spec = spec(&format!("bench-{i}"), "exec sleep 1000")?;
        let t = Instant::now();
        runtime.ensure(&spec).await?;
        create.push(t.elapsed());
        let t = Instant::now();
        runtime.delete(&spec.id).await?;
        delete.push(t.elapsed());
    }

    let spec = spec("pauser", "while :; do i=$((i+1)); sleep 0.001; done")?;
    runtime.ensure(&spec).await?;
    let mut pause = Vec::with_capacity(N);
    let mut resume = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        runtime.pause(&spec.id).await?;
        pause.push(t.elapsed());
        let t = Instant::now();
        runtime.resume(&spec.id).await?;
        resume.push(t.elapsed());
    }
    runtime.delete(&spec.id).await?;

    println!("local runtime, n = {N} each (p50 / p99 / max)");
    report("create -> ready", &mut create);
    report("pause", &mut pause);
    report("resume", &mut resume);
    report("delete", &mut delete);
    Ok(())
}

fn spec(id: &str, script: &str) -> Result<SandboxSpec, oka_runtime::SpecError> {
    Ok(SandboxSpec::new(SandboxId::new(id)?, vec!["/bin/sh".into(), "-c".into(), script.into()]))
}

fn report(name: &str, samples: &mut [Duration]) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name:>16}: {:8.3} ms / {:8.3} ms / {:8.3} ms",
        ms(at(0.50)),
        ms(at(0.99)),
        ms(samples[samples.len() - 1])
    );
}
