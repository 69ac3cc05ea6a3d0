//! What of a container's `startupProbe` oka's runtime honours: it runs the probe as the
//! sandbox's startup check (the sandbox is not ready, nor handed out of its pool, before the
//! first success; `failureThreshold` failures fail its start).
//!
//! Honoured: `exec.command`; `tcpSocket.port` and `httpGet.port`/`path` (a number or a name of
//! the container's `ports`; connected to on the sandbox's own loopback), `httpGet.scheme: HTTP`,
//! a `host` that is the loopback; `initialDelaySeconds`, `periodSeconds`, `timeoutSeconds`,
//! `failureThreshold` (0 or unset: Kubernetes' defaults 0, 10, 1, 3), `successThreshold: 1`.
//! Everything else that is set is refused by [`unsupported_startup_probe_fields`], by name.

use k8s_openapi::api::core::v1::Probe;

/// The wording a refusal starts with.
pub const NOT_HONOURED: &str = "not supported by oka's runtime";

/// The hosts a `tcpSocket` or `httpGet` check may name: the sandbox's loopback, where the check
/// connects in any case.
pub const LOOPBACK_HOSTS: &[&str] = &["", "localhost", "127.0.0.1"];

/// Every field of `probe` (a container's `startupProbe`) that is set and not honoured, as a path
/// below the probe (`grpc`, `httpGet.httpHeaders`) with what to do instead.
pub fn unsupported_startup_probe_fields(probe: &Probe) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    if probe.grpc.is_some() {
        out.push(("grpc", "use exec, httpGet or tcpSocket"));
    }
    let remote =
        |host: &Option<String>| host.as_deref().is_some_and(|h| !LOOPBACK_HOSTS.contains(&h));
    if let Some(http) = &probe.http_get {
        if remote(&http.host) {
            out.push(("httpGet.host", "the check connects to the sandbox's own loopback"));
        }
        if http.scheme.as_deref().is_some_and(|s| s != "HTTP") {
            out.push(("httpGet.scheme", "only HTTP is"));
        }
        if http.http_headers.as_ref().is_some_and(|h| !h.is_empty()) {
            out.push(("httpGet.httpHeaders", ""));
        }
    }
    if let Some(tcp) = &probe.tcp_socket
        && remote(&tcp.host)
    {
        out.push(("tcpSocket.host", "the check connects to the sandbox's own loopback"));
    }
    if probe.success_threshold.is_some_and(|s| s != 1) {
        out.push(("successThreshold", "a startup probe's must be 1"));
    }
    if probe.termination_grace_period_seconds.is_some() {
        out.push((
            "terminationGracePeriodSeconds",
            "a failed startup probe ends the command at once",
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        ExecAction, GRPCAction, HTTPGetAction, HTTPHeader, TCPSocketAction,
    };
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;

    #[test]
    fn the_honoured_handlers_pass_and_the_rest_is_named() {
        let exec = Probe {
            exec: Some(ExecAction { command: Some(vec!["true".into()]) }),
            period_seconds: Some(1),
            failure_threshold: Some(60),
            success_threshold: Some(1),
            ..Default::default()
        };
        assert!(unsupported_startup_probe_fields(&exec).is_empty());
        let http = Probe {
            http_get: Some(HTTPGetAction {
                port: IntOrString::Int(8000),
                path: Some("/".into()),
                scheme: Some("HTTP".into()),
                host: Some("localhost".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(unsupported_startup_probe_fields(&http).is_empty());
        let all = Probe {
            grpc: Some(GRPCAction { port: 9000, ..Default::default() }),
            http_get: Some(HTTPGetAction {
                port: IntOrString::Int(443),
                scheme: Some("HTTPS".into()),
                host: Some("example.test".into()),
                http_headers: Some(vec![HTTPHeader { name: "a".into(), value: "b".into() }]),
                ..Default::default()
            }),
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(1),
                host: Some("10.0.0.1".into()),
            }),
            success_threshold: Some(2),
            termination_grace_period_seconds: Some(5),
            ..Default::default()
        };
        let fields: Vec<_> =
            unsupported_startup_probe_fields(&all).into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            [
                "grpc",
                "httpGet.host",
                "httpGet.scheme",
                "httpGet.httpHeaders",
                "tcpSocket.host",
                "successThreshold",
                "terminationGracePeriodSeconds"
            ]
        );
    }
}
