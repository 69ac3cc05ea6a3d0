//! The daemon's wire answers, through `app(state)` with `oneshot` (no socket), plus one h2c round trip
//! over loopback, and a proptest over envelope + JSON decoding.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, StatusCode};
use oka_envd::connect::{Codec, EnvelopeDecoder, FLAG_END, envelope};
use oka_envd::proto::{self, EntryResponse, EventResponse, ListResponse, PathRequest};
use oka_envd::{AppState, Config, app};
use proptest::prelude::*;
use prost::Message as _;
use tower::ServiceExt as _;

fn state() -> (AppState, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let passwd = dir.path().join("passwd");
    std::fs::write(&passwd, format!("user:x:{uid}:{gid}::{}:/bin/bash\n", home.display())).unwrap();
    (AppState::new(Config { passwd, ..Default::default() }), dir)
}

async fn call(state: &AppState, req: Request<Body>) -> (StatusCode, http::HeaderMap, Bytes) {
    let r = app(state.clone()).oneshot(req).await.unwrap();
    let (parts, body) = r.into_parts();
    (parts.status, parts.headers, axum::body::to_bytes(body, usize::MAX).await.unwrap())
}

/// Polls `List` until a process with `tag` is listed (`true`) or is gone (`false`).
async fn wait_listed(s: &AppState, tag: &str, listed: bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let needle = format!(r#""tag":"{tag}""#);
    loop {
        let (_, _, body) = call(s, unary("/process.Process/List", "{}")).await;
        if String::from_utf8_lossy(&body).contains(&needle) == listed {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{tag} listed is never {listed}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

fn unary(path: &str, json: &str) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(json.to_owned()))
        .unwrap()
}

fn stream_req(path: &str, json: &str) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/connect+json")
        .body(Body::from(envelope(0, json.as_bytes())))
        .unwrap()
}

fn envelopes(body: &[u8]) -> Vec<(u8, serde_json::Value)> {
    let mut d = EnvelopeDecoder::default();
    d.push(body);
    let mut out = Vec::new();
    while let Some((f, p)) = d.next_envelope().unwrap() {
        out.push((f, serde_json::from_slice(&p).unwrap()));
    }
    assert!(!d.has_partial());
    out
}

#[tokio::test]
async fn unary_errors_have_connect_codes_and_statuses() {
    let (s, _d) = state();
    let (st, h, b) = call(&s, unary("/filesystem.Filesystem/Stat", r#"{"path":"/no/such"}"#)).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(h["content-type"], "application/json");
    let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["code"], "not_found");

    let (st, _, b) = call(&s, unary("/filesystem.Filesystem/Stat", "{\"path\":")).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&b).contains("invalid_argument"));

    let (st, _, b) = call(&s, unary("/filesystem.Filesystem/Nope", "{}")).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert!(String::from_utf8_lossy(&b).contains("unimplemented"));

    let (st, _, _) = call(
        &s,
        Request::post("/process.Process/List")
            .header("content-type", "text/plain")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(st, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let (st, _, b) =
        call(&s, unary("/filesystem.Filesystem/Stat", r#"{"path":"/a/../../etc"}"#)).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&b));

    let mut r = unary("/process.Process/List", "{}");
    r.headers_mut().insert("connect-timeout-ms", "soon".parse().unwrap());
    assert_eq!(call(&s, r).await.0, StatusCode::BAD_REQUEST);

    let mut r = unary("/process.Process/List", "{}");
    r.headers_mut().insert("authorization", "Basic bm9ib2R5Og==".parse().unwrap()); // nobody:
    let (st, _, b) = call(&s, r).await;
    assert_eq!(st, StatusCode::OK, "List does not need a user: {}", String::from_utf8_lossy(&b));
    let mut r = unary("/filesystem.Filesystem/Stat", "{}");
    r.headers_mut().insert("authorization", "Basic bm9ib2R5Og==".parse().unwrap());
    let (st, _, b) = call(&s, r).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    assert!(String::from_utf8_lossy(&b).contains("invalid username: 'nobody'"));
}

#[tokio::test]
async fn binary_protobuf_unary() {
    let (s, d) = state();
    let path = d.path().join("f");
    std::fs::write(&path, "12345").unwrap();
    let req = PathRequest { path: path.to_string_lossy().into_owned() };
    let r = Request::post("/filesystem.Filesystem/Stat")
        .header("content-type", "application/proto")
        .body(Body::from(req.encode_to_vec()))
        .unwrap();
    let (st, h, b) = call(&s, r).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(h["content-type"], "application/proto");
    let e = EntryResponse::decode(b).unwrap().entry.unwrap();
    assert_eq!((e.name.as_str(), e.size, e.r#type), ("f", 5, proto::FileType::File as i32));
}

#[tokio::test]
async fn start_streams_start_data_end_and_end_of_stream() {
    let (s, _d) = state();
    let (st, h, b) = call(
        &s,
        stream_req(
            "/process.Process/Start",
            r#"{"process":{"cmd":"/bin/bash","args":["-c","printf hi; printf oops >&2; exit 4"]},"stdin":false}"#,
        ),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(h["content-type"], "application/connect+json");
    let env = envelopes(&b);
    assert!(env[0].1["event"]["start"]["pid"].as_u64().unwrap() > 0);
    let mut stdout = String::new();
    for (_, v) in &env {
        if let Some(o) = v["event"]["data"]["stdout"].as_str() {
            stdout.push_str(o);
        }
    }
    assert_eq!(stdout, "aGk="); // "hi"
    let end = &env[env.len() - 2].1["event"]["end"];
    assert_eq!(end["exitCode"], 4);
    assert_eq!(end["status"], "exit status 4");
    assert_eq!(env.last().unwrap(), &(FLAG_END, serde_json::json!({})));
}

#[tokio::test]
async fn stream_errors_travel_in_the_end_message() {
    let (s, _d) = state();
    let (st, _, b) = call(
        &s,
        stream_req(
            "/process.Process/Start",
            r#"{"process":{"cmd":"/bin/true","cwd":"/no/such/dir"}}"#,
        ),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let env = envelopes(&b);
    assert_eq!(env.len(), 1);
    assert_eq!(env[0].0, FLAG_END);
    assert_eq!(env[0].1["error"]["code"], "invalid_argument");
    assert!(env[0].1["error"]["message"].as_str().unwrap().contains("does not exist"));

    // A truncated envelope.
    let r = Request::post("/process.Process/Start")
        .header("content-type", "application/connect+json")
        .body(Body::from(vec![0u8, 0, 0, 9, b'{']))
        .unwrap();
    let env = envelopes(&call(&s, r).await.2);
    assert_eq!(env[0].1["error"]["code"], "invalid_argument");

    // An oversized one.
    let r = Request::post("/process.Process/Connect")
        .header("content-type", "application/connect+json")
        .body(Body::from(vec![0u8, 0x7f, 0xff, 0xff, 0xff]))
        .unwrap();
    let env = envelopes(&call(&s, r).await.2);
    assert_eq!(env[0].1["error"]["code"], "resource_exhausted");

    // Connect to an unknown pid.
    let env = envelopes(
        &call(&s, stream_req("/process.Process/Connect", r#"{"process":{"pid":999999}}"#)).await.2,
    );
    assert_eq!(env[0].1["error"]["code"], "not_found");
}

#[tokio::test]
async fn background_process_survives_disconnect_and_reconnects_by_tag() {
    let (s, _d) = state();
    // Start with a tag and drop the response body at once (client gone).
    let r = app(s.clone())
        .oneshot(stream_req(
            "/process.Process/Start",
            r#"{"process":{"cmd":"/bin/bash","args":["-c","read x; echo got $x"]},"tag":"t1","stdin":true}"#,
        ))
        .await
        .unwrap();
    drop(r);
    wait_listed(&s, "t1", true).await;
    let (_, _, b) = call(&s, unary("/process.Process/List", "{}")).await;
    let list: ListResponse = serde_json::from_slice(&b).unwrap();
    let p = list.processes.iter().find(|p| p.tag.as_deref() == Some("t1")).expect("still listed");
    let pid = p.pid;
    // Reconnect by tag while feeding stdin.
    let s2 = s.clone();
    let conn = tokio::spawn(async move {
        call(&s2, stream_req("/process.Process/Connect", r#"{"process":{"tag":"t1"}}"#)).await
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let input = format!(r#"{{"process":{{"pid":{pid}}},"input":{{"stdin":"eWVzCg=="}}}}"#);
    assert_eq!(call(&s, unary("/process.Process/SendInput", &input)).await.0, StatusCode::OK);
    let env = envelopes(&conn.await.unwrap().2);
    assert_eq!(env[0].1["event"]["start"]["pid"], pid);
    let out: Vec<_> =
        env.iter().filter_map(|(_, v)| v["event"]["data"]["stdout"].as_str()).collect();
    assert_eq!(out.concat(), "Z290IHllcwo="); // "got yes\n"
    // Exits are retained: a late Connect gets start + end.
    let env = envelopes(
        &call(&s, stream_req("/process.Process/Connect", r#"{"process":{"tag":"t1"}}"#)).await.2,
    );
    assert_eq!(env.len(), 3);
    assert_eq!(env[1].1["event"]["end"]["exited"], true);
    // Signals to an exited process: not found.
    let sig = format!(r#"{{"process":{{"pid":{pid}}},"signal":"SIGNAL_SIGKILL"}}"#);
    assert_eq!(call(&s, unary("/process.Process/SendSignal", &sig)).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn keepalives_are_sent_when_idle() {
    let (s, _d) = state();
    let mut r =
        stream_req("/process.Process/Start", r#"{"process":{"cmd":"/bin/sleep","args":["1.5"]}}"#);
    r.headers_mut().insert("keepalive-ping-interval", "1".parse().unwrap());
    let env = envelopes(&call(&s, r).await.2);
    assert!(env.iter().any(|(_, v)| v["event"].get("keepalive").is_some()), "{env:?}");
}

#[tokio::test]
async fn start_deadline_kills_the_process() {
    let (s, _d) = state();
    let mut r = stream_req(
        "/process.Process/Start",
        r#"{"process":{"cmd":"/bin/sleep","args":["30"]},"tag":"dl"}"#,
    );
    r.headers_mut().insert("connect-timeout-ms", "300".parse().unwrap());
    let t = std::time::Instant::now();
    let env = envelopes(&call(&s, r).await.2);
    assert!(t.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(env.last().unwrap().1["error"]["code"], "deadline_exceeded");
    wait_listed(&s, "dl", false).await;
}

#[tokio::test]
async fn client_streaming_stream_input() {
    let (s, _d) = state();
    let s2 = s.clone();
    let run = tokio::spawn(async move {
        call(
            &s2,
            stream_req(
                "/process.Process/Start",
                r#"{"process":{"cmd":"/bin/cat"},"tag":"cat","stdin":true}"#,
            ),
        )
        .await
    });
    wait_listed(&s, "cat", true).await;
    let mut body = Vec::new();
    body.extend_from_slice(&envelope(0, br#"{"start":{"process":{"tag":"cat"}}}"#));
    body.extend_from_slice(&envelope(0, br#"{"data":{"input":{"stdin":"eA=="}}}"#));
    body.extend_from_slice(&envelope(0, br#"{"keepalive":{}}"#));
    body.extend_from_slice(&envelope(0, br#"{"data":{"input":{"stdin":"eQo="}}}"#));
    let r = Request::post("/process.Process/StreamInput")
        .header("content-type", "application/connect+json")
        .body(Body::from(body))
        .unwrap();
    let env = envelopes(&call(&s, r).await.2);
    assert_eq!(env, vec![(0, serde_json::json!({})), (FLAG_END, serde_json::json!({}))]);
    assert_eq!(
        call(&s, unary("/process.Process/CloseStdin", r#"{"process":{"tag":"cat"}}"#)).await.0,
        StatusCode::OK
    );
    let env = envelopes(&run.await.unwrap().2);
    // The output may arrive in one chunk or several: compare the decoded bytes.
    use base64::Engine as _;
    let out: Vec<u8> = env
        .iter()
        .filter_map(|(_, v)| v["event"]["data"]["stdout"].as_str())
        .flat_map(|chunk| base64::engine::general_purpose::STANDARD.decode(chunk).unwrap())
        .collect();
    assert_eq!(out, b"xy\n");
}

#[tokio::test]
async fn pty_resize_and_input() {
    let (s, _d) = state();
    let s2 = s.clone();
    let run = tokio::spawn(async move {
        call(
            &s2,
            stream_req(
                "/process.Process/Start",
                r#"{"process":{"cmd":"/bin/bash","args":["--norc","-i"]},"pty":{"size":{"cols":80,"rows":24}},"tag":"pty"}"#,
            ),
        )
        .await
    });
    wait_listed(&s, "pty", true).await;
    let upd = r#"{"process":{"tag":"pty"},"pty":{"size":{"cols":120,"rows":40}}}"#;
    assert_eq!(call(&s, unary("/process.Process/Update", upd)).await.0, StatusCode::OK);
    // "stty size; exit\n"
    let inp = r#"{"process":{"tag":"pty"},"input":{"pty":"c3R0eSBzaXplOyBleGl0Cg=="}}"#;
    assert_eq!(call(&s, unary("/process.Process/SendInput", inp)).await.0, StatusCode::OK);
    let bad = r#"{"process":{"tag":"pty"},"input":{"stdin":"eA=="}}"#;
    assert_eq!(
        call(&s, unary("/process.Process/SendInput", bad)).await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    let env =
        tokio::time::timeout(std::time::Duration::from_secs(10), run).await.unwrap().unwrap().2;
    let mut out = Vec::new();
    for (_, v) in envelopes(&env) {
        if let Some(p) = v["event"]["data"]["pty"].as_str() {
            use base64::Engine as _;
            out.extend(base64::engine::general_purpose::STANDARD.decode(p).unwrap());
        }
    }
    assert!(String::from_utf8_lossy(&out).contains("40 120"), "{}", String::from_utf8_lossy(&out));
}

#[tokio::test]
async fn access_token_and_signed_urls() {
    let (s, d) = state();
    let init = Request::post("/init")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"accessToken":"tok","envVars":{"X":"1"}}"#))
        .unwrap();
    let (st, h, _) = call(&s, init).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    assert_eq!(h["x-envd-version"], oka_envd::ENVD_VERSION);
    // RPC without the token: 401 with envd's JSON.
    let (st, h, b) = call(&s, unary("/process.Process/List", "{}")).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    assert_eq!(h["content-type"], "application/json; charset=utf-8");
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&b).unwrap()["code"], 401);
    let mut r = unary("/process.Process/List", "{}");
    r.headers_mut().insert("x-access-token", "tok".parse().unwrap());
    assert_eq!(call(&s, r).await.0, StatusCode::OK);
    // /health stays open.
    assert_eq!(
        call(&s, Request::get("/health").body(Body::empty()).unwrap()).await.0,
        StatusCode::NO_CONTENT
    );
    // /envs needs the token.
    let r = Request::get("/envs").header("x-access-token", "tok").body(Body::empty()).unwrap();
    let (_, _, b) = call(&s, r).await;
    let envs: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!((envs["X"].as_str(), envs["E2B_SANDBOX"].as_str()), (Some("1"), Some("true")));
    // /files: signature.
    let f = d.path().join("s.txt");
    std::fs::write(&f, "signed").unwrap();
    let p = f.to_string_lossy().into_owned();
    let get = |q: String| Request::get(format!("/files?{q}")).body(Body::empty()).unwrap();
    assert_eq!(call(&s, get(format!("path={p}"))).await.0, StatusCode::UNAUTHORIZED);
    let sig = oka_envd::http::file_signature(&p, "read", "", "tok", None);
    let enc = sig.replace('+', "%2B").replace('/', "%2F");
    let (st, _, b) = call(&s, get(format!("path={p}&signature={enc}"))).await;
    assert_eq!((st, &b[..]), (StatusCode::OK, &b"signed"[..]));
    let wrong = oka_envd::http::file_signature(&p, "write", "", "tok", None)
        .replace('+', "%2B")
        .replace('/', "%2F");
    assert_eq!(
        call(&s, get(format!("path={p}&signature={wrong}"))).await.0,
        StatusCode::UNAUTHORIZED
    );
    let old = oka_envd::http::file_signature(&p, "read", "", "tok", Some("1"))
        .replace('+', "%2B")
        .replace('/', "%2F");
    assert_eq!(
        call(&s, get(format!("path={p}&signature={old}&signature_expiration=1"))).await.0,
        StatusCode::UNAUTHORIZED
    );
    // Re-init without proving the token: refused.
    let init = Request::post("/init").body(Body::from(r#"{"accessToken":"other"}"#)).unwrap();
    assert_eq!(call(&s, init).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn files_answers_and_errors() {
    let (s, d) = state();
    let base = d.path().to_string_lossy().into_owned();
    // Octet-stream with gzip, parents created.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, b"zipped").unwrap();
    let r = Request::post(format!("/files?path={base}/a/b/c.txt"))
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body(Body::from(gz.finish().unwrap()))
        .unwrap();
    let (st, h, b) = call(&s, r).await;
    assert_eq!(st, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(h["content-type"], "application/json; charset=utf-8");
    let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        v,
        serde_json::json!([{"path": format!("{base}/a/b/c.txt"), "name": "c.txt", "type": "file"}])
    );
    assert_eq!(std::fs::read_to_string(format!("{base}/a/b/c.txt")).unwrap(), "zipped");
    // Download with gzip accepted: gzipped when that shrinks the file, as it is otherwise (a
    // file this small would grow).
    let download = |path: String| {
        Request::get(format!("/files?path={path}"))
            .header("accept-encoding", "gzip, deflate")
            .body(Body::empty())
            .unwrap()
    };
    let (st, h, b) = call(&s, download(format!("{base}/a/b/c.txt"))).await;
    assert_eq!((st, &b[..]), (StatusCode::OK, &b"zipped"[..]));
    assert!(h.get("content-encoding").is_none());
    assert_eq!(h["content-length"], "6");
    let text = "zipped and zipped again\n".repeat(4000);
    std::fs::write(format!("{base}/a/text.txt"), &text).unwrap();
    let (st, h, b) = call(&s, download(format!("{base}/a/text.txt"))).await;
    assert_eq!((st, h["content-encoding"].to_str().unwrap()), (StatusCode::OK, "gzip"));
    assert!(b.len() < text.len() / 10, "{} bytes", b.len());
    let mut out = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&b[..]), &mut out).unwrap();
    assert_eq!(out, text);
    // Data that does not compress (already compressed, random) goes as it is, at full speed.
    let noise = common::noise(200_000);
    let mut packed = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut packed, &noise).unwrap();
    let packed = packed.finish().unwrap();
    std::fs::write(format!("{base}/a/packed.gz"), &packed).unwrap();
    let (st, h, b) = call(&s, download(format!("{base}/a/packed.gz"))).await;
    assert_eq!(st, StatusCode::OK);
    assert!(b[..] == packed[..], "the file's own bytes ({} of {})", b.len(), packed.len());
    assert!(h.get("content-encoding").is_none());
    assert_eq!(h["content-length"], packed.len().to_string());
    // Errors.
    let get = |q: String| Request::get(format!("/files?{q}")).body(Body::empty()).unwrap();
    let (st, _, b) = call(&s, get(format!("path={base}/missing"))).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["code"], 404);
    assert_eq!(v["message"], format!("path '{base}/missing' does not exist"));
    assert_eq!(call(&s, get(format!("path={base}"))).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(
        call(&s, get(format!("path={base}/x&username=nobody"))).await.0,
        StatusCode::UNAUTHORIZED
    );
    let r = Request::get(format!("/files?path={base}/a/b/c.txt"))
        .header("accept-encoding", "br, identity;q=0")
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&s, r).await.0, StatusCode::NOT_ACCEPTABLE);
    let r = Request::post(format!("/files?path={base}/t"))
        .header("content-type", "text/plain")
        .body(Body::from("x"))
        .unwrap();
    assert_eq!(call(&s, r).await.0, StatusCode::BAD_REQUEST);
    let r = Request::post("/files")
        .header("content-type", "application/octet-stream")
        .body(Body::from("x"))
        .unwrap();
    assert_eq!(call(&s, r).await.0, StatusCode::BAD_REQUEST);
    // Multipart with two parts of the same path: 400.
    let part = |p: &str| {
        format!(
            "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{p}\"\r\nContent-Type: application/octet-stream\r\n\r\nx\r\n"
        )
    };
    let body = format!("{}{}--B--\r\n", part(&format!("{base}/d1")), part(&format!("{base}/d1")));
    let r = Request::post("/files")
        .header("content-type", "multipart/form-data; boundary=B")
        .body(Body::from(body))
        .unwrap();
    assert_eq!(call(&s, r).await.0, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn filesystem_methods_and_watch_stream() {
    let (s, d) = state();
    let base = d.path().to_string_lossy().into_owned();
    let mk = format!(r#"{{"path":"{base}/w/x"}}"#);
    assert_eq!(call(&s, unary("/filesystem.Filesystem/MakeDir", &mk)).await.0, StatusCode::OK);
    assert_eq!(
        call(&s, unary("/filesystem.Filesystem/MakeDir", &mk)).await.0,
        StatusCode::CONFLICT
    );
    // WatchDir (recursive) over a server stream; read until we saw our events.
    let s2 = s.clone();
    let req = stream_req(
        "/filesystem.Filesystem/WatchDir",
        &format!(r#"{{"path":"{base}/w","recursive":true,"includeEntry":true}}"#),
    );
    let resp = app(s2).oneshot(req).await.unwrap();
    let mut body = resp.into_body().into_data_stream();
    use futures::StreamExt as _;
    let mut dec = EnvelopeDecoder::default();
    let first = body.next().await.unwrap().unwrap();
    dec.push(&first);
    let (_, p) = dec.next_envelope().unwrap().unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&p).unwrap(),
        serde_json::json!({"start":{}})
    );
    std::fs::write(format!("{base}/w/x/f.txt"), "1").unwrap();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while !seen.iter().any(|v: &serde_json::Value| {
        v["filesystem"]["name"] == "x/f.txt" && v["filesystem"]["type"] == "EVENT_TYPE_CREATE"
    }) {
        let chunk = tokio::time::timeout_at(deadline, body.next()).await.unwrap().unwrap().unwrap();
        dec.push(&chunk);
        while let Some((_, p)) = dec.next_envelope().unwrap() {
            seen.push(serde_json::from_slice(&p).unwrap());
        }
    }
    let ev = seen.iter().find(|v| v["filesystem"]["name"] == "x/f.txt").unwrap();
    assert_eq!(ev["filesystem"]["entry"]["type"], "FILE_TYPE_FILE");
    // A file written into new directories at once is reported even though it appeared before the
    // recursive watch reached its directory.
    std::fs::create_dir_all(format!("{base}/w/n1/n2")).unwrap();
    std::fs::write(format!("{base}/w/n1/n2/deep.txt"), "2").unwrap();
    while !seen.iter().any(|v: &serde_json::Value| {
        v["filesystem"]["name"] == "n1/n2/deep.txt"
            && v["filesystem"]["type"] == "EVENT_TYPE_CREATE"
    }) {
        let chunk = tokio::time::timeout_at(deadline, body.next()).await.unwrap().unwrap().unwrap();
        dec.push(&chunk);
        while let Some((_, p)) = dec.next_envelope().unwrap() {
            seen.push(serde_json::from_slice(&p).unwrap());
        }
    }
    // Polled watcher errors.
    let (st, _, _) =
        call(&s, unary("/filesystem.Filesystem/GetWatcherEvents", r#"{"watcherId":"nope"}"#)).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _, _) = call(
        &s,
        unary("/filesystem.Filesystem/CreateWatcher", &format!(r#"{{"path":"{base}/none"}}"#)),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // ListDir on a file, Move of a missing source.
    std::fs::write(format!("{base}/file"), "").unwrap();
    let (st, _, _) =
        call(&s, unary("/filesystem.Filesystem/ListDir", &format!(r#"{{"path":"{base}/file"}}"#)))
            .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let mv = format!(r#"{{"source":"{base}/none","destination":"{base}/x"}}"#);
    assert_eq!(call(&s, unary("/filesystem.Filesystem/Move", &mv)).await.0, StatusCode::NOT_FOUND);
    let rm = format!(r#"{{"path":"{base}/none"}}"#);
    assert_eq!(call(&s, unary("/filesystem.Filesystem/Remove", &rm)).await.0, StatusCode::OK);
}

#[tokio::test]
async fn h2c_and_http1_over_loopback() {
    let (s, _d) = state();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(oka_envd::serve(l, s, std::future::pending()));
    // HTTP/2 prior knowledge: the connection preface, then check the server answers with SETTINGS.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let mut head = [0u8; 9];
    c.read_exact(&mut head).await.unwrap();
    assert_eq!(head[3], 0x04, "expected a SETTINGS frame, got {head:?}");
    // HTTP/1.1 chunked streaming request.
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let env = envelope(0, br#"{"process":{"cmd":"/bin/echo","args":["chunked"]}}"#);
    let mut req = b"POST /process.Process/Start HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    req.extend_from_slice(format!("{:x}\r\n", env.len()).as_bytes());
    req.extend_from_slice(&env);
    req.extend_from_slice(b"\r\n0\r\n\r\n");
    c.write_all(&req).await.unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("transfer-encoding: chunked"), "{text}");
    assert!(text.contains("Y2h1bmtlZAo="), "{text}"); // "chunked\n"
}

fn decode_any(body: &[u8]) {
    let mut d = EnvelopeDecoder::default();
    d.push(body);
    while let Ok(Some((_, p))) = d.next_envelope() {
        let _ = Codec::Json.decode::<proto::StartRequest>(&p);
        let _ = Codec::Json.decode::<proto::StreamInputRequest>(&p);
        let _ = Codec::Proto.decode::<proto::EntryInfo>(&p);
        let _ = Codec::Proto.decode::<EventResponse>(&p);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn envelope_and_json_decoding_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        decode_any(&body);
    }

    #[test]
    fn json_like_payloads_never_panic(s in r#"\{("[a-zA-Z_]{1,12}":(\{\}|"[a-zA-Z0-9+/=]{0,12}"|-?[0-9]{1,20}|true|null|\[\])[,]?){0,5}\}"#) {
        decode_any(&envelope(0, s.as_bytes()));
        let _ = Codec::Json.decode::<proto::SendSignalRequest>(s.as_bytes());
        let _ = Codec::Json.decode::<proto::EntryInfo>(s.as_bytes());
    }

    #[test]
    fn envelopes_split_anywhere_decode_the_same(payload in proptest::collection::vec(any::<u8>(), 0..64), cut in 0usize..80) {
        let e = envelope(0, &payload);
        let cut = cut.min(e.len());
        let mut d = EnvelopeDecoder::default();
        d.push(&e[..cut]);
        let early = d.next_envelope().unwrap();
        d.push(&e[cut..]);
        let got = match early { Some(x) => x, None => d.next_envelope().unwrap().unwrap() };
        prop_assert_eq!(got, (0u8, Bytes::from(payload)));
    }
}

#[tokio::test]
async fn files_range_requests() {
    let (s, d) = state();
    let file = d.path().join("r.bin");
    let data: Vec<u8> = (0..100u8).collect();
    std::fs::write(&file, &data).unwrap();
    let get = |range: Option<&str>| {
        let mut r = Request::get(format!("/files?path={}", file.display()));
        if let Some(v) = range {
            r = r.header("range", v);
        }
        r.body(Body::empty()).unwrap()
    };
    // No Range: 200, the whole file, and ranges are advertised.
    let (st, h, b) = call(&s, get(None)).await;
    assert_eq!((st, &b[..]), (StatusCode::OK, &data[..]));
    assert_eq!(h["accept-ranges"], "bytes");
    // bytes=a-b, a-, -n: 206 with Content-Range and the exact bytes.
    for (range, from, to) in [
        ("bytes=10-19", 10, 19),
        ("bytes=90-", 90, 99),
        ("bytes=-5", 95, 99),
        ("bytes=98-500", 98, 99),
    ] {
        let (st, h, b) = call(&s, get(Some(range))).await;
        assert_eq!(st, StatusCode::PARTIAL_CONTENT, "{range}");
        assert_eq!(h["content-range"], format!("bytes {from}-{to}/100"), "{range}");
        assert_eq!(h["content-length"], (to - from + 1).to_string(), "{range}");
        assert_eq!(h["accept-ranges"], "bytes");
        assert_eq!(&b[..], &data[from..=to], "{range}");
    }
    // A suffix longer than the file is the whole file, still as a range.
    let (st, h, b) = call(&s, get(Some("bytes=-1000"))).await;
    assert_eq!((st, &b[..]), (StatusCode::PARTIAL_CONTENT, &data[..]));
    assert_eq!(h["content-range"], "bytes 0-99/100");
    // A range never gzips, even when the client accepts it.
    let r = Request::get(format!("/files?path={}", file.display()))
        .header("range", "bytes=0-9")
        .header("accept-encoding", "gzip")
        .body(Body::empty())
        .unwrap();
    let (st, h, b) = call(&s, r).await;
    assert_eq!((st, &b[..]), (StatusCode::PARTIAL_CONTENT, &data[..10]));
    assert!(h.get("content-encoding").is_none());
    // Unsatisfiable: 416 with `Content-Range: bytes */size` and the JSON error body.
    for range in ["bytes=100-", "bytes=100-200", "bytes=-0"] {
        let (st, h, b) = call(&s, get(Some(range))).await;
        assert_eq!(st, StatusCode::RANGE_NOT_SATISFIABLE, "{range}");
        assert_eq!(h["content-range"], "bytes */100", "{range}");
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["code"], 416);
    }
    // Malformed or multiple ranges, or another unit, are ignored: 200 and the whole file.
    for range in ["bytes=abc", "bytes=5-2", "items=0-1", "bytes=0-1,5-6", "bytes=-"] {
        let (st, _, b) = call(&s, get(Some(range))).await;
        assert_eq!((st, b.len()), (StatusCode::OK, 100), "{range}");
    }
    // An empty file has no satisfiable range.
    let empty = d.path().join("empty");
    std::fs::write(&empty, "").unwrap();
    let r = Request::get(format!("/files?path={}", empty.display()))
        .header("range", "bytes=0-")
        .body(Body::empty())
        .unwrap();
    let (st, h, _) = call(&s, r).await;
    assert_eq!(st, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(h["content-range"], "bytes */0");
}

#[tokio::test]
async fn files_large_upload_and_download_round_trip() {
    // Several MiB in odd-sized body chunks, octet-stream and multipart, then read back whole and
    // in a range: the batched, vectored writer and the chunked reader keep every byte in order.
    let (s, d) = state();
    let data: Vec<u8> =
        (0..3_000_017u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let target = d.path().join("big.bin");
    let chunks: Vec<Result<Bytes, std::io::Error>> =
        data.chunks(7_919).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    let r = Request::post(format!("/files?path={}", target.display()))
        .header("content-type", "application/octet-stream")
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .unwrap();
    assert_eq!(call(&s, r).await.0, StatusCode::OK);
    assert!(std::fs::read(&target).unwrap() == data);
    let mut body = b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x\"\r\nContent-Type: application/octet-stream\r\n\r\n".to_vec();
    body.extend_from_slice(&data);
    body.extend_from_slice(b"\r\n--B--\r\n");
    let chunks: Vec<Result<Bytes, std::io::Error>> =
        body.chunks(65_521).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    let target2 = d.path().join("big2.bin");
    let r = Request::post(format!("/files?path={}", target2.display()))
        .header("content-type", "multipart/form-data; boundary=B")
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .unwrap();
    assert_eq!(call(&s, r).await.0, StatusCode::OK);
    assert!(std::fs::read(&target2).unwrap() == data);
    let r = Request::get(format!("/files?path={}", target.display())).body(Body::empty()).unwrap();
    let (st, _, b) = call(&s, r).await;
    assert!(st == StatusCode::OK && b[..] == data[..]);
    let r = Request::get(format!("/files?path={}", target.display()))
        .header("range", "bytes=1000000-2500000")
        .body(Body::empty())
        .unwrap();
    let (st, _, b) = call(&s, r).await;
    assert!(st == StatusCode::PARTIAL_CONTENT && b[..] == data[1_000_000..=2_500_000]);
}
