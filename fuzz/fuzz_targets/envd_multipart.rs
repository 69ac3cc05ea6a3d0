//! envd's multipart `POST /files` body: the first line is the `Content-Type`, the rest the body.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oka_envd::fuzzing::multipart(data));
