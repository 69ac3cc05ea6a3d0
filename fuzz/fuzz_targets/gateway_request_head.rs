//! The gateway's HTTP/1 relay reading a client's request head: routing, framing and the
//! upstream head it writes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oka_gateway::fuzzing::request_head(data));
