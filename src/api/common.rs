//! Types shared by the three custom resources.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A non-negative decimal written as a Kubernetes quantity string in plain
/// decimal form, such as `"560"`, `"1.80"` or `"0.45"`.
///
/// The string is kept as written (so that a round trip through the API server
/// changes nothing); [`Decimal::value`] gives the number.
#[derive(Clone, PartialEq)]
pub struct Decimal {
    raw: String,
    value: f64,
}

/// The pattern every decimal quantity must match (also enforced by the schema).
pub const DECIMAL_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?$";

/// Why a string is not a [`Decimal`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecimalError {
    /// Not digits with an optional fraction (a sign, an exponent, a unit...).
    #[error(
        "{raw:?} is not a decimal quantity (expected digits with an optional fraction, e.g. \"93.6\")"
    )]
    Syntax {
        /// The string as given.
        raw: String,
    },
    /// Digits that `f64` would not parse.
    #[error("{raw:?} is not a decimal quantity: {source}")]
    Number {
        /// The string as given.
        raw: String,
        /// The parser's complaint.
        #[source]
        source: std::num::ParseFloatError,
    },
    /// Too large for an `f64`.
    #[error("{raw:?} is out of range")]
    OutOfRange {
        /// The string as given.
        raw: String,
    },
}

impl Decimal {
    /// Parses a plain decimal string (`"93.6"`). Signs, exponents and unit
    /// suffixes are rejected.
    pub fn parse(raw: &str) -> Result<Self, DecimalError> {
        let mut parts = raw.splitn(2, '.');
        let int = parts.next().unwrap_or_default();
        let frac = parts.next();
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(int) || frac.is_some_and(|f| !digits(f)) {
            return Err(DecimalError::Syntax {
                raw: raw.to_owned(),
            });
        }
        let value: f64 = raw.parse().map_err(|source| DecimalError::Number {
            raw: raw.to_owned(),
            source,
        })?;
        if !value.is_finite() {
            return Err(DecimalError::OutOfRange {
                raw: raw.to_owned(),
            });
        }
        Ok(Self {
            raw: raw.to_owned(),
            value,
        })
    }

    /// Builds a decimal from a number (used by tests and defaults).
    pub fn from_f64(value: f64) -> Self {
        assert!(
            value.is_finite() && value >= 0.0,
            "decimal must be finite and >= 0"
        );
        Self {
            raw: format_number(value),
            value,
        }
    }

    /// The numeric value.
    pub fn value(&self) -> f64 {
        self.value
    }

    /// The string as written.
    pub fn as_str(&self) -> &str {
        &self.raw
    }
}

/// Unix seconds as an RFC 3339 timestamp (falls back to the number when out
/// of range).
pub fn rfc3339(secs: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map_or_else(|_| secs.to_string(), |t| t.to_string())
}

/// An RFC 3339 timestamp as Unix seconds.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_second())
}

/// Formats a number with at most six decimals and no trailing zeros.
pub fn format_number(value: f64) -> String {
    let s = format!("{value:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_owned()
    } else {
        s.to_owned()
    }
}

impl fmt::Debug for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.raw)
    }
}

impl fmt::Display for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl Serialize for Decimal {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.raw)
    }
}

impl<'de> Deserialize<'de> for Decimal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Decimal::parse(&raw).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Decimal {
    fn schema_name() -> Cow<'static, str> {
        "Decimal".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DECIMAL_PATTERN,
        })
    }
}
