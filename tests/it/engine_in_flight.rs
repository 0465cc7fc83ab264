//! The decision's checks of `spec.inFlight` against the pool (issue 22 item
//! 5): `stopAt` below what a full pool holds in flight (Little's law) and
//! `resumeBelow >= conserveAt` are warnings, in the decision (so in `plan`,
//! text and JSON) and, through it, in the controller's condition.

use std::path::Path;

use crate::scratch::Scratch;
use lanekeeper::api::InFlightSpec;
use lanekeeper::manifest::{Loaded, load_str};
use lanekeeper::policy::{
    Approvals, EngineState, InFlightProblem, ProfileDecision, Warning, World, evaluate,
};
use lanekeeper::snapshot::{LaneSignals, ProfileSignals, Snapshot};

const INC47: &str = include_str!("../../examples/inc-47/inc-47.yaml");

fn world() -> World {
    let mut loaded = Loaded::default();
    load_str(Path::new("inc-47.yaml"), INC47, &mut loaded).unwrap();
    loaded.world
}

/// One evaluation at `capacity` with P1 at `p1` req/s (the other lanes at
/// their expected rates).
fn decide(world: &World, capacity: f64, p1: f64) -> ProfileDecision {
    let mut s = Snapshot::default();
    s.profiles.insert(
        "ai-platform/agent-assist".into(),
        ProfileSignals {
            available_units_per_second: Some(capacity),
            ..Default::default()
        },
    );
    s.lanes.insert(
        "ai-platform/p1-agent-assist".into(),
        LaneSignals {
            requests_per_second: Some(p1),
            ..Default::default()
        },
    );
    let (e, _) = evaluate(world, &s, &Approvals::new(), &EngineState::default());
    e.profiles.into_iter().next().unwrap()
}

fn in_flight(d: &ProfileDecision) -> Vec<&InFlightProblem> {
    d.warnings
        .iter()
        .filter_map(|w| match w {
            Warning::InFlight(p) => Some(p),
            _ => None,
        })
        .collect()
}

#[test]
fn stop_at_below_a_full_pool_is_a_warning_by_littles_law() {
    let w = world();
    // P0 52 req/s x 3.6 s + P1 180 x 4.8 s = 1,051.2 request-seconds per
    // second over 488.1 units/s of demand: a full pool of 560 units/s holds
    // 1,206 in flight, under stopAt 1,500.
    assert!(in_flight(&decide(&w, 560.0, 180.0)).is_empty());
    // P1 surging to 320 req/s: 1,723.2 over 628.1 units/s, x 560 = 1,536 in
    // flight (a lower bound: P2, P3 and P4 set no expectedServiceSeconds).
    let d = decide(&w, 560.0, 320.0);
    assert_eq!(
        in_flight(&d),
        [&InFlightProblem::StopAtBelowFullPool {
            stop_at: 1500,
            full_pool: 1530.0,
            capacity: 560.0
        }]
    );
    let text = d
        .warnings
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>();
    assert!(
        text.iter().any(|t| t.starts_with(
            "StopAtBelowFullPool: inFlight.stopAt 1500 is below the 1530 requests a full pool holds in flight"
        )),
        "{text:?}"
    );
    // The same surge on the incident's 420 units/s fits.
    assert!(in_flight(&decide(&w, 420.0, 320.0)).is_empty());
}

#[test]
fn resume_at_or_above_conserve_is_a_warning() {
    // The CRD's rule refuses it; a profile written before the rule is
    // still read.
    let mut w = world();
    w.profiles[0].spec.in_flight = Some(InFlightSpec {
        conserve_at: 1350,
        stop_at: 1500,
        resume_below: 1350,
        resume_after_stable_seconds: None,
    });
    let d = decide(&w, 560.0, 180.0);
    assert_eq!(
        in_flight(&d),
        [&InFlightProblem::ResumeAtOrAboveConserve {
            resume_below: 1350,
            conserve_at: 1350
        }]
    );
    // Without watermarks there is nothing to check.
    w.profiles[0].spec.in_flight = None;
    assert!(in_flight(&decide(&w, 560.0, 320.0)).is_empty());
}

/// `plan` says it, as text and as JSON: INC-47 with `stopAt` 1,000 under
/// the 1,206 a full pool of 560 units/s holds at the expected demand.
#[test]
fn plan_warns_in_text_and_json() {
    let dir = Scratch::new("in-flight");
    let from = "inFlight: {conserveAt: 1350, stopAt: 1500, resumeBelow: 1200}";
    assert!(INC47.contains(from));
    let low = dir.join("inc-47.yaml");
    std::fs::write(
        &low,
        INC47.replace(
            from,
            "inFlight: {conserveAt: 900, stopAt: 1000, resumeBelow: 800}",
        ),
    )
    .unwrap();
    let plan = |output: &str| {
        crate::cli::lanekeeper_ok(["plan", "-f", low.to_str().unwrap(), "-o", output])
    };
    let want = "StopAtBelowFullPool: inFlight.stopAt 1000 is below the 1200 requests a full pool holds in flight";
    let text = plan("table");
    assert!(text.contains(&format!("warning: {want}")), "{text}");
    let json: serde_json::Value = serde_json::from_str(&plan("json")).unwrap();
    let warnings = &json["steps"][0]["profiles"][0]["warnings"];
    assert!(
        warnings
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().starts_with(want)),
        "{warnings}"
    );
}
