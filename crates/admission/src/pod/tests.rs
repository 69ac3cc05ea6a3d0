//! Table tests: one template per rule, with the API server's exact messages.

use serde_json::{Value, json};

use super::*;

fn errors(template: Value) -> Vec<String> {
    validate_template(&template, "spec.template", &[])
        .iter()
        .map(|e| format!("{}: {}", e.field, e.body()))
        .collect()
}

#[test]
fn a_minimal_template_is_valid() {
    assert_eq!(
        errors(json!({"spec": {"containers": [{"name": "main", "image": "busybox"}]}})),
        Vec::<String>::new()
    );
}
