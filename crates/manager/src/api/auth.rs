//! API keys: the `X-API-Key` header checked against the admin key from configuration.
//!
//! Keys have E2B's form, `e2b_` followed by 40 lowercase hex digits, which every SDK version
//! accepts (the SDK checks `^e2b_[0-9a-f]+$` client-side from 2.25.0). The admin key belongs
//! to the reference's well-known admin key ID and the `admin` team, which sees every
//! namespace. Keys are compared by SHA-256 digest in constant time; only the digest is kept.
//!
//! Stored keys (oka's and those taken over from the reference's Secret), their CRUD
//! (`/api-keys`) and teams as namespaces are in [`super::keys`]; the reference's compat
//! encoding (`e2b_6f6b6167…`), which the key store decodes before a lookup, in
//! [`super::key_compat`].

use http::HeaderMap;
use sha2::{Digest, Sha256};

/// The reference's well-known ID of the admin API key (the owner of what it creates).
pub const ADMIN_KEY_ID: &str = "550e8400-e29b-41d4-a716-446655440000";
/// The reference's well-known ID of the admin team.
pub const ADMIN_TEAM_ID: &str = "550e8400-e29b-41d4-a716-446655449999";
/// The header the SDKs send the key in (matched case-insensitively).
pub const API_KEY_HEADER: &str = "x-api-key";

/// Why a request is not authenticated: 401 `Invalid API Key`, the reference's message, for
/// both (so a caller cannot probe which keys exist).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `X-API-Key` header.
    #[error("Invalid API Key")]
    Missing,
    /// The key is not known.
    #[error("Invalid API Key")]
    Invalid,
}

/// Why a configured key is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an API key must be `e2b_` followed by 40 lowercase hex digits")]
pub struct InvalidKeyFormat;

/// An API key (kept as its SHA-256 digest).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    digest: [u8; 32],
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl ApiKey {
    /// Parses a key of the form `e2b_` + 40 lowercase hex digits.
    ///
    /// # Errors
    ///
    /// [`InvalidKeyFormat`] for anything else.
    pub fn parse(key: &str) -> Result<Self, InvalidKeyFormat> {
        let hex = key.strip_prefix("e2b_").ok_or(InvalidKeyFormat)?;
        if hex.len() != 40 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(InvalidKeyFormat);
        }
        Ok(Self { digest: digest(key) })
    }

    /// A fresh random key and its text (shown once, to be printed for the user).
    pub fn generate() -> (Self, String) {
        let random = [uuid::Uuid::new_v4().as_u128(), uuid::Uuid::new_v4().as_u128()];
        let hex: String = random.iter().map(|r| format!("{r:032x}")).collect();
        let text = format!("e2b_{}", &hex[..40]);
        (Self { digest: digest(&text) }, text)
    }

    /// Whether `candidate` is this key (constant time in the candidate's content).
    pub fn matches(&self, candidate: &str) -> bool {
        let other = digest(candidate);
        self.digest.iter().zip(other).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

/// The caller a key identifies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The API key's ID: the owner stamped on what the caller claims.
    pub id: String,
    /// The team's name.
    pub team: String,
    /// The namespace the team sees; `None` for the admin team (every namespace).
    pub namespace: Option<String>,
    /// The key's quota; `None`: unlimited.
    pub quota: Option<crate::quota::QuotaSpec>,
}

impl User {
    /// The admin key's user.
    pub fn admin() -> Self {
        Self { id: ADMIN_KEY_ID.into(), team: "admin".into(), namespace: None, quota: None }
    }

    /// Whether this is the admin team (sees every namespace).
    pub fn is_admin(&self) -> bool {
        self.namespace.is_none()
    }
}

/// Authenticates a request by its `X-API-Key` header.
///
/// # Errors
///
/// [`AuthError::Missing`] without the header, [`AuthError::Invalid`] for an unknown key.
pub fn authenticate(admin_key: &ApiKey, headers: &HeaderMap) -> Result<User, AuthError> {
    let key = headers.get(API_KEY_HEADER).ok_or(AuthError::Missing)?;
    let key = key.to_str().map_err(|_| AuthError::Invalid)?;
    if admin_key.matches(key) { Ok(User::admin()) } else { Err(AuthError::Invalid) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "e2b_0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn parse_accepts_only_the_e2b_form() {
        assert!(ApiKey::parse(KEY).is_ok());
        for bad in [
            "",
            "e2b_",
            "0123456789abcdef0123456789abcdef01234567",
            "e2b_0123456789ABCDEF0123456789abcdef01234567",
            "e2b_0123456789abcdef0123456789abcdef0123456",
            "e2b_0123456789abcdef0123456789abcdef012345678",
            "e2b_0123456789abcdef0123456789abcdef0123456g",
        ] {
            assert_eq!(ApiKey::parse(bad), Err(InvalidKeyFormat), "{bad:?}");
        }
    }

    #[test]
    fn generated_keys_parse_and_match_only_themselves() {
        let (key, text) = ApiKey::generate();
        assert_eq!(ApiKey::parse(&text).as_ref(), Ok(&key));
        assert!(key.matches(&text));
        assert!(!key.matches(KEY));
        assert_eq!(format!("{key:?}"), "ApiKey(<redacted>)");
    }

    #[test]
    fn authenticate_reads_x_api_key() {
        let key = ApiKey::parse(KEY).unwrap();
        let mut headers = HeaderMap::new();
        assert_eq!(authenticate(&key, &headers), Err(AuthError::Missing));
        headers.insert("X-API-KEY", "e2b_nope".parse().unwrap());
        assert_eq!(authenticate(&key, &headers), Err(AuthError::Invalid));
        headers.insert("x-api-key", KEY.parse().unwrap());
        assert_eq!(authenticate(&key, &headers), Ok(User::admin()));
    }
}
