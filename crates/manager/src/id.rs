//! Short sandbox IDs: 13 lowercase base32 characters (`[a-z2-7]`), unique per manager process,
//! in the reference's Sonyflake layout (`docs/proposals/…short-sandbox-id`).
//!
//! Layout of the 64-bit value, big-endian, then unpadded RFC 4648 base32, lowercased:
//! 41 bits of milliseconds since 2025-01-01 UTC, 18 bits of worker, 4 bits of sequence (16 IDs
//! per millisecond; a 17th borrows the next millisecond instead of waiting).
//!
//! IDs match `^[a-z0-9]+$`, so they fit the `{port}-{id}.{domain}` host form the E2B SDK and the
//! gateway split on `-` and `.`.
//!
//! # Caveats
//!
//! - The worker number is random per process (the reference leases one from the API server).
//!   Two manager processes collide only if they draw the same of 2^18 workers *and* mint in the
//!   same millisecond with the same sequence; one machine runs one manager.

use std::sync::Mutex;
use std::sync::PoisonError;

/// Milliseconds of the Unix epoch at 2025-01-01T00:00:00Z, the ID epoch.
const EPOCH_MS: i64 = 1_735_689_600_000;
const WORKER_BITS: u32 = 18;
const SEQUENCE_BITS: u32 = 4;
const SEQUENCE_MAX: u64 = (1 << SEQUENCE_BITS) - 1;
const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// Mints short sandbox IDs; see the [module documentation](self).
#[derive(Debug)]
pub struct IdGenerator {
    worker: u64,
    /// (millisecond, sequence) of the last ID.
    last: Mutex<(u64, u64)>,
}

impl Default for IdGenerator {
    fn default() -> Self {
        let random = uuid::Uuid::new_v4().as_u128();
        Self::with_worker((random as u64) & ((1 << WORKER_BITS) - 1))
    }
}

impl IdGenerator {
    /// A generator with a fixed worker number (taken modulo 2^18).
    pub fn with_worker(worker: u64) -> Self {
        Self { worker: worker & ((1 << WORKER_BITS) - 1), last: Mutex::new((0, 0)) }
    }

    /// The next ID, at the current wall-clock time.
    pub fn next_id(&self) -> String {
        let now_ms = jiff::Timestamp::now().as_millisecond().saturating_sub(EPOCH_MS).max(0) as u64;
        self.next_at(now_ms)
    }

    /// The next ID, at `now_ms` milliseconds after the ID epoch.
    fn next_at(&self, now_ms: u64) -> String {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let (ms, seq) = if now_ms > last.0 {
            (now_ms, 0)
        } else if last.1 < SEQUENCE_MAX {
            (last.0, last.1 + 1)
        } else {
            (last.0 + 1, 0)
        };
        *last = (ms, seq);
        drop(last);
        let value = (ms << (WORKER_BITS + SEQUENCE_BITS)) | (self.worker << SEQUENCE_BITS) | seq;
        encode(value)
    }
}

/// `value` as 8 big-endian bytes in unpadded lowercase base32 (13 characters).
fn encode(value: u64) -> String {
    // 64 bits = 12 full 5-bit groups + 4 bits, padded with one zero bit: 65 bits, 13 chars.
    let wide = u128::from(value) << 1;
    (0..13).rev().map(|i| char::from(ALPHABET[((wide >> (i * 5)) & 31) as usize])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_13_lowercase_base32_chars() {
        let id = IdGenerator::default().next_id();
        assert_eq!(id.len(), 13, "{id}");
        assert!(id.bytes().all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b)), "{id}");
    }

    #[test]
    fn encode_matches_rfc4648() {
        // base32("\0\0\0\0\0\0\0\x01") = "AAAAAAAAAAAAC===" → lowercased, unpadded.
        assert_eq!(encode(1), "aaaaaaaaaaaac");
        assert_eq!(encode(u64::MAX), "7777777777776");
    }

    #[test]
    fn ids_are_unique_within_a_millisecond_burst() {
        // 100 IDs in one millisecond: 16 per millisecond, then borrowed milliseconds.
        let ids = IdGenerator::with_worker(7);
        let minted: Vec<String> = (0..100).map(|_| ids.next_at(1_000)).collect();
        let unique: std::collections::HashSet<_> = minted.iter().collect();
        assert_eq!(unique.len(), minted.len());
        // A later millisecond does not reuse a borrowed one.
        assert!(!minted.contains(&ids.next_at(1_001)));
    }
}
