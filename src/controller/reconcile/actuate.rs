//! Actuate: carry a decision out on the cluster (the gateway ConfigMap, the
//! pool size or the HPA's minimum, the bounded drain) and say what was done,
//! as typed [`Effects`]. Each write is skipped when nothing changed.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use super::super::context::{Context, FIELD_MANAGER};
use super::super::drain;
use super::super::error::Error;
use super::super::pods::selector_of;
use super::super::scale;
use super::observe::Observation;
use super::refusals::Refused;
use crate::api::{ObjectKey, ScalingMode};
use crate::controller::lanes_configmap;
use crate::policy::gateway_config;
use crate::policy::{Drain, DrainAction, ProfileDecision, Telemetry};

/// What actuation did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Effects {
    /// The gateway config in force: its ConfigMap and hash, and whether this
    /// step wrote it.
    pub config: ConfigEffect,
    /// The pool size or HPA minimum written, if any.
    pub scaled: Option<Scaled>,
    /// An HPA owns the replicas and the scaling mode is `Direct`, or an
    /// older profile sizes the workload.
    pub scaling_conflict: Option<ScalingConflict>,
    /// The drain as carried out (None without a drain spec or a synced pod
    /// index).
    pub drain: Option<Drain>,
    /// The writes the API server refused (the rest went ahead).
    pub refused: Vec<Refused>,
}

/// The gateway ConfigMap could not be written: nothing else is done, and
/// the engine's state stays where it was (the ConfigMap the gateways
/// enforce and the ladder's memory in `status.engine` move together).
#[derive(Debug)]
pub struct ConfigRefused {
    /// The refusal, for the profile's `Ready` condition.
    pub refused: Refused,
    /// The error, for the reconcile's backoff.
    pub error: Error,
}

/// The gateway config write.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigEffect {
    /// ConfigMap name.
    pub name: String,
    /// Content hash of the config in force.
    pub hash: String,
    /// Whether this step wrote it.
    pub written: bool,
}

/// A pool size write.
#[derive(Clone, Debug, PartialEq)]
pub enum Scaled {
    /// The HPA's `minReplicas` was raised (mode `HPAMinReplicas`).
    HpaMin {
        /// The HPA.
        hpa: String,
        /// The new minimum.
        to: i32,
    },
    /// The scale subresource was written (mode `Direct`).
    Replicas {
        /// Kind of the scale target.
        kind: String,
        /// Its name.
        name: String,
        /// Replicas before, if known.
        from: Option<i32>,
        /// Replicas now.
        to: i32,
    },
}

impl Scaled {
    /// The replica count written.
    pub fn to(&self) -> i32 {
        match self {
            Scaled::HpaMin { to, .. } | Scaled::Replicas { to, .. } => *to,
        }
    }
}

impl fmt::Display for Scaled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scaled::HpaMin { hpa, to } => {
                write!(
                    f,
                    "raised HorizontalPodAutoscaler {hpa} minReplicas to {to}"
                )
            }
            Scaled::Replicas {
                kind,
                name,
                from,
                to,
            } => write!(
                f,
                "scaled {kind} {name} from {} to {to} replicas",
                from.map_or_else(|| "unknown".to_owned(), |r| r.to_string())
            ),
        }
    }
}

/// Another writer owns the replicas of the workload lanekeeper would size.
#[derive(Clone, Debug, PartialEq)]
pub enum ScalingConflict {
    /// An HPA targets the workload and the scaling mode is `Direct`.
    Hpa {
        /// The HPA.
        hpa: String,
        /// Kind of the scale target.
        kind: String,
        /// Its name.
        name: String,
    },
    /// An older CapacityProfile names the same workload: it sizes (and
    /// drains) it, this one writes neither.
    Profile {
        /// The profile that acts on the workload.
        winner: String,
        /// Kind of the scale target.
        kind: String,
        /// Its name.
        name: String,
    },
}

impl ScalingConflict {
    /// The `ScalingConflict` condition's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            ScalingConflict::Hpa { .. } => "HPATargetsWorkload",
            ScalingConflict::Profile { .. } => "ProfileTargetsWorkload",
        }
    }
}

impl fmt::Display for ScalingConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScalingConflict::Hpa { hpa, kind, name } => write!(
                f,
                "HorizontalPodAutoscaler {hpa} targets {kind} {name}: lanekeeper leaves the replicas alone (set spec.scaling.mode to HPAMinReplicas to raise its minimum instead, or Disabled)"
            ),
            ScalingConflict::Profile { winner, kind, name } => write!(
                f,
                "CapacityProfile {winner} also targets {kind} {name} and is older: it sizes the workload and drains its pods, this profile writes neither (point spec.pool.scaleTargetRef at another workload, or delete one of the profiles)"
            ),
        }
    }
}

/// Carries the decision out: the gateway ConfigMap first (when it is
/// refused, nothing else), then the pool size and the drain, each of which
/// may be refused without stopping the other.
pub async fn actuate(
    ctx: &Context,
    obs: &Observation,
    decision: &ProfileDecision,
) -> Result<Effects, ConfigRefused> {
    let config = gateway_config(ctx, obs, decision).await?;
    let mut refused = Vec::new();
    let (scaled, scaling_conflict) = pool_size(ctx, obs, decision).await.unwrap_or_else(|r| {
        refused.push(r);
        (None, None)
    });
    let (drain, drain_refused) = bounded_drain(ctx, obs, decision).await;
    refused.extend(drain_refused);
    Ok(Effects {
        config,
        scaled,
        scaling_conflict,
        drain,
        refused,
    })
}

/// The gateway ConfigMap (written in observe mode too, under its own name).
async fn gateway_config(
    ctx: &Context,
    obs: &Observation,
    decision: &ProfileDecision,
) -> Result<ConfigEffect, ConfigRefused> {
    let profile = &obs.profile;
    let observe = obs.observe_only();
    let name = lanes_configmap::configmap_name(profile.name_str(), observe);
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), profile.namespace_str());
    // The ConfigMap as the watch cache has it (lanekeeper's ConfigMaps carry
    // its managed-by label, which the watch selects).
    let current = ctx.index.configmap(profile.namespace_str(), &name);
    let cached_rv = current.as_ref().and_then(|c| c.resource_version());
    let prev_cfg = current
        .as_deref()
        .and_then(|c| lanes_configmap::from_configmap(c).0);
    let binding = obs.binding();
    let cfg = gateway_config::build(
        decision,
        &binding.lanes,
        binding.policy,
        profile.metadata.generation.unwrap_or(0),
        prev_cfg.as_ref(),
        obs.now,
    );
    let object = format!("ConfigMap/{}/{name}", profile.namespace_str());
    let lag = &ctx.index.lag;
    // The data is compared, not only the hash annotation: an edit that kept
    // the annotation is put back.
    let in_place = current
        .as_deref()
        .is_some_and(|c| lanes_configmap::carries(c, &cfg));
    let mut written = !in_place && !lag.in_flight(&object, cached_rv.as_deref(), &cfg.content_hash);
    if written
        && lag.wrote_before(&object, &cfg.content_hash)
        && live_carries(&api, &name, &cfg).await
    {
        // Already on the server; the cache is behind it.
        lag.wrote(&object, cached_rv.as_deref(), &cfg.content_hash);
        written = false;
    }
    if written {
        let cm = lanes_configmap::configmap(profile, &cfg, observe);
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&cm),
        )
        .await
        .map_err(|e| {
            lag.failed(&object, &cfg.content_hash);
            ConfigRefused {
                refused: Refused {
                    write: format!("apply the gateway config to {object}"),
                    error: e.to_string(),
                },
                error: Error::kube("apply gateway configmap", e),
            }
        })?;
        ctx.index
            .lag
            .wrote(&object, cached_rv.as_deref(), &cfg.content_hash);
        ctx.metrics.write("ConfigMap", "apply");
        tracing::info!(profile = %profile.key(), configmap = %name, hash = %cfg.content_hash, "gateway config written");
    }
    Ok(ConfigEffect {
        name,
        hash: cfg.content_hash,
        written,
    })
}

/// Whether the ConfigMap as the server has it now (a quorum read) carries
/// `cfg` (false when it cannot be read).
async fn live_carries(api: &Api<ConfigMap>, name: &str, cfg: &lanes::GatewayConfig) -> bool {
    let live = api.get_opt(name).await.ok().flatten();
    live.is_some_and(|l| lanes_configmap::carries(&l, cfg))
}

/// The pool size: never when an older profile sizes the workload, never in
/// observe mode, never without an opinion, never against an HPA unless the
/// mode says to raise its minimum.
async fn pool_size(
    ctx: &Context,
    obs: &Observation,
    decision: &ProfileDecision,
) -> Result<(Option<Scaled>, Option<ScalingConflict>), Refused> {
    let profile = &obs.profile;
    let target_ref = &profile.spec.pool.scale_target_ref;
    if let Some(winner) = &obs.outranked_by {
        return Ok((
            None,
            Some(ScalingConflict::Profile {
                winner: winner.clone(),
                kind: target_ref.kind.clone(),
                name: target_ref.name.clone(),
            }),
        ));
    }
    let (Some(target), false) = (&obs.target, obs.observe_only()) else {
        return Ok((None, None));
    };
    let mode = profile.spec.scaling.mode;
    if mode == ScalingMode::Disabled {
        return Ok((None, None));
    }
    match (ctx.index.hpa(profile.namespace_str(), target_ref), mode) {
        (Some(h), ScalingMode::HpaMinReplicas) => {
            let want = (decision.desired_replicas, may_shrink(decision));
            let raised = hpa_min(ctx, obs, &h, want).await?;
            Ok((raised, None))
        }
        (Some(h), _) => Ok((
            None,
            Some(ScalingConflict::Hpa {
                hpa: h.name_any(),
                kind: target_ref.kind.clone(),
                name: target_ref.name.clone(),
            }),
        )),
        (None, _) => {
            let due = scale::write_due(
                decision.desired_replicas,
                target.replicas,
                may_shrink(decision),
            );
            let Some(n) = due else {
                return Ok((None, None));
            };
            Ok((replicas(ctx, obs, n).await?, None))
        }
    }
}

/// Whether the pool may be made smaller now: never while degraded or while
/// telemetry is unknown (rule 6; the engine holds the current size then,
/// and this keeps any write from undoing a person's scale-up).
fn may_shrink(decision: &ProfileDecision) -> bool {
    decision.level == 0 && decision.telemetry == Telemetry::Known
}

/// Raises (or lowers) the HPA's `minReplicas` to the desired replicas.
async fn hpa_min(
    ctx: &Context,
    obs: &Observation,
    h: &HorizontalPodAutoscaler,
    (desired, may_shrink): (Option<i32>, bool),
) -> Result<Option<Scaled>, Refused> {
    let current = h.spec.as_ref().and_then(|s| s.min_replicas);
    let Some(d) = scale::write_due(desired, current, may_shrink) else {
        return Ok(None);
    };
    let ns = obs.profile.namespace_str();
    let object = scale::hpa_key(ns, &h.name_any());
    let rv = h.resource_version();
    let lag = &ctx.index.lag;
    if lag.in_flight(&object, rv.as_deref(), &d.to_string()) {
        return Ok(None);
    }
    let write = scale::write_hpa_min(&ctx.client, ns, h, d, FIELD_MANAGER);
    let what = || format!("set {object} minReplicas to {d}");
    let wanted = d.to_string();
    if !ctx
        .refusals
        .attempt(&ctx.metrics, (&object, &wanted), what, write)
        .await?
    {
        return Ok(None);
    }
    lag.wrote(&object, rv.as_deref(), &wanted);
    ctx.metrics.write("HorizontalPodAutoscaler", "apply");
    Ok(Some(Scaled::HpaMin {
        hpa: h.name_any(),
        to: d,
    }))
}

/// Sets the scale target's replicas to `n` through its scale subresource.
async fn replicas(ctx: &Context, obs: &Observation, n: i32) -> Result<Option<Scaled>, Refused> {
    let ns = obs.profile.namespace_str();
    let target_ref = &obs.profile.spec.pool.scale_target_ref;
    let target = obs.target.as_ref();
    let object = scale::target_key(ns, target_ref);
    let rv = target
        .and_then(|t| t.workload.as_ref())
        .and_then(|w| w.resource_version());
    let wanted = n.to_string();
    if ctx.index.lag.in_flight(&object, rv.as_deref(), &wanted) {
        return Ok(None);
    }
    let write = scale::write(&ctx.client, &ctx.resolver, ns, target_ref, n, FIELD_MANAGER);
    let what = || {
        format!(
            "scale {} {} to {n} replicas",
            target_ref.kind, target_ref.name
        )
    };
    ctx.refusals
        .attempt(&ctx.metrics, (&object, &wanted), what, write)
        .await?;
    ctx.index.lag.wrote(&object, rv.as_deref(), &wanted);
    ctx.metrics.write("Scale", "apply");
    Ok(Some(Scaled::Replicas {
        kind: target_ref.kind.clone(),
        name: target_ref.name.clone(),
        from: target.and_then(|t| t.replicas),
        to: n,
    }))
}

/// The bounded drain (with a synced pod index; without a drain spec, the
/// release of what is drained and the readiness gates), and the write the
/// API server refused, if one was (the drain's writes back off together:
/// one pool, written one pod at a time).
async fn bounded_drain(
    ctx: &Context,
    obs: &Observation,
    decision: &ProfileDecision,
) -> (Option<Drain>, Option<Refused>) {
    let profile = &obs.profile;
    let Some(cached) = &obs.pods else {
        return (None, None);
    };
    let spec = profile.spec.drain.as_ref();
    // The drain reads pods listed afresh and cached ones alike, as `Pod`s.
    let cached: Vec<Arc<Pod>> = cached.iter().map(|p| Arc::new(p.to_pod())).collect();
    let object = format!("Pod/{}/{}", profile.namespace_str(), profile.name_str());
    // What the step would write: its drains and undrains (the readiness
    // gates follow from them and the pods).
    let wanted: Vec<String> = decision
        .drain
        .actions
        .iter()
        .filter(|a| matches!(a.action, DrainAction::Drain | DrainAction::Undrain))
        .map(|a| format!("{:?} {}", a.action, a.pod))
        .collect();
    let wanted = wanted.join(", ");
    if let Some(r) = ctx.refusals.held(&object, &wanted) {
        return (
            Some(drain::unwritten(spec, &decision.drain, &cached)),
            Some(r),
        );
    }
    let selector = match selector_of(profile) {
        Ok(s) => s,
        Err(e) => {
            let write = "select the pool's pods".to_owned();
            let refused = ctx.refusals.note(
                &ctx.metrics,
                (&object, &wanted),
                write,
                &Error::Invalid(e.to_string()),
            );
            return (None, Some(refused));
        }
    };
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), profile.namespace_str());
    let metrics = &ctx.metrics;
    let (done, refused) = drain::actuate(
        &api,
        &selector,
        spec,
        &decision.drain,
        &cached,
        obs.drain_acting(),
        obs.now,
        |kind| metrics.write(kind, "patch"),
    )
    .await;
    let refused = match refused {
        None => {
            ctx.refusals.applied(&object);
            None
        }
        Some((write, e)) => Some(ctx.refusals.note(metrics, (&object, &wanted), write, &e)),
    };
    (Some(done), refused)
}
