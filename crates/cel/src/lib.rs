//! A CEL (Common Expression Language) parser and evaluator over JSON data, made for the
//! validation rules of Kubernetes custom resources (`x-kubernetes-validations`).
//!
//! ```
//! use oka_cel::{Program, Value};
//!
//! let rule = Program::compile("self.minReplicas <= self.maxReplicas").unwrap();
//! let spec = serde_json::json!({"minReplicas": 3, "maxReplicas": 2});
//! let verdict = rule.evaluate(&[("self", Value::from_json(&spec))]).unwrap();
//! assert_eq!(verdict, Value::Bool(false));
//! ```
//!
//! It covers the language (literals, lists and maps, field selection, indexing, the `has`,
//! `all`, `exists`, `exists_one`, `map` and `filter` macros and their two-variable forms
//! (`all(i, v, p)`, `transformList`, `transformMap`), every operator with CEL's
//! error-absorbing `&&` and `||`, integer overflow as an error), optionals (`self.?field`,
//! `list[?i]`, `orValue`), `type()`, and the parts of the Kubernetes CEL library rules use:
//! string functions (`startsWith`, `matches`, `split`, `find`, ...), list functions
//! (`isSorted`, `sum`, `min`, `max`, ...), `sets.*`, resource quantities (`quantity('1Gi')`),
//! conversions, durations and timestamps. There is no type checker: types are checked as the
//! expression runs, so a mismatch is a `no such overload` evaluation error rather than a
//! compile error. Each evaluation has a step budget ([`DEFAULT_STEP_BUDGET`]).
//!
//! # Architecture invariant
//!
//! This crate is pure: source text and values in, values and errors out; no I/O, no clock,
//! no time zone database.

#![forbid(unsafe_code)]

mod ast;
mod error;
mod eval;
mod functions;
mod lexer;
mod parser;
mod quantity;
mod regexes;
mod time;
mod value;

#[cfg(test)]
mod tests;

pub use error::{EvalError, ParseError};
pub use value::{Key, Value};

/// The words Kubernetes escapes as `__word__` when a property has that name, so rules can
/// still select it (`self.__namespace__`).
const RESERVED_PROPERTY_NAMES: [&str; 21] = [
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// Parses a Go duration (`1h30m`, `300ms`, `-1.5s`) into nanoseconds, as `duration()` does;
/// for callers that build [`Value::Duration`]s from typed data (a schema's `format: duration`).
pub fn parse_duration(text: &str) -> Result<i64, EvalError> {
    time::parse_duration(text)
}

/// How many expression nodes one evaluation may visit (each element of a comprehension visits
/// its body again): a bound on time and memory, as the API server bounds a rule's cost, far
/// above what a validation rule over one object needs.
pub const DEFAULT_STEP_BUDGET: u64 = 10_000_000;

/// A parsed expression, ready to evaluate any number of times.
#[derive(Debug, Clone)]
pub struct Program {
    expr: ast::Expr,
    regexes: regexes::Regexes,
}

impl Program {
    /// Parses `source`.
    pub fn compile(source: &str) -> Result<Program, ParseError> {
        let expr = parser::parse(source)?;
        let regexes = regexes::Regexes::collect(&expr);
        Ok(Program { expr, regexes })
    }

    /// Whether the expression reads the variable `name` (a Kubernetes rule that reads
    /// `oldSelf` is a transition rule, evaluated on updates only).
    pub fn references(&self, name: &str) -> bool {
        self.expr.references(name)
    }

    /// Evaluates the expression with `variables` bound, within [`DEFAULT_STEP_BUDGET`].
    pub fn evaluate(&self, variables: &[(&str, Value)]) -> Result<Value, EvalError> {
        self.evaluate_within(variables, DEFAULT_STEP_BUDGET)
    }

    /// Evaluates the expression with `variables` bound, failing with
    /// [`EvalError::CostLimitExceeded`] after `budget` steps.
    pub fn evaluate_within(
        &self,
        variables: &[(&str, Value)],
        budget: u64,
    ) -> Result<Value, EvalError> {
        eval::Evaluator::new(variables, &self.regexes, budget).eval(&self.expr)
    }
}
