//! `lanekeeper plan`: evaluate manifests against a signal timeline.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::api::FreezeState;
use crate::api::common::format_number;
use crate::policy::{
    self, Approvals, EngineState, Evaluation, LaneDecision, ProfileDecision, World, key,
};
use crate::snapshot::{ProfileSignals, SignalsFile, Snapshot};

mod gateway_configs;
mod objectives;

pub use gateway_configs::{EmittedConfig, emitted};
pub use objectives::ObjectiveSummary;

/// The plan: one evaluation per step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Evaluations in time order.
    pub steps: Vec<Evaluation>,
    /// Each lane with an objective over the timeline (absent without one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objectives: Vec<ObjectiveSummary>,
}

/// What `plan` says on stderr when it runs the default timeline.
pub const DEFAULT_TIMELINE_NOTE: &str = "note: no --signals: one step at t=0 assuming each pool measures its calibrated spec.capacity.safeUnitsPerSecond and each lane sends its expectedRequestsPerSecond (a what-if: the controller reads live signals, and without them says telemetry Unknown)";

/// The default timeline when no signals are given: the what-if "every pool
/// delivers its calibrated capacity" (`safeUnitsPerSecond`, docs/reference.md)
/// as one step at 0, with every lane's demand its
/// `expectedRequestsPerSecond`. It is a stated assumption, written into the
/// snapshot as a measurement, so the engine evaluates it like any other
/// step; `plan` prints [`DEFAULT_TIMELINE_NOTE`].
pub fn default_timeline(world: &World) -> SignalsFile {
    let mut snap = Snapshot::default();
    for p in &world.profiles {
        let k = key(
            p.metadata.namespace.as_deref().unwrap_or_default(),
            p.metadata.name.as_deref().unwrap_or_default(),
        );
        snap.profiles.insert(
            k,
            ProfileSignals {
                available_units_per_second: Some(p.spec.capacity.safe_units_per_second.value()),
                ..Default::default()
            },
        );
    }
    SignalsFile { steps: vec![snap] }
}

/// The notes for a signals timeline's keys that name no loaded object (a
/// misspelt lane would otherwise plan silently at its expected rate): one
/// per key, naming the first step that has it.
pub fn unmatched_signal_keys(world: &World, timeline: &SignalsFile) -> Vec<String> {
    let name = |m: &kube::api::ObjectMeta| {
        key(
            m.namespace.as_deref().unwrap_or_default(),
            m.name.as_deref().unwrap_or_default(),
        )
    };
    let profiles: BTreeSet<String> = world.profiles.iter().map(|p| name(&p.metadata)).collect();
    let lanes: BTreeSet<String> = world.lanes.iter().map(|l| name(&l.metadata)).collect();
    let mut seen = BTreeSet::new();
    let mut notes = Vec::new();
    for step in &timeline.steps {
        let unknown_profiles = step.profiles.keys().filter(|k| !profiles.contains(*k));
        let unknown_lanes = step.lanes.keys().filter(|k| !lanes.contains(*k));
        for (kind, k) in unknown_profiles
            .map(|k| ("profiles", k))
            .chain(unknown_lanes.map(|k| ("lanes", k)))
        {
            if seen.insert((kind, k.clone())) {
                notes.push(format!(
                    "signals {kind}.{k} (from the step at {}) name no loaded object: ignored",
                    step.at
                ));
            }
        }
    }
    notes
}

/// Evaluates every step, carrying the engine state from one to the next.
/// Approvals without a time are given at the first step (and lapse from
/// there); an approval given at `T` approves nothing before `T`.
pub fn plan(world: &World, timeline: &SignalsFile, approvals: &Approvals) -> Plan {
    let mut state = EngineState::default();
    let mut steps = Vec::with_capacity(timeline.steps.len());
    let first = timeline.steps.first().map_or(0, |s| s.at);
    for snap in &timeline.steps {
        let given: Approvals = approvals
            .iter()
            .map(|(k, a)| {
                let at = a.given_at.unwrap_or(first);
                (
                    k,
                    crate::api::Approval {
                        level: a.level,
                        given_at: Some(at),
                    },
                )
            })
            .filter(|(_, a)| a.given_at.is_some_and(|t| t <= snap.at))
            .map(|(k, a)| (k.clone(), a))
            .collect();
        let (eval, next) = policy::evaluate(world, snap, &given, &state);
        state = next;
        steps.push(eval);
    }
    let objectives = objectives::summaries(&world.lanes, &steps);
    Plan { steps, objectives }
}

fn num(v: f64) -> String {
    format_number(v)
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "unknown".to_owned(), num)
}

type LaneSignature = (String, &'static str, String, String, String);

fn lanes_signature(p: &ProfileDecision) -> Vec<LaneSignature> {
    p.lanes
        .iter()
        .map(|l| {
            (
                l.name.clone(),
                l.state.as_str(),
                num(l.demand_units_per_second),
                num(l.admitted_units_per_second),
                l.demand_source.clone(),
            )
        })
        .collect()
}

fn lane_row(l: &LaneDecision) -> String {
    let mut note = match (&l.limited_by, l.level_cap_units_per_second) {
        (Some(by), Some(cap)) if by == "level" => format!("level cap {}", num(cap)),
        (Some(by), _) => by.clone(),
        (None, _) => String::new(),
    };
    if l.demand_source == "Held" {
        if !note.is_empty() {
            note.push_str(", ");
        }
        note.push_str("rate unknown: demand held");
    }
    format!(
        "    {:<24} {:>3}  {:<9} {:>9} {:>9} {:>8}  {}\n",
        l.name,
        l.priority,
        l.state.as_str(),
        num(l.demand_units_per_second),
        num(l.admitted_units_per_second),
        num(l.borrowed_units_per_second),
        note
    )
}

/// Renders the plan for a human reading a pull request: one line per profile
/// and step; the lane table where the lanes changed; transitions, drains and
/// warnings as they happen.
pub fn render_table(plan: &Plan) -> String {
    let mut out = String::new();
    let mut last: std::collections::BTreeMap<String, Vec<LaneSignature>> = Default::default();
    let mut last_warnings: std::collections::BTreeMap<String, Vec<policy::Warning>> =
        Default::default();
    let mut last_calibration: std::collections::BTreeMap<
        String,
        (Option<policy::CalibrationStale>, bool),
    > = Default::default();
    let mut last_freeze: std::collections::BTreeMap<String, FreezeState> = Default::default();
    for step in &plan.steps {
        for w in &step.warnings {
            let _ = writeln!(out, "at {:>6}s  warning: {w}", step.at);
        }
        for p in &step.profiles {
            let k = format!("{}/{}", p.namespace, p.name);
            let _ = writeln!(
                out,
                "at {:>6}s  {k}  level {} ({})  telemetry {}  capacity {}  demand {}  admitted {}  util {}  replicas {}{}",
                step.at,
                p.level,
                p.level_name,
                if p.telemetry == policy::Telemetry::Known {
                    "Known"
                } else {
                    "Unknown"
                },
                opt(p.capacity_units_per_second),
                num(p.demand_units_per_second),
                num(p.admitted_units_per_second),
                p.utilization_percent.map_or_else(
                    || "unknown".to_owned(),
                    |u| format!("{}%", (u * 10.0).round() / 10.0)
                ),
                p.desired_replicas
                    .map_or_else(|| "unknown".to_owned(), |d| d.to_string()),
                p.pending_approval_level
                    .map(|l| format!("  pending approval: level {l}"))
                    .unwrap_or_default(),
            );
            if let Some(t) = &p.transition {
                let dir = if t.to > t.from { "UP" } else { "DOWN" };
                let _ = writeln!(
                    out,
                    "           {dir} level {} -> {}: {}",
                    t.from, t.to, t.reason
                );
            }
            let cal = (p.calibration_stale, p.calibration_held);
            if last_calibration.get(&k).copied().unwrap_or_default() != cal {
                let _ = match cal {
                    (Some(why), true) => writeln!(
                        out,
                        "           calibration stale: {} (onStaleCalibration Hold: capacity from calibration numbers is Unknown)",
                        why.as_str()
                    ),
                    (Some(why), false) => writeln!(
                        out,
                        "           calibration stale: {} (onStaleCalibration Warn)",
                        why.as_str()
                    ),
                    (None, _) => writeln!(out, "           calibration valid again"),
                };
                last_calibration.insert(k.clone(), cal);
            }
            let freeze = p.freeze.as_ref().map_or(FreezeState::Open, |f| f.state);
            let was = last_freeze.insert(k.clone(), freeze).unwrap_or_default();
            if was != freeze {
                let _ = writeln!(out, "           {}", freeze_line(was, p.freeze.as_ref()));
            }
            let sig = lanes_signature(p);
            if last.get(&k) != Some(&sig) {
                let _ = writeln!(
                    out,
                    "    {:<24} {:>3}  {:<9} {:>9} {:>9} {:>8}  LIMIT",
                    "LANE", "PRI", "STATE", "DEMAND", "ADMITTED", "BORROWED"
                );
                for l in &p.lanes {
                    out.push_str(&lane_row(l));
                }
                last.insert(k.clone(), sig);
            }
            for d in &p.drain.actions {
                if d.action != policy::DrainAction::Keep
                    || d.reason == policy::DrainReason::OutdatedRevision
                {
                    let _ = writeln!(
                        out,
                        "           drain: {:?} {} ({})",
                        d.action, d.pod, d.reason
                    );
                }
            }
            if last_warnings.get(&k) != Some(&p.warnings) {
                for w in &p.warnings {
                    let _ = writeln!(out, "           warning: {w}");
                }
                last_warnings.insert(k, p.warnings.clone());
            }
        }
    }
    for o in &plan.objectives {
        let _ = writeln!(out, "{}", objective_line(o));
    }
    out
}

/// One lane's objective over the timeline, for the table.
fn objective_line(o: &ObjectiveSummary) -> String {
    let budget = match (o.first_remaining_percent, o.last_remaining_percent) {
        (Some(a), Some(b)) => format!(
            "budget {}% -> {}% (used {}%), attainment {}%",
            num(a),
            num(b),
            num(a - b),
            opt(o.attainment_percent)
        ),
        _ => "budget unknown".to_owned(),
    };
    format!(
        "objective {}/{} {}%: {budget}, band {} (worst {})",
        o.namespace,
        o.name,
        num(o.within_deadline_percent),
        o.final_band.as_str(),
        o.worst_band.as_str()
    )
}

/// A change of a profile's freeze, for the table: the states and the lanes
/// that cause the new one with their bands.
fn freeze_line(was: FreezeState, now: Option<&policy::freeze::Freeze>) -> String {
    let state = now.map_or(FreezeState::Open, |f| f.state);
    let lanes: Vec<String> = now
        .map(|f| f.lanes.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|l| format!("lane {} is {}", l.name, l.band.as_str()))
        .collect();
    let cause = if state == FreezeState::Open || lanes.is_empty() {
        String::new()
    } else {
        format!(": {}", lanes.join(", "))
    };
    format!("freeze {} -> {}{cause}", was.as_str(), state.as_str())
}
