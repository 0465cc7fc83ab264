//! A lane's objective (`LaneContract.spec.objective`), its error-budget
//! bands and what status reports of them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::common::Decimal;
use crate::snapshot::BurnRates;

/// The lane's objective: the share of qualified outcomes that must be good
/// over a rolling window. Good: answered within the deadline. Bad: admitted
/// then failed, timed out or answered late, or refused while the lane was
/// inside its floor. Refusals the contract allows are not counted.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectiveSpec {
    /// Percent of qualified outcomes that must be good, a decimal strictly
    /// between 0 and 100, e.g. `"99.9"` (an error budget of 0.1 %).
    #[x_kube(validation = Rule::new("quantity(self).isGreaterThan(quantity('0')) && quantity(self).isLessThan(quantity('100'))").message("withinDeadlinePercent must be within (0, 100)"))]
    pub within_deadline_percent: Decimal,
    /// The p99 latency the lane aims at, in seconds (a decimal): `rules`
    /// records it and alerts when the p99 upstream latency stays above it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("quantity(self).isGreaterThan(quantity('0'))").message("latencyP99Seconds must be greater than 0"))]
    pub latency_p99_seconds: Option<Decimal>,
    /// The rolling window of the objective: a whole number of minutes,
    /// hours, days or weeks (`90m`, `6h`, `28d`, `4w`), at least `1h`.
    #[serde(default = "default_window")]
    #[x_kube(validation = Rule::new("self.matches('^[1-9][0-9]*(m|h|d|w)$')").message("window must be a whole number of minutes, hours, days or weeks, such as 28d"))]
    #[x_kube(validation = Rule::new("!self.endsWith('m') || self.matches('^([6-9][0-9]|[1-9][0-9][0-9]+)m$')").message("window must be at least 1h"))]
    pub window: String,
}

/// The default objective window.
pub const DEFAULT_WINDOW: &str = "28d";

fn default_window() -> String {
    DEFAULT_WINDOW.to_owned()
}

impl ObjectiveSpec {
    /// The error budget as a fraction of qualified outcomes (`0.001` for
    /// 99.9 %).
    pub fn budget_fraction(&self) -> f64 {
        (100.0 - self.within_deadline_percent.value()) / 100.0
    }

    /// The window in seconds (None: not a valid duration).
    pub fn window_seconds(&self) -> Option<i64> {
        window_seconds(&self.window)
    }
}

/// Seconds in a `window` (`90m`, `6h`, `28d`, `4w`); None when it is not
/// one.
pub fn window_seconds(w: &str) -> Option<i64> {
    let unit = w.chars().last()?;
    let n: i64 = w[..w.len() - unit.len_utf8()].parse().ok()?;
    let per = match unit {
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        'w' => 604_800,
        _ => return None,
    };
    (n > 0).then_some(n.checked_mul(per)?)
}

/// A lane's error-budget band: what its budget allows for changes.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord,
)]
pub enum Band {
    /// More than 50 % of the budget left: routine releases and canaries.
    Routine,
    /// 20–50 % left: smaller changes, more observation.
    Cautious,
    /// 0–20 % left, or budget data Unknown: non-essential releases pause.
    Restricted,
    /// Nothing left: only reliability fixes, critical security fixes and
    /// owner-approved emergency changes.
    Exhausted,
}

impl Band {
    /// 0 for Routine up to 3 for Exhausted (the metric's value).
    pub fn severity(self) -> u8 {
        match self {
            Band::Routine => 0,
            Band::Cautious => 1,
            Band::Restricted => 2,
            Band::Exhausted => 3,
        }
    }

    /// The band's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Band::Routine => "Routine",
            Band::Cautious => "Cautious",
            Band::Restricted => "Restricted",
            Band::Exhausted => "Exhausted",
        }
    }
}

/// A lane's objective as status reports it.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectiveStatus {
    /// The budget band.
    pub band: Band,
    /// Error budget remaining over the window, in percent (absent: Unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_percent: Option<f64>,
    /// Burn rates by window (`5m`, `30m`, `1h`, `6h`; a missing window is
    /// Unknown).
    #[serde(default, skip_serializing_if = "BurnRates::is_empty")]
    #[schemars(schema_with = "burn_rates_schema")]
    pub burn_rates: BurnRates,
    /// When the lane entered this band.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

fn burn_rates_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let rate = |w: &str| serde_json::json!({"type": "number", "description": format!("Burn rate over the last {w}.")});
    schemars::json_schema!({
        "type": "object",
        "properties": {"5m": rate("5m"), "30m": rate("30m"), "1h": rate("1h"), "6h": rate("6h")},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse_in_minutes_hours_days_and_weeks() {
        assert_eq!(window_seconds("28d"), Some(28 * 86_400));
        assert_eq!(window_seconds("90m"), Some(5400));
        assert_eq!(window_seconds("1h"), Some(3600));
        assert_eq!(window_seconds("4w"), Some(4 * 604_800));
        for bad in [
            "",
            "d",
            "0h",
            "-1h",
            "1.5h",
            "1y",
            "28 d",
            "99999999999999999999w",
        ] {
            assert_eq!(window_seconds(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_budget_is_what_the_objective_leaves() {
        let o = ObjectiveSpec {
            within_deadline_percent: Decimal::parse("99.9").unwrap(),
            latency_p99_seconds: None,
            window: DEFAULT_WINDOW.into(),
        };
        assert!((o.budget_fraction() - 0.001).abs() < 1e-12);
        assert_eq!(o.window_seconds(), Some(2_419_200));
    }
}
