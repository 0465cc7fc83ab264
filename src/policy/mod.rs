//! The decision engine: pure, deterministic, no I/O, no clock.
//!
//! Input: the specs, one signal snapshot (with its time) and the previous
//! state. Output: the decision per profile and the next state. The controller,
//! `plan` and `simulate` all call this same code.

pub mod allocation;
pub mod bind;
pub mod decision;
pub mod drain;
pub mod evidence;
pub mod ladder;
pub mod sizing;

use std::collections::BTreeMap;

use crate::api::{
    Approval, CapacityProfile, DegradationPolicy, LaneContract, ObjectKey, Ramp, SheddingMode,
    StaleCalibrationMode,
};
use crate::snapshot::{ProfileSignals, Snapshot};

pub use bind::{BindProblem, Binding, Bound, World, bind, bind_profile};
pub use decision::*;

use allocation::{EPS, LaneClaim};
use evidence::{DemandSource, LaneDemand, lane_demand};
use ladder::LevelInputs;

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

/// How the level actions touch one lane.
#[derive(Clone, Debug, Default)]
struct LaneLimits {
    paused: bool,
    level_cap: Option<f64>,
}

/// Every action of the policy, at any level, that a lane contract overrides
/// (for the policy's `Valid` condition): the rule the engine applies, run
/// over the whole ladder.
pub fn contract_overrides(policy: &DegradationPolicy, lanes: &[&LaneContract]) -> Vec<Warning> {
    let (_, warnings) = apply_actions(Some(policy), policy.spec.levels.len() as u32, lanes);
    let mut texts: Vec<(String, Warning)> =
        warnings.into_iter().map(|w| (w.to_string(), w)).collect();
    texts.sort_by(|a, b| a.0.cmp(&b.0));
    texts.dedup_by(|a, b| a.0 == b.0);
    texts.into_iter().map(|(_, w)| w).collect()
}

/// Applies the actions of `levels` (1-based levels 1..=n) to each lane,
/// honouring contracts. Returns the limits and the overrides (warnings).
fn apply_actions(
    policy: Option<&DegradationPolicy>,
    upto: u32,
    lanes: &[&LaneContract],
) -> (Vec<LaneLimits>, Vec<Warning>) {
    let mut limits = vec![LaneLimits::default(); lanes.len()];
    let mut warnings = Vec::new();
    let Some(policy) = policy else {
        return (limits, warnings);
    };
    let pname = object_key(policy);
    for (idx, level) in policy.spec.levels.iter().enumerate().take(upto as usize) {
        let n = idx + 1;
        for (li, lane) in lanes.iter().enumerate() {
            let lname = lane.name_str();
            let selects = |p: Option<i32>, names: &[String]| {
                p.is_some_and(|p| lane.spec.priority >= p) || names.iter().any(|x| x == lname)
            };
            for sel in &level.actions.pause {
                if selects(sel.priority_at_least, &sel.lanes) {
                    if lane.spec.shedding.mode == SheddingMode::Pause {
                        limits[li].paused = true;
                    } else {
                        warnings.push(Warning::ContractOverride(ContractOverride {
                            policy: pname.clone(),
                            level: n,
                            level_name: level.name.clone(),
                            lane: lname.to_owned(),
                            action: OverriddenAction::Pause {
                                mode: lane.spec.shedding.mode,
                            },
                        }));
                    }
                }
            }
            for cap in &level.actions.cap {
                if !selects(cap.priority_at_least, &cap.lanes) {
                    continue;
                }
                let v = cap.units_per_second.value();
                let refused = match lane.spec.shedding.mode {
                    SheddingMode::Never => Some(None),
                    SheddingMode::Defer => {
                        let min = lane
                            .spec
                            .shedding
                            .min_units_per_second
                            .as_ref()
                            .map_or(0.0, |d| d.value());
                        (v + EPS < min).then_some(Some(min))
                    }
                    _ => None,
                };
                match refused {
                    Some(below_min) => warnings.push(Warning::ContractOverride(ContractOverride {
                        policy: pname.clone(),
                        level: n,
                        level_name: level.name.clone(),
                        lane: lname.to_owned(),
                        action: OverriddenAction::Cap {
                            units: cap.units_per_second.clone(),
                            below_min,
                        },
                    })),
                    None => {
                        let c = limits[li].level_cap.map_or(v, |c: f64| c.min(v));
                        limits[li].level_cap = Some(c);
                    }
                }
            }
        }
    }
    (limits, warnings)
}

/// The lane's cap under the given limits: min(demand, ceiling, level cap), 0
/// if paused.
fn lane_cap(lane: &LaneContract, demand: f64, l: &LaneLimits) -> f64 {
    if l.paused {
        return 0.0;
    }
    let mut c = demand;
    if let Some(ceil) = &lane.spec.ceiling_units_per_second {
        c = c.min(ceil.value());
    }
    if let Some(lc) = l.level_cap {
        c = c.min(lc);
    }
    c.max(0.0)
}

/// Evaluates one profile.
pub fn evaluate_profile(
    b: &Binding<'_>,
    snapshot: &Snapshot,
    approval: Option<Approval>,
    prev: &ProfileState,
) -> (ProfileDecision, ProfileState) {
    let profile = b.profile;
    let policy = b.policy;
    let at = snapshot.at;
    let pkey = object_key(profile);
    let sig = snapshot.profiles.get(&pkey).map(ProfileSignals::sanitized);
    let (capacity, capacity_source, ready) = capacity_of(profile, sig.as_ref());
    let telemetry = if capacity.is_some() {
        Telemetry::Known
    } else {
        Telemetry::Unknown
    };

    let mut lanes: Vec<&LaneContract> = b.lanes.clone();
    lanes.sort_by(|a, c| (a.spec.priority, a.name_str()).cmp(&(c.spec.priority, c.name_str())));
    let demands: Vec<LaneDemand> = lanes
        .iter()
        .map(|l| lane_demand(l, snapshot, &prev.lane_rates))
        .collect();
    let lanes_known = demands.iter().all(|d| d.source != DemandSource::Held);
    // Evidence is complete when capacity and every lane's rate are known;
    // otherwise nothing relaxes in this step.
    let complete = capacity.is_some() && lanes_known;
    let total_demand: f64 = demands.iter().map(|d| d.units).sum();
    let utilization = capacity.and_then(|c| (c > EPS).then(|| total_demand / c * 100.0));
    let nlevels = policy.map_or(0, |p| p.spec.levels.len() as u32);

    // Demand after the actions of levels 1..k-1, for k = 1..=N.
    let demand_after: Vec<f64> = (0..nlevels.max(1))
        .map(|k| {
            let (limits, _) = apply_actions(policy, k, &lanes);
            lanes
                .iter()
                .zip(&demands)
                .zip(&limits)
                .map(|((l, d), lim)| lane_cap(l, d.units, lim))
                .sum()
        })
        .collect();

    let recovery = policy.and_then(|p| p.spec.hysteresis.recovery.as_ref());
    let inputs = LevelInputs {
        at,
        capacity,
        utilization,
        demand_after: &demand_after,
        lanes_known,
        retry_amplification: evidence::amplification(&demands),
        retries_unknown: demands.iter().any(|d| d.retries_unknown),
        signals: sig.as_ref(),
        approval,
        ramping_until: evidence::ramping_until(&prev.ramps, recovery),
    };
    let ladder = ladder::step(policy, &inputs, prev);
    let level = ladder.level;

    // Actions of all levels up to the current one.
    let (limits, mut warnings) = apply_actions(policy, level, &lanes);
    let mut gateway = GatewayFlags::default();
    if let Some(p) = policy {
        for l in p.spec.levels.iter().take(level as usize) {
            gateway.reject_optional_context |= l.actions.reject_optional_context;
            gateway.use_fallback_routes |= l.actions.use_fallback_routes;
            gateway.read_only |= l.actions.read_only;
            gateway.static_fallback |= l.actions.static_fallback;
        }
    }
    gateway.in_flight = profile.spec.in_flight.as_ref().map(|f| InFlightWatermarks {
        conserve_at: f.conserve_at,
        stop_at: f.stop_at,
        resume_below: f.resume_below,
        resume_after_stable_seconds: f.resume_after_stable_seconds,
    });

    // Allocation.
    let index: BTreeMap<&str, usize> = lanes
        .iter()
        .enumerate()
        .map(|(i, l)| (l.name_str(), i))
        .collect();
    let claims: Vec<LaneClaim> = lanes
        .iter()
        .zip(&demands)
        .zip(&limits)
        .map(|((l, d), lim)| {
            let cap = lane_cap(l, d.units, lim);
            let floor = l
                .spec
                .floor_units_per_second
                .as_ref()
                .map_or(0.0, |f| f.value());
            let reserve = lane_cap(l, floor, lim);
            let borrowing = l
                .spec
                .borrowing
                .as_ref()
                .filter(|_| l.spec.checkpointable)
                .map(|bs| {
                    let lenders = bs
                        .from
                        .iter()
                        .filter_map(|n| index.get(n.as_str()).copied())
                        .collect();
                    (lenders, bs.max_units_per_second.value())
                });
            LaneClaim {
                priority: l.spec.priority,
                weight: f64::from(l.spec.weight.max(1)),
                cap,
                reserve,
                borrowing,
            }
        })
        .collect();
    let floors_total: f64 = claims.iter().map(|l| l.reserve).sum();
    // Unknown capacity holds: allocation runs against the last known capacity
    // (or, never having known one, the declared safe capacity), so missing
    // data neither expands nor collapses what gateways admit. A held stale
    // calibration assumes no calibrated figure: the floors only.
    let held = calibration_held(profile, sig.as_ref());
    let allocation_capacity = capacity.or(prev.last_capacity).unwrap_or_else(|| {
        if held {
            floors_total
        } else {
            profile.spec.capacity.safe_units_per_second.value()
        }
    });
    let mut allocations = allocation::allocate(&claims, allocation_capacity);
    // Unknown never relaxes: on incomplete evidence no lane gets more than
    // it was admitted in the previous step.
    if !complete {
        for (l, a) in lanes.iter().zip(allocations.iter_mut()) {
            if let Some(&before) = prev.admitted.get(l.name_str()) {
                a.hold_at(before);
            }
        }
    }
    // Staged recovery of lanes released by a step down.
    let ramps = ramps_after(
        policy,
        &ladder,
        prev,
        &lanes,
        &apply_actions(policy, prev.level, &lanes).0,
        &limits,
        at,
    );
    let mut ramp_stages: Vec<Option<i32>> = vec![None; lanes.len()];
    if let Some(spec) = recovery {
        for (i, l) in lanes.iter().enumerate() {
            if let Some(r) = ramps.get(l.name_str())
                && let Some(pct) = evidence::ramp_stage(r, spec, at)
            {
                let full = allocations[i].admitted;
                allocations[i].hold_at(evidence::ramped(full, r, pct));
                ramp_stages[i] = Some(pct);
            }
        }
    }
    if let Some(c) = capacity
        && floors_total > c + EPS
    {
        warnings.push(Warning::Overcommitted {
            floors: round6(floors_total),
            capacity: round6(c),
        });
    }

    let mut lane_decisions = Vec::with_capacity(lanes.len());
    for (i, l) in lanes.iter().enumerate() {
        let d = &demands[i];
        let a = &allocations[i];
        let lim = &limits[i];
        let cap = claims[i].cap;
        let ceiling = l.spec.ceiling_units_per_second.as_ref().map(|c| c.value());
        let ramp_note = ramp_stages[i].map(|p| format!("recovery {p}%"));
        let (state, limited_by) = if lim.paused {
            (LaneState::Paused, Some("pause"))
        } else if ramp_note.is_some() && a.admitted + 1e-6 < d.units {
            (LaneState::Recovering, ramp_note.as_deref())
        } else if a.admitted + 1e-6 >= d.units {
            (LaneState::Admitted, None)
        } else if a.admitted + 1e-6 >= cap {
            let by_level = lim
                .level_cap
                .is_some_and(|c| c + EPS < d.units && ceiling.is_none_or(|ce| c <= ce));
            (
                LaneState::Capped,
                Some(if by_level { "level" } else { "ceiling" }),
            )
        } else {
            (LaneState::Throttled, Some("capacity"))
        };
        let wpr = l.spec.work_units_per_request.value();
        let lease = l.spec.borrowing.as_ref().map_or(0, |bs| bs.lease_seconds);
        lane_decisions.push(LaneDecision {
            namespace: l.namespace_str().to_owned(),
            name: l.name_str().to_owned(),
            priority: l.spec.priority,
            state,
            requests_per_second: round6(d.rps),
            demand_source: d.source.as_str().to_owned(),
            retry_amplification: d.amplification().map(round6),
            demand_units_per_second: round6(d.units),
            admitted_units_per_second: round6(a.admitted),
            admitted_requests_per_second: round6(if wpr > 0.0 { a.admitted / wpr } else { 0.0 }),
            borrowed_units_per_second: round6(a.borrowed_total()),
            reserved_units_per_second: round6(a.reserved),
            level_cap_units_per_second: lim.level_cap.map(round6),
            limited_by: limited_by.map(str::to_owned),
            borrowing: a
                .borrowed
                .iter()
                .map(|(lender, units)| BorrowGrant {
                    from: lanes[*lender].name_str().to_owned(),
                    units_per_second: round6(*units),
                    expires_at: at + lease,
                })
                .collect(),
        });
    }
    let admitted_total: f64 = allocations.iter().map(|a| a.admitted).sum();

    // Pool size.
    let sizing = sizing::desired(
        profile,
        total_demand,
        ready,
        level,
        if complete {
            telemetry
        } else {
            Telemetry::Unknown
        },
        at,
        prev,
    );
    let scaling_down = match (sizing.desired, ready) {
        (Some(d), Some(r)) => (d as i64) < i64::from(r),
        _ => false,
    };

    // Drain.
    let (drain, drained) = drain::decide(
        profile.spec.drain.as_ref(),
        sig.as_ref(),
        at,
        telemetry == Telemetry::Known && !scaling_down && complete,
        !complete,
        &prev.drained,
    );

    let level_name = match (policy, level) {
        (_, 0) | (None, _) => "normal".to_owned(),
        (Some(p), n) => p.spec.levels[(n - 1) as usize].name.clone(),
    };

    let next = ProfileState {
        level,
        level_since: ladder.level_since,
        exit_since: ladder.exit_since,
        gate_since: ladder.gate_since,
        desired_replicas: sizing.desired,
        scale_down_since: sizing.scale_down_since,
        scale_down_want: sizing.scale_down_want,
        drained,
        last_capacity: capacity.or(prev.last_capacity),
        trigger_since: ladder.trigger_since,
        episode_since: ladder.episode_since,
        stepped_down: ladder.stepped_down,
        admitted: lanes
            .iter()
            .zip(&allocations)
            .map(|(l, a)| (l.name_str().to_owned(), round6(a.admitted)))
            .collect(),
        lane_rates: lanes
            .iter()
            .zip(&demands)
            .filter(|(_, d)| d.source == DemandSource::Observed)
            .map(|(l, d)| (l.name_str().to_owned(), d.rps))
            .chain(
                prev.lane_rates
                    .iter()
                    .filter(|(k, _)| {
                        lanes.iter().zip(&demands).any(|(l, d)| {
                            l.name_str() == k.as_str() && d.source == DemandSource::Held
                        })
                    })
                    .map(|(k, v)| (k.clone(), *v)),
            )
            .collect(),
        ramps: ramps
            .into_iter()
            .filter(|(_, r)| {
                recovery.is_some_and(|spec| evidence::ramp_stage(r, spec, at).is_some())
            })
            .collect(),
        approval_used: ladder.approval_consumed.or(prev.approval_used),
    };
    let decision = ProfileDecision {
        namespace: profile.namespace_str().to_owned(),
        name: profile.metadata.name.clone().unwrap_or_default(),
        policy: policy.map(object_key),
        telemetry,
        level,
        level_name,
        pending_approval_level: ladder.pending,
        approval_consumed: ladder.approval_consumed.map(|a| a.level),
        approval_lapsed: ladder.approval_lapsed.map(|a| a.level),
        level_since: ladder.level_since,
        exit_holding_since: ladder.exit_since,
        transition: ladder.transition,
        triggers: ladder.triggers,
        capacity_units_per_second: capacity.map(round6),
        capacity_source,
        calibration_stale: sig.as_ref().and_then(|s| s.calibration_stale),
        calibration_held: held,
        demand_units_per_second: round6(total_demand),
        admitted_units_per_second: round6(admitted_total),
        utilization_percent: utilization.map(round6),
        ready_replicas: ready,
        desired_replicas: sizing.desired,
        drain,
        warnings: {
            warnings.extend(b.warnings.iter().cloned().map(Warning::Binding));
            warnings
        },
        gateway,
        lanes: lane_decisions,
    };
    (decision, next)
}

/// The ramps after this step: a step up ends them all (that level's caps
/// apply); a step down starts one for each lane it releases (a pause lifted,
/// a cap removed or raised), from the lane's admitted rate before; running
/// ramps carry on.
fn ramps_after(
    policy: Option<&DegradationPolicy>,
    ladder: &ladder::LadderOutcome,
    prev: &ProfileState,
    lanes: &[&LaneContract],
    before: &[LaneLimits],
    after: &[LaneLimits],
    at: i64,
) -> BTreeMap<String, Ramp> {
    if policy
        .and_then(|p| p.spec.hysteresis.recovery.as_ref())
        .is_none()
    {
        return BTreeMap::new();
    }
    let Some(t) = &ladder.transition else {
        return prev.ramps.clone();
    };
    if t.to > t.from {
        return BTreeMap::new();
    }
    let mut ramps = prev.ramps.clone();
    for ((l, b), a) in lanes.iter().zip(before).zip(after) {
        let unpaused = b.paused && !a.paused;
        let raised = match (b.level_cap, a.level_cap) {
            (Some(_), None) => true,
            (Some(x), Some(y)) => y > x + EPS,
            _ => false,
        };
        if unpaused || raised {
            ramps.insert(
                l.name_str().to_owned(),
                Ramp {
                    since: at,
                    base: prev.admitted.get(l.name_str()).copied().unwrap_or(0.0),
                },
            );
        }
    }
    ramps
}
