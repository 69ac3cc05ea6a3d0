//! The runtime ID: the name of a Sandbox's instance in the runtime.
//!
//! The sandbox controller creates the instance under it, and the gateway, the probes and the
//! checkpoint controller find the instance by it, so they compute it here. It is
//! `<namespace>--<name>-<uid>`: stable for the object's whole life, different for a new object
//! of the same name (the uid differs), and always a valid runtime sandbox id (ASCII letters,
//! digits, `.`, `_`, `-`; at most [`MAX_LEN`]; not starting with `.` or `-`).

/// The longest runtime ID: the runtime's own limit on a sandbox id (`oka_runtime_api`'s
/// `MAX_ID_LEN`, checked against it where the two meet).
pub const MAX_LEN: usize = 128;

/// Why a Sandbox has no runtime ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeIdError {
    /// The object lacks a field the store always sets (`name`, `uid`).
    #[error("the sandbox has no metadata.{0}")]
    MissingMetadata(&'static str),
}

/// The runtime ID of `sandbox`.
///
/// Characters outside `[A-Za-z0-9._-]` become `-`; when too long for [`MAX_LEN`], the
/// `<namespace>--<name>` part is cut (the uid keeps it unique), and a uid longer than 64
/// characters is replaced by its FNV-1 hash.
///
/// # Errors
///
/// [`RuntimeIdError::MissingMetadata`] when the name or uid is not set.
pub fn runtime_id(sandbox: &crate::Sandbox) -> Result<String, RuntimeIdError> {
    let meta = &sandbox.metadata;
    let name = meta.name.as_deref().filter(|n| !n.is_empty());
    let name = name.ok_or(RuntimeIdError::MissingMetadata("name"))?;
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let uid = meta.uid.as_deref().filter(|u| !u.is_empty());
    let uid = uid.ok_or(RuntimeIdError::MissingMetadata("uid"))?;
    let uid = if uid.len() <= 64 {
        sanitize(uid)
    } else {
        format!("{:08x}", crate::fnv::fnv1_32(uid.as_bytes()))
    };
    let prefix =
        if namespace.is_empty() { name.to_owned() } else { format!("{namespace}--{name}") };
    let mut prefix = sanitize(&prefix);
    prefix.truncate(MAX_LEN - 1 - uid.len());
    let prefix = prefix.trim_start_matches(['.', '-']);
    let prefix = if prefix.is_empty() { "sandbox" } else { prefix };
    Ok(format!("{prefix}-{uid}"))
}

fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(namespace: &str, name: &str, uid: Option<&str>) -> crate::Sandbox {
        let mut sandbox = crate::Sandbox::new(name, crate::SandboxSpec::default());
        sandbox.metadata.namespace = Some(namespace.to_owned());
        sandbox.metadata.uid = uid.map(str::to_owned);
        sandbox
    }

    fn valid(id: &str) -> bool {
        !id.is_empty()
            && id.len() <= MAX_LEN
            && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            && !id.starts_with(['.', '-'])
    }

    #[test]
    fn runtime_ids_are_stable_unique_and_valid() {
        let a = sandbox("default", "sbx", Some("sbx-uid"));
        assert_eq!(runtime_id(&a), Ok("default--sbx-sbx-uid".to_owned()));
        let again = sandbox("default", "sbx", Some("another-uid"));
        assert_ne!(runtime_id(&again), runtime_id(&a), "a new object is a new instance");
        let long_name = format!("{}.x", "n".repeat(250));
        let uid = "7c5b5a0e-3a3b-4b8e-9d49-2b1f1d3f9a10";
        let id = runtime_id(&sandbox("default", &long_name, Some(uid))).unwrap();
        assert!(valid(&id) && id.ends_with(&format!("-{uid}")), "{id}");
        let long_uid = "u".repeat(65);
        let id = runtime_id(&sandbox("-", "..", Some(&long_uid))).unwrap();
        assert!(valid(&id), "{id}");
        assert_eq!(
            runtime_id(&sandbox("default", "sbx", None)),
            Err(RuntimeIdError::MissingMetadata("uid"))
        );
    }
}
