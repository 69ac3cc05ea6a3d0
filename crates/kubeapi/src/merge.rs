//! JSON merge patch (RFC 7386): what `kubectl apply`, `kubectl scale` and `kubectl patch
//! --type merge` send for custom resources (`application/merge-patch+json`).

use serde_json::Value;

/// Applies `patch` to `target` as RFC 7386 says: an object patch merges key by key, `null`
/// removes a key, and anything else (arrays included) replaces the target whole.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    let Value::Object(map) = target else { return };
    for (key, value) in patch {
        if value.is_null() {
            map.remove(key);
        } else {
            merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Applies a strategic merge patch (`application/strategic-merge-patch+json`), what kubectl
/// sends built-in kinds: [`oka_api::strategic`]'s rules.
pub use oka_api::strategic::strategic_merge_patch;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_directives_apply() {
        let mut target = json!({
            "metadata": {"finalizers": ["a", "b"], "labels": {"x": "1", "y": "2"}},
            "data": {"k": "v", "old": "o"},
        });
        strategic_merge_patch(
            &mut target,
            &json!({
                "metadata": {
                    "$deleteFromPrimitiveList/finalizers": ["a"],
                    "$setElementOrder/finalizers": ["b"],
                    "labels": {"y": null, "z": "3"},
                },
                "data": {"$patch": "replace", "new": "n"},
            }),
        );
        assert_eq!(
            target,
            json!({
                "metadata": {"finalizers": ["b"], "labels": {"x": "1", "z": "3"}},
                "data": {"new": "n"},
            })
        );
    }

    /// The examples of RFC 7386, appendix A.
    #[test]
    fn rfc_7386_examples() {
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (json!({"a":"b","b":"c"}), json!({"a":null}), json!({"b":"c"})),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (json!({"a":{"b":"c"}}), json!({"a":{"b":"d","c":null}}), json!({"a":{"b":"d"}})),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"a":"foo"}), json!(null), json!(null)),
            (json!({"a":"foo"}), json!("bar"), json!("bar")),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (json!({}), json!({"a":{"bb":{"ccc":null}}}), json!({"a":{"bb":{}}})),
        ];
        for (mut target, patch, expected) in cases {
            merge_patch(&mut target, &patch);
            assert_eq!(target, expected, "patch {patch}");
        }
    }

    /// What `kubectl scale` sends to a scale subresource.
    #[test]
    fn a_scale_patch_changes_only_the_replicas() {
        let mut scale = json!({"spec": {"replicas": 1}, "status": {"replicas": 1}});
        merge_patch(&mut scale, &json!({"spec": {"replicas": 3}}));
        assert_eq!(scale, json!({"spec": {"replicas": 3}, "status": {"replicas": 1}}));
    }
}
