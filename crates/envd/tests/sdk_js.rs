//! The official `e2b` JavaScript SDK (newest release on npm) against oka-envd.
//!
//! The same harness as `sdk_python.rs`: the daemon on a loopback port and a tiny fake control plane
//! that answers the SDK's create/kill calls, pushing `/init` (token, default user `user`, env vars)
//! first like the real control plane. `E2B_API_URL` and `E2B_SANDBOX_URL` (the JS SDK honours the same
//! variables as the Python one) point the SDK at them. The SDK comes from `scripts/setup-e2b-sdk.sh`
//! (`.venv/e2b-js`); without it this test fails (it does not skip). The JS SDK speaks Connect with the
//! JSON codec over undici's fetch (HTTP/1.1 on plain http), like the Python SDK.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use axum::extract::State;
use axum::routing::{delete, post};
use std::path::PathBuf;
use std::process::Command;

const SANDBOX_ID: &str = "oka0test0sandbox0001";
const TOKEN: &str = "envd-test-token";
/// A uid that no real account uses, for the test's `user`.
const TEST_UID: u32 = 61_235;

/// The npm project holding `node_modules/e2b`.
fn sdk_dir() -> PathBuf {
    let root = std::env::var_os("OKA_E2B_VENV_ROOT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv"),
        PathBuf::from,
    );
    let dir = root.join("e2b-js");
    assert!(
        dir.join("node_modules/e2b/package.json").exists() && dir.join("node").exists(),
        "{} is missing: run scripts/setup-e2b-sdk.sh first (it installs the e2b JavaScript SDK)",
        dir.display()
    );
    dir
}

#[derive(Clone)]
struct Plane {
    envd: String,
}

async fn create(State(p): State<Plane>) -> impl axum::response::IntoResponse {
    // Like the real control plane: initialise envd before answering.
    let r = reqwest_init(&p.envd).await;
    assert!(r, "envd /init failed");
    let body = serde_json::json!({
        "templateID": "base", "sandboxID": SANDBOX_ID, "clientID": "oka",
        "envdVersion": oka_envd::ENVD_VERSION, "envdAccessToken": TOKEN,
        "trafficAccessToken": null, "domain": null, "alias": "base",
    });
    (
        http::StatusCode::CREATED,
        [(http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
}

async fn kill() -> http::StatusCode {
    http::StatusCode::NO_CONTENT
}

/// POST /init over a raw HTTP/1.1 connection (no HTTP client dependency needed).
async fn reqwest_init(envd: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = serde_json::json!({
        "accessToken": TOKEN, "defaultUser": "user",
        "envVars": {"GLOBAL_VAR": "from-init"},
    })
    .to_string();
    let mut s = tokio::net::TcpStream::connect(envd).await.unwrap();
    let req = format!(
        "POST /init HTTP/1.1\r\nHost: x\r\nX-Access-Token: {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.starts_with("HTTP/1.1 204")
}

async fn serve_both(passwd: PathBuf) -> (std::net::SocketAddr, std::net::SocketAddr) {
    let config =
        oka_envd::Config { passwd, sandbox_id: Some(SANDBOX_ID.into()), ..Default::default() };
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let envd_addr = l.local_addr().unwrap();
    tokio::spawn(oka_envd::serve(l, oka_envd::AppState::new(config), std::future::pending()));
    let plane = Plane { envd: envd_addr.to_string() };
    let api = axum::Router::new()
        .route("/v2/sandboxes", post(create))
        .route("/sandboxes", post(create))
        .route("/sandboxes/{id}", delete(kill))
        .with_state(plane);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, api).await });
    (envd_addr, api_addr)
}

#[test]
fn sdk_js_latest() {
    let sdk = sdk_dir();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home/user");
    std::fs::create_dir_all(&home).unwrap();
    let root = rustix::process::geteuid().is_root();
    let uid = if root { TEST_UID } else { rustix::process::geteuid().as_raw() };
    let gid = if root { TEST_UID } else { rustix::process::getegid().as_raw() };
    if root {
        std::os::unix::fs::chown(&home, Some(uid), Some(gid)).unwrap();
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    let passwd = dir.path().join("passwd");
    std::fs::write(
        &passwd,
        format!(
            "root:x:0:0:root:/root:/bin/bash\nuser:x:{uid}:{gid}::{}:/bin/bash\n",
            home.display()
        ),
    )
    .unwrap();

    let (tx, rx) = std::sync::mpsc::channel();
    let passwd2 = passwd.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let addrs = serve_both(passwd2).await;
            tx.send(addrs).unwrap();
            std::future::pending::<()>().await;
        });
    });
    let (envd_addr, api_addr) = rx.recv().unwrap();

    let driver = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/driver.mjs");
    // The node chosen by the setup script (the machine's, or a newer one it installed).
    let out = Command::new(sdk.join("node"))
        .arg(&driver)
        .env("OKA_E2B_JS", &sdk)
        .env("E2B_API_KEY", "e2b_0000000000000000000000000000000000000000")
        .env("E2B_API_URL", format!("http://{api_addr}"))
        .env("E2B_SANDBOX_URL", format!("http://{envd_addr}"))
        .env("OKA_TEST_HOME", &home)
        .env("OKA_TEST_UID", uid.to_string())
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_DOMAIN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "SDK driver failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("OK "), "driver did not finish:\n{stdout}\n{stderr}");
}
