//! Signal sources: where the live snapshot comes from.
//!
//! Every source fills part of the same [`Snapshot`](crate::snapshot::Snapshot)
//! type that `plan --signals` reads, so the live path and the offline path
//! feed the engine identically. Sources are behind the [`SignalSource`] trait;
//! the controller composes them (later sources override what earlier ones
//! left unknown or measured less directly).

use std::collections::BTreeMap;

use futures::channel::mpsc::UnboundedSender;
use futures::future::BoxFuture;
use kube::runtime::reflector::ObjectRef;

use crate::api::{CapacityProfile, LaneContract};
use crate::snapshot::{BurnWindow, LaneSignals, PodSignals, ProfileSignals};

pub mod goodput_rule;
pub mod prometheus;
pub mod rules;
pub mod scrape;
pub mod scrape_source;
pub mod token_rules;

/// A pool pod as the controller keeps it (stripped of everything else).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolPod {
    /// Pod name.
    pub name: String,
    /// The pod's own readiness: its `ContainersReady` condition (lanekeeper's
    /// readiness gate is deliberately ignored).
    pub containers_ready: bool,
    /// Pod IP, when assigned.
    pub ip: Option<String>,
    /// Whether the pod carries lanekeeper's drain label.
    pub drained: bool,
    /// Whether someone asked for a drain (`lanekeeper.dev/drain-request`).
    pub drain_requested: bool,
    /// Whether the pod is being deleted.
    pub terminating: bool,
}

impl PoolPod {
    /// The pod's signals as the cluster shows them (readiness by
    /// [`PodSignals::is_ready`], the one definition).
    pub fn signals(&self) -> PodSignals {
        PodSignals::from_cluster(
            self.containers_ready,
            self.terminating,
            self.drain_requested,
        )
    }
}

/// What a source gets to look at.
pub struct SourceInput<'a> {
    /// The profile.
    pub profile: &'a CapacityProfile,
    /// Its lanes.
    pub lanes: &'a [&'a LaneContract],
    /// Ready replicas reported by the scale target's status, where the kind
    /// has one.
    pub target_ready_replicas: Option<u32>,
    /// The pool's pods, when the pod index has synced (None before).
    pub pods: Option<&'a [PoolPod]>,
    /// Now, in Unix seconds.
    pub now: i64,
}

/// What a source found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceOutput {
    /// Pool signals.
    pub profile: ProfileSignals,
    /// Lane signals keyed `namespace/name`.
    pub lanes: BTreeMap<String, LaneSignals>,
    /// Signals that are unknown, with the reason (for status and events).
    pub unknown: BTreeMap<String, String>,
}

/// Where a source that polls on its own says that a profile's signals
/// changed: the profile to reconcile.
pub type Trigger = UnboundedSender<ObjectRef<CapacityProfile>>;

/// The triggers of the controllers a source that polls on its own is
/// attached to, one per scope.
#[derive(Default)]
pub struct Triggers(std::sync::Mutex<Vec<(Option<String>, Trigger)>>);

impl Triggers {
    /// The controller for `scope` starts (replacing one for the same
    /// scope).
    pub fn attach(&self, scope: &Option<String>, trigger: Trigger) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        t.retain(|(s, _)| s != scope);
        t.push((scope.clone(), trigger));
    }

    /// The controller for `scope` stopped.
    pub fn detach(&self, scope: &Option<String>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(s, _)| s != scope);
    }

    /// Sends profile `namespace/name` to the controller of its scope.
    pub fn send(&self, namespace: &str, name: &str) {
        let t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, t)) = t
            .iter()
            .find(|(scope, _)| scope.as_deref().is_none_or(|s| s == namespace))
        {
            let _ = t.unbounded_send(ObjectRef::new(name).within(namespace));
        }
    }
}

/// A source of live signals.
pub trait SignalSource: Send + Sync {
    /// Collects signals for one profile.
    fn collect<'a>(&'a self, input: &'a SourceInput<'a>) -> BoxFuture<'a, SourceOutput>;

    /// A controller for `scope` (a namespace, or all of them) starts: a
    /// source that polls on its own sends the profiles of that scope whose
    /// signals changed to `trigger`.
    fn attach(&self, _scope: &Option<String>, _trigger: Trigger) {}

    /// The controller for `scope` stopped (lease lost, shutdown): stop
    /// polling for it.
    fn detach(&self, _scope: &Option<String>) {}

    /// The profile is gone: forget it.
    fn forget(&self, _namespace: &str, _name: &str) {}
}

/// Signals the cluster itself gives: ready replicas from the scale target,
/// per-pod readiness from the pool's pods. Lane demand is left to the lanes'
/// `expectedRequestsPerSecond`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClusterSource;

impl ClusterSource {
    /// The synchronous core of [`SignalSource::collect`].
    pub fn observe(input: &SourceInput<'_>) -> SourceOutput {
        let mut out = SourceOutput::default();
        out.profile.ready_replicas = input.target_ready_replicas;
        match input.pods {
            Some(pods) => {
                for p in pods.iter().filter(|p| !p.terminating) {
                    out.profile.pods.insert(p.name.clone(), p.signals());
                }
            }
            None => {
                out.unknown
                    .insert("pods".into(), "the pod index has not synced yet".into());
            }
        }
        if input.target_ready_replicas.is_none()
            && input
                .pods
                .is_none_or(|p| p.iter().all(|p| !p.signals().is_ready()))
        {
            out.unknown.insert(
                "capacity".into(),
                "no availableUnitsPerSecond, no readyReplicas on the scale target and no ready pods".into(),
            );
        }
        out
    }
}

impl SignalSource for ClusterSource {
    fn collect<'a>(&'a self, input: &'a SourceInput<'a>) -> BoxFuture<'a, SourceOutput> {
        Box::pin(async move { Self::observe(input) })
    }
}

/// Merges `overlay` into `base`: every value the overlay knows replaces the
/// base's; unknown reasons are kept only for signals still unknown.
pub fn merge(base: &mut SourceOutput, overlay: SourceOutput) {
    let b = &mut base.profile;
    let o = overlay.profile;
    b.available_units_per_second = o
        .available_units_per_second
        .or(b.available_units_per_second);
    b.gateway_goodput_while_saturated = o
        .gateway_goodput_while_saturated
        .or(b.gateway_goodput_while_saturated);
    b.ready_replicas = o.ready_replicas.or(b.ready_replicas);
    b.in_flight = o.in_flight.or(b.in_flight);
    b.queue_depth = o.queue_depth.or(b.queue_depth);
    b.p95_latency_seconds = o.p95_latency_seconds.or(b.p95_latency_seconds);
    b.error_ratio = o.error_ratio.or(b.error_ratio);
    b.kv_cache_usage_percent = o.kv_cache_usage_percent.or(b.kv_cache_usage_percent);
    for (name, pod) in o.pods {
        let e = b.pods.entry(name).or_default();
        e.ready = pod.ready.or(e.ready);
        e.error_ratio = pod.error_ratio.or(e.error_ratio);
        e.drain_requested = pod.drain_requested.or(e.drain_requested);
    }
    for (k, l) in overlay.lanes {
        let e = base.lanes.entry(k).or_default();
        e.requests_per_second = l.requests_per_second.or(e.requests_per_second);
        e.retry_requests_per_second = l.retry_requests_per_second.or(e.retry_requests_per_second);
        e.error_budget_remaining_percent = l
            .error_budget_remaining_percent
            .or(e.error_budget_remaining_percent);
        e.p95_input_tokens = l.p95_input_tokens.or(e.p95_input_tokens);
        e.p95_output_tokens = l.p95_output_tokens.or(e.p95_output_tokens);
        e.p95_cost_units_per_request = l
            .p95_cost_units_per_request
            .or(e.p95_cost_units_per_request);
        for w in BurnWindow::ALL {
            let v = l.burn_rate.get(w).or(e.burn_rate.get(w));
            e.burn_rate.set(w, v);
        }
        e.unknown.extend(l.unknown);
    }
    base.unknown.extend(overlay.unknown);
    if base.profile.available_units_per_second.is_some() || base.profile.ready_replicas.is_some() {
        base.unknown.remove("capacity");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::BurnRates;

    #[test]
    fn merging_keeps_each_lanes_budget_and_burn_rates() {
        let lane = |remaining: Option<f64>, m5: Option<f64>, h1: Option<f64>| LaneSignals {
            error_budget_remaining_percent: remaining,
            burn_rate: BurnRates {
                m5,
                h1,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut base = SourceOutput::default();
        base.lanes
            .insert("ns/p0".into(), lane(Some(40.0), Some(2.0), Some(3.0)));
        let mut overlay = SourceOutput::default();
        overlay
            .lanes
            .insert("ns/p0".into(), lane(None, Some(9.0), None));
        merge(&mut base, overlay);
        let l = &base.lanes["ns/p0"];
        assert_eq!(l.error_budget_remaining_percent, Some(40.0), "kept");
        assert_eq!(l.burn_rate.m5, Some(9.0), "the overlay's value wins");
        assert_eq!(l.burn_rate.h1, Some(3.0), "kept");
    }
}
