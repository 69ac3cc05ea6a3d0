//! What a pod template takes from outside itself, for oka's runtime: the ConfigMaps and Secrets
//! its volumes and env name ([`referenced`]), as read from the store ([`PodInputs`]), and the
//! pure mappings onto the runtime spec: volumes and mounts ([`mounts`]), env from those
//! objects and the downward API ([`environment`]), and the security context ([`security`]).
//!
//! The kubelet's rules, as far as they go here:
//! - a volume of a missing ConfigMap or Secret that is not `optional` keeps the sandbox from
//!   starting (`FailedMount`: `MountVolume.SetUp failed for volume "v" : configmap "x" not
//!   found`), as does an `items` key it lacks; an optional missing one is an empty volume;
//! - a volume holds every key (ConfigMap `data` and `binaryData`, Secret `data`), or only
//!   `items` at their `path`s; each file's mode is its item's `mode`, else `defaultMode`, else
//!   0644;
//! - env: `configMapKeyRef`/`secretKeyRef` of a missing object or key fail the container
//!   (`CreateContainerConfigError`: `configmap "x" not found`, `couldn't find key k in
//!   ConfigMap ns/x`) unless `optional`, when the variable is left out; `envFrom` takes every
//!   key (with `prefix`), a missing object fails unless `optional`; keys that are not valid
//!   variable names are skipped; `env` comes after `envFrom`, later entries win;
//! - `$(VAR)` references in `env` values are expanded from the variables before them
//!   (`$$` escapes); an unknown one is kept as written;
//! - the security context: container fields win over pod fields; `runAsNonRoot` with a user
//!   that is root (or no user, on a root without an image `USER`) fails the container.
//!
//! The objects are read when the spec is resolved (every reconcile of a sandbox that is not
//! running): their content is what a sandbox was created or restarted with; a running sandbox
//! does not see later changes (the kubelet's `subPath` behaviour, for every mount here).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, PodTemplateSpec, Secret};
use oka_api::Sandbox;
use oka_runtime_api::{
    EnvVar, HostPathKind, Medium, Mount, MountSource, Seccomp, Security, VolumeFile,
};

use super::resolve::ResolveError;
use oka_api::quantity::{self, Rounding};

/// The keys of one ConfigMap or Secret, as bytes.
pub type Keys = BTreeMap<String, Vec<u8>>;

/// The objects a template names, as the store had them (`None`: not found).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInputs {
    /// ConfigMaps by name.
    pub config_maps: BTreeMap<String, Option<Keys>>,
    /// Secrets by name.
    pub secrets: BTreeMap<String, Option<Keys>>,
    /// The node that runs the sandbox (`spec.nodeName` of the downward API).
    pub node_name: Option<String>,
}

impl PodInputs {
    /// Records ConfigMap `name` as read (`None`: not found).
    pub fn add_config_map(&mut self, name: &str, object: Option<&ConfigMap>) {
        let keys = object.map(|cm| {
            let mut keys: Keys = cm
                .data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
                .collect();
            keys.extend(cm.binary_data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())));
            keys
        });
        self.config_maps.insert(name.to_owned(), keys);
    }

    /// Records Secret `name` as read (`None`: not found).
    pub fn add_secret(&mut self, name: &str, object: Option<&Secret>) {
        let keys = object.map(|s| {
            let mut keys: Keys = s
                .string_data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
                .collect();
            keys.extend(s.data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())));
            keys
        });
        self.secrets.insert(name.to_owned(), keys);
    }
}

/// Which kind of object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// A ConfigMap.
    ConfigMap,
    /// A Secret.
    Secret,
}

impl ObjectKind {
    /// As the kubelet's messages name it: `configmap`, `secret`.
    pub fn lower(self) -> &'static str {
        match self {
            Self::ConfigMap => "configmap",
            Self::Secret => "secret",
        }
    }

    /// As its kind: `ConfigMap`, `Secret`.
    pub fn kind(self) -> &'static str {
        match self {
            Self::ConfigMap => "ConfigMap",
            Self::Secret => "Secret",
        }
    }
}

/// The ConfigMaps and Secrets `template` names (volumes, env, envFrom of its first container).
pub fn referenced(template: &PodTemplateSpec) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut config_maps = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    let Some(pod) = template.spec.as_ref() else { return (config_maps, secrets) };
    for volume in pod.volumes.iter().flatten() {
        if let Some(cm) = &volume.config_map {
            config_maps.insert(cm.name.clone());
        }
        if let Some(name) = volume.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            secrets.insert(name);
        }
    }
    if let Some(container) = pod.containers.first() {
        for var in container.env.iter().flatten() {
            let Some(from) = &var.value_from else { continue };
            if let Some(r) = &from.config_map_key_ref {
                config_maps.insert(r.name.clone());
            }
            if let Some(r) = &from.secret_key_ref {
                secrets.insert(r.name.clone());
            }
        }
        for from in container.env_from.iter().flatten() {
            if let Some(r) = &from.config_map_ref {
                config_maps.insert(r.name.clone());
            }
            if let Some(r) = &from.secret_ref {
                secrets.insert(r.name.clone());
            }
        }
    }
    (config_maps, secrets)
}

fn keys_of<'a>(inputs: &'a PodInputs, kind: ObjectKind, name: &str) -> Option<&'a Keys> {
    let map = match kind {
        ObjectKind::ConfigMap => &inputs.config_maps,
        ObjectKind::Secret => &inputs.secrets,
    };
    map.get(name).and_then(Option::as_ref)
}

/// The runtime mounts of the first container's `volumeMounts`, in order.
///
/// # Errors
///
/// [`ResolveError::FailedMount`] for a missing object or key; [`ResolveError::Volume`] for a
/// mount of an unknown volume, a bad `hostPath` type or size.
pub fn mounts(
    pod: &PodSpec,
    container: &Container,
    inputs: &PodInputs,
) -> Result<Vec<Mount>, ResolveError> {
    let mut out = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let invalid = |reason: String| ResolveError::Volume { volume: mount.name.clone(), reason };
        let volume =
            pod.volumes.iter().flatten().find(|v| v.name == mount.name).ok_or_else(|| {
                invalid(format!("no volume {:?} in the pod template", mount.name))
            })?;
        let source = if let Some(host) = &volume.host_path {
            let kind = match host.type_.as_deref().unwrap_or("") {
                "" => HostPathKind::Unchecked,
                "Directory" => HostPathKind::Directory,
                "DirectoryOrCreate" => HostPathKind::DirectoryOrCreate,
                "File" => HostPathKind::File,
                "FileOrCreate" => HostPathKind::FileOrCreate,
                other => {
                    return Err(invalid(format!(
                        "hostPath type {other:?} is not supported by oka's runtime: use \"\", \
                         Directory, DirectoryOrCreate, File or FileOrCreate"
                    )));
                }
            };
            MountSource::HostPath { path: PathBuf::from(&host.path), kind }
        } else if let Some(empty) = &volume.empty_dir {
            let medium = if empty.medium.as_deref() == Some("Memory") {
                let size_bytes = match &empty.size_limit {
                    None => None,
                    Some(q) => Some(
                        quantity::parse(&q.0)
                            .and_then(|a| a.scaled(1, 1, Rounding::Up))
                            .map_err(|e| invalid(format!("sizeLimit {:?}: {}", q.0, e.reason())))?,
                    ),
                };
                Medium::Memory { size_bytes }
            } else {
                Medium::Disk
            };
            MountSource::EmptyDir { volume: volume.name.clone(), medium }
        } else if let Some(cm) = &volume.config_map {
            let files = volume_files(
                &volume.name,
                ObjectKind::ConfigMap,
                &cm.name,
                cm.items.as_deref(),
                cm.default_mode,
                cm.optional.unwrap_or(false),
                inputs,
            )?;
            MountSource::Files { volume: volume.name.clone(), files }
        } else if let Some(secret) = &volume.secret {
            let name = secret.secret_name.clone().unwrap_or_default();
            let files = volume_files(
                &volume.name,
                ObjectKind::Secret,
                &name,
                secret.items.as_deref(),
                secret.default_mode,
                secret.optional.unwrap_or(false),
                inputs,
            )?;
            MountSource::Files { volume: volume.name.clone(), files }
        } else {
            return Err(invalid("not supported by oka's runtime".into()));
        };
        out.push(Mount {
            target: PathBuf::from(&mount.mount_path),
            source,
            sub_path: mount.sub_path.as_deref().filter(|s| !s.is_empty()).map(PathBuf::from),
            read_only: mount.read_only.unwrap_or(false),
        });
    }
    Ok(out)
}

fn volume_files(
    volume: &str,
    kind: ObjectKind,
    name: &str,
    items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
    default_mode: Option<i32>,
    optional: bool,
    inputs: &PodInputs,
) -> Result<Vec<VolumeFile>, ResolveError> {
    let mode_of = |mode: Option<i32>| {
        mode.or(default_mode).and_then(|m| u32::try_from(m).ok()).unwrap_or(0o644) & 0o777
    };
    let failed =
        |what: String| ResolveError::FailedMount { volume: volume.to_owned(), message: what };
    let Some(keys) = keys_of(inputs, kind, name) else {
        if optional {
            return Ok(Vec::new());
        }
        return Err(failed(format!("{} {name:?} not found", kind.lower())));
    };
    let Some(items) = items.filter(|i| !i.is_empty()) else {
        return Ok(keys
            .iter()
            .map(|(key, content)| VolumeFile {
                path: PathBuf::from(key),
                mode: mode_of(None),
                content: content.clone(),
            })
            .collect());
    };
    let mut files = Vec::with_capacity(items.len());
    for item in items {
        match keys.get(&item.key) {
            Some(content) => files.push(VolumeFile {
                path: PathBuf::from(&item.path),
                mode: mode_of(item.mode),
                content: content.clone(),
            }),
            None if optional => {}
            None => {
                return Err(failed(format!("{} {name:?} has no key {:?}", kind.lower(), item.key)));
            }
        }
    }
    Ok(files)
}

/// Whether `name` can be an environment variable's name (what the kubelet takes from
/// `envFrom`: not empty, no `=`, printable ASCII).
fn env_name_ok(name: &str) -> bool {
    !name.is_empty() && !name.contains('=') && name.bytes().all(|b| b.is_ascii_graphic())
}

/// The first container's environment: `envFrom`, then `env` (values, references to ConfigMaps
/// and Secrets, the downward API), with `$(VAR)` expanded.
///
/// # Errors
///
/// [`ResolveError::ContainerConfig`] for a missing object or key that is not optional, or a
/// value that is not UTF-8.
pub fn environment(
    sandbox: &Sandbox,
    pod: &PodSpec,
    container: &Container,
    inputs: &PodInputs,
) -> Result<Vec<EnvVar>, ResolveError> {
    let config = |message: String| ResolveError::ContainerConfig {
        container: container.name.clone(),
        message,
    };
    let namespace = sandbox.metadata.namespace.clone().unwrap_or_default();
    let text = |bytes: &[u8], what: &dyn Fn() -> String| {
        String::from_utf8(bytes.to_vec()).map_err(|_| config(format!("{} is not UTF-8", what())))
    };
    let mut env: Vec<EnvVar> = Vec::new();
    let set = |env: &mut Vec<EnvVar>, name: &str, value: String| {
        env.retain(|v| v.name != name);
        env.push(EnvVar::new(name, value));
    };
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (kind, name, optional) = match (&from.config_map_ref, &from.secret_ref) {
            (Some(r), _) => (ObjectKind::ConfigMap, &r.name, r.optional.unwrap_or(false)),
            (None, Some(r)) => (ObjectKind::Secret, &r.name, r.optional.unwrap_or(false)),
            (None, None) => continue,
        };
        let Some(keys) = keys_of(inputs, kind, name) else {
            if optional {
                continue;
            }
            return Err(config(format!("{} {name:?} not found", kind.lower())));
        };
        for (key, value) in keys {
            let var = format!("{prefix}{key}");
            if env_name_ok(&var) {
                let value = text(value, &|| format!("key {key} of {} {name}", kind.kind()))?;
                set(&mut env, &var, value);
            }
        }
    }
    for var in container.env.iter().flatten() {
        let Some(from) = &var.value_from else {
            let value = expand(var.value.as_deref().unwrap_or_default(), &env);
            set(&mut env, &var.name, value);
            continue;
        };
        let keyed = match (&from.config_map_key_ref, &from.secret_key_ref) {
            (Some(r), _) => {
                Some((ObjectKind::ConfigMap, &r.name, &r.key, r.optional.unwrap_or(false)))
            }
            (None, Some(r)) => {
                Some((ObjectKind::Secret, &r.name, &r.key, r.optional.unwrap_or(false)))
            }
            (None, None) => None,
        };
        if let Some((kind, name, key, optional)) = keyed {
            let Some(keys) = keys_of(inputs, kind, name) else {
                if optional {
                    continue;
                }
                return Err(config(format!("{} {name:?} not found", kind.lower())));
            };
            match keys.get(key) {
                Some(value) => {
                    let value = text(value, &|| format!("key {key} of {} {name}", kind.kind()))?;
                    set(&mut env, &var.name, value);
                }
                None if optional => {}
                None => {
                    return Err(config(format!(
                        "couldn't find key {key} in {} {namespace}/{name}",
                        kind.kind()
                    )));
                }
            }
            continue;
        }
        if let Some(field) = &from.field_ref {
            if let Some(value) = downward(sandbox, pod, inputs, &field.field_path) {
                set(&mut env, &var.name, value);
            }
            continue;
        }
    }
    Ok(env)
}

/// A downward-API field of the sandbox (as a Pod's): `None` for one not supported (refused
/// before, by [`oka_api::local_runtime`]) or a label or annotation it lacks (the empty string
/// then, as the kubelet gives).
fn downward(sandbox: &Sandbox, pod: &PodSpec, inputs: &PodInputs, path: &str) -> Option<String> {
    let meta = &sandbox.metadata;
    let keyed = |prefix: &str, map: Option<&BTreeMap<String, String>>| {
        let key = path.strip_prefix(prefix)?.strip_prefix("['")?.strip_suffix("']")?;
        Some(map.and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => Some(inputs.node_name.clone().unwrap_or_default()),
        "spec.serviceAccountName" => Some(
            pod.service_account_name.clone().or(pod.service_account.clone()).unwrap_or_default(),
        ),
        _ => keyed("metadata.labels", meta.labels.as_ref())
            .or_else(|| keyed("metadata.annotations", meta.annotations.as_ref())),
    }
}

/// Kubernetes' `$(VAR)` expansion of a value from the variables defined before it: `$$` is a
/// `$`, an unknown reference stays as written.
pub fn expand(value: &str, env: &[EnvVar]) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(end) = body.find(')')
        {
            let name = &body[..end];
            match env.iter().rev().find(|v| v.name == name) {
                Some(var) => out.push_str(&var.value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The runtime's security settings of the first container: container fields win over the
/// pod's (`seccompProfile`); capabilities and `allowPrivilegeEscalation` are the container's
/// alone, `fsGroup` the pod's. A `seccompProfile` other than `Unconfined` is the runtime's
/// default filter (`Localhost` is refused before a template gets here, by
/// `oka_api::local_runtime`).
///
/// # Errors
///
/// [`ResolveError::InvalidUser`] for an `fsGroup` that is not a 32-bit id.
pub fn security(pod: &PodSpec, container: &Container) -> Result<Security, ResolveError> {
    let context = container.security_context.as_ref();
    let caps = context.and_then(|c| c.capabilities.as_ref());
    let fs_group = pod.security_context.as_ref().and_then(|c| c.fs_group);
    let fs_group = fs_group.map(|g| group_id(container, "fsGroup", g)).transpose()?;
    Ok(Security {
        read_only_root: context.and_then(|c| c.read_only_root_filesystem).unwrap_or(false),
        add_capabilities: caps.and_then(|c| c.add.clone()).unwrap_or_default(),
        drop_capabilities: caps.and_then(|c| c.drop.clone()).unwrap_or_default(),
        no_new_privileges: context.and_then(|c| c.allow_privilege_escalation) == Some(false),
        fs_group,
        seccomp: seccomp(pod, container),
    })
}

/// The filter a template asks for: the container's `seccompProfile`, else the pod's.
fn seccomp(pod: &PodSpec, container: &Container) -> Seccomp {
    let profile = container
        .security_context
        .as_ref()
        .and_then(|c| c.seccomp_profile.as_ref())
        .or_else(|| pod.security_context.as_ref().and_then(|c| c.seccomp_profile.as_ref()));
    match profile.map(|p| p.type_.as_str()) {
        Some("Unconfined") => Seccomp::Unconfined,
        _ => Seccomp::RuntimeDefault,
    }
}

fn group_id(container: &Container, field: &'static str, value: i64) -> Result<u32, ResolveError> {
    u32::try_from(value).map_err(|_| ResolveError::InvalidUser {
        container: container.name.clone(),
        field,
        value,
    })
}

/// The pod's `supplementalGroups`.
///
/// # Errors
///
/// [`ResolveError::InvalidUser`] for one that is not a 32-bit id.
pub fn supplementary_groups(
    pod: &PodSpec,
    container: &Container,
) -> Result<Vec<u32>, ResolveError> {
    let groups = pod.security_context.as_ref().and_then(|c| c.supplemental_groups.as_ref());
    groups.into_iter().flatten().map(|g| group_id(container, "supplementalGroups", *g)).collect()
}

/// Whether `runAsNonRoot` is asked for (the container's, else the pod's).
pub fn run_as_non_root(pod: &PodSpec, container: &Container) -> bool {
    container
        .security_context
        .as_ref()
        .and_then(|c| c.run_as_non_root)
        .or_else(|| pod.security_context.as_ref().and_then(|c| c.run_as_non_root))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<EnvVar> {
        pairs.iter().map(|(k, v)| EnvVar::new(*k, *v)).collect()
    }

    #[test]
    fn references_expand_from_earlier_variables() {
        let env = vars(&[("A", "1"), ("B", "two")]);
        assert_eq!(expand("$(A)-$(B)", &env), "1-two");
        assert_eq!(expand("$$(A) $(C) $", &env), "$(A) $(C) $");
        assert_eq!(expand("x$(A", &env), "x$(A");
    }

    fn pod(json: serde_json::Value) -> PodSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn config_map_volumes_take_every_key_or_the_items_with_their_modes() {
        let spec = pod(serde_json::json!({
            "volumes": [
                {"name": "all", "configMap": {"name": "cm", "defaultMode": 0o440}},
                {"name": "some", "configMap": {"name": "cm", "items": [{"key": "b", "path": "dir/b", "mode": 0o600}]}},
                {"name": "gone", "secret": {"secretName": "missing", "optional": true}},
                {"name": "needed", "secret": {"secretName": "missing"}},
            ],
            "containers": [{"name": "main", "volumeMounts": [
                {"name": "all", "mountPath": "/all"},
                {"name": "some", "mountPath": "/some", "subPath": "dir"},
                {"name": "gone", "mountPath": "/gone"},
            ]}],
        }));
        let mut inputs = PodInputs::default();
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AAE="},
        }))
        .unwrap();
        inputs.add_config_map("cm", Some(&cm));
        inputs.add_secret("missing", None);
        let got = mounts(&spec, &spec.containers[0], &inputs).unwrap();
        let MountSource::Files { files, .. } = &got[0].source else { panic!("{got:?}") };
        let summary: Vec<(String, u32, Vec<u8>)> = files
            .iter()
            .map(|f| (f.path.display().to_string(), f.mode, f.content.clone()))
            .collect();
        assert_eq!(
            summary,
            [
                ("a".into(), 0o440, b"1".to_vec()),
                ("b".into(), 0o440, b"2".to_vec()),
                ("c".into(), 0o440, vec![0, 1])
            ]
        );
        let MountSource::Files { files, .. } = &got[1].source else { panic!("{got:?}") };
        assert_eq!((files[0].path.to_str(), files[0].mode), (Some("dir/b"), 0o600));
        assert_eq!(got[1].sub_path.as_deref(), Some(std::path::Path::new("dir")));
        assert_eq!(got[2].source, MountSource::Files { volume: "gone".into(), files: vec![] });

        let mut needed = spec.clone();
        needed.containers[0].volume_mounts = Some(vec![
            serde_json::from_value(serde_json::json!({"name": "needed", "mountPath": "/n"}))
                .unwrap(),
        ]);
        let err = mounts(&needed, &needed.containers[0], &inputs).unwrap_err();
        assert_eq!(
            err.to_string(),
            "MountVolume.SetUp failed for volume \"needed\" : secret \"missing\" not found"
        );
    }

    #[test]
    fn env_comes_from_objects_the_downward_api_and_earlier_values() {
        let sandbox = Sandbox::test().name("sbx").build();
        let spec = pod(serde_json::json!({"containers": [{
            "name": "main",
            "envFrom": [{"prefix": "CM_", "configMapRef": {"name": "cm"}}, {"secretRef": {"name": "nope", "optional": true}}],
            "env": [
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
                {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "none", "optional": true}}},
                {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "BOTH", "value": "$(NAME)/$(CM_a)"},
            ],
        }]}));
        let mut inputs = PodInputs::default();
        let cm: ConfigMap =
            serde_json::from_value(serde_json::json!({"data": {"a": "1", "bad=key": "x"}}))
                .unwrap();
        inputs.add_config_map("cm", Some(&cm));
        let secret: Secret =
            serde_json::from_value(serde_json::json!({"data": {"token": "c2VjcmV0"}})).unwrap();
        inputs.add_secret("s", Some(&secret));
        inputs.add_secret("nope", None);
        let env = environment(&sandbox, &spec, &spec.containers[0], &inputs).unwrap();
        assert_eq!(
            env,
            vars(&[("CM_a", "1"), ("TOKEN", "secret"), ("NAME", "sbx"), ("BOTH", "sbx/1")])
        );
        inputs.add_secret("s", None);
        let err = environment(&sandbox, &spec, &spec.containers[0], &inputs).unwrap_err();
        assert_eq!(err.to_string(), "secret \"s\" not found");
        inputs.add_secret(
            "s",
            Some(&serde_json::from_value(serde_json::json!({"data": {}})).unwrap()),
        );
        let err = environment(&sandbox, &spec, &spec.containers[0], &inputs).unwrap_err();
        assert_eq!(err.to_string(), "couldn't find key token in Secret default/s");
    }

    #[test]
    fn the_security_context_takes_the_containers_fields_and_the_pods_groups() {
        let spec = pod(serde_json::json!({
            "securityContext": {"fsGroup": 2000, "supplementalGroups": [3000, 3001], "runAsNonRoot": true},
            "containers": [{"name": "main", "securityContext": {
                "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                "capabilities": {"add": ["NET_ADMIN"], "drop": ["NET_RAW"]},
            }}],
        }));
        let container = &spec.containers[0];
        assert_eq!(
            security(&spec, container).unwrap(),
            Security {
                read_only_root: true,
                add_capabilities: vec!["NET_ADMIN".into()],
                drop_capabilities: vec!["NET_RAW".into()],
                no_new_privileges: true,
                fs_group: Some(2000),
                seccomp: Seccomp::RuntimeDefault,
            }
        );
        assert_eq!(supplementary_groups(&spec, container).unwrap(), [3000, 3001]);
        assert!(run_as_non_root(&spec, container));
        let mut negative = spec.clone();
        negative.security_context.as_mut().unwrap().fs_group = Some(-1);
        assert!(security(&negative, container).is_err());
    }

    #[test]
    fn the_containers_seccomp_profile_wins_and_only_unconfined_turns_the_filter_off() {
        let profile = |pod: Option<&str>, container: Option<&str>| {
            let kind =
                |t: Option<&str>| t.map(|t| serde_json::json!({"seccompProfile": {"type": t}}));
            let spec = pod_of(kind(pod), kind(container));
            security(&spec, &spec.containers[0]).unwrap().seccomp
        };
        assert_eq!(profile(None, None), Seccomp::RuntimeDefault);
        assert_eq!(profile(Some("Unconfined"), None), Seccomp::Unconfined);
        assert_eq!(profile(Some("Unconfined"), Some("RuntimeDefault")), Seccomp::RuntimeDefault);
        assert_eq!(profile(Some("RuntimeDefault"), Some("Unconfined")), Seccomp::Unconfined);
    }

    fn pod_of(
        pod_context: Option<serde_json::Value>,
        context: Option<serde_json::Value>,
    ) -> PodSpec {
        let mut c = serde_json::json!({"name": "main"});
        if let Some(sc) = context {
            c["securityContext"] = sc;
        }
        let mut p = serde_json::json!({"containers": [c]});
        if let Some(sc) = pod_context {
            p["securityContext"] = sc;
        }
        pod(p)
    }
}
