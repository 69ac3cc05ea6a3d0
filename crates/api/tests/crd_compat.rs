//! Test A: our generated CRDs against the reference's (`tests/reference/bases/`).
//!
//! For every reference CRD of a kind we implement: identity (group, names, scope, version),
//! subresources, printer columns, and every schema node (path → type and the validation and
//! merge facets below). Every difference is collected and reported at once. Deliberate
//! differences (oka extensions) are listed in the constants below, so they stay visible.

// Test code: a panic is how a helper reports a broken fixture.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use common::{our_crds, root_schema, walk_schema, yaml_documents, yaml_files};

/// Reference kinds oka does not implement (yet). Remove an entry when the kind lands.
const KNOWN_GAPS: &[&str] = &["Commit", "GlobalSecurityProfile", "SecurityProfile"];

/// Our kinds that the reference does not have.
const EXTENSION_KINDS: &[&str] = &["PoolAutoscaler"];

/// Schema subtrees that exist only in ours: (kind, path prefix).
const EXTENSION_PATHS: &[(&str, &str)] = &[
    // seed-extensions §2.2: probes and the auto-pause policy on all three template holders.
    ("Sandbox", ".spec.probes"),
    ("Sandbox", ".spec.autoPausePolicy"),
    ("SandboxSet", ".spec.probes"),
    ("SandboxSet", ".spec.autoPausePolicy"),
    ("SandboxTemplate", ".spec.probes"),
    ("SandboxTemplate", ".spec.autoPausePolicy"),
    // seed-extensions §7.3: the canonical reuse counter (mirrored to recycledCount).
    ("Sandbox", ".status.reuseCount"),
];

/// Facets where ours differs from the reference on purpose: (kind, path, facet).
const EXTENSION_FACETS: &[(&str, &str, &str)] = &[
    // The CEL rules tying autoPausePolicy to probes (seed-extensions §2.2) sit on the spec.
    ("Sandbox", ".spec", "x-kubernetes-validations"),
    ("SandboxSet", ".spec", "x-kubernetes-validations"),
    ("SandboxTemplate", ".spec", "x-kubernetes-validations"),
];

/// Printer columns only we have: (kind, column name).
const EXTENSION_COLUMNS: &[(&str, &str)] = &[
    // seed-extensions §7.3: "print column ReuseCount".
    ("Sandbox", "ReuseCount"),
];

/// The facets of a schema node that are compared. Descriptions are not.
const FACETS: &[&str] = &[
    "type",
    "format",
    "enum",
    "default",
    "anyOf",
    "nullable",
    "required",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
];

fn reference_crds() -> BTreeMap<String, (String, Value)> {
    let mut out = BTreeMap::new();
    for path in yaml_files("reference/bases") {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let mut docs = yaml_documents(&path);
        assert_eq!(docs.len(), 1, "{file}: one CRD per file");
        let crd = docs.remove(0);
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_owned();
        out.insert(kind, (file, crd));
    }
    out
}

#[test]
fn reference_kinds_are_implemented_or_known_gaps() {
    let reference: BTreeSet<String> = reference_crds().into_keys().collect();
    let ours: BTreeSet<String> = our_crds().into_keys().collect();
    let gaps: BTreeSet<String> = KNOWN_GAPS.iter().map(|s| s.to_string()).collect();
    let extensions: BTreeSet<String> = EXTENSION_KINDS.iter().map(|s| s.to_string()).collect();

    let implemented: BTreeSet<String> = ours.difference(&extensions).cloned().collect();
    let expected: BTreeSet<String> = implemented.union(&gaps).cloned().collect();
    assert_eq!(reference, expected, "reference kinds vs implemented ∪ KNOWN_GAPS");
    assert!(
        implemented.is_disjoint(&gaps),
        "a known gap is implemented now; drop it from KNOWN_GAPS"
    );
    assert!(
        extensions.iter().all(|k| ours.contains(k) && !reference.contains(k)),
        "EXTENSION_KINDS must be ours only"
    );
}

#[test]
fn reference_file_names_follow_the_plural() {
    for (kind, (file, crd)) in reference_crds() {
        let plural = crd["spec"]["names"]["plural"].as_str().unwrap();
        assert_eq!(file, format!("agents.kruise.io_{plural}.yaml"), "{kind}");
    }
}

#[test]
fn generated_crds_match_the_reference() {
    let ours = our_crds();
    let mut mismatches = Vec::new();
    for (kind, (file, reference)) in reference_crds() {
        if KNOWN_GAPS.contains(&kind.as_str()) {
            continue;
        }
        let Some(ours) = ours.get(&kind) else {
            mismatches.push(format!("{kind}: not generated"));
            continue;
        };
        let mut report = |what: String| mismatches.push(format!("{kind} ({file}): {what}"));
        compare_identity(&kind, &reference, ours, &mut report);
        compare_schema(&kind, root_schema(&reference), root_schema(ours), &mut report);
    }
    assert!(mismatches.is_empty(), "{} mismatches:\n{}", mismatches.len(), mismatches.join("\n"));
}

fn compare_identity(kind: &str, reference: &Value, ours: &Value, report: &mut dyn FnMut(String)) {
    let same = |what: &str, r: &Value, o: &Value, report: &mut dyn FnMut(String)| {
        if r != o {
            report(format!("{what}: reference {r} vs ours {o}"));
        }
    };
    same("apiVersion", &reference["apiVersion"], &ours["apiVersion"], report);
    same("kind", &reference["kind"], &ours["kind"], report);
    same("metadata.name", &reference["metadata"]["name"], &ours["metadata"]["name"], report);
    same("spec.group", &reference["spec"]["group"], &ours["spec"]["group"], report);
    same("spec.scope", &reference["spec"]["scope"], &ours["spec"]["scope"], report);
    for name in ["kind", "listKind", "plural", "singular", "shortNames", "categories"] {
        same(
            &format!("spec.names.{name}"),
            &reference["spec"]["names"][name],
            &ours["spec"]["names"][name],
            report,
        );
    }
    let (rv, ov) = (&reference["spec"]["versions"], &ours["spec"]["versions"]);
    same(
        "number of versions",
        &json!(rv.as_array().map(Vec::len)),
        &json!(ov.as_array().map(Vec::len)),
        report,
    );
    let (rv, ov) = (&rv[0], &ov[0]);
    for field in ["name", "served", "storage", "deprecated", "subresources"] {
        same(&format!("versions[0].{field}"), &rv[field], &ov[field], report);
    }
    // Printer columns: ours without the listed extensions must equal the reference's exactly
    // (order, name, type, jsonPath, format, priority, description).
    let columns = |v: &Value| v["additionalPrinterColumns"].as_array().cloned().unwrap_or_default();
    let reference_columns = columns(rv);
    let our_columns: Vec<Value> = columns(ov)
        .into_iter()
        .filter(|c| !EXTENSION_COLUMNS.contains(&(kind, c["name"].as_str().unwrap_or_default())))
        .collect();
    same("additionalPrinterColumns", &json!(reference_columns), &json!(our_columns), report);
    for (k, name) in EXTENSION_COLUMNS.iter().filter(|(k, _)| *k == kind) {
        if !columns(ov).iter().any(|c| c["name"] == *name) {
            report(format!("extension column {k}/{name} is gone; update EXTENSION_COLUMNS"));
        }
    }
}

/// The compared facets of a schema node; numbers as f64 so `1` and `1.0` agree, `required`
/// sorted.
fn facets(node: &Value) -> BTreeMap<&'static str, Value> {
    FACETS
        .iter()
        .filter_map(|&facet| {
            let mut value = node.get(facet)?.clone();
            if facet == "required"
                && let Some(list) = value.as_array_mut()
            {
                list.sort_by_key(|v| v.to_string());
            }
            Some((facet, numbers_as_f64(value)))
        })
        .collect()
}

fn numbers_as_f64(value: Value) -> Value {
    match value {
        Value::Number(n) => json!(n.as_f64()),
        Value::Array(items) => Value::Array(items.into_iter().map(numbers_as_f64).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, numbers_as_f64(v))).collect())
        }
        other => other,
    }
}

fn collect(schema: &Value) -> BTreeMap<String, BTreeMap<&'static str, Value>> {
    let mut nodes = BTreeMap::new();
    walk_schema(schema, "", &mut |path, node| {
        nodes.insert(path.to_owned(), facets(node));
    });
    nodes
}

fn compare_schema(kind: &str, reference: &Value, ours: &Value, report: &mut dyn FnMut(String)) {
    let reference_nodes = collect(reference);
    let our_nodes = collect(ours);
    for (path, reference_facets) in &reference_nodes {
        let Some(our_facets) = our_nodes.get(path) else {
            report(format!("{path}: missing (reference type {:?})", reference_facets.get("type")));
            continue;
        };
        let keys: BTreeSet<&str> =
            reference_facets.keys().chain(our_facets.keys()).copied().collect();
        for facet in keys {
            let (r, o) = (reference_facets.get(facet), our_facets.get(facet));
            if r == o || EXTENSION_FACETS.contains(&(kind, path.as_str(), facet)) {
                continue;
            }
            report(format!("{path}: {facet}: reference {r:?} vs ours {o:?}"));
        }
    }
    for path in our_nodes.keys().filter(|p| !reference_nodes.contains_key(*p)) {
        let is_extension =
            EXTENSION_PATHS.iter().any(|(k, prefix)| *k == kind && path.starts_with(prefix));
        if !is_extension {
            report(format!("{path}: only in ours (not an EXTENSION_PATHS entry)"));
        }
    }
    for (k, prefix) in EXTENSION_PATHS.iter().filter(|(k, _)| *k == kind) {
        if !our_nodes.contains_key(*prefix) {
            report(format!("extension path {k}{prefix} is gone; update EXTENSION_PATHS"));
        }
        if reference_nodes.contains_key(*prefix) {
            report(format!("{prefix} is in the reference now; drop it from EXTENSION_PATHS"));
        }
    }
}

/// PoolAutoscaler has no reference CRD; check its identity against seed-extensions §1.2.
#[test]
fn pool_autoscaler_identity_matches_the_design() {
    let crd = &our_crds()["PoolAutoscaler"];
    assert_eq!(crd["metadata"]["name"], "poolautoscalers.agents.kruise.io");
    assert_eq!(crd["spec"]["group"], "agents.kruise.io");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(
        crd["spec"]["names"],
        json!({
            "kind": "PoolAutoscaler",
            "listKind": "PoolAutoscalerList",
            "plural": "poolautoscalers",
            "singular": "poolautoscaler",
            "shortNames": ["pas"],
        })
    );
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert_eq!(version["subresources"], json!({"status": {}}));
    let column = |name: &str, type_: &str, path: &str| json!({"name": name, "type": type_, "jsonPath": path});
    assert_eq!(
        version["additionalPrinterColumns"],
        json!([
            column("Target", "string", ".spec.scaleTargetRef.name"),
            column("Min", "integer", ".spec.minReplicas"),
            column("Max", "integer", ".spec.maxReplicas"),
            column("Current", "integer", ".status.currentReplicas"),
            column("Desired", "integer", ".status.desiredReplicas"),
            column("Available", "integer", ".status.currentCapacity.available"),
            column("Suspended", "boolean", ".status.suspended"),
            column("Age", "date", ".metadata.creationTimestamp"),
        ])
    );
    let schema = root_schema(crd);
    assert_eq!(schema["properties"]["spec"]["required"], json!(["maxReplicas", "scaleTargetRef"]));
    assert_eq!(
        schema["properties"]["spec"]["properties"]["cronPolicies"]["x-kubernetes-list-map-keys"],
        json!(["name"])
    );
}

/// Generic structural rules every generated CRD must follow, extensions included.
#[test]
fn generated_schemas_are_structural_and_clean() {
    let mut problems = Vec::new();
    for (kind, crd) in our_crds() {
        walk_schema(root_schema(&crd), "", &mut |path, node| {
            if node.get("nullable").is_some() {
                problems.push(format!("{kind}{path}: nullable"));
            }
            if let Some(values) = node.get("enum").and_then(Value::as_array)
                && values.iter().any(Value::is_null)
            {
                problems.push(format!("{kind}{path}: null in enum"));
            }
            let typed = node.get("type").is_some()
                || node.get("x-kubernetes-int-or-string") == Some(&json!(true))
                || node.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
            if !typed {
                problems.push(format!("{kind}{path}: no type"));
            }
            // Doc comments become descriptions; rustdoc link syntax would show in kubectl explain.
            if node.get("description").and_then(Value::as_str).is_some_and(|d| d.contains("[`")) {
                problems.push(format!("{kind}{path}: rustdoc link in description"));
            }
            for keyword in ["$ref", "oneOf", "allOf", "not", "definitions", "title"] {
                if node.get(keyword).is_some() && !path.is_empty() {
                    problems.push(format!("{kind}{path}: {keyword}"));
                }
            }
        });
        if root_schema(&crd).get("title").is_some() {
            problems.push(format!("{kind}: root title"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
