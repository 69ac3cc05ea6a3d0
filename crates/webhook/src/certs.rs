//! The webhook server's certificates, as the reference's certificate controller keeps them: a
//! self-signed CA and a serving certificate for the webhook Service, in one Secret of the
//! system namespace, shared by every replica.
//!
//! The Secret's keys are the reference's (`pkg/utils/webhookutils/writer`), so a Secret the
//! reference made is read and reused as it is: `ca-cert.pem` and `ca-key.pem` (the CA),
//! `cert.pem` and `key.pem` (the serving certificate and its key), and the same two again as
//! `tls.crt` and `tls.key`.
//!
//! A certificate is kept while it would still be accepted six months from now (the
//! reference's rule) for the Service's names `<service>.<namespace>.svc` and
//! `<service>.<namespace>.svc.cluster.local`, signed by the CA beside it, with its key. Else a
//! new CA and certificate replace both, valid ten years.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use oka_kubeapi::tls::{self, TlsError};

/// The CA certificate's key in the Secret.
pub const CA_CERT: &str = "ca-cert.pem";
/// The CA private key's key in the Secret.
pub const CA_KEY: &str = "ca-key.pem";
/// The serving certificate's key in the Secret.
pub const SERVER_CERT: &str = "cert.pem";
/// The serving key's key in the Secret.
pub const SERVER_KEY: &str = "key.pem";
/// The serving certificate again, under the name Kubernetes' TLS Secrets use.
pub const TLS_CERT: &str = "tls.crt";
/// The serving key again, under the name Kubernetes' TLS Secrets use.
pub const TLS_KEY: &str = "tls.key";

/// How long ahead a kept certificate must still be valid.
pub const RENEW_AHEAD: Duration = Duration::from_secs(183 * 24 * 3600);
/// How long a new CA and certificate are valid, in years.
const VALID_YEARS: i16 = 10;

/// The names the serving certificate covers: the Service's, short and long.
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        format!("{service}.{namespace}"),
        service.to_owned(),
    ]
}

/// The names a kept certificate must cover: those the API server dials.
fn required_names(names: &[String]) -> &[String] {
    &names[..names.len().min(2)]
}

/// A CA and the serving certificate it signed, as PEM texts.
#[derive(Clone, PartialEq, Eq)]
pub struct CertBundle {
    /// The CA certificate: the webhook configurations' `caBundle`.
    pub ca_cert: String,
    /// The CA private key.
    pub ca_key: String,
    /// The serving certificate.
    pub cert: String,
    /// The serving key.
    pub key: String,
}

impl std::fmt::Debug for CertBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertBundle").field("ca_cert", &self.ca_cert).finish_non_exhaustive()
    }
}

impl CertBundle {
    /// A new CA and a serving certificate for `names` (see [`service_names`]).
    pub fn generate(names: &[String]) -> Result<Self, TlsError> {
        let today = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC).date();
        let not_after = today.checked_add(jiff::Span::new().years(VALID_YEARS)).unwrap_or(today);
        let (ca, server) = tls::issue_ca_and_server("oka-webhook-ca", names, not_after)?;
        Ok(CertBundle { ca_cert: ca.cert, ca_key: ca.key, cert: server.cert, key: server.key })
    }

    /// The bundle of a Secret's `data`, when it has every part (the reference's key names;
    /// `tls.crt` and `tls.key` stand in for `cert.pem` and `key.pem`).
    pub fn from_secret_data(data: &BTreeMap<String, ByteString>) -> Option<Self> {
        let text = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| data.get(*k))
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
                .filter(|t| !t.trim().is_empty())
        };
        Some(CertBundle {
            ca_cert: text(&[CA_CERT])?,
            ca_key: text(&[CA_KEY]).unwrap_or_default(),
            cert: text(&[SERVER_CERT, TLS_CERT])?,
            key: text(&[SERVER_KEY, TLS_KEY])?,
        })
    }

    /// The Secret's `data` for this bundle.
    pub fn to_secret_data(&self) -> BTreeMap<String, ByteString> {
        [
            (CA_CERT, &self.ca_cert),
            (CA_KEY, &self.ca_key),
            (SERVER_CERT, &self.cert),
            (SERVER_KEY, &self.key),
            (TLS_CERT, &self.cert),
            (TLS_KEY, &self.key),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
        .collect()
    }

    /// Whether the serving certificate, signed by the CA, with its key, would still be
    /// accepted for the names the API server dials (the first two of `names`) at `now` plus
    /// [`RENEW_AHEAD`].
    pub fn check(&self, names: &[String], now: SystemTime) -> Result<(), TlsError> {
        tls::verify_server_cert(
            &self.ca_cert,
            &self.cert,
            &self.key,
            required_names(names),
            now + RENEW_AHEAD,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_bundle_serves_the_service_names_for_years() {
        let names = service_names("oka-webhook", "sandbox-system");
        let bundle = CertBundle::generate(&names).unwrap();
        bundle.check(&names, SystemTime::now()).unwrap();
        let in_nine_years = SystemTime::now() + Duration::from_secs(9 * 365 * 24 * 3600);
        bundle.check(&names, in_nine_years).unwrap();
        let in_eleven_years = SystemTime::now() + Duration::from_secs(11 * 365 * 24 * 3600);
        assert!(bundle.check(&names, in_eleven_years).is_err(), "expired by then");
        let other = service_names("oka-webhook", "elsewhere");
        assert!(bundle.check(&other, SystemTime::now()).is_err(), "another namespace's names");
    }

    #[test]
    fn the_secret_keeps_the_reference_key_names() {
        let names = service_names("s", "n");
        let bundle = CertBundle::generate(&names).unwrap();
        let data = bundle.to_secret_data();
        let keys: Vec<&str> = data.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            ["ca-cert.pem", "ca-key.pem", "cert.pem", "key.pem", "tls.crt", "tls.key"]
        );
        assert_eq!(CertBundle::from_secret_data(&data), Some(bundle.clone()));
        let mut tls_only = data.clone();
        tls_only.remove(SERVER_CERT);
        tls_only.remove(SERVER_KEY);
        assert_eq!(CertBundle::from_secret_data(&tls_only), Some(bundle.clone()));
        let mut no_ca = data;
        no_ca.remove(CA_CERT);
        assert_eq!(CertBundle::from_secret_data(&no_ca), None);
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused() {
        let names = service_names("s", "n");
        let one = CertBundle::generate(&names).unwrap();
        let other = CertBundle::generate(&names).unwrap();
        let mixed = CertBundle { key: other.key, ..one.clone() };
        assert!(mixed.check(&names, SystemTime::now()).is_err());
        let foreign_ca = CertBundle { ca_cert: other.ca_cert, ..one };
        assert!(foreign_ca.check(&names, SystemTime::now()).is_err());
    }
}
