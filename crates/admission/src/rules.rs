//! A CRD's `x-kubernetes-validations` rules (CEL) applied to an object as the API server
//! applies them: each rule sees the value at its schema node as `self` (and, on an update,
//! the stored object's value there as `oldSelf`), and a rule that does not hold is a field
//! error at that node worded as the API server words it:
//! `spec: Invalid value: "object": minReplicas must be less than or equal to maxReplicas`.
//!
//! - Rules on absent or null values are not evaluated.
//! - A rule that reads `oldSelf` (a transition rule) is evaluated only on an update, and only
//!   where the stored object has a value at the same place: object fields and map entries
//!   correlate by key, items of `x-kubernetes-list-type: map` lists by their map keys, other
//!   list items not at all. With `optionalOldSelf: true` it runs on creates too, `oldSelf`
//!   then being `optional.none()` (and an optional wrapping the old value on updates).
//! - Ratcheting: on an update, a rule that does not read `oldSelf` is not evaluated on a value
//!   the update leaves unchanged, so an object stored before a rule existed can still be
//!   updated elsewhere.

use std::collections::BTreeMap;

use oka_cel::{Program, Value as Cel};
use serde_json::Value;

use crate::errors::{FieldError, FieldErrorKind};

/// The longest message a `messageExpression` may produce (the API server's
/// `MaxEvaluatedMessageExpressionSizeBytes`); a longer one falls back to the rule's message.
const MAX_MESSAGE_EXPRESSION_BYTES: usize = 5 * 1024;

/// The field error a failed rule reports (its `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    Invalid,
    Forbidden,
    Required,
    Duplicate,
}

/// One rule, parsed once.
#[derive(Debug, Clone)]
struct Rule {
    /// The rule as the CRD writes it, for default messages.
    source: String,
    program: Result<Program, oka_cel::ParseError>,
    message: Option<String>,
    message_expression: Option<Program>,
    reason: Reason,
    /// `fieldPath`, in the API server's path syntax (`spec.a[key]`), relative to the node.
    field_path: Option<String>,
    /// Whether the rule reads `oldSelf`.
    transition: bool,
    /// `optionalOldSelf`: a transition rule also runs where there is no old value, with
    /// `oldSelf` an optional (`optional.none()` then).
    optional_old_self: bool,
}

/// The rules of a schema and of its descendants; subtrees without rules are left out, so
/// objects are only walked where a rule may apply.
#[derive(Debug, Clone, Default)]
pub(crate) struct RuleTree {
    rules: Vec<Rule>,
    /// The node's schema when it has rules: it types the values the rules see.
    schema: Option<Value>,
    /// The schema's `type`, which failed rules show as the value (`Invalid value: "object"`).
    type_name: String,
    properties: BTreeMap<String, RuleTree>,
    items: Option<Box<RuleTree>>,
    additional: Option<Box<RuleTree>>,
    /// `x-kubernetes-list-map-keys` of a `map` list: how old items correlate with new ones.
    list_map_keys: Option<Vec<String>>,
}

impl RuleTree {
    /// The rules of `schema`, compiled; `None` when neither it nor its descendants have any.
    pub(crate) fn new(schema: &Value) -> Option<RuleTree> {
        let rules: Vec<Rule> = schema
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Rule::new)
            .collect();
        let properties: BTreeMap<String, RuleTree> = schema
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(key, child)| Some((key.clone(), RuleTree::new(child)?)))
            .collect();
        let items = schema.get("items").and_then(RuleTree::new).map(Box::new);
        let additional = schema
            .get("additionalProperties")
            .filter(|a| a.is_object())
            .and_then(RuleTree::new)
            .map(Box::new);
        if rules.is_empty() && properties.is_empty() && items.is_none() && additional.is_none() {
            return None;
        }
        let is_map_list =
            schema.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map");
        let list_map_keys = is_map_list.then(|| {
            schema
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        });
        Some(RuleTree {
            schema: (!rules.is_empty()).then(|| schema.clone()),
            rules,
            type_name: schema.get("type").and_then(Value::as_str).unwrap_or_default().to_owned(),
            properties,
            items,
            additional,
            list_map_keys,
        })
    }

    /// Records every rule `value` (at `path`) breaks; `old` is the stored value at the same
    /// place on an update. The root's `metadata` is `ObjectMeta`, which has no rules.
    pub(crate) fn validate(
        &self,
        value: &Value,
        old: Option<&Value>,
        path: &str,
        errors: &mut Vec<FieldError>,
    ) {
        if value.is_null() {
            return;
        }
        let old = old.filter(|o| !o.is_null());
        if !self.rules.is_empty() {
            self.check_rules(value, old, path, errors);
        }
        match value {
            Value::Object(map) => {
                for (key, child) in &self.properties {
                    if path.is_empty() && key == "metadata" {
                        continue;
                    }
                    if let Some(field) = map.get(key) {
                        let old_field = old.and_then(|o| o.get(key));
                        child.validate(field, old_field, &join(path, key), errors);
                    }
                }
                if let Some(child) = &self.additional {
                    for (key, field) in map {
                        let old_field = old.and_then(|o| o.get(key));
                        child.validate(field, old_field, &format!("{path}[{key}]"), errors);
                    }
                }
            }
            Value::Array(items) => {
                if let Some(child) = &self.items {
                    for (i, item) in items.iter().enumerate() {
                        let old_item = self.old_item(item, old);
                        child.validate(item, old_item, &format!("{path}[{i}]"), errors);
                    }
                }
            }
            _ => {}
        }
    }

    /// The stored item `item` corresponds to: only `map` lists correlate, by their keys.
    fn old_item<'o>(&self, item: &Value, old: Option<&'o Value>) -> Option<&'o Value> {
        let keys = self.list_map_keys.as_ref()?;
        old?.as_array()?
            .iter()
            .find(|candidate| keys.iter().all(|k| candidate.get(k) == item.get(k)))
    }

    fn check_rules(
        &self,
        value: &Value,
        old: Option<&Value>,
        path: &str,
        errors: &mut Vec<FieldError>,
    ) {
        let unchanged = old == Some(value);
        let applicable: Vec<&Rule> =
            self.rules
                .iter()
                .filter(|r| {
                    if r.transition { old.is_some() || r.optional_old_self } else { !unchanged }
                })
                .collect();
        if applicable.is_empty() {
            return;
        }
        let schema = self.schema.as_ref().unwrap_or(&Value::Null);
        let this = typed(value, schema);
        let old = old.map(|o| typed(o, schema));
        let shown = Value::from(self.type_name.as_str());
        let at = path_or_root(path);
        for rule in applicable {
            let mut variables = vec![("self", this.clone())];
            if rule.optional_old_self {
                let optional = old.clone().map(std::sync::Arc::new);
                variables.push(("oldSelf", Cel::Optional(optional)));
            } else if let Some(old) = &old {
                variables.push(("oldSelf", old.clone()));
            }
            let program = match &rule.program {
                Ok(program) => program,
                Err(e) => {
                    let detail = format!("compilation failed: {e}, for rule: {}", rule.source);
                    errors.push(FieldError::invalid(at, shown.clone(), detail));
                    continue;
                }
            };
            match program.evaluate(&variables) {
                Ok(Cel::Bool(true)) => {}
                Ok(Cel::Bool(false)) => errors.push(self.failure(rule, &variables, path)),
                Ok(other) => errors.push(FieldError::invalid(
                    at,
                    shown.clone(),
                    format!(
                        "rule evaluated to {} instead of bool, evaluating rule: {}",
                        other.type_name(),
                        rule.error_string()
                    ),
                )),
                // cel-go's runtime error says no more than this, so neither does the message.
                Err(oka_cel::EvalError::NoSuchOverload(_)) => errors.push(FieldError::invalid(
                    at,
                    shown.clone(),
                    format!(
                        "'no such overload': call arguments did not match a supported operator, function or macro signature for rule: {}",
                        rule.error_string()
                    ),
                )),
                Err(e) => errors.push(FieldError::invalid(
                    at,
                    shown.clone(),
                    format!("{e} evaluating rule: {}", rule.error_string()),
                )),
            }
        }
    }

    /// The error for a rule that evaluated to false.
    fn failure(&self, rule: &Rule, variables: &[(&str, Cel)], path: &str) -> FieldError {
        let field = match &rule.field_path {
            Some(relative) if relative.starts_with('[') => format!("{path}{relative}"),
            Some(relative) => join(path, relative),
            None => path_or_root(path).to_owned(),
        };
        let detail = rule
            .message_expression
            .as_ref()
            .and_then(|m| evaluated_message(m, variables))
            .unwrap_or_else(|| rule.message_or_default());
        let shown = Value::from(self.type_name.as_str());
        match rule.reason {
            Reason::Invalid => FieldError::invalid(&field, shown, detail),
            Reason::Forbidden => FieldError::forbidden(&field, detail),
            Reason::Required => FieldError::required(&field, detail),
            Reason::Duplicate => FieldError::new(&field, FieldErrorKind::Duplicate, shown, ""),
        }
    }
}

/// `value` as the CEL value its schema declares, as the API server types it: `number` is a
/// `double` even when written without a fraction, strings of `format: duration` are
/// durations and of `format: date` or `date-time` timestamps. Values the schema does not
/// describe (`x-kubernetes-preserve-unknown-fields`) are typed from their JSON.
fn typed(value: &Value, schema: &Value) -> Cel {
    let declared = schema.get("type").and_then(Value::as_str);
    match value {
        Value::Object(map) => {
            let properties = schema.get("properties");
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let fields = map.iter().map(|(key, field)| {
                let field_schema =
                    properties.and_then(|p| p.get(key)).or(additional).unwrap_or(&Value::Null);
                (oka_cel::Key::String(key.as_str().into()), typed(field, field_schema))
            });
            Cel::Map(std::sync::Arc::new(fields.collect()))
        }
        Value::Array(items) => {
            let item_schema = schema.get("items").unwrap_or(&Value::Null);
            Cel::List(std::sync::Arc::new(items.iter().map(|i| typed(i, item_schema)).collect()))
        }
        Value::Number(n) if declared == Some("number") => {
            Cel::Double(n.as_f64().unwrap_or(f64::NAN))
        }
        Value::String(text) if declared == Some("string") => {
            let format = schema.get("format").and_then(Value::as_str);
            let converted = match format {
                Some("duration") => oka_cel::parse_duration(text).ok().map(Cel::Duration),
                Some("date-time") => text.parse::<jiff::Timestamp>().ok().map(Cel::Timestamp),
                Some("date") => text
                    .parse::<jiff::civil::Date>()
                    .ok()
                    .and_then(|d| d.to_zoned(jiff::tz::TimeZone::UTC).ok())
                    .map(|z| Cel::Timestamp(z.timestamp())),
                _ => None,
            };
            converted.unwrap_or_else(|| Cel::from_json(value))
        }
        _ => Cel::from_json(value),
    }
}

/// A `messageExpression`'s message; `None` (the rule's message is used instead) when it fails,
/// is not a string, or is empty, multi-line or too long once trimmed.
fn evaluated_message(program: &Program, variables: &[(&str, Cel)]) -> Option<String> {
    match program.evaluate(variables) {
        Ok(Cel::String(text)) => {
            let trimmed = text.trim();
            let fits = !trimmed.is_empty()
                && !trimmed.contains(['\n', '\r'])
                && trimmed.len() <= MAX_MESSAGE_EXPRESSION_BYTES;
            fits.then(|| trimmed.to_owned())
        }
        _ => None,
    }
}

impl Rule {
    /// The rule of one `x-kubernetes-validations` entry; `None` without a `rule`.
    fn new(entry: &Value) -> Option<Rule> {
        let source = entry.get("rule").and_then(Value::as_str)?.to_owned();
        let text = |key: &str| entry.get(key).and_then(Value::as_str).map(str::to_owned);
        let program = Program::compile(&source);
        let transition = program.as_ref().is_ok_and(|p| p.references("oldSelf"));
        let reason = match text("reason").as_deref() {
            Some("FieldValueForbidden") => Reason::Forbidden,
            Some("FieldValueRequired") => Reason::Required,
            Some("FieldValueDuplicate") => Reason::Duplicate,
            _ => Reason::Invalid,
        };
        Some(Rule {
            program,
            message: text("message").filter(|m| !m.trim().is_empty()),
            message_expression: text("messageExpression").and_then(|m| Program::compile(&m).ok()),
            reason,
            field_path: text("fieldPath").and_then(|p| normalize_field_path(&p)),
            transition,
            optional_old_self: entry.get("optionalOldSelf").and_then(Value::as_bool) == Some(true),
            source,
        })
    }

    /// The API server's `ruleErrorString`: the message if there is one, else the rule.
    fn error_string(&self) -> String {
        match &self.message {
            Some(message) => message.trim().to_owned(),
            None => self.source.trim().to_owned(),
        }
    }

    /// The API server's `ruleMessageOrDefault`.
    fn message_or_default(&self) -> String {
        match &self.message {
            Some(message) => message.trim().to_owned(),
            None => format!("failed rule: {}", self.source.trim()),
        }
    }
}

/// A node's path as Go's `field.Path` prints it: the root, a nil path, is `<nil>`.
fn path_or_root(path: &str) -> &str {
    if path.is_empty() { "<nil>" } else { path }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") }
}

/// A rule's `fieldPath` (`.spec.a`, `.a['b.c']`) in the API server's path syntax
/// (`spec.a`, `a[b.c]`); `None` for one that is not a field path.
fn normalize_field_path(text: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let len = after.find(['.', '[']).unwrap_or(after.len());
            if len == 0 {
                return None;
            }
            out = join(&out, &after[..len]);
            rest = &after[len..];
        } else if let Some(after) = rest.strip_prefix("['") {
            let end = after.find("']")?;
            out.push_str(&format!("[{}]", &after[..end]));
            rest = &after[end + 2..];
        } else {
            return None;
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Every rule of every schema below `schema`.
    fn all_rules(tree: &RuleTree, into: &mut Vec<Rule>) {
        into.extend(tree.rules.iter().cloned());
        for child in tree.properties.values() {
            all_rules(child, into);
        }
        for child in tree.items.iter().chain(&tree.additional) {
            all_rules(child, into);
        }
    }

    #[test]
    fn every_rule_of_the_crds_compiles() {
        let mut rules = Vec::new();
        for crd in oka_api::crds() {
            for version in &crd.spec.versions {
                let schema = version.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref());
                let schema = serde_json::to_value(schema).unwrap();
                if let Some(tree) = RuleTree::new(&schema) {
                    all_rules(&tree, &mut rules);
                }
            }
        }
        // 19 of the sandbox kinds; 9 of each traffic policy kind (the spec's, the peer rule in
        // four peer lists, the two port rules in two rules lists).
        assert_eq!(rules.len(), 19 + 2 * 9, "rules of the CRDs, counting each copy");
        for rule in rules {
            assert!(rule.program.is_ok(), "{}: {:?}", rule.source, rule.program);
        }
    }

    fn errors_of(schema: Value, value: Value, old: Option<Value>) -> Vec<String> {
        let tree = RuleTree::new(&schema).unwrap();
        let mut errors = Vec::new();
        tree.validate(&value, old.as_ref(), "spec", &mut errors);
        errors.iter().map(|e| format!("{}: {}", e.field, e.body())).collect()
    }

    #[test]
    fn rules_honour_message_expression_reason_and_field_path() {
        let schema = json!({
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {"type": "string", "x-kubernetes-validations": [{"rule": "self != 'bad'"}]},
                },
                "labels": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "string",
                        "x-kubernetes-validations": [{"rule": "size(self) < 4", "reason": "FieldValueForbidden", "message": "too long "}],
                    },
                },
            },
            "x-kubernetes-validations": [
                {"rule": "self.n > 0", "messageExpression": "'n must be positive, not ' + string(self.n)", "fieldPath": ".n"},
                {"rule": "has(self.name)", "reason": "FieldValueRequired", "message": "name is required", "fieldPath": ".name"},
                {"rule": "self.n != 2", "reason": "FieldValueDuplicate"},
                {"rule": "self.n < 10", "messageExpression": "''"},
                {"rule": "self.missing == 1"},
                {"rule": "self.n + 'a' == 1"},
            ],
        });
        let value = json!({"n": 0, "items": ["ok", "bad"], "labels": {"a": "long!", "b": "ok"}});
        assert_eq!(
            errors_of(schema.clone(), value, None),
            [
                "spec.n: Invalid value: \"object\": n must be positive, not 0",
                "spec.name: Required value: name is required",
                "spec: Invalid value: \"object\": no such key: missing evaluating rule: self.missing == 1",
                "spec: Invalid value: \"object\": 'no such overload': call arguments did not match a supported operator, function or macro signature for rule: self.n + 'a' == 1",
                "spec.items[1]: Invalid value: \"string\": failed rule: self != 'bad'",
                "spec.labels[a]: Forbidden: too long",
            ]
        );
        let value = json!({"n": 12, "name": "x", "missing": 1});
        assert_eq!(
            errors_of(schema.clone(), value, None),
            [
                "spec: Invalid value: \"object\": failed rule: self.n < 10",
                "spec: Invalid value: \"object\": 'no such overload': call arguments did not match a supported operator, function or macro signature for rule: self.n + 'a' == 1"
            ]
        );
        let value = json!({"n": 2, "name": "x", "missing": 1});
        assert_eq!(errors_of(schema, value, None)[0], "spec: Duplicate value: \"object\"");
    }

    #[test]
    fn values_are_typed_by_their_schema() {
        let schema = json!({
            "type": "object",
            "properties": {
                "ratio": {"type": "number"},
                "timeout": {"type": "string", "format": "duration"},
                "at": {"type": "string", "format": "date-time"},
                "day": {"type": "string", "format": "date"},
            },
            "x-kubernetes-validations": [
                {"rule": "self.ratio * 2.0 == 2.0"},
                {"rule": "self.timeout > duration('1m')"},
                {"rule": "self.at < self.day"},
            ],
        });
        let value = json!({"ratio": 1, "timeout": "90s", "at": "2024-01-01T10:00:00Z", "day": "2024-01-02"});
        assert_eq!(errors_of(schema, value, None), Vec::<String>::new());
    }

    #[test]
    fn optional_old_self_rules_run_on_creates_too() {
        let schema = json!({
            "type": "string",
            "x-kubernetes-validations": [{
                "rule": "oldSelf.hasValue() ? self == oldSelf.value() : self.startsWith('v')",
                "optionalOldSelf": true,
                "message": "must start with v, then never change",
            }],
        });
        let refused = ["spec: Invalid value: \"string\": must start with v, then never change"];
        assert_eq!(errors_of(schema.clone(), json!("x1"), None), refused);
        assert_eq!(errors_of(schema.clone(), json!("v1"), None), Vec::<String>::new());
        assert_eq!(errors_of(schema.clone(), json!("v2"), Some(json!("v1"))), refused);
        assert_eq!(errors_of(schema, json!("x1"), Some(json!("x1"))), Vec::<String>::new());
    }

    #[test]
    fn a_rule_on_the_root_reports_the_nil_path() {
        let schema =
            json!({"type": "object", "x-kubernetes-validations": [{"rule": "has(self.spec)"}]});
        let tree = RuleTree::new(&schema).unwrap();
        let mut errors = Vec::new();
        tree.validate(&json!({"kind": "X"}), None, "", &mut errors);
        assert_eq!(errors[0].field, "<nil>");
        assert_eq!(errors[0].body(), "Invalid value: \"object\": failed rule: has(self.spec)");
    }

    #[test]
    fn transition_rules_correlate_map_list_items_by_key() {
        let schema = json!({
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "items": {
                "type": "object",
                "x-kubernetes-validations": [{"rule": "self.size == oldSelf.size", "message": "size is immutable"}],
            },
        });
        let old = json!([{"name": "a", "size": 1}, {"name": "b", "size": 2}]);
        let new =
            json!([{"name": "b", "size": 3}, {"name": "c", "size": 9}, {"name": "a", "size": 1}]);
        assert_eq!(
            errors_of(schema, new, Some(old)),
            ["spec[0]: Invalid value: \"object\": size is immutable"]
        );
    }

    #[test]
    fn field_paths_normalize_to_the_api_servers_syntax() {
        assert_eq!(normalize_field_path(".spec.replicas").as_deref(), Some("spec.replicas"));
        assert_eq!(normalize_field_path(".labels['a.b/c']").as_deref(), Some("labels[a.b/c]"));
        assert_eq!(normalize_field_path("spec"), None);
        assert_eq!(normalize_field_path(".a..b"), None);
    }
}
