//! Go duration strings (`time.ParseDuration`).
//!
//! The reference stores durations (`claimTimeout`, `ttlAfterCompleted`, `waitReadyTimeout`, the
//! `cleanup-retain-on-failure` and `reserve-paused-sandbox-duration` annotations) as strings in
//! the format of Go's `time.ParseDuration`. The types keep the string as written, so objects
//! round-trip byte for byte; these functions give it a value.
//!
//! Grammar (as Go): an optional sign, then one or more `<number><unit>` pairs, where a number is
//! decimal with an optional fraction (`1.5h`, `.5s`, `1.s`) and a unit is one of `ns`, `us`, `µs`
//! (U+00B5), `μs` (U+03BC), `ms`, `s`, `m`, `h`. The bare string `"0"` (optionally signed) is
//! zero; any other number needs a unit. Days are not a unit. The magnitude must fit in a signed
//! 64-bit count of nanoseconds.

use std::time::Duration;

use jiff::SignedDuration;

use crate::ApiError;

const NANOS_PER_MICRO: u64 = 1_000;
const NANOS_PER_MILLI: u64 = 1_000_000;
const NANOS_PER_SECOND: u64 = 1_000_000_000;
const NANOS_PER_MINUTE: u64 = 60 * NANOS_PER_SECOND;
const NANOS_PER_HOUR: u64 = 60 * NANOS_PER_MINUTE;

/// The largest magnitude Go accepts: 2^63 nanoseconds (only as a negative value).
const MAX_MAGNITUDE: u64 = 1 << 63;

/// Parses a Go duration string that must not be negative.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(oka_api::parse_go_duration("1m30s"), Ok(Duration::from_secs(90)));
/// assert!(oka_api::parse_go_duration("-1s").is_err());
/// ```
///
/// # Errors
///
/// [`ApiError::InvalidDuration`] when the string is not a Go duration,
/// [`ApiError::NegativeDuration`] when it is negative (zero with a minus sign is zero).
pub fn parse_go_duration(input: &str) -> Result<Duration, ApiError> {
    let (negative, nanos) = parse(input)?;
    if negative && nanos > 0 {
        return Err(ApiError::NegativeDuration { input: input.to_owned() });
    }
    if nanos >= MAX_MAGNITUDE {
        return Err(invalid(input, "out of range"));
    }
    Ok(Duration::from_nanos(nanos))
}

/// Parses a Go duration string that may be negative (`ttlAfterCompleted: -1s` means "never").
///
/// ```
/// use jiff::SignedDuration;
/// assert_eq!(oka_api::parse_go_duration_signed("-1.5s"), Ok(SignedDuration::from_millis(-1500)));
/// ```
///
/// # Errors
///
/// [`ApiError::InvalidDuration`] when the string is not a Go duration.
pub fn parse_go_duration_signed(input: &str) -> Result<SignedDuration, ApiError> {
    let (negative, nanos) = parse(input)?;
    let signed = if negative {
        // -2^63 is representable; `nanos <= 2^63` was checked by `parse`.
        0i64.checked_sub_unsigned(nanos).ok_or_else(|| invalid(input, "out of range"))?
    } else {
        i64::try_from(nanos).map_err(|_| invalid(input, "out of range"))?
    };
    Ok(SignedDuration::from_nanos(signed))
}

fn invalid(input: &str, reason: &'static str) -> ApiError {
    ApiError::InvalidDuration { input: input.to_owned(), reason }
}

/// Returns (negative, magnitude in nanoseconds), magnitude ≤ 2^63.
fn parse(input: &str) -> Result<(bool, u64), ApiError> {
    let mut s = input;
    let mut negative = false;
    if let Some(rest) = s.strip_prefix('-') {
        negative = true;
        s = rest;
    } else if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    if s == "0" {
        return Ok((negative, 0));
    }
    if s.is_empty() {
        return Err(invalid(input, "empty"));
    }
    let mut total: u64 = 0;
    while !s.is_empty() {
        let first = s.as_bytes()[0];
        if !(first == b'.' || first.is_ascii_digit()) {
            return Err(invalid(input, "expected a number"));
        }
        // Integer part.
        let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
        let mut value: u64 = 0;
        for digit in s[..int_len].bytes() {
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(digit - b'0')))
                .filter(|v| *v <= MAX_MAGNITUDE)
                .ok_or_else(|| invalid(input, "out of range"))?;
        }
        s = &s[int_len..];
        // Fraction part: Go keeps as many digits as fit and ignores the rest.
        let mut fraction: u64 = 0;
        let mut scale: f64 = 1.0;
        let mut has_fraction_digits = false;
        if let Some(rest) = s.strip_prefix('.') {
            s = rest;
            let frac_len = s.bytes().take_while(u8::is_ascii_digit).count();
            has_fraction_digits = frac_len > 0;
            let mut overflow = false;
            for digit in s[..frac_len].bytes() {
                if overflow {
                    continue;
                }
                match fraction.checked_mul(10).and_then(|v| v.checked_add(u64::from(digit - b'0')))
                {
                    Some(v) if v <= MAX_MAGNITUDE => {
                        fraction = v;
                        scale *= 10.0;
                    }
                    _ => overflow = true,
                }
            }
            s = &s[frac_len..];
        }
        if int_len == 0 && !has_fraction_digits {
            return Err(invalid(input, "expected a number"));
        }
        // Unit.
        let unit_len = s.find(|c: char| c == '.' || c.is_ascii_digit()).unwrap_or(s.len());
        if unit_len == 0 {
            return Err(invalid(input, "missing unit"));
        }
        let unit = match &s[..unit_len] {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => NANOS_PER_MICRO,
            "ms" => NANOS_PER_MILLI,
            "s" => NANOS_PER_SECOND,
            "m" => NANOS_PER_MINUTE,
            "h" => NANOS_PER_HOUR,
            _ => return Err(invalid(input, "unknown unit")),
        };
        s = &s[unit_len..];
        let mut nanos = value
            .checked_mul(unit)
            .filter(|v| *v <= MAX_MAGNITUDE)
            .ok_or_else(|| invalid(input, "out of range"))?;
        if fraction > 0 {
            // Same float arithmetic as Go, so rounding matches.
            let extra = (fraction as f64 * (unit as f64 / scale)) as u64;
            nanos = nanos
                .checked_add(extra)
                .filter(|v| *v <= MAX_MAGNITUDE)
                .ok_or_else(|| invalid(input, "out of range"))?;
        }
        total = total
            .checked_add(nanos)
            .filter(|v| *v <= MAX_MAGNITUDE)
            .ok_or_else(|| invalid(input, "out of range"))?;
    }
    if !negative && total > MAX_MAGNITUDE - 1 {
        return Err(invalid(input, "out of range"));
    }
    Ok((negative, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn ok(input: &str, nanos: i64) {
        assert_eq!(
            parse_go_duration_signed(input),
            Ok(SignedDuration::from_nanos(nanos)),
            "{input}"
        );
    }

    #[track_caller]
    fn err(input: &str) {
        assert!(parse_go_duration_signed(input).is_err(), "{input} should not parse");
    }

    #[test]
    fn parses_what_go_parses() {
        ok("0", 0);
        ok("-0", 0);
        ok("+0", 0);
        ok("0s", 0);
        ok("5s", 5_000_000_000);
        ok("30s", 30_000_000_000);
        ok("1m", 60_000_000_000);
        ok("60m", 3_600_000_000_000);
        ok("1h", 3_600_000_000_000);
        ok("1h30m", 5_400_000_000_000);
        ok("1h0m0s", 3_600_000_000_000);
        ok("-5s", -5_000_000_000);
        ok("+5s", 5_000_000_000);
        ok("1.5h", 5_400_000_000_000);
        ok(".5s", 500_000_000);
        ok("1.s", 1_000_000_000);
        ok("1.0s", 1_000_000_000);
        ok("100ms", 100_000_000);
        ok("10us", 10_000);
        ok("10\u{b5}s", 10_000);
        ok("10\u{3bc}s", 10_000);
        ok("7ns", 7);
        ok("1h1m1s1ms1us1ns", 3_661_001_001_001);
        ok("2562047h47m16.854775807s", i64::MAX);
        ok("-2562047h47m16.854775808s", i64::MIN);
        // Go keeps only the fraction digits that fit and ignores the rest.
        ok("0.100000000000000000000h", 360_000_000_000);
    }

    #[test]
    fn rejects_what_go_rejects() {
        err("");
        err("-");
        err("3");
        err("s");
        err(".s");
        err("1d");
        err("1 s");
        err("1s ");
        err("--1s");
        err("1.5.s");
        err("2562047h47m16.854775808s");
        err("9223372036854775808ns");
        err("3000000h");
    }

    #[test]
    fn unsigned_rejects_negative_but_accepts_minus_zero() {
        assert_eq!(parse_go_duration("-0"), Ok(Duration::ZERO));
        assert_eq!(
            parse_go_duration("-1s"),
            Err(ApiError::NegativeDuration { input: "-1s".to_owned() })
        );
        assert_eq!(parse_go_duration("60m"), Ok(Duration::from_secs(3600)));
    }
}
