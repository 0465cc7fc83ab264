//! The bounded readiness drain, acting on real pods.
//!
//! The engine decides who should be drained; this module carries it out on
//! the cluster without ever passing the bound:
//!
//! - the bound is counted from the cluster, never from memory: before every
//!   drain write the pool's pods are listed afresh from the API server, and the
//!   write carries the pod's `resourceVersion` as a precondition (a pod that
//!   changed in between fails the write with 409 and the drain waits for the
//!   next evaluation);
//! - writes for one pool are serialized (the controller never runs two
//!   reconciles of one profile at once, and this module writes one pod at a
//!   time), undrains before drains;
//! - "ready" is the pod's own `ContainersReady`, so a drained pod stays in the
//!   base and in the drained count until it is undrained or gone;
//! - a pod that is not ready is never labelled.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::Selector;
use serde_json::json;

use super::pods::{DRAIN_LABEL, pool_pod};
use super::status::rfc3339;
use super::{Error, FIELD_MANAGER};
use crate::api::DrainSpec;
use crate::policy::drain::bound;
use crate::policy::{DrainAction, DrainedPod, ProfileDecision};
use crate::signals::PoolPod;

/// Annotation: when the pod was drained (RFC 3339).
pub const DRAINED_AT_ANNOTATION: &str = "lanekeeper.dev/drained-at";
/// Annotation: why the pod was drained.
pub const DRAIN_REASON_ANNOTATION: &str = "lanekeeper.dev/drain-reason";
/// The readiness-gate condition type lanekeeper sets.
pub const SERVING_CONDITION: &str = "lanekeeper.dev/serving";

/// What the drain step did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DrainReport {
    /// Pods drained now, with the reason.
    pub drained: Vec<(String, String)>,
    /// Pods undrained now, with the reason.
    pub undrained: Vec<(String, String)>,
    /// Candidates the bound (or a hold, or a race) refused, with the reason.
    pub refused: Vec<(String, String)>,
    /// Pods carrying the drain label after this step.
    pub drained_count: u32,
    /// The bound after this step.
    pub budget: u32,
    /// Readiness-gate conditions written.
    pub gates_written: u32,
}

/// The drained set as the cluster shows it: labelled pods, with the time and
/// reason from their annotations and the healthy window from the engine's
/// last state.
pub fn drained_from_cluster(
    pods: &[Pod],
    engine: &BTreeMap<String, DrainedPod>,
    now: i64,
) -> BTreeMap<String, DrainedPod> {
    pods.iter()
        .filter(|p| pool_pod(p).drained)
        .map(|p| {
            let name = p.name_any();
            let prev = engine.get(&name);
            let since = p
                .annotations()
                .get(DRAINED_AT_ANNOTATION)
                .and_then(|t| crate::api::common::parse_rfc3339(t))
                .or(prev.map(|d| d.since))
                .unwrap_or(now);
            let reason = p
                .annotations()
                .get(DRAIN_REASON_ANNOTATION)
                .cloned()
                .or(prev.map(|d| d.reason.clone()))
                .unwrap_or_else(|| "DrainLabel: labelled by hand".into());
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

fn has_gate(p: &Pod) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.condition_type == SERVING_CONDITION))
}

fn gate_status(p: &Pod) -> Option<String> {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == SERVING_CONDITION))
        .map(|c| c.status.clone())
}

struct Counted {
    ready: u32,
    drained: u32,
}

fn count(pods: &[Pod]) -> Counted {
    let views: Vec<PoolPod> = pods
        .iter()
        .map(pool_pod)
        .filter(|p| !p.terminating)
        .collect();
    Counted {
        ready: views.iter().filter(|p| p.containers_ready).count() as u32,
        drained: views.iter().filter(|p| p.drained).count() as u32,
    }
}

async fn fresh_pods(api: &Api<Pod>, selector: &str) -> Result<Vec<Pod>, Error> {
    Ok(api
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| Error::kube("list pool pods", e))?
        .items)
}

/// Carries out the decision's drains and undrains on the pool's pods.
/// `enforce` is false in observe mode: then nothing is written.
pub async fn actuate(
    api: &Api<Pod>,
    pod_selector: &Selector,
    spec: &DrainSpec,
    decision: &ProfileDecision,
    enforce: bool,
    now: i64,
    mut on_write: impl FnMut(&str),
) -> Result<DrainReport, Error> {
    let selector = pod_selector.to_string();
    let mut report = DrainReport::default();
    let wants_undrain: Vec<_> = decision
        .drain
        .iter()
        .filter(|a| a.action == DrainAction::Undrain)
        .collect();
    let wants_drain: Vec<_> = decision
        .drain
        .iter()
        .filter(|a| a.action == DrainAction::Drain)
        .collect();
    for a in decision
        .drain
        .iter()
        .filter(|a| a.action == DrainAction::Refused)
    {
        report.refused.push((a.pod.clone(), a.reason.clone()));
    }
    if !enforce {
        let pods = fresh_pods(api, &selector).await?;
        let c = count(&pods);
        report.drained_count = c.drained;
        report.budget = bound(spec, c.ready);
        for a in wants_drain {
            report.refused.push((
                a.pod.clone(),
                "Observe: the policy is in observe mode; nothing is written".into(),
            ));
        }
        return Ok(report);
    }

    // Undrains first: they only free slots.
    if !wants_undrain.is_empty() {
        let pods = fresh_pods(api, &selector).await?;
        for a in wants_undrain {
            let Some(p) = pods.iter().find(|p| p.name_any() == a.pod) else {
                continue;
            };
            if !pool_pod(p).drained {
                continue;
            }
            let patch = json!({"metadata": {
                "resourceVersion": p.resource_version(),
                "labels": {DRAIN_LABEL: null},
                "annotations": {DRAINED_AT_ANNOTATION: null, DRAIN_REASON_ANNOTATION: null},
            }});
            match api
                .patch(
                    &a.pod,
                    &PatchParams::apply(FIELD_MANAGER),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => {
                    on_write("Pod");
                    report.undrained.push((a.pod.clone(), a.reason.clone()));
                }
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                    tracing::info!(pod = %a.pod, "pod changed while undraining; retried at the next evaluation");
                }
                Err(e) => return Err(Error::kube("undrain pod", e)),
            }
        }
    }

    // Drains, each re-checking the bound against the newest state.
    for a in wants_drain {
        let pods = fresh_pods(api, &selector).await?;
        let c = count(&pods);
        let budget = bound(spec, c.ready);
        let Some(p) = pods.iter().find(|p| p.name_any() == a.pod) else {
            continue;
        };
        let view = pool_pod(p);
        if view.drained || view.terminating {
            continue;
        }
        if !view.containers_ready {
            report.refused.push((
                a.pod.clone(),
                "NotReady: a pod that is not ready is never labelled".into(),
            ));
            continue;
        }
        if c.drained + 1 > budget {
            report.refused.push((
                a.pod.clone(),
                format!("DrainBudgetExhausted: {} of {budget} drained", c.drained),
            ));
            continue;
        }
        let patch = json!({"metadata": {
            "resourceVersion": p.resource_version(),
            "labels": {DRAIN_LABEL: "true"},
            "annotations": {DRAINED_AT_ANNOTATION: rfc3339(now), DRAIN_REASON_ANNOTATION: a.reason},
        }});
        match api
            .patch(
                &a.pod,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                on_write("Pod");
                report.drained.push((a.pod.clone(), a.reason.clone()));
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                report.refused.push((
                    a.pod.clone(),
                    "Conflict: the pod changed while draining; re-evaluated next time".into(),
                ));
            }
            Err(e) => return Err(Error::kube("drain pod", e)),
        }
    }

    // Readiness gates: True once the containers are ready and the pod is not
    // drained, False while drained.
    let pods = fresh_pods(api, &selector).await?;
    for p in pods.iter().filter(|p| has_gate(p)) {
        let view = pool_pod(p);
        if view.terminating {
            continue;
        }
        let want = if view.drained {
            Some("False")
        } else if view.containers_ready {
            Some("True")
        } else {
            None // no opinion until the containers are ready
        };
        let Some(want) = want else { continue };
        if gate_status(p).as_deref() == Some(want) {
            continue;
        }
        let (reason, message) = if want == "True" {
            ("Serving", "containers ready and not drained by lanekeeper")
        } else {
            (
                "Drained",
                "taken out of rotation by lanekeeper's bounded drain",
            )
        };
        let patch = json!({"status": {"conditions": [{
            "type": SERVING_CONDITION,
            "status": want,
            "reason": reason,
            "message": message,
            "lastTransitionTime": rfc3339(now),
        }]}});
        match api
            .patch_status(
                &p.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Ok(_) => {
                on_write("Pod/status");
                report.gates_written += 1;
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(Error::kube("set serving condition", e)),
        }
    }
    let c = count(&pods);
    report.drained_count = c.drained;
    report.budget = bound(spec, c.ready);
    Ok(report)
}
