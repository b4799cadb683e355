//! Money, for the cost budget: whole millionths of a US dollar, never a float, so sums
//! are exact and a budget check cannot be off by a rounding error.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An amount in millionths of a US dollar (micro-USD). Serialized as the bare integer,
/// which is why stored and wire field names end in `_micro_usd`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct MicroUsd(pub u64);

/// Micro-dollars in one dollar.
const PER_USD: u64 = 1_000_000;

impl MicroUsd {
    /// Nothing.
    pub const ZERO: MicroUsd = MicroUsd(0);

    /// The sum, capped at the largest amount instead of wrapping.
    #[must_use]
    pub const fn saturating_add(self, other: MicroUsd) -> MicroUsd {
        MicroUsd(self.0.saturating_add(other.0))
    }
}

/// `$1.50`, `$0.000150`: dollars with at least two decimals and no trailing zeros beyond
/// them, so a human reads the amount without unit arithmetic.
impl fmt::Display for MicroUsd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dollars = self.0 / PER_USD;
        let mut fraction = format!("{:06}", self.0 % PER_USD);
        while fraction.len() > 2 && fraction.ends_with('0') {
            fraction.pop();
        }
        write!(f, "${dollars}.{fraction}")
    }
}

/// A text that is not an amount of US dollars.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not an amount of US dollars like 0.50 or 12 (at most 6 decimals, not negative): {why}"
)]
pub struct BadUsd {
    /// The text as given.
    pub text: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// Parses a decimal amount of dollars (`12`, `0.5`, `$0.000150`) exactly: decimal text is
/// never rounded through a float, and more precision than a micro-dollar is refused
/// rather than silently dropped.
impl FromStr for MicroUsd {
    type Err = BadUsd;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why| BadUsd {
            text: text.to_owned(),
            why,
        };
        let digits = text.trim();
        let digits = digits.strip_prefix('$').unwrap_or(digits);
        let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
        if whole.is_empty() && fraction.is_empty() {
            return Err(bad("no digits"));
        }
        if !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
        {
            return Err(bad("only digits and one decimal point are allowed"));
        }
        if fraction.len() > 6 {
            return Err(bad("more precise than a micro-dollar"));
        }
        let whole: u64 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| bad("too large"))?
        };
        let fraction: u64 = format!("{fraction:0<6}")
            .parse()
            .map_err(|_| bad("only digits and one decimal point are allowed"))?;
        whole
            .checked_mul(PER_USD)
            .and_then(|micros| micros.checked_add(fraction))
            .map(MicroUsd)
            .ok_or_else(|| bad("too large"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_dollars_parse_exactly() {
        for (text, micros) in [
            ("0", 0),
            ("12", 12_000_000),
            ("0.5", 500_000),
            ("$2.50", 2_500_000),
            (".25", 250_000),
            ("3.", 3_000_000),
            ("0.000001", 1),
            (" 0.15 ", 150_000),
            ("18446744073709.551615", u64::MAX),
        ] {
            assert_eq!(text.parse::<MicroUsd>(), Ok(MicroUsd(micros)), "{text}");
        }
        for bad in [
            "",
            ".",
            "$",
            "-1",
            "1e-3",
            "0.0000001",
            "1.2.3",
            "1,5",
            "NaN",
            "18446744073709.551616",
        ] {
            assert!(bad.parse::<MicroUsd>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn amounts_display_as_dollars_and_parse_back() {
        for (micros, shown) in [
            (0, "$0.00"),
            (1_500_000, "$1.50"),
            (150, "$0.00015"),
            (1, "$0.000001"),
            (12_345_678, "$12.345678"),
        ] {
            assert_eq!(MicroUsd(micros).to_string(), shown);
            assert_eq!(shown.parse::<MicroUsd>(), Ok(MicroUsd(micros)));
        }
        assert_eq!(serde_json::to_string(&MicroUsd(150)).unwrap(), "150");
    }
}
