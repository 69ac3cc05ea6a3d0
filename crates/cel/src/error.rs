//! Why an expression does not parse or does not evaluate.

/// An expression that is not CEL: where (1-based line and column, in characters) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{column}: {message}")]
pub struct ParseError {
    /// The line, from 1.
    pub line: usize,
    /// The column, from 1, in characters.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

impl ParseError {
    /// An error at byte `offset` of `source`.
    pub(crate) fn at(source: &str, offset: usize, message: impl Into<String>) -> Self {
        let before = source.get(..offset).unwrap_or(source);
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().unwrap_or_default().chars().count() + 1;
        ParseError { line, column, message: message.into() }
    }
}

/// An expression that parsed but could not produce a value for this input. The messages are
/// cel-go's, which the Kubernetes API server shows in its field errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// A map (or object) has no such key or field.
    #[error("no such key: {0}")]
    NoSuchKey(String),
    /// An identifier is not a variable of the expression.
    #[error("undeclared reference to '{0}'")]
    UndeclaredReference(String),
    /// No function or operator takes these argument types.
    #[error("no such overload: {0}")]
    NoSuchOverload(String),
    /// A list index outside the list.
    #[error("index '{index}' out of range in list size '{size}'")]
    IndexOutOfRange {
        /// The index asked for.
        index: i64,
        /// The list's length.
        size: usize,
    },
    /// Integer division by zero.
    #[error("division by zero")]
    DivisionByZero,
    /// Integer modulus by zero.
    #[error("modulus by zero")]
    ModulusByZero,
    /// An integer, duration or timestamp result outside its range.
    #[error("{0} overflow")]
    Overflow(&'static str),
    /// The evaluation took more steps than its budget (a comprehension over a large list
    /// nested in another, ...); the message is cel-go's.
    #[error("operation cancelled: actual cost limit exceeded")]
    CostLimitExceeded,
    /// A conversion or function argument this input cannot satisfy (`int('x')`,
    /// `duration('1d')`, an invalid regular expression).
    #[error("{0}")]
    InvalidArgument(String),
}

impl EvalError {
    /// `no such overload` for `function` over the type names of its arguments.
    pub(crate) fn overload(function: &str, types: &[&str]) -> Self {
        EvalError::NoSuchOverload(format!("{function}({})", types.join(", ")))
    }
}
