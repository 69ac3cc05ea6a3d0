//! JSON patch (RFC 6902, `application/json-patch+json`): what `kubectl patch --type json`
//! sends. Operations apply in order to a copy; the first that fails fails the whole patch and
//! leaves the target as it was.

use serde_json::Value;

/// Why a JSON patch does not apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The body is not an array of operations.
    #[error("{0}")]
    Malformed(String),
    /// An operation's path names nothing it can act on.
    #[error("{0}")]
    Path(String),
    /// A `test` operation found another value.
    #[error("testing value {path} failed: test failed")]
    TestFailed {
        /// The tested path.
        path: String,
    },
}

/// Splits a JSON pointer (`/a/b~1c`) into its unescaped tokens.
fn tokens(pointer: &str) -> Result<Vec<String>, PatchError> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(PatchError::Path(format!("path `{pointer}` does not start with /")));
    };
    Ok(rest.split('/').map(|t| t.replace("~1", "/").replace("~0", "~")).collect())
}

/// The array index a token names in an array of `len` items (`-` is the end when `append`).
fn index(token: &str, len: usize, append: bool) -> Result<usize, PatchError> {
    if append && token == "-" {
        return Ok(len);
    }
    let bound = if append { len } else { len.saturating_sub(1) };
    match token.parse::<usize>() {
        Ok(i)
            if (token == "0" || !token.starts_with('0')) && (i <= bound) && (append || len > 0) =>
        {
            Ok(i)
        }
        _ => Err(PatchError::Path(format!("array index `{token}` is out of bounds"))),
    }
}

/// The parent of the value at `path` and the last token.
fn parent<'a>(
    doc: &'a mut Value,
    path: &[String],
    full: &str,
) -> Result<(&'a mut Value, String), PatchError> {
    let Some((last, init)) = path.split_last() else {
        return Err(PatchError::Path("the root has no parent".into()));
    };
    let mut at = doc;
    for token in init {
        at = match at {
            Value::Object(map) => map.get_mut(token),
            Value::Array(items) => {
                let i = index(token, items.len(), false)?;
                items.get_mut(i)
            }
            _ => None,
        }
        .ok_or_else(|| PatchError::Path(format!("doc is missing path: \"{full}\"")))?;
    }
    Ok((at, last.clone()))
}

fn get<'a>(doc: &'a Value, path: &str) -> Result<&'a Value, PatchError> {
    let mut at = doc;
    for token in tokens(path)? {
        at = match at {
            Value::Object(map) => map.get(&token),
            Value::Array(items) => items.get(index(&token, items.len(), false)?),
            _ => None,
        }
        .ok_or_else(|| PatchError::Path(format!("doc is missing path: \"{path}\"")))?;
    }
    Ok(at)
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), PatchError> {
    let parts = tokens(path)?;
    if parts.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (at, last) = parent(doc, &parts, path)?;
    match at {
        Value::Object(map) => {
            map.insert(last, value);
            Ok(())
        }
        Value::Array(items) => {
            let i = index(&last, items.len(), true)?;
            items.insert(i, value);
            Ok(())
        }
        _ => Err(PatchError::Path(format!("doc is missing path: \"{path}\""))),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, PatchError> {
    let parts = tokens(path)?;
    let (at, last) = parent(doc, &parts, path)?;
    let missing = || PatchError::Path(format!("doc is missing path: \"{path}\""));
    match at {
        Value::Object(map) => map.remove(&last).ok_or_else(missing),
        Value::Array(items) => {
            let i = index(&last, items.len(), false)?;
            Ok(items.remove(i))
        }
        _ => Err(missing()),
    }
}

/// Applies the JSON patch `patch` to `doc`.
pub fn apply(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let Value::Array(ops) = patch else {
        return Err(PatchError::Malformed("a JSON patch is an array of operations".into()));
    };
    let mut work = doc.clone();
    for op in ops {
        let text = |key: &str| -> Result<String, PatchError> {
            op.get(key).and_then(Value::as_str).map(str::to_owned).ok_or_else(|| {
                PatchError::Malformed(format!("operation {op} has no string `{key}`"))
            })
        };
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| PatchError::Malformed(format!("operation {op} has no `value`")))
        };
        let path = text("path")?;
        match text("op")?.as_str() {
            "add" => add(&mut work, &path, value()?)?,
            "remove" => {
                remove(&mut work, &path)?;
            }
            "replace" => {
                get(&work, &path)?;
                if tokens(&path)?.is_empty() {
                    work = value()?;
                } else {
                    remove(&mut work, &path)?;
                    add(&mut work, &path, value()?)?;
                }
            }
            "move" => {
                let from = text("from")?;
                if path.starts_with(&format!("{from}/")) {
                    return Err(PatchError::Path(format!(
                        "cannot move {from} into its own child {path}"
                    )));
                }
                let moved = remove(&mut work, &from)?;
                add(&mut work, &path, moved)?;
            }
            "copy" => {
                let copied = get(&work, &text("from")?)?.clone();
                add(&mut work, &path, copied)?;
            }
            "test" => {
                if *get(&work, &path)? != value()? {
                    return Err(PatchError::TestFailed { path });
                }
            }
            other => return Err(PatchError::Malformed(format!("unexpected kind: {other}"))),
        }
    }
    *doc = work;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn operations_apply_in_order() {
        let mut doc =
            json!({"spec": {"replicas": 1, "list": [1, 2]}, "metadata": {"labels": {"a/b": "x"}}});
        apply(
            &mut doc,
            &json!([
                {"op": "test", "path": "/spec/replicas", "value": 1},
                {"op": "replace", "path": "/spec/replicas", "value": 3},
                {"op": "add", "path": "/spec/list/-", "value": 3},
                {"op": "add", "path": "/spec/list/0", "value": 0},
                {"op": "remove", "path": "/metadata/labels/a~1b"},
                {"op": "copy", "from": "/spec/replicas", "path": "/spec/copied"},
                {"op": "move", "from": "/spec/copied", "path": "/spec/moved"},
            ]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"spec": {"replicas": 3, "list": [0, 1, 2, 3], "moved": 3}, "metadata": {"labels": {}}})
        );
    }

    #[test]
    fn a_failing_operation_changes_nothing() {
        let mut doc = json!({"spec": {"replicas": 1}});
        let before = doc.clone();
        let e = apply(
            &mut doc,
            &json!([
                {"op": "replace", "path": "/spec/replicas", "value": 3},
                {"op": "test", "path": "/spec/replicas", "value": 1},
            ]),
        )
        .unwrap_err();
        assert_eq!(e, PatchError::TestFailed { path: "/spec/replicas".into() });
        assert_eq!(doc, before);
        let e = apply(&mut doc, &json!([{"op": "replace", "path": "/spec/nope", "value": 1}]));
        assert_eq!(e.unwrap_err().to_string(), "doc is missing path: \"/spec/nope\"");
        let e = apply(&mut doc, &json!([{"op": "add", "path": "/spec/list/5", "value": 1}]));
        assert!(e.is_err());
        assert!(apply(&mut doc, &json!({"op": "add"})).is_err());
    }
}
