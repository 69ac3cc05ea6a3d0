//! Entry points for the fuzz targets (`fuzz/`), behind the `fuzzing` feature: each runs one
//! of the daemon's parsers on any input and asserts what must hold of its output, panicking
//! otherwise.

use std::fmt::Debug;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;

use crate::connect::{Codec, EnvelopeDecoder, Msg, decode_single};
use crate::proto;

/// The fast path's reading of a request head (`fast::classify`).
pub fn fast_head(buf: &[u8]) {
    crate::fast::fuzz_classify(buf);
}

/// A Connect request body: the first byte picks the codec and the message type, the rest is
/// the body. A message that decodes must come back the same from both codecs; the envelope
/// decoder must find the same envelopes however the body is split.
pub fn connect(data: &[u8]) {
    let Some((&selector, body)) = data.split_first() else { return };
    let codec = if selector & 1 == 0 { Codec::Json } else { Codec::Proto };
    match (selector >> 1) % 8 {
        0 => round_trip::<proto::StartRequest>(codec, body),
        1 => round_trip::<proto::UpdateRequest>(codec, body),
        2 => round_trip::<proto::SendInputRequest>(codec, body),
        3 => round_trip::<proto::StreamInputRequest>(codec, body),
        4 => round_trip::<proto::SendSignalRequest>(codec, body),
        5 => round_trip::<proto::ListDirRequest>(codec, body),
        6 => round_trip::<proto::MoveRequest>(codec, body),
        _ => round_trip::<proto::WatchRequest>(codec, body),
    }
    envelopes(usize::from(selector), body);
}

fn round_trip<T: Msg + PartialEq + Debug>(codec: Codec, body: &[u8]) {
    let Ok(message) = decode_single::<T>(codec, body) else { return };
    for codec in [Codec::Json, Codec::Proto] {
        let encoded = codec.encode(&message);
        match codec.decode::<T>(&encoded) {
            Ok(again) => assert_eq!(again, message, "{codec:?} round trip of {encoded:?}"),
            Err(e) => panic!("{codec:?} does not decode its own {encoded:?}: {e:?}"),
        }
    }
}

fn decode_all(pieces: &[&[u8]]) -> (Vec<(u8, Bytes)>, bool, bool) {
    let mut decoder = EnvelopeDecoder::default();
    let mut found = Vec::new();
    for piece in pieces {
        decoder.push(piece);
        loop {
            match decoder.next_envelope() {
                Ok(Some(envelope)) => found.push(envelope),
                Ok(None) => break,
                Err(_) => return (found, true, decoder.has_partial()),
            }
        }
    }
    (found, false, decoder.has_partial())
}

fn envelopes(split: usize, body: &[u8]) {
    let whole = decode_all(&[body]);
    let at = split.min(body.len());
    let (a, b) = body.split_at(at);
    assert_eq!(decode_all(&[a, b]), whole, "envelopes depend on the split at {at}");
}

/// A multipart upload as `POST /files` reads it: the first line is the `Content-Type`, the
/// rest the body, handed to the parser in two pieces. Every part must be read to its end or
/// to an error, never hang.
pub fn multipart(data: &[u8]) {
    let (content_type, body) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(content_type) = std::str::from_utf8(content_type) else { return };
    let Ok(boundary) = multer::parse_boundary(content_type) else { return };
    let cut = body.len() / 2;
    let pieces = [Bytes::copy_from_slice(&body[..cut]), Bytes::copy_from_slice(&body[cut..])];
    let stream = futures::stream::iter(pieces.map(Ok::<_, std::convert::Infallible>));
    let mut parts = multer::Multipart::new(stream, boundary);
    let read = async move {
        let mut total = 0usize;
        while let Ok(Some(mut field)) = parts.next_field().await {
            let _ = (field.name(), field.file_name(), field.content_type());
            while let Ok(Some(chunk)) = field.chunk().await {
                total += chunk.len();
            }
        }
        total
    };
    let total = ready(read);
    assert!(total <= body.len(), "more bytes read from the parts than the body holds");
}

/// Runs a future over in-memory input to its end: it never waits for anything, so it must
/// finish without ever being pending.
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("pending on an in-memory body"),
    }
}

/// The `POST /files` query string parser: any string, never a panic.
pub fn files_query(query: &str) {
    let _ = crate::http::parse_files_query(Some(query));
}
