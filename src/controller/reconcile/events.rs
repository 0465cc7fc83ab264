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
    profile_events(reported, decision, effects, unknown, &mut out);
    out
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
            "ContractOverride",
            super::super::status::join(&p.overrides),
        ));
    }
    if let Some(a) = p.consumed {
        out.push(note(
            Target::Policy,
            EventType::Normal,
            "ApprovalConsumed",
            format!("level fell below the approved level {a}: approval consumed"),
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
    if let Some(s) = &effects.scaled {
        out.push(Note {
            action: format!("Scale{}", s.to()),
            ..note(Target::Profile, EventType::Normal, "Scaled", s.to_string())
        });
    }
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
    if decision.telemetry == Telemetry::Unknown && was("TelemetryKnown") != Some("False") {
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
    if decision.telemetry == Telemetry::Known && was("TelemetryKnown") == Some("False") {
        out.push(note(
            Target::Profile,
            EventType::Normal,
            "TelemetryRestored",
            "capacity is known again".into(),
        ));
    }
    if let Some(c) = &effects.scaling_conflict
        && was("ScalingConflict") != Some("True")
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
