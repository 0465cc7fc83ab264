//! `LaneContract.spec.cost` and `LaneContract.spec.tokens`: what a request
//! of the lane costs in work units, counted in tokens, and the shape of a
//! request the gateway lets through.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::common::Decimal;

/// The cost of one request in work units, from its tokens:
/// `perRequest + perInputToken × input tokens + perOutputToken × output
/// tokens`. Capacity, floors, ceilings and the ladder keep their one unit.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.perRequest) && quantity(self.perRequest).isGreaterThan(quantity('0'))) || (has(self.perInputToken) && quantity(self.perInputToken).isGreaterThan(quantity('0'))) || (has(self.perOutputToken) && quantity(self.perOutputToken).isGreaterThan(quantity('0')))").message("cost must set at least one of perRequest, perInputToken, perOutputToken greater than 0"))]
pub struct LaneCost {
    /// Work units every request costs whatever its size (a decimal, `"0.2"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_request: Option<Decimal>,
    /// Work units per input (prompt) token (a decimal, `"0.0001"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_input_token: Option<Decimal>,
    /// Work units per output (completion) token (a decimal, `"0.002"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_output_token: Option<Decimal>,
}

/// Limits on the shape of one request, checked by the gateway before
/// admission.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LaneTokens {
    /// Most input tokens a request may carry (estimated from the body's
    /// size). A larger request is refused before admission with 413 and the
    /// error code `context_too_long`, and never reaches the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("maxInputTokens must be >= 1"))]
    pub max_input_tokens: Option<i64>,
    /// Most output tokens a request may ask for: a larger `max_tokens` (or
    /// `max_completion_tokens`) is lowered to it, and a request without one
    /// is given it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("maxOutputTokens must be >= 1"))]
    pub max_output_tokens: Option<i64>,
}

/// A level action: hold the selected lanes' answers to at most `tokens`
/// output tokens.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.priorityAtLeast) || (has(self.lanes) && size(self.lanes) > 0)").message("capOutputTokens needs priorityAtLeast or lanes"))]
pub struct CapOutputTokensAction {
    /// Selects lanes whose priority number is at least this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("priorityAtLeast must be >= 0"))]
    pub priority_at_least: Option<i32>,
    /// Selects lanes by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<String>,
    /// Most output tokens of one answer of a selected lane.
    #[x_kube(validation = Rule::new("self >= 1").message("tokens must be >= 1"))]
    pub tokens: i64,
}

impl CapOutputTokensAction {
    /// Whether the action selects a lane of this priority and name.
    pub fn selects(&self, priority: i32, name: &str) -> bool {
        self.priority_at_least.is_some_and(|p| priority >= p)
            || self.lanes.iter().any(|l| l == name)
    }
}
