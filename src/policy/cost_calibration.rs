//! The cost calibration of a lane: what its requests are measured to cost
//! against what the engine counts them at.
//!
//! The engine turns a lane's requests per second into work units with its
//! `workUnitsPerRequest`, whether or not the lane has a `cost`: demand,
//! admitted requests per second and the pool's size all rest on it. A lane
//! with a `cost` is charged by tokens at the gateway, so each request costs
//! what its usage says; the gateway measures that cost per request, and
//! Prometheus gives its P95 (`p95CostUnitsPerRequest`). The admission
//! practice reserves a class's need at its P95, so `workUnitsPerRequest`
//! should cover the measured P95: when the P95 is more than
//! [`TOLERANCE`] (20 %) above it, the lane's demand is counted short and the
//! lane is `Underestimated` (a warning). Exactly 20 % above is still
//! `Calibrated`. No measurement (absent, `.nan`, listed as Unknown) is
//! `Unknown`: never a warning, never a pass.
//!
//! The gateway's own estimate (the reservation, learned per lane) is not
//! what is judged here: how far it was from the settled cost is the
//! `lanekeeper_gateway_lane_cost_estimate_ratio` histogram.

use serde::{Deserialize, Serialize};

use crate::api::LaneContract;
use crate::snapshot::LaneSignals;

/// How far above `workUnitsPerRequest` the measured P95 cost may be before
/// the lane is `Underestimated` (0.2: 20 %).
pub const TOLERANCE: f64 = 0.20;

/// Relative slack for the rounding of decimals (`1.2 × 0.5` is `0.6`).
const ROUNDING: f64 = 1e-9;

/// The verdict on a lane's `workUnitsPerRequest`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CostCalibration {
    /// The measured P95 cost is at most 20 % above `workUnitsPerRequest`.
    Calibrated,
    /// The measured P95 cost is more than 20 % above it.
    Underestimated,
    /// No measured P95 cost.
    Unknown,
}

impl CostCalibration {
    /// As written in decisions and conditions.
    pub fn as_str(self) -> &'static str {
        match self {
            CostCalibration::Calibrated => "Calibrated",
            CostCalibration::Underestimated => "Underestimated",
            CostCalibration::Unknown => "Unknown",
        }
    }
}

/// What is measured of a lane's requests, and the verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaneCostMeasured {
    /// P95 input tokens of a request (absent: Unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_input_tokens: Option<f64>,
    /// P95 output tokens of a request (absent: Unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_output_tokens: Option<f64>,
    /// P95 work units a request cost when settled (absent: Unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_cost_units_per_request: Option<f64>,
    /// The lane's `workUnitsPerRequest`.
    pub work_units_per_request: f64,
    /// The verdict.
    pub calibration: CostCalibration,
}

/// The verdict for a lane counted at `declared` work units a request whose
/// measured P95 cost is `measured`.
pub fn check(declared: f64, measured: Option<f64>) -> CostCalibration {
    match measured {
        None => CostCalibration::Unknown,
        Some(m) if m > declared * (1.0 + TOLERANCE) * (1.0 + ROUNDING) => {
            CostCalibration::Underestimated
        }
        Some(_) => CostCalibration::Calibrated,
    }
}

/// A measured value: finite, not negative, and not listed as Unknown.
fn known(v: Option<f64>, sig: &LaneSignals, name: &str) -> Option<f64> {
    v.filter(|x| x.is_finite() && *x >= 0.0)
        .filter(|_| !sig.unknown.contains_key(name))
}

/// The lane's measurements and verdict: for a lane with a `cost` (Unknown
/// without signals), or any lane something was measured for; None for the
/// others.
pub fn measured(lane: &LaneContract, sig: Option<&LaneSignals>) -> Option<LaneCostMeasured> {
    let empty = LaneSignals::default();
    let s = sig.unwrap_or(&empty);
    let p95_input_tokens = known(s.p95_input_tokens, s, "p95InputTokens");
    let p95_output_tokens = known(s.p95_output_tokens, s, "p95OutputTokens");
    let p95_cost = known(s.p95_cost_units_per_request, s, "p95CostUnitsPerRequest");
    let any = p95_input_tokens.is_some() || p95_output_tokens.is_some() || p95_cost.is_some();
    if lane.spec.cost.is_none() && !any {
        return None;
    }
    let declared = lane.spec.work_units_per_request.value();
    Some(LaneCostMeasured {
        p95_input_tokens,
        p95_output_tokens,
        p95_cost_units_per_request: p95_cost,
        work_units_per_request: declared,
        calibration: check(declared, p95_cost),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn exactly_twenty_percent_above_is_calibrated_and_more_is_not() {
        assert_eq!(check(1.0, Some(1.2)), CostCalibration::Calibrated);
        assert_eq!(check(0.5, Some(0.6)), CostCalibration::Calibrated);
        assert_eq!(check(2.5, Some(3.0)), CostCalibration::Calibrated);
        assert_eq!(check(1.0, Some(1.201)), CostCalibration::Underestimated);
        assert_eq!(check(0.5, Some(0.6001)), CostCalibration::Underestimated);
        assert_eq!(check(1.0, Some(0.3)), CostCalibration::Calibrated);
        assert_eq!(check(1.0, None), CostCalibration::Unknown);
    }

    fn lane(cost: bool) -> LaneContract {
        let mut spec = serde_json::json!({
            "profile": "pool", "priority": 1, "workUnitsPerRequest": "0.70", "expectedRequestsPerSecond": "5",
            "deadlineSeconds": 60, "queue": {"maxDepth": 1, "ttlSeconds": 1}, "retry": {"maxAttempts": 1},
            "routes": {"primary": ["m"]}, "shedding": {"mode": "Throttle"}
        });
        if cost {
            spec["cost"] = serde_json::json!({"perOutputToken": "0.004"});
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "LaneContract",
            "metadata": {"name": "p2", "namespace": "ns"}, "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn a_measurement_that_is_garbage_or_listed_unknown_is_unknown_never_zero() {
        let sig = |cost: Option<f64>, unknown: bool| LaneSignals {
            p95_cost_units_per_request: cost,
            unknown: if unknown {
                [("p95CostUnitsPerRequest".to_owned(), "stale".to_owned())].into()
            } else {
                Default::default()
            },
            ..Default::default()
        };
        let priced = lane(true);
        for s in [
            sig(None, false),
            sig(Some(f64::NAN), false),
            sig(Some(f64::INFINITY), false),
            sig(Some(-1.0), false),
            sig(Some(5.0), true),
        ] {
            let m = measured(&priced, Some(&s)).unwrap();
            assert_eq!(m.calibration, CostCalibration::Unknown, "{s:?}");
            assert_eq!(m.p95_cost_units_per_request, None);
        }
        let m = measured(&priced, None).unwrap();
        assert_eq!(m.calibration, CostCalibration::Unknown);
        let m = measured(&priced, Some(&sig(Some(0.85), false))).unwrap();
        assert_eq!(m.calibration, CostCalibration::Underestimated);
        assert_eq!(m.work_units_per_request, 0.7);
        // A lane without a cost is judged only when something is measured.
        assert_eq!(measured(&lane(false), None), None);
        assert_eq!(measured(&lane(false), Some(&sig(None, false))), None);
        let m = measured(&lane(false), Some(&sig(Some(0.84), false))).unwrap();
        assert_eq!(m.calibration, CostCalibration::Calibrated);
    }

    proptest! {
        /// The verdict follows the ratio: at most 1.2 (with rounding
        /// slack) is calibrated, above 1.2 by more than the slack is not.
        #[test]
        fn the_verdict_follows_the_ratio(declared in 0.001f64..1000.0, ratio in 0.0f64..3.0) {
            let v = check(declared, Some(declared * ratio));
            if ratio <= 1.2 {
                prop_assert_eq!(v, CostCalibration::Calibrated);
            } else if ratio > 1.2 * (1.0 + 1e-6) {
                prop_assert_eq!(v, CostCalibration::Underestimated);
            }
        }

        /// Missing is never a pass and never a warning.
        #[test]
        fn missing_is_unknown(declared in 0.001f64..1000.0) {
            prop_assert_eq!(check(declared, None), CostCalibration::Unknown);
        }
    }
}
