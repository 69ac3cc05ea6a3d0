//! Strategic merge patch (`application/strategic-merge-patch+json`), as
//! `k8s.io/apimachinery`'s does for the kinds oka keeps: what kubectl sends the core kinds, and
//! how a SandboxUpdateOps's `spec.patch` changes each sandbox's pod template.
//!
//! # Rules
//!
//! - Maps merge key by key; `null` removes a key (as does a value patched with `$patch: delete`);
//!   scalars replace.
//! - Lists with a merge key merge item by item on that key (containers, init and ephemeral
//!   containers, volumes, env, image pull secrets and host aliases by their `name` or `ip`;
//!   ports by `containerPort`; volume mounts by `mountPath`; volume devices by `devicePath`):
//!   an item whose key matches is patched, a new one is appended, and an item carrying
//!   `$patch: delete` removes the matching one. Other lists replace whole.
//! - Directives: `$patch: replace` (a map or a list item replaced whole), `$patch: delete` (a
//!   map removed), `$retainKeys`, `$deleteFromPrimitiveList/<list>`, `$setElementOrder/<list>`
//!   (an order only: merge order is kept).
//! - As the reference does before patching, `"spec": {"containers": null}` in the patch is not
//!   read as "remove every container" (the Go struct encodes an absent list as `null`).

use serde_json::{Map, Value};

/// The merge key of a list, by the list's field name (the same in every pod type that has it).
fn merge_key(list: &str) -> Option<&'static str> {
    Some(match list {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates" => "name",
        "ports" => "containerPort",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "hostAliases" => "ip",
        _ => return None,
    })
}

/// Applies `patch` to `template` (a `PodTemplateSpec` as JSON).
pub fn patch_pod_template(template: &mut Value, patch: &Value) {
    let mut patch = patch.clone();
    if let Some(spec) = patch.get_mut("spec").and_then(Value::as_object_mut)
        && spec.get("containers").is_some_and(Value::is_null)
    {
        spec.remove("containers");
    }
    strategic_merge_patch(template, &patch);
}

/// Applies `patch` to `target` by the rules above.
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    match patch.get("$patch").and_then(Value::as_str) {
        Some("delete") => {
            *target = Value::Null;
            return;
        }
        Some("replace") => {
            let mut replaced = patch.clone();
            replaced.remove("$patch");
            *target = Value::Object(replaced);
            return;
        }
        _ => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(map) = target else { return };
    if let Some(keep) = patch.get("$retainKeys").and_then(Value::as_array) {
        map.retain(|k, _| keep.iter().any(|r| r == k) || patch.contains_key(k));
    }
    for (key, value) in patch {
        if let Some(list) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Value::Array(gone)) = (map.get_mut(list), value) {
                items.retain(|i| !gone.contains(i));
            }
            continue;
        }
        if key.starts_with('$') {
            continue;
        }
        if value.is_null() {
            map.remove(key);
            continue;
        }
        match (merge_key(key), value) {
            (Some(on), Value::Array(items)) => {
                let current = map.entry(key.clone()).or_insert_with(|| Value::Array(Vec::new()));
                merge_list(current, items, on);
            }
            _ => {
                let slot = map.entry(key.clone()).or_insert(Value::Null);
                strategic_merge_patch(slot, value);
                if slot.is_null() {
                    map.remove(key);
                }
            }
        }
    }
}

/// Merges the items of a patch list into `target` by the merge key `on`.
fn merge_list(target: &mut Value, items: &[Value], on: &str) {
    if !target.is_array() {
        *target = Value::Array(Vec::new());
    }
    let Value::Array(list) = target else { return };
    for item in items {
        let Some(key) = item.get(on).filter(|k| !k.is_null()) else {
            // An item without its merge key cannot be matched: it is added as it is.
            list.push(item.clone());
            continue;
        };
        let position = list.iter().position(|existing| existing.get(on) == Some(key));
        match (item.get("$patch").and_then(Value::as_str), position) {
            (Some("delete"), Some(at)) => {
                list.remove(at);
            }
            (Some("delete"), None) => {}
            (Some("replace"), found) => {
                let mut replaced = item.clone();
                if let Value::Object(map) = &mut replaced {
                    map.remove("$patch");
                }
                match found {
                    Some(at) => list[at] = replaced,
                    None => list.push(replaced),
                }
            }
            (_, Some(at)) => strategic_merge_patch(&mut list[at], item),
            (_, None) => {
                let mut added = Value::Null;
                strategic_merge_patch(&mut added, item);
                list.push(added);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template() -> Value {
        json!({"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [
            {"name": "main", "image": "app:1", "env": [{"name": "A", "value": "1"}],
             "ports": [{"containerPort": 80}]},
            {"name": "side", "image": "side:1"},
        ]}})
    }

    #[test]
    fn containers_merge_by_name() {
        let mut t = template();
        patch_pod_template(
            &mut t,
            &json!({"spec": {"containers": [{"name": "main", "image": "app:2"}]}}),
        );
        assert_eq!(t["spec"]["containers"][0]["image"], "app:2");
        assert_eq!(t["spec"]["containers"][0]["env"][0]["value"], "1");
        assert_eq!(t["spec"]["containers"][1]["image"], "side:1");
    }

    #[test]
    fn nested_lists_merge_by_their_keys_and_items_are_added_or_deleted() {
        let mut t = template();
        patch_pod_template(
            &mut t,
            &json!({"spec": {"containers": [
                {"name": "main", "env": [{"name": "B", "value": "2"}, {"name": "A", "value": "9"}],
                 "ports": [{"containerPort": 8080}]},
                {"name": "side", "$patch": "delete"},
                {"name": "new", "image": "new:1"},
            ]}}),
        );
        let containers = t["spec"]["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 2);
        assert_eq!(
            containers[0]["env"],
            json!([{"name": "A", "value": "9"}, {"name": "B", "value": "2"}])
        );
        assert_eq!(containers[0]["ports"], json!([{"containerPort": 80}, {"containerPort": 8080}]));
        assert_eq!(containers[1]["name"], "new");
    }

    #[test]
    fn directives_and_nulls() {
        let mut t = template();
        patch_pod_template(
            &mut t,
            &json!({"metadata": {"labels": {"app": null, "b": "c"}}, "spec": {"containers": null}}),
        );
        assert_eq!(t["metadata"]["labels"], json!({"b": "c"}));
        assert_eq!(
            t["spec"]["containers"].as_array().unwrap().len(),
            2,
            "containers: null is not a removal"
        );
        patch_pod_template(
            &mut t,
            &json!({"metadata": {"labels": {"$patch": "replace", "only": "x"}}}),
        );
        assert_eq!(t["metadata"]["labels"], json!({"only": "x"}));
        patch_pod_template(
            &mut t,
            &json!({"spec": {"containers": [{"name": "main", "image": "app:3", "$patch": "replace"}]}}),
        );
        assert_eq!(t["spec"]["containers"][0], json!({"name": "main", "image": "app:3"}));
    }
}
