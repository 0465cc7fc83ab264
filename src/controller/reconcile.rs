//! One reconcile of one CapacityProfile: gather → signals → decide → actuate
//! → report.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::status::{self, Observed};
use super::{APPROVE_ANNOTATION, Context, Error, FIELD_MANAGER, scale};
use crate::api::{CapacityProfile, DegradationPolicy, LaneContract, PolicyMode, ScalingMode};
use crate::gateway;
use crate::policy::{self, Binding, ProfileState, Telemetry};
use crate::signals::{SourceInput, SourceOutput, merge};
use crate::snapshot::Snapshot;

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn key_of<K: Resource>(o: &K) -> String {
    format!(
        "{}/{}",
        o.meta().namespace.as_deref().unwrap_or_default(),
        o.meta().name.as_deref().unwrap_or_default()
    )
}

/// Publishes an event. kube's recorder folds events with the same type,
/// reason, action and object into one series (keeping the first note), so
/// events whose note carries the news (a level change, a scale) use an
/// action that names the outcome.
async fn publish<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    obj: &K,
    type_: EventType,
    reason: &str,
    note: String,
) {
    publish_action(ctx, obj, type_, reason, reason, note).await;
}

async fn publish_action<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    obj: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    };
    match ctx.recorder.publish(&ev, &obj.object_ref(&())).await {
        Ok(()) => ctx.metrics.write("Event", "create"),
        Err(e) => tracing::warn!(error = %e, reason, "failed to publish event"),
    }
}

/// The approval granted by a policy's annotation.
pub fn approved_level(policy: &DegradationPolicy) -> Option<u32> {
    policy
        .annotations()
        .get(APPROVE_ANNOTATION)
        .and_then(|v| v.trim().parse().ok())
}

/// Reconciles one profile.
pub async fn reconcile(
    obj: Arc<DeserializeGuard<CapacityProfile>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let started = Instant::now();
    let profile = match &obj.0 {
        Ok(p) => p,
        Err(invalid) => {
            report_invalid(&ctx, "CapacityProfile", invalid).await;
            return Ok(Action::await_change());
        }
    };
    let ns = profile.namespace().unwrap_or_default();
    let name = profile.name_any();
    // Never decide on a partial index: lanes and policies must have synced.
    // kube's `Store::wait_until_ready` wakes only the task that polled it
    // last, so when many profiles reconcile at start-up, awaiting it left all
    // but one asleep until the timeout (30 s); poll the readiness instead.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !super::stores_ready(&ctx.lanes, &ctx.policies) {
        if Instant::now() >= deadline {
            return Err(Error::IndexNotSynced);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let result = reconcile_profile(profile, &ctx).await;
    ctx.metrics
        .reconcile_duration
        .with_label_values(&[&ns, &name])
        .observe(started.elapsed().as_secs_f64());
    let key = key_of(profile);
    if result.is_ok() {
        ctx.failures.lock().expect("not poisoned").remove(&key);
    }
    result.map(|()| Action::requeue(ctx.settings.resync))
}

/// Backoff per object: 1 s doubling up to 5 minutes.
pub fn error_policy(
    obj: Arc<DeserializeGuard<CapacityProfile>>,
    err: &Error,
    ctx: Arc<Context>,
) -> Action {
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[err.reason()])
        .inc();
    let key = match &obj.0 {
        Ok(p) => key_of(p),
        Err(i) => format!(
            "{}/{}",
            i.metadata.namespace.as_deref().unwrap_or_default(),
            i.metadata.name.as_deref().unwrap_or_default()
        ),
    };
    let mut failures = ctx.failures.lock().expect("not poisoned");
    let n = failures.entry(key.clone()).or_insert(0);
    *n = n.saturating_add(1);
    let delay = Duration::from_secs(1u64 << (*n - 1).min(8)).min(Duration::from_secs(300));
    tracing::warn!(profile = %key, error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

struct Gathered {
    lanes: Vec<LaneContract>,
    policy: Option<DegradationPolicy>,
    /// Policies naming this profile that lose to an older one.
    losers: Vec<(DegradationPolicy, String)>,
}

/// Whether the status this leader wrote (at `written_rv`) is newer than the
/// store's copy (at `store_rv`). Resource versions are compared as numbers
/// when both are numeric (as every API server in practice makes them); when
/// they can't be ordered, what we wrote wins until the store shows the same
/// version.
fn written_is_newer(written_rv: &str, store_rv: Option<&str>) -> bool {
    match (written_rv.parse::<u64>(), store_rv.map(str::parse::<u64>)) {
        (Ok(w), Some(Ok(s))) => w > s,
        _ => store_rv != Some(written_rv),
    }
}

/// The object with the freshest status and annotations we know: the
/// store's, unless this leader wrote a newer one that the watch has not
/// delivered yet. Statuses accumulate (transitions, condition times), so
/// building on a stale copy would lose what was just written; and an
/// approval annotation this leader just consumed must not be read back from
/// a stale copy and consumed again.
pub(crate) fn freshen<K>(ctx: &Context, obj: &K) -> K
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned,
{
    let Some(uid) = obj.meta().uid.as_deref() else {
        return obj.clone();
    };
    let cached = ctx.statuses.lock().expect("not poisoned").get(uid).cloned();
    match cached {
        Some((rv, written)) if written_is_newer(&rv, obj.meta().resource_version.as_deref()) => {
            let mut v = match serde_json::to_value(obj) {
                Ok(v) => v,
                Err(_) => return obj.clone(),
            };
            v["status"] = written["status"].clone();
            v["metadata"]["annotations"] = written["annotations"].clone();
            serde_json::from_value(v).unwrap_or_else(|_| obj.clone())
        }
        _ => obj.clone(),
    }
}

/// Remembers the status and annotations an API write returned.
pub(crate) fn remember<K: Resource + serde::Serialize>(ctx: &Context, written: &K) {
    let (Some(uid), Some(rv)) = (
        written.meta().uid.clone(),
        written.meta().resource_version.clone(),
    ) else {
        return;
    };
    if let Ok(v) = serde_json::to_value(written) {
        let kept = json!({"status": v["status"], "annotations": v["metadata"]["annotations"]});
        ctx.statuses
            .lock()
            .expect("not poisoned")
            .insert(uid, (rv, kept));
    }
}

/// Server-side applies `status` to an object's status subresource as the
/// `lanekeeper` field manager, unless it equals the freshest status known
/// (`current`); remembers what the write returned. Returns whether it wrote.
async fn apply_status<K, S>(
    ctx: &Context,
    obj: &K,
    current: Option<&S>,
    status: &S,
) -> Result<bool, Error>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
    S: serde::Serialize + PartialEq,
{
    if current == Some(status) {
        return Ok(false);
    }
    let api: Api<K> = Api::namespaced(
        ctx.client.clone(),
        obj.meta().namespace.as_deref().unwrap_or_default(),
    );
    let kind = K::kind(&());
    let patch = json!({"apiVersion": K::api_version(&()), "kind": kind, "status": status});
    let written = api
        .patch_status(
            obj.meta().name.as_deref().unwrap_or_default(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|e| Error::kube("apply status", e))?;
    ctx.metrics.write(&kind, "apply-status");
    remember(ctx, &written);
    Ok(true)
}

/// The valid objects of a store that name `profile` (same namespace, not
/// being deleted), freshened and sorted by name.
fn naming<K>(
    ctx: &Context,
    store: &Store<DeserializeGuard<K>>,
    profile: &CapacityProfile,
    target: impl Fn(&K) -> &str,
) -> Vec<K>
where
    K: Resource<DynamicType = ()> + Clone + serde::Serialize + serde::de::DeserializeOwned,
{
    let ns = profile.namespace();
    let name = profile.name_any();
    let mut out: Vec<K> = store
        .state()
        .iter()
        .filter_map(|g| g.0.as_ref().ok())
        .filter(|o| {
            o.namespace() == ns && target(o) == name && o.meta().deletion_timestamp.is_none()
        })
        .map(|o| freshen(ctx, o))
        .collect();
    out.sort_by_key(|o| o.name_any());
    out
}

fn gather(profile: &CapacityProfile, ctx: &Context) -> Gathered {
    let lanes = naming(ctx, &ctx.lanes, profile, |l: &LaneContract| {
        l.spec.profile.as_str()
    });
    let policies = naming(ctx, &ctx.policies, profile, |p: &DegradationPolicy| {
        p.spec.profile.as_str()
    });
    let losers: Vec<(DegradationPolicy, String)> = policy::bind::losing_policies(&policies)
        .into_iter()
        .map(|(l, w)| (l.clone(), w.name_any()))
        .collect();
    let policy = policies
        .into_iter()
        .find(|p| !losers.iter().any(|(l, _)| l.uid() == p.uid()));
    Gathered {
        lanes,
        policy,
        losers,
    }
}

async fn reconcile_profile(profile: &CapacityProfile, ctx: &Context) -> Result<(), Error> {
    let fresh = freshen(ctx, profile);
    let profile = &fresh;
    let now = now();
    let ns = profile.namespace().unwrap_or_default();
    let name = profile.name_any();
    let client = &ctx.client;
    let g = gather(profile, ctx);
    let lane_refs: Vec<&LaneContract> = g.lanes.iter().collect();
    let observe = g
        .policy
        .as_ref()
        .is_some_and(|p| p.spec.mode == PolicyMode::Observe);

    // Index: pods and the scale target.
    let mut observed = Observed::default();
    let raw_pods = match ctx.pods.pods(profile) {
        Ok(p) => p,
        Err(e) => {
            observed.unknown.insert("pods".into(), e);
            None
        }
    };
    observed.unschedulable = raw_pods.as_deref().and_then(super::pods::unschedulable);
    let pods: Option<Vec<crate::signals::PoolPod>> = raw_pods
        .as_ref()
        .map(|ps| ps.iter().map(|p| super::pods::pool_pod(p)).collect());
    let target_ref = &profile.spec.pool.scale_target_ref;
    let target = match scale::read(client, &ctx.resolver, &ns, target_ref).await {
        Ok(t) => Some(t),
        Err(Error::Kube { source, context }) if !matches!(&source, kube::Error::Api(s) if s.code == 404) =>
        {
            return Err(Error::Kube { context, source });
        }
        Err(e) => {
            observed.scale_problem = Some(e.to_string());
            None
        }
    };

    // Signals.
    let input = SourceInput {
        profile,
        lanes: &lane_refs,
        target_ready_replicas: target.as_ref().and_then(|t| t.ready_replicas),
        pods: pods.as_deref(),
        now,
    };
    let mut out = SourceOutput::default();
    for source in &ctx.sources {
        let o = source.collect(&input).await;
        merge(&mut out, o);
    }
    let pkey = key_of(profile);
    let mut snapshot = Snapshot {
        at: now,
        ..Default::default()
    };
    let mut profile_signals = out.profile.clone();
    profile_signals.unknown = out.unknown.clone();
    snapshot.profiles.insert(pkey.clone(), profile_signals);
    snapshot.lanes = out.lanes.clone();
    observed.unknown.extend(out.unknown.clone());
    observed.ready_replicas = out.profile.ready_replicas.or_else(|| {
        pods.as_ref().map(|p| {
            p.iter()
                .filter(|p| p.containers_ready && !p.terminating)
                .count() as u32
        })
    });
    observed.calibration_expired = status::calibration_expired(profile, now);

    // Decide.
    let mut prev: ProfileState = profile
        .status
        .as_ref()
        .and_then(|s| s.engine.clone())
        .unwrap_or_default();
    // Who is drained is read from the cluster (the labels), never from memory.
    if let Some(ps) = &raw_pods {
        let owned: Vec<k8s_openapi::api::core::v1::Pod> =
            ps.iter().map(|p| (**p).clone()).collect();
        prev.drained = super::drain::drained_from_cluster(&owned, &prev.drained, now);
    }
    let approved = g.policy.as_ref().and_then(approved_level);
    let binding = Binding {
        profile,
        lanes: lane_refs.clone(),
        policy: g.policy.as_ref(),
        warnings: g
            .losers
            .iter()
            .map(|(l, w)| {
                format!(
                    "policy {}/{} is ignored: {w} already governs profile {name}",
                    ns,
                    l.name_any()
                )
            })
            .collect(),
    };
    let (decision, next) = policy::evaluate_profile(&binding, &snapshot, approved, &prev);

    // Actuate: the gateway config.
    let cm_name = gateway::configmap_name(&name, observe);
    let cm_api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let current_cm = cm_api
        .get_opt(&cm_name)
        .await
        .map_err(|e| Error::kube("get gateway configmap", e))?;
    let prev_cfg: Option<gateway::GatewayConfig> = current_cm
        .as_ref()
        .and_then(|c| c.data.as_ref())
        .and_then(|d| d.get(gateway::CONFIG_KEY))
        .and_then(|s| serde_json::from_str(s).ok());
    let cfg = gateway::build(
        &decision,
        &lane_refs,
        g.policy.as_ref(),
        profile.metadata.generation.unwrap_or(0),
        prev_cfg.as_ref(),
        now,
    );
    let current_hash = current_cm
        .as_ref()
        .and_then(|c| c.annotations().get(gateway::HASH_ANNOTATION).cloned());
    if current_hash.as_deref() != Some(cfg.content_hash.as_str()) {
        let owner = profile
            .controller_owner_ref(&())
            .expect("profile has a name and uid");
        let cm = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": cm_name,
                "namespace": ns,
                "labels": {
                    "app.kubernetes.io/managed-by": "lanekeeper",
                    "lanekeeper.dev/profile": name,
                    "lanekeeper.dev/mode": if observe { "Observe" } else { "Enforce" },
                },
                "annotations": {gateway::HASH_ANNOTATION: cfg.content_hash},
                "ownerReferences": [owner],
            },
            "data": {gateway::CONFIG_KEY: gateway::to_json(&cfg)},
        });
        cm_api
            .patch(
                &cm_name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&cm),
            )
            .await
            .map_err(|e| Error::kube("apply gateway configmap", e))?;
        ctx.metrics.write("ConfigMap", "apply");
        tracing::info!(profile = %pkey, configmap = %cm_name, hash = %cfg.content_hash, "gateway config written");
    }

    // Actuate: the pool size (never in observe mode, never without an opinion).
    let mut scaled = None;
    if let (Some(t), false) = (&target, observe) {
        match profile.spec.scaling.mode {
            ScalingMode::Disabled => {}
            mode => {
                let hpa = scale::find_hpa(client, &ns, target_ref).await?;
                match (hpa, mode) {
                    (Some(h), ScalingMode::HpaMinReplicas) => {
                        if let Some(d) = decision.desired_replicas
                            && scale::write_hpa_min(client, &ns, &h, d, FIELD_MANAGER).await?
                        {
                            ctx.metrics.write("HorizontalPodAutoscaler", "apply");
                            scaled = Some(format!(
                                "raised HorizontalPodAutoscaler {} minReplicas to {d}",
                                h.name_any()
                            ));
                        }
                    }
                    (Some(h), _) => {
                        observed.scaling_conflict = Some(format!(
                            "HorizontalPodAutoscaler {} targets {} {}: lanekeeper leaves the replicas alone (set spec.scaling.mode to HPAMinReplicas to raise its minimum instead, or Disabled)",
                            h.name_any(),
                            target_ref.kind,
                            target_ref.name
                        ));
                    }
                    (None, _) => {
                        if let Some(n) =
                            scale::scale_write_due(decision.desired_replicas, t.replicas)
                        {
                            scale::write(client, &ctx.resolver, &ns, target_ref, n, FIELD_MANAGER)
                                .await?;
                            ctx.metrics.write("Scale", "apply");
                            scaled = Some(format!(
                                "scaled {} {} from {} to {n} replicas",
                                target_ref.kind,
                                target_ref.name,
                                t.replicas.map_or("unknown".into(), |r| r.to_string())
                            ));
                        }
                    }
                }
            }
        }
    }

    // Actuate: the bounded drain (only with a synced pod index).
    if let (Some(spec), Some(_)) = (&profile.spec.drain, &raw_pods) {
        let selector = super::pods::selector_of(profile).map_err(Error::Invalid)?;
        let metrics = &ctx.metrics;
        let pod_api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
        let report = super::drain::actuate(
            &pod_api,
            &selector,
            spec,
            &decision,
            !observe,
            now,
            |kind| metrics.write(kind, "patch"),
        )
        .await?;
        let reason_of = |r: &str| r.split(':').next().unwrap_or(r).to_owned();
        for (pod, why) in &report.drained {
            metrics
                .drains
                .with_label_values(&[&ns, &name, &reason_of(why)])
                .inc();
            publish_action(
                ctx,
                profile,
                EventType::Warning,
                "PodDrained",
                &format!("Drain{pod}"),
                format!("pod {pod} taken out of rotation: {why}"),
            )
            .await;
        }
        for (pod, why) in &report.undrained {
            metrics
                .undrains
                .with_label_values(&[&ns, &name, &reason_of(why)])
                .inc();
            publish_action(
                ctx,
                profile,
                EventType::Normal,
                "PodUndrained",
                &format!("Undrain{pod}"),
                format!("pod {pod} back in rotation: {why}"),
            )
            .await;
        }
        let refused_by_bound: Vec<&(String, String)> = report
            .refused
            .iter()
            .filter(|(_, why)| why.starts_with("DrainBudgetExhausted"))
            .collect();
        if !refused_by_bound.is_empty() {
            metrics
                .drains_refused
                .with_label_values(&[&ns, &name])
                .inc_by(refused_by_bound.len() as u64);
        }
        metrics
            .drained_pods
            .with_label_values(&[&ns, &name])
            .set(f64::from(report.drained_count));
        observed.drain = Some(report);
    }

    // Report: status of the profile, its lanes and its policy.
    let old_status = profile.status.clone().unwrap_or_default();
    let new_status = status::profile_status(profile, &decision, &next, &observed, now);
    apply_status(ctx, profile, profile.status.as_ref(), &new_status).await?;
    ctx.written.lock().expect("not poisoned").insert(
        profile.uid().unwrap_or_default(),
        Written {
            namespace: ns.clone(),
            name: name.clone(),
            lanes: decision.lanes.iter().map(|l| l.name.clone()).collect(),
        },
    );

    for lane in &g.lanes {
        let d = decision.lanes.iter().find(|d| d.name == lane.name_any());
        let floor = lane
            .spec
            .floor_units_per_second
            .as_ref()
            .map_or(0.0, |f| f.value());
        let st = status::lane_status(lane, d, None, floor, now);
        apply_status(ctx, lane, lane.status.as_ref(), &st).await?;
    }

    let policy_api: Api<DegradationPolicy> = Api::namespaced(client.clone(), &ns);
    if let Some(p) = &g.policy {
        let overrides = policy::contract_overrides(p, &lane_refs);
        let st = status::policy_status(p, Some(&decision), None, approved, &overrides, now);
        let old = p.status.clone().unwrap_or_default();
        apply_status(ctx, p, p.status.as_ref(), &st).await?;
        // Events about the policy.
        if old.approved_level != approved
            && let Some(a) = approved
        {
            publish(
                ctx,
                p,
                EventType::Normal,
                "ApprovalGranted",
                format!("levels up to {a} approved by annotation {APPROVE_ANNOTATION}"),
            )
            .await;
        }
        if st.pending_approval_level.is_some()
            && st.pending_approval_level != old.pending_approval_level
        {
            publish(ctx, p, EventType::Warning, "ApprovalPending", format!(
                "level {} waits for approval: annotate the policy with {APPROVE_ANNOTATION}: \"{}\"",
                st.pending_approval_level.unwrap_or_default(),
                st.pending_approval_level.unwrap_or_default()
            ))
            .await;
        }
        let old_valid = old
            .conditions
            .iter()
            .find(|c| c.type_ == "Valid")
            .map(|c| c.message.clone());
        let new_valid = st
            .conditions
            .iter()
            .find(|c| c.type_ == "Valid")
            .map(|c| c.message.clone());
        if !overrides.is_empty() && old_valid != new_valid {
            publish(
                ctx,
                p,
                EventType::Warning,
                "ContractOverride",
                overrides.join("; "),
            )
            .await;
        }
        // An approval is consumed once the ladder has reached it and falls
        // below it again.
        if let Some(a) = approved
            && st.approved_level_reached
            && decision.level < a
        {
            let patch = json!({"metadata": {"annotations": {APPROVE_ANNOTATION: null}}});
            policy_api
                .patch(
                    &p.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(|e| Error::kube("consume approval", e))
                .map(|o| remember(ctx, &o))?;
            ctx.metrics.write("DegradationPolicy", "merge");
            publish(
                ctx,
                p,
                EventType::Normal,
                "ApprovalConsumed",
                format!("level fell below the approved level {a}: approval consumed"),
            )
            .await;
        }
    }
    for (loser, winner) in &g.losers {
        let msg = format!(
            "ignored: DegradationPolicy {winner} already governs profile {name} (the older policy wins)"
        );
        let st = status::policy_status(loser, None, Some(msg.clone()), None, &[], now);
        if apply_status(ctx, loser, loser.status.as_ref(), &st).await? {
            publish(ctx, loser, EventType::Warning, "DuplicatePolicy", msg).await;
        }
    }

    // Events about the profile.
    if let Some(t) = &decision.transition {
        let (type_, reason) = if t.to > t.from {
            (EventType::Warning, "LevelRaised")
        } else {
            (EventType::Normal, "LevelLowered")
        };
        let action = format!("SetLevel{}From{}", t.to, t.from);
        publish_action(
            ctx,
            profile,
            type_,
            reason,
            &action,
            format!(
                "level {} -> {} ({}): {}",
                t.from, t.to, decision.level_name, t.reason
            ),
        )
        .await;
    }
    if let Some(s) = scaled {
        let action = format!("Scale{}", decision.desired_replicas.unwrap_or_default());
        publish_action(ctx, profile, EventType::Normal, "Scaled", &action, s).await;
    }
    let was = |t: &str| {
        old_status
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| c.status.clone())
    };
    if decision.telemetry == Telemetry::Unknown && was("TelemetryKnown").as_deref() != Some("False")
    {
        let why = observed
            .unknown
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join("; ");
        publish(
            ctx,
            profile,
            EventType::Warning,
            "TelemetryUnknown",
            format!("holding level {}: {why}", decision.level),
        )
        .await;
    }
    if decision.telemetry == Telemetry::Known && was("TelemetryKnown").as_deref() == Some("False") {
        publish(
            ctx,
            profile,
            EventType::Normal,
            "TelemetryRestored",
            "capacity is known again".into(),
        )
        .await;
    }
    if observed.scaling_conflict.is_some() && was("ScalingConflict").as_deref() != Some("True") {
        publish(
            ctx,
            profile,
            EventType::Warning,
            "ScalingConflict",
            observed.scaling_conflict.clone().unwrap_or_default(),
        )
        .await;
    }

    if let Some(c) = new_status
        .conditions
        .iter()
        .find(|c| c.type_ == "DrainBudgetExhausted")
        && c.status == "True"
        && (was("DrainBudgetExhausted").as_deref() != Some("True")
            || old_status
                .conditions
                .iter()
                .any(|o| o.type_ == "DrainBudgetExhausted" && o.message != c.message))
    {
        publish(
            ctx,
            profile,
            EventType::Warning,
            "DrainBudgetExhausted",
            c.message.clone(),
        )
        .await;
    }

    // Metrics.
    let m = &ctx.metrics;
    let l = [ns.as_str(), name.as_str()];
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
    if let Some(r) = observed.ready_replicas {
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
        let ll = [ns.as_str(), name.as_str(), lane.name.as_str()];
        m.lane_demand
            .with_label_values(&ll)
            .set(lane.demand_units_per_second);
        m.lane_admitted
            .with_label_values(&ll)
            .set(lane.admitted_units_per_second);
    }
    Ok(())
}

/// Reports an invalid object once per resourceVersion: an event and a
/// condition in its status.
pub async fn report_invalid(
    ctx: &Context,
    kind: &str,
    invalid: &kube::core::error_boundary::InvalidObject,
) {
    // Once per spec generation (our own status writes don't change it).
    let uid = invalid.metadata.uid.clone().unwrap_or_default();
    let rv = invalid.metadata.generation.unwrap_or_default().to_string();
    {
        let mut seen = ctx.reported_invalid.lock().expect("not poisoned");
        if seen.get(&uid) == Some(&rv) {
            return;
        }
        seen.insert(uid.clone(), rv);
    }
    let ns = invalid.metadata.namespace.clone().unwrap_or_default();
    let name = invalid.metadata.name.clone().unwrap_or_default();
    tracing::warn!(kind, namespace = %ns, name = %name, error = %invalid.error, "invalid object");
    let (plural, cond_type) = match kind {
        "CapacityProfile" => ("capacityprofiles", "Ready"),
        "LaneContract" => ("lanecontracts", "Bound"),
        _ => ("degradationpolicies", "Valid"),
    };
    let ar = kube::core::ApiResource {
        group: crate::api::GROUP.into(),
        version: "v1alpha1".into(),
        api_version: "lanekeeper.dev/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &ar);
    // Name the field: read the raw object again with a path-tracking reader.
    let detail = match api.get_opt(&name).await {
        Ok(Some(raw)) => serde_json::to_value(&raw)
            .ok()
            .and_then(|v| crate::manifest::explain(kind, &v)),
        _ => None,
    };
    let message = match detail {
        Some((field, why)) => format!("the object cannot be read: {field}: {why}"),
        None => format!("the object cannot be read: {}", invalid.error),
    };
    let patch = json!({
        "status": {"conditions": [{
            "type": cond_type,
            "status": "False",
            "reason": "InvalidSpec",
            "message": message,
            "lastTransitionTime": status::rfc3339(now()),
            "observedGeneration": invalid.metadata.generation,
        }]}
    });
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => ctx.metrics.write(kind, "merge-status"),
        Err(e) => tracing::warn!(error = %e, "failed to report the invalid object in its status"),
    }
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("lanekeeper.dev/v1alpha1".into()),
        kind: Some(kind.into()),
        name: Some(name),
        namespace: Some(ns),
        uid: invalid.metadata.uid.clone(),
        ..Default::default()
    };
    let ev = Event {
        type_: EventType::Warning,
        reason: "InvalidObject".into(),
        note: Some(message.chars().take(1000).collect()),
        action: "Validate".into(),
        secondary: None,
    };
    match ctx.recorder.publish(&ev, &reference).await {
        Ok(()) => ctx.metrics.write("Event", "create"),
        Err(e) => tracing::warn!(error = %e, "failed to publish event"),
    }
}

/// Periodic pass over what no profile reconcile sees: invalid lanes and
/// policies, lanes whose profile does not exist, policies naming a missing
/// profile, and metrics of deleted profiles.
pub async fn report_orphans(
    ctx: &Context,
    profiles: &Store<DeserializeGuard<CapacityProfile>>,
    lanes: &Store<DeserializeGuard<LaneContract>>,
    policies: &Store<DeserializeGuard<DegradationPolicy>>,
) {
    let profile_names: std::collections::BTreeSet<(String, String)> = profiles
        .state()
        .iter()
        .map(|p| match &p.0 {
            Ok(p) => (p.namespace().unwrap_or_default(), p.name_any()),
            Err(i) => (
                i.metadata.namespace.clone().unwrap_or_default(),
                i.metadata.name.clone().unwrap_or_default(),
            ),
        })
        .collect();
    let now = now();
    for l in lanes.state().iter() {
        match &l.0 {
            Err(invalid) => report_invalid(ctx, "LaneContract", invalid).await,
            Ok(lane) => {
                let lane = &freshen(ctx, lane);
                let ns = lane.namespace().unwrap_or_default();
                if !profile_names.contains(&(ns.clone(), lane.spec.profile.clone())) {
                    let msg = format!(
                        "CapacityProfile {ns}/{} does not exist: the lane takes no part",
                        lane.spec.profile
                    );
                    let st = status::lane_status(lane, None, Some(msg.clone()), 0.0, now);
                    report_orphan(ctx, lane, lane.status.as_ref(), &st, msg).await;
                }
            }
        }
    }
    for p in policies.state().iter() {
        match &p.0 {
            Err(invalid) => report_invalid(ctx, "DegradationPolicy", invalid).await,
            Ok(policy) => {
                let policy = &freshen(ctx, policy);
                let ns = policy.namespace().unwrap_or_default();
                if !profile_names.contains(&(ns.clone(), policy.spec.profile.clone())) {
                    let msg = format!(
                        "CapacityProfile {ns}/{} does not exist",
                        policy.spec.profile
                    );
                    let st = status::policy_status(policy, None, Some(msg.clone()), None, &[], now);
                    report_orphan(ctx, policy, policy.status.as_ref(), &st, msg).await;
                }
            }
        }
    }
    // Profiles that left: stop their pod watches and drop their series.
    let live: std::collections::BTreeSet<String> = profiles
        .state()
        .iter()
        .filter_map(|p| p.0.as_ref().ok().and_then(|p| p.uid()))
        .collect();
    let gone: Vec<Written> = {
        let mut written = ctx.written.lock().expect("not poisoned");
        let uids: Vec<String> = written
            .keys()
            .filter(|u| !live.contains(*u))
            .cloned()
            .collect();
        uids.iter().filter_map(|u| written.remove(u)).collect()
    };
    for w in gone {
        ctx.metrics.forget_profile(&w.namespace, &w.name, &w.lanes);
        let mut r = kube::runtime::reflector::ObjectRef::<CapacityProfile>::new(&w.name);
        r.namespace = Some(w.namespace.clone());
        ctx.pods.forget(&r);
    }
}

/// Writes the status of an object whose profile does not exist, with a
/// `ProfileNotFound` event when it changes.
async fn report_orphan<K, S>(ctx: &Context, obj: &K, current: Option<&S>, status: &S, msg: String)
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
    S: serde::Serialize + PartialEq,
{
    match apply_status(ctx, obj, current, status).await {
        Ok(true) => publish(ctx, obj, EventType::Warning, "ProfileNotFound", msg).await,
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(error = %e, "failed to report an object whose profile does not exist")
        }
    }
}

/// A profile this leader reconciled (to drop its metrics when it goes).
#[derive(Clone, Debug)]
pub struct Written {
    /// Profile namespace.
    pub namespace: String,
    /// Profile name.
    pub name: String,
    /// Lane names with metric series.
    pub lanes: Vec<String>,
}
