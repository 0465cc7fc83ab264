//! Report: the statuses of the profile, its lanes, its policy and the
//! policies it ignores; the approval consumed once used; the metrics. What
//! was written comes back as [`Reported`] for the events.

use kube::ResourceExt;

use super::super::context::{APPROVE_ANNOTATION, Context, Reconciled};
use super::super::error::Error;
use super::super::status::{self, Observed};
use super::actuate::Effects;
use super::observe::Observation;
use crate::api::{CapacityProfileStatus, DegradationPolicyStatus, LaneContractStatus, ObjectKey};
use crate::policy::{self, BindProblem, ProfileDecision, ProfileState, Telemetry, Warning};

/// The statuses before and after, for the events.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reported {
    /// The profile's status before this step.
    pub profile_before: CapacityProfileStatus,
    /// And after.
    pub profile_after: CapacityProfileStatus,
    /// The governing policy's, if any.
    pub policy: Option<PolicyReport>,
    /// The policies the binding ignores (same order as the binding's).
    pub ignored: Vec<IgnoredReport>,
    /// The lanes' statuses before and after (same order as the binding's
    /// lanes).
    pub lanes: Vec<(LaneContractStatus, LaneContractStatus)>,
}

/// The governing policy's report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyReport {
    /// Status before.
    pub before: DegradationPolicyStatus,
    /// Status after.
    pub after: DegradationPolicyStatus,
    /// The level the annotation approves (as observed, before consumption).
    pub approved: Option<u32>,
    /// Actions lane contracts override, at any level.
    pub overrides: Vec<Warning>,
    /// The approval consumed (used to enter a level) in this step.
    pub consumed: Option<u32>,
    /// The approval that lapsed in this step.
    pub lapsed: Option<u32>,
}

/// An ignored policy's report.
#[derive(Clone, Debug, PartialEq)]
pub struct IgnoredReport {
    /// Why it is ignored.
    pub problem: BindProblem,
    /// Whether its status was written now (it changed).
    pub written: bool,
}

/// Writes the statuses and consumes a used approval.
pub async fn report(
    ctx: &Context,
    obs: &Observation,
    decision: &ProfileDecision,
    next: &ProfileState,
    effects: &Effects,
    freeze: Option<crate::api::FreezeStatus>,
) -> Result<Reported, Error> {
    let now = obs.now;
    let profile = &obs.profile;
    let observed = Observed {
        ready_replicas: obs.ready_replicas,
        scale_problem: obs.scale_problem.clone(),
        scaling_conflict: effects.scaling_conflict.as_ref().map(ToString::to_string),
        unknown: obs.unknown.clone(),
        calibration: obs.calibration.clone(),
        observed_config_hash: obs
            .pool
            .as_ref()
            .and_then(|p| p.config_hash.as_ref().ok().cloned()),
        drain: effects.drain.clone(),
        unschedulable: obs.unschedulable.clone(),
    };
    let profile_before = profile.status.clone().unwrap_or_default();
    let mut profile_after = status::profile_status(profile, decision, next, &observed, now);
    profile_after.freeze = freeze;
    ctx.writes
        .status(profile, profile.status.as_ref(), &profile_after)
        .await?;
    ctx.seen.reconciled.lock().expect("not poisoned").insert(
        profile.uid().unwrap_or_default(),
        Reconciled {
            namespace: profile.namespace_str().to_owned(),
            name: profile.name_str().to_owned(),
            lanes: decision.lanes.iter().map(|l| l.name.clone()).collect(),
        },
    );

    let binding = obs.binding();
    let mut lanes = Vec::with_capacity(binding.lanes.len());
    for lane in &binding.lanes {
        let d = decision.lanes.iter().find(|d| d.name == lane.name_str());
        let floor = lane
            .spec
            .floor_units_per_second
            .as_ref()
            .map_or(0.0, |f| f.value());
        let st = status::lane_status(lane, d, None, floor, now);
        ctx.writes.status(*lane, lane.status.as_ref(), &st).await?;
        lanes.push((lane.status.clone().unwrap_or_default(), st));
    }

    let mut policy_report = None;
    if let Some(p) = binding.policy {
        let approved = obs.approved.map(|a| a.level);
        let mut overrides = policy::contract_overrides(p, &binding.lanes);
        overrides.extend(policy::lanes_without_objective(p, &binding.lanes));
        overrides.extend(policy::long_context_without_limit(p, binding.profile));
        // An approval used to enter a level, or lapsed, approves nothing more:
        // the annotation goes, and status forgets it.
        let consumed = decision.approval_consumed;
        let lapsed = decision.approval_lapsed;
        let still = approved.filter(|_| consumed.is_none() && lapsed.is_none());
        let after = status::policy_status(p, Some(decision), None, still, &overrides, now);
        ctx.writes.status(p, p.status.as_ref(), &after).await?;
        if consumed.is_some() || lapsed.is_some() {
            ctx.writes.remove_annotation(p, APPROVE_ANNOTATION).await?;
        }
        policy_report = Some(PolicyReport {
            before: p.status.clone().unwrap_or_default(),
            after,
            approved,
            overrides,
            consumed,
            lapsed,
        });
    }
    let mut ignored = Vec::new();
    for (loser, problem) in binding.ignored.iter().zip(&binding.warnings) {
        let st = status::policy_status(loser, None, Some(problem.to_string()), None, &[], now);
        let written = ctx
            .writes
            .status(*loser, loser.status.as_ref(), &st)
            .await?;
        ignored.push(IgnoredReport {
            problem: problem.clone(),
            written,
        });
    }
    record_metrics(ctx, obs, decision, effects);
    Ok(Reported {
        profile_before,
        profile_after,
        policy: policy_report,
        ignored,
        lanes,
    })
}

/// The profile's gauges and the drain counters.
fn record_metrics(ctx: &Context, obs: &Observation, decision: &ProfileDecision, effects: &Effects) {
    let m = &ctx.metrics;
    let (ns, name) = (obs.profile.namespace_str(), obs.profile.name_str());
    let l = [ns, name];
    m.level.with_label_values(&l).set(f64::from(decision.level));
    match decision.capacity_units_per_second {
        Some(c) => m.capacity.with_label_values(&l).set(c),
        None => {
            let _ = m.capacity.remove_label_values(&l);
        }
    }
    m.demand
        .with_label_values(&l)
        .set(decision.demand_units_per_second);
    m.admitted
        .with_label_values(&l)
        .set(decision.admitted_units_per_second);
    if let Some(u) = decision.utilization_percent {
        m.utilization.with_label_values(&l).set(u);
    }
    if let Some(d) = decision.desired_replicas {
        m.desired_replicas.with_label_values(&l).set(f64::from(d));
    }
    if let Some(r) = obs.ready_replicas {
        m.ready_replicas.with_label_values(&l).set(f64::from(r));
    }
    m.telemetry_known
        .with_label_values(&l)
        .set(if decision.telemetry == Telemetry::Known {
            1.0
        } else {
            0.0
        });
    for lane in &decision.lanes {
        let ll = [ns, name, lane.name.as_str()];
        m.lane_demand
            .with_label_values(&ll)
            .set(lane.demand_units_per_second);
        m.lane_admitted
            .with_label_values(&ll)
            .set(lane.admitted_units_per_second);
        match lane.retry_amplification {
            Some(a) => m.lane_retry_amplification.with_label_values(&ll).set(a),
            None => {
                let _ = m.lane_retry_amplification.remove_label_values(&ll);
            }
        }
        let o = lane.objective.as_ref();
        match o.and_then(|o| o.remaining_percent) {
            Some(r) => m.lane_error_budget_remaining.with_label_values(&ll).set(r),
            None => {
                let _ = m.lane_error_budget_remaining.remove_label_values(&ll);
            }
        }
        match o {
            Some(o) => m
                .lane_budget_band
                .with_label_values(&ll)
                .set(f64::from(o.band.severity())),
            None => {
                let _ = m.lane_budget_band.remove_label_values(&ll);
            }
        }
    }
    if let (Some(done), Some(_)) = (&effects.drain, &obs.profile.spec.drain) {
        use crate::policy::DrainAction;
        for a in &done.actions {
            let counter = match a.action {
                DrainAction::Drain => &m.drains,
                DrainAction::Undrain => &m.undrains,
                _ => continue,
            };
            counter
                .with_label_values(&[ns, name, a.reason.code()])
                .inc();
        }
        let refused = done.refused_by_bound().count();
        if refused > 0 {
            m.drains_refused
                .with_label_values(&l)
                .inc_by(refused as u64);
        }
        m.drained_pods
            .with_label_values(&l)
            .set(f64::from(done.drained_pods));
    }
}
