//! The decision engine: pure, deterministic, no I/O, no clock.
//!
//! Input: the specs, one signal snapshot (with its time) and the previous
//! state. Output: the decision per profile and the next state. The controller,
//! `plan` and `simulate` all call this same code.

mod actions;
pub mod allocation;
pub mod bind;
pub mod budget;
mod burn;
pub mod cost_calibration;
pub mod decision;
pub mod drain;
pub mod evidence;
pub mod freeze;
pub mod gateway_config;
pub mod gateway_tokens;
mod in_flight;
pub mod ladder;
mod shares;
pub mod sizing;

use std::collections::BTreeMap;

use crate::api::{Approval, CapacityProfile, DegradationPolicy, ObjectKey};
use crate::snapshot::Snapshot;

pub use bind::{BindProblem, Binding, Bound, World, bind, bind_profile};
pub use decision::*;

pub use crate::snapshot::{GOODPUT_SIGNAL, KV_CACHE_SIGNAL};
pub use actions::contract_overrides;
pub use actions::long_context_without_limit;
pub use burn::lanes_without_objective;
pub use evidence::{CAPACITY_SIGNAL, calibration_held, lowered_by_goodput};

use actions::{apply_actions, lane_cap};
use allocation::EPS;
use evidence::{DemandSource, Evidence, recovery_of};
use ladder::{LadderOutcome, LevelInputs};
use shares::Shares;
use sizing::Sizing;

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
    let ladder = climb(policy, &ev, snapshot, approval, prev);
    let level = ladder.level;
    // Actions of all levels up to the current one.
    let (limits, mut warnings) = apply_actions(policy, level, &ev.lanes);
    let shares = shares::share(b, &ev, &ladder, &limits, prev, at);
    warnings.extend(overcommitted(ev.capacity, shares.floors_total));
    warnings.extend(in_flight::check(profile.spec.in_flight.as_ref(), &ev));
    warnings.extend(b.warnings.iter().cloned().map(Warning::Binding));
    if let Some(p) = policy {
        warnings.extend(burn::lanes_without_objective(p, &ev.lanes));
        warnings.extend(actions::long_context_without_limit(p, profile));
    }
    let mut lanes = shares::decisions(&ev, &shares, &limits, at);
    let (objectives, bands) = budget::objectives(&ev.lanes, snapshot, &prev.objectives);
    for (d, o) in lanes.iter_mut().zip(objectives) {
        d.objective = o;
    }
    for (d, l) in lanes.iter_mut().zip(&ev.lanes) {
        d.cost = cost_calibration::measured(l, snapshot.lanes.get(&object_key(*l)));
    }
    warnings.extend(cost_warnings(&lanes));
    let admitted_total = shares.admitted_total();
    let (sizing, drain, drained) = pool_step(profile, &ev, level, at, prev);
    let mut next = next_state(&ev, &ladder, &sizing, drained, shares, prev);
    next.objectives = bands;
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
        freeze: freeze::reported(&lanes),
        lanes,
    };
    (decision, next)
}

/// A `CostUnderestimated` warning for each lane whose measured P95 cost
/// per request is more than 20 % above its `workUnitsPerRequest`.
fn cost_warnings(lanes: &[LaneDecision]) -> Vec<Warning> {
    lanes
        .iter()
        .filter_map(|d| {
            let c = d.cost.as_ref()?;
            let measured = c.p95_cost_units_per_request?;
            (c.calibration == cost_calibration::CostCalibration::Underestimated).then(|| {
                Warning::CostUnderestimated {
                    lane: d.name.clone(),
                    measured,
                    declared: c.work_units_per_request,
                }
            })
        })
        .collect()
}

/// The ladder's step: the demand after the actions of each level below, the
/// level inputs of this step, then `ladder::step`.
fn climb(
    policy: Option<&DegradationPolicy>,
    ev: &Evidence<'_>,
    snapshot: &Snapshot,
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
    let at = snapshot.at;
    let inputs = LevelInputs {
        at,
        lanes: &snapshot.lanes,
        namespace: policy.map_or("", |p| p.namespace_str()),
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
        objectives: BTreeMap::new(),
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
