//! Regular expressions for `matches`, `find` and `findAll`, compiled once per program when
//! the pattern is a literal (as it nearly always is), so a rule evaluated on every item of a
//! list does not compile its pattern for each.

use std::collections::HashMap;

use regex::Regex;

use crate::ast::Expr;
use crate::error::EvalError;
use crate::value::Value;

/// The functions whose first argument (after the receiver) is a pattern.
const REGEX_FUNCTIONS: [&str; 3] = ["matches", "find", "findAll"];

/// The compiled literal patterns of one program.
#[derive(Debug, Clone, Default)]
pub(crate) struct Regexes(HashMap<String, Regex>);

impl Regexes {
    /// Compiles every literal pattern in `expr`; an invalid one is left out, to fail (with
    /// its error) when evaluated.
    pub(crate) fn collect(expr: &Expr) -> Regexes {
        let mut compiled = HashMap::new();
        expr.visit(&mut |e| {
            let Expr::Call { target, function, args } = e else { return };
            if !REGEX_FUNCTIONS.contains(&function.as_str()) {
                return;
            }
            // `s.matches(p)` or the global `matches(s, p)`.
            let pattern = if target.is_some() { args.first() } else { args.get(1) };
            if let Some(Expr::Literal(Value::String(pattern))) = pattern
                && let Ok(re) = Regex::new(pattern)
            {
                compiled.insert(pattern.to_string(), re);
            }
        });
        Regexes(compiled)
    }

    /// The regular expression of `pattern`, compiled now if it was not a literal.
    pub(crate) fn get(&self, pattern: &str) -> Result<Regex, EvalError> {
        match self.0.get(pattern) {
            Some(re) => Ok(re.clone()),
            None => Regex::new(pattern).map_err(|e| {
                EvalError::InvalidArgument(format!("invalid regular expression: {e}"))
            }),
        }
    }
}
