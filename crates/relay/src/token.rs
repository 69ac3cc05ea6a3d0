//! The relay's shared secret: checked when it is made, so a node agent never starts with a token
//! an attacker could guess, and compared in constant time.

use std::fmt;
use std::path::{Path, PathBuf};

/// The fewest characters a token may have: 32 characters of text, as 32 random hex digits are
/// 128 bits.
pub const MIN_TOKEN_LEN: usize = 32;

/// The most characters a token may have; it bounds the header the server reads.
pub const MAX_TOKEN_LEN: usize = 256;

/// Why a token was refused or could not be read or made.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Shorter than [`MIN_TOKEN_LEN`] (an empty token included).
    #[error("relay token is {len} characters; at least {MIN_TOKEN_LEN} are needed")]
    TooShort {
        /// Its length.
        len: usize,
    },
    /// Longer than [`MAX_TOKEN_LEN`].
    #[error("relay token is {len} characters; at most {MAX_TOKEN_LEN} are allowed")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// A character that is not printable ASCII (space and control characters included): the
    /// token is one field of a space-separated line.
    #[error("relay token may hold only printable ASCII characters without spaces")]
    InvalidCharacter,
    /// The token file could not be read.
    #[error("cannot read relay token file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The system's random source failed.
    #[error("cannot generate a relay token: {0}")]
    Random(getrandom::Error),
}

/// A shared secret between the relay's server and its clients.
///
/// Invariant: [`MIN_TOKEN_LEN`] to [`MAX_TOKEN_LEN`] printable ASCII characters, no space;
/// enforced by [`RelayToken::new`]. `Debug` does not show it, so it never lands in a log.
#[derive(Clone, PartialEq, Eq)]
pub struct RelayToken(String);

impl RelayToken {
    /// Checks `token` and wraps it.
    pub fn new(token: impl Into<String>) -> Result<Self, TokenError> {
        let token = token.into();
        let len = token.len();
        if len < MIN_TOKEN_LEN {
            return Err(TokenError::TooShort { len });
        }
        if len > MAX_TOKEN_LEN {
            return Err(TokenError::TooLong { len });
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::InvalidCharacter);
        }
        Ok(Self(token))
    }

    /// The token's text, for writing it into a header or a file.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token, compared without an early exit on the first differing
    /// byte, so response times do not reveal how much of a guess was right.
    pub fn matches(&self, presented: &[u8]) -> bool {
        constant_time_eq(self.0.as_bytes(), presented)
    }
}

impl fmt::Debug for RelayToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RelayToken(<redacted>)")
    }
}

/// Compares without an early exit on the first differing byte (only a different length returns
/// early: the length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    // `black_box` keeps the optimiser from turning the fold back into an early-exit compare.
    std::hint::black_box(a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y))) == 0
}

/// Reads a token from `path`, with surrounding whitespace (a trailing newline) trimmed: the shape
/// of a Kubernetes Secret mounted as a file.
pub fn load_token(path: impl AsRef<Path>) -> Result<RelayToken, TokenError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path)
        .map_err(|source| TokenError::Read { path: path.to_owned(), source })?;
    RelayToken::new(text.trim())
}

/// A new random token: 32 bytes from the system's random source, as 64 hex digits.
pub fn generate_token() -> Result<RelayToken, TokenError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(TokenError::Random)?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    RelayToken::new(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_empty_long_and_spaced_tokens_are_refused() {
        assert!(matches!(RelayToken::new(""), Err(TokenError::TooShort { len: 0 })));
        assert!(matches!(RelayToken::new("a".repeat(31)), Err(TokenError::TooShort { len: 31 })));
        assert!(matches!(RelayToken::new("a".repeat(257)), Err(TokenError::TooLong { len: 257 })));
        let spaced = format!("{} {}", "a".repeat(20), "b".repeat(20));
        assert!(matches!(RelayToken::new(spaced), Err(TokenError::InvalidCharacter)));
        let newline = format!("{}\n", "a".repeat(40));
        assert!(matches!(RelayToken::new(newline), Err(TokenError::InvalidCharacter)));
        assert!(RelayToken::new("a".repeat(32)).is_ok());
        assert!(RelayToken::new("a".repeat(256)).is_ok());
    }

    #[test]
    fn tokens_match_only_themselves_and_never_print() {
        let token = RelayToken::new("x".repeat(40)).unwrap();
        assert!(token.matches("x".repeat(40).as_bytes()));
        assert!(!token.matches("x".repeat(39).as_bytes()));
        assert!(!token.matches(format!("{}y", "x".repeat(39)).as_bytes()));
        assert_eq!(format!("{token:?}"), "RelayToken(<redacted>)");
    }

    #[test]
    fn generated_tokens_are_valid_and_differ() {
        let a = generate_token().unwrap();
        let b = generate_token().unwrap();
        assert_eq!(a.expose().len(), 64);
        assert!(a.expose().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn token_files_are_trimmed_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, format!("  {}\n", "k".repeat(48))).unwrap();
        assert_eq!(load_token(&path).unwrap().expose(), "k".repeat(48));
        std::fs::write(&path, "short\n").unwrap();
        assert!(matches!(load_token(&path), Err(TokenError::TooShort { len: 5 })));
        assert!(matches!(load_token(dir.path().join("missing")), Err(TokenError::Read { .. })));
    }
}
