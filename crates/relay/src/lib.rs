//! The node agent's relay: one authenticated TCP port per node through which the gateway and the
//! manager, running elsewhere, reach a port inside a sandbox that this node runs.
//!
//! On a cluster every machine that hosts sandboxes runs `oka node`, which runs them with a
//! [`Runtime`](oka_runtime_api::Runtime); only that process can open a socket inside a sandbox's
//! network namespace ([`Runtime::connect`](oka_runtime_api::Runtime::connect)). The
//! [`RelayServer`] listens on one port, checks a shared token, dials the asked port through the
//! runtime and then splices bytes both ways. The [`RelayClient`] does the handshake and hands
//! back a plain [`tokio::net::TcpStream`] that is, from then on, a connection to the sandbox's
//! port: the gateway's dialer and the manager's envd connector want exactly that, and the binary
//! glues them (this crate knows neither).
//!
//! # Protocol (`OKA-RELAY/1`)
//!
//! Expected flow:
//!
//! 1. The client opens a TCP connection to the node's relay port and sends one ASCII line:
//!    `OKA-RELAY/1 <token> <runtime-id> <port>\n`, four fields separated by one space each.
//!    `<token>` is the shared secret ([`RelayToken`]: 32 to 256 printable ASCII characters, no
//!    space), `<runtime-id>` the sandbox's runtime id (a [`SandboxId`](oka_runtime_api::SandboxId):
//!    letters, digits, `.`, `_`, `-`), `<port>` a decimal port, 1 to 65535. The whole line is at
//!    most [`MAX_HEADER`] bytes.
//! 2. The server checks the version, then the token (in constant time), then the id and port,
//!    and only then dials the sandbox's port through its runtime.
//! 3. The server answers one line: `OK\n` (exactly three bytes) when the sandbox's port is
//!    connected, or `ERR <code> <message>\n` and closes the connection. The codes are
//!    `port-closed` (nothing listens on the port), `gone` (no running instance of that sandbox
//!    on this node), `unauthorized` (wrong token), `bad-request` (a malformed header, an unknown
//!    version, a header not complete within the handshake timeout) and `error` (anything else,
//!    e.g. the runtime failed). The message is free text of at most [`MAX_ANSWER`] bytes in all.
//! 4. After `OK\n` the connection is a raw byte pipe to the sandbox's port in both directions,
//!    half-close included: when one side shuts down its writing half, the relay shuts down the
//!    same half towards the other side and keeps the other direction open.
//!
//! Why this shape:
//!
//! - One line of text each way is one write and one read on each side, costs nothing to parse
//!   next to a TCP connect, and can be typed into `nc` when a node misbehaves. A binary header
//!   would save a few bytes and no round trip.
//! - The success answer has a fixed length, so the client reads exactly three bytes and can
//!   never consume a byte the sandbox sent after it (a server may speak first, as SSH and SMTP
//!   do). Any other answer is an error, after which the server sends nothing more, so the client
//!   may read the rest of that line freely.
//! - The token is checked before the id and the port are even parsed, and nothing is dialed for
//!   a peer without it: an unauthenticated peer learns nothing about what runs on the node.
//! - The version comes first: a server that does not speak the client's version answers
//!   `ERR bad-request unsupported version ...` and a client that does not understand an answer
//!   reports [`RelayError::Protocol`] with what it got, rather than piping garbage.
//!
//! Guarantees: the server reads at most [`MAX_HEADER`] bytes and waits at most the handshake
//! timeout ([`ServerConfig::handshake_timeout`]) for the header (slow or oversized headers are
//! refused and never dialed); bytes a client sends after the header line, before the answer, are
//! delivered to the sandbox first; every answer but `OK` is followed by the server closing.
//!
//! Assumptions and caveats: the relay does not encrypt. It is meant for the cluster network
//! between the gateway or manager and the node agent (a NetworkPolicy limiting who reaches the
//! port, or a mesh giving mTLS, is the deployment's job), and the token is the authentication,
//! not a confidentiality measure. The token's length is not secret (the comparison returns early
//! on a different length); generated tokens are all 64 characters.
//!
//! # Layout
//!
//! - [`token`] holds [`RelayToken`], [`load_token`], [`generate_token`].
//! - [`wire`] holds the header and answer formats, pure and tested without sockets.
//! - [`server`] holds [`RelayServer`].
//! - [`client`] holds [`RelayClient`], [`RelayError`].
//! - [`metrics`] holds [`RelayMetrics`], the server's series.
//!
//! Architecture invariant: depends on nothing of ours but `oka-runtime-api`; the relay does not
//! know who calls it (gateway or manager) or which runtime it dials through.

#![forbid(unsafe_code)]

pub mod activity;
pub mod client;
pub mod metrics;
pub mod server;
pub mod token;
pub mod wire;

pub use activity::Activity;
pub use client::{ClientConfig, RelayClient, RelayError};
pub use metrics::RelayMetrics;
pub use server::{RelayServer, ServerConfig};
pub use token::{RelayToken, TokenError, generate_token, load_token};
pub use wire::{MAX_ANSWER, MAX_HEADER, VERSION};
