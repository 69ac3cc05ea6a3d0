//! The reference's mutating (defaulting) webhooks (`pkg/webhook` of OpenKruise Agents):
//! `md-sbs.kb.io` (`/default-sandboxset`, SandboxSet create and update) and `md-sbt.kb.io`
//! (`/default-sandboxtemplate`, SandboxTemplate create only).
//!
//! Both default the pod template and the PVC templates:
//!
//! - `template.spec.automountServiceAccountToken` is forced to `false` (unset or `true` become
//!   `false`): a sandbox runs untrusted code and gets no API token unless asked for one;
//! - the template's pod spec gets Kubernetes' core/v1 defaults ([`crate::pod_defaults`]);
//! - each `volumeClaimTemplates[]` gets `spec.accessModes: [ReadWriteOnce]` when it has none
//!   and `spec.volumeMode: Filesystem` when unset.
//!
//! `md-sbs` also defaults `spec.updateStrategy.maxUnavailable` to `20%`, on every SandboxSet
//! (the reference's update strategy is a struct, not a pointer, so it is there even when the
//! client sent none). On a create it would give an empty `persistentContents` the value of the
//! reference's `--default-persistent-contents` flag, whose default is empty, so it does
//! nothing; oka has no such flag.
//!
//! # Where they run
//!
//! As on a cluster: the API server decodes the request (pruning unknown fields and applying
//! the schema's defaults), then calls the mutating webhooks, then defaults again after a
//! webhook's patch, then validates the final object (schema, CEL rules, validating webhooks).
//! The webhooks are registered for the `sandboxsets` and `sandboxtemplates` resources, not
//! their `status` or `scale` subresources, so writes through those are not mutated.
//!
//! # Caveats
//!
//! - **Revision hashes.** A SandboxSet's revision is a hash of its (defaulted) template. The
//!   default pools `oka serve` creates go straight into the store, not through admission, so
//!   their templates are not defaulted; the first time a user re-applies such a pool through
//!   the API its template is defaulted, its revision changes once and its members are
//!   replaced as in a template update. The reference warns of the same on upgrade.
//! - The reference re-encodes the whole object from Go structs, so it also drops unknown
//!   fields inside the schemaless template and spells quantities canonically; here the
//!   template keeps what the client sent besides the defaults (see [`crate::pod_defaults`]).

use serde_json::{Map, Value};

use crate::Operation;
use crate::pod_defaults::{default_pod_spec, is_null, objects, set_if_null};

/// The `updateStrategy.maxUnavailable` `md-sbs` gives a SandboxSet without one.
pub const DEFAULT_UPDATE_MAX_UNAVAILABLE: &str =
    oka_api::sandboxset::DEFAULT_UPDATE_MAX_UNAVAILABLE;

/// Applies the mutating webhook of `kind` for `operation` to `obj`, the whole object. Returns
/// whether it changed anything (a webhook's patch is empty otherwise).
pub fn mutate(kind: &str, operation: Operation, obj: &mut Value) -> bool {
    let before = obj.clone();
    match (kind, operation) {
        ("SandboxSet", _) => default_sandbox_set(obj),
        ("SandboxTemplate", Operation::Create) => default_sandbox_template(obj),
        _ => return false,
    }
    *obj != before
}

/// `md-sbs.kb.io`.
fn default_sandbox_set(obj: &mut Value) {
    let Some(spec) = child(obj, "spec") else { return };
    default_embedded_template(spec);
    if let Some(strategy) = child_of(spec, "updateStrategy") {
        set_if_null(strategy, "maxUnavailable", Value::from(DEFAULT_UPDATE_MAX_UNAVAILABLE));
    }
}

/// `md-sbt.kb.io`.
fn default_sandbox_template(obj: &mut Value) {
    if let Some(spec) = child(obj, "spec") {
        default_embedded_template(spec);
    }
}

/// The pod template and the PVC templates of a SandboxSet's or SandboxTemplate's spec.
fn default_embedded_template(spec: &mut Map<String, Value>) {
    // A nil template (the SandboxSet uses `templateRef`) is left nil.
    if let Some(Value::Object(template)) = spec.get_mut("template")
        && let Some(pod) = child_of(template, "spec")
    {
        if pod.get("automountServiceAccountToken") != Some(&Value::Bool(false)) {
            pod.insert("automountServiceAccountToken".into(), Value::Bool(false));
        }
        default_pod_spec(pod);
    }
    for claim in objects(spec, "volumeClaimTemplates") {
        let Some(claim_spec) = child_of(claim, "spec") else { continue };
        let no_modes = match claim_spec.get("accessModes") {
            None | Some(Value::Null) => true,
            Some(Value::Array(modes)) => modes.is_empty(),
            Some(_) => false,
        };
        if no_modes {
            claim_spec.insert("accessModes".into(), Value::from(vec!["ReadWriteOnce"]));
        }
        if is_null(claim_spec.get("volumeMode")) {
            claim_spec.insert("volumeMode".into(), Value::from("Filesystem"));
        }
    }
}

/// The object at `key` of the object `obj`, created empty when absent or `null` (a Go struct
/// is always there); `None` when either is not an object.
fn child<'a>(obj: &'a mut Value, key: &str) -> Option<&'a mut Map<String, Value>> {
    child_of(obj.as_object_mut()?, key)
}

fn child_of<'a>(map: &'a mut Map<String, Value>, key: &str) -> Option<&'a mut Map<String, Value>> {
    set_if_null(map, key, Value::Object(Map::new()));
    map.get_mut(key)?.as_object_mut()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pool(spec: Value) -> Value {
        json!({"apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxSet",
               "metadata": {"name": "p", "namespace": "default"}, "spec": spec})
    }

    #[test]
    fn a_sandbox_set_gets_the_reference_defaults() {
        let mut obj = pool(json!({
            "replicas": 1,
            "template": {"spec": {"containers": [{"name": "main", "image": "img:v1"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}}],
        }));
        assert!(mutate("SandboxSet", Operation::Create, &mut obj));
        assert_eq!(
            obj["spec"],
            json!({
                "replicas": 1,
                "template": {"spec": {
                    "automountServiceAccountToken": false,
                    "dnsPolicy": "ClusterFirst",
                    "restartPolicy": "Always",
                    "securityContext": {},
                    "terminationGracePeriodSeconds": 30,
                    "schedulerName": "default-scheduler",
                    "containers": [{
                        "name": "main", "image": "img:v1",
                        "imagePullPolicy": "Always",
                        "terminationMessagePath": "/dev/termination-log",
                        "terminationMessagePolicy": "File",
                    }],
                }},
                "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                    "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                }}],
                "updateStrategy": {"maxUnavailable": "20%"},
            })
        );
    }

    #[test]
    fn automount_is_forced_off_but_other_user_values_stay() {
        for (sent, stored) in [(json!(null), false), (json!(true), false), (json!(false), false)] {
            let mut obj = pool(json!({"template": {"spec": {
                "automountServiceAccountToken": sent,
                "containers": [{"name": "a"}],
            }}}));
            mutate("SandboxSet", Operation::Update, &mut obj);
            assert_eq!(obj["spec"]["template"]["spec"]["automountServiceAccountToken"], stored);
        }
        let mut obj = pool(json!({
            "templateRef": {"name": "t"},
            "updateStrategy": {"maxUnavailable": 2},
            "volumeClaimTemplates": [{"spec": {"accessModes": ["ReadWriteMany"], "volumeMode": "Block"}}],
        }));
        let before = obj.clone();
        assert!(!mutate("SandboxSet", Operation::Create, &mut obj));
        assert_eq!(obj, before, "a templateRef pool has no template to default");
    }

    #[test]
    fn a_sandbox_template_is_defaulted_on_create_only() {
        let template = json!({"kind": "SandboxTemplate", "spec": {
            "template": {"spec": {"containers": [{"name": "a", "image": "i"}]}},
        }});
        let mut created = template.clone();
        assert!(mutate("SandboxTemplate", Operation::Create, &mut created));
        assert_eq!(
            created["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
            "Always"
        );
        assert!(created["spec"].get("updateStrategy").is_none());
        let mut updated = template.clone();
        assert!(!mutate("SandboxTemplate", Operation::Update, &mut updated));
        assert_eq!(updated, template);
        let mut sandbox = json!({"kind": "Sandbox", "spec": {"template": {"spec": {}}}});
        assert!(!mutate("Sandbox", Operation::Create, &mut sandbox));
    }

    /// Defaulting is idempotent: a second pass over any defaulted object changes nothing,
    /// whatever subset of fields the client set.
    #[test]
    fn defaulting_a_defaulted_object_changes_nothing() {
        let full = json!({
            "replicas": 2,
            "updateStrategy": {},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {
                "automountServiceAccountToken": true,
                "volumes": [{"name": "v"}, {"name": "s", "secret": {"secretName": "x"}},
                            {"name": "i", "image": {"reference": "busybox"}}],
                "initContainers": [{"name": "i", "image": "busybox",
                    "resources": {"limits": {"cpu": "0.0001"}}}],
                "containers": [{"name": "c", "image": "c:latest",
                    "ports": [{"containerPort": 1}],
                    "readinessProbe": {"httpGet": {"port": 1}},
                    "lifecycle": {"preStop": {"httpGet": {"port": 1}}}}],
                "ephemeralContainers": [{"name": "e", "env": [
                    {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}],
            }},
            "volumeClaimTemplates": [{"spec": {"accessModes": []}}, {}],
        });
        let keys: Vec<String> = full.as_object().unwrap().keys().cloned().collect();
        // Every subset of the spec's fields.
        for mask in 0..(1u32 << keys.len()) {
            let spec: Map<String, Value> = keys
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, k)| (k.clone(), full[k].clone()))
                .collect();
            for (kind, operation) in [
                ("SandboxSet", Operation::Create),
                ("SandboxSet", Operation::Update),
                ("SandboxTemplate", Operation::Create),
            ] {
                let mut once = pool(Value::Object(spec.clone()));
                mutate(kind, operation, &mut once);
                let mut twice = once.clone();
                assert!(!mutate(kind, operation, &mut twice), "{kind} {mask}: {once}");
                assert_eq!(twice, once);
            }
        }
    }
}
