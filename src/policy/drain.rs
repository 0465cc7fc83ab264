//! The bounded readiness drain.
//!
//! At most min(floor(maxDrained × ready pods), ready pods − minServing) pods
//! are drained at once (never negative). Candidates are pods whose error ratio
//! is above the threshold, worst first, ties by name. A drained pod stays
//! drained until it has looked healthy for `healthyForSeconds`. A pod with no
//! evidence in a step is neither drained nor undrained.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::api::DrainSpec;
use crate::snapshot::ProfileSignals;

use super::decision::{DrainAction, DrainedPod, PodDrain};

/// Reason prefix of drains asked for by annotation.
pub const REQUESTED: &str = "DrainRequested";

/// The drain result.
#[derive(Debug, Default, PartialEq)]
pub struct DrainOutcome {
    /// What happens to each pod involved.
    pub actions: Vec<PodDrain>,
    /// Drained pods after this step.
    pub drained: BTreeMap<String, DrainedPod>,
    /// How many are drained.
    pub drained_count: u32,
    /// The bound now.
    pub budget: u32,
}

/// `maxDrained` resolved against a number of ready pods (percent rounded
/// down). Malformed values allow nothing.
pub fn max_drained(spec: &IntOrString, ready: u32) -> u32 {
    match spec {
        IntOrString::Int(n) => (*n).max(0) as u32,
        IntOrString::String(s) => s
            .strip_suffix('%')
            .and_then(|p| p.trim().parse::<u64>().ok())
            .map_or(0, |p| (p.min(100) * u64::from(ready) / 100) as u32),
    }
}

/// The drain bound: min(maxDrained of ready, ready − minServing), >= 0.
pub fn bound(spec: &DrainSpec, ready: u32) -> u32 {
    let by_share = max_drained(&spec.max_drained, ready);
    let by_serving = i64::from(ready) - i64::from(spec.min_serving.max(0));
    by_share.min(by_serving.max(0) as u32)
}

/// Decides drains for one step. `may_drain` is false while telemetry is
/// unknown or the pool is scaling down (no new drains then).
pub fn decide(
    spec: Option<&DrainSpec>,
    signals: Option<&ProfileSignals>,
    at: i64,
    may_drain: bool,
    prev: &BTreeMap<String, DrainedPod>,
) -> DrainOutcome {
    let (Some(spec), Some(sig)) = (spec, signals) else {
        // No drain spec: nothing is drained (previous drains are released).
        // No signals: nothing known about any pod; keep what is drained.
        let drained = if spec.is_some() {
            prev.clone()
        } else {
            BTreeMap::new()
        };
        return DrainOutcome {
            drained_count: drained.len() as u32,
            actions: if spec.is_some() {
                Vec::new()
            } else {
                prev.keys()
                    .map(|p| PodDrain {
                        pod: p.clone(),
                        action: DrainAction::Undrain,
                        error_ratio: None,
                        reason: "DrainDisabled".into(),
                    })
                    .collect()
            },
            drained,
            budget: 0,
        };
    };
    let threshold = spec.error_ratio_above.value();
    let ready = sig.pods.values().filter(|p| p.ready != Some(false)).count() as u32;
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
        if requested {
            // Stays drained while the request stands.
            d.healthy_since = None;
            drained.insert(name.clone(), d);
            continue;
        }
        if d.reason.starts_with(REQUESTED) && err.is_none_or(|e| e <= threshold) {
            // The request was withdrawn and no evidence says the pod is bad.
            actions.push(PodDrain {
                pod: name.clone(),
                action: DrainAction::Undrain,
                error_ratio: err,
                reason: "DrainRequestWithdrawn".into(),
            });
            continue;
        }
        match err {
            Some(e) if e <= threshold => {
                let since = d.healthy_since.unwrap_or(at);
                if at - since >= healthy_for {
                    actions.push(PodDrain {
                        pod: name.clone(),
                        action: DrainAction::Undrain,
                        error_ratio: err,
                        reason: format!(
                            "Healthy: error ratio at or below {threshold} for {}s",
                            at - since
                        ),
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
    //    healthiest first so the bound and minServing hold.
    if drained.len() as u32 > budget {
        let mut order: Vec<(String, f64)> = drained
            .keys()
            .map(|n| {
                (
                    n.clone(),
                    sig.pods
                        .get(n)
                        .and_then(|p| p.error_ratio)
                        .unwrap_or(f64::INFINITY),
                )
            })
            .collect();
        order.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        let excess = drained.len() - budget as usize;
        for (name, err) in order.into_iter().take(excess) {
            drained.remove(&name);
            actions.push(PodDrain {
                pod: name,
                action: DrainAction::Undrain,
                error_ratio: err.is_finite().then_some(err),
                reason: format!("OverBound: at most {budget} pods may be drained"),
            });
        }
    }
    for (name, d) in &drained {
        actions.push(PodDrain {
            pod: name.clone(),
            action: DrainAction::Keep,
            error_ratio: sig.pods.get(name).and_then(|p| p.error_ratio),
            reason: d.reason.clone(),
        });
    }
    // 3. New candidates within the bound: requested drains first, then the
    //    worst error ratios, ties by name.
    let mut candidates: Vec<(&String, bool, f64)> = sig
        .pods
        .iter()
        .filter(|(n, p)| {
            p.ready != Some(false) && !drained.contains_key(*n) && !prev.contains_key(*n)
        })
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
            format!("{REQUESTED}: annotation lanekeeper.dev/drain-request")
        } else {
            format!("ErrorRatio: {err} > {threshold}")
        };
        if may_drain && (drained.len() as u32) < budget {
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
                reason: if may_drain {
                    format!(
                        "DrainBudgetExhausted: {} of {budget} drained",
                        drained.len()
                    )
                } else {
                    "DrainHeld: telemetry unknown or pool scaling down".to_owned()
                },
            });
        }
    }
    actions.sort_by(|a, b| a.pod.cmp(&b.pod));
    DrainOutcome {
        drained_count: drained.len() as u32,
        actions,
        drained,
        budget,
    }
}
