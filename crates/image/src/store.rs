//! The image store: a directory of verified content and unpacked layers, and the pulls that
//! fill it.
//!
//! ```text
//! <dir>/blobs/sha256/<hex>      manifests, indexes and configs, as fetched (verified)
//! <dir>/layers/<id>/            one unpacked layer: an overlay lower directory
//! <dir>/layers/<id>.json        its diff id, blob digest and size
//! <dir>/images/<hex>.json       one image by manifest digest: its layers, config, size, last use
//! <dir>/references.json         reference → manifest digest
//! <dir>/tmp/                    layers being unpacked or imported (removed at open)
//! ```
//!
//! Locally built images (`local.rs`, references under [`LOCAL_REGISTRY`]) live in the same
//! records; their image record may also name directories outside the store as the bottom of
//! their stack (a default template's root), which GC never touches, and GC keeps the images
//! themselves (nothing could fetch them again).
//!
//! A layer's `<id>` is the first 16 hex digits of its diff id (the full 64 when another layer
//! holds the short one), so many layers fit in overlay's mount options, one page (4096 bytes)
//! with `lowerdir=` and the rest: at 16 + 1 bytes per layer plus the store's path, a store at
//! `/var/lib/oka/images` stacks about 90 layers by absolute path, about 240 relative to
//! `<dir>/layers`. Compressed layer blobs are not kept: a layer is verified while it streams
//! (the blob's digest and, decompressed, its diff id), unpacked into `tmp/` and renamed into
//! place only when both match, so a crash never leaves a half layer under its final name.
//! Pulls of one reference, and downloads of one layer, run once however many callers ask.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt as _, Shared};
use futures::{StreamExt as _, TryStreamExt as _};
use http_body_util::BodyExt as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio::sync::{broadcast, mpsc};

use crate::auth::RegistryAuth;
use crate::client::{RegistryClient, Session};
use crate::error::{ImageError, PullError};
use crate::gc::{GcImage, GcPolicy, GcReport, plan_gc};
use crate::local::LOCAL_REGISTRY;
use crate::manifest::{
    self, ConfigDocument, Descriptor, LayerCompression, ManifestDocument, ManifestKind,
};
use crate::reference::Reference;
use crate::unpack::{UnpackError, unpack_layer};

/// How the store reaches registries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageStoreConfig {
    /// Registries (`host[:port]` or host) spoken to over plain HTTP; loopback ones always are.
    pub insecure_registries: Vec<String>,
    /// Registry → mirror base URL (`"docker.io": "http://127.0.0.1:5000"`), tried first; a
    /// mirror that fails falls through to the registry.
    pub mirrors: BTreeMap<String, String>,
    /// Layers downloaded at once per pull.
    pub concurrent_layers: usize,
    /// The platform chosen from an index (`None`: this machine's).
    pub platform: Option<manifest::Platform>,
}

impl Default for ImageStoreConfig {
    fn default() -> Self {
        ImageStoreConfig {
            insecure_registries: Vec::new(),
            mirrors: BTreeMap::new(),
            concurrent_layers: 3,
            platform: None,
        }
    }
}

/// An image in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledImage {
    /// The normalised reference it was pulled or looked up by.
    pub reference: String,
    /// `sha256:…` of its manifest (the platform's manifest when the reference names an index).
    pub digest: String,
    /// Its unpacked layers, bottom first: overlay lower directories.
    pub layers: Vec<PathBuf>,
    /// How it runs.
    pub config: ImageConfig,
    /// Bytes of its unpacked layers' file content.
    pub size: u64,
}

/// The image config's run settings (`ENTRYPOINT`, `CMD`, `ENV`, `WORKDIR`, `USER`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `ENTRYPOINT`.
    pub entrypoint: Vec<String>,
    /// `CMD`.
    pub cmd: Vec<String>,
    /// `ENV`, `K=V`.
    pub env: Vec<String>,
    /// `WORKDIR`.
    pub working_dir: Option<String>,
    /// `USER`.
    pub user: Option<String>,
}

/// How a pull is going, for logs and Events. Layers are numbered from 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullProgress {
    /// The manifest is resolved: this many layers, this many compressed bytes.
    Resolved {
        /// The normalised reference.
        reference: String,
        /// The manifest digest.
        digest: String,
        /// Number of layers.
        layers: usize,
        /// Their compressed size.
        bytes: u64,
    },
    /// A layer was already in the store.
    LayerCached {
        /// Which (1-based).
        index: usize,
        /// Of how many.
        count: usize,
        /// Its blob digest.
        digest: String,
    },
    /// Bytes of a layer received so far (reported every few MiB and at the end).
    LayerBytes {
        /// Which (1-based).
        index: usize,
        /// Of how many.
        count: usize,
        /// Its blob digest.
        digest: String,
        /// Received.
        downloaded: u64,
        /// Its size.
        size: u64,
    },
    /// A layer is verified and unpacked.
    LayerDone {
        /// Which (1-based).
        index: usize,
        /// Of how many.
        count: usize,
        /// Its blob digest.
        digest: String,
    },
    /// The image is in the store.
    Done {
        /// The normalised reference.
        reference: String,
        /// The manifest digest.
        digest: String,
    },
}

impl std::fmt::Display for PullProgress {
    /// One line for a log or an Event (`layer 2/5: 12.0 of 45.0 MB`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mb = |bytes: u64| bytes as f64 / 1e6;
        match self {
            PullProgress::Resolved { reference, digest, layers, bytes } => {
                write!(f, "pulling {reference} ({digest}): {layers} layers, {:.1} MB", mb(*bytes))
            }
            PullProgress::LayerCached { index, count, .. } => {
                write!(f, "layer {index}/{count}: already present")
            }
            PullProgress::LayerBytes { index, count, downloaded, size, .. } => {
                write!(f, "layer {index}/{count}: {:.1} of {:.1} MB", mb(*downloaded), mb(*size))
            }
            PullProgress::LayerDone { index, count, .. } => {
                write!(f, "layer {index}/{count}: unpacked")
            }
            PullProgress::Done { reference, digest } => write!(f, "pulled {reference} ({digest})"),
        }
    }
}

/// How often `LayerBytes` is reported.
const PROGRESS_EVERY: u64 = 8 * 1024 * 1024;

/// One image's record (`images/<hex>.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ImageRecord {
    pub(crate) digest: String,
    pub(crate) layers: Vec<String>,
    pub(crate) diff_ids: Vec<String>,
    pub(crate) config: ImageConfig,
    pub(crate) size: u64,
    pub(crate) last_used: u64,
    /// Directories outside the store below `layers`, bottom first (a locally built image's base).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) base_dirs: Vec<PathBuf>,
    /// Built on this machine ([`LOCAL_REGISTRY`]): never fetched, never collected.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) local: bool,
}

/// One layer's record (`layers/<id>.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LayerRecord {
    pub(crate) diff_id: String,
    pub(crate) digest: String,
    pub(crate) size: u64,
}

type SharedPull = Shared<BoxFuture<'static, Result<PulledImage, PullError>>>;
type SharedLayer = Shared<BoxFuture<'static, Result<String, PullError>>>;

/// The content-addressed image store.
#[derive(Clone)]
pub struct ImageStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) dir: PathBuf,
    config: ImageStoreConfig,
    client: RegistryClient,
    pub(crate) references: Mutex<BTreeMap<String, String>>,
    pulls: Mutex<HashMap<String, (SharedPull, broadcast::Sender<PullProgress>)>>,
    layers: Mutex<HashMap<String, SharedLayer>>,
    /// Read while records are written, written while GC runs.
    pub(crate) records: RwLock<()>,
    /// Layers a pull in progress holds (id → holders): GC leaves them alone.
    pinned: Mutex<HashMap<String, usize>>,
}

/// Layers held against GC until dropped.
struct Pins {
    inner: Arc<Inner>,
    ids: Vec<String>,
}

impl Pins {
    fn pin(&mut self, id: &str) {
        *lock(&self.inner.pinned).entry(id.to_string()).or_default() += 1;
        self.ids.push(id.to_string());
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let mut pinned = lock(&self.inner.pinned);
        for id in &self.ids {
            if let Some(count) = pinned.get_mut(id) {
                *count -= 1;
                if *count == 0 {
                    pinned.remove(id);
                }
            }
        }
    }
}

/// A spawned single-flight task as a future every waiter can share; a task that panicked or was
/// cancelled is a [`PullError::Store`] naming `reference` and `what` the task was.
fn shared_task<T: Clone + Send + Sync + 'static>(
    task: tokio::task::JoinHandle<Result<T, PullError>>,
    reference: String,
    what: &'static str,
) -> Shared<BoxFuture<'static, Result<T, PullError>>> {
    async move {
        task.await.unwrap_or_else(|e| {
            Err(PullError::Store { reference, message: format!("{what} task failed: {e}") })
        })
    }
    .boxed()
    .shared()
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs()
}

/// Writes `bytes` to `path` through a temporary file and a rename.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp-{}-{n}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

impl ImageStore {
    /// Opens (creating) the store in `dir`; leftovers of interrupted unpacks are removed.
    pub fn open(dir: &Path, config: ImageStoreConfig) -> Result<ImageStore, ImageError> {
        for sub in ["blobs/sha256", "layers", "images", "tmp"] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(|e| ImageError::io(&path, e))?;
        }
        let tmp = dir.join("tmp");
        if let Ok(entries) = std::fs::read_dir(&tmp) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_dir_all(entry.path())
                    .or_else(|_| std::fs::remove_file(entry.path()));
            }
        }
        let references_path = dir.join("references.json");
        let references = match std::fs::read(&references_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(path = %references_path.display(), error = %e, "unreadable references; starting empty");
                BTreeMap::new()
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(ImageError::io(&references_path, e)),
        };
        Ok(ImageStore {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                config,
                client: RegistryClient::new()?,
                references: Mutex::new(references),
                pulls: Mutex::new(HashMap::new()),
                layers: Mutex::new(HashMap::new()),
                records: RwLock::new(()),
                pinned: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Pulls `reference` and returns it unpacked. A tag is resolved at the registry each time
    /// (layers already here are not fetched again); a digest already in the store is answered
    /// without network. Concurrent pulls of one reference share one pull (and the first
    /// caller's credentials); each caller hears the progress.
    pub async fn pull(
        &self,
        reference: &str,
        auth: &[RegistryAuth],
        progress: &(dyn Fn(PullProgress) + Send + Sync),
    ) -> Result<PulledImage, PullError> {
        let parsed = Reference::parse(reference).map_err(|e| PullError::InvalidReference {
            reference: reference.to_string(),
            message: e.to_string(),
        })?;
        let key = parsed.to_string();
        if parsed.registry == LOCAL_REGISTRY {
            let image = self.get(&key).ok_or_else(|| PullError::NotFound {
                reference: key.clone(),
                registry: LOCAL_REGISTRY.to_string(),
                message: "a locally built image that this machine's image store does not hold \
                          (such images are never fetched from a network)"
                    .into(),
            })?;
            progress(PullProgress::Done { reference: key, digest: image.digest.clone() });
            return Ok(image);
        }
        // A digest names immutable content: when it is here, no registry is asked.
        if parsed.digest.is_some()
            && let Some(image) = self.get(&key)
        {
            progress(PullProgress::Done { reference: key, digest: image.digest.clone() });
            return Ok(image);
        }
        let (pull, mut events) = {
            let mut pulls = lock(&self.inner.pulls);
            match pulls.get(&key) {
                Some((pull, sender)) => (pull.clone(), sender.subscribe()),
                None => {
                    let (sender, events) = broadcast::channel(1024);
                    let inner = self.inner.clone();
                    let auth = auth.to_vec();
                    let task_sender = sender.clone();
                    let task_key = key.clone();
                    let task = tokio::spawn(async move {
                        let result = inner.pull_uncoalesced(&parsed, &auth, &task_sender).await;
                        lock(&inner.pulls).remove(&task_key);
                        result
                    });
                    let pull = shared_task(task, key.clone(), "pull");
                    pulls.insert(key.clone(), (pull.clone(), sender));
                    (pull, events)
                }
            }
        };
        let mut pull = std::pin::pin!(pull);
        loop {
            tokio::select! {
                biased;
                event = events.recv() => match event {
                    Ok(event) => progress(event),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return pull.await,
                },
                result = &mut pull => {
                    while let Ok(event) = events.try_recv() {
                        progress(event);
                    }
                    return result;
                }
            }
        }
    }

    /// The image `reference` names if it is complete in the store; no network.
    pub fn get(&self, reference: &str) -> Option<PulledImage> {
        let parsed = Reference::parse(reference).ok()?;
        let key = parsed.to_string();
        let digest = lock(&self.inner.references).get(&key).cloned().or(parsed.digest.clone())?;
        self.inner.load_image(&key, &digest)
    }

    /// Removes images and layers as `policy` says, keeping the images whose manifest digests
    /// are `in_use` (their last use becomes now) and the layers of pulls in progress.
    /// Blocking (file removals): call it from a blocking thread in async code.
    pub fn gc(&self, in_use: &BTreeSet<String>, policy: &GcPolicy) -> Result<GcReport, ImageError> {
        let (report, doomed) = {
            // Pulls wait for this part only: the plan and the renames out of `layers/`.
            let _records =
                self.inner.records.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            self.inner.gc_detach(in_use, policy)?
        };
        for dir in doomed {
            std::fs::remove_dir_all(&dir).map_err(|e| ImageError::io(&dir, e))?;
        }
        Ok(report)
    }
}

impl Inner {
    pub(crate) fn image_path(&self, digest: &str) -> Option<PathBuf> {
        manifest::sha256_hex(digest).map(|hex| self.dir.join("images").join(format!("{hex}.json")))
    }

    fn blob_path(&self, digest: &str) -> Option<PathBuf> {
        manifest::sha256_hex(digest).map(|hex| self.dir.join("blobs/sha256").join(hex))
    }

    pub(crate) fn read_image(&self, digest: &str) -> Option<ImageRecord> {
        let bytes = std::fs::read(self.image_path(digest)?).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// The image if its record and every layer directory are there.
    pub(crate) fn load_image(&self, reference: &str, digest: &str) -> Option<PulledImage> {
        let record = self.read_image(digest)?;
        let layers: Vec<PathBuf> = record
            .base_dirs
            .iter()
            .cloned()
            .chain(record.layers.iter().map(|id| self.dir.join("layers").join(id)))
            .collect();
        if !layers.iter().all(|l| l.is_dir()) {
            return None;
        }
        Some(PulledImage {
            reference: reference.to_string(),
            digest: record.digest,
            layers,
            config: record.config,
            size: record.size,
        })
    }

    async fn pull_uncoalesced(
        self: &Arc<Self>,
        reference: &Reference,
        auth: &[RegistryAuth],
        progress: &broadcast::Sender<PullProgress>,
    ) -> Result<PulledImage, PullError> {
        let endpoints = reference.endpoints(&self.config.mirrors, &self.config.insecure_registries);
        let started = std::time::Instant::now();
        let mut last = None;
        for endpoint in endpoints {
            let mirror = endpoint.mirror;
            let base = endpoint.base.clone();
            tracing::debug!(reference = %reference, endpoint = %base, "pulling");
            match self.pull_from(reference, endpoint, auth, progress).await {
                Ok(image) => {
                    tracing::info!(
                        reference = %reference,
                        endpoint = %base,
                        digest = %image.digest,
                        layers = image.layers.len(),
                        size = image.size,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "image pulled"
                    );
                    return Ok(image);
                }
                Err(e) if mirror => {
                    tracing::warn!(reference = %reference, mirror = %base, error = %e, "mirror failed; trying the next endpoint");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| PullError::Unreachable {
            reference: reference.to_string(),
            registry: reference.registry.clone(),
            message: "no endpoint".into(),
        }))
    }

    async fn pull_from(
        self: &Arc<Self>,
        reference: &Reference,
        endpoint: crate::reference::Endpoint,
        auth: &[RegistryAuth],
        progress: &broadcast::Sender<PullProgress>,
    ) -> Result<PulledImage, PullError> {
        let key = reference.to_string();
        let session = Arc::new(
            Session::connect(&self.client, endpoint, &reference.repository, &key, auth).await?,
        );
        let (bytes, content_type) = session.manifest(reference.manifest_reference()).await?;
        let mut digest = manifest::sha256_digest(&bytes);
        if let Some(pinned) = &reference.digest
            && pinned != &digest
        {
            return Err(self.mismatch(&key, &session, "manifest", pinned, &digest));
        }
        let mut document = parse_manifest(&session, &bytes)?;
        let mut kind =
            manifest::classify(content_type.as_deref(), &document).map_err(|media_type| {
                PullError::UnsupportedMediaType {
                    reference: key.clone(),
                    what: "manifest".into(),
                    media_type,
                }
            })?;
        self.write_blob(&key, &digest, &bytes)?;
        if kind == ManifestKind::Index {
            let wanted = self.config.platform.clone().unwrap_or_else(manifest::host_platform);
            let chosen =
                manifest::choose_platform(&document.manifests, &wanted).ok_or_else(|| {
                    PullError::NoMatchingPlatform {
                        reference: key.clone(),
                        wanted: manifest::platform_name(&wanted),
                        available: document
                            .manifests
                            .iter()
                            .filter_map(|d| d.platform.as_ref().map(manifest::platform_name))
                            .collect::<Vec<_>>()
                            .join(", "),
                    }
                })?;
            let chosen_digest = chosen.digest.clone();
            let (bytes, content_type) = session.manifest(&chosen_digest).await?;
            digest = manifest::sha256_digest(&bytes);
            if digest != chosen_digest {
                return Err(self.mismatch(
                    &key,
                    &session,
                    "platform manifest",
                    &chosen_digest,
                    &digest,
                ));
            }
            document = parse_manifest(&session, &bytes)?;
            kind =
                manifest::classify(content_type.as_deref(), &document).map_err(|media_type| {
                    PullError::UnsupportedMediaType {
                        reference: key.clone(),
                        what: "manifest".into(),
                        media_type,
                    }
                })?;
            if kind != ManifestKind::Image {
                return Err(session.invalid("manifest", "an index inside an index"));
            }
            self.write_blob(&key, &digest, &bytes)?;
        }
        if let Some(image) = self.load_image(&key, &digest) {
            self.remember(&key, &digest)?;
            let _ = progress
                .send(PullProgress::Done { reference: key.clone(), digest: digest.clone() });
            return Ok(image);
        }
        let config_descriptor =
            document.config.clone().ok_or_else(|| session.invalid("manifest", "no config"))?;
        if !matches!(
            config_descriptor.media_type.as_str(),
            "application/vnd.oci.image.config.v1+json"
                | "application/vnd.docker.container.image.v1+json"
                | ""
        ) {
            return Err(PullError::UnsupportedMediaType {
                reference: key.clone(),
                what: "config (not a container image)".into(),
                media_type: config_descriptor.media_type.clone(),
            });
        }
        let config_bytes = session.small_blob(&config_descriptor.digest).await?;
        let config_digest = manifest::sha256_digest(&config_bytes);
        if config_digest != config_descriptor.digest {
            return Err(self.mismatch(
                &key,
                &session,
                "config",
                &config_descriptor.digest,
                &config_digest,
            ));
        }
        let config: ConfigDocument = serde_json::from_slice(&config_bytes)
            .map_err(|e| session.invalid("config", &e.to_string()))?;
        self.write_blob(&key, &config_digest, &config_bytes)?;
        let diff_ids = config.rootfs.as_ref().map(|r| r.diff_ids.clone()).unwrap_or_default();
        if diff_ids.len() != document.layers.len() {
            return Err(session.invalid(
                "config",
                &format!("{} diff ids for {} layers", diff_ids.len(), document.layers.len()),
            ));
        }
        for layer in &document.layers {
            match manifest::layer_compression(&layer.media_type) {
                Some(LayerCompression::None | LayerCompression::Gzip) => {}
                Some(LayerCompression::Zstd) => {
                    return Err(PullError::UnsupportedMediaType {
                        reference: key.clone(),
                        what: format!(
                            "layer {} (zstd layers are not supported; push gzip layers)",
                            layer.digest
                        ),
                        media_type: layer.media_type.clone(),
                    });
                }
                None => {
                    return Err(PullError::UnsupportedMediaType {
                        reference: key.clone(),
                        what: format!("layer {}", layer.digest),
                        media_type: layer.media_type.clone(),
                    });
                }
            }
        }
        let count = document.layers.len();
        let mut pins = Pins { inner: self.clone(), ids: Vec::new() };
        for diff_id in &diff_ids {
            let id = self
                .layer_id(diff_id)
                .ok_or_else(|| session.invalid("config", &format!("diff id {diff_id}")))?;
            pins.pin(&id);
        }
        let _ = progress.send(PullProgress::Resolved {
            reference: key.clone(),
            digest: digest.clone(),
            layers: count,
            bytes: document.layers.iter().map(|l| l.size).sum(),
        });
        let jobs = document.layers.iter().cloned().zip(diff_ids.iter().cloned()).enumerate().map(
            |(i, (layer, diff_id))| {
                let inner = self.clone();
                let session = session.clone();
                let progress = progress.clone();
                let key = key.clone();
                async move {
                    inner.ensure_layer(&key, session, layer, diff_id, i + 1, count, progress).await
                }
            },
        );
        let layer_ids: Vec<String> = futures::stream::iter(jobs)
            .buffered(self.config.concurrent_layers.max(1))
            .try_collect()
            .await?;
        let run = config.config.unwrap_or_default();
        let image_config = ImageConfig {
            entrypoint: run.entrypoint.unwrap_or_default(),
            cmd: run.cmd.unwrap_or_default(),
            env: run.env.unwrap_or_default(),
            working_dir: run.working_dir.filter(|w| !w.is_empty()),
            user: run.user.filter(|u| !u.is_empty()),
        };
        let mut size = 0;
        for id in &layer_ids {
            size += self.read_layer(id).map_or(0, |l| l.size);
        }
        let record = ImageRecord {
            digest: digest.clone(),
            layers: layer_ids,
            diff_ids,
            config: image_config,
            size,
            last_used: now_secs(),
            base_dirs: Vec::new(),
            local: false,
        };
        {
            let _records = self.records.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            let path =
                self.image_path(&digest).ok_or_else(|| session.invalid("manifest", "digest"))?;
            let json = serde_json::to_vec_pretty(&record).map_err(|e| store_error(&key, e))?;
            write_atomic(&path, &json).map_err(|e| store_error(&key, e))?;
        }
        self.remember(&key, &digest)?;
        drop(pins);
        let _ =
            progress.send(PullProgress::Done { reference: key.clone(), digest: digest.clone() });
        self.load_image(&key, &digest).ok_or_else(|| PullError::Store {
            reference: key.clone(),
            message: "a layer vanished right after the pull (a concurrent GC?)".into(),
        })
    }

    fn mismatch(
        &self,
        reference: &str,
        session: &Session,
        what: &str,
        expected: &str,
        actual: &str,
    ) -> PullError {
        PullError::DigestMismatch {
            reference: reference.to_string(),
            registry: session.endpoint.host.clone(),
            what: what.to_string(),
            expected: expected.to_string(),
            actual: actual.to_string(),
        }
    }

    fn write_blob(&self, reference: &str, digest: &str, bytes: &[u8]) -> Result<(), PullError> {
        let Some(path) = self.blob_path(digest) else { return Ok(()) };
        if path.exists() {
            return Ok(());
        }
        write_atomic(&path, bytes).map_err(|e| store_error(reference, e))
    }

    /// Records `reference → digest` and the image's last use.
    pub(crate) fn remember(&self, reference: &str, digest: &str) -> Result<(), PullError> {
        let _records = self.records.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        {
            // Written under the lock, so a newer map is never replaced by an older one.
            let mut references = lock(&self.references);
            references.insert(reference.to_string(), digest.to_string());
            let snapshot =
                serde_json::to_vec_pretty(&*references).map_err(|e| store_error(reference, e))?;
            write_atomic(&self.dir.join("references.json"), &snapshot)
                .map_err(|e| store_error(reference, e))?;
        }
        if let Some(mut record) = self.read_image(digest) {
            record.last_used = now_secs();
            if let (Some(path), Ok(json)) =
                (self.image_path(digest), serde_json::to_vec_pretty(&record))
            {
                write_atomic(&path, &json).map_err(|e| store_error(reference, e))?;
            }
        }
        Ok(())
    }

    pub(crate) fn has_layer(&self, id: &str, diff_id: &str) -> bool {
        self.dir.join("layers").join(id).is_dir()
            && self.read_layer(id).is_some_and(|l| l.diff_id == diff_id)
    }

    pub(crate) fn read_layer(&self, id: &str) -> Option<LayerRecord> {
        let bytes = std::fs::read(self.dir.join("layers").join(format!("{id}.json"))).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// The directory name for a diff id: 16 hex digits unless another layer holds them.
    pub(crate) fn layer_id(&self, diff_id: &str) -> Option<String> {
        let hex = manifest::sha256_hex(diff_id)?;
        let short = &hex[..16];
        match self.read_layer(short) {
            Some(existing) if existing.diff_id != diff_id => Some(hex.to_string()),
            _ => Some(short.to_string()),
        }
    }

    /// The layer's directory id, downloading and unpacking it unless it is there; one download
    /// per diff id however many pulls want it.
    #[allow(clippy::too_many_arguments)]
    async fn ensure_layer(
        self: Arc<Self>,
        reference: &str,
        session: Arc<Session>,
        layer: Descriptor,
        diff_id: String,
        index: usize,
        count: usize,
        progress: broadcast::Sender<PullProgress>,
    ) -> Result<String, PullError> {
        let id = self
            .layer_id(&diff_id)
            .ok_or_else(|| session.invalid("config", &format!("diff id {diff_id}")))?;
        let download = {
            // Under the lock: a download that finishes removes itself under it after putting
            // its layer in place, so the layer is either here or being fetched.
            let mut layers = lock(&self.layers);
            match layers.get(&diff_id) {
                Some(download) => download.clone(),
                None if self.has_layer(&id, &diff_id) => {
                    drop(layers);
                    let digest = layer.digest.clone();
                    let _ = progress.send(PullProgress::LayerCached { index, count, digest });
                    return Ok(id);
                }
                None => {
                    let inner = self.clone();
                    let reference = reference.to_string();
                    let task_diff_id = diff_id.clone();
                    let task_id = id.clone();
                    let task_progress = progress.clone();
                    let task_layer = layer.clone();
                    let task = tokio::spawn(async move {
                        let result = inner
                            .download_layer(
                                &reference,
                                &session,
                                &task_layer,
                                &task_diff_id,
                                &task_id,
                                index,
                                count,
                                &task_progress,
                            )
                            .await;
                        lock(&inner.layers).remove(&task_diff_id);
                        result.map(|()| task_id)
                    });
                    let download = shared_task(task, layer.digest.clone(), "layer");
                    layers.insert(diff_id.clone(), download.clone());
                    download
                }
            }
        };
        let id = download.await?;
        let _ =
            progress.send(PullProgress::LayerDone { index, count, digest: layer.digest.clone() });
        Ok(id)
    }

    /// Downloads one layer with retries: streamed, hashed, unpacked on a blocking thread into
    /// `tmp/`, renamed into `layers/<id>` once both digests match.
    #[allow(clippy::too_many_arguments)]
    async fn download_layer(
        &self,
        reference: &str,
        session: &Session,
        layer: &Descriptor,
        diff_id: &str,
        id: &str,
        index: usize,
        count: usize,
        progress: &broadcast::Sender<PullProgress>,
    ) -> Result<(), PullError> {
        let mut backoff = Duration::from_millis(200);
        let mut attempt = 0;
        loop {
            match self
                .download_layer_once(reference, session, layer, diff_id, id, index, count, progress)
                .await
            {
                Err(e) if e.retryable() && attempt < 2 && !matches!(e, PullError::Store { .. }) => {
                    tracing::warn!(reference, layer = %layer.digest, error = %e, attempt, "layer download failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn download_layer_once(
        &self,
        reference: &str,
        session: &Session,
        layer: &Descriptor,
        diff_id: &str,
        id: &str,
        index: usize,
        count: usize,
        progress: &broadcast::Sender<PullProgress>,
    ) -> Result<(), PullError> {
        let tmp = tempdir_in(&self.dir.join("tmp"), id).map_err(|e| store_error(reference, e))?;
        let result = self
            .stream_into(reference, session, layer, diff_id, &tmp, index, count, progress)
            .await;
        let result = match result {
            Ok(size) => self.install_layer(reference, layer, diff_id, id, &tmp, size),
            Err(e) => Err(e),
        };
        if tmp.exists() {
            let _ = tokio::task::spawn_blocking({
                let tmp = tmp.clone();
                move || std::fs::remove_dir_all(tmp)
            })
            .await;
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn stream_into(
        &self,
        reference: &str,
        session: &Session,
        layer: &Descriptor,
        diff_id: &str,
        tmp: &Path,
        index: usize,
        count: usize,
        progress: &broadcast::Sender<PullProgress>,
    ) -> Result<u64, PullError> {
        let response = session.blob(&layer.digest).await?;
        let (sender, receiver) = mpsc::channel::<Bytes>(32);
        let dest = tmp.to_path_buf();
        let unpacker =
            tokio::task::spawn_blocking(move || unpack_layer(ChannelReader::new(receiver), &dest));
        let mut body = response.into_body();
        let mut hasher = Sha256::new();
        let mut downloaded = 0u64;
        let mut reported = 0u64;
        let mut failure = None;
        let mut unpacking = true;
        loop {
            let frame = match tokio::time::timeout(Duration::from_secs(60), body.frame()).await {
                Err(_) => {
                    failure = Some(PullError::Unreachable {
                        reference: reference.to_string(),
                        registry: session.endpoint.host.clone(),
                        message: format!("layer {} stalled for 60s", layer.digest),
                    });
                    break;
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    failure = Some(session.body_error(&format!("layer {}", layer.digest), &e));
                    break;
                }
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else { continue };
            hasher.update(&data);
            downloaded += data.len() as u64;
            if downloaded - reported >= PROGRESS_EVERY {
                reported = downloaded;
                let _ = progress.send(PullProgress::LayerBytes {
                    index,
                    count,
                    digest: layer.digest.clone(),
                    downloaded,
                    size: layer.size,
                });
            }
            // When the unpacker stopped early the rest is still read: a digest mismatch, not
            // the broken archive it caused, is then the reason given.
            if unpacking && sender.send(data).await.is_err() {
                unpacking = false;
            }
        }
        drop(sender);
        let unpacked = unpacker.await.map_err(|e| store_error(reference, e))?;
        if let Some(failure) = failure {
            return Err(failure);
        }
        let actual = format!("sha256:{}", manifest::hex(&hasher.finalize()));
        if actual != layer.digest {
            return Err(self.mismatch(
                reference,
                session,
                &format!("layer {}", layer.digest),
                &layer.digest,
                &actual,
            ));
        }
        let _ = progress.send(PullProgress::LayerBytes {
            index,
            count,
            digest: layer.digest.clone(),
            downloaded,
            size: layer.size,
        });
        let unpacked = unpacked.map_err(|e| match e {
            UnpackError::Zstd => PullError::UnsupportedMediaType {
                reference: reference.to_string(),
                what: format!(
                    "layer {} (zstd layers are not supported; push gzip layers)",
                    layer.digest
                ),
                media_type: layer.media_type.clone(),
            },
            other => PullError::UnpackFailed {
                reference: reference.to_string(),
                layer: layer.digest.clone(),
                message: other.to_string(),
            },
        })?;
        if unpacked.diff_id != diff_id {
            return Err(self.mismatch(
                reference,
                session,
                &format!("uncompressed layer {}", layer.digest),
                diff_id,
                &unpacked.diff_id,
            ));
        }
        Ok(unpacked.size)
    }

    fn install_layer(
        &self,
        reference: &str,
        layer: &Descriptor,
        diff_id: &str,
        id: &str,
        tmp: &Path,
        size: u64,
    ) -> Result<(), PullError> {
        let record =
            LayerRecord { diff_id: diff_id.to_string(), digest: layer.digest.clone(), size };
        let json = serde_json::to_vec_pretty(&record).map_err(|e| store_error(reference, e))?;
        let layers = self.dir.join("layers");
        write_atomic(&layers.join(format!("{id}.json")), &json)
            .map_err(|e| store_error(reference, e))?;
        match std::fs::rename(tmp, layers.join(id)) {
            Ok(()) => Ok(()),
            // Another process put the same layer in place first.
            Err(_) if layers.join(id).is_dir() => Ok(()),
            Err(e) => Err(store_error(reference, e)),
        }
    }

    /// Applies a GC plan: image records and references removed, layers renamed into `tmp/`
    /// (returned, for the caller to delete), unreferenced blobs deleted.
    fn gc_detach(
        &self,
        in_use: &BTreeSet<String>,
        policy: &GcPolicy,
    ) -> Result<(GcReport, Vec<PathBuf>), ImageError> {
        let now = now_secs();
        let images_dir = self.dir.join("images");
        let mut records = Vec::new();
        let mut in_use = in_use.clone();
        for entry in
            std::fs::read_dir(&images_dir).map_err(|e| ImageError::io(&images_dir, e))?.flatten()
        {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "json")
                && let Ok(bytes) = std::fs::read(&path)
                && let Ok(mut record) = serde_json::from_slice::<ImageRecord>(&bytes)
            {
                if record.local {
                    in_use.insert(record.digest.clone());
                }
                if in_use.contains(&record.digest) {
                    record.last_used = now;
                    if let Ok(json) = serde_json::to_vec_pretty(&record) {
                        write_atomic(&path, &json).map_err(|e| ImageError::io(&path, e))?;
                    }
                }
                records.push(record);
            }
        }
        let layers_dir = self.dir.join("layers");
        let mut layer_sizes = BTreeMap::new();
        for entry in
            std::fs::read_dir(&layers_dir).map_err(|e| ImageError::io(&layers_dir, e))?.flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir() {
                let size = self.read_layer(&name).map_or(0, |l| l.size);
                layer_sizes.insert(name, size);
            }
        }
        let images: Vec<GcImage> = records
            .iter()
            .map(|r| GcImage {
                digest: r.digest.clone(),
                last_used: r.last_used,
                layers: r.layers.clone(),
            })
            .collect();
        let pinned: BTreeSet<String> = lock(&self.pinned).keys().cloned().collect();
        let mut plan = plan_gc(&images, &layer_sizes, &in_use, policy, now);
        plan.layers.retain(|id| !pinned.contains(id));
        let mut report = GcReport::default();
        for digest in &plan.images {
            if let Some(path) = self.image_path(digest) {
                std::fs::remove_file(&path).map_err(|e| ImageError::io(&path, e))?;
            }
            report.removed_images.push(digest.clone());
        }
        {
            let removed: BTreeSet<&String> = plan.images.iter().collect();
            let mut references = lock(&self.references);
            references.retain(|_, digest| !removed.contains(digest));
            let json = serde_json::to_vec_pretty(&*references).unwrap_or_default();
            let path = self.dir.join("references.json");
            write_atomic(&path, &json).map_err(|e| ImageError::io(&path, e))?;
        }
        let mut doomed = Vec::new();
        for id in &plan.layers {
            let dir = layers_dir.join(id);
            let record = self.read_layer(id);
            // Renamed first, so a crash mid-removal never leaves a half layer under its name.
            let removed = tempdir_in(&self.dir.join("tmp"), &format!("gc-{id}"))
                .map_err(|e| ImageError::io(&self.dir.join("tmp"), e))?
                .join(id);
            std::fs::rename(&dir, &removed).map_err(|e| ImageError::io(&dir, e))?;
            let _ = std::fs::remove_file(layers_dir.join(format!("{id}.json")));
            doomed.push(removed.parent().map_or(removed.clone(), Path::to_path_buf));
            report.freed_bytes += layer_sizes.get(id).copied().unwrap_or(0);
            report.removed_layers.push(record.map_or_else(|| id.clone(), |r| r.diff_id));
        }
        // Blobs (manifests, configs) of images no longer here.
        let kept_images: Vec<&ImageRecord> =
            records.iter().filter(|r| !plan.images.contains(&r.digest)).collect();
        let mut kept_blobs: BTreeSet<String> = BTreeSet::new();
        for record in &kept_images {
            kept_blobs.insert(record.digest.clone());
            if let Some(bytes) = self.blob_path(&record.digest).and_then(|p| std::fs::read(p).ok())
                && let Ok(document) = serde_json::from_slice::<ManifestDocument>(&bytes)
                && let Some(config) = document.config
            {
                kept_blobs.insert(config.digest);
            }
        }
        for digest in lock(&self.references).values() {
            kept_blobs.insert(digest.clone());
        }
        // Indexes: kept while an image of theirs is.
        let blobs_dir = self.dir.join("blobs/sha256");
        for entry in
            std::fs::read_dir(&blobs_dir).map_err(|e| ImageError::io(&blobs_dir, e))?.flatten()
        {
            let digest = format!("sha256:{}", entry.file_name().to_string_lossy());
            if kept_blobs.contains(&digest) {
                continue;
            }
            let is_live_index = std::fs::read(entry.path())
                .ok()
                .and_then(|b| serde_json::from_slice::<ManifestDocument>(&b).ok())
                .is_some_and(|d| d.manifests.iter().any(|m| kept_blobs.contains(&m.digest)));
            if is_live_index {
                continue;
            }
            let size = entry.metadata().map_or(0, |m| m.len());
            if std::fs::remove_file(entry.path()).is_ok() {
                report.freed_bytes += size;
            }
        }
        let kept_layers: BTreeSet<&String> =
            kept_images.iter().flat_map(|r| r.layers.iter()).collect();
        report.remaining_bytes =
            layer_sizes.iter().filter(|(id, _)| kept_layers.contains(id)).map(|(_, s)| s).sum();
        tracing::info!(
            images = report.removed_images.len(),
            layers = report.removed_layers.len(),
            freed_bytes = report.freed_bytes,
            "image gc"
        );
        Ok((report, doomed))
    }
}

fn parse_manifest(session: &Session, bytes: &[u8]) -> Result<ManifestDocument, PullError> {
    serde_json::from_slice(bytes).map_err(|e| session.invalid("manifest", &e.to_string()))
}

fn store_error(reference: &str, error: impl std::fmt::Display) -> PullError {
    PullError::Store { reference: reference.to_string(), message: error.to_string() }
}

/// A fresh directory under `parent`.
pub(crate) fn tempdir_in(parent: &Path, prefix: &str) -> io::Result<PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = parent.join(format!("{prefix}-{}-{n}", std::process::id()));
        match std::fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// A blocking `Read` over chunks sent from the async side.
struct ChannelReader {
    receiver: mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl ChannelReader {
    fn new(receiver: mpsc::Receiver<Bytes>) -> ChannelReader {
        ChannelReader { receiver, current: Bytes::new() }
    }
}

impl io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.receiver.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}
