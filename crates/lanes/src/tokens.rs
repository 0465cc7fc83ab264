//! A lane's token settings in `lanes.json`: what a request costs counted in
//! tokens (`cost`) and the limits on its shape (`tokens`), checked when the
//! document is.

use serde::{Deserialize, Serialize};

use crate::config::LaneConfig;
use crate::validate::ConfigError;

/// The cost of one request in work units (the contract's `spec.cost`):
/// `perRequest + perInputToken × input + perOutputToken × output`. Absent
/// terms are 0.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenCost {
    /// Work units of every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_request: Option<f64>,
    /// Work units per input token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_input_token: Option<f64>,
    /// Work units per output token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_output_token: Option<f64>,
}

impl TokenCost {
    /// The cost of a request with `input` and `output` tokens.
    pub fn of(&self, input: u64, output: u64) -> f64 {
        self.per_request.unwrap_or(0.0)
            + self.per_input_token.unwrap_or(0.0) * input as f64
            + self.per_output_token.unwrap_or(0.0) * output as f64
    }
}

/// Limits on one request's shape (the contract's `spec.tokens`, with the
/// level's `capOutputTokens`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenLimits {
    /// Most input tokens (estimated from the body): more is refused with
    /// 413 `context_too_long` before admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_input_tokens: Option<u64>,
    /// Most output tokens a request may ask for (the contract's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    /// Most output tokens under the current level (`capOutputTokens`);
    /// the lower of this and `maxOutputTokens` applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_output_tokens: Option<u64>,
}

impl TokenLimits {
    /// The output limit in force: the lower of the contract's and the
    /// level's.
    pub fn output_limit(&self) -> Option<u64> {
        match (self.max_output_tokens, self.cap_output_tokens) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether a request's shape needs checking at all.
    pub fn is_empty(&self) -> bool {
        self.max_input_tokens.is_none() && self.output_limit().is_none()
    }
}

/// Costs finite and >= 0 with one above 0; token limits >= 1.
pub(crate) fn check_tokens(l: &LaneConfig) -> Result<(), ConfigError> {
    let bad = |field: &'static str, value: String, expected: &'static str| ConfigError::Field {
        lane: l.name.clone(),
        field,
        value,
        expected,
    };
    if let Some(c) = &l.cost {
        let terms = [
            ("cost.perRequest", c.per_request),
            ("cost.perInputToken", c.per_input_token),
            ("cost.perOutputToken", c.per_output_token),
        ];
        for (field, v) in terms {
            if let Some(v) = v.filter(|v| !(v.is_finite() && *v >= 0.0)) {
                return Err(bad(field, v.to_string(), "must be a finite number >= 0"));
            }
        }
        if !terms.iter().any(|(_, v)| v.is_some_and(|v| v > 0.0)) {
            return Err(bad(
                "cost",
                "0".to_owned(),
                "must have at least one term above 0",
            ));
        }
    }
    if let Some(t) = &l.tokens {
        for (field, v) in [
            ("tokens.maxInputTokens", t.max_input_tokens),
            ("tokens.maxOutputTokens", t.max_output_tokens),
            ("tokens.capOutputTokens", t.cap_output_tokens),
        ] {
            if v == Some(0) {
                return Err(bad(field, "0".to_owned(), "must be >= 1"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{config, lane};
    use crate::validate::validate;

    #[test]
    fn the_output_limit_is_the_lower_of_the_contracts_and_the_levels() {
        let l = |max, cap| TokenLimits {
            max_input_tokens: None,
            max_output_tokens: max,
            cap_output_tokens: cap,
        };
        assert_eq!(l(Some(512), Some(128)).output_limit(), Some(128));
        assert_eq!(l(Some(64), Some(128)).output_limit(), Some(64));
        assert_eq!(l(None, Some(128)).output_limit(), Some(128));
        assert_eq!(l(Some(512), None).output_limit(), Some(512));
        assert_eq!(l(None, None).output_limit(), None);
        assert!(l(None, None).is_empty());
    }

    #[test]
    fn a_request_costs_its_terms() {
        let c = TokenCost {
            per_request: Some(0.5),
            per_input_token: Some(0.001),
            per_output_token: None,
        };
        assert!((c.of(1000, 50) - 1.5).abs() < 1e-12);
    }

    #[test]
    fn bad_costs_and_limits_are_refused_with_their_field() {
        let with = |cost: Option<TokenCost>, tokens: Option<TokenLimits>| {
            let mut l = lane("a", 1.0, 1);
            l.cost = cost;
            l.tokens = tokens;
            validate(&config(vec![l]))
        };
        let cost = |r: Option<f64>, i: Option<f64>| {
            Some(TokenCost {
                per_request: r,
                per_input_token: i,
                per_output_token: None,
            })
        };
        assert!(with(cost(Some(0.0), Some(0.001)), None).is_ok());
        for (c, field) in [
            (cost(Some(-1.0), Some(1.0)), "cost.perRequest"),
            (cost(None, Some(f64::NAN)), "cost.perInputToken"),
            (cost(Some(0.0), None), "cost"),
            (cost(None, None), "cost"),
        ] {
            let err = with(c, None).unwrap_err();
            assert!(
                matches!(err, ConfigError::Field { field: f, .. } if f == field),
                "{err}"
            );
        }
        let zero = TokenLimits {
            max_input_tokens: Some(0),
            ..Default::default()
        };
        assert!(with(None, Some(zero)).is_err());
        let ok = TokenLimits {
            max_input_tokens: Some(1),
            max_output_tokens: Some(1),
            cap_output_tokens: Some(1),
        };
        assert!(with(None, Some(ok)).is_ok());
    }
}
