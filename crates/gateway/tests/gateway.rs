//! The gateway end to end: a real embedded store, real upstream servers on loopback, real
//! HTTP/1.1, h2c and WebSocket clients.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use jiff::{SignedDuration, Timestamp};
use oka_api::{Sandbox, SandboxPhase, annotations, labels};
use oka_store::{Preconditions, Selector, Store, WatchEvent};
use serde_json::json;
use sha2::Digest;
use tokio::net::TcpStream;

const ID: &str = "i1a2b3c4d5e6f7g8h9j0";

/// A store with one running sandbox `sbx` (ID [`ID`]) whose port 49983 is a real upstream,
/// and a gateway in front.
async fn setup()
-> (Running, Upstream, MapDialer, oka_store::embedded::EmbeddedStore, tempfile::TempDir) {
    let (store, dir) = store();
    create(&store, &running("sbx", ID)).await;
    let up = upstream().await;
    let dialer = MapDialer::default();
    dialer.map("sbx", 49983, up.addr);
    let gw = gateway(&store, &dialer, config()).await;
    (gw, up, dialer, store, dir)
}

#[tokio::test]
async fn routes_by_host_by_headers_and_by_path() {
    let (gw, _up, _dialer, _store, _dir) = setup().await;
    let host = format!("49983-{ID}.{DOMAIN}");

    let by_host = get(gw.addr, &host, "/hello?x=1").await;
    assert_eq!(by_host.status, 200);
    assert_eq!(by_host.json()["path"], "/hello?x=1");
    assert_eq!(by_host.json()["host"], host, "the Host header is passed through");

    let ip_host = gw.addr.to_string();
    let headers = [("E2b-Sandbox-Id", ID), ("E2b-Sandbox-Port", "49983"), ("X-Access-Token", "t")];
    for shared in [ip_host.as_str(), "localhost:49983", "sandbox.oka.test"] {
        let by_headers = send(gw.addr, "GET", shared, "/health", &headers, "").await;
        assert_eq!(by_headers.status, 200, "{shared}");
        let seen = by_headers.json();
        assert_eq!(seen["path"], "/health");
        assert_eq!(seen["accessToken"], "t", "envd's token passes through");
        assert_eq!(seen["sandboxIdHeader"], ID);
    }

    let by_path = get(gw.addr, &ip_host, &format!("/kruise/{ID}/49983/files?path=/a")).await;
    assert_eq!(by_path.status, 200);
    assert_eq!(by_path.json()["path"], "/files?path=/a", "the /kruise prefix is stripped");
    let root = get(gw.addr, &ip_host, &format!("/kruise/{ID}/49983")).await;
    assert_eq!(root.json()["path"], "/");
}

#[tokio::test]
async fn unknown_sandboxes_and_closed_ports_get_the_e2b_502_bodies() {
    let (gw, _up, _dialer, _store, _dir) = setup().await;
    let unknown = get(gw.addr, &format!("49983-nosuchsandbox.{DOMAIN}"), "/health").await;
    assert_eq!(unknown.status, 502);
    assert_eq!(
        unknown.headers["content-type"].to_str().unwrap(),
        "application/json; charset=utf-8"
    );
    assert_eq!(
        unknown.json(),
        json!({"sandboxId": "nosuchsandbox", "message": "The sandbox was not found", "code": 502})
    );

    let closed = get(gw.addr, &format!("8080-{ID}.{DOMAIN}"), "/").await;
    assert_eq!(closed.status, 502);
    assert_eq!(
        closed.json(),
        json!({
            "sandboxId": ID,
            "message": "The sandbox is running but port is not open",
            "port": 8080,
            "code": 502,
        })
    );
}

#[tokio::test]
async fn malformed_routing_gets_400() {
    let (gw, _up, _dialer, _store, _dir) = setup().await;
    let ip = gw.addr.to_string();
    let id_only = send(gw.addr, "GET", &ip, "/", &[("E2b-Sandbox-Id", ID)], "").await;
    assert_eq!(id_only.status, 400);
    assert_eq!(id_only.json()["message"], "Missing header: E2b-Sandbox-Port");
    let port_only = send(gw.addr, "GET", &ip, "/", &[("E2b-Sandbox-Port", "49983")], "").await;
    assert_eq!(port_only.status, 400);
    assert_eq!(port_only.json()["message"], "Missing header: E2b-Sandbox-Id");
    let no_route = get(gw.addr, &ip, "/health").await;
    assert_eq!((no_route.status, no_route.json()["message"].clone()), (400, json!("Invalid host")));
    let bad_port = get(gw.addr, &format!("99999-{ID}.{DOMAIN}"), "/").await;
    assert_eq!(bad_port.json()["message"], "Invalid sandbox port");
}

#[tokio::test]
async fn a_streamed_response_arrives_chunk_by_chunk() {
    let (gw, up, _dialer, _store, _dir) = setup().await;
    let stream = TcpStream::connect(gw.addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    let request = http::Request::get("/stream")
        .header("host", format!("49983-{ID}.{DOMAIN}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    // The upstream has not finished: it sends `second` only once we saw `first`.
    let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the first chunk arrives while the upstream is still streaming")
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "first");
    up.release.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "second");
}

#[tokio::test]
async fn a_chunked_request_body_streams_to_the_sandbox() {
    let (gw, _up, _dialer, _store, _dir) = setup().await;
    let stream = TcpStream::connect(gw.addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(1);
    let body = StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    let request = http::Request::post("/echo-stream")
        .header("host", format!("49983-{ID}.{DOMAIN}"))
        .body(body)
        .unwrap();
    tx.send(Ok(Frame::data(Bytes::from_static(b"ping-1")))).await.unwrap();
    let response = sender.send_request(request).await.unwrap();
    let mut body = response.into_body();
    // Each chunk comes back before the next is sent: nothing waits for the whole body.
    for i in 1..=3 {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("the echo of a chunk arrives before the request body ends")
            .unwrap()
            .unwrap();
        assert_eq!(frame.into_data().unwrap(), format!("ping-{i}"));
        if i < 3 {
            tx.send(Ok(Frame::data(Bytes::from(format!("ping-{}", i + 1))))).await.unwrap();
        }
    }
    drop(tx);
    assert!(body.collect().await.unwrap().to_bytes().is_empty());
}

#[tokio::test]
async fn websockets_pass_through() {
    let (gw, _up, dialer, _store, _dir) = setup().await;
    dialer.map("sbx", 3000, ws_upstream().await);
    let stream = TcpStream::connect(gw.addr).await.unwrap();
    let url = format!("ws://3000-{ID}.{DOMAIN}/socket");
    let (mut ws, response) = tokio_tungstenite::client_async(url, stream).await.unwrap();
    assert_eq!(response.status(), 101);
    use futures::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    for text in ["hello", "through", "the gateway"] {
        ws.send(Message::text(text)).await.unwrap();
        let echoed = ws.next().await.unwrap().unwrap();
        assert_eq!(echoed, Message::text(text));
    }
    ws.send(Message::binary(vec![0u8, 1, 2, 255])).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::binary(vec![0u8, 1, 2, 255]));
    ws.close(None).await.unwrap();
}

#[tokio::test]
async fn h2c_requests_are_served() {
    let (gw, _up, _dialer, _store, _dir) = setup().await;
    let stream = TcpStream::connect(gw.addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = http::Request::get(format!("http://49983-{ID}.{DOMAIN}/over-h2"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(seen["path"], "/over-h2");
    assert_eq!(seen["host"], format!("49983-{ID}.{DOMAIN}"), "the authority becomes Host");
}

/// A ready, unclaimed member `pooled` of pool `pool`, with public ID `id`.
fn pool_member(id: &str) -> Sandbox {
    Sandbox::test()
        .name("pooled")
        .pooled("pool")
        .label(labels::SANDBOX_ID, id)
        .phase(SandboxPhase::Running)
        .ready()
        .build()
}

/// The manager's claim of a pool member: labels and ownerReference change in one update.
async fn claim(store: &oka_store::embedded::EmbeddedStore, member: &Sandbox) {
    let mut claimed = member.clone();
    claimed.metadata.owner_references = None;
    claimed
        .metadata
        .labels
        .get_or_insert_default()
        .insert(labels::SANDBOX_CLAIMED.into(), labels::TRUE.into());
    store.update("default", &claimed).await.unwrap();
}

#[tokio::test]
async fn a_route_appears_on_claim_and_disappears_on_delete() {
    let (store, _dir) = store();
    let up = upstream().await;
    let dialer = MapDialer::default();
    dialer.map("pooled", 49983, up.addr);
    // An unclaimed pool member is not routed.
    let created = create(&store, &pool_member("claimme")).await;
    let gw = gateway(&store, &dialer, config()).await;
    let host = format!("49983-claimme.{DOMAIN}");
    assert_eq!(get(gw.addr, &host, "/").await.status, 502);

    claim(&store, &created).await;
    eventually("the claimed sandbox is routed", || async {
        get(gw.addr, &host, "/").await.status == 200
    })
    .await;
    assert_eq!(gw.gateway.routes(), 1);

    store.delete::<Sandbox>("default", "pooled", &Preconditions::default()).await.unwrap();
    eventually("the deleted sandbox is not routed", || async {
        get(gw.addr, &host, "/").await.status == 502
    })
    .await;
    assert_eq!(gw.gateway.routes(), 0);
}

#[tokio::test]
async fn wait_routed_resolves_when_the_claim_reaches_the_table() {
    let (store, _dir) = store();
    let created = create(&store, &pool_member("waitme")).await;
    let gw = gateway(&store, &MapDialer::default(), config()).await;
    assert!(
        !gw.gateway.wait_routed("waitme", Duration::from_millis(50)).await,
        "an unclaimed pool member is not routed"
    );

    let waiter = tokio::spawn({
        let gateway = gw.gateway.clone();
        async move {
            let started = std::time::Instant::now();
            (gateway.wait_routed("waitme", Duration::from_secs(30)).await, started.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished(), "the wait ended before the claim");
    claim(&store, &created).await;
    let (routed, waited) = waiter.await.unwrap();
    assert!(routed, "the claimed sandbox is routed");
    assert!(waited < Duration::from_secs(10), "woken by the watch, not the timeout: {waited:?}");
    assert!(gw.gateway.lookup("waitme").is_some());
}

/// A gateway whose managers run elsewhere: a request for a sandbox claimed a moment ago, which
/// its watch has not brought yet, waits for the route (`unknown_wait`) instead of a 502; an ID
/// that never appears is still a 502, after the wait.
#[tokio::test]
async fn a_request_for_an_unknown_id_waits_for_its_route_when_asked_to() {
    let (store, _dir) = store();
    let up = upstream().await;
    let dialer = MapDialer::default();
    dialer.map("pooled", 49983, up.addr);
    let created = create(&store, &pool_member("late")).await;
    let mut waiting = config();
    waiting.unknown_wait = Duration::from_secs(5);
    let gw = gateway(&store, &dialer, waiting).await;
    let request =
        tokio::spawn(async move { get(gw.addr, &format!("49983-late.{DOMAIN}"), "/").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!request.is_finished(), "the request waits for the route");
    claim(&store, &created).await;
    assert_eq!(request.await.unwrap().status, 200);

    let mut short = config();
    short.unknown_wait = Duration::from_millis(200);
    let gw = gateway(&store, &dialer, short).await;
    let started = std::time::Instant::now();
    assert_eq!(get(gw.addr, &format!("49983-never.{DOMAIN}"), "/").await.status, 502);
    assert!(started.elapsed() >= Duration::from_millis(200), "the unknown ID waited first");
}

#[tokio::test]
async fn the_table_is_rebuilt_after_a_restart() {
    let (gw, _up, dialer, store, _dir) = setup().await;
    let host = format!("49983-{ID}.{DOMAIN}");
    assert_eq!(get(gw.addr, &host, "/").await.status, 200);
    gw.stop().await;
    // A sandbox claimed while the gateway was down is routed by the next one too.
    create(&store, &running("later", "claimedwhiledown")).await;
    dialer.map("later", 49983, upstream().await.addr);
    let gw = gateway(&store, &dialer, config()).await;
    assert_eq!(gw.gateway.routes(), 2);
    assert_eq!(get(gw.addr, &host, "/").await.status, 200);
    assert_eq!(get(gw.addr, &format!("49983-claimedwhiledown.{DOMAIN}"), "/").await.status, 200);
}

#[tokio::test]
async fn the_traffic_token_is_checked_where_required_and_not_forwarded() {
    let (store, _dir) = store();
    let token = "secret-traffic-token";
    let hash: String =
        sha2::Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    let secured = Sandbox::test()
        .name("secured")
        .claimed()
        .label(labels::SANDBOX_ID, "secured")
        .annotation(annotations::ENABLE_JWT_AUTH, "true")
        .annotation(annotations::TRAFFIC_ACCESS_TOKEN_SHA256, &hash)
        .phase(SandboxPhase::Running)
        .ready()
        .build();
    create(&store, &secured).await;
    let up = upstream().await;
    let dialer = MapDialer::default();
    dialer.map("secured", 49999, up.addr);
    let gw = gateway(&store, &dialer, config()).await;
    let host = format!("49999-secured.{DOMAIN}");

    let missing = get(gw.addr, &host, "/execute").await;
    assert_eq!(missing.status, 403);
    assert_eq!(
        missing.json()["message"],
        "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing"
    );
    let wrong =
        send(gw.addr, "GET", &host, "/execute", &[("E2B-Traffic-Access-Token", "nope")], "").await;
    assert_eq!(wrong.status, 403);
    assert_eq!(
        wrong.json()["message"],
        "Sandbox is secured with traffic access token. Provided token in header 'e2b-traffic-access-token' is invalid"
    );
    assert_eq!(up.requests.load(Ordering::SeqCst), 0, "rejected requests never reach the sandbox");
    let right = send(
        gw.addr,
        "GET",
        &host,
        "/execute",
        &[("E2B-Traffic-Access-Token", token), ("X-Access-Token", "envd")],
        "",
    )
    .await;
    assert_eq!(right.status, 200);
    assert_eq!(right.json()["trafficToken"], json!(null), "the verified token is stripped");
    assert_eq!(right.json()["accessToken"], "envd");
}

/// A paused sandbox the timer paused (`pauseTime` passed), as the E2B "pause at timeout" mode
/// leaves it.
fn auto_paused(name: &str, id: &str) -> Sandbox {
    Sandbox::test()
        .name(name)
        .claimed()
        .label(labels::SANDBOX_ID, id)
        .phase(SandboxPhase::Paused)
        .condition("SandboxPaused", "True")
        .paused()
        .pause_at(Timestamp::now() - SignedDuration::from_secs(60))
        .build()
}

/// Plays the sandbox controller: when a paused sandbox's `spec.paused` turns false, report it
/// Running and Ready. Counts the writes that unpaused a sandbox.
fn fake_controller(store: &oka_store::embedded::EmbeddedStore) -> Arc<AtomicUsize> {
    let resumes = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&resumes);
    let store = store.clone();
    tokio::spawn(async move {
        let mut events =
            store.watch::<Sandbox>(Some("default"), &Selector::everything(), "").await.unwrap();
        let mut paused = std::collections::HashMap::new();
        while let Some(Ok(event)) = events.next().await {
            let WatchEvent::Modified(sandbox) = event else { continue };
            let name = sandbox.metadata.name.clone().unwrap();
            let was_paused = paused.insert(name, sandbox.is_paused()).unwrap_or(true);
            if was_paused && !sandbox.is_paused() {
                counted.fetch_add(1, Ordering::SeqCst);
                set_status(&store, (*sandbox).clone(), running_status()).await;
            }
        }
    });
    resumes
}

#[tokio::test]
async fn a_request_wakes_an_auto_paused_sandbox_once() {
    let (store, _dir) = store();
    create(&store, &auto_paused("sleepy", "sleepy")).await;
    let up = upstream().await;
    let dialer = MapDialer::default();
    dialer.map("sleepy", 49983, up.addr);
    let resumes = fake_controller(&store);
    let gw = gateway(&store, &dialer, config()).await;
    let host = format!("49983-sleepy.{DOMAIN}");

    let (a, b) = tokio::join!(get(gw.addr, &host, "/health"), get(gw.addr, &host, "/health"));
    assert_eq!((a.status, b.status), (200, 200), "{}", String::from_utf8_lossy(&a.body));
    assert_eq!(resumes.load(Ordering::SeqCst), 1, "two waiting requests, one resume write");
    let woken = store.get::<Sandbox>("default", "sleepy").await.unwrap();
    assert_eq!(woken.spec.paused, Some(false));
    let pause_at = woken.spec.pause_time.unwrap().0;
    assert!(
        pause_at > Timestamp::now() + SignedDuration::from_secs(200),
        "timer moved: {pause_at}"
    );
}

#[tokio::test]
async fn explicitly_paused_sandboxes_are_not_woken() {
    let (store, _dir) = store();
    // Paused before its timer (an explicit pause), and one that opted out.
    let mut explicit = auto_paused("explicit", "explicit");
    explicit.spec.pause_time = None;
    create(&store, &explicit).await;
    let mut opted_out = auto_paused("optout", "optout");
    opted_out
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(annotations::AUTO_RESUME.into(), "false".into());
    create(&store, &opted_out).await;
    let dialer = MapDialer::default();
    let gw = gateway(&store, &dialer, config()).await;
    for id in ["explicit", "optout"] {
        let answer = get(gw.addr, &format!("49983-{id}.{DOMAIN}"), "/health").await;
        assert_eq!(answer.status, 502, "a paused sandbox is not running for the SDK");
        assert_eq!(answer.json()["message"], "The sandbox was not found");
        let sandbox = store.get::<Sandbox>("default", id).await.unwrap();
        assert_eq!(sandbox.spec.paused, Some(true), "{id} stays paused");
    }
    assert_eq!(dialer.dials.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_wake_that_does_not_finish_in_time_gets_504() {
    let (store, _dir) = store();
    let mut opted_in = auto_paused("stuck", "stuck");
    opted_in.spec.pause_time = None;
    opted_in
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(annotations::AUTO_RESUME.into(), "true".into());
    create(&store, &opted_in).await;
    let mut config = config();
    config.wake_timeout = Duration::from_millis(300);
    // No controller runs: the sandbox never comes back.
    let gw = gateway(&store, &MapDialer::default(), config).await;
    let answer = get(gw.addr, &format!("49983-stuck.{DOMAIN}"), "/").await;
    assert_eq!(answer.status, 504);
    assert_eq!(
        answer.json(),
        json!({"sandboxId": "stuck", "message": "The sandbox did not resume within 0.3s", "code": 504})
    );
    let sandbox = store.get::<Sandbox>("default", "stuck").await.unwrap();
    assert_eq!(sandbox.spec.paused, Some(false), "the resume was asked for");
}

#[tokio::test]
async fn upstream_connections_are_reused() {
    let (gw, up, dialer, _store, _dir) = setup().await;
    let host = format!("49983-{ID}.{DOMAIN}");
    for _ in 0..20 {
        assert_eq!(get(gw.addr, &host, "/").await.status, 200);
    }
    assert_eq!(up.requests.load(Ordering::SeqCst), 20);
    let dials = dialer.dials.load(Ordering::SeqCst);
    assert!(dials <= 2, "20 sequential requests took {dials} dials");
}

#[tokio::test]
async fn a_connection_handed_over_carries_the_next_request_without_a_dial() {
    let host = format!("49983-{ID}.{DOMAIN}");
    let (gw, up, dialer, store, _dir) = setup().await;
    let sandbox = store.get::<Sandbox>("default", "sbx").await.unwrap();
    gw.gateway.adopt_upstream(&sandbox, 49983, TcpStream::connect(up.addr).await.unwrap());
    assert_eq!(get(gw.addr, &host, "/").await.status, 200);
    assert_eq!(up.requests.load(Ordering::SeqCst), 1);
    assert_eq!(dialer.dials.load(Ordering::SeqCst), 0, "the handed-over connection was used");
    // Handed over for another port: not used for this one.
    let (gw, up, dialer, store, _dir) = setup().await;
    let sandbox = store.get::<Sandbox>("default", "sbx").await.unwrap();
    gw.gateway.adopt_upstream(&sandbox, 8080, TcpStream::connect(up.addr).await.unwrap());
    assert_eq!(get(gw.addr, &host, "/").await.status, 200);
    assert_eq!(dialer.dials.load(Ordering::SeqCst), 1);

    // One the sandbox closed before it was used is dropped: the request dials.
    let (gw, _up, dialer, store, _dir) = setup().await;
    let sandbox = store.get::<Sandbox>("default", "sbx").await.unwrap();
    let refuser = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed = TcpStream::connect(refuser.local_addr().unwrap()).await.unwrap();
    drop(refuser.accept().await.unwrap());
    tokio::time::sleep(Duration::from_millis(50)).await;
    gw.gateway.adopt_upstream(&sandbox, 49983, closed);
    assert_eq!(get(gw.addr, &host, "/").await.status, 200);
    assert_eq!(dialer.dials.load(Ordering::SeqCst), 1);
}

/// A raw HTTP/1.1 upstream that answers every request on a connection with `200 ok` and
/// keep-alive, but closes each connection, unannounced, `close_after` after its first answer.
async fn closing_upstream(close_after: Duration) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut seen = Vec::new();
                let mut deadline = None;
                loop {
                    let read = match deadline {
                        Some(at) => {
                            match tokio::time::timeout_at(at, stream.read(&mut buf)).await {
                                Ok(read) => read,
                                Err(_) => return, // closes the idle connection
                            }
                        }
                        None => stream.read(&mut buf).await,
                    };
                    let Ok(n @ 1..) = read else { return };
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..end + 4);
                        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        stream.write_all(answer.as_bytes()).await.unwrap();
                        deadline.get_or_insert(tokio::time::Instant::now() + close_after);
                    }
                }
            });
        }
    });
    (addr, connections)
}

#[tokio::test]
async fn a_pooled_connection_the_sandbox_closed_is_replaced_without_failing_the_request() {
    let (store, _dir) = store();
    create(&store, &running("sbx", ID)).await;
    let (addr, connections) = closing_upstream(Duration::from_millis(50)).await;
    let dialer = MapDialer::default();
    dialer.map("sbx", 49983, addr);
    let gw = gateway(&store, &dialer, config()).await;
    let host = format!("49983-{ID}.{DOMAIN}");
    for round in 0..3 {
        let answer = get(gw.addr, &host, "/").await;
        assert_eq!((answer.status, answer.body.as_slice()), (200, &b"ok"[..]), "round {round}");
        // The pooled connection is closed by the upstream while it idles.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(connections.load(Ordering::SeqCst), 3, "one connection per round");
}

#[tokio::test]
async fn responses_without_a_body_keep_their_connection_and_an_abandoned_body_drops_it() {
    let (gw, up, dialer, _store, _dir) = setup().await;
    let host = format!("49983-{ID}.{DOMAIN}");
    // HEAD: hyper never polls an empty body; the connection still goes back to the pool.
    for _ in 0..5 {
        assert_eq!(send(gw.addr, "HEAD", &host, "/", &[], "").await.status, 200);
    }
    assert!(dialer.dials.load(Ordering::SeqCst) <= 2, "HEAD requests were not pooled");

    // A client that goes away in the middle of a streamed body: its upstream connection is
    // dropped, and the next request is served on another.
    let stream = TcpStream::connect(gw.addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    let driver = tokio::spawn(connection);
    let request = http::Request::builder()
        .uri("/stream")
        .header("host", &host)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let mut response = sender.send_request(request).await.unwrap();
    let first = response.body_mut().frame().await.unwrap().unwrap();
    assert!(first.is_data());
    drop(response);
    drop(sender);
    driver.abort();
    let answer = get(gw.addr, &host, "/").await;
    assert_eq!(answer.status, 200);
    assert!(up.requests.load(Ordering::SeqCst) >= 7);
}

/// One response read off a raw connection: status, lowercase header names with values, body
/// (`Content-Length`, chunked, or until close).
struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Reads one response from `stream`, keeping bytes of the next in `buf`.
async fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> RawResponse {
    use tokio::io::AsyncReadExt;
    async fn more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
        let mut chunk = [0u8; 65536];
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .expect("the response arrives")
            .unwrap();
        buf.extend_from_slice(&chunk[..n]);
        n > 0
    }
    let (status, headers, len) = loop {
        let mut parsed = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut parsed);
        if let httparse::Status::Complete(len) = response.parse(buf).unwrap() {
            let headers: Vec<(String, String)> = response
                .headers
                .iter()
                .map(|h| {
                    (h.name.to_ascii_lowercase(), String::from_utf8(h.value.to_vec()).unwrap())
                })
                .collect();
            break (response.code.unwrap(), headers, len);
        }
        assert!(more(stream, buf).await, "the connection closed before a response head");
    };
    buf.drain(..len);
    let mut answer = RawResponse { status, headers, body: Vec::new() };
    if let Some(n) = answer.header("content-length") {
        let n: usize = n.parse().unwrap();
        while buf.len() < n {
            assert!(more(stream, buf).await, "the connection closed in a body");
        }
        answer.body = buf.drain(..n).collect();
    } else if answer.header("transfer-encoding") == Some("chunked") {
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                assert!(more(stream, buf).await);
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[..line_end]).unwrap(), 16).unwrap();
            while buf.len() < line_end + 2 + size + 2 {
                assert!(more(stream, buf).await);
            }
            answer.body.extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break;
            }
        }
    } else if status >= 200 && status != 204 && status != 304 {
        while more(stream, buf).await {}
        answer.body = std::mem::take(buf);
    }
    answer
}

/// Whether the peer closed `stream` (EOF within 10 s, nothing else arriving).
async fn closed(stream: &mut TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut byte = [0u8; 1];
    matches!(tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte)).await, Ok(Ok(0)))
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_and_a_refusal_keeps_the_connection() {
    use tokio::io::AsyncWriteExt;
    let (gw, _up, _dialer, _store, _dir) = setup().await;
    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    let pipelined = format!(
        "GET /first HTTP/1.1\r\nHost: 49983-{ID}.{DOMAIN}\r\n\r\n\
         GET / HTTP/1.1\r\nHost: 49983-nosuchsandbox.{DOMAIN}\r\n\r\n\
         POST /third HTTP/1.1\r\nHost: 49983-{ID}.{DOMAIN}\r\nContent-Length: 5\r\n\r\nhello\
         GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nE2b-Sandbox-Id: {ID}\r\n\r\n\
         GET /fifth HTTP/1.1\r\nHost: 127.0.0.1\r\nE2b-Sandbox-Id: {ID}\r\nE2b-Sandbox-Port: 49983\r\n\r\n"
    );
    stream.write_all(pipelined.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let first = read_response(&mut stream, &mut buf).await;
    assert_eq!(first.status, 200);
    let seen: serde_json::Value = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(seen["path"], "/first");
    let unknown = read_response(&mut stream, &mut buf).await;
    assert_eq!(unknown.status, 502);
    assert_eq!(unknown.header("content-type"), Some("application/json; charset=utf-8"));
    let unknown: serde_json::Value = serde_json::from_slice(&unknown.body).unwrap();
    assert_eq!(unknown["message"], "The sandbox was not found");
    let third = read_response(&mut stream, &mut buf).await;
    let seen: serde_json::Value = serde_json::from_slice(&third.body).unwrap();
    assert_eq!((third.status, &seen["path"]), (200, &json!("/third")));
    let missing = read_response(&mut stream, &mut buf).await;
    assert_eq!(missing.status, 400);
    let missing: serde_json::Value = serde_json::from_slice(&missing.body).unwrap();
    assert_eq!(missing["message"], "Missing header: E2b-Sandbox-Port");
    let fifth = read_response(&mut stream, &mut buf).await;
    let seen: serde_json::Value = serde_json::from_slice(&fifth.body).unwrap();
    assert_eq!((fifth.status, &seen["path"]), (200, &json!("/fifth")));
}

#[tokio::test]
async fn a_connection_moves_to_hyper_for_what_the_relay_does_not_take_and_close_is_honoured() {
    use tokio::io::AsyncWriteExt;
    let (gw, _up, _dialer, _store, _dir) = setup().await;
    let host = format!("49983-{ID}.{DOMAIN}");
    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    let mut buf = Vec::new();
    stream
        .write_all(format!("GET /relayed HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let relayed = read_response(&mut stream, &mut buf).await;
    assert_eq!(relayed.status, 200);
    // `Expect: 100-continue` is hyper's to answer; the connection goes on there.
    stream
        .write_all(
            format!(
                "POST /echo-stream HTTP/1.1\r\nHost: {host}\r\nExpect: 100-continue\r\n\
                 Content-Length: 2\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let interim = read_response(&mut stream, &mut buf).await;
    assert_eq!(interim.status, 100);
    stream.write_all(b"hi").await.unwrap();
    let echoed = read_response(&mut stream, &mut buf).await;
    assert_eq!((echoed.status, echoed.body.as_slice()), (200, &b"hi"[..]));
    stream
        .write_all(
            format!("GET /last HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let last = read_response(&mut stream, &mut buf).await;
    assert_eq!(last.status, 200);
    assert!(closed(&mut stream).await, "closed after a `Connection: close` request");

    // On the relay, too.
    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    stream
        .write_all(
            format!("GET /only HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut buf = Vec::new();
    let only = read_response(&mut stream, &mut buf).await;
    assert_eq!((only.status, only.header("connection")), (200, Some("close")));
    assert!(closed(&mut stream).await);
}

#[tokio::test]
async fn a_large_upload_streams_while_its_echo_streams_back() {
    let (gw, _up, _dialer, _store, _dir) = setup().await;
    let body: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let stream = TcpStream::connect(gw.addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    for _ in 0..2 {
        let request = http::Request::post("/echo-stream")
            .header("host", format!("49983-{ID}.{DOMAIN}"))
            .body(Full::new(Bytes::from(body.clone())))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let echoed = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(echoed.len(), body.len());
        assert!(echoed == body, "the echo differs from the upload");
    }
}

/// A raw upstream: `/early` answers 413 at once without reading the body and closes;
/// `/until-close` answers with a body that ends when the connection does.
async fn abrupt_upstream() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    let Ok(n @ 1..) = stream.read(&mut buf).await else { return };
                    seen.extend_from_slice(&buf[..n]);
                }
                let answer: &[u8] = if seen.starts_with(b"POST /early") {
                    b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 8\r\nconnection: close\r\n\r\ntoo big!"
                } else {
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end"
                };
                let _ = stream.write_all(answer).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_early_answer_reaches_the_client_and_a_body_may_end_with_its_connection() {
    use tokio::io::AsyncWriteExt;
    let (store, _dir) = store();
    create(&store, &running("sbx", ID)).await;
    let dialer = MapDialer::default();
    dialer.map("sbx", 49983, abrupt_upstream().await);
    let gw = gateway(&store, &dialer, config()).await;
    let host = format!("49983-{ID}.{DOMAIN}");

    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    let head = format!("POST /early HTTP/1.1\r\nHost: {host}\r\nContent-Length: 104857600\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    // The client goes on sending while the answer comes.
    let sending = tokio::spawn(async move {
        let chunk = vec![0u8; 65536];
        for _ in 0..1600 {
            if writer.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut received = Vec::new();
    let answer = tokio::time::timeout(Duration::from_secs(10), async {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        while !received.ends_with(b"too big!") {
            let n = reader.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before the answer: {:?}", String::from_utf8_lossy(&received));
            received.extend_from_slice(&buf[..n]);
        }
        String::from_utf8(received).unwrap()
    })
    .await
    .expect("the early answer arrives while the body is still being sent");
    assert!(answer.starts_with("HTTP/1.1 413 Payload Too Large\r\n"), "{answer}");
    sending.abort();

    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    stream
        .write_all(format!("GET /until-close HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    let whole = read_response(&mut stream, &mut buf).await;
    assert_eq!(whole.status, 200);
    assert_eq!(
        whole.header("connection"),
        Some("close"),
        "the client learns the body ends with the connection"
    );
    assert_eq!(whole.body, b"until the end");
}

#[tokio::test]
async fn shutdown_closes_idle_connections_and_lets_a_running_response_finish() {
    use tokio::io::AsyncWriteExt;
    let (gw, up, _dialer, _store, _dir) = setup().await;
    let host = format!("49983-{ID}.{DOMAIN}");
    let mut idle = TcpStream::connect(gw.addr).await.unwrap();
    let mut buf = Vec::new();
    idle.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut idle, &mut buf).await.status, 200);

    let mut busy = TcpStream::connect(gw.addr).await.unwrap();
    busy.write_all(format!("GET /stream HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    // The first chunk of the streamed answer has come: the request is running.
    let mut started = Vec::new();
    while !started.windows(5).any(|w| w == b"first") {
        use tokio::io::AsyncReadExt;
        let mut chunk = [0u8; 1024];
        let n = busy.read(&mut chunk).await.unwrap();
        assert!(n > 0);
        started.extend_from_slice(&chunk[..n]);
    }
    let stopping = tokio::spawn(gw.stop());
    assert!(closed(&mut idle).await, "an idle connection is closed at shutdown");
    up.release.notify_one();
    let mut rest = Vec::new();
    {
        use tokio::io::AsyncReadExt;
        tokio::time::timeout(Duration::from_secs(10), busy.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
    }
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("second") && rest.ends_with("0\r\n\r\n"), "{rest}");
    tokio::time::timeout(Duration::from_secs(5), stopping).await.unwrap().unwrap();
}

/// A running sandbox `sbx` (ID [`ID`]) with the sandbox controller's finalizer, so that a delete
/// leaves it in the store with a `deletionTimestamp` (a kill in progress).
fn finalized(name: &str, id: &str) -> Sandbox {
    let mut sandbox = running(name, id);
    sandbox.metadata.finalizers = Some(vec!["agents.kruise.io/sandbox".into()]);
    sandbox
}

/// Starts the kill of `default/{name}`: `deletionTimestamp` set, the object still there.
async fn start_kill(store: &oka_store::embedded::EmbeddedStore, name: &str) {
    let deleted =
        store.delete::<Sandbox>("default", name, &Preconditions::default()).await.unwrap();
    assert!(matches!(deleted, oka_store::Deleted::Finalizing(_)), "{deleted:?}");
}

const NOT_FOUND: &str = "The sandbox was not found";

#[tokio::test]
async fn a_sandbox_being_killed_is_not_found_and_never_dialed() {
    let (store, _dir) = store();
    create(&store, &finalized("sbx", ID)).await;
    let up = upstream().await;
    let dialer = MapDialer::default();
    dialer.map("sbx", 49983, up.addr);
    let gw = gateway(&store, &dialer, config()).await;
    let host = format!("49983-{ID}.{DOMAIN}");
    assert_eq!(get(gw.addr, &host, "/health").await.status, 200);

    start_kill(&store, "sbx").await;
    eventually("the kill reaches the route table", || async {
        get(gw.addr, &host, "/health").await.status == 502
    })
    .await;
    let dials = dialer.dials.load(Ordering::SeqCst);
    // The SDKs' health probe reads only this message as "the sandbox is gone".
    let health = get(gw.addr, &host, "/health").await;
    assert_eq!(health.json(), json!({"sandboxId": ID, "message": NOT_FOUND, "code": 502}));
    assert_eq!(dialer.dials.load(Ordering::SeqCst), dials, "a killed sandbox is not dialed");
}

/// A raw upstream that reads each request head, reports its request line on `heads`, and then
/// closes the connection without an answer when `cut` is notified, like envd killed under a
/// request. `/stream` first answers a chunked head and one chunk, and is cut in its body.
async fn cut_upstream()
-> (std::net::SocketAddr, tokio::sync::mpsc::Receiver<String>, Arc<tokio::sync::Notify>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (heads, heard) = tokio::sync::mpsc::channel(8);
    let cut = Arc::new(tokio::sync::Notify::new());
    let cut2 = Arc::clone(&cut);
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let (heads, cut) = (heads.clone(), Arc::clone(&cut2));
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    let Ok(n @ 1..) = stream.read(&mut buf).await else { return };
                    seen.extend_from_slice(&buf[..n]);
                }
                let line = String::from_utf8_lossy(&seen).lines().next().unwrap_or("").to_owned();
                if line.starts_with("GET /stream ") {
                    let head = b"HTTP/1.1 200 OK\r\ncontent-type: application/connect+json\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n";
                    stream.write_all(head).await.unwrap();
                }
                heads.send(line).await.unwrap();
                cut.notified().await;
                // Dropped: the connection closes with the request unanswered.
            });
        }
    });
    (addr, heard, cut)
}

/// Sends a request over h2c (the gateway's hyper path); gives the response head and the body
/// as it streams.
async fn send_h2(
    addr: std::net::SocketAddr,
    method: &str,
    host: &str,
    path: &str,
) -> http::Response<hyper::body::Incoming> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = http::Request::builder()
        .method(method)
        .uri(format!("http://{host}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    sender.send_request(request).await.unwrap()
}

/// The JSON `message` of an answer of the gateway.
fn message(status: u16, body: &[u8]) -> String {
    assert_eq!(status, 502, "{}", String::from_utf8_lossy(body));
    let json: serde_json::Value = serde_json::from_slice(body).unwrap();
    json["message"].as_str().unwrap().to_owned()
}

/// Sends `method path` with `body` on a new connection and reads the answer without writing
/// and reading at once (the body must fit the sockets' buffers).
async fn raw_request(
    addr: std::net::SocketAddr,
    method: &str,
    host: &str,
    path: &str,
    body: &[u8],
) -> RawResponse {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tokio::io::AsyncWriteExt::write_all(&mut stream, head.as_bytes()).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stream, body).await.unwrap();
    read_response(&mut stream, &mut Vec::new()).await
}

#[tokio::test]
async fn a_request_cut_off_by_a_kill_is_answered_not_found_on_both_paths() {
    let (store, _dir) = store();
    let (addr, mut heads, cut) = cut_upstream().await;
    let dialer = MapDialer::default();
    let cases = ["h1", "h1-upload", "h2", "h1-alive", "h2-alive"];
    for (i, name) in cases.iter().enumerate() {
        create(&store, &finalized(name, &format!("{ID}{i}"))).await;
        dialer.map(name, 49983, addr);
    }
    let gw = gateway(&store, &dialer, config()).await;
    for (i, &name) in cases.iter().enumerate() {
        let host = format!("49983-{ID}{i}.{DOMAIN}");
        let addr = gw.addr;
        let request = tokio::spawn(async move {
            match name {
                // Larger than what the relay sends with the head: the body streams.
                "h1-upload" => {
                    let answer =
                        raw_request(addr, "POST", &host, "/files", &[7u8; 256 << 10]).await;
                    (answer.status, answer.body)
                }
                "h2" | "h2-alive" => {
                    let response = send_h2(addr, "GET", &host, "/files").await;
                    let status = response.status().as_u16();
                    (status, response.into_body().collect().await.unwrap().to_bytes().to_vec())
                }
                _ => {
                    let answer = get(addr, &host, "/files").await;
                    (answer.status, answer.body)
                }
            }
        });
        heads.recv().await.unwrap();
        let killed = !name.ends_with("-alive");
        if killed {
            start_kill(&store, name).await;
        }
        cut.notify_one();
        let (status, body) = request.await.unwrap();
        let message = message(status, &body);
        if killed {
            assert_eq!(message, NOT_FOUND, "{name}: the request lost a killed sandbox");
        } else {
            assert!(
                message.starts_with("Failed to reach the sandbox"),
                "{name}: a running sandbox that could not be reached is not reported gone: {message}"
            );
        }
    }
}

#[tokio::test]
async fn a_stream_cut_off_in_its_body_fails_and_never_ends_cleanly() {
    let (store, _dir) = store();
    create(&store, &finalized("sbx", ID)).await;
    create(&store, &finalized("sbx2", &format!("{ID}2"))).await;
    let (addr, mut heads, cut) = cut_upstream().await;
    let dialer = MapDialer::default();
    dialer.map("sbx", 49983, addr);
    dialer.map("sbx2", 49983, addr);
    let gw = gateway(&store, &dialer, config()).await;

    // HTTP/1.1 (the relay): the chunked body stops without its last chunk.
    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    let head = format!("GET /stream HTTP/1.1\r\nHost: 49983-{ID}.{DOMAIN}\r\n\r\n");
    tokio::io::AsyncWriteExt::write_all(&mut stream, head.as_bytes()).await.unwrap();
    heads.recv().await.unwrap();
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    while !received.ends_with(b"first\r\n") {
        let n = tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await.unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&received));
        received.extend_from_slice(&buf[..n]);
    }
    start_kill(&store, "sbx").await;
    cut.notify_one();
    assert!(closed(&mut stream).await, "the client connection closes");
    let text = String::from_utf8_lossy(&received);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(!text.contains("\r\n0\r\n"), "no last chunk: the body never looks complete: {text}");

    // h2c (hyper): the stream fails after its first frame.
    let mut body =
        send_h2(gw.addr, "GET", &format!("49983-{ID}2.{DOMAIN}"), "/stream").await.into_body();
    heads.recv().await.unwrap();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "first");
    cut.notify_one();
    assert!(body.frame().await.unwrap().is_err(), "the h2 stream ends in an error");
}

#[tokio::test]
async fn an_upload_cut_off_by_a_kill_gets_its_answer_while_still_sending() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (store, _dir) = store();
    create(&store, &finalized("sbx", ID)).await;
    let (addr, mut heads, cut) = cut_upstream().await;
    let dialer = MapDialer::default();
    dialer.map("sbx", 49983, addr);
    let gw = gateway(&store, &dialer, config()).await;

    let stream = TcpStream::connect(gw.addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let head = format!(
        "POST /files HTTP/1.1\r\nHost: 49983-{ID}.{DOMAIN}\r\nContent-Length: 1099511627776\r\n\r\n"
    );
    writer.write_all(head.as_bytes()).await.unwrap();
    // The client goes on sending, as an SDK streaming a large file does.
    let sending = tokio::spawn(async move {
        let chunk = vec![0u8; 65536];
        while writer.write_all(&chunk).await.is_ok() {}
    });
    heads.recv().await.unwrap();
    start_kill(&store, "sbx").await;
    cut.notify_one();
    let answer = tokio::time::timeout(Duration::from_secs(10), async {
        let mut received = Vec::new();
        let mut buf = [0u8; 4096];
        while !received.ends_with(b"}") {
            match reader.read(&mut buf).await {
                Ok(n @ 1..) => received.extend_from_slice(&buf[..n]),
                other => {
                    panic!("no answer ({other:?}) after {:?}", String::from_utf8_lossy(&received))
                }
            }
        }
        String::from_utf8(received).unwrap()
    })
    .await
    .expect("the answer arrives while the body is still being sent");
    assert!(answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{answer}");
    assert!(answer.contains(NOT_FOUND), "{answer}");
    // The gateway lingers: a client still sending is not reset right after the answer (a reset
    // can destroy the answer before a client reads it), and is closed after a while.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!sending.is_finished(), "the client was reset right after the answer");
    tokio::time::timeout(Duration::from_secs(10), sending)
        .await
        .expect("the connection closes after lingering")
        .unwrap();
}

/// A raw HTTP/1.1 upstream that answers each request head with the head and first chunk of a
/// streamed response, then sends nothing more and reports on `ended` when the gateway closes
/// the connection (how a code interpreter hears that the SDK's timeout gave up on a run).
async fn silent_upstream() -> (std::net::SocketAddr, tokio::sync::mpsc::UnboundedReceiver<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ended, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let ended = ended.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = vec![0u8; 4096];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    let Ok(n @ 1..) = stream.read(&mut buf).await else { return };
                    seen.extend_from_slice(&buf[..n]);
                }
                let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n";
                stream.write_all(head.as_bytes()).await.unwrap();
                while matches!(stream.read(&mut buf).await, Ok(1..)) {}
                let _ = ended.send(());
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn a_client_that_goes_away_mid_response_closes_its_upstream_connection_on_every_path() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (store, _dir) = store();
    create(&store, &running("sbx", ID)).await;
    let (addr, mut ended) = silent_upstream().await;
    let dialer = MapDialer::default();
    dialer.map("sbx", 49999, addr);
    let gw = gateway(&store, &dialer, config()).await;
    let host = format!("49999-{ID}.{DOMAIN}");
    let cases = [
        // The relay, a body sent with its head (the SDKs' `POST /execute`).
        (
            "relay",
            format!("POST /execute HTTP/1.1\r\nHost: {host}\r\nContent-Length: 2\r\n\r\n{{}}"),
        ),
        // The relay, a streamed body.
        (
            "relay, chunked body",
            format!(
                "POST /execute HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n"
            ),
        ),
        // Hyper (a `Connection` option the relay does not take).
        (
            "hyper",
            format!(
                "POST /execute HTTP/1.1\r\nHost: {host}\r\nConnection: x-other\r\nContent-Length: 2\r\n\r\n{{}}"
            ),
        ),
    ];
    for (name, request) in cases {
        let mut stream = TcpStream::connect(gw.addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.windows(5).any(|w| w == b"first") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "{name}: the response's start arrives");
            got.extend_from_slice(&buf[..n]);
        }
        drop(stream);
        let closed = tokio::time::timeout(Duration::from_secs(5), ended.recv()).await;
        assert!(matches!(closed, Ok(Some(()))), "{name}: the upstream connection is closed");
    }
}

/// The value of the sample `series` (name and labels, as written) in an OpenMetrics scrape.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[tokio::test]
async fn relayed_bytes_and_first_byte_latency_are_counted_on_both_relays() {
    let (gw, _up, _dialer, _store, _dir) = setup().await;
    let mut registry = oka_metrics::Registry::default();
    gw.gateway.register_metrics(&mut registry);
    let scrape =
        || oka_metrics::scrape::encode(&registry, oka_metrics::scrape::Format::OpenMetrics);
    let before = scrape().unwrap();
    assert_eq!(sample(&before, "oka_gateway_upstream_first_byte_seconds_count"), 0.0);
    assert_eq!(sample(&before, "oka_gateway_relayed_bytes_total{direction=\"in\"}"), 0.0);

    // The HTTP/1.1 relay: a request with a body.
    let host = format!("49983-{ID}.{DOMAIN}");
    let answer = send(gw.addr, "POST", &host, "/echo", &[], "0123456789").await;
    assert_eq!(answer.status, 200);
    let text = scrape().unwrap();
    assert_eq!(sample(&text, "oka_gateway_upstream_first_byte_seconds_count"), 1.0);
    let sent = sample(&text, "oka_gateway_relayed_bytes_total{direction=\"in\"}");
    let received = sample(&text, "oka_gateway_relayed_bytes_total{direction=\"out\"}");
    assert!(sent > 10.0, "the head and the 10-byte body went in: {sent}");
    assert!(received >= answer.body.len() as f64, "the response came out: {received}");

    // The hyper relay (h2c from the client, HTTP/1.1 to the sandbox).
    let stream = TcpStream::connect(gw.addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request =
        http::Request::get(format!("http://{host}/over-h2")).body(Full::new(Bytes::new())).unwrap();
    let response = sender.send_request(request).await.unwrap();
    response.into_body().collect().await.unwrap();
    let text = scrape().unwrap();
    assert_eq!(sample(&text, "oka_gateway_upstream_first_byte_seconds_count"), 2.0);
    assert!(sample(&text, "oka_gateway_relayed_bytes_total{direction=\"in\"}") > sent);
    assert!(sample(&text, "oka_gateway_relayed_bytes_total{direction=\"out\"}") > received);
}
