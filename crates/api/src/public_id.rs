//! The public sandbox ID: the name E2B clients use for a claimed sandbox.
//!
//! The manager hands it out, the gateway routes requests by it, and probes substitute it for
//! `$(SANDBOX_ID)`, so all three read it here: label `agents.kruise.io/sandbox-id` when set and
//! not empty, else the reference's legacy `<namespace>--<name>`.

use crate::{Sandbox, labels};

/// The reference's legacy public ID of a sandbox without an ID label: `<namespace>--<name>`.
pub fn legacy(namespace: &str, name: &str) -> String {
    format!("{namespace}--{name}")
}

/// The ID the sandbox is known by, claimed or not: its `agents.kruise.io/sandbox-id` label
/// when set and not empty, else [`legacy`].
pub fn of(sandbox: &Sandbox) -> String {
    let meta = &sandbox.metadata;
    match meta.labels.as_ref().and_then(|l| l.get(labels::SANDBOX_ID)).filter(|id| !id.is_empty()) {
        Some(id) => id.clone(),
        None => legacy(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        ),
    }
}

/// The public ID of a claimed sandbox (label `agents.kruise.io/sandbox-claimed: "true"`), the
/// one it is routed under; `None` for a sandbox that is not claimed.
pub fn of_claimed(sandbox: &Sandbox) -> Option<String> {
    let labels = sandbox.metadata.labels.as_ref()?;
    if labels.get(labels::SANDBOX_CLAIMED).is_none_or(|v| v != labels::TRUE) {
        return None;
    }
    Some(of(sandbox))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn sandbox(pairs: &[(&str, &str)]) -> Sandbox {
        let mut sandbox = Sandbox::new("sbx", crate::SandboxSpec::default());
        sandbox.metadata.namespace = Some("team".into());
        let labels: BTreeMap<String, String> =
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        sandbox.metadata.labels = Some(labels);
        sandbox
    }

    #[test]
    fn the_label_wins_and_the_legacy_form_fills_in() {
        let claimed = (labels::SANDBOX_CLAIMED, labels::TRUE);
        assert_eq!(
            of_claimed(&sandbox(&[claimed, (labels::SANDBOX_ID, "abc")])),
            Some("abc".into())
        );
        assert_eq!(of_claimed(&sandbox(&[claimed])), Some("team--sbx".into()));
        assert_eq!(
            of_claimed(&sandbox(&[claimed, (labels::SANDBOX_ID, "")])),
            Some("team--sbx".into())
        );
        assert_eq!(of_claimed(&sandbox(&[(labels::SANDBOX_ID, "abc")])), None, "not claimed");
        assert_eq!(of_claimed(&sandbox(&[(labels::SANDBOX_CLAIMED, "false")])), None);
        assert_eq!(of(&sandbox(&[(labels::SANDBOX_ID, "abc")])), "abc");
        assert_eq!(of(&sandbox(&[])), "team--sbx");
    }
}
