//! oka-interpreter: an `e2b-code-interpreter`-compatible server for port 49999, backed by real
//! Jupyter kernels.
//!
//! - [`zmtp`]: a minimal ZMTP 3.0 (ZeroMQ wire protocol) client, DEALER and SUB, NULL mechanism;
//! - [`wire`]: Jupyter messaging v5.3 (framing, HMAC-SHA256 signatures, headers);
//! - [`kernel`]: kernelspec discovery, starting kernels, executing code, interrupts;
//! - [`server`]: the HTTP API the SDK speaks (`/execute` NDJSON, `/contexts`, `/health`).
//!
//! **Architecture Invariant:** only this crate knows the Jupyter protocol and the
//! code-interpreter JSON.

pub mod kernel;
pub mod server;
pub mod wire;
pub mod zmtp;
