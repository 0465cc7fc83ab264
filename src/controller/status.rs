//! Building the status of each resource from a decision (pure).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::api::calibration::CalibrationCheck;
use crate::api::{
    CapacityProfile, CapacityProfileStatus, DegradationPolicy, DegradationPolicyStatus,
    LaneContract, LaneContractStatus, ObjectiveStatus, Transition,
};
use crate::policy::cost_calibration::CostCalibration;
use crate::policy::{
    Drain, InFlightProblem, LaneDecision, LevelTransition, ProfileDecision, ProfileState,
    Telemetry, Warning,
};

/// The condition type saying whether the calibration describes the pool.
pub const CALIBRATED: &str = "Calibrated";

/// The condition type saying whether a lane's `workUnitsPerRequest` covers
/// its measured P95 cost per request.
pub const COST_CALIBRATED: &str = "CostCalibrated";

/// The condition type saying whether the `inFlight` watermarks fit the pool.
pub const IN_FLIGHT_FITS: &str = "InFlightWatermarksFit";

/// Most transitions kept in a policy's status.
pub const MAX_TRANSITIONS: usize = 10;

use crate::api::common::rfc3339;

fn time(secs: i64) -> Time {
    Time(Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// A condition to set.
pub struct Cond<'a> {
    /// Type.
    pub type_: &'a str,
    /// `True`, `False` or `Unknown`.
    pub status: &'a str,
    /// CamelCase reason.
    pub reason: &'a str,
    /// Human message.
    pub message: String,
}

/// Sets conditions, keeping `lastTransitionTime` of those whose status did
/// not change (so an unchanged status compares equal and is not rewritten).
pub fn conditions(
    existing: &[Condition],
    wanted: Vec<Cond<'_>>,
    generation: Option<i64>,
    now: i64,
) -> Vec<Condition> {
    wanted
        .into_iter()
        .map(|c| {
            let old = existing.iter().find(|e| e.type_ == c.type_);
            let last = match old {
                Some(o) if o.status == c.status => o.last_transition_time.clone(),
                _ => time(now),
            };
            Condition {
                type_: c.type_.to_owned(),
                status: c.status.to_owned(),
                reason: c.reason.to_owned(),
                message: c.message,
                observed_generation: generation,
                last_transition_time: last,
            }
        })
        .collect()
}

/// The reason shared by a policy's static warnings when they are all of one
/// kind that is not a contract override (`BurnLaneWithoutObjective`,
/// `LimitLongContextWithoutLimit`); None otherwise.
pub fn static_reason(warnings: &[Warning]) -> Option<&'static str> {
    let reason = |w: &Warning| match w {
        Warning::BurnLaneWithoutObjective { .. } => Some("BurnLaneWithoutObjective"),
        Warning::LimitLongContextWithoutLimit { .. } => Some("LimitLongContextWithoutLimit"),
        _ => None,
    };
    let first = reason(warnings.first()?)?;
    warnings
        .iter()
        .all(|w| reason(w) == Some(first))
        .then_some(first)
}

/// Warnings as one message.
pub fn join(warnings: &[Warning]) -> String {
    warnings
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn tf(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// What the controller observed and did besides the decision (the report
/// stage fills it from the observation and the effects).
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// Ready replicas of the pool.
    pub ready_replicas: Option<u32>,
    /// A problem reaching the scale target.
    pub scale_problem: Option<String>,
    /// Another writer owns the replicas (an HPA in `Direct` mode, an older
    /// profile on the same workload): the condition's reason and message.
    pub scaling_conflict: Option<(&'static str, String)>,
    /// Unknown signals with reasons.
    pub unknown: std::collections::BTreeMap<String, String>,
    /// What the calibration says about the pool now.
    pub calibration: CalibrationCheck,
    /// The hash of the pool's pod template (None without one).
    pub observed_config_hash: Option<String>,
    /// The drain as carried out (None without a drain spec or pod index).
    pub drain: Option<Drain>,
    /// Pods of the pool the scheduler could not place, with its message for
    /// one of them (None when every pod is placed or pods are not watched).
    pub unschedulable: Option<(usize, String)>,
    /// The writes the API server refused, each `what: error`.
    pub refused: Vec<String>,
}

/// `Ready`: False while the scale target can't be read
/// (`ScaleTargetUnavailable`) or a write of the decision was refused
/// (`WriteRefused`, naming each), else True.
pub fn ready_condition(scale_problem: Option<&str>, refused: &[String]) -> Cond<'static> {
    let refused =
        (!refused.is_empty()).then(|| format!("the API server refused: {}", refused.join("; ")));
    match (scale_problem, refused) {
        (Some(p), r) => Cond {
            type_: "Ready",
            status: "False",
            reason: "ScaleTargetUnavailable",
            message: r.map_or_else(|| p.to_owned(), |r| format!("{p}; {r}")),
        },
        (None, Some(r)) => Cond {
            type_: "Ready",
            status: "False",
            reason: "WriteRefused",
            message: r,
        },
        (None, None) => Cond {
            type_: "Ready",
            status: "True",
            reason: "Reconciled",
            message: "decision computed and applied".into(),
        },
    }
}

/// `status` with one condition set (the others as they are).
pub fn with_condition(
    status: &CapacityProfileStatus,
    c: Cond<'_>,
    generation: Option<i64>,
    now: i64,
) -> CapacityProfileStatus {
    let set = conditions(&status.conditions, vec![c], generation, now);
    let mut out = status.clone();
    for new in set {
        match out.conditions.iter_mut().find(|e| e.type_ == new.type_) {
            Some(e) => *e = new,
            None => out.conditions.push(new),
        }
    }
    out
}

/// The conditions that follow from the decision: `Ready`, `Degraded`,
/// `TelemetryKnown`, `Overcommitted`.
fn decision_conditions(d: &ProfileDecision, observed: &Observed) -> Vec<Cond<'static>> {
    let known = d.telemetry == Telemetry::Known;
    let overcommitted = d
        .warnings
        .iter()
        .find(|w| matches!(w, Warning::Overcommitted { .. }));
    let unknown_msg = if observed.unknown.is_empty() {
        "capacity could not be had".to_owned()
    } else {
        observed
            .unknown
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join("; ")
    };
    vec![
        ready_condition(observed.scale_problem.as_deref(), &observed.refused),
        Cond {
            type_: "Degraded",
            status: tf(d.level > 0),
            reason: if d.level > 0 { "LevelRaised" } else { "Normal" },
            message: format!("level {} ({})", d.level, d.level_name),
        },
        if known {
            Cond {
                type_: "TelemetryKnown",
                status: "True",
                reason: "CapacityKnown",
                message: format!(
                    "capacity from {}",
                    d.capacity_source.as_deref().unwrap_or("signals")
                ),
            }
        } else {
            Cond {
                type_: "TelemetryKnown",
                status: "False",
                reason: "CapacityUnknown",
                message: unknown_msg,
            }
        },
        Cond {
            type_: "Overcommitted",
            status: tf(overcommitted.is_some()),
            reason: if overcommitted.is_some() {
                "FloorsExceedCapacity"
            } else {
                "FloorsFit"
            },
            message: overcommitted.map_or_else(
                || "lane floors fit within capacity".into(),
                ToString::to_string,
            ),
        },
    ]
}

/// The conditions about the pool: `Calibrated`, `DrainBudgetExhausted`
/// (with a drain section), `PoolGrowthBlocked`, `ScalingConflict`.
fn pool_conditions(profile: &CapacityProfile, observed: &Observed) -> Vec<Cond<'static>> {
    let mut wanted = Vec::new();
    let (status, reason, message) = observed
        .calibration
        .condition(profile.spec.capacity.on_stale_calibration);
    wanted.push(Cond {
        type_: CALIBRATED,
        status,
        reason,
        message,
    });
    if profile.spec.drain.is_some() {
        let refused: Vec<String> = observed
            .drain
            .as_ref()
            .map(|r| r.refused_by_bound().map(|a| a.pod.clone()).collect())
            .unwrap_or_default();
        wanted.push(if refused.is_empty() {
            Cond {
                type_: "DrainBudgetExhausted",
                status: "False",
                reason: "WithinBudget",
                message: "every drain candidate fits within the bound".into(),
            }
        } else {
            Cond {
                type_: "DrainBudgetExhausted",
                status: "True",
                reason: "BoundReached",
                message: format!(
                    "drain refused by the bound (maxDrained/minServing): {}",
                    refused.join(", ")
                ),
            }
        });
    }
    wanted.push(match &observed.unschedulable {
        Some((n, why)) => Cond {
            type_: "PoolGrowthBlocked",
            status: "True",
            reason: "PodsUnschedulable",
            message: format!(
                "{n} pod(s) of the pool cannot be placed and add no capacity (ready replicas stay {}); {why}",
                observed
                    .ready_replicas
                    .map_or_else(|| "unknown".to_owned(), |r| r.to_string())
            ),
        },
        None => Cond {
            type_: "PoolGrowthBlocked",
            status: "False",
            reason: "AllPodsPlaced",
            message: "every pod of the pool is placed on a node".into(),
        },
    });
    wanted.push(match &observed.scaling_conflict {
        Some((reason, m)) => Cond {
            type_: "ScalingConflict",
            status: "True",
            reason,
            message: m.clone(),
        },
        None => Cond {
            type_: "ScalingConflict",
            status: "False",
            reason: "NoConflict",
            message:
                "no HorizontalPodAutoscaler or other CapacityProfile competes for the replicas"
                    .into(),
        },
    });
    wanted
}

/// `InFlightWatermarksFit` (with an `inFlight` section): False when the
/// decision warns that `stopAt` is below what a full pool holds in flight
/// or that `resumeBelow >= conserveAt`.
fn in_flight_condition(profile: &CapacityProfile, d: &ProfileDecision) -> Option<Cond<'static>> {
    profile.spec.in_flight.as_ref()?;
    let problems: Vec<&InFlightProblem> = d
        .warnings
        .iter()
        .filter_map(|w| match w {
            Warning::InFlight(p) => Some(p),
            _ => None,
        })
        .collect();
    Some(match problems.first() {
        None => Cond {
            type_: IN_FLIGHT_FITS,
            status: "True",
            reason: "Fit",
            message: "stopAt holds a full pool in flight and resumeBelow is below conserveAt"
                .into(),
        },
        Some(first) => Cond {
            type_: IN_FLIGHT_FITS,
            status: "False",
            reason: first.reason(),
            message: problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        },
    })
}

/// The CapacityProfile status for a decision.
pub fn profile_status(
    profile: &CapacityProfile,
    d: &ProfileDecision,
    state: &ProfileState,
    observed: &Observed,
    now: i64,
) -> CapacityProfileStatus {
    let generation = profile.metadata.generation;
    let existing = profile
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let known = d.telemetry == Telemetry::Known;
    let mut wanted = decision_conditions(d, observed);
    wanted.extend(pool_conditions(profile, observed));
    wanted.extend(in_flight_condition(profile, d));
    CapacityProfileStatus {
        observed_generation: generation,
        level: d.level,
        level_name: Some(d.level_name.clone()),
        telemetry: Some(if known { "Known" } else { "Unknown" }.into()),
        capacity_units_per_second: d.capacity_units_per_second,
        demand_units_per_second: Some(d.demand_units_per_second),
        admitted_units_per_second: Some(d.admitted_units_per_second),
        utilization_percent: d.utilization_percent.map(|u| (u * 10.0).round() / 10.0),
        desired_replicas: d.desired_replicas,
        ready_replicas: observed.ready_replicas.map(|r| r as i32),
        drained_pods: profile
            .spec
            .drain
            .as_ref()
            .map(|_| observed.drain.as_ref().unwrap_or(&d.drain).drained_pods as i32),
        drain_budget: profile
            .spec
            .drain
            .as_ref()
            .map(|_| observed.drain.as_ref().unwrap_or(&d.drain).drain_budget as i32),
        unknown_signals: observed.unknown.clone(),
        observed_config_hash: observed.observed_config_hash.clone(),
        conditions: conditions(existing, wanted, generation, now),
        freeze: None,
        engine: Some(state.clone()),
    }
}

/// `CostCalibrated` (lanes with a cost, or a measured cost): True while the
/// measured P95 cost per request is at most 20 % above
/// `workUnitsPerRequest`, False above, Unknown without a measurement.
fn cost_condition(d: &LaneDecision) -> Option<Cond<'static>> {
    let c = d.cost.as_ref()?;
    let declared = c.work_units_per_request;
    Some(match (c.calibration, c.p95_cost_units_per_request) {
        (CostCalibration::Underestimated, Some(m)) => Cond {
            type_: COST_CALIBRATED,
            status: "False",
            reason: "CostUnderestimated",
            message: format!(
                "P95 cost {m} work units a request is more than 20 % above workUnitsPerRequest {declared}: demand is counted short"
            ),
        },
        (CostCalibration::Calibrated, Some(m)) => Cond {
            type_: COST_CALIBRATED,
            status: "True",
            reason: "WithinTolerance",
            message: format!(
                "P95 cost {m} work units a request is at most 20 % above workUnitsPerRequest {declared}"
            ),
        },
        _ => Cond {
            type_: COST_CALIBRATED,
            status: "Unknown",
            reason: "CostUnknown",
            message: "no measured P95 cost per request (laneP95CostUnitsPerRequest)".into(),
        },
    })
}

/// The LaneContract status for a lane's decision (or for an unbound lane).
pub fn lane_status(
    lane: &LaneContract,
    d: Option<&LaneDecision>,
    bound_problem: Option<String>,
    floor_units: f64,
    now: i64,
) -> LaneContractStatus {
    let generation = lane.metadata.generation;
    let existing = lane
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let mut wanted = vec![match &bound_problem {
        Some(m) => Cond {
            type_: "Bound",
            status: "False",
            reason: "ProfileNotFound",
            message: m.clone(),
        },
        None => Cond {
            type_: "Bound",
            status: "True",
            reason: "ProfileFound",
            message: format!("runs on profile {}", lane.spec.profile),
        },
    }];
    if let Some(d) = d {
        let owed = floor_units.min(d.demand_units_per_second);
        let respected = d.admitted_units_per_second + 1e-6 >= owed;
        wanted.push(Cond {
            type_: "ContractRespected",
            status: tf(respected),
            reason: if respected {
                "FloorHonoured"
            } else {
                "FloorNotMet"
            },
            message: if respected {
                format!(
                    "admitted {} of {} units/s demand",
                    d.admitted_units_per_second, d.demand_units_per_second
                )
            } else {
                format!(
                    "admitted {} units/s, below min(floor, demand) = {owed}: capacity is short",
                    d.admitted_units_per_second
                )
            },
        });
        wanted.extend(cost_condition(d));
    }
    let cost = d.and_then(|d| d.cost.as_ref());
    LaneContractStatus {
        observed_generation: generation,
        state: d.map(|d| d.state.as_str().to_owned()),
        demand_source: d.map(|d| d.demand_source.clone()),
        retry_amplification: d.and_then(|d| d.retry_amplification),
        demand_units_per_second: d.map(|d| d.demand_units_per_second),
        admitted_units_per_second: d.map(|d| d.admitted_units_per_second),
        borrowed_units_per_second: d.map(|d| d.borrowed_units_per_second),
        objective: d
            .and_then(|d| d.objective.as_ref())
            .map(|o| ObjectiveStatus {
                band: o.band,
                remaining_percent: o.remaining_percent,
                burn_rates: o.burn_rate.clone(),
                since: Some(time(o.since)),
            }),
        p95_input_tokens: cost.and_then(|c| c.p95_input_tokens),
        p95_output_tokens: cost.and_then(|c| c.p95_output_tokens),
        p95_cost_units_per_request: cost.and_then(|c| c.p95_cost_units_per_request),
        conditions: conditions(existing, wanted, generation, now),
    }
}

/// Whether the policy's status already records `t`: its status was
/// written with it by a pass whose profile status (the engine's state)
/// then failed, so the next pass decides the same transition again.
fn recorded(old: &DegradationPolicyStatus, t: &LevelTransition) -> bool {
    old.level == t.to
        && old
            .transitions
            .last()
            .is_some_and(|l| (l.from, l.to) == (t.from, t.to))
}

/// The DegradationPolicy status for a decision. `approved` is the level the
/// annotation approves.
pub fn policy_status(
    policy: &DegradationPolicy,
    d: Option<&ProfileDecision>,
    invalid: Option<String>,
    approved: Option<u32>,
    static_overrides: &[Warning],
    now: i64,
) -> DegradationPolicyStatus {
    let generation = policy.metadata.generation;
    let old = policy.status.clone().unwrap_or_default();
    let mut transitions = old.transitions.clone();
    if let Some(t) = d.and_then(|d| d.transition.as_ref())
        && !recorded(&old, t)
    {
        transitions.push(Transition {
            at: rfc3339(now),
            from: t.from,
            to: t.to,
            reason: t.reason.clone(),
        });
        let excess = transitions.len().saturating_sub(MAX_TRANSITIONS);
        transitions.drain(..excess);
    }
    let valid = match (&invalid, static_overrides.is_empty()) {
        (Some(m), _) => Cond {
            type_: "Valid",
            status: "False",
            reason: "Ignored",
            message: m.clone(),
        },
        (None, false) if static_reason(static_overrides).is_some() => Cond {
            type_: "Valid",
            status: "False",
            reason: static_reason(static_overrides).unwrap_or("ContractOverrides"),
            message: join(static_overrides),
        },
        (None, false) => Cond {
            type_: "Valid",
            status: "False",
            reason: "ContractOverrides",
            message: format!(
                "actions that lane contracts override: {}",
                join(static_overrides)
            ),
        },
        (None, true) => Cond {
            type_: "Valid",
            status: "True",
            reason: "Valid",
            message: "every action can be applied".into(),
        },
    };
    let level = d.map_or(0, |d| d.level);
    // The approval's time: kept while the same level stays approved.
    let approved_at = approved.map(|a| match (&old.approved_at, old.approved_level) {
        (Some(t), Some(l)) if l == a => t.clone(),
        _ => rfc3339(now),
    });
    DegradationPolicyStatus {
        observed_generation: generation,
        level,
        level_name: d.map(|d| d.level_name.clone()),
        since: d.and_then(|d| d.level_since).map(rfc3339),
        exit_holding_since: d.and_then(|d| d.exit_holding_since).map(rfc3339),
        pending_approval_level: d.and_then(|d| d.pending_approval_level),
        approved_level: approved,
        approved_at,
        transitions,
        conditions: conditions(&old.conditions, vec![valid], generation, now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn burn() -> Warning {
        Warning::BurnLaneWithoutObjective {
            policy: "t/p".into(),
            level: 1,
            level_name: "one".into(),
            lane: "a".into(),
        }
    }

    fn long() -> Warning {
        Warning::LimitLongContextWithoutLimit {
            policy: "t/p".into(),
            level: 2,
            level_name: "two".into(),
        }
    }

    #[test]
    fn one_kind_names_itself_and_a_mix_names_nothing() {
        assert_eq!(static_reason(&[]), None);
        assert_eq!(
            static_reason(&[burn(), burn()]),
            Some("BurnLaneWithoutObjective")
        );
        assert_eq!(
            static_reason(&[long()]),
            Some("LimitLongContextWithoutLimit")
        );
        assert_eq!(static_reason(&[burn(), long()]), None);
        assert_eq!(static_reason(&[Warning::Text("x".into())]), None);
    }
}
