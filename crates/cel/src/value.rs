//! CEL values, and their conversion from and to JSON.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A CEL value. Lists, maps, strings and bytes are shared, so copying a value is cheap.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `null`.
    Null,
    /// `bool`.
    Bool(bool),
    /// `int`: 64-bit signed; arithmetic that overflows is an error.
    Int(i64),
    /// `uint`: 64-bit unsigned.
    Uint(u64),
    /// `double`.
    Double(f64),
    /// `string`.
    String(Arc<str>),
    /// `bytes`.
    Bytes(Arc<[u8]>),
    /// `list`.
    List(Arc<Vec<Value>>),
    /// `map`, ordered by key.
    Map(Arc<BTreeMap<Key, Value>>),
    /// `google.protobuf.Duration`, in nanoseconds (as Go's `time.Duration`).
    Duration(i64),
    /// `google.protobuf.Timestamp`.
    Timestamp(jiff::Timestamp),
    /// `optional_type`: a value or none (`self.?field`, `optional.of(x)`).
    Optional(Option<Arc<Value>>),
    /// A Kubernetes resource quantity (`quantity('1.5Gi')`), in nano-units.
    Quantity(i128),
    /// A type, as `type(x)` gives it and type names (`int`, `string`, ...) denote it: its name.
    Type(&'static str),
}

/// A map key: CEL allows `bool`, `int`, `uint` and `string` keys.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    /// A `bool` key.
    Bool(bool),
    /// An `int` key.
    Int(i64),
    /// A `uint` key.
    Uint(u64),
    /// A `string` key (every key of a JSON object).
    String(Arc<str>),
}

impl Key {
    /// The key of `value`, if it can be one.
    pub fn from_value(value: &Value) -> Option<Key> {
        match value {
            Value::Bool(b) => Some(Key::Bool(*b)),
            Value::Int(i) => Some(Key::Int(*i)),
            Value::Uint(u) => Some(Key::Uint(*u)),
            Value::String(s) => Some(Key::String(s.clone())),
            _ => None,
        }
    }

    /// The key as a value (what comprehensions over a map iterate).
    pub fn to_value(&self) -> Value {
        match self {
            Key::Bool(b) => Value::Bool(*b),
            Key::Int(i) => Value::Int(*i),
            Key::Uint(u) => Value::Uint(*u),
            Key::String(s) => Value::String(s.clone()),
        }
    }

    /// The same number as the other integer type, so `{1: x}[1u]` finds `x` as in cel-go.
    pub(crate) fn numeric_twin(&self) -> Option<Key> {
        match self {
            Key::Int(i) => u64::try_from(*i).ok().map(Key::Uint),
            Key::Uint(u) => i64::try_from(*u).ok().map(Key::Int),
            _ => None,
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Bool(b) => write!(f, "{b}"),
            Key::Int(i) => write!(f, "{i}"),
            Key::Uint(u) => write!(f, "{u}"),
            Key::String(s) => write!(f, "{s}"),
        }
    }
}

impl Value {
    /// A string value.
    pub fn string(text: &str) -> Value {
        Value::String(Arc::from(text))
    }

    /// The CEL type name, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null_type",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Uint(_) => "uint",
            Value::Double(_) => "double",
            Value::String(_) => "string",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Map(_) => "map",
            Value::Duration(_) => "google.protobuf.Duration",
            Value::Timestamp(_) => "google.protobuf.Timestamp",
            Value::Optional(_) => "optional_type",
            Value::Quantity(_) => "kubernetes.Quantity",
            Value::Type(_) => "type",
        }
    }

    /// The value of a JSON document: objects are maps with string keys, integers that fit
    /// are `int` (larger ones `uint`), other numbers `double`.
    pub fn from_json(json: &serde_json::Value) -> Value {
        match json {
            serde_json::Value::Null => Value::Null,
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Value::Int(i)
                } else if let Some(u) = n.as_u64() {
                    Value::Uint(u)
                } else {
                    Value::Double(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            serde_json::Value::String(s) => Value::string(s),
            serde_json::Value::Array(items) => {
                Value::List(Arc::new(items.iter().map(Value::from_json).collect()))
            }
            serde_json::Value::Object(map) => Value::Map(Arc::new(
                map.iter()
                    .map(|(k, v)| (Key::String(Arc::from(k.as_str())), Value::from_json(v)))
                    .collect(),
            )),
        }
    }

    /// The value as JSON: durations and timestamps as the strings `string()` gives them,
    /// bytes as a list of numbers, non-finite doubles as `null`.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as Json;
        match self {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Int(i) => Json::from(*i),
            Value::Uint(u) => Json::from(*u),
            Value::Double(d) => serde_json::Number::from_f64(*d).map_or(Json::Null, Json::Number),
            Value::String(s) => Json::String(s.to_string()),
            Value::Bytes(b) => Json::Array(b.iter().map(|x| Json::from(*x)).collect()),
            Value::List(items) => Json::Array(items.iter().map(Value::to_json).collect()),
            Value::Map(map) => {
                Json::Object(map.iter().map(|(k, v)| (k.to_string(), v.to_json())).collect())
            }
            Value::Optional(inner) => inner.as_ref().map_or(Json::Null, |v| v.to_json()),
            Value::Type(name) => Json::String((*name).to_owned()),
            Value::Quantity(q) => Json::String(crate::quantity::format(*q)),
            Value::Duration(_) | Value::Timestamp(_) => {
                Json::String(crate::functions::to_string(self).unwrap_or_default())
            }
        }
    }

    /// CEL equality: numbers compare across `int`, `uint` and `double`; lists and maps
    /// compare element by element; values of different types are unequal.
    pub fn equals(&self, other: &Value) -> bool {
        if let Some(ordering) = numeric_order(self, other) {
            return ordering == Ordering::Equal;
        }
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::String(a), Value::String(b)) => a == b,
            (Value::Bytes(a), Value::Bytes(b)) => a == b,
            (Value::Duration(a), Value::Duration(b)) => a == b,
            (Value::Timestamp(a), Value::Timestamp(b)) => a == b,
            (Value::Type(a), Value::Type(b)) => a == b,
            (Value::Quantity(a), Value::Quantity(b)) => a == b,
            (Value::Optional(a), Value::Optional(b)) => match (a, b) {
                (Some(x), Some(y)) => x.equals(y),
                (None, None) => true,
                _ => false,
            },
            (Value::List(a), Value::List(b)) => {
                a.len() == b.len() && a.iter().zip(b.iter()).all(|(x, y)| x.equals(y))
            }
            (Value::Map(a), Value::Map(b)) => {
                a.len() == b.len()
                    && a.iter().all(|(k, v)| lookup(b, k).is_some_and(|w| v.equals(w)))
            }
            _ => false,
        }
    }

    /// The order of `<`, `<=`, `>`, `>=`; `None` when the types do not compare (or a NaN).
    pub fn compare(&self, other: &Value) -> Option<Ordering> {
        if let Some(ordering) = numeric_order(self, other) {
            return Some(ordering);
        }
        match (self, other) {
            (Value::Bool(a), Value::Bool(b)) => Some(a.cmp(b)),
            (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
            (Value::Bytes(a), Value::Bytes(b)) => Some(a.cmp(b)),
            (Value::Duration(a), Value::Duration(b)) => Some(a.cmp(b)),
            (Value::Timestamp(a), Value::Timestamp(b)) => Some(a.cmp(b)),
            _ => None,
        }
    }
}

/// `key` in `map`, also under the other integer type.
pub(crate) fn lookup<'m>(map: &'m BTreeMap<Key, Value>, key: &Key) -> Option<&'m Value> {
    map.get(key).or_else(|| key.numeric_twin().and_then(|twin| map.get(&twin)))
}

/// The order of two numbers of any numeric types, exactly (no rounding of large integers).
fn numeric_order(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Some(x.cmp(y)),
        (Value::Uint(x), Value::Uint(y)) => Some(x.cmp(y)),
        (Value::Int(x), Value::Uint(y)) => Some(i128::from(*x).cmp(&i128::from(*y))),
        (Value::Uint(x), Value::Int(y)) => Some(i128::from(*x).cmp(&i128::from(*y))),
        (Value::Double(x), Value::Double(y)) => x.partial_cmp(y),
        (Value::Double(x), Value::Int(y)) => double_vs_integer(*x, i128::from(*y)),
        (Value::Double(x), Value::Uint(y)) => double_vs_integer(*x, i128::from(*y)),
        (Value::Int(x), Value::Double(y)) => {
            double_vs_integer(*y, i128::from(*x)).map(Ordering::reverse)
        }
        (Value::Uint(x), Value::Double(y)) => {
            double_vs_integer(*y, i128::from(*x)).map(Ordering::reverse)
        }
        _ => None,
    }
}

fn double_vs_integer(d: f64, i: i128) -> Option<Ordering> {
    if d.is_nan() {
        return None;
    }
    // Every i64 and u64 lies strictly inside ±2^65, where f64 -> i128 is exact after floor.
    const LIMIT: f64 = 36_893_488_147_419_103_232.0;
    if d >= LIMIT {
        return Some(Ordering::Greater);
    }
    if d <= -LIMIT {
        return Some(Ordering::Less);
    }
    let floor = d.floor();
    let whole = floor as i128;
    match whole.cmp(&i) {
        Ordering::Equal if d > floor => Some(Ordering::Greater),
        ordering => Some(ordering),
    }
}
