//! The Jupyter messaging protocol, version 5.3, on top of ZMTP multipart messages.
//!
//! A message on the wire is `[identities…, "<IDS|MSG>", signature, header, parent_header,
//! metadata, content, buffers…]`. The signature is the lowercase hex HMAC-SHA256, keyed with the
//! kernel's connection-file key, of the four JSON frames in order. Incoming messages with a bad
//! signature are dropped (with a warning) by the caller.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The protocol version we speak.
pub const PROTOCOL_VERSION: &str = "5.3";
const DELIMITER: &[u8] = b"<IDS|MSG>";

/// Errors decoding a Jupyter message.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// No `<IDS|MSG>` delimiter, or too few frames after it.
    #[error("malformed jupyter message: {0}")]
    Malformed(&'static str),
    /// The HMAC signature does not match.
    #[error("bad jupyter message signature")]
    BadSignature,
    /// A JSON frame does not parse.
    #[error("bad jupyter message json: {0}")]
    Json(#[from] serde_json::Error),
}

/// HMAC-SHA256 (RFC 2104) over the concatenation of `parts`.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let inner = inner.finalize();
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner);
    outer.finalize().into()
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// A message header.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Header {
    /// Unique per message.
    pub msg_id: String,
    /// The sender's session id.
    pub session: String,
    /// The sender's user name.
    pub username: String,
    /// ISO 8601 time the message was made.
    pub date: String,
    /// The message type, e.g. `execute_request`.
    pub msg_type: String,
    /// The protocol version.
    pub version: String,
}

/// A decoded (or to-be-sent) message.
#[derive(Debug, Clone)]
pub struct Message {
    /// This message's header.
    pub header: Header,
    /// The header of the request this message answers (`{}` if none).
    pub parent_header: Value,
    /// Free-form metadata.
    pub metadata: Value,
    /// The message content.
    pub content: Value,
    /// Extra binary buffers.
    pub buffers: Vec<Bytes>,
}

impl Message {
    /// The `msg_id` of the parent header, if any.
    pub fn parent_id(&self) -> Option<&str> {
        self.parent_header.get("msg_id").and_then(Value::as_str)
    }

    /// The message type.
    pub fn msg_type(&self) -> &str {
        &self.header.msg_type
    }
}

/// A client session: its id, user name and signing key.
#[derive(Debug, Clone)]
pub struct Session {
    key: Vec<u8>,
    session: String,
    username: String,
}

impl Session {
    /// A new session with a random id.
    pub fn new(key: impl Into<Vec<u8>>, username: impl Into<String>) -> Self {
        Session {
            key: key.into(),
            session: uuid::Uuid::new_v4().to_string(),
            username: username.into(),
        }
    }

    /// A new request message of `msg_type` with `content`.
    pub fn request(&self, msg_type: &str, content: Value) -> Message {
        Message {
            header: Header {
                msg_id: uuid::Uuid::new_v4().to_string(),
                session: self.session.clone(),
                username: self.username.clone(),
                date: jiff::Timestamp::now().to_string(),
                msg_type: msg_type.to_owned(),
                version: PROTOCOL_VERSION.to_owned(),
            },
            parent_header: Value::Object(Default::default()),
            metadata: Value::Object(Default::default()),
            content,
            buffers: Vec::new(),
        }
    }

    fn sign(&self, parts: &[&[u8]]) -> String {
        if self.key.is_empty() {
            return String::new();
        }
        hex(&hmac_sha256(&self.key, parts))
    }

    /// The frames of `msg` as a DEALER sends them (no identities).
    pub fn encode(&self, msg: &Message) -> Result<Vec<Vec<u8>>, WireError> {
        let header = serde_json::to_vec(&msg.header)?;
        let parent = serde_json::to_vec(&msg.parent_header)?;
        let metadata = serde_json::to_vec(&msg.metadata)?;
        let content = serde_json::to_vec(&msg.content)?;
        let sig = self.sign(&[&header, &parent, &metadata, &content]);
        let mut frames =
            vec![DELIMITER.to_vec(), sig.into_bytes(), header, parent, metadata, content];
        frames.extend(msg.buffers.iter().map(|b| b.to_vec()));
        Ok(frames)
    }

    /// Decodes received frames, verifying the signature.
    pub fn decode(&self, frames: &[Bytes]) -> Result<Message, WireError> {
        let at = frames
            .iter()
            .position(|f| &f[..] == DELIMITER)
            .ok_or(WireError::Malformed("no <IDS|MSG> delimiter"))?;
        let rest = &frames[at + 1..];
        if rest.len() < 5 {
            return Err(WireError::Malformed("fewer than five frames after the delimiter"));
        }
        if !self.key.is_empty() {
            let want = self.sign(&[&rest[1], &rest[2], &rest[3], &rest[4]]);
            if !constant_time_eq(want.as_bytes(), &rest[0]) {
                return Err(WireError::BadSignature);
            }
        }
        Ok(Message {
            header: serde_json::from_slice(&rest[1])?,
            parent_header: serde_json::from_slice(&rest[2])?,
            metadata: serde_json::from_slice(&rest[3])?,
            content: serde_json::from_slice(&rest[4])?,
            buffers: rest[5..].to_vec(),
        })
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn hmac_rfc4231_vectors() {
        // Test cases 1, 2, 4 and 6 (a key longer than the block) of RFC 4231.
        let cases: [(Vec<u8>, Vec<u8>, &str); 4] = [
            (
                vec![0x0b; 20],
                b"Hi There".to_vec(),
                "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
            ),
            (
                b"Jefe".to_vec(),
                b"what do ya want for nothing?".to_vec(),
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (
                unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"),
                vec![0xcd; 50],
                "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
            ),
            (
                vec![0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First".to_vec(),
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            ),
        ];
        for (key, data, want) in cases {
            assert_eq!(hex(&hmac_sha256(&key, &[&data])), want);
            // Split input gives the same MAC.
            let (a, b) = data.split_at(data.len() / 2);
            assert_eq!(hex(&hmac_sha256(&key, &[a, b])), want);
        }
    }

    #[test]
    fn encode_decode_round_trip_and_bad_signature() {
        let s = Session::new(b"secret".to_vec(), "user");
        let m = s.request("execute_request", serde_json::json!({"code": "1+1"}));
        let frames: Vec<Bytes> = s.encode(&m).unwrap().into_iter().map(Bytes::from).collect();
        let mut with_ids = vec![Bytes::from_static(b"topic")];
        with_ids.extend(frames.iter().cloned());
        let d = s.decode(&with_ids).unwrap();
        assert_eq!(d.header, m.header);
        assert_eq!(d.content["code"], "1+1");
        assert_eq!(d.parent_id(), None);

        let other = Session::new(b"other".to_vec(), "user");
        assert!(matches!(other.decode(&frames), Err(WireError::BadSignature)));
        assert!(matches!(s.decode(&frames[1..]), Err(WireError::Malformed(_))));
    }
}
