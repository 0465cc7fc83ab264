//! Events: which Kubernetes events one reconcile raises, as a pure function
//! of the statuses before and after, the decision and the effects
//! ([`events`], unit-tested without an API server), and their publication.
//!
//! kube's recorder folds events with the same type, reason, action and
//! object into one series and keeps the first note, so an event whose note
//! carries the news (a level change, a scale, one pod's drain) has an action
//! that names the outcome.

use std::collections::BTreeMap;

use kube::Resource;
use kube::runtime::events::{Event, EventType};

use super::super::context::{APPROVE_ANNOTATION, Context};
use super::super::status::{CALIBRATED, COST_CALIBRATED, IN_FLIGHT_FITS};
use super::actuate::Effects;
use super::report::Reported;
use crate::policy::{DrainAction, ProfileDecision, Telemetry};

/// Which object an event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The CapacityProfile.
    Profile,
    /// The governing DegradationPolicy.
    Policy,
    /// The n-th ignored policy (in the binding's order).
    Ignored(usize),
    /// The n-th lane (in the binding's order).
    Lane(usize),
}

/// One event to publish.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    /// About which object.
    pub target: Target,
    /// Normal or Warning.
    pub type_: EventType,
    /// CamelCase reason.
    pub reason: &'static str,
    /// The action (names the outcome where the note carries news).
    pub action: String,
    /// The message.
    pub note: String,
}

fn note(target: Target, type_: EventType, reason: &'static str, text: String) -> Note {
    Note {
        target,
        type_,
        reason,
        action: reason.to_owned(),
        note: text,
    }
}

fn condition<'a>(
    conditions: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// The events of one reconcile. `unknown` names the unknown signals with
/// their reasons.
pub fn events(
    reported: &Reported,
    decision: &ProfileDecision,
    effects: &Effects,
    unknown: &BTreeMap<String, String>,
) -> Vec<Note> {
    let mut out = Vec::new();
    if let Some(p) = &reported.policy {
        policy_events(p, &mut out);
    }
    for (i, ig) in reported.ignored.iter().enumerate() {
        if ig.written {
            out.push(note(
                Target::Ignored(i),
                EventType::Warning,
                "DuplicatePolicy",
                ig.problem.to_string(),
            ));
        }
    }
    if reported.committed {
        profile_events(reported, decision, effects, unknown, &mut out);
        calibration_events(reported, &mut out);
        in_flight_events(reported, &mut out);
    } else {
        out.extend(write_refused(
            &reported.profile_before,
            &reported.profile_after,
        ));
    }
    cost_events(reported, &mut out);
    out
}

/// The events of what actuation wrote: the scale, each pod drained and
/// undrained (published when done, whatever the report then does).
pub fn effect_events(effects: &Effects) -> Vec<Note> {
    let mut out = Vec::new();
    if let Some(s) = &effects.scaled {
        out.push(Note {
            action: format!("Scale{}", s.to()),
            ..note(Target::Profile, EventType::Normal, "Scaled", s.to_string())
        });
    }
    drain_events(effects, &mut out);
    out
}

/// A Warning `WriteRefused` when `Ready` turns `WriteRefused` or names
/// other refusals.
fn write_refused(
    before: &crate::api::CapacityProfileStatus,
    after: &crate::api::CapacityProfileStatus,
) -> Option<Note> {
    let c = condition(&after.conditions, "Ready").filter(|c| c.reason == "WriteRefused")?;
    let was = condition(&before.conditions, "Ready");
    if was.is_some_and(|o| o.reason == c.reason && o.message == c.message) {
        return None;
    }
    Some(note(
        Target::Profile,
        EventType::Warning,
        "WriteRefused",
        c.message.clone(),
    ))
}

/// On a lane: a Warning `CostUnderestimated` when `CostCalibrated` turns
/// False, a Normal `CostCalibrated` when it is True again.
fn cost_events(reported: &Reported, out: &mut Vec<Note>) {
    for (i, (before, after)) in reported.lanes.iter().enumerate() {
        let Some(c) = condition(&after.conditions, COST_CALIBRATED) else {
            continue;
        };
        let was = condition(&before.conditions, COST_CALIBRATED).map(|o| o.status.as_str());
        let (type_, reason) = match (c.status.as_str(), was) {
            ("False", w) if w != Some("False") => (EventType::Warning, "CostUnderestimated"),
            ("True", Some("False")) => (EventType::Normal, "CostCalibrated"),
            _ => continue,
        };
        out.push(note(Target::Lane(i), type_, reason, c.message.clone()));
    }
}

/// A Warning when `InFlightWatermarksFit` turns False (or names another
/// problem), a Normal event when it is True again.
fn in_flight_events(reported: &Reported, out: &mut Vec<Note>) {
    let (old, new) = (&reported.profile_before, &reported.profile_after);
    let Some(c) = condition(&new.conditions, IN_FLIGHT_FITS) else {
        return;
    };
    let was = condition(&old.conditions, IN_FLIGHT_FITS);
    if c.status == "False" && was.is_none_or(|o| o.status != "False" || o.reason != c.reason) {
        out.push(Note {
            action: format!("Check{}", c.reason),
            ..note(
                Target::Profile,
                EventType::Warning,
                "InFlightWatermarksMisfit",
                c.message.clone(),
            )
        });
    }
    if c.status == "True" && was.is_some_and(|o| o.status == "False") {
        out.push(note(
            Target::Profile,
            EventType::Normal,
            "InFlightWatermarksFit",
            c.message.clone(),
        ));
    }
}

fn policy_events(p: &super::report::PolicyReport, out: &mut Vec<Note>) {
    let (old, new) = (&p.before, &p.after);
    if old.approved_level != p.approved
        && let Some(a) = p.approved
    {
        out.push(note(
            Target::Policy,
            EventType::Normal,
            "ApprovalGranted",
            format!("levels up to {a} approved by annotation {APPROVE_ANNOTATION}"),
        ));
    }
    if let Some(level) = new.pending_approval_level
        && new.pending_approval_level != old.pending_approval_level
    {
        out.push(note(
            Target::Policy,
            EventType::Warning,
            "ApprovalPending",
            format!(
                "level {level} waits for approval: annotate the policy with {APPROVE_ANNOTATION}: \"{level}\""
            ),
        ));
    }
    let valid = |s: &crate::api::DegradationPolicyStatus| {
        condition(&s.conditions, "Valid").map(|c| c.message.clone())
    };
    if !p.overrides.is_empty() && valid(old) != valid(new) {
        out.push(note(
            Target::Policy,
            EventType::Warning,
            super::super::status::static_reason(&p.overrides).unwrap_or("ContractOverride"),
            super::super::status::join(&p.overrides),
        ));
    }
    if let Some(a) = p.consumed {
        out.push(note(
            Target::Policy,
            EventType::Normal,
            "ApprovalConsumed",
            format!(
                "the approval of levels up to {a} was used to enter level {}: consumed (annotation removed)",
                new.level
            ),
        ));
    }
    if let Some(a) = p.lapsed {
        out.push(note(
            Target::Policy,
            EventType::Warning,
            "ApprovalLapsed",
            format!(
                "the approval of levels up to {a} lapsed unused (older than approval.validForSeconds): annotation removed; approve again if still wanted"
            ),
        ));
    }
}

/// A Warning for each pod drained, a Normal event for each undrained.
fn drain_events(effects: &Effects, out: &mut Vec<Note>) {
    for a in effects.drain.iter().flat_map(|d| &d.actions) {
        let (type_, reason, verb, text) = match a.action {
            DrainAction::Drain => (
                EventType::Warning,
                "PodDrained",
                "Drain",
                "taken out of rotation",
            ),
            DrainAction::Undrain => (
                EventType::Normal,
                "PodUndrained",
                "Undrain",
                "back in rotation",
            ),
            _ => continue,
        };
        out.push(Note {
            action: format!("{verb}{}", a.pod),
            ..note(
                Target::Profile,
                type_,
                reason,
                format!("pod {} {text}: {}", a.pod, a.reason),
            )
        });
    }
}

/// `TelemetryUnknown` when telemetry turns Unknown (saying why), and
/// `TelemetryRestored` when it is known again; `known_before` is the
/// `TelemetryKnown` condition's status before.
fn telemetry_events(
    decision: &ProfileDecision,
    known_before: Option<&str>,
    unknown: &BTreeMap<String, String>,
    out: &mut Vec<Note>,
) {
    if decision.telemetry == Telemetry::Unknown && known_before != Some("False") {
        let why = unknown
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join("; ");
        out.push(note(
            Target::Profile,
            EventType::Warning,
            "TelemetryUnknown",
            format!("holding level {}: {why}", decision.level),
        ));
    }
    if decision.telemetry == Telemetry::Known && known_before == Some("False") {
        out.push(note(
            Target::Profile,
            EventType::Normal,
            "TelemetryRestored",
            "capacity is known again".into(),
        ));
    }
}

fn profile_events(
    reported: &Reported,
    decision: &ProfileDecision,
    effects: &Effects,
    unknown: &BTreeMap<String, String>,
    out: &mut Vec<Note>,
) {
    let (old, new) = (&reported.profile_before, &reported.profile_after);
    let was = |t: &str| condition(&old.conditions, t).map(|c| c.status.as_str());
    if let Some(t) = &decision.transition {
        let (type_, reason) = if t.to > t.from {
            (EventType::Warning, "LevelRaised")
        } else {
            (EventType::Normal, "LevelLowered")
        };
        out.push(Note {
            action: format!("SetLevel{}From{}", t.to, t.from),
            ..note(
                Target::Profile,
                type_,
                reason,
                format!(
                    "level {} -> {} ({}): {}",
                    t.from, t.to, decision.level_name, t.reason
                ),
            )
        });
    }
    out.extend(write_refused(old, new));
    band_events(reported, decision, out);
    telemetry_events(decision, was("TelemetryKnown"), unknown, out);
    if let Some(c) = &effects.scaling_conflict
        && condition(&old.conditions, "ScalingConflict")
            .is_none_or(|o| o.status != "True" || o.reason != c.reason())
    {
        out.push(note(
            Target::Profile,
            EventType::Warning,
            "ScalingConflict",
            c.to_string(),
        ));
    }
    if let Some(c) = condition(&new.conditions, "DrainBudgetExhausted")
        && c.status == "True"
        && condition(&old.conditions, "DrainBudgetExhausted")
            .is_none_or(|o| o.status != "True" || o.message != c.message)
    {
        out.push(note(
            Target::Profile,
            EventType::Warning,
            "DrainBudgetExhausted",
            c.message.clone(),
        ));
    }
}

/// A lane whose error-budget band changed: a Warning when it got worse, a
/// Normal event when it got better (on the profile, naming the lane).
fn band_events(reported: &Reported, decision: &ProfileDecision, out: &mut Vec<Note>) {
    let before = reported
        .profile_before
        .engine
        .as_ref()
        .map(|e| &e.objectives);
    for lane in &decision.lanes {
        let Some(o) = &lane.objective else { continue };
        let was = before.and_then(|b| b.get(&lane.name)).map(|b| b.band);
        if was == Some(o.band) {
            continue;
        }
        let worse = was.is_none_or(|w| o.band > w);
        let left = o
            .remaining_percent
            .map_or_else(|| "Unknown".to_owned(), |r| format!("{r} %"));
        let from = was.map_or("no band", |w| w.as_str());
        out.push(Note {
            action: format!("Budget{}", o.band.as_str()),
            ..note(
                Target::Profile,
                if worse {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                "BudgetBandChanged",
                format!(
                    "lane {}: error budget {from} -> {} (remaining {left})",
                    lane.name,
                    o.band.as_str()
                ),
            )
        });
    }
}

/// The calibration's events: a Warning saying what to re-measure when
/// `Calibrated` turns False (or says something new), a Normal one when it
/// is True again.
fn calibration_events(reported: &Reported, out: &mut Vec<Note>) {
    let (old, new) = (&reported.profile_before, &reported.profile_after);
    let Some(c) = condition(&new.conditions, CALIBRATED) else {
        return;
    };
    let was = condition(&old.conditions, CALIBRATED);
    if c.status == "False"
        && was.is_none_or(|o| o.status != "False" || o.reason != c.reason || o.message != c.message)
    {
        // The action names what changed, so a new pool change is a new
        // event rather than a repeat folded into the first one's series.
        let hash = new
            .observed_config_hash
            .as_deref()
            .and_then(|h| h.strip_prefix("sha256:"))
            .map(|h| format!("-{}", &h[..h.len().min(12)]))
            .filter(|_| c.reason == "PoolChanged")
            .unwrap_or_default();
        out.push(Note {
            action: format!("Remeasure{}{hash}", c.reason),
            ..note(
                Target::Profile,
                EventType::Warning,
                "CalibrationStale",
                c.message.clone(),
            )
        });
    }
    if c.status == "True" && was.is_some_and(|o| o.status == "False") {
        out.push(note(
            Target::Profile,
            EventType::Normal,
            "CalibrationValid",
            format!("the calibration describes the pool again: {}", c.message),
        ));
    }
}

/// Publishes one event about `obj`. A failure is logged, never fatal.
pub async fn publish<K: Resource<DynamicType = ()>>(ctx: &Context, obj: &K, n: &Note) {
    let ev = Event {
        type_: n.type_,
        reason: n.reason.into(),
        note: Some(n.note.chars().take(1000).collect()),
        action: n.action.clone(),
        secondary: None,
    };
    match ctx.recorder.publish(&ev, &obj.object_ref(&())).await {
        Ok(()) => ctx.metrics.write("Event", "create"),
        Err(e) => tracing::warn!(error = %e, reason = n.reason, "failed to publish event"),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use serde_json::json;

    use super::*;
    use crate::api::{CapacityProfileStatus, DegradationPolicyStatus, DrainReason};
    use crate::controller::reconcile::actuate::{Scaled, ScalingConflict};
    use crate::controller::reconcile::report::{IgnoredReport, PolicyReport};
    use crate::policy::{BindProblem, Drain, PodDrain, Warning};

    fn decision(level: u32, telemetry: &str, transition: Option<(u32, u32)>) -> ProfileDecision {
        serde_json::from_value(json!({
            "namespace": "ns", "name": "pool", "policy": "ns/ladder",
            "telemetry": telemetry, "level": level, "levelName": "shed",
            "pendingApprovalLevel": null, "levelSince": 0, "exitHoldingSince": null,
            "transition": transition.map(|(f, t)| json!({"from": f, "to": t, "reason": "utilizationPercentAbove: 98% > 95%"})),
            "triggers": [], "capacityUnitsPerSecond": 400.0, "capacitySource": "availableUnitsPerSecond",
            "demandUnitsPerSecond": 488.1, "admittedUnitsPerSecond": 400.1, "utilizationPercent": 122.0,
            "readyReplicas": null, "desiredReplicas": 11,
            "drain": [], "drainedPods": 0, "drainBudget": 0,
            "warnings": [], "gateway": {"rejectOptionalContext": false, "useFallbackRoutes": false,
                "readOnly": false, "staticFallback": false, "inFlight": null},
            "lanes": []
        }))
        .expect("a decision")
    }

    fn cond(type_: &str, status: &str, message: &str) -> Condition {
        serde_json::from_value(json!({
            "type": type_, "status": status, "reason": "R", "message": message,
            "lastTransitionTime": "2026-12-01T00:00:00Z"
        }))
        .unwrap()
    }

    fn profile(conds: Vec<Condition>) -> CapacityProfileStatus {
        CapacityProfileStatus {
            conditions: conds,
            ..Default::default()
        }
    }

    fn reasons(notes: &[Note]) -> Vec<&str> {
        notes.iter().map(|n| n.reason).collect()
    }

    #[test]
    fn an_underestimated_cost_is_a_warning_on_its_lane_once_and_its_fix_an_event() {
        let lane = |status: Option<&str>| crate::api::LaneContractStatus {
            conditions: status
                .map(|s| vec![cond(COST_CALIBRATED, s, "P95 cost 0.85")])
                .unwrap_or_default(),
            ..Default::default()
        };
        let run = |before: Option<&str>, after: Option<&str>| {
            let r = Reported {
                lanes: vec![(lane(None), lane(None)), (lane(before), lane(after))],
                ..steady()
            };
            events(
                &r,
                &decision(0, "Known", None),
                &Effects::default(),
                &BTreeMap::new(),
            )
        };
        for before in [None, Some("Unknown"), Some("True")] {
            let n = run(before, Some("False"));
            assert_eq!(reasons(&n), ["CostUnderestimated"], "{before:?}");
            assert_eq!(n[0].target, Target::Lane(1));
            assert_eq!(n[0].type_, EventType::Warning);
            assert_eq!(n[0].note, "P95 cost 0.85");
        }
        assert!(run(Some("False"), Some("False")).is_empty(), "said once");
        let back = run(Some("False"), Some("True"));
        assert_eq!(reasons(&back), ["CostCalibrated"]);
        assert_eq!(back[0].type_, EventType::Normal);
        for (before, after) in [
            (Some("False"), Some("Unknown")),
            (Some("Unknown"), Some("True")),
            (None, Some("Unknown")),
            (None, None),
        ] {
            assert!(run(before, after).is_empty(), "{before:?} -> {after:?}");
        }
    }

    fn steady() -> Reported {
        let st = profile(vec![cond(
            "TelemetryKnown",
            "True",
            "capacity from signals",
        )]);
        Reported {
            profile_before: st.clone(),
            profile_after: st,
            committed: true,
            ..Default::default()
        }
    }

    #[test]
    fn watermarks_that_do_not_fit_are_a_warning_once_and_their_fix_an_event() {
        let with = |status: &str, reason: &str| {
            let mut c = cond(IN_FLIGHT_FITS, status, &format!("{reason}: the words"));
            c.reason = reason.to_owned();
            profile(vec![c])
        };
        let at = |before: CapacityProfileStatus, after: CapacityProfileStatus| {
            let r = Reported {
                profile_before: before,
                profile_after: after,
                committed: true,
                ..Default::default()
            };
            events(
                &r,
                &decision(0, "Known", None),
                &Effects::default(),
                &Default::default(),
            )
        };
        let low = at(with("True", "Fit"), with("False", "StopAtBelowFullPool"));
        assert_eq!(reasons(&low), ["InFlightWatermarksMisfit"]);
        assert_eq!(low[0].type_, EventType::Warning);
        assert_eq!(low[0].note, "StopAtBelowFullPool: the words");
        assert_eq!(low[0].action, "CheckStopAtBelowFullPool");
        // First seen without a condition before: said too.
        assert_eq!(
            reasons(&at(profile(vec![]), with("False", "StopAtBelowFullPool"))),
            ["InFlightWatermarksMisfit"]
        );
        // Still the same problem (its figures move with demand): said once.
        assert!(
            at(
                with("False", "StopAtBelowFullPool"),
                with("False", "StopAtBelowFullPool")
            )
            .is_empty()
        );
        let other = at(
            with("False", "StopAtBelowFullPool"),
            with("False", "ResumeAtOrAboveConserve"),
        );
        assert_eq!(other[0].action, "CheckResumeAtOrAboveConserve");
        let fixed = at(with("False", "StopAtBelowFullPool"), with("True", "Fit"));
        assert_eq!(reasons(&fixed), ["InFlightWatermarksFit"]);
        assert_eq!(fixed[0].type_, EventType::Normal);
        assert!(at(with("True", "Fit"), with("True", "Fit")).is_empty());
    }

    #[test]
    fn nothing_changed_means_no_event() {
        let n = events(
            &steady(),
            &decision(2, "Known", None),
            &Effects::default(),
            &Default::default(),
        );
        assert!(n.is_empty(), "{n:?}");
    }

    fn with_band(band: Option<&str>, remaining: Option<f64>) -> ProfileDecision {
        let mut d = decision(0, "Known", None);
        d.lanes = vec![serde_json::from_value(json!({
            "namespace": "ns", "name": "p0", "priority": 0, "state": "Admitted",
            "requestsPerSecond": 1.0, "demandSource": "Observed", "demandUnitsPerSecond": 1.0,
            "admittedUnitsPerSecond": 1.0, "admittedRequestsPerSecond": 1.0,
            "borrowedUnitsPerSecond": 0.0, "reservedUnitsPerSecond": 0.0,
            "levelCapUnitsPerSecond": null, "limitedBy": null, "borrowing": [],
            "objective": band.map(|b| json!({"band": b, "remainingPercent": remaining, "since": 60})),
        }))
        .expect("a lane decision")];
        d
    }

    fn remembered(band: &str) -> Reported {
        let mut r = steady();
        let state: crate::api::ProfileState =
            serde_json::from_value(json!({"objectives": {"p0": {"band": band, "since": 0}}}))
                .unwrap();
        r.profile_before.engine = Some(state);
        r
    }

    #[test]
    fn a_band_change_is_an_event_naming_the_lane_and_a_steady_band_is_none() {
        let fx = Effects::default();
        let none = Default::default();
        let worse = events(
            &remembered("Cautious"),
            &with_band(Some("Restricted"), Some(14.5)),
            &fx,
            &none,
        );
        assert_eq!(reasons(&worse), ["BudgetBandChanged"]);
        assert_eq!(worse[0].type_, EventType::Warning);
        assert_eq!(worse[0].action, "BudgetRestricted");
        assert_eq!(
            worse[0].note,
            "lane p0: error budget Cautious -> Restricted (remaining 14.5 %)"
        );
        let better = events(
            &remembered("Exhausted"),
            &with_band(Some("Cautious"), Some(30.0)),
            &fx,
            &none,
        );
        assert_eq!(better[0].type_, EventType::Normal);
        let unknown = events(
            &remembered("Routine"),
            &with_band(Some("Restricted"), None),
            &fx,
            &none,
        );
        assert!(
            unknown[0].note.ends_with("(remaining Unknown)"),
            "{unknown:?}"
        );
        let same = events(
            &remembered("Cautious"),
            &with_band(Some("Cautious"), Some(40.0)),
            &fx,
            &none,
        );
        assert!(same.is_empty(), "{same:?}");
        let first = events(
            &steady(),
            &with_band(Some("Routine"), Some(90.0)),
            &fx,
            &none,
        );
        assert_eq!(
            first[0].note,
            "lane p0: error budget no band -> Routine (remaining 90 %)"
        );
        let without = events(&remembered("Cautious"), &with_band(None, None), &fx, &none);
        assert!(
            without.is_empty(),
            "a lane without an objective: {without:?}"
        );
    }

    #[test]
    fn a_level_change_names_its_outcome_in_the_action() {
        let up = events(
            &steady(),
            &decision(2, "Known", Some((0, 2))),
            &Effects::default(),
            &Default::default(),
        );
        assert_eq!(up.len(), 1);
        assert_eq!(
            (up[0].reason, up[0].type_),
            ("LevelRaised", EventType::Warning)
        );
        assert_eq!(up[0].action, "SetLevel2From0");
        assert_eq!(
            up[0].note,
            "level 0 -> 2 (shed): utilizationPercentAbove: 98% > 95%"
        );
        let down = events(
            &steady(),
            &decision(1, "Known", Some((2, 1))),
            &Effects::default(),
            &Default::default(),
        );
        assert_eq!(
            (down[0].reason, down[0].type_),
            ("LevelLowered", EventType::Normal)
        );
        assert_eq!(down[0].action, "SetLevel1From2");
    }

    #[test]
    fn telemetry_unknown_is_said_once_and_its_return_once() {
        let unknown = BTreeMap::from([(
            "availableUnitsPerSecond".to_owned(),
            "prometheus: timeout".to_owned(),
        )]);
        let first = events(
            &steady(),
            &decision(2, "Unknown", None),
            &Effects::default(),
            &unknown,
        );
        assert_eq!(reasons(&first), ["TelemetryUnknown"]);
        assert_eq!(
            first[0].note,
            "holding level 2: availableUnitsPerSecond: prometheus: timeout"
        );
        let mut still = steady();
        still.profile_before = profile(vec![cond("TelemetryKnown", "False", "x")]);
        assert!(
            events(
                &still,
                &decision(2, "Unknown", None),
                &Effects::default(),
                &unknown
            )
            .is_empty()
        );
        let back = events(
            &still,
            &decision(2, "Known", None),
            &Effects::default(),
            &unknown,
        );
        assert_eq!(reasons(&back), ["TelemetryRestored"]);
    }

    #[test]
    fn effects_raise_scale_drain_and_conflict_events() {
        let drained = PodDrain {
            pod: "pool-3".into(),
            action: DrainAction::Drain,
            error_ratio: Some(0.9),
            reason: DrainReason::ErrorRatio {
                ratio: 0.9,
                threshold: 0.2,
            },
        };
        let undrained = PodDrain {
            pod: "pool-1".into(),
            action: DrainAction::Undrain,
            error_ratio: Some(0.0),
            reason: DrainReason::Healthy {
                threshold: 0.2,
                seconds: 120,
            },
        };
        let kept = PodDrain {
            pod: "pool-2".into(),
            action: DrainAction::Keep,
            ..drained.clone()
        };
        let effects = Effects {
            scaled: Some(Scaled::Replicas {
                kind: "Deployment".into(),
                name: "pool".into(),
                from: Some(9),
                to: 11,
            }),
            scaling_conflict: Some(ScalingConflict::Hpa {
                hpa: "pool".into(),
                kind: "Deployment".into(),
                name: "pool".into(),
            }),
            drain: Some(Drain {
                actions: vec![undrained, kept, drained],
                drained_pods: 2,
                drain_budget: 2,
            }),
            ..Default::default()
        };
        let n = effect_events(&effects);
        assert_eq!(reasons(&n), ["Scaled", "PodUndrained", "PodDrained"]);
        let conflict = events(
            &steady(),
            &decision(2, "Known", None),
            &effects,
            &Default::default(),
        );
        assert_eq!(reasons(&conflict), ["ScalingConflict"]);
        assert_eq!(n[0].action, "Scale11");
        assert_eq!(n[0].note, "scaled Deployment pool from 9 to 11 replicas");
        assert_eq!(n[1].action, "Undrainpool-1");
        assert_eq!(
            n[2].note,
            "pod pool-3 taken out of rotation: ErrorRatio: 0.9 > 0.2"
        );
        // A conflict already reported is not repeated.
        let mut known = steady();
        let mut reported = cond("ScalingConflict", "True", "x");
        reported.reason = "HPATargetsWorkload".into();
        known.profile_before.conditions.push(reported);
        let again = events(
            &known,
            &decision(2, "Known", None),
            &Effects {
                scaling_conflict: effects.scaling_conflict.clone(),
                ..Default::default()
            },
            &Default::default(),
        );
        assert!(again.is_empty(), "{again:?}");
        // Another writer than the one reported is.
        let other = events(
            &known,
            &decision(2, "Known", None),
            &Effects {
                scaling_conflict: Some(ScalingConflict::Profile {
                    winner: "older".into(),
                    kind: "Deployment".into(),
                    name: "pool".into(),
                }),
                ..Default::default()
            },
            &Default::default(),
        );
        assert_eq!(reasons(&other), ["ScalingConflict"]);
        assert!(other[0].note.contains("CapacityProfile older"), "{other:?}");
    }

    #[test]
    fn a_refused_write_is_a_warning_when_it_starts_or_names_other_writes() {
        let ready = |reason: &str, m: &str| {
            let mut c = cond("Ready", "False", m);
            c.reason = reason.into();
            profile(vec![c])
        };
        let run = |before: CapacityProfileStatus, after: CapacityProfileStatus, committed| {
            let r = Reported {
                profile_before: before,
                profile_after: after,
                committed,
                ..Default::default()
            };
            events(
                &r,
                &decision(2, "Known", None),
                &Effects::default(),
                &Default::default(),
            )
        };
        let refused = ready("WriteRefused", "the API server refused: scale x to 9");
        // A ConfigMap refused (nothing committed) says so too.
        for committed in [true, false] {
            let n = run(steady().profile_before, refused.clone(), committed);
            assert_eq!(reasons(&n), ["WriteRefused"], "{committed}");
            assert_eq!(n[0].type_, EventType::Warning);
            assert_eq!(n[0].note, "the API server refused: scale x to 9");
        }
        assert!(run(refused.clone(), refused.clone(), true).is_empty());
        let other = ready("WriteRefused", "the API server refused: scale x to 10");
        assert_eq!(
            reasons(&run(refused.clone(), other, true)),
            ["WriteRefused"]
        );
        assert!(run(refused, steady().profile_after, true).is_empty());
        let unavailable = ready("ScaleTargetUnavailable", "x");
        assert!(run(steady().profile_before, unavailable, true).is_empty());
    }

    #[test]
    fn what_the_profile_status_commits_is_said_only_once_it_is_written() {
        let mut r = steady();
        r.committed = false;
        let n = events(
            &r,
            &decision(2, "Known", Some((0, 2))),
            &Effects::default(),
            &Default::default(),
        );
        assert!(n.is_empty(), "{n:?}");
    }

    #[test]
    fn drain_budget_exhausted_when_it_starts_or_its_candidates_change() {
        let exhausted = |m: &str| profile(vec![cond("DrainBudgetExhausted", "True", m)]);
        let mut r = steady();
        r.profile_after = exhausted("drain refused by the bound (maxDrained/minServing): pool-4");
        let n = events(
            &r,
            &decision(0, "Known", None),
            &Effects::default(),
            &Default::default(),
        );
        assert_eq!(reasons(&n), ["DrainBudgetExhausted"]);
        r.profile_before = r.profile_after.clone();
        assert!(
            events(
                &r,
                &decision(0, "Known", None),
                &Effects::default(),
                &Default::default()
            )
            .is_empty()
        );
        r.profile_after =
            exhausted("drain refused by the bound (maxDrained/minServing): pool-4, pool-5");
        assert_eq!(
            reasons(&events(
                &r,
                &decision(0, "Known", None),
                &Effects::default(),
                &Default::default()
            )),
            ["DrainBudgetExhausted"]
        );
    }

    #[test]
    fn a_stale_calibration_says_what_to_remeasure_once_and_its_return_once() {
        let cal = |status: &str, reason: &str, m: &str, hash: &str| {
            let mut c = cond("Calibrated", status, m);
            c.reason = reason.into();
            CapacityProfileStatus {
                conditions: vec![c],
                observed_config_hash: Some(hash.into()),
                ..Default::default()
            }
        };
        let run = |r: &Reported| {
            events(
                r,
                &decision(0, "Known", None),
                &Effects::default(),
                &Default::default(),
            )
        };
        let valid = cal(
            "True",
            "Valid",
            "the pod template matches configHash",
            "sha256:aaaa",
        );
        let changed = |h: &str| {
            cal(
                "False",
                "PoolChanged",
                &format!("the pool's pod template hashes to {h}: measure again"),
                h,
            )
        };
        let mut r = Reported {
            profile_before: valid.clone(),
            profile_after: changed("sha256:bbbbbbbbbbbbbbbbbbbb"),
            committed: true,
            ..Default::default()
        };
        let n = run(&r);
        assert_eq!(reasons(&n), ["CalibrationStale"]);
        assert_eq!(n[0].type_, EventType::Warning);
        assert_eq!(n[0].action, "RemeasurePoolChanged-bbbbbbbbbbbb");
        assert!(n[0].note.contains("measure again"), "{}", n[0].note);
        // Unchanged: no repeat.
        r.profile_before = r.profile_after.clone();
        assert!(run(&r).is_empty());
        // The pool changed again: a new event with its own action.
        r.profile_after = changed("sha256:cccccccccccccccccccc");
        let n = run(&r);
        assert_eq!(n[0].action, "RemeasurePoolChanged-cccccccccccc");
        // Expired: a different action.
        r.profile_before = valid.clone();
        r.profile_after = cal("False", "Expired", "expired: measure again", "sha256:aaaa");
        assert_eq!(run(&r)[0].action, "RemeasureExpired");
        // Valid again: once.
        r.profile_before = r.profile_after.clone();
        r.profile_after = valid.clone();
        let n = run(&r);
        assert_eq!(reasons(&n), ["CalibrationValid"]);
        assert_eq!(n[0].type_, EventType::Normal);
        r.profile_before = valid;
        assert!(run(&r).is_empty());
        // Unknown (no calibration) says nothing.
        r.profile_after = cal(
            "Unknown",
            "NoCalibration",
            "nothing to check",
            "sha256:aaaa",
        );
        assert!(run(&r).is_empty());
    }

    #[test]
    fn policy_events_follow_the_approval_and_the_overrides() {
        let before = DegradationPolicyStatus::default();
        let after = DegradationPolicyStatus {
            pending_approval_level: Some(3),
            conditions: vec![cond(
                "Valid",
                "False",
                "actions that lane contracts override: x",
            )],
            ..Default::default()
        };
        let mut r = steady();
        r.policy = Some(PolicyReport {
            before,
            after,
            approved: Some(2),
            overrides: vec![Warning::Text("x".into())],
            consumed: Some(2),
            lapsed: None,
        });
        r.ignored = vec![
            IgnoredReport {
                problem: BindProblem::IgnoredPolicy {
                    namespace: "ns".into(),
                    policy: "newer".into(),
                    winner: "ladder".into(),
                    profile: "pool".into(),
                },
                written: true,
            },
            IgnoredReport {
                problem: BindProblem::Text("unchanged".into()),
                written: false,
            },
        ];
        let n = events(
            &r,
            &decision(1, "Known", None),
            &Effects::default(),
            &Default::default(),
        );
        assert_eq!(
            reasons(&n),
            [
                "ApprovalGranted",
                "ApprovalPending",
                "ContractOverride",
                "ApprovalConsumed",
                "DuplicatePolicy"
            ]
        );
        assert!(n[..4].iter().all(|n| n.target == Target::Policy));
        assert_eq!(n[4].target, Target::Ignored(0));
        assert_eq!(
            n[1].note,
            "level 3 waits for approval: annotate the policy with lanekeeper.dev/approve-level: \"3\""
        );
        assert_eq!(
            n[4].note,
            "policy ns/newer is ignored: ladder already governs profile pool (the older policy wins)"
        );
    }
}
