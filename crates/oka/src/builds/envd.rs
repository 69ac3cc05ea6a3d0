//! The build's client of the build sandbox's envd: run one command with its env, working
//! directory and user, its output handed over line by line as it comes (`process.Process/Start`,
//! Connect protocol, JSON codec), and upload one file (`POST /files`, octet-stream).
//!
//! Connections are opened through the runtime's `connect` to port 49983 of the sandbox, which
//! was never initialised, so no access token is sent.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::BodyExt as _;
use oka_runtime_api::{Runtime, SandboxId};

/// envd's port.
const ENVD_PORT: u16 = 49983;
/// The flag of Connect's end-of-stream envelope.
const END_OF_STREAM: u8 = 0x02;

/// Why envd could not run a command or take a file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EnvdError(pub String);

/// A command to run.
#[derive(Debug, Clone)]
pub struct Command<'a> {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// The user (envd's operation user).
    pub user: &'a str,
    /// Its environment, over envd's defaults.
    pub env: BTreeMap<String, String>,
    /// Its working directory.
    pub cwd: &'a str,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// Its exit code (-1 for a signal).
    pub exit_code: i32,
    /// envd's wording (`exit status 3`).
    pub status: String,
}

/// Opens an HTTP/1.1 connection to the sandbox's envd, trying again while it starts.
async fn connect<B>(
    runtime: &dyn Runtime,
    id: &SandboxId,
) -> Result<hyper::client::conn::http1::SendRequest<B>, EnvdError>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut last = String::new();
    for _ in 0..50 {
        match runtime.connect(id, ENVD_PORT).await {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                let (sender, connection) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                        .await
                        .map_err(|e| EnvdError(format!("handshake with envd: {e}")))?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                return Ok(sender);
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(EnvdError(format!("cannot reach the build sandbox's envd: {last}")))
}

fn basic(user: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:")))
}

/// Runs `command`, calling `output` with each complete line of stdout and stderr as it comes,
/// until it ends or `timeout` passes (envd kills it then).
pub async fn run(
    runtime: &dyn Runtime,
    id: &SandboxId,
    command: &Command<'_>,
    timeout: Duration,
    output: &mut (dyn FnMut(&str) + Send),
) -> Result<Ended, EnvdError> {
    let Some((cmd, args)) = command.argv.split_first() else {
        return Err(EnvdError("the command is empty".into()));
    };
    let mut sender = connect::<http_body_util::Full<Bytes>>(runtime, id).await?;
    let message = serde_json::json!({
        "process": { "cmd": cmd, "args": args, "envs": command.env, "cwd": command.cwd },
        "stdin": false,
    });
    let payload = serde_json::to_vec(&message).map_err(|e| EnvdError(e.to_string()))?;
    let mut body = Vec::with_capacity(payload.len() + 5);
    body.push(0u8);
    body.extend_from_slice(&u32::try_from(payload.len()).unwrap_or(u32::MAX).to_be_bytes());
    body.extend_from_slice(&payload);
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri("/process.Process/Start")
        .header(http::header::HOST, format!("localhost:{ENVD_PORT}"))
        .header(http::header::CONTENT_TYPE, "application/connect+json")
        .header("connect-protocol-version", "1")
        .header("connect-timeout-ms", timeout.as_millis().to_string())
        .header(http::header::AUTHORIZATION, basic(command.user))
        .body(http_body_util::Full::new(Bytes::from(body)))
        .map_err(|e| EnvdError(format!("request: {e}")))?;
    let response =
        sender.send_request(request).await.map_err(|e| EnvdError(format!("request: {e}")))?;
    let status = response.status();
    let mut body = response.into_body();
    if status != http::StatusCode::OK {
        let text = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        return Err(EnvdError(format!(
            "envd answered {status}: {}",
            String::from_utf8_lossy(&text).trim()
        )));
    }
    let mut buffer = Vec::new();
    let mut pending = [Vec::new(), Vec::new()];
    let flush = |pending: &mut Vec<u8>, all: bool, output: &mut (dyn FnMut(&str) + Send)| {
        while let Some(at) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=at).collect();
            output(String::from_utf8_lossy(&line).trim_end());
        }
        if all && !pending.is_empty() {
            output(String::from_utf8_lossy(pending).trim_end());
            pending.clear();
        }
    };
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| EnvdError(format!("response: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        buffer.extend_from_slice(&data);
        while let Some(header) = buffer.get(..5) {
            let flags = header[0];
            let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            if buffer.len() < 5 + length {
                break;
            }
            let payload: Vec<u8> = buffer.drain(..5 + length).skip(5).collect();
            let json: serde_json::Value = serde_json::from_slice(&payload)
                .map_err(|e| EnvdError(format!("an envelope that is not JSON: {e}")))?;
            if flags & END_OF_STREAM != 0 {
                for p in &mut pending {
                    flush(p, true, output);
                }
                let code = json.pointer("/error/code").and_then(|c| c.as_str());
                return Err(match code {
                    Some("deadline_exceeded") => EnvdError(format!(
                        "the command ran longer than {} s and was killed",
                        timeout.as_secs()
                    )),
                    Some(code) => EnvdError(format!(
                        "envd refused the command: {code}: {}",
                        json.pointer("/error/message").and_then(|m| m.as_str()).unwrap_or_default()
                    )),
                    None => EnvdError("the process stream ended without an end event".into()),
                });
            }
            let Some(event) = json.get("event") else { continue };
            if let Some(data) = event.get("data") {
                for (i, name) in ["stdout", "stderr"].into_iter().enumerate() {
                    if let Some(chunk) = data
                        .get(name)
                        .and_then(|v| v.as_str())
                        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                    {
                        pending[i].extend_from_slice(&chunk);
                        flush(&mut pending[i], false, output);
                    }
                }
            }
            if let Some(end) = event.get("end") {
                for p in &mut pending {
                    flush(p, true, output);
                }
                // ProtoJSON omits defaults: no `exitCode` is 0.
                let exit_code = end
                    .get("exitCode")
                    .and_then(serde_json::Value::as_i64)
                    .and_then(|c| i32::try_from(c).ok())
                    .unwrap_or(0);
                let status =
                    end.get("status").and_then(|s| s.as_str()).unwrap_or_default().to_string();
                return Ok(Ended { exit_code, status });
            }
        }
    }
    Err(EnvdError("the process stream ended without an end event".into()))
}

/// Writes the host file `source` to `path` in the sandbox, owned by root, streamed.
pub async fn upload(
    runtime: &dyn Runtime,
    id: &SandboxId,
    path: &str,
    source: &std::path::Path,
) -> Result<(), EnvdError> {
    use futures::StreamExt as _;
    use tokio::io::AsyncReadExt as _;
    let file = tokio::fs::File::open(source)
        .await
        .map_err(|e| EnvdError(format!("{}: {e}", source.display())))?;
    let chunks = futures::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let mut buffer = vec![0u8; 256 * 1024];
        match file.read(&mut buffer).await {
            Ok(0) => None,
            Ok(n) => {
                buffer.truncate(n);
                Some((Ok(hyper::body::Frame::data(Bytes::from(buffer))), Some(file)))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    let body = http_body_util::StreamBody::new(chunks.boxed());
    let mut sender = connect(runtime, id).await?;
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("path", path)
        .append_pair("username", "root")
        .finish();
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!("/files?{query}"))
        .header(http::header::HOST, format!("localhost:{ENVD_PORT}"))
        .header(http::header::CONTENT_TYPE, "application/octet-stream")
        .header(http::header::AUTHORIZATION, basic("root"))
        .body(body)
        .map_err(|e| EnvdError(format!("request: {e}")))?;
    let response =
        sender.send_request(request).await.map_err(|e| EnvdError(format!("upload: {e}")))?;
    let status = response.status();
    let text = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    if !status.is_success() {
        return Err(EnvdError(format!(
            "envd refused the upload of {path}: {status}: {}",
            String::from_utf8_lossy(&text).trim()
        )));
    }
    Ok(())
}
