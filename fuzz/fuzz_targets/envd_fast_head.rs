//! envd's fast path reading a request head (`/files` uploads and downloads, `/init`), and the
//! `/files` query string.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    oka_envd::fuzzing::fast_head(data);
    if let Ok(text) = std::str::from_utf8(data) {
        oka_envd::fuzzing::files_query(text);
    }
});
