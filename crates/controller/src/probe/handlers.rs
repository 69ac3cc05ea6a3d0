//! The probe handlers: what one attempt of a `tcpSocket`, `httpGet` or `activity` probe does.
//!
//! A [`Check`] is made from a probe when the runner (re)reads its sandbox, so an attempt only
//! connects and, for `httpGet`, writes a request head built once. Outcomes follow kubelet:
//! a refused or failed connection is a failure; a response status in 200..=399 passes, any other
//! fails; an attempt cut at `timeoutSeconds` is a timeout; what prevents the attempt itself (an
//! unresolvable named port, HTTPS, the runtime not knowing the sandbox) is an error, which
//! counts toward neither threshold.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use oka_api::conditions::TRUE;
use oka_api::conditions::sandbox::READY;
use oka_api::probes::SandboxProbe;
use oka_api::{Sandbox, SandboxTemplate, annotations};
use oka_runtime_api::{Runtime, RuntimeError, SandboxId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::annotation_time;
use crate::sandbox::runtime_id;

/// The result of one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The probe passed.
    Success(String),
    /// The probe failed.
    Failure(String),
    /// The attempt took longer than `timeoutSeconds` (a failure).
    Timeout(String),
    /// The attempt could not be made.
    Error(String),
}

/// Where an attempt connects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The sandbox's runtime instance (used without `host`).
    pub id: Option<SandboxId>,
    /// An explicit host, reached over the host's network.
    pub host: Option<String>,
    /// The port.
    pub port: u16,
}

impl Check {
    /// The probe's type as the API names it: `tcpSocket`, `httpGet`, `exec` or `activity`;
    /// `invalid` for a probe that cannot be run as written.
    pub fn kind(&self) -> &'static str {
        match self {
            Check::Invalid(_) => "invalid",
            Check::Tcp(_) => "tcpSocket",
            Check::Http { .. } => "httpGet",
            Check::Exec { .. } => "exec",
            Check::Activity { .. } => "activity",
        }
    }
}

/// One probe, ready to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// Connect.
    Tcp(Endpoint),
    /// Connect and send `head`; pass on a status in 200..=399.
    Http {
        /// Where.
        endpoint: Endpoint,
        /// The whole request (a GET has no body).
        head: Vec<u8>,
    },
    /// Recent traffic.
    Activity {
        /// The ports that count (all when empty).
        ports: Vec<i32>,
        /// `windowSeconds`.
        window: i64,
        /// The latest of the annotation `last-activity-time`, the claim time and Ready's
        /// transition, in Unix seconds.
        floor: Option<i64>,
    },
    /// A command run in the sandbox (as root, through its agent runtime): exit code 0 passes.
    Exec {
        /// `command[0]` and its arguments.
        command: Vec<String>,
    },
    /// The probe cannot run; every attempt is this error.
    Invalid(String),
}

/// `$(SANDBOX_NAME)`, `$(SANDBOX_NAMESPACE)` and `$(SANDBOX_ID)` of `sandbox` in `text`.
pub fn substitute(text: &str, sandbox: &Sandbox) -> String {
    let name = sandbox.metadata.name.as_deref().unwrap_or_default();
    let namespace = sandbox.metadata.namespace.as_deref().unwrap_or_default();
    let id = oka_api::public_id::of(sandbox);
    text.replace("$(SANDBOX_NAME)", name)
        .replace("$(SANDBOX_NAMESPACE)", namespace)
        .replace("$(SANDBOX_ID)", &id)
}

/// The port `port` names: a number, or a container port's name in the sandbox's pod template.
fn resolve_port(port: &IntOrString, template: Option<&PodTemplateSpec>) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("port {n} is out of range")),
        IntOrString::String(name) => template
            .and_then(|t| t.spec.as_ref())
            .into_iter()
            .flat_map(|spec| spec.containers.iter())
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("no container port is named {name:?}")),
    }
}

fn endpoint(
    sandbox: &Sandbox,
    host: Option<&str>,
    port: &IntOrString,
    template: Option<&PodTemplateSpec>,
) -> Result<Endpoint, String> {
    let port = resolve_port(port, template)?;
    let host = host.filter(|h| !h.is_empty()).map(|h| substitute(h, sandbox));
    let id = match host {
        Some(_) => None,
        None => Some(runtime_id(sandbox).map_err(|e| e.to_string())?),
    };
    Ok(Endpoint { id, host, port })
}

impl Check {
    /// The check of `probe` on `sandbox`, whose referenced SandboxTemplate is `template`.
    pub fn of(sandbox: &Sandbox, template: Option<&SandboxTemplate>, probe: &SandboxProbe) -> Self {
        let pod = sandbox
            .spec
            .template
            .as_ref()
            .or_else(|| template.and_then(|t| t.spec.template.as_ref()));
        let result = if let Some(tcp) = &probe.tcp_socket {
            endpoint(sandbox, tcp.host.as_deref(), &tcp.port, pod).map(Check::Tcp)
        } else if let Some(http) = &probe.http_get {
            if http.scheme.as_deref().is_some_and(|s| !s.eq_ignore_ascii_case("HTTP")) {
                Err("HTTPS probes are not supported yet: the probe runner has no TLS client"
                    .to_owned())
            } else {
                endpoint(sandbox, http.host.as_deref(), &http.port, pod).map(|endpoint| {
                    let path = substitute(
                        http.path.as_deref().filter(|p| !p.is_empty()).unwrap_or("/"),
                        sandbox,
                    );
                    let path = if path.starts_with('/') { path } else { format!("/{path}") };
                    let host = endpoint.host.clone().unwrap_or_else(|| "127.0.0.1".to_owned());
                    let mut head = format!("GET {path} HTTP/1.1\r\n");
                    let headers = http.http_headers.iter().flatten();
                    if !headers.clone().any(|h| h.name.eq_ignore_ascii_case("host")) {
                        head.push_str(&format!("Host: {host}:{}\r\n", endpoint.port));
                    }
                    for header in headers.clone() {
                        head.push_str(&format!(
                            "{}: {}\r\n",
                            header.name,
                            substitute(&header.value, sandbox)
                        ));
                    }
                    if !headers.clone().any(|h| h.name.eq_ignore_ascii_case("user-agent")) {
                        head.push_str("User-Agent: oka-probe/1.0\r\n");
                    }
                    if !headers.clone().any(|h| h.name.eq_ignore_ascii_case("accept")) {
                        head.push_str("Accept: */*\r\n");
                    }
                    head.push_str("Connection: close\r\n\r\n");
                    Check::Http { endpoint, head: head.into_bytes() }
                })
            }
        } else if let Some(activity) = &probe.activity {
            let ready = sandbox
                .condition(READY)
                .filter(|c| c.status == TRUE)
                .map(|c| c.last_transition_time.0);
            let floor = [
                annotation_time(sandbox, annotations::LAST_ACTIVITY_TIME),
                annotation_time(sandbox, annotations::CLAIM_TIMESTAMP),
                ready,
            ]
            .into_iter()
            .flatten()
            .max()
            .map(|t| t.as_second());
            Ok(Check::Activity {
                ports: activity.ports.clone().unwrap_or_default(),
                window: i64::from(activity.window_seconds),
                floor,
            })
        } else if let Some(exec) = &probe.exec {
            match exec.command.as_deref() {
                Some(command) if !command.is_empty() => {
                    Ok(Check::Exec { command: command.to_vec() })
                }
                _ => Err("the exec probe has no command".to_owned()),
            }
        } else {
            Err("the probe sets no handler".to_owned())
        };
        result.unwrap_or_else(Check::Invalid)
    }
}

async fn connect(runtime: &dyn Runtime, endpoint: &Endpoint) -> Result<TcpStream, Outcome> {
    let port = endpoint.port;
    match (&endpoint.host, &endpoint.id) {
        (Some(host), _) => TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| Outcome::Failure(format!("dial tcp {host}:{port}: {e}"))),
        (None, Some(id)) => runtime.connect(id, port).await.map_err(|e| match e {
            RuntimeError::NotFound(_)
            | RuntimeError::InvalidState { .. }
            | RuntimeError::Unsupported { .. } => {
                Outcome::Error(format!("the sandbox cannot be reached: {e}"))
            }
            other => Outcome::Failure(format!("dial tcp port {port}: {other}")),
        }),
        (None, None) => Err(Outcome::Error("no address to probe".to_owned())),
    }
}

/// The status code of an HTTP/1.x status line at the start of `buf`, once it is complete.
fn status_code(buf: &[u8]) -> Option<Result<u16, String>> {
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = String::from_utf8_lossy(&buf[..end]);
    let mut parts = line.split(' ');
    let version = parts.next().unwrap_or_default();
    let code = parts.next().and_then(|c| c.parse::<u16>().ok());
    Some(match code {
        Some(code) if version.starts_with("HTTP/1.") => Ok(code),
        _ => Err(format!("not an HTTP response: {line:?}")),
    })
}

async fn http(runtime: &dyn Runtime, endpoint: &Endpoint, head: &[u8]) -> Outcome {
    let mut stream = match connect(runtime, endpoint).await {
        Ok(stream) => stream,
        Err(outcome) => return outcome,
    };
    if let Err(e) = stream.write_all(head).await {
        return Outcome::Failure(format!("sending the request: {e}"));
    }
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) => return Outcome::Failure("the connection closed before a response".to_owned()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Outcome::Failure(format!("reading the response: {e}")),
        }
        match status_code(&buf) {
            None if buf.len() < 4096 => {}
            None => return Outcome::Failure("the response's status line is too long".to_owned()),
            Some(Err(why)) => return Outcome::Failure(why),
            Some(Ok(code)) if (200..400).contains(&code) => {
                return Outcome::Success(format!("HTTP {code}"));
            }
            Some(Ok(code)) => return Outcome::Failure(format!("HTTP {code}")),
        }
    }
}

/// The activity verdict at `now` given the last request (`seen`, Unix seconds) and `floor`.
pub fn activity(seen: Option<i64>, floor: Option<i64>, window: i64, now: Timestamp) -> Outcome {
    let Some(last) = seen.into_iter().chain(floor).max() else {
        return Outcome::Failure("no activity recorded".to_owned());
    };
    let ago = now.as_second().saturating_sub(last);
    let at = Timestamp::from_second(last).map_or_else(|_| last.to_string(), |t| t.to_string());
    let message = format!("last activity {at} ({ago}s ago)");
    if ago < window { Outcome::Success(message) } else { Outcome::Failure(message) }
}

/// One attempt of `check`, cut at `timeout`. `seen` is the activity source's answer for an
/// activity check.
pub async fn attempt(
    runtime: &dyn Runtime,
    check: &Check,
    timeout: Duration,
    now: Timestamp,
    seen: Option<i64>,
    exec: Option<(&dyn crate::sandbox::HookRunner, &Sandbox)>,
) -> Outcome {
    let run = async {
        match check {
            Check::Tcp(endpoint) => match connect(runtime, endpoint).await {
                Ok(_) => Outcome::Success(format!("connected to port {}", endpoint.port)),
                Err(outcome) => outcome,
            },
            Check::Http { endpoint, head } => http(runtime, endpoint, head).await,
            Check::Activity { window, floor, .. } => activity(seen, *floor, *window, now),
            Check::Exec { command } => match exec {
                None => Outcome::Error(super::EXEC_NOT_RUN.to_owned()),
                Some((runner, sandbox)) => match runner.run_hook(sandbox, command, timeout).await {
                    Ok(done) if done.exit_code == 0 => Outcome::Success("exit code 0".to_owned()),
                    Ok(done) => {
                        let text = done.stderr.trim();
                        let mut start = text.len().saturating_sub(200);
                        while !text.is_char_boundary(start) {
                            start += 1;
                        }
                        let tail = &text[start..];
                        Outcome::Failure(format!("exit code {}: {tail}", done.exit_code))
                    }
                    Err(why) if why.contains("longer than its timeout") => Outcome::Timeout(why),
                    Err(why) => Outcome::Error(why),
                },
            },
            Check::Invalid(why) => Outcome::Error(why.clone()),
        }
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::Timeout(format!("timed out after {}s", timeout.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(status_code(b"HTTP/1.1 200 OK\r\n"), Some(Ok(200)));
        assert_eq!(status_code(b"HTTP/1.0 503 Service Unavailable\r\nx"), Some(Ok(503)));
        assert_eq!(status_code(b"HTTP/1.1 20"), None);
        assert!(matches!(status_code(b"SSH-2.0\r\n"), Some(Err(_))));
    }

    #[test]
    fn activity_window() {
        let now = Timestamp::from_second(1_000).unwrap();
        assert!(matches!(activity(Some(950), None, 60, now), Outcome::Success(_)));
        assert!(matches!(activity(Some(900), None, 60, now), Outcome::Failure(_)));
        assert!(
            matches!(activity(Some(900), Some(990), 60, now), Outcome::Success(_)),
            "the floor counts"
        );
        assert!(matches!(activity(None, None, 60, now), Outcome::Failure(_)));
    }
}
