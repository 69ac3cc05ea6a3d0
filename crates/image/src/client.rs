//! The registry client: the distribution API v2 over hyper (HTTP/1.1, rustls with the system's
//! roots, plain HTTP where the endpoint says so). A `Session` is one repository on one
//! endpoint: it pings `/v2/`, answers the `WWW-Authenticate` challenge (anonymous, Basic, or a
//! Bearer token from the realm, with Basic credentials when there are some), re-authenticates
//! once when a token expires, retries transient failures (connection errors, 5xx, 429) with
//! exponential backoff, follows blob redirects (without the registry's `Authorization` on
//! another host), and maps answers to `PullError`s.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use crate::auth::{self, Challenge, RegistryAuth};
use crate::error::{ImageError, PullError};
use crate::reference::Endpoint;

/// How many times a transient failure is retried before the pull gives up.
const RETRIES: u32 = 4;
/// The first backoff; it doubles each retry.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// How long the response headers may take.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// The most redirects a blob request follows.
const MAX_REDIRECTS: usize = 5;
/// The largest manifest or token answer read into memory.
const MAX_DOCUMENT: usize = 8 * 1024 * 1024;

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The HTTP client all pulls share (its connection pool included).
#[derive(Clone)]
pub(crate) struct RegistryClient {
    http: HttpClient,
}

impl RegistryClient {
    pub(crate) fn new() -> Result<RegistryClient, ImageError> {
        // ring, as the rest of the tree: it builds with the C compiler alone.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let builder = match builder.with_provider_and_native_roots(provider.clone()) {
            Ok(builder) => builder,
            Err(e) => {
                // No system roots: plain-HTTP registries still work, HTTPS ones fail by name.
                tracing::warn!(error = %e, "no TLS root certificates found; HTTPS registries will fail");
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| ImageError::Tls(e.to_string()))?
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth();
                hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
            }
        };
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(Duration::from_secs(15)));
        http.set_nodelay(true);
        let connector = builder.https_or_http().enable_http1().wrap_connector(http);
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(RegistryClient { http })
    }
}

/// One repository on one endpoint, authenticated.
pub(crate) struct Session {
    client: RegistryClient,
    pub(crate) endpoint: Endpoint,
    repository: String,
    /// The normalised reference, for errors.
    reference: String,
    credentials: Option<RegistryAuth>,
    challenge: Option<Challenge>,
    authorization: tokio::sync::RwLock<Option<String>>,
}

/// The error body of the distribution API.
#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    errors: Vec<ErrorEntry>,
}

#[derive(Deserialize)]
struct ErrorEntry {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// A transient failure (retry), or a final answer.
enum Attempt {
    Transient(String),
    Final(PullError),
}

impl Session {
    /// Pings `/v2/` and authenticates as the registry's challenge asks.
    pub(crate) async fn connect(
        client: &RegistryClient,
        endpoint: Endpoint,
        repository: &str,
        reference: &str,
        auths: &[RegistryAuth],
    ) -> Result<Session, PullError> {
        let credentials = auths.iter().find(|a| a.matches(&endpoint.host)).cloned().or_else(|| {
            // A mirror named only by the registry it mirrors gets no upstream credentials.
            (!endpoint.mirror)
                .then(|| auths.iter().find(|a| a.matches(reference_registry(reference))).cloned())?
        });
        let mut session = Session {
            client: client.clone(),
            endpoint,
            repository: repository.to_string(),
            reference: reference.to_string(),
            credentials,
            challenge: None,
            authorization: tokio::sync::RwLock::new(None),
        };
        let url = format!("{}/v2/", session.endpoint.base);
        let response = session.send_with_retries(Method::GET, &url, None, false).await?;
        match response.status() {
            status if status.is_success() => {}
            StatusCode::UNAUTHORIZED => {
                let header = response
                    .headers()
                    .get_all(header::WWW_AUTHENTICATE)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .filter_map(auth::parse_challenge)
                    .max_by_key(|c| matches!(c, Challenge::Bearer { .. }));
                let Some(challenge) = header else {
                    return Err(session.unauthorized(
                        "the registry wants an authentication scheme other than Basic or Bearer",
                    ));
                };
                session.challenge = Some(challenge);
                session.authenticate().await?;
            }
            status => {
                return Err(session.status_error(
                    status,
                    "/v2/",
                    read_error_message(response).await,
                ));
            }
        }
        Ok(session)
    }

    /// Fetches a manifest (by tag or digest): its bytes and `Content-Type`.
    pub(crate) async fn manifest(
        &self,
        tag_or_digest: &str,
    ) -> Result<(Bytes, Option<String>), PullError> {
        let url =
            format!("{}/v2/{}/manifests/{tag_or_digest}", self.endpoint.base, self.repository);
        let response = self.get(&url, Some(crate::manifest::MANIFEST_ACCEPT)).await?;
        if !response.status().is_success() {
            let status = response.status();
            return Err(self.status_error(
                status,
                &format!("manifest {tag_or_digest}"),
                read_error_message(response).await,
            ));
        }
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = self.read_document(response, "manifest").await?;
        Ok((body, content_type))
    }

    /// Opens a blob for streaming (redirects followed); the caller verifies its digest.
    pub(crate) async fn blob(&self, digest: &str) -> Result<Response<Incoming>, PullError> {
        let mut url = format!("{}/v2/{}/blobs/{digest}", self.endpoint.base, self.repository);
        let mut with_auth = true;
        for _ in 0..=MAX_REDIRECTS {
            let response = if with_auth {
                self.get(&url, None).await?
            } else {
                self.send_with_retries(Method::GET, &url, None, false).await?
            };
            let status = response.status();
            if status.is_redirection() {
                let Some(location) =
                    response.headers().get(header::LOCATION).and_then(|v| v.to_str().ok())
                else {
                    return Err(self.invalid("blob redirect", "a redirect without Location"));
                };
                let next = resolve_location(&url, location);
                // The registry's credentials stay with the registry.
                with_auth = with_auth && same_origin(&url, &next);
                url = next;
                continue;
            }
            if !status.is_success() {
                return Err(self.status_error(
                    status,
                    &format!("blob {digest}"),
                    read_error_message(response).await,
                ));
            }
            return Ok(response);
        }
        Err(self.invalid("blob", "too many redirects"))
    }

    /// Reads a small blob (a config) whole.
    pub(crate) async fn small_blob(&self, digest: &str) -> Result<Bytes, PullError> {
        let response = self.blob(digest).await?;
        self.read_document(response, "config").await
    }

    /// A GET with the session's authorization; a 401 re-authenticates once (expired token).
    async fn get(&self, url: &str, accept: Option<&str>) -> Result<Response<Incoming>, PullError> {
        let response = self.send_with_retries(Method::GET, url, accept, true).await?;
        if response.status() == StatusCode::UNAUTHORIZED && self.challenge.is_some() {
            self.authenticate().await?;
            return self.send_with_retries(Method::GET, url, accept, true).await;
        }
        Ok(response)
    }

    /// Gets the `Authorization` the challenge asks for.
    async fn authenticate(&self) -> Result<(), PullError> {
        let value = match &self.challenge {
            None => return Ok(()),
            Some(Challenge::Basic) => match &self.credentials {
                Some(credentials) => auth::basic_header(credentials),
                None => {
                    return Err(self.unauthorized(
                        "the registry wants credentials (Basic) and none were given",
                    ));
                }
            },
            Some(Challenge::Bearer { realm, service, .. }) => {
                let scope = auth::pull_scope(&self.repository);
                let url = auth::token_url(realm, service.as_deref(), &scope);
                let basic = self.credentials.as_ref().map(auth::basic_header);
                let response =
                    self.send_once_retrying(Method::GET, &url, None, basic.as_deref()).await?;
                let status = response.status();
                if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                    let what = if self.credentials.is_some() {
                        "refused the credentials"
                    } else {
                        "refused an anonymous token"
                    };
                    return Err(
                        self.unauthorized(&format!("the token service {realm} {what} ({status})"))
                    );
                }
                if !status.is_success() {
                    return Err(self.status_error(
                        status,
                        "token",
                        read_error_message(response).await,
                    ));
                }
                let body = self.read_document(response, "token").await?;
                let token =
                    auth::parse_token_response(&body).map_err(|m| self.invalid("token", &m))?;
                format!("Bearer {token}")
            }
        };
        *self.authorization.write().await = Some(value);
        Ok(())
    }

    async fn send_with_retries(
        &self,
        method: Method,
        url: &str,
        accept: Option<&str>,
        authorized: bool,
    ) -> Result<Response<Incoming>, PullError> {
        let authorization = if authorized { self.authorization.read().await.clone() } else { None };
        self.send_once_retrying(method, url, accept, authorization.as_deref()).await
    }

    /// Sends, retrying connection errors, 5xx and 429 with exponential backoff.
    async fn send_once_retrying(
        &self,
        method: Method,
        url: &str,
        accept: Option<&str>,
        authorization: Option<&str>,
    ) -> Result<Response<Incoming>, PullError> {
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 0;
        loop {
            match self.send_once(method.clone(), url, accept, authorization).await {
                Ok(response) => return Ok(response),
                Err(Attempt::Final(e)) => return Err(e),
                Err(Attempt::Transient(message)) if attempt >= RETRIES => {
                    return Err(PullError::Unreachable {
                        reference: self.reference.clone(),
                        registry: self.endpoint.host.clone(),
                        message,
                    });
                }
                Err(Attempt::Transient(message)) => {
                    tracing::debug!(url, attempt, error = %message, "registry request failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    attempt += 1;
                }
            }
        }
    }

    async fn send_once(
        &self,
        method: Method,
        url: &str,
        accept: Option<&str>,
        authorization: Option<&str>,
    ) -> Result<Response<Incoming>, Attempt> {
        let mut request =
            Request::builder().method(method).uri(url).header(header::USER_AGENT, "oka-image");
        if let Some(accept) = accept {
            request = request.header(header::ACCEPT, accept);
        }
        if let Some(authorization) = authorization
            && let Ok(value) = HeaderValue::from_str(authorization)
        {
            request = request.header(header::AUTHORIZATION, value);
        }
        let request = request.body(Full::new(Bytes::new())).map_err(|e| {
            Attempt::Final(
                self.invalid("request", &format!("cannot build a request to {url}: {e}")),
            )
        })?;
        let response =
            match tokio::time::timeout(RESPONSE_TIMEOUT, self.client.http.request(request)).await {
                Err(_) => {
                    return Err(Attempt::Transient(format!(
                        "no answer from {url} in {RESPONSE_TIMEOUT:?}"
                    )));
                }
                Ok(Err(e)) => {
                    return Err(Attempt::Transient(format!("{url}: {}", error_chain(&e))));
                }
                Ok(Ok(response)) => response,
            };
        let status = response.status();
        if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            let message = read_error_message(response).await;
            return Err(Attempt::Transient(format!("{url}: {status} {message}")));
        }
        Ok(response)
    }

    async fn read_document(
        &self,
        response: Response<Incoming>,
        what: &str,
    ) -> Result<Bytes, PullError> {
        let mut body = response.into_body();
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| PullError::Unreachable {
                reference: self.reference.clone(),
                registry: self.endpoint.host.clone(),
                message: format!("reading the {what}: {}", error_chain(&e)),
            })?;
            if let Ok(data) = frame.into_data() {
                out.extend_from_slice(&data);
                if out.len() > MAX_DOCUMENT {
                    return Err(self.invalid(what, &format!("larger than {MAX_DOCUMENT} bytes")));
                }
            }
        }
        Ok(Bytes::from(out))
    }

    /// The error for a final non-success status.
    fn status_error(&self, status: StatusCode, what: &str, message: String) -> PullError {
        let message = if message.is_empty() {
            format!("{what}: {status}")
        } else {
            format!("{what}: {status}: {message}")
        };
        match status {
            StatusCode::NOT_FOUND => PullError::NotFound {
                reference: self.reference.clone(),
                registry: self.endpoint.host.clone(),
                message,
            },
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => self.unauthorized(&message),
            _ => PullError::InvalidResponse {
                reference: self.reference.clone(),
                registry: self.endpoint.host.clone(),
                what: what.to_string(),
                message,
            },
        }
    }

    fn unauthorized(&self, message: &str) -> PullError {
        let message = match &self.credentials {
            Some(c) if !message.contains("credentials") => {
                format!("{message} (as user {:?})", c.username)
            }
            None if !message.contains("credentials") && !message.contains("anonymous") => {
                format!("{message} (no credentials for {})", self.endpoint.host)
            }
            _ => message.to_string(),
        };
        PullError::Unauthorized {
            reference: self.reference.clone(),
            registry: self.endpoint.host.clone(),
            message,
        }
    }

    pub(crate) fn invalid(&self, what: &str, message: &str) -> PullError {
        PullError::InvalidResponse {
            reference: self.reference.clone(),
            registry: self.endpoint.host.clone(),
            what: what.to_string(),
            message: message.to_string(),
        }
    }

    /// A failure reading a body mid-stream: transient, as the connection failing is.
    pub(crate) fn body_error(&self, what: &str, error: &hyper::Error) -> PullError {
        PullError::Unreachable {
            reference: self.reference.clone(),
            registry: self.endpoint.host.clone(),
            message: format!("reading {what}: {}", error_chain(error)),
        }
    }
}

/// The registry part of a normalised reference string.
fn reference_registry(reference: &str) -> &str {
    reference.split('/').next().unwrap_or_default()
}

/// The distribution API's error message of a response (its `errors[].code: message`).
async fn read_error_message(response: Response<Incoming>) -> String {
    let Ok(collected) =
        tokio::time::timeout(Duration::from_secs(10), response.into_body().collect()).await
    else {
        return String::new();
    };
    let Ok(body) = collected else { return String::new() };
    let body = body.to_bytes();
    match serde_json::from_slice::<ErrorBody>(&body) {
        Ok(parsed) if !parsed.errors.is_empty() => parsed
            .errors
            .iter()
            .map(|e| format!("{}: {}", e.code, e.message))
            .collect::<Vec<_>>()
            .join("; "),
        _ => String::from_utf8_lossy(&body[..body.len().min(200)]).trim().to_string(),
    }
}

/// An error and its causes, one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

/// A `Location` resolved against the URL it answered.
fn resolve_location(base: &str, location: &str) -> String {
    if location.contains("://") {
        return location.to_string();
    }
    let origin_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[origin_end..].find('/').map_or(base.len(), |i| origin_end + i);
    if location.starts_with('/') {
        format!("{}{location}", &base[..host_end])
    } else {
        let dir_end = base.rfind('/').filter(|i| *i >= host_end).map_or(host_end, |i| i);
        format!("{}/{location}", &base[..dir_end])
    }
}

/// Whether two URLs have the same scheme, host and port.
fn same_origin(a: &str, b: &str) -> bool {
    let origin = |u: &str| -> String {
        let start = u.find("://").map_or(0, |i| i + 3);
        let end = u[start..].find('/').map_or(u.len(), |i| start + i);
        u[..end].to_ascii_lowercase()
    };
    origin(a) == origin(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_resolve_and_credentials_stay_home() {
        let base = "http://r:5000/v2/a/blobs/sha256:x";
        assert_eq!(
            resolve_location(base, "https://s3.example/b?sig=1"),
            "https://s3.example/b?sig=1"
        );
        assert_eq!(resolve_location(base, "/other/path"), "http://r:5000/other/path");
        assert_eq!(resolve_location(base, "y"), "http://r:5000/v2/a/blobs/y");
        assert!(same_origin(base, "http://R:5000/x"));
        assert!(!same_origin(base, "http://r:5001/x"));
        assert!(!same_origin(base, "https://r:5000/x"));
    }
}
