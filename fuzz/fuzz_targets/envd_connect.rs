//! envd's Connect-RPC request bodies: the envelope and the message in either codec. The first
//! byte picks the codec and the message type.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oka_envd::fuzzing::connect(data));
