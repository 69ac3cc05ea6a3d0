//! The seam where a claimed sandbox's agent runtime is initialised.
//!
//! After the claim write and before the `201`, the create handler calls
//! [`SandboxInitializer::init`] with the sandbox, the caller's `envVars` and the fresh access
//! token. When the agent runtime lands, its implementation is the reference's
//! `POST http://<sandbox>:49983/init {"envVars", "accessToken"}` (short per-attempt timeout,
//! retried), reached through the node runtime's port connector; then the gateway route is
//! published. Until then [`NoopInitializer`] does nothing, and the access token and env vars
//! are only recorded on the sandbox (`agents.kruise.io/init-runtime-request`).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use oka_api::Sandbox;

/// Why initialising a sandbox failed; the create fails with 500 and the sandbox is deleted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot initialise the sandbox's agent runtime: {0}")]
pub struct InitError(pub String);

/// Initialises the agent runtime of a freshly claimed sandbox.
pub trait SandboxInitializer: Send + Sync + 'static {
    /// Sends `env_vars` and `access_token` to the sandbox's agent runtime and returns once it
    /// answered. Must be idempotent: a retried create may call it again.
    fn init<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        env_vars: &'a BTreeMap<String, String>,
        access_token: &'a str,
    ) -> BoxFuture<'a, Result<(), InitError>>;
}

/// The initializer used until the agent runtime lands: does nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopInitializer;

impl SandboxInitializer for NoopInitializer {
    fn init<'a>(
        &'a self,
        _sandbox: &'a Sandbox,
        _env_vars: &'a BTreeMap<String, String>,
        _access_token: &'a str,
    ) -> BoxFuture<'a, Result<(), InitError>> {
        Box::pin(async { Ok(()) })
    }
}
