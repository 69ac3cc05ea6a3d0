//! Registry credentials and the distribution API's authentication rules, pure: credentials
//! from a `.dockerconfigjson` (an `imagePullSecret`), which credentials belong to a registry
//! (Docker Hub answers to several names), the `WWW-Authenticate` challenge (Basic, or Bearer
//! with realm/service/scope), the token request, and the token service's answer.

use base64::Engine as _;
use serde::Deserialize;
use std::collections::BTreeMap;

use crate::error::ImageError;
use crate::reference::DOCKER_HUB;

/// Credentials for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryAuth {
    /// The registry they are for (`docker.io`, `registry.example:5000`); a URL's scheme and
    /// path are ignored when matching.
    pub registry: String,
    /// User name.
    pub username: String,
    /// Password or token.
    pub password: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("registry", &self.registry)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerAuthEntry>,
}

#[derive(Deserialize, Default)]
struct DockerAuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

impl RegistryAuth {
    /// The credentials of a `.dockerconfigjson` (a `kubernetes.io/dockerconfigjson` Secret's
    /// data): each `auths` entry's `auth` (base64 of `user:pass`) or its `username` and
    /// `password`; the key `https://index.docker.io/v1/` (and any other spelling of Docker
    /// Hub) means `docker.io`. Entries with neither are skipped.
    pub fn from_docker_config_json(bytes: &[u8]) -> Result<Vec<RegistryAuth>, ImageError> {
        let config: DockerConfig = serde_json::from_slice(bytes)
            .map_err(|e| ImageError::InvalidDockerConfig(e.to_string()))?;
        let mut out = Vec::new();
        for (key, entry) in config.auths {
            let registry = normalize_registry(&key);
            let (username, password) = match (&entry.auth, &entry.username, &entry.password) {
                (Some(auth), _, _) if !auth.is_empty() => {
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(auth.trim())
                        .map_err(|e| {
                            ImageError::InvalidDockerConfig(format!("auths[{key:?}].auth: {e}"))
                        })?;
                    let decoded = String::from_utf8(decoded).map_err(|_| {
                        ImageError::InvalidDockerConfig(format!("auths[{key:?}].auth is not UTF-8"))
                    })?;
                    let Some((user, pass)) = decoded.split_once(':') else {
                        return Err(ImageError::InvalidDockerConfig(format!(
                            "auths[{key:?}].auth is not base64 of user:password"
                        )));
                    };
                    (user.to_string(), pass.to_string())
                }
                (_, Some(user), Some(pass)) => (user.clone(), pass.clone()),
                _ => continue,
            };
            out.push(RegistryAuth { registry, username, password });
        }
        Ok(out)
    }

    /// Whether these credentials are for `registry` (as a reference or endpoint names it).
    pub fn matches(&self, registry: &str) -> bool {
        normalize_registry(&self.registry) == normalize_registry(registry)
    }
}

/// A registry name as credentials are matched: scheme, path and a trailing slash removed,
/// Docker Hub's names (`index.docker.io`, `registry-1.docker.io`, `https://index.docker.io/v1/`)
/// as `docker.io`.
pub fn normalize_registry(name: &str) -> String {
    let name = name.trim();
    let name = name.split_once("://").map_or(name, |(_, rest)| rest);
    let host = name.split('/').next().unwrap_or_default().to_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            DOCKER_HUB.to_string()
        }
        _ => host,
    }
}

/// A `WWW-Authenticate` challenge this client can answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    /// `Basic realm=…`: send the credentials with every request.
    Basic,
    /// `Bearer realm=…,service=…,scope=…`: get a token from the realm.
    Bearer {
        /// The token service URL.
        realm: String,
        /// The `service` parameter.
        service: Option<String>,
        /// The `scope` the registry asked for (absent on `/v2/`).
        scope: Option<String>,
    },
}

/// Parses a `WWW-Authenticate` header value (`Bearer realm="…",service="…"`); `None` for a
/// scheme other than Basic or Bearer.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, params) = header.split_once(char::is_whitespace).unwrap_or((header, ""));
    let params = parse_params(params);
    match scheme.to_ascii_lowercase().as_str() {
        "basic" => Some(Challenge::Basic),
        "bearer" => Some(Challenge::Bearer {
            realm: params.get("realm")?.clone(),
            service: params.get("service").cloned(),
            scope: params.get("scope").cloned(),
        }),
        _ => None,
    }
}

/// `key="value", key=value` pairs (quoted values may contain commas and escaped quotes).
fn parse_params(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            chars.next();
        }
        let key: String = chars
            .by_ref()
            .take_while(|c| *c != '=')
            .collect::<String>()
            .trim()
            .to_ascii_lowercase();
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.peek().copied() {
                if c == ',' {
                    break;
                }
                value.push(c);
                chars.next();
            }
            value = value.trim().to_string();
        }
        out.insert(key, value);
    }
    out
}

/// The token request's URL: the realm with `service` and `scope` as query parameters.
pub fn token_url(realm: &str, service: Option<&str>, scope: &str) -> String {
    let mut url = realm.to_string();
    let mut sep = if realm.contains('?') { '&' } else { '?' };
    if let Some(service) = service {
        url.push(sep);
        url.push_str("service=");
        url.push_str(&query_escape(service));
        sep = '&';
    }
    url.push(sep);
    url.push_str("scope=");
    url.push_str(&query_escape(scope));
    url
}

fn query_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b':' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The pull scope of a repository.
pub fn pull_scope(repository: &str) -> String {
    format!("repository:{repository}:pull")
}

/// The `Authorization` value of Basic credentials.
pub fn basic_header(auth: &RegistryAuth) -> String {
    let pair = format!("{}:{}", auth.username, auth.password);
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
}

#[derive(Deserialize)]
struct TokenResponse {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

/// The token of a token service's answer: `token`, else `access_token` (OAuth2's name).
pub fn parse_token_response(body: &[u8]) -> Result<String, String> {
    let response: TokenResponse =
        serde_json::from_slice(body).map_err(|e| format!("invalid token response: {e}"))?;
    response
        .token
        .filter(|t| !t.is_empty())
        .or(response.access_token.filter(|t| !t.is_empty()))
        .ok_or_else(|| "token response has neither token nor access_token".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_config_json_auths() {
        let json = br#"{"auths":{
            "https://index.docker.io/v1/":{"auth":"dXNlcjpwYTpzcw=="},
            "registry.example:5000":{"username":"bob","password":"secret"},
            "http://127.0.0.1:5000/v2/":{"auth":"YWxpY2U6cHc="},
            "empty.example":{}
        }}"#;
        let auths = RegistryAuth::from_docker_config_json(json).unwrap();
        let found: Vec<(String, String, String)> = auths
            .iter()
            .map(|a| (a.registry.clone(), a.username.clone(), a.password.clone()))
            .collect();
        assert_eq!(
            found,
            [
                ("127.0.0.1:5000".into(), "alice".into(), "pw".into()),
                ("docker.io".into(), "user".into(), "pa:ss".into()),
                ("registry.example:5000".into(), "bob".into(), "secret".into()),
            ]
        );
        assert!(auths[1].matches("docker.io") && auths[1].matches("registry-1.docker.io"));
        assert!(!auths[2].matches("registry.example"));
        assert!(RegistryAuth::from_docker_config_json(b"{").is_err());
        assert!(
            RegistryAuth::from_docker_config_json(br#"{"auths":{"r":{"auth":"!!"}}}"#).is_err()
        );
        assert!(
            RegistryAuth::from_docker_config_json(br#"{"auths":{"r":{"auth":"bm9jb2xvbg=="}}}"#)
                .is_err()
        );
        assert!(!format!("{:?}", auths[0]).contains("pw"));
    }

    #[test]
    fn challenges() {
        assert_eq!(parse_challenge(r#"Basic realm="Registry Realm""#), Some(Challenge::Basic));
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge("bearer realm=http://127.0.0.1:1/t"),
            Some(Challenge::Bearer {
                realm: "http://127.0.0.1:1/t".into(),
                service: None,
                scope: None
            })
        );
        assert_eq!(parse_challenge("Bearer service=x"), None);
        assert_eq!(parse_challenge("Negotiate abc"), None);
        assert_eq!(
            token_url("https://a/token", Some("reg istry"), "repository:a/b:pull"),
            "https://a/token?service=reg%20istry&scope=repository:a/b:pull"
        );
        assert_eq!(token_url("https://a/t?x=1", None, "s"), "https://a/t?x=1&scope=s");
        assert_eq!(parse_token_response(br#"{"access_token":"a"}"#), Ok("a".into()));
        assert_eq!(parse_token_response(br#"{"token":"t","access_token":"a"}"#), Ok("t".into()));
        assert!(parse_token_response(br#"{}"#).is_err());
    }
}
