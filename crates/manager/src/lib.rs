//! The manager: the E2B-compatible REST API ([`api`]) and the warm-pool claim engine
//! ([`claim`]), over the [`oka_store::Store`] seam.
//!
//! # Modules
//!
//! - [`index`]: the in-memory index of Sandboxes and SandboxSets, fed by a store list+watch.
//! - [`acquire`]: one sandbox for one caller, claimed or created, its agent runtime
//!   initialised: the path the E2B create and the SandboxClaim controller share.
//! - [`claim`]: choosing and claiming an available sandbox with one compare-and-swap write.
//! - [`create`]: create-on-no-stock: a new, claimed sandbox when a pool is empty.
//! - [`id`]: short sandbox IDs.
//! - [`init`]: the [`init::SandboxInitializer`] seam where the agent runtime's `/init` goes.
//! - [`exec`]: running one command in a sandbox through its agent runtime's process API (the
//!   sandbox controller's upgrade hooks).
//! - [`quota`]: per-API-key quota: admission at create, release at kill, the embedded and
//!   Redis backends, anti-drift.
//! - [`templatebuild`]: the seam of E2B template builds: what the API hands a
//!   [`templatebuild::TemplateBuilder`] and what it answers.
//! - [`api`]: the axum router ([`api::app`]), JSON models, API keys and the error mapping.
//!
//! # Architecture invariant
//!
//! The hot path of a create is the index lookup, one store write and the initializer call; no
//! code here waits for a controller. The manager knows no runtime: it reaches sandboxes only
//! through the store and the [`init::SandboxInitializer`].

#![forbid(unsafe_code)]

pub mod acquire;
pub mod api;
pub mod claim;
pub mod create;
pub mod egress;
pub mod exec;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod id;
pub mod index;
pub mod init;
pub mod metrics;
pub mod quota;
pub mod templatebuild;

pub use acquire::{AcquireError, AcquireOptions, acquire};
pub use claim::{ClaimConfig, ClaimEngine, ClaimError, ClaimOptions, ClaimedSandbox, PoolRef};
pub use create::CreateConfig;
pub use index::Index;
pub use init::{
    EnvdConnector, EnvdInitConfig, EnvdInitializer, InitError, NoopInitializer, SandboxInitializer,
};
pub use templatebuild::{
    BuildBase, BuildFailure, BuildLog, BuildOutput, BuildRequest, BuildStep, LogEntry, LogLevel,
    TemplateBuildConfig, TemplateBuilder,
};
