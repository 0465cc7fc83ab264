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
        // No drain spec: nothing is drained (previous drains are released).
        // No signals: nothing known about any pod; keep what is drained.
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
        return (drain, drained);
    };
    let threshold = spec.error_ratio_above.value();
    let ready = sig.ready_pods();
    let budget = bound(spec, ready);
    let healthy_for = spec.healthy_for_seconds;

    let mut actions = Vec::new();
    let mut drained: BTreeMap<String, DrainedPod> = BTreeMap::new();
    // 1. Previously drained pods: gone pods leave; healthy ones are undrained
    //    after the window.
    for (name, d) in prev {
        let Some(pod) = sig.pods.get(name) else {
            continue;
        };
        let err = pod.error_ratio;
        let mut d = d.clone();
        let requested = pod.drain_requested == Some(true);
        let outdated = sig.is_outdated(pod);
        if requested {
            // Stays drained while the request stands.
            d.healthy_since = None;
            drained.insert(name.clone(), d);
            continue;
        }
        if !outdated
            && !hold
            && d.reason == DrainReason::Requested
            && err.is_none_or(|e| e <= threshold)
        {
            // The request was withdrawn and no evidence says the pod is bad.
            actions.push(PodDrain {
                pod: name.clone(),
                action: DrainAction::Undrain,
                error_ratio: err,
                reason: DrainReason::RequestWithdrawn,
            });
            continue;
        }
        match err {
            Some(e) if e <= threshold => {
                let since = d.healthy_since.unwrap_or(at);
                if at - since >= healthy_for && !hold && !outdated {
                    actions.push(PodDrain {
                        pod: name.clone(),
                        action: DrainAction::Undrain,
                        error_ratio: err,
                        reason: DrainReason::Healthy {
                            threshold,
                            seconds: at - since,
                        },
                    });
                    continue;
                }
                d.healthy_since = Some(since);
            }
            Some(_) => d.healthy_since = None,
            None => {} // no evidence: neither drained nor undrained
        }
        drained.insert(name.clone(), d);
    }
    // 2. Over the bound (pods left, readiness dropped): undrain the
    //    healthiest first so the bound and minServing hold (pods of the
    //    current revision before outdated ones).
    let outdated = |n: &str| sig.pods.get(n).is_some_and(|p| sig.is_outdated(p));
    if drained.len() as u32 > budget {
        let mut order: Vec<(String, bool, f64)> = drained
            .keys()
            .map(|n| {
                (
                    n.clone(),
                    outdated(n),
                    sig.pods
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
    for (name, d) in &drained {
        actions.push(PodDrain {
            pod: name.clone(),
            action: DrainAction::Keep,
            error_ratio: sig.pods.get(name).and_then(|p| p.error_ratio),
            reason: if outdated(name) {
                DrainReason::OutdatedRevision
            } else {
                d.reason.clone()
            },
        });
    }
    // 3. New candidates within the bound: requested drains first, then the
    //    worst error ratios, ties by name.
    let mut candidates: Vec<(&String, bool, f64)> = sig
        .pods
        .iter()
        .filter(|(n, p)| p.is_ready() && !drained.contains_key(*n) && !prev.contains_key(*n))
        .filter_map(|(n, p)| {
            let requested = p.drain_requested == Some(true);
            let bad = p.error_ratio.filter(|e| *e > threshold);
            (requested || bad.is_some()).then(|| (n, requested, p.error_ratio.unwrap_or(0.0)))
        })
        .collect();
    candidates.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then_with(|| b.2.total_cmp(&a.2))
            .then_with(|| a.0.cmp(b.0))
    });
    for (name, requested, err) in candidates {
        let err_known = sig.pods.get(name).and_then(|p| p.error_ratio);
        let reason = if requested {
            DrainReason::Requested
        } else {
            DrainReason::ErrorRatio {
                ratio: err,
                threshold,
            }
        };
        let rollout = sig.rollout_in_progress == Some(true);
        if may_drain && !rollout && (drained.len() as u32) < budget {
            drained.insert(
                name.clone(),
                DrainedPod {
                    since: at,
                    reason: reason.clone(),
                    healthy_since: None,
                },
            );
            actions.push(PodDrain {
                pod: name.clone(),
                action: DrainAction::Drain,
                error_ratio: err_known,
                reason,
            });
        } else {
            actions.push(PodDrain {
                pod: name.clone(),
                action: DrainAction::Refused,
                error_ratio: err_known,
                reason: if rollout {
                    DrainReason::RolloutInProgress
                } else if may_drain {
                    DrainReason::BudgetExhausted {
                        drained: drained.len() as u32,
                        bound: budget,
                    }
                } else {
                    DrainReason::Held
                },
            });
        }
    }
    actions.sort_by(|a, b| a.pod.cmp(&b.pod));
    let drain = Drain {
        drained_pods: drained.len() as u32,
        actions,
        drain_budget: budget,
    };
    (drain, drained)
}
