//! `exec::run_command` against a real `oka-envd` server on loopback.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use futures::future::BoxFuture;
use oka_api::Sandbox;
use oka_manager::EnvdConnector;
use oka_manager::exec::{ExecOptions, run_command};

/// Dials `addr` for every sandbox.
struct Loopback(SocketAddr);

impl EnvdConnector for Loopback {
    fn connect<'a>(
        &'a self,
        _sandbox: &'a Sandbox,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<tokio::net::TcpStream>> {
        assert_eq!(port, 49983);
        Box::pin(tokio::net::TcpStream::connect(self.0))
    }
}

async fn envd() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = oka_envd::AppState::new(oka_envd::Config::default());
    tokio::spawn(oka_envd::serve(listener, state, std::future::pending()));
    addr
}

fn command(script: &str) -> Vec<String> {
    ["sh", "-c", script].map(str::to_owned).to_vec()
}

fn is_root() -> bool {
    std::process::Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_runs_as_root_and_reports_its_exit_code_and_output() {
    if !is_root() {
        eprintln!("SKIPPED: envd runs a root command only when it is root");
        return;
    }
    let connector = Loopback(envd().await);
    let sandbox = Sandbox::test().name("sbx").build();
    let options = ExecOptions::root(Duration::from_secs(10));
    let ok = run_command(&connector, &sandbox, &command("echo hi; id -u"), &options).await.unwrap();
    assert_eq!((ok.exit_code, ok.exited), (0, true), "{ok:?}");
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "hi\n0\n");
    assert!(ok.pid.is_some());
    let failed =
        run_command(&connector, &sandbox, &command("echo out; echo err >&2; exit 3"), &options)
            .await
            .unwrap();
    assert_eq!(failed.exit_code, 3);
    assert_eq!(failed.status, "exit status 3");
    assert_eq!(
        (failed.stdout.as_slice(), failed.stderr.as_slice()),
        (&b"out\n"[..], &b"err\n"[..])
    );
    // Output beyond the limit keeps its end.
    let small = ExecOptions { output_limit: 4, ..options.clone() };
    let long =
        run_command(&connector, &sandbox, &command("echo 0123456789"), &small).await.unwrap();
    assert_eq!(long.stdout, b"789\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_past_its_timeout_is_killed_and_a_missing_program_fails() {
    if !is_root() {
        eprintln!("SKIPPED: envd runs a root command only when it is root");
        return;
    }
    let connector = Loopback(envd().await);
    let sandbox = Sandbox::test().name("sbx").build();
    let options = ExecOptions::root(Duration::from_millis(500));
    let started = std::time::Instant::now();
    // envd kills it at the deadline and ends the stream with `deadline_exceeded`.
    let killed = run_command(&connector, &sandbox, &command("sleep 30"), &options).await;
    assert!(killed.as_ref().is_err_and(|e| e.0.contains("longer than its timeout")), "{killed:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let missing = vec!["/no/such/program".to_owned()];
    let error = run_command(&connector, &sandbox, &missing, &options).await;
    assert!(error.is_err() || error.as_ref().is_ok_and(|o| o.exit_code != 0), "{error:?}");
}

#[tokio::test]
async fn an_unreachable_runtime_is_an_error() {
    let connector = Loopback("127.0.0.1:9".parse().unwrap());
    let sandbox = Sandbox::test().name("sbx").build();
    let options = ExecOptions::root(Duration::from_secs(1));
    let error = run_command(&connector, &sandbox, &command("true"), &options).await.unwrap_err();
    assert!(error.0.contains("cannot connect"), "{error}");
}
