//! The gateway's HTTP/1 relay reading a sandbox's response head, for each kind of request.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oka_gateway::fuzzing::response_head(data));
