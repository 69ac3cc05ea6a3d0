//! From a Sandbox and its resolved pod template to what the runtime runs: [`runtime_id`] and
//! [`resolve_runtime_spec`]. Pure functions; the template is looked up by the caller.
//!
//! # What is taken from the pod template
//!
//! Only the **first container** runs (sidecars and init containers need pods):
//!
//! | pod template | runtime spec |
//! |---|---|
//! | `command`, `args` | [`ProcessSpec::command`], [`ProcessSpec::args`] (args alone name the program); with an OCI image, Kubernetes' rule against its `Entrypoint`/`Cmd` ([`imageconfig`](super::imageconfig)) |
//! | `envFrom`, `env[].value`, `env[].valueFrom` (`configMapKeyRef`, `secretKeyRef`, `fieldRef`) | [`ProcessSpec::env`], after an OCI image's `Env`, with `$(VAR)` expanded ([`super::inputs::environment`]) |
//! | `volumes` (`emptyDir`, `hostPath`, `configMap`, `secret`) with the container's `volumeMounts` | [`SandboxSpec::mounts`](oka_runtime_api::SandboxSpec::mounts) ([`super::inputs::mounts`]), a ConfigMap's or Secret's keys as files |
//! | `securityContext.readOnlyRootFilesystem`, `capabilities`, `allowPrivilegeEscalation: false`; pod `fsGroup` | [`SandboxSpec::security`](oka_runtime_api::SandboxSpec::security) |
//! | pod `securityContext.supplementalGroups` | [`ProcessSpec::supplementary_groups`] |
//! | `securityContext.runAsNonRoot` (container, else pod) | refused ([`ResolveError::RunAsRoot`]) when the user is root |
//! | pod `hostUsers: false` | [`UserNamespace::DEFAULT_REMAPPED`], unless the annotation below says otherwise |
//! | anything of [`oka_api::local_runtime`]'s table | refused, every field by its path ([`ResolveError::Unsupported`]) |
//! | `startupProbe` (`exec`, `httpGet`, `tcpSocket`) | [`ProcessSpec::startup_check`] ([`super::startup`]): the sandbox is ready only once it passed |
//! | `workingDir` | [`ProcessSpec::working_dir`], else an OCI image's `WorkingDir` |
//! | `securityContext.runAsUser/runAsGroup` (container, else pod) | [`ProcessSpec::user`], else an OCI image's `USER` (names from its `/etc/passwd`, `/etc/group`) |
//! | `resources.limits.cpu` / `.memory` | [`ResourceLimits`], rounded up to a millicpu / a byte |
//! | `image`: absent or empty | [`RootFs::Default`], the runtime's default root |
//! | `image`: an absolute path | [`RootFs::Directory`] |
//! | `image`: any other value, an OCI image reference | [`RootFs::Layers`], the layers of the image as pulled ([`super::image`]); until it is pulled the spec is [`ResolveError::ImageNotPulled`], never another root |
//! | `imagePullPolicy`, pod `imagePullSecrets` | how and with which credentials the image is pulled ([`super::image`]), not part of the spec |
//! | annotation `agents.kruise.io/network` (`loopback`, `outbound`) | [`SandboxSpec::network`](oka_runtime_api::SandboxSpec::network): loopback only when absent |
//! | annotation `agents.kruise.io/user-namespace` (`host`, `remapped`) | [`SandboxSpec::user_namespace`](oka_runtime_api::SandboxSpec::user_namespace): `remapped` is [`UserNamespace::DEFAULT_REMAPPED`], the same range for every sandbox |
//! | annotations `kubernetes.io/egress-bandwidth`, `kubernetes.io/ingress-bandwidth` (quantities of bits per second, `10M`) | [`SandboxSpec::bandwidth`](oka_runtime_api::SandboxSpec::bandwidth): `tc` on the host end; refused for a loopback-only sandbox |
//! | the Sandbox's annotation `agents.kruise.io/restore-from` (a checkpoint ID) | [`SandboxSpec::from_snapshot`](oka_runtime_api::SandboxSpec::from_snapshot): the sandbox is created from that snapshot (the runtime's snapshot of the same name, see [`crate::checkpoint`]) |
//!
//! Plus what belongs to the sandbox: the hostname is the sandbox's name (cut to a valid
//! hostname), the PID limit is [`DEFAULT_PIDS_LIMIT`], and the id is [`runtime_id`].
//!
//! Only `Entrypoint`, `Cmd`, `Env`, `WorkingDir` and `User` of an image's configuration are
//! used; its `ExposedPorts`, `Volumes`, `StopSignal` and `Healthcheck` are not (nor by the
//! kubelet, but for the stop signal).

use std::path::PathBuf;

use super::image::{PulledImage, TemplateImage};
use super::imageconfig;
use super::inputs::{self, PodInputs};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use oka_api::quantity::{self, Rounding};
use oka_api::runtime_id::RuntimeIdError;
use oka_api::{Sandbox, annotations};
use oka_runtime_api::spec::MAX_ID_LEN;
use oka_runtime_api::{
    NetworkMode, ProcessSpec, ResourceLimits, RootFs, SandboxId, SpecError, User, UserNamespace,
};

/// The PID limit every sandbox gets (the pod template has no way to say it): enough for a
/// language server and a build, small enough that a fork bomb stops quickly.
pub const DEFAULT_PIDS_LIMIT: u64 = 1024;

/// Why a Sandbox cannot be turned into a runtime spec. The message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The object lacks a field the store always sets (name, namespace, uid).
    #[error("the sandbox has no metadata.{0}")]
    MissingMetadata(&'static str),
    /// The Sandbox has neither `spec.template` nor `spec.templateRef`.
    #[error("the sandbox has neither spec.template nor spec.templateRef")]
    NoTemplate,
    /// `spec.templateRef` names a SandboxTemplate that does not exist or has no template.
    #[error("SandboxTemplate {0} not found, or it has no template")]
    TemplateNotFound(String),
    /// The pod template has no container to run.
    #[error("the pod template has no containers: add one with the command to run")]
    NoContainer,
    /// The template sets fields oka's runtime cannot honour ([`oka_api::local_runtime`]).
    #[error("{}", .0.join("; "))]
    Unsupported(Vec<String>),
    /// A volume cannot be set up: a ConfigMap or Secret (or a key of it) it needs is missing.
    /// The kubelet's `FailedMount`.
    #[error("MountVolume.SetUp failed for volume {volume:?} : {message}")]
    FailedMount {
        /// The volume's name.
        volume: String,
        /// What is missing (`configmap "x" not found`).
        message: String,
    },
    /// A volume or mount of the template is not usable (an unknown volume, a bad type or size).
    #[error("volume {volume}: {reason}")]
    Volume {
        /// The volume's name.
        volume: String,
        /// What is wrong.
        reason: String,
    },
    /// The container's configuration cannot be made: a ConfigMap, Secret or key its env needs
    /// is missing. The kubelet's `CreateContainerConfigError`.
    #[error("{message}")]
    ContainerConfig {
        /// The container's name.
        container: String,
        /// The kubelet's words (`configmap "x" not found`).
        message: String,
    },
    /// `runAsNonRoot` with a user that is root. The kubelet's `CreateContainerConfigError`.
    #[error("container has runAsNonRoot and image will run as root (container: {container})")]
    RunAsRoot {
        /// The container's name.
        container: String,
    },
    /// A resource limit is not a Kubernetes quantity, or is out of range.
    #[error("container {container}: invalid {resource} limit {value:?}: {reason}")]
    Quantity {
        /// The container's name.
        container: String,
        /// `cpu` or `memory`.
        resource: &'static str,
        /// The quantity as written.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `runAsUser` or `runAsGroup` is not a 32-bit id.
    #[error("container {container}: {field} {value} is not a valid user or group id")]
    InvalidUser {
        /// The container's name.
        container: String,
        /// `runAsUser`, `runAsGroup`, `fsGroup` or `supplementalGroups`.
        field: &'static str,
        /// The value given.
        value: i64,
    },
    /// An oka annotation of the pod template has a value it does not take.
    #[error("annotation {key} of the pod template is {value:?}: use {expected}")]
    InvalidAnnotation {
        /// The annotation.
        key: &'static str,
        /// The value given.
        value: String,
        /// The values it takes.
        expected: &'static str,
    },
    /// The template names an OCI image that is not pulled yet.
    #[error("image {0:?} is not pulled yet")]
    ImageNotPulled(String),
    /// The image's `USER` names an account the image does not have.
    #[error("container {container}: {source}")]
    ImageUser {
        /// The container's name.
        container: String,
        /// What is missing.
        #[source]
        source: super::imageconfig::ImageUserError,
    },
    /// The container's `startupProbe` sets a field that is not honoured, or a value that is
    /// not valid ([`super::startup`]).
    #[error("container {container}: {field}: {reason}")]
    StartupProbe {
        /// The container's name.
        container: String,
        /// The probe's field, `startupProbe.grpc`.
        field: String,
        /// What is wrong, or what to do instead.
        reason: String,
    },
    /// The resulting spec cannot run (no command, relative working directory, ...).
    #[error(transparent)]
    Spec(#[from] SpecError),
}

/// The id of the Sandbox's runtime instance: [`oka_api::runtime_id::runtime_id`], the one
/// rule, as the runtime's [`SandboxId`].
///
/// # Errors
///
/// [`ResolveError::MissingMetadata`] when the name or uid is not set.
pub fn runtime_id(sandbox: &Sandbox) -> Result<SandboxId, ResolveError> {
    let id = oka_api::runtime_id::runtime_id(sandbox).map_err(|e| match e {
        RuntimeIdError::MissingMetadata(field) => ResolveError::MissingMetadata(field),
    })?;
    Ok(SandboxId::new(id)?)
}

// The API's rule keeps its ids within what the runtime accepts.
const _: () = assert!(oka_api::runtime_id::MAX_LEN == MAX_ID_LEN);

/// The sandbox's hostname: its name, cut to 63 characters without a trailing `-` or `.`, and
/// lower case (a Kubernetes name already is).
pub fn hostname(name: &str) -> String {
    let cut: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '.') {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    let trimmed = cut.trim_matches(['-', '.']);
    if trimmed.is_empty() { "sandbox".to_owned() } else { trimmed.replace("..", ".") }
}

/// Converts `sandbox` with its resolved pod `template` (the inline `spec.template`, or the
/// SandboxTemplate's that `spec.templateRef` names) into the spec the runtime runs; see the
/// [module documentation](self) for what is taken from where. The result has passed
/// [`oka_runtime_api::SandboxSpec::validate`].
///
/// # Errors
///
/// [`ResolveError`] when the template asks for something the local runtime cannot do, or the
/// result would not run.
pub fn resolve_runtime_spec(
    sandbox: &Sandbox,
    template: &PodTemplateSpec,
) -> Result<oka_runtime_api::SandboxSpec, ResolveError> {
    resolve_runtime_spec_with(sandbox, template, None)
}

/// [`resolve_runtime_spec`] with the pulled `image` the template names (when it names an OCI
/// image reference): its layers are the root, and its configuration is merged with the
/// container's by Kubernetes' rules ([`super::imageconfig`]).
///
/// # Errors
///
/// As [`resolve_runtime_spec`]; [`ResolveError::ImageNotPulled`] when the template names an
/// image reference and `image` is `None`; [`ResolveError::ImageUser`] when the image's `USER`
/// names an account it lacks.
pub fn resolve_runtime_spec_with(
    sandbox: &Sandbox,
    template: &PodTemplateSpec,
    image: Option<&PulledImage>,
) -> Result<oka_runtime_api::SandboxSpec, ResolveError> {
    resolve_runtime_spec_from(sandbox, template, image, &PodInputs::default())
}

/// [`resolve_runtime_spec_with`] with the ConfigMaps and Secrets the template names, as read
/// from the store ([`super::inputs`]): its volumes and env from them.
///
/// # Errors
///
/// As [`resolve_runtime_spec_with`]; [`ResolveError::Unsupported`] for fields of the table
/// [`oka_api::local_runtime`]; [`ResolveError::FailedMount`] and
/// [`ResolveError::ContainerConfig`] for a missing object or key; [`ResolveError::RunAsRoot`].
pub fn resolve_runtime_spec_from(
    sandbox: &Sandbox,
    template: &PodTemplateSpec,
    image: Option<&PulledImage>,
    inputs: &PodInputs,
) -> Result<oka_runtime_api::SandboxSpec, ResolveError> {
    let id = runtime_id(sandbox)?;
    let unsupported = oka_api::local_runtime::unsupported_fields(template);
    if !unsupported.is_empty() {
        return Err(ResolveError::Unsupported(
            unsupported
                .iter()
                .map(|u| format!("spec.template.{}: {}", u.field, u.detail()))
                .collect(),
        ));
    }
    let pod = template.spec.as_ref();
    let container = pod.and_then(|p| p.containers.first()).ok_or(ResolveError::NoContainer)?;
    let default_pod = k8s_openapi::api::core::v1::PodSpec::default();
    let pod_spec = pod.unwrap_or(&default_pod);
    let cname = || container.name.clone();

    // Volumes are set up before the container's configuration is made, as the kubelet does.
    let mounts = inputs::mounts(pod_spec, container, inputs)?;
    let env = inputs::environment(sandbox, pod_spec, container, inputs)?;
    let security = inputs::security(pod_spec, container)?;
    let supplementary_groups = inputs::supplementary_groups(pod_spec, container)?;

    let container_security = container.security_context.as_ref();
    let pod_security = pod.and_then(|p| p.security_context.as_ref());
    let run_as_user = container_security
        .and_then(|s| s.run_as_user)
        .or_else(|| pod_security.and_then(|s| s.run_as_user));
    let run_as_group = container_security
        .and_then(|s| s.run_as_group)
        .or_else(|| pod_security.and_then(|s| s.run_as_group));
    let id_of = |field: &'static str, value: i64| {
        u32::try_from(value).map_err(|_| ResolveError::InvalidUser {
            container: cname(),
            field,
            value,
        })
    };
    let run_as_user = run_as_user.map(|u| id_of("runAsUser", u)).transpose()?;
    let run_as_group = run_as_group.map(|g| id_of("runAsGroup", g)).transpose()?;
    let (root, image) = match TemplateImage::of(template) {
        TemplateImage::None => (RootFs::Default, None),
        TemplateImage::Directory(dir) => (RootFs::Directory(PathBuf::from(dir)), None),
        TemplateImage::Reference(reference) => {
            let image = image.ok_or_else(|| ResolveError::ImageNotPulled(reference.to_owned()))?;
            (RootFs::Layers(image.layers.clone()), Some(image))
        }
    };
    let command = container.command.clone().unwrap_or_default();
    let args = container.args.clone().unwrap_or_default();
    let (command, args, env, working_dir, user) = match image {
        None => {
            let user = match (run_as_user, run_as_group) {
                (None, None) => None,
                (user, group) => {
                    let uid = user.unwrap_or(0);
                    Some(User { uid, gid: group.unwrap_or(uid) })
                }
            };
            (command, args, env, container.working_dir.as_ref().map(PathBuf::from), user)
        }
        Some(image) => {
            let (command, args) = imageconfig::command_and_args(&command, &args, &image.config);
            let user = imageconfig::user(run_as_user, run_as_group, &image.config, &image.accounts)
                .map_err(|source| ResolveError::ImageUser { container: cname(), source })?;
            (
                command,
                args,
                imageconfig::environment(&image.config, env),
                imageconfig::working_dir(container.working_dir.as_deref(), &image.config),
                user,
            )
        }
    };

    let startup_check = super::startup::startup_check(container)?;
    let limits = container.resources.as_ref().and_then(|r| r.limits.as_ref());
    let limit = |resource: &'static str, scale: u128| -> Result<Option<u64>, ResolveError> {
        let Some(Quantity(value)) = limits.and_then(|l| l.get(resource)) else { return Ok(None) };
        let invalid = |reason| ResolveError::Quantity {
            container: cname(),
            resource,
            value: value.clone(),
            reason,
        };
        let amount = quantity::parse(value).map_err(|e| invalid(e.reason()))?;
        amount.scaled(scale, 1, Rounding::Up).map(Some).map_err(|e| invalid(e.reason()))
    };
    if inputs::run_as_non_root(pod_spec, container) && user.is_none_or(|u| u.uid == 0) {
        return Err(ResolveError::RunAsRoot { container: cname() });
    }
    let resources = ResourceLimits {
        cpu_millis: limit("cpu", 1000)?,
        memory_bytes: limit("memory", 1)?,
        pids: Some(DEFAULT_PIDS_LIMIT),
    };

    let annotation = |key: &str| {
        template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    let user_namespace = match annotation(annotations::USER_NAMESPACE) {
        None if pod_spec.host_users == Some(false) => UserNamespace::DEFAULT_REMAPPED,
        None | Some(annotations::USER_NAMESPACE_HOST) => UserNamespace::Host,
        Some(annotations::USER_NAMESPACE_REMAPPED) => UserNamespace::DEFAULT_REMAPPED,
        Some(other) => {
            return Err(ResolveError::InvalidAnnotation {
                key: annotations::USER_NAMESPACE,
                value: other.to_owned(),
                expected: "host or remapped",
            });
        }
    };
    let network = match annotation(annotations::NETWORK) {
        None | Some(annotations::NETWORK_LOOPBACK) => NetworkMode::Loopback,
        Some(annotations::NETWORK_OUTBOUND) => NetworkMode::Outbound,
        Some(other) => {
            return Err(ResolveError::InvalidAnnotation {
                key: annotations::NETWORK,
                value: other.to_owned(),
                expected: "loopback or outbound",
            });
        }
    };
    let restore_from = sandbox.metadata.annotations.as_ref().and_then(|a| {
        a.get(annotations::RESTORE_FROM).map(String::as_str).filter(|v| !v.is_empty())
    });
    let from_snapshot = match restore_from {
        None => None,
        Some(value) => {
            Some(SandboxId::new(value).map_err(|_| ResolveError::InvalidAnnotation {
                key: annotations::RESTORE_FROM,
                value: value.to_owned(),
                expected: "a snapshot ID",
            })?)
        }
    };
    let bandwidth = oka_runtime_api::Bandwidth {
        egress_bits_per_second: bandwidth_limit(
            annotations::EGRESS_BANDWIDTH,
            annotation(annotations::EGRESS_BANDWIDTH),
        )?,
        ingress_bits_per_second: bandwidth_limit(
            annotations::INGRESS_BANDWIDTH,
            annotation(annotations::INGRESS_BANDWIDTH),
        )?,
    };
    let spec = oka_runtime_api::SandboxSpec {
        id,
        hostname: hostname(sandbox.metadata.name.as_deref().unwrap_or_default()),
        root,
        process: ProcessSpec {
            command,
            args,
            env,
            working_dir,
            user,
            supplementary_groups,
            startup_check,
        },
        resources,
        network,
        user_namespace,
        from_snapshot,
        mounts,
        security,
        bandwidth,
    };
    spec.validate()?;
    Ok(spec)
}

/// A bandwidth annotation's bits per second (a positive quantity, `10M`), rounded up.
fn bandwidth_limit(key: &'static str, value: Option<&str>) -> Result<Option<u64>, ResolveError> {
    let Some(value) = value else { return Ok(None) };
    oka_api::quantity::parse(value)
        .ok()
        .filter(oka_api::quantity::Amount::is_positive)
        .and_then(|amount| amount.whole(oka_api::quantity::Rounding::Up).ok())
        .map(Some)
        .ok_or_else(|| ResolveError::InvalidAnnotation {
            key,
            value: value.to_owned(),
            expected: "a positive quantity of bits per second, such as 10M",
        })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn template_with(annotations: &[(&str, &str)]) -> PodTemplateSpec {
        let annotations: BTreeMap<String, String> =
            annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        PodTemplateSpec {
            metadata: Some(ObjectMeta { annotations: Some(annotations), ..Default::default() }),
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "main".into(),
                    command: Some(vec!["sleep".into(), "infinity".into()]),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        }
    }

    #[test]
    fn the_network_and_user_namespace_annotations_select_what_the_sandbox_gets() {
        let sandbox = Sandbox::test().name("sbx").build();
        let network = |value: &[(&str, &str)]| {
            resolve_runtime_spec(&sandbox, &template_with(value)).map(|s| s.network)
        };
        assert_eq!(network(&[]), Ok(NetworkMode::Loopback));
        assert_eq!(network(&[(annotations::NETWORK, "loopback")]), Ok(NetworkMode::Loopback));
        assert_eq!(network(&[(annotations::NETWORK, "outbound")]), Ok(NetworkMode::Outbound));
        let userns = |value: &[(&str, &str)]| {
            resolve_runtime_spec(&sandbox, &template_with(value)).map(|s| s.user_namespace)
        };
        assert_eq!(userns(&[]), Ok(UserNamespace::Host));
        assert_eq!(
            userns(&[(annotations::USER_NAMESPACE, "remapped")]),
            Ok(UserNamespace::DEFAULT_REMAPPED)
        );
        assert!(matches!(
            userns(&[(annotations::USER_NAMESPACE, "yes")]),
            Err(ResolveError::InvalidAnnotation { key: annotations::USER_NAMESPACE, .. })
        ));
        assert_eq!(
            network(&[(annotations::NETWORK, "Outbound ")]),
            Err(ResolveError::InvalidAnnotation {
                key: annotations::NETWORK,
                value: "Outbound ".into(),
                expected: "loopback or outbound",
            })
        );
    }

    #[test]
    fn bandwidth_annotations_are_bits_per_second_for_outbound_sandboxes_only() {
        let sandbox = Sandbox::test().name("sbx").build();
        let outbound = (annotations::NETWORK, "outbound");
        let limits = |value: &[(&str, &str)]| {
            resolve_runtime_spec(&sandbox, &template_with(value)).map(|s| s.bandwidth)
        };
        let got = limits(&[
            outbound,
            (annotations::EGRESS_BANDWIDTH, "10M"),
            (annotations::INGRESS_BANDWIDTH, "1.5Mi"),
        ])
        .unwrap();
        assert_eq!(got.egress_bits_per_second, Some(10_000_000));
        assert_eq!(got.ingress_bits_per_second, Some(1_572_864));
        assert!(limits(&[outbound]).unwrap().is_unlimited());
        assert!(matches!(
            limits(&[outbound, (annotations::EGRESS_BANDWIDTH, "fast")]),
            Err(ResolveError::InvalidAnnotation { key: annotations::EGRESS_BANDWIDTH, .. })
        ));
        let err = limits(&[(annotations::EGRESS_BANDWIDTH, "10M")]).unwrap_err();
        assert!(err.to_string().contains("needs an outbound sandbox"), "{err}");
    }
}
