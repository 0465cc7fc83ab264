//! `lanekeeper diff`: the same scenarios and signal timelines under the base
//! and the head manifests, and what changes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use clap::ValueEnum;
use serde::Serialize;

use crate::api::common::format_number;
use crate::plan;
use crate::policy::{Approvals, Evaluation, GatewayFlags, LaneDecision, ProfileDecision, World};
use crate::snapshot::{SignalsFile, SignalsFileError};

use super::engine::{SimError, Strategy};
use super::report::LaneReport;
use crate::scenario;

/// Conditions `--fail-on` can gate on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailOn {
    /// A priority-0 lane completes a smaller share of requests within its
    /// deadline in some scenario (by more than 0.01 percentage points).
    P0DeadlineRegression,
    /// Any lane does (same tolerance).
    DeadlineRegression,
    /// The head produces a warning the base does not.
    NewWarnings,
    /// Any decision differs.
    DecisionChange,
    /// A profile changes level more often in some scenario.
    MoreTransitions,
}

impl FailOn {
    fn name(self) -> &'static str {
        match self {
            FailOn::P0DeadlineRegression => "p0-deadline-regression",
            FailOn::DeadlineRegression => "deadline-regression",
            FailOn::NewWarnings => "new-warnings",
            FailOn::DecisionChange => "decision-change",
            FailOn::MoreTransitions => "more-transitions",
        }
    }
}

/// Tolerance of a deadline regression, in percentage points.
pub const DEADLINE_TOLERANCE_PP: f64 = 0.01;

/// What changes between base and head.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Diff {
    /// Per scenario.
    pub scenarios: Vec<ScenarioDiff>,
    /// Per signal timeline.
    pub signals: Vec<SignalsDiff>,
    /// Warnings the head produces and the base does not.
    pub new_warnings: Vec<String>,
    /// Warnings the base produces and the head does not.
    pub resolved_warnings: Vec<String>,
    /// Lanes the change moves across an error-budget band (by scenario:
    /// the band after it; by signals: the worst band of the timeline).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub band_changes: Vec<super::objectives::BandChange>,
}

/// A diff with the names of its two sides.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Labelled {
    /// Base manifests.
    pub base: String,
    /// Head manifests.
    pub head: String,
    /// The diff.
    #[serde(flatten)]
    pub diff: Diff,
}

/// The first evaluation at which a profile's decision differs.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FirstDifference {
    /// `namespace/name` of the profile.
    pub profile: String,
    /// Time of the evaluation.
    pub at: i64,
    /// The base decision, summarised (only what differs).
    pub base: String,
    /// The head decision, summarised.
    pub head: String,
}

/// A lane's outcomes under both.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LaneDelta {
    /// `namespace/name` of the profile.
    pub profile: String,
    /// Lane name.
    pub lane: String,
    /// Priority (head's, else base's).
    pub priority: i32,
    /// Outcomes under the base (None: the lane is new).
    pub base: Option<LaneReport>,
    /// Outcomes under the head (None: the lane was removed).
    pub head: Option<LaneReport>,
}

impl LaneDelta {
    /// Head − base within-deadline share, percentage points.
    pub fn deadline_delta_pp(&self) -> Option<f64> {
        Some(
            self.head.as_ref()?.within_deadline_percent?
                - self.base.as_ref()?.within_deadline_percent?,
        )
    }
}

/// One scenario under both.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScenarioDiff {
    /// The scenario file.
    pub file: String,
    /// Its name.
    pub name: String,
    /// First differing decision per profile.
    pub first_differences: Vec<FirstDifference>,
    /// Per lane.
    pub lanes: Vec<LaneDelta>,
    /// Level transitions per profile: (base, head).
    pub transitions: BTreeMap<String, (usize, usize)>,
}

/// One signal timeline under both.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SignalsDiff {
    /// The signals file.
    pub file: String,
    /// Steps in the timeline.
    pub steps: usize,
    /// Steps at which some profile's decision differs.
    pub differing_steps: usize,
    /// First differing decision per profile.
    pub first_differences: Vec<FirstDifference>,
}

fn pkey(d: &ProfileDecision) -> String {
    format!("{}/{}", d.namespace, d.name)
}

fn milli(v: f64) -> i64 {
    (v * 1000.0).round() as i64
}

/// What a decision says, compared at 0.001 units/s: every aspect that
/// differs, in the base's and the head's words (never the same words for
/// both).
fn describe_differences(
    b: Option<&ProfileDecision>,
    h: Option<&ProfileDecision>,
) -> Option<(String, String)> {
    let (b, h) = match (b, h) {
        (None, None) => return None,
        (Some(_), None) => return Some(("present".into(), "absent".into())),
        (None, Some(_)) => return Some(("absent".into(), "present".into())),
        (Some(b), Some(h)) => (b, h),
    };
    let mut diffs = Vec::new();
    if b.level != h.level || b.pending_approval_level != h.pending_approval_level {
        diffs.push((level(b), level(h)));
    }
    diffs.extend(lane_differences(b, h));
    diffs.extend(gateway_differences(&b.gateway, &h.gateway));
    if b.desired_replicas != h.desired_replicas {
        diffs.push((
            format!("replicas {:?}", b.desired_replicas),
            format!("replicas {:?}", h.desired_replicas),
        ));
    }
    if diffs.is_empty() {
        return None;
    }
    let (bs, hs): (Vec<String>, Vec<String>) = diffs.into_iter().unzip();
    Some((bs.join("; "), hs.join("; ")))
}

/// `level 3 (protect)`, with the level waiting for approval if any.
fn level(d: &ProfileDecision) -> String {
    let mut out = format!("level {} ({})", d.level, d.level_name);
    if let Some(p) = d.pending_approval_level {
        let _ = write!(out, ", level {p} awaiting approval");
    }
    out
}

/// Each lane whose state or admitted rate differs.
fn lane_differences(b: &ProfileDecision, h: &ProfileDecision) -> Vec<(String, String)> {
    let lanes: BTreeSet<&str> = b
        .lanes
        .iter()
        .chain(&h.lanes)
        .map(|l| l.name.as_str())
        .collect();
    let show = |l: Option<&LaneDecision>| {
        l.map_or_else(
            || "absent".to_owned(),
            |l| {
                format!(
                    "{} {}",
                    l.state.as_str(),
                    format_number(l.admitted_units_per_second)
                )
            },
        )
    };
    let mut out = Vec::new();
    for name in lanes {
        let bl = b.lanes.iter().find(|l| l.name == name);
        let hl = h.lanes.iter().find(|l| l.name == name);
        let same = match (bl, hl) {
            (Some(x), Some(y)) => {
                x.state == y.state
                    && milli(x.admitted_units_per_second) == milli(y.admitted_units_per_second)
            }
            _ => false,
        };
        if !same {
            out.push((
                format!("{name} {}", show(bl)),
                format!("{name} {}", show(hl)),
            ));
        }
    }
    out
}

/// Each gateway field that differs, as `gateway.inFlight.stopAt 1500` on
/// both sides (`absent` where a side has none). Read from the serialized
/// flags, so a field added to [`GatewayFlags`] shows without a change here.
fn gateway_differences(b: &GatewayFlags, h: &GatewayFlags) -> Vec<(String, String)> {
    if b == h {
        return Vec::new();
    }
    let (bl, hl) = (leaves(b), leaves(h));
    let keys: BTreeSet<&String> = bl.keys().chain(hl.keys()).collect();
    let show = |m: &BTreeMap<String, String>, k: &str| {
        let v = m.get(k).map_or("absent", String::as_str);
        format!("gateway.{k} {v}")
    };
    keys.into_iter()
        .filter(|k| bl.get(*k) != hl.get(*k))
        .map(|k| (show(&bl, k), show(&hl, k)))
        .collect()
}

/// The leaf values of `v` serialized, keyed by their dotted path; a null
/// (an absent option) is no leaf.
fn leaves(v: &impl Serialize) -> BTreeMap<String, String> {
    fn walk(path: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
        match v {
            serde_json::Value::Null => {}
            serde_json::Value::Object(m) => {
                for (k, c) in m {
                    let sub = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(&sub, c, out);
                }
            }
            leaf => {
                out.insert(path.to_owned(), leaf.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", &serde_json::to_value(v).unwrap_or_default(), &mut out);
    out
}

/// First differing evaluation per profile, and how many steps differ.
fn compare_evaluations(base: &[Evaluation], head: &[Evaluation]) -> (Vec<FirstDifference>, usize) {
    let mut first: BTreeMap<String, FirstDifference> = BTreeMap::new();
    let mut differing = 0;
    for (b, h) in base.iter().zip(head) {
        let keys: BTreeSet<String> = b.profiles.iter().chain(&h.profiles).map(pkey).collect();
        let mut any = false;
        for k in keys {
            let bd = b.profiles.iter().find(|d| pkey(d) == k);
            let hd = h.profiles.iter().find(|d| pkey(d) == k);
            if let Some((bs, hs)) = describe_differences(bd, hd) {
                any = true;
                first.entry(k.clone()).or_insert(FirstDifference {
                    profile: k,
                    at: b.at,
                    base: bs,
                    head: hs,
                });
            }
        }
        differing += usize::from(any);
    }
    (first.into_values().collect(), differing)
}

fn warnings_of(evals: &[Evaluation], out: &mut BTreeSet<String>) {
    for e in evals {
        out.extend(e.warnings.iter().map(ToString::to_string));
        for p in &e.profiles {
            out.extend(p.warnings.iter().map(ToString::to_string));
        }
    }
}

/// Which manifests a simulation ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// `--base`.
    Base,
    /// `--head`.
    Head,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Base => "base",
            Side::Head => "head",
        })
    }
}

/// Why a diff could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// A scenario could not be loaded.
    #[error(transparent)]
    Scenario(#[from] scenario::ScenarioError),
    /// A scenario does not run against one side's manifests.
    #[error("{} ({side}): {source}", .path.display())]
    Simulate {
        /// The scenario file.
        path: PathBuf,
        /// Base or head.
        side: Side,
        /// Why.
        #[source]
        source: SimError,
    },
    /// A signals file could not be read, parsed or used.
    #[error(transparent)]
    Signals(#[from] SignalsFileError),
}

/// Computes the diff.
pub fn diff(
    base: &World,
    head: &World,
    scenarios: &[PathBuf],
    signals: &[PathBuf],
) -> Result<Diff, DiffError> {
    let mut wb = BTreeSet::new();
    let mut wh = BTreeSet::new();
    let mut out = Diff {
        scenarios: Vec::new(),
        signals: Vec::new(),
        new_warnings: Vec::new(),
        resolved_warnings: Vec::new(),
        band_changes: Vec::new(),
    };
    for path in scenarios {
        let sc = scenario::load(path)?;
        let simulate = |world, side| {
            super::simulate(world, &sc, Strategy::Lanekeeper).map_err(|source| {
                DiffError::Simulate {
                    path: path.clone(),
                    side,
                    source,
                }
            })
        };
        let (rb, repb) = simulate(base, Side::Base)?;
        let (rh, reph) = simulate(head, Side::Head)?;
        warnings_of(&rb.evaluations, &mut wb);
        warnings_of(&rh.evaluations, &mut wh);
        wb.extend(rb.warnings.iter().cloned());
        wh.extend(rh.warnings.iter().cloned());
        let (first, _) = compare_evaluations(&rb.evaluations, &rh.evaluations);
        let mut lanes: BTreeMap<(String, i32, String), LaneDelta> = BTreeMap::new();
        let mut transitions = BTreeMap::new();
        for (side, rep) in [(0, &repb), (1, &reph)] {
            for p in &rep.profiles {
                let pk = format!("{}/{}", p.namespace, p.name);
                let e = transitions.entry(pk.clone()).or_insert((0, 0));
                if side == 0 {
                    e.0 = p.level_timeline.len();
                } else {
                    e.1 = p.level_timeline.len();
                }
                for l in &p.lanes {
                    let k = (pk.clone(), l.priority, l.name.clone());
                    // A lane whose priority changed is matched by name.
                    let existing = lanes
                        .keys()
                        .find(|(q, _, n)| *q == pk && *n == l.name)
                        .cloned();
                    let d = lanes.entry(existing.unwrap_or(k)).or_insert(LaneDelta {
                        profile: pk.clone(),
                        lane: l.name.clone(),
                        priority: l.priority,
                        base: None,
                        head: None,
                    });
                    if side == 0 {
                        d.base = Some(l.clone());
                    } else {
                        d.priority = l.priority;
                        d.head = Some(l.clone());
                    }
                }
            }
        }
        let sides: Vec<_> = lanes
            .values()
            .map(|d| {
                let ns = d.profile.split('/').next().unwrap_or_default();
                (
                    format!("{ns}/{}", d.lane),
                    objective_of(&d.base),
                    objective_of(&d.head),
                )
            })
            .collect();
        let file = path.display().to_string();
        out.band_changes
            .extend(super::objectives::scenario_band_changes(&file, &sides));
        out.scenarios.push(ScenarioDiff {
            file: path.display().to_string(),
            name: repb.scenario.clone(),
            first_differences: first,
            lanes: lanes.into_values().collect(),
            transitions,
        });
    }
    for path in signals {
        let t = SignalsFile::load(path)?;
        let pb = plan::plan(base, &t, &Approvals::new());
        let ph = plan::plan(head, &t, &Approvals::new());
        warnings_of(&pb.steps, &mut wb);
        warnings_of(&ph.steps, &mut wh);
        let (first, differing) = compare_evaluations(&pb.steps, &ph.steps);
        out.band_changes
            .extend(super::objectives::plan_band_changes(
                &path.display().to_string(),
                &pb.objectives,
                &ph.objectives,
            ));
        out.signals.push(SignalsDiff {
            file: path.display().to_string(),
            steps: t.steps.len(),
            differing_steps: differing,
            first_differences: first,
        });
    }
    out.new_warnings = wh.difference(&wb).cloned().collect();
    out.resolved_warnings = wb.difference(&wh).cloned().collect();
    Ok(out)
}

/// A side's objective outcome of a lane.
fn objective_of(r: &Option<LaneReport>) -> Option<&super::objectives::ObjectiveOutcome> {
    r.as_ref().and_then(|l| l.objective.as_ref())
}

/// The `--fail-on` conditions that hold, each with its evidence.
pub fn gate(d: &Diff, conds: &[FailOn]) -> Vec<String> {
    let mut out = Vec::new();
    let conds: BTreeSet<FailOn> = conds.iter().copied().collect();
    for c in conds {
        let mut evidence = Vec::new();
        match c {
            FailOn::P0DeadlineRegression | FailOn::DeadlineRegression => {
                for s in &d.scenarios {
                    for l in &s.lanes {
                        if c == FailOn::P0DeadlineRegression && l.priority != 0 {
                            continue;
                        }
                        if let Some(dp) = l.deadline_delta_pp()
                            && dp < -DEADLINE_TOLERANCE_PP
                        {
                            evidence.push(format!("{} in {}: {:+.3} pp", l.lane, s.name, dp));
                        }
                    }
                }
            }
            FailOn::NewWarnings => evidence.extend(d.new_warnings.iter().cloned()),
            FailOn::DecisionChange => {
                for s in &d.scenarios {
                    for f in &s.first_differences {
                        evidence.push(format!("{} at {}s in {}", f.profile, f.at, s.name));
                    }
                }
                for s in &d.signals {
                    for f in &s.first_differences {
                        evidence.push(format!("{} at {}s in {}", f.profile, f.at, s.file));
                    }
                }
            }
            FailOn::MoreTransitions => {
                for s in &d.scenarios {
                    for (p, (b, h)) in &s.transitions {
                        if h > b {
                            evidence.push(format!("{p} in {}: {b} -> {h} transitions", s.name));
                        }
                    }
                }
            }
        }
        if !evidence.is_empty() {
            out.push(format!("{} ({})", c.name(), evidence.join(", ")));
        }
    }
    out
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |x| format!("{x:.3}%"))
}

fn secs(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |x| format!("{x:.2}s"))
}

fn drain(l: &LaneReport) -> String {
    match (l.drain_end_backlog_seconds, l.drain_seconds) {
        (Some(0.0), Some(d)) => format!("{d}s"),
        (Some(0.0), None) => "-".into(),
        (Some(x), _) => format!("{:.0}s more", x.ceil()),
        (None, _) => "never".into(),
    }
}

/// Cells of a lane row: within-deadline, expired, rejected, p95, backlog
/// at end, drain — each `base → head`.
fn lane_row(l: &LaneDelta) -> Vec<String> {
    let both = |f: &dyn Fn(&LaneReport) -> String| {
        let b = l.base.as_ref().map_or_else(|| "absent".to_owned(), f);
        let h = l.head.as_ref().map_or_else(|| "absent".to_owned(), f);
        if b == h { b } else { format!("{b} → {h}") }
    };
    vec![
        l.lane.clone(),
        l.priority.to_string(),
        both(&|r| pct(r.within_deadline_percent)),
        l.deadline_delta_pp()
            .map_or_else(|| "-".into(), |d| format!("{d:+.3}")),
        both(&|r| r.expired.to_string()),
        both(&|r| r.rejected.to_string()),
        both(&|r| secs(r.latency_p95_seconds)),
        both(&|r| r.peak_backlog.to_string()),
        both(&|r| r.backlog_at_end.to_string()),
        both(&drain),
    ]
}

const LANE_HEADERS: [&str; 10] = [
    "lane",
    "pri",
    "within deadline",
    "Δ pp",
    "expired",
    "rejected",
    "p95",
    "peak backlog",
    "backlog at end",
    "drain",
];

/// Markdown for a pull-request comment.
pub fn render_markdown(d: &Labelled, failures: &[String]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## lanekeeper diff\n\nbase `{}` → head `{}`\n",
        d.base, d.head
    );
    for s in &d.diff.scenarios {
        let _ = writeln!(out, "### Scenario `{}` (`{}`)\n", s.name, s.file);
        if s.first_differences.is_empty() {
            let _ = writeln!(out, "Decisions: identical at every evaluation.\n");
        }
        for f in &s.first_differences {
            let _ = writeln!(
                out,
                "Decisions first differ for `{}` at **{}s**:\n- base: {}\n- head: {}\n",
                f.profile, f.at, f.base, f.head
            );
        }
        let _ = writeln!(out, "| {} |", LANE_HEADERS.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(LANE_HEADERS.len()));
        for l in &s.lanes {
            let _ = writeln!(out, "| {} |", lane_row(l).join(" | "));
        }
        for (p, (b, h)) in &s.transitions {
            let _ = writeln!(out, "\nLevel transitions of `{p}`: {b} → {h}");
        }
        let _ = writeln!(out);
    }
    for s in &d.diff.signals {
        let _ = writeln!(out, "### Signals `{}`\n", s.file);
        let _ = writeln!(out, "{} of {} steps differ.\n", s.differing_steps, s.steps);
        for f in &s.first_differences {
            let _ = writeln!(
                out,
                "First difference for `{}` at **{}s**:\n- base: {}\n- head: {}\n",
                f.profile, f.at, f.base, f.head
            );
        }
    }
    if !d.diff.band_changes.is_empty() {
        let _ = writeln!(out, "### Error-budget bands that move\n");
        for c in &d.diff.band_changes {
            let _ = writeln!(out, "- {c}");
        }
        let _ = writeln!(out);
    }
    if !d.diff.new_warnings.is_empty() {
        let _ = writeln!(out, "### New warnings\n");
        for w in &d.diff.new_warnings {
            let _ = writeln!(out, "- {w}");
        }
        let _ = writeln!(out);
    }
    if !d.diff.resolved_warnings.is_empty() {
        let _ = writeln!(out, "### Warnings gone\n");
        for w in &d.diff.resolved_warnings {
            let _ = writeln!(out, "- {w}");
        }
        let _ = writeln!(out);
    }
    if !failures.is_empty() {
        let _ = writeln!(out, "### Failed gates\n");
        for f in failures {
            let _ = writeln!(out, "- :x: {f}");
        }
    }
    out
}

/// Plain text.
pub fn render_text(d: &Labelled, failures: &[String]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "base {} -> head {}", d.base, d.head);
    for s in &d.diff.scenarios {
        let _ = writeln!(out, "\nscenario {} ({})", s.name, s.file);
        if s.first_differences.is_empty() {
            let _ = writeln!(out, "  decisions identical at every evaluation");
        }
        for f in &s.first_differences {
            let _ = writeln!(
                out,
                "  decisions first differ for {} at {}s\n    base: {}\n    head: {}",
                f.profile, f.at, f.base, f.head
            );
        }
        let rows: Vec<Vec<String>> =
            std::iter::once(LANE_HEADERS.iter().map(|h| h.to_uppercase()).collect())
                .chain(s.lanes.iter().map(lane_row))
                .collect();
        let widths: Vec<usize> = (0..LANE_HEADERS.len())
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        for r in &rows {
            let mut line = String::from("  ");
            for (c, cell) in r.iter().enumerate() {
                let _ = write!(line, "{:<w$}  ", cell, w = widths[c]);
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        for (p, (b, h)) in &s.transitions {
            let _ = writeln!(out, "  level transitions of {p}: {b} -> {h}");
        }
    }
    for s in &d.diff.signals {
        let _ = writeln!(
            out,
            "\nsignals {}: {} of {} steps differ",
            s.file, s.differing_steps, s.steps
        );
        for f in &s.first_differences {
            let _ = writeln!(
                out,
                "  first difference for {} at {}s\n    base: {}\n    head: {}",
                f.profile, f.at, f.base, f.head
            );
        }
    }
    for c in &d.diff.band_changes {
        let _ = writeln!(out, "band change: {c}");
    }
    for w in &d.diff.new_warnings {
        let _ = writeln!(out, "new warning: {w}");
    }
    for w in &d.diff.resolved_warnings {
        let _ = writeln!(out, "warning gone: {w}");
    }
    for f in failures {
        let _ = writeln!(out, "FAILED: {f}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The INC-47 decision at its safe capacity.
    fn decision() -> ProfileDecision {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let loaded = crate::manifest::load(&[root.join("examples/inc-47/inc-47.yaml")]).unwrap();
        let timeline = plan::default_timeline(&loaded.world);
        let p = plan::plan(&loaded.world, &timeline, &Approvals::new());
        p.steps[0].profiles[0].clone()
    }

    #[test]
    fn a_moved_watermark_is_named_with_both_values() {
        let b = decision();
        let mut h = b.clone();
        h.gateway.in_flight.as_mut().unwrap().stop_at = 1400;
        let (bs, hs) = describe_differences(Some(&b), Some(&h)).unwrap();
        assert_eq!(bs, "gateway.inFlight.stopAt 1500");
        assert_eq!(hs, "gateway.inFlight.stopAt 1400");
        h.gateway.in_flight = None;
        let (bs, hs) = describe_differences(Some(&b), Some(&h)).unwrap();
        assert!(bs.contains("gateway.inFlight.conserveAt 1350"), "{bs}");
        assert!(hs.contains("gateway.inFlight.conserveAt absent"), "{hs}");
    }

    #[test]
    fn a_flag_and_a_pending_approval_show_what_differs() {
        let b = decision();
        let mut h = b.clone();
        h.gateway.use_fallback_routes = !b.gateway.use_fallback_routes;
        h.pending_approval_level = Some(3);
        let (bs, hs) = describe_differences(Some(&b), Some(&h)).unwrap();
        assert_ne!(bs, hs);
        assert!(hs.contains("level 3 awaiting approval"), "{hs}");
        assert!(hs.contains("gateway.useFallbackRoutes true"), "{hs}");
        assert!(bs.contains("gateway.useFallbackRoutes false"), "{bs}");
        assert_eq!(describe_differences(Some(&b), Some(&b.clone())), None);
    }
}
