//! The registry documents: OCI image manifests and indexes, Docker v2 schema 2 manifests and
//! manifest lists (the same JSON shapes under other media types), image configs; the `Accept`
//! header that asks for all four; the choice of this machine's manifest from an index (os,
//! architecture, variant: containerd's platform rules, simplified); digests. Pure.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;

/// OCI image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Docker v2 schema 2 manifest.
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker v2 manifest list.
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// The `Accept` header of a manifest request: every kind this store can use.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";

/// A descriptor: what a manifest says about a blob or another manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Its media type.
    #[serde(default)]
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Its size in bytes.
    #[serde(default)]
    pub size: u64,
    /// The platform (entries of an index).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    /// Annotations (an index's attestation entries are marked here).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An index entry's platform.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// `linux`.
    #[serde(default)]
    pub os: String,
    /// `amd64`, `arm64`, ...
    #[serde(default)]
    pub architecture: String,
    /// `v7`, `v8`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// A manifest or an index, read as one shape (the fields of each are disjoint).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestDocument {
    /// 2 for everything this store reads.
    #[serde(default)]
    pub schema_version: u32,
    /// The media type written in the document (may be absent in OCI documents).
    #[serde(default)]
    pub media_type: Option<String>,
    /// An image manifest's config.
    #[serde(default)]
    pub config: Option<Descriptor>,
    /// An image manifest's layers, bottom first.
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    /// An index's manifests.
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

/// What a fetched manifest document is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestKind {
    /// An image manifest (OCI or Docker v2 schema 2).
    Image,
    /// An index (OCI) or manifest list (Docker).
    Index,
}

/// Classifies a manifest by its `Content-Type` (else the document's `mediaType`, else its
/// shape); `Err` carries an unsupported media type (Docker schema 1, anything else).
pub fn classify(
    content_type: Option<&str>,
    doc: &ManifestDocument,
) -> Result<ManifestKind, String> {
    let declared = content_type
        .map(|c| c.split(';').next().unwrap_or_default().trim().to_string())
        .filter(|c| !c.is_empty() && c != "application/json" && c != "application/octet-stream")
        .or_else(|| doc.media_type.clone());
    match declared.as_deref() {
        Some(OCI_MANIFEST | DOCKER_MANIFEST) => Ok(ManifestKind::Image),
        Some(OCI_INDEX | DOCKER_MANIFEST_LIST) => Ok(ManifestKind::Index),
        Some(other) => Err(other.to_string()),
        None if !doc.manifests.is_empty() => Ok(ManifestKind::Index),
        None if doc.config.is_some() && doc.schema_version == 2 => Ok(ManifestKind::Image),
        None => Err("unknown (no media type)".to_string()),
    }
}

/// How a layer blob is compressed, from its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerCompression {
    /// A tar.
    None,
    /// A gzipped tar.
    Gzip,
    /// A zstd tar: not supported by this store.
    Zstd,
}

/// The compression a layer media type says (`None` for media types that are not layers).
pub fn layer_compression(media_type: &str) -> Option<LayerCompression> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar"
        | "application/vnd.docker.image.rootfs.diff.tar" => Some(LayerCompression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => {
            Some(LayerCompression::Gzip)
        }
        "application/vnd.oci.image.layer.v1.tar+zstd"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => {
            Some(LayerCompression::Zstd)
        }
        _ => None,
    }
}

/// The image config (OCI and Docker share it): the fields a sandbox runs with, and the layers'
/// uncompressed digests.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfigDocument {
    /// The run configuration.
    #[serde(default)]
    pub config: Option<RunConfig>,
    /// The layers' diff ids.
    #[serde(default)]
    pub rootfs: Option<RootFsDocument>,
    /// The platform the image was built for.
    #[serde(default)]
    pub architecture: String,
    /// Its os.
    #[serde(default)]
    pub os: String,
}

/// `config.config`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    /// `ENTRYPOINT`.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// `CMD`.
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    /// `ENV`.
    #[serde(default)]
    pub env: Option<Vec<String>>,
    /// `WORKDIR`.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// `USER`.
    #[serde(default)]
    pub user: Option<String>,
}

/// `config.rootfs`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RootFsDocument {
    /// `layers`.
    #[serde(default, rename = "type")]
    pub kind: String,
    /// One per layer, bottom first: the sha256 of the uncompressed tar.
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// This machine's platform as OCI names it (`linux/amd64`, `linux/arm64/v8`, ...).
pub fn host_platform() -> Platform {
    let (architecture, variant) = match std::env::consts::ARCH {
        "x86_64" => ("amd64", None),
        "aarch64" => ("arm64", Some("v8")),
        "x86" => ("386", None),
        "arm" => ("arm", Some("v7")),
        "powerpc64" if cfg!(target_endian = "little") => ("ppc64le", None),
        "riscv64" => ("riscv64", None),
        "s390x" => ("s390x", None),
        other => (other, None),
    };
    Platform {
        os: "linux".to_string(),
        architecture: architecture.to_string(),
        variant: variant.map(str::to_string),
    }
}

/// The index entry to run on `wanted`: same os and architecture, and a variant that matches
/// (arm64's `v8` is the same as none; an arm `v7` machine also runs `v6` and `v5`, best
/// first); attestation manifests (`unknown/unknown`) never match. `None` when nothing fits.
pub fn choose_platform<'a>(
    manifests: &'a [Descriptor],
    wanted: &Platform,
) -> Option<&'a Descriptor> {
    let normalise = |p: &Platform| -> Option<String> {
        match (p.architecture.as_str(), p.variant.as_deref()) {
            ("arm64", None | Some("v8")) => None,
            ("amd64", None | Some("v1")) => None,
            (_, variant) => variant.map(str::to_string),
        }
    };
    let wanted_variant = normalise(wanted);
    // Variants a machine accepts, best first.
    let acceptable: Vec<Option<String>> =
        match (wanted.architecture.as_str(), wanted_variant.as_deref()) {
            ("arm", Some("v7")) => {
                vec![Some("v7".into()), Some("v6".into()), Some("v5".into()), None]
            }
            ("arm", Some("v6")) => vec![Some("v6".into()), Some("v5".into()), None],
            (_, variant) => vec![variant.map(str::to_string)],
        };
    acceptable.iter().find_map(|variant| {
        manifests.iter().find(|d| {
            d.annotations
                .get("vnd.docker.reference.type")
                .is_none_or(|t| t != "attestation-manifest")
                && d.platform.as_ref().is_some_and(|p| {
                    p.os == wanted.os
                        && p.architecture == wanted.architecture
                        && &normalise(p) == variant
                })
        })
    })
}

/// `os/architecture[/variant]`.
pub fn platform_name(p: &Platform) -> String {
    match &p.variant {
        Some(v) => format!("{}/{}/{v}", p.os, p.architecture),
        None => format!("{}/{}", p.os, p.architecture),
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

/// The hex of a `sha256:<64 hex>` digest, `None` for any other form (so a digest can name a
/// file without escaping anything).
pub fn sha256_hex(digest: &str) -> Option<&str> {
    digest.strip_prefix("sha256:").filter(|h| {
        h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(arch: &str, variant: Option<&str>, digest: &str) -> Descriptor {
        Descriptor {
            media_type: OCI_MANIFEST.into(),
            digest: digest.into(),
            size: 1,
            platform: Some(Platform {
                os: "linux".into(),
                architecture: arch.into(),
                variant: variant.map(Into::into),
            }),
            annotations: BTreeMap::new(),
        }
    }

    fn platform(arch: &str, variant: Option<&str>) -> Platform {
        Platform { os: "linux".into(), architecture: arch.into(), variant: variant.map(Into::into) }
    }

    #[test]
    fn chooses_the_machines_platform_from_an_index() {
        let mut attestation = entry("unknown", None, "att");
        attestation.platform =
            Some(Platform { os: "unknown".into(), architecture: "unknown".into(), variant: None });
        attestation
            .annotations
            .insert("vnd.docker.reference.type".into(), "attestation-manifest".into());
        let index = vec![
            attestation,
            entry("arm", Some("v6"), "armv6"),
            entry("arm64", None, "arm64"),
            entry("amd64", None, "amd64"),
            entry("arm", Some("v7"), "armv7"),
        ];
        let pick = |p: Platform| choose_platform(&index, &p).map(|d| d.digest.clone());
        assert_eq!(pick(platform("amd64", None)).as_deref(), Some("amd64"));
        assert_eq!(pick(platform("arm64", Some("v8"))).as_deref(), Some("arm64"));
        assert_eq!(pick(platform("arm", Some("v7"))).as_deref(), Some("armv7"));
        assert_eq!(pick(platform("arm", Some("v6"))).as_deref(), Some("armv6"));
        assert_eq!(pick(platform("s390x", None)), None);
        let only_v6 = vec![entry("arm", Some("v6"), "armv6")];
        assert_eq!(
            choose_platform(&only_v6, &platform("arm", Some("v7"))).map(|d| d.digest.as_str()),
            Some("armv6")
        );
        assert_eq!(choose_platform(&only_v6, &platform("arm", Some("v5"))), None);
        assert_eq!(host_platform().os, "linux");
    }

    #[test]
    fn classifies_manifests_by_content_type_then_document() {
        let image = ManifestDocument {
            schema_version: 2,
            config: Some(entry("x", None, "c")),
            ..Default::default()
        };
        let index = ManifestDocument {
            schema_version: 2,
            manifests: vec![entry("x", None, "m")],
            ..Default::default()
        };
        assert_eq!(classify(Some(DOCKER_MANIFEST), &image), Ok(ManifestKind::Image));
        assert_eq!(
            classify(Some("application/vnd.oci.image.index.v1+json; charset=utf-8"), &index),
            Ok(ManifestKind::Index)
        );
        assert_eq!(classify(Some("application/json"), &index), Ok(ManifestKind::Index));
        assert_eq!(classify(None, &image), Ok(ManifestKind::Image));
        let v1 = "application/vnd.docker.distribution.manifest.v1+prettyjws";
        assert_eq!(classify(Some(v1), &image), Err(v1.to_string()));
    }

    #[test]
    fn digests_and_hex() {
        assert_eq!(
            sha256_digest(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert!(
            sha256_hex("sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
                .is_some()
        );
        assert!(sha256_hex("sha256:../../etc").is_none());
        assert!(sha256_hex("sha512:e3b0").is_none());
        assert_eq!(
            layer_compression("application/vnd.oci.image.layer.v1.tar+zstd"),
            Some(LayerCompression::Zstd)
        );
    }
}
