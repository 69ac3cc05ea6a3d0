//! Entry points for the fuzz targets (`fuzz/`), behind the `fuzzing` feature: the E2B API's
//! parsers of request bodies and query strings are private, and each function here runs one
//! on any input and asserts what must hold of its output, panicking otherwise.

/// A `POST /sandboxes` body: the JSON model and every rule applied to it before a claim
/// (unsupported fields, network entries, lifecycle, timeout, metadata and its extensions).
pub fn create_body(body: &[u8]) {
    crate::api::fuzz_create_body(body);
}

/// A `GET /v2/sandboxes` query string: states, limit, order, `nextToken`, `startedAfter` and
/// the metadata filters (the `metadata=` parameter's nested encoding included).
pub fn list_query(raw: &str) {
    crate::api::fuzz_list_query(raw);
}
