//! What the pool's workload (the scale target) says beyond its size: the
//! hash of its pod template (for the calibration) and its rollout (for the
//! drain). Read in the observe stage; the rules are pure functions of the
//! objects, unit-tested here.
//!
//! **Rollout in progress** (no new drain while it holds):
//!
//! - Deployment: `status.observedGeneration < metadata.generation` (a spec
//!   change not yet acted on), or `status.updatedReplicas < spec.replicas`
//!   (pods of the new template still to be made), or `status.replicas >
//!   status.updatedReplicas` (pods of an older template still there).
//!   Unavailable pods alone do not count: lanekeeper's own drains and pods
//!   the scheduler cannot place make pods unavailable with no rollout at all.
//! - StatefulSet: `status.observedGeneration < metadata.generation`, or
//!   `status.currentRevision != status.updateRevision`.
//! - A status without `observedGeneration` (no controller has reported on
//!   the workload yet) and any other kind: not known; drains are not held.
//!
//! **A pod's revision** against the pool's current one:
//!
//! - Deployment: the pod's `pod-template-hash` label against that of the
//!   Deployment's current ReplicaSet (owned by it, with the Deployment's
//!   `deployment.kubernetes.io/revision`, else the highest);
//! - StatefulSet: the pod's `controller-revision-hash` label against
//!   `status.updateRevision`.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{DynamicObject, PartialObjectMeta};
use serde_json::Value;

use crate::api::ScaleTargetRef;
use crate::api::calibration::{ConfigHashError, workload_config_hash};

/// The pod label naming a Deployment pod's template.
pub const DEPLOYMENT_REVISION_LABEL: &str = "pod-template-hash";
/// The pod label naming a StatefulSet pod's revision.
pub const STATEFULSET_REVISION_LABEL: &str = "controller-revision-hash";
/// The annotation with a Deployment's (and its ReplicaSets') revision number.
pub const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";

/// The kinds whose rollout lanekeeper reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkloadKind {
    /// `apps/v1` Deployment.
    Deployment,
    /// `apps/v1` StatefulSet.
    StatefulSet,
    /// Anything else: no rollout known.
    Other,
}

impl WorkloadKind {
    /// The kind of a scale target.
    pub fn of(r: &ScaleTargetRef) -> Self {
        let group = r.api_version.split_once('/').map_or("", |(g, _)| g);
        match (group, r.kind.as_str()) {
            ("apps", "Deployment") => WorkloadKind::Deployment,
            ("apps", "StatefulSet") => WorkloadKind::StatefulSet,
            _ => WorkloadKind::Other,
        }
    }

    /// The pod label that carries a pod's revision.
    pub fn revision_label(self) -> Option<&'static str> {
        match self {
            WorkloadKind::Deployment => Some(DEPLOYMENT_REVISION_LABEL),
            WorkloadKind::StatefulSet => Some(STATEFULSET_REVISION_LABEL),
            WorkloadKind::Other => None,
        }
    }
}

/// What the workload says about the pool.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolView {
    /// The hash of the pod template, or why there is none.
    pub config_hash: Result<String, ConfigHashError>,
    /// Whether a rollout is in progress (None: not known).
    pub rollout_in_progress: Option<bool>,
    /// The current revision (None: not known).
    pub current_revision: Option<String>,
    /// Why the current revision could not be read (an API error).
    pub revision_problem: Option<String>,
}

fn int(v: &Value, path: &str) -> Option<i64> {
    v.pointer(path).and_then(Value::as_i64)
}

/// Whether the workload's controller has reported on it: its status has an
/// `observedGeneration`. Then a count missing from the status is 0 (the API
/// server leaves zero counts out).
fn observed(obj: &Value) -> Option<(i64, i64)> {
    let observed = int(obj, "/status/observedGeneration")?;
    let generation = int(obj, "/metadata/generation").unwrap_or(observed);
    Some((observed, generation))
}

/// A Deployment's rollout (see the module's rule).
pub fn deployment_in_progress(obj: &Value) -> Option<bool> {
    let (observed, generation) = observed(obj)?;
    let count = |p: &str| int(obj, p).unwrap_or(0);
    let wanted = int(obj, "/spec/replicas").unwrap_or(1);
    let updated = count("/status/updatedReplicas");
    let existing = count("/status/replicas");
    Some(observed < generation || updated < wanted || existing > updated)
}

/// A StatefulSet's rollout and current revision (see the module's rule).
pub fn statefulset_rollout(obj: &Value) -> (Option<bool>, Option<String>) {
    let text = |p: &str| obj.pointer(p).and_then(Value::as_str).map(str::to_owned);
    let update = text("/status/updateRevision");
    let current = text("/status/currentRevision");
    let in_progress = observed(obj).map(|(observed, generation)| {
        observed < generation || matches!((&current, &update), (Some(c), Some(u)) if c != u)
    });
    (in_progress, update)
}

/// The `pod-template-hash` of a Deployment's current ReplicaSet: among the
/// sets it controls, the one with its revision number, else the highest.
pub fn current_replicaset_hash<'a>(
    deployment_uid: &str,
    deployment_revision: Option<&str>,
    sets: impl IntoIterator<Item = &'a ObjectMeta>,
) -> Option<String> {
    let revision = |rs: &ObjectMeta| {
        rs.annotations
            .as_ref()
            .and_then(|a| a.get(REVISION_ANNOTATION))
            .and_then(|r| r.parse::<u64>().ok())
    };
    let owned: Vec<&ObjectMeta> = sets
        .into_iter()
        .filter(|rs| {
            rs.owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == deployment_uid && o.controller == Some(true))
        })
        .collect();
    let wanted = deployment_revision.and_then(|r| r.parse::<u64>().ok());
    let current = owned
        .iter()
        .find(|rs| wanted.is_some() && revision(rs) == wanted)
        .or_else(|| owned.iter().max_by_key(|rs| revision(rs)))?;
    current
        .labels
        .as_ref()
        .and_then(|l| l.get(DEPLOYMENT_REVISION_LABEL))
        .cloned()
}

/// What the workload says about the pool. A Deployment's current revision
/// comes from its ReplicaSets (the watch cache's, selected by the pool's
/// pod selector); `None` while that cache has not synced leaves the revision
/// unknown and says why.
pub fn read(
    r: &ScaleTargetRef,
    obj: &DynamicObject,
    replicasets: Option<&[Arc<PartialObjectMeta<ReplicaSet>>]>,
) -> PoolView {
    let value = serde_json::to_value(obj).unwrap_or(Value::Null);
    let config_hash = workload_config_hash(&value);
    let mut view = PoolView {
        config_hash,
        rollout_in_progress: None,
        current_revision: None,
        revision_problem: None,
    };
    match WorkloadKind::of(r) {
        WorkloadKind::Deployment => {
            view.rollout_in_progress = deployment_in_progress(&value);
            match replicasets {
                Some(sets) => {
                    view.current_revision = current_replicaset_hash(
                        obj.uid().as_deref().unwrap_or_default(),
                        obj.annotations()
                            .get(REVISION_ANNOTATION)
                            .map(String::as_str),
                        sets.iter().map(|s| &s.metadata),
                    );
                }
                None => {
                    view.revision_problem =
                        Some("the ReplicaSet watch has not synced yet".to_owned())
                }
            }
        }
        WorkloadKind::StatefulSet => {
            let (in_progress, current) = statefulset_rollout(&value);
            view.rollout_in_progress = in_progress;
            view.current_revision = current;
        }
        WorkloadKind::Other => {}
    }
    view
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deployment(generation: i64, status: Value) -> Value {
        json!({"metadata": {"generation": generation}, "spec": {"replicas": 4}, "status": status})
    }

    #[test]
    fn a_deployment_rolls_out_until_every_pod_is_of_the_new_template() {
        let done = json!({"observedGeneration": 3, "replicas": 4, "updatedReplicas": 4,
            "readyReplicas": 4, "availableReplicas": 4});
        assert_eq!(
            deployment_in_progress(&deployment(3, done.clone())),
            Some(false)
        );
        // A spec change not yet seen by the deployment controller.
        assert_eq!(
            deployment_in_progress(&deployment(4, done.clone())),
            Some(true)
        );
        // New pods still to be made.
        let mut partway = done.clone();
        partway["updatedReplicas"] = json!(1);
        assert_eq!(deployment_in_progress(&deployment(3, partway)), Some(true));
        // Old pods still there (surge).
        let mut surge = done.clone();
        surge["replicas"] = json!(5);
        assert_eq!(deployment_in_progress(&deployment(3, surge)), Some(true));
        // Zero counts are left out by the API server: no updated replica.
        let started = json!({"observedGeneration": 3, "replicas": 4});
        assert_eq!(deployment_in_progress(&deployment(3, started)), Some(true));
        // Unavailable pods alone (a drained pod, a pod the scheduler cannot
        // place) are no rollout.
        let mut unavailable = done;
        unavailable["availableReplicas"] = json!(2);
        unavailable["unavailableReplicas"] = json!(2);
        assert_eq!(
            deployment_in_progress(&deployment(3, unavailable)),
            Some(false)
        );
        // No controller has reported: not known.
        let unreported = json!({"replicas": 4, "readyReplicas": 4});
        assert_eq!(deployment_in_progress(&deployment(3, unreported)), None);
    }

    #[test]
    fn a_statefulset_rolls_out_while_its_revisions_differ() {
        let sts = |generation: i64, status: Value| json!({"metadata": {"generation": generation}, "status": status});
        let same = json!({"observedGeneration": 2, "currentRevision": "web-7c6d", "updateRevision": "web-7c6d"});
        assert_eq!(
            statefulset_rollout(&sts(2, same.clone())),
            (Some(false), Some("web-7c6d".into()))
        );
        assert_eq!(statefulset_rollout(&sts(3, same)).0, Some(true));
        let differ = json!({"observedGeneration": 2, "currentRevision": "web-7c6d", "updateRevision": "web-9f8e"});
        assert_eq!(
            statefulset_rollout(&sts(2, differ)),
            (Some(true), Some("web-9f8e".into()))
        );
        let unreported = json!({"updateRevision": "web-9f8e"});
        assert_eq!(
            statefulset_rollout(&sts(2, unreported)),
            (None, Some("web-9f8e".into()))
        );
    }

    fn rs(name: &str, owner: &str, revision: &str, hash: &str) -> ReplicaSet {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"pod-template-hash": hash},
                "annotations": {"deployment.kubernetes.io/revision": revision},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm",
                    "uid": owner, "controller": true}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_current_replicaset_is_the_deployments_revision() {
        let sets = [
            rs("vllm-aaa", "uid-1", "1", "aaa"),
            rs("vllm-ccc", "uid-1", "3", "ccc"),
            rs("vllm-bbb", "uid-1", "2", "bbb"),
            rs("other-zzz", "uid-2", "9", "zzz"),
        ];
        assert_eq!(
            current_replicaset_hash("uid-1", Some("3"), sets.iter().map(|s| &s.metadata)),
            Some("ccc".into())
        );
        // A rollback makes an older set current again.
        assert_eq!(
            current_replicaset_hash("uid-1", Some("2"), sets.iter().map(|s| &s.metadata)),
            Some("bbb".into())
        );
        // Without the Deployment's annotation: the highest revision it owns.
        assert_eq!(
            current_replicaset_hash("uid-1", None, sets.iter().map(|s| &s.metadata)),
            Some("ccc".into())
        );
        assert_eq!(
            current_replicaset_hash("uid-3", None, sets.iter().map(|s| &s.metadata)),
            None
        );
    }

    #[test]
    fn only_apps_deployments_and_statefulsets_have_a_known_rollout() {
        let r = |v: &str, k: &str| ScaleTargetRef {
            api_version: v.into(),
            kind: k.into(),
            name: "x".into(),
        };
        assert_eq!(
            WorkloadKind::of(&r("apps/v1", "Deployment")),
            WorkloadKind::Deployment
        );
        assert_eq!(
            WorkloadKind::of(&r("apps/v1", "StatefulSet")),
            WorkloadKind::StatefulSet
        );
        assert_eq!(
            WorkloadKind::of(&r("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")),
            WorkloadKind::Other
        );
        assert_eq!(WorkloadKind::Other.revision_label(), None);
    }
}
