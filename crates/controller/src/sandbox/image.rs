//! OCI images of sandboxes: which image a template names, the pull policy, the pulls, and the
//! rule that turns a pull's state into the sandbox's `Ready` condition, as the kubelet does.
//!
//! # Expected flow
//!
//! 1. A template's first container names an `image` that is not an absolute path (a
//!    directory root) and not empty (the runtime's default root): [`TemplateImage::Reference`].
//! 2. The reconcile asks [`ImagePulls::observe`] for the image's [`ImageState`] under the
//!    container's [`PullPolicy`] (IO: the store of pulled images is asked, without network).
//! 3. The pure [`pull_step`] decides: an image [`ImageState::Ready`] lets the sandbox be created
//!    on its layers; one that must be pulled keeps the sandbox `Pending` with
//!    `Ready=False/ContainerCreating` ("Pulling image …") and asks for a pull
//!    ([`PullStep::start`]); a failed pull shows `ErrImagePull`, then `ImagePullBackOff` until
//!    the next attempt, the kubelet's backoff ([`pull_backoff`]: 10 s doubling to 5 min);
//!    `Never` with the image absent is `ErrImageNeverPull`. The sandbox is never created on
//!    another root.
//! 4. The executor starts the pull ([`ImagePulls::start`]) on a task of its own, so no worker
//!    waits on the network; one pull per reference at a time, whoever asks. When it ends, every
//!    sandbox waiting for it gets the kubelet's Event (`Pulled`, `Failed`) and is reconciled
//!    again.
//!
//! The digest a sandbox was created from is recorded in `status.podInfo.annotations`
//! ([`IMAGE_ID`], `repository@sha256:…`, what Kubernetes keeps in a container status's
//! `imageID`), so a garbage collector knows which images are in use.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{self, Stream};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, PodTemplateSpec};
use oka_api::Sandbox;
use oka_cache::ObjectKey;
use tokio::sync::mpsc;

use super::Shared;
use super::imageconfig::{ImageAccounts, ImageConfig};
use crate::events::{EventRecorder, EventType};

/// The key of `status.podInfo.annotations` that records the image a sandbox was created from,
/// `repository@sha256:…` (Kubernetes' `imageID`).
pub const IMAGE_ID: &str = "agents.kruise.io/image-id";

/// `Ready=False` reasons of the image step, the kubelet's waiting reasons.
pub mod reason {
    /// The image is being pulled (the container is being created).
    pub const CONTAINER_CREATING: &str = "ContainerCreating";
    /// The last pull failed.
    pub const ERR_IMAGE_PULL: &str = "ErrImagePull";
    /// Waiting before the next attempt.
    pub const IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";
    /// `imagePullPolicy: Never` and the image is not present.
    pub const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
    /// The container's configuration cannot be made from the image (an unknown `USER`).
    pub const CREATE_CONTAINER_CONFIG_ERROR: &str = "CreateContainerConfigError";
}

/// The first pull retry waits this long; each failure doubles it up to [`MAX_PULL_BACKOFF`]
/// (the kubelet's image backoff).
pub const INITIAL_PULL_BACKOFF: Duration = Duration::from_secs(10);
/// The longest wait between two pull attempts.
pub const MAX_PULL_BACKOFF: Duration = Duration::from_secs(300);
/// How long after a failed pull its sandboxes show `ErrImagePull`, before `ImagePullBackOff`.
pub const ERR_IMAGE_PULL_SHOWN: Duration = Duration::from_secs(2);

/// The wait before attempt `failures + 1`, after `failures` failed pulls in a row.
pub fn pull_backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    INITIAL_PULL_BACKOFF.saturating_mul(1 << doublings).min(MAX_PULL_BACKOFF)
}

/// What a template's first container names as its `image`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateImage<'a> {
    /// No image: the runtime's default root.
    None,
    /// An absolute path: a root directory on the host.
    Directory(&'a str),
    /// An image reference to pull (`python:3.12`, `127.0.0.1:5000/app@sha256:…`).
    Reference(&'a str),
}

impl<'a> TemplateImage<'a> {
    /// The image of `template`'s first container.
    pub fn of(template: &'a PodTemplateSpec) -> Self {
        let image = template
            .spec
            .as_ref()
            .and_then(|p| p.containers.first())
            .and_then(|c| c.image.as_deref())
            .map(str::trim)
            .unwrap_or_default();
        if image.is_empty() {
            Self::None
        } else if image.starts_with('/') {
            Self::Directory(image)
        } else {
            Self::Reference(image)
        }
    }
}

/// `imagePullPolicy`, with Kubernetes' default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PullPolicy {
    /// Resolve the reference at the registry for every sandbox created.
    Always,
    /// Pull only when the image is not present.
    IfNotPresent,
    /// Never pull; the image must be present.
    Never,
}

impl PullPolicy {
    /// The container's policy: as written, else Kubernetes' default: `Always` for a reference
    /// without a tag or digest or tagged `:latest`, else `IfNotPresent`.
    pub fn of(container: &Container) -> Self {
        match container.image_pull_policy.as_deref() {
            Some("Always") => Self::Always,
            Some("Never") => Self::Never,
            Some("IfNotPresent") => Self::IfNotPresent,
            _ => match container.image.as_deref().map(tag_of) {
                Some(Tag::Latest | Tag::None) => Self::Always,
                _ => Self::IfNotPresent,
            },
        }
    }

    /// The policy's name in a pod spec.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

enum Tag {
    None,
    Latest,
    Other,
}

fn tag_of(reference: &str) -> Tag {
    if reference.contains('@') {
        return Tag::Other;
    }
    let last = reference.rsplit('/').next().unwrap_or(reference);
    match last.split_once(':') {
        None => Tag::None,
        Some((_, "latest")) => Tag::Latest,
        Some(_) => Tag::Other,
    }
}

/// The repository of `reference`: without its tag or digest.
pub fn repository_of(reference: &str) -> &str {
    let reference = reference.split('@').next().unwrap_or(reference);
    let slash = reference.rfind('/').map_or(0, |i| i + 1);
    match reference[slash..].find(':') {
        Some(colon) => &reference[..slash + colon],
        None => reference,
    }
}

/// An image present on this machine, unpacked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledImage {
    /// The reference it was pulled by.
    pub reference: String,
    /// The manifest's digest, `sha256:…`.
    pub digest: String,
    /// The unpacked layers, bottom first ([`oka_runtime_api::RootFs::Layers`]).
    pub layers: Vec<PathBuf>,
    /// Its configuration.
    pub config: ImageConfig,
    /// Its `/etc/passwd` and `/etc/group`, for the names of its `USER`.
    pub accounts: ImageAccounts,
    /// Its size in bytes (compressed layers, as the kubelet reports).
    pub size: u64,
}

impl PulledImage {
    /// `repository@digest`: what Kubernetes records as a container's `imageID`.
    pub fn image_id(&self) -> String {
        format!("{}@{}", repository_of(&self.reference), self.digest)
    }
}

/// Why a pull failed: a message a user can act on (which image, which registry, what
/// happened), shown in the sandbox's `Ready` condition and its `Failed` Event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ImagePullError {
    /// What happened.
    pub message: String,
}

/// Where images come from: what the sandbox controller pulls through. `oka serve` implements
/// it over `oka_image::ImageStore`.
pub trait ImageSource: Send + Sync + 'static {
    /// Pulls `reference` from its registry (resolving its tag again) with the credentials of
    /// `pull_secrets` (each the `.dockerconfigjson` of a `kubernetes.io/dockerconfigjson`
    /// Secret, in `imagePullSecrets` order), and returns it unpacked.
    fn pull<'a>(
        &'a self,
        reference: &'a str,
        pull_secrets: &'a [Vec<u8>],
    ) -> BoxFuture<'a, Result<PulledImage, ImagePullError>>;

    /// The image `reference` names if it is present on this machine (no network).
    fn present(&self, reference: &str) -> Option<PulledImage>;
}

/// A shared [`ImageSource`].
pub type Images = Shared<dyn ImageSource>;

/// What the sandbox's image is, for the planner.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageState {
    /// The template names no image to pull (a directory root, or none).
    NotNeeded,
    /// Present: the sandbox can be created on it.
    Ready(Arc<PulledImage>),
    /// Not present (or, under `Always`, not resolved since the sandbox was made): pull it.
    Absent,
    /// Being pulled.
    Pulling,
    /// The last pull failed at `failed_at`; the next may start at `retry_at`.
    Failed {
        /// The pull's error.
        message: String,
        /// When it failed.
        failed_at: Timestamp,
        /// When the next attempt may start.
        retry_at: Timestamp,
    },
    /// `imagePullPolicy: Never` and not present.
    NeverPresent,
    /// This node has no image store: it cannot run an image reference.
    NoSource,
}

/// What the planner decided about the image of a sandbox that must be created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullStep {
    /// `Ready=False` with this reason and message (`None`: the image is ready).
    pub waiting: Option<(&'static str, String)>,
    /// Start a pull of the reference.
    pub start: bool,
    /// Look again after this long.
    pub requeue_after: Option<Duration>,
}

/// The kubelet's rule for a sandbox that waits for its image `reference` in `state`; see the
/// [module documentation](self).
pub fn pull_step(reference: &str, state: &ImageState, now: Timestamp) -> PullStep {
    let pulling = || PullStep {
        waiting: Some((reason::CONTAINER_CREATING, format!("Pulling image \"{reference}\""))),
        start: false,
        requeue_after: None,
    };
    match state {
        ImageState::NotNeeded | ImageState::Ready(_) => {
            PullStep { waiting: None, start: false, requeue_after: None }
        }
        ImageState::Pulling => pulling(),
        ImageState::Absent => PullStep { start: true, ..pulling() },
        ImageState::Failed { retry_at, .. } if now >= *retry_at => {
            PullStep { start: true, ..pulling() }
        }
        ImageState::Failed { message, failed_at, retry_at } => {
            let until = |t: &Timestamp| {
                Duration::try_from(t.duration_since(now))
                    .unwrap_or_default()
                    .max(Duration::from_millis(1))
            };
            let shown = jiff::SignedDuration::try_from(ERR_IMAGE_PULL_SHOWN).unwrap_or_default();
            let shown_until = failed_at.checked_add(shown).unwrap_or(*failed_at);
            if now < shown_until {
                PullStep {
                    waiting: Some((reason::ERR_IMAGE_PULL, message.clone())),
                    start: false,
                    requeue_after: Some(until(&shown_until).min(until(retry_at))),
                }
            } else {
                let message = format!("Back-off pulling image \"{reference}\": {message}");
                PullStep {
                    waiting: Some((reason::IMAGE_PULL_BACK_OFF, message)),
                    start: false,
                    requeue_after: Some(until(retry_at)),
                }
            }
        }
        ImageState::NoSource => PullStep {
            waiting: Some((
                reason::ERR_IMAGE_PULL,
                format!(
                    "cannot pull image \"{reference}\": this node has no image store; name a \
                     root directory by its absolute path instead"
                ),
            )),
            start: false,
            requeue_after: None,
        },
        ImageState::NeverPresent => PullStep {
            waiting: Some((
                reason::ERR_IMAGE_NEVER_PULL,
                format!("Container image \"{reference}\" is not present with pull policy of Never"),
            )),
            start: false,
            requeue_after: Some(INITIAL_PULL_BACKOFF),
        },
    }
}

/// One reference's pull state.
#[derive(Debug, Clone)]
enum Entry {
    Pulling,
    Pulled { image: Arc<PulledImage>, at: Timestamp },
    Failed { message: String, failures: u32, failed_at: Timestamp, retry_at: Timestamp },
}

/// The pulls of this process, by reference: at most one at a time per reference, the last
/// outcome kept (a pulled image, or a failure with the time of the next attempt), and the
/// sandboxes waiting for each, woken when it ends. The executor's half of the image step.
pub struct ImagePulls {
    source: Arc<dyn ImageSource>,
    state: Mutex<PullState>,
    wake: mpsc::UnboundedSender<ObjectKey>,
    events: EventRecorder,
}

#[derive(Default)]
struct PullState {
    entries: HashMap<String, Entry>,
    waiting: HashMap<String, HashMap<ObjectKey, Sandbox>>,
}

impl std::fmt::Debug for ImagePulls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImagePulls").finish_non_exhaustive()
    }
}

impl ImagePulls {
    /// Pulls through `source`, recording Events with `events`; the stream yields the sandboxes
    /// to reconcile when a pull they wait for ends.
    pub fn new(
        source: Arc<dyn ImageSource>,
        events: EventRecorder,
    ) -> (Arc<Self>, impl Stream<Item = ObjectKey> + Send + 'static) {
        let (wake, woken) = mpsc::unbounded_channel();
        let pulls = Arc::new(Self { source, state: Mutex::default(), wake, events });
        let woken =
            stream::unfold(
                woken,
                |mut woken| async move { woken.recv().await.map(|key| (key, woken)) },
            );
        (pulls, woken)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PullState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The state of `reference` for `sandbox` under `policy` (asking the source what is present,
    /// without network). Under `Always` only a pull that ended after the sandbox was created
    /// counts, so each new sandbox resolves the tag again (sandboxes created while one pull
    /// runs share it).
    pub fn observe(&self, reference: &str, policy: PullPolicy, sandbox: &Sandbox) -> ImageState {
        let created = sandbox.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let state = self.lock();
        match state.entries.get(reference) {
            Some(Entry::Pulling) => {
                drop(state);
                self.wait_for(reference, sandbox);
                return ImageState::Pulling;
            }
            Some(Entry::Pulled { image, at }) => {
                let fresh = policy != PullPolicy::Always || created.is_none_or(|c| *at >= c);
                // A collected image is pulled again, not handed to the runtime.
                if fresh && image.layers.iter().all(|layer| layer.is_dir()) {
                    return ImageState::Ready(Arc::clone(image));
                }
            }
            Some(Entry::Failed { message, failed_at, retry_at, .. })
                if policy != PullPolicy::Never =>
            {
                return ImageState::Failed {
                    message: message.clone(),
                    failed_at: *failed_at,
                    retry_at: *retry_at,
                };
            }
            Some(Entry::Failed { .. }) | None => {}
        }
        drop(state);
        match policy {
            PullPolicy::Always => ImageState::Absent,
            PullPolicy::IfNotPresent | PullPolicy::Never => match self.source.present(reference) {
                Some(image) => {
                    let image = Arc::new(image);
                    let at = created.unwrap_or(Timestamp::UNIX_EPOCH);
                    self.lock().entries.insert(
                        reference.to_owned(),
                        Entry::Pulled { image: Arc::clone(&image), at },
                    );
                    ImageState::Ready(image)
                }
                None if policy == PullPolicy::Never => ImageState::NeverPresent,
                None => ImageState::Absent,
            },
        }
    }

    /// Starts pulling `reference` for `sandbox` with `pull_secrets` unless a pull of it runs
    /// already; `sandbox` is woken when it ends. Records `Pulling` on the sandbox. `now` is
    /// the clock's, for the backoff.
    pub fn start(
        self: &Arc<Self>,
        reference: &str,
        pull_secrets: Vec<Vec<u8>>,
        sandbox: &Sandbox,
        clock: crate::plan::Clock,
    ) {
        let mut state = self.lock();
        let failures = match state.entries.get(reference) {
            Some(Entry::Pulling) => None,
            Some(Entry::Failed { failures, .. }) => Some(*failures),
            Some(Entry::Pulled { .. }) | None => Some(0),
        };
        if failures.is_some() {
            state.entries.insert(reference.to_owned(), Entry::Pulling);
        }
        drop(state);
        self.wait_for(reference, sandbox);
        let Some(failures) = failures else { return };
        let pulls = Arc::clone(self);
        let reference = reference.to_owned();
        tokio::spawn(async move {
            let started = Instant::now();
            tracing::info!(image = %reference, "pulling image");
            let outcome = pulls.source.pull(&reference, &pull_secrets).await;
            pulls.finish(&reference, outcome, failures, started.elapsed(), clock.now());
        });
    }

    /// Records `sandbox` as waiting for the pull of `reference`, with the kubelet's `Pulling`
    /// Event the first time.
    fn wait_for(&self, reference: &str, sandbox: &Sandbox) {
        let new = self
            .lock()
            .waiting
            .entry(reference.to_owned())
            .or_default()
            .insert(ObjectKey::of(sandbox), sandbox.clone())
            .is_none();
        if new {
            let message = format!("Pulling image \"{reference}\"");
            self.events.record(sandbox, EventType::Normal, "Pulling", &message);
        }
    }

    fn finish(
        &self,
        reference: &str,
        outcome: Result<PulledImage, ImagePullError>,
        failures: u32,
        took: Duration,
        now: Timestamp,
    ) {
        let mut state = self.lock();
        let waiting = state.waiting.remove(reference).unwrap_or_default();
        let (type_, event_reason, message) = match outcome {
            Ok(image) => {
                tracing::info!(image = %reference, digest = %image.digest, ?took, "image pulled");
                let message = format!(
                    "Successfully pulled image \"{reference}\" in {:.3}s. Image size: {} bytes.",
                    took.as_secs_f64(),
                    image.size
                );
                let image = Arc::new(image);
                state.entries.insert(reference.to_owned(), Entry::Pulled { image, at: now });
                (EventType::Normal, "Pulled", message)
            }
            Err(error) => {
                let failures = failures.saturating_add(1);
                let wait = pull_backoff(failures);
                let retry_at = now
                    .checked_add(jiff::SignedDuration::try_from(wait).unwrap_or_default())
                    .unwrap_or(now);
                tracing::warn!(image = %reference, %error, retry_in = ?wait, "image pull failed");
                let message = format!("Failed to pull image \"{reference}\": {error}");
                state.entries.insert(
                    reference.to_owned(),
                    Entry::Failed { message: error.message, failures, failed_at: now, retry_at },
                );
                (EventType::Warning, "Failed", message)
            }
        };
        drop(state);
        for (key, sandbox) in waiting {
            self.events.record(&sandbox, type_, event_reason, &message);
            let _ = self.wake.send(key);
        }
    }

    /// The digests of the images pulled or found present by this process: in use by the
    /// sandboxes being made from them, whatever their status says yet.
    pub fn known_digests(&self) -> BTreeSet<String> {
        self.lock()
            .entries
            .values()
            .filter_map(|e| match e {
                Entry::Pulled { image, .. } => Some(image.digest.clone()),
                _ => None,
            })
            .collect()
    }

    /// Records the kubelet's `BackOff` Event on `sandbox`.
    pub fn record_back_off(&self, sandbox: &Sandbox, reference: &str) {
        let message = format!("Back-off pulling image \"{reference}\"");
        self.events.record(sandbox, EventType::Normal, "BackOff", &message);
    }

    /// Records the kubelet's `Pulled` Event of an image that needed no pull on `sandbox`.
    pub fn record_present(&self, sandbox: &Sandbox, reference: &str) {
        let message = format!("Container image \"{reference}\" already present on machine");
        self.events.record(sandbox, EventType::Normal, "Pulled", &message);
    }

    /// Records the kubelet's `ErrImageNeverPull` Event on `sandbox`.
    pub fn record_never_pull(&self, sandbox: &Sandbox, message: &str) {
        self.events.record(sandbox, EventType::Warning, reason::ERR_IMAGE_NEVER_PULL, message);
    }
}

/// The digests (`sha256:…`) of the images `sandboxes` record as theirs ([`IMAGE_ID`]).
pub fn recorded_digests<'a>(sandboxes: impl IntoIterator<Item = &'a Sandbox>) -> BTreeSet<String> {
    sandboxes
        .into_iter()
        .filter_map(|s| {
            let info = s.status.as_ref()?.pod_info.as_ref()?;
            let id = info.annotations.as_ref()?.get(IMAGE_ID)?;
            id.rsplit_once('@').map(|(_, digest)| digest.to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn the_default_pull_policy_is_always_for_latest_or_no_tag() {
        let policy = |image: &str, policy: Option<&str>| {
            PullPolicy::of(&Container {
                image: Some(image.into()),
                image_pull_policy: policy.map(Into::into),
                ..Default::default()
            })
        };
        assert_eq!(policy("python", None), PullPolicy::Always);
        assert_eq!(policy("python:latest", None), PullPolicy::Always);
        assert_eq!(policy("127.0.0.1:5000/app", None), PullPolicy::Always);
        assert_eq!(policy("127.0.0.1:5000/app:1", None), PullPolicy::IfNotPresent);
        assert_eq!(policy("app@sha256:abc", None), PullPolicy::IfNotPresent);
        assert_eq!(policy("python:3.12", Some("Never")), PullPolicy::Never);
        assert_eq!(policy("python", Some("IfNotPresent")), PullPolicy::IfNotPresent);
    }

    #[test]
    fn the_image_id_is_the_repository_at_the_digest() {
        assert_eq!(repository_of("127.0.0.1:5000/test/app:1"), "127.0.0.1:5000/test/app");
        assert_eq!(repository_of("127.0.0.1:5000/test/app"), "127.0.0.1:5000/test/app");
        assert_eq!(repository_of("python@sha256:ab"), "python");
        assert_eq!(repository_of("python:3@sha256:ab"), "python");
    }

    #[test]
    fn pull_backoff_doubles_from_ten_seconds_to_five_minutes() {
        let waits: Vec<u64> = (1..=7).map(|n| pull_backoff(n).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn a_failed_pull_shows_err_image_pull_then_image_pull_back_off_then_pulls_again() {
        let state = ImageState::Failed {
            message: "manifest unknown".into(),
            failed_at: ts(90),
            retry_at: ts(100),
        };
        let first = pull_step("x:1", &state, ts(90));
        assert_eq!(first.waiting, Some((reason::ERR_IMAGE_PULL, "manifest unknown".into())));
        assert!(!first.start);
        assert_eq!(first.requeue_after, Some(ERR_IMAGE_PULL_SHOWN));
        let next = pull_step("x:1", &state, ts(92));
        assert_eq!(
            next.waiting,
            Some((
                reason::IMAGE_PULL_BACK_OFF,
                "Back-off pulling image \"x:1\": manifest unknown".into()
            ))
        );
        assert_eq!(next.requeue_after, Some(Duration::from_secs(8)), "until the next attempt");
        let retry = pull_step("x:1", &state, ts(100));
        assert!(retry.start);
        assert_eq!(retry.waiting.map(|w| w.0), Some(reason::CONTAINER_CREATING));
    }

    #[test]
    fn an_absent_image_is_pulled_and_never_means_never() {
        let absent = pull_step("x:1", &ImageState::Absent, ts(0));
        assert!(absent.start);
        assert_eq!(
            absent.waiting,
            Some((reason::CONTAINER_CREATING, "Pulling image \"x:1\"".into()))
        );
        let pulling = pull_step("x:1", &ImageState::Pulling, ts(0));
        assert!(!pulling.start && pulling.waiting.is_some());
        let never = pull_step("x:1", &ImageState::NeverPresent, ts(0));
        assert!(!never.start);
        assert_eq!(never.waiting.map(|w| w.0), Some(reason::ERR_IMAGE_NEVER_PULL));
    }
}
