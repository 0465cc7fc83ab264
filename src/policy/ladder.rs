//! The degradation ladder: fast up, slow down, one level per stable window,
//! and hold on unknown telemetry.

use std::collections::BTreeMap;

use crate::api::{
    ApprovalMode, DegradationPolicy, EnterWhen, ExitWhen, LevelSpec, MissingTelemetry,
};
use crate::snapshot::ProfileSignals;

use super::admission::EPS;
use super::decision::{LevelTransition, ProfileState, round6};

/// What the ladder reads in one evaluation.
pub struct LevelInputs<'a> {
    /// The snapshot's time.
    pub at: i64,
    /// Capacity (None = unknown telemetry).
    pub capacity: Option<f64>,
    /// Demand ÷ capacity in percent.
    pub utilization: Option<f64>,
    /// `demand_after[k-1]`: total demand after the actions of levels 1..k-1.
    pub demand_after: &'a [f64],
    /// Pool signals.
    pub signals: Option<&'a ProfileSignals>,
    /// Highest approved level.
    pub approved: Option<u32>,
}

/// The ladder's result.
#[derive(Debug, Default)]
pub struct LadderOutcome {
    /// Level after this evaluation.
    pub level: u32,
    /// When it was entered.
    pub level_since: Option<i64>,
    /// Since when its exit condition has held.
    pub exit_since: Option<i64>,
    /// Trigger-held-since for gated levels.
    pub gate_since: BTreeMap<u32, i64>,
    /// Level waiting for approval.
    pub pending: Option<u32>,
    /// The transition made, if any.
    pub transition: Option<LevelTransition>,
    /// Triggers that held, `"<level>: <reason>"`.
    pub triggers: Vec<String>,
}

/// The first enter trigger of `level` (1-based `k`) that holds, as a reason.
pub fn enter_reason(level: &LevelSpec, k: u32, i: &LevelInputs<'_>) -> Option<String> {
    let e: &EnterWhen = &level.enter_when;
    let s = i.signals;
    if e.over_capacity == Some(true)
        && let Some(c) = i.capacity
    {
        let d = i.demand_after.get((k - 1) as usize).copied().unwrap_or(0.0);
        if d > c + EPS {
            return Some(format!(
                "overCapacity: demand after lower levels {} > capacity {}",
                round6(d),
                round6(c)
            ));
        }
    }
    if let (Some(t), Some(u)) = (e.utilization_percent_above, i.utilization)
        && u > f64::from(t) + EPS
    {
        return Some(format!("utilizationPercentAbove: {}% > {t}%", round6(u)));
    }
    let above = |thr: Option<f64>, v: Option<f64>, name: &str| match (thr, v) {
        (Some(t), Some(v)) if v > t + EPS => Some(format!("{name}: {} > {}", round6(v), round6(t))),
        _ => None,
    };
    above(
        e.in_flight_above.map(|x| x as f64),
        s.and_then(|s| s.in_flight),
        "inFlightAbove",
    )
    .or_else(|| {
        above(
            e.queue_depth_above.map(|x| x as f64),
            s.and_then(|s| s.queue_depth),
            "queueDepthAbove",
        )
    })
    .or_else(|| {
        above(
            e.p95_latency_seconds_above.as_ref().map(|d| d.value()),
            s.and_then(|s| s.p95_latency_seconds),
            "p95LatencySecondsAbove",
        )
    })
    .or_else(|| {
        above(
            e.error_ratio_above.as_ref().map(|d| d.value()),
            s.and_then(|s| s.error_ratio),
            "errorRatioAbove",
        )
    })
}

/// Whether no enter trigger of a level reads a signal that its source
/// reported Unknown (listed in the snapshot's `unknown`). A level is never
/// left on such missing data: it is no evidence that the trigger stopped
/// holding. A signal nobody provides at all (no source configured for it) is
/// not missing data: a trigger on it simply never holds, and it does not pin
/// the level. Unknown capacity is covered by the Hold rule (it holds the
/// whole ladder).
pub fn enter_triggers_known(e: &EnterWhen, i: &LevelInputs<'_>) -> bool {
    // Utilization is undefined while capacity is 0: no evidence either way.
    if e.utilization_percent_above.is_some() && i.utilization.is_none() {
        return false;
    }
    let Some(s) = i.signals else { return true };
    let failed = |set: bool, name: &str| set && s.unknown.contains_key(name);
    !(failed(e.in_flight_above.is_some(), "inFlight")
        || failed(e.queue_depth_above.is_some(), "queueDepth")
        || failed(e.p95_latency_seconds_above.is_some(), "p95LatencySeconds")
        || failed(e.error_ratio_above.is_some(), "errorRatio"))
}

/// Whether every `exitWhen` condition holds (an unknown signal does not hold).
pub fn exit_conditions_hold(x: Option<&ExitWhen>, i: &LevelInputs<'_>) -> bool {
    let Some(x) = x else { return true };
    let s = i.signals;
    let below = |thr: Option<f64>, v: Option<f64>| match thr {
        None => true,
        Some(t) => v.is_some_and(|v| v < t - EPS),
    };
    below(x.utilization_percent_below.map(f64::from), i.utilization)
        && below(
            x.in_flight_below.map(|v| v as f64),
            s.and_then(|s| s.in_flight),
        )
        && below(
            x.queue_depth_below.map(|v| v as f64),
            s.and_then(|s| s.queue_depth),
        )
        && below(
            x.p95_latency_seconds_below.as_ref().map(|d| d.value()),
            s.and_then(|s| s.p95_latency_seconds),
        )
        && below(
            x.error_ratio_below.as_ref().map(|d| d.value()),
            s.and_then(|s| s.error_ratio),
        )
}

/// Advances the ladder by one evaluation.
pub fn step(
    policy: Option<&DegradationPolicy>,
    i: &LevelInputs<'_>,
    prev: &ProfileState,
) -> LadderOutcome {
    let Some(policy) = policy else {
        return LadderOutcome::default();
    };
    let levels = &policy.spec.levels;
    let n = levels.len() as u32;
    let at = i.at;
    // A previous level beyond the ladder (the policy lost levels) is clamped.
    let prev_level = prev.level.min(n);
    let mut out = LadderOutcome {
        level: prev_level,
        level_since: prev.level_since,
        ..Default::default()
    };

    if i.capacity.is_none() {
        // Unknown telemetry: never step down; the stable window restarts
        // once telemetry is back.
        if policy.spec.on_missing_telemetry == MissingTelemetry::EnterLevel {
            let floor = (policy.spec.missing_telemetry_level.unwrap_or(1).max(1) as u32).min(n);
            if floor > prev_level {
                out.level = floor;
                out.level_since = Some(at);
                out.transition = Some(LevelTransition {
                    from: prev_level,
                    to: floor,
                    reason: "telemetry unknown (onMissingTelemetry: EnterLevel)".into(),
                });
            }
        }
        out.gate_since = prev.gate_since.clone();
        return out;
    }

    let reasons: Vec<Option<String>> = levels
        .iter()
        .enumerate()
        .map(|(idx, l)| enter_reason(l, idx as u32 + 1, i))
        .collect();
    for (idx, r) in reasons.iter().enumerate() {
        if let Some(r) = r {
            out.triggers.push(format!("{}: {r}", idx + 1));
        }
    }

    // The highest level whose trigger holds: where the ladder wants to be.
    let wanted = (1..=n)
        .rev()
        .find(|&k| reasons[(k - 1) as usize].is_some())
        .unwrap_or(0);
    // Approval gates. Levels are cumulative, so going to `wanted` passes
    // through every level below it: a gated level that is not approved stops
    // the ladder just below it, whichever higher trigger pulls it up. A gate's
    // clock (for Confirm's timeout) runs while the ladder wants to pass it.
    let mut blocked_at = None;
    for (idx, l) in levels.iter().enumerate() {
        let k = idx as u32 + 1;
        if l.approval.mode == ApprovalMode::Automatic || k <= prev_level || k > wanted {
            continue;
        }
        let since = prev.gate_since.get(&k).copied().unwrap_or(at);
        out.gate_since.insert(k, since);
        let approved = i.approved.is_some_and(|a| a >= k);
        let allowed = match l.approval.mode {
            ApprovalMode::Automatic => true,
            ApprovalMode::Manual => approved,
            ApprovalMode::Confirm => {
                approved || at - since >= l.approval.timeout_seconds.unwrap_or(0)
            }
        };
        if !allowed && blocked_at.is_none() {
            blocked_at = Some(k);
        }
    }
    let target = match blocked_at {
        Some(g) => wanted.min(g - 1),
        None => wanted,
    };
    out.pending = blocked_at;
    // The reason for entering `target`: its own trigger, else the higher
    // trigger that pulls the ladder up to the gate.
    let reason_for = |t: u32| {
        reasons[(t - 1) as usize]
            .clone()
            .or_else(|| {
                reasons[(wanted - 1) as usize]
                    .as_ref()
                    .map(|r| format!("{r} (level {wanted} waits for approval)"))
            })
            .unwrap_or_default()
    };

    if target > prev_level {
        out.level = target;
        out.level_since = Some(at);
        out.exit_since = None;
        out.transition = Some(LevelTransition {
            from: prev_level,
            to: target,
            reason: reason_for(target),
        });
        return out;
    }
    if prev_level == 0 {
        return out;
    }

    let exit_ok = |k: u32| {
        let idx = (k - 1) as usize;
        reasons[idx].is_none()
            && enter_triggers_known(&levels[idx].enter_when, i)
            && exit_conditions_hold(levels[idx].exit_when.as_ref(), i)
    };
    if !exit_ok(prev_level) {
        out.exit_since = None;
        return out;
    }
    let since = prev.exit_since.unwrap_or(at);
    let stable = policy.spec.hysteresis.stable_for_seconds;
    if at - since >= stable {
        let to = prev_level - 1;
        out.level = to;
        out.level_since = Some(at);
        out.transition = Some(LevelTransition {
            from: prev_level,
            to,
            reason: format!(
                "level {prev_level} ({}) exit held for {}s",
                levels[(prev_level - 1) as usize].name,
                at - since
            ),
        });
        // The window for the next level starts afresh now.
        out.exit_since = (to > 0 && exit_ok(to)).then_some(at);
    } else {
        out.exit_since = Some(since);
    }
    out
}
