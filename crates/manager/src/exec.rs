//! A small client of envd's process API: run one command in a sandbox and wait for its end.
//!
//! [`run_command`] is `process.Process/Start` (e2b-protocol.md §3) over HTTP/1.1 with the
//! Connect protocol and the JSON codec, on a connection an [`EnvdConnector`] opens to port
//! [`ENVD_PORT`] of the sandbox. It is what the sandbox controller's upgrade hooks
//! (`spec.lifecycle.preUpgrade` / `postUpgrade`) run through in `oka serve`.
//!
//! # Expected flow
//!
//! 1. Connect, and send one request envelope `{"process":{"cmd","args"},"stdin":false}` with
//!    `Content-Type: application/connect+json`, `Connect-Timeout-Ms` set to the timeout (envd
//!    kills the process when it runs longer), `Authorization: Basic` naming the user, and
//!    `X-Access-Token` when the sandbox has an access token (annotation
//!    `agents.kruise.io/runtime-access-token`).
//! 2. Read the answer's envelopes: `start` (the pid), `data` (stdout/stderr, base64), keepalives,
//!    then `end` (exit code, status): the outcome. An end-of-stream envelope carrying an error
//!    (`deadline_exceeded`: the command ran past its timeout and was killed), or any other
//!    answer than 200, is an [`ExecError`].
//!
//! # Guarantees
//!
//! - Bounded time: the whole call (connect included) takes at most the timeout plus
//!   [`END_GRACE`]; the connection is closed when it returns.
//! - Bounded memory: at most [`ExecOptions::output_limit`] bytes of each of stdout and stderr
//!   are kept, the last ones (the end of the output says most about a failure).

use std::time::Duration;

use base64::Engine as _;
use http_body_util::BodyExt as _;
use oka_api::Sandbox;

use crate::init::{ENVD_PORT, EnvdConnector};

/// How long after the command's timeout the call waits for envd's end event (envd kills the
/// process at the timeout and then reports it) before giving up.
pub const END_GRACE: Duration = Duration::from_secs(5);

/// The default of [`ExecOptions::output_limit`]: 64 KiB.
pub const DEFAULT_OUTPUT_LIMIT: usize = 64 * 1024;

/// Why a command could not be run, or its end not seen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ExecError(pub String);

/// How to run a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOptions {
    /// The user the command runs as (envd's operation user, sent with Basic auth).
    pub user: String,
    /// The most the command may run; envd kills it then.
    pub timeout: Duration,
    /// The most bytes kept of each of stdout and stderr (the last ones).
    pub output_limit: usize,
}

impl ExecOptions {
    /// As `root`, for at most `timeout`, keeping [`DEFAULT_OUTPUT_LIMIT`] bytes of output.
    pub fn root(timeout: Duration) -> Self {
        Self { user: "root".to_owned(), timeout, output_limit: DEFAULT_OUTPUT_LIMIT }
    }
}

/// What a command ended with, as envd's end event says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecOutcome {
    /// Its process id in the sandbox, from the start event.
    pub pid: Option<u32>,
    /// The exit code (-1 when a signal ended it).
    pub exit_code: i32,
    /// Whether it exited (rather than being killed by a signal).
    pub exited: bool,
    /// envd's wording, e.g. `exit status 3`, `signal: killed`.
    pub status: String,
    /// envd's error, if it reported one.
    pub error: Option<String>,
    /// The last [`ExecOptions::output_limit`] bytes of stdout.
    pub stdout: Vec<u8>,
    /// The last [`ExecOptions::output_limit`] bytes of stderr.
    pub stderr: Vec<u8>,
}

/// Runs `command[0]` with `command[1..]` as its arguments in `sandbox` through its envd (see the
/// [module documentation](self)) and returns its outcome once it ended.
///
/// # Errors
///
/// [`ExecError`] when `command` is empty, envd cannot be reached, refuses the call, ends the
/// stream without an end event, or does not report the end within the timeout plus
/// [`END_GRACE`].
pub async fn run_command<C: EnvdConnector + ?Sized>(
    connector: &C,
    sandbox: &Sandbox,
    command: &[String],
    options: &ExecOptions,
) -> Result<ExecOutcome, ExecError> {
    let Some((cmd, args)) = command.split_first() else {
        return Err(ExecError("the command is empty".to_owned()));
    };
    let within = options.timeout.saturating_add(END_GRACE);
    match tokio::time::timeout(within, start(connector, sandbox, cmd, args, options)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(ExecError(format!(
            "no end of the command within {} s",
            options.timeout.as_secs_f64()
        ))),
    }
}

/// Aborts the task driving a connection when dropped.
struct Driver(tokio::task::JoinHandle<()>);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn start<C: EnvdConnector + ?Sized>(
    connector: &C,
    sandbox: &Sandbox,
    cmd: &str,
    args: &[String],
    options: &ExecOptions,
) -> Result<ExecOutcome, ExecError> {
    let stream = connector
        .connect(sandbox, ENVD_PORT)
        .await
        .map_err(|e| ExecError(format!("cannot connect to the agent runtime: {e}")))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| ExecError(format!("handshake: {e}")))?;
    let _driver = Driver(tokio::spawn(async move {
        let _ = connection.await;
    }));
    let message = serde_json::json!({
        "process": { "cmd": cmd, "args": args },
        "stdin": false,
    });
    let payload = serde_json::to_vec(&message).map_err(|e| ExecError(e.to_string()))?;
    let mut body = Vec::with_capacity(payload.len() + 5);
    body.push(0u8);
    body.extend_from_slice(&u32::try_from(payload.len()).unwrap_or(u32::MAX).to_be_bytes());
    body.extend_from_slice(&payload);
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{}:", options.user));
    let mut request = http::Request::builder()
        .method(http::Method::POST)
        .uri("/process.Process/Start")
        .header(http::header::HOST, format!("localhost:{ENVD_PORT}"))
        .header(http::header::CONTENT_TYPE, "application/connect+json")
        .header("connect-protocol-version", "1")
        .header("connect-timeout-ms", options.timeout.as_millis().to_string())
        .header("connect-content-encoding", "identity")
        .header("connect-accept-encoding", "identity")
        .header(http::header::AUTHORIZATION, format!("Basic {basic}"));
    if let Some(token) = access_token(sandbox) {
        request = request.header("x-access-token", token);
    }
    let request = request
        .body(http_body_util::Full::new(axum::body::Bytes::from(body)))
        .map_err(|e| ExecError(format!("request: {e}")))?;
    let response =
        sender.send_request(request).await.map_err(|e| ExecError(format!("request: {e}")))?;
    let status = response.status();
    let mut body = response.into_body();
    if status != http::StatusCode::OK {
        let text = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        return Err(ExecError(format!("the agent runtime answered {status}: {}", text.trim())));
    }
    let mut reader = Envelopes::default();
    let mut outcome = ExecOutcome::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ExecError(format!("response: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        reader.buffer.extend_from_slice(&data);
        while let Some((flags, payload)) = reader.next() {
            let json: serde_json::Value = serde_json::from_slice(&payload)
                .map_err(|e| ExecError(format!("an envelope that is not JSON: {e}")))?;
            if flags & END_OF_STREAM != 0 {
                let code = json.pointer("/error/code").and_then(|c| c.as_str());
                if code == Some("deadline_exceeded") {
                    return Err(ExecError(format!(
                        "the command ran longer than its timeout of {} s and was killed",
                        options.timeout.as_secs_f64()
                    )));
                }
                return Err(match json.get("error") {
                    Some(error) => ExecError(format!(
                        "the agent runtime refused the command: {}: {}",
                        error.get("code").and_then(|c| c.as_str()).unwrap_or("unknown"),
                        error.get("message").and_then(|m| m.as_str()).unwrap_or_default()
                    )),
                    None => ExecError("the process stream ended without an end event".to_owned()),
                });
            }
            if apply_event(&mut outcome, &json, options.output_limit) {
                return Ok(outcome);
            }
        }
    }
    Err(ExecError("the process stream ended without an end event".to_owned()))
}

/// The flag of Connect's end-of-stream envelope.
const END_OF_STREAM: u8 = 0x02;

/// Connect envelopes (`flags:u8 | length:u32be | payload`) cut out of the bytes read so far.
#[derive(Default)]
struct Envelopes {
    buffer: Vec<u8>,
}

impl Envelopes {
    /// The next complete envelope, if the buffer holds one.
    fn next(&mut self) -> Option<(u8, Vec<u8>)> {
        let header: [u8; 5] = self.buffer.get(..5)?.try_into().ok()?;
        let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
        let end = 5usize.checked_add(usize::try_from(length).ok()?)?;
        if self.buffer.len() < end {
            return None;
        }
        let payload = self.buffer[5..end].to_vec();
        self.buffer.drain(..end);
        Some((header[0], payload))
    }
}

/// Folds one `StartResponse` (`{"event":{...}}`) into `outcome`; true at the end event.
fn apply_event(outcome: &mut ExecOutcome, message: &serde_json::Value, limit: usize) -> bool {
    let Some(event) = message.get("event") else { return false };
    if let Some(pid) = event.pointer("/start/pid").and_then(serde_json::Value::as_u64) {
        outcome.pid = u32::try_from(pid).ok();
    }
    if let Some(data) = event.get("data") {
        for (name, keep) in [("stdout", &mut outcome.stdout), ("stderr", &mut outcome.stderr)] {
            let chunk = data.get(name).and_then(|v| v.as_str()).and_then(|b64| {
                base64::engine::general_purpose::STANDARD.decode(b64.as_bytes()).ok()
            });
            if let Some(chunk) = chunk {
                keep.extend_from_slice(&chunk);
                if keep.len() > limit {
                    let cut = keep.len() - limit;
                    keep.drain(..cut);
                }
            }
        }
    }
    let Some(end) = event.get("end") else { return false };
    // ProtoJSON omits defaults: no `exitCode` is 0, no `exited` is false.
    outcome.exit_code = end
        .get("exitCode")
        .or_else(|| end.get("exit_code"))
        .and_then(serde_json::Value::as_i64)
        .and_then(|c| i32::try_from(c).ok())
        .unwrap_or(0);
    outcome.exited = end.get("exited").and_then(serde_json::Value::as_bool).unwrap_or(false);
    outcome.status = end.get("status").and_then(|s| s.as_str()).unwrap_or_default().to_owned();
    outcome.error = end.get("error").and_then(|e| e.as_str()).map(str::to_owned);
    true
}

/// The sandbox's access token (annotation `agents.kruise.io/runtime-access-token`), if any.
fn access_token(sandbox: &Sandbox) -> Option<&str> {
    sandbox
        .metadata
        .annotations
        .as_ref()?
        .get(oka_api::annotations::RUNTIME_ACCESS_TOKEN)
        .map(String::as_str)
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_are_cut_when_complete() {
        let mut reader = Envelopes::default();
        reader.buffer.extend_from_slice(&[0, 0, 0, 0, 2, b'{']);
        assert!(reader.next().is_none());
        reader.buffer.extend_from_slice(b"}\x02\x00\x00\x00\x02{}");
        assert_eq!(reader.next(), Some((0, b"{}".to_vec())));
        assert_eq!(reader.next(), Some((2, b"{}".to_vec())));
        assert!(reader.next().is_none());
    }

    #[test]
    fn events_fold_into_the_outcome_with_bounded_output() {
        let mut outcome = ExecOutcome::default();
        let start = serde_json::json!({"event": {"start": {"pid": 42}}});
        assert!(!apply_event(&mut outcome, &start, 4));
        // "abcdef" then "gh": only the last 4 bytes stay.
        for chunk in ["YWJjZGVm", "Z2g="] {
            let data = serde_json::json!({"event": {"data": {"stdout": chunk}}});
            assert!(!apply_event(&mut outcome, &data, 4));
        }
        let end = serde_json::json!({"event": {"end": {"exitCode": 3, "exited": true, "status": "exit status 3"}}});
        assert!(apply_event(&mut outcome, &end, 4));
        assert_eq!(outcome.pid, Some(42));
        assert_eq!(outcome.stdout, b"efgh");
        assert_eq!((outcome.exit_code, outcome.exited), (3, true));
        // A zero exit code is omitted.
        let mut zero = ExecOutcome::default();
        let end =
            serde_json::json!({"event": {"end": {"exited": true, "status": "exit status 0"}}});
        assert!(apply_event(&mut zero, &end, 4));
        assert_eq!(zero.exit_code, 0);
    }
}
