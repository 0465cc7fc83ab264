//! The pod index: one label-selected watch per pool, each pod decoded
//! straight into a [`CachedPod`], so the controller never watches the whole
//! cluster's pods and keeps only what it reads of each pod.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodReadinessGate, PodSpec, PodStatus};
use kube::api::Api;
use kube::core::{ObjectMeta, Selector};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde::Deserialize;

use super::reconcile::pool::{DEPLOYMENT_REVISION_LABEL, STATEFULSET_REVISION_LABEL, WorkloadKind};
use super::watch::{Trigger, Watch};

use crate::api::CapacityProfile;
use crate::signals::PoolPod;

/// Why the pool's pods can't be watched.
#[derive(Debug, thiserror::Error)]
pub enum PoolSelectorError {
    /// The selector is not a valid label selector.
    #[error("spec.pool.podSelector: {0}")]
    Invalid(#[from] kube::core::ParseExpressionError),
    /// The selector selects every pod of the namespace.
    #[error("spec.pool.podSelector selects every pod of the namespace: give it labels")]
    Empty,
}

/// The selector of a profile's pool, as a label selector string.
pub fn selector_of(profile: &CapacityProfile) -> Result<Selector, PoolSelectorError> {
    Ok(profile.spec.pool.pod_selector.clone().try_into()?)
}

/// Label lanekeeper puts on drained pods.
pub const DRAIN_LABEL: &str = "lanekeeper.dev/drain";
/// Annotation: when the pod was drained (RFC 3339).
pub const DRAINED_AT_ANNOTATION: &str = "lanekeeper.dev/drained-at";
/// Annotation: why the pod was drained.
pub const DRAIN_REASON_ANNOTATION: &str = "lanekeeper.dev/drain-reason";
/// Annotation with which a person or tool asks for a drain.
pub const DRAIN_REQUEST_ANNOTATION: &str = "lanekeeper.dev/drain-request";

struct Entry {
    selector: String,
    watch: Watch<CachedPod>,
}

/// Per-profile pod watches.
pub struct PodIndex {
    client: Client,
    trigger: Trigger,
    entries: Mutex<HashMap<ObjectRef<CapacityProfile>, Entry>>,
}

/// A pool pod as the pod index keeps it: only what the controller reads.
/// The watch decodes each pod straight into this (through the private
/// wire types below), so a full `Pod`, with its spec, managed fields and
/// container statuses, is never built, let alone kept: a pool pod takes
/// well under a kilobyte in the index, whatever its spec.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "wire::Pod")]
pub struct CachedPod {
    /// Name, namespace, resource version (the watch resumes from it) and
    /// the deletion mark; nothing else.
    pub metadata: ObjectMeta,
    /// Its `ContainersReady` condition is True.
    pub containers_ready: bool,
    /// Pod IP, when assigned.
    pub ip: Option<String>,
    /// It carries lanekeeper's drain label.
    pub drained: bool,
    /// When it was drained (the drained-at annotation, RFC 3339).
    pub drained_at: Option<String>,
    /// Why it was drained (the drain-reason annotation).
    pub drain_reason: Option<String>,
    /// Someone asked for a drain (the drain-request annotation).
    pub drain_requested: bool,
    /// A Deployment pod's revision (`pod-template-hash`).
    pub pod_template_hash: Option<String>,
    /// A StatefulSet pod's revision (`controller-revision-hash`).
    pub controller_revision_hash: Option<String>,
    /// Its phase is Pending or not reported yet.
    pub pending: bool,
    /// `PodScheduled` is False: the scheduler's message (else its reason).
    pub unscheduled: Option<String>,
    /// lanekeeper's readiness gates (condition types `lanekeeper.dev/...`).
    pub gates: Vec<String>,
    /// lanekeeper's conditions: type and status.
    pub conditions: Vec<(String, String)>,
}

impl k8s_openapi::Resource for CachedPod {
    const API_VERSION: &'static str = <Pod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Pod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Pod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Pod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Pod as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for CachedPod {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The parts of a pod's JSON the index reads; serde skips the rest without
/// allocating for it.
mod wire {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{PodCondition, PodReadinessGate};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde::Deserialize;

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Meta {
        pub name: Option<String>,
        pub namespace: Option<String>,
        pub resource_version: Option<String>,
        pub deletion_timestamp: Option<Time>,
        pub labels: Option<BTreeMap<String, String>>,
        pub annotations: Option<BTreeMap<String, String>>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Spec {
        pub readiness_gates: Option<Vec<PodReadinessGate>>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Status {
        pub phase: Option<String>,
        #[serde(rename = "podIP")]
        pub pod_ip: Option<String>,
        pub conditions: Option<Vec<PodCondition>>,
    }

    #[derive(Default, Deserialize)]
    pub struct Pod {
        pub metadata: Option<Meta>,
        pub spec: Option<Spec>,
        pub status: Option<Status>,
    }
}

/// lanekeeper's own labels, annotations and condition types.
fn ours(key: &str) -> bool {
    key.starts_with("lanekeeper.dev/")
}

impl From<wire::Pod> for CachedPod {
    fn from(p: wire::Pod) -> Self {
        let m = p.metadata.unwrap_or_default();
        let mut labels = m.labels.unwrap_or_default();
        let mut annotations = m.annotations.unwrap_or_default();
        let status = p.status.unwrap_or_default();
        let conditions = status.conditions.unwrap_or_default();
        let condition = |t: &str| conditions.iter().find(|c| c.type_ == t);
        let unscheduled = condition("PodScheduled")
            .filter(|c| c.status == "False")
            .map(|c| {
                c.message
                    .clone()
                    .or_else(|| c.reason.clone())
                    .unwrap_or_else(|| "not scheduled".to_owned())
            });
        CachedPod {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                resource_version: m.resource_version,
                deletion_timestamp: m.deletion_timestamp,
                ..Default::default()
            },
            containers_ready: condition("ContainersReady").is_some_and(|c| c.status == "True"),
            ip: status.pod_ip,
            drained: labels.get(DRAIN_LABEL).is_some_and(|v| v == "true"),
            drained_at: annotations.remove(DRAINED_AT_ANNOTATION),
            drain_reason: annotations.remove(DRAIN_REASON_ANNOTATION),
            drain_requested: annotations
                .get(DRAIN_REQUEST_ANNOTATION)
                .is_some_and(|v| v == "true"),
            pod_template_hash: labels.remove(DEPLOYMENT_REVISION_LABEL),
            controller_revision_hash: labels.remove(STATEFULSET_REVISION_LABEL),
            pending: status.phase.as_deref().is_none_or(|ph| ph == "Pending"),
            unscheduled,
            gates: p
                .spec
                .and_then(|s| s.readiness_gates)
                .into_iter()
                .flatten()
                .map(|g| g.condition_type)
                .filter(|t| ours(t))
                .collect(),
            conditions: conditions
                .iter()
                .filter(|c| ours(&c.type_))
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect(),
        }
    }
}

/// The same projection of a full pod (one listed afresh).
impl From<&Pod> for CachedPod {
    fn from(p: &Pod) -> Self {
        let m = &p.metadata;
        let spec = p.spec.as_ref();
        let status = p.status.as_ref();
        CachedPod::from(wire::Pod {
            metadata: Some(wire::Meta {
                name: m.name.clone(),
                namespace: m.namespace.clone(),
                resource_version: m.resource_version.clone(),
                deletion_timestamp: m.deletion_timestamp.clone(),
                labels: m.labels.clone(),
                annotations: m.annotations.clone(),
            }),
            spec: Some(wire::Spec {
                readiness_gates: spec.and_then(|s| s.readiness_gates.clone()),
            }),
            status: Some(wire::Status {
                phase: status.and_then(|s| s.phase.clone()),
                pod_ip: status.and_then(|s| s.pod_ip.clone()),
                conditions: status.and_then(|s| s.conditions.clone()),
            }),
        })
    }
}

impl CachedPod {
    /// The pool's view of the pod.
    pub fn pool_pod(&self) -> PoolPod {
        PoolPod {
            name: self.name_any(),
            containers_ready: self.containers_ready,
            ip: self.ip.clone(),
            drained: self.drained,
            drain_requested: self.drain_requested,
            terminating: self.metadata.deletion_timestamp.is_some(),
        }
    }

    /// The pod's revision by the label of the pool's workload kind.
    pub fn revision(&self, kind: WorkloadKind) -> Option<&str> {
        match kind {
            WorkloadKind::Deployment => self.pod_template_hash.as_deref(),
            WorkloadKind::StatefulSet => self.controller_revision_hash.as_deref(),
            WorkloadKind::Other => None,
        }
    }

    /// The pod again as a `Pod` holding only what was kept (for the drain,
    /// which reads pods listed afresh and cached ones alike);
    /// `CachedPod::from` of it gives this back.
    pub fn to_pod(&self) -> Pod {
        let map = |kv: Vec<(&str, Option<&String>)>| {
            let m: BTreeMap<String, String> = kv
                .into_iter()
                .filter_map(|(k, v)| Some((k.to_owned(), v?.clone())))
                .collect();
            (!m.is_empty()).then_some(m)
        };
        let yes = "true".to_owned();
        let labels = map(vec![
            (DRAIN_LABEL, self.drained.then_some(&yes)),
            (DEPLOYMENT_REVISION_LABEL, self.pod_template_hash.as_ref()),
            (
                STATEFULSET_REVISION_LABEL,
                self.controller_revision_hash.as_ref(),
            ),
        ]);
        let annotations = map(vec![
            (
                DRAIN_REQUEST_ANNOTATION,
                self.drain_requested.then_some(&yes),
            ),
            (DRAINED_AT_ANNOTATION, self.drained_at.as_ref()),
            (DRAIN_REASON_ANNOTATION, self.drain_reason.as_ref()),
        ]);
        Pod {
            metadata: ObjectMeta {
                labels,
                annotations,
                ..self.metadata.clone()
            },
            spec: Some(PodSpec {
                readiness_gates: (!self.gates.is_empty()).then(|| {
                    self.gates
                        .iter()
                        .map(|t| PodReadinessGate {
                            condition_type: t.clone(),
                        })
                        .collect()
                }),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(if self.pending { "Pending" } else { "Running" }.to_owned()),
                pod_ip: self.ip.clone(),
                conditions: Some(self.status_conditions()),
                ..Default::default()
            }),
        }
    }

    fn status_conditions(&self) -> Vec<PodCondition> {
        let condition = |t: &str, status: &str| PodCondition {
            type_: t.to_owned(),
            status: status.to_owned(),
            ..Default::default()
        };
        let truth = |b: bool| if b { "True" } else { "False" };
        let mut out = vec![condition("ContainersReady", truth(self.containers_ready))];
        if let Some(why) = &self.unscheduled {
            out.push(PodCondition {
                message: Some(why.clone()),
                ..condition("PodScheduled", "False")
            });
        }
        out.extend(self.conditions.iter().map(|(t, s)| condition(t, s)));
        out
    }
}

/// Pods of the pool that the scheduler could not place (Pending with
/// `PodScheduled` False), with the scheduler's message for one of them. They
/// add no capacity: `None` when every pod is placed.
pub fn unschedulable(pods: &[Arc<CachedPod>]) -> Option<(usize, String)> {
    let refused: Vec<(String, &str)> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && p.pending)
        .filter_map(|p| Some((p.name_any(), p.unscheduled.as_deref()?)))
        .collect();
    let (name, why) = refused.first()?;
    Some((refused.len(), format!("{name}: {why}")))
}

/// The pool's view of a pod.
pub fn pool_pod(p: &Pod) -> PoolPod {
    CachedPod::from(p).pool_pod()
}

impl PodIndex {
    /// A new, empty index; pod changes are sent to `trigger` as the profile
    /// to reconcile.
    pub fn new(client: Client, trigger: Trigger) -> Self {
        Self {
            client,
            trigger,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The pool's pods, once its watch has synced (None before). Starts or
    /// restarts the watch when the profile's selector is new or changed.
    pub fn pods(
        &self,
        profile: &CapacityProfile,
    ) -> Result<Option<Vec<Arc<CachedPod>>>, PoolSelectorError> {
        let selector = selector_of(profile)?;
        let sel = selector.to_string();
        if sel.is_empty() {
            return Err(PoolSelectorError::Empty);
        }
        let key = ObjectRef::from_obj(profile);
        let mut entries = self.entries.lock().expect("not poisoned");
        if entries.get(&key).is_some_and(|e| e.selector != sel) {
            entries.remove(&key);
        }
        let entry = entries
            .entry(key.clone())
            .or_insert_with(|| self.start(profile, &sel, selector, key.clone()));
        Ok(entry.watch.state())
    }

    fn start(
        &self,
        profile: &CapacityProfile,
        sel: &str,
        selector: Selector,
        key: ObjectRef<CapacityProfile>,
    ) -> Entry {
        let ns = profile.namespace().unwrap_or_default();
        let api: Api<CachedPod> = Api::namespaced(self.client.clone(), &ns);
        let config = watcher::Config::default().labels_from(&selector);
        Entry {
            selector: sel.to_owned(),
            watch: Watch::start(watcher(api, config), (), "pods", self.trigger.clone(), key),
        }
    }

    /// While the pool's pod watch is on its first list, within the grace:
    /// how long is left (see [`Watch::first_sync_left`]).
    pub fn first_sync_left(&self, profile: &CapacityProfile) -> Option<Duration> {
        let entries = self.entries.lock().expect("not poisoned");
        entries
            .get(&ObjectRef::from_obj(profile))?
            .watch
            .first_sync_left()
    }

    /// Stops the watch of a deleted profile.
    pub fn forget(&self, key: &ObjectRef<CapacityProfile>) {
        self.entries.lock().expect("not poisoned").remove(key);
    }

    /// Stops every watch.
    pub fn shutdown(&self) {
        self.entries.lock().expect("not poisoned").clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(
        name: &str,
        phase: &str,
        scheduled: Option<(&str, &str)>,
        deleting: bool,
    ) -> Arc<CachedPod> {
        let mut conditions = Vec::new();
        if let Some((status, message)) = scheduled {
            conditions.push(serde_json::json!({
                "type": "PodScheduled", "status": status, "reason": "Unschedulable", "message": message
            }));
        }
        let mut v = serde_json::json!({
            "metadata": {"name": name},
            "status": {"phase": phase, "conditions": conditions}
        });
        if deleting {
            v["metadata"]["deletionTimestamp"] = serde_json::json!("2026-12-01T00:00:00Z");
        }
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn only_pending_pods_the_scheduler_refused_count() {
        let gpu = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.";
        let pods = vec![
            pod("running", "Running", Some(("True", "")), false),
            pod("placed-not-started", "Pending", Some(("True", "")), false),
            pod("no-condition-yet", "Pending", None, false),
            pod("refused-a", "Pending", Some(("False", gpu)), false),
            pod("refused-b", "Pending", Some(("False", gpu)), false),
            pod(
                "refused-but-deleting",
                "Pending",
                Some(("False", gpu)),
                true,
            ),
        ];
        let (n, why) = unschedulable(&pods).expect("two refused pods");
        assert_eq!(n, 2);
        assert_eq!(why, format!("refused-a: {gpu}"));
        assert_eq!(unschedulable(&pods[..3]), None);
        assert_eq!(unschedulable(&[]), None);
    }

    /// A pod as a kubelet (here kwok) and lanekeeper leave it: spec,
    /// managed fields, container statuses and all.
    fn full_pod() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "pool-7d9f-abcde", "namespace": "ai", "uid": "0b5c",
                "resourceVersion": "4711", "generateName": "pool-7d9f-",
                "deletionTimestamp": "2026-12-01T00:00:00Z",
                "labels": {"app": "pool", "pod-template-hash": "7d9f",
                    "lanekeeper.dev/drain": "true"},
                "annotations": {"lanekeeper.dev/drain-request": "true",
                    "lanekeeper.dev/drained-at": "2026-12-01T00:00:00Z",
                    "lanekeeper.dev/drain-reason": "errorRatio", "kwok.x-k8s.io/x": "y"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "pool-7d9f", "uid": "1", "controller": true}],
                "managedFields": [{"manager": "kwok", "operation": "Update",
                    "apiVersion": "v1", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:phase": {}}}}]
            },
            "spec": {
                "containers": [{"name": "vllm", "image": "vllm:1",
                    "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
                "readinessGates": [{"conditionType": "lanekeeper.dev/serving"},
                    {"conditionType": "example.com/other"}],
                "nodeName": "kwok-gpu-0"
            },
            "status": {
                "phase": "Running", "podIP": "10.0.0.7", "hostIP": "10.0.0.1",
                "conditions": [
                    {"type": "ContainersReady", "status": "True",
                        "lastTransitionTime": "2026-12-01T00:00:00Z"},
                    {"type": "Ready", "status": "False"},
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "lanekeeper.dev/serving", "status": "False",
                        "reason": "Drained", "message": "taken out"}
                ],
                "containerStatuses": [{"name": "vllm", "ready": true, "restartCount": 0,
                    "image": "vllm:1", "imageID": "", "started": true,
                    "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}}}]
            }
        })
    }

    #[test]
    fn a_pod_is_kept_as_what_the_controller_reads() {
        let cached: CachedPod = serde_json::from_value(full_pod()).unwrap();
        let m = &cached.metadata;
        assert_eq!(m.name.as_deref(), Some("pool-7d9f-abcde"));
        assert_eq!(m.namespace.as_deref(), Some("ai"));
        assert_eq!(m.resource_version.as_deref(), Some("4711"));
        assert!(m.deletion_timestamp.is_some());
        assert_eq!(
            (m.uid.as_ref(), m.labels.as_ref(), m.annotations.as_ref()),
            (None, None, None)
        );
        assert!(m.owner_references.is_none() && m.managed_fields.is_none());
        assert!(cached.containers_ready && cached.drained && cached.drain_requested);
        assert_eq!(cached.ip.as_deref(), Some("10.0.0.7"));
        assert_eq!(cached.drain_reason.as_deref(), Some("errorRatio"));
        assert_eq!(cached.revision(WorkloadKind::Deployment), Some("7d9f"));
        assert_eq!(cached.revision(WorkloadKind::StatefulSet), None);
        assert!(!cached.pending && cached.unscheduled.is_none());
        assert_eq!(cached.gates, ["lanekeeper.dev/serving"]);
        assert_eq!(
            cached.conditions,
            [("lanekeeper.dev/serving".to_owned(), "False".to_owned())]
        );
    }

    #[test]
    fn a_full_pod_and_the_kept_one_read_the_same() {
        let full: Pod = serde_json::from_value(full_pod()).unwrap();
        let cached: CachedPod = serde_json::from_value(full_pod()).unwrap();
        assert_eq!(CachedPod::from(&full), cached);
        assert_eq!(CachedPod::from(&cached.to_pod()), cached);
        assert_eq!(pool_pod(&full), cached.pool_pod());
        assert_eq!(pool_pod(&cached.to_pod()), cached.pool_pod());
        let refused = pod("refused", "Pending", Some(("False", "no GPU")), false);
        assert_eq!(CachedPod::from(&refused.to_pod()), *refused);
    }
}
