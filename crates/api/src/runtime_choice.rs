//! Which runtime runs a sandbox on a cluster: an ordinary Pod, or oka's node agent.
//!
//! The rule, written once (placement, the Pod runtime's controller and the migration use it):
//!
//! 1. the annotation [`annotations::RUNTIME`] (`pod` | `node`) on the Sandbox, else on its pod
//!    template's metadata, wins;
//! 2. else a pod template whose `runtimeClassName` is [`annotations::NODE_RUNTIME_CLASS`]
//!    (`oka-node`) runs on a node agent (any other runtime class is a Pod runtime class and
//!    passed through to the Pod);
//! 3. else the cluster's default (`cluster.defaultRuntime`).
//!
//! An annotation value other than `pod` or `node` is ignored (the next rule decides).

use k8s_openapi::api::core::v1::PodTemplateSpec;

use crate::{Sandbox, annotations};

/// Where a sandbox runs on a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SandboxRuntime {
    /// An ordinary Pod, run by the kubelet (the reference's model).
    #[default]
    Pod,
    /// oka's node agent (`oka node`).
    Node,
}

impl SandboxRuntime {
    /// Parses `pod` or `node`.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            annotations::RUNTIME_POD => Some(Self::Pod),
            annotations::RUNTIME_NODE => Some(Self::Node),
            _ => None,
        }
    }

    /// `pod` or `node`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pod => annotations::RUNTIME_POD,
            Self::Node => annotations::RUNTIME_NODE,
        }
    }
}

/// The runtime of `sandbox` whose resolved pod template is `template` (`None` while a
/// `templateRef`'s SandboxTemplate is not known: then only the annotation and the default
/// decide), on a cluster whose default is `default`.
pub fn sandbox_runtime(
    sandbox: &Sandbox,
    template: Option<&PodTemplateSpec>,
    default: SandboxRuntime,
) -> SandboxRuntime {
    let annotated = |annotations: Option<&std::collections::BTreeMap<String, String>>| {
        annotations.and_then(|a| a.get(annotations::RUNTIME)).and_then(|v| SandboxRuntime::parse(v))
    };
    let template_meta = template.and_then(|t| t.metadata.as_ref());
    if let Some(runtime) = annotated(sandbox.metadata.annotations.as_ref())
        .or_else(|| annotated(template_meta.and_then(|m| m.annotations.as_ref())))
    {
        return runtime;
    }
    let class =
        template.and_then(|t| t.spec.as_ref()).and_then(|s| s.runtime_class_name.as_deref());
    if class == Some(annotations::NODE_RUNTIME_CLASS) {
        return SandboxRuntime::Node;
    }
    default
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn sandbox(annotation: Option<&str>) -> Sandbox {
        let mut s = Sandbox::new("s", crate::SandboxSpec::default());
        if let Some(v) = annotation {
            s.metadata.annotations = Some([(annotations::RUNTIME.to_owned(), v.to_owned())].into());
        }
        s
    }

    fn template(class: Option<&str>, annotation: Option<&str>) -> PodTemplateSpec {
        PodTemplateSpec {
            metadata: annotation.map(|v| ObjectMeta {
                annotations: Some([(annotations::RUNTIME.to_owned(), v.to_owned())].into()),
                ..ObjectMeta::default()
            }),
            spec: Some(PodSpec {
                runtime_class_name: class.map(str::to_owned),
                ..PodSpec::default()
            }),
        }
    }

    #[test]
    fn the_annotation_wins_over_the_runtime_class_and_the_default() {
        let node_class = template(Some("oka-node"), None);
        assert_eq!(
            sandbox_runtime(&sandbox(Some("pod")), Some(&node_class), SandboxRuntime::Node),
            SandboxRuntime::Pod
        );
        assert_eq!(
            sandbox_runtime(&sandbox(Some("node")), None, SandboxRuntime::Pod),
            SandboxRuntime::Node
        );
        let annotated = template(None, Some("node"));
        assert_eq!(
            sandbox_runtime(&sandbox(None), Some(&annotated), SandboxRuntime::Pod),
            SandboxRuntime::Node
        );
    }

    #[test]
    fn the_oka_node_runtime_class_means_the_node_agent_and_others_the_default() {
        let node_class = template(Some("oka-node"), None);
        let gvisor = template(Some("gvisor"), None);
        assert_eq!(
            sandbox_runtime(&sandbox(None), Some(&node_class), SandboxRuntime::Pod),
            SandboxRuntime::Node
        );
        assert_eq!(
            sandbox_runtime(&sandbox(None), Some(&gvisor), SandboxRuntime::Node),
            SandboxRuntime::Node
        );
        assert_eq!(
            sandbox_runtime(&sandbox(None), Some(&gvisor), SandboxRuntime::Pod),
            SandboxRuntime::Pod
        );
    }

    #[test]
    fn an_unknown_annotation_value_is_ignored() {
        assert_eq!(
            sandbox_runtime(&sandbox(Some("vm")), None, SandboxRuntime::Node),
            SandboxRuntime::Node
        );
        assert_eq!(SandboxRuntime::parse("pod"), Some(SandboxRuntime::Pod));
        assert_eq!(SandboxRuntime::Node.as_str(), "node");
    }
}
