//! The bounded readiness drain.
//!
//! At most min(floor(maxDrained × ready pods), ready pods − minServing) pods
//! are drained at once (never negative). Candidates are pods whose error ratio
//! is above the threshold, worst first, ties by name. A drained pod stays
//! drained until it has looked healthy for `healthyForSeconds`. A pod with no
//! evidence in a step is neither drained nor undrained.
//!
//! With the rollout in mind: no new drain while the pool rolls out a new
//! revision (`rolloutInProgress`; candidates are refused with
//! `RolloutInProgress`), and a drained pod made from an older revision than
//! the pool's current one is never undrained on health or a withdrawn
//! request: it stays drained (`OutdatedRevision`) until the rollout replaces
//! it. Only the bound itself releases one, and only after every drained pod
//! of the current revision.

use std::collections::BTreeMap;

use crate::api::DrainSpec;
use crate::snapshot::ProfileSignals;

use super::decision::{Drain, DrainAction, DrainReason, DrainedPod, PodDrain};

/// The drain bound: see [`DrainSpec::bound`].
pub fn bound(spec: &DrainSpec, ready: u32) -> u32 {
    spec.bound(ready)
}

/// What one step of the drain reads.
struct DrainStep<'a> {
    /// The profile's signals.
    sig: &'a ProfileSignals,
    /// The step's time.
    at: i64,
    /// A pod whose error ratio is above this is a candidate.
    threshold: f64,
    /// How long a drained pod must look healthy to be undrained.
    healthy_for: i64,
    /// The bound: most pods drained at once.
    budget: u32,
    /// Whether new drains may be made.
    may_drain: bool,
    /// Whether evidence is incomplete (no undrain for health).
    hold: bool,
}

/// Decides drains for one step: the drain, and the drained pods after it
/// (the engine's state). `may_drain` is false while telemetry is unknown or
/// the pool is scaling down (no new drains then). `hold` is true while
/// evidence is incomplete: no pod is undrained for health then (the bound
/// still holds: pods over it are released).
pub fn decide(
    spec: Option<&DrainSpec>,
    signals: Option<&ProfileSignals>,
    at: i64,
    may_drain: bool,
    hold: bool,
    prev: &BTreeMap<String, DrainedPod>,
) -> (Drain, BTreeMap<String, DrainedPod>) {
    let (Some(spec), Some(sig)) = (spec, signals) else {
        return without_evidence(spec, prev);
    };
    let step = DrainStep {
        sig,
        at,
        threshold: spec.error_ratio_above.value(),
        healthy_for: spec.healthy_for_seconds,
        budget: bound(spec, sig.ready_pods()),
        may_drain,
        hold,
    };
    let mut actions = Vec::new();
    // 1. Previously drained pods: gone pods leave; healthy ones are undrained
    //    after the window.
    let mut drained: BTreeMap<String, DrainedPod> = prev
        .iter()
        .filter_map(|(name, d)| {
            step.revisit(name, d, &mut actions)
                .map(|d| (name.clone(), d))
        })
        .collect();
    // 2. Over the bound: the healthiest released; the rest kept.
    step.release_over_bound(&mut drained, &mut actions);
    step.keep(&drained, &mut actions);
    // 3. New candidates within the bound.
    step.drain_candidates(prev, &mut drained, &mut actions);
    actions.sort_by(|a, b| a.pod.cmp(&b.pod));
    let drain = Drain {
        drained_pods: drained.len() as u32,
        actions,
        drain_budget: step.budget,
    };
    (drain, drained)
}

/// No drain spec: nothing is drained (previous drains are released). No
/// signals: nothing known about any pod; keep what is drained.
fn without_evidence(
    spec: Option<&DrainSpec>,
    prev: &BTreeMap<String, DrainedPod>,
) -> (Drain, BTreeMap<String, DrainedPod>) {
    let drained = if spec.is_some() {
        prev.clone()
    } else {
        BTreeMap::new()
    };
    let drain = Drain {
        drained_pods: drained.len() as u32,
        actions: if spec.is_some() {
            Vec::new()
        } else {
            prev.keys()
                .map(|p| PodDrain {
                    pod: p.clone(),
                    action: DrainAction::Undrain,
                    error_ratio: None,
                    reason: DrainReason::Disabled,
                })
                .collect()
        },
        drain_budget: 0,
    };
    (drain, drained)
}

impl DrainStep<'_> {
    /// A previously drained pod: what it is after this step (`None`: gone
    /// or undrained, with its action pushed).
    fn revisit(
        &self,
        name: &str,
        d: &DrainedPod,
        actions: &mut Vec<PodDrain>,
    ) -> Option<DrainedPod> {
        let pod = self.sig.pods.get(name)?;
        let (at, threshold) = (self.at, self.threshold);
        let err = pod.error_ratio;
        let mut d = d.clone();
        let requested = pod.drain_requested == Some(true);
        let outdated = self.sig.is_outdated(pod);
        if requested {
            // Stays drained while the request stands.
            d.healthy_since = None;
            return Some(d);
        }
        if !outdated
            && !self.hold
            && d.reason == DrainReason::Requested
            && err.is_none_or(|e| e <= threshold)
        {
            // The request was withdrawn and no evidence says the pod is bad.
            actions.push(PodDrain {
                pod: name.to_owned(),
                action: DrainAction::Undrain,
                error_ratio: err,
                reason: DrainReason::RequestWithdrawn,
            });
            return None;
        }
        match err {
            Some(e) if e <= threshold => {
                let since = d.healthy_since.unwrap_or(at);
                if at - since >= self.healthy_for && !self.hold && !outdated {
                    actions.push(PodDrain {
                        pod: name.to_owned(),
                        action: DrainAction::Undrain,
                        error_ratio: err,
                        reason: DrainReason::Healthy {
                            threshold,
                            seconds: at - since,
                        },
                    });
                    return None;
                }
                d.healthy_since = Some(since);
            }
            Some(_) => d.healthy_since = None,
            None => {} // no evidence: neither drained nor undrained
        }
        Some(d)
    }

    /// Whether the pod is of an older revision than the pool's current one.
    fn outdated(&self, name: &str) -> bool {
        self.sig
            .pods
            .get(name)
            .is_some_and(|p| self.sig.is_outdated(p))
    }

    /// Over the bound (pods left, readiness dropped): undrains the
    /// healthiest first so the bound and minServing hold (pods of the
    /// current revision before outdated ones).
    fn release_over_bound(
        &self,
        drained: &mut BTreeMap<String, DrainedPod>,
        actions: &mut Vec<PodDrain>,
    ) {
        let budget = self.budget;
        if drained.len() as u32 <= budget {
            return;
        }
        let mut order: Vec<(String, bool, f64)> = drained
            .keys()
            .map(|n| {
                (
                    n.clone(),
                    self.outdated(n),
                    self.sig
                        .pods
                        .get(n)
                        .and_then(|p| p.error_ratio)
                        .unwrap_or(f64::INFINITY),
                )
            })
            .collect();
        order.sort_by(|a, b| {
            a.1.cmp(&b.1)
                .then_with(|| a.2.total_cmp(&b.2))
                .then_with(|| a.0.cmp(&b.0))
        });
        let excess = drained.len() - budget as usize;
        for (name, _, err) in order.into_iter().take(excess) {
            drained.remove(&name);
            actions.push(PodDrain {
                pod: name,
                action: DrainAction::Undrain,
                error_ratio: err.is_finite().then_some(err),
                reason: DrainReason::OverBound { bound: budget },
            });
        }
    }

    /// A `Keep` action for each pod that stays drained.
    fn keep(&self, drained: &BTreeMap<String, DrainedPod>, actions: &mut Vec<PodDrain>) {
        for (name, d) in drained {
            actions.push(PodDrain {
                pod: name.clone(),
                action: DrainAction::Keep,
                error_ratio: self.sig.pods.get(name).and_then(|p| p.error_ratio),
                reason: if self.outdated(name) {
                    DrainReason::OutdatedRevision
                } else {
                    d.reason.clone()
                },
            });
        }
    }

    /// The new candidates: ready pods not drained before, with a drain
    /// request or an error ratio above the threshold; requested drains
    /// first, then the worst error ratios, ties by name.
    fn candidates(
        &self,
        prev: &BTreeMap<String, DrainedPod>,
        drained: &BTreeMap<String, DrainedPod>,
    ) -> Vec<(String, bool, f64)> {
        let mut candidates: Vec<(&String, bool, f64)> = self
            .sig
            .pods
            .iter()
            .filter(|(n, p)| p.is_ready() && !drained.contains_key(*n) && !prev.contains_key(*n))
            .filter_map(|(n, p)| {
                let requested = p.drain_requested == Some(true);
                let bad = p.error_ratio.filter(|e| *e > self.threshold);
                (requested || bad.is_some()).then(|| (n, requested, p.error_ratio.unwrap_or(0.0)))
            })
            .collect();
        candidates.sort_by(|a, b| {
            b.1.cmp(&a.1)
                .then_with(|| b.2.total_cmp(&a.2))
                .then_with(|| a.0.cmp(b.0))
        });
        candidates
            .into_iter()
            .map(|(n, requested, err)| (n.clone(), requested, err))
            .collect()
    }

    /// Drains the candidates within the bound; refuses the rest (the bound
    /// reached, a rollout under way, or no new drain allowed in this step).
    fn drain_candidates(
        &self,
        prev: &BTreeMap<String, DrainedPod>,
        drained: &mut BTreeMap<String, DrainedPod>,
        actions: &mut Vec<PodDrain>,
    ) {
        let rollout = self.sig.rollout_in_progress == Some(true);
        for (name, requested, err) in self.candidates(prev, drained) {
            let err_known = self.sig.pods.get(&name).and_then(|p| p.error_ratio);
            let reason = if requested {
                DrainReason::Requested
            } else {
                DrainReason::ErrorRatio {
                    ratio: err,
                    threshold: self.threshold,
                }
            };
            if self.may_drain && !rollout && (drained.len() as u32) < self.budget {
                drained.insert(
                    name.clone(),
                    DrainedPod {
                        since: self.at,
                        reason: reason.clone(),
                        healthy_since: None,
                    },
                );
                actions.push(PodDrain {
                    pod: name,
                    action: DrainAction::Drain,
                    error_ratio: err_known,
                    reason,
                });
            } else {
                let reason = if rollout {
                    DrainReason::RolloutInProgress
                } else if self.may_drain {
                    DrainReason::BudgetExhausted {
                        drained: drained.len() as u32,
                        bound: self.budget,
                    }
                } else {
                    DrainReason::Held
                };
                actions.push(PodDrain {
                    pod: name,
                    action: DrainAction::Refused,
                    error_ratio: err_known,
                    reason,
                });
            }
        }
    }
}
