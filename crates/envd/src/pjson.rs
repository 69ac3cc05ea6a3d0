//! ProtoJSON helpers for the hand-written messages in [`crate::proto`].
//!
//! Rules (e2b-protocol.md §3.1): `bytes` are standard base64 with padding (any base64 accepted),
//! 64-bit integers are JSON strings (numbers accepted), enums are names (numbers accepted),
//! `google.protobuf.Timestamp` is an RFC 3339 UTC string, default values are omitted.

use base64::Engine as _;
use serde::de::{self, Deserializer, Visitor};
use serde::ser::Serializer;
use std::fmt;

/// Skip predicate for numeric defaults.
pub fn is_zero<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Skip predicate for `false`.
pub fn is_false(v: &bool) -> bool {
    !*v
}

fn decode_b64(s: &str) -> Result<Vec<u8>, String> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let t = s.trim_end_matches('=');
    STANDARD_NO_PAD
        .decode(t)
        .or_else(|_| URL_SAFE_NO_PAD.decode(t))
        .or_else(|_| STANDARD.decode(s))
        .or_else(|_| URL_SAFE.decode(s))
        .map_err(|e| format!("invalid base64: {e}"))
}

/// `bytes` fields: base64.
pub mod b64 {
    use super::*;

    /// Serialize as standard padded base64.
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    /// Deserialize from any base64 alphabet, padded or not (`null` → empty).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s: Option<String> = serde::Deserialize::deserialize(d)?;
        match s {
            None => Ok(Vec::new()),
            Some(s) => decode_b64(&s).map_err(de::Error::custom),
        }
    }
}

/// `int64` fields: a JSON string, numbers accepted.
pub mod i64_str {
    use super::*;

    /// Serialize as a decimal string.
    pub fn serialize<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    struct V;
    impl Visitor<'_> for V {
        type Value = i64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an int64 as a number or string")
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<i64, E> {
            Ok(v)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<i64, E> {
            i64::try_from(v).map_err(E::custom)
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<i64, E> {
            if v.fract() == 0.0 && v.abs() < 9.0e18 {
                #[allow(clippy::cast_possible_truncation)]
                Ok(v as i64)
            } else {
                Err(E::custom("not an integer"))
            }
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<i64, E> {
            v.trim().parse().map_err(E::custom)
        }
        fn visit_unit<E: de::Error>(self) -> Result<i64, E> {
            Ok(0)
        }
    }

    /// Deserialize from a number or a string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        d.deserialize_any(V)
    }
}

/// Enum fields stored as `i32` (prost style): names out, names or numbers in.
pub trait ProtoEnum: Sized {
    /// The ProtoJSON name of a value, `None` for unknown numbers.
    fn name_of(v: i32) -> Option<&'static str>;
    /// The number of a ProtoJSON name.
    fn number_of(name: &str) -> Option<i32>;
}

/// Serde adapter for an enum field of type `E` stored as `i32`.
pub mod enum_i32 {
    use super::*;
    use std::marker::PhantomData;

    /// Serialize the name (or the number when unknown).
    pub fn serialize<E: ProtoEnum, S: Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
        match E::name_of(*v) {
            Some(n) => s.serialize_str(n),
            None => s.serialize_i32(*v),
        }
    }

    struct V<E>(PhantomData<E>);
    impl<E: ProtoEnum> Visitor<'_> for V<E> {
        type Value = i32;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an enum name or number")
        }
        fn visit_i64<Er: de::Error>(self, v: i64) -> Result<i32, Er> {
            i32::try_from(v).map_err(Er::custom)
        }
        fn visit_u64<Er: de::Error>(self, v: u64) -> Result<i32, Er> {
            i32::try_from(v).map_err(Er::custom)
        }
        fn visit_str<Er: de::Error>(self, v: &str) -> Result<i32, Er> {
            E::number_of(v).ok_or_else(|| Er::custom(format!("unknown enum value {v:?}")))
        }
        fn visit_unit<Er: de::Error>(self) -> Result<i32, Er> {
            Ok(0)
        }
    }

    /// Deserialize a name or a number.
    pub fn deserialize<'de, E: ProtoEnum, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
        d.deserialize_any(V::<E>(PhantomData))
    }
}

/// Formats seconds + nanos since the Unix epoch as RFC 3339 UTC (`2024-01-02T03:04:05.123456789Z`).
pub fn rfc3339(seconds: i64, nanos: i32) -> String {
    let days = seconds.div_euclid(86_400);
    let secs = seconds.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let frac = if nanos == 0 {
        String::new()
    } else if nanos % 1_000_000 == 0 {
        format!(".{:03}", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!(".{:06}", nanos / 1_000)
    } else {
        format!(".{nanos:09}")
    };
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}{frac}Z")
}

/// Parses an RFC 3339 timestamp (any offset) into seconds + nanos since the Unix epoch.
pub fn parse_rfc3339(s: &str) -> Option<(i64, i32)> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !(b[10] == b'T' || b[10] == b't') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut i = 19;
    let mut nanos: i64 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = s.get(start..i)?;
        if digits.is_empty() || digits.len() > 9 {
            return None;
        }
        nanos = digits.parse::<i64>().ok()? * 10_i64.pow(9 - u32::try_from(digits.len()).ok()?);
    }
    let offset = match b.get(i)? {
        b'Z' | b'z' => 0,
        c @ (b'+' | b'-') => {
            let oh = num(i + 1..i + 3)?;
            let om = num(i + 4..i + 6)?;
            let o = oh * 3600 + om * 60;
            if *c == b'-' { -o } else { o }
        }
        _ => return None,
    };
    // Days-from-civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset;
    Some((secs, i32::try_from(nanos).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000, 5_000_000), "2023-11-14T22:13:20.005Z");
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20.005Z"), Some((1_700_000_000, 5_000_000)));
        assert_eq!(parse_rfc3339("2023-11-14T23:13:20+01:00"), Some((1_700_000_000, 0)));
        assert_eq!(parse_rfc3339("nope"), None);
        for s in [-86_400 * 400, 0, 951_782_400, 4_102_444_800] {
            assert_eq!(parse_rfc3339(&rfc3339(s, 123)), Some((s, 123)));
        }
    }

    #[test]
    fn base64_accepts_all_alphabets() {
        assert_eq!(decode_b64("aGkK").unwrap(), b"hi\n");
        assert_eq!(decode_b64("aGk").unwrap(), b"hi");
        assert_eq!(decode_b64("-_8=").unwrap(), decode_b64("+/8").unwrap());
    }
}
