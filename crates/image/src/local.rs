//! Locally built images: a finished layer directory (a build sandbox's writable layer) moved
//! into the store and recorded under a reference of [`LOCAL_REGISTRY`], so `get` and `pull`
//! answer it offline like any pulled image.
//!
//! Rules:
//! - a reference is `oka.local/<namespace>/<template>:<build-id>` ([`local_reference`]); such a
//!   reference is never fetched: `pull` answers it from the store or says it is not here;
//! - a layer's key is a SHA-256 over its content ([`layer_digest`]: every path in byte order,
//!   its type, mode, owner, xattrs (overlay whiteouts and opaque markers included), file
//!   content, link target and device number; not times), so the same content is one layer;
//! - the layer is renamed into `layers/<id>` under the records lock, after its record, so GC
//!   never sees it without the image that uses it and a crash leaves nothing under its name;
//! - the base below the new layer is the store's layers of an image, optionally on top of
//!   directories outside the store (a default template's root, always the bottom): those are
//!   recorded as they are and never collected;
//! - a locally built image is kept by GC whatever its age (nothing could fetch it again) until
//!   its owner forgets it with [`ImageStore::remove_local`].

use std::io::{self, Read as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest as _, Sha256};

use crate::error::ImageError;
use crate::manifest;
use crate::reference::Reference;
use crate::store::{
    ImageConfig, ImageRecord, ImageStore, LayerRecord, PulledImage, lock, now_secs, tempdir_in,
    write_atomic,
};

/// The registry name of images built on this machine; never contacted.
pub const LOCAL_REGISTRY: &str = "oka.local";

/// The reference a build of `template` in `namespace` is recorded under:
/// `oka.local/<namespace>/<template>:<build-id>`, each part lower-cased and with characters a
/// reference cannot hold replaced by `-`.
pub fn local_reference(namespace: &str, template: &str, build_id: &str) -> String {
    let component = |s: &str| {
        let cleaned: String = s
            .chars()
            .map(|c| {
                let c = c.to_ascii_lowercase();
                if c.is_ascii_alphanumeric() { c } else { '-' }
            })
            .collect();
        let trimmed = cleaned.trim_matches('-');
        if trimmed.is_empty() { "x".to_string() } else { trimmed.to_string() }
    };
    let tag: String = build_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '-' })
        .take(128)
        .collect();
    let tag = tag.trim_start_matches(['.', '-']);
    let tag = if tag.is_empty() { "latest" } else { tag };
    format!("{LOCAL_REGISTRY}/{}/{}:{tag}", component(namespace), component(template))
}

/// A layer's content digest (`sha256:…`) and the bytes of its regular files; see the module
/// rules for what is hashed. Blocking.
pub fn layer_digest(dir: &Path) -> io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    hash_entry(dir, Path::new(""), &mut hasher, &mut size)?;
    Ok((format!("sha256:{}", manifest::hex(&hasher.finalize())), size))
}

fn field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

fn hash_entry(full: &Path, rel: &Path, hasher: &mut Sha256, size: &mut u64) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let meta = std::fs::symlink_metadata(full)?;
    let kind = meta.file_type();
    field(hasher, rel.as_os_str().as_bytes());
    hasher.update(meta.mode().to_le_bytes());
    hasher.update(meta.uid().to_le_bytes());
    hasher.update(meta.gid().to_le_bytes());
    for (name, value) in xattrs(full) {
        field(hasher, &name);
        field(hasher, &value);
    }
    if kind.is_symlink() {
        field(hasher, std::fs::read_link(full)?.as_os_str().as_bytes());
    } else if kind.is_file() {
        hasher.update(meta.len().to_le_bytes());
        *size += meta.len();
        let mut file = std::fs::File::open(full)?;
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let n = file.read(&mut buffer)?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
        }
    } else if kind.is_dir() {
        let mut names: Vec<_> = std::fs::read_dir(full)?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect::<io::Result<_>>()?;
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        hasher.update((names.len() as u64).to_le_bytes());
        for name in names {
            hash_entry(&full.join(&name), &rel.join(&name), hasher, size)?;
        }
    } else {
        hasher.update(meta.rdev().to_le_bytes());
    }
    Ok(())
}

/// The entry's extended attributes, sorted by name; none where the file system has none.
fn xattrs(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut names = vec![0u8; 4096];
    let Ok(n) = rustix::fs::llistxattr(path, &mut names) else { return Vec::new() };
    let mut out = Vec::new();
    for name in names[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let mut value = vec![0u8; 4096];
        if let Ok(len) = rustix::fs::lgetxattr(path, name, &mut value) {
            value.truncate(len);
            out.push((name.to_vec(), value));
        }
    }
    out.sort();
    out
}

/// What the image digest of a locally built image is computed over.
#[derive(Serialize)]
struct LocalImageIdentity<'a> {
    base_dirs: &'a [PathBuf],
    diff_ids: &'a [String],
    config: &'a ImageConfig,
}

impl ImageStore {
    /// A fresh empty directory inside the store (under `tmp/`, removed at the next open), on
    /// the store's file system, where a caller prepares a layer for
    /// [`import_local`](Self::import_local).
    pub fn staging_dir(&self, prefix: &str) -> Result<PathBuf, ImageError> {
        let tmp = self.inner.dir.join("tmp");
        tempdir_in(&tmp, prefix).map_err(|e| ImageError::io(&tmp, e))
    }

    /// Records the image `reference` (of [`LOCAL_REGISTRY`]) made of `base` (lower directories,
    /// bottom first: directories outside the store, then this store's layers, as a
    /// [`PulledImage`] lists them) and `layer` on top, run with `config`. `layer` (a directory
    /// on the store's file system, see [`staging_dir`](Self::staging_dir)) is moved into the
    /// store, or removed when the store already has the same content; `None` adds no layer.
    /// Blocking (hashing, renames).
    pub fn import_local(
        &self,
        reference: &str,
        base: &[PathBuf],
        layer: Option<&Path>,
        config: ImageConfig,
    ) -> Result<PulledImage, ImageError> {
        let refuse =
            |message: String| ImageError::Import { reference: reference.to_string(), message };
        let parsed = Reference::parse(reference).map_err(|e| refuse(e.to_string()))?;
        if parsed.registry != LOCAL_REGISTRY || parsed.digest.is_some() {
            return Err(refuse(format!(
                "a locally built image is named {LOCAL_REGISTRY}/<namespace>/<name>:<tag>"
            )));
        }
        let key = parsed.to_string();
        let inner = &self.inner;
        let layers_dir = inner.dir.join("layers");
        let mut base_dirs = Vec::new();
        let mut layer_ids = Vec::new();
        let mut diff_ids = Vec::new();
        for dir in base {
            if dir.parent() == Some(layers_dir.as_path()) {
                let id = dir.file_name().map(|n| n.to_string_lossy().into_owned());
                let record = id.as_deref().and_then(|id| inner.read_layer(id));
                match (id, record) {
                    (Some(id), Some(record)) if dir.is_dir() => {
                        layer_ids.push(id);
                        diff_ids.push(record.diff_id);
                    }
                    _ => {
                        return Err(refuse(format!(
                            "{} is not a layer of this store",
                            dir.display()
                        )));
                    }
                }
            } else if !layer_ids.is_empty() {
                return Err(refuse(format!(
                    "{} is above a store layer: directories outside the store can only be the \
                     bottom of an image",
                    dir.display()
                )));
            } else if !dir.is_absolute() || !dir.is_dir() || dir.starts_with(&inner.dir) {
                return Err(refuse(format!(
                    "{} is not an absolute directory outside the image store",
                    dir.display()
                )));
            } else {
                base_dirs.push(dir.clone());
            }
        }
        let new_layer = match layer {
            Some(dir) => {
                let (diff_id, size) = layer_digest(dir).map_err(|e| ImageError::io(dir, e))?;
                let id = inner
                    .layer_id(&diff_id)
                    .ok_or_else(|| refuse(format!("layer digest {diff_id}")))?;
                Some((dir.to_path_buf(), diff_id, id, size))
            }
            None => None,
        };
        if let Some((_, diff_id, id, _)) = &new_layer {
            layer_ids.push(id.clone());
            diff_ids.push(diff_id.clone());
        }
        let identity =
            LocalImageIdentity { base_dirs: &base_dirs, diff_ids: &diff_ids, config: &config };
        let identity = serde_json::to_vec(&identity).map_err(|e| refuse(e.to_string()))?;
        let digest = manifest::sha256_digest(&identity);
        let size =
            layer_ids.iter().map(|id| inner.read_layer(id).map_or(0, |l| l.size)).sum::<u64>()
                + new_layer.as_ref().map_or(0, |(_, _, id, size)| {
                    if inner.read_layer(id).is_some() { 0 } else { *size }
                });
        {
            // GC waits while the layer and the image that keeps it are put in place.
            let _records = inner.records.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((dir, diff_id, id, size)) = &new_layer {
                if inner.has_layer(id, diff_id) {
                    std::fs::remove_dir_all(dir).map_err(|e| ImageError::io(dir, e))?;
                } else {
                    let record = LayerRecord {
                        diff_id: diff_id.clone(),
                        digest: diff_id.clone(),
                        size: *size,
                    };
                    let json =
                        serde_json::to_vec_pretty(&record).map_err(|e| refuse(e.to_string()))?;
                    let path = layers_dir.join(format!("{id}.json"));
                    write_atomic(&path, &json).map_err(|e| ImageError::io(&path, e))?;
                    let target = layers_dir.join(id);
                    std::fs::rename(dir, &target).map_err(|e| ImageError::io(&target, e))?;
                }
            }
            let record = ImageRecord {
                digest: digest.clone(),
                layers: layer_ids,
                diff_ids,
                config,
                size,
                last_used: now_secs(),
                base_dirs,
                local: true,
            };
            let path = inner.image_path(&digest).ok_or_else(|| refuse("digest".into()))?;
            let json = serde_json::to_vec_pretty(&record).map_err(|e| refuse(e.to_string()))?;
            write_atomic(&path, &json).map_err(|e| ImageError::io(&path, e))?;
        }
        inner.remember(&key, &digest).map_err(|e| refuse(e.to_string()))?;
        tracing::info!(reference = %key, %digest, "locally built image recorded");
        inner
            .load_image(&key, &digest)
            .ok_or_else(|| refuse("a directory of the image vanished while it was recorded".into()))
    }

    /// The locally built images' references, each with its image digest and last use (seconds
    /// since the epoch).
    pub fn local_images(&self) -> Vec<(String, String, u64)> {
        let references = lock(&self.inner.references).clone();
        references
            .into_iter()
            .filter(|(reference, _)| {
                Reference::parse(reference).is_ok_and(|r| r.registry == LOCAL_REGISTRY)
            })
            .map(|(reference, digest)| {
                let last_used = self.inner.read_image(&digest).map_or(0, |r| r.last_used);
                (reference, digest, last_used)
            })
            .collect()
    }

    /// Forgets the locally built image `reference`: its reference and, when no other reference
    /// names it, its record (its layers then go at the next GC). Nothing else is touched.
    pub fn remove_local(&self, reference: &str) -> Result<(), ImageError> {
        let refuse =
            |message: String| ImageError::Import { reference: reference.to_string(), message };
        let parsed = Reference::parse(reference).map_err(|e| refuse(e.to_string()))?;
        if parsed.registry != LOCAL_REGISTRY {
            return Err(refuse("not a locally built image".into()));
        }
        let key = parsed.to_string();
        let inner = &self.inner;
        let _records = inner.records.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut references = lock(&inner.references);
        let Some(digest) = references.remove(&key) else { return Ok(()) };
        let json = serde_json::to_vec_pretty(&*references).map_err(|e| refuse(e.to_string()))?;
        let path = inner.dir.join("references.json");
        write_atomic(&path, &json).map_err(|e| ImageError::io(&path, e))?;
        if !references.values().any(|d| d == &digest)
            && let Some(path) = inner.image_path(&digest)
        {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(ImageError::io(&path, e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_valid_whatever_the_names() {
        let reference = local_reference("Team_A", "my.Template", "0f6c-11aa");
        assert_eq!(reference, "oka.local/team-a/my-template:0f6c-11aa");
        assert!(Reference::parse(&reference).is_ok());
        assert!(Reference::parse(&local_reference("", "--", "..")).is_ok());
    }

    #[test]
    fn the_digest_follows_content_and_mode_not_times() {
        let a = tempfile::tempdir().unwrap();
        std::fs::create_dir(a.path().join("d")).unwrap();
        std::fs::write(a.path().join("d/f"), "one").unwrap();
        let (first, size) = layer_digest(a.path()).unwrap();
        assert_eq!(size, 3);
        let f = a.path().join("d/f");
        let file = std::fs::File::options().write(true).open(&f).unwrap();
        file.set_modified(std::time::SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(layer_digest(a.path()).unwrap().0, first);
        std::fs::write(&f, "two").unwrap();
        let (second, _) = layer_digest(a.path()).unwrap();
        assert_ne!(second, first);
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_ne!(layer_digest(a.path()).unwrap().0, second);
    }
}
