//! Admission for `agents.kruise.io/v1alpha1` objects: what the Kubernetes API server does to
//! a custom resource on every write before it stores it, from the CRDs `oka_api::crds`
//! generates.
//!
//! In the API server's order:
//!
//! 1. **Unknown fields** (those the schema does not declare, outside
//!    `x-kubernetes-preserve-unknown-fields`) are pruned; with `fieldValidation=Strict` they
//!    fail the request, with `Warn` (the default) each is a warning, with `Ignore` nothing.
//! 2. **Defaults** from the schema fill absent fields.
//! 3. **Mutating webhooks**: the reference's defaulting webhooks (`md-sbs.kb.io` on SandboxSet
//!    create and update, `md-sbt.kb.io` on SandboxTemplate create; [`mutating`]) default the
//!    pod template, the PVC templates and the update strategy. They see the pruned and
//!    defaulted object and the API server defaults again after them, as on a cluster; what
//!    they set is validated with the rest.
//! 4. **Validation**: `metadata` as `ObjectMeta` (name, labels, annotations), then the schema
//!    (types, formats, `required`, `enum`, bounds, lengths, patterns, list types); every
//!    failure is a [`FieldError`] worded as the API server words it.
//! 5. **Rules**: the schema's `x-kubernetes-validations` (CEL, evaluated by `oka_cel`), unless
//!    step 4 found an error that breaks their assumptions (a wrong type, a missing required
//!    field, ...). On an update, transition rules compare with the stored object (`oldSelf`).
//! 6. **Validating webhooks**: the reference's `v-sbs`, `v-sbt` and `v-suo` (with the refusal
//!    of what oka's runtime cannot honour in a template that names it, [`local_runtime`],
//!    which a Sandbox meets in step 4), and
//!    oka's for PoolAutoscalers (schedules, zones, capacity amounts) ([`webhooks`]); the rules
//!    that need the namespace's other objects are separate functions the API calls with them.
//!
//! The webhooks (steps 3 and 6) are registered for the resources, not their `status` and
//! `scale` subresources: [`Admission::admit_subresource`] admits a write through those
//! without them.
//!
//! # Architecture invariant
//!
//! This crate is pure: JSON in, JSON and errors out, no I/O but one read: a PoolAutoscaler's
//! `timeZone` is looked up in the system's time zone database (read once and cached by
//! `jiff`), as the controller will look it up. The Kubernetes-compatible API of `oka serve`
//! calls it on every write, and a Kubernetes admission webhook can serve it unchanged.

#![forbid(unsafe_code)]

mod errors;
pub mod local_runtime;
mod metadata;
pub mod mutating;
mod pod;
pub mod pod_defaults;
mod rules;
mod structural;
pub mod webhooks;

use std::collections::BTreeMap;

use serde_json::Value;

pub use errors::{FieldError, FieldErrorKind, render_value};

/// What the client asked for unknown fields (`fieldValidation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Prune them silently.
    Ignore,
    /// Prune them and warn about each (the API server's default).
    #[default]
    Warn,
    /// Refuse the request.
    Strict,
}

impl FieldValidation {
    /// The query parameter's value; `None` for one the API server does not take.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "Ignore" => Some(FieldValidation::Ignore),
            "Warn" | "" => Some(FieldValidation::Warn),
            "Strict" => Some(FieldValidation::Strict),
            _ => None,
        }
    }
}

/// The write being admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// A new object.
    Create,
    /// A change to an existing object.
    Update,
}

/// Why an object is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdmissionError {
    /// Fields the schema does not know, under `fieldValidation=Strict` (400 BadRequest): their
    /// paths.
    #[error("strict decoding error: {}", unknown_list(.0))]
    UnknownFields(Vec<String>),
    /// The object breaks its schema (422 Invalid).
    #[error("{} field errors", .0.len())]
    Invalid(Vec<FieldError>),
    /// The object passed its schema but the reference's validating webhook denies it (422,
    /// worded as the API server words a webhook's denial).
    #[error("{}", .0.message())]
    Denied(webhooks::Denial),
    /// The kind is not one of this API's.
    #[error("no schema for kind {0}")]
    UnknownKind(String),
}

fn unknown_list(paths: &[String]) -> String {
    paths.iter().map(|p| format!("unknown field \"{p}\"")).collect::<Vec<_>>().join(", ")
}

/// What admission did to an accepted object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Admitted {
    /// Warnings for the client (`Warning: 299 - "..."`): the unknown fields pruned under `Warn`.
    pub warnings: Vec<String>,
}

/// The schemas of every kind, ready to admit objects.
#[derive(Debug, Clone)]
pub struct Admission {
    schemas: BTreeMap<String, structural::Schema>,
    /// Each kind's `x-kubernetes-validations`, compiled once; kinds without rules are absent.
    rules: BTreeMap<String, rules::RuleTree>,
}

impl Default for Admission {
    fn default() -> Self {
        Self::new()
    }
}

impl Admission {
    /// Admission for every kind of [`oka_api::crds`].
    pub fn new() -> Self {
        let mut schemas = BTreeMap::new();
        let mut rules = BTreeMap::new();
        for crd in oka_api::crds() {
            let version = crd.spec.versions.iter().find(|v| v.name == oka_api::VERSION);
            let schema = version
                .and_then(|v| v.schema.as_ref())
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .and_then(|s| serde_json::to_value(s).ok());
            if let Some(schema) = schema {
                let kind = crd.spec.names.kind.clone();
                if let Some(tree) = rules::RuleTree::new(&schema) {
                    rules.insert(kind.clone(), tree);
                }
                schemas.insert(kind, structural::Schema::new(schema));
            }
        }
        Admission { schemas, rules }
    }

    /// The OpenAPI v3 schema of `kind`, as its CRD declares it.
    pub fn schema(&self, kind: &str) -> Option<&Value> {
        self.schemas.get(kind).map(structural::Schema::root)
    }

    /// Admits `obj` (the whole object, as the client sent it after any patch): prunes it,
    /// defaults it (the schema's defaults and the mutating webhooks') and validates it, in
    /// place. `old` is the stored object an update replaces (`None` on a create), which
    /// transition rules (`oldSelf`) compare with.
    pub fn admit(
        &self,
        kind: &str,
        operation: Operation,
        obj: &mut Value,
        old: Option<&Value>,
        validation: FieldValidation,
    ) -> Result<Admitted, AdmissionError> {
        self.run(kind, operation, obj, old, validation, true)
    }

    /// Admits an update through the `status` or `scale` subresource (`obj` the whole object
    /// it leaves): as [`Admission::admit`] without the webhooks, which are registered for the
    /// resource alone. A scale write must not default the template, or scaling a pool would
    /// change its revision.
    pub fn admit_subresource(
        &self,
        kind: &str,
        obj: &mut Value,
        old: Option<&Value>,
        validation: FieldValidation,
    ) -> Result<Admitted, AdmissionError> {
        self.run(kind, Operation::Update, obj, old, validation, false)
    }

    fn run(
        &self,
        kind: &str,
        operation: Operation,
        obj: &mut Value,
        old: Option<&Value>,
        validation: FieldValidation,
        run_webhooks: bool,
    ) -> Result<Admitted, AdmissionError> {
        let schema =
            self.schemas.get(kind).ok_or_else(|| AdmissionError::UnknownKind(kind.into()))?;
        let mut unknown = Vec::new();
        metadata::prune(obj, &mut unknown);
        schema.prune(obj, &mut unknown);
        let mut admitted = Admitted::default();
        match validation {
            FieldValidation::Strict if !unknown.is_empty() => {
                return Err(AdmissionError::UnknownFields(unknown));
            }
            FieldValidation::Warn => {
                admitted.warnings =
                    unknown.iter().map(|p| format!("unknown field \"{p}\"")).collect();
            }
            _ => {}
        }
        schema.default(obj);
        // The mutating webhooks see the pruned, defaulted object; the API server defaults
        // again after a webhook's patch.
        if run_webhooks && mutating::mutate(kind, operation, obj) {
            schema.default(obj);
        }
        let mut errors = metadata::validate(obj, operation);
        schema.validate(obj, &mut errors);
        // A Sandbox has no webhook of the reference's; its template meets the local runtime's
        // table here (a SandboxSet's and a SandboxTemplate's in their webhooks).
        if kind == "Sandbox" && run_webhooks {
            errors.extend(local_runtime::template_errors(obj));
        }
        if let Some(tree) = self.rules.get(kind) {
            if errors.iter().any(FieldError::blocks_rules) {
                errors.push(FieldError::invalid(
                    "<nil>",
                    Value::from("null"),
                    "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
                ));
            } else {
                let old = old.filter(|_| operation == Operation::Update);
                tree.validate(obj, old, "", &mut errors);
            }
        }
        if !errors.is_empty() {
            return Err(AdmissionError::Invalid(errors));
        }
        if !run_webhooks {
            return Ok(admitted);
        }
        // The validating webhooks run after the schema, as on a cluster.
        let verdict = webhooks::validate(kind, operation, obj, old);
        if let Some(denial) = verdict.denial {
            return Err(AdmissionError::Denied(denial));
        }
        admitted.warnings.extend(verdict.warnings);
        Ok(admitted)
    }
}

/// The metadata checks alone (name, labels, annotations), for kinds without a CRD schema.
pub fn validate_metadata(obj: &Value, operation: Operation) -> Vec<FieldError> {
    metadata::validate(obj, operation)
}

#[cfg(test)]
mod tests;
