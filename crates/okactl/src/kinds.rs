//! The agents.kruise.io kinds `get` and `delete` know, by every name kubectl accepts for them.

/// The API group of every kind.
pub const GROUP: &str = "agents.kruise.io";
/// Its version.
pub const VERSION: &str = "v1alpha1";

/// One kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// The resource in URLs (`sandboxsets`).
    pub plural: &'static str,
    /// The singular (`sandboxset`), which kubectl's `-o name` and `deleted` lines use.
    pub singular: &'static str,
    /// The short name (`sbs`).
    pub short: &'static str,
    /// The kind (`SandboxSet`).
    pub kind: &'static str,
}

/// Every kind, in the order `okactl get --help` lists them.
pub const KINDS: &[Kind] = &[
    Kind { plural: "sandboxes", singular: "sandbox", short: "sbx", kind: "Sandbox" },
    Kind { plural: "sandboxsets", singular: "sandboxset", short: "sbs", kind: "SandboxSet" },
    Kind { plural: "sandboxclaims", singular: "sandboxclaim", short: "sbc", kind: "SandboxClaim" },
    Kind {
        plural: "sandboxtemplates",
        singular: "sandboxtemplate",
        short: "sbt",
        kind: "SandboxTemplate",
    },
    Kind {
        plural: "sandboxupdateops",
        singular: "sandboxupdateops",
        short: "suo",
        kind: "SandboxUpdateOps",
    },
    Kind { plural: "checkpoints", singular: "checkpoint", short: "cp", kind: "Checkpoint" },
    Kind {
        plural: "poolautoscalers",
        singular: "poolautoscaler",
        short: "pas",
        kind: "PoolAutoscaler",
    },
];

impl Kind {
    /// The kind `name` names: its plural, singular, short name or kind, in any case, optionally
    /// followed by `.agents.kruise.io`, as kubectl accepts them.
    pub fn find(name: &str) -> Option<Kind> {
        let lower = name.to_ascii_lowercase();
        let bare = lower.strip_suffix(".agents.kruise.io").unwrap_or(&lower);
        KINDS.iter().copied().find(|k| {
            [k.plural, k.singular, k.short].contains(&bare) || k.kind.eq_ignore_ascii_case(bare)
        })
    }

    /// `sandboxset.agents.kruise.io`, kubectl's name of the kind in its output lines.
    pub fn qualified(&self) -> String {
        format!("{}.{GROUP}", self.singular)
    }

    /// The URL path of the collection, in `namespace` or (None) across all namespaces.
    pub fn path(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) => format!("/apis/{GROUP}/{VERSION}/namespaces/{ns}/{}", self.plural),
            None => format!("/apis/{GROUP}/{VERSION}/{}", self.plural),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_kubectl_accepts_finds_the_kind() {
        for name in
            ["sbs", "sandboxset", "sandboxsets", "SandboxSet", "sandboxsets.agents.kruise.io"]
        {
            assert_eq!(Kind::find(name).map(|k| k.plural), Some("sandboxsets"), "{name}");
        }
        assert_eq!(Kind::find("suo").map(|k| k.singular), Some("sandboxupdateops"));
        assert_eq!(Kind::find("pods"), None);
    }
}
