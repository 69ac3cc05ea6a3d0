//! The official `e2b-code-interpreter` Python SDK (newest release, in `.venv/e2b-latest` from
//! `scripts/setup-e2b-sdk.sh`) against the real `oka-interpreter` binary and ipykernel.
//!
//! A stand-in control plane answers `Sandbox.create` (with an envd access token) and kill;
//! `E2B_SANDBOX_URL` points the SDK's port-49999 traffic at our server, which fetches global env vars
//! from a stand-in envd `/envs` that checks the token. With the kernels of
//! `scripts/install-kernels.sh` (which `scripts/test.sh` installs as root), `tests/sdk/parity.py`
//! checks results, charts and every language's contexts too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::routing::{delete, post};
use std::path::PathBuf;

const TOKEN: &str = "envd-test-token";

fn venv_python() -> PathBuf {
    let root = std::env::var_os("OKA_E2B_VENV_ROOT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv"),
        PathBuf::from,
    );
    let py = root.join("e2b-latest/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run scripts/setup-e2b-sdk.sh first (it installs e2b-code-interpreter)",
        py.display()
    );
    py
}

async fn control_plane() -> std::net::SocketAddr {
    let create = || async {
        let body = serde_json::json!({
            "templateID": "code-interpreter-v1", "sandboxID": "oka0interp0sandbox01",
            "clientID": "oka", "envdVersion": "0.6.13", "envdAccessToken": TOKEN,
            "trafficAccessToken": null, "domain": null, "alias": "code-interpreter-v1",
        });
        (
            http::StatusCode::CREATED,
            [(http::header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
    };
    let app = axum::Router::new()
        .route("/v2/sandboxes", post(create))
        .route("/sandboxes", post(create))
        .route("/sandboxes/{id}", delete(|| async { http::StatusCode::NO_CONTENT }));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

#[tokio::test]
async fn sdk_latest() {
    if !common::have_ipykernel() {
        return;
    }
    let python = venv_python();
    let envd = common::FakeEnvd::start().await;
    *envd.token.lock().unwrap() = Some(TOKEN.into());
    envd.envs.lock().unwrap().insert("GLOBAL_VAR".into(), "from-envd".into());
    envd.envs.lock().unwrap().insert("G_VAR".into(), "from-sandbox".into());
    let server = common::Server::start(&envd.url, &[]).await;
    let api = control_plane().await;
    let driver = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/driver.py");
    let out = tokio::process::Command::new(&python)
        .arg(&driver)
        .env("E2B_API_KEY", "e2b_0000000000000000000000000000000000000000")
        .env("E2B_API_URL", format!("http://{api}"))
        .env("E2B_SANDBOX_URL", format!("http://{}", server.addr))
        .env("OKA_KERNELS", if common::have_all_kernels() { "all" } else { "python" })
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_DOMAIN")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "SDK driver failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("OK "), "driver did not finish:\n{stdout}\n{stderr}");
}
