//! One reconcile of one CapacityProfile, in the stages the design names:
//!
//! 1. [`observe`]: the profile, what binds to it, its pods, its scale target
//!    and the signals, read once into an `Observation`;
//! 2. decide: the pure engine (`policy::evaluate_profile`), the same call
//!    `plan` and `simulate` make;
//! 3. [`actuate`]: the gateway ConfigMap, the pool size, the bounded drain,
//!    returning typed `Effects`;
//! 4. [`report`]: statuses, approval consumption, metrics;
//! 5. [`events`]: a pure function from what changed to the events, then
//!    published.
//!
//! [`pool`] reads what the pool's workload says beyond its size (its pod
//! template's hash, its rollout) for observe. [`writes`] keeps what our writes returned (the watch lags behind them);
//! [`refusals`] the writes the API server refused, each backing off;
//! [`sweep`] covers what no profile's reconcile sees; [`shared_target`]
//! picks the one profile that acts on a workload several profiles name.

pub mod actuate;
pub mod events;
pub mod freeze;
pub mod observe;
pub mod pool;
pub mod refusals;
pub mod report;
pub mod shared_target;
pub mod sweep;
pub mod writes;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;

use super::context::{Context, stores_ready};
use super::error::Error;
use crate::api::{CapacityProfile, ObjectKey};
use crate::policy;
use events::Target;

/// Reconciles one profile (the entry point the kube runtime calls).
pub async fn reconcile(
    obj: Arc<DeserializeGuard<CapacityProfile>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let started = Instant::now();
    let profile = match &obj.0 {
        Ok(p) => p,
        Err(invalid) => {
            sweep::report_invalid(&ctx, "CapacityProfile", invalid).await;
            return Ok(Action::await_change());
        }
    };
    // Never decide on a partial index: lanes and policies must have synced.
    // kube's `Store::wait_until_ready` wakes only the task that polled it
    // last, so when many profiles reconcile at start-up, awaiting it left all
    // but one asleep until the timeout (30 s); poll the readiness instead.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(stores_ready(&ctx.lanes, &ctx.policies) && ctx.index.synced()) {
        if Instant::now() >= deadline {
            return Err(Error::IndexNotSynced);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Some(wait) = backoff_left(&ctx, &profile.key()) {
        return Ok(Action::requeue(wait));
    }
    let result = reconcile_profile(profile, &ctx).await;
    ctx.metrics
        .reconcile_duration
        .with_label_values(&[profile.namespace_str(), profile.name_str()])
        .observe(started.elapsed().as_secs_f64());
    if result.is_ok() {
        ctx.failures
            .lock()
            .expect("not poisoned")
            .remove(&profile.key());
    }
    result
}

/// Observe → decide → actuate → report → events; when a watch of the pool
/// is still on its first list, nothing (its first list triggers the next
/// reconcile, and the grace's end one at the latest). A refused write
/// stops nothing after it but the gateway ConfigMap's: the ConfigMap the
/// gateways enforce and the engine's state move together. Events are
/// published for what was done, also when a later write fails.
async fn reconcile_profile(profile: &CapacityProfile, ctx: &Context) -> Result<Action, Error> {
    let obs = match observe::observe(ctx, profile).await? {
        observe::Observed::Ready(obs) => obs,
        observe::Observed::FirstSync(left) => return Ok(Action::requeue(left)),
    };
    let (decision, next) =
        policy::evaluate_profile(&obs.binding(), &obs.snapshot, obs.approved, &obs.prev);
    let mut effects = match actuate::actuate(ctx, &obs, &decision).await {
        Ok(effects) => effects,
        Err(refused) => {
            let reported = report::config_refused(ctx, &obs, &refused.refused).await?;
            let notes = events::events(&reported, &decision, &Default::default(), &obs.unknown);
            publish(ctx, &obs, notes).await;
            return Err(refused.error);
        }
    };
    let frozen = freeze::actuate(ctx, &obs, &decision, &mut effects.refused).await;
    report::count_drain(ctx, &obs, &effects);
    publish(ctx, &obs, events::effect_events(&effects)).await;
    let (reported, result) = report::report(ctx, &obs, &decision, &next, &effects, frozen).await;
    let mut notes = events::events(&reported, &decision, &effects, &obs.unknown);
    if reported.committed {
        notes.extend(freeze::events(
            &reported.profile_before,
            &reported.profile_after,
        ));
    }
    publish(ctx, &obs, notes).await;
    result.map(|()| Action::requeue(ctx.settings.resync))
}

/// Publishes each note on its object.
async fn publish(ctx: &Context, obs: &observe::Observation, notes: Vec<events::Note>) {
    for n in notes {
        match n.target {
            Target::Profile => events::publish(ctx, &obs.profile, &n).await,
            Target::Policy => events::publish(ctx, &obs.policies[0], &n).await,
            Target::Ignored(i) => events::publish(ctx, &obs.policies[i + 1], &n).await,
            Target::Lane(i) => events::publish(ctx, obs.binding().lanes[i], &n).await,
        }
    }
}

/// How long the profile's backoff after failed reconciles still holds.
fn backoff_left(ctx: &Context, key: &str) -> Option<Duration> {
    let failures = ctx.failures.lock().expect("not poisoned");
    let (_, retry_at) = failures.get(key)?;
    retry_at
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Backoff per object: 1 s doubling up to 5 minutes. It holds against the
/// resync ticker and the triggers too ([`reconcile`] waits it out), so a
/// reconcile that keeps failing is not retried on every tick.
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
        Ok(p) => p.key(),
        Err(i) => format!(
            "{}/{}",
            i.metadata.namespace.as_deref().unwrap_or_default(),
            i.metadata.name.as_deref().unwrap_or_default()
        ),
    };
    let mut failures = ctx.failures.lock().expect("not poisoned");
    let (n, retry_at) = failures.entry(key.clone()).or_insert((0, Instant::now()));
    *n = n.saturating_add(1);
    let delay = Duration::from_secs(1u64 << (*n - 1).min(8)).min(Duration::from_secs(300));
    *retry_at = Instant::now() + delay;
    tracing::warn!(profile = %key, error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
