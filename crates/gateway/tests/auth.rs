//! The gateway's auth modes end to end: a real gateway over a real embedded store, real
//! upstreams on loopback, and for `jwt` a real OIDC provider over HTTPS on loopback (its own CA)
//! whose keys sign the tokens.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::idp::{self, Doc};
use common::*;
use oka_api::{Sandbox, SandboxPhase, annotations, labels};
use oka_gateway::AuthMode;
use oka_gateway::oidc::{self, OidcOptions};
use serde_json::json;
use sha2::Digest;

/// A running claimed sandbox `name` with public ID `id` and these annotations.
fn sandbox(name: &str, id: &str, notes: &[(&str, &str)]) -> Sandbox {
    let mut builder = Sandbox::test().name(name).claimed().label(labels::SANDBOX_ID, id);
    for (k, v) in notes {
        builder = builder.annotation(k, v);
    }
    builder.phase(SandboxPhase::Running).ready().build()
}

/// A request through the relay (plain HTTP/1.1) and one through hyper (`Expect` hands the
/// connection over): both paths must decide alike.
async fn both_paths(
    addr: std::net::SocketAddr,
    host: &str,
    headers: &[(&str, &str)],
) -> (Answer, Answer) {
    let relay = send(addr, "GET", host, "/echo", headers, "").await;
    let mut expect = headers.to_vec();
    expect.push(("expect", "100-continue"));
    let hyper = send(addr, "POST", host, "/echo", &expect, "x").await;
    (relay, hyper)
}

#[tokio::test]
async fn access_token_mode_checks_x_access_token_on_both_paths() {
    let (store, _dir) = store();
    create(
        &store,
        &sandbox("guarded", "guarded", &[(annotations::RUNTIME_ACCESS_TOKEN, "envd-secret")]),
    )
    .await;
    create(&store, &sandbox("open", "open", &[])).await;
    let up = upstream().await;
    let dialer = MapDialer::default();
    dialer.map("guarded", 49983, up.addr);
    dialer.map("open", 49983, up.addr);
    let mut config = config();
    config.auth = AuthMode::AccessToken;
    let gw = gateway(&store, &dialer, config).await;
    let host = format!("49983-guarded.{DOMAIN}");

    for headers in [&[][..], &[("x-access-token", "wrong")][..]] {
        let (relay, hyper) = both_paths(gw.addr, &host, headers).await;
        for answer in [relay, hyper] {
            assert_eq!(answer.status, 401);
            assert_eq!(answer.json()["message"], "unauthorized: invalid or missing access token");
        }
    }
    assert_eq!(up.requests.load(Ordering::SeqCst), 0, "refused requests never reach the sandbox");
    let headers = [("X-Access-Token", "envd-secret"), ("e2b-traffic-access-token", "kept")];
    let (relay, hyper) = both_paths(gw.addr, &host, &headers).await;
    for answer in [relay, hyper] {
        assert_eq!(answer.status, 200);
        assert_eq!(answer.json()["accessToken"], "envd-secret", "forwarded untouched");
        assert_eq!(answer.json()["trafficToken"], "kept", "not this mode's header");
    }
    // A sandbox without an access token passes without one.
    let open = get(gw.addr, &format!("49983-open.{DOMAIN}"), "/echo").await;
    assert_eq!(open.status, 200);
}

#[tokio::test]
async fn without_a_verifier_a_sandbox_requiring_traffic_auth_is_unavailable() {
    let (store, _dir) = store();
    create(&store, &sandbox("jwt", "jwt", &[(annotations::ENABLE_JWT_AUTH, "true")])).await;
    let up = upstream().await;
    let dialer = MapDialer::default();
    dialer.map("jwt", 49983, up.addr);
    for mode in [AuthMode::None, AuthMode::AccessToken, AuthMode::Jwt] {
        let mut config = config();
        config.auth = mode;
        let gw = gateway(&store, &dialer, config).await;
        assert_eq!(gw.gateway.jwt_ready(), mode != AuthMode::Jwt);
        let (relay, hyper) = both_paths(
            gw.addr,
            &format!("49983-jwt.{DOMAIN}"),
            &[("e2b-traffic-access-token", "t")],
        )
        .await;
        for answer in [relay, hyper] {
            assert_eq!(answer.status, 503, "{mode:?}");
            assert_eq!(
                answer.json()["message"],
                "service unavailable: traffic access token verifier is not ready"
            );
        }
    }
    assert_eq!(up.requests.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn jwt_mode_verifies_tokens_of_a_real_identity_provider() {
    let (store, dir) = store();
    let secured =
        create(&store, &sandbox("sec", "sec-id", &[(annotations::ENABLE_JWT_AUTH, "true")])).await;
    let uid = secured.metadata.uid.clone().unwrap();
    let other =
        create(&store, &sandbox("other", "other-id", &[(annotations::ENABLE_JWT_AUTH, "true")]))
            .await;
    create(&store, &sandbox("plain", "plain-id", &[])).await;
    // oka's own opaque token on a sandbox that also requires traffic auth.
    let opaque = "e2b-opaque-token";
    let hash: String =
        sha2::Sha256::digest(opaque.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    create(
        &store,
        &sandbox(
            "e2b",
            "e2b-id",
            &[
                (annotations::ENABLE_JWT_AUTH, "true"),
                (annotations::TRAFFIC_ACCESS_TOKEN_SHA256, &hash),
            ],
        ),
    )
    .await;
    let up = upstream().await;
    let dialer = MapDialer::default();
    for name in ["sec", "other", "plain", "e2b"] {
        dialer.map(name, 49983, up.addr);
    }
    let mut config = config();
    config.auth = AuthMode::Jwt;
    let gw = gateway(&store, &dialer, config).await;

    // The provider is not up yet: the loader retries, the gateway is not ready.
    let pki = idp::pki();
    let ca_file = dir.path().join("idp-ca.crt");
    std::fs::write(&ca_file, &pki.ca_pem).unwrap();
    let port = closed_port().await.port();
    let mut options = OidcOptions::new(
        format!("https://127.0.0.1:{port}/.well-known/openid-configuration"),
        &ca_file,
    );
    options.refresh_interval = Duration::from_secs(3600);
    gw.gateway.start_jwt_verifier(options);
    let host = |id: &str| format!("49983-{id}.{DOMAIN}");
    eventually("a first failed load", || async { gw.gateway.jwt_auth().last_error().is_some() })
        .await;
    assert!(!gw.gateway.jwt_ready());
    let early = get(gw.addr, &host("sec-id"), "/echo").await;
    assert_eq!(early.status, 503);
    // oka's opaque token needs no provider.
    let e2b =
        send(gw.addr, "GET", &host("e2b-id"), "/echo", &[("e2b-traffic-access-token", opaque)], "")
            .await;
    assert_eq!(e2b.status, 200);
    assert_eq!(e2b.json()["trafficToken"], json!(null), "stripped");

    let provider =
        idp::start(tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap(), &pki);
    provider.serve_standard();
    eventually("the verifier to load (backoff 1 s, 2 s, ...)", || async { gw.gateway.jwt_ready() })
        .await;

    let token = provider.token("sec-id", &uid);
    let headers = [("E2B-Traffic-Access-Token", token.as_str()), ("x-access-token", "envd")];
    let (relay, hyper) = both_paths(gw.addr, &host("sec-id"), &headers).await;
    for answer in [relay, hyper] {
        assert_eq!(answer.status, 200);
        assert_eq!(answer.json()["trafficToken"], json!(null), "the verified token is stripped");
        assert_eq!(answer.json()["accessToken"], "envd", "x-access-token is forwarded untouched");
    }
    // The same token for another sandbox, a token naming the right ID with another UID.
    let mismatch = "forbidden: traffic access token does not match sandbox";
    let (relay, hyper) =
        both_paths(gw.addr, &host("other-id"), &[("e2b-traffic-access-token", &token)]).await;
    for answer in [relay, hyper] {
        assert_eq!(answer.status, 403);
        assert_eq!(answer.json()["message"], mismatch);
    }
    let stale = provider.token("other-id", &uid);
    assert_ne!(other.metadata.uid.as_deref(), Some(uid.as_str()));
    let answer =
        send(gw.addr, "GET", &host("other-id"), "/", &[("e2b-traffic-access-token", &stale)], "")
            .await;
    assert_eq!((answer.status, answer.json()["message"].clone()), (403, json!(mismatch)));
    let invalid = "forbidden: invalid or missing traffic access token";
    for headers in [&[][..], &[("e2b-traffic-access-token", "garbage")][..]] {
        let answer = send(gw.addr, "GET", &host("sec-id"), "/", headers, "").await;
        assert_eq!((answer.status, answer.json()["message"].clone()), (403, json!(invalid)));
    }
    // A token of a key the provider does not publish.
    let impostor = idp::start(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(), &pki);
    let forged = impostor.token("sec-id", &uid).replace(&impostor.issuer(), &provider.issuer());
    let answer =
        send(gw.addr, "GET", &host("sec-id"), "/", &[("e2b-traffic-access-token", &forged)], "")
            .await;
    assert_eq!(answer.status, 403);
    // A sandbox that does not require traffic auth passes, the header removed.
    let plain =
        send(gw.addr, "GET", &host("plain-id"), "/echo", &[("e2b-traffic-access-token", "x")], "")
            .await;
    assert_eq!(plain.status, 200);
    assert_eq!(plain.json()["trafficToken"], json!(null));
    // Both kinds of token work on the E2B sandbox.
    let e2b =
        send(gw.addr, "GET", &host("e2b-id"), "/", &[("e2b-traffic-access-token", opaque)], "")
            .await;
    assert_eq!(e2b.status, 200);
}

/// An identity provider on loopback serving its standard documents, and its CA written in `dir`.
async fn standard_provider(dir: &std::path::Path) -> (idp::Idp, std::path::PathBuf) {
    let pki = idp::pki();
    let ca_file = dir.join("ca.crt");
    std::fs::write(&ca_file, &pki.ca_pem).unwrap();
    let provider = idp::start(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(), &pki);
    provider.serve_standard();
    (provider, ca_file)
}

#[tokio::test]
async fn loading_refuses_what_the_reference_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let (provider, ca_file) = standard_provider(dir.path()).await;
    let options = OidcOptions::new(provider.discovery_url(), &ca_file);
    let verifier = oidc::load(&options).await.unwrap();
    assert_eq!(verifier.issuer(), provider.issuer());

    let error =
        |options: OidcOptions| async move { oidc::load(&options).await.unwrap_err().to_string() };
    // Discovery over plain HTTP is refused before any request.
    let plain = OidcOptions::new(provider.discovery_url().replace("https", "http"), &ca_file);
    assert!(error(plain).await.contains("must be an absolute HTTPS URL"));
    // Only the configured CA is trusted.
    let other_ca = dir.path().join("other.crt");
    std::fs::write(&other_ca, idp::pki().ca_pem).unwrap();
    assert!(error(OidcOptions::new(provider.discovery_url(), &other_ca)).await.contains("TLS"));
    std::fs::write(dir.path().join("empty.crt"), "no pem here").unwrap();
    let empty = OidcOptions::new(provider.discovery_url(), dir.path().join("empty.crt"));
    assert!(error(empty).await.contains("no valid PEM certificates"));
    let missing = OidcOptions::new(provider.discovery_url(), dir.path().join("missing.crt"));
    assert!(error(missing).await.contains("CA bundle"));

    let discovery = "/.well-known/openid-configuration";
    let with_discovery = |doc: serde_json::Value| {
        provider.set(discovery, Doc::json(&doc));
        OidcOptions::new(provider.discovery_url(), &ca_file)
    };
    let jwks = format!("{}/jwks", provider.issuer());
    let http_jwks = with_discovery(
        json!({"issuer": provider.issuer(), "jwks_uri": jwks.replace("https", "http")}),
    );
    assert!(error(http_jwks).await.contains("jwks_uri must be an absolute HTTPS URL"));
    let http_issuer = with_discovery(json!({"issuer": "http://idp", "jwks_uri": jwks}));
    assert!(error(http_issuer).await.contains("the issuer must be an absolute HTTPS URL"));
    // Redirects are not followed; other statuses fail.
    provider.set(
        discovery,
        Doc { status: 302, headers: vec![("location".into(), "/elsewhere".into())], body: vec![] },
    );
    assert!(error(OidcOptions::new(provider.discovery_url(), &ca_file)).await.contains("302"));
    provider.serve_standard();
    provider.set("/jwks", Doc { status: 500, headers: vec![], body: vec![] });
    assert!(error(OidcOptions::new(provider.discovery_url(), &ca_file)).await.contains("500"));
    // Documents over 1 MiB are refused.
    provider.set("/jwks", Doc { status: 200, headers: vec![], body: vec![b' '; (1 << 20) + 1] });
    assert!(
        error(OidcOptions::new(provider.discovery_url(), &ca_file)).await.contains("read body")
    );
    // The key set's own rules.
    provider.set("/jwks", Doc::json(&json!({"keys": []})));
    assert!(
        error(OidcOptions::new(provider.discovery_url(), &ca_file))
            .await
            .contains("at least one key")
    );
    let mut symmetric = provider.jwk();
    symmetric["kty"] = json!("oct");
    provider.set("/jwks", Doc::json(&json!({"keys": [symmetric]})));
    assert!(
        error(OidcOptions::new(provider.discovery_url(), &ca_file)).await.contains("asymmetric")
    );
}

#[tokio::test]
async fn a_published_verifier_is_kept_when_a_refresh_fails_and_replaced_when_one_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let (provider, ca_file) = standard_provider(dir.path()).await;
    let auth = std::sync::Arc::new(oidc::JwtAuth::default());
    let mut options = OidcOptions::new(provider.discovery_url(), &ca_file);
    options.refresh_interval = Duration::from_millis(200);
    let task = oidc::JwtAuth::spawn_loader(&auth, options);
    eventually("the first load", || async { auth.is_ready() }).await;
    let first = auth.current().unwrap();
    // The provider fails: the verifier stays, the failure is recorded.
    provider.set("/jwks", Doc { status: 503, headers: vec![], body: vec![] });
    eventually("a failed refresh", || async { auth.last_error().is_some() }).await;
    assert!(std::sync::Arc::ptr_eq(&first, &auth.current().unwrap()));
    // It recovers: a new verifier is published (the backoff after one failure is 1 s).
    provider.serve_standard();
    eventually("a refreshed verifier", || async {
        auth.last_error().is_none() && !std::sync::Arc::ptr_eq(&first, &auth.current().unwrap())
    })
    .await;
    drop(auth);
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_gateway_that_waits_for_its_watch_accepts_a_token_refreshed_a_moment_ago() {
    let (store, _dir) = store();
    let hash = |token: &str| -> String {
        sha2::Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    };
    let created = create(
        &store,
        &sandbox(
            "sec",
            "sec-id",
            &[
                (annotations::ENABLE_JWT_AUTH, "true"),
                (annotations::TRAFFIC_ACCESS_TOKEN_SHA256, &hash("old")),
            ],
        ),
    )
    .await;
    let up = upstream().await;
    let dialer = MapDialer::default();
    dialer.map("sec", 49983, up.addr);
    let mut config = config();
    // A cluster's gateway: the manager that refreshes tokens is another process.
    config.unknown_wait = Duration::from_secs(1);
    let gw = gateway(&store, &dialer, config).await;
    let host = format!("49983-sec-id.{DOMAIN}");

    // The refresh lands 200 ms after the request with the new token arrived.
    let writer = store.clone();
    let refreshed = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut updated = created.clone();
        updated
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(annotations::TRAFFIC_ACCESS_TOKEN_SHA256.into(), hash("new"));
        oka_store::Store::update(&writer, "default", &updated).await.unwrap();
    });
    let started = std::time::Instant::now();
    let answer =
        send(gw.addr, "GET", &host, "/echo", &[("e2b-traffic-access-token", "new")], "").await;
    assert_eq!(answer.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(150), "it waited for the refresh");
    refreshed.await.unwrap();
    // The old token is refused, after the wait; a missing one at once.
    let started = std::time::Instant::now();
    let old =
        send(gw.addr, "GET", &host, "/echo", &[("e2b-traffic-access-token", "old")], "").await;
    assert_eq!(old.status, 403);
    assert!(started.elapsed() >= Duration::from_millis(900));
    let started = std::time::Instant::now();
    assert_eq!(get(gw.addr, &host, "/echo").await.status, 403);
    assert!(started.elapsed() < Duration::from_millis(500));
}
