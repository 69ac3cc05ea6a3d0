//! Traffic access tokens as JWTs: the identity provider's key set (JWKS) and the verification
//! of one token against it, as the reference's gateway does (`pkg/identity/oidc`). Pure: no IO,
//! the time is passed in; [`crate::oidc`] fetches the documents and publishes the verifier.
//!
//! # Key set rules (a set that breaks one is refused whole)
//!
//! - At least one key; every key has a non-empty `kid`, unique in the set.
//! - `use`, when given, is `sig`; `key_ops`, when given, contains `verify`.
//! - Asymmetric public keys only: `RSA` (`n`, `e`; 2048 to 8192 bits), `EC` (`P-256`, `P-384`,
//!   `P-521`, a point on the curve), `OKP` (`Ed25519`, 32 bytes). A symmetric (`oct`) key or
//!   one with private parts (`d`, `p`, ...) is refused.
//! - `alg`, when given, is one the key can verify.
//!
//! # Token rules
//!
//! - Compact JWS of at most [`MAX_TOKEN`] bytes; `alg` one of RS256/384/512, PS256/384/512,
//!   ES256/384/512, EdDSA; `kid` present and in the set; `alg` equal to the key's `alg` when it
//!   has one, and usable with the key's type and curve; the signature verifies.
//! - Claims: `exp`, `iat` and `nbf` present; `sub` non-empty; `iss` equal to the issuer of
//!   the discovery document; `exp` not passed, `nbf` and `iat` not in the future, each with
//!   the clock skew allowed. `aud` is not checked.
//! - The sandbox the token is for is `{"sandbox": {"sandboxId", "sandboxUid"}}`; comparing it
//!   with the route is the caller's ([`crate::auth`]).

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;

/// The longest token verified (the reference's 64 KiB).
pub const MAX_TOKEN: usize = 64 * 1024;

/// A signature algorithm of JWS that the verifier accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    Rs256,
    /// RSASSA-PKCS1-v1_5 with SHA-384.
    Rs384,
    /// RSASSA-PKCS1-v1_5 with SHA-512.
    Rs512,
    /// RSASSA-PSS with SHA-256.
    Ps256,
    /// RSASSA-PSS with SHA-384.
    Ps384,
    /// RSASSA-PSS with SHA-512.
    Ps512,
    /// ECDSA on P-256 with SHA-256.
    Es256,
    /// ECDSA on P-384 with SHA-384.
    Es384,
    /// ECDSA on P-521 with SHA-512.
    Es512,
    /// Ed25519.
    EdDsa,
}

impl Algorithm {
    /// The algorithm a JOSE `alg` names, if accepted.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "RS256" => Self::Rs256,
            "RS384" => Self::Rs384,
            "RS512" => Self::Rs512,
            "PS256" => Self::Ps256,
            "PS384" => Self::Ps384,
            "PS512" => Self::Ps512,
            "ES256" => Self::Es256,
            "ES384" => Self::Es384,
            "ES512" => Self::Es512,
            "EdDSA" => Self::EdDsa,
            _ => return None,
        })
    }
}

/// A verification key of the set.
#[derive(Clone)]
enum PublicKey {
    /// Big-endian modulus (no leading zeros) and exponent.
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    P256(p256::ecdsa::VerifyingKey),
    P384(p384::ecdsa::VerifyingKey),
    P521(Box<p521::ecdsa::VerifyingKey>),
    Ed25519(Vec<u8>),
}

impl PublicKey {
    /// Whether `alg` can be verified with this key.
    fn supports(&self, alg: Algorithm) -> bool {
        use Algorithm::*;
        match self {
            PublicKey::Rsa { .. } => matches!(alg, Rs256 | Rs384 | Rs512 | Ps256 | Ps384 | Ps512),
            PublicKey::P256(_) => alg == Es256,
            PublicKey::P384(_) => alg == Es384,
            PublicKey::P521(_) => alg == Es512,
            PublicKey::Ed25519(_) => alg == EdDsa,
        }
    }

    /// Whether `signature` over `message` verifies (`alg` is one [`Self::supports`]).
    fn verify(&self, alg: Algorithm, message: &[u8], signature: &[u8]) -> bool {
        use ring::signature as rs;
        use signature_verify as ec;
        match self {
            PublicKey::Rsa { n, e } => {
                let params: &rs::RsaParameters = match alg {
                    Algorithm::Rs256 => &rs::RSA_PKCS1_2048_8192_SHA256,
                    Algorithm::Rs384 => &rs::RSA_PKCS1_2048_8192_SHA384,
                    Algorithm::Rs512 => &rs::RSA_PKCS1_2048_8192_SHA512,
                    Algorithm::Ps256 => &rs::RSA_PSS_2048_8192_SHA256,
                    Algorithm::Ps384 => &rs::RSA_PSS_2048_8192_SHA384,
                    Algorithm::Ps512 => &rs::RSA_PSS_2048_8192_SHA512,
                    _ => return false,
                };
                rs::RsaPublicKeyComponents { n, e }.verify(params, message, signature).is_ok()
            }
            PublicKey::P256(key) => ec::p256(key, message, signature),
            PublicKey::P384(key) => ec::p384(key, message, signature),
            PublicKey::P521(key) => ec::p521(key, message, signature),
            PublicKey::Ed25519(x) => {
                rs::UnparsedPublicKey::new(&rs::ED25519, x).verify(message, signature).is_ok()
            }
        }
    }
}

/// ECDSA verification with the fixed-size `r || s` signatures of JWS.
mod signature_verify {
    use p256::ecdsa::signature::Verifier as _;

    pub(super) fn p256(key: &p256::ecdsa::VerifyingKey, message: &[u8], sig: &[u8]) -> bool {
        p256::ecdsa::Signature::from_slice(sig).is_ok_and(|s| key.verify(message, &s).is_ok())
    }

    pub(super) fn p384(key: &p384::ecdsa::VerifyingKey, message: &[u8], sig: &[u8]) -> bool {
        p384::ecdsa::Signature::from_slice(sig).is_ok_and(|s| key.verify(message, &s).is_ok())
    }

    pub(super) fn p521(key: &p521::ecdsa::VerifyingKey, message: &[u8], sig: &[u8]) -> bool {
        p521::ecdsa::Signature::from_slice(sig).is_ok_and(|s| key.verify(message, &s).is_ok())
    }
}

/// One key of the set, checked.
#[derive(Clone)]
struct Jwk {
    key: PublicKey,
    /// Its `alg`, when the set names one.
    alg: Option<Algorithm>,
}

/// Why a key set was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwksError {
    /// Not a JSON object with a `keys` array.
    #[error("the key set is not a JWKS document: {0}")]
    Document(String),
    /// No key.
    #[error("key set must contain at least one key")]
    Empty,
    /// Key number `index` (from 0) breaks a rule.
    #[error("key {index}: {reason}")]
    Key {
        /// Its place in the set.
        index: usize,
        /// The rule.
        reason: String,
    },
    /// Two keys share a `kid`.
    #[error("duplicate kid {0:?}")]
    DuplicateKid(String),
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// No token.
    #[error("token must not be empty")]
    Empty,
    /// Longer than [`MAX_TOKEN`].
    #[error("token exceeds maximum size of {MAX_TOKEN} bytes")]
    TooLarge,
    /// Not three base64url parts with a JSON header and payload.
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    /// `alg` is not one of the accepted algorithms.
    #[error("unsupported algorithm {0:?}")]
    Algorithm(String),
    /// No `kid` in the header.
    #[error("token header must contain a kid")]
    NoKid,
    /// `kid` is not in the set.
    #[error("token references unknown kid {0:?}")]
    UnknownKid(String),
    /// `alg` differs from the key's, or the key cannot verify it.
    #[error("token algorithm {0:?} does not match its key")]
    KeyMismatch(String),
    /// The signature does not verify.
    #[error("invalid signature")]
    Signature,
    /// A required claim is missing or empty.
    #[error("token is missing {0} claim")]
    Missing(&'static str),
    /// `iss` is not the issuer.
    #[error("token issuer {0:?} does not match the expected issuer")]
    Issuer(String),
    /// `exp` has passed.
    #[error("token is expired")]
    Expired,
    /// `nbf` is in the future.
    #[error("token is not valid yet")]
    NotYetValid,
    /// `iat` is in the future.
    #[error("token was issued in the future")]
    IssuedInFuture,
}

/// The sandbox a verified token is for.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct SandboxClaims {
    /// The public sandbox ID.
    #[serde(rename = "sandboxId", default)]
    pub sandbox_id: String,
    /// The Sandbox object's UID.
    #[serde(rename = "sandboxUid", default)]
    pub sandbox_uid: String,
}

/// A verifier over one key set and issuer; immutable once built.
#[derive(Clone)]
pub struct Verifier {
    issuer: String,
    keys: HashMap<String, Jwk>,
    clock_skew: Duration,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut kids: Vec<&String> = self.keys.keys().collect();
        kids.sort();
        f.debug_struct("Verifier")
            .field("issuer", &self.issuer)
            .field("kids", &kids)
            .field("clock_skew", &self.clock_skew)
            .finish()
    }
}

fn b64(text: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(text).ok()
}

/// A JOSE NumericDate: seconds since the epoch, integer or not.
fn numeric_date(value: Option<&serde_json::Value>) -> Option<f64> {
    value.and_then(serde_json::Value::as_f64)
}

/// One key of a JWKS document, checked (the rules of the module documentation).
fn parse_key(raw: &serde_json::Value) -> Result<(String, Jwk), String> {
    let object = raw.as_object().ok_or("is not a JSON object")?;
    let text = |name: &str| -> Result<Option<&str>, String> {
        match object.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(format!("{name} is not a string")),
        }
    };
    let bytes = |name: &str| -> Result<Vec<u8>, String> {
        let value = text(name)?.ok_or_else(|| format!("{name} is missing"))?;
        b64(value).filter(|b| !b.is_empty()).ok_or_else(|| format!("{name} is not base64url"))
    };
    if let Some(ops) = object.get("key_ops") {
        let ops = ops.as_array().ok_or("key_ops is not an array")?;
        if !ops.is_empty() && !ops.iter().any(|op| op == "verify") {
            return Err("key_ops does not permit verify".into());
        }
    }
    let kty = text("kty")?.ok_or("kty is missing")?;
    let kid = text("kid")?.unwrap_or_default();
    if kid.is_empty() {
        return Err("has an empty kid".into());
    }
    if let Some(usage) = text("use")?
        && usage != "sig"
    {
        return Err(format!("key {kid:?} has unsupported use {usage:?}"));
    }
    const PRIVATE: [&str; 6] = ["d", "p", "q", "dp", "dq", "qi"];
    if kty == "oct" || PRIVATE.iter().any(|k| object.contains_key(*k)) {
        return Err(format!("key {kid:?} must be an asymmetric public key"));
    }
    let invalid = |why: &str| format!("key {kid:?} is invalid: {why}");
    let key = match kty {
        "RSA" => {
            let mut n = bytes("n").map_err(|e| invalid(&e))?;
            let e = bytes("e").map_err(|e| invalid(&e))?;
            let zeros = n.iter().take_while(|b| **b == 0).count();
            n.drain(..zeros);
            let bits = n.len() * 8 - n.first().map_or(8, |b| b.leading_zeros() as usize);
            if !(2048..=8192).contains(&bits) {
                return Err(invalid("the RSA modulus must have 2048 to 8192 bits"));
            }
            if e.iter().all(|b| *b == 0) {
                return Err(invalid("the RSA exponent is zero"));
            }
            PublicKey::Rsa { n, e }
        }
        "EC" => {
            let crv = text("crv")?.unwrap_or_default();
            let (x, y) =
                (bytes("x").map_err(|e| invalid(&e))?, bytes("y").map_err(|e| invalid(&e))?);
            let size = match crv {
                "P-256" => 32,
                "P-384" => 48,
                "P-521" => 66,
                _ => return Err(invalid(&format!("unsupported curve {crv:?}"))),
            };
            if x.len() != size || y.len() != size {
                return Err(invalid("coordinates of the wrong size"));
            }
            let mut point = Vec::with_capacity(1 + 2 * size);
            point.push(0x04);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            let off_curve = || invalid("the point is not on the curve");
            match crv {
                "P-256" => PublicKey::P256(
                    p256::ecdsa::VerifyingKey::from_sec1_bytes(&point).map_err(|_| off_curve())?,
                ),
                "P-384" => PublicKey::P384(
                    p384::ecdsa::VerifyingKey::from_sec1_bytes(&point).map_err(|_| off_curve())?,
                ),
                _ => PublicKey::P521(Box::new(
                    p521::ecdsa::VerifyingKey::from_sec1_bytes(&point).map_err(|_| off_curve())?,
                )),
            }
        }
        "OKP" => {
            let crv = text("crv")?.unwrap_or_default();
            if crv != "Ed25519" {
                return Err(invalid(&format!("unsupported curve {crv:?}")));
            }
            let x = bytes("x").map_err(|e| invalid(&e))?;
            if x.len() != 32 {
                return Err(invalid("an Ed25519 key has 32 bytes"));
            }
            PublicKey::Ed25519(x)
        }
        other => return Err(format!("key {kid:?} has unsupported kty {other:?}")),
    };
    let alg = match text("alg")? {
        None | Some("") => None,
        Some(name) => match Algorithm::from_name(name) {
            Some(alg) if key.supports(alg) => Some(alg),
            _ => return Err(format!("key {kid:?} has incompatible algorithm {name:?}")),
        },
    };
    Ok((kid.to_owned(), Jwk { key, alg }))
}

impl Verifier {
    /// A verifier for tokens of `issuer` signed by a key of `jwks` (a JWKS document), with
    /// `clock_skew` allowed on the time claims.
    pub fn new(issuer: &str, jwks: &[u8], clock_skew: Duration) -> Result<Self, JwksError> {
        #[derive(Deserialize)]
        struct Document {
            keys: Vec<serde_json::Value>,
        }
        let document: Document =
            serde_json::from_slice(jwks).map_err(|e| JwksError::Document(e.to_string()))?;
        if document.keys.is_empty() {
            return Err(JwksError::Empty);
        }
        let mut keys = HashMap::with_capacity(document.keys.len());
        for (index, raw) in document.keys.iter().enumerate() {
            let (kid, key) = parse_key(raw).map_err(|reason| JwksError::Key { index, reason })?;
            if keys.contains_key(&kid) {
                return Err(JwksError::DuplicateKid(kid));
            }
            keys.insert(kid, key);
        }
        Ok(Self { issuer: issuer.to_owned(), keys, clock_skew })
    }

    /// The issuer tokens must name.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Verifies `token` at `now` (seconds since the epoch); the sandbox it is for.
    pub fn verify(&self, token: &[u8], now: i64) -> Result<SandboxClaims, JwtError> {
        #[derive(Deserialize)]
        struct Header {
            alg: Option<String>,
            kid: Option<String>,
        }
        if token.is_empty() {
            return Err(JwtError::Empty);
        }
        if token.len() > MAX_TOKEN {
            return Err(JwtError::TooLarge);
        }
        let token = std::str::from_utf8(token).map_err(|_| JwtError::Malformed("not text"))?;
        let mut parts = token.split('.');
        let (Some(header_part), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(JwtError::Malformed("not three parts"));
        };
        let signed = &token[..header_part.len() + 1 + payload.len()];
        let header: Header = b64(header_part)
            .and_then(|h| serde_json::from_slice(&h).ok())
            .ok_or(JwtError::Malformed("header"))?;
        let alg_name = header.alg.unwrap_or_default();
        let alg =
            Algorithm::from_name(&alg_name).ok_or_else(|| JwtError::Algorithm(alg_name.clone()))?;
        let kid = header.kid.filter(|k| !k.is_empty()).ok_or(JwtError::NoKid)?;
        let key = self.keys.get(&kid).ok_or(JwtError::UnknownKid(kid))?;
        if key.alg.is_some_and(|a| a != alg) || !key.key.supports(alg) {
            return Err(JwtError::KeyMismatch(alg_name));
        }
        let signature = b64(signature).ok_or(JwtError::Malformed("signature"))?;
        if !key.key.verify(alg, signed.as_bytes(), &signature) {
            return Err(JwtError::Signature);
        }
        let claims: serde_json::Value = b64(payload)
            .and_then(|p| serde_json::from_slice(&p).ok())
            .filter(serde_json::Value::is_object)
            .ok_or(JwtError::Malformed("payload"))?;
        let exp = numeric_date(claims.get("exp")).ok_or(JwtError::Missing("exp"))?;
        let iat = numeric_date(claims.get("iat")).ok_or(JwtError::Missing("iat"))?;
        let nbf = numeric_date(claims.get("nbf")).ok_or(JwtError::Missing("nbf"))?;
        let iss = claims.get("iss").and_then(serde_json::Value::as_str).unwrap_or_default();
        if iss != self.issuer {
            return Err(JwtError::Issuer(iss.to_owned()));
        }
        if claims.get("sub").and_then(serde_json::Value::as_str).is_none_or(str::is_empty) {
            return Err(JwtError::Missing("sub"));
        }
        let skew = self.clock_skew.as_secs_f64();
        let now = now as f64;
        if now - skew > exp {
            return Err(JwtError::Expired);
        }
        if now + skew < nbf {
            return Err(JwtError::NotYetValid);
        }
        if now + skew < iat {
            return Err(JwtError::IssuedInFuture);
        }
        Ok(claims
            .get("sandbox")
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .unwrap_or_default())
    }
}

#[cfg(test)]
pub(crate) mod tests;
