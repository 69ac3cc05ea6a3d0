//! Kubernetes resource quantities (`500m`, `1.5Gi`, `2e3`), as the Kubernetes CEL library's
//! `quantity()` reads them, held exactly in nano-units (a quantity's finest precision; finer
//! digits round away from zero, as Kubernetes rounds them).

use std::cmp::Ordering;

use crate::error::EvalError;
use crate::value::Value;

const NANOS_PER_UNIT: i128 = 1_000_000_000;

fn invalid(message: impl Into<String>) -> EvalError {
    EvalError::InvalidArgument(message.into())
}

/// `text` as nano-units.
pub(crate) fn parse(text: &str) -> Result<i128, EvalError> {
    let bad = || {
        invalid(format!(
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text}"
        ))
    };
    let (negative, body) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let number_len = body.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(body.len());
    let (number, suffix) = body.split_at(number_len);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(bad());
    }
    let digits = format!("{whole}{fraction}");
    // More digits than an i128 holds cannot be a quantity Kubernetes accepts either.
    if digits.trim_start_matches('0').len() > 36 {
        return Err(bad());
    }
    let mantissa: i128 = digits.parse().map_err(|_| bad())?;
    let (binary_power, decimal_power) = suffix_powers(suffix).ok_or_else(bad)?;
    let too_large = || invalid(format!("quantity too large: {text}"));
    let mut value = mantissa
        .checked_mul(2i128.checked_pow(binary_power).ok_or_else(too_large)?)
        .ok_or_else(too_large)?;
    let exponent = decimal_power + 9 - i32::try_from(fraction.len()).map_err(|_| bad())?;
    if exponent >= 0 {
        let scale = 10i128.checked_pow(exponent.unsigned_abs()).ok_or_else(too_large)?;
        value = value.checked_mul(scale).ok_or_else(too_large)?;
    } else {
        // Below a nano-unit: round away from zero.
        let scale = 10i128.checked_pow(exponent.unsigned_abs());
        value = match scale {
            Some(scale) => value / scale + i128::from(value % scale != 0),
            None => i128::from(value != 0),
        };
    }
    Ok(if negative { -value } else { value })
}

/// The powers of 2 and of 10 a suffix multiplies by.
fn suffix_powers(suffix: &str) -> Option<(u32, i32)> {
    let binary = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if let Some(i) = binary.iter().position(|s| *s == suffix) {
        return Some((10 * (u32::try_from(i).ok()? + 1), 0));
    }
    let decimal = match suffix {
        "n" => -9,
        "u" => -6,
        "m" => -3,
        "" => 0,
        "k" => 3,
        "M" => 6,
        "G" => 9,
        "T" => 12,
        "P" => 15,
        "E" => 18,
        exponent => {
            let digits = exponent.strip_prefix(['e', 'E'])?;
            if digits.is_empty() || digits.len() > 4 {
                return None;
            }
            return digits.parse::<i32>().ok().map(|e| (0, e));
        }
    };
    Some((0, decimal))
}

/// A quantity as a plain decimal number of units (`1.5`, `0.001`).
pub(crate) fn format(nanos: i128) -> String {
    let sign = if nanos < 0 { "-" } else { "" };
    let magnitude = nanos.unsigned_abs();
    let whole = magnitude / NANOS_PER_UNIT.unsigned_abs();
    let fraction = magnitude % NANOS_PER_UNIT.unsigned_abs();
    if fraction == 0 {
        return format!("{sign}{whole}");
    }
    let digits = format!("{fraction:09}");
    format!("{sign}{whole}.{}", digits.trim_end_matches('0'))
}

/// A method of a quantity; `None` when there is none of that name for these arguments.
pub(crate) fn method(function: &str, q: i128, args: &[Value]) -> Option<Result<Value, EvalError>> {
    let other = |v: &Value| match v {
        Value::Quantity(o) => Some(*o),
        Value::Int(i) => i128::from(*i).checked_mul(NANOS_PER_UNIT),
        _ => None,
    };
    let overflow = || EvalError::Overflow("quantity");
    Some(match (function, args) {
        ("sign", []) => Ok(Value::Int(match q.cmp(&0) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        })),
        ("isInteger", []) => Ok(Value::Bool(as_integer(q).is_some())),
        ("asInteger", []) => {
            as_integer(q).map(Value::Int).ok_or_else(|| invalid("cannot convert value to integer"))
        }
        ("asApproximateFloat", []) => Ok(Value::Double(q as f64 / NANOS_PER_UNIT as f64)),
        ("add", [v]) => q.checked_add(other(v)?).map(Value::Quantity).ok_or_else(overflow),
        ("sub", [v]) => q.checked_sub(other(v)?).map(Value::Quantity).ok_or_else(overflow),
        ("isLessThan", [Value::Quantity(o)]) => Ok(Value::Bool(q < *o)),
        ("isGreaterThan", [Value::Quantity(o)]) => Ok(Value::Bool(q > *o)),
        ("compareTo", [Value::Quantity(o)]) => Ok(Value::Int(match q.cmp(o) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        })),
        _ => return None,
    })
}

/// The quantity as an `int`, when it is a whole number that fits.
fn as_integer(q: i128) -> Option<i64> {
    if q % NANOS_PER_UNIT != 0 {
        return None;
    }
    i64::try_from(q / NANOS_PER_UNIT).ok()
}
