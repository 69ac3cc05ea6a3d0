//! Bearer token authentication against the real registry: `docker-registry` with `auth: token`
//! trusts a self-signed P-256 certificate, and a small token service in the test signs ES256
//! JWTs with its key (the certificate in the `x5c` header), granting pull only to a user with
//! the right password, as Docker Hub's service does for private repositories.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use oka_image::{ImageStore, ImageStoreConfig, PullError, RegistryAuth};
use rcgen::SigningKey as _;
use support::{Entry, Registry, TestImage, TestLayer, host_arch};

const SERVICE: &str = "oka-test-registry";
const ISSUER: &str = "oka-test-issuer";

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// ECDSA's DER signature (SEQUENCE of two INTEGERs) as JWS wants it: r || s, 32 bytes each.
fn der_to_raw(der: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 2; // SEQUENCE tag and (short) length
    for _ in 0..2 {
        assert_eq!(der[i], 0x02, "INTEGER");
        let len = der[i + 1] as usize;
        let int = &der[i + 2..i + 2 + len];
        let int = if int.len() > 32 { &int[int.len() - 32..] } else { int };
        out.extend(std::iter::repeat_n(0, 32 - int.len()));
        out.extend_from_slice(int);
        i += 2 + len;
    }
    out
}

struct TokenService {
    key: rcgen::KeyPair,
    cert_der: Vec<u8>,
    /// Each request's query and whether it had credentials.
    requests: Mutex<Vec<(String, bool)>>,
}

impl TokenService {
    fn token(&self, query: &str, authorized: bool) -> String {
        let param = |name: &str| {
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .map(|v| v.replace("%3A", ":"))
        };
        let scope = param("scope").unwrap_or_default();
        let access: Vec<serde_json::Value> = match scope.split(':').collect::<Vec<_>>()[..] {
            ["repository", name, _] if authorized => {
                vec![serde_json::json!({"type": "repository", "name": name, "actions": ["pull"]})]
            }
            _ => vec![],
        };
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let header = serde_json::json!({
            "typ": "JWT", "alg": "ES256",
            "x5c": [base64::engine::general_purpose::STANDARD.encode(&self.cert_der)]
        });
        let claims = serde_json::json!({
            "iss": ISSUER, "sub": if authorized { "bob" } else { "" }, "aud": SERVICE,
            "exp": now + 300, "nbf": now - 10, "iat": now, "jti": format!("{now}-{}", rand_suffix()),
            "access": access
        });
        let signing_input = format!(
            "{}.{}",
            b64url(&serde_json::to_vec(&header).unwrap()),
            b64url(&serde_json::to_vec(&claims).unwrap())
        );
        let signature = der_to_raw(&self.key.sign(signing_input.as_bytes()).unwrap());
        format!("{signing_input}.{}", b64url(&signature))
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Serves `/token` on a free loopback port; `bob:tokenpw` gets pull access, anyone else a
/// token without access (the registry then refuses).
async fn start_token_service(service: Arc<TokenService>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let good = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("bob:tokenpw"));
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = service.clone();
            let good = good.clone();
            tokio::spawn(async move {
                let handler = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let service = service.clone();
                    let good = good.clone();
                    async move {
                        let query = request.uri().query().unwrap_or_default().to_string();
                        let auth = request
                            .headers()
                            .get("authorization")
                            .map(|v| v.to_str().unwrap().to_string());
                        service.requests.lock().unwrap().push((query.clone(), auth.is_some()));
                        if auth.as_ref().is_some_and(|a| a != &good) {
                            return Ok::<_, Infallible>(
                                hyper::Response::builder()
                                    .status(401)
                                    .body(Full::new(Bytes::new()))
                                    .unwrap(),
                            );
                        }
                        let token = service.token(&query, auth.is_some());
                        let body = serde_json::to_vec(&serde_json::json!({"access_token": token}))
                            .unwrap();
                        Ok(hyper::Response::new(Full::new(Bytes::from(body))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), handler)
                    .await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_from_the_realm_with_basic_credentials() {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["oka-test-token".to_string()]).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    let service = Arc::new(TokenService {
        cert_der: cert.der().to_vec(),
        key,
        requests: Mutex::new(Vec::new()),
    });
    let token_port = start_token_service(service.clone()).await;

    // Pushed while open, then the registry restarts wanting tokens.
    let mut registry = Registry::start(None);
    let image = TestImage::new(
        vec![TestLayer::build(&[Entry::File("token".into(), b"bearer".to_vec(), 0o644, 0)])],
        host_arch(),
    );
    registry.push_image("tok/app", "1", &image).await;
    let bundle = registry.dir.path().join("token.crt");
    std::fs::write(&bundle, cert.pem()).unwrap();
    registry.restart_with_auth(&format!(
        "  token:\n    realm: http://127.0.0.1:{token_port}/token\n    service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n",
        bundle.display()
    ));

    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path(), ImageStoreConfig::default()).unwrap();
    let reference = format!("{}/tok/app:1", registry.host);

    // Anonymous: a token without access, refused by the registry.
    let err = store.pull(&reference, &[], &|_| {}).await.unwrap_err();
    assert!(matches!(err, PullError::Unauthorized { .. }), "{err}\n{}", registry.log());
    // Wrong password: the token service refuses.
    let wrong = [RegistryAuth {
        registry: registry.host.clone(),
        username: "bob".into(),
        password: "no".into(),
    }];
    let err = store.pull(&reference, &wrong, &|_| {}).await.unwrap_err();
    assert!(
        matches!(&err, PullError::Unauthorized { message, .. } if message.contains("token service")),
        "{err}"
    );

    let good = [RegistryAuth {
        registry: registry.host.clone(),
        username: "bob".into(),
        password: "tokenpw".into(),
    }];
    let pulled = store
        .pull(&reference, &good, &|_| {})
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", registry.log()));
    assert_eq!(std::fs::read_to_string(pulled.layers[0].join("token")).unwrap(), "bearer");
    let requests = service.requests.lock().unwrap().clone();
    let (query, with_credentials) = requests.last().unwrap();
    assert!(*with_credentials);
    assert!(
        query.contains(&format!("service={SERVICE}"))
            && query.contains("scope=repository:tok/app:pull"),
        "{query}"
    );
}
