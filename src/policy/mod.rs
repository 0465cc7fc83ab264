//! The decision engine: pure, deterministic, no I/O, no clock.
//!
//! Input: the specs, one signal snapshot (with its time) and the previous
//! state. Output: the decision per profile and the next state. The controller,
//! `plan` and `simulate` all call this same code.

mod actions;
pub mod allocation;
pub mod bind;
pub mod decision;
pub mod drain;
pub mod evidence;
pub mod ladder;
mod shares;
pub mod sizing;

use std::collections::BTreeMap;

use crate::api::{
    Approval, CapacityProfile, DegradationPolicy, LaneContract, ObjectKey, RecoverySpec,
    StaleCalibrationMode,
};
use crate::snapshot::{ProfileSignals, Snapshot};

pub use bind::{BindProblem, Binding, Bound, World, bind, bind_profile};
pub use decision::*;

pub use actions::contract_overrides;

use actions::{apply_actions, lane_cap};
use allocation::EPS;
use evidence::{DemandSource, LaneDemand, lane_demand};
use ladder::{LadderOutcome, LevelInputs};
use shares::Shares;
use sizing::Sizing;

/// The name of the measured-capacity signal.
pub const CAPACITY_SIGNAL: &str = "availableUnitsPerSecond";

/// Namespace/name key of an object.
pub fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

fn object_key<K: ObjectKey>(o: &K) -> String {
    o.key()
}

/// Approvals granted per profile (`namespace/name` → the approval).
pub type Approvals = BTreeMap<String, Approval>;

/// Evaluates every profile of the world against one snapshot.
pub fn evaluate(
    world: &World,
    snapshot: &Snapshot,
    approvals: &Approvals,
    prev: &EngineState,
) -> (Evaluation, EngineState) {
    let bound = bind(world);
    let mut next = EngineState::default();
    let mut decisions = Vec::with_capacity(bound.bindings.len());
    for b in &bound.bindings {
        let k = object_key(b.profile);
        let empty = ProfileState::default();
        let prev_state = prev.profiles.get(&k).unwrap_or(&empty);
        let (d, s) = evaluate_profile(b, snapshot, approvals.get(&k).copied(), prev_state);
        decisions.push(d);
        next.profiles.insert(k, s);
    }
    (
        Evaluation {
            at: snapshot.at,
            profiles: decisions,
            warnings: bound.warnings,
        },
        next,
    )
}

/// Capacity from the signals: available capacity, else ready replicas ×
/// units per replica, else ready pods × units per replica. With a stale
/// calibration and `onStaleCalibration: Hold`, only the measured available
/// capacity counts (the rest is derived from calibration numbers).
fn capacity_of(
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
struct Evidence<'a> {
    /// The profile's signals, sanitized.
    sig: Option<ProfileSignals>,
    /// Capacity (None = unknown).
    capacity: Option<f64>,
    /// Where capacity came from.
    capacity_source: Option<String>,
    /// Ready replicas (or pods).
    ready: Option<u32>,
    /// Whether capacity is known.
    telemetry: Telemetry,
    /// Whether a stale calibration holds the calibrated capacity Unknown.
    held: bool,
    /// The lanes, by priority then name.
    lanes: Vec<&'a LaneContract>,
    /// Each lane's demand.
    demands: Vec<LaneDemand>,
    /// Whether every lane's rate is known (none held).
    lanes_known: bool,
    /// Evidence is complete when capacity and every lane's rate are known;
    /// otherwise nothing relaxes in this step.
    complete: bool,
    /// Total demand in work units/s.
    total_demand: f64,
    /// Demand ÷ capacity in percent.
    utilization: Option<f64>,
}

impl<'a> Evidence<'a> {
    /// Reads the profile's signals and each lane's demand from the snapshot.
    fn gather(b: &Binding<'a>, snapshot: &Snapshot, prev: &ProfileState) -> Self {
        let profile = b.profile;
        let sig = snapshot
            .profiles
            .get(&object_key(profile))
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
fn recovery_of(policy: Option<&DegradationPolicy>) -> Option<&RecoverySpec> {
    policy.and_then(|p| p.spec.hysteresis.recovery.as_ref())
}

/// Evaluates one profile: the evidence, the ladder, the actions of its level,
/// each lane's share, the pool's size and drain; then the decision and the
/// next state.
pub fn evaluate_profile(
    b: &Binding<'_>,
    snapshot: &Snapshot,
    approval: Option<Approval>,
    prev: &ProfileState,
) -> (ProfileDecision, ProfileState) {
    let (profile, policy, at) = (b.profile, b.policy, snapshot.at);
    let ev = Evidence::gather(b, snapshot, prev);
    let ladder = climb(policy, &ev, at, approval, prev);
    let level = ladder.level;
    // Actions of all levels up to the current one.
    let (limits, mut warnings) = apply_actions(policy, level, &ev.lanes);
    let shares = shares::share(b, &ev, &ladder, &limits, prev, at);
    warnings.extend(overcommitted(ev.capacity, shares.floors_total));
    warnings.extend(b.warnings.iter().cloned().map(Warning::Binding));
    let lanes = shares::decisions(&ev, &shares, &limits, at);
    let admitted_total = shares.admitted_total();
    let (sizing, drain, drained) = pool_step(profile, &ev, level, at, prev);
    let next = next_state(&ev, &ladder, &sizing, drained, shares, prev);
    let decision = ProfileDecision {
        namespace: profile.namespace_str().to_owned(),
        name: profile.metadata.name.clone().unwrap_or_default(),
        policy: policy.map(object_key),
        telemetry: ev.telemetry,
        level,
        level_name: level_name(policy, level),
        pending_approval_level: ladder.pending,
        approval_consumed: ladder.approval_consumed.map(|a| a.level),
        approval_lapsed: ladder.approval_lapsed.map(|a| a.level),
        level_since: ladder.level_since,
        exit_holding_since: ladder.exit_since,
        transition: ladder.transition,
        triggers: ladder.triggers,
        capacity_units_per_second: ev.capacity.map(round6),
        capacity_source: ev.capacity_source,
        calibration_stale: ev.sig.as_ref().and_then(|s| s.calibration_stale),
        calibration_held: ev.held,
        demand_units_per_second: round6(ev.total_demand),
        admitted_units_per_second: round6(admitted_total),
        utilization_percent: ev.utilization.map(round6),
        ready_replicas: ev.ready,
        desired_replicas: sizing.desired,
        drain,
        warnings,
        gateway: actions::gateway_flags(profile, policy, level),
        lanes,
    };
    (decision, next)
}

/// The ladder's step: the demand after the actions of each level below, the
/// level inputs of this step, then `ladder::step`.
fn climb(
    policy: Option<&DegradationPolicy>,
    ev: &Evidence<'_>,
    at: i64,
    approval: Option<Approval>,
    prev: &ProfileState,
) -> LadderOutcome {
    let nlevels = policy.map_or(0, |p| p.spec.levels.len() as u32);
    // Demand after the actions of levels 1..k-1, for k = 1..=N.
    let demand_after: Vec<f64> = (0..nlevels.max(1))
        .map(|k| {
            let (limits, _) = apply_actions(policy, k, &ev.lanes);
            ev.lanes
                .iter()
                .zip(&ev.demands)
                .zip(&limits)
                .map(|((l, d), lim)| lane_cap(l, d.units, lim))
                .sum()
        })
        .collect();
    let inputs = LevelInputs {
        at,
        capacity: ev.capacity,
        utilization: ev.utilization,
        demand_after: &demand_after,
        lanes_known: ev.lanes_known,
        retry_amplification: evidence::amplification(&ev.demands),
        retries_unknown: ev.demands.iter().any(|d| d.retries_unknown),
        signals: ev.sig.as_ref(),
        approval,
        ramping_until: evidence::ramping_until(&prev.ramps, recovery_of(policy)),
    };
    ladder::step(policy, &inputs, prev)
}

/// The `Overcommitted` warning when the floors add up to more than a known
/// capacity.
fn overcommitted(capacity: Option<f64>, floors_total: f64) -> Option<Warning> {
    let c = capacity?;
    (floors_total > c + EPS).then(|| Warning::Overcommitted {
        floors: round6(floors_total),
        capacity: round6(c),
    })
}

/// The pool's size and drain in this step: sizing relaxes only on complete
/// evidence, and no pod is drained while the pool scales down.
fn pool_step(
    profile: &CapacityProfile,
    ev: &Evidence<'_>,
    level: u32,
    at: i64,
    prev: &ProfileState,
) -> (Sizing, Drain, BTreeMap<String, DrainedPod>) {
    let telemetry = if ev.complete {
        ev.telemetry
    } else {
        Telemetry::Unknown
    };
    let sizing = sizing::desired(
        profile,
        ev.total_demand,
        ev.ready,
        level,
        telemetry,
        at,
        prev,
    );
    let scaling_down = match (sizing.desired, ev.ready) {
        (Some(d), Some(r)) => (d as i64) < i64::from(r),
        _ => false,
    };
    let (drain, drained) = drain::decide(
        profile.spec.drain.as_ref(),
        ev.sig.as_ref(),
        at,
        ev.telemetry == Telemetry::Known && !scaling_down && ev.complete,
        !ev.complete,
        &prev.drained,
    );
    (sizing, drain, drained)
}

/// The name of the level (`normal` at 0).
fn level_name(policy: Option<&DegradationPolicy>, level: u32) -> String {
    match (policy, level) {
        (_, 0) | (None, _) => "normal".to_owned(),
        (Some(p), n) => p.spec.levels[(n - 1) as usize].name.clone(),
    }
}

/// The engine's state after this step.
fn next_state(
    ev: &Evidence<'_>,
    ladder: &LadderOutcome,
    sizing: &Sizing,
    drained: BTreeMap<String, DrainedPod>,
    shares: Shares,
    prev: &ProfileState,
) -> ProfileState {
    ProfileState {
        level: ladder.level,
        level_since: ladder.level_since,
        exit_since: ladder.exit_since,
        gate_since: ladder.gate_since.clone(),
        desired_replicas: sizing.desired,
        scale_down_since: sizing.scale_down_since,
        scale_down_want: sizing.scale_down_want,
        drained,
        last_capacity: ev.capacity.or(prev.last_capacity),
        trigger_since: ladder.trigger_since.clone(),
        episode_since: ladder.episode_since,
        stepped_down: ladder.stepped_down,
        admitted: ev
            .lanes
            .iter()
            .zip(&shares.allocations)
            .map(|(l, a)| (l.name_str().to_owned(), round6(a.admitted)))
            .collect(),
        lane_rates: lane_rates(ev, prev),
        ramps: shares.ramps,
        approval_used: ladder.approval_consumed.or(prev.approval_used),
    }
}

/// The lane rates to remember: the observed ones, and the last known rate of
/// each lane whose rate is held.
fn lane_rates(ev: &Evidence<'_>, prev: &ProfileState) -> BTreeMap<String, f64> {
    let lanes = || ev.lanes.iter().zip(&ev.demands);
    lanes()
        .filter(|(_, d)| d.source == DemandSource::Observed)
        .map(|(l, d)| (l.name_str().to_owned(), d.rps))
        .chain(
            prev.lane_rates
                .iter()
                .filter(|(k, _)| {
                    lanes()
                        .any(|(l, d)| l.name_str() == k.as_str() && d.source == DemandSource::Held)
                })
                .map(|(k, v)| (k.clone(), *v)),
        )
        .collect()
}
