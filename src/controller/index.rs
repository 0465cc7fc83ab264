//! The watch caches behind every read a reconcile makes besides the
//! lanekeeper objects: the owned ConfigMaps and LaneFreezes, the HPAs, and per profile its
//! scale target and (for a Deployment) its ReplicaSets' metadata. The pods
//! are in [`super::pods::PodIndex`], built on the same [`Watch`].
//!
//! A reconcile reads these caches and makes no API call when nothing
//! changed; every change of a watched object triggers the reconcile of the
//! profile it belongs to at once, instead of waiting for the resync tick.
//!
//! Our own writes reach the caches later than their responses; the
//! [`Lag`] guard keeps a reconcile that runs in between from writing the
//! same thing twice.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, PartialObjectMeta};
use kube::core::{ApiResource, Selector};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use super::error::Error;
use super::pods::selector_of;
use super::scale::{Resolver, TargetState};
use crate::api::{CapacityProfile, LaneFreeze, ScaleTargetRef};

pub use super::watch::{Trigger, Watch};

/// Keeps only what the controller reads of a workload: everything but the
/// managed fields (its pod template goes into the calibration hash, its
/// status into the rollout rule).
fn strip_workload(o: &mut DynamicObject) {
    o.metadata.managed_fields = None;
}

/// Keeps only what the revision rule reads of a ReplicaSet: name, uid,
/// labels, the revision annotation and the owner references.
fn strip_replicaset(o: &mut PartialObjectMeta<ReplicaSet>) {
    o.metadata.managed_fields = None;
    if let Some(a) = o.metadata.annotations.as_mut() {
        a.retain(|k, _| k == super::reconcile::pool::REVISION_ANNOTATION);
    }
}

/// The watches of one profile's scale target.
struct TargetEntry {
    /// What they were started for (restarted when it changes).
    key: String,
    /// The workload, by name.
    workload: Watch<DynamicObject>,
    /// A Deployment's ReplicaSets (metadata only), selected by the pool's
    /// pod selector (a ReplicaSet carries its pod template's labels).
    replicasets: Option<Watch<PartialObjectMeta<ReplicaSet>>>,
    /// The scale subresource as last read, by the workload's resource
    /// version (kinds whose replicas are not at `spec.replicas`).
    scale: Option<(String, Option<i32>)>,
}

/// Whether the kind keeps its replicas at `spec.replicas` (the scale
/// subresource's `specReplicasPath`), so the scale subresource need not be
/// read.
fn replicas_in_spec(r: &ScaleTargetRef) -> bool {
    let group = r.api_version.split_once('/').map_or("", |(g, _)| g);
    matches!(
        (group, r.kind.as_str()),
        ("apps", "Deployment" | "StatefulSet" | "ReplicaSet")
    )
}

/// What was read of the scale target from the caches.
pub struct TargetView {
    /// The target, when it exists.
    pub state: TargetState,
    /// A Deployment's ReplicaSets (None: not a Deployment, or not synced).
    pub replicasets: Option<Vec<Arc<PartialObjectMeta<ReplicaSet>>>>,
}

/// A write whose response came back before the watch delivered it: what was
/// written, on top of which resource version.
#[derive(Clone, Debug, PartialEq)]
struct Pending {
    written: String,
    on_top_of: Option<String>,
    /// The write failed: it may or may not be on the server.
    failed: bool,
}

/// The guard against writing twice what the watch has not delivered yet:
/// per object, what this leader wrote and on top of which resource version.
/// While the cache still shows that version, the write counts as done.
#[derive(Default)]
pub struct Lag {
    pending: Mutex<HashMap<String, Pending>>,
}

impl Lag {
    /// Whether `want` was written on top of `cached_rv` and the cache has not
    /// caught up yet (so writing it again would change nothing).
    pub fn in_flight(&self, object: &str, cached_rv: Option<&str>, want: &str) -> bool {
        let pending = self.pending.lock().expect("not poisoned");
        pending
            .get(object)
            .is_some_and(|p| !p.failed && p.written == want && p.on_top_of.as_deref() == cached_rv)
    }

    /// Whether this leader has written (or tried to write) `want` before:
    /// then a cache that shows another version (a relist from a stale cache,
    /// a response lost in a restart) may still be behind the server, and the
    /// server is asked before writing `want` again.
    pub fn wrote_before(&self, object: &str, want: &str) -> bool {
        let pending = self.pending.lock().expect("not poisoned");
        pending.get(object).is_some_and(|p| p.written == want)
    }

    /// What this leader wrote on top of `cached_rv`, while the cache has
    /// not caught up (the value the server has now).
    pub fn written_on(&self, object: &str, cached_rv: Option<&str>) -> Option<String> {
        let pending = self.pending.lock().expect("not poisoned");
        pending
            .get(object)
            .filter(|p| !p.failed && p.on_top_of.as_deref() == cached_rv)
            .map(|p| p.written.clone())
    }

    /// Records a write of `want` that failed: the server may have taken it
    /// all the same (a restart between the write and its answer).
    pub fn failed(&self, object: &str, want: &str) {
        self.pending.lock().expect("not poisoned").insert(
            object.to_owned(),
            Pending {
                written: want.to_owned(),
                on_top_of: None,
                failed: true,
            },
        );
    }

    /// Records a write of `written` on top of `cached_rv`.
    pub fn wrote(&self, object: &str, cached_rv: Option<&str>, written: &str) {
        self.pending.lock().expect("not poisoned").insert(
            object.to_owned(),
            Pending {
                written: written.to_owned(),
                on_top_of: cached_rv.map(str::to_owned),
                failed: false,
            },
        );
    }
}

/// The caches.
pub struct Index {
    client: Client,
    trigger: Trigger,
    /// lanekeeper's ConfigMaps (label `app.kubernetes.io/managed-by`).
    configmaps: Store<ConfigMap>,
    /// The freeze parameters (one LaneFreeze per profile).
    freezes: Store<LaneFreeze>,
    /// The HPAs of the watched namespaces.
    hpas: Store<HorizontalPodAutoscaler>,
    targets: Mutex<HashMap<ObjectRef<CapacityProfile>, TargetEntry>>,
    /// Writes not yet seen by the caches.
    pub lag: Lag,
}

impl Index {
    /// An index over the given stores; per-profile watches start on first
    /// use.
    pub fn new(
        client: Client,
        trigger: Trigger,
        configmaps: Store<ConfigMap>,
        freezes: Store<LaneFreeze>,
        hpas: Store<HorizontalPodAutoscaler>,
    ) -> Self {
        Self {
            client,
            trigger,
            configmaps,
            freezes,
            hpas,
            targets: Mutex::new(HashMap::new()),
            lag: Lag::default(),
        }
    }

    /// Whether the shared stores have their first list.
    pub fn synced(&self) -> bool {
        use futures::FutureExt;
        self.configmaps.wait_until_ready().now_or_never().is_some()
            && self.freezes.wait_until_ready().now_or_never().is_some()
            && self.hpas.wait_until_ready().now_or_never().is_some()
    }

    /// A ConfigMap from the cache.
    pub fn configmap(&self, ns: &str, name: &str) -> Option<Arc<ConfigMap>> {
        self.configmaps.get(&ObjectRef::new(name).within(ns))
    }

    /// A LaneFreeze from the cache.
    pub fn lane_freeze(&self, ns: &str, name: &str) -> Option<Arc<LaneFreeze>> {
        self.freezes.get(&ObjectRef::new(name).within(ns))
    }

    /// The HPA that targets the workload, if any.
    pub fn hpa(&self, ns: &str, r: &ScaleTargetRef) -> Option<Arc<HorizontalPodAutoscaler>> {
        let group = |v: &str| v.split_once('/').map_or("", |(g, _)| g).to_owned();
        self.hpas.state().into_iter().find(|h| {
            h.namespace().as_deref() == Some(ns)
                && h.spec.as_ref().is_some_and(|s| {
                    let t = &s.scale_target_ref;
                    t.kind == r.kind
                        && t.name == r.name
                        && t.api_version.as_deref().map(group) == Some(group(&r.api_version))
                })
        })
    }

    /// The scale target from its watch (started on first use, restarted
    /// when the reference or the pool's selector changes). `Ok(None)` until
    /// the watch has synced; an error when the kind can't be resolved or the
    /// object does not exist.
    pub async fn target(
        &self,
        resolver: &Resolver,
        profile: &CapacityProfile,
    ) -> Result<Option<TargetView>, Error> {
        let r = &profile.spec.pool.scale_target_ref;
        let ns = profile.namespace().unwrap_or_default();
        let (ar, _) = resolver.resolve(&self.client, r).await?;
        // No ReplicaSet watch without a usable pod selector (the pod index
        // reports why): the revision is then unknown.
        let pods = selector_of(profile)
            .ok()
            .filter(|s| !s.to_string().is_empty());
        let deployment = super::reconcile::pool::WorkloadKind::of(r)
            == super::reconcile::pool::WorkloadKind::Deployment;
        let key = format!(
            "{}|{}|{}|{}",
            r.api_version,
            r.kind,
            r.name,
            pods.as_ref().map(|s| s.to_string()).unwrap_or_default()
        );
        let pref = ObjectRef::from_obj(profile);
        let (obj, replicasets, scale_cached) = {
            let mut targets = self.targets.lock().expect("not poisoned");
            if targets.get(&pref).is_some_and(|e| e.key != key) {
                targets.remove(&pref);
            }
            let entry = targets.entry(pref.clone()).or_insert_with(|| {
                self.start_target(
                    &ns,
                    &ar,
                    r,
                    deployment.then_some(pods).flatten(),
                    &pref,
                    key,
                )
            });
            let Some(objs) = entry.workload.state() else {
                return Ok(None);
            };
            let replicasets = entry.replicasets.as_ref().and_then(Watch::state);
            if entry.replicasets.is_some() && replicasets.is_none() {
                return Ok(None);
            }
            (objs.into_iter().next(), replicasets, entry.scale.clone())
        };
        let Some(obj) = obj else {
            return Err(Error::ScaleTarget(format!(
                "{} {}/{ns}/{} not found",
                r.api_version, r.kind, r.name
            )));
        };
        let ready_replicas = obj
            .data
            .pointer("/status/readyReplicas")
            .and_then(|v| v.as_u64())
            .map(|v| v.min(u64::from(u32::MAX)) as u32)
            .or_else(|| obj.data.pointer("/status/replicas").map(|_| 0));
        let rv = obj.resource_version().unwrap_or_default();
        let replicas = if replicas_in_spec(r) {
            // Absent means the default, 1.
            Some(
                obj.data
                    .pointer("/spec/replicas")
                    .and_then(|v| v.as_i64())
                    .map_or(1, |v| v as i32),
            )
        } else if let Some((seen, replicas)) = scale_cached.filter(|(seen, _)| *seen == rv) {
            let _ = seen;
            replicas
        } else {
            // Another kind: its scale subresource, read again only when the
            // object changed.
            let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &ns, &ar);
            let raw = api
                .get_subresource("scale", &r.name)
                .await
                .map_err(|e| Error::kube("get scale", e))?;
            let scale: Scale = serde_json::to_value(&raw)
                .and_then(serde_json::from_value)
                .map_err(|e| {
                    Error::ScaleTarget(format!(
                        "the scale subresource of {} {} is not a Scale: {e}",
                        r.kind, r.name
                    ))
                })?;
            let replicas = scale.spec.and_then(|s| s.replicas);
            if let Some(e) = self.targets.lock().expect("not poisoned").get_mut(&pref) {
                e.scale = Some((rv, replicas));
            }
            replicas
        };
        Ok(Some(TargetView {
            state: TargetState {
                replicas,
                ready_replicas,
                workload: Some((*obj).clone()),
            },
            replicasets,
        }))
    }

    fn start_target(
        &self,
        ns: &str,
        ar: &ApiResource,
        r: &ScaleTargetRef,
        replicaset_selector: Option<Selector>,
        pref: &ObjectRef<CapacityProfile>,
        key: String,
    ) -> TargetEntry {
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, ar);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", r.name));
        let workload = Watch::start(
            watcher(api, config).modify(strip_workload),
            ar.clone(),
            "scale target",
            self.trigger.clone(),
            pref.clone(),
        );
        let replicasets = replicaset_selector.map(|sel| {
            let api: Api<PartialObjectMeta<ReplicaSet>> = Api::namespaced(self.client.clone(), ns);
            Watch::start(
                watcher(api, watcher::Config::default().labels_from(&sel)).modify(strip_replicaset),
                (),
                "replicasets",
                self.trigger.clone(),
                pref.clone(),
            )
        });
        TargetEntry {
            key,
            workload,
            replicasets,
            scale: None,
        }
    }

    /// While the scale target's watches (the workload, a Deployment's
    /// ReplicaSets) are on their first list, within the grace: how long
    /// is left (see [`Watch::first_sync_left`]).
    pub fn first_sync_left(&self, profile: &CapacityProfile) -> Option<Duration> {
        let targets = self.targets.lock().expect("not poisoned");
        let e = targets.get(&ObjectRef::from_obj(profile))?;
        let workload = e.workload.first_sync_left();
        let replicasets = e.replicasets.as_ref().and_then(Watch::first_sync_left);
        workload.max(replicasets)
    }

    /// Stops the watches of a deleted profile.
    pub fn forget(&self, key: &ObjectRef<CapacityProfile>) {
        self.targets.lock().expect("not poisoned").remove(key);
    }

    /// Stops every per-profile watch.
    pub fn shutdown(&self) {
        self.targets.lock().expect("not poisoned").clear();
    }
}

/// The profiles an HPA concerns: those of its namespace whose scale target
/// it targets.
pub fn profiles_of_hpa(
    hpa: &HorizontalPodAutoscaler,
    profiles: &[Arc<kube::core::DeserializeGuard<CapacityProfile>>],
) -> Vec<ObjectRef<kube::core::DeserializeGuard<CapacityProfile>>> {
    let Some(t) = hpa.spec.as_ref().map(|s| &s.scale_target_ref) else {
        return Vec::new();
    };
    let ns = hpa.namespace();
    profiles
        .iter()
        .filter_map(|g| g.0.as_ref().ok())
        .filter(|p| {
            p.namespace() == ns
                && p.spec.pool.scale_target_ref.kind == t.kind
                && p.spec.pool.scale_target_ref.name == t.name
        })
        .map(|p| ObjectRef::new(&p.name_any()).within(&p.namespace().unwrap_or_default()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_counts_as_done_until_the_cache_moves() {
        let lag = Lag::default();
        assert!(!lag.in_flight("ns/a", Some("10"), "h1"));
        lag.wrote("ns/a", Some("10"), "h1");
        // The cache still shows the version we wrote on top of.
        assert!(lag.in_flight("ns/a", Some("10"), "h1"));
        // Something else is wanted now: write it.
        assert!(!lag.in_flight("ns/a", Some("10"), "h2"));
        // The cache moved (our write, or someone else's): judge by it.
        assert!(!lag.in_flight("ns/a", Some("11"), "h1"));
        // A created object: nothing was there.
        lag.wrote("ns/b", None, "h1");
        assert!(lag.in_flight("ns/b", None, "h1"));
        assert!(!lag.in_flight("ns/b", Some("12"), "h1"));
    }

    #[test]
    fn a_failed_write_is_never_done_but_makes_the_next_one_look_first() {
        let lag = Lag::default();
        assert!(!lag.wrote_before("ns/a", "h1"));
        lag.failed("ns/a", "h1");
        // Not done: nothing is cached yet, and nothing may count as written.
        assert!(!lag.in_flight("ns/a", None, "h1"));
        assert!(!lag.in_flight("ns/a", Some("10"), "h1"));
        // But it may be on the server: ask before writing it again.
        assert!(lag.wrote_before("ns/a", "h1"));
        assert!(!lag.wrote_before("ns/a", "h2"));
        lag.wrote("ns/a", Some("10"), "h1");
        assert!(lag.in_flight("ns/a", Some("10"), "h1"));
    }

    #[test]
    fn only_apps_kinds_keep_replicas_in_spec() {
        let r = |v: &str, k: &str| ScaleTargetRef {
            api_version: v.into(),
            kind: k.into(),
            name: "x".into(),
        };
        assert!(replicas_in_spec(&r("apps/v1", "Deployment")));
        assert!(replicas_in_spec(&r("apps/v1", "StatefulSet")));
        assert!(!replicas_in_spec(&r(
            "leaderworkerset.x-k8s.io/v1",
            "LeaderWorkerSet"
        )));
        assert!(!replicas_in_spec(&r("v1", "Deployment")));
    }
}
