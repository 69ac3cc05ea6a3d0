//! The gateway's auth mode through a real `oka serve` with real sandboxes (as root, as CI
//! runs): `gateway.auth.mode: jwt` with an identity provider that does not answer keeps
//! `/readyz` failing and sandboxes requiring traffic auth at 503, while oka's own traffic
//! tokens (E2B's `allowPublicTraffic: false`, and `POST /sandboxes/{id}/traffic-access-token`)
//! pass, a refreshed one at once and the replaced one never again.
//!
//! The sandboxes of the jwt test are created without their agent runtime's `/init`: a request
//! the gateway lets through is answered by envd's `/health` (204) where `oka-envd` is built
//! beside `oka`, else with the gateway's "port is not open" 502; one it refuses gets its own
//! 403/503.

// Test helpers outside `#[test]` functions may unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::Duration;

use support::{OkaServe, http, wait_until};

mod support;

const OKA: &str = env!("CARGO_BIN_EXE_oka");

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n")
}

/// The gateway's answer to `GET /health` of sandbox `id`'s port 49983, with `token` if any.
fn through_gateway(serve: &OkaServe, id: &str, token: Option<&str>) -> (u16, String) {
    let token = token.map(|t| format!("E2b-Traffic-Access-Token: {t}\r\n")).unwrap_or_default();
    through_gateway_with(serve, id, &token)
}

/// [`through_gateway`] with `headers` (each line ending in CRLF).
fn through_gateway_with(serve: &OkaServe, id: &str, extra: &str) -> (u16, String) {
    let headers = format!("E2b-Sandbox-Id: {id}\r\nE2b-Sandbox-Port: 49983\r\n{extra}");
    let (status, body) = http(serve.gateway, "GET", "/health", &headers, "");
    let message = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|b| b["message"].as_str().map(str::to_owned))
        .unwrap_or(body);
    (status, message)
}

/// Whether the gateway let the request through (see the module documentation).
fn passed(answer: (u16, String)) -> bool {
    answer.0 == 204 || answer == (502, "The sandbox is running but port is not open".to_owned())
}

#[test]
fn jwt_mode_waits_for_its_provider_and_oka_tokens_pass_refreshed_at_once() {
    if !is_root() {
        eprintln!("skipped: needs root for real sandboxes");
        return;
    }
    let ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca.path(), "not a certificate").unwrap();
    let nobody = support::free_port();
    let config = format!(
        "defaultPool:\n  replicas: 2\napi:\n  trafficAccessTokenValidity: 2h\ngateway:\n  auth:\n    mode: jwt\n    jwt:\n      discoveryUrl: https://127.0.0.1:{nobody}/.well-known/openid-configuration\n      caFile: {}\n",
        ca.path().display()
    );
    let serve = OkaServe::start(OKA, &config, &[]);
    let auth = format!("X-API-Key: {}\r\n", serve.key());

    // Not ready while the provider's keys cannot be loaded, and it says which check fails.
    wait_until(&serve, "the first verifier load to fail", Duration::from_secs(30), || {
        serve.log().contains("failed to initialize the traffic access token JWT verifier")
    });
    let (status, body) = http(serve.gateway, "GET", "/readyz", "", "");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("gateway-jwt-verifier"), "{body}");

    let create = |body: &str| {
        let mut answer = (0, String::new());
        wait_until(&serve, "a create", Duration::from_secs(120), || {
            answer = http(serve.api, "POST", "/sandboxes", &auth, body);
            answer.0 == 201
        });
        serde_json::from_str::<serde_json::Value>(&answer.1).unwrap()
    };
    let skip_init = r#""metadata":{"e2b.agents.kruise.io/skip-init-runtime":"true"}"#;
    let secured = create(&format!(
        r#"{{"templateID":"base","network":{{"allowPublicTraffic":false}},{skip_init}}}"#
    ));
    let id = secured["sandboxID"].as_str().unwrap().to_owned();
    let first = secured["trafficAccessToken"].as_str().unwrap().to_owned();
    // oka's own token needs no provider; without it the reference's JWT answers apply.
    assert!(passed(through_gateway(&serve, &id, Some(&first))));
    assert_eq!(
        through_gateway(&serve, &id, Some("not-oka-s")),
        (503, "service unavailable: traffic access token verifier is not ready".into())
    );

    let path = format!("/sandboxes/{id}/traffic-access-token");
    let (status, body) = http(serve.api, "POST", &path, &auth, "");
    assert_eq!(status, 200, "{body}");
    let refreshed: serde_json::Value = serde_json::from_str(&body).unwrap();
    let second = refreshed["trafficAccessToken"].as_str().unwrap().to_owned();
    let expiration: jiff::Timestamp =
        refreshed["trafficAccessTokenExpiration"].as_str().unwrap().parse().unwrap();
    let life = expiration.duration_since(jiff::Timestamp::now()).as_secs();
    assert!((7190..=7200).contains(&life), "api.trafficAccessTokenValidity: {life}");
    assert!(passed(through_gateway(&serve, &id, Some(&second))));
    assert_eq!(through_gateway(&serve, &id, Some(&first)).0, 503, "the replaced token is refused");
    let (status, body) = http(serve.api, "POST", &format!("/kruise/api{path}"), &auth, "");
    assert_eq!(status, 200, "{body}");

    // A sandbox that does not require traffic auth passes in jwt mode; it has no token to refresh.
    let open = create(&format!(r#"{{"templateID":"base",{skip_init}}}"#));
    let open_id = open["sandboxID"].as_str().unwrap();
    assert!(passed(through_gateway(&serve, open_id, None)));
    let (status, body) =
        http(serve.api, "POST", &format!("/sandboxes/{open_id}/traffic-access-token"), &auth, "");
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("Sandbox cannot refresh its traffic access token"), "{body}");
}

#[test]
fn a_jwt_mode_without_its_provider_is_refused_at_start_naming_the_field() {
    let state = tempfile::tempdir().unwrap();
    let config = state.path().join("config.yaml");
    std::fs::write(&config, "gateway:\n  auth:\n    mode: jwt\n").unwrap();
    let out = Command::new(OKA)
        .arg("serve")
        .arg("--state-dir")
        .arg(state.path())
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("gateway.auth.jwt.discoveryUrl is required with mode jwt"), "{stderr}");
    assert!(stderr.contains(&config.display().to_string()), "{stderr}");
}

#[test]
fn access_token_mode_admits_only_the_sandboxes_envd_token() {
    if !is_root() {
        eprintln!("skipped: needs root for real sandboxes");
        return;
    }
    if !std::path::Path::new(OKA).with_file_name("oka-envd").exists() {
        eprintln!("skipped: needs oka-envd beside oka (cargo build -p oka-envd)");
        return;
    }
    let config = "defaultPool:\n  replicas: 1\ncodeInterpreterPool:\n  enabled: false\ngateway:\n  auth:\n    mode: accessToken\n";
    let serve = OkaServe::start(OKA, config, &[]);
    let auth = format!("X-API-Key: {}\r\n", serve.key());
    let mut created = (0, String::new());
    wait_until(&serve, "a create", Duration::from_secs(120), || {
        created = http(serve.api, "POST", "/sandboxes", &auth, r#"{"templateID":"base"}"#);
        created.0 == 201
    });
    let created: serde_json::Value = serde_json::from_str(&created.1).unwrap();
    let id = created["sandboxID"].as_str().unwrap();
    let token = created["envdAccessToken"].as_str().unwrap();
    let unauthorized = (401, "unauthorized: invalid or missing access token".to_owned());
    assert_eq!(through_gateway_with(&serve, id, ""), unauthorized);
    assert_eq!(through_gateway_with(&serve, id, "X-Access-Token: wrong\r\n"), unauthorized);
    // The right token reaches envd, which answers its health check itself.
    let (status, body) = through_gateway_with(&serve, id, &format!("X-Access-Token: {token}\r\n"));
    assert!((200..300).contains(&status), "{status} {body}");
    assert_eq!(http(serve.gateway, "GET", "/readyz", "", "").0, 200);
}
