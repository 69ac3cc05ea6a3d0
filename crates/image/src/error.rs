//! The crate's errors: `PullError`, what a pull can end in, each variant a case a caller acts
//! on (its `Display` names the image, the registry and what happened, and `retryable` says
//! whether trying again can help); `ImageError`, the store's own failures (open, GC, config).

/// Why a pull failed. Cloneable: concurrent pulls of one image share one outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PullError {
    /// The reference is not an image reference (Docker's message).
    #[error("invalid image reference {reference:?}: {message}")]
    InvalidReference {
        /// The reference as given.
        reference: String,
        /// Docker's words for what is wrong.
        message: String,
    },
    /// The registry has no such repository, tag or digest.
    #[error("image {reference} not found in registry {registry}: {message}")]
    NotFound {
        /// The normalised reference.
        reference: String,
        /// The registry host that answered.
        registry: String,
        /// What the registry said.
        message: String,
    },
    /// The registry refused the credentials, or wants some and none were given.
    #[error("pulling {reference} from {registry} is unauthorized: {message}")]
    Unauthorized {
        /// The normalised reference.
        reference: String,
        /// The registry host.
        registry: String,
        /// What happened (no credentials, refused credentials, the token service's answer).
        message: String,
    },
    /// Content did not match its digest: the registry (or something between) served other bytes.
    #[error(
        "image {reference}: {what} from {registry} does not match its digest: expected {expected}, got {actual}"
    )]
    DigestMismatch {
        /// The normalised reference.
        reference: String,
        /// The registry host.
        registry: String,
        /// Which content (`manifest`, `config`, `layer sha256:…`).
        what: String,
        /// The digest the reference or manifest names.
        expected: String,
        /// The digest of the bytes received.
        actual: String,
    },
    /// The registry could not be reached, or kept failing (5xx, reset connections, timeouts).
    #[error("registry {registry} is unreachable while pulling {reference}: {message}")]
    Unreachable {
        /// The normalised reference.
        reference: String,
        /// The registry host (the last one tried).
        registry: String,
        /// The last failure.
        message: String,
    },
    /// A manifest, config or layer of a kind this store cannot use.
    #[error("image {reference}: unsupported {what}: {media_type}")]
    UnsupportedMediaType {
        /// The normalised reference.
        reference: String,
        /// Which content.
        what: String,
        /// Its media type (or what was detected).
        media_type: String,
    },
    /// An index without a manifest for this machine's platform.
    #[error("image {reference} has no manifest for {wanted} (it has: {available})")]
    NoMatchingPlatform {
        /// The normalised reference.
        reference: String,
        /// `linux/amd64` and the like.
        wanted: String,
        /// The platforms the index lists.
        available: String,
    },
    /// The registry answered something that is not valid for its API.
    #[error("image {reference}: registry {registry} sent an invalid {what}: {message}")]
    InvalidResponse {
        /// The normalised reference.
        reference: String,
        /// The registry host.
        registry: String,
        /// Which content.
        what: String,
        /// What is wrong with it.
        message: String,
    },
    /// A layer could not be unpacked (a path escaping the layer, a broken archive, a disk error).
    #[error("image {reference}: unpacking layer {layer} failed: {message}")]
    UnpackFailed {
        /// The normalised reference.
        reference: String,
        /// The layer's digest.
        layer: String,
        /// What went wrong.
        message: String,
    },
    /// The store's own files could not be written or read.
    #[error("image {reference}: image store error: {message}")]
    Store {
        /// The normalised reference.
        reference: String,
        /// What went wrong.
        message: String,
    },
}

impl PullError {
    /// Whether pulling again later can succeed without anything else changing: a registry
    /// that was unreachable, a transfer that was corrupted on the way, a disk that filled up.
    /// A reference that is invalid or not found, refused credentials, a platform or media type
    /// the image lacks, need a change first (the kubelet still backs off and tries again).
    pub fn retryable(&self) -> bool {
        match self {
            PullError::Unreachable { .. }
            | PullError::DigestMismatch { .. }
            | PullError::Store { .. }
            | PullError::UnpackFailed { .. } => true,
            PullError::InvalidReference { .. }
            | PullError::NotFound { .. }
            | PullError::Unauthorized { .. }
            | PullError::UnsupportedMediaType { .. }
            | PullError::NoMatchingPlatform { .. }
            | PullError::InvalidResponse { .. } => false,
        }
    }

    /// A short machine-friendly reason (`NotFound`, `Unauthorized`, ...) for Events and conditions.
    pub fn reason(&self) -> &'static str {
        match self {
            PullError::InvalidReference { .. } => "InvalidImageName",
            PullError::NotFound { .. } => "NotFound",
            PullError::Unauthorized { .. } => "Unauthorized",
            PullError::DigestMismatch { .. } => "DigestMismatch",
            PullError::Unreachable { .. } => "Unreachable",
            PullError::UnsupportedMediaType { .. } => "UnsupportedMediaType",
            PullError::NoMatchingPlatform { .. } => "NoMatchingPlatform",
            PullError::InvalidResponse { .. } => "InvalidResponse",
            PullError::UnpackFailed { .. } => "UnpackFailed",
            PullError::Store { .. } => "StoreError",
        }
    }
}

/// The store's own failures (opening it, reading its records, GC), and bad credentials files.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A filesystem operation on the store failed.
    #[error("image store {path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP client could not be built (no usable TLS roots).
    #[error("image store: TLS setup failed: {0}")]
    Tls(String),
    /// A locally built image that cannot be recorded as asked.
    #[error("locally built image {reference}: {message}")]
    Import {
        /// The reference as given.
        reference: String,
        /// What is wrong.
        message: String,
    },
    /// A `.dockerconfigjson` that cannot be read.
    #[error("invalid docker config json: {0}")]
    InvalidDockerConfig(String),
}

impl ImageError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> ImageError {
        ImageError::Io { path: path.display().to_string(), source }
    }
}
