//! The gateway's HTTP/1 relay finding the end of a chunked body as it passes, however it is
//! split into reads. The first byte is how many of the next bytes are the split's steps; the
//! rest is the body.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&count, rest)) = data.split_first() else { return };
    let (cuts, body) = rest.split_at(usize::from(count).min(rest.len()));
    oka_gateway::fuzzing::chunked_body(cuts, body);
});
