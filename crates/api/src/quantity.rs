//! Kubernetes resource quantities (`500m`, `1.5`, `2Gi`, `1e3`, `128M`), read exactly.
//!
//! The one parser every crate uses for a quantity's value: the controllers turn CPU and memory
//! limits into millicores and bytes for the runtime, the manager shows them to E2B clients and
//! charges them to API-key quotas. Two parsers rounding differently would let a quota admit what
//! the runtime then limits otherwise, so there is one, and it is exact: a quantity is kept as a
//! fraction of integers, and the caller says how to round when it asks for an integer.
//!
//! Grammar (Kubernetes' `resource.Quantity`): an optional sign, a decimal number with an optional
//! fraction (`1`, `1.5`, `.5`, `1.`), then at most one suffix: a decimal SI one (`n`, `u`, `m`,
//! none, `k`, `M`, `G`, `T`, `P`, `E`), a binary one (`Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei`) or a
//! decimal exponent (`e3`, `E-3`). Surrounding whitespace is ignored. No floating point is
//! involved anywhere.

use std::fmt;

/// Why a quantity could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The number part is missing or not decimal.
    #[error("not a number")]
    NotANumber,
    /// The suffix is not one Kubernetes knows.
    #[error("unknown suffix")]
    UnknownSuffix,
    /// The value does not fit (128-bit numerator and denominator, or the integer asked for).
    #[error("too large")]
    TooLarge,
    /// The value is negative where only non-negative amounts make sense.
    #[error("must not be negative")]
    Negative,
}

impl QuantityError {
    /// The error's message as a static string, for error types that carry a `&'static str`
    /// reason.
    pub fn reason(self) -> &'static str {
        match self {
            Self::NotANumber => "not a number",
            Self::UnknownSuffix => "unknown suffix",
            Self::TooLarge => "too large",
            Self::Negative => "must not be negative",
        }
    }
}

/// How a fractional result becomes an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// Towards zero.
    Down,
    /// Away from zero (Kubernetes' `MilliValue` and `Value` round up).
    Up,
    /// To the nearest integer, halves away from zero.
    Nearest,
}

/// A quantity's exact value: `±numerator / denominator`.
///
/// Invariant: `denominator > 0`; zero is never negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Amount {
    negative: bool,
    numerator: u128,
    denominator: u128,
}

impl Amount {
    /// Whether the value is below zero.
    pub fn is_negative(&self) -> bool {
        self.negative
    }

    /// Whether the value is above zero.
    pub fn is_positive(&self) -> bool {
        !self.negative && self.numerator > 0
    }

    /// Whether the value is zero.
    pub fn is_zero(&self) -> bool {
        self.numerator == 0
    }

    /// The value × `multiplier` / `divisor`, rounded as asked, for a non-negative value.
    ///
    /// # Errors
    ///
    /// [`QuantityError::Negative`] for a negative value, [`QuantityError::TooLarge`] when it does
    /// not fit in a `u64` (or `divisor` is zero).
    pub fn scaled(
        &self,
        multiplier: u128,
        divisor: u128,
        rounding: Rounding,
    ) -> Result<u64, QuantityError> {
        if self.negative {
            return Err(QuantityError::Negative);
        }
        let numerator = self.numerator.checked_mul(multiplier).ok_or(QuantityError::TooLarge)?;
        let denominator = self.denominator.checked_mul(divisor).ok_or(QuantityError::TooLarge)?;
        if denominator == 0 {
            return Err(QuantityError::TooLarge);
        }
        let quotient = numerator / denominator;
        let remainder = numerator % denominator;
        let up = match rounding {
            Rounding::Down => false,
            Rounding::Up => remainder > 0,
            // remainder ≥ denominator - remainder, without overflow.
            Rounding::Nearest => remainder >= denominator - remainder && remainder > 0,
        };
        let rounded = if up { quotient + 1 } else { quotient };
        u64::try_from(rounded).map_err(|_| QuantityError::TooLarge)
    }

    /// The value in thousandths (millicores for CPU), rounded as asked.
    ///
    /// # Errors
    ///
    /// As [`Amount::scaled`].
    pub fn millis(&self, rounding: Rounding) -> Result<u64, QuantityError> {
        self.scaled(1000, 1, rounding)
    }

    /// The value itself (bytes for memory, cores for CPU), rounded as asked.
    ///
    /// # Errors
    ///
    /// As [`Amount::scaled`].
    pub fn whole(&self, rounding: Rounding) -> Result<u64, QuantityError> {
        self.scaled(1, 1, rounding)
    }

    /// The value in units of `unit` (MiB: `1 << 20`), rounded as asked.
    ///
    /// # Errors
    ///
    /// As [`Amount::scaled`].
    pub fn in_units_of(&self, unit: u128, rounding: Rounding) -> Result<u64, QuantityError> {
        self.scaled(1, unit, rounding)
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.negative { "-" } else { "" };
        write!(f, "{sign}{}/{}", self.numerator, self.denominator)
    }
}

/// Reads a Kubernetes quantity exactly; see the [module documentation](self) for the grammar.
///
/// ```
/// use oka_api::quantity::{Rounding, parse};
/// assert_eq!(parse("1500u").unwrap().millis(Rounding::Up), Ok(2));
/// assert_eq!(parse("2Gi").unwrap().whole(Rounding::Up), Ok(2 << 30));
/// assert!(parse("-1").unwrap().is_negative());
/// ```
///
/// # Errors
///
/// [`QuantityError::NotANumber`], [`QuantityError::UnknownSuffix`] or
/// [`QuantityError::TooLarge`].
pub fn parse(text: &str) -> Result<Amount, QuantityError> {
    let text = text.trim();
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let split =
        unsigned.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(QuantityError::NotANumber);
    }
    if !(whole.bytes().all(|b| b.is_ascii_digit()) && fraction.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(QuantityError::NotANumber);
    }
    let too_large = QuantityError::TooLarge;
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    let mut numerator: u128 =
        if digits.is_empty() { 0 } else { digits.parse().map_err(|_| too_large)? };
    let mut denominator = pow10(fraction.len()).ok_or(too_large)?;
    let (multiplier, divisor): (u128, u128) = match suffix {
        "" => (1, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1_000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (pow10(12).ok_or(too_large)?, 1),
        "P" => (pow10(15).ok_or(too_large)?, 1),
        "E" => (pow10(18).ok_or(too_large)?, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        exponent if exponent.starts_with(['e', 'E']) => {
            let exp: i32 = exponent[1..].parse().map_err(|_| QuantityError::UnknownSuffix)?;
            let factor = pow10(exp.unsigned_abs() as usize).ok_or(too_large)?;
            if exp >= 0 { (factor, 1) } else { (1, factor) }
        }
        _ => return Err(QuantityError::UnknownSuffix),
    };
    numerator = numerator.checked_mul(multiplier).ok_or(too_large)?;
    denominator = denominator.checked_mul(divisor).ok_or(too_large)?;
    Ok(Amount { negative: negative && numerator > 0, numerator, denominator })
}

fn pow10(exp: usize) -> Option<u128> {
    (0..exp).try_fold(1u128, |acc, _| acc.checked_mul(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value in millionths, for comparing fractions.
    fn micros(text: &str) -> Result<u64, QuantityError> {
        parse(text)?.scaled(1_000_000, 1, Rounding::Down)
    }

    #[test]
    fn quantities_parse_exactly() {
        let cases: [(&str, Result<u64, QuantityError>); 14] = [
            ("1", Ok(1_000_000)),
            ("500m", Ok(500_000)),
            ("1.5", Ok(1_500_000)),
            ("2Gi", Ok((2 << 30) * 1_000_000)),
            ("128M", Ok(128_000_000 * 1_000_000)),
            ("1e3", Ok(1_000_000_000)),
            ("1E-3", Ok(1_000)),
            ("0.1", Ok(100_000)),
            (".5", Ok(500_000)),
            ("+2k", Ok(2_000_000_000)),
            (" 3 ", Ok(3_000_000)),
            ("1Zi", Err(QuantityError::UnknownSuffix)),
            ("", Err(QuantityError::NotANumber)),
            ("1.2.3", Err(QuantityError::NotANumber)),
        ];
        for (text, expected) in cases {
            assert_eq!(micros(text), expected, "{text}");
        }
        assert_eq!(parse("1e400"), Err(QuantityError::TooLarge));
        assert_eq!(parse("1e"), Err(QuantityError::UnknownSuffix));
    }

    #[test]
    fn signs_are_kept_and_negatives_refused_as_integers() {
        let minus = parse("-1").unwrap();
        assert!(minus.is_negative() && !minus.is_positive());
        assert_eq!(minus.millis(Rounding::Up), Err(QuantityError::Negative));
        let zero = parse("-0").unwrap();
        assert!(zero.is_zero() && !zero.is_negative() && !zero.is_positive());
        assert!(parse("0.001m").unwrap().is_positive());
    }

    #[test]
    fn rounding_is_the_callers_choice() {
        let q = parse("1500u").unwrap(); // 1.5 millicores
        assert_eq!(q.millis(Rounding::Up), Ok(2));
        assert_eq!(q.millis(Rounding::Down), Ok(1));
        assert_eq!(q.millis(Rounding::Nearest), Ok(2));
        assert_eq!(parse("1400u").unwrap().millis(Rounding::Nearest), Ok(1));
        assert_eq!(parse("100Mi").unwrap().in_units_of(1 << 20, Rounding::Up), Ok(100));
        let odd = parse("1000001").unwrap(); // just under 1 MiB
        assert_eq!(odd.in_units_of(1 << 20, Rounding::Up), Ok(1));
        assert_eq!(odd.in_units_of(1 << 20, Rounding::Down), Ok(0));
        assert_eq!(parse("20Ei").unwrap().millis(Rounding::Up), Err(QuantityError::TooLarge));
    }
}
