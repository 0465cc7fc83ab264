//! Evidence and recovery: what a lane's demand rests on, what holds when
//! evidence is missing, and how released lanes come back in stages.
//!
//! - A lane's rate is **Observed** (its source gave a number), **Held** (its
//!   configured source failed, or a signals file says `.nan` or lists it under
//!   `unknown`: the last known rate holds) or **Expected** (it has no rate
//!   source at all: `expectedRequestsPerSecond`).
//! - A step whose evidence is incomplete (capacity unknown, or any lane's rate
//!   held) relaxes nothing: no admitted rate rises above the previous step's,
//!   desired replicas do not fall, no pod is undrained for health, and the
//!   ladder does not step down.
//! - A lane released by a step down (a pause lifted, a cap removed or
//!   raised) ramps: for each stage of `hysteresis.recovery` it may exceed its
//!   pre-release rate by only that percentage of what it regains.

use std::collections::BTreeMap;

use crate::api::{LaneContract, ObjectKey, Ramp, RecoverySpec};
use crate::snapshot::Snapshot;

/// Where a lane's rate came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DemandSource {
    /// A source measured it.
    Observed,
    /// The source failed: the last known rate holds.
    Held,
    /// No source: the contract's `expectedRequestsPerSecond`.
    Expected,
}

impl DemandSource {
    /// As written in decisions and status.
    pub fn as_str(self) -> &'static str {
        match self {
            DemandSource::Observed => "Observed",
            DemandSource::Held => "Held",
            DemandSource::Expected => "Expected",
        }
    }
}

/// A lane's demand in one step.
#[derive(Clone, Debug)]
pub struct LaneDemand {
    /// Original requests/s used for demand.
    pub rps: f64,
    /// Demand in work units/s.
    pub units: f64,
    /// Where `rps` came from.
    pub source: DemandSource,
    /// Extra attempts/s (retries), when measured.
    pub retries: Option<f64>,
    /// Whether a configured retry signal is unknown.
    pub retries_unknown: bool,
}

impl LaneDemand {
    /// Attempts ÷ originals, when both are known and originals are positive.
    pub fn amplification(&self) -> Option<f64> {
        let r = self.retries?;
        (self.source == DemandSource::Observed && self.rps > 0.0).then(|| (self.rps + r) / self.rps)
    }
}

fn valid(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite() && *x >= 0.0)
}

/// The lane's demand: observed, held (last known) or expected.
pub fn lane_demand(
    lane: &LaneContract,
    snapshot: &Snapshot,
    last_rates: &BTreeMap<String, f64>,
) -> LaneDemand {
    let expected = lane.spec.expected_requests_per_second.value();
    let sig = snapshot.lanes.get(&lane.key());
    let (rps, source) = match sig {
        None => (expected, DemandSource::Expected),
        Some(s) => {
            // A value that is not a finite, non-negative number is garbage
            // and counts as unknown, never as zero.
            let garbage = s.requests_per_second.is_some() && valid(s.requests_per_second).is_none();
            match valid(s.requests_per_second) {
                Some(v) if !s.unknown.contains_key("requestsPerSecond") => {
                    (v, DemandSource::Observed)
                }
                _ if garbage || s.unknown.contains_key("requestsPerSecond") => (
                    last_rates.get(lane.name_str()).copied().unwrap_or(expected),
                    DemandSource::Held,
                ),
                _ => (expected, DemandSource::Expected),
            }
        }
    };
    let retries_unknown = sig.is_some_and(|s| {
        s.unknown.contains_key("retryRequestsPerSecond")
            || (s.retry_requests_per_second.is_some()
                && valid(s.retry_requests_per_second).is_none())
    });
    LaneDemand {
        rps,
        units: rps * lane.spec.work_units_per_request.value(),
        source,
        retries: sig
            .and_then(|s| valid(s.retry_requests_per_second))
            .filter(|_| !retries_unknown),
        retries_unknown,
    }
}

/// The profile's retry amplification: all attempts ÷ originals over the
/// lanes whose originals and retries are both measured.
pub fn amplification(demands: &[LaneDemand]) -> Option<f64> {
    let measured: Vec<&LaneDemand> = demands
        .iter()
        .filter(|d| d.source == DemandSource::Observed && d.retries.is_some())
        .collect();
    let originals: f64 = measured.iter().map(|d| d.rps).sum();
    let retries: f64 = measured.iter().filter_map(|d| d.retries).sum();
    (!measured.is_empty() && originals > 0.0).then(|| (originals + retries) / originals)
}

/// When the last running ramp ends (None without ramps or recovery).
pub fn ramping_until(ramps: &BTreeMap<String, Ramp>, spec: Option<&RecoverySpec>) -> Option<i64> {
    let spec = spec?;
    let length = spec.step_seconds * spec.steps_percent.len() as i64;
    ramps.values().map(|r| r.since + length).max()
}

/// The stage of a ramp at `at`: the percentage in force, or None once done.
pub fn ramp_stage(ramp: &Ramp, spec: &RecoverySpec, at: i64) -> Option<i32> {
    let elapsed = (at - ramp.since).max(0);
    let idx = elapsed / spec.step_seconds.max(1);
    spec.steps_percent.get(idx as usize).copied()
}

/// The admitted rate of a ramping lane: its pre-release rate plus `percent`
/// of what it would regain.
pub fn ramped(full: f64, ramp: &Ramp, percent: i32) -> f64 {
    if full <= ramp.base {
        return full;
    }
    ramp.base + (full - ramp.base) * f64::from(percent) / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RecoverySpec {
        RecoverySpec {
            steps_percent: vec![1, 10],
            step_seconds: 300,
        }
    }

    #[test]
    fn a_ramp_goes_one_then_ten_percent_then_all() {
        let r = Ramp {
            since: 1000,
            base: 0.0,
        };
        assert_eq!(ramp_stage(&r, &spec(), 1000), Some(1));
        assert_eq!(ramp_stage(&r, &spec(), 1299), Some(1));
        assert_eq!(ramp_stage(&r, &spec(), 1300), Some(10));
        assert_eq!(ramp_stage(&r, &spec(), 1599), Some(10));
        assert_eq!(ramp_stage(&r, &spec(), 1600), None);
        assert!((ramped(49.0, &r, 1) - 0.49).abs() < 1e-9);
        let capped = Ramp {
            since: 0,
            base: 60.0,
        };
        assert!((ramped(99.0, &capped, 10) - 63.9).abs() < 1e-9);
        assert_eq!(
            ramped(50.0, &capped, 10),
            50.0,
            "never below what it gets anyway"
        );
        let ramps = BTreeMap::from([("p4".to_owned(), r)]);
        assert_eq!(ramping_until(&ramps, Some(&spec())), Some(1600));
        assert_eq!(ramping_until(&ramps, None), None);
    }
}
