//! Kubernetes' core/v1 defaults for a pod spec held as JSON: the functions of
//! `k8s.io/kubernetes/pkg/apis/core/v1/defaults.go` (Kubernetes 1.35, the version the
//! reference's `go.mod` pins) that the reference's `defaults.SetDefaultPodSpec` calls, in the
//! same selection.
//!
//! That selection is narrower than what a Pod gets: the reference calls `SetDefaults_PodSpec`
//! and the per-field functions by hand, never `SetDefaults_Pod`, so a template keeps what the
//! Pod alone gets when it is created (`enableServiceLinks`, requests copied from limits, host
//! ports under host networking, pod-level resources). The pods a controller makes from the
//! template get those from the API server, as any pod does. The rules here:
//!
//! - **Pod spec** (`SetDefaults_PodSpec`): `dnsPolicy` `ClusterFirst`, `restartPolicy`
//!   `Always`, `securityContext` `{}`, `terminationGracePeriodSeconds` 30, `schedulerName`
//!   `default-scheduler`; `overhead` quantities rounded up to a thousandth.
//! - **Containers**: `imagePullPolicy` `Always` (the reference sets it before Kubernetes' rule
//!   can look at the tag), `terminationMessagePath` `/dev/termination-log`,
//!   `terminationMessagePolicy` `File`. **Init containers** take Kubernetes' own pull policy:
//!   `Always` for the tag `latest` (or no tag and no digest), `IfNotPresent` otherwise.
//!   **Ephemeral containers** get neither: the reference skips `SetDefaults_Container` for them.
//! - **Every container** (all three kinds): ports' `protocol` `TCP`, env `fieldRef.apiVersion`
//!   `v1`, `resources.limits` and `resources.requests` quantities rounded up to a thousandth,
//!   the liveness, readiness and startup probes' `timeoutSeconds` 1, `periodSeconds` 10,
//!   `successThreshold` 1, `failureThreshold` 3 and their `httpGet` `path` `/` and `scheme`
//!   `HTTP`, and the same `httpGet` defaults in `lifecycle.postStart` and `lifecycle.preStop`.
//! - **Volumes**: one without a source becomes an `emptyDir: {}`; `hostPath.type` `""`;
//!   `secret`, `configMap`, `downwardAPI` and `projected` `defaultMode` 420 (0644); the
//!   `fieldRef.apiVersion` of downward API items (plain and projected) `v1`; a projected
//!   service account token's `expirationSeconds` 3600; an `image` volume's `pullPolicy` by its
//!   reference's tag, as an init container's. That one is behind Kubernetes' `ImageVolume`
//!   feature gate, taken here to be on, as it is by default in 1.35 (beta); with it off an
//!   image volume keeps an unset `pullPolicy`.
//!
//! # Rules of the port
//!
//! - Go cannot tell an absent field from its zero value, so neither does this: an empty
//!   string, a `0` probe number and `null` count as unset, as they decode to the zero value in
//!   Go. A field holding anything else is never changed.
//! - A field of the wrong JSON type is left alone: the reference's decoder refuses such an
//!   object, and validation refuses it here.
//! - Quantity spelling is kept: Go writes every quantity back canonically (`1000m` becomes
//!   `1`), which changes no value; only a quantity finer than a thousandth is rewritten, to the
//!   value Go rounds it up to.
//! - Every default fills an unset field, so defaulting a defaulted spec changes nothing.

use serde_json::{Map, Value};

/// The fields of `VolumeSource` in Kubernetes 1.35: a volume naming none of them becomes an
/// `emptyDir`.
const VOLUME_SOURCES: [&str; 30] = [
    "hostPath",
    "emptyDir",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "secret",
    "nfs",
    "iscsi",
    "glusterfs",
    "persistentVolumeClaim",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "downwardAPI",
    "fc",
    "azureFile",
    "configMap",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "projected",
    "portworxVolume",
    "scaleIO",
    "storageos",
    "csi",
    "ephemeral",
    "image",
];

/// The `defaultMode` of secret, config map, downward API and projected volumes: 0644.
const DEFAULT_VOLUME_MODE: i64 = 0o644;

/// A projected service account token's lifetime: one hour.
const DEFAULT_TOKEN_EXPIRATION_SECONDS: i64 = 3600;

/// Which of a pod's container lists a container is in: each gets a different pull policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ContainerKind {
    Regular,
    Init,
    Ephemeral,
}

/// Applies the defaults to `spec`, a pod spec (`template.spec`).
pub fn default_pod_spec(spec: &mut Map<String, Value>) {
    set_if_empty_string(spec, "dnsPolicy", "ClusterFirst");
    set_if_empty_string(spec, "restartPolicy", "Always");
    set_if_null(spec, "securityContext", Value::Object(Map::new()));
    set_if_null(spec, "terminationGracePeriodSeconds", Value::from(30));
    set_if_empty_string(spec, "schedulerName", "default-scheduler");
    for volume in objects(spec, "volumes") {
        default_volume(volume);
    }
    for (key, kind) in [
        ("initContainers", ContainerKind::Init),
        ("containers", ContainerKind::Regular),
        ("ephemeralContainers", ContainerKind::Ephemeral),
    ] {
        for container in objects(spec, key) {
            default_container(container, kind);
        }
    }
    if let Some(Value::Object(overhead)) = spec.get_mut("overhead") {
        round_up_resource_list(overhead);
    }
}

fn default_container(container: &mut Map<String, Value>, kind: ContainerKind) {
    if kind == ContainerKind::Regular {
        set_if_empty_string(container, "imagePullPolicy", "Always");
    }
    if kind != ContainerKind::Ephemeral {
        // `SetDefaults_Container`.
        if is_empty_string(container.get("imagePullPolicy")) {
            let image = container.get("image").and_then(Value::as_str).unwrap_or_default();
            container.insert("imagePullPolicy".into(), Value::from(pull_policy(image)));
        }
        set_if_empty_string(container, "terminationMessagePath", "/dev/termination-log");
        set_if_empty_string(container, "terminationMessagePolicy", "File");
    }
    for port in objects(container, "ports") {
        set_if_empty_string(port, "protocol", "TCP");
    }
    for env in objects(container, "env") {
        if let Some(Value::Object(field_ref)) = env.pointer_mut("valueFrom", "fieldRef") {
            default_object_field_selector(field_ref);
        }
    }
    if let Some(Value::Object(resources)) = container.get_mut("resources") {
        for key in ["limits", "requests"] {
            if let Some(Value::Object(list)) = resources.get_mut(key) {
                round_up_resource_list(list);
            }
        }
    }
    for key in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(Value::Object(probe)) = container.get_mut(key) {
            default_probe(probe);
        }
    }
    if let Some(Value::Object(lifecycle)) = container.get_mut("lifecycle") {
        for key in ["postStart", "preStop"] {
            if let Some(Value::Object(http_get)) = lifecycle.pointer_mut(key, "httpGet") {
                default_http_get(http_get);
            }
        }
    }
}

/// `SetDefaults_Probe`, and `SetDefaults_HTTPGetAction` for an HTTP probe.
fn default_probe(probe: &mut Map<String, Value>) {
    set_if_zero(probe, "timeoutSeconds", 1);
    set_if_zero(probe, "periodSeconds", 10);
    set_if_zero(probe, "successThreshold", 1);
    set_if_zero(probe, "failureThreshold", 3);
    if let Some(Value::Object(http_get)) = probe.get_mut("httpGet") {
        default_http_get(http_get);
    }
}

fn default_http_get(http_get: &mut Map<String, Value>) {
    set_if_empty_string(http_get, "path", "/");
    set_if_empty_string(http_get, "scheme", "HTTP");
}

fn default_object_field_selector(selector: &mut Map<String, Value>) {
    set_if_empty_string(selector, "apiVersion", "v1");
}

fn default_volume(volume: &mut Map<String, Value>) {
    // `SetDefaults_Volume`.
    if VOLUME_SOURCES.iter().all(|source| is_null(volume.get(*source))) {
        volume.insert("emptyDir".into(), Value::Object(Map::new()));
    }
    if let Some(Value::Object(image)) = volume.get_mut("image")
        && is_empty_string(image.get("pullPolicy"))
    {
        let reference = image.get("reference").and_then(Value::as_str).unwrap_or_default();
        let policy = pull_policy(reference);
        image.insert("pullPolicy".into(), Value::from(policy));
    }
    if let Some(Value::Object(host_path)) = volume.get_mut("hostPath") {
        // `HostPathUnset`.
        set_if_null(host_path, "type", Value::from(""));
    }
    for source in ["secret", "configMap", "downwardAPI", "projected"] {
        if let Some(Value::Object(source)) = volume.get_mut(source) {
            set_if_null(source, "defaultMode", Value::from(DEFAULT_VOLUME_MODE));
        }
    }
    if let Some(Value::Object(downward)) = volume.get_mut("downwardAPI") {
        default_downward_items(downward);
    }
    if let Some(Value::Object(projected)) = volume.get_mut("projected") {
        for source in objects(projected, "sources") {
            if let Some(Value::Object(downward)) = source.get_mut("downwardAPI") {
                default_downward_items(downward);
            }
            if let Some(Value::Object(token)) = source.get_mut("serviceAccountToken") {
                set_if_null(
                    token,
                    "expirationSeconds",
                    Value::from(DEFAULT_TOKEN_EXPIRATION_SECONDS),
                );
            }
        }
    }
}

fn default_downward_items(downward: &mut Map<String, Value>) {
    for item in objects(downward, "items") {
        if let Some(Value::Object(field_ref)) = item.get_mut("fieldRef") {
            default_object_field_selector(field_ref);
        }
    }
}

/// Kubernetes' pull policy for an image with none: `Always` for the tag `latest`, which an
/// image with neither tag nor digest is given, `IfNotPresent` for any other tag, a digest
/// alone, or a reference that does not parse (Go ignores the parse error and finds no tag).
fn pull_policy(image: &str) -> &'static str {
    if image_tag(image).as_deref() == Some("latest") { "Always" } else { "IfNotPresent" }
}

/// The tag of an image reference as `parsers.ParseImageName` finds it: `latest` for a bare
/// name, `None` for a digest without a tag or a reference that is no image name.
fn image_tag(image: &str) -> Option<String> {
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    let last = name.rsplit('/').next().unwrap_or_default();
    let (repository, tag) = match last.split_once(':') {
        Some((_, tag)) => (&name[..name.len() - tag.len() - 1], Some(tag)),
        None => (name, None),
    };
    let valid_part = |part: &str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    };
    // The host (the first part, when it has a dot, a colon or is `localhost`) may hold
    // upper case and a port; the path parts may not.
    let mut parts: Vec<&str> = repository.split('/').collect();
    if parts.len() > 1 {
        let host = parts[0];
        if host.contains(['.', ':'])
            || host == "localhost"
            || host.bytes().any(|b| b.is_ascii_uppercase())
        {
            parts.remove(0);
        }
    }
    if !parts.iter().all(|p| valid_part(p)) {
        return None;
    }
    if let Some(digest) = digest
        && !digest.contains(':')
    {
        return None;
    }
    match (tag, digest) {
        (Some(tag), _) if valid_tag(tag) => Some(tag.to_owned()),
        (Some(_), _) => None,
        (None, Some(_)) => None,
        (None, None) => Some("latest".to_owned()),
    }
}

/// A Docker tag: `[\w][\w.-]{0,127}`.
fn valid_tag(tag: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = tag.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 128
        && word(bytes[0])
        && bytes.iter().all(|b| word(*b) || *b == b'.' || *b == b'-')
}

/// `SetDefaults_ResourceList`: every quantity finer than a thousandth rounded up to one.
fn round_up_resource_list(list: &mut Map<String, Value>) {
    for value in list.values_mut() {
        let text = match value {
            Value::String(text) => text.clone(),
            Value::Number(number) => number.to_string(),
            _ => continue,
        };
        if let Some(rounded) = round_up_to_milli(&text) {
            *value = Value::from(rounded);
        }
    }
}

/// `text`, a quantity, rounded up (away from zero) to a thousandth and written as Go writes
/// it; `None` when it needs no rounding or is no quantity (validation says so).
pub(crate) fn round_up_to_milli(text: &str) -> Option<String> {
    let (negative, body) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let number_len = body.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(body.len());
    let (number, suffix) = body.split_at(number_len);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return None;
    }
    let (binary_power, decimal_power, exponent_form) = suffix_powers(suffix)?;
    // The value is mantissa × 2^binary × 10^(decimal − fraction digits); in thousandths the
    // power of ten grows by 3.
    let digits = format!("{whole}{fraction}");
    let significant = digits.trim_end_matches('0');
    let trailing_zeros = i32::try_from(digits.len() - significant.len()).ok()?;
    let significant = significant.trim_start_matches('0');
    if significant.is_empty() {
        return None;
    }
    let power = decimal_power + 3 - i32::try_from(fraction.len()).ok()? + trailing_zeros;
    if power >= 0 {
        return None;
    }
    let mantissa: i128 = significant.parse().ok()?;
    let scaled = mantissa.checked_mul(2i128.checked_pow(binary_power)?)?;
    let divisor = 10i128.checked_pow(power.unsigned_abs())?;
    if scaled % divisor == 0 {
        return None;
    }
    let millis = scaled / divisor + 1;
    let sign = if negative { "-" } else { "" };
    Some(format!("{sign}{}", canonical_millis(millis, exponent_form)))
}

/// The powers of 2 and 10 of a quantity suffix, and whether it is an exponent (`e3`).
fn suffix_powers(suffix: &str) -> Option<(u32, i32, bool)> {
    let binary = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if let Some(i) = binary.iter().position(|s| *s == suffix) {
        return Some((10 * (u32::try_from(i).ok()? + 1), 0, false));
    }
    let decimal = match suffix {
        "n" => -9,
        "u" => -6,
        "m" => -3,
        "" => 0,
        "k" => 3,
        "M" => 6,
        "G" => 9,
        "T" => 12,
        "P" => 15,
        "E" => 18,
        exponent => {
            let digits = exponent.strip_prefix(['e', 'E'])?;
            return digits.parse::<i32>().ok().map(|e| (0, e, true));
        }
    };
    Some((0, decimal, false))
}

/// `millis` thousandths as Go's canonical form writes them: the largest power of a thousand
/// that leaves a whole number, as an SI suffix (or an exponent for an exponent quantity).
fn canonical_millis(millis: i128, exponent_form: bool) -> String {
    const SUFFIXES: [&str; 8] = ["m", "", "k", "M", "G", "T", "P", "E"];
    let mut value = millis;
    let mut step = 0;
    while step + 1 < SUFFIXES.len() && value % 1000 == 0 {
        value /= 1000;
        step += 1;
    }
    if exponent_form {
        let exponent = 3 * i32::try_from(step).unwrap_or_default() - 3;
        if exponent == 0 { value.to_string() } else { format!("{value}e{exponent}") }
    } else {
        format!("{value}{}", SUFFIXES[step])
    }
}

/// The objects of the list at `key` (none when it is absent or not a list).
pub(crate) fn objects<'a>(
    map: &'a mut Map<String, Value>,
    key: &str,
) -> impl Iterator<Item = &'a mut Map<String, Value>> {
    map.get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

/// Absent or `null`: a nil pointer in Go.
pub(crate) fn is_null(value: Option<&Value>) -> bool {
    value.is_none_or(Value::is_null)
}

/// Absent, `null` or `""`: an empty string in Go.
fn is_empty_string(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => true,
        Some(Value::String(text)) => text.is_empty(),
        Some(_) => false,
    }
}

/// Sets `key` when it is a nil pointer in Go.
pub(crate) fn set_if_null(map: &mut Map<String, Value>, key: &str, value: Value) {
    if is_null(map.get(key)) {
        map.insert(key.into(), value);
    }
}

/// Sets `key` when it is an empty string in Go.
fn set_if_empty_string(map: &mut Map<String, Value>, key: &str, value: &str) {
    if is_empty_string(map.get(key)) {
        map.insert(key.into(), Value::from(value));
    }
}

/// Sets `key` when it is a zero number in Go (absent, `null` or `0`).
fn set_if_zero(map: &mut Map<String, Value>, key: &str, value: i64) {
    let zero = match map.get(key) {
        None | Some(Value::Null) => true,
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        Some(_) => false,
    };
    if zero {
        map.insert(key.into(), Value::from(value));
    }
}

/// Two steps into nested objects.
trait PointerMut {
    fn pointer_mut(&mut self, first: &str, second: &str) -> Option<&mut Value>;
}

impl PointerMut for Map<String, Value> {
    fn pointer_mut(&mut self, first: &str, second: &str) -> Option<&mut Value> {
        self.get_mut(first)?.as_object_mut()?.get_mut(second)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn defaulted(spec: Value) -> Value {
        let mut spec = spec;
        default_pod_spec(spec.as_object_mut().unwrap());
        spec
    }

    #[test]
    fn an_empty_pod_spec_gets_the_pod_spec_defaults() {
        assert_eq!(
            defaulted(json!({})),
            json!({
                "dnsPolicy": "ClusterFirst",
                "restartPolicy": "Always",
                "securityContext": {},
                "terminationGracePeriodSeconds": 30,
                "schedulerName": "default-scheduler",
            })
        );
    }

    #[test]
    fn containers_get_their_kind_of_pull_policy() {
        let spec = defaulted(json!({
            "containers": [{"name": "a", "image": "nginx:1.25"}],
            "initContainers": [
                {"name": "b", "image": "busybox"},
                {"name": "c", "image": "busybox:1.36"},
                {"name": "d", "image": "busybox:latest"},
                {"name": "e", "image": "busybox@sha256:abcd"},
                {"name": "f", "image": "registry.local:5000/team/tool"},
            ],
            "ephemeralContainers": [{"name": "g", "image": "busybox"}],
        }));
        let policy = |list: &str, i: usize| spec[list][i]["imagePullPolicy"].clone();
        assert_eq!(policy("containers", 0), json!("Always"));
        assert_eq!(policy("initContainers", 0), json!("Always"));
        assert_eq!(policy("initContainers", 1), json!("IfNotPresent"));
        assert_eq!(policy("initContainers", 2), json!("Always"));
        assert_eq!(policy("initContainers", 3), json!("IfNotPresent"));
        assert_eq!(policy("initContainers", 4), json!("Always"));
        assert_eq!(policy("ephemeralContainers", 0), Value::Null);
        assert_eq!(spec["containers"][0]["terminationMessagePath"], "/dev/termination-log");
        assert_eq!(spec["initContainers"][0]["terminationMessagePolicy"], "File");
        assert!(spec["ephemeralContainers"][0].get("terminationMessagePath").is_none());
    }

    #[test]
    fn probes_ports_env_and_lifecycle_are_defaulted_in_every_container_kind() {
        let container = json!({
            "name": "a",
            "image": "x",
            "ports": [{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP"}],
            "env": [{"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "livenessProbe": {"httpGet": {"port": 80}},
            "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 5},
            "startupProbe": {"tcpSocket": {"port": 80}, "timeoutSeconds": 0},
            "lifecycle": {
                "postStart": {"httpGet": {"port": 80, "path": "/up"}},
                "preStop": {"exec": {"command": ["true"]}},
            },
        });
        for list in ["containers", "initContainers", "ephemeralContainers"] {
            let spec = defaulted(json!({list: [container.clone()]}));
            let c = &spec[list][0];
            assert_eq!(c["ports"][0]["protocol"], "TCP", "{list}");
            assert_eq!(c["ports"][1]["protocol"], "UDP", "{list}");
            assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["apiVersion"], "v1", "{list}");
            assert_eq!(
                c["livenessProbe"],
                json!({
                    "httpGet": {"port": 80, "path": "/", "scheme": "HTTP"},
                    "timeoutSeconds": 1, "periodSeconds": 10,
                    "successThreshold": 1, "failureThreshold": 3,
                }),
                "{list}"
            );
            assert_eq!(c["readinessProbe"]["periodSeconds"], 5, "{list}");
            assert_eq!(c["startupProbe"]["timeoutSeconds"], 1, "{list}");
            assert_eq!(
                c["lifecycle"]["postStart"]["httpGet"],
                json!({"port": 80, "path": "/up", "scheme": "HTTP"}),
                "{list}"
            );
            assert_eq!(c["lifecycle"]["preStop"], json!({"exec": {"command": ["true"]}}));
        }
    }

    #[test]
    fn volumes_get_their_source_defaults() {
        let spec = defaulted(json!({"volumes": [
            {"name": "scratch"},
            {"name": "host", "hostPath": {"path": "/tmp"}},
            {"name": "secret", "secret": {"secretName": "s"}},
            {"name": "cm", "configMap": {"name": "c", "defaultMode": 256}},
            {"name": "down", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            ]}},
            {"name": "proj", "projected": {"sources": [
                {"downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                {"serviceAccountToken": {"path": "token"}},
            ]}},
            {"name": "img", "image": {"reference": "quay.io/x/y:v1"}},
            {"name": "pvc", "persistentVolumeClaim": {"claimName": "data"}},
        ]}));
        let v = &spec["volumes"];
        assert_eq!(v[0], json!({"name": "scratch", "emptyDir": {}}));
        assert_eq!(v[1]["hostPath"], json!({"path": "/tmp", "type": ""}));
        assert_eq!(v[2]["secret"]["defaultMode"], 420);
        assert_eq!(v[3]["configMap"]["defaultMode"], 256);
        assert_eq!(v[4]["downwardAPI"]["defaultMode"], 420);
        assert_eq!(v[4]["downwardAPI"]["items"][0]["fieldRef"]["apiVersion"], "v1");
        assert_eq!(v[5]["projected"]["defaultMode"], 420);
        let sources = &v[5]["projected"]["sources"];
        assert_eq!(sources[0]["downwardAPI"]["items"][0]["fieldRef"]["apiVersion"], "v1");
        assert_eq!(sources[1]["serviceAccountToken"]["expirationSeconds"], 3600);
        assert_eq!(v[6]["image"]["pullPolicy"], "IfNotPresent");
        assert_eq!(v[7], json!({"name": "pvc", "persistentVolumeClaim": {"claimName": "data"}}));
    }

    #[test]
    fn quantities_finer_than_a_thousandth_round_up() {
        for (text, expected) in [
            ("1", None),
            ("500m", None),
            ("1.5", None),
            ("1000m", None),
            ("1Gi", None),
            ("0.5Ki", None),
            ("100u", Some("1m")),
            ("0.0001", Some("1m")),
            ("1.0001", Some("1001m")),
            ("0.9999", Some("1")),
            ("1999.9999", Some("2k")),
            ("1500001u", Some("1501m")),
            ("1e-4", Some("1e-3")),
            ("0.0001Ki", Some("103m")),
            ("-0.0001", Some("-1m")),
            ("12n", Some("1m")),
            ("bogus", None),
            ("", None),
        ] {
            assert_eq!(round_up_to_milli(text).as_deref(), expected, "{text}");
        }
        let spec = defaulted(json!({
            "containers": [{"name": "a", "resources": {
                "limits": {"cpu": "0.0001", "memory": "1Gi"},
                "requests": {"cpu": 0.5},
            }}],
            "overhead": {"cpu": "250u"},
        }));
        let resources = &spec["containers"][0]["resources"];
        assert_eq!(resources["limits"], json!({"cpu": "1m", "memory": "1Gi"}));
        assert_eq!(resources["requests"], json!({"cpu": 0.5}));
        assert_eq!(spec["overhead"], json!({"cpu": "1m"}));
    }

    #[test]
    fn a_field_the_user_set_is_kept() {
        let spec = json!({
            "dnsPolicy": "None",
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 1000},
            "terminationGracePeriodSeconds": 0,
            "schedulerName": "mine",
            "containers": [{
                "name": "a", "image": "x:latest",
                "imagePullPolicy": "Never",
                "terminationMessagePath": "/tmp/msg",
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }],
        });
        let mut expected = spec.clone();
        assert_eq!(defaulted(spec), expected);
        // A second pass over a defaulted spec changes nothing either.
        expected = defaulted(json!({"containers": [{"name": "a"}], "volumes": [{"name": "v"}]}));
        assert_eq!(defaulted(expected.clone()), expected);
    }
}
