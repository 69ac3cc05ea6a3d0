//! Our kernel client against a real ipykernel: start, execute, outputs, interrupt, death.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use oka_interpreter::kernel::{self, Event, Kernel, Launch};
use std::time::Duration;
use tokio::sync::mpsc;

async fn python_spec() -> Option<kernel::KernelSpec> {
    let specs = kernel::discover(&kernel::search_path(&[]));
    if let Some(s) = kernel::find_spec(&specs, "python") {
        return Some(s.clone());
    }
    kernel::python_fallback().await
}

fn launch() -> Launch {
    Launch {
        uid_gid: None,
        home: None,
        user: None,
        cwd: std::env::temp_dir(),
        start_timeout: Duration::from_secs(60),
        env: Default::default(),
    }
}

macro_rules! require_kernel {
    () => {
        match python_spec().await {
            Some(s) => s,
            None => {
                println!("SKIPPED: ipykernel is not installed (apt-get install python3-ipykernel)");
                return;
            }
        }
    };
}

async fn run(k: &mut Kernel, code: &str) -> (Vec<Event>, kernel::Outcome) {
    let (tx, mut rx) = mpsc::channel(64);
    let collect = async {
        let mut v = Vec::new();
        while let Some(e) = rx.recv().await {
            v.push(e);
        }
        v
    };
    let exec = async {
        let r = k.execute(code, false, Some(&tx)).await.unwrap();
        drop(tx);
        r
    };
    let (o, v) = tokio::join!(exec, collect);
    (v, o)
}

#[tokio::test]
async fn executes_and_reports_outputs() {
    let spec = require_kernel!();
    let mut k = Kernel::start(&spec, &launch()).await.unwrap();
    let (ev, o) = run(&mut k, "print('hello'); 1+1").await;
    assert_eq!(o.execution_count, Some(1));
    assert_eq!(o.status, "ok");
    // The stream may come in several chunks (`print` writes the text and the newline apart, and
    // the kernel flushes when it likes); the result follows all of them.
    let stdout: String = ev
        .iter()
        .filter_map(|e| match e {
            Event::Stream { stderr: false, text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(stdout, "hello\n", "{ev:?}");
    assert!(
        matches!(ev.last(), Some(Event::Result { main: true, data }) if data["text/plain"] == "2"),
        "{ev:?}"
    );
    assert!(
        ev[..ev.len() - 1].iter().all(|e| matches!(e, Event::Stream { stderr: false, .. })),
        "{ev:?}"
    );

    let (ev, o) = run(&mut k, "1/0").await;
    assert_eq!(o.status, "error");
    assert!(matches!(&ev[0], Event::Error { name, .. } if name == "ZeroDivisionError"), "{ev:?}");

    // Silent runs do not count.
    k.run_silent("x = 41").await.unwrap();
    let (ev, o) = run(&mut k, "x + 1").await;
    assert_eq!(o.execution_count, Some(3));
    assert!(matches!(&ev[0], Event::Result { data, .. } if data["text/plain"] == "42"));
    k.shutdown().await;
}

#[tokio::test]
async fn dropping_the_receiver_interrupts() {
    let spec = require_kernel!();
    let mut k = Kernel::start(&spec, &launch()).await.unwrap();
    let (tx, rx) = mpsc::channel(4);
    let dropper = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(rx);
    };
    let (o, ()) = tokio::join!(k.execute("while True: pass", false, Some(&tx)), dropper);
    let o = o.unwrap();
    assert!(o.interrupted);
    assert_eq!(o.status, "error");
    let (_, o) = run(&mut k, "2*3").await;
    assert_eq!(o.status, "ok");
}

#[tokio::test]
async fn a_dead_kernel_is_an_error() {
    let spec = require_kernel!();
    let mut k = Kernel::start(&spec, &launch()).await.unwrap();
    let (tx, _rx) = mpsc::channel(4);
    let e = k.execute("import os; os._exit(3)", false, Some(&tx)).await.unwrap_err();
    assert!(
        matches!(e, kernel::KernelError::Exited { .. } | kernel::KernelError::Died { .. }),
        "{e}"
    );
    assert!(!k.is_alive());
}

#[tokio::test]
async fn a_kernel_that_exits_at_start_reports_its_stderr() {
    let mut spec = require_kernel!();
    spec.argv = vec!["sh".into(), "-c".into(), "echo no-such-module >&2; exit 3".into()];
    let e = Kernel::start(&spec, &launch()).await.unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("exited while starting") && msg.contains("no-such-module"), "{msg}");
}
