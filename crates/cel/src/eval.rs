//! Walks an expression over variables' values.

use std::cmp::Ordering;
use std::sync::Arc;

use crate::ast::{BinaryOp, Expr, MacroKind, UnaryOp};
use crate::error::EvalError;
use crate::functions;
use crate::regexes::Regexes;
use crate::value::{Key, Value, lookup};

/// The variables in scope: the caller's, then each comprehension's, innermost last.
pub(crate) struct Evaluator<'e> {
    scopes: Vec<(&'e str, Value)>,
    regexes: &'e Regexes,
    /// How many more expression nodes may be evaluated.
    budget: u64,
}

impl<'e> Evaluator<'e> {
    pub(crate) fn new(variables: &[(&'e str, Value)], regexes: &'e Regexes, budget: u64) -> Self {
        Evaluator { scopes: variables.to_vec(), regexes, budget }
    }

    pub(crate) fn eval(&mut self, expr: &'e Expr) -> Result<Value, EvalError> {
        self.budget = self.budget.checked_sub(1).ok_or(EvalError::CostLimitExceeded)?;
        match expr {
            Expr::Literal(value) => Ok(value.clone()),
            Expr::Ident(name) => self
                .lookup(name)
                .or_else(|| functions::type_named(name))
                .ok_or_else(|| EvalError::UndeclaredReference(name.clone())),
            Expr::List(items) => {
                let values = items.iter().map(|e| self.eval(e)).collect::<Result<_, _>>()?;
                Ok(Value::List(Arc::new(values)))
            }
            Expr::Map(entries) => {
                let mut map = std::collections::BTreeMap::new();
                for (k, v) in entries {
                    let key = self.eval(k)?;
                    let key = Key::from_value(&key).ok_or_else(|| {
                        EvalError::InvalidArgument(format!(
                            "unsupported key type: {}",
                            key.type_name()
                        ))
                    })?;
                    let value = self.eval(v)?;
                    if map.insert(key.clone(), value).is_some() {
                        return Err(EvalError::InvalidArgument(format!(
                            "duplicate map key: {key}"
                        )));
                    }
                }
                Ok(Value::Map(Arc::new(map)))
            }
            Expr::Select(operand, field) => match self.eval(operand)? {
                // Inside an optional chain (`a.?b.c`), selection keeps the optional.
                Value::Optional(None) => Ok(Value::Optional(None)),
                Value::Optional(Some(inner)) => {
                    let found = select(&inner, field)?;
                    let found = found.ok_or_else(|| EvalError::NoSuchKey(field.clone()))?;
                    Ok(Value::Optional(Some(Arc::new(found))))
                }
                operand => {
                    select(&operand, field)?.ok_or_else(|| EvalError::NoSuchKey(field.clone()))
                }
            },
            Expr::OptionalSelect(operand, field) => match self.eval(operand)? {
                Value::Optional(None) => Ok(Value::Optional(None)),
                Value::Optional(Some(inner)) => Ok(optional(select(&inner, field)?)),
                operand => Ok(optional(select(&operand, field)?)),
            },
            Expr::Has(operand, field) => {
                let operand = self.eval(operand)?;
                Ok(Value::Bool(select(&operand, field)?.is_some()))
            }
            Expr::Index(operand, index) => {
                let operand = self.eval(operand)?;
                let index = self.eval(index)?;
                match operand {
                    Value::Optional(None) => Ok(Value::Optional(None)),
                    Value::Optional(Some(inner)) => {
                        Ok(Value::Optional(Some(Arc::new(self::index(&inner, &index)?))))
                    }
                    operand => self::index(&operand, &index),
                }
            }
            Expr::OptionalIndex(operand, index) => {
                let operand = match self.eval(operand)? {
                    Value::Optional(None) => return Ok(Value::Optional(None)),
                    Value::Optional(Some(inner)) => (*inner).clone(),
                    operand => operand,
                };
                let index = self.eval(index)?;
                match self::index(&operand, &index) {
                    Ok(found) => Ok(Value::Optional(Some(Arc::new(found)))),
                    Err(EvalError::NoSuchKey(_) | EvalError::IndexOutOfRange { .. }) => {
                        Ok(Value::Optional(None))
                    }
                    Err(e) => Err(e),
                }
            }
            Expr::Call { target, function, args } => {
                if let Some(namespace) = self.namespace(target.as_deref()) {
                    // `sets.contains(a, b)`, `optional.of(x)`: a namespaced global function.
                    let args = args.iter().map(|e| self.eval(e)).collect::<Result<Vec<_>, _>>()?;
                    return functions::call(
                        &format!("{namespace}.{function}"),
                        None,
                        &args,
                        self.regexes,
                    );
                }
                let target = target.as_ref().map(|t| self.eval(t)).transpose()?;
                let args = args.iter().map(|e| self.eval(e)).collect::<Result<Vec<_>, _>>()?;
                functions::call(function, target.as_ref(), &args, self.regexes)
            }
            Expr::Unary(op, operand) => {
                let operand = self.eval(operand)?;
                unary(*op, &operand)
            }
            Expr::Binary(op, left, right) => {
                let left = self.eval(left)?;
                let right = self.eval(right)?;
                binary(*op, &left, &right)
            }
            Expr::And(left, right) => self.logical(left, right, false, "_&&_"),
            Expr::Or(left, right) => self.logical(left, right, true, "_||_"),
            Expr::Conditional(condition, then, otherwise) => match self.eval(condition)? {
                Value::Bool(true) => self.eval(then),
                Value::Bool(false) => self.eval(otherwise),
                other => Err(EvalError::overload("_?_:_", &[other.type_name()])),
            },
            Expr::Comprehension { kind, range, variable, second, filter, body } => {
                let range = self.eval(range)?;
                let pairs = second.is_some();
                // Each element's variables: a list's element (or index and element), a map's
                // key (or key and value).
                let items: Vec<(Value, Value)> = match &range {
                    Value::List(items) => items
                        .iter()
                        .enumerate()
                        .map(|(i, v)| match pairs {
                            true => (Value::Int(i64::try_from(i).unwrap_or(i64::MAX)), v.clone()),
                            false => (v.clone(), Value::Null),
                        })
                        .collect(),
                    Value::Map(map) => map
                        .iter()
                        .map(|(k, v)| (k.to_value(), if pairs { v.clone() } else { Value::Null }))
                        .collect(),
                    other => {
                        return Err(EvalError::overload(macro_name(*kind), &[other.type_name()]));
                    }
                };
                let variables = (variable.as_str(), second.as_deref());
                self.comprehension(*kind, items, variables, filter.as_deref(), body)
            }
        }
    }

    /// The function namespace a call's target names (`sets` in `sets.contains(a, b)`), unless
    /// a variable of that name hides it.
    fn namespace(&self, target: Option<&'e Expr>) -> Option<&'e str> {
        match target {
            Some(Expr::Ident(name))
                if functions::NAMESPACES.contains(&name.as_str())
                    && self.lookup(name).is_none() =>
            {
                Some(name)
            }
            _ => None,
        }
    }

    /// The innermost variable named `name`.
    fn lookup(&self, name: &str) -> Option<Value> {
        self.scopes.iter().rev().find(|(n, _)| *n == name).map(|(_, v)| v.clone())
    }

    /// `&&` (`decisive` false) or `||` (`decisive` true): the decisive value on either side
    /// wins even over an error on the other, as CEL's commutative logic operators do.
    fn logical(
        &mut self,
        left: &'e Expr,
        right: &'e Expr,
        decisive: bool,
        name: &str,
    ) -> Result<Value, EvalError> {
        let left = self.eval(left);
        if matches!(left, Ok(Value::Bool(b)) if b == decisive) {
            return Ok(Value::Bool(decisive));
        }
        let right = self.eval(right);
        if matches!(right, Ok(Value::Bool(b)) if b == decisive) {
            return Ok(Value::Bool(decisive));
        }
        match (left?, right?) {
            (Value::Bool(_), Value::Bool(_)) => Ok(Value::Bool(!decisive)),
            (a, b) => Err(EvalError::overload(name, &[a.type_name(), b.type_name()])),
        }
    }

    fn comprehension(
        &mut self,
        kind: MacroKind,
        items: Vec<(Value, Value)>,
        (variable, second): (&'e str, Option<&'e str>),
        filter: Option<&'e Expr>,
        body: &'e Expr,
    ) -> Result<Value, EvalError> {
        let mut first_error = None;
        let mut matched = 0usize;
        let mut output = Vec::new();
        let mut output_map = std::collections::BTreeMap::new();
        for (first, value) in items {
            let depth = self.scopes.len();
            self.scopes.push((variable, first.clone()));
            if let Some(second) = second {
                self.scopes.push((second, value));
            }
            let outcome = self.element(kind, filter, body);
            self.scopes.truncate(depth);
            match (kind, outcome) {
                (MacroKind::All, Ok(Step::Verdict(false))) => return Ok(Value::Bool(false)),
                (MacroKind::Exists, Ok(Step::Verdict(true))) => return Ok(Value::Bool(true)),
                (MacroKind::All | MacroKind::Exists, Ok(_)) => {}
                (MacroKind::All | MacroKind::Exists, Err(e)) => {
                    first_error.get_or_insert(e);
                }
                (_, Err(e)) => return Err(e),
                (MacroKind::ExistsOne, Ok(Step::Verdict(true))) => matched += 1,
                (MacroKind::Filter, Ok(Step::Verdict(true))) => output.push(first),
                (MacroKind::Map | MacroKind::TransformList, Ok(Step::Output(v))) => output.push(v),
                (MacroKind::TransformMap, Ok(Step::Output(v))) => {
                    if let Some(key) = Key::from_value(&first) {
                        output_map.insert(key, v);
                    }
                }
                (_, Ok(_)) => {}
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok(match kind {
            MacroKind::All => Value::Bool(true),
            MacroKind::Exists => Value::Bool(false),
            MacroKind::ExistsOne => Value::Bool(matched == 1),
            MacroKind::Map | MacroKind::Filter | MacroKind::TransformList => {
                Value::List(Arc::new(output))
            }
            MacroKind::TransformMap => Value::Map(Arc::new(output_map)),
        })
    }

    /// One element of a comprehension, its variables in scope: the predicate's verdict for
    /// the boolean macros and `filter`; the transform's value (unless the filter skips it)
    /// for the others.
    fn element(
        &mut self,
        kind: MacroKind,
        filter: Option<&'e Expr>,
        body: &'e Expr,
    ) -> Result<Step, EvalError> {
        let verdict = |this: &mut Self, predicate: &'e Expr| match this.eval(predicate)? {
            Value::Bool(b) => Ok(b),
            other => Err(EvalError::overload(macro_name(kind), &[other.type_name()])),
        };
        match kind {
            MacroKind::All | MacroKind::Exists | MacroKind::ExistsOne | MacroKind::Filter => {
                verdict(self, body).map(Step::Verdict)
            }
            MacroKind::Map | MacroKind::TransformList | MacroKind::TransformMap => {
                if let Some(filter) = filter
                    && !verdict(self, filter)?
                {
                    return Ok(Step::Skip);
                }
                self.eval(body).map(Step::Output)
            }
        }
    }
}

/// What one element of a comprehension gave.
enum Step {
    /// A predicate's value.
    Verdict(bool),
    /// Nothing: the filter left the element out.
    Skip,
    /// A transform's value.
    Output(Value),
}

/// `found` as an optional.
fn optional(found: Option<Value>) -> Value {
    Value::Optional(found.map(Arc::new))
}

fn macro_name(kind: MacroKind) -> &'static str {
    match kind {
        MacroKind::All => "all",
        MacroKind::Exists => "exists",
        MacroKind::ExistsOne => "exists_one",
        MacroKind::Map => "map",
        MacroKind::Filter => "filter",
        MacroKind::TransformList => "transformList",
        MacroKind::TransformMap => "transformMap",
    }
}

/// The field `field` of a map, `None` when absent. Kubernetes escapes property names that are
/// not CEL identifiers (`__dash__`, `__dot__`, `__slash__`, `__underscores__`, `__in__`), so
/// a name not found as written is looked up unescaped.
fn select(operand: &Value, field: &str) -> Result<Option<Value>, EvalError> {
    let Value::Map(map) = operand else {
        return Err(EvalError::InvalidArgument(format!(
            "type '{}' does not support field selection",
            operand.type_name()
        )));
    };
    let found = map.get(&Key::String(Arc::from(field))).or_else(|| {
        let unescaped = unescape_property(field)?;
        map.get(&Key::String(Arc::from(unescaped.as_str())))
    });
    Ok(found.cloned())
}

/// A Kubernetes-escaped property name's original, if `name` is escaped.
fn unescape_property(name: &str) -> Option<String> {
    if !name.contains("__") {
        return None;
    }
    if let Some(word) = name.strip_prefix("__").and_then(|n| n.strip_suffix("__"))
        && crate::RESERVED_PROPERTY_NAMES.contains(&word)
    {
        return Some(word.to_owned());
    }
    let mut out = String::new();
    let mut rest = name;
    while !rest.is_empty() {
        let escapes =
            [("__underscores__", "__"), ("__dot__", "."), ("__dash__", "-"), ("__slash__", "/")];
        if let Some((escape, plain)) = escapes.iter().find(|(e, _)| rest.starts_with(e)) {
            out.push_str(plain);
            rest = &rest[escape.len()..];
        } else if let Some(c) = rest.chars().next() {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    (out != name).then_some(out)
}

fn index(operand: &Value, index: &Value) -> Result<Value, EvalError> {
    match (operand, index) {
        (Value::List(items), Value::Int(_) | Value::Uint(_) | Value::Double(_)) => {
            let position = match index {
                Value::Int(i) => *i,
                Value::Uint(u) => i64::try_from(*u).unwrap_or(i64::MAX),
                Value::Double(d) if d.fract() == 0.0 && d.abs() < 9.2e18 => *d as i64,
                _ => return Err(EvalError::InvalidArgument("unsupported index value".into())),
            };
            usize::try_from(position)
                .ok()
                .and_then(|p| items.get(p))
                .cloned()
                .ok_or(EvalError::IndexOutOfRange { index: position, size: items.len() })
        }
        (Value::Map(map), key) => {
            let key = Key::from_value(key).ok_or_else(|| {
                EvalError::overload("_[_]", &[operand.type_name(), key.type_name()])
            })?;
            lookup(map, &key).cloned().ok_or_else(|| EvalError::NoSuchKey(key.to_string()))
        }
        _ => Err(EvalError::overload("_[_]", &[operand.type_name(), index.type_name()])),
    }
}

fn unary(op: UnaryOp, operand: &Value) -> Result<Value, EvalError> {
    match (op, operand) {
        (UnaryOp::Not, Value::Bool(b)) => Ok(Value::Bool(!b)),
        (UnaryOp::Negate, Value::Int(i)) => {
            i.checked_neg().map(Value::Int).ok_or(EvalError::Overflow("integer"))
        }
        (UnaryOp::Negate, Value::Double(d)) => Ok(Value::Double(-d)),
        (UnaryOp::Negate, Value::Duration(d)) => {
            d.checked_neg().map(Value::Duration).ok_or(EvalError::Overflow("duration"))
        }
        (UnaryOp::Not, v) => Err(EvalError::overload("!_", &[v.type_name()])),
        (UnaryOp::Negate, v) => Err(EvalError::overload("-_", &[v.type_name()])),
    }
}

/// A binary operator's value.
pub(crate) fn binary(op: BinaryOp, left: &Value, right: &Value) -> Result<Value, EvalError> {
    let numeric = |v: &Value| matches!(v, Value::Int(_) | Value::Uint(_) | Value::Double(_));
    let ordering = |accept: fn(Ordering) -> bool| match left.compare(right) {
        Some(o) => Ok(Value::Bool(accept(o))),
        // NaN is neither less nor greater than anything, nor equal.
        None if numeric(left) && numeric(right) => Ok(Value::Bool(false)),
        None => Err(EvalError::overload(op.symbol(), &[left.type_name(), right.type_name()])),
    };
    match op {
        BinaryOp::Equal => Ok(Value::Bool(left.equals(right))),
        BinaryOp::NotEqual => Ok(Value::Bool(!left.equals(right))),
        BinaryOp::Less => ordering(Ordering::is_lt),
        BinaryOp::LessEqual => ordering(Ordering::is_le),
        BinaryOp::Greater => ordering(Ordering::is_gt),
        BinaryOp::GreaterEqual => ordering(Ordering::is_ge),
        BinaryOp::In => match right {
            Value::List(items) => Ok(Value::Bool(items.iter().any(|i| i.equals(left)))),
            Value::Map(map) => {
                Ok(Value::Bool(Key::from_value(left).is_some_and(|k| lookup(map, &k).is_some())))
            }
            _ => Err(EvalError::overload(op.symbol(), &[left.type_name(), right.type_name()])),
        },
        _ => functions::arithmetic(op, left, right),
    }
}
