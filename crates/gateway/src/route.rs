//! Which sandbox port a request is for: the pure mapping from a request's path, `Host` and
//! routing headers to a [`Target`].
//!
//! # Rules, in order
//!
//! 1. **Path** `/kruise/{sandboxID}/{port}[/{rest}]` (the reference's "customized" adapter):
//!    the target is `(sandboxID, port)` and the upstream path becomes `/{rest}` (or `/`), with
//!    the query kept. `/kruise/api…` is the reference's API prefix, not a sandbox.
//! 2. **Headers**, when the host (port stripped) is an IP literal, `localhost` or
//!    `sandbox.{domain}` (the configured domain), and `E2b-Sandbox-Id` or `E2b-Sandbox-Port` is present: both must be
//!    there ([`RouteError::MissingHeader`] names the missing one, E2B's
//!    `Missing header: …`).
//! 3. **Host** `{port}-{sandboxID}.{domain}`: split on the first `.`, then on the first `-`
//!    (E2B's `packages/shared/pkg/proxy/host.go`).
//!
//! A port that is not a number in `0..=65535` is [`RouteError::InvalidPort`]; a host with no
//! `.` or no `-` in its first label is [`RouteError::InvalidHost`].

use std::net::IpAddr;

use http::HeaderMap;
use http::uri::PathAndQuery;

/// The routing header naming the sandbox.
pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
/// The routing header naming the port.
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";
/// The path prefix of path routing.
pub const PATH_PREFIX: &str = "/kruise/";

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The public sandbox ID.
    pub sandbox_id: String,
    /// The port inside the sandbox.
    pub port: u16,
    /// The path and query to send upstream, when it differs from the request's (path
    /// routing strips its prefix).
    pub path: Option<PathAndQuery>,
}

/// Why a request names no sandbox port.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// One routing header without the other.
    #[error("Missing header: {0}")]
    MissingHeader(&'static str),
    /// The host is not `{port}-{sandboxID}.{domain}`.
    #[error("Invalid host")]
    InvalidHost,
    /// The port is not a number in `0..=65535`.
    #[error("Invalid sandbox port")]
    InvalidPort,
}

/// The host name of a `Host` / `:authority` value: the port removed, IPv6 brackets removed.
pub fn hostname(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(name, _)| name);
    }
    match host.rsplit_once(':') {
        // A bare IPv6 address has several colons and no port.
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

/// Whether requests to `host` are routed by headers: an IP literal, `localhost`, or
/// `sandbox.{domain}` (with an empty `domain`, `sandbox.` followed by anything, as E2B).
pub fn is_shared_host(host: &str, domain: &str) -> bool {
    is_shared_name(hostname(host), domain)
}

/// [`is_shared_host`] of a host name (port already removed).
fn is_shared_name(name: &str, domain: &str) -> bool {
    if name.eq_ignore_ascii_case("localhost") || is_ip_literal(name) {
        return true;
    }
    let Some(rest) =
        name.get(..8).filter(|p| p.eq_ignore_ascii_case("sandbox.")).map(|_| &name[8..])
    else {
        return false;
    };
    if domain.is_empty() { !rest.is_empty() } else { rest.eq_ignore_ascii_case(domain) }
}

/// Whether `name` is an IPv4 or IPv6 literal; only names made of an address's characters are
/// parsed (a sandbox host such as `49983-id.domain` never is).
fn is_ip_literal(name: &str) -> bool {
    let v4_chars = || name.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    (name.contains(':') || v4_chars()) && name.parse::<IpAddr>().is_ok()
}

fn parse_port(port: &str) -> Result<u16, RouteError> {
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RouteError::InvalidPort);
    }
    port.parse().map_err(|_| RouteError::InvalidPort)
}

/// Path routing: `Some` when `path_and_query` is `/kruise/{id}/{port}[/{rest}]`.
fn route_path(path_and_query: &str) -> Option<Result<Target, RouteError>> {
    let (path, query) = match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query, None),
    };
    let rest = path.strip_prefix(PATH_PREFIX)?;
    let (sandbox_id, rest) = rest.split_once('/').unwrap_or((rest, ""));
    if sandbox_id.is_empty() || sandbox_id == "api" {
        return None;
    }
    let (port, rest) = rest.split_once('/').unwrap_or((rest, ""));
    let port = match parse_port(port) {
        Ok(port) => port,
        Err(e) => return Some(Err(e)),
    };
    let path = match query {
        Some(query) => format!("/{rest}?{query}"),
        None => format!("/{rest}"),
    };
    // The pieces come from a valid path, so the rebuilt one is valid too.
    let path = PathAndQuery::try_from(path).ok();
    Some(Ok(Target { sandbox_id: sandbox_id.to_owned(), port, path }))
}

/// Maps a request to its target (see the [module documentation](self) for the rules).
/// `host` is the `Host` header or the URI's authority; `path_and_query` the request target.
pub fn route(
    host: &str,
    path_and_query: Option<&PathAndQuery>,
    headers: &HeaderMap,
    domain: &str,
) -> Result<Target, RouteError> {
    route_with(
        host,
        path_and_query.map(PathAndQuery::as_str),
        |name| headers.get(name).and_then(|v| v.to_str().ok()),
        domain,
    )
}

/// [`route`] over a request head that is not a [`HeaderMap`]: `header` gives the value of a
/// header by its lowercase name (the first, when repeated).
pub fn route_with<'h>(
    host: &str,
    path_and_query: Option<&str>,
    header: impl Fn(&str) -> Option<&'h str>,
    domain: &str,
) -> Result<Target, RouteError> {
    if let Some(routed) = path_and_query.and_then(route_path) {
        return routed;
    }
    let header = |name| header(name).filter(|v| !v.is_empty());
    let name = hostname(host);
    if is_shared_name(name, domain) {
        match (header(SANDBOX_ID_HEADER), header(SANDBOX_PORT_HEADER)) {
            (Some(id), Some(port)) => {
                return Ok(Target {
                    sandbox_id: id.to_owned(),
                    port: parse_port(port)?,
                    path: None,
                });
            }
            (Some(_), None) => return Err(RouteError::MissingHeader("E2b-Sandbox-Port")),
            (None, Some(_)) => return Err(RouteError::MissingHeader("E2b-Sandbox-Id")),
            (None, None) => {}
        }
    }
    let (label, _domain) = name.split_once('.').ok_or(RouteError::InvalidHost)?;
    let (port, sandbox_id) = label.split_once('-').ok_or(RouteError::InvalidHost)?;
    if sandbox_id.is_empty() {
        return Err(RouteError::InvalidHost);
    }
    Ok(Target { sandbox_id: sandbox_id.to_owned(), port: parse_port(port)?, path: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, v.parse().unwrap());
        }
        map
    }

    fn target(id: &str, port: u16, path: Option<&str>) -> Target {
        Target {
            sandbox_id: id.into(),
            port,
            path: path.map(|p| PathAndQuery::try_from(p).unwrap()),
        }
    }

    fn pq(s: &str) -> PathAndQuery {
        PathAndQuery::try_from(s).unwrap()
    }

    #[test]
    fn host_routing_splits_on_first_dot_then_first_dash() {
        let h = HeaderMap::new();
        assert_eq!(
            route("49983-abc123.example.test", None, &h, ""),
            Ok(target("abc123", 49983, None))
        );
        assert_eq!(
            route("8080-abc.oka.localhost:7788", Some(&pq("/x")), &h, ""),
            Ok(target("abc", 8080, None))
        );
        assert_eq!(route("1-a-b.d", None, &h, ""), Ok(target("a-b", 1, None)));
        assert_eq!(route("nodot", None, &h, ""), Err(RouteError::InvalidHost));
        assert_eq!(route("nodash.example", None, &h, ""), Err(RouteError::InvalidHost));
        assert_eq!(route("x-abc.example", None, &h, ""), Err(RouteError::InvalidPort));
        assert_eq!(route("70000-abc.example", None, &h, ""), Err(RouteError::InvalidPort));
    }

    #[test]
    fn header_routing_on_shared_hosts() {
        let both = headers(&[(SANDBOX_ID_HEADER, "abc"), (SANDBOX_PORT_HEADER, "49983")]);
        for host in [
            "127.0.0.1:49983",
            "localhost",
            "LOCALHOST:1",
            "[::1]:80",
            "::1",
            "sandbox.example.test",
        ] {
            assert_eq!(
                route(host, None, &both, "example.test"),
                Ok(target("abc", 49983, None)),
                "{host}"
            );
        }
        let id_only = headers(&[(SANDBOX_ID_HEADER, "abc")]);
        assert_eq!(
            route("127.0.0.1", None, &id_only, ""),
            Err(RouteError::MissingHeader("E2b-Sandbox-Port"))
        );
        let port_only = headers(&[(SANDBOX_PORT_HEADER, "1")]);
        let err = route("localhost", None, &port_only, "").unwrap_err();
        assert_eq!(err.to_string(), "Missing header: E2b-Sandbox-Id");
        // Without headers a shared host is not a sandbox host.
        assert_eq!(
            route("127.0.0.1:3000", None, &HeaderMap::new(), ""),
            Err(RouteError::InvalidHost)
        );
        // Headers are ignored on sandbox hosts.
        assert_eq!(route("1-xyz.example", None, &both, "example.test"), Ok(target("xyz", 1, None)));
    }

    #[test]
    fn only_address_literals_are_ip_hosts() {
        for ip in ["127.0.0.1", "10.0.0.255", "::1", "fe80::1", "::ffff:127.0.0.1"] {
            assert!(is_ip_literal(ip), "{ip}");
        }
        for name in ["49983-abc.oka.test", "1.2.3", "1.2.3.4.5", "", "abc", "12345"] {
            assert!(!is_ip_literal(name), "{name}");
        }
    }

    #[test]
    fn path_routing_strips_the_prefix_and_keeps_the_query() {
        let h = HeaderMap::new();
        assert_eq!(
            route("gw.example", Some(&pq("/kruise/abc/49983/files?path=/a")), &h, ""),
            Ok(target("abc", 49983, Some("/files?path=/a")))
        );
        assert_eq!(
            route("127.0.0.1", Some(&pq("/kruise/abc/80")), &h, ""),
            Ok(target("abc", 80, Some("/")))
        );
        assert_eq!(
            route("127.0.0.1", Some(&pq("/kruise/abc/80/")), &h, ""),
            Ok(target("abc", 80, Some("/")))
        );
        assert_eq!(
            route("127.0.0.1", Some(&pq("/kruise/abc/x/y")), &h, ""),
            Err(RouteError::InvalidPort)
        );
        // The API prefix is not a sandbox.
        assert_eq!(
            route("127.0.0.1", Some(&pq("/kruise/api/sandboxes")), &h, ""),
            Err(RouteError::InvalidHost)
        );
    }
}
