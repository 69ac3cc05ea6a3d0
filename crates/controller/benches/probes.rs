//! The probe runner's CPU for 1,000 sandboxes probed every 10 s (aim: under 5 %
//! of one core).
//!
//! An embedded store holds `SANDBOXES` (default 1000) Running, Ready, claimed Sandboxes, each
//! with one probe every 10 s (`HANDLER=tcp`, the default: `tcpSocket`; `HANDLER=http`:
//! `httpGet`). A fake runtime's `connect` dials a loopback listener on another thread, which
//! accepts (and for HTTP answers `200`). The runner runs on a current-thread tokio runtime on
//! the main thread (its informers and writes too), so that thread's CPU time
//! (`/proc/thread-self/schedstat`) is the runner's whole cost, kernel time of its connects
//! included; the listener and the store's writer thread are not counted. After a warm-up of
//! 15 s (first attempts and their condition writes), the CPU of `SECONDS` (default 30) is
//! measured and printed as a percentage of one core, with the attempts served meanwhile.
//!
//! `cargo bench -p oka-controller --bench probes`
#![allow(clippy::unwrap_used, missing_docs)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{HTTPGetAction, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use oka_api::probes::SandboxProbe;
use oka_api::{Sandbox, SandboxPhase};
use oka_controller::plan::Clock;
use oka_controller::probe::{ProbeRunnerOptions, run_probe_runner};
use oka_runtime_api::{Operation, Runtime, RuntimeError, SandboxId, SandboxSpec, SandboxStatus};
use oka_store::Store;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use tokio::net::TcpStream;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A runtime whose only working verb is `connect`, to a loopback port.
struct LoopbackRuntime {
    port: u16,
}

fn unsupported(operation: Operation) -> RuntimeError {
    RuntimeError::Unsupported { operation, reason: "benchmark runtime".into() }
}

#[async_trait]
impl Runtime for LoopbackRuntime {
    async fn ensure(&self, _: &SandboxSpec) -> Result<SandboxStatus, RuntimeError> {
        Err(unsupported(Operation::Ensure))
    }
    async fn inspect(&self, id: &SandboxId) -> Result<SandboxStatus, RuntimeError> {
        Ok(SandboxStatus::gone(id.clone()))
    }
    async fn pause(&self, _: &SandboxId) -> Result<(), RuntimeError> {
        Err(unsupported(Operation::Pause))
    }
    async fn resume(&self, _: &SandboxId) -> Result<(), RuntimeError> {
        Err(unsupported(Operation::Resume))
    }
    async fn hibernate(&self, _: &SandboxId) -> Result<(), RuntimeError> {
        Err(unsupported(Operation::Hibernate))
    }
    async fn restore(&self, _: &SandboxId) -> Result<SandboxStatus, RuntimeError> {
        Err(unsupported(Operation::Restore))
    }
    async fn stop(&self, _: &SandboxId, _: Duration) -> Result<(), RuntimeError> {
        Err(unsupported(Operation::Stop))
    }
    async fn delete(&self, _: &SandboxId) -> Result<(), RuntimeError> {
        Ok(())
    }
    async fn list(&self) -> Result<Vec<SandboxStatus>, RuntimeError> {
        Ok(Vec::new())
    }
    async fn connect(&self, _: &SandboxId, _: u16) -> Result<TcpStream, RuntimeError> {
        TcpStream::connect(("127.0.0.1", self.port)).await.map_err(|e| RuntimeError::Unsupported {
            operation: Operation::Connect,
            reason: e.to_string(),
        })
    }
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    Duration::from_nanos(text.split_whitespace().next().unwrap().parse().unwrap())
}

fn main() {
    let sandboxes = env("SANDBOXES", 1000);
    let seconds = env("SECONDS", 30);
    let http = std::env::var("HANDLER").is_ok_and(|h| h == "http");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&served);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            counter.fetch_add(1, Ordering::Relaxed);
            if http {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
            }
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async move {
        let store = EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default())
            .unwrap();
        let probe = if http {
            SandboxProbe {
                name: "web".into(),
                http_get: Some(HTTPGetAction {
                    port: IntOrString::Int(8000),
                    ..HTTPGetAction::default()
                }),
                ..SandboxProbe::default()
            }
        } else {
            SandboxProbe {
                name: "port".into(),
                tcp_socket: Some(TCPSocketAction { port: IntOrString::Int(8000), host: None }),
                ..SandboxProbe::default()
            }
        };
        for i in 0..sandboxes {
            let mut sandbox = Sandbox::test()
                .name(&format!("sbx-{i}"))
                .claimed()
                .phase(SandboxPhase::Running)
                .ready()
                .build();
            sandbox.spec.probes = Some(vec![probe.clone()]);
            let status = sandbox.status.clone();
            let mut created = store.create("default", &sandbox).await.unwrap();
            created.status = status;
            store.update_status("default", &created).await.unwrap();
        }
        let clock = Clock::system();
        let runner = tokio::spawn(run_probe_runner(
            store.clone(),
            Arc::new(LoopbackRuntime { port }),
            None,
            None,
            clock,
            ProbeRunnerOptions::default(),
            std::future::pending(),
        ));
        tokio::time::sleep(Duration::from_secs(15)).await;
        let (cpu0, wall0, served0) = (thread_cpu(), Instant::now(), served.load(Ordering::Relaxed));
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let (cpu, wall) = (thread_cpu() - cpu0, wall0.elapsed());
        let attempts = served.load(Ordering::Relaxed) - served0;
        let share = cpu.as_secs_f64() / wall.as_secs_f64() * 100.0;
        let true_count = store
            .list::<Sandbox>(Some("default"), &Default::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|s| {
                        s.status.as_ref().and_then(|st| st.conditions.as_ref()).is_some_and(|c| {
                            c.iter().any(|c| c.type_.starts_with("probe.") && c.status == "True")
                        })
                    })
                    .count()
            })
            .unwrap_or(0);
        println!(
            "probe runner ({}): {sandboxes} sandboxes every 10 s: {attempts} attempts in {:.1} s \
             ({:.0}/s), runner thread CPU {:.3} s = {share:.2} % of one core; {true_count} \
             conditions True",
            if http { "httpGet" } else { "tcpSocket" },
            wall.as_secs_f64(),
            attempts as f64 / wall.as_secs_f64(),
            cpu.as_secs_f64(),
        );
        runner.abort();
    });
}
