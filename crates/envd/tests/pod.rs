//! How a Kubernetes Pod gets envd into any image: `--install` copies the binary into a shared
//! volume (an init container of a `FROM scratch` image has no `cp`), and `--detach` starts it
//! from a `postStart` exec hook, which waits until the command and its output streams are done.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read as _, Write as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: envd\r\nConnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

#[test]
fn an_installed_copy_detaches_with_its_port_open_and_returns_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let installed = dir.path().join("oka-envd");
    let status = Command::new(env!("CARGO_BIN_EXE_oka-envd"))
        .arg("--install")
        .arg(&installed)
        .status()
        .unwrap();
    assert!(status.success());
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&installed.metadata().unwrap().permissions());
    assert_eq!(mode & 0o777, 0o755);

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let started = Instant::now();
    // `output` waits for the streams to close, as a postStart exec does.
    let output = Command::new(&installed)
        .args(["--detach", "--addr", "127.0.0.1", "--port", &port.to_string()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "detach took {:?}", started.elapsed());
    // The port was bound before the command returned.
    let health = get(port, "/health").expect("envd answers at once");
    assert!(health.starts_with("HTTP/1.1 204") || health.starts_with("HTTP/1.1 200"), "{health}");

    // Stop the daemon: a process it starts signals its parent.
    let json = serde_json::json!({"process": {"cmd": "/bin/sh", "args": ["-c", "kill -TERM $PPID"], "user": "root"}});
    let payload = serde_json::to_vec(&json).unwrap();
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&payload);
    if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
        let head = format!(
            "POST /process.Process/Start HTTP/1.1\r\nHost: envd\r\nContent-Type: application/connect+json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = s.write_all(head.as_bytes());
        let _ = s.write_all(&body);
        let mut sink = Vec::new();
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = s.read_to_end(&mut sink);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(port, "/health").is_some() {
        assert!(Instant::now() < deadline, "the detached envd did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}
