//! Traces as an operator reads them in a collector: one create, one pause and one delete of a
//! real sandbox through the E2B API, exported over OTLP/gRPC to a receiver built on the
//! official protobuf definitions; the request's root span has the request's ID as its trace
//! ID, the manager's steps are its children, and every controller reconcile that acted on the
//! sandbox is a sibling child of the same root. OTLP/HTTP is checked on an API-only
//! `oka serve`.

// Test helpers outside `#[test]` functions may unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use support::OkaServe;
use support::otlp::{ReceivedSpan, Receiver};

mod support;

const OKA: &str = env!("CARGO_BIN_EXE_oka");

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n")
}

/// One HTTP/1.1 request to the E2B API with `request_id`; the status code and the body.
fn http(
    port: u16,
    method: &str,
    path: &str,
    key: &str,
    request_id: &str,
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nX-API-Key: {key}\r\nX-Request-ID: {request_id}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

fn of_trace<'a>(spans: &'a [ReceivedSpan], trace: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.trace_id == trace).collect()
}

fn root<'a>(spans: &[&'a ReceivedSpan]) -> Option<&'a ReceivedSpan> {
    spans.iter().copied().find(|s| s.parent_span_id.is_empty())
}

fn named<'a>(spans: &[&'a ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().copied().filter(|s| s.name == name).collect()
}

#[test]
fn a_create_a_pause_and_a_delete_are_each_one_trace_across_the_manager_and_the_controllers() {
    if !is_root() {
        eprintln!("skipped: needs root for real sandboxes");
        return;
    }
    let receiver = Receiver::start();
    let config = format!(
        "tracing:\n  mode: otel\n  endpoint: http://{}\ndefaultPool:\n  replicas: 1\ncodeInterpreterPool:\n  enabled: false\n",
        receiver.addr
    );
    let serve = OkaServe::start(OKA, &config, &[]);
    serve.wait_sandboxes(1, Duration::from_secs(120));
    let key = serve.key();

    // A request ID that is not a trace ID is refused while tracing is on, as the reference does.
    let (status, body) = http(serve.api, "GET", "/sandboxes", &key, "not-a-trace-id", "");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid X-Request-ID: must be 32 hex characters"), "{body}");

    // Create: the root is `POST /sandboxes` with the request ID as trace ID.
    let create = "0af7651916cd43dd8448eb211c80319c";
    let (status, body) = http(
        serve.api,
        "POST",
        "/sandboxes",
        &key,
        create,
        r#"{"templateID":"base","timeout":300}"#,
    );
    assert_eq!(status, 201, "{body}\n{}", serve.log());
    let sandbox: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = sandbox["sandboxID"].as_str().unwrap().to_owned();
    let spans = receiver.wait_for(Duration::from_secs(30), |spans| {
        let trace = of_trace(spans, create);
        ["POST /sandboxes", "manager.ClaimSandbox", "manager.InitRuntime", "proxy.syncRoute"]
            .iter()
            .all(|name| !named(&trace, name).is_empty())
    });
    let trace = of_trace(&spans, create);
    let root_span = root(&trace).unwrap_or_else(|| panic!("no root span in {trace:#?}"));
    assert_eq!(root_span.name, "POST /sandboxes");
    assert_eq!(root_span.kind, 2, "the root is a server span");
    assert_eq!(root_span.attributes.get("request.id").map(String::as_str), Some(create));
    assert_eq!(root_span.scope, "sandbox-manager");
    assert_eq!(root_span.service, "oka");
    for name in ["manager.ClaimSandbox", "manager.InitRuntime", "proxy.syncRoute"] {
        let child = named(&trace, name);
        assert_eq!(child.len(), 1, "{name} in {trace:#?}");
        assert_eq!(child[0].parent_span_id, root_span.span_id, "{name} is the root's child");
    }

    // Pause: the sandbox controller's reconciles that paused it are siblings under the root.
    let pause = "1bf7651916cd43dd8448eb211c80319d";
    let (status, body) =
        http(serve.api, "POST", &format!("/sandboxes/{id}/pause"), &key, pause, "");
    assert!(status == 204 || status == 202, "{status} {body}");
    let spans = receiver.wait_for(Duration::from_secs(30), |spans| {
        let trace = of_trace(spans, pause);
        root(&trace).is_some() && !named(&trace, "controller.Reconcile").is_empty()
    });
    let trace = of_trace(&spans, pause);
    let root_span = root(&trace).unwrap_or_else(|| panic!("no root span in {trace:#?}"));
    assert_eq!(root_span.name, "POST /sandboxes/{id}/pause");
    let reconciles = named(&trace, "controller.Reconcile");
    assert!(!reconciles.is_empty(), "no reconcile joined the pause's trace: {trace:#?}");
    for reconcile in &reconciles {
        assert_eq!(reconcile.parent_span_id, root_span.span_id, "a sibling under the root");
        assert_eq!(reconcile.scope, "sandbox-controller");
        assert!(reconcile.attributes.contains_key("sandbox.name"), "{reconcile:#?}");
        assert_ne!(reconcile.attributes.get("reconcile.noop").map(String::as_str), Some("true"));
    }
    assert_eq!(named(&trace, "manager.PauseSandbox").len(), 1, "{trace:#?}");

    // Delete: the finalizing reconciles join the delete's trace.
    let delete = "2cf7651916cd43dd8448eb211c80319e";
    let (status, body) = http(serve.api, "DELETE", &format!("/sandboxes/{id}"), &key, delete, "");
    assert_eq!(status, 204, "{body}");
    let spans = receiver.wait_for(Duration::from_secs(30), |spans| {
        !named(&of_trace(spans, delete), "controller.Reconcile").is_empty()
    });
    let trace = of_trace(&spans, delete);
    assert_eq!(root(&trace).map(|s| s.name.as_str()), Some("DELETE /sandboxes/{id}"), "{trace:#?}");
    assert!(!named(&trace, "controller.Reconcile").is_empty(), "{trace:#?}");

    // Nothing exported is a reconcile that wrote nothing.
    assert!(
        receiver
            .spans()
            .iter()
            .all(|s| s.attributes.get("reconcile.noop").map(String::as_str) != Some("true")),
        "a no-op reconcile was exported"
    );
    assert!(receiver.spans().iter().all(|s| s.protocol == "grpc"));
}

#[test]
fn otlp_over_http_carries_the_request_roots() {
    let receiver = Receiver::start();
    let config = format!(
        "runtime:\n  enabled: false\ntracing:\n  mode: otel-http\n  endpoint: http://{}\n",
        receiver.addr
    );
    let serve = OkaServe::start(OKA, &config, &[]);
    let key = serve.key();
    let request = "3df7651916cd43dd8448eb211c80319f";
    let (status, body) = http(serve.api, "GET", "/sandboxes", &key, request, "");
    assert_eq!(status, 200, "{body}");
    let (status, _) =
        http(serve.api, "GET", "/sandboxes/nope", &key, "4ef7651916cd43dd8448eb211c8031a0", "");
    assert_eq!(status, 404);
    let spans = receiver.wait_for(Duration::from_secs(30), |spans| {
        spans.iter().any(|s| s.trace_id == request)
            && spans.iter().any(|s| s.trace_id == "4ef7651916cd43dd8448eb211c8031a0")
    });
    let listed = of_trace(&spans, request);
    assert_eq!(root(&listed).map(|s| s.name.as_str()), Some("GET /sandboxes"), "{spans:#?}");
    assert_eq!(listed[0].protocol, "http");
    let missing = of_trace(&spans, "4ef7651916cd43dd8448eb211c8031a0");
    let missing = root(&missing).unwrap();
    assert_eq!(missing.name, "GET /sandboxes/{id}");
    assert_eq!(missing.status.0, 2, "a 404 ends its span with an error status");
    assert!(missing.status.1.contains("Sandbox route not found"), "{missing:#?}");
}
