//! The JWT verifier's source: OIDC discovery and the key set fetched from the identity
//! provider, published for the gateway's requests, as the reference's `jwtauth` manager does.
//!
//! # Expected flow
//!
//! 1. [`JwtAuth::spawn_loader`] starts one task per gateway. Each try reads the CA bundle file
//!    (PEM; the only roots trusted), fetches the discovery document over HTTPS (no redirects
//!    followed, [`OidcOptions::http_timeout`] per document, at most [`MAX_DOCUMENT`] bytes),
//!    whose `issuer` and `jwks_uri` must be absolute `https` URLs, then the key set at
//!    `jwks_uri`, and builds a [`Verifier`] ([`crate::jwt`] has the key rules).
//! 2. Until the first verifier is published, a failed try is retried after 1 s, doubling to
//!    30 s ([`crate::auth::backoff`]); the gateway is not ready meanwhile ([`JwtAuth::is_ready`])
//!    and sandboxes requiring traffic auth are answered 503.
//! 3. Once published, the verifier is rebuilt every [`OidcOptions::refresh_interval`] so a
//!    rotated signing key is picked up; a failed rebuild keeps the current verifier (its keys
//!    still verify tokens signed before the rotation) and is retried with the same backoff.
//!
//! The task ends when the [`JwtAuth`] is dropped.

use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tracing::{info, warn};

use crate::jwt::Verifier;

/// The largest discovery or key set document read (the reference's 1 MiB).
pub const MAX_DOCUMENT: usize = 1 << 20;

/// Where and how the verifier is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcOptions {
    /// The discovery document (`https://…/.well-known/openid-configuration`).
    pub discovery_url: String,
    /// A PEM bundle of the CA certificates trusted for discovery and the key set (on a cluster,
    /// the reference's CA ConfigMap mounted as a file).
    pub ca_file: PathBuf,
    /// Allowed difference between the provider's clock and ours on `exp`, `nbf`, `iat`.
    pub clock_skew: Duration,
    /// The bound of one document's fetch (the reference's 10 s).
    pub http_timeout: Duration,
    /// How often a published verifier is rebuilt (the reference's 10 min).
    pub refresh_interval: Duration,
}

impl OidcOptions {
    /// Options for `discovery_url` trusting `ca_file`, with the reference's defaults: clock
    /// skew 1 min, fetches 10 s, rebuilt every 10 min.
    pub fn new(discovery_url: impl Into<String>, ca_file: impl Into<PathBuf>) -> Self {
        Self {
            discovery_url: discovery_url.into(),
            ca_file: ca_file.into(),
            clock_skew: Duration::from_secs(60),
            http_timeout: Duration::from_secs(10),
            refresh_interval: Duration::from_secs(600),
        }
    }
}

/// Why the verifier could not be built.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// A URL is not an absolute `https` URL.
    #[error("{what} must be an absolute HTTPS URL: {url:?}")]
    NotHttps {
        /// Which URL.
        what: &'static str,
        /// The URL.
        url: String,
    },
    /// The CA bundle could not be read or holds no certificate.
    #[error("CA bundle {path}: {reason}", path = .path.display())]
    Ca {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A document could not be fetched.
    #[error("fetch {url}: {reason}")]
    Fetch {
        /// Its URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The discovery document is not what OIDC says.
    #[error("OIDC discovery document: {0}")]
    Discovery(String),
    /// The key set breaks a rule.
    #[error("OIDC JWKS: {0}")]
    Jwks(#[from] crate::jwt::JwksError),
}

/// Whether `url` is an absolute `https` URL with a host.
fn https_uri(url: &str) -> Option<Uri> {
    let uri: Uri = url.parse().ok()?;
    (uri.scheme_str() == Some("https") && uri.host().is_some_and(|h| !h.is_empty())).then_some(uri)
}

/// Checks the options as a configuration can (the discovery URL's scheme); the rest is
/// checked by each load.
pub fn check_discovery_url(url: &str) -> Result<(), OidcError> {
    https_uri(url)
        .map(|_| ())
        .ok_or_else(|| OidcError::NotHttps { what: "the discovery URL", url: url.to_owned() })
}

/// A client trusting only the CA bundle of `options`.
fn tls_client(options: &OidcOptions) -> Result<tokio_rustls::TlsConnector, OidcError> {
    let ca = |reason: String| OidcError::Ca { path: options.ca_file.clone(), reason };
    let pem = std::fs::read(&options.ca_file).map_err(|e| ca(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem).flatten() {
        roots.add(cert).map_err(|e| ca(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(ca("contains no valid PEM certificates".into()));
    }
    // ring, as the rest of the tree; the identity provider is on the operator's network.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ca(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// `GET url` over HTTPS: the body of a 200 answer (any other status, a redirect too, fails).
async fn fetch(
    tls: &tokio_rustls::TlsConnector,
    url: &str,
    timeout: Duration,
) -> Result<Bytes, OidcError> {
    let failed = |reason: String| OidcError::Fetch { url: url.to_owned(), reason };
    let uri = https_uri(url).ok_or_else(|| failed("not an absolute HTTPS URL".into()))?;
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(443);
    let name = ServerName::try_from(host.to_owned()).map_err(|e| failed(e.to_string()))?;
    let work = async {
        let tcp = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| failed(format!("connect: {e}")))?;
        let stream = tls.connect(name, tcp).await.map_err(|e| failed(format!("TLS: {e}")))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| failed(e.to_string()))?;
        tokio::spawn(connection);
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let authority = uri.authority().map_or(host, |a| a.as_str());
        let request = Request::get(path)
            .header(http::header::HOST, authority)
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::<Bytes>::new())
            .map_err(|e| failed(e.to_string()))?;
        let response = sender.send_request(request).await.map_err(|e| failed(e.to_string()))?;
        if response.status() != StatusCode::OK {
            return Err(failed(format!("unexpected HTTP status {}", response.status())));
        }
        let body = Limited::new(response.into_body(), MAX_DOCUMENT)
            .collect()
            .await
            .map_err(|e| failed(format!("read body: {e}")))?;
        Ok(body.to_bytes())
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| failed(format!("timed out after {timeout:?}")))?
}

/// One load: discovery, then the key set; the verifier they make.
pub async fn load(options: &OidcOptions) -> Result<Verifier, OidcError> {
    #[derive(serde::Deserialize)]
    struct Discovery {
        #[serde(default)]
        issuer: String,
        #[serde(default)]
        jwks_uri: String,
    }
    check_discovery_url(&options.discovery_url)?;
    let tls = tls_client(options)?;
    let body = fetch(&tls, &options.discovery_url, options.http_timeout).await?;
    let discovery: Discovery =
        serde_json::from_slice(&body).map_err(|e| OidcError::Discovery(e.to_string()))?;
    if https_uri(&discovery.issuer).is_none() {
        return Err(OidcError::NotHttps { what: "the issuer", url: discovery.issuer });
    }
    if https_uri(&discovery.jwks_uri).is_none() {
        return Err(OidcError::NotHttps { what: "jwks_uri", url: discovery.jwks_uri });
    }
    let jwks = fetch(&tls, &discovery.jwks_uri, options.http_timeout).await?;
    Ok(Verifier::new(&discovery.issuer, &jwks, options.clock_skew)?)
}

/// The published verifier of a gateway in `jwt` mode, and why there is none yet.
#[derive(Debug, Default)]
pub struct JwtAuth {
    verifier: RwLock<Option<Arc<Verifier>>>,
    last_error: RwLock<Option<String>>,
}

impl JwtAuth {
    /// The current verifier, if one was published.
    pub fn current(&self) -> Option<Arc<Verifier>> {
        self.verifier.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Whether a verifier is published.
    pub fn is_ready(&self) -> bool {
        self.verifier.read().unwrap_or_else(PoisonError::into_inner).is_some()
    }

    /// The last load's failure, while no verifier is published or since the last success.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Publishes `verifier` (replacing the current one).
    pub fn publish(&self, verifier: Verifier) {
        *self.verifier.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(verifier));
        *self.last_error.write().unwrap_or_else(PoisonError::into_inner) = None;
    }

    fn failed(&self, error: &OidcError) {
        *self.last_error.write().unwrap_or_else(PoisonError::into_inner) = Some(error.to_string());
    }

    /// Starts the loader (see the [module documentation](self)); it ends when `auth` is
    /// dropped. Needs a tokio runtime.
    pub fn spawn_loader(auth: &Arc<Self>, options: OidcOptions) -> tokio::task::JoinHandle<()> {
        tokio::spawn(run(Arc::downgrade(auth), options))
    }
}

async fn run(auth: Weak<JwtAuth>, options: OidcOptions) {
    let mut failures = 0u32;
    loop {
        let result = load(&options).await;
        let Some(auth) = auth.upgrade() else { return };
        let wait = match result {
            Ok(verifier) => {
                if !auth.is_ready() {
                    info!(issuer = verifier.issuer(), "traffic access token JWT verifier ready");
                }
                auth.publish(verifier);
                failures = 0;
                options.refresh_interval
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                if auth.is_ready() {
                    warn!(%error, "failed to refresh the traffic access token JWT verifier, keeping the current one");
                } else {
                    warn!(%error, "failed to initialize the traffic access token JWT verifier");
                }
                auth.failed(&error);
                crate::auth::backoff(failures)
            }
        };
        drop(auth);
        tokio::time::sleep(wait).await;
    }
}
