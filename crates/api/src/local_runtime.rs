//! What of a pod template oka's own runtime (the local runtime of `oka serve` and `oka node`)
//! cannot honour: [`unsupported_fields`], the one table, applied wherever a pod template meets
//! that runtime, so a field is refused with its path and never silently ignored.
//!
//! # Honoured (everything else that is set is in the table)
//!
//! - pod: one container; volumes `emptyDir` (a disk one without `sizeLimit`; `medium: Memory`
//!   with or without), `hostPath`, `configMap`, `secret`; `securityContext.runAsUser`,
//!   `runAsGroup`, `runAsNonRoot`, `seccompProfile` (`RuntimeDefault`, the default, or
//!   `Unconfined`); `hostUsers: false` (a user namespace of its own);
//!   `supplementalGroups` (with `supplementalGroupsPolicy: Strict`: the image's groups of the
//!   user are not added), `fsGroup` (the volumes' group, not a host path's) and
//!   `fsGroupChangePolicy`; `imagePullSecrets`; `runtimeClassName` (it picks the runtime); `nodeSelector`, `affinity`,
//!   `tolerations`, `schedulerName`, `priority`, `priorityClassName`, `preemptionPolicy`
//!   (placement's, on a cluster; one machine has nowhere else to go);
//!   `terminationGracePeriodSeconds`, `restartPolicy`, `dnsPolicy`, `enableServiceLinks`,
//!   `automountServiceAccountToken: false`, `serviceAccountName`/`serviceAccount` without a
//!   token, `shareProcessNamespace` and `os.name: linux`, which mean nothing more for one
//!   container on Linux without a cluster's DNS or Services (the admission defaults some of
//!   them on every template);
//! - container: `name`, `image`, `imagePullPolicy`, `command`, `args`, `workingDir`, `env` (a
//!   `value`, or `valueFrom` a `configMapKeyRef`, `secretKeyRef`, or a `fieldRef` to
//!   [`FIELD_REFS`]), `envFrom`, `resources` (limits and requests of `cpu` and `memory`),
//!   `ports` (`containerPort`, `name`, `protocol`: reached through the runtime),
//!   `volumeMounts` (`name`, `mountPath`, `readOnly`, `subPath`), `securityContext`
//!   (`runAsUser`, `runAsGroup`, `runAsNonRoot`, `readOnlyRootFilesystem`, `capabilities`,
//!   `allowPrivilegeEscalation`, `privileged: false`, `procMount: Default`, `seccompProfile`
//!   as the pod's), `startupProbe`
//!   (what [`crate::startup_probe`] says of it),
//!   `terminationMessagePath`/`Policy` (defaulted by the admission, unused).
//!
//! # Where it is applied
//!
//! Admission can refuse only what it knows will run on oka's runtime: a template that names it
//! (the annotation `agents.kruise.io/runtime: node` on the object or the template, or
//! `runtimeClassName: oka-node`, see [`crate::runtime_choice`]) is refused by the API
//! (`oka serve`'s and a cluster's webhooks), with each path. Any other template may run as a
//! Pod, where the kubelet honours all of it (the reference's samples, written for Pods, apply
//! unchanged), so the sandbox controller that runs it on oka's runtime refuses it instead:
//! the sandbox stays not Ready with the same paths in its condition and a Warning Event.

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, Volume};

/// The wording every refusal shares.
pub const NOT_SUPPORTED: &str = "not supported by oka's runtime";

/// The downward-API fields an env `fieldRef` may name.
pub const FIELD_REFS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "metadata.labels['<key>']",
    "metadata.annotations['<key>']",
    "spec.nodeName",
    "spec.serviceAccountName",
];

/// One field of a pod template that oka's runtime cannot honour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// Its path below the template, e.g. `spec.volumes[0].nfs`.
    pub field: String,
    /// Why, or what to do instead; empty when [`NOT_SUPPORTED`] says it all.
    pub hint: &'static str,
}

impl Unsupported {
    fn new(field: String, hint: &'static str) -> Self {
        Self { field, hint }
    }

    /// `not supported by oka's runtime`, with the hint after it.
    pub fn detail(&self) -> String {
        if self.hint.is_empty() {
            NOT_SUPPORTED.to_owned()
        } else {
            format!("{NOT_SUPPORTED}: {}", self.hint)
        }
    }
}

/// Whether a downward-API `fieldPath` is one of [`FIELD_REFS`].
pub fn field_ref_supported(path: &str) -> bool {
    let keyed = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("['"))
            .is_some_and(|rest| rest.ends_with("']"))
    };
    matches!(
        path,
        "metadata.name"
            | "metadata.namespace"
            | "metadata.uid"
            | "spec.nodeName"
            | "spec.serviceAccountName"
    ) || keyed("metadata.labels")
        || keyed("metadata.annotations")
}

/// Every field of `template` that is set and that oka's runtime cannot honour, in the order
/// of the pod spec, paths relative to the template (`spec.containers[1]`).
pub fn unsupported_fields(template: &PodTemplateSpec) -> Vec<Unsupported> {
    let mut out = Vec::new();
    if let Some(spec) = &template.spec {
        pod_spec(spec, &mut out);
    }
    out
}

/// Why a `seccompProfile` is refused: the runtime has its default filter and none.
const SECCOMP_HINT: &str =
    "only RuntimeDefault (the default) and Unconfined are; Localhost profiles are not loaded";

/// Whether a `seccompProfile` names a filter the runtime does not have (`Localhost`, or a
/// type it does not know).
fn seccomp_refused(profile: Option<&k8s_openapi::api::core::v1::SeccompProfile>) -> bool {
    profile.is_some_and(|p| !matches!(p.type_.as_str(), "RuntimeDefault" | "Unconfined"))
}

fn set<T>(value: &Option<Vec<T>>) -> bool {
    value.as_ref().is_some_and(|v| !v.is_empty())
}

fn pod_spec(spec: &PodSpec, out: &mut Vec<Unsupported>) {
    let mut refuse = |field: &str, hint: &'static str| {
        out.push(Unsupported::new(format!("spec.{field}"), hint));
    };
    if spec.active_deadline_seconds.is_some() {
        refuse("activeDeadlineSeconds", "");
    }
    if spec.automount_service_account_token == Some(true) {
        refuse("automountServiceAccountToken", "no service account token is mounted");
    }
    if spec.dns_config.is_some() {
        refuse("dnsConfig", "");
    }
    if set(&spec.ephemeral_containers) {
        refuse("ephemeralContainers", "");
    }
    if set(&spec.host_aliases) {
        refuse("hostAliases", "");
    }
    for (flag, name) in
        [(spec.host_ipc, "hostIPC"), (spec.host_network, "hostNetwork"), (spec.host_pid, "hostPID")]
    {
        if flag == Some(true) {
            refuse(name, "a sandbox has namespaces of its own");
        }
    }
    if spec.hostname.is_some() {
        refuse("hostname", "the hostname is the sandbox's name");
    }
    if spec.hostname_override.is_some() {
        refuse("hostnameOverride", "the hostname is the sandbox's name");
    }
    if set(&spec.init_containers) {
        refuse("initContainers", "a sandbox runs one container");
    }
    if spec.node_name.is_some() {
        refuse("nodeName", "");
    }
    if spec.os.as_ref().is_some_and(|os| os.name != "linux") {
        refuse("os.name", "sandboxes run Linux");
    }
    if spec.overhead.as_ref().is_some_and(|o| !o.is_empty()) {
        refuse("overhead", "");
    }
    if set(&spec.readiness_gates) {
        refuse("readinessGates", "");
    }
    if set(&spec.resource_claims) {
        refuse("resourceClaims", "");
    }
    if spec.resources.is_some() {
        refuse("resources", "set the container's resources");
    }
    if set(&spec.scheduling_gates) {
        refuse("schedulingGates", "");
    }
    if spec.set_hostname_as_fqdn == Some(true) {
        refuse("setHostnameAsFQDN", "");
    }
    if spec.subdomain.is_some() {
        refuse("subdomain", "");
    }
    if set(&spec.topology_spread_constraints) {
        refuse("topologySpreadConstraints", "");
    }
    if let Some(security) = &spec.security_context {
        let mut refuse_security = |field: &str, hint: &'static str| {
            out.push(Unsupported::new(format!("spec.securityContext.{field}"), hint));
        };
        if security.app_armor_profile.is_some() {
            refuse_security("appArmorProfile", "");
        }
        if security.se_linux_change_policy.is_some() {
            refuse_security("seLinuxChangePolicy", "");
        }
        if security.se_linux_options.is_some() {
            refuse_security("seLinuxOptions", "");
        }
        if seccomp_refused(security.seccomp_profile.as_ref()) {
            refuse_security("seccompProfile.type", SECCOMP_HINT);
        }
        if security.supplemental_groups_policy.as_deref().is_some_and(|p| p != "Strict") {
            refuse_security("supplementalGroupsPolicy", "only Strict is");
        }
        if set(&security.sysctls) {
            refuse_security("sysctls", "");
        }
        if security.windows_options.is_some() {
            refuse_security("windowsOptions", "");
        }
    }
    for (i, volume) in spec.volumes.iter().flatten().enumerate() {
        volume_source(volume, &format!("spec.volumes[{i}]"), out);
    }
    for (i, container) in spec.containers.iter().enumerate() {
        let path = format!("spec.containers[{i}]");
        if i > 0 {
            out.push(Unsupported::new(path, "a sandbox runs one container"));
            continue;
        }
        container_fields(container, &path, out);
    }
}

fn volume_source(volume: &Volume, path: &str, out: &mut Vec<Unsupported>) {
    let others = [
        (volume.aws_elastic_block_store.is_some(), "awsElasticBlockStore"),
        (volume.azure_disk.is_some(), "azureDisk"),
        (volume.azure_file.is_some(), "azureFile"),
        (volume.cephfs.is_some(), "cephfs"),
        (volume.cinder.is_some(), "cinder"),
        (volume.csi.is_some(), "csi"),
        (volume.downward_api.is_some(), "downwardAPI"),
        (volume.ephemeral.is_some(), "ephemeral"),
        (volume.fc.is_some(), "fc"),
        (volume.flex_volume.is_some(), "flexVolume"),
        (volume.flocker.is_some(), "flocker"),
        (volume.gce_persistent_disk.is_some(), "gcePersistentDisk"),
        (volume.git_repo.is_some(), "gitRepo"),
        (volume.glusterfs.is_some(), "glusterfs"),
        (volume.image.is_some(), "image"),
        (volume.iscsi.is_some(), "iscsi"),
        (volume.nfs.is_some(), "nfs"),
        (volume.persistent_volume_claim.is_some(), "persistentVolumeClaim"),
        (volume.photon_persistent_disk.is_some(), "photonPersistentDisk"),
        (volume.portworx_volume.is_some(), "portworxVolume"),
        (volume.projected.is_some(), "projected"),
        (volume.quobyte.is_some(), "quobyte"),
        (volume.rbd.is_some(), "rbd"),
        (volume.scale_io.is_some(), "scaleIO"),
        (volume.storageos.is_some(), "storageos"),
        (volume.vsphere_volume.is_some(), "vsphereVolume"),
    ];
    for (present, kind) in others {
        if present {
            out.push(Unsupported::new(
                format!("{path}.{kind}"),
                "use emptyDir, hostPath, configMap or secret",
            ));
        }
    }
    if let Some(empty) = &volume.empty_dir
        && empty.size_limit.is_some()
        && empty.medium.as_deref() != Some("Memory")
    {
        out.push(Unsupported::new(
            format!("{path}.emptyDir.sizeLimit"),
            "a disk emptyDir cannot be limited here (a medium: Memory one can)",
        ));
    }
    if let Some(empty) = &volume.empty_dir
        && empty.medium.as_deref().is_some_and(|m| !matches!(m, "" | "Memory"))
    {
        out.push(Unsupported::new(format!("{path}.emptyDir.medium"), "use \"\" or Memory"));
    }
}

fn container_fields(container: &Container, path: &str, out: &mut Vec<Unsupported>) {
    let mut refuse = |field: &str, hint: &'static str| {
        out.push(Unsupported::new(format!("{path}.{field}"), hint));
    };
    for (i, var) in container.env.iter().flatten().enumerate() {
        let Some(from) = &var.value_from else { continue };
        if from.resource_field_ref.is_some() {
            refuse(&format!("env[{i}].valueFrom.resourceFieldRef"), "");
        }
        if from.file_key_ref.is_some() {
            refuse(&format!("env[{i}].valueFrom.fileKeyRef"), "");
        }
        if let Some(field) = &from.field_ref
            && !field_ref_supported(&field.field_path)
        {
            refuse(
                &format!("env[{i}].valueFrom.fieldRef.fieldPath"),
                "use metadata.name, metadata.namespace, metadata.uid, metadata.labels['<key>'], \
                 metadata.annotations['<key>'], spec.nodeName or spec.serviceAccountName",
            );
        }
    }
    if container.lifecycle.is_some() {
        refuse("lifecycle", "");
    }
    if container.liveness_probe.is_some() {
        refuse("livenessProbe", "use the sandbox's probes");
    }
    if container.readiness_probe.is_some() {
        refuse("readinessProbe", "use the sandbox's probes");
    }
    if let Some(probe) = &container.startup_probe {
        for (field, hint) in crate::startup_probe::unsupported_startup_probe_fields(probe) {
            refuse(&format!("startupProbe.{field}"), hint);
        }
    }
    for (i, port) in container.ports.iter().flatten().enumerate() {
        if port.host_port.is_some() {
            refuse(&format!("ports[{i}].hostPort"), "a sandbox's ports are reached through oka");
        }
        if port.host_ip.is_some() {
            refuse(&format!("ports[{i}].hostIP"), "a sandbox's ports are reached through oka");
        }
    }
    if set(&container.resize_policy) {
        refuse("resizePolicy", "");
    }
    if let Some(resources) = &container.resources {
        if set(&resources.claims) {
            refuse("resources.claims", "");
        }
        for (which, map) in [("limits", &resources.limits), ("requests", &resources.requests)] {
            for name in map.iter().flatten().map(|(k, _)| k) {
                if name != "cpu" && name != "memory" {
                    refuse(&format!("resources.{which}[{name}]"), "only cpu and memory are");
                }
            }
        }
    }
    if container.restart_policy.is_some() {
        refuse("restartPolicy", "");
    }
    if set(&container.restart_policy_rules) {
        refuse("restartPolicyRules", "");
    }
    if container.stdin == Some(true) {
        refuse("stdin", "");
    }
    if container.stdin_once == Some(true) {
        refuse("stdinOnce", "");
    }
    if container.tty == Some(true) {
        refuse("tty", "");
    }
    if set(&container.volume_devices) {
        refuse("volumeDevices", "");
    }
    for (i, mount) in container.volume_mounts.iter().flatten().enumerate() {
        if mount.mount_propagation.as_deref().is_some_and(|p| p != "None") {
            refuse(&format!("volumeMounts[{i}].mountPropagation"), "");
        }
        if mount.recursive_read_only.as_deref().is_some_and(|p| p != "Disabled") {
            refuse(&format!("volumeMounts[{i}].recursiveReadOnly"), "");
        }
        if mount.sub_path_expr.is_some() {
            refuse(&format!("volumeMounts[{i}].subPathExpr"), "use subPath");
        }
    }
    if let Some(security) = &container.security_context {
        let mut refuse_security = |field: &str, hint: &'static str| {
            out.push(Unsupported::new(format!("{path}.securityContext.{field}"), hint));
        };
        if security.app_armor_profile.is_some() {
            refuse_security("appArmorProfile", "");
        }
        if security.privileged == Some(true) {
            refuse_security("privileged", "");
        }
        if security.proc_mount.as_deref().is_some_and(|p| p != "Default") {
            refuse_security("procMount", "");
        }
        if security.se_linux_options.is_some() {
            refuse_security("seLinuxOptions", "");
        }
        if seccomp_refused(security.seccomp_profile.as_ref()) {
            refuse_security("seccompProfile.type", SECCOMP_HINT);
        }
        if security.windows_options.is_some() {
            refuse_security("windowsOptions", "");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(json: serde_json::Value) -> PodTemplateSpec {
        serde_json::from_value(serde_json::json!({ "spec": json })).unwrap()
    }

    fn fields(json: serde_json::Value) -> Vec<String> {
        unsupported_fields(&template(json)).into_iter().map(|u| u.field).collect()
    }

    #[test]
    fn what_the_runtime_honours_is_not_refused() {
        let honoured = serde_json::json!({
            "restartPolicy": "Always", "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler",
            "terminationGracePeriodSeconds": 30, "automountServiceAccountToken": false,
            "enableServiceLinks": true, "hostUsers": false, "runtimeClassName": "oka-node",
            "nodeSelector": {"a": "b"}, "tolerations": [{"key": "k", "operator": "Exists"}],
            "imagePullSecrets": [{"name": "reg"}], "os": {"name": "linux"},
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true,
                                "fsGroup": 2000, "supplementalGroups": [3000],
                                "seccompProfile": {"type": "Unconfined"}},
            "volumes": [
                {"name": "a", "emptyDir": {}},
                {"name": "b", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
                {"name": "c", "hostPath": {"path": "/srv", "type": "Directory"}},
                {"name": "d", "configMap": {"name": "cm", "items": [{"key": "k", "path": "p", "mode": 256}]}},
                {"name": "e", "secret": {"secretName": "s", "defaultMode": 256, "optional": true}},
            ],
            "containers": [{
                "name": "main", "image": "debian", "imagePullPolicy": "IfNotPresent",
                "command": ["sh"], "args": ["-c", "true"], "workingDir": "/w",
                "env": [
                    {"name": "A", "value": "1"},
                    {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
                    {"name": "C", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "optional": true}}},
                    {"name": "D", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                ],
                "envFrom": [{"prefix": "X_", "configMapRef": {"name": "cm"}}],
                "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
                "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "100m"}},
                "volumeMounts": [{"name": "a", "mountPath": "/a", "readOnly": true, "subPath": "x"}],
                "securityContext": {
                    "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                    "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}, "privileged": false,
                    "runAsNonRoot": true, "procMount": "Default",
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            }],
        });
        assert_eq!(fields(honoured), Vec::<String>::new());
    }

    #[test]
    fn every_unhonoured_field_is_named_by_its_path() {
        let refused = serde_json::json!({
            "hostNetwork": true, "initContainers": [{"name": "i"}],
            "securityContext": {"supplementalGroupsPolicy": "Merge", "sysctls": [{"name": "a", "value": "b"}],
                                "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}},
            "volumes": [
                {"name": "n", "nfs": {"server": "s", "path": "/"}},
                {"name": "d", "emptyDir": {"sizeLimit": "1Gi"}},
                {"name": "p", "persistentVolumeClaim": {"claimName": "c"}},
            ],
            "containers": [
                {
                    "name": "main", "lifecycle": {"postStart": {"exec": {"command": ["true"]}}},
                    "readinessProbe": {"exec": {"command": ["true"]}},
                    "startupProbe": {"grpc": {"port": 9000}},
                    "ports": [{"containerPort": 80, "hostPort": 8080}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    "env": [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                    "volumeMounts": [{"name": "n", "mountPath": "/n", "subPathExpr": "$(X)"}],
                    "securityContext": {"privileged": true, "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}},
                },
                {"name": "sidecar"},
            ],
        });
        assert_eq!(
            fields(refused),
            [
                "spec.hostNetwork",
                "spec.initContainers",
                "spec.securityContext.seccompProfile.type",
                "spec.securityContext.supplementalGroupsPolicy",
                "spec.securityContext.sysctls",
                "spec.volumes[0].nfs",
                "spec.volumes[1].emptyDir.sizeLimit",
                "spec.volumes[2].persistentVolumeClaim",
                "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath",
                "spec.containers[0].lifecycle",
                "spec.containers[0].readinessProbe",
                "spec.containers[0].startupProbe.grpc",
                "spec.containers[0].ports[0].hostPort",
                "spec.containers[0].resources.limits[nvidia.com/gpu]",
                "spec.containers[0].volumeMounts[0].subPathExpr",
                "spec.containers[0].securityContext.privileged",
                "spec.containers[0].securityContext.seccompProfile.type",
                "spec.containers[1]",
            ]
        );
        let nfs = &unsupported_fields(&template(serde_json::json!({
            "volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}}], "containers": [],
        })))[0];
        assert_eq!(
            nfs.detail(),
            "not supported by oka's runtime: use emptyDir, hostPath, configMap or secret"
        );
    }

    #[test]
    fn field_refs_are_the_listed_ones() {
        for ok in ["metadata.name", "metadata.labels['app']", "metadata.annotations['a/b']"] {
            assert!(field_ref_supported(ok), "{ok}");
        }
        for bad in ["status.podIP", "metadata.labels", "metadata.labels['a'", "spec.x"] {
            assert!(!field_ref_supported(bad), "{bad}");
        }
    }
}
