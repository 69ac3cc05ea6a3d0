//! A container's `startupProbe` as the runtime's startup check ([`StartupCheck`]): pure.
//!
//! The probe runs inside the sandbox once per start of its command, until its first success;
//! the runtime reports the sandbox running (and so the controller `Ready`, and a pool member
//! available) only after it. What of a probe is honoured is [`oka_api::startup_probe`]'s rule;
//! anything else set is refused by name.

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use oka_api::startup_probe::unsupported_startup_probe_fields;
use oka_runtime_api::startup::{
    DEFAULT_FAILURE_THRESHOLD, DEFAULT_PERIOD_SECONDS, DEFAULT_TIMEOUT_SECONDS,
};
use oka_runtime_api::{CheckAction, StartupCheck};

use super::resolve::ResolveError;

/// The container's `startupProbe` as a startup check; `None` without one.
///
/// # Errors
///
/// [`ResolveError::StartupProbe`] naming the field: a field that is not honoured, no handler or
/// more than one, a negative number, a port that is neither a number nor one of the
/// container's port names.
pub fn startup_check(container: &Container) -> Result<Option<StartupCheck>, ResolveError> {
    let Some(probe) = &container.startup_probe else { return Ok(None) };
    let refuse = |field: &str, reason: String| ResolveError::StartupProbe {
        container: container.name.clone(),
        field: if field.is_empty() {
            "startupProbe".to_owned()
        } else {
            format!("startupProbe.{field}")
        },
        reason,
    };
    if let Some((field, hint)) = unsupported_startup_probe_fields(probe).into_iter().next() {
        let reason = if hint.is_empty() {
            oka_api::startup_probe::NOT_HONOURED.to_owned()
        } else {
            format!("{}: {hint}", oka_api::startup_probe::NOT_HONOURED)
        };
        return Err(refuse(field, reason));
    }
    let handlers = [probe.exec.is_some(), probe.http_get.is_some(), probe.tcp_socket.is_some()];
    if handlers.iter().filter(|h| **h).count() != 1 {
        return Err(refuse("", "must set exactly one of exec, httpGet or tcpSocket".to_owned()));
    }
    let port = |field: &str, port: &IntOrString| -> Result<u16, ResolveError> {
        let number = match port {
            IntOrString::Int(n) => i64::from(*n),
            IntOrString::String(name) => container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| i64::from(p.container_port))
                .ok_or_else(|| {
                    refuse(
                        field,
                        format!("{name:?} is not the name of one of the container's ports"),
                    )
                })?,
        };
        u16::try_from(number)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| refuse(field, format!("{number} is not a port (1 to 65535)")))
    };
    let action = if let Some(exec) = &probe.exec {
        let command = exec.command.clone().unwrap_or_default();
        if command.first().is_none_or(String::is_empty) {
            return Err(refuse("exec.command", "must name a program".to_owned()));
        }
        CheckAction::Exec { command }
    } else if let Some(http) = &probe.http_get {
        let path = http.path.clone().filter(|p| !p.is_empty()).unwrap_or_else(|| "/".to_owned());
        let path = if path.starts_with('/') { path } else { format!("/{path}") };
        CheckAction::HttpGet { port: port("httpGet.port", &http.port)?, path }
    } else if let Some(tcp) = &probe.tcp_socket {
        CheckAction::TcpSocket { port: port("tcpSocket.port", &tcp.port)? }
    } else {
        return Err(refuse("", "must set exactly one of exec, httpGet or tcpSocket".to_owned()));
    };
    // Unset or 0 is Kubernetes' default, as its API server defaults a Pod's probe.
    let seconds = |field: &str, value: Option<i32>, default: u32| -> Result<u32, ResolveError> {
        match value {
            None | Some(0) => Ok(default),
            Some(v) => {
                u32::try_from(v).map_err(|_| refuse(field, format!("{v} must not be negative")))
            }
        }
    };
    let check = StartupCheck {
        action,
        initial_delay_seconds: seconds("initialDelaySeconds", probe.initial_delay_seconds, 0)?,
        period_seconds: seconds("periodSeconds", probe.period_seconds, DEFAULT_PERIOD_SECONDS)?,
        timeout_seconds: seconds("timeoutSeconds", probe.timeout_seconds, DEFAULT_TIMEOUT_SECONDS)?,
        failure_threshold: seconds(
            "failureThreshold",
            probe.failure_threshold,
            DEFAULT_FAILURE_THRESHOLD,
        )?,
    };
    check.validate().map_err(|e| refuse("", e.to_string()))?;
    Ok(Some(check))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerPort, ExecAction, GRPCAction, HTTPGetAction};

    use k8s_openapi::api::core::v1::Probe;

    use super::*;

    fn with(probe: Probe) -> Container {
        Container {
            name: "main".into(),
            ports: Some(vec![ContainerPort {
                name: Some("web".into()),
                container_port: 8000,
                ..Default::default()
            }]),
            startup_probe: Some(probe),
            ..Default::default()
        }
    }

    #[test]
    fn a_startup_probe_becomes_the_startup_check_with_kubernetes_defaults() {
        let exec = Probe {
            exec: Some(ExecAction { command: Some(vec!["/bin/bash".into(), "-c".into()]) }),
            period_seconds: Some(1),
            failure_threshold: Some(60),
            ..Default::default()
        };
        let check = startup_check(&with(exec)).unwrap().unwrap();
        assert_eq!(
            check,
            StartupCheck {
                action: CheckAction::Exec { command: vec!["/bin/bash".into(), "-c".into()] },
                initial_delay_seconds: 0,
                period_seconds: 1,
                timeout_seconds: 1,
                failure_threshold: 60,
            }
        );
        let http = Probe {
            http_get: Some(HTTPGetAction {
                port: IntOrString::String("web".into()),
                path: Some("healthz".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let check = startup_check(&with(http)).unwrap().unwrap();
        assert_eq!(check.action, CheckAction::HttpGet { port: 8000, path: "/healthz".into() });
        assert_eq!((check.period_seconds, check.failure_threshold), (10, 3));
        assert_eq!(startup_check(&Container::default()), Ok(None));
    }

    #[test]
    fn what_is_not_honoured_is_refused_by_name() {
        let message = |probe: Probe| startup_check(&with(probe)).unwrap_err().to_string();
        let grpc = Probe {
            grpc: Some(GRPCAction { port: 1, ..Default::default() }),
            ..Default::default()
        };
        assert!(message(grpc).contains("startupProbe.grpc: not supported"));
        assert!(message(Probe::default()).contains("exactly one of exec, httpGet or tcpSocket"));
        let negative = Probe {
            exec: Some(ExecAction { command: Some(vec!["true".into()]) }),
            period_seconds: Some(-1),
            ..Default::default()
        };
        assert!(message(negative).contains("startupProbe.periodSeconds: -1 must not be negative"));
        let unnamed = Probe {
            tcp_socket: Some(k8s_openapi::api::core::v1::TCPSocketAction {
                port: IntOrString::String("db".into()),
                host: None,
            }),
            ..Default::default()
        };
        assert!(message(unnamed).contains("startupProbe.tcpSocket.port: \"db\" is not the name"));
    }
}
