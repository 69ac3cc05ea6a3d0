//! Revision hashes: what `status.updateRevision` of a Sandbox and of a SandboxSet hold, and the
//! `agents.kruise.io/template-hash` label a pool writes on its members.
//!
//! Both follow the reference's algorithms (`upstream-api-controllers.md` §3):
//!
//! - **Sandbox** ([`sandbox_revision`]): the JSON of `spec.template` (or of `spec.templateRef`
//!   when the sandbox refers to a SandboxTemplate, so a change inside the referenced template
//!   does not change the revision), SHA-256, lowercase hex, the first 9 characters, then
//!   [`safe_encode`].
//! - **SandboxSet** ([`sandbox_set_revision`]): the JSON of the effective `SandboxTemplateSpec`
//!   (`template` (inline, else the referenced SandboxTemplate's), `volumeClaimTemplates`,
//!   `persistentContents`, `runtimes`, `pauseStrategy`; the pool's own values win), FNV-1
//!   32-bit, as a decimal string, then [`safe_encode`].
//!
//! # Caveats
//!
//! The algorithms are the reference's, the bytes hashed are not yet: the JSON is serde's
//! encoding of the k8s-openapi types (their field order, their omission rules), not Go's
//! `encoding/json` of the Go structs. So a revision computed here differs from the one the Go
//! controller computes for the same object, and a pool taken over from the Go controller rolls
//! once. A canonical Go-compatible encoder would make them byte-exact; nothing else changes.
//! The legacy (v0.3) SandboxSet hash is not computed.

use oka_api::{SandboxSetSpec, SandboxSpec, SandboxTemplateSpec};
use sha2::{Digest, Sha256};

/// The alphabet of [`safe_encode`]: no vowels, no easily confused characters.
const SAFE_ALPHABET: &[u8; 27] = b"bcdfghjklmnpqrstvwxz2456789";

/// Maps each character `c` of `text` to `SAFE_ALPHABET[code(c) mod 27]`, as the reference's
/// `SafeEncode` does, so a hash never spells a word and is a valid label value.
pub fn safe_encode(text: &str) -> String {
    text.chars().map(|c| char::from(SAFE_ALPHABET[(u32::from(c) % 27) as usize])).collect()
}

/// FNV-1 (not FNV-1a), 32 bits, as Go's `hash/fnv.New32`.
pub fn fnv1_32(bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .fold(0x811c_9dc5_u32, |hash, byte| hash.wrapping_mul(0x0100_0193) ^ u32::from(*byte))
}

/// The revision of a Sandbox's template; see the [module documentation](self).
pub fn sandbox_revision(spec: &SandboxSpec) -> String {
    let json = match &spec.template_ref {
        Some(reference) => serde_json::to_vec(reference),
        None => serde_json::to_vec(&spec.template),
    }
    // Serializing these plain data types cannot fail; an empty input still hashes.
    .unwrap_or_default();
    let digest = Sha256::digest(&json);
    let hex: String = digest.iter().take(5).map(|byte| format!("{byte:02x}")).collect();
    safe_encode(&hex[..9])
}

/// The effective template of a pool: the pool's own fields, falling back to the referenced
/// SandboxTemplate's (`referenced`) for those the pool leaves empty. Probes and the auto-pause
/// policy are not part of it (they do not change what a sandbox runs).
pub fn effective_template(
    set: &SandboxSetSpec,
    referenced: Option<&SandboxTemplateSpec>,
) -> SandboxTemplateSpec {
    SandboxTemplateSpec {
        template: set.template.clone().or_else(|| referenced.and_then(|r| r.template.clone())),
        volume_claim_templates: set
            .volume_claim_templates
            .clone()
            .or_else(|| referenced.and_then(|r| r.volume_claim_templates.clone())),
        persistent_contents: set
            .persistent_contents
            .clone()
            .or_else(|| referenced.and_then(|r| r.persistent_contents.clone())),
        runtimes: set.runtimes.clone().or_else(|| referenced.and_then(|r| r.runtimes.clone())),
        pause_strategy: set
            .pause_strategy
            .clone()
            .or_else(|| referenced.and_then(|r| r.pause_strategy.clone())),
        probes: None,
        auto_pause_policy: None,
    }
}

/// The revision of a pool; see the [module documentation](self). `referenced` is the
/// SandboxTemplate `spec.templateRef` names, when it has one.
pub fn sandbox_set_revision(
    set: &SandboxSetSpec,
    referenced: Option<&SandboxTemplateSpec>,
) -> String {
    let json = serde_json::to_vec(&effective_template(set, referenced)).unwrap_or_default();
    safe_encode(&fnv1_32(&json).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1_32_matches_the_reference_vectors() {
        // Go: fnv.New32() of "" and "a" (FNV-1, not 1a).
        assert_eq!(fnv1_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1_32(b"a"), 0x050c_5d7e);
        assert_eq!(fnv1_32(b"foobar"), 0x31f0_b262);
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
            runtimes: Some(vec![oka_api::common::RuntimeConfig::named("csi")]),
            persistent_contents: Some(vec!["memory".into()]),
            ..Default::default()
        };
        let effective = effective_template(&set, Some(&referenced));
        assert_eq!(effective.runtimes, Some(vec![]));
        assert_eq!(effective.persistent_contents, Some(vec!["memory".into()]));
        assert_ne!(sandbox_set_revision(&set, None), sandbox_set_revision(&set, Some(&referenced)));
    }
}
