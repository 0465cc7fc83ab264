//! The degradation ladder: escalate on what persists, recover slower than
//! you fell, one level per stable window, people gate what users see, and
//! never relax on unknown data.

use std::collections::BTreeMap;

use crate::api::{
    Approval, ApprovalMode, DegradationPolicy, EnterWhen, ExitWhen, LevelSpec, MissingTelemetry,
};
use crate::snapshot::{LaneSignals, ProfileSignals};

use super::allocation::EPS;
use super::burn;
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
    /// Whether every lane's rate is known (demand is evidence, not held).
    pub lanes_known: bool,
    /// The profile's retry amplification (attempts ÷ originals), if known.
    pub retry_amplification: Option<f64>,
    /// Whether a retry signal some lane's source gives is unknown.
    pub retries_unknown: bool,
    /// Pool signals.
    pub signals: Option<&'a ProfileSignals>,
    /// Lane signals, keyed `namespace/name` (the burn rates).
    pub lanes: &'a BTreeMap<String, LaneSignals>,
    /// The profile's namespace (its lanes' keys).
    pub namespace: &'a str,
    /// The approval in force, if any.
    pub approval: Option<Approval>,
    /// The end of the released lanes' ramps (the next stable window starts no
    /// earlier).
    pub ramping_until: Option<i64>,
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
    /// Trigger-held-since for gated levels (the approval timeout's clock).
    pub gate_since: BTreeMap<u32, i64>,
    /// Trigger-held-since per level (the `forSeconds` clock).
    pub trigger_since: BTreeMap<u32, i64>,
    /// When the episode began (None at level 0).
    pub episode_since: Option<i64>,
    /// Whether the episode made its first step down.
    pub stepped_down: bool,
    /// Level waiting for approval.
    pub pending: Option<u32>,
    /// The transition made, if any.
    pub transition: Option<LevelTransition>,
    /// Triggers that held, `"<level>: <reason>"`.
    pub triggers: Vec<String>,
    /// The approval used to enter a gated level in this step.
    pub approval_consumed: Option<Approval>,
    /// An approval that lapsed (older than the level's `validForSeconds`).
    pub approval_lapsed: Option<Approval>,
}

/// A level's enter triggers in one evaluation.
#[derive(Clone, Debug, PartialEq)]
pub enum TriggerState {
    /// One holds, on known data: why.
    Holds(String),
    /// None holds, and every one was evaluated on known data.
    Clear,
    /// None holds, and one could not be evaluated (its data is unknown).
    Unknown,
}

/// Evaluates the enter triggers of `level` (1-based `k`).
pub fn trigger(level: &LevelSpec, k: u32, i: &LevelInputs<'_>) -> TriggerState {
    let e: &EnterWhen = &level.enter_when;
    let s = i.signals;
    let mut unknown = false;
    if e.over_capacity == Some(true) {
        match i.capacity {
            Some(c) if i.lanes_known => {
                let d = i.demand_after.get((k - 1) as usize).copied().unwrap_or(0.0);
                if d > c + EPS {
                    return TriggerState::Holds(format!(
                        "overCapacity: demand after lower levels {} > capacity {}",
                        round6(d),
                        round6(c)
                    ));
                }
            }
            _ => unknown = true,
        }
    }
    if let Some(t) = e.utilization_percent_above {
        match i.utilization {
            Some(u) if i.lanes_known => {
                if u > f64::from(t) + EPS {
                    return TriggerState::Holds(format!(
                        "utilizationPercentAbove: {}% > {t}%",
                        round6(u)
                    ));
                }
            }
            // Utilization is undefined while capacity is 0 or unknown.
            _ => unknown = true,
        }
    }
    match kv_cache_trigger(e.kv_cache_usage_above, s) {
        TriggerState::Holds(why) => return TriggerState::Holds(why),
        TriggerState::Unknown => unknown = true,
        TriggerState::Clear => {}
    }
    // A source reports its failures under the signal's name, the scrape
    // source under `scrape:<name>`.
    let failed = |name: &str| {
        s.is_some_and(|s| {
            s.unknown.contains_key(name) || s.unknown.contains_key(&format!("scrape:{name}"))
        })
    };
    let checks: [(Option<f64>, Option<f64>, &str, &str); 4] = [
        (
            e.in_flight_above.map(|x| x as f64),
            s.and_then(|s| s.in_flight),
            "inFlightAbove",
            "inFlight",
        ),
        (
            e.queue_depth_above.map(|x| x as f64),
            s.and_then(|s| s.queue_depth),
            "queueDepthAbove",
            "queueDepth",
        ),
        (
            e.p95_latency_seconds_above.as_ref().map(|d| d.value()),
            s.and_then(|s| s.p95_latency_seconds),
            "p95LatencySecondsAbove",
            "p95LatencySeconds",
        ),
        (
            e.error_ratio_above.as_ref().map(|d| d.value()),
            s.and_then(|s| s.error_ratio),
            "errorRatioAbove",
            "errorRatio",
        ),
    ];
    for (thr, v, name, signal) in checks {
        let Some(t) = thr else { continue };
        match v {
            Some(v) if v > t + EPS => {
                return TriggerState::Holds(format!("{name}: {} > {}", round6(v), round6(t)));
            }
            Some(_) => {}
            // Reported Unknown by its source: no evidence either way. A signal
            // nobody provides at all is no missing data: the trigger never
            // holds and does not pin the level.
            None if failed(signal) => unknown = true,
            None => {}
        }
    }
    if let Some(t) = e.retry_amplification_above.as_ref().map(|d| d.value()) {
        match i.retry_amplification {
            Some(a) if a > t + EPS => {
                return TriggerState::Holds(format!(
                    "retryAmplificationAbove: {} > {}",
                    round6(a),
                    round6(t)
                ));
            }
            // Calm over the lanes measured says nothing of a lane whose
            // retries (or rate) went missing: that may be the storming one.
            _ if i.retries_unknown || !i.lanes_known => unknown = true,
            _ => {}
        }
    }
    if let Some(b) = &e.burn_rate_above {
        match burn::holds(b, i.namespace, i.lanes) {
            burn::TriggerState::Clear => {}
            burn::TriggerState::Unknown => unknown = true,
            burn::TriggerState::Holds(why) => return TriggerState::Holds(why),
        }
    }
    if unknown {
        TriggerState::Unknown
    } else {
        TriggerState::Clear
    }
}

/// `kvCacheUsageAbove`: asked for and missing is Unknown, whatever the
/// reason (no source configured included).
fn kv_cache_trigger(threshold: Option<i32>, s: Option<&ProfileSignals>) -> TriggerState {
    let Some(t) = threshold else {
        return TriggerState::Clear;
    };
    match s.and_then(|s| s.kv_cache_usage_percent) {
        Some(v) if v > f64::from(t) + EPS => {
            TriggerState::Holds(format!("kvCacheUsageAbove: {}% > {t}%", round6(v)))
        }
        Some(_) => TriggerState::Clear,
        None => TriggerState::Unknown,
    }
}

/// Whether every `exitWhen` condition holds (an unknown signal does not hold).
pub fn exit_conditions_hold(x: Option<&ExitWhen>, i: &LevelInputs<'_>) -> bool {
    let Some(x) = x else { return true };
    let s = i.signals;
    let below = |thr: Option<f64>, v: Option<f64>| match thr {
        None => true,
        Some(t) => v.is_some_and(|v| v < t - EPS),
    };
    below(
        x.utilization_percent_below.map(f64::from),
        i.utilization.filter(|_| i.lanes_known),
    ) && below(
        x.in_flight_below.map(|v| v as f64),
        s.and_then(|s| s.in_flight),
    ) && below(
        x.queue_depth_below.map(|v| v as f64),
        s.and_then(|s| s.queue_depth),
    ) && below(
        x.p95_latency_seconds_below.as_ref().map(|d| d.value()),
        s.and_then(|s| s.p95_latency_seconds),
    ) && below(
        x.error_ratio_below.as_ref().map(|d| d.value()),
        s.and_then(|s| s.error_ratio),
    ) && below(
        x.kv_cache_usage_below.map(f64::from),
        s.and_then(|s| s.kv_cache_usage_percent),
    )
}

/// The approval in force: not lapsed (younger than the approved level's
/// `validForSeconds`) and not already used. Returns it, or the lapsed one.
fn valid_approval(
    levels: &[LevelSpec],
    i: &LevelInputs<'_>,
    prev: &ProfileState,
) -> (Option<Approval>, Option<Approval>) {
    let Some(a) = i.approval else {
        return (None, None);
    };
    if prev.approval_used == Some(a) {
        return (None, None);
    }
    let valid_for = levels.get((a.level.max(1) - 1) as usize).map_or(
        crate::api::DEFAULT_APPROVAL_VALID_FOR,
        LevelSpec::approval_valid_for,
    );
    match a.given_at {
        Some(g) if i.at - g >= valid_for => (None, Some(a)),
        _ => (Some(a), None),
    }
}

/// What one step of the ladder reads.
struct LadderStep<'a> {
    policy: &'a DegradationPolicy,
    levels: &'a [LevelSpec],
    i: &'a LevelInputs<'a>,
    prev: &'a ProfileState,
    /// The previous level, clamped to the ladder (the policy may have lost
    /// levels).
    prev_level: u32,
}

/// Each level's enter triggers in one step.
struct Triggers {
    /// What each level's triggers say.
    states: Vec<TriggerState>,
    /// Whether each level's trigger has held on known data for its
    /// `forSeconds`.
    sustained: Vec<bool>,
}

impl Triggers {
    /// Why level `k`'s trigger holds, if it does.
    fn reason(&self, k: u32) -> Option<String> {
        match &self.states[(k - 1) as usize] {
            TriggerState::Holds(r) => Some(r.clone()),
            _ => None,
        }
    }
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
    let prev_level = prev.level.min(levels.len() as u32);
    let s = LadderStep {
        policy,
        levels,
        i,
        prev,
        prev_level,
    };
    let mut out = LadderOutcome {
        level: prev_level,
        level_since: prev.level_since,
        episode_since: prev.episode_since.filter(|_| prev_level > 0),
        stepped_down: prev.stepped_down && prev_level > 0,
        ..Default::default()
    };
    let (approval, lapsed) = valid_approval(levels, i, prev);
    out.approval_lapsed = lapsed;
    if i.capacity.is_none() {
        s.hold_unknown(&mut out);
        return out;
    }
    let triggers = s.triggers(&mut out);
    // The highest level whose trigger holds and has held long enough: where
    // the ladder wants to be.
    let wanted = (1..=levels.len() as u32)
        .rev()
        .find(|&k| triggers.sustained[(k - 1) as usize])
        .unwrap_or(0);
    let (blocked_at, used) = s.gates(wanted, approval, &mut out);
    let target = match blocked_at {
        Some(g) => wanted.min(g - 1),
        None => wanted,
    };
    out.pending = blocked_at;
    if target > prev_level {
        // The reason for entering `target`: its own trigger, else the higher
        // trigger that pulls the ladder up to the gate.
        let reason = triggers
            .reason(target)
            .or_else(|| {
                let r = triggers.reason(wanted)?;
                Some(format!("{r} (level {wanted} waits for approval)"))
            })
            .unwrap_or_default();
        s.step_up(target, reason, approval.filter(|_| used), &mut out);
    } else if prev_level > 0 {
        s.step_down(&triggers.states, &mut out);
    }
    out
}

impl LadderStep<'_> {
    /// Unknown telemetry: never step down; every clock (stable window,
    /// forSeconds, approval timeouts) restarts once telemetry is back.
    /// `onMissingTelemetry: EnterLevel` raises the level to its floor.
    fn hold_unknown(&self, out: &mut LadderOutcome) {
        let spec = &self.policy.spec;
        if spec.on_missing_telemetry != MissingTelemetry::EnterLevel {
            return;
        }
        let n = self.levels.len() as u32;
        let floor = (spec.missing_telemetry_level.unwrap_or(1).max(1) as u32).min(n);
        if floor > self.prev_level {
            let at = self.i.at;
            out.level = floor;
            out.level_since = Some(at);
            out.episode_since = out.episode_since.or(Some(at));
            out.transition = Some(LevelTransition {
                from: self.prev_level,
                to: floor,
                reason: "telemetry unknown (onMissingTelemetry: EnterLevel)".into(),
            });
        }
    }

    /// Reads every level's triggers; records those that hold and since when
    /// (the `forSeconds` clock).
    fn triggers(&self, out: &mut LadderOutcome) -> Triggers {
        let at = self.i.at;
        let states: Vec<TriggerState> = self
            .levels
            .iter()
            .enumerate()
            .map(|(idx, l)| trigger(l, idx as u32 + 1, self.i))
            .collect();
        for (idx, t) in states.iter().enumerate() {
            if let TriggerState::Holds(r) = t {
                out.triggers.push(format!("{}: {r}", idx + 1));
            }
        }
        // Sustained triggers: held on known data for forSeconds.
        let mut sustained = vec![false; self.levels.len()];
        for (idx, l) in self.levels.iter().enumerate() {
            if let TriggerState::Holds(_) = states[idx] {
                let k = idx as u32 + 1;
                let since = self.prev.trigger_since.get(&k).copied().unwrap_or(at);
                out.trigger_since.insert(k, since);
                sustained[idx] = at - since >= l.enter_when.for_seconds;
            }
        }
        Triggers { states, sustained }
    }

    /// Approval gates. Levels are cumulative, so going to `wanted` passes
    /// through every level below it: a gated level that is not approved stops
    /// the ladder just below it, whichever higher trigger pulls it up. A
    /// gate's clock (for Confirm's timeout) runs while the ladder wants to
    /// pass it. Returns the gate that stops the ladder, if any, and whether
    /// the approval is used to pass one.
    fn gates(
        &self,
        wanted: u32,
        approval: Option<Approval>,
        out: &mut LadderOutcome,
    ) -> (Option<u32>, bool) {
        let at = self.i.at;
        let mut blocked_at = None;
        let mut used = false;
        for (idx, l) in self.levels.iter().enumerate() {
            let k = idx as u32 + 1;
            let mode = l.approval_mode();
            if mode == ApprovalMode::Automatic || k <= self.prev_level || k > wanted {
                continue;
            }
            let since = self.prev.gate_since.get(&k).copied().unwrap_or(at);
            out.gate_since.insert(k, since);
            let approved = approval.is_some_and(|a| a.level >= k);
            let timed_out = mode == ApprovalMode::Confirm
                && at - since
                    >= l.approval
                        .as_ref()
                        .and_then(|a| a.timeout_seconds)
                        .unwrap_or(0);
            if blocked_at.is_none() {
                if approved && !timed_out {
                    used = true;
                }
                if !(approved || timed_out) {
                    blocked_at = Some(k);
                }
            }
        }
        (blocked_at, used)
    }

    /// Enters `target`, consuming the approval used to pass a gate.
    fn step_up(
        &self,
        target: u32,
        reason: String,
        consumed: Option<Approval>,
        out: &mut LadderOutcome,
    ) {
        let at = self.i.at;
        out.level = target;
        out.level_since = Some(at);
        out.exit_since = None;
        if self.prev_level == 0 {
            out.episode_since = Some(at);
            out.stepped_down = false;
        }
        out.approval_consumed = consumed;
        out.transition = Some(LevelTransition {
            from: self.prev_level,
            to: target,
            reason,
        });
    }

    /// Whether level `k` may be left: its triggers clear on known data, no
    /// higher level's trigger is on unknown data (it might hold: no evidence
    /// to leave this one either), every lane's rate is known, and its exit
    /// conditions hold.
    fn exit_ok(&self, states: &[TriggerState], k: u32) -> bool {
        let idx = (k - 1) as usize;
        states[idx] == TriggerState::Clear
            && states[idx..].iter().all(|t| *t != TriggerState::Unknown)
            && self.i.lanes_known
            && exit_conditions_hold(self.levels[idx].exit_when.as_ref(), self.i)
    }

    /// The way down: the level may be left ([`LadderStep::exit_ok`]) for the
    /// stable window (or, for an episode's first step down, the cool-down),
    /// and no released lane is still ramping. One level per step.
    fn step_down(&self, states: &[TriggerState], out: &mut LadderOutcome) {
        let (i, at, prev_level) = (self.i, self.i.at, self.prev_level);
        if !self.exit_ok(states, prev_level) || i.ramping_until.is_some_and(|r| r > at) {
            out.exit_since = None;
            return;
        }
        let since = self
            .prev
            .exit_since
            .unwrap_or(at)
            .max(i.ramping_until.unwrap_or(i64::MIN));
        if at - since < self.wait(since, out) {
            out.exit_since = Some(since);
            return;
        }
        let to = prev_level - 1;
        out.level = to;
        out.level_since = Some(at);
        out.transition = Some(LevelTransition {
            from: prev_level,
            to,
            reason: format!(
                "level {prev_level} ({}) exit held for {}s",
                self.levels[(prev_level - 1) as usize].name,
                at - since
            ),
        });
        if to == 0 {
            out.episode_since = None;
            out.stepped_down = false;
        } else {
            out.stepped_down = true;
        }
        // The window for the next level starts afresh now.
        out.exit_since = (to > 0 && self.exit_ok(states, to)).then_some(at);
    }

    /// How long the exit must hold, from `since`: the stable window, or for
    /// the episode's first step down the cool-down (`cooldownFactor` × the
    /// time degraded) when longer.
    fn wait(&self, since: i64, out: &LadderOutcome) -> i64 {
        let h = &self.policy.spec.hysteresis;
        let stable = h.stable_for_seconds;
        if out.stepped_down {
            return stable;
        }
        let degraded = since - out.episode_since.unwrap_or(since);
        let cool = (h.cooldown_factor.value() * degraded as f64).ceil() as i64;
        stable.max(cool)
    }
}
