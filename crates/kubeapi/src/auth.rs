//! Who a request is, and what it may touch, as the API server's authentication and RBAC would
//! answer: the admin token sees everything; a team's API key sees its own namespace only, and
//! anything else is 403 Forbidden with RBAC's wording. Discovery and OpenAPI are open to every
//! authenticated caller, as `system:discovery` grants them on a cluster.

use futures::future::BoxFuture;

use crate::status::ApiStatus;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The user name RBAC messages show.
    pub name: String,
    /// The one namespace it may use; `None` for every namespace and the cluster scope.
    pub namespace: Option<String>,
}

/// Resolves bearer tokens other than the admin token (a team's API keys).
pub trait Authenticator: Send + Sync + 'static {
    /// The caller `token` belongs to, if any.
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Option<Principal>>;
}

/// What a request does, read from its method, path and query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: &'static str,
    /// The API group (`""` for the core group).
    pub group: String,
    /// The group's version.
    pub version: String,
    /// The resource (`sandboxsets`).
    pub resource: String,
    /// The namespace, when the request names one.
    pub namespace: Option<String>,
}

/// The access a resource request asks for; `None` for discovery and OpenAPI paths.
pub fn access(method: &str, path: &str, watch: bool) -> Option<Access> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => (String::new(), "v1".to_owned(), rest),
        ["apis", group, version, rest @ ..] => ((*group).to_owned(), (*version).to_owned(), rest),
        _ => return None,
    };
    let (namespace, resource, named) = match rest {
        [] => return None,
        ["namespaces", ns] => (None, "namespaces", Some(*ns)),
        ["namespaces", ns, "status" | "finalize"] => (None, "namespaces", Some(*ns)),
        ["namespaces", ns, resource, rest @ ..] => (Some(*ns), *resource, rest.first().copied()),
        [resource, rest @ ..] => (None, *resource, rest.first().copied()),
    };
    let verb = match (method, named.is_some()) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "get",
    };
    Some(Access {
        verb,
        group,
        version,
        resource: resource.to_owned(),
        namespace: namespace.map(str::to_owned),
    })
}

/// Whether `principal` may do `access`; 403 Forbidden worded as RBAC words it when not.
pub fn authorize(principal: &Principal, access: &Access) -> Result<(), ApiStatus> {
    let Some(own) = &principal.namespace else { return Ok(()) };
    if access.namespace.as_deref() == Some(own.as_str()) {
        return Ok(());
    }
    // A team reads its own Namespace object.
    if access.resource == "namespaces" && access.verb == "get" && access.namespace.is_none() {
        return Ok(());
    }
    let qualified = if access.group.is_empty() {
        access.resource.clone()
    } else {
        format!("{}.{}", access.resource, access.group)
    };
    let scope = match &access.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_owned(),
    };
    Err(ApiStatus::forbidden(
        format!(
            "{qualified} is forbidden: User \"{}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
            principal.name, access.verb, access.resource, access.group
        ),
        &access.group,
        &access.resource,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn team() -> Principal {
        Principal { name: "team-a".into(), namespace: Some("team-a".into()) }
    }

    #[test]
    fn requests_read_as_rbac_reads_them() {
        let a = access("GET", "/apis/agents.kruise.io/v1alpha1/namespaces/x/sandboxes", false);
        assert_eq!(
            a,
            Some(Access {
                verb: "list",
                group: "agents.kruise.io".into(),
                version: "v1alpha1".into(),
                resource: "sandboxes".into(),
                namespace: Some("x".into())
            })
        );
        let a = access("DELETE", "/api/v1/namespaces/x/secrets/s", false).unwrap();
        assert_eq!((a.verb, a.group.as_str(), a.resource.as_str()), ("delete", "", "secrets"));
        let a = access("GET", "/apis/agents.kruise.io/v1alpha1/sandboxsets", true).unwrap();
        assert_eq!((a.verb, a.namespace), ("watch", None));
        assert_eq!(access("GET", "/apis/agents.kruise.io/v1alpha1", false), None);
        assert_eq!(access("GET", "/version", false), None);
    }

    #[test]
    fn a_team_stays_in_its_namespace() {
        let own = access(
            "PATCH",
            "/apis/agents.kruise.io/v1alpha1/namespaces/team-a/sandboxsets/p",
            false,
        )
        .unwrap();
        assert_eq!(authorize(&team(), &own), Ok(()));
        let other =
            access("GET", "/apis/agents.kruise.io/v1alpha1/namespaces/default/sandboxsets", false)
                .unwrap();
        let e = authorize(&team(), &other).unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "sandboxsets.agents.kruise.io is forbidden: User \"team-a\" cannot list resource \"sandboxsets\" in API group \"agents.kruise.io\" in the namespace \"default\""
        );
        let all = access("GET", "/apis/agents.kruise.io/v1alpha1/sandboxes", false).unwrap();
        assert!(authorize(&team(), &all).unwrap_err().message.ends_with("at the cluster scope"));
        let admin = Principal { name: "admin".into(), namespace: None };
        assert_eq!(authorize(&admin, &all), Ok(()));
    }
}
