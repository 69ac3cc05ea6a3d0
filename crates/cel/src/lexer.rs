//! Splits CEL source into tokens, each with the byte offset it starts at so parse errors can
//! point at it.

use crate::error::ParseError;

/// One token of CEL source.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Token {
    /// An identifier (`self`, `size`, `minReplicas`).
    Ident(String),
    /// An integer literal's magnitude; the parser folds a leading `-` into it, so that
    /// `-9223372036854775808` is representable.
    Int(u64),
    /// A `u`-suffixed integer literal.
    Uint(u64),
    /// A floating-point literal.
    Double(f64),
    /// A string literal, escapes resolved.
    String(String),
    /// A `b`-prefixed literal.
    Bytes(Vec<u8>),
    /// `true` or `false`.
    Bool(bool),
    /// `null`.
    Null,
    /// An operator or punctuation mark, as written (`<=`, `&&`, `(`, `in`).
    Punct(&'static str),
}

/// A token and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Spanned {
    pub(crate) token: Token,
    pub(crate) offset: usize,
}

/// Longest first, so `<=` wins over `<`.
const PUNCTUATION: [&str; 23] = [
    "&&", "||", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ".", ",", ":", "?", "!", "-",
    "+", "*", "/", "%", "<",
];

/// Words CEL keeps for itself; they may not name variables or fields outside `__word__`
/// escaping.
const RESERVED: [&str; 15] = [
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
];

/// Tokenizes `source`.
pub(crate) fn tokenize(source: &str) -> Result<Vec<Spanned>, ParseError> {
    Lexer { source, offset: 0 }.run()
}

struct Lexer<'a> {
    source: &'a str,
    offset: usize,
}

impl<'a> Lexer<'a> {
    fn rest(&self) -> &'a str {
        &self.source[self.offset..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn error(&self, offset: usize, message: impl Into<String>) -> ParseError {
        ParseError::at(self.source, offset, message)
    }

    fn run(mut self) -> Result<Vec<Spanned>, ParseError> {
        let mut tokens = Vec::new();
        loop {
            self.skip_space_and_comments();
            let start = self.offset;
            let Some(c) = self.peek() else { return Ok(tokens) };
            let token = if c.is_ascii_digit()
                || (c == '.' && self.rest()[1..].starts_with(|d: char| d.is_ascii_digit()))
            {
                self.number()?
            } else if c == '"' || c == '\'' {
                Token::String(self.string(false)?)
            } else if c.is_ascii_alphabetic() || c == '_' {
                // A string prefix is one or two letters right before the quote.
                let prefix_end = self.rest().bytes().take(3).position(|b| b == b'"' || b == b'\'');
                let prefix = prefix_end.map(|end| self.rest()[..end].to_ascii_lowercase());
                match prefix.as_deref() {
                    Some("r") => {
                        self.offset += 1;
                        Token::String(self.string(true)?)
                    }
                    Some("b") => {
                        self.offset += 1;
                        Token::Bytes(self.bytes(false)?)
                    }
                    Some("rb" | "br") => {
                        self.offset += 2;
                        Token::Bytes(self.bytes(true)?)
                    }
                    _ => self.word()?,
                }
            } else if c == '>' {
                self.offset += 1;
                if self.rest().starts_with('=') {
                    self.offset += 1;
                    Token::Punct(">=")
                } else {
                    Token::Punct(">")
                }
            } else if let Some(p) = PUNCTUATION.iter().find(|p| self.rest().starts_with(**p)) {
                self.offset += p.len();
                Token::Punct(p)
            } else {
                return Err(self.error(start, format!("unexpected character '{c}'")));
            };
            tokens.push(Spanned { token, offset: start });
        }
    }

    fn skip_space_and_comments(&mut self) {
        loop {
            let trimmed = self.rest().trim_start();
            self.offset = self.source.len() - trimmed.len();
            if self.rest().starts_with("//") {
                self.offset += self.rest().find('\n').unwrap_or(self.rest().len());
            } else {
                return;
            }
        }
    }

    fn word(&mut self) -> Result<Token, ParseError> {
        let start = self.offset;
        let len = self.rest().find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        let len = len.unwrap_or(self.rest().len());
        let word = &self.rest()[..len];
        self.offset += len;
        Ok(match word {
            "true" => Token::Bool(true),
            "false" => Token::Bool(false),
            "null" => Token::Null,
            "in" => Token::Punct("in"),
            w if RESERVED.contains(&w) => {
                return Err(self.error(start, format!("reserved identifier: {w}")));
            }
            w => Token::Ident(w.to_owned()),
        })
    }

    fn number(&mut self) -> Result<Token, ParseError> {
        let start = self.offset;
        let rest = self.rest();
        if rest.starts_with("0x") || rest.starts_with("0X") {
            let digits = rest[2..].find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(rest.len() - 2);
            let text = &rest[2..2 + digits];
            self.offset += 2 + digits;
            let value = u64::from_str_radix(text, 16)
                .map_err(|_| self.error(start, "invalid hexadecimal literal"))?;
            return Ok(self.int_suffix(value));
        }
        let bytes = rest.as_bytes();
        let mut end = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
        let mut double = false;
        if bytes.get(end) == Some(&b'.') && bytes.get(end + 1).is_some_and(u8::is_ascii_digit) {
            double = true;
            end += 1;
            end += bytes[end..].iter().take_while(|b| b.is_ascii_digit()).count();
        }
        if matches!(bytes.get(end), Some(b'e' | b'E')) {
            let mut exp = end + 1;
            if matches!(bytes.get(exp), Some(b'+' | b'-')) {
                exp += 1;
            }
            let digits = bytes[exp.min(bytes.len())..].iter().take_while(|b| b.is_ascii_digit());
            let digits = digits.count();
            if digits > 0 {
                double = true;
                end = exp + digits;
            }
        }
        let text = &rest[..end];
        self.offset += end;
        if double {
            return text
                .parse::<f64>()
                .map(Token::Double)
                .map_err(|_| self.error(start, "invalid floating-point literal"));
        }
        let value =
            text.parse::<u64>().map_err(|_| self.error(start, "integer literal out of range"))?;
        Ok(self.int_suffix(value))
    }

    fn int_suffix(&mut self, value: u64) -> Token {
        if self.rest().starts_with(['u', 'U']) {
            self.offset += 1;
            Token::Uint(value)
        } else {
            Token::Int(value)
        }
    }

    /// A quoted string's body, as code points; `raw` leaves backslashes alone.
    fn string(&mut self, raw: bool) -> Result<String, ParseError> {
        let units = self.quoted(raw, false)?;
        let mut out = String::new();
        for unit in units {
            match unit {
                Unit::Char(c) => out.push(c),
                Unit::Byte(b) => out.push(char::from(b)),
            }
        }
        Ok(out)
    }

    fn bytes(&mut self, raw: bool) -> Result<Vec<u8>, ParseError> {
        let units = self.quoted(raw, true)?;
        let mut out = Vec::new();
        for unit in units {
            match unit {
                Unit::Char(c) => {
                    let mut buf = [0; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                Unit::Byte(b) => out.push(b),
            }
        }
        Ok(out)
    }

    fn quoted(&mut self, raw: bool, bytes: bool) -> Result<Vec<Unit>, ParseError> {
        let start = self.offset;
        let quote = match self.peek() {
            Some(q @ ('"' | '\'')) => q,
            _ => return Err(self.error(start, "expected a quote")),
        };
        let triple: String = std::iter::repeat_n(quote, 3).collect();
        let closing = if self.rest().starts_with(&triple) { triple } else { quote.to_string() };
        self.offset += closing.len();
        let mut units = Vec::new();
        loop {
            if self.rest().starts_with(&closing) {
                self.offset += closing.len();
                return Ok(units);
            }
            let Some(c) = self.peek() else {
                return Err(self.error(start, "unterminated string literal"));
            };
            if c == '\n' && closing.len() == 1 {
                return Err(self.error(start, "unterminated string literal"));
            }
            self.offset += c.len_utf8();
            if c == '\\' && !raw {
                units.push(self.escape(bytes)?);
            } else {
                units.push(Unit::Char(c));
            }
        }
    }

    /// The escape after a backslash.
    fn escape(&mut self, bytes: bool) -> Result<Unit, ParseError> {
        let at = self.offset - 1;
        let Some(c) = self.peek() else {
            return Err(self.error(at, "unterminated escape sequence"));
        };
        self.offset += c.len_utf8();
        let simple = match c {
            'a' => Some('\u{7}'),
            'b' => Some('\u{8}'),
            'f' => Some('\u{c}'),
            'n' => Some('\n'),
            'r' => Some('\r'),
            't' => Some('\t'),
            'v' => Some('\u{b}'),
            '\\' | '\'' | '"' | '`' | '?' => Some(c),
            _ => None,
        };
        if let Some(s) = simple {
            return Ok(Unit::Char(s));
        }
        let (radix, digits) = match c {
            'x' | 'X' => (16, 2),
            'u' if !bytes => (16, 4),
            'U' if !bytes => (16, 8),
            '0'..='3' => {
                self.offset -= 1;
                (8, 3)
            }
            _ => return Err(self.error(at, format!("invalid escape sequence \\{c}"))),
        };
        let text = self.rest().get(..digits).unwrap_or_default().to_owned();
        let code = u32::from_str_radix(&text, radix)
            .ok()
            .filter(|_| text.len() == digits)
            .ok_or_else(|| self.error(at, "invalid escape sequence"))?;
        self.offset += digits;
        if bytes && code <= 0xff {
            return Ok(Unit::Byte(code as u8));
        }
        char::from_u32(code).map(Unit::Char).ok_or_else(|| self.error(at, "invalid code point"))
    }
}

/// A string literal's piece: a code point, or a raw byte from an octal or `\x` escape in a
/// bytes literal.
enum Unit {
    Char(char),
    Byte(u8),
}
