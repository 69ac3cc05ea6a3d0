//! `oka serve`'s default templates on a first start: their roots are built in the background
//! while everything else is served, and a create of one that is not built answers 503 saying
//! why (being built, with its step and `Retry-After`; or failed, with the cause). Root only
//! (the builds need it); the build itself is exercised by `scripts/test.sh`'s
//! `oka templates build` and by the SDK tests on its roots (`sdk_e2e.rs`).

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

const OKA: &str = env!("CARGO_BIN_EXE_oka");

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// One HTTP/1.1 request to the API: the status, the head and the body.
fn http(port: u16, method: &str, path: &str, key: &str, body: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nX-API-Key: {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (status, head.to_ascii_lowercase(), body.to_owned())
}

fn wait_for_log(serve: &support::OkaServe, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !serve.log().contains(needle) {
        assert!(Instant::now() < deadline, "no `{needle}` in the log:\n{}", serve.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn start(templates: &std::path::Path, mirror: &str) -> support::OkaServe {
    let config = format!(
        "templates:\n  dir: {}\n  mirror: {mirror}\ncodeInterpreterPool:\n  enabled: false\n",
        templates.display()
    );
    support::OkaServe::start(OKA, &config, &[])
}

#[test]
fn a_create_of_a_template_being_built_is_told_how_far_the_build_is() {
    if !is_root() {
        eprintln!("SKIPPED: building templates needs root");
        return;
    }
    // A Debian archive that accepts connections and never answers: the build stays at its
    // first step for as long as the test needs.
    let archive = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = archive.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in archive.incoming() {
            held.push(stream);
        }
    });
    let templates = tempfile::tempdir().unwrap();
    let serve = start(templates.path(), &format!("http://127.0.0.1:{port}/debian"));
    wait_for_log(&serve, "building the default templates base in the background");
    wait_for_log(&serve, "step 1/4: debootstrap bookworm");
    let (status, head, body) =
        http(serve.api, "POST", "/sandboxes", &serve.key(), r#"{"templateID":"base"}"#);
    assert_eq!(status, 503, "{head}\n{body}");
    assert!(head.contains("retry-after: 10"), "{head}");
    assert!(
        body.contains("template base is being built (step 1/4: debootstrap bookworm), started "),
        "{body}"
    );
    // Everything else is served meanwhile.
    let (status, _, body) = http(serve.api, "GET", "/sandboxes", &serve.key(), "");
    assert_eq!(status, 200, "{body}");
    let (status, _, body) =
        http(serve.api, "POST", "/sandboxes", &serve.key(), r#"{"templateID":"nope"}"#);
    assert_eq!(status, 400, "an unknown template is still unknown: {body}");
    // Nothing under the template's final name while it builds.
    let names: Vec<String> = std::fs::read_dir(templates.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| n.starts_with('.') || n.ends_with(".partial")),
        "only the lock and the partial build: {names:?}"
    );
}

#[test]
fn a_failed_build_is_answered_with_its_cause_and_leaves_no_root() {
    if !is_root() {
        eprintln!("SKIPPED: building templates needs root");
        return;
    }
    let templates = tempfile::tempdir().unwrap();
    // Nothing listens on port 9 of loopback: debootstrap fails at once.
    let serve = start(templates.path(), "http://127.0.0.1:9/debian");
    wait_for_log(&serve, "template base could not be built");
    let (status, _, body) =
        http(serve.api, "POST", "/sandboxes", &serve.key(), r#"{"templateID":"base"}"#);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("template base could not be built: debootstrap"), "{body}");
    assert!(body.contains("oka templates build base"), "{body}");
    let names: Vec<String> = std::fs::read_dir(templates.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| n.starts_with('.')), "no root, no partial: {names:?}");
}
