//! A SandboxClaim of 100 replicas from a stocked pool: the time from `kubectl create` of the
//! claim to its `Completed`, against a real `oka serve` with real sandboxes.
//!
//! Each run creates a claim of `OKA_BENCH_REPLICAS` (default 100) from the `base` pool,
//! stocked with `OKA_BENCH_POOL` (default 110) sandboxes, with `createOnNoStock: false` (so the
//! figure is the stocked path: claims through the manager's claim engine and each sandbox's
//! `/init`, in batches of at most 50 started 5 at a time and doubling), and waits with
//! `kubectl wait --for=jsonpath={.status.phase}=Completed` (a watch, so the wait ends with the
//! status write). Then it deletes the claimed sandboxes and waits for the pool to restock (every
//! member Ready: the SandboxSet's `availableReplicas`).
//! `OKA_BENCH_RUNS` (default 10) runs; p50 and p99 are printed, with kubectl's own share (two
//! process starts and their requests, measured on a ConfigMap the same way) beside them.
//!
//! Run with `cargo bench -p oka --bench claim` as root (real sandboxes) with kubectl installed;
//! otherwise it prints SKIPPED. `oka-envd` must be built beside `oka`
//! (`cargo build --release -p oka-envd`).

#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::print_stderr)]

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Serve, env_usize, fmt, oka, percentile};

fn kubectl_binary() -> String {
    std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_owned())
}

/// Runs kubectl against `serve` with `args` and `stdin`; panics with its stderr on failure.
fn kubectl(serve: &Serve, args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new(kubectl_binary())
        .arg("--kubeconfig")
        .arg(serve.state.path().join("kubeconfig"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        serve.log()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until the `base` pool reports `pool` available sandboxes (each Ready, so each claim
/// of the run finds stock at once).
fn wait_available(serve: &Serve, pool: usize) {
    let deadline = Instant::now() + Duration::from_secs(300);
    let jsonpath = "jsonpath={.status.availableReplicas}";
    while kubectl(serve, &["get", "sbs", "base", "-o", jsonpath], None).trim() != pool.to_string() {
        assert!(Instant::now() < deadline, "the pool did not restock:\n{}", serve.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs us without it: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED claim bench: real sandboxes need root");
        return;
    }
    if Command::new(kubectl_binary()).args(["version", "--client"]).output().is_err() {
        println!("SKIPPED claim bench: no kubectl");
        return;
    }
    let envd = Path::new(&oka()).with_file_name("oka-envd");
    if !envd.exists() {
        eprintln!(
            "{} is missing: build it first with `cargo build --release -p oka-envd`",
            envd.display()
        );
        std::process::exit(1);
    }
    let replicas = env_usize("OKA_BENCH_REPLICAS", 100);
    let pool = env_usize("OKA_BENCH_POOL", 110).max(replicas);
    let runs = env_usize("OKA_BENCH_RUNS", 10);

    let serve = Serve::start(pool, &envd);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !serve.state.path().join("kubeconfig").exists() {
        assert!(Instant::now() < deadline, "no Kubernetes API:\n{}", serve.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let fill = serve.wait_stocked(pool, Duration::from_secs(300));
    wait_available(&serve, pool);
    println!("pool of {pool} filled in {:.1} s", fill.as_secs_f64());

    let mut overhead = Vec::new();
    for run in 0..runs {
        let name = format!("kubectl-share-{run}");
        let config_map =
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  a: b\n");
        let started = Instant::now();
        kubectl(&serve, &["create", "-f", "-"], Some(&config_map));
        let object = format!("configmap/{name}");
        kubectl(&serve, &["wait", "--for=jsonpath={.data.a}=b", &object, "--timeout=60s"], None);
        overhead.push(started.elapsed());
    }

    let mut samples = Vec::new();
    for run in 0..runs {
        let name = format!("bench-{run}");
        let claim = format!(
            "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxClaim\nmetadata:\n  name: {name}\n\
             spec:\n  templateName: base\n  replicas: {replicas}\n  createOnNoStock: false\n\
             \x20 claimTimeout: 5m\n  envVars:\n    BENCH: \"1\"\n"
        );
        let started = Instant::now();
        kubectl(&serve, &["create", "-f", "-"], Some(&claim));
        let object = format!("sandboxclaim/{name}");
        let wait = ["wait", "--for=jsonpath={.status.phase}=Completed", &object, "--timeout=300s"];
        kubectl(&serve, &wait, None);
        let took = started.elapsed();
        let claimed = kubectl(
            &serve,
            &["get", "sbc", &name, "-o", "jsonpath={.status.claimedReplicas}"],
            None,
        );
        assert_eq!(claimed.trim(), replicas.to_string(), "run {run} claimed {claimed}");
        println!("run {run}: {} to Completed", fmt(took));
        samples.push(took);
        let selector = format!("agents.kruise.io/claim-name={name}");
        kubectl(&serve, &["delete", "sbx", "-l", &selector, "--wait=false"], None);
        kubectl(&serve, &["delete", "sbc", &name], None);
        serve.wait_stocked(pool, Duration::from_secs(300));
        wait_available(&serve, pool);
    }

    println!(
        "\n## A SandboxClaim of {replicas} from a stocked pool of {pool}: create to Completed\n"
    );
    println!("| what | runs | p50 | p99 | max |");
    println!("|---|---|---|---|---|");
    let row = |what: &str, s: &[Duration]| {
        println!(
            "| {what} | {} | {} | {} | {} |",
            s.len(),
            fmt(percentile(s, 50.0)),
            fmt(percentile(s, 99.0)),
            fmt(s.iter().max().copied().unwrap_or_default())
        );
    };
    row(&format!("claim of {replicas}, kubectl create → Completed"), &samples);
    row("kubectl's share (create + wait of a ConfigMap)", &overhead);
}
