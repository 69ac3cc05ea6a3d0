//! The election's error type.

use oka_store::StoreError;

use crate::ConfigError;

/// Why an election could not run.
///
/// Store failures while acquiring or renewing are not errors: they are retried (a leader that
/// cannot renew loses leadership, which is an [`crate::Outcome`]). Only a request the store
/// will never accept ends the election.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElectionError {
    /// The configuration breaks a timing rule; nothing was written.
    #[error("invalid leader election config: {0}")]
    Config(#[from] ConfigError),
    /// The store refused the Lease as malformed ([`StoreError::Invalid`]): retrying would
    /// not help.
    #[error("the store refuses the lease: {0}")]
    Store(#[source] StoreError),
}
