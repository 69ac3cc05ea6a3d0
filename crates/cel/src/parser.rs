//! A recursive-descent parser for CEL's grammar, lowest precedence first:
//!
//! ```text
//! expr     = or ["?" or ":" expr]
//! or       = and {"||" and}
//! and      = relation {"&&" relation}
//! relation = addition {("<" | "<=" | ">" | ">=" | "==" | "!=" | "in") addition}
//! addition = product {("+" | "-") product}
//! product  = unary {("*" | "/" | "%") unary}
//! unary    = member | "!" {"!"} member | "-" {"-"} member
//! member   = primary {"." IDENT ["(" args ")"] | "[" expr "]"}
//! primary  = ["."] IDENT ["(" args ")"] | "(" expr ")" | "[" list "]" | "{" map "}" | literal
//! ```
//!
//! Macros (`has`, `all`, `exists`, `exists_one`, `map`, `filter`) become their own nodes here,
//! as cel-go expands them at parse time.

use std::sync::Arc;

use crate::ast::{BinaryOp, Expr, MacroKind, UnaryOp};
use crate::error::ParseError;
use crate::lexer::{Spanned, Token, tokenize};
use crate::value::Value;

/// How deep expressions may nest: deeper input is refused rather than allowed to exhaust the
/// stack (cel-go's default is 250 too).
const MAX_DEPTH: usize = 100;

/// Parses `source` into an expression.
pub(crate) fn parse(source: &str) -> Result<Expr, ParseError> {
    let tokens = tokenize(source)?;
    let mut parser = Parser { source, tokens, position: 0, depth: 0 };
    let expr = parser.expr()?;
    match parser.tokens.get(parser.position) {
        None => Ok(expr),
        Some(t) => Err(parser.error_at(t.offset, format!("unexpected {}", describe(&t.token)))),
    }
}

struct Parser<'a> {
    source: &'a str,
    tokens: Vec<Spanned>,
    position: usize,
    depth: usize,
}

fn describe(token: &Token) -> String {
    match token {
        Token::Ident(name) => format!("identifier '{name}'"),
        Token::Punct(p) => format!("'{p}'"),
        _ => "literal".to_owned(),
    }
}

impl Parser<'_> {
    fn error_at(&self, offset: usize, message: impl Into<String>) -> ParseError {
        ParseError::at(self.source, offset, message)
    }

    /// An error at the current token (or the end of the input).
    fn error_here(&self, message: impl Into<String>) -> ParseError {
        let offset = self.tokens.get(self.position).map_or(self.source.len(), |t| t.offset);
        self.error_at(offset, message)
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.position).map(|t| &t.token)
    }

    fn at_punct(&self, punct: &str) -> bool {
        matches!(self.peek(), Some(Token::Punct(p)) if *p == punct)
    }

    fn eat(&mut self, punct: &str) -> bool {
        let found = self.at_punct(punct);
        if found {
            self.position += 1;
        }
        found
    }

    fn expect(&mut self, punct: &str) -> Result<(), ParseError> {
        if self.eat(punct) {
            Ok(())
        } else {
            let found = self.peek().map_or_else(|| "end of input".to_owned(), describe);
            Err(self.error_here(format!("expected '{punct}', found {found}")))
        }
    }

    fn ident(&mut self) -> Result<String, ParseError> {
        match self.peek() {
            Some(Token::Ident(name)) => {
                let name = name.clone();
                self.position += 1;
                Ok(name)
            }
            _ => Err(self.error_here("expected an identifier")),
        }
    }

    /// One level deeper in the tree being built; every node that wraps another counts, so
    /// that long operator chains (`1+1+...`) are bounded as nesting is.
    fn deeper(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error_here("expression nested too deeply"));
        }
        Ok(())
    }

    fn expr(&mut self) -> Result<Expr, ParseError> {
        self.deeper()?;
        let condition = self.or()?;
        let result = if self.eat("?") {
            let then = self.or()?;
            self.expect(":")?;
            let otherwise = self.expr()?;
            Expr::Conditional(Box::new(condition), Box::new(then), Box::new(otherwise))
        } else {
            condition
        };
        self.depth -= 1;
        Ok(result)
    }

    fn or(&mut self) -> Result<Expr, ParseError> {
        let depth = self.depth;
        let mut left = self.and()?;
        while self.eat("||") {
            self.deeper()?;
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        self.depth = depth;
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, ParseError> {
        let depth = self.depth;
        let mut left = self.relation()?;
        while self.eat("&&") {
            self.deeper()?;
            left = Expr::And(Box::new(left), Box::new(self.relation()?));
        }
        self.depth = depth;
        Ok(left)
    }

    fn binary_level(
        &mut self,
        operators: &[(&str, BinaryOp)],
        next: fn(&mut Self) -> Result<Expr, ParseError>,
    ) -> Result<Expr, ParseError> {
        let depth = self.depth;
        let mut left = next(self)?;
        'outer: loop {
            for (symbol, op) in operators {
                if self.eat(symbol) {
                    self.deeper()?;
                    left = Expr::Binary(*op, Box::new(left), Box::new(next(self)?));
                    continue 'outer;
                }
            }
            self.depth = depth;
            return Ok(left);
        }
    }

    fn relation(&mut self) -> Result<Expr, ParseError> {
        const OPERATORS: [(&str, BinaryOp); 7] = [
            ("<=", BinaryOp::LessEqual),
            ("<", BinaryOp::Less),
            (">=", BinaryOp::GreaterEqual),
            (">", BinaryOp::Greater),
            ("==", BinaryOp::Equal),
            ("!=", BinaryOp::NotEqual),
            ("in", BinaryOp::In),
        ];
        self.binary_level(&OPERATORS, Self::addition)
    }

    fn addition(&mut self) -> Result<Expr, ParseError> {
        const OPERATORS: [(&str, BinaryOp); 2] = [("+", BinaryOp::Add), ("-", BinaryOp::Subtract)];
        self.binary_level(&OPERATORS, Self::product)
    }

    fn product(&mut self) -> Result<Expr, ParseError> {
        const OPERATORS: [(&str, BinaryOp); 3] =
            [("*", BinaryOp::Multiply), ("/", BinaryOp::Divide), ("%", BinaryOp::Remainder)];
        self.binary_level(&OPERATORS, Self::unary)
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        let depth = self.depth;
        let result = self.unary_chain();
        self.depth = depth;
        result
    }

    fn unary_chain(&mut self) -> Result<Expr, ParseError> {
        if self.eat("!") {
            let mut count = 1;
            while self.eat("!") {
                self.deeper()?;
                count += 1;
            }
            let mut expr = self.member()?;
            for _ in 0..count {
                expr = Expr::Unary(UnaryOp::Not, Box::new(expr));
            }
            return Ok(expr);
        }
        if self.at_punct("-") {
            let mut count = 0;
            while self.eat("-") {
                self.deeper()?;
                count += 1;
            }
            // A negated integer literal is one literal, so that i64::MIN can be written.
            let mut expr = match self.peek() {
                Some(Token::Int(magnitude)) if count % 2 == 1 => {
                    let magnitude = *magnitude;
                    let negative = 0i64.checked_sub_unsigned(magnitude);
                    let Some(value) = negative else {
                        return Err(self.error_here("integer literal out of range"));
                    };
                    self.position += 1;
                    count -= 1;
                    self.member_suffix(Expr::Literal(Value::Int(value)))?
                }
                _ => self.member()?,
            };
            for _ in 0..count {
                expr = Expr::Unary(UnaryOp::Negate, Box::new(expr));
            }
            return Ok(expr);
        }
        self.member()
    }

    fn member(&mut self) -> Result<Expr, ParseError> {
        let primary = self.primary()?;
        self.member_suffix(primary)
    }

    fn member_suffix(&mut self, expr: Expr) -> Result<Expr, ParseError> {
        let depth = self.depth;
        let result = self.member_chain(expr);
        self.depth = depth;
        result
    }

    fn member_chain(&mut self, mut expr: Expr) -> Result<Expr, ParseError> {
        loop {
            if matches!(self.peek(), Some(Token::Punct("." | "["))) {
                self.deeper()?;
            }
            if self.eat(".") {
                if self.eat("?") {
                    let name = self.ident()?;
                    expr = Expr::OptionalSelect(Box::new(expr), name);
                    continue;
                }
                let name = self.ident()?;
                if self.eat("(") {
                    let args = self.arguments(")")?;
                    expr = self.method(expr, name, args)?;
                } else {
                    expr = Expr::Select(Box::new(expr), name);
                }
            } else if self.eat("[") {
                let optional = self.eat("?");
                let index = self.expr()?;
                self.expect("]")?;
                expr = if optional {
                    Expr::OptionalIndex(Box::new(expr), Box::new(index))
                } else {
                    Expr::Index(Box::new(expr), Box::new(index))
                };
            } else {
                return Ok(expr);
            }
        }
    }

    /// Comma-separated expressions up to `close` (a trailing comma allowed).
    fn arguments(&mut self, close: &str) -> Result<Vec<Expr>, ParseError> {
        let mut args = Vec::new();
        while !self.eat(close) {
            args.push(self.expr()?);
            if !self.eat(",") {
                self.expect(close)?;
                break;
            }
        }
        Ok(args)
    }

    /// `target.name(args)`: a macro or a method call.
    fn method(&mut self, target: Expr, name: String, args: Vec<Expr>) -> Result<Expr, ParseError> {
        let kind = match name.as_str() {
            "all" => Some(MacroKind::All),
            "exists" => Some(MacroKind::Exists),
            "exists_one" | "existsOne" => Some(MacroKind::ExistsOne),
            "map" => Some(MacroKind::Map),
            "filter" => Some(MacroKind::Filter),
            "transformList" => Some(MacroKind::TransformList),
            "transformMap" => Some(MacroKind::TransformMap),
            _ => None,
        };
        let Some(kind) = kind else {
            return Ok(Expr::Call { target: Some(Box::new(target)), function: name, args });
        };
        let count = args.len();
        let (two_variables, arity_ok) = match kind {
            MacroKind::All | MacroKind::Exists | MacroKind::ExistsOne => {
                (count == 3, matches!(count, 2 | 3))
            }
            MacroKind::Map => (false, matches!(count, 2 | 3)),
            MacroKind::Filter => (false, count == 2),
            MacroKind::TransformList | MacroKind::TransformMap => (true, matches!(count, 3 | 4)),
        };
        if !arity_ok {
            return Err(self.error_here(format!("wrong number of arguments to macro {name}")));
        }
        let mut args = args.into_iter();
        let mut simple_name = |parser: &Self| match args.next() {
            Some(Expr::Ident(variable)) => Ok(variable),
            _ => Err(parser.error_here(format!("argument to {name} must be a simple name"))),
        };
        let variable = simple_name(self)?;
        let second = if two_variables { Some(simple_name(self)?) } else { None };
        let mut rest: Vec<Expr> = args.collect();
        let body = rest.pop().map(Box::new);
        let filter = rest.pop().map(Box::new);
        let Some(body) = body else {
            return Err(self.error_here(format!("wrong number of arguments to macro {name}")));
        };
        Ok(Expr::Comprehension { kind, range: Box::new(target), variable, second, filter, body })
    }

    fn primary(&mut self) -> Result<Expr, ParseError> {
        let Some(spanned) = self.tokens.get(self.position).cloned() else {
            return Err(self.error_here("unexpected end of input"));
        };
        self.position += 1;
        let literal = |v: Value| Ok(Expr::Literal(v));
        match spanned.token {
            Token::Int(magnitude) => match i64::try_from(magnitude) {
                Ok(value) => literal(Value::Int(value)),
                Err(_) => Err(self.error_at(spanned.offset, "integer literal out of range")),
            },
            Token::Uint(value) => literal(Value::Uint(value)),
            Token::Double(value) => literal(Value::Double(value)),
            Token::String(text) => literal(Value::String(Arc::from(text))),
            Token::Bytes(bytes) => literal(Value::Bytes(Arc::from(bytes))),
            Token::Bool(b) => literal(Value::Bool(b)),
            Token::Null => literal(Value::Null),
            Token::Ident(name) => self.identifier(name),
            Token::Punct(".") => {
                let name = self.ident()?;
                self.identifier(name)
            }
            Token::Punct("(") => {
                let inner = self.expr()?;
                self.expect(")")?;
                Ok(inner)
            }
            Token::Punct("[") => Ok(Expr::List(self.arguments("]")?)),
            Token::Punct("{") => self.map_literal(),
            other => Err(self.error_at(spanned.offset, format!("unexpected {}", describe(&other)))),
        }
    }

    /// A name, or a global call (`size(x)`, `has(a.b)`).
    fn identifier(&mut self, name: String) -> Result<Expr, ParseError> {
        if !self.eat("(") {
            return Ok(Expr::Ident(name));
        }
        let args = self.arguments(")")?;
        if name == "has" {
            return match <[Expr; 1]>::try_from(args) {
                Ok([Expr::Select(operand, field)]) => Ok(Expr::Has(operand, field)),
                _ => Err(self.error_here("invalid argument to has() macro")),
            };
        }
        Ok(Expr::Call { target: None, function: name, args })
    }

    fn map_literal(&mut self) -> Result<Expr, ParseError> {
        let mut entries = Vec::new();
        while !self.eat("}") {
            let key = self.expr()?;
            self.expect(":")?;
            let value = self.expr()?;
            entries.push((key, value));
            if !self.eat(",") {
                self.expect("}")?;
                break;
            }
        }
        Ok(Expr::Map(entries))
    }
}
