//! TLS for the API: a CA generated once per state directory and a server certificate it signs
//! at every start. `kubectl` sends its bearer token over TLS only (over plain HTTP it sends no
//! credentials at all), so the API is served over TLS even on loopback.
//!
//! The same pieces serve the admission webhooks of `oka controller` (`oka-webhook`): a CA and a
//! server certificate made together ([`issue_ca_and_server`]), the check that a certificate
//! read back still serves its names long enough ([`verify_server_cert`]), and a certificate
//! that can be replaced while connections are accepted ([`ReloadableCert`], [`Tls::reloadable`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use std::sync::RwLock;
use std::time::SystemTime;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::debug;

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the TLS material could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// `read` or `write`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Generating or parsing a key or certificate failed.
    #[error("certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    /// rustls refused the certificate.
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
    /// A PEM text holds no certificate or key of the expected kind.
    #[error("pem: {0}")]
    Pem(String),
    /// A name is not a DNS name or an IP address.
    #[error("bad server name {0:?}")]
    ServerName(String),
}

/// The server's TLS configuration and the CA clients trust it by.
#[derive(Clone)]
pub struct Tls {
    /// The CA certificate (PEM), for the kubeconfig's `certificate-authority-data`.
    pub ca_pem: String,
    config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

fn read(path: &Path) -> Result<Option<String>, TlsError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TlsError::Io { action: "read", path: path.to_owned(), source }),
    }
}

fn write_private(path: &Path, text: &str) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| TlsError::Io { action: "write", path: path.to_owned(), source };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    file.write_all(text.as_bytes()).and_then(|()| file.sync_all()).map_err(io)
}

/// The CA's certificate parameters: the same at every start, so a CA read back signs as the
/// issuer its certificate names.
fn ca_params() -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, "oka-kube-ca");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(params)
}

/// The CA of `dir` (`kube-ca.crt`, `kube-ca.key`), generated on the first call.
fn load_or_create_ca(dir: &Path) -> Result<(String, KeyPair), TlsError> {
    let (cert_path, key_path) = (dir.join("kube-ca.crt"), dir.join("kube-ca.key"));
    if let (Some(cert), Some(key)) = (read(&cert_path)?, read(&key_path)?) {
        return Ok((cert, KeyPair::from_pem(&key)?));
    }
    let key = KeyPair::generate()?;
    let cert = ca_params()?.self_signed(&key)?.pem();
    write_private(&key_path, &key.serialize_pem())?;
    write_private(&cert_path, &cert)?;
    Ok((cert, key))
}

impl Tls {
    /// The CA of `dir` (made once) and a new server certificate for `hosts` (names or IPs)
    /// signed by it.
    pub fn load_or_create(dir: &Path, hosts: &[String]) -> Result<Self, TlsError> {
        let (ca_pem, ca_key) = load_or_create_ca(dir)?;
        let issuer = Issuer::new(ca_params()?, ca_key);
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(hosts.to_vec())?;
        params.distinguished_name.push(DnType::CommonName, "oka-kube-api");
        let cert = params.signed_by(&key, &issuer)?;
        let chain = vec![cert.der().clone(), CertificateDer::from_pem_slice_ca(&ca_pem)?];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls { ca_pem, config: Arc::new(config) })
    }

    /// Serves whatever certificate `cert` holds at each handshake (a handshake before the
    /// first [`ReloadableCert::set`] fails). `ca_pem` is left empty: the caller knows its CA.
    pub fn reloadable(cert: Arc<ReloadableCert>) -> Result<Self, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(cert);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls { ca_pem: String::new(), config: Arc::new(config) })
    }
}

/// The crypto provider of every TLS use here. ring builds with the C compiler alone (no
/// cmake); the API's one client is kubectl on this machine, and a webhook's is the API
/// server, so classical key exchange is enough.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    #[allow(deprecated)]
    Arc::new(rustls::crypto::ring::default_provider())
}

/// PEM texts of a certificate and its private key.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedPem {
    /// The certificate.
    pub cert: String,
    /// Its private key (PKCS #8).
    pub key: String,
}

impl std::fmt::Debug for IssuedPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedPem").field("cert", &self.cert).finish_non_exhaustive()
    }
}

/// A new CA (common name `ca_name`) and a server certificate it signs for `hosts` (DNS names
/// or IP addresses; the first is the common name), both valid from now until `not_after`.
/// Returns (CA, server).
pub fn issue_ca_and_server(
    ca_name: &str,
    hosts: &[String],
    not_after: jiff::civil::Date,
) -> Result<(IssuedPem, IssuedPem), TlsError> {
    let now = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC).date();
    let validity = |params: &mut CertificateParams| {
        // Month and day are always in range for u8.
        params.not_before = rcgen::date_time_ymd(
            i32::from(now.year()),
            u8::try_from(now.month()).unwrap_or(1),
            u8::try_from(now.day()).unwrap_or(1),
        );
        params.not_after = rcgen::date_time_ymd(
            i32::from(not_after.year()),
            u8::try_from(not_after.month()).unwrap_or(1),
            u8::try_from(not_after.day()).unwrap_or(1),
        );
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name.push(DnType::CommonName, ca_name);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut ca_params);
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca = IssuedPem { cert: ca_cert.pem(), key: ca_key.serialize_pem() };
    let issuer = Issuer::new(ca_params, ca_key);
    let mut params = CertificateParams::new(hosts.to_vec())?;
    if let Some(first) = hosts.first() {
        params.distinguished_name.push(DnType::CommonName, first.as_str());
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut params);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((ca, IssuedPem { cert: cert.pem(), key: key.serialize_pem() }))
}

/// The certificate chain and key of PEM texts, ready to serve; fails when the key is not the
/// certificate's.
pub fn certified_key(cert_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem(e.to_string()))?;
    if chain.is_empty() {
        return Err(TlsError::Pem("no certificate".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| TlsError::Pem(e.to_string()))?;
    Ok(Arc::new(CertifiedKey::from_der(chain, key, &provider())?))
}

/// Checks that the server certificate `cert_pem` (with its key `key_pem`) is signed by the CA
/// `ca_pem` and would be accepted for every one of `names` at `at`, as a client checks it:
/// its chain, its validity period, its names and its server-auth usage.
pub fn verify_server_cert(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
    names: &[String],
    at: SystemTime,
) -> Result<(), TlsError> {
    let certified = certified_key(cert_pem, key_pem)?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(ca.map_err(|e| TlsError::Pem(e.to_string()))?)?;
    }
    if roots.is_empty() {
        return Err(TlsError::Pem("no CA certificate".into()));
    }
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| TlsError::Pem(e.to_string()))?;
    let since_epoch = at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let (end_entity, intermediates) =
        certified.cert.split_first().ok_or_else(|| TlsError::Pem("no certificate".into()))?;
    for name in names {
        let server_name =
            ServerName::try_from(name.as_str()).map_err(|_| TlsError::ServerName(name.clone()))?;
        use rustls::client::danger::ServerCertVerifier as _;
        verifier.verify_server_cert(
            end_entity,
            intermediates,
            &server_name,
            &[],
            UnixTime::since_unix_epoch(since_epoch),
        )?;
    }
    Ok(())
}

/// A server certificate that can be replaced while connections are accepted: each handshake
/// takes the one set last.
#[derive(Debug, Default)]
pub struct ReloadableCert(RwLock<Option<Arc<CertifiedKey>>>);

impl ReloadableCert {
    /// Serves `key` from the next handshake on.
    pub fn set(&self, key: Arc<CertifiedKey>) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(key);
    }

    /// Whether a certificate is set.
    pub fn is_set(&self) -> bool {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).is_some()
    }
}

impl ResolvesServerCert for ReloadableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// The DER of the first certificate of a PEM text.
trait FromPemCa: Sized {
    fn from_pem_slice_ca(pem: &str) -> Result<Self, TlsError>;
}

impl FromPemCa for CertificateDer<'static> {
    fn from_pem_slice_ca(pem: &str) -> Result<Self, TlsError> {
        CertificateDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))
    }
}

/// A TCP listener whose connections are TLS, for `axum::serve`. Handshakes run concurrently,
/// so a client that connects and says nothing delays no other.
pub struct TlsListener {
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl TlsListener {
    /// Serves `tls` on `tcp`. Connections are accepted by a task that ends with the listener.
    pub fn new(tcp: TcpListener, tls: &Tls) -> std::io::Result<Self> {
        let addr = tcp.local_addr()?;
        let acceptor = TlsAcceptor::from(Arc::clone(&tls.config));
        let (tx, handshaken) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tx.closed() => return,
                    accepted = tcp.accept() => match accepted {
                        Ok((stream, addr)) => {
                            tokio::spawn(handshake(acceptor.clone(), stream, addr, tx.clone()));
                        }
                        Err(e) => {
                            debug!(error = %e, "tls: accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    },
                }
            }
        });
        Ok(TlsListener { handshaken, addr })
    }
}

/// Completes one TLS handshake and hands the connection over; failed ones are dropped.
async fn handshake(
    acceptor: TlsAcceptor,
    stream: TcpStream,
    addr: SocketAddr,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => {
            let _ = tx.send((tls, addr)).await;
        }
        Ok(Err(e)) => debug!(%addr, error = %e, "tls: handshake failed"),
        Err(_) => debug!(%addr, "tls: handshake timed out"),
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(connection) => connection,
            // The accepting task ends only when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
