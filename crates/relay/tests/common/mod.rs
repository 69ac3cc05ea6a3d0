//! What the relay's tests and bench stand on: a test [`Runtime`] whose `connect` dials loopback
//! listeners standing in for sandbox ports, those listeners, and a relay server on loopback.
//!
//! The relay is the subject: the runtime here only maps (sandbox, port) to a loopback address and
//! counts its dials, so a test can say "nothing was dialed".
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use oka_relay::{ClientConfig, RelayClient, RelayServer, RelayToken, ServerConfig};
use oka_runtime_api::{
    Operation, Runtime, RuntimeError, SandboxId, SandboxSpec, SandboxState, SandboxStatus,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The token the test relays share.
pub fn token() -> RelayToken {
    RelayToken::new("test-token-0123456789abcdef-0123456789").unwrap()
}

pub fn id(id: &str) -> SandboxId {
    SandboxId::new(id).unwrap()
}

/// A runtime of loopback listeners: each running sandbox maps ports to addresses.
#[derive(Default)]
pub struct Fleet {
    /// `None`: the sandbox exists but is stopped.
    sandboxes: Mutex<HashMap<String, Option<HashMap<u16, SocketAddr>>>>,
    dials: AtomicUsize,
}

impl Fleet {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Sandbox `id` runs and its `port` is served at `addr`.
    pub fn serve(&self, id: &str, port: u16, addr: SocketAddr) {
        let mut sandboxes = self.sandboxes.lock().unwrap();
        sandboxes.entry(id.into()).or_insert_with(|| Some(HashMap::new()));
        if let Some(Some(ports)) = sandboxes.get_mut(id) {
            ports.insert(port, addr);
        }
    }

    /// Sandbox `id` exists without processes.
    pub fn stop(&self, id: &str) {
        self.sandboxes.lock().unwrap().insert(id.into(), None);
    }

    /// How many times `connect` was called.
    pub fn dials(&self) -> usize {
        self.dials.load(Ordering::SeqCst)
    }
}

fn unsupported(operation: Operation) -> RuntimeError {
    RuntimeError::Unsupported { operation, reason: "test runtime".into() }
}

#[async_trait]
impl Runtime for Fleet {
    async fn ensure(&self, _: &SandboxSpec) -> Result<SandboxStatus, RuntimeError> {
        Err(unsupported(Operation::Ensure))
    }
    async fn inspect(&self, id: &SandboxId) -> Result<SandboxStatus, RuntimeError> {
        Ok(SandboxStatus::gone(id.clone()))
    }
    async fn pause(&self, _: &SandboxId) -> Result<(), RuntimeError> {
        Err(unsupported(Operation::Pause))
    }
    async fn resume(&self, _: &SandboxId) -> Result<(), RuntimeError> {
        Err(unsupported(Operation::Resume))
    }
    async fn hibernate(&self, _: &SandboxId) -> Result<(), RuntimeError> {
        Err(unsupported(Operation::Hibernate))
    }
    async fn restore(&self, _: &SandboxId) -> Result<SandboxStatus, RuntimeError> {
        Err(unsupported(Operation::Restore))
    }
    async fn stop(&self, _: &SandboxId, _: Duration) -> Result<(), RuntimeError> {
        Err(unsupported(Operation::Stop))
    }
    async fn delete(&self, _: &SandboxId) -> Result<(), RuntimeError> {
        Err(unsupported(Operation::Delete))
    }
    async fn list(&self) -> Result<Vec<SandboxStatus>, RuntimeError> {
        Ok(Vec::new())
    }
    async fn connect(&self, id: &SandboxId, port: u16) -> Result<TcpStream, RuntimeError> {
        self.dials.fetch_add(1, Ordering::SeqCst);
        let addr = match self.sandboxes.lock().unwrap().get(id.as_str()) {
            None => return Err(RuntimeError::NotFound(id.clone())),
            Some(None) => {
                return Err(RuntimeError::InvalidState {
                    id: id.clone(),
                    state: SandboxState::Stopped,
                    operation: Operation::Connect,
                });
            }
            Some(Some(ports)) => ports.get(&port).copied(),
        };
        let closed = || RuntimeError::PortClosed { id: id.clone(), port };
        let addr = addr.ok_or_else(closed)?;
        TcpStream::connect(addr).await.map_err(|e| {
            if e.kind() == std::io::ErrorKind::ConnectionRefused {
                closed()
            } else {
                RuntimeError::backend(e)
            }
        })
    }
}

/// A loopback address nothing listens on (bound, then released).
pub async fn closed_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// A sandbox service: sends `greeting` first (if any), echoes everything, and after the peer's
/// end of file sends `<eof>` and closes, so a test sees that a half-close went through and the
/// other direction stayed open.
pub async fn echo(greeting: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = stream.set_nodelay(true);
                let (mut r, mut w) = stream.into_split();
                w.write_all(greeting).await?;
                tokio::io::copy(&mut r, &mut w).await?;
                w.write_all(b"<eof>").await?;
                w.shutdown().await?;
                Ok::<_, std::io::Error>(())
            });
        }
    });
    addr
}

/// A relay server on loopback.
pub struct Relay {
    pub addr: SocketAddr,
    pub server: RelayServer,
    stop: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<()>,
}

impl Relay {
    pub async fn start(fleet: Arc<Fleet>, config: ServerConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = RelayServer::new(fleet, token(), config);
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = server.clone();
        let task = tokio::spawn(async move {
            serving
                .serve(listener, async move {
                    let _ = stopped.await;
                })
                .await;
        });
        Self { addr, server, stop: Some(stop), task }
    }

    /// Triggers the server's shutdown.
    pub fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub fn client() -> RelayClient {
    RelayClient::new(token(), ClientConfig::default())
}

/// One small request and its echo.
pub async fn ping(stream: &mut TcpStream, message: &[u8]) {
    stream.write_all(message).await.unwrap();
    let mut back = vec![0u8; message.len()];
    stream.read_exact(&mut back).await.unwrap();
    assert_eq!(back, message);
}
