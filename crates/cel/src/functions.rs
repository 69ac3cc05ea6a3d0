//! CEL's standard functions and arithmetic, and the Kubernetes CEL library's string and list
//! functions.

use std::sync::Arc;

use crate::ast::BinaryOp;
use crate::error::EvalError;
use crate::quantity;
use crate::regexes::Regexes;
use crate::time;
use crate::value::Value;

/// The namespaces of global functions called as `namespace.function(args)`.
pub(crate) const NAMESPACES: [&str; 3] = ["lists", "optional", "sets"];

/// The longest list `lists.range` makes: one call allocates it all, outside the step budget.
const MAX_RANGE: i64 = 1_000_000;

/// The names that denote types (`type(x) == string`).
const TYPE_NAMES: [&str; 10] =
    ["bool", "bytes", "double", "int", "list", "map", "null_type", "string", "type", "uint"];

/// The type a name denotes, when it is one.
pub(crate) fn type_named(name: &str) -> Option<Value> {
    TYPE_NAMES.iter().find(|t| **t == name).map(|t| Value::Type(t))
}

fn overload(function: &str, target: Option<&Value>, args: &[Value]) -> EvalError {
    let types: Vec<&str> = target.into_iter().chain(args).map(Value::type_name).collect();
    EvalError::overload(function, &types)
}

fn invalid(message: impl Into<String>) -> EvalError {
    EvalError::InvalidArgument(message.into())
}

/// Calls `function` (a method of `target`, or global when `target` is `None`) on `args`.
pub(crate) fn call(
    function: &str,
    target: Option<&Value>,
    args: &[Value],
    regexes: &Regexes,
) -> Result<Value, EvalError> {
    use Value as V;
    let fail = || overload(function, target, args);
    // Functions CEL declares both ways: `size(x)` and `x.size()`, `matches(s, re)` and
    // `s.matches(re)`.
    let (target, args) = match (target, args) {
        (None, [first, rest @ ..]) if matches!(function, "size" | "matches") => (Some(first), rest),
        other => other,
    };
    match (function, target, args) {
        ("size", Some(value), []) => size(value).ok_or_else(fail),
        ("int", None, [value]) => to_int(value),
        ("uint", None, [value]) => to_uint(value),
        ("double", None, [value]) => to_double(value),
        ("string", None, [value]) => to_string(value).map(|s| V::string(&s)),
        ("bool", None, [value]) => to_bool(value),
        ("bytes", None, [V::String(s)]) => Ok(V::Bytes(Arc::from(s.as_bytes()))),
        ("bytes", None, [b @ V::Bytes(_)]) => Ok(b.clone()),
        ("dyn", None, [value]) => Ok(value.clone()),
        ("type", None, [value]) => Ok(V::Type(value.type_name())),
        ("optional.of", None, [value]) => Ok(V::Optional(Some(Arc::new(value.clone())))),
        ("optional.none", None, []) => Ok(V::Optional(None)),
        ("optional.ofNonZeroValue", None, [value]) => {
            Ok(V::Optional((!is_zero(value)).then(|| Arc::new(value.clone()))))
        }
        ("quantity", None, [V::String(s)]) => quantity::parse(s).map(V::Quantity),
        ("isQuantity", None, [V::String(s)]) => Ok(V::Bool(quantity::parse(s).is_ok())),
        (_, Some(V::Quantity(q)), _) => {
            quantity::method(function, *q, args).unwrap_or_else(|| Err(fail()))
        }
        ("lists.range", None, [V::Int(n)]) if *n <= MAX_RANGE => {
            Ok(V::List(Arc::new((0..(*n).max(0)).map(V::Int).collect())))
        }
        ("lists.range", None, [V::Int(n)]) => {
            Err(invalid(format!("lists.range({n}) is longer than {MAX_RANGE}")))
        }
        ("sets.contains", None, [V::List(a), V::List(b)]) => {
            Ok(V::Bool(b.iter().all(|x| a.iter().any(|y| x.equals(y)))))
        }
        ("sets.equivalent", None, [V::List(a), V::List(b)]) => Ok(V::Bool(
            b.iter().all(|x| a.iter().any(|y| x.equals(y)))
                && a.iter().all(|x| b.iter().any(|y| x.equals(y))),
        )),
        ("sets.intersects", None, [V::List(a), V::List(b)]) => {
            Ok(V::Bool(a.iter().any(|x| b.iter().any(|y| x.equals(y)))))
        }
        ("hasValue", Some(V::Optional(inner)), []) => Ok(V::Bool(inner.is_some())),
        ("value", Some(V::Optional(inner)), []) => {
            inner.as_deref().cloned().ok_or_else(|| invalid("optional.none() dereference"))
        }
        ("orValue", Some(V::Optional(inner)), [default]) => {
            Ok(inner.as_deref().cloned().unwrap_or_else(|| default.clone()))
        }
        ("or", Some(V::Optional(inner)), [other @ V::Optional(_)]) => {
            Ok(if inner.is_some() { V::Optional(inner.clone()) } else { other.clone() })
        }
        ("duration", None, [V::String(s)]) => time::parse_duration(s).map(V::Duration),
        ("duration", None, [d @ V::Duration(_)]) => Ok(d.clone()),
        ("timestamp", None, [V::String(s)]) => time::parse_timestamp(s).map(V::Timestamp),
        ("timestamp", None, [V::Int(seconds)]) => time::from_unix(*seconds).map(V::Timestamp),
        ("timestamp", None, [t @ V::Timestamp(_)]) => Ok(t.clone()),
        (_, Some(V::String(s)), _) => {
            string_method(function, s, args, regexes).unwrap_or_else(|| Err(fail()))
        }
        (_, Some(V::List(items)), _) => {
            list_method(function, items, args).unwrap_or_else(|| Err(fail()))
        }
        (_, Some(V::Duration(d)), []) => time::duration_part(function, *d).ok_or_else(fail),
        (_, Some(V::Timestamp(t)), []) => time::timestamp_part(function, *t, None),
        (_, Some(V::Timestamp(t)), [V::String(zone)]) => {
            time::timestamp_part(function, *t, Some(zone))
        }
        _ => Err(fail()),
    }
}

/// Whether `value` is its type's zero value (`optional.ofNonZeroValue`).
fn is_zero(value: &Value) -> bool {
    match value {
        Value::Null | Value::Optional(None) => true,
        Value::Bool(b) => !b,
        Value::Int(i) => *i == 0,
        Value::Uint(u) => *u == 0,
        Value::Double(d) => *d == 0.0,
        Value::String(s) => s.is_empty(),
        Value::Bytes(b) => b.is_empty(),
        Value::List(items) => items.is_empty(),
        Value::Map(map) => map.is_empty(),
        Value::Duration(d) => *d == 0,
        Value::Timestamp(t) => *t == jiff::Timestamp::UNIX_EPOCH,
        Value::Quantity(q) => *q == 0,
        Value::Optional(Some(_)) | Value::Type(_) => false,
    }
}

fn size(value: &Value) -> Option<Value> {
    let n = match value {
        Value::String(s) => s.chars().count(),
        Value::Bytes(b) => b.len(),
        Value::List(items) => items.len(),
        Value::Map(map) => map.len(),
        _ => return None,
    };
    Some(Value::Int(i64::try_from(n).unwrap_or(i64::MAX)))
}

fn int_arg(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

/// A string method; `None` when there is none of that name for these arguments.
fn string_method(
    function: &str,
    s: &str,
    args: &[Value],
    regexes: &Regexes,
) -> Option<Result<Value, EvalError>> {
    use Value as V;
    let text = |t: String| Ok(V::String(Arc::from(t)));
    Some(match (function, args) {
        ("contains", [V::String(sub)]) => Ok(V::Bool(s.contains(&**sub))),
        ("startsWith", [V::String(prefix)]) => Ok(V::Bool(s.starts_with(&**prefix))),
        ("endsWith", [V::String(suffix)]) => Ok(V::Bool(s.ends_with(&**suffix))),
        ("matches", [V::String(pattern)]) => regexes.get(pattern).map(|re| V::Bool(re.is_match(s))),
        ("find", [V::String(pattern)]) => {
            regexes.get(pattern).map(|re| V::string(re.find(s).map_or("", |m| m.as_str())))
        }
        ("findAll", [V::String(pattern)]) => regexes
            .get(pattern)
            .map(|re| list(re.find_iter(s).map(|m| V::string(m.as_str())).collect())),
        ("reverse", []) => text(s.chars().rev().collect()),
        ("lowerAscii", []) => text(s.to_ascii_lowercase()),
        ("upperAscii", []) => text(s.to_ascii_uppercase()),
        ("trim", []) => text(s.trim().to_owned()),
        ("split", [V::String(sep)]) => Ok(split(s, sep, -1)),
        ("split", [V::String(sep), n]) => Ok(split(s, sep, int_arg(n)?)),
        ("replace", [V::String(old), V::String(new)]) => text(s.replace(&**old, new)),
        ("replace", [V::String(old), V::String(new), n]) => {
            let n = int_arg(n)?;
            match usize::try_from(n) {
                Ok(n) => text(s.replacen(&**old, new, n)),
                Err(_) => text(s.replace(&**old, new)),
            }
        }
        ("indexOf", [V::String(sub)]) => Ok(index_of(s, sub, 0, false)),
        ("indexOf", [V::String(sub), offset]) => {
            let offset = int_arg(offset)?;
            checked_offset(s, offset).map(|o| index_of(s, sub, o, false))
        }
        ("lastIndexOf", [V::String(sub)]) => Ok(index_of(s, sub, 0, true)),
        ("charAt", [i]) => {
            let i = int_arg(i)?;
            checked_offset(s, i).map(|i| V::string(&s.chars().skip(i).take(1).collect::<String>()))
        }
        ("substring", [start]) => {
            let start = int_arg(start)?;
            checked_offset(s, start)
                .map(|start| V::string(&s.chars().skip(start).collect::<String>()))
        }
        ("substring", [start, end]) => {
            let (start, end) = (int_arg(start)?, int_arg(end)?);
            match (checked_offset(s, start), checked_offset(s, end)) {
                (Ok(start), Ok(end)) if start <= end => {
                    Ok(V::string(&s.chars().skip(start).take(end - start).collect::<String>()))
                }
                (Err(e), _) | (_, Err(e)) => Err(e),
                _ => Err(invalid(format!("invalid substring range. start: {start}, end: {end}"))),
            }
        }
        _ => return None,
    })
}

/// A character offset into `s`, which may be its length but not beyond.
fn checked_offset(s: &str, offset: i64) -> Result<usize, EvalError> {
    usize::try_from(offset)
        .ok()
        .filter(|o| *o <= s.chars().count())
        .ok_or_else(|| invalid(format!("index out of range: {offset}")))
}

/// Go's `strings.SplitN`: `n < 0` splits everywhere, `n == 0` gives no strings.
fn split(s: &str, sep: &str, n: i64) -> Value {
    let parts: Vec<Value> = match usize::try_from(n) {
        Ok(0) => Vec::new(),
        Ok(n) if sep.is_empty() => {
            let chars: Vec<char> = s.chars().collect();
            let mut parts: Vec<Value> =
                chars.iter().take(n - 1).map(|c| Value::string(&c.to_string())).collect();
            if chars.len() >= n {
                parts.push(Value::string(&chars[n - 1..].iter().collect::<String>()));
            }
            parts
        }
        Ok(n) => s.splitn(n, sep).map(Value::string).collect(),
        Err(_) if sep.is_empty() => s.chars().map(|c| Value::string(&c.to_string())).collect(),
        Err(_) => s.split(sep).map(Value::string).collect(),
    };
    Value::List(Arc::new(parts))
}

/// The character index of `sub` in `s` from character `from` (the last one when `last`), or
/// -1.
fn index_of(s: &str, sub: &str, from: usize, last: bool) -> Value {
    let start = s.char_indices().nth(from).map_or(s.len(), |(b, _)| b);
    let found = if last { s.rfind(sub) } else { s[start..].find(sub).map(|b| b + start) };
    Value::Int(found.map_or(-1, |b| i64::try_from(s[..b].chars().count()).unwrap_or(-1)))
}

/// A list method; `None` when there is none of that name for these arguments.
fn list_method(
    function: &str,
    items: &[Value],
    args: &[Value],
) -> Option<Result<Value, EvalError>> {
    Some(match (function, args) {
        ("join", []) => join(items, ""),
        ("join", [Value::String(sep)]) => join(items, sep),
        ("isSorted", []) => is_sorted(items),
        ("sum", []) => sum(items),
        ("min", []) => extreme(items, "min", std::cmp::Ordering::Less),
        ("max", []) => extreme(items, "max", std::cmp::Ordering::Greater),
        ("indexOf", [wanted]) => Ok(position(items.iter().position(|i| i.equals(wanted)))),
        ("reverse", []) => Ok(list(items.iter().rev().cloned().collect())),
        ("distinct", []) => {
            let mut seen: Vec<Value> = Vec::new();
            for item in items {
                if !seen.iter().any(|s| s.equals(item)) {
                    seen.push(item.clone());
                }
            }
            Ok(list(seen))
        }
        ("flatten", []) => Ok(list(flatten(items, 1))),
        ("flatten", [Value::Int(depth)]) if *depth >= 0 => Ok(list(flatten(items, *depth))),
        ("slice", [Value::Int(start), Value::Int(end)]) => {
            let range = usize::try_from(*start).ok().zip(usize::try_from(*end).ok());
            match range {
                Some((s, e)) if s <= e && e <= items.len() => Ok(list(items[s..e].to_vec())),
                _ => Err(invalid(format!(
                    "cannot slice({start}, {end}), list is length {}",
                    items.len()
                ))),
            }
        }
        ("sort", []) => sort(items),
        ("first", []) => Ok(Value::Optional(items.first().cloned().map(Arc::new))),
        ("last", []) => Ok(Value::Optional(items.last().cloned().map(Arc::new))),
        ("lastIndexOf", [wanted]) => Ok(position(items.iter().rposition(|i| i.equals(wanted)))),
        _ => return None,
    })
}

/// The list in ascending order; its elements must all compare with each other.
fn sort(items: &[Value]) -> Result<Value, EvalError> {
    if let Some(first) = items.first()
        && let Some(odd) = items.iter().find(|i| i.compare(first).is_none())
    {
        return Err(EvalError::overload("sort", &[first.type_name(), odd.type_name()]));
    }
    let mut sorted = items.to_vec();
    sorted.sort_by(|a, b| a.compare(b).unwrap_or(std::cmp::Ordering::Equal));
    Ok(list(sorted))
}

fn list(items: Vec<Value>) -> Value {
    Value::List(Arc::new(items))
}

/// The items of nested lists, `depth` levels down.
fn flatten(items: &[Value], depth: i64) -> Vec<Value> {
    let mut out = Vec::new();
    for item in items {
        match item {
            Value::List(inner) if depth > 0 => out.extend(flatten(inner, depth - 1)),
            other => out.push(other.clone()),
        }
    }
    out
}

fn position(found: Option<usize>) -> Value {
    Value::Int(found.and_then(|i| i64::try_from(i).ok()).unwrap_or(-1))
}

fn join(items: &[Value], sep: &str) -> Result<Value, EvalError> {
    let mut parts = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Value::String(s) => parts.push(&**s),
            other => return Err(EvalError::overload("join", &["list", other.type_name()])),
        }
    }
    Ok(Value::string(&parts.join(sep)))
}

fn is_sorted(items: &[Value]) -> Result<Value, EvalError> {
    for pair in items.windows(2) {
        let ordering = pair[0].compare(&pair[1]).ok_or_else(|| {
            EvalError::overload("isSorted", &[pair[0].type_name(), pair[1].type_name()])
        })?;
        if ordering.is_gt() {
            return Ok(Value::Bool(false));
        }
    }
    Ok(Value::Bool(true))
}

fn sum(items: &[Value]) -> Result<Value, EvalError> {
    let mut total = match items.first() {
        None => return Ok(Value::Int(0)),
        Some(first)
            if matches!(
                first,
                Value::Int(_) | Value::Uint(_) | Value::Double(_) | Value::Duration(_)
            ) =>
        {
            first.clone()
        }
        Some(other) => return Err(EvalError::overload("sum", &[other.type_name()])),
    };
    for item in &items[1..] {
        total = arithmetic(BinaryOp::Add, &total, item)?;
    }
    Ok(total)
}

fn extreme(items: &[Value], name: &str, wanted: std::cmp::Ordering) -> Result<Value, EvalError> {
    let Some(mut best) = items.first() else {
        return Err(invalid(format!("{name} called on empty list")));
    };
    for item in &items[1..] {
        let ordering = item
            .compare(best)
            .ok_or_else(|| EvalError::overload(name, &[best.type_name(), item.type_name()]))?;
        if ordering == wanted {
            best = item;
        }
    }
    Ok(best.clone())
}

/// `+ - * / %` on numbers, strings, bytes, lists, durations and timestamps. Integers never
/// wrap: overflow is an error.
pub(crate) fn arithmetic(op: BinaryOp, left: &Value, right: &Value) -> Result<Value, EvalError> {
    use BinaryOp as Op;
    use Value as V;
    let int = |r: Option<i64>| r.map(V::Int).ok_or(EvalError::Overflow("integer"));
    let uint = |r: Option<u64>| r.map(V::Uint).ok_or(EvalError::Overflow("unsigned integer"));
    let duration = |r: Option<i64>| r.map(V::Duration).ok_or(EvalError::Overflow("duration"));
    match (op, left, right) {
        (Op::Add, V::Int(a), V::Int(b)) => int(a.checked_add(*b)),
        (Op::Subtract, V::Int(a), V::Int(b)) => int(a.checked_sub(*b)),
        (Op::Multiply, V::Int(a), V::Int(b)) => int(a.checked_mul(*b)),
        (Op::Divide, V::Int(_), V::Int(0)) => Err(EvalError::DivisionByZero),
        (Op::Divide, V::Int(a), V::Int(b)) => int(a.checked_div(*b)),
        (Op::Remainder, V::Int(_), V::Int(0)) => Err(EvalError::ModulusByZero),
        (Op::Remainder, V::Int(a), V::Int(b)) => int(a.checked_rem(*b)),
        (Op::Add, V::Uint(a), V::Uint(b)) => uint(a.checked_add(*b)),
        (Op::Subtract, V::Uint(a), V::Uint(b)) => uint(a.checked_sub(*b)),
        (Op::Multiply, V::Uint(a), V::Uint(b)) => uint(a.checked_mul(*b)),
        (Op::Divide, V::Uint(_), V::Uint(0)) => Err(EvalError::DivisionByZero),
        (Op::Divide, V::Uint(a), V::Uint(b)) => uint(a.checked_div(*b)),
        (Op::Remainder, V::Uint(_), V::Uint(0)) => Err(EvalError::ModulusByZero),
        (Op::Remainder, V::Uint(a), V::Uint(b)) => uint(a.checked_rem(*b)),
        (Op::Add, V::Double(a), V::Double(b)) => Ok(V::Double(a + b)),
        (Op::Subtract, V::Double(a), V::Double(b)) => Ok(V::Double(a - b)),
        (Op::Multiply, V::Double(a), V::Double(b)) => Ok(V::Double(a * b)),
        (Op::Divide, V::Double(a), V::Double(b)) => Ok(V::Double(a / b)),
        (Op::Add, V::String(a), V::String(b)) => Ok(V::string(&format!("{a}{b}"))),
        (Op::Add, V::Bytes(a), V::Bytes(b)) => Ok(V::Bytes(Arc::from([&a[..], &b[..]].concat()))),
        (Op::Add, V::List(a), V::List(b)) => {
            Ok(V::List(Arc::new(a.iter().chain(b.iter()).cloned().collect())))
        }
        (Op::Add, V::Duration(a), V::Duration(b)) => duration(a.checked_add(*b)),
        (Op::Subtract, V::Duration(a), V::Duration(b)) => duration(a.checked_sub(*b)),
        (Op::Add, V::Timestamp(t), V::Duration(d)) | (Op::Add, V::Duration(d), V::Timestamp(t)) => {
            time::shift(*t, i128::from(*d)).map(V::Timestamp)
        }
        (Op::Subtract, V::Timestamp(t), V::Duration(d)) => {
            time::shift(*t, -i128::from(*d)).map(V::Timestamp)
        }
        (Op::Subtract, V::Timestamp(a), V::Timestamp(b)) => {
            let nanos = a.as_nanosecond() - b.as_nanosecond();
            duration(i64::try_from(nanos).ok())
        }
        _ => Err(EvalError::overload(op.symbol(), &[left.type_name(), right.type_name()])),
    }
}

fn range_error(value: &Value, target: &str) -> EvalError {
    invalid(format!("range error converting {} to {target}", to_string(value).unwrap_or_default()))
}

fn to_int(value: &Value) -> Result<Value, EvalError> {
    match value {
        Value::Int(i) => Ok(Value::Int(*i)),
        Value::Uint(u) => i64::try_from(*u).map(Value::Int).map_err(|_| range_error(value, "int")),
        // Strictly inside (-2^63, 2^63), where truncation is exact.
        Value::Double(d) if d.is_finite() && d.abs() < 9_223_372_036_854_775_807.0 => {
            Ok(Value::Int(d.trunc() as i64))
        }
        Value::Double(_) => Err(range_error(value, "int")),
        Value::String(s) => s
            .parse::<i64>()
            .map(Value::Int)
            .map_err(|_| invalid(format!("cannot convert \"{s}\" to int"))),
        Value::Duration(d) => Ok(Value::Int(*d)),
        Value::Timestamp(t) => Ok(Value::Int(t.as_second())),
        other => Err(EvalError::overload("int", &[other.type_name()])),
    }
}

fn to_uint(value: &Value) -> Result<Value, EvalError> {
    match value {
        Value::Uint(u) => Ok(Value::Uint(*u)),
        Value::Int(i) => u64::try_from(*i).map(Value::Uint).map_err(|_| range_error(value, "uint")),
        Value::Double(d) if d.is_finite() && *d > -1.0 && *d < 18_446_744_073_709_551_615.0 => {
            Ok(Value::Uint(d.trunc() as u64))
        }
        Value::Double(_) => Err(range_error(value, "uint")),
        Value::String(s) => s
            .parse::<u64>()
            .map(Value::Uint)
            .map_err(|_| invalid(format!("cannot convert \"{s}\" to uint"))),
        other => Err(EvalError::overload("uint", &[other.type_name()])),
    }
}

fn to_double(value: &Value) -> Result<Value, EvalError> {
    match value {
        Value::Double(d) => Ok(Value::Double(*d)),
        Value::Int(i) => Ok(Value::Double(*i as f64)),
        Value::Uint(u) => Ok(Value::Double(*u as f64)),
        Value::String(s) => s
            .parse::<f64>()
            .map(Value::Double)
            .map_err(|_| invalid(format!("cannot convert \"{s}\" to double"))),
        other => Err(EvalError::overload("double", &[other.type_name()])),
    }
}

fn to_bool(value: &Value) -> Result<Value, EvalError> {
    match value {
        Value::Bool(b) => Ok(Value::Bool(*b)),
        Value::String(s) => match &**s {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(Value::Bool(true)),
            "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(Value::Bool(false)),
            _ => Err(invalid(format!("cannot convert \"{s}\" to bool"))),
        },
        other => Err(EvalError::overload("bool", &[other.type_name()])),
    }
}

/// A double as Go's `%g` writes it, which cel-go's `string()` uses: the shortest digits,
/// with an exponent (`1e+06`, `1.5e-07`) when it is below -4 or at least 6.
fn format_double(d: f64) -> String {
    if d.is_nan() {
        return "NaN".to_owned();
    }
    if d.is_infinite() {
        return if d > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    let scientific = format!("{d:e}");
    let Some((mantissa, exponent)) = scientific.split_once('e') else { return d.to_string() };
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..6).contains(&exponent) {
        return d.to_string();
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
}

/// `string(value)`: durations as seconds (`"5400s"`, `"0.3s"`), timestamps in RFC 3339.
pub(crate) fn to_string(value: &Value) -> Result<String, EvalError> {
    match value {
        Value::String(s) => Ok(s.to_string()),
        Value::Int(i) => Ok(i.to_string()),
        Value::Uint(u) => Ok(u.to_string()),
        Value::Double(d) => Ok(format_double(*d)),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Bytes(b) => String::from_utf8(b.to_vec())
            .map_err(|_| invalid("invalid UTF-8 in bytes, cannot convert to string")),
        Value::Duration(d) => Ok(time::format_duration(*d)),
        Value::Timestamp(t) => Ok(t.to_string()),
        Value::Type(name) => Ok((*name).to_owned()),
        other => Err(EvalError::overload("string", &[other.type_name()])),
    }
}
