//! The pod index: one label-selected watch per pool, stripped before it is
//! stored, so the controller never watches the whole cluster's pods and
//! keeps only what it needs of each pod.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::core::{ObjectMeta, Selector};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

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
    watch: Watch<Pod>,
}

/// Per-profile pod watches.
pub struct PodIndex {
    client: Client,
    trigger: Trigger,
    entries: Mutex<HashMap<ObjectRef<CapacityProfile>, Entry>>,
}

/// Keeps only what the controller reads: name, namespace, uid, resource
/// version, lanekeeper's labels and annotations and the revision labels,
/// deletion mark, readiness gates, the conditions it reads (containers
/// ready, scheduled, lanekeeper's serving gate; a message only where it is
/// reported), phase and pod IP. A pool pod then takes a few hundred bytes in
/// the index, whatever its spec.
pub fn strip(pod: &mut Pod) {
    let m = &mut pod.metadata;
    let ours = |k: &str| k.starts_with("lanekeeper.dev/");
    let keep = ObjectMeta {
        name: m.name.take(),
        namespace: m.namespace.take(),
        uid: m.uid.take(),
        resource_version: m.resource_version.take(),
        labels: m.labels.take().map(|l| {
            l.into_iter()
                .filter(|(k, _)| {
                    ours(k)
                        || k == super::reconcile::pool::DEPLOYMENT_REVISION_LABEL
                        || k == super::reconcile::pool::STATEFULSET_REVISION_LABEL
                })
                .collect()
        }),
        annotations: m
            .annotations
            .take()
            .map(|a| a.into_iter().filter(|(k, _)| ours(k)).collect()),
        deletion_timestamp: m.deletion_timestamp.take(),
        ..Default::default()
    };
    pod.metadata = keep;
    if let Some(spec) = pod.spec.take() {
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            readiness_gates: spec.readiness_gates,
            containers: Vec::new(),
            ..Default::default()
        });
    }
    if let Some(status) = pod.status.take() {
        let conditions = status.conditions.map(|cs| {
            cs.into_iter()
                .filter(|c| {
                    matches!(c.type_.as_str(), "ContainersReady" | "PodScheduled") || ours(&c.type_)
                })
                .map(|mut c| {
                    c.last_probe_time = None;
                    c.last_transition_time = None;
                    if c.type_ != "PodScheduled" || c.status != "False" {
                        c.message = None;
                    }
                    c
                })
                .collect()
        });
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            conditions,
            pod_ip: status.pod_ip,
            phase: status.phase,
            ..Default::default()
        });
    }
}

/// Pods of the pool that the scheduler could not place (Pending with
/// `PodScheduled` False), with the scheduler's message for one of them. They
/// add no capacity: `None` when every pod is placed.
pub fn unschedulable(pods: &[Arc<Pod>]) -> Option<(usize, String)> {
    let mut count = 0;
    let mut message = None;
    for p in pods {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(status) = p.status.as_ref() else {
            continue;
        };
        if status.phase.as_deref().is_some_and(|ph| ph != "Pending") {
            continue;
        }
        let refused = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False");
        if let Some(c) = refused {
            count += 1;
            message.get_or_insert_with(|| {
                format!(
                    "{}: {}",
                    p.name_any(),
                    c.message
                        .as_deref()
                        .or(c.reason.as_deref())
                        .unwrap_or("not scheduled")
                )
            });
        }
    }
    message.map(|m| (count, m))
}

/// The pool's view of a pod.
pub fn pool_pod(p: &Pod) -> PoolPod {
    let cond = |t: &str| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == t))
            .is_some_and(|c| c.status == "True")
    };
    PoolPod {
        name: p.name_any(),
        containers_ready: cond("ContainersReady"),
        ip: p.status.as_ref().and_then(|s| s.pod_ip.clone()),
        drained: p.labels().get(DRAIN_LABEL).is_some_and(|v| v == "true"),
        drain_requested: p
            .annotations()
            .get(DRAIN_REQUEST_ANNOTATION)
            .is_some_and(|v| v == "true"),
        terminating: p.metadata.deletion_timestamp.is_some(),
    }
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
    ) -> Result<Option<Vec<Arc<Pod>>>, PoolSelectorError> {
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
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let config = watcher::Config::default().labels_from(&selector);
        Entry {
            selector: sel.to_owned(),
            watch: Watch::start(
                watcher(api, config).modify(strip),
                (),
                "pods",
                self.trigger.clone(),
                key,
            ),
        }
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

    fn pod(name: &str, phase: &str, scheduled: Option<(&str, &str)>, deleting: bool) -> Arc<Pod> {
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
}
