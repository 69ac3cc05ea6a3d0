//! The reference's SDK-compat key encoding: how a key that is not of E2B's form (`e2b_` + lowercase
//! hex, which the E2B SDK checks client-side from 2.25.0) is carried through the SDK.
//!
//! The encoding of a raw key `raw` (its UTF-8 bytes) is
//!
//! ```text
//! e2b_ 6f6b6167 01 <len: %08x> <hex(raw)> <hex(SHA-256("openkruise-agents/e2b-key-compat/v1" ‖ raw)[..8])>
//! ```
//!
//! (magic `okag`, version 1, the raw byte length, the raw bytes, a checksum), all lowercase hex.
//! A key taken over from OpenKruise Agents is a UUID or a configured admin key, so clients of
//! the reference hold it either raw or in this form, and both must keep working.
//!
//! Rules (the reference's `ToStoredRawAPIKey`): a presented key that decodes (right prefix,
//! magic, version, a length that fits, exactly the size the length says, lowercase hex, the
//! checksum, compared in constant time) stands for its raw key; anything else is used as it is.
//! The checksum only keeps unrelated `e2b_…` values from decoding by accident; the raw key stays
//! the credential.

use sha2::{Digest, Sha256};

/// `e2b_`: what the E2B SDK requires in front.
const PREFIX: &str = "e2b_";
/// `okag` in hex.
const MAGIC: &str = "6f6b6167";
/// The one format version.
const VERSION: &str = "01";
/// What the checksum is salted with.
const CHECKSUM_SALT: &[u8] = b"openkruise-agents/e2b-key-compat/v1";
/// Hex digits of the length field.
const LENGTH_DIGITS: usize = 8;
/// Hex digits of the checksum (8 bytes).
const CHECKSUM_DIGITS: usize = 16;
/// The largest raw length the reference accepts: what keeps its whole payload within an `i32`.
const MAX_RAW_LENGTH: u64 =
    (i32::MAX as u64 - (MAGIC.len() + VERSION.len() + LENGTH_DIGITS + CHECKSUM_DIGITS) as u64) / 2;

/// Whether `key` has the form the E2B SDK accepts: `^e2b_[0-9a-f]+$`.
pub fn is_sdk_form(key: &str) -> bool {
    key.strip_prefix(PREFIX).is_some_and(|hex| !hex.is_empty() && hex.bytes().all(is_lower_hex))
}

fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn checksum(raw: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(CHECKSUM_SALT);
    hasher.update(raw);
    hex(&hasher.finalize()[..8])
}

/// The encoding of the raw key `raw`.
pub fn encode(raw: &str) -> String {
    let bytes = raw.as_bytes();
    format!("{PREFIX}{MAGIC}{VERSION}{:08x}{}{}", bytes.len(), hex(bytes), checksum(bytes))
}

/// The raw key `key` encodes, if it is a valid encoding (see the module rules) of a UTF-8 key.
pub fn decode(key: &str) -> Option<String> {
    if !is_sdk_form(key) {
        return None;
    }
    let payload = key.strip_prefix(PREFIX)?;
    let body = payload.strip_prefix(MAGIC)?.strip_prefix(VERSION)?;
    let length = u64::from_str_radix(body.get(..LENGTH_DIGITS)?, 16).ok()?;
    if length > MAX_RAW_LENGTH {
        return None;
    }
    let raw_digits = usize::try_from(length).ok()?.checked_mul(2)?;
    let rest = &body[LENGTH_DIGITS..];
    if rest.len() != raw_digits.checked_add(CHECKSUM_DIGITS)? {
        return None;
    }
    let (raw_hex, given) = rest.split_at(raw_digits);
    let raw = (0..raw_hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&raw_hex[i..i + 2], 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    let expected = checksum(&raw);
    let differs = expected.bytes().zip(given.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0;
    if differs {
        return None;
    }
    String::from_utf8(raw).ok()
}

/// The raw key a presented key stands for: its decoding when it is a valid encoding, else the
/// key as presented.
pub fn to_raw(presented: &str) -> std::borrow::Cow<'_, str> {
    match decode(presented) {
        Some(raw) => std::borrow::Cow::Owned(raw),
        None => std::borrow::Cow::Borrowed(presented),
    }
}

/// What `GET /api-keys/compatible` answers for the raw key `raw`: the key itself when the SDK
/// already accepts it (oka's own keys), else its encoding.
pub fn sdk_compatible(raw: &str) -> String {
    if is_sdk_form(raw) { raw.to_owned() } else { encode(raw) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors computed independently of this code (Python's `hashlib`) from the reference's
    /// algorithm; the first is the example of the reference's design note.
    const VECTORS: &[(&str, &str)] = &[
        ("admin-987654321", "e2b_6f6b6167010000000f61646d696e2d393837363534333231633752d5d325a4ab"),
        (
            "11111111-2222-3333-4444-555555555555",
            "e2b_6f6b6167010000002431313131313131312d323232322d333333332d343434342d353535353535353535353535b1064cc3165dfab2",
        ),
        ("", "e2b_6f6b61670100000000425929dd6afb855b"),
        ("key-with-中", "e2b_6f6b6167010000000c6b65792d776974682de4b8ad7813601f17b74000"),
        ("raw-key", "e2b_6f6b616701000000077261772d6b657911f901444b16d9c2"),
        ("some-api-key", "e2b_6f6b6167010000000c736f6d652d6170692d6b657947a2e62d3ce60d6d"),
    ];

    #[test]
    fn encodes_byte_exactly_and_decodes_back() {
        for (raw, encoded) in VECTORS {
            assert_eq!(encode(raw), *encoded, "{raw:?}");
            assert!(is_sdk_form(encoded));
            assert_eq!(decode(encoded).as_deref(), Some(*raw), "{raw:?}");
            assert_eq!(to_raw(encoded), *raw);
            assert_eq!(sdk_compatible(raw), *encoded);
        }
    }

    #[test]
    fn anything_but_a_valid_encoding_is_used_as_it_is() {
        let valid = encode("raw-key");
        let flipped_last = {
            let mut s = valid.clone();
            let last = if s.ends_with('0') { '1' } else { '0' };
            s.pop();
            s.push(last);
            s
        };
        let cases = [
            "raw-key".to_owned(),
            "e2b_abc123".to_owned(),
            // Wrong magic, right checksum.
            format!("e2b_0000000001000000077261772d6b6579{}", checksum(b"raw-key")),
            valid.replacen("01", "02", 1),
            valid.replacen("00000007", "00000008", 1),
            valid.replacen("00000007", "00000006", 1),
            flipped_last,
            valid.to_uppercase(),
            format!("{valid}00"),
            valid[..valid.len() - 2].to_owned(),
            // A length beyond what the reference accepts.
            format!("e2b_6f6b61670140000000{}", "0".repeat(16)),
            "e2b_".to_owned(),
            "e2b_6f6b616701".to_owned(),
            String::new(),
        ];
        for case in cases {
            assert_eq!(decode(&case), None, "{case:?}");
            assert_eq!(to_raw(&case), case.as_str());
        }
    }

    #[test]
    fn the_sdk_form_is_lowercase_hex_after_the_prefix() {
        assert!(is_sdk_form("e2b_abc123"));
        for bad in ["abc123", "e2b_", "E2B_abc123", "e2b_ABC123", "e2b_not-hex"] {
            assert!(!is_sdk_form(bad), "{bad:?}");
        }
        // oka's own keys are answered as they are; the reference's raw keys encoded.
        let own = "e2b_0123456789abcdef0123456789abcdef01234567";
        assert_eq!(sdk_compatible(own), own);
        assert_eq!(sdk_compatible("some-api-key"), encode("some-api-key"));
    }
}
