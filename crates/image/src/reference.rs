//! Image references with Docker's naming rules (distribution's `reference` package, as
//! `docker pull` normalises them): `python` is `docker.io/library/python:latest`, a first
//! component with a `.` or a `:`, or `localhost`, or an IPv6 literal in brackets, is a
//! registry, repositories are lowercase path components, tags are `[\w][\w.-]{0,127}` and
//! digests `algorithm:hex`. Pure: no IO. Also where a reference is fetched from: Docker Hub's
//! API host, the configured mirrors first, and plain HTTP for loopback and insecure registries.

use std::collections::BTreeMap;
use std::fmt;

/// Docker Hub's name in references.
pub const DOCKER_HUB: &str = "docker.io";
/// Docker Hub's registry API host (`docker.io` names the hub, this host serves its API).
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";
/// The longest repository name (registry included) Docker accepts.
const NAME_TOTAL_LENGTH_MAX: usize = 255;

/// A parsed, normalised image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reference {
    /// The registry as named (`docker.io`, `registry:5000`, `[::1]:5000`).
    pub registry: String,
    /// The repository path (`library/python`, `user/app`).
    pub repository: String,
    /// The tag; `latest` when the reference names neither a tag nor a digest.
    pub tag: Option<String>,
    /// The manifest digest (`sha256:<64 hex>`), when the reference pins one.
    pub digest: Option<String>,
}

/// Why a string is not an image reference; the messages are Docker's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// The string does not follow the grammar at all.
    #[error("invalid reference format")]
    InvalidFormat,
    /// The repository has upper-case letters.
    #[error("invalid reference format: repository name ({0}) must be lowercase")]
    Uppercase(String),
    /// Empty name.
    #[error("repository name must have at least one component")]
    EmptyName,
    /// Longer than Docker allows.
    #[error("repository name must not be more than 255 characters")]
    NameTooLong,
    /// A bad tag.
    #[error("invalid tag format")]
    InvalidTag,
    /// A bad digest.
    #[error("invalid digest format")]
    InvalidDigest,
    /// A bare 64-hex string: Docker refuses it as a name (it is an image ID).
    #[error("invalid repository name ({0}), cannot specify 64-byte hexadecimal strings")]
    HexName(String),
}

impl Reference {
    /// Parses `s` as `docker pull` does (normalised, `latest` added when neither tag nor digest).
    pub fn parse(s: &str) -> Result<Reference, ReferenceError> {
        if s.is_empty() {
            return Err(ReferenceError::EmptyName);
        }
        if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
            return Err(ReferenceError::HexName(s.to_string()));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((rest, digest)) => (rest, Some(parse_digest(digest)?)),
            None => (s, None),
        };
        // A tag is after the last ':' that follows the last '/'.
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => {
                let tag = &rest[last_slash + i + 1..];
                if !valid_tag(tag) {
                    return Err(ReferenceError::InvalidFormat);
                }
                (&rest[..last_slash + i], Some(tag.to_string()))
            }
            None => (rest, None),
        };
        if name.is_empty() {
            return Err(ReferenceError::InvalidFormat);
        }
        if name.len() > NAME_TOTAL_LENGTH_MAX {
            return Err(ReferenceError::NameTooLong);
        }
        let (registry, remainder) = split_registry(name);
        if !valid_registry(&registry) {
            return Err(ReferenceError::InvalidFormat);
        }
        let repository = if registry == DOCKER_HUB && !remainder.contains('/') {
            format!("library/{remainder}")
        } else {
            remainder.to_string()
        };
        if repository.to_lowercase() != repository {
            return Err(ReferenceError::Uppercase(repository));
        }
        if !repository.split('/').all(valid_path_component) {
            return Err(ReferenceError::InvalidFormat);
        }
        let tag = match (&tag, &digest) {
            (None, None) => Some("latest".to_string()),
            _ => tag,
        };
        Ok(Reference { registry, repository, tag, digest })
    }

    /// What the registry's manifest endpoint is asked for: the digest when pinned, else the tag.
    pub fn manifest_reference(&self) -> &str {
        match (&self.digest, &self.tag) {
            (Some(digest), _) => digest,
            (None, Some(tag)) => tag,
            (None, None) => "latest",
        }
    }

    /// The registry without tag or digest (`docker.io/library/python`).
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The host the registry's API is served on (`docker.io` → `registry-1.docker.io`).
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB { DOCKER_HUB_API } else { &self.registry }
    }

    /// Where to fetch from, in order: the configured mirrors of this registry, then the
    /// registry itself. A mirror is a base URL (`http://127.0.0.1:5000`); the registry is
    /// spoken to over HTTPS unless it is loopback or listed in `insecure`.
    pub fn endpoints(
        &self,
        mirrors: &BTreeMap<String, String>,
        insecure: &[String],
    ) -> Vec<Endpoint> {
        let mut out = Vec::new();
        let mirror_keys = [self.registry.as_str(), self.api_host()];
        for key in mirror_keys {
            if let Some(url) = mirrors.get(key)
                && let Some(endpoint) = Endpoint::from_url(url, true)
                && !out.contains(&endpoint)
            {
                out.push(endpoint);
            }
        }
        let host = self.api_host().to_string();
        let insecure = is_insecure(&self.registry, insecure) || is_insecure(&host, insecure);
        out.push(Endpoint {
            base: format!("{}://{host}", if insecure { "http" } else { "https" }),
            host,
            mirror: false,
        });
        out
    }
}

impl fmt::Display for Reference {
    /// The full normalised form: `docker.io/library/python:latest`, `r:5000/a@sha256:…`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// One place a repository can be fetched from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `scheme://host[:port]`, no trailing slash.
    pub base: String,
    /// `host[:port]`: what credentials are matched against.
    pub host: String,
    /// A configured mirror (a failure there falls through to the next endpoint).
    pub mirror: bool,
}

impl Endpoint {
    /// An endpoint from a URL (`http://127.0.0.1:5000`, `https://mirror.example/`); a URL
    /// without a scheme follows the loopback rule.
    pub fn from_url(url: &str, mirror: bool) -> Option<Endpoint> {
        let url = url.trim().trim_end_matches('/');
        let (scheme, host) = match url.split_once("://") {
            Some((scheme, host)) if scheme == "http" || scheme == "https" => {
                (scheme.to_string(), host)
            }
            Some(_) => return None,
            None => ((if is_insecure(url, &[]) { "http" } else { "https" }).to_string(), url),
        };
        let host = host.split('/').next().unwrap_or_default().to_string();
        if host.is_empty() {
            return None;
        }
        Some(Endpoint { base: format!("{scheme}://{host}"), host, mirror })
    }
}

/// Whether `registry` (`host[:port]`) is spoken to over plain HTTP: loopback hosts always
/// (Docker's rule), and those listed (by `host[:port]` or by host alone).
pub fn is_insecure(registry: &str, insecure: &[String]) -> bool {
    let host = host_of(registry);
    let loopback = host == "localhost"
        || host == "::1"
        || host.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback());
    loopback || insecure.iter().any(|i| i == registry || i == host)
}

/// The host of `host[:port]` (brackets of an IPv6 literal removed).
fn host_of(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    registry.rsplit_once(':').map_or(registry, |(host, _)| host)
}

/// Docker's `splitDockerDomain`: the first component is a registry when it has a `.` or a `:`,
/// is `localhost`, or has upper-case letters (then it cannot be a repository component).
fn split_registry(name: &str) -> (String, &str) {
    match name.split_once('/') {
        Some((first, rest))
            if first.contains('.')
                || first.contains(':')
                || first == "localhost"
                || first.to_lowercase() != first =>
        {
            let registry = if first == "index.docker.io" { DOCKER_HUB } else { first };
            (registry.to_string(), rest)
        }
        _ => (DOCKER_HUB.to_string(), name),
    }
}

/// `host[:port]`: DNS labels joined by dots, or an IPv6 literal in brackets; then a port.
fn valid_registry(registry: &str) -> bool {
    let (host, port) = if let Some(rest) = registry.strip_prefix('[') {
        let Some((ip, after)) = rest.split_once(']') else { return false };
        if ip.is_empty() || !ip.bytes().all(|b| b.is_ascii_hexdigit() || b == b':') {
            return false;
        }
        match after.strip_prefix(':') {
            Some(port) => ("ipv6", Some(port)),
            None if after.is_empty() => ("ipv6", None),
            None => return false,
        }
    } else {
        match registry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (registry, None),
        }
    };
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let host_ok = host == "ipv6"
        || (!host.is_empty()
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            }));
    host_ok && port_ok
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`.
fn valid_path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &component[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|b| b == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// `[\w][\w.-]{0,127}`.
fn valid_tag(tag: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = tag.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 128
        && word(bytes[0])
        && bytes.iter().all(|&b| word(b) || b == b'.' || b == b'-')
}

/// `algorithm:hex`; a `sha256` digest must have 64 lower-case hex digits.
fn parse_digest(digest: &str) -> Result<String, ReferenceError> {
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return Err(ReferenceError::InvalidFormat);
    };
    let algorithm_ok = algorithm.split(['+', '.', '_', '-']).all(|part| {
        part.as_bytes().first().is_some_and(|b| b.is_ascii_alphabetic())
            && part.bytes().all(|b| b.is_ascii_alphanumeric())
    });
    if !algorithm_ok || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ReferenceError::InvalidFormat);
    }
    if algorithm == "sha256" && (hex.len() != 64 || hex.bytes().any(|b| b.is_ascii_uppercase())) {
        return Err(ReferenceError::InvalidDigest);
    }
    Ok(digest.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn full(s: &str) -> String {
        Reference::parse(s).map(|r| r.to_string()).unwrap_or_else(|e| format!("error: {e}"))
    }

    #[test]
    fn docker_hub_names_are_normalised() {
        assert_eq!(full("python"), "docker.io/library/python:latest");
        assert_eq!(full("python:3.12-slim"), "docker.io/library/python:3.12-slim");
        assert_eq!(full("user/app:1"), "docker.io/user/app:1");
        assert_eq!(full("docker.io/python"), "docker.io/library/python:latest");
        assert_eq!(full("index.docker.io/user/app"), "docker.io/user/app:latest");
        assert_eq!(full("a/b/c"), "docker.io/a/b/c:latest");
    }

    #[test]
    fn registries_ports_digests_and_ipv6() {
        assert_eq!(full(&format!("registry:5000/a/b@{D}")), format!("registry:5000/a/b@{D}"));
        assert_eq!(full(&format!("r.example/a:1@{D}")), format!("r.example/a:1@{D}"));
        assert_eq!(full("localhost/app"), "localhost/app:latest");
        assert_eq!(full("localhost:5000/app:v2"), "localhost:5000/app:v2");
        assert_eq!(full("[::1]:5000/app"), "[::1]:5000/app:latest");
        assert_eq!(full("[fe80::1]/app"), "[fe80::1]/app:latest");
        let r = Reference::parse(&format!("python@{D}")).unwrap();
        assert_eq!(
            (r.tag, r.digest.as_deref(), r.repository.as_str()),
            (None, Some(D), "library/python")
        );
        // A first component without '.', ':' or localhost is a repository path, not a host.
        assert_eq!(Reference::parse("registry/app").unwrap().registry, "docker.io");
    }

    #[test]
    fn docker_errors_for_bad_references() {
        assert_eq!(
            full("Python"),
            "error: invalid reference format: repository name (library/Python) must be lowercase"
        );
        assert_eq!(
            full("docker.io/User/app"),
            "error: invalid reference format: repository name (User/app) must be lowercase"
        );
        // An upper-case first component is a registry: the host may have capitals.
        assert_eq!(full("Registry.Example/app"), "Registry.Example/app:latest");
        assert_eq!(full(""), "error: repository name must have at least one component");
        assert_eq!(full("app:"), "error: invalid reference format");
        assert_eq!(full("app:-x"), "error: invalid reference format");
        assert_eq!(full(&format!("app:{}", "t".repeat(129))), "error: invalid reference format");
        assert_eq!(full("a//b"), "error: invalid reference format");
        assert_eq!(full("a/b-"), "error: invalid reference format");
        assert_eq!(full("a/.b"), "error: invalid reference format");
        assert_eq!(full("app@sha256:abc"), "error: invalid reference format");
        assert_eq!(
            full(&format!("app@{}", D.to_uppercase().replace("SHA", "sha"))),
            "error: invalid digest format"
        );
        assert_eq!(full("r:x/app"), "error: invalid reference format");
        assert_eq!(
            full(&"0".repeat(64)),
            format!(
                "error: invalid repository name ({}), cannot specify 64-byte hexadecimal strings",
                "0".repeat(64)
            )
        );
        assert_eq!(
            full(&format!("r.example/{}", "a".repeat(250))),
            "error: repository name must not be more than 255 characters"
        );
        assert_eq!(full("a/b__c/d.e/f-g--h_i"), "docker.io/a/b__c/d.e/f-g--h_i:latest");
        assert_eq!(full("a/b___c"), "error: invalid reference format");
    }

    #[test]
    fn endpoints_mirrors_first_then_the_registry() {
        let mirrors =
            BTreeMap::from([("docker.io".to_string(), "http://127.0.0.1:5000/".to_string())]);
        let hub = Reference::parse("python").unwrap();
        let got: Vec<String> = hub.endpoints(&mirrors, &[]).into_iter().map(|e| e.base).collect();
        assert_eq!(got, ["http://127.0.0.1:5000", "https://registry-1.docker.io"]);
        let local = Reference::parse("localhost:5000/a").unwrap();
        assert_eq!(local.endpoints(&mirrors, &[])[0].base, "http://localhost:5000");
        let v6 = Reference::parse("[::1]:5000/a").unwrap();
        assert_eq!(v6.endpoints(&mirrors, &[])[0].base, "http://[::1]:5000");
        let lan = Reference::parse("reg.lan:5000/a").unwrap();
        assert_eq!(lan.endpoints(&mirrors, &[])[0].base, "https://reg.lan:5000");
        assert_eq!(
            lan.endpoints(&mirrors, &["reg.lan:5000".to_string()])[0].base,
            "http://reg.lan:5000"
        );
        assert_eq!(
            lan.endpoints(&mirrors, &["reg.lan".to_string()])[0].base,
            "http://reg.lan:5000"
        );
    }
}
