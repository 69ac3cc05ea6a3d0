//! Entry points for the fuzz targets (`fuzz/`), behind the `fuzzing` feature: the HTTP/1
//! relay's parsers are private, and each function here runs one on any input and asserts
//! what must hold of its output, panicking otherwise.

use crate::fast;

/// The domain the request-head target routes under.
const DOMAIN: &str = "oka.test";

/// Parses `buf` as a client's request head ([`fast`]'s `parse_request`); a head it relays must
/// come out as one well-formed HTTP/1.1 request head without hop-by-hop headers.
pub fn request_head(buf: &[u8]) {
    fast::fuzz_request_head(buf, DOMAIN);
}

/// Parses `buf` as an upstream response head (`parse_response`) for each kind of request;
/// a head it relays must come out well formed.
pub fn response_head(buf: &[u8]) {
    for is_head in [false, true] {
        for client_closes in [false, true] {
            fast::fuzz_response_head(buf, is_head, client_closes);
        }
    }
}

/// Scans `data` as a chunked body, whole and split at every point given by `cuts`: the end
/// found and the verdict must not depend on how the bytes arrived.
pub fn chunked_body(cuts: &[u8], data: &[u8]) {
    fast::fuzz_chunked(cuts, data);
}
