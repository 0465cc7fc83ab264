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

fn census(pods: &[Arc<Pod>], spec: Option<&DrainSpec>) -> Census {
    let views: Vec<_> = pods
        .iter()
        .map(|p| pool_pod(p))
        .filter(|p| !p.terminating)
        .collect();
    let ready = views.iter().filter(|p| p.signals().is_ready()).count() as u32;
    Census {
        drained: views.iter().filter(|p| p.drained).count() as u32,
        bound: spec.map_or(0, |s| s.bound(ready)),
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

/// How the drain acts on the pool's pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acting {
    /// Drains, undrains and readiness gates are written.
    Enforce,
    /// Observe mode: only the readiness gates are written (nothing is
    /// drained or undrained).
    Observe,
    /// An older profile acts on the same workload: nothing is written.
    Outranked,
}

/// A drain write the API server refused: which (`drain pod P`, `list the
/// pool's pods`) and its error.
pub type DrainRefused = (String, Error);

/// Carries out the decision's drain on the pool's pods and returns it as
/// carried out: drains and undrains written, candidates refused (by the
/// bound re-checked against the newest state, by readiness, by a race), the
/// drained count and the bound after this step. `cached` is the pod watch's
/// copy of the pool: what a step that writes nothing counts from. In observe
/// mode ([`Acting::Observe`]) no pod is drained or undrained (every drain is
/// refused with `Observe`) but the readiness gates are set, so pods with
/// lanekeeper's gate become ready; a profile another one outranks on the
/// workload ([`Acting::Outranked`]) writes nothing at all and refuses every
/// drain with `ProfileTargetsWorkload`. Without a drain spec (`spec` None) nothing is
/// drained, the engine's undrains (`Disabled`) release what is, and the
/// readiness gates are still set. A write the API server refuses ends the
/// step: what was written before it is returned with the refusal.
#[allow(clippy::too_many_arguments)]
pub async fn actuate(
    api: &Api<Pod>,
    pod_selector: &Selector,
    spec: Option<&DrainSpec>,
    decided: &Drain,
    cached: &[Arc<Pod>],
    acting: Acting,
    now: i64,
    mut on_write: impl FnMut(&str),
) -> (Drain, Option<DrainRefused>) {
    let mut done: Vec<PodDrain> = decided
        .actions
        .iter()
        .filter(|a| matches!(a.action, DrainAction::Keep | DrainAction::Refused))
        .cloned()
        .collect();
    let why = match acting {
        Acting::Enforce => None,
        Acting::Observe => Some(DrainReason::Observe),
        Acting::Outranked => Some(DrainReason::ProfileTargetsWorkload),
    };
    if let Some(why) = why {
        done.extend(
            decided
                .actions
                .iter()
                .filter(|a| a.action == DrainAction::Drain)
                .map(|a| refused(a, why.clone())),
        );
        let gates = match acting {
            Acting::Observe => set_gates(api, cached, now, &mut on_write).await.err(),
            _ => None,
        };
        return (carried(done, cached, spec), gates);
    }
    let step = Step {
        api,
        selector: pod_selector.to_string(),
        spec,
        decided,
        now,
    };
    match step.write(cached, &mut done, &mut on_write).await {
        Ok(pods) => (carried(done, pods.as_deref().unwrap_or(cached), spec), None),
        // The count as the watch has it: the next step reads it afresh.
        Err(e) => (carried(done, cached, spec), Some(e)),
    }
}

/// The decision's drain without its writes (a refusal still backing off):
/// what it keeps and refuses, counted from the pod watch's copy.
pub fn unwritten(spec: Option<&DrainSpec>, decided: &Drain, cached: &[Arc<Pod>]) -> Drain {
    let kept = decided
        .actions
        .iter()
        .filter(|a| matches!(a.action, DrainAction::Keep | DrainAction::Refused))
        .cloned()
        .collect();
    carried(kept, cached, spec)
}

/// The drain as carried out, counted on `pods`.
fn carried(mut done: Vec<PodDrain>, pods: &[Arc<Pod>], spec: Option<&DrainSpec>) -> Drain {
    let c = census(pods, spec);
    done.sort_by(|a, b| a.pod.cmp(&b.pod));
    Drain {
        actions: done,
        drained_pods: c.drained,
        drain_budget: c.bound,
    }
}

/// One step's writes on the pool.
struct Step<'a> {
    api: &'a Api<Pod>,
    selector: String,
    spec: Option<&'a DrainSpec>,
    decided: &'a Drain,
    now: i64,
}

impl Step<'_> {
    fn wants(&self, action: DrainAction) -> impl Iterator<Item = &PodDrain> {
        self.decided
            .actions
            .iter()
            .filter(move |a| a.action == action)
    }

    async fn fresh(&self) -> Result<Vec<Arc<Pod>>, DrainRefused> {
        fresh_pods(self.api, &self.selector)
            .await
            .map_err(|e| ("list the pool's pods".to_owned(), e))
    }

    /// Undrains, drains, then readiness gates; the pods as listed after
    /// them when this step went to the API server (None: it did not).
    async fn write(
        &self,
        cached: &[Arc<Pod>],
        done: &mut Vec<PodDrain>,
        on_write: &mut impl FnMut(&str),
    ) -> Result<Option<Vec<Arc<Pod>>>, DrainRefused> {
        let undrained = self.undrain(done, on_write).await?;
        let drained = self.drain(done, on_write).await?;
        if !(undrained || drained) {
            set_gates(self.api, cached, self.now, on_write).await?;
            return Ok(None);
        }
        let pods = self.fresh().await?;
        set_gates(self.api, &pods, self.now, on_write).await?;
        Ok(Some(pods))
    }

    /// Undrains first: they only free slots. Whether there were any.
    async fn undrain(
        &self,
        done: &mut Vec<PodDrain>,
        on_write: &mut impl FnMut(&str),
    ) -> Result<bool, DrainRefused> {
        if self.wants(DrainAction::Undrain).next().is_none() {
            return Ok(false);
        }
        let pods = self.fresh().await?;
        for a in self.wants(DrainAction::Undrain) {
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
            match patch_as_listed(self.api, p, metadata, "undrain pod").await {
                Ok(Written::Done) => {
                    on_write("Pod");
                    done.push(a.clone());
                }
                Ok(Written::Raced) => {
                    tracing::info!(pod = %a.pod, "pod changed while undraining; retried at the next evaluation");
                }
                Err(e) => return Err((format!("undrain pod {}", a.pod), e)),
            }
        }
        Ok(true)
    }

    /// Drains, each re-checking the bound against the newest state. Whether
    /// there were any.
    async fn drain(
        &self,
        done: &mut Vec<PodDrain>,
        on_write: &mut impl FnMut(&str),
    ) -> Result<bool, DrainRefused> {
        let mut any = false;
        for a in self.wants(DrainAction::Drain) {
            any = true;
            let pods = self.fresh().await?;
            let c = census(&pods, self.spec);
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
                let (drained, bound) = (c.drained, c.bound);
                done.push(refused(a, DrainReason::BudgetExhausted { drained, bound }));
                continue;
            }
            let metadata = json!({
                "labels": {DRAIN_LABEL: "true"},
                "annotations": {DRAINED_AT_ANNOTATION: rfc3339(self.now), DRAIN_REASON_ANNOTATION: a.reason.to_string()},
            });
            match patch_as_listed(self.api, p, metadata, "drain pod").await {
                Ok(Written::Done) => {
                    on_write("Pod");
                    done.push(a.clone());
                }
                Ok(Written::Raced) => done.push(refused(a, DrainReason::Conflict)),
                Err(e) => return Err((format!("drain pod {}", a.pod), e)),
            }
        }
        Ok(any)
    }
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
) -> Result<(), DrainRefused> {
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
            Err(e) => {
                let what = format!("set the serving condition of pod {}", p.name_any());
                return Err((what, Error::kube("set serving condition", e)));
            }
        }
    }
    Ok(())
}
