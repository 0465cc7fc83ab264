//! Report: the statuses of the profile, its lanes, its policy and the
//! policies it ignores; the approval consumed once used; the metrics. What
//! was written comes back as [`Reported`] for the events.
//!
//! The profile's status carries the engine's state (`status.engine`): it is
//! the commit. The governing policy's status goes first, so a transition is
//! recorded there before the engine moves past it (the pass after a failed
//! profile status decides the same transition again, and the policy does
//! not record it twice); the rest follows from the committed state.

use kube::ResourceExt;

use super::super::context::{APPROVE_ANNOTATION, Context, Reconciled};
use super::super::error::Error;
use super::super::status::{self, Observed};
use super::actuate::Effects;
use super::observe::Observation;
use super::refusals::Refused;
use crate::api::{
    CapacityProfileStatus, DegradationPolicy, DegradationPolicyStatus, FreezeStatus,
    LaneContractStatus, ObjectKey,
};
use crate::policy::{self, BindProblem, ProfileDecision, ProfileState, Telemetry, Warning};

/// The statuses before and after, for the events: what was written (a
/// write that failed ends the report, and what it would have written is not
/// here).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reported {
    /// The profile's status before this step.
    pub profile_before: CapacityProfileStatus,
    /// And after.
    pub profile_after: CapacityProfileStatus,
    /// Whether the profile's status for this decision (with the engine's
    /// state) is in place: the events that follow from the decision are due.
    pub committed: bool,
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
    /// The approval consumed (used to enter a level) in this step, once
    /// its annotation is removed.
    pub consumed: Option<u32>,
    /// The approval that lapsed in this step, once its annotation is
    /// removed.
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

/// What one decision reports.
struct Report<'a> {
    ctx: &'a Context,
    obs: &'a Observation,
    decision: &'a ProfileDecision,
}

/// Writes the statuses and consumes a used approval: the governing
/// policy's status, the profile's (the commit), the approval's annotation,
/// the lanes' and the ignored policies' statuses. A write that fails ends
/// it: what was written comes back with the error.
pub async fn report(
    ctx: &Context,
    obs: &Observation,
    decision: &ProfileDecision,
    next: &ProfileState,
    effects: &Effects,
    freeze: Option<FreezeStatus>,
) -> (Reported, Result<(), Error>) {
    let r = Report { ctx, obs, decision };
    let mut out = Reported {
        profile_before: obs.profile.status.clone().unwrap_or_default(),
        ..Default::default()
    };
    let result = r.write(next, effects, freeze, &mut out).await;
    if out.committed {
        record_metrics(ctx, obs, decision);
    }
    (out, result)
}

impl Report<'_> {
    async fn write(
        &self,
        next: &ProfileState,
        effects: &Effects,
        freeze: Option<FreezeStatus>,
        out: &mut Reported,
    ) -> Result<(), Error> {
        let policy = self.obs.binding().policy;
        if let Some(p) = policy {
            out.policy = Some(self.policy(p).await?);
        }
        self.profile(next, effects, freeze, out).await?;
        if let (Some(p), Some(report)) = (policy, out.policy.as_mut()) {
            self.consume_approval(p, report).await?;
        }
        self.lanes(&mut out.lanes).await?;
        self.ignored(&mut out.ignored).await
    }

    /// The governing policy's status, with the transition.
    async fn policy(&self, p: &DegradationPolicy) -> Result<PolicyReport, Error> {
        let binding = self.obs.binding();
        let approved = self.obs.approved.map(|a| a.level);
        let mut overrides = policy::contract_overrides(p, &binding.lanes);
        overrides.extend(policy::lanes_without_objective(p, &binding.lanes));
        overrides.extend(policy::long_context_without_limit(p, binding.profile));
        // An approval used to enter a level, or lapsed, approves nothing
        // more: its annotation goes, and only then does status forget it
        // (consume_approval). Until then status keeps when it was given, so
        // a pass after a failed removal still knows it as the one used.
        let d = self.decision;
        let after = status::policy_status(p, Some(d), None, approved, &overrides, self.obs.now);
        self.ctx.writes.status(p, p.status.as_ref(), &after).await?;
        Ok(PolicyReport {
            before: p.status.clone().unwrap_or_default(),
            after,
            approved,
            overrides,
            consumed: None,
            lapsed: None,
        })
    }

    /// The profile's status, with the engine's state and what actuation
    /// did and had refused: the commit.
    async fn profile(
        &self,
        next: &ProfileState,
        effects: &Effects,
        freeze: Option<FreezeStatus>,
        out: &mut Reported,
    ) -> Result<(), Error> {
        let (ctx, obs) = (self.ctx, self.obs);
        let profile = &obs.profile;
        let observed = Observed {
            ready_replicas: obs.ready_replicas,
            scale_problem: obs.scale_problem.clone(),
            scaling_conflict: effects
                .scaling_conflict
                .as_ref()
                .map(|c| (c.reason(), c.to_string())),
            unknown: obs.unknown.clone(),
            calibration: obs.calibration.clone(),
            observed_config_hash: obs
                .pool
                .as_ref()
                .and_then(|p| p.config_hash.as_ref().ok().cloned()),
            drain: effects.drain.clone(),
            unschedulable: obs.unschedulable.clone(),
            refused: effects.refused.iter().map(ToString::to_string).collect(),
        };
        let mut after = status::profile_status(profile, self.decision, next, &observed, obs.now);
        after.freeze = freeze;
        ctx.writes
            .status(profile, profile.status.as_ref(), &after)
            .await?;
        out.profile_after = after;
        out.committed = true;
        ctx.seen.reconciled.lock().expect("not poisoned").insert(
            profile.uid().unwrap_or_default(),
            Reconciled {
                namespace: profile.namespace_str().to_owned(),
                name: profile.name_str().to_owned(),
                lanes: self.decision.lanes.iter().map(|l| l.name.clone()).collect(),
            },
        );
        Ok(())
    }

    /// Removes the annotation of an approval used or lapsed, then forgets
    /// it in the policy's status. An approval the engine used before and
    /// still annotated (its removal failed, or the controller stopped
    /// before it) is removed now.
    async fn consume_approval(
        &self,
        p: &DegradationPolicy,
        report: &mut PolicyReport,
    ) -> Result<(), Error> {
        let (d, obs) = (self.decision, self.obs);
        let used_before = obs.approved.filter(|a| obs.prev.approval_used == Some(*a));
        let consumed = d.approval_consumed.or(used_before.map(|a| a.level));
        let lapsed = d.approval_lapsed;
        if consumed.is_none() && lapsed.is_none() {
            return Ok(());
        }
        let writes = &self.ctx.writes;
        writes.remove_annotation(p, APPROVE_ANNOTATION).await?;
        report.consumed = consumed;
        report.lapsed = lapsed;
        let forgotten = DegradationPolicyStatus {
            approved_level: None,
            approved_at: None,
            ..report.after.clone()
        };
        writes.status(p, Some(&report.after), &forgotten).await?;
        report.after = forgotten;
        Ok(())
    }

    /// The lanes' statuses, in the binding's order.
    async fn lanes(
        &self,
        out: &mut Vec<(LaneContractStatus, LaneContractStatus)>,
    ) -> Result<(), Error> {
        let binding = self.obs.binding();
        for lane in &binding.lanes {
            let d = self
                .decision
                .lanes
                .iter()
                .find(|d| d.name == lane.name_str());
            let floor = lane
                .spec
                .floor_units_per_second
                .as_ref()
                .map_or(0.0, |f| f.value());
            let st = status::lane_status(lane, d, None, floor, self.obs.now);
            self.ctx
                .writes
                .status(*lane, lane.status.as_ref(), &st)
                .await?;
            out.push((lane.status.clone().unwrap_or_default(), st));
        }
        Ok(())
    }

    /// The statuses of the policies the binding ignores.
    async fn ignored(&self, out: &mut Vec<IgnoredReport>) -> Result<(), Error> {
        let binding = self.obs.binding();
        for (loser, problem) in binding.ignored.iter().zip(&binding.warnings) {
            let st = status::policy_status(
                loser,
                None,
                Some(problem.to_string()),
                None,
                &[],
                self.obs.now,
            );
            let written = self
                .ctx
                .writes
                .status(*loser, loser.status.as_ref(), &st)
                .await?;
            out.push(IgnoredReport {
                problem: problem.clone(),
                written,
            });
        }
        Ok(())
    }
}

/// The gateway ConfigMap was refused: the profile's `Ready` condition says
/// so, and the rest of its status, the engine's state included, stays as it
/// was (the gateways still enforce the config that state decided).
pub async fn config_refused(
    ctx: &Context,
    obs: &Observation,
    refused: &Refused,
) -> Result<Reported, Error> {
    let profile = &obs.profile;
    let before = profile.status.clone().unwrap_or_default();
    let ready = status::ready_condition(obs.scale_problem.as_deref(), &[refused.to_string()]);
    let after = status::with_condition(&before, ready, profile.metadata.generation, obs.now);
    ctx.writes
        .status(profile, profile.status.as_ref(), &after)
        .await?;
    Ok(Reported {
        profile_before: before,
        profile_after: after,
        ..Default::default()
    })
}

/// The drain counters: what actuation did (counted when it is done, whatever
/// the report then does).
pub fn count_drain(ctx: &Context, obs: &Observation, effects: &Effects) {
    use crate::policy::DrainAction;
    let Some(done) = &effects.drain else {
        return;
    };
    let m = &ctx.metrics;
    let (ns, name) = (obs.profile.namespace_str(), obs.profile.name_str());
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
            .with_label_values(&[ns, name])
            .inc_by(refused as u64);
    }
    if obs.profile.spec.drain.is_some() {
        m.drained_pods
            .with_label_values(&[ns, name])
            .set(f64::from(done.drained_pods));
    }
}

/// The profile's gauges.
fn record_metrics(ctx: &Context, obs: &Observation, decision: &ProfileDecision) {
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
    let lanes: Vec<String> = decision.lanes.iter().map(|l| l.name.clone()).collect();
    m.keep_lanes(ns, name, &lanes);
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
}
