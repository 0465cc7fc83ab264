//! The bounded readiness drain, acting on real pods.
//!
//! The engine decides who should be drained; this module carries it out on
//! the cluster without ever passing the bound:
//!
//! - the bound is counted from the cluster, never from memory: before every
//!   drain write the pool's pods are listed afresh from the API server, and the
//!   write carries the pod's `resourceVersion` as a precondition (a pod that
//!   changed in between fails the write with 409 and the drain waits for the
//!   next evaluation); a step that writes nothing counts from the pod watch's
//!   cache and makes no API call;
//! - writes for one pool are serialized (the controller never runs two
//!   reconciles of one profile at once, and this module writes one pod at a
//!   time), undrains before drains;
//! - "ready" is the one definition (`PodSignals::is_ready`: containers ready,
//!   not being deleted), so a drained pod stays in the base and in the
//!   drained count until it is undrained or gone;
//! - a pod that is not ready is never labelled.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::Selector;
use serde_json::json;

use super::context::FIELD_MANAGER;
use super::error::Error;
use super::pods::{DRAIN_LABEL, DRAIN_REASON_ANNOTATION, DRAINED_AT_ANNOTATION, pool_pod};
use crate::api::common::rfc3339;
use crate::api::{DrainReason, DrainSpec};
use crate::policy::{Drain, DrainAction, PodDrain};

/// The readiness-gate condition type lanekeeper sets.
pub const SERVING_CONDITION: &str = "lanekeeper.dev/serving";

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

/// The pool as the cluster shows it now: ready pods, drained pods and the
/// bound ([`DrainSpec::bound`]) they give.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Census {
    drained: u32,
    bound: u32,
}

fn census(pods: &[Arc<Pod>], spec: &DrainSpec) -> Census {
    let views: Vec<_> = pods
        .iter()
        .map(|p| pool_pod(p))
        .filter(|p| !p.terminating)
        .collect();
    let ready = views.iter().filter(|p| p.signals().is_ready()).count() as u32;
    Census {
        drained: views.iter().filter(|p| p.drained).count() as u32,
        bound: spec.bound(ready),
    }
}

async fn fresh_pods(api: &Api<Pod>, selector: &str) -> Result<Vec<Arc<Pod>>, Error> {
    Ok(api
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| Error::kube("list pool pods", e))?
        .items
        .into_iter()
        .map(Arc::new)
        .collect())
}

fn refused(a: &PodDrain, reason: DrainReason) -> PodDrain {
    PodDrain {
        action: DrainAction::Refused,
        reason,
        ..a.clone()
    }
}

/// Carries out the decision's drain on the pool's pods and returns it as
/// carried out: drains and undrains written, candidates refused (by the
/// bound re-checked against the newest state, by readiness, by a race), the
/// drained count and the bound after this step. `cached` is the pod watch's
/// copy of the pool: what a step that writes nothing counts from. `enforce`
/// is false in observe mode: then nothing is written and every drain is
/// refused with `Observe`.
#[allow(clippy::too_many_arguments)]
pub async fn actuate(
    api: &Api<Pod>,
    pod_selector: &Selector,
    spec: &DrainSpec,
    decided: &Drain,
    cached: &[Arc<Pod>],
    enforce: bool,
    now: i64,
    mut on_write: impl FnMut(&str),
) -> Result<Drain, Error> {
    let selector = pod_selector.to_string();
    let mut done: Vec<PodDrain> = decided
        .actions
        .iter()
        .filter(|a| matches!(a.action, DrainAction::Keep | DrainAction::Refused))
        .cloned()
        .collect();
    let wants = |action| decided.actions.iter().filter(move |a| a.action == action);
    if !enforce {
        done.extend(wants(DrainAction::Drain).map(|a| refused(a, DrainReason::Observe)));
        let c = census(cached, spec);
        done.sort_by(|a, b| a.pod.cmp(&b.pod));
        return Ok(Drain {
            actions: done,
            drained_pods: c.drained,
            drain_budget: c.bound,
        });
    }

    // Whether this step went to the API server (then the count after it is
    // read afresh too).
    let mut touched = false;
    // Undrains first: they only free slots.
    if wants(DrainAction::Undrain).next().is_some() {
        touched = true;
        let pods = fresh_pods(api, &selector).await?;
        for a in wants(DrainAction::Undrain) {
            let Some(p) = pods.iter().find(|p| p.name_any() == a.pod) else {
                continue;
            };
            if !pool_pod(p).drained {
                continue;
            }
            let metadata = json!({
                "labels": {DRAIN_LABEL: null},
                "annotations": {DRAINED_AT_ANNOTATION: null, DRAIN_REASON_ANNOTATION: null},
            });
            match patch_as_listed(api, p, metadata, "undrain pod").await? {
                Written::Done => {
                    on_write("Pod");
                    done.push(a.clone());
                }
                Written::Raced => {
                    tracing::info!(pod = %a.pod, "pod changed while undraining; retried at the next evaluation");
                }
            }
        }
    }

    // Drains, each re-checking the bound against the newest state.
    for a in wants(DrainAction::Drain) {
        touched = true;
        let pods = fresh_pods(api, &selector).await?;
        let c = census(&pods, spec);
        let Some(p) = pods.iter().find(|p| p.name_any() == a.pod) else {
            continue;
        };
        let view = pool_pod(p);
        if view.drained || view.terminating {
            continue;
        }
        if !view.signals().is_ready() {
            done.push(refused(a, DrainReason::NotReady));
            continue;
        }
        if c.drained + 1 > c.bound {
            done.push(refused(
                a,
                DrainReason::BudgetExhausted {
                    drained: c.drained,
                    bound: c.bound,
                },
            ));
            continue;
        }
        let metadata = json!({
            "labels": {DRAIN_LABEL: "true"},
            "annotations": {DRAINED_AT_ANNOTATION: rfc3339(now), DRAIN_REASON_ANNOTATION: a.reason.to_string()},
        });
        match patch_as_listed(api, p, metadata, "drain pod").await? {
            Written::Done => {
                on_write("Pod");
                done.push(a.clone());
            }
            Written::Raced => done.push(refused(a, DrainReason::Conflict)),
        }
    }

    // Readiness gates, then the count after this step.
    let c = if touched {
        let pods = fresh_pods(api, &selector).await?;
        set_gates(api, &pods, now, &mut on_write).await?;
        census(&pods, spec)
    } else {
        set_gates(api, cached, now, &mut on_write).await?;
        census(cached, spec)
    };
    done.sort_by(|a, b| a.pod.cmp(&b.pod));
    Ok(Drain {
        actions: done,
        drained_pods: c.drained,
        drain_budget: c.bound,
    })
}

/// How a drain or undrain write went.
enum Written {
    /// The pod carries it.
    Done,
    /// The pod changed since it was listed (409) or is gone (404): nothing
    /// was written.
    Raced,
}

/// Writes a drain or an undrain (the pod's labels and annotations in
/// `metadata`) with the `resourceVersion` of the pod as listed as a
/// precondition, so it lands only on the state the bound was counted from.
async fn patch_as_listed(
    api: &Api<Pod>,
    pod: &Pod,
    mut metadata: serde_json::Value,
    context: &'static str,
) -> Result<Written, Error> {
    metadata["resourceVersion"] = json!(pod.resource_version());
    let patch = json!({ "metadata": metadata });
    match api
        .patch(
            &pod.name_any(),
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(Written::Done),
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(Written::Raced),
        Err(e) => Err(Error::kube(context, e)),
    }
}

/// Readiness gates: True once the containers are ready and the pod is not
/// drained, False while drained.
async fn set_gates(
    api: &Api<Pod>,
    pods: &[Arc<Pod>],
    now: i64,
    on_write: &mut impl FnMut(&str),
) -> Result<(), Error> {
    for p in pods.iter().filter(|p| has_gate(p)) {
        let view = pool_pod(p);
        if view.terminating {
            continue;
        }
        let want = if view.drained {
            Some("False")
        } else if view.signals().is_ready() {
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
            Ok(_) => on_write("Pod/status"),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(Error::kube("set serving condition", e)),
        }
    }
    Ok(())
}
