//! The parsed form of an expression: what the evaluator walks.

use crate::value::Value;

/// A unary operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnaryOp {
    /// `!`
    Not,
    /// `-`
    Negate,
}

/// A binary operator other than `&&` and `||`, which absorb errors and have their own nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BinaryOp {
    Add,
    Subtract,
    Multiply,
    Divide,
    Remainder,
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
    Equal,
    NotEqual,
    In,
}

impl BinaryOp {
    /// The operator as written, for `no such overload` messages.
    pub(crate) fn symbol(self) -> &'static str {
        match self {
            BinaryOp::Add => "_+_",
            BinaryOp::Subtract => "_-_",
            BinaryOp::Multiply => "_*_",
            BinaryOp::Divide => "_/_",
            BinaryOp::Remainder => "_%_",
            BinaryOp::Less => "_<_",
            BinaryOp::LessEqual => "_<=_",
            BinaryOp::Greater => "_>_",
            BinaryOp::GreaterEqual => "_>=_",
            BinaryOp::Equal => "_==_",
            BinaryOp::NotEqual => "_!=_",
            BinaryOp::In => "@in",
        }
    }
}

/// The comprehension macros over a list's elements or a map's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MacroKind {
    /// `all(x, p)`: every element satisfies `p`.
    All,
    /// `exists(x, p)`: some element satisfies `p`.
    Exists,
    /// `exists_one(x, p)`: exactly one element satisfies `p`.
    ExistsOne,
    /// `map(x, t)` or `map(x, p, t)`: `t` of each element (that satisfies `p`).
    Map,
    /// `filter(x, p)`: the elements that satisfy `p`.
    Filter,
    /// `transformList(i, v, t)` or `transformList(i, v, p, t)`: `t` of each index (or key)
    /// and value (that satisfy `p`), as a list.
    TransformList,
    /// `transformMap(k, v, t)` or `transformMap(k, v, p, t)`: each key (or index) to `t` of it
    /// and its value (that satisfy `p`), as a map.
    TransformMap,
}

/// An expression.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    Literal(Value),
    Ident(String),
    List(Vec<Expr>),
    Map(Vec<(Expr, Expr)>),
    /// `operand.field`.
    Select(Box<Expr>, String),
    /// `operand.?field`: an optional, none when the field is absent.
    OptionalSelect(Box<Expr>, String),
    /// `operand[?index]`: an optional, none when the index or key is absent.
    OptionalIndex(Box<Expr>, Box<Expr>),
    /// `has(operand.field)`.
    Has(Box<Expr>, String),
    /// `operand[index]`.
    Index(Box<Expr>, Box<Expr>),
    /// `function(args)` or `target.function(args)`.
    Call {
        target: Option<Box<Expr>>,
        function: String,
        args: Vec<Expr>,
    },
    Unary(UnaryOp, Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    /// `condition ? then : otherwise`.
    Conditional(Box<Expr>, Box<Expr>, Box<Expr>),
    /// A comprehension macro: `range.kind(variable, second?, filter?, body)`. With one
    /// variable it is each element of a list or key of a map; with two (`all(i, v, p)`), the
    /// index and element, or the key and value.
    Comprehension {
        kind: MacroKind,
        range: Box<Expr>,
        variable: String,
        second: Option<String>,
        /// The `p` of `map(x, p, t)`.
        filter: Option<Box<Expr>>,
        body: Box<Expr>,
    },
}

impl Expr {
    /// Calls `f` on this expression and every expression inside it, parents first.
    pub(crate) fn visit(&self, f: &mut impl FnMut(&Expr)) {
        f(self);
        match self {
            Expr::Literal(_) | Expr::Ident(_) => {}
            Expr::List(items) => items.iter().for_each(|e| e.visit(f)),
            Expr::Map(entries) => entries.iter().for_each(|(k, v)| {
                k.visit(f);
                v.visit(f);
            }),
            Expr::Select(operand, _)
            | Expr::OptionalSelect(operand, _)
            | Expr::Has(operand, _)
            | Expr::Unary(_, operand) => operand.visit(f),
            Expr::Index(a, b)
            | Expr::OptionalIndex(a, b)
            | Expr::Binary(_, a, b)
            | Expr::And(a, b)
            | Expr::Or(a, b) => {
                a.visit(f);
                b.visit(f);
            }
            Expr::Call { target, args, .. } => {
                if let Some(target) = target {
                    target.visit(f);
                }
                args.iter().for_each(|e| e.visit(f));
            }
            Expr::Conditional(a, b, c) => {
                a.visit(f);
                b.visit(f);
                c.visit(f);
            }
            Expr::Comprehension { range, filter, body, .. } => {
                range.visit(f);
                if let Some(filter) = filter {
                    filter.visit(f);
                }
                body.visit(f);
            }
        }
    }

    /// Whether the expression reads the variable `name` anywhere it is not shadowed by a
    /// comprehension's own variable.
    pub(crate) fn references(&self, name: &str) -> bool {
        match self {
            Expr::Literal(_) => false,
            Expr::Ident(ident) => ident == name,
            Expr::List(items) => items.iter().any(|e| e.references(name)),
            Expr::Map(entries) => {
                entries.iter().any(|(k, v)| k.references(name) || v.references(name))
            }
            Expr::Select(operand, _)
            | Expr::OptionalSelect(operand, _)
            | Expr::Has(operand, _)
            | Expr::Unary(_, operand) => operand.references(name),
            Expr::Index(a, b)
            | Expr::OptionalIndex(a, b)
            | Expr::Binary(_, a, b)
            | Expr::And(a, b)
            | Expr::Or(a, b) => a.references(name) || b.references(name),
            Expr::Call { target, args, .. } => {
                target.as_ref().is_some_and(|t| t.references(name))
                    || args.iter().any(|e| e.references(name))
            }
            Expr::Conditional(a, b, c) => {
                a.references(name) || b.references(name) || c.references(name)
            }
            Expr::Comprehension { range, variable, second, filter, body, .. } => {
                range.references(name)
                    || (variable != name
                        && second.as_deref() != Some(name)
                        && (filter.as_ref().is_some_and(|f| f.references(name))
                            || body.references(name)))
            }
        }
    }
}
