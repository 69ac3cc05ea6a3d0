//! Hand-written schema pieces and the final touch-up of generated CRDs.
//!
//! Most of each CRD schema is derived from the Rust types by schemars. A few pieces must look
//! exactly like the reference's controller-gen output and cannot be derived:
//!
//! - pod templates and patches are *schemaless* (`x-kubernetes-preserve-unknown-fields: true`),
//!   so the API server neither validates nor prunes them ([`preserve_unknown_fields`]);
//! - `status.conditions` is the `metav1.Condition` list-map keyed by `type`, with its patterns and
//!   limits ([`conditions`]);
//! - a few k8s-openapi types lack the list/map-type markers the reference has
//!   ([`label_selector`], [`exec_action`], [`quantity_map`]).
//!
//! [`finalize`] then normalizes what kube's structural-schema rewriter leaves behind so the result
//! reads like controller-gen's: no `nullable` (every optional field is omitted, never `null`),
//! `anyOf: [integer, string]` next to `x-kubernetes-int-or-string`, the `apiVersion`/`kind`/`metadata`
//! root properties, and `listKind`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use schemars::{Schema, SchemaGenerator, json_schema};

/// The Kubernetes quantity pattern, as in every controller-gen CRD.
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// A schemaless value: accepted and stored as is.
pub(crate) fn preserve_unknown_fields(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
}

/// `[]metav1.Condition` as a list-map keyed by `type`.
pub(crate) fn conditions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "description": "Condition contains details for one aspect of the current state of this API Resource.",
            "type": "object",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "lastTransitionTime": {
                    "description": "lastTransitionTime is the last time the condition transitioned from one status to another. This should be when the underlying condition changed.  If that is not known, then using the time when the API field changed is acceptable.",
                    "type": "string",
                    "format": "date-time",
                },
                "message": {
                    "description": "message is a human readable message indicating details about the transition. This may be an empty string.",
                    "type": "string",
                    "maxLength": 32768,
                },
                "observedGeneration": {
                    "description": "observedGeneration represents the .metadata.generation that the condition was set based upon. For instance, if .metadata.generation is currently 12, but the .status.conditions[x].observedGeneration is 9, the condition is out of date with respect to the current state of the instance.",
                    "type": "integer",
                    "format": "int64",
                    "minimum": 0,
                },
                "reason": {
                    "description": "reason contains a programmatic identifier indicating the reason for the condition's last transition. Producers of specific condition types may define expected values and meanings for this field, and whether the values are considered a guaranteed API. The value should be a CamelCase string. This field may not be empty.",
                    "type": "string",
                    "maxLength": 1024,
                    "minLength": 1,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                },
                "status": {
                    "description": "status of the condition, one of True, False, Unknown.",
                    "type": "string",
                    "enum": ["True", "False", "Unknown"],
                },
                "type": {
                    "description": "type of condition in CamelCase or in foo.example.com/CamelCase.",
                    "type": "string",
                    "maxLength": 316,
                    "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
                },
            },
        },
    })
}

/// `map[string]resource.Quantity`.
pub(crate) fn quantity_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "additionalProperties": {
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": true,
        },
    })
}

/// `metav1.LabelSelector` with the reference's atomic markers.
pub(crate) fn label_selector(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-map-type": "atomic",
        "properties": {
            "matchExpressions": {
                "description": "matchExpressions is a list of label selector requirements. The requirements are ANDed.",
                "type": "array",
                "x-kubernetes-list-type": "atomic",
                "items": {
                    "description": "A label selector requirement is a selector that contains values, a key, and an operator that relates the key and values.",
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {
                            "description": "key is the label key that the selector applies to.",
                            "type": "string",
                        },
                        "operator": {
                            "description": "operator represents a key's relationship to a set of values. Valid operators are In, NotIn, Exists and DoesNotExist.",
                            "type": "string",
                        },
                        "values": {
                            "description": "values is an array of string values. If the operator is In or NotIn, the values array must be non-empty. If the operator is Exists or DoesNotExist, the values array must be empty.",
                            "type": "array",
                            "x-kubernetes-list-type": "atomic",
                            "items": { "type": "string" },
                        },
                    },
                },
            },
            "matchLabels": {
                "description": "matchLabels is a map of {key,value} pairs. A single {key,value} in the matchLabels map is equivalent to an element of matchExpressions, whose key field is \"key\", the operator is \"In\", and the values array contains only \"value\". The requirements are ANDed.",
                "type": "object",
                "additionalProperties": { "type": "string" },
            },
        },
    })
}

/// `corev1.ExecAction` with the reference's atomic `command` list.
pub(crate) fn exec_action(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "properties": {
            "command": {
                "description": "Command is the command line to execute inside the container, the working directory for the command is root ('/') in the container's filesystem. The command is simply exec'd, it is not run inside a shell, so traditional shell instructions ('|', etc) won't work. To use a shell, you need to explicitly call out to that shell. Exit status of 0 is treated as live/healthy and non-zero is unhealthy.",
                "type": "array",
                "x-kubernetes-list-type": "atomic",
                "items": { "type": "string" },
            },
        },
    })
}

/// Normalizes a CRD generated by kube's derive so it reads like the reference's.
pub(crate) fn finalize(crd: &mut CustomResourceDefinition) {
    if crd.spec.names.list_kind.is_none() {
        crd.spec.names.list_kind = Some(format!("{}List", crd.spec.names.kind));
    }
    for version in &mut crd.spec.versions {
        let Some(root) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) else {
            continue;
        };
        normalize(root);
        root.title = None;
        let properties = root.properties.get_or_insert_with(Default::default);
        properties.entry("apiVersion".to_owned()).or_insert_with(|| JSONSchemaProps {
            description: Some(
                "APIVersion defines the versioned schema of this representation of an object. \
                 Servers should convert recognized schemas to the latest internal value, and may \
                 reject unrecognized values."
                    .to_owned(),
            ),
            type_: Some("string".to_owned()),
            ..Default::default()
        });
        properties.entry("kind".to_owned()).or_insert_with(|| JSONSchemaProps {
            description: Some(
                "Kind is a string value representing the REST resource this object represents. \
                 Servers may infer this from the endpoint the client submits requests to. Cannot \
                 be updated. In CamelCase."
                    .to_owned(),
            ),
            type_: Some("string".to_owned()),
            ..Default::default()
        });
        properties.entry("metadata".to_owned()).or_insert_with(|| JSONSchemaProps {
            type_: Some("object".to_owned()),
            ..Default::default()
        });
    }
}

fn normalize(schema: &mut JSONSchemaProps) {
    // Optional fields are omitted when unset, never written as null; the reference has no
    // `nullable`, so the API server prunes a stray null instead of storing it.
    schema.nullable = None;
    if let Some(values) = schema.enum_.as_mut() {
        values.retain(|v| !v.0.is_null());
    }
    if schema.x_kubernetes_int_or_string == Some(true) {
        let of_type = |t: &str| JSONSchemaProps { type_: Some(t.to_owned()), ..Default::default() };
        schema.any_of = Some(vec![of_type("integer"), of_type("string")]);
    }
    for child in schema.properties.iter_mut().flat_map(|p| p.values_mut()) {
        normalize(child);
    }
    match schema.items.as_mut() {
        Some(JSONSchemaPropsOrArray::Schema(item)) => normalize(item),
        Some(JSONSchemaPropsOrArray::Schemas(items)) => items.iter_mut().for_each(normalize),
        None => {}
    }
    if let Some(JSONSchemaPropsOrBool::Schema(values)) = schema.additional_properties.as_mut() {
        normalize(values);
    }
}
