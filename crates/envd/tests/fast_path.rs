//! The zero-copy `/files` path in front of hyper (`oka_envd::fast`), over a real socket: its
//! answers are the router's, refused requests get the router's answers, and a connection carries
//! fast-path and router requests in any order, pipelined or not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use oka_envd::{AppState, Config};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

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

async fn daemon(s: AppState) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(oka_envd::serve(l, s, std::future::pending()));
    addr
}

/// One response: status, headers (lowercased names) and body (Content-Length or chunked).
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// Reads one response from `c`, keeping what follows it in `rest`.
async fn response(c: &mut TcpStream, rest: &mut Vec<u8>) -> Resp {
    async fn fill(c: &mut TcpStream, rest: &mut Vec<u8>) {
        rest.reserve(65536);
        let n = c.read_buf(rest).await.unwrap();
        assert!(n > 0, "connection closed; got so far: {:?}", String::from_utf8_lossy(rest));
    }
    let end = loop {
        if let Some(i) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        fill(c, rest).await;
    };
    let head = String::from_utf8(rest[..end].to_vec()).unwrap();
    rest.drain(..end + 4);
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_ascii_lowercase(), v.trim().to_owned())
        })
        .collect();
    let mut r = Resp { status, headers, body: Vec::new() };
    if let Some(n) = r.header("content-length").map(|v| v.parse::<usize>().unwrap()) {
        while rest.len() < n {
            fill(c, rest).await;
        }
        r.body = rest.drain(..n).collect();
    } else if r.header("transfer-encoding") == Some("chunked") {
        loop {
            let line_end = loop {
                if let Some(i) = rest.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                fill(c, rest).await;
            };
            let n =
                usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16).unwrap();
            rest.drain(..line_end + 2);
            while rest.len() < n + 2 {
                fill(c, rest).await;
            }
            r.body.extend(rest.drain(..n));
            rest.drain(..2);
            if n == 0 {
                break;
            }
        }
    }
    r
}

fn upload(path: &str, body: &[u8], extra: &str) -> Vec<u8> {
    let mut r = format!(
        "POST /files?path={path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

fn chunked_upload(path: &str, body: &[u8], extra: &str) -> Vec<u8> {
    let mut r = format!(
        "POST /files?path={path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n{extra}Transfer-Encoding: chunked\r\n\r\n{:x}\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r.extend_from_slice(b"\r\n0\r\n\r\n");
    r
}

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET /files?path={path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n").into_bytes()
}

#[tokio::test]
async fn fast_path_answers_as_the_router_does() {
    let (s, d) = state();
    let addr = daemon(s).await;
    let base = d.path().to_string_lossy().into_owned();
    let data: Vec<u8> =
        (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();

    // An upload with a length (fast path) and the same upload chunked (router): same answer.
    let fast_path = format!("{base}/new/dir/fast.bin");
    c.write_all(&upload(&fast_path, &data, "")).await.unwrap();
    let fast = response(&mut c, &mut rest).await;
    let routed_path = format!("{base}/new/dir/routed.bin");
    c.write_all(&chunked_upload(&routed_path, &data, "")).await.unwrap();
    let routed = response(&mut c, &mut rest).await;
    assert_eq!((fast.status, routed.status), (200, 200));
    assert_eq!(fast.header("content-type"), routed.header("content-type"));
    assert!(fast.header("date").is_some());
    let v: serde_json::Value = serde_json::from_slice(&fast.body).unwrap();
    assert_eq!(v, serde_json::json!([{"path": fast_path, "name": "fast.bin", "type": "file"}]));
    assert_eq!(std::fs::read(&fast_path).unwrap(), data);
    assert_eq!(std::fs::read(&routed_path).unwrap(), data);

    // Downloads on the same connection, which the router now has: still served, same bytes.
    c.write_all(&get(&fast_path, "")).await.unwrap();
    let r = response(&mut c, &mut rest).await;
    assert_eq!((r.status, r.body.len()), (200, data.len()));
    assert!(r.body == data);
    assert_eq!(r.header("content-disposition"), Some("inline; filename=\"fast.bin\""));
    assert_eq!(r.header("accept-ranges"), Some("bytes"));

    // Accepting gzip (as the Python SDK's client always does): what does not compress comes as
    // it is, what does comes gzipped; one connection, both pipelined.
    let noise = common::noise(1_000_000);
    let noise_path = format!("{base}/noise.bin");
    std::fs::write(&noise_path, &noise).unwrap();
    let text = "a line of text, as logs and sources are\n".repeat(20_000);
    let text_path = format!("{base}/text.txt");
    std::fs::write(&text_path, &text).unwrap();
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();
    let gz = "Accept-Encoding: gzip, deflate\r\n";
    let mut batch = get(&noise_path, gz);
    batch.extend(get(&text_path, gz));
    batch.extend(get(&noise_path, gz));
    c.write_all(&batch).await.unwrap();
    for expect_gzip in [false, true, false] {
        let r = response(&mut c, &mut rest).await;
        assert_eq!(r.status, 200);
        if expect_gzip {
            assert_eq!(r.header("content-encoding"), Some("gzip"));
            let mut out = String::new();
            std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&r.body[..]), &mut out)
                .unwrap();
            assert!(out == text && r.body.len() < text.len() / 10);
        } else {
            assert_eq!(r.header("content-encoding"), None);
            assert_eq!(r.header("content-length"), Some("1000000"));
            assert!(r.body == noise);
        }
    }

    // A fresh connection: download (fast path), upload, download, then a router request, then
    // an upload again; pipelined in one write.
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();
    let small = b"small body".to_vec();
    let p2 = format!("{base}/p2.txt");
    let mut batch = get(&fast_path, "");
    batch.extend(upload(&p2, &small, ""));
    batch.extend(get(&p2, ""));
    batch.extend(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    batch.extend(upload(&p2, b"again", ""));
    batch.extend(get(&p2, ""));
    c.write_all(&batch).await.unwrap();
    let r = response(&mut c, &mut rest).await;
    assert_eq!((r.status, r.body.len()), (200, data.len()));
    assert!(r.body == data);
    let r = response(&mut c, &mut rest).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = response(&mut c, &mut rest).await;
    assert_eq!((r.status, &r.body[..]), (200, &small[..]));
    let r = response(&mut c, &mut rest).await;
    assert_eq!(r.status, 204);
    let r = response(&mut c, &mut rest).await;
    assert_eq!(r.status, 200);
    let r = response(&mut c, &mut rest).await;
    assert_eq!((r.status, &r.body[..]), (200, &b"again"[..]));

    // Errors are the router's: a directory, a missing file; a relative path is in the home.
    for (req, status) in [
        (upload(&base, b"x", ""), 400),
        (get(&format!("{base}/missing"), ""), 404),
        (get(&base, ""), 400),
        (upload("rel.txt", b"x", ""), 200),
    ] {
        let mut c = TcpStream::connect(addr).await.unwrap();
        let mut rest = Vec::new();
        c.write_all(&req).await.unwrap();
        let r = response(&mut c, &mut rest).await;
        assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
        if status != 200 {
            assert_eq!(r.header("content-type"), Some("application/json; charset=utf-8"));
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(v["code"], status);
        }
    }
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();
    // An unknown user: 401.
    let req = upload(&format!("{base}/u"), b"x", "");
    let req = String::from_utf8(req).unwrap().replace("path=", "username=nobody&path=");
    c.write_all(req.as_bytes()).await.unwrap();
    assert_eq!(response(&mut c, &mut rest).await.status, 401);
}

#[tokio::test]
async fn fast_path_keeps_auth_and_survives_cut_uploads() {
    let (s, d) = state();
    let addr = daemon(s).await;
    let base = d.path().to_string_lossy().into_owned();
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();
    let body = br#"{"accessToken":"tok"}"#;
    let init = format!(
        "POST /init HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(init.as_bytes()).await.unwrap();
    c.write_all(body).await.unwrap();
    assert_eq!(response(&mut c, &mut rest).await.status, 204);

    let p = format!("{base}/secret.txt");
    // Without the token: 401 from the router, and nothing written.
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();
    c.write_all(&upload(&p, b"data", "")).await.unwrap();
    let r = response(&mut c, &mut rest).await;
    assert_eq!(r.status, 401);
    assert!(!std::path::Path::new(&p).exists());
    // With it, or with a signature: served.
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();
    c.write_all(&upload(&p, b"data", "X-Access-Token: tok\r\n")).await.unwrap();
    assert_eq!(response(&mut c, &mut rest).await.status, 200);
    let sig = oka_envd::http::file_signature(&p, "read", "", "tok", None)
        .replace('+', "%2B")
        .replace('/', "%2F");
    c.write_all(&get(&format!("{p}&signature={sig}"), "")).await.unwrap();
    let r = response(&mut c, &mut rest).await;
    assert_eq!((r.status, &r.body[..]), (200, &b"data"[..]));
    c.write_all(&get(&p, "X-Access-Token: nope\r\n")).await.unwrap();
    assert_eq!(response(&mut c, &mut rest).await.status, 401);

    // A client that announces more than it sends and goes away: the daemon keeps serving.
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut req = upload(&format!("{base}/cut.bin"), &[7u8; 1000], "X-Access-Token: tok\r\n");
    req.truncate(req.len() - 400);
    c.write_all(&req).await.unwrap();
    c.shutdown().await.unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();
    c.write_all(&get(&p, "X-Access-Token: tok\r\n")).await.unwrap();
    assert_eq!(response(&mut c, &mut rest).await.status, 200);
}

/// A tmpfs of `size` mounted on `dir`, unmounted when dropped (the tests run as root).
struct SmallFs(std::path::PathBuf);

impl SmallFs {
    fn mount(dir: std::path::PathBuf, size: &str) -> Self {
        use std::os::unix::ffi::OsStrExt as _;
        std::fs::create_dir_all(&dir).unwrap();
        let target = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        let data = std::ffi::CString::new(format!("size={size}")).unwrap();
        // SAFETY: every pointer is a valid C string for the duration of the call.
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                data.as_ptr().cast(),
            )
        };
        assert_eq!(
            rc,
            0,
            "mount a tmpfs (run the tests as root): {}",
            std::io::Error::last_os_error()
        );
        Self(dir)
    }

    fn free_bytes(&self) -> u64 {
        let s = rustix::fs::statvfs(&self.0).unwrap();
        s.f_bfree * s.f_frsize
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        use std::os::unix::ffi::OsStrExt as _;
        let target = std::ffi::CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: the pointer is a valid C string for the duration of the call.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

#[tokio::test]
async fn an_upload_larger_than_the_free_space_is_refused_before_its_body_is_sent() {
    let (s, d) = state();
    let addr = daemon(s).await;
    let fs = SmallFs::mount(d.path().join("small"), "1m");
    let free = fs.free_bytes();
    let p = format!("{}/big.bin", fs.0.display());

    // The head and the first 64 KiB of an 8 MiB body: the 507 comes without the rest.
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();
    let mut req = upload(&p, &vec![1u8; 8 << 20], "");
    req.truncate(req.len() - (8 << 20) + (64 << 10));
    c.write_all(&req).await.unwrap();
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), response(&mut c, &mut rest))
        .await
        .expect("an answer without the rest of the body");
    assert_eq!(r.status, 507, "{}", String::from_utf8_lossy(&r.body));
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["code"], 507, "{body}");
    // Nothing of the space stays taken.
    assert_eq!(std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0), 0);
    assert_eq!(fs.free_bytes(), free);

    // What fits is written.
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();
    c.write_all(&upload(&p, &[2u8; 256 << 10], "")).await.unwrap();
    assert_eq!(response(&mut c, &mut rest).await.status, 200);
    assert_eq!(std::fs::read(&p).unwrap(), vec![2u8; 256 << 10]);
}

#[tokio::test]
async fn an_upload_that_trickles_in_is_written_whole() {
    // Pieces smaller than the mark the splice waits for, with pauses longer than that wait:
    // the daemon takes what has arrived and goes on waiting for the rest.
    let (s, d) = state();
    let addr = daemon(s).await;
    let p = format!("{}/slow.bin", d.path().display());
    let body: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
    let req = upload(&p, &body, "");
    let head_len = req.len() - body.len();
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();
    c.write_all(&req[..head_len + 1000]).await.unwrap();
    let mut sent = head_len + 1000;
    for piece in [20_000, 200_000, 1, usize::MAX] {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let end = sent.saturating_add(piece).min(req.len());
        c.write_all(&req[sent..end]).await.unwrap();
        sent = end;
    }
    let r = response(&mut c, &mut rest).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(std::fs::read(&p).unwrap() == body);
    // The connection serves the next request at once.
    c.write_all(&get(&p, "")).await.unwrap();
    let r = tokio::time::timeout(std::time::Duration::from_secs(5), response(&mut c, &mut rest))
        .await
        .expect("the next request is read without waiting for a low mark");
    assert_eq!(r.body.len(), body.len());
}

#[tokio::test]
async fn a_file_cut_short_during_its_download_closes_that_connection_only() {
    // The download is sent from a mapping of the file. A file truncated under it must cut that
    // one download short (the head promised more) and nothing else: a read of a truncated mapping
    // in the daemon would kill it (SIGBUS), and this test with it.
    let (s, d) = state();
    let addr = daemon(s).await;
    let p = format!("{}/shrinking.bin", d.path().display());
    let len = 64usize << 20;
    std::fs::write(&p, vec![7u8; len]).unwrap();
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&get(&p, "")).await.unwrap();
    // Read a little so the head and the first bytes have come, then let the socket fill up.
    let mut first = vec![0u8; 64 << 10];
    c.read_exact(&mut first).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    std::fs::File::options().write(true).open(&p).unwrap().set_len(0).unwrap();
    let mut got = first.len();
    let mut buf = vec![0u8; 1 << 20];
    let read_all = async {
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), read_all)
        .await
        .expect("the connection is closed, not left hanging");
    assert!(got < len, "all {got} bytes came of a file cut to nothing");

    // The daemon goes on serving, the same file included.
    std::fs::write(&p, b"whole again").unwrap();
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();
    c.write_all(&get(&p, "")).await.unwrap();
    let r = response(&mut c, &mut rest).await;
    assert_eq!((r.status, &r.body[..]), (200, &b"whole again"[..]));
}

/// `POST /init` with `body`; `chunked` sends the same body chunked (which only hyper serves).
fn init(body: &str, extra: &str, chunked: bool) -> Vec<u8> {
    let head = "POST /init HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
    if chunked {
        format!(
            "{head}{extra}Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            body.len()
        )
    } else {
        format!("{head}{extra}Content-Length: {}\r\n\r\n{body}", body.len())
    }
    .into_bytes()
}

#[tokio::test]
async fn init_is_answered_as_the_router_does_and_the_connection_goes_on() {
    let (s, d) = state();
    let addr = daemon(s).await;
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();
    let first = r#"{"envVars":{"A":"1"},"accessToken":"tok"}"#;
    c.write_all(&init(first, "", false)).await.unwrap();
    let r = response(&mut c, &mut rest).await;
    assert_eq!(r.status, 204);
    assert_eq!(r.header("x-envd-version"), Some(oka_envd::ENVD_VERSION));
    assert_eq!(r.header("content-length"), None, "a 204 has no length");
    assert!(r.header("date").is_some() && r.body.is_empty());

    // Refusals, each sent with a length (answered here) and chunked (the router): same answers.
    let refusals = [
        (r#"{"accessToken":"other"}"#, "", 401),
        ("{not json", "X-Access-Token: tok\r\n", 400),
        (r#"{"accessToken":"tok","defaultUser":"nobody"}"#, "", 400),
    ];
    for (body, extra, status) in refusals {
        c.write_all(&init(body, extra, false)).await.unwrap();
        let here = response(&mut c, &mut rest).await;
        let mut routed_conn = TcpStream::connect(addr).await.unwrap();
        let mut routed_rest = Vec::new();
        routed_conn.write_all(&init(body, extra, true)).await.unwrap();
        let routed = response(&mut routed_conn, &mut routed_rest).await;
        assert_eq!((here.status, routed.status), (status, status), "{body}");
        assert_eq!(here.body, routed.body, "{body}");
        assert_eq!(here.header("content-type"), routed.header("content-type"));
    }

    // The same connection carries a replay (same token, new env vars), a file upload and download,
    // and an init whose body arrives after its head (handed to the router).
    let p = format!("{}/after-init.txt", d.path().display());
    let mut batch = init(r#"{"envVars":{"B":"2"},"accessToken":"tok"}"#, "", false);
    let token = "X-Access-Token: tok\r\n";
    batch.extend(upload(&p, b"hello", token));
    batch.extend(get(&p, token));
    c.write_all(&batch).await.unwrap();
    assert_eq!(response(&mut c, &mut rest).await.status, 204);
    assert_eq!(response(&mut c, &mut rest).await.status, 200);
    let r = response(&mut c, &mut rest).await;
    assert_eq!((r.status, &r.body[..]), (200, &b"hello"[..]));
    let late = init(r#"{"envVars":{"C":"3"},"accessToken":"tok"}"#, "", false);
    let split = late.len() - 10;
    c.write_all(&late[..split]).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    c.write_all(&late[split..]).await.unwrap();
    assert_eq!(response(&mut c, &mut rest).await.status, 204);
    c.write_all(b"GET /envs HTTP/1.1\r\nHost: x\r\nX-Access-Token: tok\r\n\r\n").await.unwrap();
    let r = response(&mut c, &mut rest).await;
    let envs: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!((envs.get("A"), envs.get("B"), &envs["C"]), (None, None, &serde_json::json!("3")));
}

#[tokio::test]
async fn an_upload_sets_the_whole_metadata_on_both_paths() {
    let (s, d) = state();
    let addr = daemon(s).await;
    let path = format!("{}/meta.txt", d.path().display());
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();
    let with = "X-Metadata-Owner: oka\r\nX-Metadata-Purpose: test\r\n";
    let long = format!("X-Metadata-Big: {}\r\n", "v".repeat(1025));
    // (request, status, metadata in the answer and on the file)
    let steps: [(Vec<u8>, u16, serde_json::Value); 6] = [
        (upload(&path, b"1", with), 200, serde_json::json!({"owner": "oka", "purpose": "test"})),
        (upload(&path, b"2", ""), 200, serde_json::json!({})),
        (
            chunked_upload(&path, b"3", "X-Metadata-Owner: router\r\n"),
            200,
            serde_json::json!({"owner": "router"}),
        ),
        (chunked_upload(&path, b"4", ""), 200, serde_json::json!({})),
        (upload(&path, b"5", "X-Metadata-A: 1\r\n"), 200, serde_json::json!({"a": "1"})),
        (upload(&path, b"6", &long), 400, serde_json::json!({"a": "1"})),
    ];
    for (i, (request, status, metadata)) in steps.into_iter().enumerate() {
        c.write_all(&request).await.unwrap();
        let r = response(&mut c, &mut rest).await;
        assert_eq!(r.status, status, "step {i}: {}", String::from_utf8_lossy(&r.body));
        if status == 200 {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            let answered = v[0].get("metadata").cloned().unwrap_or(serde_json::json!({}));
            assert_eq!(answered, metadata, "step {i}: the answer");
        } else {
            // A refused upload closes a fast-path connection (its body may still be coming).
            c = TcpStream::connect(addr).await.unwrap();
            rest.clear();
        }
        let stored: serde_json::Value =
            serde_json::to_value(oka_envd::meta::read(std::path::Path::new(&path))).unwrap();
        assert_eq!(stored, metadata, "step {i}: the file");
    }
}
