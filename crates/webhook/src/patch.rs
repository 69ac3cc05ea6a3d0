//! The JSON Patch (RFC 6902) a mutating webhook answers: the operations that turn the object
//! the API server sent into the defaulted one. Objects are compared key by key; arrays of the
//! same length element by element, others replaced whole; other values replaced.

use serde_json::{Value, json};

/// The operations that turn `before` into `after` (empty when they are equal).
pub fn diff(before: &Value, after: &Value) -> Vec<Value> {
    let mut ops = Vec::new();
    walk(before, after, &mut String::new(), &mut ops);
    ops
}

fn walk(before: &Value, after: &Value, path: &mut String, ops: &mut Vec<Value>) {
    if before == after {
        return;
    }
    match (before, after) {
        (Value::Object(old), Value::Object(new)) => {
            for key in old.keys().filter(|k| !new.contains_key(*k)) {
                ops.push(json!({"op": "remove", "path": format!("{path}/{}", token(key))}));
            }
            for (key, value) in new {
                let len = path.len();
                path.push('/');
                path.push_str(&token(key));
                match old.get(key) {
                    Some(previous) => walk(previous, value, path, ops),
                    None => ops.push(json!({"op": "add", "path": path.clone(), "value": value})),
                }
                path.truncate(len);
            }
        }
        (Value::Array(old), Value::Array(new)) if old.len() == new.len() => {
            for (i, (previous, value)) in old.iter().zip(new).enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                walk(previous, value, path, ops);
                path.truncate(len);
            }
        }
        _ => ops.push(json!({"op": "replace", "path": path.clone(), "value": after})),
    }
}

/// A JSON Pointer reference token.
fn token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies `ops` as the API server does, with kubeapi's JSON Patch.
    fn applied(before: &Value, ops: Vec<Value>) -> Value {
        let mut doc = before.clone();
        oka_kubeapi::json_patch::apply(&mut doc, &Value::Array(ops)).unwrap();
        doc
    }

    #[test]
    fn the_patch_turns_the_old_object_into_the_new() {
        let cases = [
            (json!({"a": 1}), json!({"a": 1})),
            (json!({"a": 1, "b": {"c": [1, 2]}}), json!({"a": 2, "b": {"c": [1, 3], "d": null}})),
            (json!({"a/b": {"x~y": 1}, "gone": true}), json!({"a/b": {"x~y": 2}})),
            (json!({"l": [{"n": 1}]}), json!({"l": [{"n": 1, "m": 2}, {"n": 3}]})),
            (json!({"spec": {}}), json!({"spec": {"template": {"spec": {"x": false}}}})),
            (json!([1]), json!({"a": 1})),
        ];
        for (before, after) in cases {
            let ops = diff(&before, &after);
            assert_eq!(ops.is_empty(), before == after);
            assert_eq!(applied(&before, ops), after, "{before} → {after}");
        }
    }

    #[test]
    fn pointers_are_escaped() {
        let ops = diff(&json!({}), &json!({"a/b~c": 1}));
        assert_eq!(ops, [json!({"op": "add", "path": "/a~1b~0c", "value": 1})]);
    }
}
