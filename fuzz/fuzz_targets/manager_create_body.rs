//! The E2B API's `POST /sandboxes` body and the rules applied to it before a claim.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oka_manager::fuzzing::create_body(data));
