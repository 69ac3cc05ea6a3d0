//! Label selectors in the Kubernetes string syntax (`a=b,c!=d,e in (x,y),!f,g`).
//!
//! A [`Selector`] is parsed once, so a malformed one fails at the edge with a message that says
//! what to fix, and is printed back in the canonical syntax for the Kubernetes backend.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::StoreError;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key=value` or `key==value`.
    Equals(String, String),
    /// `key!=value`: the label is absent or has another value.
    NotEquals(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)`: the label is absent or has none of the values.
    NotIn(String, Vec<String>),
    /// `key`: the label is present.
    Exists(String),
    /// `!key`: the label is absent.
    DoesNotExist(String),
}

impl Requirement {
    /// Whether `labels` meet this requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Requirement::Equals(k, v) => write!(f, "{k}={v}"),
            Requirement::NotEquals(k, v) => write!(f, "{k}!={v}"),
            Requirement::In(k, vs) => write!(f, "{k} in ({})", vs.join(",")),
            Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", vs.join(",")),
            Requirement::Exists(k) => write!(f, "{k}"),
            Requirement::DoesNotExist(k) => write!(f, "!{k}"),
        }
    }
}

/// A label selector: all of its requirements must hold. The empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Selector {
    /// The selector that matches every object.
    pub fn everything() -> Self {
        Selector::default()
    }

    /// A selector from requirements.
    pub fn new(requirements: Vec<Requirement>) -> Self {
        Selector { requirements }
    }

    /// A selector requiring each `key=value` of `labels`.
    pub fn from_labels<'a>(labels: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Selector {
            requirements: labels
                .into_iter()
                .map(|(k, v)| Requirement::Equals(k.to_owned(), v.to_owned()))
                .collect(),
        }
    }

    /// The selector's requirements.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether this selector matches everything.
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether `labels` (absent labels are an empty map) meet every requirement.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        static EMPTY: BTreeMap<String, String> = BTreeMap::new();
        let labels = labels.unwrap_or(&EMPTY);
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl FromStr for Selector {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Parser { src: s, pos: 0 }.selector()
    }
}

/// A small recursive-descent parser over the selector string.
struct Parser<'a> {
    src: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn selector(mut self) -> Result<Selector, StoreError> {
        let mut requirements = Vec::new();
        self.skip_ws();
        if self.at_end() {
            return Ok(Selector::everything());
        }
        loop {
            requirements.push(self.requirement()?);
            self.skip_ws();
            if self.at_end() {
                break;
            }
            self.expect(",")?;
        }
        Ok(Selector { requirements })
    }

    fn requirement(&mut self) -> Result<Requirement, StoreError> {
        self.skip_ws();
        if self.eat("!") {
            let key = self.key()?;
            return Ok(Requirement::DoesNotExist(key));
        }
        let key = self.key()?;
        self.skip_ws();
        if self.eat("==") || self.eat("=") {
            let value = self.value()?;
            return Ok(Requirement::Equals(key, value));
        }
        if self.eat("!=") {
            let value = self.value()?;
            return Ok(Requirement::NotEquals(key, value));
        }
        if self.eat_word("notin") {
            return Ok(Requirement::NotIn(key, self.set()?));
        }
        if self.eat_word("in") {
            return Ok(Requirement::In(key, self.set()?));
        }
        if self.at_end() || self.peek() == Some(',') {
            return Ok(Requirement::Exists(key));
        }
        Err(self.error("expected `=`, `!=`, `in`, `notin`, `,` or the end"))
    }

    fn set(&mut self) -> Result<Vec<String>, StoreError> {
        self.skip_ws();
        self.expect("(")?;
        let mut values = Vec::new();
        loop {
            self.skip_ws();
            if self.eat(")") {
                break;
            }
            if !values.is_empty() {
                self.expect(",")?;
            }
            values.push(self.value()?);
            self.skip_ws();
        }
        if values.is_empty() {
            return Err(self.error("a set needs at least one value"));
        }
        Ok(values)
    }

    fn key(&mut self) -> Result<String, StoreError> {
        self.skip_ws();
        let token = self.token();
        if token.is_empty() {
            return Err(self.error("expected a label key"));
        }
        if !is_valid_key(&token) {
            return Err(self.error(&format!("`{token}` is not a valid label key")));
        }
        Ok(token)
    }

    fn value(&mut self) -> Result<String, StoreError> {
        self.skip_ws();
        let token = self.token();
        if !is_valid_value(&token) {
            return Err(self.error(&format!("`{token}` is not a valid label value")));
        }
        Ok(token)
    }

    /// Reads the characters a key or value may contain.
    fn token(&mut self) -> String {
        let rest = &self.src[self.pos..];
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')))
            .unwrap_or(rest.len());
        self.pos += len;
        rest[..len].to_owned()
    }

    fn skip_ws(&mut self) {
        let rest = &self.src[self.pos..];
        self.pos += rest.len() - rest.trim_start().len();
    }

    fn at_end(&self) -> bool {
        self.pos >= self.src.len()
    }

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn eat(&mut self, s: &str) -> bool {
        if self.src[self.pos..].starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    /// Eats `word` when it is followed by whitespace or `(`.
    fn eat_word(&mut self, word: &str) -> bool {
        let Some(after) = self.src[self.pos..].strip_prefix(word) else { return false };
        if after.chars().next().is_some_and(|c| c.is_whitespace() || c == '(') {
            self.pos += word.len();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, s: &str) -> Result<(), StoreError> {
        if self.eat(s) { Ok(()) } else { Err(self.error(&format!("expected `{s}`"))) }
    }

    fn error(&self, what: &str) -> StoreError {
        StoreError::Invalid(format!(
            "label selector `{}`: {what} at position {}",
            self.src, self.pos
        ))
    }
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters of alphanumerics, `-`, `_`, `.`, beginning and ending with an alphanumeric.
fn is_valid_key(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let ok = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !ok {
            return false;
        }
    }
    !name.is_empty() && is_valid_value(name) && !name.contains('/')
}

/// A label value: empty, or at most 63 characters of alphanumerics, `-`, `_`, `.`, beginning
/// and ending with an alphanumeric.
fn is_valid_value(value: &str) -> bool {
    if value.is_empty() {
        return true;
    }
    value.len() <= 63
        && value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[track_caller]
    fn check(selector: &str, pairs: &[(&str, &str)], expected: bool) {
        let sel: Selector = selector.parse().unwrap();
        assert_eq!(sel.matches(Some(&labels(pairs))), expected, "{selector} on {pairs:?}");
        // Printing and parsing again gives the same selector.
        let again: Selector = sel.to_string().parse().unwrap();
        assert_eq!(sel, again);
    }

    #[test]
    fn a_multibyte_character_after_a_key_is_an_error_not_a_panic() {
        // Found by the `selectors` fuzz target: `in` was sliced before it was matched.
        for text in ["e in\0\0я", "e iя", "e nя", "e notiя", "e я"] {
            assert!(text.parse::<Selector>().is_err(), "{text:?}");
        }
    }

    #[test]
    fn selectors_match_as_kubernetes_does() {
        check("", &[], true);
        check("a=b", &[("a", "b")], true);
        check("a==b", &[("a", "c")], false);
        check("a!=b", &[], true);
        check("a!=b", &[("a", "b")], false);
        check("a in (x, y)", &[("a", "y")], true);
        check("a in (x,y)", &[], false);
        check("a notin (x,y)", &[], true);
        check("a notin (x,y)", &[("a", "x")], false);
        check("a", &[("a", "")], true);
        check("!a", &[("a", "")], false);
        check(
            "agents.kruise.io/sandbox-claimed=false,agents.kruise.io/sandbox-pool=p1",
            &[
                ("agents.kruise.io/sandbox-claimed", "false"),
                ("agents.kruise.io/sandbox-pool", "p1"),
            ],
            true,
        );
        check(" a = b , !c ", &[("a", "b")], true);
        check("a=", &[("a", "")], true);
    }

    #[test]
    fn malformed_selectors_say_what_is_wrong() {
        for bad in ["a=b,", "=b", "a in ()", "a in (x", "a b", "-a=b", "a=b c", "Foo.Bar/x=1"] {
            let err = bad.parse::<Selector>().unwrap_err();
            assert!(
                matches!(err, StoreError::Invalid(ref m) if m.contains("label selector")),
                "{bad}: {err}"
            );
        }
    }
}
