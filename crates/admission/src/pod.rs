//! Kubernetes core `PodTemplateSpec` validation, as `k8s.io/kubernetes/pkg/apis/core/validation`
//! (`ValidatePodTemplateSpec`, Kubernetes 1.35) applies it to the pod templates of SandboxSets
//! and SandboxTemplates in the reference's `v-sbs.kb.io` and `v-sbt.kb.io` webhooks. Every
//! error is a [`FieldError`] with the API server's path and words
//! (`spec.template.spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be
//! between 1 and 65535, inclusive`), in the order the API server finds them, duplicates
//! dropped as its aggregate drops them.
//!
//! # Options
//!
//! The reference passes its own `PodValidationOptions`: an invalid
//! `controller.kubernetes.io/pod-deletion-cost`, hugepage quantities that are not a multiple
//! of the page size and invalid label values in selectors are allowed; everything else is the
//! strict default (environment variable names are C-identifier-like, a lifecycle `sleep` must
//! be positive, the template is not a Pod, so an image volume needs no `reference`).
//!
//! # Defaults
//!
//! On a cluster the reference's mutating webhooks default the template before this runs, so the
//! rules that would say `Required value` for a field defaulting fills (restartPolicy,
//! dnsPolicy, terminationGracePeriodSeconds, imagePullPolicy, terminationMessagePolicy, a
//! port's protocol, a probe's timeouts and thresholds, an HTTP probe's scheme and path, a
//! fieldRef's apiVersion, a hostPath's type) read an absent or empty value as its default
//! here, so the outcome is the reference's with or without defaulting in front.
//!
//! # Types
//!
//! The template is schemaless in the CRDs; a field of the wrong JSON type is left to decoding
//! (the store decodes the object into typed Kubernetes structs after admission, as the
//! reference's webhook decodes it first), and these rules skip it. A quantity that does not
//! parse is the exception: it is reported here, at its field, with the parser's words
//! (`quantities must match the regular expression ...`), where the reference's decoder answers
//! 400 with the same words.
//!
//! # Not covered
//!
//! Rules users rarely meet are not checked: affinity, topology spread constraints, resource
//! claims (`resourceClaims`, `resources.claims`), pod-level `resources`, `overhead`, sysctls,
//! SELinux/AppArmor/Windows options and their annotations, seccomp annotations, the
//! `scheduler.alpha.kubernetes.io/tolerations` annotation, `resizePolicy`, `fsGroupChangePolicy`,
//! a resource field selector's `divisor`, the integer rule of extended resources, the inner
//! fields of generic ephemeral volume claim templates, iSCSI, FC, Flocker, StorageOS and
//! Quobyte volumes and cluster trust bundle projections, the rules whose message prints a
//! whole Go struct (`allowPrivilegeEscalation` false with `privileged`, a seccomp
//! `localhostProfile` without `Localhost`), and `imagePullSecrets` (JSON cannot set anything
//! but their name, the only rule there is).
//!
//! # Privileged containers
//!
//! `securityContext.privileged: true` is refused (`Forbidden: disallowed by cluster policy`):
//! the reference's webhook process never enables privileged containers in Kubernetes' process
//! capabilities, whose default forbids them, so its validation refuses them too.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use crate::metadata::{
    annotations_errors, label_value_errors, labels_errors, qualified_name_errors, subdomain_errors,
};
use crate::{FieldError, FieldErrorKind};

/// The pod validation errors of `template` (a `PodTemplateSpec` at `path`, e.g.
/// `spec.template`), with one `persistentVolumeClaim` volume appended per volume claim
/// template name in `claims`, as the reference appends them before validating.
pub(crate) fn validate_template(
    template: &Value,
    path: &str,
    claims: &[String],
) -> Vec<FieldError> {
    let mut v = Validator::default();
    let meta = template.get("metadata").unwrap_or(&Value::Null);
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        v.errors.extend(labels_errors(labels, &format!("{path}.labels")));
    }
    let annotations = meta.get("annotations").and_then(Value::as_object);
    if let Some(annotations) = annotations {
        v.errors.extend(annotations_errors(annotations, &format!("{path}.annotations")));
    }
    let spec = template.get("spec").unwrap_or(&Value::Null);
    if let Some(mirror) = annotations.and_then(|a| a.get(MIRROR_POD))
        && text(spec, "nodeName").is_empty()
    {
        v.invalid(
            &format!("{path}.annotations[{MIRROR_POD}]"),
            mirror.clone(),
            "must set spec.nodeName if mirror pod annotation is set",
        );
    }
    let mut volumes: Vec<Value> = list(spec, "volumes").to_vec();
    volumes.extend(claims.iter().map(
        |name| serde_json::json!({"name": name, "persistentVolumeClaim": {"claimName": name}}),
    ));
    v.pod_spec(spec, &volumes, &format!("{path}.spec"));
    if !list(spec, "ephemeralContainers").is_empty() {
        v.forbidden(
            &format!("{path}.spec.ephemeralContainers"),
            "ephemeral containers not allowed in pod template",
        );
    }
    // The API server's aggregate drops repeated messages.
    let mut seen = BTreeSet::new();
    v.errors.retain(|e| seen.insert(format!("{}: {}", e.field, e.body())));
    v.errors
}

/// The annotation of a static pod's mirror; a template with it must name its node.
const MIRROR_POD: &str = "kubernetes.io/config.mirror";

/// A pod's grace period when the template sets none (the defaulting webhook's value).
const DEFAULT_GRACE_PERIOD: i64 = 30;

const DNS_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const ENV_VAR_FMT: &str = "[-._a-zA-Z][-._a-zA-Z0-9]*";
const CONFIG_KEY_FMT: &str = "[-._a-zA-Z0-9]+";
const HEADER_FMT: &str = "[-A-Za-z0-9]+";
const QUANTITY_ERROR: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
const FILE_MODE_ERROR: &str = "must be a number between 0 and 0777 (octal), both inclusive";
const NEGATIVE_ERROR: &str = "must be greater than or equal to 0";
const MORE_THAN_ONE_VOLUME: &str = "may not specify more than 1 volume type";
const MORE_THAN_ONE_HANDLER: &str = "may not specify more than 1 handler type";
const INIT_ONLY_WITH_ALWAYS: &str =
    "may not be set for init containers without restartPolicy=Always";
const EPHEMERAL_FORBIDDEN: &str = "cannot be set for an Ephemeral Container";

/// A volume source: its JSON key, the name its "more than 1" error uses (the API server
/// misspells two), and the string fields it requires, with the path they are reported under.
struct VolumeKind {
    key: &'static str,
    forbidden_as: &'static str,
    reported_as: &'static str,
    required: &'static [&'static str],
}

const fn kind(
    key: &'static str,
    forbidden_as: &'static str,
    reported_as: &'static str,
    required: &'static [&'static str],
) -> VolumeKind {
    VolumeKind { key, forbidden_as, reported_as, required }
}

/// Every volume source, in the order the API server checks them (the first one present is the
/// volume's type; each further one is `Forbidden`).
const VOLUME_KINDS: [VolumeKind; 30] = [
    kind("emptyDir", "emptyDir", "emptyDir", &[]),
    kind("hostPath", "hostPath", "hostPath", &[]),
    kind("gitRepo", "gitRepo", "gitRepo", &["repository"]),
    kind("gcePersistentDisk", "gcePersistentDisk", "persistentDisk", &["pdName"]),
    kind("awsElasticBlockStore", "awsElasticBlockStore", "awsElasticBlockStore", &["volumeID"]),
    kind("secret", "secret", "secret", &[]),
    kind("nfs", "nfs", "nfs", &[]),
    kind("iscsi", "iscsi", "iscsi", &[]),
    kind("glusterfs", "glusterfs", "glusterfs", &["endpoints", "path"]),
    kind("flocker", "flocker", "flocker", &[]),
    kind("persistentVolumeClaim", "persistentVolumeClaim", "persistentVolumeClaim", &["claimName"]),
    kind("rbd", "rbd", "rbd", &["monitors", "image"]),
    kind("cinder", "cinder", "cinder", &["volumeID"]),
    kind("cephfs", "cephFS", "cephfs", &["monitors"]),
    kind("quobyte", "quobyte", "quobyte", &[]),
    kind("downwardAPI", "downwarAPI", "downwardAPI", &[]),
    kind("fc", "fc", "fc", &[]),
    kind("flexVolume", "flexVolume", "flexVolume", &["driver"]),
    kind("configMap", "configMap", "configMap", &[]),
    kind("azureFile", "azureFile", "azureFile", &["secretName", "shareName"]),
    kind("vsphereVolume", "vsphereVolume", "vsphereVolume", &["volumePath"]),
    kind("photonPersistentDisk", "photonPersistentDisk", "photonPersistentDisk", &["pdID"]),
    kind("portworxVolume", "portworxVolume", "portworxVolume", &["volumeID"]),
    kind("azureDisk", "azureDisk", "azureDisk", &["diskName", "diskURI"]),
    kind("storageos", "storageos", "storageos", &[]),
    kind("projected", "projected", "projected", &[]),
    kind("scaleIO", "scaleIO", "scaleIO", &["gateway", "system", "volumeName"]),
    kind("csi", "csi", "csi", &[]),
    kind("ephemeral", "ephemeral", "ephemeral", &[]),
    kind("image", "image", "image", &[]),
];

/// The fields a pod's environment may read through `fieldRef`.
const ENV_FIELD_PATHS: [&str; 9] = [
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
];

/// The fields a downward API volume may project.
const VOLUME_FIELD_PATHS: [&str; 5] = [
    "metadata.annotations",
    "metadata.labels",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
];

/// The fields `ConvertDownwardAPIFieldLabel` knows for `v1`.
const KNOWN_FIELD_LABELS: [&str; 15] = [
    "metadata.annotations",
    "metadata.labels",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.serviceAccountName",
    "spec.schedulerName",
    "status.phase",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
    "spec.host",
];

/// The container resources a `resourceFieldRef` may read (plus any hugepages).
const RESOURCE_FIELDS: [&str; 6] = [
    "limits.cpu",
    "limits.ephemeral-storage",
    "limits.memory",
    "requests.cpu",
    "requests.ephemeral-storage",
    "requests.memory",
];

/// Resource names without a domain that quota and containers know.
const STANDARD_RESOURCES: [&str; 21] = [
    "cpu",
    "memory",
    "ephemeral-storage",
    "storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
    "requests.storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "pods",
    "services",
    "replicationcontrollers",
    "resourcequotas",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "services.nodeports",
    "services.loadbalancers",
    "count/pods",
];

/// Collects errors in the API server's order.
#[derive(Default)]
struct Validator {
    errors: Vec<FieldError>,
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// A field that is set (present and not `null`): a Go pointer that is not nil.
fn present<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| !x.is_null())
}

fn int(v: &Value, key: &str) -> Option<i64> {
    v.get(key).and_then(Value::as_i64)
}

fn boolean(v: &Value, key: &str) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// `supported values: "A", "B"`, as `field.NotSupported` lists them.
fn supported(values: &[&str]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    format!("supported values: {}", quoted.join(", "))
}

fn range_error(lo: i64, hi: i64) -> String {
    format!("must be between {lo} and {hi}, inclusive")
}

/// `RegexError`: the message, the examples and the pattern.
fn regex_error(message: &str, pattern: &str, examples: &[&str]) -> String {
    let examples: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    format!("{message} (e.g. {}regex used for validation is '{pattern}')", examples.join(" or "))
}

fn is_dns_label(value: &str) -> bool {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = value.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            ok(first) && ok(last) && bytes.iter().all(|&b| ok(b) || b == b'-')
        }
        _ => false,
    }
}

/// `IsDNS1123Label`.
fn dns_label_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push("must be no more than 63 characters".to_owned());
    }
    if !is_dns_label(value) {
        if value.len() <= 253 && !value.is_empty() && value.split('.').all(is_dns_label) {
            errors.push("must not contain dots".to_owned());
        } else {
            errors.push(regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
                DNS_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errors
}

/// `hasChDirPrefix`.
fn chdir_prefix_errors(value: &str) -> Option<&'static str> {
    match value {
        "." => Some("must not be '.'"),
        ".." => Some("must not be '..'"),
        v if v.starts_with("..") => Some("must not start with '..'"),
        _ => None,
    }
}

/// `IsEnvVarName`: `[-._a-zA-Z][-._a-zA-Z0-9]*`, and not `.`, `..` or `..`-prefixed.
fn env_var_name_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let bytes = value.as_bytes();
    let rest = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_');
    let valid =
        bytes.first().is_some_and(|b| rest(b) && !b.is_ascii_digit()) && bytes.iter().all(rest);
    if !valid {
        errors.push(regex_error(
            "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit",
            ENV_VAR_FMT,
            &["my.env-name", "MY_ENV.NAME", "MyEnvName1"],
        ));
    }
    errors.extend(chdir_prefix_errors(value).map(str::to_owned));
    errors
}

/// `IsConfigMapKey`.
fn config_key_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 253 {
        errors.push("must be no more than 253 characters".to_owned());
    }
    let valid = !value.is_empty()
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if !valid {
        errors.push(regex_error(
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
            CONFIG_KEY_FMT,
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    errors.extend(chdir_prefix_errors(value).map(str::to_owned));
    errors
}

/// `IsValidPortName` (an IANA service name).
fn port_name_errors(name: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if name.len() > 15 {
        errors.push("must be no more than 15 characters".to_owned());
    }
    if name.is_empty()
        || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        errors.push(
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_owned(),
        );
    }
    if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        errors.push("must contain at least one letter (a-z)".to_owned());
    }
    if name.contains("--") {
        errors.push("must not contain consecutive hyphens".to_owned());
    }
    if name.starts_with('-') || name.ends_with('-') {
        errors.push("must not begin or end with a hyphen".to_owned());
    }
    errors
}

/// `NameIsDNSSubdomain` with `prefix`: a trailing `-` is allowed in a name that is a prefix.
fn subdomain_name_errors(name: &str, prefix: bool) -> Vec<String> {
    match name.strip_suffix('-') {
        Some(stem) if prefix && !stem.is_empty() => subdomain_errors(&format!("{stem}a")),
        _ => subdomain_errors(name),
    }
}

/// Whether the `..`-free path rule holds (`validatePathNoBacksteps`).
fn has_backsteps(path: &str) -> bool {
    path.replace('\\', "/").split('/').any(|part| part == "..")
}

impl Validator {
    fn push(&mut self, field: &str, kind: FieldErrorKind, value: Value, detail: impl Into<String>) {
        self.errors.push(FieldError::new(field, kind, value, detail));
    }

    fn required(&mut self, field: &str, detail: &str) {
        self.errors.push(FieldError::required(field, detail));
    }

    fn invalid(&mut self, field: &str, value: Value, detail: impl Into<String>) {
        self.errors.push(FieldError::invalid(field, value, detail));
    }

    fn forbidden(&mut self, field: &str, detail: &str) {
        self.errors.push(FieldError::forbidden(field, detail));
    }

    fn not_supported(&mut self, field: &str, value: &str, values: &[&str]) {
        self.push(field, FieldErrorKind::NotSupported, Value::from(value), supported(values));
    }

    fn duplicate(&mut self, field: &str, value: &str) {
        self.push(field, FieldErrorKind::Duplicate, Value::from(value), "");
    }

    fn not_found(&mut self, field: &str, value: &str) {
        self.push(field, FieldErrorKind::NotFound, Value::from(value), "");
    }

    fn dns_label(&mut self, field: &str, value: &str) {
        for e in dns_label_errors(value) {
            self.invalid(field, Value::from(value), e);
        }
    }

    fn subdomain(&mut self, field: &str, value: &str) {
        for e in subdomain_errors(value) {
            self.invalid(field, Value::from(value), e);
        }
    }

    fn qualified_name(&mut self, field: &str, value: &str) {
        for e in qualified_name_errors(value) {
            self.invalid(field, Value::from(value), e);
        }
    }

    fn nonnegative(&mut self, field: &str, value: Option<i64>) {
        if let Some(n) = value.filter(|n| *n < 0) {
            self.invalid(field, Value::from(n), NEGATIVE_ERROR);
        }
    }

    fn file_mode(&mut self, field: &str, mode: Option<i64>) {
        if let Some(mode) = mode.filter(|m| !(0..=0o777).contains(m)) {
            self.invalid(field, Value::from(mode), FILE_MODE_ERROR);
        }
    }

    /// `validateLocalDescendingPath`: relative, without `..`.
    fn local_descending_path(&mut self, field: &str, path: &str) {
        if path.starts_with('/') {
            self.invalid(field, Value::from(path), "must be a relative path");
        }
        self.no_backsteps(field, path);
    }

    fn no_backsteps(&mut self, field: &str, path: &str) {
        if has_backsteps(path) {
            self.invalid(field, Value::from(path), "must not contain '..'");
        }
    }

    /// `ValidateLocalNonReservedPath`.
    fn local_non_reserved_path(&mut self, field: &str, path: &str) {
        self.local_descending_path(field, path);
        if path.starts_with("..") && !path.starts_with("../") {
            self.invalid(field, Value::from(path), "must not start with '..'");
        }
    }

    /// A quantity that parses, or its error.
    fn quantity(&mut self, field: &str, value: &Value) -> Option<Quantity> {
        match Quantity::parse(value) {
            Some(q) => Some(q),
            None => {
                self.invalid(field, value.clone(), QUANTITY_ERROR);
                None
            }
        }
    }

    /// `ValidatePodSpec`, with the template's volumes (claim volumes appended).
    fn pod_spec(&mut self, spec: &Value, volume_list: &[Value], path: &str) {
        let grace = int(spec, "terminationGracePeriodSeconds").unwrap_or(DEFAULT_GRACE_PERIOD);
        let security = spec.get("securityContext").unwrap_or(&Value::Null);
        let host_users = security.get("hostUsers").and_then(Value::as_bool).unwrap_or(true);
        let volumes = self.volumes(volume_list, &format!("{path}.volumes"));
        self.containers(spec, &volumes, grace, host_users, path);
        if boolean(spec, "hostNetwork") {
            for (i, container) in list(spec, "containers").iter().enumerate() {
                for (j, port) in list(container, "ports").iter().enumerate() {
                    let host = int(port, "hostPort").unwrap_or(0);
                    if host != 0 && host != int(port, "containerPort").unwrap_or(0) {
                        self.invalid(
                            &format!("{path}.containers[{i}].ports[{j}].hostPort"),
                            Value::from(host),
                            "must match `containerPort` when `hostNetwork` is true",
                        );
                    }
                }
            }
        }
        let restart = text(spec, "restartPolicy");
        if !matches!(restart, "" | "Always" | "OnFailure" | "Never") {
            self.not_supported(
                &format!("{path}.restartPolicy"),
                restart,
                &["Always", "OnFailure", "Never"],
            );
        }
        let dns_policy = text(spec, "dnsPolicy");
        if !matches!(
            dns_policy,
            "" | "ClusterFirstWithHostNet" | "ClusterFirst" | "Default" | "None"
        ) {
            self.not_supported(
                &format!("{path}.dnsPolicy"),
                dns_policy,
                &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"],
            );
        }
        if let Some(selector) = spec.get("nodeSelector").and_then(Value::as_object) {
            self.errors.extend(labels_errors(selector, &format!("{path}.nodeSelector")));
        }
        self.pod_security_context(spec, security, &format!("{path}.securityContext"));
        self.dns_config(spec, dns_policy, &format!("{path}.dnsConfig"));
        for (i, gate) in list(spec, "readinessGates").iter().enumerate() {
            let field = format!("{path}.readinessGates[{i}].conditionType");
            self.qualified_name(&field, text(gate, "conditionType"));
        }
        let mut gates = BTreeSet::new();
        for (i, gate) in list(spec, "schedulingGates").iter().enumerate() {
            let field = format!("{path}.schedulingGates[{i}]");
            let name = text(gate, "name");
            self.qualified_name(&field, name);
            if !gates.insert(name) {
                self.duplicate(&field, name);
            }
        }
        for (key, field) in [("serviceAccountName", "serviceAccountName"), ("nodeName", "nodeName")]
        {
            let name = text(spec, key);
            if !name.is_empty() {
                self.subdomain(&format!("{path}.{field}"), name);
            }
        }
        if let Some(deadline) = int(spec, "activeDeadlineSeconds")
            && !(1..=i64::from(i32::MAX)).contains(&deadline)
        {
            self.invalid(
                &format!("{path}.activeDeadlineSeconds"),
                Value::from(deadline),
                range_error(1, i64::from(i32::MAX)),
            );
        }
        for key in ["hostname", "subdomain"] {
            let name = text(spec, key);
            if !name.is_empty() {
                self.dns_label(&format!("{path}.{key}"), name);
            }
        }
        self.tolerations(list(spec, "tolerations"), &format!("{path}.tolerations"));
        for (i, alias) in list(spec, "hostAliases").iter().enumerate() {
            self.ip(&format!("{path}.hostAliases[{i}].ip"), text(alias, "ip"));
            for (j, host) in list(alias, "hostnames").iter().enumerate() {
                let host = host.as_str().unwrap_or_default();
                self.subdomain(&format!("{path}.hostAliases[{i}].hostnames[{j}]"), host);
            }
        }
        let priority_class = text(spec, "priorityClassName");
        if !priority_class.is_empty() {
            self.subdomain(&format!("{path}.priorityClassName"), priority_class);
        }
        if let Some(runtime_class) = present(spec, "runtimeClassName").and_then(Value::as_str) {
            self.subdomain(&format!("{path}.runtimeClassName"), runtime_class);
        }
        if let Some(preemption) = present(spec, "preemptionPolicy").and_then(Value::as_str) {
            let field = format!("{path}.preemptionPolicy");
            match preemption {
                "PreemptLowerPriority" | "Never" => {}
                "" => self.required(&field, ""),
                other => self.not_supported(&field, other, &["PreemptLowerPriority", "Never"]),
            }
        }
        if let Some(os) = present(spec, "os") {
            let field = format!("{path}.os.name");
            match text(os, "name") {
                "linux" | "windows" => {}
                "" => self.required(&field, ""),
                other => self.not_supported(&field, other, &["linux", "windows"]),
            }
        }
    }

    /// `ValidateVolumes`: the volumes that passed, by name, with their source's key.
    fn volumes(&mut self, volumes: &[Value], path: &str) -> BTreeMap<String, &'static str> {
        let mut valid = BTreeMap::new();
        let mut names = BTreeSet::new();
        for (i, volume) in volumes.iter().enumerate() {
            let at = format!("{path}[{i}]");
            let before = self.errors.len();
            let name = text(volume, "name");
            let source = self.volume_source(volume, &at);
            if name.is_empty() {
                self.required(&format!("{at}.name"), "");
            } else {
                self.dns_label(&format!("{at}.name"), name);
            }
            if names.contains(name) {
                self.duplicate(&format!("{at}.name"), name);
            }
            if self.errors.len() == before {
                names.insert(name.to_owned());
                valid.insert(name.to_owned(), source.unwrap_or(""));
            }
        }
        valid
    }

    /// `validateVolumeSource`: the key of the volume's source, when it has one.
    fn volume_source(&mut self, volume: &Value, at: &str) -> Option<&'static str> {
        let mut found: Option<&'static str> = None;
        for kind in &VOLUME_KINDS {
            let Some(source) = present(volume, kind.key) else { continue };
            if found.is_some() {
                self.forbidden(&format!("{at}.{}", kind.forbidden_as), MORE_THAN_ONE_VOLUME);
                continue;
            }
            found = Some(kind.key);
            let inner = format!("{at}.{}", kind.reported_as);
            for field in kind.required {
                let empty = match source.get(*field) {
                    Some(Value::String(s)) => s.is_empty(),
                    Some(Value::Array(a)) => a.is_empty(),
                    Some(Value::Null) | None => true,
                    Some(_) => false,
                };
                if empty {
                    self.required(&format!("{inner}.{field}"), "");
                }
            }
            self.volume_source_rules(kind.key, source, &inner);
        }
        if found.is_none() {
            self.required(at, "must specify a volume type");
        }
        found
    }

    fn volume_source_rules(&mut self, key: &str, source: &Value, at: &str) {
        match key {
            "emptyDir" => {
                if let Some(limit) = present(source, "sizeLimit") {
                    let field = format!("{at}.sizeLimit");
                    if self.quantity(&field, limit).is_some_and(|q| q.nanos < 0) {
                        self.forbidden(&field, "SizeLimit field must be a valid resource quantity");
                    }
                }
            }
            "hostPath" => {
                let path = text(source, "path");
                if path.is_empty() {
                    self.required(&format!("{at}.path"), "");
                    return;
                }
                self.no_backsteps(&format!("{at}.path"), path);
                let kind = text(source, "type");
                let kinds = [
                    "",
                    "BlockDevice",
                    "CharDevice",
                    "Directory",
                    "DirectoryOrCreate",
                    "File",
                    "FileOrCreate",
                    "Socket",
                ];
                if !kinds.contains(&kind) {
                    self.not_supported(&format!("{at}.type"), kind, &kinds);
                }
            }
            "gitRepo" => {
                self.local_descending_path(&format!("{at}.directory"), text(source, "directory"));
            }
            "secret" | "configMap" => {
                let name = if key == "secret" { "secretName" } else { "name" };
                if text(source, name).is_empty() {
                    self.required(&format!("{at}.{name}"), "");
                }
                self.file_mode(&format!("{at}.defaultMode"), int(source, "defaultMode"));
                for (i, item) in list(source, "items").iter().enumerate() {
                    self.key_to_path(item, &format!("{at}.items[{i}]"));
                }
            }
            "nfs" => {
                let path = text(source, "path");
                if text(source, "server").is_empty() {
                    self.required(&format!("{at}.server"), "");
                }
                if path.is_empty() {
                    self.required(&format!("{at}.path"), "");
                }
                if !path.starts_with('/') {
                    self.invalid(
                        &format!("{at}.path"),
                        Value::from(path),
                        "must be an absolute path",
                    );
                }
            }
            "downwardAPI" => {
                self.file_mode(&format!("{at}.defaultMode"), int(source, "defaultMode"));
                for item in list(source, "items") {
                    self.downward_api_file(item, at);
                }
            }
            "projected" => self.projected(source, at),
            "csi" => self.csi_driver(text(source, "driver"), &format!("{at}.driver")),
            "ephemeral" if present(source, "volumeClaimTemplate").is_none() => {
                self.required(&format!("{at}.volumeClaimTemplate"), "");
            }
            "image" => {
                let policy = text(source, "pullPolicy");
                if !policy.is_empty() {
                    self.pull_policy(&format!("{at}.pullPolicy"), policy);
                }
            }
            _ => {}
        }
    }

    /// `validateKeyToPath`.
    fn key_to_path(&mut self, item: &Value, at: &str) {
        if text(item, "key").is_empty() {
            self.required(&format!("{at}.key"), "");
        }
        let path = text(item, "path");
        if path.is_empty() {
            self.required(&format!("{at}.path"), "");
        }
        self.local_non_reserved_path(&format!("{at}.path"), path);
        self.file_mode(&format!("{at}.mode"), int(item, "mode"));
    }

    /// `validateDownwardAPIVolumeFile`, reported under the volume's path as the API server
    /// reports it.
    fn downward_api_file(&mut self, file: &Value, at: &str) {
        let path = text(file, "path");
        if path.is_empty() {
            self.required(&format!("{at}.path"), "");
        }
        self.local_non_reserved_path(&format!("{at}.path"), path);
        if let Some(field_ref) = present(file, "fieldRef") {
            self.field_selector(field_ref, &VOLUME_FIELD_PATHS, &format!("{at}.fieldRef"));
            if present(file, "resourceFieldRef").is_some() {
                self.invalid(
                    at,
                    Value::from("resource"),
                    "fieldRef and resourceFieldRef can not be specified simultaneously",
                );
            }
        } else if let Some(resource_ref) = present(file, "resourceFieldRef") {
            self.resource_field_selector(resource_ref, &format!("{at}.resourceFieldRef"), true);
        } else {
            self.required(at, "one of fieldRef and resourceFieldRef is required");
        }
        self.file_mode(&format!("{at}.mode"), int(file, "mode"));
    }

    fn projected(&mut self, source: &Value, at: &str) {
        self.file_mode(&format!("{at}.defaultMode"), int(source, "defaultMode"));
        let mut paths = BTreeSet::new();
        for (i, projection) in list(source, "sources").iter().enumerate() {
            let src = format!("{at}.sources[{i}]");
            let mut count = 0;
            for kind in ["secret", "configMap"] {
                let Some(inner) = present(projection, kind) else { continue };
                count += 1;
                let name = text(inner, "name");
                if name.is_empty() {
                    self.required(&format!("{src}.{kind}.name"), "");
                }
                for (j, item) in list(inner, "items").iter().enumerate() {
                    self.key_to_path(item, &format!("{src}.{kind}.items[{j}]"));
                    let path = text(item, "path");
                    if !path.is_empty() && !paths.insert(path.to_owned()) {
                        self.invalid(at, Value::from(name), "conflicting duplicate paths");
                    }
                }
            }
            if let Some(inner) = present(projection, "downwardAPI") {
                count += 1;
                for item in list(inner, "items") {
                    self.downward_api_file(item, &format!("{src}.downwardAPI"));
                    let path = text(item, "path");
                    if !path.is_empty() && !paths.insert(path.to_owned()) {
                        self.invalid(at, Value::from(path), "conflicting duplicate paths");
                    }
                }
            }
            if let Some(token) = present(projection, "serviceAccountToken") {
                count += 1;
                let field = format!("{src}.serviceAccountToken.expirationSeconds");
                let expiry = int(token, "expirationSeconds").filter(|s| *s != 0).unwrap_or(3600);
                if expiry < 600 {
                    self.invalid(
                        &field,
                        Value::from(expiry),
                        "may not specify a duration less than 10 minutes",
                    );
                }
                if expiry > 1 << 32 {
                    self.invalid(
                        &field,
                        Value::from(expiry),
                        "may not specify a duration larger than 2^32 seconds",
                    );
                }
                let path = text(token, "path");
                if path.is_empty() {
                    self.required(&format!("{at}.path"), "");
                } else {
                    self.local_non_reserved_path(&format!("{at}.path"), path);
                }
            }
            if present(projection, "clusterTrustBundle").is_some() {
                count += 1;
            }
            if count > 1 {
                self.forbidden(&src, "may not specify more than 1 volume type per source");
            }
        }
    }

    /// `ValidateCSIDriverName`.
    fn csi_driver(&mut self, driver: &str, field: &str) {
        if driver.is_empty() {
            self.required(field, "");
        }
        if driver.len() > 63 {
            self.push(field, FieldErrorKind::TooLong, Value::Null, "may not be more than 63 bytes");
        }
        for e in subdomain_errors(&driver.to_lowercase()) {
            self.invalid(field, Value::from(driver), e);
        }
    }

    /// The regular, init and ephemeral containers, in the API server's order.
    fn containers(
        &mut self,
        spec: &Value,
        volumes: &BTreeMap<String, &'static str>,
        grace: i64,
        host_users: bool,
        path: &str,
    ) {
        let regular = list(spec, "containers");
        let at = format!("{path}.containers");
        if regular.is_empty() {
            self.required(&at, "");
        }
        let mut names = BTreeSet::new();
        let mut host_ports = BTreeSet::new();
        for (i, c) in regular.iter().enumerate() {
            let ca = format!("{at}[{i}]");
            self.container_common(c, volumes, host_users, &ca);
            let name = text(c, "name");
            if !names.insert(name) {
                self.duplicate(&format!("{ca}.name"), name);
            }
            self.probes_and_lifecycle(c, grace, &ca);
            if present(c, "restartPolicy").is_some() {
                self.forbidden(
                    &format!("{ca}.restartPolicy"),
                    "may not be set for non-init containers",
                );
            }
        }
        for (i, c) in regular.iter().enumerate() {
            self.host_port_conflicts(c, &format!("{at}[{i}]"), &mut host_ports);
        }
        let at = format!("{path}.initContainers");
        let mut all: BTreeSet<&str> = regular.iter().map(|c| text(c, "name")).collect();
        for (i, c) in list(spec, "initContainers").iter().enumerate() {
            let ca = format!("{at}[{i}]");
            self.container_common(c, volumes, host_users, &ca);
            let restart = present(c, "restartPolicy").map(|p| p.as_str().unwrap_or_default());
            if let Some(policy) = restart.filter(|p| *p != "Always") {
                self.not_supported(&format!("{ca}.restartPolicy"), policy, &["Always"]);
            }
            let name = text(c, "name");
            if all.contains(name) {
                self.duplicate(&format!("{ca}.name"), name);
            } else if !name.is_empty() {
                all.insert(name);
            }
            self.host_port_conflicts(c, &ca, &mut BTreeSet::new());
            if restart == Some("Always") {
                self.probes_and_lifecycle(c, grace, &ca);
            } else {
                for key in ["lifecycle", "livenessProbe", "readinessProbe", "startupProbe"] {
                    if present(c, key).is_some() {
                        self.forbidden(&format!("{ca}.{key}"), INIT_ONLY_WITH_ALWAYS);
                    }
                }
            }
        }
        let ephemeral = list(spec, "ephemeralContainers");
        if ephemeral.is_empty() {
            return;
        }
        let at = format!("{path}.ephemeralContainers");
        let others: BTreeSet<&str> =
            regular.iter().chain(list(spec, "initContainers")).map(|c| text(c, "name")).collect();
        let mut all = others.clone();
        for (i, c) in ephemeral.iter().enumerate() {
            let ca = format!("{at}[{i}]");
            self.container_common(c, volumes, host_users, &ca);
            let image = text(c, "image");
            if image.len() != image.trim().len() {
                self.invalid(
                    &format!("{ca}.image"),
                    Value::from(image),
                    "must not have leading or trailing whitespace",
                );
            }
            let name = text(c, "name");
            if !all.insert(name) {
                self.duplicate(&format!("{ca}.name"), name);
            }
            let target = text(c, "targetContainerName");
            if !target.is_empty() && !others.contains(target) {
                self.not_found(&format!("{ca}.targetContainerName"), target);
            }
            // The fields an ephemeral container may not set, in the struct's order.
            for key in [
                "ports",
                "resources",
                "resizePolicy",
                "restartPolicy",
                "livenessProbe",
                "readinessProbe",
                "startupProbe",
                "lifecycle",
            ] {
                let set = match c.get(key) {
                    None | Some(Value::Null) => false,
                    Some(Value::Array(a)) => !a.is_empty(),
                    Some(Value::Object(o)) => !o.values().all(Value::is_null),
                    Some(_) => true,
                };
                if set {
                    self.forbidden(&format!("{ca}.{key}"), EPHEMERAL_FORBIDDEN);
                }
            }
            for (j, mount) in list(c, "volumeMounts").iter().enumerate() {
                for key in ["subPath", "subPathExpr"] {
                    if !text(mount, key).is_empty() {
                        self.forbidden(
                            &format!("{ca}.volumeMounts[{j}].{key}"),
                            EPHEMERAL_FORBIDDEN,
                        );
                    }
                }
            }
        }
    }

    /// `AccumulateUniqueHostPorts` for one container.
    fn host_port_conflicts(&mut self, c: &Value, at: &str, seen: &mut BTreeSet<String>) {
        for (j, port) in list(c, "ports").iter().enumerate() {
            let host = int(port, "hostPort").unwrap_or(0);
            if host == 0 {
                continue;
            }
            let protocol = match text(port, "protocol") {
                "" => "TCP",
                p => p,
            };
            let key = format!("{protocol}/{}/{host}", text(port, "hostIP"));
            if !seen.insert(key.clone()) {
                self.duplicate(&format!("{at}.ports[{j}].hostPort"), &key);
            }
        }
    }

    /// `validateContainerCommon`.
    fn container_common(
        &mut self,
        c: &Value,
        volumes: &BTreeMap<String, &'static str>,
        host_users: bool,
        at: &str,
    ) {
        let name = text(c, "name");
        if name.is_empty() {
            self.required(&format!("{at}.name"), "");
        } else {
            self.dns_label(&format!("{at}.name"), name);
        }
        if text(c, "image").is_empty() {
            self.required(&format!("{at}.image"), "");
        }
        let policy = text(c, "terminationMessagePolicy");
        if !matches!(policy, "" | "File" | "FallbackToLogsOnError") {
            self.not_supported(
                &format!("{at}.terminationMessagePolicy"),
                policy,
                &["File", "FallbackToLogsOnError"],
            );
        }
        self.ports(list(c, "ports"), &format!("{at}.ports"));
        self.env(list(c, "env"), &format!("{at}.env"));
        self.env_from(list(c, "envFrom"), &format!("{at}.envFrom"));
        let devices: BTreeMap<&str, &str> = list(c, "volumeDevices")
            .iter()
            .map(|d| (text(d, "name"), text(d, "devicePath")))
            .collect();
        let mounts: BTreeMap<&str, &str> = list(c, "volumeMounts")
            .iter()
            .map(|m| (text(m, "name"), text(m, "mountPath")))
            .collect();
        self.volume_mounts(c, &devices, volumes, &format!("{at}.volumeMounts"));
        self.volume_devices(
            list(c, "volumeDevices"),
            &mounts,
            volumes,
            &format!("{at}.volumeDevices"),
        );
        let pull = text(c, "imagePullPolicy");
        if !pull.is_empty() {
            self.pull_policy(&format!("{at}.imagePullPolicy"), pull);
        }
        if let Some(resources) = present(c, "resources") {
            self.resources(resources, &format!("{at}.resources"));
        }
        if let Some(security) = present(c, "securityContext") {
            self.container_security_context(security, host_users, &format!("{at}.securityContext"));
        }
    }

    fn pull_policy(&mut self, field: &str, policy: &str) {
        if !matches!(policy, "Always" | "IfNotPresent" | "Never") {
            self.not_supported(field, policy, &["Always", "IfNotPresent", "Never"]);
        }
    }

    /// `validateContainerPorts`.
    fn ports(&mut self, ports: &[Value], at: &str) {
        let mut names = BTreeSet::new();
        for (i, port) in ports.iter().enumerate() {
            let pa = format!("{at}[{i}]");
            let name = text(port, "name");
            if !name.is_empty() {
                let errors = port_name_errors(name);
                if !errors.is_empty() {
                    for e in errors {
                        self.invalid(&format!("{pa}.name"), Value::from(name), e);
                    }
                } else if !names.insert(name) {
                    self.duplicate(&format!("{pa}.name"), name);
                }
            }
            match int(port, "containerPort").unwrap_or(0) {
                0 => self.required(&format!("{pa}.containerPort"), ""),
                n if !(1..=65535).contains(&n) => {
                    self.invalid(
                        &format!("{pa}.containerPort"),
                        Value::from(n),
                        range_error(1, 65535),
                    );
                }
                _ => {}
            }
            let host = int(port, "hostPort").unwrap_or(0);
            if host != 0 && !(1..=65535).contains(&host) {
                self.invalid(&format!("{pa}.hostPort"), Value::from(host), range_error(1, 65535));
            }
            let protocol = text(port, "protocol");
            if !matches!(protocol, "" | "TCP" | "UDP" | "SCTP") {
                self.not_supported(&format!("{pa}.protocol"), protocol, &["SCTP", "TCP", "UDP"]);
            }
        }
    }

    /// `ValidateEnv`.
    fn env(&mut self, vars: &[Value], at: &str) {
        for (i, var) in vars.iter().enumerate() {
            let va = format!("{at}[{i}]");
            let name = text(var, "name");
            if name.is_empty() {
                self.required(&format!("{va}.name"), "");
            } else {
                for e in env_var_name_errors(name) {
                    self.invalid(&format!("{va}.name"), Value::from(name), e);
                }
            }
            let Some(from) = present(var, "valueFrom") else { continue };
            let field = format!("{va}.valueFrom");
            let mut sources = 0;
            if let Some(field_ref) = present(from, "fieldRef") {
                sources += 1;
                self.field_selector(field_ref, &ENV_FIELD_PATHS, &format!("{field}.fieldRef"));
            }
            if let Some(resource_ref) = present(from, "resourceFieldRef") {
                sources += 1;
                self.resource_field_selector(
                    resource_ref,
                    &format!("{field}.resourceFieldRef"),
                    false,
                );
            }
            for key in ["configMapKeyRef", "secretKeyRef"] {
                if let Some(selector) = present(from, key) {
                    sources += 1;
                    self.key_selector(selector, &format!("{field}.{key}"));
                }
            }
            if sources == 0 {
                self.invalid(
                    &field,
                    Value::from(""),
                    "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
                );
            } else if !text(var, "value").is_empty() {
                self.invalid(
                    &field,
                    Value::from(""),
                    "may not be specified when `value` is not empty",
                );
            } else if sources > 1 {
                self.invalid(
                    &field,
                    Value::from(""),
                    "may not have more than one field specified at a time",
                );
            }
        }
    }

    /// `validateObjectFieldSelector`.
    fn field_selector(&mut self, selector: &Value, allowed: &[&str], at: &str) {
        let version = match text(selector, "apiVersion") {
            "" => "v1",
            v => v,
        };
        let path = text(selector, "fieldPath");
        if path.is_empty() {
            self.required(&format!("{at}.fieldPath"), "");
            return;
        }
        let subscripted = split_subscript(path);
        let conversion = if version != "v1" {
            Err(format!("unsupported pod version: {version}"))
        } else if let Some((base, _)) = subscripted {
            if matches!(base, "metadata.annotations" | "metadata.labels") {
                Ok(())
            } else {
                Err(format!("field label does not support subscript: {path}"))
            }
        } else if KNOWN_FIELD_LABELS.contains(&path) {
            Ok(())
        } else {
            Err(format!("field label not supported: {path}"))
        };
        if let Err(e) = conversion {
            self.invalid(
                &format!("{at}.fieldPath"),
                Value::from(path),
                format!("error converting fieldPath: {e}"),
            );
            return;
        }
        let path = if path == "spec.host" { "spec.nodeName" } else { path };
        match subscripted {
            Some(("metadata.annotations", key)) => self.qualified_name(at, &key.to_lowercase()),
            Some((_, key)) => self.qualified_name(at, key),
            None if !allowed.contains(&path) => {
                let mut sorted = allowed.to_vec();
                sorted.sort_unstable();
                self.not_supported(&format!("{at}.fieldPath"), path, &sorted);
            }
            None => {}
        }
    }

    /// `validateContainerResourceFieldSelector`, without the divisor.
    fn resource_field_selector(&mut self, selector: &Value, at: &str, volume: bool) {
        let resource = text(selector, "resource");
        if volume && text(selector, "containerName").is_empty() {
            self.required(&format!("{at}.containerName"), "");
        } else if resource.is_empty() {
            self.required(&format!("{at}.resource"), "");
        } else if !RESOURCE_FIELDS.contains(&resource)
            && !resource.starts_with("requests.hugepages-")
            && !resource.starts_with("limits.hugepages-")
        {
            self.not_supported(&format!("{at}.resource"), resource, &RESOURCE_FIELDS);
        }
    }

    /// `validateConfigMapKeySelector` and `validateSecretKeySelector`.
    fn key_selector(&mut self, selector: &Value, at: &str) {
        let name = text(selector, "name");
        for e in subdomain_errors(name) {
            self.invalid(&format!("{at}.name"), Value::from(name), e);
        }
        let key = text(selector, "key");
        if key.is_empty() {
            self.required(&format!("{at}.key"), "");
        } else {
            for e in config_key_errors(key) {
                self.invalid(&format!("{at}.key"), Value::from(key), e);
            }
        }
    }

    /// `ValidateEnvFrom`; its "one source" errors are reported at the list, as the API server
    /// reports them.
    fn env_from(&mut self, sources: &[Value], at: &str) {
        for (i, source) in sources.iter().enumerate() {
            let sa = format!("{at}[{i}]");
            let prefix = text(source, "prefix");
            if !prefix.is_empty() {
                for e in env_var_name_errors(prefix) {
                    self.invalid(&format!("{sa}.prefix"), Value::from(prefix), e);
                }
            }
            let mut count = 0;
            for key in ["configMapRef", "secretRef"] {
                let Some(reference) = present(source, key) else { continue };
                count += 1;
                let name = text(reference, "name");
                let field = format!("{sa}.{key}.name");
                if name.is_empty() {
                    self.required(&field, "");
                } else {
                    for e in subdomain_name_errors(name, true) {
                        self.invalid(&field, Value::from(name), e);
                    }
                }
            }
            if count == 0 {
                self.invalid(
                    at,
                    Value::from(""),
                    "must specify one of: `configMapRef` or `secretRef`",
                );
            } else if count > 1 {
                self.invalid(
                    at,
                    Value::from(""),
                    "may not have more than one field specified at a time",
                );
            }
        }
    }

    /// `ValidateVolumeMounts`. Some paths are the list's, not the mount's, as the API server
    /// builds them.
    fn volume_mounts(
        &mut self,
        c: &Value,
        devices: &BTreeMap<&str, &str>,
        volumes: &BTreeMap<String, &'static str>,
        at: &str,
    ) {
        let privileged =
            c.pointer("/securityContext/privileged").and_then(Value::as_bool) == Some(true);
        let mut mount_points = BTreeSet::new();
        for (i, mount) in list(c, "volumeMounts").iter().enumerate() {
            let ma = format!("{at}[{i}]");
            let name = text(mount, "name");
            let path = text(mount, "mountPath");
            if name.is_empty() {
                self.required(&format!("{ma}.name"), "");
            }
            if !volumes.contains_key(name) {
                self.not_found(&format!("{ma}.name"), name);
            }
            if path.is_empty() {
                self.required(&format!("{ma}.mountPath"), "");
            }
            if !mount_points.insert(path) {
                self.invalid(&format!("{ma}.mountPath"), Value::from(path), "must be unique");
            }
            if devices.contains_key(name) {
                self.invalid(
                    &format!("{ma}.name"),
                    Value::from(name),
                    "must not already exist in volumeDevices",
                );
            }
            if devices.values().any(|p| *p == path) {
                self.invalid(
                    &format!("{ma}.mountPath"),
                    Value::from(path),
                    "must not already exist as a path in volumeDevices",
                );
            }
            let sub_path = text(mount, "subPath");
            let sub_path_expr = text(mount, "subPathExpr");
            if volumes.get(name) == Some(&"image") {
                for (key, value) in [("subPath", sub_path), ("subPathExpr", sub_path_expr)] {
                    if !value.is_empty() {
                        self.invalid(
                            &format!("{ma}.{key}"),
                            Value::from(value),
                            "not allowed in image volume sources",
                        );
                    }
                }
            }
            if !sub_path.is_empty() {
                self.local_descending_path(&format!("{at}.subPath"), sub_path);
            }
            if !sub_path_expr.is_empty() {
                if !sub_path.is_empty() {
                    self.invalid(
                        &format!("{ma}.subPathExpr"),
                        Value::from(sub_path_expr),
                        "subPathExpr and subPath are mutually exclusive",
                    );
                }
                self.local_descending_path(&format!("{at}.subPathExpr"), sub_path_expr);
            }
            if let Some(propagation) = present(mount, "mountPropagation").and_then(Value::as_str) {
                let field = format!("{at}.mountPropagation");
                let modes = ["Bidirectional", "HostToContainer", "None"];
                if !modes.contains(&propagation) {
                    self.not_supported(&field, propagation, &modes);
                }
                if propagation == "Bidirectional" && !privileged {
                    self.forbidden(
                        &field,
                        "Bidirectional mount propagation is available only to privileged containers",
                    );
                }
            }
            if let Some(rro) = present(mount, "recursiveReadOnly").and_then(Value::as_str) {
                let field = format!("{at}.recursiveReadOnly");
                match rro {
                    "Disabled" => {}
                    "Enabled" | "IfPossible" => {
                        if !boolean(mount, "readOnly") {
                            self.forbidden(&field, "may only be specified when readOnly is true");
                        }
                        let propagation = text(mount, "mountPropagation");
                        if !propagation.is_empty() && propagation != "None" {
                            self.forbidden(
                                &field,
                                "may only be specified when mountPropagation is None or not specified",
                            );
                        }
                    }
                    other => {
                        self.not_supported(&field, other, &["Disabled", "Enabled", "IfPossible"])
                    }
                }
            }
        }
    }

    /// `ValidateVolumeDevices`.
    fn volume_devices(
        &mut self,
        devices: &[Value],
        mounts: &BTreeMap<&str, &str>,
        volumes: &BTreeMap<String, &'static str>,
        at: &str,
    ) {
        let mut paths = BTreeSet::new();
        let mut names = BTreeSet::new();
        for (i, device) in devices.iter().enumerate() {
            let da = format!("{at}[{i}]");
            let name = text(device, "name");
            let path = text(device, "devicePath");
            let source = volumes.get(name);
            if name.is_empty() {
                self.required(&format!("{da}.name"), "");
            }
            if names.contains(name) {
                self.invalid(&format!("{da}.name"), Value::from(name), "must be unique");
            }
            match source {
                Some(&"persistentVolumeClaim" | &"ephemeral") => {}
                Some(_) => self.invalid(
                    &format!("{da}.name"),
                    Value::from(name),
                    "can only use volume source type of PersistentVolumeClaim or Ephemeral for block mode",
                ),
                None => self.not_found(&format!("{da}.name"), name),
            }
            if path.is_empty() {
                self.required(&format!("{da}.devicePath"), "");
            }
            if paths.contains(path) {
                self.invalid(&format!("{da}.devicePath"), Value::from(path), "must be unique");
            }
            if !path.is_empty() && has_backsteps(path) {
                self.invalid(
                    &format!("{da}.devicePath"),
                    Value::from(path),
                    "can not contain backsteps ('..')",
                );
            } else {
                paths.insert(path);
            }
            if mounts.contains_key(name) {
                self.invalid(
                    &format!("{da}.name"),
                    Value::from(name),
                    "must not already exist in volumeMounts",
                );
            }
            if mounts.values().any(|p| *p == path) {
                self.invalid(
                    &format!("{da}.devicePath"),
                    Value::from(path),
                    "must not already exist as a path in volumeMounts",
                );
            }
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }

    /// `ValidateContainerResourceRequirements`: names, quantities, requests within limits.
    fn resources(&mut self, resources: &Value, at: &str) {
        let empty = Map::new();
        let limits = resources.get("limits").and_then(Value::as_object).unwrap_or(&empty);
        let requests = resources.get("requests").and_then(Value::as_object).unwrap_or(&empty);
        let lim_path = format!("{at}.limits");
        let req_path = format!("{at}.requests");
        let mut cpu_or_memory = false;
        let mut hugepages = false;
        let mut parsed_limits = BTreeMap::new();
        for (name, value) in limits {
            let field = format!("{lim_path}[{name}]");
            self.resource_name(name, &field);
            if let Some(q) = self.quantity(&field, value) {
                self.nonnegative_quantity(&field, &q);
                parsed_limits.insert(name.as_str(), q);
            }
            hugepages |= name.starts_with("hugepages-");
            cpu_or_memory |= matches!(name.as_str(), "cpu" | "memory");
        }
        for (name, value) in requests {
            let field = format!("{req_path}[{name}]");
            self.resource_name(name, &field);
            let Some(q) = self.quantity(&field, value) else { continue };
            self.nonnegative_quantity(&field, &q);
            let overcommit = is_native_resource(name) && !name.starts_with("hugepages-");
            match parsed_limits.get(name.as_str()) {
                Some(limit) if q.nanos != limit.nanos && !overcommit => self.invalid(
                    &req_path,
                    Value::from(q.canonical()),
                    format!("must be equal to {name} limit of {}", limit.canonical()),
                ),
                Some(limit) if q.nanos > limit.nanos => self.invalid(
                    &req_path,
                    Value::from(q.canonical()),
                    format!("must be less than or equal to {name} limit of {}", limit.canonical()),
                ),
                Some(_) => {}
                None if !overcommit && !limits.contains_key(name) => {
                    self.required(&lim_path, "Limit must be set for non overcommitable resources");
                }
                None => {}
            }
            hugepages |= name.starts_with("hugepages-");
            cpu_or_memory |= matches!(name.as_str(), "cpu" | "memory");
        }
        if hugepages && !cpu_or_memory {
            self.forbidden(at, "HugePages require cpu or memory");
        }
    }

    fn nonnegative_quantity(&mut self, field: &str, q: &Quantity) {
        if q.nanos < 0 {
            self.invalid(field, Value::from(q.canonical()), NEGATIVE_ERROR);
        }
    }

    /// `validateContainerResourceName`.
    fn resource_name(&mut self, name: &str, field: &str) {
        let before = self.errors.len();
        self.qualified_name(field, name);
        let qualified = self.errors.len() == before;
        if !name.contains('/') {
            if qualified && !is_standard_resource(name) {
                self.invalid(
                    field,
                    Value::from(name),
                    "must be a standard resource type or fully qualified",
                );
            }
            if !matches!(name, "cpu" | "memory" | "ephemeral-storage")
                && !name.starts_with("hugepages-")
            {
                self.invalid(
                    field,
                    Value::from(name),
                    "must be a standard resource for containers",
                );
            }
        } else if !is_native_resource(name) && !is_extended_resource(name) {
            self.invalid(
                field,
                Value::from(name),
                "doesn't follow extended resource name standard",
            );
        }
    }

    /// Probes and lifecycle hooks of a container that may have them.
    fn probes_and_lifecycle(&mut self, c: &Value, grace: i64, at: &str) {
        if let Some(lifecycle) = present(c, "lifecycle") {
            for hook in ["postStart", "preStop"] {
                if let Some(handler) = present(lifecycle, hook) {
                    self.handler(handler, true, grace, &format!("{at}.lifecycle.{hook}"));
                }
            }
        }
        for key in ["livenessProbe", "readinessProbe", "startupProbe"] {
            let Some(probe) = present(c, key) else { continue };
            let pa = format!("{at}.{key}");
            self.handler(probe, false, grace, &pa);
            for field in [
                "initialDelaySeconds",
                "timeoutSeconds",
                "periodSeconds",
                "successThreshold",
                "failureThreshold",
            ] {
                self.nonnegative(&format!("{pa}.{field}"), int(probe, field));
            }
            let probe_grace = int(probe, "terminationGracePeriodSeconds");
            if let Some(g) = probe_grace.filter(|g| *g <= 0) {
                self.invalid(
                    &format!("{pa}.terminationGracePeriodSeconds"),
                    Value::from(g),
                    "must be greater than 0",
                );
            }
            match key {
                "readinessProbe" => {
                    if let Some(g) = probe_grace {
                        self.invalid(
                            &format!("{pa}.terminationGracePeriodSeconds"),
                            Value::from(g),
                            "must not be set for readinessProbes",
                        );
                    }
                }
                _ => {
                    // Defaulting turns 0 into 1.
                    let success = int(probe, "successThreshold").filter(|s| *s != 0).unwrap_or(1);
                    if success != 1 {
                        self.invalid(
                            &format!("{pa}.successThreshold"),
                            Value::from(success),
                            "must be 1",
                        );
                    }
                }
            }
        }
    }

    /// `validateHandler`: exactly one action, each action's own rules.
    fn handler(&mut self, handler: &Value, lifecycle: bool, grace: i64, at: &str) {
        let kinds: &[&str] = if lifecycle {
            &["exec", "httpGet", "tcpSocket", "sleep"]
        } else {
            &["exec", "httpGet", "tcpSocket", "grpc"]
        };
        let mut count = 0;
        for kind in kinds {
            let Some(action) = present(handler, kind) else { continue };
            let field = format!("{at}.{kind}");
            if count > 0 {
                self.forbidden(&field, MORE_THAN_ONE_HANDLER);
                continue;
            }
            count += 1;
            match *kind {
                "exec" => {
                    if list(action, "command").is_empty() {
                        self.required(&format!("{field}.command"), "");
                    }
                }
                "httpGet" => {
                    self.port_num_or_name(action.get("port"), &format!("{field}.port"));
                    let scheme = text(action, "scheme");
                    if !matches!(scheme, "" | "HTTP" | "HTTPS") {
                        self.not_supported(&format!("{field}.scheme"), scheme, &["HTTP", "HTTPS"]);
                    }
                    for header in list(action, "httpHeaders") {
                        let name = text(header, "name");
                        let valid = !name.is_empty()
                            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
                        if !valid {
                            self.invalid(
                                &format!("{field}.httpHeaders"),
                                Value::from(name),
                                regex_error(
                                    "a valid HTTP header must consist of alphanumeric characters or '-'",
                                    HEADER_FMT,
                                    &["X-Header-Name"],
                                ),
                            );
                        }
                    }
                }
                "tcpSocket" => self.port_num_or_name(action.get("port"), &format!("{field}.port")),
                "grpc" => {
                    let port = int(action, "port").unwrap_or(0);
                    if !(1..=65535).contains(&port) {
                        self.invalid(
                            &format!("{field}.port"),
                            Value::from(port),
                            range_error(1, 65535),
                        );
                    }
                }
                _ => {
                    let seconds = int(action, "seconds").unwrap_or(0);
                    if seconds <= 0 || seconds > grace {
                        self.invalid(
                            &field,
                            Value::from(seconds),
                            format!(
                                "must be greater than 0 and less than terminationGracePeriodSeconds ({grace}). Enable AllowPodLifecycleSleepActionZeroValue feature gate for zero sleep."
                            ),
                        );
                    }
                }
            }
        }
        if count == 0 {
            self.required(at, "must specify a handler type");
        }
    }

    /// `ValidatePortNumOrName`: a number is a port, a string a port name.
    fn port_num_or_name(&mut self, port: Option<&Value>, field: &str) {
        match port {
            Some(Value::String(name)) => {
                for e in port_name_errors(name) {
                    self.invalid(field, Value::from(name.as_str()), e);
                }
            }
            other => {
                let n = other.and_then(Value::as_i64).unwrap_or(0);
                if !(1..=65535).contains(&n) {
                    self.invalid(field, Value::from(n), range_error(1, 65535));
                }
            }
        }
    }

    /// `ValidateSecurityContext` (a container's).
    fn container_security_context(&mut self, sc: &Value, host_users: bool, at: &str) {
        if boolean(sc, "privileged") {
            self.forbidden(&format!("{at}.privileged"), "disallowed by cluster policy");
        }
        for key in ["runAsUser", "runAsGroup"] {
            self.id_range(&format!("{at}.{key}"), int(sc, key));
        }
        if let Some(proc_mount) = present(sc, "procMount").and_then(Value::as_str) {
            let field = format!("{at}.procMount");
            if !matches!(proc_mount, "Default" | "Unmasked") {
                self.not_supported(&field, proc_mount, &["Default", "Unmasked"]);
            }
            if host_users && proc_mount == "Unmasked" {
                self.invalid(
                    &field,
                    Value::from(proc_mount),
                    "`hostUsers` must be false to use `Unmasked`",
                );
            }
        }
        self.seccomp(sc, &format!("{at}.seccompProfile"));
    }

    /// The type of a seccomp profile, and a Localhost profile's file.
    fn seccomp(&mut self, sc: &Value, at: &str) {
        let Some(profile) = present(sc, "seccompProfile") else { return };
        match text(profile, "type") {
            "Localhost" => match present(profile, "localhostProfile").and_then(Value::as_str) {
                None => self.required(
                    &format!("{at}.localhostProfile"),
                    "must be set when seccomp type is Localhost",
                ),
                Some(file) => self.local_descending_path(&format!("{at}.localhostProfile"), file),
            },
            "RuntimeDefault" | "Unconfined" => {}
            other => self.not_supported(
                &format!("{at}.type"),
                other,
                &["Localhost", "RuntimeDefault", "Unconfined"],
            ),
        }
    }

    /// A user or group id: 0 to 2^32 - 1.
    fn id_range(&mut self, field: &str, id: Option<i64>) {
        if let Some(id) = id.filter(|id| !(0..=0xffff_ffff).contains(id)) {
            self.invalid(field, Value::from(id), range_error(0, 0xffff_ffff));
        }
    }

    /// `validatePodSpecSecurityContext`: ids, and `shareProcessNamespace` with `hostPID`.
    fn pod_security_context(&mut self, spec: &Value, sc: &Value, at: &str) {
        for key in ["fsGroup", "runAsUser", "runAsGroup"] {
            self.id_range(&format!("{at}.{key}"), int(sc, key));
        }
        for (i, group) in list(sc, "supplementalGroups").iter().enumerate() {
            self.id_range(&format!("{at}.supplementalGroups[{i}]"), group.as_i64());
        }
        if boolean(spec, "shareProcessNamespace") && boolean(spec, "hostPID") {
            self.invalid(
                &format!("{at}.shareProcessNamespace"),
                Value::from(true),
                "ShareProcessNamespace and HostPID cannot both be enabled",
            );
        }
        self.seccomp(sc, &format!("{at}.seccompProfile"));
    }

    /// `validatePodDNSConfig`.
    fn dns_config(&mut self, spec: &Value, policy: &str, at: &str) {
        let config = present(spec, "dnsConfig");
        if policy == "None" {
            match config {
                None => {
                    self.required(at, "must provide `dnsConfig` when `dnsPolicy` is None");
                    return;
                }
                Some(c) if list(c, "nameservers").is_empty() => {
                    self.required(
                        &format!("{at}.nameservers"),
                        "must provide at least one DNS nameserver when `dnsPolicy` is None",
                    );
                    return;
                }
                Some(_) => {}
            }
        }
        let Some(config) = config else { return };
        let nameservers = list(config, "nameservers");
        if nameservers.len() > 3 {
            self.invalid(
                &format!("{at}.nameservers"),
                Value::Array(nameservers.to_vec()),
                "must not have more than 3 nameservers",
            );
        }
        for (i, ns) in nameservers.iter().enumerate() {
            self.ip(&format!("{at}.nameservers[{i}]"), ns.as_str().unwrap_or_default());
        }
        let searches = list(config, "searches");
        if searches.len() > 32 {
            self.invalid(
                &format!("{at}.searches"),
                Value::Array(searches.to_vec()),
                "must not have more than 32 search paths",
            );
        }
        for (i, search) in searches.iter().enumerate() {
            let search = search.as_str().unwrap_or_default();
            self.subdomain(
                &format!("{at}.searches[{i}]"),
                search.strip_suffix('.').unwrap_or(search),
            );
        }
        for (i, option) in list(config, "options").iter().enumerate() {
            if text(option, "name").is_empty() {
                self.required(&format!("{at}.options[{i}]"), "must not be empty");
            }
        }
    }

    fn ip(&mut self, field: &str, ip: &str) {
        if ip.parse::<std::net::IpAddr>().is_err() {
            self.invalid(
                field,
                Value::from(ip),
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            );
        }
    }

    /// `ValidateTolerations`.
    fn tolerations(&mut self, tolerations: &[Value], at: &str) {
        for (i, t) in tolerations.iter().enumerate() {
            let ta = format!("{at}[{i}]");
            let key = text(t, "key");
            let operator = text(t, "operator");
            let value = text(t, "value");
            let effect = text(t, "effect");
            if !key.is_empty() {
                self.qualified_name(&format!("{ta}.key"), key);
            }
            if key.is_empty() && operator != "Exists" {
                self.invalid(
                    &format!("{ta}.operator"),
                    Value::from(operator),
                    "operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
                );
            }
            if present(t, "tolerationSeconds").is_some() && effect != "NoExecute" {
                self.invalid(
                    &format!("{ta}.effect"),
                    Value::from(effect),
                    "effect must be 'NoExecute' when `tolerationSeconds` is set",
                );
            }
            match operator {
                "Equal" | "" => {
                    let errors = label_value_errors(value);
                    if !errors.is_empty() {
                        self.invalid(
                            &format!("{ta}.operator"),
                            Value::from(value),
                            errors.join(";"),
                        );
                    }
                }
                "Exists" => {
                    if !value.is_empty() {
                        self.invalid(
                            &format!("{ta}.operator"),
                            Value::from(value),
                            "value must be empty when `operator` is 'Exists'",
                        );
                    }
                }
                other => self.not_supported(&format!("{ta}.operator"), other, &["Equal", "Exists"]),
            }
            if !effect.is_empty()
                && !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
            {
                self.not_supported(
                    &format!("{ta}.effect"),
                    effect,
                    &["NoSchedule", "PreferNoSchedule", "NoExecute"],
                );
            }
        }
    }
}

/// `fieldpath.SplitMaybeSubscriptedPath`: `metadata.labels['app']` is (`metadata.labels`,
/// `app`).
fn split_subscript(path: &str) -> Option<(&str, &str)> {
    let inner = path.strip_suffix("']")?;
    let (base, key) = inner.split_once("['")?;
    (!base.is_empty()).then_some((base, key))
}

/// A resource without a domain, or in `kubernetes.io`.
fn is_native_resource(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

/// `IsExtendedResourceName`: outside `kubernetes.io`, not `requests.`-prefixed, and a
/// qualified name once `requests.` is put in front of it.
fn is_extended_resource(name: &str) -> bool {
    !is_native_resource(name)
        && !name.starts_with("requests.")
        && qualified_name_errors(&format!("requests.{name}")).is_empty()
}

fn is_standard_resource(name: &str) -> bool {
    STANDARD_RESOURCES.contains(&name)
        || name.starts_with("hugepages-")
        || name.starts_with("requests.hugepages-")
}

/// How a quantity was written, which decides how the API server prints it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QuantityFormat {
    /// `Ki`, `Mi`, ...
    BinarySi,
    /// No suffix, or `m`, `k`, `M`, ...
    DecimalSi,
    /// `e3`, `E-2`.
    DecimalExponent,
}

/// A resource quantity, exactly, in nano-units (its finest precision; finer digits round
/// away from zero, as Kubernetes rounds them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Quantity {
    nanos: i128,
    format: QuantityFormat,
}

impl Quantity {
    /// A quantity from JSON: a string (`"500m"`) or a number (`1`), as `resource.Quantity`
    /// decodes both.
    fn parse(value: &Value) -> Option<Quantity> {
        match value {
            Value::String(s) => Self::parse_text(s.trim()),
            Value::Number(n) => Self::parse_text(&n.to_string()),
            _ => None,
        }
    }

    fn parse_text(text: &str) -> Option<Quantity> {
        let (negative, body) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let number_len = body.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(body.len());
        let (number, suffix) = body.split_at(number_len);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return None;
        }
        let digits = format!("{whole}{fraction}");
        if digits.trim_start_matches('0').len() > 30 {
            return None;
        }
        let mantissa: i128 = digits.parse().ok()?;
        let (binary, decimal, format) = match suffix {
            "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
                let i = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"].iter().position(|s| *s == suffix)?;
                (10 * (u32::try_from(i).ok()? + 1), 0, QuantityFormat::BinarySi)
            }
            "n" => (0, -9, QuantityFormat::DecimalSi),
            "u" => (0, -6, QuantityFormat::DecimalSi),
            "m" => (0, -3, QuantityFormat::DecimalSi),
            "" => (0, 0, QuantityFormat::DecimalSi),
            "k" => (0, 3, QuantityFormat::DecimalSi),
            "M" => (0, 6, QuantityFormat::DecimalSi),
            "G" => (0, 9, QuantityFormat::DecimalSi),
            "T" => (0, 12, QuantityFormat::DecimalSi),
            "P" => (0, 15, QuantityFormat::DecimalSi),
            "E" => (0, 18, QuantityFormat::DecimalSi),
            exponent => {
                let digits = exponent.strip_prefix(['e', 'E'])?;
                if digits.is_empty() || digits.len() > 4 {
                    return None;
                }
                (0, digits.parse::<i32>().ok()?, QuantityFormat::DecimalExponent)
            }
        };
        let mut value = mantissa.checked_mul(2i128.checked_pow(binary)?)?;
        let exponent = decimal + 9 - i32::try_from(fraction.len()).ok()?;
        if exponent >= 0 {
            value = value.checked_mul(10i128.checked_pow(exponent.unsigned_abs())?)?;
        } else {
            value = match 10i128.checked_pow(exponent.unsigned_abs()) {
                Some(scale) => value / scale + i128::from(value % scale != 0),
                None => i128::from(value != 0),
            };
        }
        Some(Quantity { nanos: if negative { -value } else { value }, format })
    }

    /// The quantity as the API server prints it (`Quantity.String()`): `2000m` is `2`, `1.5`
    /// is `1500m`, `1024Mi` is `1Gi`, `1000` is `1k`.
    fn canonical(&self) -> String {
        const NANO: i128 = 1_000_000_000;
        if self.nanos == 0 {
            return "0".to_owned();
        }
        let mut format = self.format;
        if format == QuantityFormat::BinarySi
            && ((-1024 * NANO < self.nanos && self.nanos < 1024 * NANO) || self.nanos % NANO != 0)
        {
            format = QuantityFormat::DecimalSi;
        }
        if format == QuantityFormat::BinarySi {
            let mut units = self.nanos / NANO;
            let mut power = 0;
            while power < 6 && units % 1024 == 0 {
                units /= 1024;
                power += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][power];
            return format!("{units}{suffix}");
        }
        let mut mantissa = self.nanos;
        let mut exponent: i32 = -9;
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exponent += 1;
        }
        let r = exponent.rem_euclid(3);
        mantissa *= 10i128.pow(r.unsigned_abs());
        exponent -= r;
        let suffix = match (format, exponent) {
            (QuantityFormat::DecimalExponent, 0) => String::new(),
            (QuantityFormat::DecimalExponent, e) => format!("e{e}"),
            (_, -9) => "n".to_owned(),
            (_, -6) => "u".to_owned(),
            (_, -3) => "m".to_owned(),
            (_, 0) => String::new(),
            (_, 3) => "k".to_owned(),
            (_, 6) => "M".to_owned(),
            (_, 9) => "G".to_owned(),
            (_, 12) => "T".to_owned(),
            (_, 15) => "P".to_owned(),
            (_, 18) => "E".to_owned(),
            (_, e) => format!("e{e}"),
        };
        format!("{mantissa}{suffix}")
    }
}

#[cfg(test)]
mod tests;
