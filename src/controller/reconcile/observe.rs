//! Observe: everything one decision needs, read once, into an
//! [`Observation`]: the profile and what binds to it (through
//! `policy::bind_profile`, the rule `plan` uses), the pool's pods and scale
//! target, the signal sources' snapshot and the engine's last state.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kube::ResourceExt;

use super::super::context::{APPROVE_ANNOTATION, Context};
use super::super::drain::Acting;
use super::super::error::Error;
use super::super::index::TargetView;
use super::super::pods::{self, CachedPod};
use super::super::scale::{self, TargetState};
use super::pool::{self as pool_view, PoolView, WorkloadKind};
use super::shared_target;
use crate::api::calibration::CalibrationCheck;
use crate::api::{
    Approval, CapacityProfile, DegradationPolicy, DrainReason, DrainedPod, LaneContract, ObjectKey,
    PolicyMode, ProfileState, ScalingMode, StaleCalibrationMode,
};
use crate::policy::{self, Binding};
use crate::signals::{SourceInput, SourceOutput, merge};
use crate::snapshot::{ProfileSignals, Snapshot};

/// Now, in Unix seconds.
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Everything one reconcile of one profile knows, read once.
pub struct Observation {
    /// When it was read (Unix seconds).
    pub now: i64,
    /// The profile (freshest of the cache and our own writes).
    pub profile: CapacityProfile,
    /// Its lanes, by name.
    pub lanes: Vec<LaneContract>,
    /// The policies naming it: the governing one first, then those it
    /// outranks.
    pub policies: Vec<DegradationPolicy>,
    /// Enforce or Observe, decided once from the governing policy.
    pub mode: PolicyMode,
    /// The governing policy's approval annotation: the level it approves and
    /// when the controller first saw it (kept in the policy's status).
    pub approved: Option<Approval>,
    /// The pool's pods, once the pod index has synced.
    pub pods: Option<Vec<Arc<CachedPod>>>,
    /// The scale target, when it could be read.
    pub target: Option<TargetState>,
    /// Why the scale target could not be read.
    pub scale_problem: Option<String>,
    /// The signals for the engine.
    pub snapshot: Snapshot,
    /// The engine's last state (from status), with the drained set as the
    /// cluster shows it.
    pub prev: ProfileState,
    /// Ready replicas (the scale target's, else the ready pods).
    pub ready_replicas: Option<u32>,
    /// Unknown signals with the reason.
    pub unknown: BTreeMap<String, String>,
    /// Pods the scheduler could not place, with its message for one.
    pub unschedulable: Option<(usize, String)>,
    /// What the pool's workload says: its pod template's hash and its
    /// rollout (None when the scale target could not be read).
    pub pool: Option<PoolView>,
    /// What the calibration says about the pool now.
    pub calibration: CalibrationCheck,
    /// The older profile that sizes and drains the same workload, when one
    /// does (then this one writes neither).
    pub outranked_by: Option<String>,
}

impl Observation {
    /// The binding, by the one rule (`policy::bind_profile`).
    pub fn binding(&self) -> Binding<'_> {
        policy::bind_profile(&self.profile, &self.lanes, &self.policies)
    }

    /// Whether the governing policy only observes (nothing is enforced).
    pub fn observe_only(&self) -> bool {
        self.mode == PolicyMode::Observe
    }

    /// How the drain acts on the pool's pods: not at all when another
    /// profile acts on the workload, only on the readiness gates in observe
    /// mode.
    pub fn drain_acting(&self) -> Acting {
        match (&self.outranked_by, self.observe_only()) {
            (Some(_), _) => Acting::Outranked,
            (None, true) => Acting::Observe,
            (None, false) => Acting::Enforce,
        }
    }
}

/// The approval granted by a policy's annotation, given when the policy's
/// status first recorded it (or now, when it is new).
pub fn approval(policy: &DegradationPolicy, now: i64) -> Option<Approval> {
    let level: u32 = policy
        .annotations()
        .get(APPROVE_ANNOTATION)
        .and_then(|v| v.trim().parse().ok())?;
    let status = policy.status.as_ref();
    let given_at = status
        .filter(|s| s.approved_level == Some(level))
        .and_then(|s| s.approved_at.as_deref())
        .and_then(crate::api::common::parse_rfc3339)
        .unwrap_or(now);
    Some(Approval {
        level,
        given_at: Some(given_at),
    })
}

/// What the workload says about the pool, into the engine's signals: the
/// calibration's staleness, the rollout, the current revision and each
/// pod's revision (from the kind's revision label). Adds to `unknown` what
/// could not be had or what `Hold` makes Unknown.
pub fn pool_signals(
    profile: &CapacityProfile,
    pool: Option<&PoolView>,
    calibration: &CalibrationCheck,
    raw_pods: Option<&[Arc<CachedPod>]>,
    signals: &mut ProfileSignals,
    unknown: &mut BTreeMap<String, String>,
) {
    signals.calibration_stale = calibration.stale();
    if let Some(why) = signals.calibration_stale
        && profile.spec.capacity.on_stale_calibration == StaleCalibrationMode::Hold
        && signals.available_units_per_second.is_none()
    {
        unknown.insert(
            CALIBRATED_CAPACITY.to_owned(),
            format!(
                "the calibration is stale ({}) and capacity.onStaleCalibration is Hold",
                why.as_str()
            ),
        );
    }
    let Some(pool) = pool else {
        return;
    };
    signals.rollout_in_progress = pool.rollout_in_progress;
    signals.current_revision = pool.current_revision.clone();
    if let Some(problem) = &pool.revision_problem {
        unknown.insert("currentRevision".to_owned(), problem.clone());
    }
    let kind = WorkloadKind::of(&profile.spec.pool.scale_target_ref);
    for p in raw_pods.unwrap_or_default() {
        if let Some(s) = signals.pods.get_mut(&p.name_any()) {
            s.revision = p.revision(kind).map(str::to_owned);
        }
    }
}

/// The `unknown` key saying why calibrated capacity is not used.
pub const CALIBRATED_CAPACITY: &str = "calibratedCapacity";

/// The drained set as the cluster shows it: labelled pods, with the time and
/// reason from their annotations and the healthy window from the engine's
/// last state. Who is drained is read from the cluster, never from memory.
pub fn drained_from_cluster(
    pods: &[Arc<CachedPod>],
    engine: &BTreeMap<String, DrainedPod>,
    now: i64,
) -> BTreeMap<String, DrainedPod> {
    pods.iter()
        .filter(|p| p.drained)
        .map(|p| {
            let name = p.name_any();
            let prev = engine.get(&name);
            let since = p
                .drained_at
                .as_deref()
                .and_then(crate::api::common::parse_rfc3339)
                .or(prev.map(|d| d.since))
                .unwrap_or(now);
            let reason = p
                .drain_reason
                .as_deref()
                .map(DrainReason::from)
                .or(prev.map(|d| d.reason.clone()))
                .unwrap_or(DrainReason::LabelledByHand);
            (
                name,
                DrainedPod {
                    since,
                    reason,
                    healthy_since: prev.and_then(|d| d.healthy_since),
                },
            )
        })
        .collect()
}

/// What observe found.
pub enum Observed {
    /// Everything one decision needs.
    Ready(Box<Observation>),
    /// A watch of the pool (its pods, its scale target) is on its first
    /// list, for at most this long more: nothing is decided on a cache not
    /// yet listed; the first list triggers the reconcile again.
    FirstSync(Duration),
}

/// The objects bound to the profile (through `policy::bind_profile`, from
/// the watch caches), each the freshest copy: its lanes, and the policies
/// naming it. Whether a policy governs it (then the first one).
fn bound_objects(
    ctx: &Context,
    profile: &CapacityProfile,
) -> (Vec<LaneContract>, Vec<DegradationPolicy>, bool) {
    let lane_objs = ctx.lanes.state();
    let policy_objs = ctx.policies.state();
    let binding = policy::bind_profile(
        profile,
        lane_objs.iter().filter_map(|g| g.0.as_ref().ok()),
        policy_objs.iter().filter_map(|g| g.0.as_ref().ok()),
    );
    let lanes: Vec<LaneContract> = binding
        .lanes
        .iter()
        .map(|l| ctx.writes.freshen(*l))
        .collect();
    let policies: Vec<DegradationPolicy> = binding
        .policy
        .into_iter()
        .chain(binding.ignored.iter().copied())
        .map(|p| ctx.writes.freshen(p))
        .collect();
    (lanes, policies, binding.policy.is_some())
}

/// The scale target and its ReplicaSets, from their watch caches, or why
/// they could not be had. Fails only on an API error worth a retry.
async fn scale_target(
    ctx: &Context,
    profile: &CapacityProfile,
) -> Result<(Option<TargetView>, Option<String>), Error> {
    let target_ref = &profile.spec.pool.scale_target_ref;
    match ctx.index.target(&ctx.resolver, profile).await {
        Ok(Some(v)) => Ok((Some(v), None)),
        Ok(None) => Ok((
            None,
            Some(format!(
                "the watch of {} {} has not synced yet",
                target_ref.kind, target_ref.name
            )),
        )),
        Err(Error::Kube { source, context }) if !matches!(&source, kube::Error::Api(s) if s.code == 404) => {
            Err(Error::Kube { context, source })
        }
        Err(e) => Ok((None, Some(e.to_string()))),
    }
}

/// The engine's last state, from status, with the drained set read from the
/// cluster (when the pods are known). Its pool size is the one lanekeeper
/// sets as the cluster has it now (`sized`, see [`sized_replicas`]), as an
/// HPA starts from the current replicas: a person's scale-up is where the
/// engine starts, so it is never undone while the pool is degraded or
/// telemetry is unknown, and only after the stabilization window
/// otherwise. Where lanekeeper sets no size, the engine's own last value;
/// a profile that never sized its pool starts from the pool's current
/// `replicas`, so demand that wants fewer waits out the stabilization
/// window (and any degradation) like every other scale-down.
fn engine_state(
    profile: &CapacityProfile,
    pods: Option<&[Arc<CachedPod>]>,
    (sized, current_replicas): (Option<i32>, Option<i32>),
    now: i64,
) -> ProfileState {
    let mut prev: ProfileState = profile
        .status
        .as_ref()
        .and_then(|s| s.engine.clone())
        .unwrap_or_default();
    prev.desired_replicas = sized.or(prev.desired_replicas).or(current_replicas);
    if let Some(ps) = pods {
        prev.drained = drained_from_cluster(ps, &prev.drained, now);
    }
    prev
}

/// The replica count lanekeeper sets, as the server has it now (what this
/// leader wrote while the watch has not shown it yet, else the cache): the
/// scale target's replicas in `Direct` mode, its HPA's `minReplicas` in
/// `HPAMinReplicas` mode. None where lanekeeper sets none (observe mode,
/// `Disabled`, an HPA that `Direct` leaves alone) or it can't be read.
fn sized_replicas(
    ctx: &Context,
    profile: &CapacityProfile,
    (mode, outranked): (PolicyMode, bool),
    target: Option<&TargetState>,
) -> Option<i32> {
    if mode == PolicyMode::Observe || outranked {
        return None;
    }
    let ns = profile.namespace_str();
    let r = &profile.spec.pool.scale_target_ref;
    let written = |key: String, rv: Option<String>| {
        let w = ctx.index.lag.written_on(&key, rv.as_deref())?;
        w.parse().ok()
    };
    match (ctx.index.hpa(ns, r), profile.spec.scaling.mode) {
        (_, ScalingMode::Disabled) | (Some(_), ScalingMode::Direct) => None,
        (Some(h), ScalingMode::HpaMinReplicas) => {
            written(scale::hpa_key(ns, &h.name_any()), h.resource_version())
                .or(h.spec.as_ref()?.min_replicas)
        }
        (None, _) => {
            let t = target?;
            let rv = t.workload.as_ref().and_then(|w| w.resource_version());
            written(scale::target_key(ns, r), rv).or(t.replicas)
        }
    }
}

/// Reads everything the decision needs. Fails only on API errors worth a
/// retry; waits for the pool's watches' first lists (within their grace);
/// what can't be had (pods not synced after the grace, no scale target, a
/// signal source down) is recorded as unknown and the engine holds.
pub async fn observe(ctx: &Context, profile: &CapacityProfile) -> Result<Observed, Error> {
    let now = now();
    let profile = ctx.writes.freshen(profile);

    let (lanes, policies, governed) = bound_objects(ctx, &profile);
    let governing = policies.first().filter(|_| governed);
    let mode = governing.map_or(PolicyMode::Enforce, |p| p.spec.mode);
    let approved = governing.and_then(|p| approval(p, now));

    // The pool: pods and the scale target.
    let mut unknown = BTreeMap::new();
    let raw_pods = match ctx.pods.pods(&profile) {
        Ok(p) => p,
        Err(e) => {
            unknown.insert("pods".to_owned(), e.to_string());
            None
        }
    };
    let unschedulable = raw_pods.as_deref().and_then(pods::unschedulable);
    let pool_pods: Option<Vec<crate::signals::PoolPod>> = raw_pods
        .as_ref()
        .map(|ps| ps.iter().map(|p| p.pool_pod()).collect());
    let target_ref = &profile.spec.pool.scale_target_ref;
    let (view, scale_problem) = scale_target(ctx, &profile).await?;
    let first_sync = ctx.pods.first_sync_left(&profile);
    if let Some(left) = first_sync.max(ctx.index.first_sync_left(&profile)) {
        return Ok(Observed::FirstSync(left));
    }
    let pool = view.as_ref().and_then(|v| {
        v.state
            .workload
            .as_ref()
            .map(|w| pool_view::read(target_ref, w, v.replicasets.as_deref()))
    });
    let target = view.map(|v| v.state);
    let calibration = CalibrationCheck::new(
        profile.spec.capacity.calibration.as_ref(),
        pool.as_ref().map(|p| &p.config_hash),
        now,
    );

    // Signals, from every source in order.
    let lane_refs: Vec<&LaneContract> = lanes.iter().collect();
    let input = SourceInput {
        profile: &profile,
        lanes: &lane_refs,
        target_ready_replicas: target.as_ref().and_then(|t| t.ready_replicas),
        pods: pool_pods.as_deref(),
        now,
    };
    let mut out = SourceOutput::default();
    for source in &ctx.sources {
        merge(&mut out, source.collect(&input).await);
    }
    let ready_replicas = out.profile.ready_replicas.or_else(|| {
        pool_pods
            .as_ref()
            .map(|p| p.iter().filter(|p| p.signals().is_ready()).count() as u32)
    });
    unknown.extend(out.unknown.clone());
    let mut snapshot = Snapshot {
        at: now,
        ..Default::default()
    };
    let mut profile_signals = out.profile;
    profile_signals.unknown = out.unknown;
    pool_signals(
        &profile,
        pool.as_ref(),
        &calibration,
        raw_pods.as_deref(),
        &mut profile_signals,
        &mut unknown,
    );
    snapshot.profiles.insert(profile.key(), profile_signals);
    snapshot.lanes = out.lanes;

    let current_replicas = target.as_ref().and_then(|t| t.replicas);
    let outranked_by = shared_target::outranked_by(&profile, &ctx.peer_profiles.state());
    let sized = sized_replicas(
        ctx,
        &profile,
        (mode, outranked_by.is_some()),
        target.as_ref(),
    );
    let prev = engine_state(
        &profile,
        raw_pods.as_deref(),
        (sized, current_replicas),
        now,
    );
    Ok(Observed::Ready(Box::new(Observation {
        now,
        profile,
        lanes,
        policies,
        mode,
        approved,
        pods: raw_pods,
        target,
        scale_problem,
        snapshot,
        prev,
        ready_replicas,
        unknown,
        unschedulable,
        pool,
        calibration,
        outranked_by,
    })))
}
