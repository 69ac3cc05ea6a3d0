//! Per-API-key quota end to end: a real `oka serve` (embedded ledger, real local sandboxes, as
//! root) and the E2B REST API: a key with `sandbox.count` limit 2 gets 403 `QuotaExceeded` on
//! its third create, and a create again after a kill.

// Test helpers outside `#[test]` functions may unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;

mod support;

const OKA: &str = env!("CARGO_BIN_EXE_oka");

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n")
}

/// One HTTP/1.1 request to the API: the status and the JSON body (`null` when empty).
fn http(port: u16, method: &str, path: &str, key: &str, body: &str) -> (u16, serde_json::Value) {
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
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, serde_json::from_str(&body).unwrap_or(serde_json::Value::Null))
}

#[test]
fn a_key_limited_to_two_sandboxes_gets_403_on_the_third_and_one_again_after_a_kill() {
    if !is_root() {
        eprintln!("skipped: the local runtime needs root");
        return;
    }
    let serve = support::OkaServe::start(
        OKA,
        "defaultPool:\n  replicas: 2\ncodeInterpreterPool:\n  enabled: false\n",
        &[],
    );
    serve.wait_sandboxes(2, std::time::Duration::from_secs(60));
    let admin = serve.key();
    let (status, key) = http(
        serve.api,
        "POST",
        "/api-keys",
        &admin,
        r#"{"name":"limited","quota":{"limits":[{"dimension":"sandbox.count","scope":"all","limit":2}]}}"#,
    );
    assert_eq!(status, 201, "{key}");
    let key = key["key"].as_str().unwrap().to_owned();
    // Without oka-envd built beside oka the sandboxes run no agent runtime: no `/init`.
    let body = r#"{"templateID":"base","timeout":300,"metadata":{"e2b.agents.kruise.io/skip-init-runtime":"true"}}"#;
    let create = || http(serve.api, "POST", "/sandboxes", &key, body);
    let (status, first) = create();
    assert_eq!(status, 201, "{first}\n{}", serve.log());
    let (status, second) = create();
    assert_eq!(status, 201, "{second}\n{}", serve.log());
    let (status, third) = create();
    assert_eq!(status, 403, "{third}");
    assert_eq!(third["code"], 403);
    assert_eq!(third["message"], "QuotaExceeded: api-key quota exceeded");

    let id = first["sandboxID"].as_str().unwrap();
    let (status, body) = http(serve.api, "DELETE", &format!("/sandboxes/{id}"), &key, "");
    assert_eq!(status, 204, "{body}");
    let (status, again) = create();
    assert_eq!(status, 201, "{again}\n{}", serve.log());
    let (status, refused) = create();
    assert_eq!(status, 403, "{refused}");
}
