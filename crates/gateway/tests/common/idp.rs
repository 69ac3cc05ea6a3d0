//! An OIDC identity provider on loopback, as a test plays it: a throwaway CA (rcgen), an HTTPS
//! server with a certificate for 127.0.0.1 that serves a discovery document and a key set
//! (both replaceable while it runs), and an Ed25519 key that signs traffic JWTs.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use ring::signature::{Ed25519KeyPair, KeyPair as _};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// A throwaway CA and a server certificate it signed for 127.0.0.1.
pub struct Pki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

pub fn pki() -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert_pem = params.signed_by(&key, &issuer).unwrap().pem();
    Pki { ca_pem, cert_pem, key_pem: key.serialize_pem() }
}

/// One answer of the provider: status, extra headers, body.
#[derive(Clone)]
pub struct Doc {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Doc {
    pub fn json(value: &Value) -> Self {
        Doc { status: 200, headers: vec![], body: value.to_string().into_bytes() }
    }
}

/// The provider: its address, what it serves by path, and its signing key (`kid` "k1").
pub struct Idp {
    pub addr: SocketAddr,
    pub docs: Arc<Mutex<HashMap<String, Doc>>>,
    pub key: Arc<Ed25519KeyPair>,
    pub requests: Arc<std::sync::atomic::AtomicUsize>,
}

impl Idp {
    pub fn issuer(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn discovery_url(&self) -> String {
        format!("{}/.well-known/openid-configuration", self.issuer())
    }

    /// The public JWK of the signing key.
    pub fn jwk(&self) -> Value {
        json!({"kty": "OKP", "crv": "Ed25519", "kid": "k1", "use": "sig", "alg": "EdDSA",
               "x": URL_SAFE_NO_PAD.encode(self.key.public_key().as_ref())})
    }

    pub fn set(&self, path: &str, doc: Doc) {
        self.docs.lock().unwrap().insert(path.to_owned(), doc);
    }

    /// Serves the standard documents: discovery naming this issuer and `/jwks`, and the key.
    pub fn serve_standard(&self) {
        self.set(
            "/.well-known/openid-configuration",
            Doc::json(
                &json!({"issuer": self.issuer(), "jwks_uri": format!("{}/jwks", self.issuer())}),
            ),
        );
        self.set("/jwks", Doc::json(&json!({"keys": [self.jwk()]})));
    }

    /// A traffic JWT for sandbox `id`/`uid`, valid for ten minutes from now.
    pub fn token(&self, id: &str, uid: &str) -> String {
        let now = jiff::Timestamp::now().as_second();
        let claims = json!({"iss": self.issuer(), "sub": "agent-1", "iat": now, "nbf": now,
                            "exp": now + 600, "sandbox": {"sandboxId": id, "sandboxUid": uid}});
        let header = json!({"alg": "EdDSA", "kid": "k1", "typ": "JWT"});
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = self.key.sign(input.as_bytes());
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref()))
    }
}

/// Starts the provider on `listener` with the certificate of `pki`; nothing is served until
/// documents are set.
pub fn start(listener: TcpListener, pki: &Pki) -> Idp {
    let addr = listener.local_addr().unwrap();
    let chain = CertificateDer::pem_slice_iter(pki.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(pki.key_pem.as_bytes()).unwrap();
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let docs: Arc<Mutex<HashMap<String, Doc>>> = Arc::default();
    let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).unwrap();
    let key = Arc::new(Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap());
    let (served, counted) = (Arc::clone(&docs), Arc::clone(&requests));
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let (acceptor, docs, requests) =
                (acceptor.clone(), Arc::clone(&served), Arc::clone(&counted));
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    requests.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let doc = docs.lock().unwrap().get(request.uri().path()).cloned();
                    async move {
                        let doc = doc.unwrap_or(Doc { status: 404, headers: vec![], body: vec![] });
                        let mut response = Response::new(Full::new(Bytes::from(doc.body)));
                        *response.status_mut() = http::StatusCode::from_u16(doc.status).unwrap();
                        for (k, v) in doc.headers {
                            response.headers_mut().insert(
                                http::HeaderName::try_from(k).unwrap(),
                                http::HeaderValue::try_from(v).unwrap(),
                            );
                        }
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Idp { addr, docs, key, requests }
}
