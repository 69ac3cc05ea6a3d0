//! OCI images for the sandbox controller: [`StoreImages`], the controller's
//! [`ImageSource`] over `oka_image::ImageStore` (pull progress in the log, `imagePullSecrets`
//! turned into registry credentials, the image's `/etc/passwd` and `/etc/group` read from its
//! layers), and [`run_gc`], the periodic collection of the images no sandbox uses.
//!
//! The images in use are the digests the sandboxes record (`status.podInfo.annotations`,
//! [`oka_controller::sandbox::image::IMAGE_ID`]); an image pulled for a sandbox not running yet
//! is kept by the policy's minimum age, which counts from its pull.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use oka_api::Sandbox;
use oka_controller::sandbox::image::{ImagePullError, ImageSource, PulledImage};
use oka_controller::sandbox::imageconfig::{ImageAccounts, ImageConfig};
use oka_image::{GcPolicy, ImageStore, ImageStoreConfig, PullProgress, RegistryAuth};
use oka_store::Store;
use tracing::{debug, info, warn};

use crate::config::ImagesConfig;

/// The controller's image source over the machine's image store.
#[derive(Clone)]
pub struct StoreImages {
    store: ImageStore,
}

impl std::fmt::Debug for StoreImages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreImages").field("dir", &self.store.dir()).finish()
    }
}

impl StoreImages {
    /// Opens the image store `config` names under `state_dir`.
    ///
    /// # Errors
    ///
    /// When the store's directory cannot be made or read.
    pub fn open(config: &ImagesConfig, state_dir: &Path) -> anyhow::Result<Self> {
        let dir = config.dir(state_dir);
        let store_config = ImageStoreConfig {
            insecure_registries: config.insecure_registries.clone(),
            mirrors: config.mirrors.clone(),
            ..ImageStoreConfig::default()
        };
        let store = ImageStore::open(&dir, store_config).map_err(|e| {
            anyhow::anyhow!("cannot open the image store in {} (images.dir): {e}", dir.display())
        })?;
        Ok(Self { store })
    }
}

/// The registry credentials of `pull_secrets` (each a `.dockerconfigjson`); one that cannot
/// be read is skipped, with a warning.
fn credentials(pull_secrets: &[Vec<u8>]) -> Vec<RegistryAuth> {
    let mut auth = Vec::new();
    for secret in pull_secrets {
        match RegistryAuth::from_docker_config_json(secret) {
            Ok(entries) => auth.extend(entries),
            Err(error) => warn!(%error, "an imagePullSecret is not a Docker config: skipped"),
        }
    }
    auth
}

/// A pull's progress in the log, one line each: what was resolved, each layer's bytes (every
/// few MiB) and unpacking, the end.
fn log_progress(progress: PullProgress) {
    match progress {
        PullProgress::LayerCached { .. } => debug!("{progress}"),
        _ => info!("{progress}"),
    }
}

/// The controller's view of a stored image: its account files read from its layers.
fn pulled(image: oka_image::PulledImage) -> PulledImage {
    let accounts = ImageAccounts {
        passwd: image_file(&image.layers, Path::new("etc/passwd")),
        group: image_file(&image.layers, Path::new("etc/group")),
    };
    let oka_image::ImageConfig { entrypoint, cmd, env, working_dir, user } = image.config;
    PulledImage {
        reference: image.reference,
        digest: image.digest,
        layers: image.layers,
        config: ImageConfig { entrypoint, cmd, env, working_dir, user },
        accounts,
        size: image.size,
    }
}

impl ImageSource for StoreImages {
    fn pull<'a>(
        &'a self,
        reference: &'a str,
        pull_secrets: &'a [Vec<u8>],
    ) -> BoxFuture<'a, Result<PulledImage, ImagePullError>> {
        Box::pin(async move {
            let auth = credentials(pull_secrets);
            let image = self
                .store
                .pull(reference, &auth, &log_progress)
                .await
                .map_err(|e| ImagePullError { message: e.to_string() })?;
            tokio::task::spawn_blocking(move || pulled(image))
                .await
                .map_err(|e| ImagePullError { message: format!("reading the image: {e}") })
        })
    }

    fn present(&self, reference: &str) -> Option<PulledImage> {
        self.store.get(reference).map(pulled)
    }
}

/// The largest account file read (a bigger `/etc/passwd` is not believed).
const MAX_ACCOUNT_FILE: u64 = 1 << 20;

/// The content of `path` (relative) as the overlay of `layers` (bottom first) shows it: the
/// top-most layer that has it, unless a layer above hides it (an overlay whiteout, a `0:0`
/// character device, at the path or at one of its directories) or makes a directory above it
/// opaque (`trusted.overlay.opaque=y`: nothing below shows through). `None` when not there.
pub fn image_file(layers: &[PathBuf], path: &Path) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let parents: Vec<&Path> =
        path.ancestors().skip(1).filter(|p| !p.as_os_str().is_empty()).collect();
    for layer in layers.iter().rev() {
        let whiteout = |p: &Path| {
            std::fs::symlink_metadata(layer.join(p))
                .is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == 0)
        };
        if parents.iter().any(|p| whiteout(p)) || whiteout(path) {
            return None;
        }
        let full = layer.join(path);
        if let Ok(meta) = std::fs::symlink_metadata(&full)
            && meta.is_file()
        {
            let mut text = String::new();
            let file = std::fs::File::open(&full).ok()?;
            file.take(MAX_ACCOUNT_FILE).read_to_string(&mut text).ok()?;
            return Some(text);
        }
        let opaque = parents.iter().any(|p| {
            let mut value = [0u8; 1];
            rustix::fs::lgetxattr(layer.join(p), "trusted.overlay.opaque", &mut value)
                .is_ok_and(|n| n == 1 && value[0] == b'y')
        });
        if opaque {
            return None;
        }
    }
    None
}

/// Collects the images no sandbox of `store` that `selector` picks (this node's) records as its
/// own, every `period` of `config`, by its policy, until `stopped` resolves. A failed
/// collection is logged and tried again at the next period.
pub async fn run_gc<S: Store>(
    images: StoreImages,
    store: S,
    selector: oka_store::Selector,
    config: crate::config::ImageGcConfig,
    stopped: impl std::future::Future<Output = ()>,
) {
    let policy = GcPolicy {
        min_age: config.min_age,
        max_bytes: config.budget,
        max_unused_age: config.max_unused_age,
    };
    let collect = async {
        let mut ticks = tokio::time::interval(config.period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let sandboxes = match store.list::<Sandbox>(None, &selector).await {
                Ok(list) => list.items,
                Err(error) => {
                    warn!(%error, "image GC: cannot list the sandboxes; trying again later");
                    continue;
                }
            };
            let in_use = oka_controller::sandbox::image::recorded_digests(
                sandboxes.iter().map(AsRef::as_ref),
            );
            let named = match named_images(&store, &sandboxes).await {
                Ok(named) => named,
                Err(error) => {
                    warn!(%error, "image GC: cannot list the templates; trying again later");
                    continue;
                }
            };
            forget_unnamed_local_images(&images.store, &named, &in_use, policy.min_age);
            let image_store = images.store.clone();
            let policy = policy.clone();
            match tokio::task::spawn_blocking(move || image_store.gc(&in_use, &policy)).await {
                Ok(Ok(report)) if !report.removed_images.is_empty() || report.freed_bytes > 0 => {
                    info!(
                        images = report.removed_images.len(),
                        layers = report.removed_layers.len(),
                        freed_bytes = report.freed_bytes,
                        "image GC removed unused images"
                    );
                }
                Ok(Ok(_)) => debug!("image GC: nothing to remove"),
                Ok(Err(error)) => warn!(%error, "image GC failed"),
                Err(error) => warn!(%error, "image GC task failed"),
            }
        }
    };
    tokio::select! {
        () = stopped => {}
        () = collect => {}
    }
}

/// Every container image the sandboxes, pools and templates of `store` name.
async fn named_images<S: Store>(
    store: &S,
    sandboxes: &[std::sync::Arc<Sandbox>],
) -> Result<std::collections::BTreeSet<String>, oka_store::StoreError> {
    let everything = oka_store::Selector::everything();
    let sets = store.list::<oka_api::SandboxSet>(None, &everything).await?.items;
    let templates = store.list::<oka_api::SandboxTemplate>(None, &everything).await?.items;
    let pods = sandboxes
        .iter()
        .filter_map(|s| s.spec.template.as_ref())
        .chain(sets.iter().filter_map(|s| s.spec.template.as_ref()))
        .chain(templates.iter().filter_map(|t| t.spec.template.as_ref()));
    Ok(pods
        .filter_map(|pod| pod.spec.as_ref())
        .flat_map(|spec| spec.containers.iter().chain(spec.init_containers.iter().flatten()))
        .filter_map(|c| c.image.clone())
        .collect())
}

/// Forgets the locally built images (template builds) that nothing names any more (their
/// template was deleted) and no sandbox runs, once unused for `min_age` (a build that just
/// ended is named by its template a moment later); the GC then removes their layers.
fn forget_unnamed_local_images(
    images: &ImageStore,
    named: &std::collections::BTreeSet<String>,
    in_use: &std::collections::BTreeSet<String>,
    min_age: std::time::Duration,
) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for (reference, digest, last_used) in images.local_images() {
        if named.contains(&reference)
            || in_use.contains(&digest)
            || now.saturating_sub(last_used) < min_age.as_secs()
        {
            continue;
        }
        match images.remove_local(&reference) {
            Ok(()) => info!(%reference, "image GC: forgot a built image no template names"),
            Err(error) => warn!(%reference, %error, "image GC: cannot forget a built image"),
        }
    }
}

/// The controller's image source for `oka serve` and `oka node`; its collector is handed to
/// `spawn` to run in the background until `stopped`.
///
/// # Errors
///
/// When the image store cannot be opened.
pub fn start<S: Store>(
    config: &crate::config::Config,
    store: S,
    selector: oka_store::Selector,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
    spawn: impl FnOnce(tokio::task::JoinHandle<()>),
) -> anyhow::Result<oka_controller::sandbox::image::Images> {
    start_with_store(config, store, selector, stopped, spawn).map(|(images, _)| images)
}

/// [`start`], also answering the image store itself (for the template builder, which must
/// share it: one store per directory and process).
///
/// # Errors
///
/// When the image store cannot be opened.
pub fn start_with_store<S: Store>(
    config: &crate::config::Config,
    store: S,
    selector: oka_store::Selector,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
    spawn: impl FnOnce(tokio::task::JoinHandle<()>),
) -> anyhow::Result<(oka_controller::sandbox::image::Images, ImageStore)> {
    let images = StoreImages::open(&config.images, &config.state_dir)?;
    let image_store = images.store.clone();
    info!(dir = %images.store.dir().display(), "image store open");
    let gc =
        tokio::spawn(run_gc(images.clone(), store, selector, config.images.gc.clone(), stopped));
    spawn(gc);
    let source: Arc<dyn ImageSource> = Arc::new(images);
    Ok((oka_controller::sandbox::Shared(source), image_store))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_image_is_forgotten_once_nothing_names_or_runs_it() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("root");
        std::fs::create_dir_all(&base).unwrap();
        let store =
            ImageStore::open(&dir.path().join("images"), ImageStoreConfig::default()).unwrap();
        let reference = oka_image::local_reference("default", "app", "b1");
        let layer = store.staging_dir("t").unwrap();
        std::fs::write(layer.join("f"), "x").unwrap();
        let image = store
            .import_local(&reference, &[base], Some(&layer), oka_image::ImageConfig::default())
            .unwrap();
        let none = std::collections::BTreeSet::new();
        let named: std::collections::BTreeSet<String> = [reference.clone()].into();
        let running: std::collections::BTreeSet<String> = [image.digest.clone()].into();
        let zero = std::time::Duration::ZERO;
        forget_unnamed_local_images(&store, &named, &none, zero);
        forget_unnamed_local_images(&store, &none, &running, zero);
        forget_unnamed_local_images(&store, &none, &none, std::time::Duration::from_secs(600));
        assert!(store.get(&reference).is_some(), "named, running or just built: kept");
        forget_unnamed_local_images(&store, &none, &none, zero);
        assert!(store.get(&reference).is_none());
    }

    fn write(path: &Path, body: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, body).unwrap();
    }

    #[test]
    fn an_image_file_is_the_top_most_layers_and_whiteouts_hide_it() {
        let dir = tempfile::tempdir().unwrap();
        let (bottom, middle, top) =
            (dir.path().join("bottom"), dir.path().join("middle"), dir.path().join("top"));
        for layer in [&bottom, &middle, &top] {
            std::fs::create_dir_all(layer).unwrap();
        }
        write(&bottom.join("etc/passwd"), "bottom\n");
        write(&middle.join("etc/passwd"), "middle\n");
        write(&bottom.join("etc/group"), "bottom-group\n");
        let layers = vec![bottom.clone(), middle.clone(), top.clone()];
        assert_eq!(image_file(&layers, Path::new("etc/passwd")).as_deref(), Some("middle\n"));
        assert_eq!(image_file(&layers, Path::new("etc/group")).as_deref(), Some("bottom-group\n"));
        assert_eq!(image_file(&layers, Path::new("etc/shadow")), None);
        if rustix::process::geteuid().is_root() {
            // A whiteout in the top layer hides both lower files.
            std::fs::create_dir_all(top.join("etc")).unwrap();
            rustix::fs::mknodat(
                rustix::fs::CWD,
                top.join("etc/passwd").as_path(),
                rustix::fs::FileType::CharacterDevice,
                rustix::fs::Mode::empty(),
                rustix::fs::makedev(0, 0),
            )
            .unwrap();
            assert_eq!(image_file(&layers, Path::new("etc/passwd")), None);
            // An opaque /etc in the middle layer hides the bottom layer's group file.
            rustix::fs::setxattr(
                middle.join("etc"),
                "trusted.overlay.opaque",
                b"y",
                rustix::fs::XattrFlags::empty(),
            )
            .unwrap();
            assert_eq!(image_file(&layers, Path::new("etc/group")), None);
        }
    }
}
