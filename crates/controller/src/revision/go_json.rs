//! Go's `encoding/json` output for the Go structs the reference hashes, from their JSON.
//!
//! The reference's revisions (`crate::revision`) hash `json.Marshal` of Go structs, so the
//! bytes depend on facts JSON alone does not carry: each struct's field order (its Go
//! declaration order), which fields are `omitempty`, and what an absent field becomes (a
//! non-`omitempty` string is `""`, a nil pointer, slice or map is `null`, a struct is always
//! written, even under `omitempty`: `"resources":{}`, `"metadata":{"creationTimestamp":null}`).
//! [`encode`] takes a value as the Kubernetes JSON of an object (what serde writes for the
//! k8s-openapi and oka types) and writes it as Go would, driven by [`GO_TYPES`], a table of
//! the Go types involved: `PodTemplateSpec` and the `k8s.io/api/core/v1` types reachable from
//! it, `PersistentVolumeClaim`, the `metav1` types they use, and the reference's
//! `agents.kruise.io` types of the revision (`SandboxTemplateSpec`, `RuntimeConfig`,
//! `PauseStrategy`, `SandboxTemplateRef`).
//!
//! The table follows `k8s.io/api` v0.35 (the version the reference's `go.mod` pins). It was
//! written from the Go declarations; each line is `Type: field ty, ...`, a `?` after a name
//! marks `omitempty`, `..Type` embeds a struct inline (Go's `json:",inline"`), and the field
//! types are `str`, `int`, `bool`, `qty` (`resource.Quantity`), `time` (`metav1.Time`), `ios`
//! (`intstr.IntOrString`), `raw` (any JSON, written with sorted keys), `*T`, `[]T`, `map T`
//! (string keys, sorted as Go sorts them) or a struct name.
//!
//! Values are written as Go writes them: strings with Go's escaping (`<`, `>`, `&`, U+2028
//! and U+2029 as `\u003c` etc., `\b` `\f` `\n` `\r` `\t` short, other controls as `\u00XX`),
//! `metav1.Time` as RFC 3339 in UTC to the second (or `null` when zero), `resource.Quantity`
//! in its canonical form ([`canonical_quantity`]: `1000m` is `1`, `1024Mi` is `1Gi`), and an
//! `IntOrString` as the number or string it holds. Fields Go does not know are dropped, as a
//! Go decoder drops them.
//!
//! # Caveats
//!
//! - The in-tree volume sources Kubernetes deprecated (`gcePersistentDisk`, `rbd`, `cinder`,
//!   ...) are `raw` here: written with sorted keys, not in their Go field order. A template
//!   using one hashes differently from the reference.
//! - A required Go slice the user left out is `null` in Go; k8s-openapi, which has no
//!   `Option` for a few required lists (`nodeSelectorTerms`), writes `[]` and so does this
//!   encoder.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::OnceLock;

use serde_json::Value;

/// The Go types, one per line; see the [module documentation](self) for the notation.
pub const GO_TYPES: &str = "
ObjectMeta: name? str, generateName? str, namespace? str, selfLink? str, uid? str, resourceVersion? str, generation? int, creationTimestamp? time, deletionTimestamp? *time, deletionGracePeriodSeconds? *int, labels? map str, annotations? map str, ownerReferences? []OwnerReference, finalizers? []str, managedFields? []ManagedFieldsEntry
TypeMeta: kind? str, apiVersion? str
OwnerReference: apiVersion str, kind str, name str, uid str, controller? *bool, blockOwnerDeletion? *bool
ManagedFieldsEntry: manager? str, operation? str, apiVersion? str, time? *time, fieldsType? str, fieldsV1? *raw, subresource? str
LabelSelector: matchLabels? map str, matchExpressions? []LabelSelectorRequirement
LabelSelectorRequirement: key str, operator str, values? []str
PodTemplateSpec: metadata? ObjectMeta, spec? PodSpec
PodSpec: volumes? []Volume, initContainers? []Container, containers []Container, ephemeralContainers? []EphemeralContainer, restartPolicy? str, terminationGracePeriodSeconds? *int, activeDeadlineSeconds? *int, dnsPolicy? str, nodeSelector? map str, serviceAccountName? str, serviceAccount? str, automountServiceAccountToken? *bool, nodeName? str, hostNetwork? bool, hostPID? bool, hostIPC? bool, shareProcessNamespace? *bool, securityContext? *PodSecurityContext, imagePullSecrets? []LocalObjectReference, hostname? str, subdomain? str, affinity? *Affinity, schedulerName? str, tolerations? []Toleration, hostAliases? []HostAlias, priorityClassName? str, priority? *int, dnsConfig? *PodDNSConfig, readinessGates? []PodReadinessGate, runtimeClassName? *str, enableServiceLinks? *bool, preemptionPolicy? *str, overhead? map qty, topologySpreadConstraints? []TopologySpreadConstraint, setHostnameAsFQDN? *bool, os? *PodOS, hostUsers? *bool, schedulingGates? []PodSchedulingGate, resourceClaims? []PodResourceClaim, resources? *ResourceRequirements, hostnameOverride? *str, workloadRef? *WorkloadReference
Container: name str, image? str, command? []str, args? []str, workingDir? str, ports? []ContainerPort, envFrom? []EnvFromSource, env? []EnvVar, resources? ResourceRequirements, resizePolicy? []ContainerResizePolicy, restartPolicy? *str, restartPolicyRules? []ContainerRestartRule, volumeMounts? []VolumeMount, volumeDevices? []VolumeDevice, livenessProbe? *Probe, readinessProbe? *Probe, startupProbe? *Probe, lifecycle? *Lifecycle, terminationMessagePath? str, terminationMessagePolicy? str, imagePullPolicy? str, securityContext? *SecurityContext, stdin? bool, stdinOnce? bool, tty? bool
EphemeralContainer: ..Container, targetContainerName? str
ContainerRestartRule: action str, exitCodes? *ContainerRestartRuleOnExitCodes
ContainerRestartRuleOnExitCodes: operator str, values? []int
ContainerPort: name? str, hostPort? int, containerPort int, protocol? str, hostIP? str
EnvFromSource: prefix? str, configMapRef? *ConfigMapEnvSource, secretRef? *SecretEnvSource
ConfigMapEnvSource: ..LocalObjectReference, optional? *bool
SecretEnvSource: ..LocalObjectReference, optional? *bool
LocalObjectReference: name? str
EnvVar: name str, value? str, valueFrom? *EnvVarSource
EnvVarSource: fieldRef? *ObjectFieldSelector, resourceFieldRef? *ResourceFieldSelector, configMapKeyRef? *ConfigMapKeySelector, secretKeyRef? *SecretKeySelector, fileKeyRef? *FileKeySelector
ObjectFieldSelector: apiVersion? str, fieldPath str
ResourceFieldSelector: containerName? str, resource str, divisor? qty
ConfigMapKeySelector: ..LocalObjectReference, key str, optional? *bool
SecretKeySelector: ..LocalObjectReference, key str, optional? *bool
FileKeySelector: volumeName str, path str, key str, optional? *bool
ResourceRequirements: limits? map qty, requests? map qty, claims? []ResourceClaim
ResourceClaim: name str, request? str
ContainerResizePolicy: resourceName str, restartPolicy str
VolumeMount: name str, readOnly? bool, recursiveReadOnly? *str, mountPath str, subPath? str, mountPropagation? *str, subPathExpr? str
VolumeDevice: name str, devicePath str
Probe: ..ProbeHandler, initialDelaySeconds? int, timeoutSeconds? int, periodSeconds? int, successThreshold? int, failureThreshold? int, terminationGracePeriodSeconds? *int
ProbeHandler: exec? *ExecAction, httpGet? *HTTPGetAction, tcpSocket? *TCPSocketAction, grpc? *GRPCAction
ExecAction: command? []str
HTTPGetAction: path? str, port ios, host? str, scheme? str, httpHeaders? []HTTPHeader
HTTPHeader: name str, value str
TCPSocketAction: port ios, host? str
GRPCAction: port int, service *str
Lifecycle: postStart? *LifecycleHandler, preStop? *LifecycleHandler, stopSignal? *str
LifecycleHandler: exec? *ExecAction, httpGet? *HTTPGetAction, tcpSocket? *TCPSocketAction, sleep? *SleepAction
SleepAction: seconds int
SecurityContext: capabilities? *Capabilities, privileged? *bool, seLinuxOptions? *SELinuxOptions, windowsOptions? *WindowsSecurityContextOptions, runAsUser? *int, runAsGroup? *int, runAsNonRoot? *bool, readOnlyRootFilesystem? *bool, allowPrivilegeEscalation? *bool, procMount? *str, seccompProfile? *SeccompProfile, appArmorProfile? *AppArmorProfile
Capabilities: add? []str, drop? []str
SELinuxOptions: user? str, role? str, type? str, level? str
WindowsSecurityContextOptions: gmsaCredentialSpecName? *str, gmsaCredentialSpec? *str, runAsUserName? *str, hostProcess? *bool
SeccompProfile: type str, localhostProfile? *str
AppArmorProfile: type str, localhostProfile? *str
PodSecurityContext: seLinuxOptions? *SELinuxOptions, windowsOptions? *WindowsSecurityContextOptions, runAsUser? *int, runAsGroup? *int, runAsNonRoot? *bool, supplementalGroups? []int, supplementalGroupsPolicy? *str, fsGroup? *int, sysctls? []Sysctl, fsGroupChangePolicy? *str, seccompProfile? *SeccompProfile, appArmorProfile? *AppArmorProfile, seLinuxChangePolicy? *str
Sysctl: name str, value str
Affinity: nodeAffinity? *NodeAffinity, podAffinity? *PodAffinity, podAntiAffinity? *PodAntiAffinity
NodeAffinity: requiredDuringSchedulingIgnoredDuringExecution? *NodeSelector, preferredDuringSchedulingIgnoredDuringExecution? []PreferredSchedulingTerm
NodeSelector: nodeSelectorTerms []NodeSelectorTerm
NodeSelectorTerm: matchExpressions? []NodeSelectorRequirement, matchFields? []NodeSelectorRequirement
NodeSelectorRequirement: key str, operator str, values? []str
PreferredSchedulingTerm: weight int, preference NodeSelectorTerm
PodAffinity: requiredDuringSchedulingIgnoredDuringExecution? []PodAffinityTerm, preferredDuringSchedulingIgnoredDuringExecution? []WeightedPodAffinityTerm
PodAntiAffinity: ..PodAffinity
PodAffinityTerm: labelSelector? *LabelSelector, namespaces? []str, topologyKey str, namespaceSelector? *LabelSelector, matchLabelKeys? []str, mismatchLabelKeys? []str
WeightedPodAffinityTerm: weight int, podAffinityTerm PodAffinityTerm
Toleration: key? str, operator? str, value? str, effect? str, tolerationSeconds? *int
HostAlias: ip str, hostnames? []str
PodDNSConfig: nameservers? []str, searches? []str, options? []PodDNSConfigOption
PodDNSConfigOption: name? str, value? *str
PodReadinessGate: conditionType str
TopologySpreadConstraint: maxSkew int, topologyKey str, whenUnsatisfiable str, labelSelector? *LabelSelector, minDomains? *int, nodeAffinityPolicy? *str, nodeTaintsPolicy? *str, matchLabelKeys? []str
PodOS: name str
PodSchedulingGate: name str
PodResourceClaim: name str, resourceClaimName? *str, resourceClaimTemplateName? *str
WorkloadReference: name str, podGroup str, podGroupReplicaKey? str
Volume: name str, ..VolumeSource
VolumeSource: hostPath? *HostPathVolumeSource, emptyDir? *EmptyDirVolumeSource, gcePersistentDisk? *raw, awsElasticBlockStore? *raw, gitRepo? *GitRepoVolumeSource, secret? *SecretVolumeSource, nfs? *NFSVolumeSource, iscsi? *raw, glusterfs? *raw, persistentVolumeClaim? *PersistentVolumeClaimVolumeSource, rbd? *raw, flexVolume? *raw, cinder? *raw, cephfs? *raw, flocker? *raw, downwardAPI? *DownwardAPIVolumeSource, fc? *raw, azureFile? *raw, configMap? *ConfigMapVolumeSource, vsphereVolume? *raw, quobyte? *raw, azureDisk? *raw, photonPersistentDisk? *raw, projected? *ProjectedVolumeSource, portworxVolume? *raw, scaleIO? *raw, storageos? *raw, csi? *CSIVolumeSource, ephemeral? *EphemeralVolumeSource, image? *ImageVolumeSource
HostPathVolumeSource: path str, type? *str
EmptyDirVolumeSource: medium? str, sizeLimit? *qty
GitRepoVolumeSource: repository str, revision? str, directory? str
NFSVolumeSource: server str, path str, readOnly? bool
SecretVolumeSource: secretName? str, items? []KeyToPath, defaultMode? *int, optional? *bool
KeyToPath: key str, path str, mode? *int
PersistentVolumeClaimVolumeSource: claimName str, readOnly? bool
DownwardAPIVolumeSource: items? []DownwardAPIVolumeFile, defaultMode? *int
DownwardAPIVolumeFile: path str, fieldRef? *ObjectFieldSelector, resourceFieldRef? *ResourceFieldSelector, mode? *int
ConfigMapVolumeSource: ..LocalObjectReference, items? []KeyToPath, defaultMode? *int, optional? *bool
ProjectedVolumeSource: sources []VolumeProjection, defaultMode? *int
VolumeProjection: secret? *SecretProjection, downwardAPI? *DownwardAPIProjection, configMap? *ConfigMapProjection, serviceAccountToken? *ServiceAccountTokenProjection, clusterTrustBundle? *ClusterTrustBundleProjection, podCertificate? *raw
SecretProjection: ..LocalObjectReference, items? []KeyToPath, optional? *bool
ConfigMapProjection: ..LocalObjectReference, items? []KeyToPath, optional? *bool
DownwardAPIProjection: items? []DownwardAPIVolumeFile
ServiceAccountTokenProjection: audience? str, expirationSeconds? *int, path str
ClusterTrustBundleProjection: name? *str, signerName? *str, labelSelector? *LabelSelector, optional? *bool, path str
CSIVolumeSource: driver str, readOnly? *bool, fsType? *str, volumeAttributes? map str, nodePublishSecretRef? *LocalObjectReference
EphemeralVolumeSource: volumeClaimTemplate? *PersistentVolumeClaimTemplate
PersistentVolumeClaimTemplate: metadata? ObjectMeta, spec PersistentVolumeClaimSpec
ImageVolumeSource: reference? str, pullPolicy? str
PersistentVolumeClaim: ..TypeMeta, metadata? ObjectMeta, spec? PersistentVolumeClaimSpec, status? PersistentVolumeClaimStatus
PersistentVolumeClaimSpec: accessModes? []str, selector? *LabelSelector, resources? VolumeResourceRequirements, volumeName? str, storageClassName? *str, volumeMode? *str, dataSource? *TypedLocalObjectReference, dataSourceRef? *TypedObjectReference, volumeAttributesClassName? *str
VolumeResourceRequirements: limits? map qty, requests? map qty
TypedLocalObjectReference: apiGroup *str, kind str, name str
TypedObjectReference: apiGroup *str, kind str, name str, namespace? *str
PersistentVolumeClaimStatus: phase? str, accessModes? []str, capacity? map qty, conditions? []PersistentVolumeClaimCondition, allocatedResources? map qty, allocatedResourceStatuses? map str, currentVolumeAttributesClassName? *str, modifyVolumeStatus? *ModifyVolumeStatus
PersistentVolumeClaimCondition: type str, status str, lastProbeTime? time, lastTransitionTime? time, reason? str, message? str
ModifyVolumeStatus: targetVolumeAttributesClassName? str, status str
SandboxTemplateSpec: template? *PodTemplateSpec, volumeClaimTemplates? []PersistentVolumeClaim, persistentContents? []str, runtimes? []RuntimeConfig, pauseStrategy? *PauseStrategy
RuntimeConfig: name str
PauseStrategy: type? str, hibernateStrategy? *HibernateStrategy
HibernateStrategy: type? str
SandboxTemplateRef: name str, kind? str, apiVersion? str
";

/// The type of a Go field.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ty {
    Str,
    Int,
    Bool,
    Quantity,
    Time,
    IntOrString,
    Raw,
    Ptr(Box<Ty>),
    Slice(Box<Ty>),
    Map(Box<Ty>),
    Struct(String),
}

/// One entry of a Go struct: a field, or a struct embedded inline.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Field { name: String, omit_empty: bool, ty: Ty },
    Inline(String),
}

type Table = HashMap<String, Vec<Entry>>;

fn parse_ty(text: &str) -> Result<Ty, String> {
    let text = text.trim();
    Ok(if let Some(rest) = text.strip_prefix('*') {
        Ty::Ptr(Box::new(parse_ty(rest)?))
    } else if let Some(rest) = text.strip_prefix("[]") {
        Ty::Slice(Box::new(parse_ty(rest)?))
    } else if let Some(rest) = text.strip_prefix("map ") {
        Ty::Map(Box::new(parse_ty(rest)?))
    } else {
        match text {
            "str" => Ty::Str,
            "int" => Ty::Int,
            "bool" => Ty::Bool,
            "qty" => Ty::Quantity,
            "time" => Ty::Time,
            "ios" => Ty::IntOrString,
            "raw" => Ty::Raw,
            name if name.chars().next().is_some_and(char::is_uppercase) => {
                Ty::Struct(name.to_owned())
            }
            other => return Err(format!("unknown type {other:?}")),
        }
    })
}

fn parse_table(text: &str) -> Result<Table, String> {
    let mut table = Table::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (name, fields) = line.split_once(':').ok_or_else(|| format!("no ':' in {line:?}"))?;
        let mut entries = Vec::new();
        for field in fields.split(',').map(str::trim) {
            if let Some(inline) = field.strip_prefix("..") {
                entries.push(Entry::Inline(inline.to_owned()));
                continue;
            }
            let (json, ty) =
                field.split_once(' ').ok_or_else(|| format!("bad field {field:?} of {name}"))?;
            let (json, omit_empty) = match json.strip_suffix('?') {
                Some(json) => (json, true),
                None => (json, false),
            };
            entries.push(Entry::Field { name: json.to_owned(), omit_empty, ty: parse_ty(ty)? });
        }
        if table.insert(name.trim().to_owned(), entries).is_some() {
            return Err(format!("{name} twice"));
        }
    }
    Ok(table)
}

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    // The table is a constant checked by a test (`the_table_is_complete`); a broken table
    // yields an empty one, whose every struct is then written as `{}`.
    TABLE.get_or_init(|| parse_table(GO_TYPES).unwrap_or_default())
}

/// Why a value cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GoJsonError {
    /// The Go type is not in [`GO_TYPES`].
    #[error("Go type {0} is not in the table")]
    UnknownType(String),
}

/// Writes `value` (the Kubernetes JSON of a Go value of type `go_type`, or `None` for the
/// zero value) as Go's `json.Marshal` of that value would.
///
/// # Errors
///
/// [`GoJsonError::UnknownType`] when `go_type` is not a struct of [`GO_TYPES`].
pub fn encode(go_type: &str, value: Option<&Value>) -> Result<Vec<u8>, GoJsonError> {
    if !table().contains_key(go_type) {
        return Err(GoJsonError::UnknownType(go_type.to_owned()));
    }
    let mut out = String::new();
    write_value(&Ty::Struct(go_type.to_owned()), value, &mut out);
    Ok(out.into_bytes())
}

/// Writes `value` as a Go `*T` of the struct `go_type`: `null` when absent.
///
/// # Errors
///
/// As [`encode`].
pub fn encode_ptr(go_type: &str, value: Option<&Value>) -> Result<Vec<u8>, GoJsonError> {
    match value {
        None | Some(Value::Null) => Ok(b"null".to_vec()),
        Some(value) => encode(go_type, Some(value)),
    }
}

fn present(value: Option<&Value>) -> Option<&Value> {
    value.filter(|v| !v.is_null())
}

/// Whether Go's `omitempty` drops a field of type `ty` holding `value`. A struct (and
/// `Quantity`, `Time`, `IntOrString`, which are structs in Go) is never empty.
fn is_empty(ty: &Ty, value: Option<&Value>) -> bool {
    let Some(value) = present(value) else {
        return !matches!(ty, Ty::Struct(_) | Ty::Quantity | Ty::Time | Ty::IntOrString);
    };
    match ty {
        Ty::Str => value.as_str() == Some(""),
        Ty::Int => value.as_f64() == Some(0.0),
        Ty::Bool => value.as_bool() == Some(false),
        Ty::Slice(_) => value.as_array().is_some_and(Vec::is_empty),
        Ty::Map(_) => value.as_object().is_some_and(serde_json::Map::is_empty),
        Ty::Ptr(_) | Ty::Raw | Ty::Struct(_) | Ty::Quantity | Ty::Time | Ty::IntOrString => false,
    }
}

fn write_value(ty: &Ty, value: Option<&Value>, out: &mut String) {
    let value = present(value);
    match ty {
        Ty::Str => match value {
            Some(Value::String(s)) => write_string(s, out),
            Some(other) => write_raw(other, out),
            None => out.push_str("\"\""),
        },
        Ty::Int | Ty::Bool => match value {
            Some(value) => write_raw(value, out),
            None => out.push_str(if *ty == Ty::Int { "0" } else { "false" }),
        },
        Ty::Quantity => match value {
            Some(Value::String(s)) => match canonical_quantity(s) {
                Some(canonical) => write_string(&canonical, out),
                None => write_string(s, out),
            },
            Some(Value::Number(n)) => {
                let text = n.to_string();
                write_string(&canonical_quantity(&text).unwrap_or(text), out);
            }
            Some(other) => write_raw(other, out),
            None => out.push_str("\"0\""),
        },
        Ty::Time => match value.and_then(Value::as_str).and_then(go_time) {
            Some(time) => write_string(&time, out),
            None => out.push_str("null"),
        },
        Ty::IntOrString => match value {
            Some(value) => write_raw(value, out),
            None => out.push('0'),
        },
        Ty::Raw => match value {
            Some(value) => write_raw(value, out),
            None => out.push_str("null"),
        },
        Ty::Ptr(inner) => match value {
            Some(value) => write_value(inner, Some(value), out),
            None => out.push_str("null"),
        },
        Ty::Slice(inner) => match value {
            Some(Value::Array(items)) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_value(inner, Some(item), out);
                }
                out.push(']');
            }
            Some(other) => write_raw(other, out),
            None => out.push_str("null"),
        },
        Ty::Map(inner) => match value {
            Some(Value::Object(map)) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, key) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_string(key, out);
                    out.push(':');
                    write_value(inner, map.get(key), out);
                }
                out.push('}');
            }
            Some(other) => write_raw(other, out),
            None => out.push_str("null"),
        },
        Ty::Struct(name) => {
            out.push('{');
            let mut first = true;
            write_fields(name, value.and_then(Value::as_object), out, &mut first);
            out.push('}');
        }
    }
}

fn write_fields(
    name: &str,
    object: Option<&serde_json::Map<String, Value>>,
    out: &mut String,
    first: &mut bool,
) {
    let Some(entries) = table().get(name) else { return };
    for entry in entries {
        match entry {
            Entry::Inline(inner) => write_fields(inner, object, out, first),
            Entry::Field { name, omit_empty, ty } => {
                let value = object.and_then(|o| o.get(name));
                if *omit_empty && is_empty(ty, value) {
                    continue;
                }
                if !*first {
                    out.push(',');
                }
                *first = false;
                write_string(name, out);
                out.push(':');
                write_value(ty, value, out);
            }
        }
    }
}

/// Any JSON value as Go writes an `interface{}` holding it: object keys sorted.
pub fn write_raw(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_raw(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                if let Some(value) = map.get(key) {
                    write_raw(value, out);
                }
            }
            out.push('}');
        }
    }
}

/// A string as Go's `encoding/json` writes it (with its default HTML escaping).
pub fn write_string(text: &str, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A `metav1.Time` as Go writes it: RFC 3339, UTC, whole seconds.
fn go_time(text: &str) -> Option<String> {
    let time: jiff::Timestamp = text.parse().ok()?;
    Some(time.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// The canonical form of a `resource.Quantity` (what Go's `Quantity.String` returns), or
/// `None` when `text` is not a quantity.
///
/// The value keeps the format its suffix gave it (binary `Ki`..`Ei`, decimal `n`..`E` or
/// none, exponent `e3`), is rounded up to nano units, and is written with the largest
/// suffix that keeps an integer mantissa: a binary value below 1024 or with a fraction is
/// written decimal; a decimal exponent is a multiple of 3.
pub fn canonical_quantity(text: &str) -> Option<String> {
    #[derive(PartialEq)]
    enum Format {
        Binary,
        DecimalSi,
        Exponent,
    }
    let text = text.trim();
    let (negative, rest) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let mut mantissa: i128 = digits.parse().ok()?;
    let mut exponent = -i32::try_from(fraction.len()).ok()?;
    let (format, binary_power, decimal_power) = match suffix {
        "" => (Format::DecimalSi, 0, 0),
        "Ki" => (Format::Binary, 10, 0),
        "Mi" => (Format::Binary, 20, 0),
        "Gi" => (Format::Binary, 30, 0),
        "Ti" => (Format::Binary, 40, 0),
        "Pi" => (Format::Binary, 50, 0),
        "Ei" => (Format::Binary, 60, 0),
        "n" => (Format::DecimalSi, 0, -9),
        "u" => (Format::DecimalSi, 0, -6),
        "m" => (Format::DecimalSi, 0, -3),
        "k" => (Format::DecimalSi, 0, 3),
        "M" => (Format::DecimalSi, 0, 6),
        "G" => (Format::DecimalSi, 0, 9),
        "T" => (Format::DecimalSi, 0, 12),
        "P" => (Format::DecimalSi, 0, 15),
        "E" => (Format::DecimalSi, 0, 18),
        other => {
            let power = other.strip_prefix(['e', 'E'])?;
            (Format::Exponent, 0, power.parse::<i32>().ok()?)
        }
    };
    mantissa = mantissa.checked_mul(1_i128.checked_shl(binary_power)?)?;
    exponent += decimal_power;
    // Round up to nano units, as Go's parser does.
    while exponent < -9 {
        let rounded_up = mantissa % 10 != 0;
        mantissa = mantissa / 10 + i128::from(rounded_up);
        exponent += 1;
    }
    if mantissa == 0 {
        return Some("0".to_owned());
    }
    if negative {
        mantissa = -mantissa;
    }
    // The value as an integer, when it is one.
    let integer = if exponent >= 0 {
        10_i128.checked_pow(exponent.unsigned_abs()).and_then(|p| mantissa.checked_mul(p))
    } else {
        let divisor = 10_i128.pow(exponent.unsigned_abs());
        (mantissa % divisor == 0).then(|| mantissa / divisor)
    };
    let sign = if mantissa < 0 { "-" } else { "" };
    if format == Format::Binary
        && let Some(integer) = integer.filter(|v| v.abs() >= 1024)
    {
        let mut amount = integer.abs();
        let mut power = 0;
        while amount % 1024 == 0 && power < 6 {
            amount /= 1024;
            power += 1;
        }
        let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][power];
        return Some(format!("{sign}{amount}{suffix}"));
    }
    let mut amount = mantissa.abs();
    while amount % 10 == 0 {
        amount /= 10;
        exponent += 1;
    }
    match exponent.rem_euclid(3) {
        1 => {
            amount *= 10;
            exponent -= 1;
        }
        2 => {
            amount *= 100;
            exponent -= 2;
        }
        _ => {}
    }
    let suffix = if format == Format::Exponent {
        if exponent == 0 { String::new() } else { format!("e{exponent}") }
    } else {
        match exponent {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            0 => "",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            other => return Some(format!("{sign}{amount}e{other}")),
        }
        .to_owned()
    };
    Some(format!("{sign}{amount}{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_table_is_complete() {
        let table = parse_table(GO_TYPES).expect("the table parses");
        fn check(ty: &Ty, table: &Table) {
            match ty {
                Ty::Ptr(inner) | Ty::Slice(inner) | Ty::Map(inner) => check(inner, table),
                Ty::Struct(name) => assert!(table.contains_key(name), "{name} is missing"),
                _ => {}
            }
        }
        for entries in table.values() {
            for entry in entries {
                match entry {
                    Entry::Inline(name) => assert!(table.contains_key(name), "{name} is missing"),
                    Entry::Field { ty, .. } => check(ty, &table),
                }
            }
        }
    }

    #[test]
    fn structs_are_always_written_and_nil_values_are_null() {
        let bytes = encode("PodTemplateSpec", Some(&json!({}))).expect("known type");
        assert_eq!(
            String::from_utf8(bytes).expect("utf-8"),
            r#"{"metadata":{"creationTimestamp":null},"spec":{"containers":null}}"#
        );
        let container = json!({"name": "main", "image": "busybox"});
        let bytes = encode("Container", Some(&container)).expect("known type");
        assert_eq!(
            String::from_utf8(bytes).expect("utf-8"),
            r#"{"name":"main","image":"busybox","resources":{}}"#
        );
    }

    #[test]
    fn unknown_fields_are_dropped_and_go_order_is_kept() {
        let port = json!({"protocol": "TCP", "containerPort": 80, "bogus": 1, "name": "http"});
        let bytes = encode("ContainerPort", Some(&port)).expect("known type");
        assert_eq!(
            String::from_utf8(bytes).expect("utf-8"),
            r#"{"name":"http","containerPort":80,"protocol":"TCP"}"#
        );
    }

    #[test]
    fn strings_are_escaped_as_go_escapes_them() {
        let mut out = String::new();
        write_string("a<b>&c\"d\\e\n\u{1}\u{8}\u{2028}é", &mut out);
        assert_eq!(out, r#""a\u003cb\u003e\u0026c\"d\\e\n\u0001\b\u2028é""#);
    }

    #[test]
    fn quantities_are_canonical() {
        for (input, canonical) in [
            ("0", "0"),
            ("0Mi", "0"),
            ("1", "1"),
            ("1000m", "1"),
            ("1500m", "1500m"),
            ("0.5", "500m"),
            ("100m", "100m"),
            ("2", "2"),
            ("1k", "1k"),
            ("1000", "1k"),
            ("1024", "1024"),
            ("1Gi", "1Gi"),
            ("1024Mi", "1Gi"),
            ("1.5Gi", "1536Mi"),
            ("512Mi", "512Mi"),
            ("100Mi", "100Mi"),
            ("1Ki", "1Ki"),
            ("0.5Ki", "512"),
            ("1e3", "1e3"),
            ("1E6", "1e6"),
            ("12e2", "1200"),
            ("-1", "-1"),
            ("-100m", "-100m"),
            ("1n", "1n"),
            ("0.1n", "1n"),
            ("1.1", "1100m"),
            ("10M", "10M"),
            ("250m", "250m"),
        ] {
            assert_eq!(canonical_quantity(input).as_deref(), Some(canonical), "{input}");
        }
        assert_eq!(canonical_quantity("abc"), None);
        assert_eq!(canonical_quantity("1Qi"), None);
    }

    #[test]
    fn times_are_whole_seconds_in_utc() {
        let condition = json!({"type": "Resizing", "status": "True",
            "lastTransitionTime": "2024-01-02T03:04:05.678+01:00"});
        let bytes = encode("PersistentVolumeClaimCondition", Some(&condition)).expect("known");
        assert_eq!(
            String::from_utf8(bytes).expect("utf-8"),
            r#"{"type":"Resizing","status":"True","lastProbeTime":null,"lastTransitionTime":"2024-01-02T02:04:05Z"}"#
        );
    }

    #[test]
    fn int_or_string_keeps_its_kind_and_maps_are_sorted() {
        let probe = json!({"httpGet": {"port": "http", "path": "/"}, "periodSeconds": 5});
        let bytes = encode("Probe", Some(&probe)).expect("known type");
        assert_eq!(
            String::from_utf8(bytes).expect("utf-8"),
            r#"{"httpGet":{"path":"/","port":"http"},"periodSeconds":5}"#
        );
        let resources = json!({"limits": {"memory": "1024Mi", "cpu": "1000m"}});
        let bytes = encode("ResourceRequirements", Some(&resources)).expect("known type");
        assert_eq!(
            String::from_utf8(bytes).expect("utf-8"),
            r#"{"limits":{"cpu":"1","memory":"1Gi"}}"#
        );
    }

    #[test]
    fn an_unknown_type_is_an_error() {
        assert_eq!(encode("Pod", None), Err(GoJsonError::UnknownType("Pod".into())));
    }
}
