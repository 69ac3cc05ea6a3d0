//! The pure rules of template builds: which names and tags are accepted, what a build start
//! asks for (validated, every field the SDK sends either honoured or refused by name), and the
//! SandboxTemplate and SandboxSet a successful build becomes.

use std::collections::BTreeMap;

use oka_api::{SandboxSet, SandboxTemplate};
use serde::Deserialize;
use serde_json::json;

use crate::templatebuild::{BuildBase, BuildOutput, BuildRequest};

/// The label on the objects template builds write, with [`MANAGED_BY_BUILDS`]: only those a
/// later build of the same name may replace.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY_BUILDS: &str = "oka-template-build";
/// The annotation on a built SandboxTemplate and SandboxSet: the build they are of.
pub const BUILD_ID: &str = "agents.kruise.io/template-build-id";
/// The annotation on a built SandboxTemplate: when its build finished (RFC 3339).
pub const BUILD_FINISHED_AT: &str = "agents.kruise.io/template-build-finished-at";
/// The tag a build gets when its name names none (E2B's).
pub const DEFAULT_TAG: &str = "default";
/// The step types the builder runs, as the SDK sends them.
pub const STEP_KINDS: [&str; 5] = ["RUN", "COPY", "ENV", "WORKDIR", "USER"];
/// The images that mean oka's own `base` template (the SDKs' default base).
pub const E2B_BASE_IMAGES: [&str; 2] = ["e2bdev/base", "e2bdev/base:latest"];
/// Names the API's routes take as words (`/templates/tags`, `/templates/aliases/…`).
const RESERVED_NAMES: [&str; 2] = ["tags", "aliases"];

/// Checks that `name` can be a template here: the name of a SandboxSet (a Kubernetes name of
/// at most 63 characters, so it also fits a label value).
pub fn check_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !valid {
        return Err(format!(
            "invalid template name {name:?}: a template is a SandboxSet here, so its name must be \
             a Kubernetes name: 1 to 63 lowercase letters, digits and '-', starting and ending \
             with a letter or digit"
        ));
    }
    if RESERVED_NAMES.contains(&name) {
        return Err(format!("invalid template name {name:?}: the name is reserved by the API"));
    }
    Ok(())
}

/// Checks a tag: 1 to 128 letters, digits, `.`, `_` and `-`.
pub fn check_tag(tag: &str) -> Result<(), String> {
    let valid = !tag.is_empty()
        && tag.len() <= 128
        && tag.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(format!("invalid tag {tag:?}: a tag is 1 to 128 letters, digits, '.', '_' and '-'"))
    }
}

/// `name` or `name:tag` split into a checked name and its tag, if any.
pub fn split_name(target: &str) -> Result<(&str, Option<&str>), String> {
    let (name, tag) = match target.split_once(':') {
        Some((name, tag)) => (name, Some(tag)),
        None => (target, None),
    };
    check_name(name)?;
    if let Some(tag) = tag {
        check_tag(tag)?;
    }
    Ok((name, tag))
}

/// Checks an uploaded file's hash as the SDKs compute it (SHA-256, 64 lowercase hex digits);
/// it names the file on disk, so nothing else is accepted.
pub fn check_files_hash(hash: &str) -> Result<(), String> {
    if hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        Ok(())
    } else {
        Err(format!("invalid files hash {hash:?}: expected 64 lowercase hex digits (SHA-256)"))
    }
}

/// `POST /v3/templates` (E2B's `TemplateBuildRequestV3`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateRequest {
    /// `name` or `name:tag`.
    #[serde(default)]
    pub name: Option<String>,
    /// The deprecated spelling of `name`.
    #[serde(default)]
    pub alias: Option<String>,
    /// Tags the build gets when it succeeds.
    #[serde(default)]
    pub tags: Option<Vec<String>>,
    /// A team other than the key's: refused unless it is the key's own.
    #[serde(default, rename = "teamID")]
    pub team_id: Option<String>,
    /// CPUs of the template's sandboxes (their limit).
    #[serde(default, rename = "cpuCount")]
    pub cpu_count: Option<u32>,
    /// Memory of the template's sandboxes, MiB (their limit).
    #[serde(default, rename = "memoryMB")]
    pub memory_mb: Option<u64>,
    /// Free disk after the steps, MiB: sandboxes here share the host's disk, so anything but
    /// 0 cannot be promised and is refused.
    #[serde(default, rename = "minFreeDiskMb", alias = "minFreeDiskMB")]
    pub min_free_disk_mb: Option<u64>,
}

/// A checked template request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedTemplate {
    /// The template's name (and ID).
    pub name: String,
    /// The tags the build gets: the name's tag (else [`DEFAULT_TAG`]) and `tags`, each once.
    pub tags: Vec<String>,
    /// CPUs.
    pub cpu_count: Option<u32>,
    /// Memory, MiB.
    pub memory_mb: Option<u64>,
}

/// Checks a template request.
pub fn plan_template(request: &TemplateRequest) -> Result<PlannedTemplate, String> {
    let target = request
        .name
        .as_deref()
        .or(request.alias.as_deref())
        .filter(|n| !n.is_empty())
        .ok_or("name is required")?;
    let (name, tag) = split_name(target)?;
    let mut tags = vec![tag.unwrap_or(DEFAULT_TAG).to_owned()];
    for tag in request.tags.iter().flatten() {
        check_tag(tag)?;
        if !tags.contains(tag) {
            tags.push(tag.clone());
        }
    }
    if request.cpu_count == Some(0) {
        return Err("cpuCount must be at least 1".into());
    }
    if request.memory_mb == Some(0) {
        return Err("memoryMB must be at least 1".into());
    }
    if request.min_free_disk_mb.is_some_and(|mib| mib > 0) {
        return Err("minFreeDiskMb is not supported by oka: sandboxes share the host's disk, so \
                    free space cannot be reserved per template; omit it or set it to 0"
            .into());
    }
    Ok(PlannedTemplate {
        name: name.to_owned(),
        tags,
        cpu_count: request.cpu_count,
        memory_mb: request.memory_mb,
    })
}

/// `POST /v2/templates/{id}/builds/{build}` (E2B's `TemplateBuildStartV2`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// A registry image to start from.
    #[serde(default, rename = "fromImage")]
    pub from_image: Option<String>,
    /// A template to start from.
    #[serde(default, rename = "fromTemplate")]
    pub from_template: Option<String>,
    /// How to log in to `fromImage`'s registry.
    #[serde(default, rename = "fromImageRegistry")]
    pub from_image_registry: Option<serde_json::Value>,
    /// Build without any cache.
    #[serde(default)]
    pub force: Option<bool>,
    /// The steps.
    #[serde(default)]
    pub steps: Option<Vec<StepJson>>,
    /// The start command.
    #[serde(default, rename = "startCmd")]
    pub start_cmd: Option<String>,
    /// The ready check.
    #[serde(default, rename = "readyCmd")]
    pub ready_cmd: Option<String>,
}

/// One step as the SDK sends it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepJson {
    /// `RUN`, `COPY`, `ENV`, `WORKDIR` or `USER`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// `COPY`: the hash of its uploaded files.
    #[serde(default, rename = "filesHash")]
    pub files_hash: Option<String>,
    /// Skip the cache from here on.
    #[serde(default)]
    pub force: Option<bool>,
    /// The SDK's own upload flag (it decided whether to upload; nothing left to do here).
    #[serde(default, rename = "forceUpload")]
    pub force_upload: Option<bool>,
}

/// What a build start names outside itself, which the caller resolves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlannedBase {
    /// A registry image, with credentials.
    Image {
        /// The image reference.
        reference: String,
        /// `fromImageRegistry`'s username and password.
        credentials: Option<(String, String)>,
    },
    /// A template by name (`e2bdev/base` is `base`).
    Template(String),
}

/// One checked step; `files_hash` still to be found among the uploads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedStep {
    /// The step type.
    pub kind: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// `COPY`'s files hash.
    pub files_hash: Option<String>,
    /// Its `force`.
    pub force: bool,
}

/// A checked build start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedStart {
    /// The base.
    pub base: PlannedBase,
    /// The steps.
    pub steps: Vec<PlannedStep>,
    /// The start command.
    pub start_cmd: Option<String>,
    /// The ready check.
    pub ready_cmd: Option<String>,
    /// The whole build's `force`.
    pub force: bool,
}

/// Checks a build start. Every field is honoured or refused with a message naming it.
pub fn plan_start(request: &StartRequest) -> Result<PlannedStart, String> {
    let base = match (&request.from_image, &request.from_template) {
        (Some(_), Some(_)) => {
            return Err("fromImage and fromTemplate are exclusive: give one".into());
        }
        (None, None) => return Err("fromImage or fromTemplate is required".into()),
        (None, Some(template)) => {
            if request.from_image_registry.is_some() {
                return Err(
                    "fromImageRegistry applies to fromImage only, not to fromTemplate".into()
                );
            }
            check_name(template).map_err(|e| format!("fromTemplate: {e}"))?;
            PlannedBase::Template(template.clone())
        }
        (Some(image), None) => {
            if image.trim().is_empty() {
                return Err("fromImage is empty".into());
            }
            let credentials = registry_credentials(request.from_image_registry.as_ref())?;
            if E2B_BASE_IMAGES.contains(&image.as_str()) && credentials.is_none() {
                PlannedBase::Template("base".into())
            } else {
                PlannedBase::Image { reference: image.clone(), credentials }
            }
        }
    };
    let mut steps = Vec::new();
    for (index, step) in request.steps.iter().flatten().enumerate() {
        steps.push(plan_step(index, step)?);
    }
    for (field, value) in [("startCmd", &request.start_cmd), ("readyCmd", &request.ready_cmd)] {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err(format!("{field} is empty: omit it or give a command"));
        }
    }
    Ok(PlannedStart {
        base,
        steps,
        start_cmd: request.start_cmd.clone(),
        ready_cmd: request.ready_cmd.clone(),
        force: request.force.unwrap_or(false),
    })
}

/// `fromImageRegistry`: `{type: registry, username, password}` is honoured; AWS and GCP
/// registries are refused by name (oka pulls with plain registry credentials only).
fn registry_credentials(
    registry: Option<&serde_json::Value>,
) -> Result<Option<(String, String)>, String> {
    let Some(registry) = registry.filter(|r| !r.is_null()) else { return Ok(None) };
    let kind = registry.get("type").and_then(|t| t.as_str()).unwrap_or_default();
    match kind {
        "registry" => {
            let field = |name: &str| {
                registry
                    .get(name)
                    .and_then(|v| v.as_str())
                    .filter(|v| !v.is_empty())
                    .map(str::to_owned)
                    .ok_or_else(|| format!("fromImageRegistry of type registry needs {name}"))
            };
            let known = ["type", "username", "password"];
            if let Some(other) =
                registry.as_object().and_then(|o| o.keys().find(|k| !known.contains(&k.as_str())))
            {
                return Err(format!("fromImageRegistry: unknown field {other:?}"));
            }
            Ok(Some((field("username")?, field("password")?)))
        }
        "aws" | "gcp" => Err(format!(
            "fromImageRegistry of type {kind} is not supported by oka: give the registry's \
             username and password (type registry), or pull the image into a registry oka can \
             read"
        )),
        other => Err(format!(
            "fromImageRegistry: unknown type {other:?} (expected registry, aws or gcp)"
        )),
    }
}

fn plan_step(index: usize, step: &StepJson) -> Result<PlannedStep, String> {
    // Numbered as the SDKs number steps: the base is 0, `steps[0]` is 1.
    let number = index + 1;
    let at = |message: String| format!("step {number} ({}): {message}", step.kind);
    if !STEP_KINDS.contains(&step.kind.as_str()) {
        return Err(format!(
            "step {number}: unknown step type {:?} (oka builds {})",
            step.kind,
            STEP_KINDS.join(", ")
        ));
    }
    let args = step.args.clone().unwrap_or_default();
    let count_ok = match step.kind.as_str() {
        "RUN" => (1..=2).contains(&args.len()) && !args[0].trim().is_empty(),
        "COPY" => (2..=4).contains(&args.len()) && !args[0].is_empty() && !args[1].is_empty(),
        "ENV" => !args.is_empty() && args.len().is_multiple_of(2),
        _ => args.len() == 1 && !args[0].is_empty(),
    };
    if !count_ok {
        let expected = match step.kind.as_str() {
            "RUN" => "a command and optionally a user",
            "COPY" => "a source, a destination, and optionally a user and a mode",
            "ENV" => "pairs of name and value",
            "WORKDIR" => "one directory",
            _ => "one user",
        };
        return Err(at(format!("expected {expected}, got {args:?}")));
    }
    if step.kind == "ENV" {
        for name in args.iter().step_by(2) {
            let valid = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                return Err(at(format!("invalid environment variable name {name:?}")));
            }
        }
    }
    let files_hash = match (step.kind.as_str(), &step.files_hash) {
        ("COPY", Some(hash)) => {
            check_files_hash(hash).map_err(at)?;
            Some(hash.clone())
        }
        ("COPY", None) => return Err(at("filesHash is required".into())),
        (_, Some(_)) => return Err(at("filesHash applies to COPY steps only".into())),
        (_, None) => None,
    };
    Ok(PlannedStep {
        kind: step.kind.clone(),
        args,
        files_hash,
        force: step.force.unwrap_or(false),
    })
}

/// How often a built template's ready check runs until it passes, in seconds.
pub const READY_CHECK_PERIOD_SECONDS: i32 = 1;

/// The SandboxTemplate a successful build writes: its image, pulled if not present;
/// `cpuCount`/`memoryMB` as limits; the start command as the container's command and the
/// ready check as an exec startup probe, both through a login bash, so a pool's sandboxes
/// are handed out only once their ready check passed; `pod_annotations` on its pod template.
///
/// The probe is E2B's ready check: run every second until its first success, within
/// `ready_timeout` (the build's wait for a ready sandbox): `failureThreshold` is its seconds,
/// and so is `timeoutSeconds`, since a ready command may itself wait (the SDK's
/// `waitForTimeout` is a `sleep`).
pub fn template_object(
    request: &BuildRequest,
    output: &BuildOutput,
    pod_annotations: &BTreeMap<String, String>,
    ready_timeout: std::time::Duration,
    finished_at: jiff::Timestamp,
) -> Result<SandboxTemplate, String> {
    let mut container = json!({
        "name": "sandbox",
        "image": output.image,
        "imagePullPolicy": "IfNotPresent",
    });
    let mut limits = serde_json::Map::new();
    if let Some(cpu) = request.cpu_count {
        limits.insert("cpu".into(), json!(cpu.to_string()));
    }
    if let Some(memory) = request.memory_mb {
        limits.insert("memory".into(), json!(format!("{memory}Mi")));
    }
    if !limits.is_empty() {
        container["resources"] = json!({ "limits": limits });
    }
    if let Some(start) = &request.start_cmd {
        container["command"] = json!(["/bin/bash", "-l", "-c", start]);
    }
    if let Some(ready) = &request.ready_cmd {
        let seconds = i32::try_from(ready_timeout.as_secs()).unwrap_or(i32::MAX).max(1);
        container["startupProbe"] = json!({
            "exec": { "command": ["/bin/bash", "-l", "-c", ready] },
            "periodSeconds": READY_CHECK_PERIOD_SECONDS,
            "timeoutSeconds": seconds,
            "failureThreshold": (seconds / READY_CHECK_PERIOD_SECONDS).max(1),
        });
    }
    let mut pod = json!({ "spec": { "containers": [container] } });
    if !pod_annotations.is_empty() {
        pod["metadata"] = json!({ "annotations": pod_annotations });
    }
    let object = json!({
        "apiVersion": oka_api::API_VERSION,
        "kind": "SandboxTemplate",
        "metadata": {
            "name": request.template_id,
            "namespace": request.namespace,
            "labels": { MANAGED_BY: MANAGED_BY_BUILDS },
            "annotations": {
                BUILD_ID: request.build_id,
                BUILD_FINISHED_AT: finished_at.to_string(),
            },
        },
        "spec": { "template": pod },
    });
    serde_json::from_value(object).map_err(|e| format!("the built template is invalid: {e}"))
}

/// The SandboxSet of a first successful build: `replicas` warm sandboxes of the template of
/// the same name.
pub fn set_object(request: &BuildRequest, replicas: i32) -> Result<SandboxSet, String> {
    let object = json!({
        "apiVersion": oka_api::API_VERSION,
        "kind": "SandboxSet",
        "metadata": {
            "name": request.template_id,
            "namespace": request.namespace,
            "labels": { MANAGED_BY: MANAGED_BY_BUILDS },
            "annotations": { BUILD_ID: request.build_id },
        },
        "spec": {
            "replicas": replicas,
            "templateRef": { "name": request.template_id },
        },
    });
    serde_json::from_value(object).map_err(|e| format!("the built pool is invalid: {e}"))
}

/// Where the pool of a freshly written template is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rollout {
    /// Not rolled to the new template yet, or no sandbox of it ready yet.
    Waiting,
    /// A sandbox of the new template is ready (or the pool is scaled to zero once rolled).
    Ready,
    /// A sandbox of the new template failed: why.
    Failed(String),
}

/// The rollout of `set` to a new template: its `updateRevision` must have moved from
/// `revision_before` (unless the template's spec did not change, `expect_new_revision` false),
/// then one of `members` (the sandboxes of every pool, filtered here) at that revision must be
/// ready (`updatedAvailableReplicas`), and none of them failed.
pub fn rollout(
    set: &SandboxSet,
    members: &[std::sync::Arc<oka_api::Sandbox>],
    revision_before: Option<&str>,
    expect_new_revision: bool,
) -> Rollout {
    let status = set.status.clone().unwrap_or_default();
    let Some(revision) = status.update_revision.as_deref() else { return Rollout::Waiting };
    if expect_new_revision && Some(revision) == revision_before {
        return Rollout::Waiting;
    }
    let failed = members.iter().find(|sandbox| {
        of_revision(set, sandbox, revision)
            && sandbox.status.as_ref().and_then(|s| s.phase.as_ref())
                == Some(&oka_api::SandboxPhase::Failed)
    });
    if let Some(sandbox) = failed {
        let message = sandbox
            .status
            .as_ref()
            .and_then(|s| s.message.clone())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "no message".into());
        return Rollout::Failed(format!(
            "a sandbox of the built template failed to start ({}): {message}",
            sandbox.metadata.name.as_deref().unwrap_or_default()
        ));
    }
    if set.spec.replicas == 0 || status.updated_available_replicas.unwrap_or(0) >= 1 {
        Rollout::Ready
    } else {
        Rollout::Waiting
    }
}

/// Why the pool's sandboxes of its update revision are not ready, in their `Ready` condition's
/// words (the first such sandbox that says), for a build that waited in vain: a ready command
/// that never passed, or a template the runtime refused, is named instead of left to guess.
pub fn not_ready_because(
    set: &SandboxSet,
    members: &[std::sync::Arc<oka_api::Sandbox>],
) -> Option<String> {
    let revision = set.status.as_ref()?.update_revision.as_deref()?;
    members.iter().find_map(|sandbox| {
        if !of_revision(set, sandbox, revision) {
            return None;
        }
        let ready = sandbox
            .status
            .as_ref()?
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == oka_api::conditions::sandbox::READY && c.status == "False")?;
        Some(ready.message.clone()).filter(|m| !m.is_empty()).map(|message| {
            format!("{} ({message})", sandbox.metadata.name.as_deref().unwrap_or_default())
        })
    })
}

/// Whether `sandbox` is a member of pool `set` made from its template revision `revision`.
fn of_revision(set: &SandboxSet, sandbox: &oka_api::Sandbox, revision: &str) -> bool {
    let labels = sandbox.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    sandbox.metadata.namespace == set.metadata.namespace
        && label(oka_api::labels::SANDBOX_POOL) == set.metadata.name.as_deref()
        && label(oka_api::labels::TEMPLATE_HASH) == Some(revision)
}

/// Whether template builds wrote this object (and so may replace it).
pub fn written_by_builds(
    metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> bool {
    metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY)).is_some_and(|v| v == MANAGED_BY_BUILDS)
}

/// The base a build starts from, once a template base is resolved to its image (`""`: the
/// runtime's default root).
pub fn build_base(base: &PlannedBase, template_image: Option<String>) -> BuildBase {
    match base {
        PlannedBase::Image { reference, credentials } => {
            BuildBase::Image { reference: reference.clone(), credentials: credentials.clone() }
        }
        PlannedBase::Template(name) => {
            BuildBase::Template { name: name.clone(), image: template_image.unwrap_or_default() }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn start(value: serde_json::Value) -> Result<PlannedStart, String> {
        plan_start(&serde_json::from_value(value).map_err(|e| e.to_string())?)
    }

    #[test]
    fn names_must_be_kubernetes_names() {
        assert!(check_name("my-env-2").is_ok());
        for bad in ["", "My", "a_b", "-a", "a-", "team/a", "tags", &"a".repeat(64)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(split_name("py:v1.2").unwrap(), ("py", Some("v1.2")));
        assert!(split_name("py:").is_err());
    }

    #[test]
    fn a_template_request_gets_its_names_tag_or_default() {
        let plan = |v| plan_template(&serde_json::from_value(v).unwrap());
        let p = plan(json!({"name": "py:v1", "tags": ["stable", "v1"], "cpuCount": 2})).unwrap();
        assert_eq!((p.name.as_str(), p.tags.clone()), ("py", vec!["v1".into(), "stable".into()]));
        assert_eq!(plan(json!({"alias": "py"})).unwrap().tags, ["default"]);
        assert_eq!(plan(json!({})).unwrap_err(), "name is required");
        assert!(
            plan(json!({"name": "py", "minFreeDiskMb": 10})).unwrap_err().contains("minFreeDiskMb")
        );
        assert!(plan(json!({"name": "py", "minFreeDiskMb": 0})).is_ok());
    }

    #[test]
    fn the_sdk_default_base_is_oka_base_and_other_registries_are_refused_by_name() {
        let p = start(json!({"fromImage": "e2bdev/base", "force": false, "steps": []})).unwrap();
        assert_eq!(p.base, PlannedBase::Template("base".into()));
        let p = start(json!({"fromImage": "python:3", "fromImageRegistry":
            {"type": "registry", "username": "u", "password": "p"}}))
        .unwrap();
        assert_eq!(
            p.base,
            PlannedBase::Image {
                reference: "python:3".into(),
                credentials: Some(("u".into(), "p".into()))
            }
        );
        let err =
            start(json!({"fromImage": "x", "fromImageRegistry": {"type": "aws"}})).unwrap_err();
        assert!(err.starts_with("fromImageRegistry of type aws is not supported"), "{err}");
        assert!(start(json!({"steps": []})).is_err());
        assert!(start(json!({"fromImage": "a", "fromTemplate": "b"})).is_err());
    }

    #[test]
    fn steps_are_checked_by_kind_with_their_index() {
        let steps = |s| start(json!({"fromTemplate": "base", "steps": s}));
        let ok = steps(json!([
            {"type": "RUN", "args": ["echo hi", "root"], "force": false, "forceUpload": null},
            {"type": "COPY", "args": ["a", "/b", "", ""], "filesHash": "a".repeat(64)},
            {"type": "ENV", "args": ["A", "1", "B", "2"]},
            {"type": "WORKDIR", "args": ["/app"]},
            {"type": "USER", "args": ["user"]},
        ]))
        .unwrap();
        assert_eq!(ok.steps.len(), 5);
        assert_eq!(ok.steps[1].files_hash.as_deref(), Some(&*"a".repeat(64)));
        let err = steps(json!([{"type": "RUN", "args": ["x"]}, {"type": "ARG", "args": ["x"]}]));
        assert_eq!(
            err.unwrap_err(),
            "step 2: unknown step type \"ARG\" (oka builds RUN, COPY, ENV, WORKDIR, USER)"
        );
        let err = steps(json!([{"type": "COPY", "args": ["a", "/b"]}])).unwrap_err();
        assert_eq!(err, "step 1 (COPY): filesHash is required");
        let err = steps(json!([{"type": "ENV", "args": ["1A", "x"]}])).unwrap_err();
        assert!(err.contains("invalid environment variable name"), "{err}");
        let err = steps(json!([{"type": "RUN", "args": ["x"], "cache": true}])).unwrap_err();
        assert!(err.contains("unknown field `cache`"), "{err}");
    }

    #[test]
    fn a_rollout_is_ready_with_a_ready_sandbox_of_the_new_revision_and_failed_with_a_failed_one() {
        use oka_api::{Sandbox, SandboxPhase, SandboxSetStatus};
        let mut set = SandboxSet::new("py", Default::default());
        set.metadata.namespace = Some("default".into());
        set.spec.replicas = 1;
        let with = |revision: &str, ready: i32| {
            let mut set = set.clone();
            set.status = Some(SandboxSetStatus {
                update_revision: Some(revision.into()),
                updated_available_replicas: Some(ready),
                ..Default::default()
            });
            set
        };
        assert_eq!(rollout(&set, &[], None, true), Rollout::Waiting, "no status yet");
        assert_eq!(rollout(&with("r1", 1), &[], Some("r1"), true), Rollout::Waiting);
        assert_eq!(rollout(&with("r1", 1), &[], Some("r1"), false), Rollout::Ready, "same spec");
        assert_eq!(rollout(&with("r2", 0), &[], Some("r1"), true), Rollout::Waiting);
        assert_eq!(rollout(&with("r2", 1), &[], Some("r1"), true), Rollout::Ready);
        let member = |pool: &str, revision: &str, phase| {
            let mut sandbox = Sandbox::test()
                .name("py-1")
                .namespace("default")
                .pooled(pool)
                .label(oka_api::labels::TEMPLATE_HASH, revision)
                .phase(phase)
                .build();
            sandbox.status.get_or_insert_default().message = Some("exec: bash: not found".into());
            std::sync::Arc::new(sandbox)
        };
        let failed = [member("py", "r2", SandboxPhase::Failed)];
        assert_eq!(
            rollout(&with("r2", 0), &failed, Some("r1"), true),
            Rollout::Failed(
                "a sandbox of the built template failed to start (py-1): exec: bash: not found"
                    .into()
            )
        );
        let unrelated =
            [member("other", "r2", SandboxPhase::Failed), member("py", "r1", SandboxPhase::Failed)];
        assert_eq!(rollout(&with("r2", 0), &unrelated, Some("r1"), true), Rollout::Waiting);
        assert_eq!(not_ready_because(&with("r2", 0), &unrelated), None);
        let mut probing = Sandbox::test()
            .name("py-2")
            .namespace("default")
            .pooled("py")
            .label(oka_api::labels::TEMPLATE_HASH, "r2")
            .phase(SandboxPhase::Pending)
            .build();
        probing.status.get_or_insert_default().conditions =
            Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: oka_api::conditions::sandbox::READY.into(),
                status: "False".into(),
                reason: "PodCreateFailed".into(),
                message: "Startup probe failed: exited with code 1".into(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: None,
            }]);
        assert_eq!(
            not_ready_because(&with("r2", 0), &[std::sync::Arc::new(probing)]).as_deref(),
            Some("py-2 (Startup probe failed: exited with code 1)")
        );
    }

    #[test]
    fn a_build_becomes_a_template_with_its_image_command_probe_and_limits() {
        let request = BuildRequest {
            template_id: "py".into(),
            build_id: "b1".into(),
            namespace: "team".into(),
            base: BuildBase::Template { name: "base".into(), image: String::new() },
            steps: vec![],
            start_cmd: Some("python -m http.server 8000".into()),
            ready_cmd: Some("curl -s localhost:8000".into()),
            force: false,
            cpu_count: Some(2),
            memory_mb: Some(1024),
        };
        let output = BuildOutput { image: "oka.local/py:b1".into() };
        let annotations = BTreeMap::from([("agents.kruise.io/network".into(), "outbound".into())]);
        let ready_timeout = std::time::Duration::from_secs(120);
        let template = template_object(
            &request,
            &output,
            &annotations,
            ready_timeout,
            jiff::Timestamp::UNIX_EPOCH,
        )
        .unwrap();
        let value = serde_json::to_value(&template).unwrap();
        let container = &value["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"], "oka.local/py:b1");
        assert_eq!(container["imagePullPolicy"], "IfNotPresent");
        assert_eq!(
            container["command"],
            json!(["/bin/bash", "-l", "-c", "python -m http.server 8000"])
        );
        // E2B's ready check is a startup probe: every second until it passes, within the
        // build's ready timeout; never a readiness or liveness probe.
        assert_eq!(
            container["startupProbe"],
            json!({
                "exec": { "command": ["/bin/bash", "-l", "-c", "curl -s localhost:8000"] },
                "periodSeconds": 1,
                "timeoutSeconds": 120,
                "failureThreshold": 120,
            })
        );
        assert!(container.get("readinessProbe").is_none());
        assert!(container.get("livenessProbe").is_none());
        assert_eq!(container["resources"]["limits"], json!({"cpu": "2", "memory": "1024Mi"}));
        assert_eq!(
            value["spec"]["template"]["metadata"]["annotations"]["agents.kruise.io/network"],
            "outbound"
        );
        assert_eq!(value["metadata"]["annotations"][BUILD_ID], "b1");
        assert!(written_by_builds(&template.metadata));
        let set = set_object(&request, 3).unwrap();
        assert_eq!(set.spec.replicas, 3);
        assert_eq!(set.spec.template_ref.as_ref().map(|r| r.name.as_str()), Some("py"));
    }
}
