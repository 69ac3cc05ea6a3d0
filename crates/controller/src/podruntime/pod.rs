//! The Pod of a pod-runtime Sandbox, and its PersistentVolumeClaims: pure functions from the
//! Sandbox and its resolved pod template.
//!
//! # The Pod's shape (the reference's, so the Pods it created are adopted as they are)
//!
//! - `metadata.name` = the sandbox's name, in its namespace; one controller ownerReference to
//!   the Sandbox (`agents.kruise.io/v1alpha1`, `controller` and `blockOwnerDeletion` true);
//! - the template's labels and annotations, plus the label and annotation
//!   `agents.kruise.io/created-by: sandbox`, the label `pod-template-hash: <revision>` (the
//!   sandbox's `status.updateRevision`) and the label `agents.kruise.io/sandbox-uid: <uid>`;
//! - the template's spec, plus one volume per `volumeClaimTemplates` entry (named as the entry,
//!   claim `<entry>-<sandbox>`), without a `runtimeClassName` of `oka-node` (that class means
//!   oka's node agent and names no Kubernetes RuntimeClass).
//!
//! # The agent runtime in any image
//!
//! Unless the template already runs envd ([`runs_envd`]), the builder adds:
//!
//! - an `emptyDir` volume [`ENVD_VOLUME`] and an init container [`ENVD_INIT_CONTAINER`] of
//!   [`PodOptions::envd_image`] (a `FROM scratch` image holding the static `/oka-envd`) that
//!   copies the binary into it (`/oka-envd --install /.oka/bin/oka-envd`: a scratch image has
//!   no `cp`);
//! - in the first container, the volume read-only at [`ENVD_MOUNT`], and envd started:
//!   - **as its supervisor** when the container names its `command`: the command becomes
//!     `oka-envd --init -- <command> <args>`, so envd is PID 1 (reaps orphans, forwards
//!     SIGTERM, exits with the command's status) and serves port 49983;
//!   - **beside the image's entrypoint** when it does not (the image's `ENTRYPOINT`/`CMD` are
//!     unknown without pulling it): a `postStart` exec hook `oka-envd --detach` starts envd as
//!     a daemon in the container, as the reference's samples start theirs. A container with a
//!     `postStart` hook of its own and no command cannot take it: the build fails, saying so.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, ExecAction, Lifecycle, LifecycleHandler,
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodSpec, PodTemplateSpec,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use oka_api::{Sandbox, annotations, labels};

/// envd's port (E2B's).
pub const ENVD_PORT: i32 = 49983;
/// The `emptyDir` volume the envd binary is copied into.
pub const ENVD_VOLUME: &str = "oka-envd";
/// The init container that copies it.
pub const ENVD_INIT_CONTAINER: &str = "oka-envd-install";
/// Where the volume is mounted in the init container and the first container.
pub const ENVD_MOUNT: &str = "/.oka/bin";
/// The envd binary inside the first container.
pub const ENVD_PATH: &str = "/.oka/bin/oka-envd";
/// The binary's path in the envd image.
pub const ENVD_IMAGE_BINARY: &str = "/oka-envd";

/// What the Pod builder needs from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodOptions {
    /// The image holding the static `/oka-envd` (`cluster.pods.envdImage`).
    pub envd_image: String,
}

/// Why a Pod cannot be built from a sandbox's template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodBuildError {
    /// The template has no pod spec or no container.
    #[error("the pod template has no container")]
    NoContainer,
    /// The first container has a `postStart` hook and no `command`: envd can neither wrap the
    /// command nor be started beside it.
    #[error(
        "container {0:?} has a postStart hook and no command: oka cannot start envd in it; set its command, or start envd in the template"
    )]
    NoWayToStartEnvd(String),
}

/// The name of the PVC of volume claim template `template` for `sandbox` (the reference's).
pub fn claim_name(template: &str, sandbox: &str) -> String {
    format!("{template}-{sandbox}")
}

/// The controller ownerReference to `sandbox`.
pub fn owner_reference(sandbox: &Sandbox) -> OwnerReference {
    OwnerReference {
        api_version: oka_api::API_VERSION.to_owned(),
        kind: "Sandbox".to_owned(),
        name: sandbox.metadata.name.clone().unwrap_or_default(),
        uid: sandbox.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Whether `spec` already starts envd (a reference template with envd in its image): a
/// container or init container with the env var `ENVD_DIR` (the reference's agent-runtime
/// convention), a container port 49983, or a word of a container's command, args or
/// `postStart` exec whose file name starts with `envd` (`/mnt/envd/envd-run.sh`, `envd`).
pub fn runs_envd(spec: &PodSpec) -> bool {
    let all = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    for container in all {
        if container.env.iter().flatten().any(|e| e.name == "ENVD_DIR") {
            return true;
        }
        if container.ports.iter().flatten().any(|p| p.container_port == ENVD_PORT) {
            return true;
        }
        let hook = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.post_start.as_ref())
            .and_then(|h| h.exec.as_ref())
            .and_then(|e| e.command.as_ref());
        let words = container
            .command
            .iter()
            .flatten()
            .chain(container.args.iter().flatten())
            .chain(hook.into_iter().flatten());
        for word in words {
            let file = word.rsplit('/').next().unwrap_or_default();
            if file.starts_with("envd") {
                return true;
            }
        }
    }
    false
}

/// The Pod of `sandbox`, from its resolved pod `template`, at `revision` (the sandbox's
/// `status.updateRevision`). See the module documentation.
pub fn build_pod(
    sandbox: &Sandbox,
    template: &PodTemplateSpec,
    revision: &str,
    options: &PodOptions,
) -> Result<Pod, PodBuildError> {
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    let template_meta = template.metadata.clone().unwrap_or_default();
    let mut labels_out: BTreeMap<String, String> = template_meta.labels.unwrap_or_default();
    labels_out.insert(labels::CREATED_BY.to_owned(), labels::CREATED_BY_SANDBOX.to_owned());
    labels_out.insert(labels::POD_TEMPLATE_HASH.to_owned(), revision.to_owned());
    if let Some(uid) = &sandbox.metadata.uid {
        labels_out.insert(labels::SANDBOX_UID.to_owned(), uid.clone());
    }
    let mut annotations_out: BTreeMap<String, String> =
        template_meta.annotations.unwrap_or_default();
    annotations_out
        .insert(annotations::CREATED_BY.to_owned(), labels::CREATED_BY_SANDBOX.to_owned());

    let mut spec = template.spec.clone().ok_or(PodBuildError::NoContainer)?;
    if spec.containers.is_empty() {
        return Err(PodBuildError::NoContainer);
    }
    if spec.runtime_class_name.as_deref() == Some(annotations::NODE_RUNTIME_CLASS) {
        spec.runtime_class_name = None;
    }
    for claim in sandbox.spec.volume_claim_templates.iter().flatten() {
        let volume = claim.metadata.name.clone().unwrap_or_default();
        spec.volumes.get_or_insert_default().push(Volume {
            name: volume.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(&volume, &name),
                read_only: None,
            }),
            ..Volume::default()
        });
    }
    if !runs_envd(&spec) {
        inject_envd(&mut spec, options)?;
    }
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: sandbox.metadata.namespace.clone(),
            labels: Some(labels_out),
            annotations: Some(annotations_out),
            owner_references: Some(vec![owner_reference(sandbox)]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// Adds the envd volume, its install init container, and envd's start to the first container.
fn inject_envd(spec: &mut PodSpec, options: &PodOptions) -> Result<(), PodBuildError> {
    let mount = |read_only: bool| VolumeMount {
        name: ENVD_VOLUME.to_owned(),
        mount_path: ENVD_MOUNT.to_owned(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    };
    let first = spec.containers.first_mut().ok_or(PodBuildError::NoContainer)?;
    match first.command.take() {
        Some(command) if !command.is_empty() => {
            let mut wrapped = vec![ENVD_PATH.to_owned(), "--init".to_owned(), "--".to_owned()];
            wrapped.extend(command);
            wrapped.extend(first.args.take().unwrap_or_default());
            first.command = Some(wrapped);
        }
        _ => {
            let lifecycle = first.lifecycle.get_or_insert_with(Lifecycle::default);
            if lifecycle.post_start.is_some() {
                return Err(PodBuildError::NoWayToStartEnvd(first.name.clone()));
            }
            lifecycle.post_start = Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec![ENVD_PATH.to_owned(), "--detach".to_owned()]),
                }),
                ..LifecycleHandler::default()
            });
        }
    }
    first.volume_mounts.get_or_insert_default().push(mount(true));
    spec.volumes.get_or_insert_default().push(Volume {
        name: ENVD_VOLUME.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    });
    let install = Container {
        name: ENVD_INIT_CONTAINER.to_owned(),
        image: Some(options.envd_image.clone()),
        command: Some(vec![
            ENVD_IMAGE_BINARY.to_owned(),
            "--install".to_owned(),
            ENVD_PATH.to_owned(),
        ]),
        volume_mounts: Some(vec![mount(false)]),
        ..Container::default()
    };
    spec.init_containers.get_or_insert_default().insert(0, install);
    Ok(())
}

/// The PersistentVolumeClaims of `sandbox`'s `volumeClaimTemplates`: `<entry>-<sandbox>`, in
/// its namespace, controlled by it (the reference's; they outlive pauses, and go with the
/// Sandbox).
pub fn build_claims(sandbox: &Sandbox) -> Vec<PersistentVolumeClaim> {
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    sandbox
        .spec
        .volume_claim_templates
        .iter()
        .flatten()
        .map(|template| {
            let mut claim = PersistentVolumeClaim::from(template.clone());
            let entry = claim.metadata.name.clone().unwrap_or_default();
            claim.metadata.name = Some(claim_name(&entry, &name));
            claim.metadata.namespace = sandbox.metadata.namespace.clone();
            claim.metadata.owner_references = Some(vec![owner_reference(sandbox)]);
            claim.status = None;
            claim
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EnvVar, PersistentVolumeClaimSpec};
    use oka_api::common::PersistentVolumeClaimTemplate;

    fn options() -> PodOptions {
        PodOptions { envd_image: "oka-envd:1.2.3".into() }
    }

    fn sandbox(template: PodTemplateSpec) -> Sandbox {
        let mut s = Sandbox::new(
            "sbx",
            oka_api::SandboxSpec { template: Some(template), ..oka_api::SandboxSpec::default() },
        );
        s.metadata.namespace = Some("team-a".into());
        s.metadata.uid = Some("0b5e7e1c-0000-4000-8000-000000000001".into());
        s
    }

    fn template(command: Option<Vec<&str>>) -> PodTemplateSpec {
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some([("app".to_owned(), "demo".to_owned())].into()),
                annotations: Some([("note".to_owned(), "kept".to_owned())].into()),
                ..ObjectMeta::default()
            }),
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "main".into(),
                    image: Some("python:3.12".into()),
                    command: command.map(|c| c.into_iter().map(str::to_owned).collect()),
                    args: Some(vec!["-u".into()]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
        }
    }

    fn template_of(sandbox: &Sandbox) -> PodTemplateSpec {
        sandbox.spec.template.clone().unwrap()
    }

    #[test]
    fn the_pod_has_the_reference_name_labels_annotations_and_owner() {
        let s = sandbox(template(Some(vec!["python"])));
        let pod = build_pod(&s, &template_of(&s), "rev1", &options()).unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("sbx"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("team-a"));
        let labels = pod.metadata.labels.unwrap();
        assert_eq!(labels["app"], "demo");
        assert_eq!(labels["agents.kruise.io/created-by"], "sandbox");
        assert_eq!(labels["pod-template-hash"], "rev1");
        assert_eq!(labels["agents.kruise.io/sandbox-uid"], "0b5e7e1c-0000-4000-8000-000000000001");
        let annotations = pod.metadata.annotations.unwrap();
        assert_eq!(annotations["note"], "kept");
        assert_eq!(annotations["agents.kruise.io/created-by"], "sandbox");
        let owners = pod.metadata.owner_references.unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].api_version, "agents.kruise.io/v1alpha1");
        assert_eq!(owners[0].kind, "Sandbox");
        assert_eq!(owners[0].name, "sbx");
        assert_eq!(owners[0].uid, "0b5e7e1c-0000-4000-8000-000000000001");
        assert_eq!(owners[0].controller, Some(true));
        assert_eq!(owners[0].block_owner_deletion, Some(true));
    }

    #[test]
    fn a_command_is_wrapped_by_envd_as_its_supervisor() {
        let s = sandbox(template(Some(vec!["python", "app.py"])));
        let pod = build_pod(&s, &template_of(&s), "rev1", &options()).unwrap();
        let spec = pod.spec.unwrap();
        let main = &spec.containers[0];
        assert_eq!(
            main.command.as_deref().unwrap(),
            ["/.oka/bin/oka-envd", "--init", "--", "python", "app.py", "-u"]
        );
        assert_eq!(main.args, None);
        assert!(main.lifecycle.is_none());
        let mount = &main.volume_mounts.as_ref().unwrap()[0];
        assert_eq!((mount.name.as_str(), mount.mount_path.as_str()), ("oka-envd", "/.oka/bin"));
        assert_eq!(mount.read_only, Some(true));
        let init = &spec.init_containers.unwrap()[0];
        assert_eq!(init.name, "oka-envd-install");
        assert_eq!(init.image.as_deref(), Some("oka-envd:1.2.3"));
        assert_eq!(
            init.command.as_deref().unwrap(),
            ["/oka-envd", "--install", "/.oka/bin/oka-envd"]
        );
        let volume = &spec.volumes.unwrap()[0];
        assert_eq!(volume.name, "oka-envd");
        assert!(volume.empty_dir.is_some());
    }

    #[test]
    fn without_a_command_envd_starts_beside_the_image_entrypoint() {
        let s = sandbox(template(None));
        let pod = build_pod(&s, &template_of(&s), "rev1", &options()).unwrap();
        let main = &pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(main.command, None);
        assert_eq!(main.args.as_deref(), Some(&["-u".to_owned()][..]));
        let hook = main.lifecycle.as_ref().unwrap().post_start.as_ref().unwrap();
        assert_eq!(
            hook.exec.as_ref().unwrap().command.as_deref().unwrap(),
            ["/.oka/bin/oka-envd", "--detach"]
        );

        let mut t = template(None);
        t.spec.as_mut().unwrap().containers[0].lifecycle = Some(Lifecycle {
            post_start: Some(LifecycleHandler {
                exec: Some(ExecAction { command: Some(vec!["/setup".into()]) }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        });
        let s = sandbox(t);
        assert_eq!(
            build_pod(&s, &template_of(&s), "rev1", &options()),
            Err(PodBuildError::NoWayToStartEnvd("main".into()))
        );
    }

    #[test]
    fn a_template_that_runs_envd_is_left_alone() {
        let mut t = template(None);
        t.spec.as_mut().unwrap().containers[0].env = Some(vec![EnvVar {
            name: "ENVD_DIR".into(),
            value: Some("/mnt/envd".into()),
            ..EnvVar::default()
        }]);
        let s = sandbox(t.clone());
        let pod = build_pod(&s, &t, "rev1", &options()).unwrap();
        assert_eq!(pod.spec.as_ref().unwrap().containers, t.spec.as_ref().unwrap().containers);
        assert!(pod.spec.unwrap().init_containers.is_none());

        let mut hook = template(None).spec.unwrap();
        hook.containers[0].lifecycle = Some(Lifecycle {
            post_start: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec!["bash".into(), "/mnt/envd/envd-run.sh".into()]),
                }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        });
        assert!(runs_envd(&hook));
        assert!(!runs_envd(&template(Some(vec!["python"])).spec.unwrap()));
    }

    #[test]
    fn volume_claim_templates_become_claims_and_volumes() {
        let mut s = sandbox(template(Some(vec!["sleep"])));
        s.spec.volume_claim_templates = Some(vec![PersistentVolumeClaimTemplate {
            metadata: ObjectMeta { name: Some("www".into()), ..ObjectMeta::default() },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                ..PersistentVolumeClaimSpec::default()
            }),
            ..PersistentVolumeClaimTemplate::default()
        }]);
        let pod = build_pod(&s, &template_of(&s), "rev1", &options()).unwrap();
        let volumes = pod.spec.unwrap().volumes.unwrap();
        assert_eq!(volumes[0].name, "www");
        assert_eq!(volumes[0].persistent_volume_claim.as_ref().unwrap().claim_name, "www-sbx");
        let claims = build_claims(&s);
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].metadata.name.as_deref(), Some("www-sbx"));
        assert_eq!(claims[0].metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(claims[0].metadata.owner_references.as_ref().unwrap()[0].kind, "Sandbox");
    }

    #[test]
    fn the_node_agent_runtime_class_is_not_passed_to_the_pod() {
        let mut t = template(Some(vec!["sleep"]));
        t.spec.as_mut().unwrap().runtime_class_name = Some("oka-node".into());
        let s = sandbox(t.clone());
        assert_eq!(
            build_pod(&s, &t, "r", &options()).unwrap().spec.unwrap().runtime_class_name,
            None
        );
        t.spec.as_mut().unwrap().runtime_class_name = Some("gvisor".into());
        assert_eq!(
            build_pod(&s, &t, "r", &options()).unwrap().spec.unwrap().runtime_class_name.as_deref(),
            Some("gvisor")
        );
    }
}
