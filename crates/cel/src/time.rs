//! Durations (Go's syntax, as Kubernetes writes them: `1h30m`, `300ms`) and timestamps
//! (RFC 3339).

use crate::error::EvalError;
use crate::value::Value;

fn invalid(message: impl Into<String>) -> EvalError {
    EvalError::InvalidArgument(message.into())
}

/// Nanoseconds per unit, longest unit names first where one is a prefix of another.
const UNITS: [(&str, i128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Go's `time.ParseDuration`: a signed sequence of decimal numbers with units, in
/// nanoseconds.
pub(crate) fn parse_duration(text: &str) -> Result<i64, EvalError> {
    let bad = || invalid(format!("time: invalid duration \"{text}\""));
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if body == "0" {
        return Ok(0);
    }
    if body.is_empty() {
        return Err(bad());
    }
    let mut total: i128 = 0;
    let mut rest = body;
    while !rest.is_empty() {
        let whole_len = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let whole = &rest[..whole_len];
        rest = &rest[whole_len..];
        let mut fraction = "";
        if let Some(after) = rest.strip_prefix('.') {
            let len = after.find(|c: char| !c.is_ascii_digit()).unwrap_or(after.len());
            fraction = &after[..len];
            rest = &after[len..];
        }
        if whole.is_empty() && fraction.is_empty() {
            return Err(bad());
        }
        let unit = UNITS
            .iter()
            .filter(|(name, _)| rest.starts_with(name))
            .max_by_key(|(name, _)| name.len());
        let Some((name, scale)) = unit else {
            return Err(invalid(format!("time: missing unit in duration \"{text}\"")));
        };
        rest = &rest[name.len()..];
        let whole: i128 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| bad())? };
        let mut part = whole.checked_mul(*scale).ok_or_else(bad)?;
        // Digits beyond nanosecond precision cannot change the result.
        let fraction = &fraction[..fraction.len().min(18)];
        if !fraction.is_empty() {
            let digits: i128 = fraction.parse().map_err(|_| bad())?;
            let divisor = 10i128.pow(u32::try_from(fraction.len()).map_err(|_| bad())?);
            part += digits * scale / divisor;
        }
        total = total.checked_add(part).ok_or_else(bad)?;
        if total > i128::from(i64::MAX) + 1 {
            return Err(bad());
        }
    }
    let signed = if negative { -total } else { total };
    i64::try_from(signed).map_err(|_| bad())
}

/// A duration as cel-go's `string()` writes it: seconds, with as many decimals as needed.
pub(crate) fn format_duration(nanos: i64) -> String {
    let seconds = nanos / 1_000_000_000;
    let fraction = (nanos % 1_000_000_000).unsigned_abs();
    let sign = if nanos < 0 && seconds == 0 { "-" } else { "" };
    if fraction == 0 {
        return format!("{sign}{seconds}s");
    }
    let digits = format!("{fraction:09}");
    format!("{sign}{seconds}.{}s", digits.trim_end_matches('0'))
}

/// An RFC 3339 timestamp.
pub(crate) fn parse_timestamp(text: &str) -> Result<jiff::Timestamp, EvalError> {
    text.parse::<jiff::Timestamp>()
        .map_err(|e| invalid(format!("cannot parse \"{text}\" as a timestamp: {e}")))
}

/// The timestamp `seconds` after the Unix epoch.
pub(crate) fn from_unix(seconds: i64) -> Result<jiff::Timestamp, EvalError> {
    jiff::Timestamp::from_second(seconds).map_err(|_| EvalError::Overflow("timestamp"))
}

/// `t` moved by `nanos`.
pub(crate) fn shift(t: jiff::Timestamp, nanos: i128) -> Result<jiff::Timestamp, EvalError> {
    t.as_nanosecond()
        .checked_add(nanos)
        .and_then(|n| jiff::Timestamp::from_nanosecond(n).ok())
        .ok_or(EvalError::Overflow("timestamp"))
}

/// A duration's `getHours()`, `getMinutes()`, `getSeconds()`, `getMilliseconds()`: the whole
/// duration in that unit, truncated.
pub(crate) fn duration_part(function: &str, nanos: i64) -> Option<Value> {
    let per_unit = match function {
        "getHours" => 3_600_000_000_000,
        "getMinutes" => 60_000_000_000,
        "getSeconds" => 1_000_000_000,
        "getMilliseconds" => 1_000_000,
        _ => return None,
    };
    Some(Value::Int(nanos / per_unit))
}

/// A timestamp's calendar fields in UTC, or in `zone` (`UTC` or a fixed offset such as
/// `+05:30`; named zones would need a time zone database, which this pure crate does not
/// read). Months, days of the year and `getDayOfMonth` count from 0, as in CEL.
pub(crate) fn timestamp_part(
    function: &str,
    t: jiff::Timestamp,
    zone: Option<&str>,
) -> Result<Value, EvalError> {
    let tz = match zone {
        None | Some("UTC" | "Z") => jiff::tz::TimeZone::UTC,
        Some(offset) => jiff::tz::TimeZone::fixed(parse_offset(offset)?),
    };
    let z = t.to_zoned(tz);
    let value = match function {
        "getFullYear" => i64::from(z.year()),
        "getMonth" => i64::from(z.month()) - 1,
        "getDate" => i64::from(z.day()),
        "getDayOfMonth" => i64::from(z.day()) - 1,
        "getDayOfWeek" => i64::from(z.weekday().to_sunday_zero_offset()),
        "getDayOfYear" => i64::from(z.day_of_year()) - 1,
        "getHours" => i64::from(z.hour()),
        "getMinutes" => i64::from(z.minute()),
        "getSeconds" => i64::from(z.second()),
        "getMilliseconds" => i64::from(z.millisecond()),
        _ => {
            return Err(EvalError::overload(function, &["google.protobuf.Timestamp"]));
        }
    };
    Ok(Value::Int(value))
}

/// `+05:30`, `-08:00`.
fn parse_offset(text: &str) -> Result<jiff::tz::Offset, EvalError> {
    let bad = || invalid(format!("unsupported time zone \"{text}\""));
    let (sign, rest) = match text.as_bytes().first() {
        Some(b'+') => (1, &text[1..]),
        Some(b'-') => (-1, &text[1..]),
        _ => return Err(bad()),
    };
    let (hours, minutes) = rest.split_once(':').ok_or_else(bad)?;
    let hours: i32 = hours.parse().map_err(|_| bad())?;
    let minutes: i32 = minutes.parse().map_err(|_| bad())?;
    if !(0..24).contains(&hours) || !(0..60).contains(&minutes) {
        return Err(bad());
    }
    jiff::tz::Offset::from_seconds(sign * (hours * 3600 + minutes * 60)).map_err(|_| bad())
}
