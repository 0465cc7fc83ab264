//! What every reconcile shares: settings, the API client, the indexes, the
//! signal sources, the write cache and the metrics.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::core::DeserializeGuard;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;

use super::index::Index;
use super::pods::PodIndex;
use super::reconcile::refusals::Refusals;
use super::reconcile::writes::Writes;
use super::scale::Resolver;
use crate::api::{CapacityProfile, DegradationPolicy, LaneContract};
use crate::metrics::Metrics;
use crate::signals::SignalSource;

pub use crate::api::{APPROVE_ANNOTATION, FIELD_MANAGER};

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Namespaces to watch (empty: all).
    pub namespaces: Vec<String>,
    /// Periodic evaluation interval (lets time-based hysteresis advance).
    pub resync: Duration,
    /// Whether to take a leader lease before acting.
    pub leader_election: bool,
    /// Lease name.
    pub lease_name: String,
    /// Namespace of the lease (the controller's own).
    pub lease_namespace: String,
    /// Lease duration in seconds (a standby takes over within it).
    pub lease_duration_seconds: u64,
    /// This instance's identity in the lease.
    pub identity: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            namespaces: Vec::new(),
            resync: Duration::from_secs(15),
            leader_election: true,
            lease_name: "lanekeeper".into(),
            lease_namespace: "lanekeeper-system".into(),
            lease_duration_seconds: 15,
            identity: "lanekeeper".into(),
        }
    }
}

/// Shared state of the running controller.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Settings.
    pub settings: Settings,
    /// Metrics.
    pub metrics: Metrics,
    /// Event recorder.
    pub recorder: Recorder,
    /// Signal sources, applied in order.
    pub sources: Vec<Arc<dyn SignalSource>>,
    /// The profiles (the controller's own store).
    pub profiles: Store<DeserializeGuard<CapacityProfile>>,
    /// The profiles as the watch that triggers a profile's peers on its
    /// workload has them (`workload_peers`): which profile acts on a shared
    /// workload is read here, so a peer triggered by a change sees it (the
    /// controller's own store may not have it yet).
    pub peer_profiles: Store<DeserializeGuard<CapacityProfile>>,
    /// Lane index.
    pub lanes: Store<DeserializeGuard<LaneContract>>,
    /// Policy index.
    pub policies: Store<DeserializeGuard<DegradationPolicy>>,
    /// Pod index.
    pub pods: PodIndex,
    /// The other watch caches: ConfigMaps, HPAs, scale targets.
    pub index: Index,
    /// Scale target resolution cache.
    pub resolver: Resolver,
    /// Status and annotation writes, with what they returned (bridges the
    /// watch lag after our own writes).
    pub writes: Writes,
    /// What the sweep needs to remember between passes.
    pub seen: SweepMemory,
    /// Per profile: failed reconciles in a row, and when the next may run
    /// (the backoff holds against the resync ticker and the triggers too).
    pub failures: Mutex<HashMap<String, (u32, std::time::Instant)>>,
    /// Writes the API server refused, each backing off on its own.
    pub refusals: Refusals,
}

/// A profile this leader reconciled (to drop its metrics when it goes).
#[derive(Clone, Debug)]
pub struct Reconciled {
    /// Profile namespace.
    pub namespace: String,
    /// Profile name.
    pub name: String,
    /// Lane names with metric series.
    pub lanes: Vec<String>,
}

/// What the controller remembers between passes about objects it does not
/// own: the profiles it reconciled (uid → names, for clean-up when they go)
/// and the invalid objects it already reported (uid → generation).
#[derive(Default)]
pub struct SweepMemory {
    /// Profiles reconciled, per uid.
    pub reconciled: Mutex<HashMap<String, Reconciled>>,
    /// Invalid objects already reported (uid → generation).
    pub reported_invalid: Mutex<HashMap<String, String>>,
    /// The LaneFreeze spec this leader last wrote, per profile key.
    pub freeze_params: Mutex<HashMap<String, crate::api::LaneFreezeSpec>>,
}

/// Readiness flags served on /readyz.
#[derive(Clone, Default)]
pub struct Readiness {
    ready: Arc<AtomicBool>,
}

impl Readiness {
    /// Marks ready or not.
    pub fn set(&self, v: bool) {
        self.ready.store(v, Ordering::Release);
    }
    /// Whether ready.
    pub fn get(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// Whether the lane and policy stores have synced (without waiting: kube's
/// `Store::wait_until_ready` wakes only the last of several waiting tasks, so
/// callers poll this instead).
pub(crate) fn stores_ready(
    lanes: &Store<DeserializeGuard<LaneContract>>,
    policies: &Store<DeserializeGuard<DegradationPolicy>>,
) -> bool {
    use futures::FutureExt;
    lanes.wait_until_ready().now_or_never().is_some()
        && policies.wait_until_ready().now_or_never().is_some()
}
