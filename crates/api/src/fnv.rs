//! FNV-1 hashing, as Go's `hash/fnv`: the reference hashes names and revisions with it, and the
//! runtime ID shortens a long uid with it.

/// FNV-1 (not FNV-1a), 32 bits, as Go's `hash/fnv.New32`.
pub fn fnv1_32(bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .fold(0x811c_9dc5_u32, |hash, byte| hash.wrapping_mul(0x0100_0193) ^ u32::from(*byte))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1_32_matches_the_reference_vectors() {
        // Go: fnv.New32() of "" and "a" (FNV-1, not 1a).
        assert_eq!(fnv1_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1_32(b"a"), 0x050c_5d7e);
        assert_eq!(fnv1_32(b"foobar"), 0x31f0_b262);
    }
}
