//! The store's error type: one variant per failure a caller can act on.

/// Result of a store operation.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The object does not exist (HTTP 404).
    #[error("{kind} {namespace}/{name} not found")]
    NotFound {
        /// The object's kind.
        kind: String,
        /// The object's namespace.
        namespace: String,
        /// The object's name.
        name: String,
    },
    /// An object with this name already exists (HTTP 409).
    #[error("{kind} {namespace}/{name} already exists")]
    AlreadyExists {
        /// The object's kind.
        kind: String,
        /// The object's namespace.
        namespace: String,
        /// The object's name.
        name: String,
    },
    /// A precondition failed: the caller's resourceVersion or uid is stale (HTTP 409).
    /// Read the object again and retry.
    #[error("conflict on {kind} {namespace}/{name}: {message}")]
    Conflict {
        /// The object's kind.
        kind: String,
        /// The object's namespace.
        namespace: String,
        /// The object's name.
        name: String,
        /// What did not match.
        message: String,
    },
    /// The requested resourceVersion is older than the retained history (HTTP 410):
    /// list again and watch from the list's resourceVersion.
    #[error("resource version {requested} is too old (oldest retained is {oldest}): relist")]
    Gone {
        /// The resourceVersion the caller asked for.
        requested: String,
        /// The oldest resourceVersion a watch can start from now.
        oldest: String,
    },
    /// The request is malformed: bad selector, missing name, namespace mismatch (HTTP 422).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The store is shutting down or its backend cannot be reached; retry later (HTTP 503).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The backend failed in a way the caller cannot fix (HTTP 500).
    #[error("storage failure: {0}")]
    Internal(String),
}

impl StoreError {
    /// The HTTP status a Kubernetes API server answers for this error.
    pub fn http_status(&self) -> u16 {
        match self {
            StoreError::NotFound { .. } => 404,
            StoreError::AlreadyExists { .. } | StoreError::Conflict { .. } => 409,
            StoreError::Gone { .. } => 410,
            StoreError::Invalid(_) => 422,
            StoreError::Unavailable(_) => 503,
            StoreError::Internal(_) => 500,
        }
    }

    /// Whether doing the same thing again later may succeed without changing the request:
    /// conflicts (after a re-read), unavailability and internal failures.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Conflict { .. } | StoreError::Unavailable(_) | StoreError::Internal(_)
        )
    }

    /// True for [`StoreError::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::NotFound { .. })
    }

    /// True for [`StoreError::Conflict`].
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict { .. })
    }
}
