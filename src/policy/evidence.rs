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
//! - A profile's step rests on its capacity (measured, else derived from
//!   calibration numbers unless a stale calibration holds them) and every
//!   lane's demand (`Evidence`).
//! - A lane released by a step down (a pause lifted, a cap removed or
//!   raised) ramps: for each stage of `hysteresis.recovery` it may exceed its
//!   pre-release rate by only that percentage of what it regains.

use std::collections::BTreeMap;

use crate::api::{
    CapacityProfile, DegradationPolicy, LaneContract, ObjectKey, ProfileState, Ramp, RecoverySpec,
    StaleCalibrationMode,
};
use crate::snapshot::{GOODPUT_SIGNAL, ProfileSignals, Snapshot};

use super::allocation::EPS;
use super::bind::Binding;
use super::decision::Telemetry;

/// The name of the measured-capacity signal.
pub const CAPACITY_SIGNAL: &str = "availableUnitsPerSecond";

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
    // While the evidence is Unknown the ramp stays where it was then.
    let now = ramp.blind_since.map_or(at, |b| b.min(at));
    let elapsed = (now - ramp.since).max(0);
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

/// Capacity from the signals: [`capacity_measured`], lowered to the
/// gateway's goodput while saturated when that is lower
/// ([`lowered_by_goodput`]).
fn capacity_of(
    profile: &CapacityProfile,
    sig: Option<&ProfileSignals>,
) -> (Option<f64>, Option<String>, Option<u32>) {
    let (capacity, source, ready) = capacity_measured(profile, sig);
    let (capacity, source) = lowered_by_goodput(capacity, source, sig);
    (capacity, source, ready)
}

/// The gateway's evidence applied to a capacity: while the gateway is
/// saturated (every in-flight slot taken, requests waiting for one), what
/// the pool completed through it is what the pool can do now, so the
/// capacity is the lower of the two; that is how a capacity drop shows one
/// scrape after the gateway sees it, before the capacity signal (or a
/// count of ready replicas, which does not move when a provider degrades)
/// does. The evidence only ever lowers: absent (not saturated) it changes
/// nothing, it never raises a capacity, and it never stands in for an
/// Unknown one. A configured source that failed (listed in `unknown`)
/// makes the capacity Unknown, so nothing relaxes on it.
pub fn lowered_by_goodput(
    capacity: Option<f64>,
    source: Option<String>,
    sig: Option<&ProfileSignals>,
) -> (Option<f64>, Option<String>) {
    let Some(sig) = sig else {
        return (capacity, source);
    };
    if sig.unknown.contains_key(GOODPUT_SIGNAL) {
        return (None, None);
    }
    match (capacity, valid(sig.gateway_goodput_while_saturated)) {
        (Some(c), Some(g)) if g < c => (Some(g), Some(GOODPUT_SIGNAL.into())),
        _ => (capacity, source),
    }
}

/// Capacity from the measuring signals: available capacity, else ready
/// replicas × units per replica, else ready pods × units per replica. With
/// a stale calibration and `onStaleCalibration: Hold`, only the measured
/// available capacity counts (the rest is derived from calibration
/// numbers).
fn capacity_measured(
    profile: &CapacityProfile,
    sig: Option<&ProfileSignals>,
) -> (Option<f64>, Option<String>, Option<u32>) {
    let Some(sig) = sig else {
        return (None, None, None);
    };
    let upr = profile.spec.capacity.units_per_replica.value();
    let measured_capacity_missing =
        sig.available_units_per_second.is_none() && sig.unknown.contains_key(CAPACITY_SIGNAL);
    let ready_pods = sig.ready_pods();
    let ready = sig.ready_replicas.or(if sig.pods.is_empty() {
        None
    } else {
        Some(ready_pods)
    });
    if measured_capacity_missing {
        return (None, None, ready);
    }
    if let Some(a) = sig.available_units_per_second {
        return (Some(a), Some(CAPACITY_SIGNAL.into()), ready);
    }
    if calibration_held(profile, Some(sig)) {
        return (None, None, ready);
    }
    if let Some(r) = sig.ready_replicas {
        return (Some(r as f64 * upr), Some("readyReplicas".into()), ready);
    }
    if ready_pods > 0 {
        return (
            Some(ready_pods as f64 * upr),
            Some("readyPods".into()),
            ready,
        );
    }
    (None, None, ready)
}

/// Whether the capacity derived from calibration numbers is Unknown in this
/// step: the calibration is stale and the profile says `Hold`.
pub fn calibration_held(profile: &CapacityProfile, sig: Option<&ProfileSignals>) -> bool {
    sig.is_some_and(|s| s.calibration_stale.is_some())
        && profile.spec.capacity.on_stale_calibration == StaleCalibrationMode::Hold
}

/// What one profile's step rests on: its signals, its capacity and each
/// lane's demand, the lanes in priority order.
pub(super) struct Evidence<'a> {
    /// The profile's signals, sanitized.
    pub(super) sig: Option<ProfileSignals>,
    /// Capacity (None = unknown).
    pub(super) capacity: Option<f64>,
    /// Where capacity came from.
    pub(super) capacity_source: Option<String>,
    /// Ready replicas (or pods).
    pub(super) ready: Option<u32>,
    /// Whether capacity is known.
    pub(super) telemetry: Telemetry,
    /// Whether a stale calibration holds the calibrated capacity Unknown.
    pub(super) held: bool,
    /// The lanes, by priority then name.
    pub(super) lanes: Vec<&'a LaneContract>,
    /// Each lane's demand.
    pub(super) demands: Vec<LaneDemand>,
    /// Whether every lane's rate is known (none held).
    pub(super) lanes_known: bool,
    /// Evidence is complete when capacity and every lane's rate are known;
    /// otherwise nothing relaxes in this step.
    pub(super) complete: bool,
    /// Total demand in work units/s.
    pub(super) total_demand: f64,
    /// Demand ÷ capacity in percent.
    pub(super) utilization: Option<f64>,
}

impl<'a> Evidence<'a> {
    /// Reads the profile's signals and each lane's demand from the snapshot.
    pub(super) fn gather(b: &Binding<'a>, snapshot: &Snapshot, prev: &ProfileState) -> Self {
        let profile = b.profile;
        let sig = snapshot
            .profiles
            .get(&profile.key())
            .map(ProfileSignals::sanitized);
        let (capacity, capacity_source, ready) = capacity_of(profile, sig.as_ref());
        let telemetry = if capacity.is_some() {
            Telemetry::Known
        } else {
            Telemetry::Unknown
        };
        let held = calibration_held(profile, sig.as_ref());
        let mut lanes: Vec<&LaneContract> = b.lanes.clone();
        lanes.sort_by(|a, c| (a.spec.priority, a.name_str()).cmp(&(c.spec.priority, c.name_str())));
        let demands: Vec<LaneDemand> = lanes
            .iter()
            .map(|l| lane_demand(l, snapshot, &prev.lane_rates))
            .collect();
        let lanes_known = demands.iter().all(|d| d.source != DemandSource::Held);
        let total_demand: f64 = demands.iter().map(|d| d.units).sum();
        Evidence {
            sig,
            capacity,
            capacity_source,
            ready,
            telemetry,
            held,
            lanes,
            demands,
            lanes_known,
            complete: capacity.is_some() && lanes_known,
            total_demand,
            utilization: capacity.and_then(|c| (c > EPS).then(|| total_demand / c * 100.0)),
        }
    }
}

/// The policy's staged recovery, if it has one.
pub(super) fn recovery_of(policy: Option<&DegradationPolicy>) -> Option<&RecoverySpec> {
    policy.and_then(|p| p.spec.hysteresis.recovery.as_ref())
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

    fn goodput(g: Option<f64>) -> ProfileSignals {
        ProfileSignals {
            gateway_goodput_while_saturated: g,
            ..Default::default()
        }
    }

    #[test]
    fn goodput_while_saturated_lowers_the_capacity_and_never_raises_it() {
        let measured = || (Some(560.0), Some(CAPACITY_SIGNAL.to_owned()));
        // Saturated at 420: the pool does 420 now, whatever the signal says.
        let (c, src) = lowered_by_goodput(measured().0, measured().1, Some(&goodput(Some(420.0))));
        assert_eq!(c, Some(420.0));
        assert_eq!(src.as_deref(), Some(GOODPUT_SIGNAL));
        // Saturated above the measured capacity: the measurement stands.
        let (c, src) = lowered_by_goodput(measured().0, measured().1, Some(&goodput(Some(600.0))));
        assert_eq!(c, Some(560.0), "never above the measured capacity");
        assert_eq!(src.as_deref(), Some(CAPACITY_SIGNAL));
        // Not saturated (absent): nothing changes.
        let (c, _) = lowered_by_goodput(measured().0, measured().1, Some(&goodput(None)));
        assert_eq!(c, Some(560.0));
        // No signals at all: nothing changes.
        assert_eq!(lowered_by_goodput(Some(560.0), None, None).0, Some(560.0));
        // An Unknown capacity stays Unknown: a lower bound does not stand
        // in for it.
        let (c, src) = lowered_by_goodput(None, None, Some(&goodput(Some(420.0))));
        assert_eq!((c, src), (None, None));
    }

    #[test]
    fn a_failed_goodput_source_makes_the_capacity_unknown() {
        let mut sig = goodput(None);
        sig.unknown
            .insert(GOODPUT_SIGNAL.to_owned(), "timeout".to_owned());
        let (c, src) = lowered_by_goodput(Some(560.0), Some(CAPACITY_SIGNAL.into()), Some(&sig));
        assert_eq!((c, src), (None, None), "missing is Unknown, never relaxes");
        // Garbage is Unknown too (the snapshot's sanitizing says so).
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let clean = goodput(Some(bad)).sanitized();
            assert!(clean.unknown.contains_key(GOODPUT_SIGNAL), "{bad}");
            assert_eq!(lowered_by_goodput(Some(560.0), None, Some(&clean)).0, None);
        }
    }

    #[test]
    fn a_ramp_goes_one_then_ten_percent_then_all() {
        let r = Ramp {
            since: 1000,
            base: 0.0,
            blind_since: None,
        };
        assert_eq!(ramp_stage(&r, &spec(), 1000), Some(1));
        assert_eq!(ramp_stage(&r, &spec(), 1299), Some(1));
        assert_eq!(ramp_stage(&r, &spec(), 1300), Some(10));
        assert_eq!(ramp_stage(&r, &spec(), 1599), Some(10));
        assert_eq!(ramp_stage(&r, &spec(), 1600), None);
        // Blind since 1299: it stays at 1 % however long that lasts.
        let blind = Ramp {
            blind_since: Some(1299),
            ..r.clone()
        };
        assert_eq!(ramp_stage(&blind, &spec(), 5000), Some(1));
        assert!((ramped(49.0, &r, 1) - 0.49).abs() < 1e-9);
        let capped = Ramp {
            since: 0,
            base: 60.0,
            blind_since: None,
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
