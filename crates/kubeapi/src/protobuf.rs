//! Request bodies in the Kubernetes protobuf encoding (`application/vnd.kubernetes.protobuf`),
//! which kubectl sends when it creates or replaces a built-in kind (`kubectl create configmap`,
//! `kubectl create secret`). This API answers in JSON (kubectl accepts either), so it only
//! decodes, and only the kinds it serves: Namespace, ConfigMap, Secret, Event and Lease.
//!
//! The encoding: the bytes `k8s\0`, then a `runtime.Unknown` message (`typeMeta` = 1 with
//! `apiVersion` = 1 and `kind` = 2; `raw` = 2, the object's own message), each message in the
//! protobuf wire format with the field numbers of `k8s.io/api`'s `generated.proto`.

use base64::Engine as _;
use serde_json::{Map, Value, json};

/// The media type kubectl sends built-in kinds in.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

/// How a field's bytes read.
#[derive(Clone, Copy)]
enum Ty {
    Str,
    Int,
    Bool,
    /// `metav1.Time`: whole seconds, RFC 3339.
    Time,
    /// `metav1.MicroTime`: microseconds, RFC 3339.
    MicroTime,
    Msg(&'static [Field]),
    MapStr,
    MapBytes,
    RepeatedStr,
    RepeatedMsg(&'static [Field]),
}

/// One field of a message: its number, its JSON name, how it reads.
struct Field(u32, &'static str, Ty);

const OWNER_REFERENCE: &[Field] = &[
    Field(1, "kind", Ty::Str),
    Field(3, "name", Ty::Str),
    Field(4, "uid", Ty::Str),
    Field(5, "apiVersion", Ty::Str),
    Field(6, "controller", Ty::Bool),
    Field(7, "blockOwnerDeletion", Ty::Bool),
];

const OBJECT_META: &[Field] = &[
    Field(1, "name", Ty::Str),
    Field(2, "generateName", Ty::Str),
    Field(3, "namespace", Ty::Str),
    Field(5, "uid", Ty::Str),
    Field(6, "resourceVersion", Ty::Str),
    Field(7, "generation", Ty::Int),
    Field(8, "creationTimestamp", Ty::Time),
    Field(9, "deletionTimestamp", Ty::Time),
    Field(10, "deletionGracePeriodSeconds", Ty::Int),
    Field(11, "labels", Ty::MapStr),
    Field(12, "annotations", Ty::MapStr),
    Field(13, "ownerReferences", Ty::RepeatedMsg(OWNER_REFERENCE)),
    Field(14, "finalizers", Ty::RepeatedStr),
];

const NAMESPACE: &[Field] = &[
    Field(1, "metadata", Ty::Msg(OBJECT_META)),
    Field(2, "spec", Ty::Msg(&[Field(1, "finalizers", Ty::RepeatedStr)])),
    Field(3, "status", Ty::Msg(&[Field(1, "phase", Ty::Str)])),
];

const CONFIG_MAP: &[Field] = &[
    Field(1, "metadata", Ty::Msg(OBJECT_META)),
    Field(2, "data", Ty::MapStr),
    Field(3, "binaryData", Ty::MapBytes),
    Field(4, "immutable", Ty::Bool),
];

const SECRET: &[Field] = &[
    Field(1, "metadata", Ty::Msg(OBJECT_META)),
    Field(2, "data", Ty::MapBytes),
    Field(3, "type", Ty::Str),
    Field(4, "stringData", Ty::MapStr),
    Field(5, "immutable", Ty::Bool),
];

const OBJECT_REFERENCE: &[Field] = &[
    Field(1, "kind", Ty::Str),
    Field(2, "namespace", Ty::Str),
    Field(3, "name", Ty::Str),
    Field(4, "uid", Ty::Str),
    Field(5, "apiVersion", Ty::Str),
    Field(6, "resourceVersion", Ty::Str),
    Field(7, "fieldPath", Ty::Str),
];

const EVENT_SOURCE: &[Field] = &[Field(1, "component", Ty::Str), Field(2, "host", Ty::Str)];

const EVENT_SERIES: &[Field] =
    &[Field(1, "count", Ty::Int), Field(2, "lastObservedTime", Ty::MicroTime)];

const EVENT: &[Field] = &[
    Field(1, "metadata", Ty::Msg(OBJECT_META)),
    Field(2, "involvedObject", Ty::Msg(OBJECT_REFERENCE)),
    Field(3, "reason", Ty::Str),
    Field(4, "message", Ty::Str),
    Field(5, "source", Ty::Msg(EVENT_SOURCE)),
    Field(6, "firstTimestamp", Ty::Time),
    Field(7, "lastTimestamp", Ty::Time),
    Field(8, "count", Ty::Int),
    Field(9, "type", Ty::Str),
    Field(10, "eventTime", Ty::MicroTime),
    Field(11, "series", Ty::Msg(EVENT_SERIES)),
    Field(12, "action", Ty::Str),
    Field(13, "related", Ty::Msg(OBJECT_REFERENCE)),
    Field(14, "reportingComponent", Ty::Str),
    Field(15, "reportingInstance", Ty::Str),
];

const LEASE_SPEC: &[Field] = &[
    Field(1, "holderIdentity", Ty::Str),
    Field(2, "leaseDurationSeconds", Ty::Int),
    Field(3, "acquireTime", Ty::MicroTime),
    Field(4, "renewTime", Ty::MicroTime),
    Field(5, "leaseTransitions", Ty::Int),
    Field(6, "strategy", Ty::Str),
    Field(7, "preferredHolder", Ty::Str),
];

const LEASE: &[Field] =
    &[Field(1, "metadata", Ty::Msg(OBJECT_META)), Field(2, "spec", Ty::Msg(LEASE_SPEC))];

/// A protobuf reader over one message's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
}

/// One field as read: its number and its value.
enum Raw<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut value: u64 = 0;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.bytes.split_first().ok_or("truncated varint")?;
            self.bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint too long".into())
    }

    fn next(&mut self) -> Result<Option<(u32, Raw<'a>)>, String> {
        if self.bytes.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let number = u32::try_from(key >> 3).map_err(|_| "field number too large")?;
        let raw = match key & 7 {
            0 => Raw::Varint(self.varint()?),
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| "length too large")?;
                if len > self.bytes.len() {
                    return Err("truncated field".into());
                }
                let (field, rest) = self.bytes.split_at(len);
                self.bytes = rest;
                Raw::Bytes(field)
            }
            1 | 5 => {
                let len = if key & 7 == 1 { 8 } else { 4 };
                if len > self.bytes.len() {
                    return Err("truncated field".into());
                }
                self.bytes = &self.bytes[len..];
                Raw::Fixed
            }
            other => return Err(format!("unsupported wire type {other}")),
        };
        Ok(Some((number, raw)))
    }
}

fn text(bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| "a string is not UTF-8".to_owned())
}

/// A `Time` or `MicroTime` message as RFC 3339.
fn time(bytes: &[u8], micro: bool) -> Result<Value, String> {
    let (mut seconds, mut nanos) = (0i64, 0i64);
    let mut reader = Reader { bytes };
    while let Some((number, raw)) = reader.next()? {
        match (number, raw) {
            (1, Raw::Varint(v)) => seconds = v as i64,
            (2, Raw::Varint(v)) => nanos = i64::from(v as i32),
            _ => {}
        }
    }
    let at = jiff::Timestamp::new(seconds, if micro { (nanos / 1000 * 1000) as i32 } else { 0 })
        .map_err(|e| e.to_string())?;
    Ok(Value::String(if micro {
        at.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
    } else {
        at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    }))
}

/// A map entry message (`key` = 1, `value` = 2).
fn entry(bytes: &[u8], bytes_value: bool) -> Result<(String, Value), String> {
    let (mut key, mut value) = (String::new(), Value::String(String::new()));
    let mut reader = Reader { bytes };
    while let Some((number, raw)) = reader.next()? {
        if let Raw::Bytes(b) = raw {
            match number {
                1 => key = text(b)?,
                2 if bytes_value => {
                    value = Value::String(base64::engine::general_purpose::STANDARD.encode(b));
                }
                2 => value = Value::String(text(b)?),
                _ => {}
            }
        }
    }
    Ok((key, value))
}

fn message(bytes: &[u8], fields: &[Field]) -> Result<Value, String> {
    let mut out = Map::new();
    let mut reader = Reader { bytes };
    while let Some((number, raw)) = reader.next()? {
        let Some(Field(_, name, ty)) = fields.iter().find(|f| f.0 == number) else { continue };
        let name = (*name).to_owned();
        match (*ty, raw) {
            (Ty::Str, Raw::Bytes(b)) => {
                out.insert(name, Value::String(text(b)?));
            }
            (Ty::Int, Raw::Varint(v)) => {
                out.insert(name, json!(v as i64));
            }
            (Ty::Bool, Raw::Varint(v)) => {
                out.insert(name, json!(v != 0));
            }
            (Ty::Time, Raw::Bytes(b)) => {
                out.insert(name, time(b, false)?);
            }
            (Ty::MicroTime, Raw::Bytes(b)) => {
                out.insert(name, time(b, true)?);
            }
            (Ty::Msg(inner), Raw::Bytes(b)) => {
                out.insert(name, message(b, inner)?);
            }
            (Ty::MapStr | Ty::MapBytes, Raw::Bytes(b)) => {
                let (key, value) = entry(b, matches!(ty, Ty::MapBytes))?;
                if let Value::Object(map) = out.entry(name).or_insert_with(|| json!({})) {
                    map.insert(key, value);
                }
            }
            (Ty::RepeatedStr, Raw::Bytes(b)) => {
                if let Value::Array(items) = out.entry(name).or_insert_with(|| json!([])) {
                    items.push(Value::String(text(b)?));
                }
            }
            (Ty::RepeatedMsg(inner), Raw::Bytes(b)) => {
                let item = message(b, inner)?;
                if let Value::Array(items) = out.entry(name).or_insert_with(|| json!([])) {
                    items.push(item);
                }
            }
            _ => {
                return Err(format!(
                    "field {number} ({}) has the wrong wire type",
                    fields.iter().find(|f| f.0 == number).map_or("", |f| f.1)
                ));
            }
        }
    }
    Ok(Value::Object(out))
}

/// The object a protobuf request body carries, as JSON.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let unknown = body
        .strip_prefix(MAGIC)
        .ok_or("the body does not start with the protobuf envelope's k8s\\0")?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    let mut reader = Reader { bytes: unknown };
    while let Some((number, field)) = reader.next()? {
        match (number, field) {
            (1, Raw::Bytes(type_meta)) => {
                let mut inner = Reader { bytes: type_meta };
                while let Some((n, f)) = inner.next()? {
                    match (n, f) {
                        (1, Raw::Bytes(b)) => api_version = text(b)?,
                        (2, Raw::Bytes(b)) => kind = text(b)?,
                        _ => {}
                    }
                }
            }
            (2, Raw::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    let fields = match kind.as_str() {
        "Namespace" => NAMESPACE,
        "ConfigMap" => CONFIG_MAP,
        "Secret" => SECRET,
        "Event" => EVENT,
        "Lease" => LEASE,
        other => {
            return Err(format!("protobuf bodies of kind {other:?} are not served; send JSON"));
        }
    };
    let mut object = message(raw, fields)?;
    if let Value::Object(map) = &mut object {
        map.insert("apiVersion".into(), json!(api_version));
        map.insert("kind".into(), json!(kind));
    }
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    fn bytes_field(number: u32, bytes: &[u8], out: &mut Vec<u8>) {
        varint(u64::from(number << 3 | 2), out);
        varint(bytes.len() as u64, out);
        out.extend_from_slice(bytes);
    }

    #[test]
    fn a_config_map_reads_as_its_json() {
        let mut meta = Vec::new();
        bytes_field(1, b"cfg", &mut meta);
        let mut label = Vec::new();
        bytes_field(1, b"app", &mut label);
        bytes_field(2, b"web", &mut label);
        bytes_field(11, &label, &mut meta);
        let mut cm = Vec::new();
        bytes_field(1, &meta, &mut cm);
        let mut entry = Vec::new();
        bytes_field(1, b"a", &mut entry);
        bytes_field(2, b"b", &mut entry);
        bytes_field(2, &entry, &mut cm);
        varint(4 << 3, &mut cm);
        varint(1, &mut cm);
        let mut type_meta = Vec::new();
        bytes_field(1, b"v1", &mut type_meta);
        bytes_field(2, b"ConfigMap", &mut type_meta);
        let mut body = MAGIC.to_vec();
        bytes_field(1, &type_meta, &mut body);
        bytes_field(2, &cm, &mut body);
        assert_eq!(
            decode(&body).unwrap(),
            json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "cfg", "labels": {"app": "web"}},
                "data": {"a": "b"},
                "immutable": true,
            })
        );
        assert!(decode(b"{}").is_err());
    }
}
