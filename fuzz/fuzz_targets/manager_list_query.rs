//! The E2B API's `GET /v2/sandboxes` query string: filters, paging and the metadata query.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        oka_manager::fuzzing::list_query(text);
    }
});
