//! The rules of the reference's validating webhooks (`pkg/webhook` of OpenKruise Agents), which
//! a cluster runs after the CRD schemas: `v-sbs.kb.io` (SandboxSet, create and update),
//! `v-sbt.kb.io` (SandboxTemplate, create), `v-suo.kb.io` (SandboxUpdateOps, create and update),
//! and oka's `v-pas.kb.io` (PoolAutoscaler, create and update: what its CEL rules cannot say,
//! schedules that parse, zones that load, capacity amounts that are counts or percentages; and
//! one autoscaler per SandboxSet, which needs the namespace's others).
//! A denial reads as the API server words a webhook's: `admission webhook "v-sbs.kb.io" denied
//! the request: spec.replicas: Invalid value: -1: replicas cannot be negative`.
//!
//! Templates also pass Kubernetes' core PodTemplateSpec validation (`crate::pod`), as the
//! reference runs it, with the volume claim templates appended as volumes.
//! The reference's newest rule that every volume claim template be mounted by a container is a warning
//! here, not a denial: the reference's own samples (`sandboxset-code-interpreter.yaml`) break
//! it, and they must apply unchanged.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::{FieldError, Operation};

/// The label and annotation prefix a template may not use: the E2B layer's own.
pub const RESERVED_PREFIX: &str = "e2b.agents.kruise.io/";

/// A webhook's denial: its name and the errors, in the order the reference finds them.
#[derive(Debug, Clone, PartialEq)]
pub struct Denial {
    /// `v-sbs.kb.io`.
    pub webhook: &'static str,
    /// What is wrong.
    pub errors: Vec<FieldError>,
}

impl Denial {
    /// The message the API server gives for it: `admission webhook "<name>" denied the
    /// request: ` and the [`Denial::aggregate`].
    pub fn message(&self) -> String {
        format!("admission webhook \"{}\" denied the request: {}", self.webhook, self.aggregate())
    }

    /// The errors as the webhook itself words them (Go's `ErrorList.ToAggregate()`): one
    /// error alone, several as `[a, b]`. A webhook server answers this; the API server adds
    /// the webhook's name before it.
    pub fn aggregate(&self) -> String {
        let bodies: Vec<String> =
            self.errors.iter().map(|e| format!("{}: {}", e.field, e.body())).collect();
        match bodies.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        }
    }
}

/// What the webhooks say of an object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    /// Why it is refused, when it is.
    pub denial: Option<Denial>,
    /// What the client is warned of.
    pub warnings: Vec<String>,
}

/// The reference's message for a volume claim template no container mounts.
const UNMOUNTED_CLAIM: &str =
    "must be mounted by at least one container, init container, or ephemeral container";

/// The webhook rules of `kind` for `obj` (with `old` on update).
pub fn validate(kind: &str, operation: Operation, obj: &Value, old: Option<&Value>) -> Verdict {
    let (webhook, errors) = match (kind, operation, old) {
        ("SandboxSet", _, _) => {
            let mut errors = sandbox_set(obj);
            errors.extend(crate::local_runtime::template_errors(obj));
            ("v-sbs.kb.io", errors)
        }
        ("SandboxTemplate", Operation::Create, _) => {
            let mut errors = sandbox_template(obj);
            errors.extend(crate::local_runtime::template_errors(obj));
            ("v-sbt.kb.io", errors)
        }
        ("SandboxUpdateOps", Operation::Create, _) => ("v-suo.kb.io", update_ops_create(obj)),
        ("SandboxUpdateOps", Operation::Update, Some(old)) => {
            ("v-suo.kb.io", update_ops_update(obj, old))
        }
        ("PoolAutoscaler", _, _) => (POOL_AUTOSCALER_WEBHOOK, pool_autoscaler(obj)),
        _ => return Verdict::default(),
    };
    let (warned, errors): (Vec<FieldError>, Vec<FieldError>) =
        errors.into_iter().partition(|e| e.detail == UNMOUNTED_CLAIM);
    Verdict {
        denial: (!errors.is_empty()).then_some(Denial { webhook, errors }),
        warnings: warned.iter().map(|e| format!("{}: {}", e.field, e.body())).collect(),
    }
}

/// The webhook of PoolAutoscalers.
const POOL_AUTOSCALER_WEBHOOK: &str = "v-pas.kb.io";

/// `v-pas.kb.io`'s static rules: every cron schedule parses ([`oka_api::cron`]), every time
/// zone loads from the system's database, and the capacity amounts are counts `>= 0` or
/// percentages from `0%` to `100%`.
fn pool_autoscaler(obj: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let policies = obj.pointer("/spec/cronPolicies").and_then(Value::as_array);
    for (i, policy) in policies.into_iter().flatten().enumerate() {
        if let Some(schedule) = policy.get("schedule").and_then(Value::as_str)
            && let Err(error) = oka_api::cron::Schedule::parse(schedule)
        {
            errors.push(FieldError::invalid(
                &format!("spec.cronPolicies[{i}].schedule"),
                Value::from(schedule),
                error.to_string(),
            ));
        }
        if let Some(zone) = policy.get("timeZone").and_then(Value::as_str)
            && jiff::tz::db().get(zone).is_err()
        {
            errors.push(FieldError::invalid(
                &format!("spec.cronPolicies[{i}].timeZone"),
                Value::from(zone),
                "unknown time zone",
            ));
        }
    }
    for field in ["targetAvailable", "tolerance"] {
        if let Some(value) = obj.pointer(&format!("/spec/capacityPolicy/{field}"))
            && !value.is_null()
            && !count_or_percent(value)
        {
            errors.push(FieldError::invalid(
                &format!("spec.capacityPolicy.{field}"),
                value.clone(),
                "must be a count >= 0 or a percentage from 0% to 100%",
            ));
        }
    }
    errors
}

/// A count `>= 0`, or `"N%"` with `0 <= N <= 100`.
fn count_or_percent(value: &Value) -> bool {
    match value {
        Value::Number(n) => n.as_i64().is_some_and(|n| n >= 0),
        Value::String(s) => s
            .strip_suffix('%')
            .and_then(|p| p.parse::<i64>().ok())
            .is_some_and(|p| (0..=100).contains(&p)),
        _ => false,
    }
}

/// `v-pas.kb.io`'s rule that needs the namespace's other PoolAutoscalers: one autoscaler per
/// SandboxSet. A create, or an update that changes the target, is refused when another
/// autoscaler already targets the same SandboxSet.
pub fn pool_autoscaler_against_others(
    obj: &Value,
    old: Option<&Value>,
    others: &[Value],
) -> Option<Denial> {
    let target = |o: &Value| {
        o.pointer("/spec/scaleTargetRef/name").and_then(Value::as_str).map(str::to_owned)
    };
    let wanted = target(obj)?;
    if old.is_some_and(|old| target(old).as_deref() == Some(wanted.as_str())) {
        return None;
    }
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let other = others.iter().find(|o| {
        o.pointer("/metadata/name").and_then(Value::as_str) != Some(name)
            && target(o).as_deref() == Some(wanted.as_str())
    })?;
    let other_name = other.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    Some(Denial {
        webhook: POOL_AUTOSCALER_WEBHOOK,
        errors: vec![FieldError::invalid(
            "spec.scaleTargetRef.name",
            Value::from(wanted.as_str()),
            format!("PoolAutoscaler {other_name} already targets this SandboxSet"),
        )],
    })
}

/// `v-suo.kb.io`'s rule that needs the namespace's other SandboxUpdateOps: at most one is
/// active (neither Completed nor Failed) at a time.
pub fn update_ops_against_others(obj: &Value, others: &[Value]) -> Option<Denial> {
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let active = others.iter().find(|o| {
        let phase = o.pointer("/status/phase").and_then(Value::as_str).unwrap_or_default();
        o.pointer("/metadata/name").and_then(Value::as_str) != Some(name)
            && phase != "Completed"
            && phase != "Failed"
    })?;
    let other = active.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    Some(Denial {
        webhook: "v-suo.kb.io",
        errors: vec![FieldError::forbidden(
            "spec",
            format!("there is an active SandboxUpdateOps in the same namespace: {other}"),
        )],
    })
}

fn sandbox_set(obj: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if let Some(replicas) = obj.pointer("/spec/replicas").and_then(Value::as_i64)
        && replicas < 0
    {
        errors.push(FieldError::invalid(
            "spec.replicas",
            Value::from(replicas),
            "replicas cannot be negative",
        ));
    }
    let template = obj.pointer("/spec/template").filter(|t| !t.is_null());
    let reference = obj.pointer("/spec/templateRef").filter(|t| !t.is_null());
    match (template, reference) {
        (Some(_), Some(_)) => errors.push(FieldError::forbidden(
            "spec.templateRef",
            "template and templateRef are mutually exclusive",
        )),
        (None, None) => errors.push(FieldError::required(
            "spec.template",
            "either template or templateRef is required",
        )),
        _ => {}
    }
    for (path, strategy) in [
        ("spec.scaleStrategy", "/spec/scaleStrategy"),
        ("spec.updateStrategy", "/spec/updateStrategy"),
    ] {
        if let Some(value) = obj.pointer(&format!("{strategy}/maxUnavailable"))
            && !int_or_percent(value)
        {
            errors.push(FieldError::invalid(
                &format!("{path}.maxUnavailable"),
                value.clone(),
                "maxUnavailable is invalid",
            ));
        }
    }
    if let Some(template) = template {
        errors.extend(template_rules(
            template,
            "spec.template",
            obj.pointer("/spec/volumeClaimTemplates"),
        ));
    }
    errors
}

fn sandbox_template(obj: &Value) -> Vec<FieldError> {
    match obj.pointer("/spec/template").filter(|t| !t.is_null()) {
        Some(template) => {
            template_rules(template, "spec.template", obj.pointer("/spec/volumeClaimTemplates"))
        }
        None => vec![FieldError::required("spec.template", "template is required")],
    }
}

fn update_ops_create(obj: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    match obj.pointer("/spec/selector").filter(|s| !s.is_null()) {
        None => errors.push(FieldError::required("spec.selector", "selector is required")),
        Some(selector) => {
            if let Err(message) = label_selector(selector) {
                errors.push(FieldError::invalid("spec.selector", selector.clone(), message));
            }
        }
    }
    if let Some(value) = obj.pointer("/spec/updateStrategy/maxUnavailable")
        && !int_or_percent(value)
    {
        errors.push(FieldError::invalid(
            "spec.updateStrategy.maxUnavailable",
            value.clone(),
            "maxUnavailable is invalid",
        ));
    }
    for hook in ["preUpgrade", "postUpgrade"] {
        if let Some(h) = obj.pointer(&format!("/spec/lifecycle/{hook}")).filter(|h| !h.is_null())
            && h.get("exec").is_none_or(Value::is_null)
        {
            errors.push(FieldError::required(
                &format!("spec.lifecycle.{hook}.exec"),
                format!("exec is required when {hook} is specified"),
            ));
        }
    }
    errors
}

fn update_ops_update(obj: &Value, old: &Value) -> Vec<FieldError> {
    ["selector", "patch", "lifecycle"]
        .iter()
        .filter(|f| obj.pointer(&format!("/spec/{f}")) != old.pointer(&format!("/spec/{f}")))
        .map(|f| FieldError::forbidden(&format!("spec.{f}"), format!("{f} is immutable")))
        .collect()
}

/// An IntOrString that scales as a count or a percentage (`3`, `"20%"`).
fn int_or_percent(value: &Value) -> bool {
    match value {
        Value::Number(n) => n.is_i64() || n.is_u64(),
        Value::String(s) => s.strip_suffix('%').is_some_and(|p| p.parse::<i64>().is_ok()),
        _ => false,
    }
}

/// Checks a `metav1.LabelSelector` as `LabelSelectorAsSelector` does.
fn label_selector(selector: &Value) -> Result<(), String> {
    for expr in selector.get("matchExpressions").and_then(Value::as_array).into_iter().flatten() {
        let operator = expr.get("operator").and_then(Value::as_str).unwrap_or_default();
        let values = expr.get("values").and_then(Value::as_array).map_or(0, Vec::len);
        match operator {
            "In" | "NotIn" if values == 0 => {
                return Err("for 'in', 'notin' operators, values set can't be empty".to_owned());
            }
            "Exists" | "DoesNotExist" if values > 0 => {
                return Err("values set must be empty for exists and does not exist".to_owned());
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => return Err(format!("{other:?} is not a valid label selector operator")),
        }
    }
    Ok(())
}

/// The rules a template's labels, annotations, containers, volumes and volume claim templates
/// follow.
fn template_rules(template: &Value, path: &str, claims: Option<&Value>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (field, what) in [("labels", "label"), ("annotations", "annotation")] {
        for key in template
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(k, _)| k)
        {
            if key.starts_with(RESERVED_PREFIX) {
                errors.push(FieldError::invalid(
                    &format!("{path}.metadata.{field}[{key}]"),
                    Value::from(key.as_str()),
                    format!("{what} cannot start with {RESERVED_PREFIX}"),
                ));
            }
        }
    }
    let claim_names: Vec<String> = claims
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| c.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned())
        .collect();
    errors.extend(crate::pod::validate_template(template, path, &claim_names));
    let spec = template.get("spec").cloned().unwrap_or(Value::Null);
    let mut mounted = BTreeSet::new();
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for container in spec.get(list).and_then(Value::as_array).into_iter().flatten() {
            for mount in
                container.get("volumeMounts").and_then(Value::as_array).into_iter().flatten()
            {
                if let Some(volume) = mount.get("name").and_then(Value::as_str) {
                    mounted.insert(volume.to_owned());
                }
            }
        }
    }
    for (i, claim) in claims.and_then(Value::as_array).into_iter().flatten().enumerate() {
        let name = claim.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        if !mounted.contains(name) {
            errors.push(FieldError::invalid(
                &format!("spec.volumeClaimTemplates[{i}].metadata.name"),
                Value::from(name),
                UNMOUNTED_CLAIM,
            ));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pool(spec: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": spec})
    }

    #[test]
    fn a_pool_reads_as_the_reference_webhook_reads_it() {
        let good = pool(
            json!({"replicas": 1, "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}}),
        );
        assert_eq!(validate("SandboxSet", Operation::Create, &good, None), Verdict::default());
        let mut unmounted = good.clone();
        unmounted["spec"]["volumeClaimTemplates"] = json!([{"metadata": {"name": "www"}}]);
        let verdict = validate("SandboxSet", Operation::Create, &unmounted, None);
        assert_eq!(verdict.denial, None);
        assert_eq!(
            verdict.warnings,
            [
                "spec.volumeClaimTemplates[0].metadata.name: Invalid value: \"www\": must be mounted by at least one container, init container, or ephemeral container"
            ]
        );
        let bad = pool(
            json!({"replicas": -1, "templateRef": {"name": "t"}, "template": {"metadata": {"labels": {"e2b.agents.kruise.io/x": "y"}}, "spec": {"containers": [{"name": "Main"}]}}}),
        );
        let denial = validate("SandboxSet", Operation::Update, &bad, None).denial.unwrap();
        assert_eq!(
            denial.message(),
            "admission webhook \"v-sbs.kb.io\" denied the request: [spec.replicas: Invalid value: -1: replicas cannot be negative, \
             spec.templateRef: Forbidden: template and templateRef are mutually exclusive, \
             spec.template.metadata.labels[e2b.agents.kruise.io/x]: Invalid value: \"e2b.agents.kruise.io/x\": label cannot start with e2b.agents.kruise.io/, \
             spec.template.spec.containers[0].name: Invalid value: \"Main\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?'), \
             spec.template.spec.containers[0].image: Required value]"
        );
        let neither = pool(json!({"replicas": 1}));
        assert_eq!(
            validate("SandboxSet", Operation::Create, &neither, None).denial.unwrap().message(),
            "admission webhook \"v-sbs.kb.io\" denied the request: spec.template: Required value: either template or templateRef is required"
        );
    }

    #[test]
    fn update_ops_keep_their_selector_patch_and_lifecycle() {
        let ops = json!({"metadata": {"name": "u"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "lifecycle": {"preUpgrade": {}}, "updateStrategy": {"maxUnavailable": "x%"}}});
        let denial = validate("SandboxUpdateOps", Operation::Create, &ops, None).denial.unwrap();
        assert_eq!(
            denial.message(),
            "admission webhook \"v-suo.kb.io\" denied the request: [spec.updateStrategy.maxUnavailable: Invalid value: \"x%\": maxUnavailable is invalid, \
             spec.lifecycle.preUpgrade.exec: Required value: exec is required when preUpgrade is specified]"
        );
        let mut changed = ops.clone();
        changed["spec"]["selector"] = json!({"matchLabels": {"a": "c"}});
        let denial =
            validate("SandboxUpdateOps", Operation::Update, &changed, Some(&ops)).denial.unwrap();
        assert_eq!(denial.errors[0].body(), "Forbidden: selector is immutable");
        let others = [json!({"metadata": {"name": "v"}, "status": {"phase": "Updating"}})];
        let denial = update_ops_against_others(&ops, &others).unwrap();
        assert_eq!(
            denial.errors[0].body(),
            "Forbidden: there is an active SandboxUpdateOps in the same namespace: v"
        );
        let done = [json!({"metadata": {"name": "v"}, "status": {"phase": "Completed"}})];
        assert_eq!(update_ops_against_others(&ops, &done), None);
    }
}
