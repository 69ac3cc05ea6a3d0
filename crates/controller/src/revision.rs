//! Revision hashes: what `status.updateRevision` of a Sandbox and of a SandboxSet hold, and the
//! `agents.kruise.io/template-hash` label a pool writes on its members.
//!
//! Both follow the reference's algorithms (`upstream-api-controllers.md` §3), over the bytes
//! Go's `encoding/json` writes for the reference's Go structs ([`go_json`]):
//!
//! - **Sandbox** ([`sandbox_revision`]): the JSON of `spec.template` (a `*PodTemplateSpec`),
//!   or of `spec.templateRef` when the sandbox refers to a SandboxTemplate, so a change inside
//!   the referenced template does not change the revision; SHA-256, lowercase hex, the first 9
//!   characters, then [`safe_encode`].
//! - **SandboxSet** ([`sandbox_set_revision`]): the JSON of the effective `SandboxTemplateSpec`
//!   ([`effective_template`]: `template` (inline, else the referenced SandboxTemplate's),
//!   then the pool's own `volumeClaimTemplates`, `persistentContents`, `runtimes`,
//!   `pauseStrategy`), FNV-1 32-bit, as a decimal string, then [`safe_encode`].
//!
//! So a pool taken over from the Go controller keeps its revision and does not roll.
//!
//! # Caveats
//!
//! - The bytes are Go's for every type [`go_json::GO_TYPES`] lists; its caveats (deprecated
//!   in-tree volume sources, required lists left out) are the places a hash may still differ.
//! - The reference's mutating webhook fills in Kubernetes' pod defaults before the object is
//!   stored, and hashes the defaulted template; oka applies no defaults, so a template the
//!   reference defaulted hashes as the stored (defaulted) object does, not as the YAML the
//!   user wrote.
//! - **Legacy SandboxSet** ([`legacy_sandbox_set_revision`]): the revision of the reference's
//!   release v0.3, which its controller still accepts as up to date beside `updateRevision`, so
//!   that members created before its hash changed are not rolled. Only for a pool with an
//!   inline template: Go's JSON of `spec.template` read back as a generic map, `"$patch":
//!   "replace"` added, wrapped as `{"spec": {"template": ...}}` and written again (maps: keys
//!   sorted), FNV-1 32-bit, decimal, [`safe_encode`].
//!
//! A pool's members count as up to date when their `template-hash` is its revision or one of
//! [`accepted_sandbox_set_revisions`]: the legacy revision, and each revision as written by
//! Kubernetes libraries from 1.34 on, which leave out the `"creationTimestamp":null` of a zero
//! `ObjectMeta` that older ones write (the reference's hashes follow the libraries it was built
//! with; its golden legacy value is of the newer form).

pub mod go_json;

use oka_api::{SandboxSetSpec, SandboxSpec, SandboxTemplateSpec};
use sha2::{Digest, Sha256};

/// The alphabet of [`safe_encode`]: no vowels, no easily confused characters.
const SAFE_ALPHABET: &[u8; 27] = b"bcdfghjklmnpqrstvwxz2456789";

/// Maps each character `c` of `text` to `SAFE_ALPHABET[code(c) mod 27]`, as the reference's
/// `SafeEncode` does, so a hash never spells a word and is a valid label value.
pub fn safe_encode(text: &str) -> String {
    text.chars().map(|c| char::from(SAFE_ALPHABET[(u32::from(c) % 27) as usize])).collect()
}

/// FNV-1, 32 bits, as Go's `hash/fnv.New32`: the one in `oka-api`, named here for the
/// revision code and its older callers.
pub use oka_api::fnv::fnv1_32;

/// The revision of a Sandbox's template; see the [module documentation](self).
pub fn sandbox_revision(spec: &SandboxSpec) -> String {
    let json = match &spec.template_ref {
        Some(reference) => go_bytes("SandboxTemplateRef", serde_json::to_value(reference).ok()),
        None => match &spec.template {
            Some(template) => go_bytes("PodTemplateSpec", serde_json::to_value(template).ok()),
            None => b"null".to_vec(),
        },
    };
    let digest = Sha256::digest(&json);
    let hex: String = digest.iter().take(5).map(|byte| format!("{byte:02x}")).collect();
    safe_encode(&hex[..9])
}

/// The revision of the parts of a Sandbox's template that cannot change in place (the
/// annotation `sandbox.agents.kruise.io/hash-immutable-part`, written once): the same hash over
/// the template without its labels and annotations and with every container's and init
/// container's image and resources cleared; a `templateRef`'s is [`sandbox_revision`]; `None`
/// without a template.
pub fn sandbox_immutable_revision(spec: &SandboxSpec) -> Option<String> {
    if spec.template_ref.is_some() && spec.template.is_none() {
        return Some(sandbox_revision(spec));
    }
    let mut template = spec.template.clone()?;
    if let Some(meta) = template.metadata.as_mut() {
        meta.labels = None;
        meta.annotations = None;
    }
    if let Some(pod) = template.spec.as_mut() {
        let all = pod.containers.iter_mut().chain(pod.init_containers.iter_mut().flatten());
        for container in all {
            container.image = None;
            container.resources = Some(Default::default());
        }
    }
    let json = go_bytes("PodTemplateSpec", serde_json::to_value(&template).ok());
    let digest = Sha256::digest(&json);
    let hex: String = digest.iter().take(5).map(|byte| format!("{byte:02x}")).collect();
    Some(safe_encode(&hex[..9]))
}

/// The effective template of a pool, as the reference builds it for the revision: the pod
/// template (inline, else the referenced SandboxTemplate's, `referenced`), and the pool's own
/// `volumeClaimTemplates`, `persistentContents`, `runtimes` and `pauseStrategy` (the pool's
/// win; the referenced template's are not used). Probes and the auto-pause policy are not
/// part of it (they do not change what a sandbox runs).
pub fn effective_template(
    set: &SandboxSetSpec,
    referenced: Option<&SandboxTemplateSpec>,
) -> SandboxTemplateSpec {
    SandboxTemplateSpec {
        template: set.template.clone().or_else(|| referenced.and_then(|r| r.template.clone())),
        volume_claim_templates: set.volume_claim_templates.clone(),
        persistent_contents: set.persistent_contents.clone(),
        runtimes: set.runtimes.clone(),
        pause_strategy: set.pause_strategy.clone(),
        probes: None,
        auto_pause_policy: None,
    }
}

/// The Go bytes of `value` as the struct `go_type`; `null` when absent.
fn go_bytes(go_type: &str, value: Option<serde_json::Value>) -> Vec<u8> {
    // The types named here are in the table (a test covers each), so this cannot fail.
    go_json::encode_ptr(go_type, value.as_ref()).unwrap_or_else(|_| b"null".to_vec())
}

/// The revision of a pool; see the [module documentation](self). `referenced` is the
/// SandboxTemplate `spec.templateRef` names, when it has one.
pub fn sandbox_set_revision(
    set: &SandboxSetSpec,
    referenced: Option<&SandboxTemplateSpec>,
) -> String {
    let json = go_bytes(
        "SandboxTemplateSpec",
        serde_json::to_value(effective_template(set, referenced)).ok(),
    );
    safe_encode(&fnv1_32(&json).to_string())
}

/// The revisions besides [`sandbox_set_revision`] that the reference may have labelled a
/// pool's members with, and that therefore count as up to date (so a pool taken over is not
/// rolled): see the [module documentation](self).
pub fn accepted_sandbox_set_revisions(
    set: &SandboxSetSpec,
    referenced: Option<&SandboxTemplateSpec>,
) -> Vec<String> {
    let current = sandbox_set_revision(set, referenced);
    let json = go_bytes(
        "SandboxTemplateSpec",
        serde_json::to_value(effective_template(set, referenced)).ok(),
    );
    let mut accepted = vec![safe_encode(&fnv1_32(&without_null_creation_time(&json)).to_string())];
    accepted.extend(legacy_revisions(set));
    accepted.sort();
    accepted.dedup();
    accepted.retain(|r| *r != current);
    accepted
}

/// `json` without the `"creationTimestamp":null` members Go writes for a zero `ObjectMeta`
/// with Kubernetes libraries before 1.34, which tag the field `omitzero` (the reference's
/// hashes depend on the version it was built with).
fn without_null_creation_time(json: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(json);
    text.replace("\"creationTimestamp\":null,", "")
        .replace(",\"creationTimestamp\":null", "")
        .replace("\"creationTimestamp\":null", "")
        .into_bytes()
}

/// The legacy (v0.3) revision of a pool, for an inline template only; see the
/// [module documentation](self). The reference's own golden value is the one without a null
/// `creationTimestamp`.
pub fn legacy_sandbox_set_revision(set: &SandboxSetSpec) -> Option<String> {
    legacy_revisions(set).into_iter().next()
}

/// [`legacy_sandbox_set_revision`], then the same with `creationTimestamp: null` kept.
fn legacy_revisions(set: &SandboxSetSpec) -> Vec<String> {
    let Some(bytes) = set
        .template
        .as_ref()
        .filter(|_| set.template_ref.is_none())
        .and_then(|t| serde_json::to_value(t).ok())
        .and_then(|t| go_json::encode("PodTemplateSpec", Some(&t)).ok())
    else {
        return Vec::new();
    };
    [without_null_creation_time(&bytes), bytes]
        .iter()
        .filter_map(|bytes| legacy_revision_of(bytes))
        .collect()
}

/// The legacy revision of the Go bytes of a `PodTemplateSpec`.
fn legacy_revision_of(bytes: &[u8]) -> Option<String> {
    let mut generic: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    generic.as_object_mut()?.insert("$patch".into(), "replace".into());
    let wrapped = serde_json::json!({ "spec": { "template": generic } });
    let mut out = String::new();
    // Go's `json.Marshal` of the generic value (`map[string]interface{}`) it was read into:
    // keys sorted, Go's escaping; numbers as read, Go's form for a pod template's integers.
    go_json::write_raw(&wrapped, &mut out);
    Some(safe_encode(&fnv1_32(out.as_bytes()).to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_immutable_part_ignores_images_resources_and_metadata_only() {
        use k8s_openapi::api::core::v1::{
            Container, PodSpec, PodTemplateSpec, ResourceRequirements,
        };
        let spec = |image: &str, cpu: &str, label: &str, command: &str| SandboxSpec {
            template: Some(PodTemplateSpec {
                metadata: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    labels: Some([("l".to_owned(), label.to_owned())].into()),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "c".into(),
                        image: Some(image.into()),
                        command: Some(vec![command.into()]),
                        resources: Some(ResourceRequirements {
                            limits: Some(
                                [(
                                    "cpu".to_owned(),
                                    k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                                        cpu.into(),
                                    ),
                                )]
                                .into(),
                            ),
                            ..Default::default()
                        }),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            }),
            ..SandboxSpec::default()
        };
        let base = sandbox_immutable_revision(&spec("a:1", "1", "x", "sleep")).unwrap();
        assert_eq!(sandbox_immutable_revision(&spec("b:2", "2", "y", "sleep")).unwrap(), base);
        assert_ne!(sandbox_immutable_revision(&spec("a:1", "1", "x", "true")).unwrap(), base);
        assert_ne!(
            sandbox_revision(&spec("b:2", "1", "x", "sleep")),
            sandbox_revision(&spec("a:1", "1", "x", "sleep"))
        );
        assert_eq!(sandbox_immutable_revision(&SandboxSpec::default()), None);
    }

    #[test]
    fn safe_encode_maps_each_character_mod_27() {
        // '0' is 48: 48 mod 27 = 21 → '4'; 'a' is 97: 97 mod 27 = 16 → 'v'.
        assert_eq!(safe_encode("0a"), "4v");
        assert_eq!(safe_encode(""), "");
        assert!(
            safe_encode("0123456789abcdef").chars().all(|c| SAFE_ALPHABET.contains(&(c as u8)))
        );
    }

    #[test]
    fn sandbox_revision_is_nine_safe_characters_and_follows_the_template() {
        let mut spec = SandboxSpec::default();
        let empty = sandbox_revision(&spec);
        assert_eq!(empty.len(), 9);
        spec.template = Some(Default::default());
        let with_template = sandbox_revision(&spec);
        assert_ne!(empty, with_template);
        assert_eq!(with_template, sandbox_revision(&spec.clone()), "stable");
        // Changing anything but the template does not change it.
        spec.paused = Some(true);
        assert_eq!(with_template, sandbox_revision(&spec));
    }

    #[test]
    fn a_template_ref_hashes_the_reference_only() {
        let mut spec = SandboxSpec {
            template_ref: Some(oka_api::common::SandboxTemplateRef {
                name: "base".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let by_ref = sandbox_revision(&spec);
        spec.template = Some(Default::default());
        assert_eq!(by_ref, sandbox_revision(&spec));
    }

    #[test]
    fn pool_fields_win_over_the_referenced_template() {
        let set = SandboxSetSpec { runtimes: Some(vec![]), ..Default::default() };
        let referenced = SandboxTemplateSpec {
            template: Some(Default::default()),
            runtimes: Some(vec![oka_api::common::RuntimeConfig::named("csi")]),
            persistent_contents: Some(vec!["memory".into()]),
            ..Default::default()
        };
        let effective = effective_template(&set, Some(&referenced));
        assert_eq!(effective.runtimes, Some(vec![]));
        assert_eq!(effective.persistent_contents, None, "the reference takes only the template");
        assert_eq!(effective.template, referenced.template);
        assert_ne!(sandbox_set_revision(&set, None), sandbox_set_revision(&set, Some(&referenced)));
    }

    /// Vectors from `tests/go_vectors/make_vectors.py`, which hashes JSON derived by hand
    /// from the Go declarations (not by this encoder) with the reference's algorithms written
    /// again in Python. The samples are the reference's own (`oka-api`'s
    /// `tests/reference/samples`).
    mod go_vectors {
        use super::*;
        use oka_api::{Sandbox, SandboxSet};

        fn sample<T: serde::de::DeserializeOwned>(name: &str) -> T {
            let path =
                format!("{}/../api/tests/reference/samples/{name}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).expect("the sample exists");
            serde_yaml::from_str(&text).expect("the sample parses")
        }

        /// The reference's golden legacy revision ("captured from a real production cluster",
        /// its `TestComputeUpdateRevision`).
        #[test]
        fn the_legacy_revision_is_the_reference_golden_value() {
            let set: SandboxSetSpec = serde_json::from_value(serde_json::json!({
                "replicas": 3,
                "persistentContents": ["filesystem"],
                "runtimes": [{"name": "agent-runtime"}, {"name": "csi"}],
                "template": {
                    "metadata": {"labels": {"app": "code-interpreter", "env": "production"}},
                    "spec": {
                        "containers": [{
                            "name": "sandbox",
                            "image": "registry.example.com/sandbox/code-interpreter:v1.3",
                            "resources": {
                                "requests": {"cpu": "1", "memory": "1Gi"},
                                "limits": {"cpu": "2", "memory": "2Gi"},
                            },
                            "ports": [
                                {"name": "interpreter", "containerPort": 49999},
                                {"name": "envd", "containerPort": 49983},
                            ],
                        }],
                        "terminationGracePeriodSeconds": 1,
                    },
                },
            }))
            .expect("the spec parses");
            assert_eq!(legacy_sandbox_set_revision(&set).as_deref(), Some("5bf5fbb5d6"));
            assert_ne!(sandbox_set_revision(&set, None), "5bf5fbb5d6");
            // Members labelled with it are up to date; so are those labelled with the legacy
            // revision of libraries that wrote `creationTimestamp: null` (665d9c8596, computed
            // with Python from the same bytes plus that member), and with the current revision
            // of libraries that do not.
            let accepted = accepted_sandbox_set_revisions(&set, None);
            assert!(accepted.contains(&"5bf5fbb5d6".to_owned()), "{accepted:?}");
            assert!(accepted.contains(&"665d9c8596".to_owned()), "{accepted:?}");
            assert_eq!(accepted.len(), 3, "{accepted:?}");
            assert!(!accepted.contains(&sandbox_set_revision(&set, None)));
            // A pool with a templateRef has none.
            let mut by_reference = set.clone();
            by_reference.template = None;
            by_reference.template_ref =
                Some(serde_json::from_value(serde_json::json!({"name": "t"})).expect("a ref"));
            assert_eq!(legacy_sandbox_set_revision(&by_reference), None);
        }

        #[test]
        fn the_code_interpreter_sample_pool_hashes_as_the_reference() {
            let set: SandboxSet = sample("sandboxset-code-interpreter.yaml");
            assert_eq!(sandbox_set_revision(&set.spec, None), "f97c77999");
        }

        #[test]
        fn a_pool_with_every_hashed_field_hashes_as_the_reference() {
            let set: SandboxSetSpec = serde_json::from_value(serde_json::json!({
                "replicas": 3,
                "persistentContents": ["memory"],
                "runtimes": [{"name": "csi"}],
                "pauseStrategy": {"type": "Stop"},
                "probes": [],
                "template": {
                    "metadata": {"labels": {"app": "a<b>&c"}},
                    "spec": {
                        "containers": [{
                            "name": "main",
                            "image": "busybox",
                            "command": ["sh", "-c", "x > y"],
                            "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                            "resources": {"requests": {"cpu": "500m", "memory": "0.5Gi"}}
                        }],
                        "tolerations": [{"operator": "Exists"}]
                    }
                }
            }))
            .expect("a valid spec");
            assert_eq!(sandbox_set_revision(&set, None), "6884d7b95d");
        }

        #[test]
        fn the_sandbox_sample_hashes_as_the_reference() {
            let sandbox: Sandbox = sample("sandbox.yaml");
            assert_eq!(sandbox_revision(&sandbox.spec), "f55cx7f97");
        }
    }
}
