//! Each lane's share of capacity in one step: its claim (from its contract,
//! its demand and the level's limits), the allocation against the capacity
//! the step may assume, held on incomplete evidence and ramped after a step
//! down, and the lane's decision.

use std::collections::BTreeMap;

use crate::api::{DegradationPolicy, LaneContract, ObjectKey, ProfileState, Ramp, RecoverySpec};

use super::actions::{LaneLimits, apply_actions, lane_cap};
use super::allocation::{self, Allocation, EPS, LaneClaim};
use super::bind::Binding;
use super::decision::{BorrowGrant, LaneDecision, LaneState, round6};
use super::evidence::{self, LaneDemand};
use super::evidence::{Evidence, recovery_of};
use super::ladder::LadderOutcome;

/// Every lane's share in one step (each list in the order of the lanes).
pub(super) struct Shares {
    /// What each lane claims.
    pub(super) claims: Vec<LaneClaim>,
    /// What each lane got.
    pub(super) allocations: Vec<Allocation>,
    /// The recovery stage (percent) of each lane ramping in this step.
    pub(super) ramp_stages: Vec<Option<i32>>,
    /// The ramps still running after this step.
    pub(super) ramps: BTreeMap<String, Ramp>,
    /// What the floors reserve in total.
    pub(super) floors_total: f64,
}

impl Shares {
    /// The admitted total.
    pub(super) fn admitted_total(&self) -> f64 {
        self.allocations.iter().map(|a| a.admitted).sum()
    }
}

/// Shares capacity among the lanes under the limits of the level.
pub(super) fn share(
    b: &Binding<'_>,
    ev: &Evidence<'_>,
    ladder: &LadderOutcome,
    limits: &[LaneLimits],
    prev: &ProfileState,
    at: i64,
) -> Shares {
    let claims = claims(&ev.lanes, &ev.demands, limits);
    let floors_total: f64 = claims.iter().map(|l| l.reserve).sum();
    let capacity = allocation_capacity(b, ev, prev, floors_total);
    let mut allocations = allocation::allocate(&claims, capacity);
    if !ev.complete {
        hold_at_previous(&ev.lanes, &mut allocations, prev);
    }
    let before = apply_actions(b.policy, prev.level, &ev.lanes).0;
    let ramps = ramps_after(b.policy, ladder, prev, ev, &before, limits, at);
    let recovery = recovery_of(b.policy);
    let ramp_stages = apply_ramps(&ev.lanes, &ramps, recovery, at, &mut allocations);
    let ramps = ramps
        .into_iter()
        .filter(|(_, r)| recovery.is_some_and(|spec| evidence::ramp_stage(r, spec, at).is_some()))
        .collect();
    Shares {
        claims,
        allocations,
        ramp_stages,
        ramps,
        floors_total,
    }
}

/// Each lane's claim: its cap and its floor's reserve under its limits, and
/// its lenders (by index) when it may borrow.
fn claims(
    lanes: &[&LaneContract],
    demands: &[LaneDemand],
    limits: &[LaneLimits],
) -> Vec<LaneClaim> {
    let index: BTreeMap<&str, usize> = lanes
        .iter()
        .enumerate()
        .map(|(i, l)| (l.name_str(), i))
        .collect();
    lanes
        .iter()
        .zip(demands)
        .zip(limits)
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
        .collect()
}

/// The capacity allocation runs against. Unknown capacity holds: the last
/// known capacity (or, never having known one, the declared safe capacity),
/// so missing data neither expands nor collapses what gateways admit. A held
/// stale calibration assumes no calibrated figure: the floors only.
fn allocation_capacity(
    b: &Binding<'_>,
    ev: &Evidence<'_>,
    prev: &ProfileState,
    floors_total: f64,
) -> f64 {
    ev.capacity.or(prev.last_capacity).unwrap_or_else(|| {
        if ev.held {
            floors_total
        } else {
            b.profile.spec.capacity.safe_units_per_second.value()
        }
    })
}

/// Unknown never relaxes: on incomplete evidence no lane gets more than it
/// was admitted in the previous step.
fn hold_at_previous(lanes: &[&LaneContract], allocations: &mut [Allocation], prev: &ProfileState) {
    for (l, a) in lanes.iter().zip(allocations.iter_mut()) {
        if let Some(&before) = prev.admitted.get(l.name_str()) {
            a.hold_at(before);
        }
    }
}

/// Staged recovery of lanes released by a step down: each ramping lane is
/// held to its stage. Returns each lane's stage.
fn apply_ramps(
    lanes: &[&LaneContract],
    ramps: &BTreeMap<String, Ramp>,
    recovery: Option<&RecoverySpec>,
    at: i64,
    allocations: &mut [Allocation],
) -> Vec<Option<i32>> {
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
    ramp_stages
}

/// The ramps after this step: a step up ends them all (that level's caps
/// apply); a step down starts one for each lane it releases (a pause lifted,
/// a cap removed or raised), from the lane's admitted rate before; running
/// ramps carry on.
fn ramps_after(
    policy: Option<&DegradationPolicy>,
    ladder: &LadderOutcome,
    prev: &ProfileState,
    ev: &Evidence<'_>,
    before: &[LaneLimits],
    after: &[LaneLimits],
    at: i64,
) -> BTreeMap<String, Ramp> {
    if recovery_of(policy).is_none() {
        return BTreeMap::new();
    }
    let carried = carried_ramps(prev, ev.complete, at);
    let Some(t) = &ladder.transition else {
        return carried;
    };
    if t.to > t.from {
        return BTreeMap::new();
    }
    let mut ramps = carried;
    for ((l, b), a) in ev.lanes.iter().zip(before).zip(after) {
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
                    blind_since: None,
                },
            );
        }
    }
    ramps
}

/// The ramps carried into this step. Time on incomplete evidence, whose
/// rates are held at the previous step's, does not count toward a ramp
/// (rule 8: Unknown time never counts toward a timer): the first such step
/// marks when it began, the ramp stays at its stage of that moment, and the
/// first step with complete evidence moves its start on by that time, so a
/// lane held through blindness goes on from the stage it was in instead of
/// skipping the stages that passed meanwhile. Only those two steps change
/// the state.
fn carried_ramps(prev: &ProfileState, complete: bool, at: i64) -> BTreeMap<String, Ramp> {
    let carried = |r: &Ramp| match (complete, r.blind_since) {
        (false, None) => Ramp {
            blind_since: Some(at),
            ..r.clone()
        },
        (true, Some(b)) => Ramp {
            since: r.since + (at - b).max(0),
            base: r.base,
            blind_since: None,
        },
        _ => r.clone(),
    };
    prev.ramps
        .iter()
        .map(|(lane, r)| (lane.clone(), carried(r)))
        .collect()
}

/// Each lane's decision.
pub(super) fn decisions(
    ev: &Evidence<'_>,
    shares: &Shares,
    limits: &[LaneLimits],
    at: i64,
) -> Vec<LaneDecision> {
    (0..ev.lanes.len())
        .map(|i| lane_decision(ev, shares, &limits[i], i, at))
        .collect()
}

/// The decision for lane `i`.
fn lane_decision(
    ev: &Evidence<'_>,
    shares: &Shares,
    lim: &LaneLimits,
    i: usize,
    at: i64,
) -> LaneDecision {
    let l = ev.lanes[i];
    let d = &ev.demands[i];
    let a = &shares.allocations[i];
    let stage = shares.ramp_stages[i];
    let (state, limited_by) = lane_state(l, d, a, lim, shares.claims[i].cap, stage);
    let wpr = l.spec.work_units_per_request.value();
    let lease = l.spec.borrowing.as_ref().map_or(0, |bs| bs.lease_seconds);
    LaneDecision {
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
        limited_by,
        borrowing: a
            .borrowed
            .iter()
            .map(|(lender, units)| BorrowGrant {
                from: ev.lanes[*lender].name_str().to_owned(),
                units_per_second: round6(*units),
                expires_at: at + lease,
            })
            .collect(),
        objective: None,
        cost: None,
    }
}

/// A lane's state and what limits it.
fn lane_state(
    l: &LaneContract,
    d: &LaneDemand,
    a: &Allocation,
    lim: &LaneLimits,
    cap: f64,
    stage: Option<i32>,
) -> (LaneState, Option<String>) {
    let ceiling = l.spec.ceiling_units_per_second.as_ref().map(|c| c.value());
    let ramp_note = stage.map(|p| format!("recovery {p}%"));
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
    (state, limited_by.map(str::to_owned))
}
