//! Unit tests of the decision engine, one rule at a time, through the public
//! API (`lanekeeper::policy::{evaluate, evaluate_profile, bind}`).
//!
//! Objects are written as YAML and loaded with `manifest::load_str`, so every
//! object a test uses is one the CRDs' CEL rules accept (the few tests that
//! need an object the API server would reject change it after loading).

use std::path::Path;

use lanekeeper::manifest::{Loaded, load_str};
use lanekeeper::policy::{
    Approvals, DrainAction, EngineState, Evaluation, LaneDecision, LaneState, ProfileDecision,
    Telemetry, World, bind, evaluate, evaluate_profile,
};
use lanekeeper::snapshot::{LaneSignals, PodSignals, ProfileSignals, SignalsFile, Snapshot};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const INC47: &str = include_str!("../../examples/inc-47/inc-47.yaml");
const INC47_PROFILE: &str = "ai-platform/agent-assist";

/// The synthetic profile most tests use: namespace `t`, name `pool`.
const POOL: &str = "t/pool";

fn load(yaml: &str) -> World {
    let mut loaded = Loaded::default();
    load_str(Path::new("test.yaml"), yaml, &mut loaded)
        .unwrap_or_else(|e| panic!("test manifest invalid: {e}"));
    loaded.world
}

/// A CapacityProfile `t/pool`: 10 units per replica at 100 % target
/// utilization (so desired replicas = ceil(demand / 10)), replicas 1..50 with a
/// large scale-up step, and the given drain spec (YAML flow mapping).
fn profile_doc(drain: &str) -> String {
    format!(
        r#"apiVersion: lanekeeper.dev/v1alpha1
kind: CapacityProfile
metadata: {{name: pool, namespace: t}}
spec:
  pool:
    scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: pool}}
    podSelector: {{matchLabels: {{app: pool}}}}
  capacity: {{safeUnitsPerSecond: "100", unitsPerReplica: "10", warningUtilizationPercent: 100}}
  replicas: {{min: 1, max: 50, maxScaleUpStep: 50, scaleDownStabilizationSeconds: 300}}
  drain: {drain}
"#
    )
}

const DEFAULT_DRAIN: &str =
    r#"{maxDrained: "25%", minServing: 2, errorRatioAbove: "0.20", healthyForSeconds: 120}"#;

/// A LaneContract on `t/pool` with one work unit per request (so demand in
/// units/s equals requests/s). `extra` is more of the spec as flow-mapping
/// entries, e.g. `floorUnitsPerSecond: "50", shedding: {mode: Never}`.
fn lane_doc(name: &str, priority: i32, rps: f64, extra: &str) -> String {
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!(", {extra}")
    };
    format!(
        r#"apiVersion: lanekeeper.dev/v1alpha1
kind: LaneContract
metadata: {{name: {name}, namespace: t}}
spec: {{profile: pool, priority: {priority}, workUnitsPerRequest: "1", expectedRequestsPerSecond: "{rps}", deadlineSeconds: 10, queue: {{maxDepth: 10, ttlSeconds: 5}}, retry: {{maxAttempts: 1}}, routes: {{primary: [r]}}{extra}}}
"#
    )
}

/// A DegradationPolicy `t/ladder` on `t/pool`; `body` is the rest of the spec
/// (indented by two spaces).
fn policy_doc(body: &str) -> String {
    format!(
        r#"apiVersion: lanekeeper.dev/v1alpha1
kind: DegradationPolicy
metadata: {{name: ladder, namespace: t}}
spec:
  profile: pool
{body}"#
    )
}

fn docs(parts: &[String]) -> String {
    parts.iter().map(|p| format!("---\n{p}")).collect()
}

/// Signals of `t/pool` with only an available-capacity figure.
fn avail(units: f64) -> ProfileSignals {
    ProfileSignals {
        available_units_per_second: Some(units),
        ..Default::default()
    }
}

fn snap(at: i64, profile: Option<ProfileSignals>, lanes: &[(&str, f64)]) -> Snapshot {
    snap_for(POOL, "t", at, profile, lanes)
}

fn snap_for(
    pkey: &str,
    ns: &str,
    at: i64,
    profile: Option<ProfileSignals>,
    lanes: &[(&str, f64)],
) -> Snapshot {
    let mut s = Snapshot {
        at,
        ..Default::default()
    };
    if let Some(p) = profile {
        s.profiles.insert(pkey.to_owned(), p);
    }
    for (name, rps) in lanes {
        s.lanes.insert(
            format!("{ns}/{name}"),
            LaneSignals {
                requests_per_second: Some(*rps),
                ..Default::default()
            },
        );
    }
    s
}

fn pod(ready: Option<bool>, err: Option<f64>) -> PodSignals {
    PodSignals {
        ready,
        error_ratio: err,
        drain_requested: None,
        revision: None,
    }
}

/// `n` ready pods `pod-0..` with the given error ratios (None: no evidence).
fn pods(errs: &[Option<f64>]) -> ProfileSignals {
    let mut s = ProfileSignals::default();
    for (i, e) in errs.iter().enumerate() {
        s.pods.insert(format!("pod-{i}"), pod(Some(true), *e));
    }
    s
}

/// Runs a world through successive snapshots, carrying the state.
struct Run {
    world: World,
    state: EngineState,
    approvals: Approvals,
}

impl Run {
    fn new(yaml: &str) -> Self {
        Self {
            world: load(yaml),
            state: EngineState::default(),
            approvals: Approvals::new(),
        }
    }

    fn eval(&mut self, s: &Snapshot) -> Evaluation {
        let (e, next) = evaluate(&self.world, s, &self.approvals, &self.state);
        self.state = next;
        e
    }

    /// Evaluates and returns the decision of the only profile.
    fn step(&mut self, s: &Snapshot) -> ProfileDecision {
        let e = self.eval(s);
        assert_eq!(e.profiles.len(), 1, "expected exactly one profile");
        e.profiles.into_iter().next().unwrap()
    }
}

fn lane<'a>(d: &'a ProfileDecision, name: &str) -> &'a LaneDecision {
    d.lanes.iter().find(|l| l.name == name).unwrap_or_else(|| {
        panic!(
            "no lane {name} in {:?}",
            d.lanes.iter().map(|l| &l.name).collect::<Vec<_>>()
        )
    })
}

#[track_caller]
fn close(got: f64, want: f64) {
    assert!((got - want).abs() < 1e-6, "got {got}, want {want}");
}

fn action_of(d: &ProfileDecision, pod: &str) -> Option<DrainAction> {
    d.drain
        .actions
        .iter()
        .find(|p| p.pod == pod)
        .map(|p| p.action)
}

fn drained(run: &Run, pkey: &str) -> Vec<String> {
    run.state.profiles[pkey].drained.keys().cloned().collect()
}

fn queue(q: f64) -> ProfileSignals {
    ProfileSignals {
        available_units_per_second: Some(1000.0),
        queue_depth: Some(q),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------
// Capacity
// ---------------------------------------------------------------------------

fn capacity_world() -> Run {
    Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 20.0, ""),
    ]))
}

#[test]
fn capacity_prefers_available_units_over_replicas_and_pods() {
    let mut run = capacity_world();
    let mut sig = pods(&[None, None, None]);
    sig.available_units_per_second = Some(420.0);
    sig.ready_replicas = Some(8);
    let d = run.step(&snap(0, Some(sig), &[]));
    assert_eq!(d.telemetry, Telemetry::Known);
    assert_eq!(d.capacity_units_per_second, Some(420.0));
    assert_eq!(
        d.capacity_source.as_deref(),
        Some("availableUnitsPerSecond")
    );
}

#[test]
fn capacity_from_ready_replicas_when_no_available_figure() {
    let mut run = capacity_world();
    let mut sig = pods(&[None, None, None]);
    sig.ready_replicas = Some(5);
    let d = run.step(&snap(0, Some(sig), &[]));
    assert_eq!(d.capacity_units_per_second, Some(50.0)); // 5 × 10, not 3 pods × 10
    assert_eq!(d.capacity_source.as_deref(), Some("readyReplicas"));
    assert_eq!(d.ready_replicas, Some(5));
}

#[test]
fn capacity_from_ready_pods_as_last_resort() {
    let mut run = capacity_world();
    let mut sig = ProfileSignals::default();
    sig.pods.insert("p-0".into(), pod(Some(true), None));
    sig.pods.insert("p-1".into(), pod(None, None)); // absent readiness counts as ready
    sig.pods.insert("p-2".into(), pod(Some(false), None));
    sig.pods.insert("p-3".into(), pod(Some(true), Some(0.5)));
    let d = run.step(&snap(0, Some(sig), &[]));
    assert_eq!(d.capacity_units_per_second, Some(30.0));
    assert_eq!(d.capacity_source.as_deref(), Some("readyPods"));
    assert_eq!(d.ready_replicas, Some(3));
}

#[test]
fn capacity_unknown_when_no_source_exists() {
    // No entry for the profile at all.
    let mut run = capacity_world();
    let d = run.step(&snap(0, None, &[]));
    assert_eq!(d.telemetry, Telemetry::Unknown);
    assert_eq!(d.capacity_units_per_second, None);
    assert_eq!(d.utilization_percent, None);

    // Pool signals but none that give capacity, and only unready pods.
    let mut run = capacity_world();
    let mut sig = ProfileSignals {
        in_flight: Some(100.0),
        queue_depth: Some(5.0),
        ..Default::default()
    };
    sig.pods.insert("p-0".into(), pod(Some(false), Some(0.0)));
    let d = run.step(&snap(0, Some(sig), &[]));
    assert_eq!(d.telemetry, Telemetry::Unknown);
    assert_eq!(d.capacity_units_per_second, None);
    // Never the declared safe capacity in the report: unknown stays unknown.
    assert_ne!(d.capacity_units_per_second, Some(100.0));
}

#[test]
fn garbage_available_figure_is_unknown_not_zero() {
    let mut run = capacity_world();
    for bad in [f64::NAN, -5.0, f64::INFINITY] {
        let sig = ProfileSignals {
            available_units_per_second: Some(bad),
            ready_replicas: Some(4),
            ..Default::default()
        };
        let d = run.step(&snap(0, Some(sig), &[]));
        // The measurement the profile was told to trust failed: no fall
        // back to ready replicas (all ready while the provider degrades).
        assert_eq!(d.capacity_units_per_second, None, "available {bad}");
        assert_eq!(d.telemetry, Telemetry::Unknown, "available {bad}");
    }
}

#[test]
fn observed_rate_overrides_expected_rate() {
    let mut run = capacity_world();
    let d = run.step(&snap(0, Some(avail(1000.0)), &[]));
    assert_eq!(lane(&d, "a").demand_source, "Expected");
    close(lane(&d, "a").demand_units_per_second, 20.0);
    let d = run.step(&snap(1, Some(avail(1000.0)), &[("a", 33.0)]));
    assert_eq!(lane(&d, "a").demand_source, "Observed");
    close(lane(&d, "a").demand_units_per_second, 33.0);
}

// ---------------------------------------------------------------------------
// The ladder
// ---------------------------------------------------------------------------

/// Three queue-driven levels (enter above 10, 20, 30), no exitWhen.
fn queue_ladder(stable: i64) -> Run {
    Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 20.0, ""),
        policy_doc(&format!(
            r#"  hysteresis: {{stableForSeconds: {stable}}}
  levels:
  - {{name: one, enterWhen: {{queueDepthAbove: 10}}}}
  - {{name: two, enterWhen: {{queueDepthAbove: 20}}}}
  - {{name: three, enterWhen: {{queueDepthAbove: 30}}}}
"#
        )),
    ]))
}

#[test]
fn trigger_whose_signal_is_unknown_does_not_hold() {
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 20.0, ""),
        policy_doc(
            r#"  levels:
  - {name: busy, enterWhen: {inFlightAbove: 100, p95LatencySecondsAbove: "2", errorRatioAbove: "0.1"}}
"#,
        ),
    ]));
    // Capacity known, but no inFlight / latency / error signal.
    let d = run.step(&snap(0, Some(avail(1000.0)), &[]));
    assert_eq!(d.level, 0);
    assert!(d.triggers.is_empty(), "{:?}", d.triggers);
    // The same with the signal present and high enters.
    let sig = ProfileSignals {
        in_flight: Some(150.0),
        ..avail(1000.0)
    };
    let d = run.step(&snap(60, Some(sig), &[]));
    assert_eq!(d.level, 1);
}

#[test]
fn enter_triggers_are_alternatives() {
    let yaml = docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 20.0, ""),
        policy_doc(
            r#"  levels:
  - {name: busy, enterWhen: {inFlightAbove: 1000, queueDepthAbove: 50, utilizationPercentAbove: 90}}
"#,
        ),
    ]);
    // Only the queue trigger holds.
    let mut run = Run::new(&yaml);
    let sig = ProfileSignals {
        in_flight: Some(10.0),
        queue_depth: Some(60.0),
        ..avail(1000.0)
    };
    let d = run.step(&snap(0, Some(sig), &[]));
    assert_eq!(d.level, 1);
    assert!(
        d.triggers.iter().any(|t| t.contains("queueDepthAbove")),
        "{:?}",
        d.triggers
    );
    // Only utilization holds (20 / 21 = 95 %).
    let mut run = Run::new(&yaml);
    let sig = ProfileSignals {
        in_flight: Some(10.0),
        queue_depth: Some(0.0),
        ..avail(21.0)
    };
    let d = run.step(&snap(0, Some(sig), &[]));
    assert_eq!(d.level, 1);
    assert!(
        d.triggers
            .iter()
            .any(|t| t.contains("utilizationPercentAbove")),
        "{:?}",
        d.triggers
    );
    // None holds.
    let mut run = Run::new(&yaml);
    let sig = ProfileSignals {
        in_flight: Some(10.0),
        queue_depth: Some(0.0),
        ..avail(1000.0)
    };
    assert_eq!(run.step(&snap(0, Some(sig), &[])).level, 0);
}

#[test]
fn over_capacity_on_level_k_uses_demand_after_levels_below_k() {
    // INC-47 demand 488.1; after level 1 (no caps) 488.1; after levels 1..2
    // 400.1 (P4 paused, P3 capped at 60); after levels 1..3 373.6 (P2 at 40).
    let cases: [(f64, u32, Option<u32>); 5] = [
        (500.0, 1, None),    // utilization 97.6 % > 85 only: conserve
        (420.0, 2, None),    // 488.1 > 420, 400.1 <= 420
        (400.1, 2, None),    // exactly at capacity is not over it
        (380.0, 3, None),    // 400.1 > 380, 373.6 <= 380
        (370.0, 3, Some(4)), // 373.6 > 370: continuity holds but needs approval
    ];
    for (cap, level, pending) in cases {
        let mut run = Run::new(INC47);
        let d = run.step(&snap_for(
            INC47_PROFILE,
            "ai-platform",
            0,
            Some(avail(cap)),
            &[],
        ));
        assert_eq!(d.level, level, "capacity {cap}: {:?}", d.triggers);
        assert_eq!(d.pending_approval_level, pending, "capacity {cap}");
        let over: Vec<&String> = d
            .triggers
            .iter()
            .filter(|t| t.contains("overCapacity"))
            .collect();
        // Which levels' overCapacity held, by level number.
        let held: Vec<u32> = over
            .iter()
            .map(|t| t.split(':').next().unwrap().trim().parse().unwrap())
            .collect();
        let want: Vec<u32> = [2, 3, 4]
            .into_iter()
            .filter(|&k| match k {
                2 => 488.1 > cap,
                3 => 400.1 > cap + 1e-9,
                _ => 373.6 > cap,
            })
            .collect();
        assert_eq!(held, want, "capacity {cap}: {:?}", d.triggers);
    }
}

#[test]
fn levels_are_skipped_going_up() {
    let mut run = Run::new(INC47);
    let d = run.step(&snap_for(
        INC47_PROFILE,
        "ai-platform",
        0,
        Some(avail(380.0)),
        &[],
    ));
    assert_eq!(d.level, 3);
    assert_eq!(d.level_name, "protect");
    let t = d.transition.clone().expect("a transition");
    assert_eq!((t.from, t.to), (0, 3));
    // Actions of every level up to 3 apply.
    assert!(
        d.gateway.reject_optional_context && d.gateway.use_fallback_routes && !d.gateway.read_only
    );
    assert_eq!(lane(&d, "p4-eval-backfill").state, LaneState::Paused);
    close(lane(&d, "p3-shift-batch").admitted_units_per_second, 60.0);
    close(lane(&d, "p2-email-extract").admitted_units_per_second, 40.0);
    close(d.admitted_units_per_second, 373.6);

    // And from 1 straight to 3 on the next step.
    let mut run = queue_ladder(300);
    assert_eq!(run.step(&snap(0, Some(queue(15.0)), &[])).level, 1);
    let d = run.step(&snap(10, Some(queue(35.0)), &[]));
    assert_eq!(d.level, 3);
    assert_eq!(d.transition.map(|t| (t.from, t.to)), Some((1, 3)));
}

#[test]
fn steps_down_one_level_per_stable_window() {
    let mut run = queue_ladder(300);
    assert_eq!(run.step(&snap(0, Some(queue(50.0)), &[])).level, 3);
    // Calm from 60 on: 3 -> 2 at 360, 2 -> 1 at 660, 1 -> 0 at 960.
    let mut levels = Vec::new();
    let mut downs = Vec::new();
    for at in (60..=1200).step_by(60) {
        let d = run.step(&snap(at, Some(queue(0.0)), &[]));
        if let Some(t) = &d.transition {
            assert_eq!(t.from, t.to + 1, "one level at a time: {t:?}");
            downs.push((at, t.from, t.to));
        }
        levels.push((at, d.level));
    }
    assert_eq!(downs, vec![(360, 3, 2), (660, 2, 1), (960, 1, 0)]);
    for (at, level) in levels {
        let want = match at {
            ..360 => 3,
            360..660 => 2,
            660..960 => 1,
            _ => 0,
        };
        assert_eq!(level, want, "at {at}");
    }
}

#[test]
fn stable_window_restarts_when_the_trigger_returns() {
    let mut run = queue_ladder(300);
    run.step(&snap(0, Some(queue(50.0)), &[]));
    let d = run.step(&snap(60, Some(queue(0.0)), &[]));
    assert_eq!(d.exit_holding_since, Some(60));
    // Level 3's trigger holds again at 200: the window restarts.
    let d = run.step(&snap(200, Some(queue(35.0)), &[]));
    assert_eq!((d.level, d.exit_holding_since), (3, None));
    let d = run.step(&snap(260, Some(queue(0.0)), &[]));
    assert_eq!(d.exit_holding_since, Some(260));
    // 60 + 300 = 360 would have stepped down without the restart.
    assert_eq!(run.step(&snap(400, Some(queue(0.0)), &[])).level, 3);
    assert_eq!(run.step(&snap(559, Some(queue(0.0)), &[])).level, 3);
    let d = run.step(&snap(560, Some(queue(0.0)), &[]));
    assert_eq!(d.level, 2);
    // The window for level 2 starts afresh at the step down.
    assert_eq!(d.exit_holding_since, Some(560));
    assert_eq!(run.step(&snap(859, Some(queue(0.0)), &[])).level, 2);
    assert_eq!(run.step(&snap(860, Some(queue(0.0)), &[])).level, 1);
}

#[test]
fn a_lower_level_still_holding_stops_the_way_down_there() {
    let mut run = queue_ladder(100);
    run.step(&snap(0, Some(queue(50.0)), &[]));
    // Queue 15: level 1 holds, 2 and 3 do not.
    run.step(&snap(10, Some(queue(15.0)), &[]));
    assert_eq!(run.step(&snap(110, Some(queue(15.0)), &[])).level, 2);
    assert_eq!(run.step(&snap(210, Some(queue(15.0)), &[])).level, 1);
    for at in [400, 1000, 5000] {
        let d = run.step(&snap(at, Some(queue(15.0)), &[]));
        assert_eq!((d.level, d.exit_holding_since), (1, None), "at {at}");
    }
}

#[test]
fn exit_when_with_an_unknown_signal_blocks_the_step_down() {
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 20.0, ""),
        policy_doc(
            r#"  hysteresis: {stableForSeconds: 300}
  levels:
  - {name: one, enterWhen: {queueDepthAbove: 10}, exitWhen: {inFlightBelow: 100}}
"#,
        ),
    ]));
    let sig = |q: f64, inflight: Option<f64>| ProfileSignals {
        in_flight: inflight,
        ..queue(q)
    };
    assert_eq!(
        run.step(&snap(0, Some(sig(50.0, Some(10.0))), &[])).level,
        1
    );
    // Enter no longer holds, but inFlight is unknown: exit does not hold.
    for at in (60..=1200).step_by(60) {
        let d = run.step(&snap(at, Some(sig(0.0, None)), &[]));
        assert_eq!((d.level, d.exit_holding_since), (1, None), "at {at}");
    }
    // inFlight known but too high: still no exit.
    let d = run.step(&snap(1260, Some(sig(0.0, Some(150.0))), &[]));
    assert_eq!((d.level, d.exit_holding_since), (1, None));
    // Known and low: the window starts now.
    let d = run.step(&snap(1320, Some(sig(0.0, Some(10.0))), &[]));
    assert_eq!(d.exit_holding_since, Some(1320));
    assert_eq!(
        run.step(&snap(1619, Some(sig(0.0, Some(10.0))), &[])).level,
        1
    );
    assert_eq!(
        run.step(&snap(1620, Some(sig(0.0, Some(10.0))), &[])).level,
        0
    );
}

#[test]
fn a_level_is_not_left_while_its_trigger_cannot_be_evaluated() {
    // No exitWhen: the level is left when its trigger no longer holds. A
    // queue-depth signal its source reported Unknown is no evidence of that
    // (capacity is known, so this is not the Hold rule).
    let mut run = queue_ladder(300);
    assert_eq!(run.step(&snap(0, Some(queue(15.0)), &[])).level, 1);
    let mut failed = avail(1000.0);
    failed
        .unknown
        .insert("queueDepth".into(), "timeout after 5s".into());
    for at in (60..=1200).step_by(60) {
        let d = run.step(&snap(at, Some(failed.clone()), &[]));
        assert_eq!(d.telemetry, Telemetry::Known);
        assert_eq!((d.level, d.exit_holding_since), (1, None), "at {at}");
    }
    let d = run.step(&snap(1260, Some(queue(0.0)), &[]));
    assert_eq!(d.exit_holding_since, Some(1260));
    assert_eq!(run.step(&snap(1560, Some(queue(0.0)), &[])).level, 0);
}

#[test]
fn hold_on_unknown_telemetry() {
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 20.0, ""),
        policy_doc(
            r#"  hysteresis: {stableForSeconds: 300}
  onMissingTelemetry: Hold
  levels:
  - {name: one, enterWhen: {queueDepthAbove: 10}}
  - {name: two, enterWhen: {queueDepthAbove: 20}}
"#,
        ),
    ]));
    // Known: level 1, 8 pods, one bad pod drained, demand 95 -> 10 replicas.
    let mut sig = pods(&[Some(0.0); 8]);
    sig.pods.insert("pod-3".into(), pod(Some(true), Some(0.9)));
    sig.queue_depth = Some(15.0);
    let d = run.step(&snap(0, Some(sig.clone()), &[("a", 95.0)]));
    assert_eq!((d.level, d.desired_replicas), (1, Some(10)));
    assert_eq!(action_of(&d, "pod-3"), Some(DrainAction::Drain));
    // Calm: exit holds from 60.
    sig.queue_depth = Some(0.0);
    let d = run.step(&snap(60, Some(sig.clone()), &[("a", 95.0)]));
    assert_eq!(d.exit_holding_since, Some(60));

    // Unknown (no profile signals at all) from 120 to 600, with the lane
    // demand dropping and then soaring: nothing moves.
    for (at, rps) in [(120, 5.0), (300, 5.0), (400, 400.0), (600, 5.0)] {
        let d = run.step(&snap(at, None, &[("a", rps)]));
        assert_eq!(d.telemetry, Telemetry::Unknown);
        assert_eq!(
            d.level, 1,
            "no step down at {at} although exit held since 60"
        );
        assert_eq!(d.transition, None);
        assert_eq!(d.exit_holding_since, None, "the window does not advance");
        assert_eq!(
            d.desired_replicas,
            Some(10),
            "desired replicas held at {at}"
        );
        assert!(
            d.drain
                .actions
                .iter()
                .all(|p| p.action != DrainAction::Drain && p.action != DrainAction::Undrain)
        );
        assert_eq!(
            drained(&run, POOL),
            vec!["pod-3".to_owned()],
            "drained pods kept at {at}"
        );
    }
    // Unknown with high signals but no capacity source: no step up either.
    let mut blind = ProfileSignals {
        queue_depth: Some(500.0),
        in_flight: Some(5000.0),
        ..Default::default()
    };
    blind
        .pods
        .insert("pod-0".into(), pod(Some(false), Some(0.9)));
    let d = run.step(&snap(620, Some(blind), &[]));
    assert_eq!(
        (d.telemetry, d.level, d.transition.clone()),
        (Telemetry::Unknown, 1, None)
    );
    assert!(
        d.drain
            .actions
            .iter()
            .all(|p| p.action != DrainAction::Drain)
    );

    // Known again from 660: the window restarts at 660, not at 60.
    sig.pods.insert("pod-3".into(), pod(Some(true), None));
    let d = run.step(&snap(660, Some(sig.clone()), &[("a", 95.0)]));
    assert_eq!((d.level, d.exit_holding_since), (1, Some(660)));
    assert_eq!(
        run.step(&snap(959, Some(sig.clone()), &[("a", 95.0)]))
            .level,
        1
    );
    assert_eq!(run.step(&snap(960, Some(sig), &[("a", 95.0)])).level, 0);
}

#[test]
fn on_missing_telemetry_enter_level() {
    let yaml = docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 20.0, ""),
        policy_doc(
            r#"  hysteresis: {stableForSeconds: 300}
  onMissingTelemetry: EnterLevel
  missingTelemetryLevel: 2
  levels:
  - {name: one, enterWhen: {queueDepthAbove: 10}}
  - {name: two, enterWhen: {queueDepthAbove: 20}}
  - {name: three, enterWhen: {queueDepthAbove: 30}}
"#,
        ),
    ]);
    // From 0: unknown goes to 2 at once.
    let mut run = Run::new(&yaml);
    assert_eq!(run.step(&snap(0, Some(queue(0.0)), &[])).level, 0);
    let d = run.step(&snap(60, None, &[]));
    assert_eq!(d.level, 2);
    assert_eq!(d.transition.map(|t| (t.from, t.to)), Some((0, 2)));
    // Still unknown: stays, no transition.
    let d = run.step(&snap(120, None, &[]));
    assert_eq!((d.level, d.transition), (2, None));
    // Known and calm: back down one level per window, from the first known step.
    assert_eq!(run.step(&snap(180, Some(queue(0.0)), &[])).level, 2);
    assert_eq!(run.step(&snap(479, Some(queue(0.0)), &[])).level, 2);
    assert_eq!(run.step(&snap(480, Some(queue(0.0)), &[])).level, 1);

    // From 3: unknown never steps down.
    let mut run = Run::new(&yaml);
    assert_eq!(run.step(&snap(0, Some(queue(50.0)), &[])).level, 3);
    for at in [60, 600, 6000] {
        assert_eq!(run.step(&snap(at, None, &[])).level, 3);
    }
}

// ---------------------------------------------------------------------------
// Approval
// ---------------------------------------------------------------------------

fn approval_world(mode: &str) -> Run {
    Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 20.0, ""),
        policy_doc(&format!(
            r#"  levels:
  - {{name: one, enterWhen: {{queueDepthAbove: 10}}}}
  - {{name: two, enterWhen: {{queueDepthAbove: 20}}, approval: {mode}}}
"#
        )),
    ]))
}

#[test]
fn automatic_approval_enters_at_once() {
    let mut run = approval_world("{mode: Automatic}");
    let d = run.step(&snap(0, Some(queue(50.0)), &[]));
    assert_eq!((d.level, d.pending_approval_level), (2, None));
}

#[test]
fn confirm_waits_for_the_timeout() {
    let mut run = approval_world("{mode: Confirm, timeoutSeconds: 300}");
    for at in [0, 120, 299] {
        let d = run.step(&snap(at, Some(queue(50.0)), &[]));
        assert_eq!((d.level, d.pending_approval_level), (1, Some(2)), "at {at}");
    }
    let d = run.step(&snap(300, Some(queue(50.0)), &[]));
    assert_eq!((d.level, d.pending_approval_level), (2, None));
}

#[test]
fn confirm_timeout_restarts_when_the_trigger_stops_holding() {
    let mut run = approval_world("{mode: Confirm, timeoutSeconds: 300}");
    run.step(&snap(0, Some(queue(50.0)), &[]));
    // Level 2's trigger stops holding at 100 (level 1's still holds).
    let d = run.step(&snap(100, Some(queue(15.0)), &[]));
    assert_eq!((d.level, d.pending_approval_level), (1, None));
    run.step(&snap(200, Some(queue(50.0)), &[]));
    // 0 + 300 would have timed out; 200 + 300 = 500 does.
    let d = run.step(&snap(450, Some(queue(50.0)), &[]));
    assert_eq!((d.level, d.pending_approval_level), (1, Some(2)));
    assert_eq!(run.step(&snap(500, Some(queue(50.0)), &[])).level, 2);
}

#[test]
fn confirm_enters_at_once_when_approved() {
    let mut run = approval_world("{mode: Confirm, timeoutSeconds: 300}");
    run.approvals.insert(POOL.to_owned(), 2.into());
    let d = run.step(&snap(0, Some(queue(50.0)), &[]));
    assert_eq!((d.level, d.pending_approval_level), (2, None));
}

#[test]
fn manual_waits_for_approval_only() {
    let mut run = approval_world("{mode: Manual}");
    for at in [0, 300, 3000, 30000] {
        let d = run.step(&snap(at, Some(queue(50.0)), &[]));
        assert_eq!((d.level, d.pending_approval_level), (1, Some(2)), "at {at}");
    }
    // An approval of a lower level does not approve level 2.
    run.approvals.insert(POOL.to_owned(), 1.into());
    assert_eq!(run.step(&snap(30060, Some(queue(50.0)), &[])).level, 1);
    run.approvals.insert(POOL.to_owned(), 2.into());
    let d = run.step(&snap(30120, Some(queue(50.0)), &[]));
    assert_eq!((d.level, d.pending_approval_level), (2, None));
    // Approved for an unrelated profile does nothing.
    let mut run = approval_world("{mode: Manual}");
    run.approvals.insert("t/other".to_owned(), 2.into());
    assert_eq!(run.step(&snap(0, Some(queue(50.0)), &[])).level, 1);
}

// ---------------------------------------------------------------------------
// Contracts outrank policies
// ---------------------------------------------------------------------------

#[test]
fn contract_overrides_are_not_applied_and_warn() {
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc(
            "never",
            0,
            50.0,
            r#"floorUnitsPerSecond: "30", shedding: {mode: Never}"#,
        ),
        lane_doc("throttle", 1, 50.0, r#"shedding: {mode: Throttle}"#),
        lane_doc(
            "defer",
            2,
            50.0,
            r#"shedding: {mode: Defer, minUnitsPerSecond: "20"}"#,
        ),
        lane_doc("pause", 3, 50.0, r#"shedding: {mode: Pause}"#),
        policy_doc(
            r#"  levels:
  - name: squeeze
    enterWhen: {queueDepthAbove: 10}
    actions:
      pause: [{lanes: [never, throttle, pause]}]
      cap: [{lanes: [never], unitsPerSecond: "5"}, {lanes: [defer], unitsPerSecond: "5"}]
"#,
        ),
    ]));
    // At level 0 nothing is applied, so nothing is refused.
    let d = run.step(&snap(0, Some(queue(0.0)), &[]));
    assert_eq!(d.level, 0);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    let d = run.step(&snap(10, Some(queue(50.0)), &[]));
    assert_eq!(d.level, 1);
    // Applied only where the contract allows it.
    assert_eq!(lane(&d, "pause").state, LaneState::Paused);
    close(lane(&d, "pause").admitted_units_per_second, 0.0);
    for name in ["never", "throttle", "defer"] {
        let l = lane(&d, name);
        assert_eq!(l.state, LaneState::Admitted, "{name}");
        close(l.admitted_units_per_second, 50.0);
        assert_eq!(l.level_cap_units_per_second, None, "{name}");
    }
    // One warning per refused action, naming policy, level and lane.
    let find = |lane: &str, verb: &str| {
        d.warnings
            .iter()
            .filter(|w| {
                w.to_string().contains("t/ladder")
                    && w.to_string().contains("level 1")
                    && w.to_string().contains(&format!("lane {lane}"))
                    && w.to_string().contains(verb)
            })
            .count()
    };
    assert_eq!(find("never", "pause"), 1, "{:#?}", d.warnings);
    assert_eq!(find("throttle", "pause"), 1, "{:#?}", d.warnings);
    assert_eq!(find("never", "cap"), 1, "{:#?}", d.warnings);
    assert_eq!(find("defer", "cap"), 1, "{:#?}", d.warnings);
    assert_eq!(
        find("pause", "pause"),
        0,
        "an applied pause is no warning: {:#?}",
        d.warnings
    );
    assert_eq!(d.warnings.len(), 4, "{:#?}", d.warnings);
}

#[test]
fn defer_lane_may_be_capped_down_to_its_minimum() {
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc(
            "defer",
            2,
            50.0,
            r#"shedding: {mode: Defer, minUnitsPerSecond: "20"}"#,
        ),
        policy_doc(
            r#"  levels:
  - name: squeeze
    enterWhen: {queueDepthAbove: 10}
    actions:
      cap: [{lanes: [defer], unitsPerSecond: "20"}]
"#,
        ),
    ]));
    let d = run.step(&snap(0, Some(queue(50.0)), &[]));
    let l = lane(&d, "defer");
    assert_eq!(l.state, LaneState::Capped);
    assert_eq!(l.limited_by.as_deref(), Some("level"));
    close(l.admitted_units_per_second, 20.0);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
}

// ---------------------------------------------------------------------------
// Allocation
// ---------------------------------------------------------------------------

#[test]
fn floors_are_reserved_in_priority_order() {
    // Floors add up to 150 on a capacity of 100: the most critical first.
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 60.0, r#"floorUnitsPerSecond: "60""#),
        lane_doc("b", 1, 60.0, r#"floorUnitsPerSecond: "60""#),
        lane_doc("c", 2, 30.0, r#"floorUnitsPerSecond: "30""#),
    ]));
    let d = run.step(&snap(0, Some(avail(100.0)), &[]));
    close(lane(&d, "a").admitted_units_per_second, 60.0);
    close(lane(&d, "b").admitted_units_per_second, 40.0);
    close(lane(&d, "c").admitted_units_per_second, 0.0);
    close(lane(&d, "b").reserved_units_per_second, 40.0);
    assert_eq!(lane(&d, "b").state, LaneState::Throttled);
    assert!(
        d.warnings
            .iter()
            .any(|w| w.to_string().contains("Overcommitted")),
        "{:?}",
        d.warnings
    );

    // A less critical lane's floor is reserved before a more critical lane
    // is filled beyond its own floor.
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("hi", 0, 200.0, ""),
        lane_doc("lo", 1, 100.0, r#"floorUnitsPerSecond: "40""#),
    ]));
    let d = run.step(&snap(0, Some(avail(150.0)), &[]));
    close(lane(&d, "hi").admitted_units_per_second, 110.0);
    close(lane(&d, "lo").admitted_units_per_second, 40.0);
    assert_eq!(lane(&d, "hi").state, LaneState::Throttled);
    assert_eq!(lane(&d, "lo").state, LaneState::Throttled);
}

#[test]
fn idle_floor_stays_reserved() {
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc(
            "a",
            0,
            20.0,
            r#"floorUnitsPerSecond: "50", shedding: {mode: Never}"#,
        ),
        lane_doc("b", 1, 200.0, ""),
    ]));
    let d = run.step(&snap(0, Some(avail(100.0)), &[]));
    let a = lane(&d, "a");
    close(a.admitted_units_per_second, 20.0);
    close(a.reserved_units_per_second, 50.0);
    assert_eq!(a.state, LaneState::Admitted);
    // b gets capacity minus a's whole floor, not minus a's demand.
    close(lane(&d, "b").admitted_units_per_second, 50.0);
    assert_eq!(lane(&d, "b").state, LaneState::Throttled);
    close(d.admitted_units_per_second, 70.0);
}

/// Lender `l` (priority 0, floor 60), a hungry `t` (priority 1), and a
/// borrower `b` (priority 3) that borrows up to `max` from `l`.
fn borrow_world(max: &str) -> Run {
    Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc(
            "l",
            0,
            60.0,
            r#"floorUnitsPerSecond: "60", shedding: {mode: Never}"#,
        ),
        lane_doc("t", 1, 500.0, ""),
        lane_doc(
            "b",
            3,
            100.0,
            &format!(
                r#"checkpointable: true, borrowing: {{from: [l], maxUnitsPerSecond: "{max}", leaseSeconds: 300, releaseWithinSeconds: 30}}"#
            ),
        ),
    ]))
}

#[test]
fn borrowing_takes_the_lenders_idle_floor_up_to_the_maximum() {
    let mut run = borrow_world("30");
    // Lender demand 20 of a 60 floor: 40 idle; max 30.
    let d = run.step(&snap(1000, Some(avail(200.0)), &[("l", 20.0)]));
    let b = lane(&d, "b");
    close(b.borrowed_units_per_second, 30.0);
    close(b.admitted_units_per_second, 30.0);
    assert_eq!(b.borrowing.len(), 1);
    assert_eq!(b.borrowing[0].from, "l");
    close(b.borrowing[0].units_per_second, 30.0);
    assert_eq!(
        b.borrowing[0].expires_at, 1300,
        "expiresAt = at + leaseSeconds"
    );
    assert_eq!(b.state, LaneState::Throttled);
    // t gets capacity minus l's whole floor.
    close(lane(&d, "t").admitted_units_per_second, 140.0);
    close(d.admitted_units_per_second, 190.0);
    assert!(d.admitted_units_per_second <= 200.0 + 1e-6);
}

#[test]
fn borrowing_is_limited_by_the_lenders_idle_floor() {
    let mut run = borrow_world("100");
    let d = run.step(&snap(0, Some(avail(200.0)), &[("l", 20.0)]));
    close(lane(&d, "b").borrowed_units_per_second, 40.0);
    close(d.admitted_units_per_second, 200.0);
}

#[test]
fn borrowing_shrinks_at_once_when_the_lenders_demand_rises() {
    let mut run = borrow_world("100");
    let d = run.step(&snap(0, Some(avail(200.0)), &[("l", 20.0)]));
    close(lane(&d, "b").borrowed_units_per_second, 40.0);
    let d = run.step(&snap(10, Some(avail(200.0)), &[("l", 50.0)]));
    close(lane(&d, "b").borrowed_units_per_second, 10.0);
    close(lane(&d, "l").admitted_units_per_second, 50.0);
    assert_eq!(lane(&d, "b").borrowing[0].expires_at, 310);
    let d = run.step(&snap(20, Some(avail(200.0)), &[("l", 60.0)]));
    close(lane(&d, "b").borrowed_units_per_second, 0.0);
    assert!(lane(&d, "b").borrowing.is_empty());
    close(lane(&d, "l").admitted_units_per_second, 60.0);
}

#[test]
fn borrowing_needs_checkpointable() {
    let mut run = borrow_world("100");
    // The API server would reject this object (CEL); the engine must not
    // grant anything either if it sees one.
    for l in &mut run.world.lanes {
        if l.metadata.name.as_deref() == Some("b") {
            l.spec.checkpointable = false;
        }
    }
    let d = run.step(&snap(0, Some(avail(200.0)), &[("l", 20.0)]));
    close(lane(&d, "b").borrowed_units_per_second, 0.0);
    close(lane(&d, "b").admitted_units_per_second, 0.0);
    assert!(lane(&d, "b").borrowing.is_empty());
}

#[test]
fn borrowing_is_limited_by_the_borrowers_unmet_cap() {
    let mut run = borrow_world("100");
    // Borrower demand 15 only.
    let d = run.step(&snap(0, Some(avail(200.0)), &[("l", 20.0), ("b", 15.0)]));
    close(lane(&d, "b").borrowed_units_per_second, 15.0);
    assert_eq!(lane(&d, "b").state, LaneState::Admitted);
    // With enough capacity the borrower needs no lease at all.
    let d = run.step(&snap(10, Some(avail(1000.0)), &[("l", 20.0), ("b", 15.0)]));
    close(lane(&d, "b").borrowed_units_per_second, 0.0);
    close(lane(&d, "b").admitted_units_per_second, 15.0);
}

#[test]
fn inc47_p3_borrows_p0s_idle_floor_when_short() {
    // P0 quiet (20 req/s × 1.8 = 36 of its 93.6 floor), P1 at its ceiling
    // of 400, capacity 300.
    let mut run = Run::new(INC47);
    let lanes = [("p0-disruption-assist", 20.0), ("p1-agent-assist", 400.0)];
    let d = run.step(&snap_for(
        INC47_PROFILE,
        "ai-platform",
        0,
        Some(avail(300.0)),
        &lanes,
    ));
    assert_eq!((d.level, d.pending_approval_level), (3, Some(4)));
    close(lane(&d, "p1-agent-assist").admitted_units_per_second, 166.4);
    let p3 = lane(&d, "p3-shift-batch");
    // Level 3 (continuity pending approval). Floors reserved: P0 93.6, P1
    // 120, P2 40 (its level cap); P1 takes the remaining 46.4. P0's idle
    // floor is 93.6 − 36 = 57.6, within P3's level cap of 60 and its max 60.
    close(p3.borrowed_units_per_second, 57.6);
    assert_eq!(p3.borrowing[0].from, "p0-disruption-assist");
    assert_eq!(p3.borrowing[0].expires_at, 300);
    assert!(d.admitted_units_per_second <= 300.0 + 1e-6);
}

#[test]
fn equal_priorities_share_by_weight() {
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("x", 1, 100.0, "weight: 1"),
        lane_doc("y", 1, 100.0, "weight: 3"),
    ]));
    let d = run.step(&snap(0, Some(avail(80.0)), &[]));
    close(lane(&d, "x").admitted_units_per_second, 20.0);
    close(lane(&d, "y").admitted_units_per_second, 60.0);
    // A lane that wants less than its share leaves the rest to the others.
    let d = run.step(&snap(1, Some(avail(80.0)), &[("x", 10.0)]));
    close(lane(&d, "x").admitted_units_per_second, 10.0);
    close(lane(&d, "y").admitted_units_per_second, 70.0);
    assert_eq!(lane(&d, "x").state, LaneState::Admitted);
    assert_eq!(lane(&d, "y").state, LaneState::Throttled);
    // Default weight is 1: equal split.
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("x", 1, 100.0, ""),
        lane_doc("y", 1, 100.0, ""),
    ]));
    let d = run.step(&snap(0, Some(avail(80.0)), &[]));
    close(lane(&d, "x").admitted_units_per_second, 40.0);
    close(lane(&d, "y").admitted_units_per_second, 40.0);
}

#[test]
fn strict_priority_fill_beyond_floors() {
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 100.0, ""),
        lane_doc("b", 1, 100.0, ""),
        lane_doc("c", 2, 100.0, ""),
    ]));
    let d = run.step(&snap(0, Some(avail(150.0)), &[]));
    close(lane(&d, "a").admitted_units_per_second, 100.0);
    close(lane(&d, "b").admitted_units_per_second, 50.0);
    close(lane(&d, "c").admitted_units_per_second, 0.0);
    assert_eq!(
        [
            lane(&d, "a").state,
            lane(&d, "b").state,
            lane(&d, "c").state
        ],
        [
            LaneState::Admitted,
            LaneState::Throttled,
            LaneState::Throttled
        ]
    );
    assert_eq!(lane(&d, "c").limited_by.as_deref(), Some("capacity"));
}

#[test]
fn lane_states_and_ceilings() {
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("admitted", 0, 30.0, ""),
        lane_doc("ceiling", 1, 300.0, r#"ceilingUnitsPerSecond: "200""#),
        lane_doc(
            "capped",
            2,
            100.0,
            r#"shedding: {mode: Defer, minUnitsPerSecond: "10"}"#,
        ),
        lane_doc("paused", 3, 100.0, r#"shedding: {mode: Pause}"#),
        lane_doc("throttled", 4, 500.0, ""),
        policy_doc(
            r#"  levels:
  - name: squeeze
    enterWhen: {queueDepthAbove: 10}
    actions:
      pause: [{priorityAtLeast: 3}]
      cap: [{lanes: [capped], unitsPerSecond: "25"}]
"#,
        ),
    ]));
    let mut sig = queue(50.0);
    sig.available_units_per_second = Some(400.0);
    let d = run.step(&snap(0, Some(sig), &[]));
    let expect = [
        ("admitted", LaneState::Admitted, 30.0, None),
        ("ceiling", LaneState::Capped, 200.0, Some("ceiling")),
        ("capped", LaneState::Capped, 25.0, Some("level")),
        ("paused", LaneState::Paused, 0.0, Some("pause")),
        ("throttled", LaneState::Throttled, 145.0, Some("capacity")),
    ];
    for (name, state, admitted, by) in expect {
        let l = lane(&d, name);
        assert_eq!(l.state, state, "{name}");
        close(l.admitted_units_per_second, admitted);
        assert_eq!(l.limited_by.as_deref(), by, "{name}");
    }
    // priorityAtLeast 3 also selects "throttled" (priority 4), but a Throttle
    // lane is never paused: refused, with a warning.
    assert!(
        d.warnings
            .iter()
            .any(|w| w.to_string().contains("lane throttled")),
        "{:?}",
        d.warnings
    );

    // A ceiling holds even with capacity to spare, and also bounds the floor.
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc(
            "c",
            0,
            300.0,
            r#"floorUnitsPerSecond: "50", ceilingUnitsPerSecond: "80""#,
        ),
    ]));
    let d = run.step(&snap(0, Some(avail(10000.0)), &[]));
    close(lane(&d, "c").admitted_units_per_second, 80.0);
    assert_eq!(lane(&d, "c").state, LaneState::Capped);
    close(lane(&d, "c").reserved_units_per_second, 50.0);
}

// ---------------------------------------------------------------------------
// Pool sizing
// ---------------------------------------------------------------------------

#[test]
fn inc47_pool_size_is_nine() {
    // 488.1 / (70 × 0.85) = 8.2 -> 9, whatever the capacity.
    for cap in [560.0, 420.0] {
        let mut run = Run::new(INC47);
        let d = run.step(&snap_for(
            INC47_PROFILE,
            "ai-platform",
            0,
            Some(avail(cap)),
            &[],
        ));
        assert_eq!(d.desired_replicas, Some(9), "capacity {cap}");
    }
}

#[test]
fn pool_size_is_clamped_to_min_and_max() {
    let quiet: Vec<(&str, f64)> = [
        "p0-disruption-assist",
        "p1-agent-assist",
        "p2-email-extract",
        "p3-shift-batch",
        "p4-eval-backfill",
    ]
    .into_iter()
    .map(|n| (n, 0.5))
    .collect();
    let mut run = Run::new(INC47);
    let d = run.step(&snap_for(
        INC47_PROFILE,
        "ai-platform",
        0,
        Some(avail(560.0)),
        &quiet,
    ));
    assert_eq!(d.desired_replicas, Some(4), "min");
    let loud: Vec<(&str, f64)> = quiet.iter().map(|(n, _)| (*n, 5000.0)).collect();
    let mut run = Run::new(INC47);
    let sig = ProfileSignals {
        ready_replicas: Some(16),
        ..Default::default()
    };
    let d = run.step(&snap_for(INC47_PROFILE, "ai-platform", 0, Some(sig), &loud));
    assert_eq!(d.desired_replicas, Some(16), "max");
}

#[test]
fn pool_scale_up_is_limited_per_step() {
    // 9 wanted, 2 ready, maxScaleUpStep 4: 6, then 9 once 6 are ready.
    let mut run = Run::new(INC47);
    let sig = |r| ProfileSignals {
        ready_replicas: Some(r),
        ..avail(560.0)
    };
    let d = run.step(&snap_for(
        INC47_PROFILE,
        "ai-platform",
        0,
        Some(sig(2)),
        &[],
    ));
    assert_eq!(d.desired_replicas, Some(6));
    let d = run.step(&snap_for(
        INC47_PROFILE,
        "ai-platform",
        60,
        Some(sig(6)),
        &[],
    ));
    assert_eq!(d.desired_replicas, Some(9));
    // Without a ready count, no step limit applies.
    let mut run = Run::new(INC47);
    let d = run.step(&snap_for(
        INC47_PROFILE,
        "ai-platform",
        0,
        Some(avail(560.0)),
        &[],
    ));
    assert_eq!(d.desired_replicas, Some(9));
}

#[test]
fn pool_scale_down_waits_for_the_stabilization_window() {
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 20.0, ""),
    ]));
    let at = |t, rps| snap(t, Some(avail(1000.0)), &[("a", rps)]);
    assert_eq!(run.step(&at(0, 95.0)).desired_replicas, Some(10));
    assert_eq!(run.step(&at(60, 35.0)).desired_replicas, Some(10));
    assert_eq!(run.step(&at(120, 55.0)).desired_replicas, Some(10)); // wants 6
    assert_eq!(run.step(&at(359, 35.0)).desired_replicas, Some(10));
    // 300 s after the window began: the highest count wanted in it.
    assert_eq!(run.step(&at(360, 35.0)).desired_replicas, Some(6));
    // A new window for the next step down.
    assert_eq!(run.step(&at(420, 35.0)).desired_replicas, Some(6));
    assert_eq!(run.step(&at(719, 35.0)).desired_replicas, Some(6));
    assert_eq!(run.step(&at(720, 35.0)).desired_replicas, Some(4));
    // Scale up is immediate.
    assert_eq!(run.step(&at(780, 201.0)).desired_replicas, Some(21));
}

#[test]
fn pool_scale_down_window_restarts_when_demand_comes_back() {
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 20.0, ""),
    ]));
    let at = |t, rps| snap(t, Some(avail(1000.0)), &[("a", rps)]);
    run.step(&at(0, 95.0));
    run.step(&at(60, 35.0));
    run.step(&at(120, 100.0)); // wants 10 again: the window is over
    assert_eq!(run.step(&at(360, 35.0)).desired_replicas, Some(10));
    assert_eq!(
        run.step(&at(420, 35.0)).desired_replicas,
        Some(10),
        "60 + 300 would have scaled down"
    );
    assert_eq!(run.step(&at(660, 35.0)).desired_replicas, Some(4));
}

#[test]
fn pool_never_scales_down_while_degraded_or_blind() {
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 20.0, ""),
        policy_doc(
            r#"  hysteresis: {stableForSeconds: 600}
  levels:
  - {name: one, enterWhen: {queueDepthAbove: 10}}
"#,
        ),
    ]));
    let d = run.step(&snap(0, Some(queue(50.0)), &[("a", 95.0)]));
    assert_eq!((d.level, d.desired_replicas), (1, Some(10)));
    for t in (60..660).step_by(60) {
        let d = run.step(&snap(t, Some(queue(0.0)), &[("a", 35.0)]));
        assert_eq!((d.level, d.desired_replicas), (1, Some(10)), "at {t}");
    }
    let d = run.step(&snap(660, Some(queue(0.0)), &[("a", 35.0)]));
    assert_eq!(
        (d.level, d.desired_replicas),
        (0, Some(10)),
        "the window starts at level 0"
    );
    // Unknown telemetry in between holds and restarts the window.
    let d = run.step(&snap(900, None, &[("a", 35.0)]));
    assert_eq!(
        (d.telemetry, d.desired_replicas),
        (Telemetry::Unknown, Some(10))
    );
    assert_eq!(
        run.step(&snap(960, Some(queue(0.0)), &[("a", 35.0)]))
            .desired_replicas,
        Some(10)
    );
    assert_eq!(
        run.step(&snap(1259, Some(queue(0.0)), &[("a", 35.0)]))
            .desired_replicas,
        Some(10)
    );
    assert_eq!(
        run.step(&snap(1260, Some(queue(0.0)), &[("a", 35.0)]))
            .desired_replicas,
        Some(4)
    );
}

#[test]
fn pool_does_not_shrink_while_pods_are_not_ready_yet() {
    // No policy (level 0 throughout). Demand 488.1 wants 9 replicas. Most
    // pods lose readiness for ten minutes (a node failure, a slow restart):
    // the scale-up step limit (ready + 4) must not pass for demand wanting
    // fewer replicas, or the pool would shrink and kill the pods that are
    // starting.
    let mut run = Run::new(INC47);
    run.world.policies.clear();
    let ready = |r| ProfileSignals {
        ready_replicas: Some(r),
        ..Default::default()
    };
    let d = run.step(&snap_for(
        INC47_PROFILE,
        "ai-platform",
        0,
        Some(ready(8)),
        &[],
    ));
    assert_eq!((d.level, d.desired_replicas), (0, Some(9)));
    for at in (60..=660).step_by(60) {
        let d = run.step(&snap_for(
            INC47_PROFILE,
            "ai-platform",
            at,
            Some(ready(2)),
            &[],
        ));
        assert_eq!(d.desired_replicas, Some(9), "at {at}: demand still wants 9");
    }
    // Demand that really wants fewer replicas still scales down after the
    // window, to what demand wants (not to ready + step).
    let quiet: Vec<(&str, f64)> = vec![("p1-agent-assist", 10.0)];
    // 93.6 + 10 + 66.5 + 99 + 49 = 318.1 -> ceil(318.1 / 59.5) = 6.
    let d = run.step(&snap_for(
        INC47_PROFILE,
        "ai-platform",
        720,
        Some(ready(8)),
        &quiet,
    ));
    assert_eq!(d.desired_replicas, Some(9));
    let d = run.step(&snap_for(
        INC47_PROFILE,
        "ai-platform",
        1020,
        Some(ready(8)),
        &quiet,
    ));
    assert_eq!(d.desired_replicas, Some(6));
}

#[test]
fn pool_size_unknown_until_first_known() {
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 20.0, ""),
    ]));
    assert_eq!(run.step(&snap(0, None, &[])).desired_replicas, None);
    assert_eq!(
        run.step(&snap(1, Some(avail(100.0)), &[])).desired_replicas,
        Some(2)
    );
}

// ---------------------------------------------------------------------------
// Drain
// ---------------------------------------------------------------------------

/// A pool whose demand (80 units/s) wants 8 replicas, so that with up to 8
/// pods it is not scaling down (which would hold new drains).
fn drain_world(drain: &str) -> Run {
    Run::new(&docs(&[profile_doc(drain), lane_doc("a", 0, 80.0, "")]))
}

fn drained_now(d: &ProfileDecision) -> Vec<&str> {
    d.drain
        .actions
        .iter()
        .filter(|p| matches!(p.action, DrainAction::Drain | DrainAction::Keep))
        .map(|p| p.pod.as_str())
        .collect()
}

#[test]
fn drain_takes_exactly_the_two_worst_of_eight() {
    let mut run = drain_world(DEFAULT_DRAIN);
    // 8 ready pods, 5 above 0.20; 25 % of 8 = 2, 8 − minServing 2 = 6.
    let sig = pods(&[
        Some(0.30),
        Some(0.90),
        Some(0.01),
        Some(0.50),
        Some(0.70),
        Some(0.25),
        Some(0.0),
        Some(0.2),
    ]);
    let d = run.step(&snap(0, Some(sig), &[]));
    assert_eq!(d.drain.drain_budget, 2);
    assert_eq!(d.drain.drained_pods, 2);
    assert_eq!(action_of(&d, "pod-1"), Some(DrainAction::Drain));
    assert_eq!(action_of(&d, "pod-4"), Some(DrainAction::Drain));
    for p in ["pod-0", "pod-3", "pod-5"] {
        assert_eq!(action_of(&d, p), Some(DrainAction::Refused), "{p}");
    }
    // At the threshold is not above it; healthy pods get no action.
    for p in ["pod-2", "pod-6", "pod-7"] {
        assert_eq!(action_of(&d, p), None, "{p}");
    }
    assert_eq!(drained(&run, POOL), vec!["pod-1", "pod-4"]);
}

#[test]
fn drain_nothing_with_three_ready_pods() {
    let mut run = drain_world(DEFAULT_DRAIN);
    let d = run.step(&snap(
        0,
        Some(pods(&[Some(0.9), Some(0.9), Some(0.9)])),
        &[],
    ));
    assert_eq!((d.drain.drain_budget, d.drain.drained_pods), (0, 0));
    assert!(
        d.drain
            .actions
            .iter()
            .all(|p| p.action == DrainAction::Refused)
    );
    assert_eq!(d.drain.actions.len(), 3);
}

#[test]
fn drain_min_serving_bounds_an_integer_max() {
    // maxDrained 5 of 4 ready pods, minServing 2: at most 2.
    let mut run = drain_world(
        r#"{maxDrained: 5, minServing: 2, errorRatioAbove: "0.2", healthyForSeconds: 120}"#,
    );
    let d = run.step(&snap(
        0,
        Some(pods(&[Some(0.9), Some(0.8), Some(0.7), Some(0.6)])),
        &[],
    ));
    assert_eq!((d.drain.drain_budget, d.drain.drained_pods), (2, 2));
    assert_eq!(drained_now(&d), vec!["pod-0", "pod-1"]);
}

#[test]
fn drain_ties_are_broken_by_name() {
    let mut run = drain_world(DEFAULT_DRAIN);
    let mut errs = [Some(0.0); 8];
    errs[7] = Some(0.5);
    errs[2] = Some(0.5);
    errs[5] = Some(0.5);
    let d = run.step(&snap(0, Some(pods(&errs)), &[]));
    assert_eq!(drained_now(&d), vec!["pod-2", "pod-5"]);
    assert_eq!(action_of(&d, "pod-7"), Some(DrainAction::Refused));
}

#[test]
fn drain_ignores_unready_pods_and_counts_only_ready_ones() {
    let mut run = drain_world(DEFAULT_DRAIN);
    let mut sig = pods(&[Some(0.0); 8]);
    sig.pods.insert("pod-0".into(), pod(Some(false), Some(0.9)));
    sig.pods.insert("pod-1".into(), pod(Some(false), Some(0.9)));
    sig.pods.insert("pod-2".into(), pod(Some(true), Some(0.4)));
    sig.pods.insert("pod-3".into(), pod(Some(true), Some(0.3)));
    // 6 ready: 25 % = 1.
    let d = run.step(&snap(0, Some(sig), &[]));
    assert_eq!(d.drain.drain_budget, 1);
    assert_eq!(drained_now(&d), vec!["pod-2"]);
    assert_eq!(
        action_of(&d, "pod-0"),
        None,
        "liveness is not readiness: unready pods are not drained"
    );
}

#[test]
fn drained_pod_is_undrained_after_healthy_for_seconds() {
    let mut run = drain_world(DEFAULT_DRAIN);
    let mut errs = [Some(0.0); 8];
    errs[3] = Some(0.9);
    assert_eq!(
        action_of(&run.step(&snap(0, Some(pods(&errs)), &[])), "pod-3"),
        Some(DrainAction::Drain)
    );
    errs[3] = Some(0.1);
    assert_eq!(
        action_of(&run.step(&snap(60, Some(pods(&errs)), &[])), "pod-3"),
        Some(DrainAction::Keep)
    );
    assert_eq!(
        action_of(&run.step(&snap(179, Some(pods(&errs)), &[])), "pod-3"),
        Some(DrainAction::Keep)
    );
    let d = run.step(&snap(180, Some(pods(&errs)), &[]));
    assert_eq!(action_of(&d, "pod-3"), Some(DrainAction::Undrain));
    assert_eq!(d.drain.drained_pods, 0);
    assert!(drained(&run, POOL).is_empty());
}

#[test]
fn healthy_window_restarts_when_the_pod_turns_bad_again() {
    let mut run = drain_world(DEFAULT_DRAIN);
    let mut errs = [Some(0.0); 8];
    errs[3] = Some(0.9);
    run.step(&snap(0, Some(pods(&errs)), &[]));
    errs[3] = Some(0.1);
    run.step(&snap(60, Some(pods(&errs)), &[]));
    errs[3] = Some(0.5);
    run.step(&snap(120, Some(pods(&errs)), &[]));
    errs[3] = Some(0.1);
    run.step(&snap(180, Some(pods(&errs)), &[]));
    // 60 + 120 = 180 would have undrained; the window began again at 180.
    assert_eq!(
        action_of(&run.step(&snap(240, Some(pods(&errs)), &[])), "pod-3"),
        Some(DrainAction::Keep)
    );
    assert_eq!(
        action_of(&run.step(&snap(300, Some(pods(&errs)), &[])), "pod-3"),
        Some(DrainAction::Undrain)
    );
}

#[test]
fn no_evidence_neither_drains_nor_undrains() {
    let mut run = drain_world(DEFAULT_DRAIN);
    let mut errs = [Some(0.0); 8];
    errs[3] = Some(0.9);
    run.step(&snap(0, Some(pods(&errs)), &[]));
    // pod-3 loses its error ratio: stays drained however long.
    errs[3] = None;
    for t in [60, 600, 6000] {
        let d = run.step(&snap(t, Some(pods(&errs)), &[]));
        assert_eq!(action_of(&d, "pod-3"), Some(DrainAction::Keep), "at {t}");
    }
    // A pod without evidence is never a candidate.
    let mut run = drain_world(DEFAULT_DRAIN);
    let d = run.step(&snap(0, Some(pods(&[None; 8])), &[]));
    assert!(d.drain.actions.is_empty());
    assert_eq!(d.drain.drained_pods, 0);
}

#[test]
fn gone_pods_leave_the_count() {
    let mut run = drain_world(
        r#"{maxDrained: 2, minServing: 2, errorRatioAbove: "0.2", healthyForSeconds: 120}"#,
    );
    let mut errs = [Some(0.0); 8];
    errs[1] = Some(0.9);
    errs[2] = Some(0.8);
    errs[3] = Some(0.7);
    let d = run.step(&snap(0, Some(pods(&errs)), &[]));
    assert_eq!(drained_now(&d), vec!["pod-1", "pod-2"]);
    assert_eq!(action_of(&d, "pod-3"), Some(DrainAction::Refused));
    // pod-1 is gone: it no longer counts, so pod-3 can be drained.
    let mut sig = pods(&errs);
    sig.pods.remove("pod-1");
    let d = run.step(&snap(60, Some(sig), &[]));
    assert_eq!(action_of(&d, "pod-1"), None);
    assert_eq!(action_of(&d, "pod-2"), Some(DrainAction::Keep));
    assert_eq!(action_of(&d, "pod-3"), Some(DrainAction::Drain));
    assert_eq!(d.drain.drained_pods, 2);
    assert_eq!(drained(&run, POOL), vec!["pod-2", "pod-3"]);
}

#[test]
fn over_the_bound_the_healthiest_drained_pods_are_released_first() {
    let mut run = drain_world(DEFAULT_DRAIN);
    let mut errs = [Some(0.0); 8];
    errs[1] = Some(0.5);
    errs[2] = Some(0.9);
    let d = run.step(&snap(0, Some(pods(&errs)), &[]));
    assert_eq!(drained_now(&d), vec!["pod-1", "pod-2"]);
    // Four other pods lose readiness: 4 ready, bound min(1, 2) = 1.
    let mut sig = pods(&errs);
    for p in ["pod-4", "pod-5", "pod-6", "pod-7"] {
        sig.pods.insert(p.into(), pod(Some(false), Some(0.0)));
    }
    let d = run.step(&snap(60, Some(sig), &[]));
    assert_eq!(d.drain.drain_budget, 1);
    assert_eq!(action_of(&d, "pod-1"), Some(DrainAction::Undrain));
    assert!(
        d.drain
            .actions
            .iter()
            .any(|p| p.pod == "pod-1" && p.reason.to_string().contains("OverBound"))
    );
    assert_eq!(action_of(&d, "pod-2"), Some(DrainAction::Keep));
    assert_eq!(d.drain.drained_pods, 1);
}

#[test]
fn no_new_drains_while_scaling_down() {
    let sig = || {
        let mut s = pods(&[
            Some(0.0),
            Some(0.9),
            Some(0.0),
            Some(0.0),
            Some(0.0),
            Some(0.0),
            Some(0.0),
            Some(0.0),
        ]);
        s.ready_replicas = Some(12);
        s
    };
    // Demand 40 wants 4 replicas, 12 are ready: scaling down.
    let mut run = drain_world(DEFAULT_DRAIN);
    let d = run.step(&snap(0, Some(sig()), &[("a", 40.0)]));
    assert!(d.desired_replicas.unwrap() < 12);
    assert_eq!(action_of(&d, "pod-1"), Some(DrainAction::Refused));
    assert_eq!(d.drain.drained_pods, 0);
    // Demand 200 wants 20: not scaling down, so the pod is drained.
    let mut run = drain_world(DEFAULT_DRAIN);
    let d = run.step(&snap(0, Some(sig()), &[("a", 200.0)]));
    assert_eq!(action_of(&d, "pod-1"), Some(DrainAction::Drain));
}

#[test]
fn drain_without_a_drain_spec_never_drains() {
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN).replace(&format!("  drain: {DEFAULT_DRAIN}\n"), ""),
        lane_doc("a", 0, 20.0, ""),
    ]));
    assert!(run.world.profiles[0].spec.drain.is_none());
    let d = run.step(&snap(0, Some(pods(&[Some(0.9); 8])), &[]));
    assert_eq!(d.drain.drained_pods, 0);
    assert!(d.drain.actions.is_empty());
}

// ---------------------------------------------------------------------------
// Binding
// ---------------------------------------------------------------------------

#[test]
fn lane_without_its_profile_takes_no_part() {
    let yaml = docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 20.0, ""),
        lane_doc("ghost", 0, 500.0, "").replace("profile: pool", "profile: nowhere"),
    ]);
    let mut run = Run::new(&yaml);
    let b = bind(&run.world);
    assert_eq!(b.bindings.len(), 1);
    assert_eq!(b.bindings[0].lanes.len(), 1);
    assert!(
        b.warnings
            .iter()
            .any(|w| w.to_string().contains("t/ghost") && w.to_string().contains("nowhere")),
        "{:?}",
        b.warnings
    );
    let e = run.eval(&snap(0, Some(avail(100.0)), &[]));
    assert!(
        e.warnings.iter().any(|w| w.to_string().contains("t/ghost")),
        "{:?}",
        e.warnings
    );
    let d = &e.profiles[0];
    assert_eq!(d.lanes.len(), 1);
    close(d.demand_units_per_second, 20.0);
}

#[test]
fn of_two_policies_the_older_governs() {
    let newer = policy_doc(
        r#"  levels:
  - {name: newer-one, enterWhen: {queueDepthAbove: 100000}}
"#,
    )
    .replace(
        "name: ladder, namespace: t",
        "name: newer, namespace: t, creationTimestamp: \"2026-02-01T00:00:00Z\"",
    );
    let older = policy_doc(
        r#"  levels:
  - {name: older-one, enterWhen: {queueDepthAbove: 10}}
"#,
    )
    .replace(
        "name: ladder, namespace: t",
        "name: older, namespace: t, creationTimestamp: \"2026-01-01T00:00:00Z\"",
    );
    // The newer one comes first in the input: order must not matter.
    let mut run = Run::new(&docs(&[
        profile_doc(DEFAULT_DRAIN),
        lane_doc("a", 0, 20.0, ""),
        newer,
        older,
    ]));
    let b = bind(&run.world);
    assert_eq!(
        b.bindings[0]
            .policy
            .and_then(|p| p.metadata.name.as_deref()),
        Some("older")
    );
    let d = run.step(&snap(0, Some(queue(50.0)), &[]));
    assert_eq!(d.policy.as_deref(), Some("t/older"));
    assert_eq!((d.level, d.level_name.as_str()), (1, "older-one"));
    assert!(
        d.warnings.iter().any(|w| w.to_string().contains("t/newer")
            && w.to_string().contains("older")
            && w.to_string().contains("ignored")),
        "{:?}",
        d.warnings
    );
}

#[test]
fn evaluate_profile_agrees_with_evaluate() {
    let world = load(INC47);
    let s = snap_for(INC47_PROFILE, "ai-platform", 0, Some(avail(420.0)), &[]);
    let (e, state) = evaluate(&world, &s, &Approvals::new(), &EngineState::default());
    let b = bind(&world);
    let (d, ps) = evaluate_profile(&b.bindings[0], &s, None, &Default::default());
    assert_eq!(e.profiles[0], d);
    assert_eq!(state.profiles[INC47_PROFILE], ps);
}

// ---------------------------------------------------------------------------
// INC-47
// ---------------------------------------------------------------------------

#[test]
fn inc47_at_560() {
    let mut run = Run::new(INC47);
    let d = run.step(&snap_for(
        INC47_PROFILE,
        "ai-platform",
        0,
        Some(avail(560.0)),
        &[],
    ));
    assert_eq!((d.level, d.level_name.as_str()), (1, "conserve"));
    assert_eq!(d.telemetry, Telemetry::Known);
    assert_eq!(d.pending_approval_level, None);
    assert_eq!(d.capacity_units_per_second, Some(560.0));
    close(d.demand_units_per_second, 488.1);
    close(d.admitted_units_per_second, 488.1);
    assert_eq!(d.desired_replicas, Some(9));
    assert!(
        d.gateway.reject_optional_context && !d.gateway.use_fallback_routes && !d.gateway.read_only
    );
    let want = [93.6, 180.0, 66.5, 99.0, 49.0];
    assert_eq!(d.lanes.len(), 5);
    for (l, w) in d.lanes.iter().zip(want) {
        assert_eq!(l.state, LaneState::Admitted, "{}", l.name);
        close(l.demand_units_per_second, w);
        close(l.admitted_units_per_second, w);
    }
    let inflight = d
        .gateway
        .in_flight
        .as_ref()
        .expect("watermarks passed through");
    assert_eq!(
        (
            inflight.conserve_at,
            inflight.stop_at,
            inflight.resume_below
        ),
        (1350, 1500, 1200)
    );
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
}

#[test]
fn inc47_at_420() {
    let mut run = Run::new(INC47);
    let d = run.step(&snap_for(
        INC47_PROFILE,
        "ai-platform",
        0,
        Some(avail(420.0)),
        &[],
    ));
    assert_eq!((d.level, d.level_name.as_str()), (2, "shed"));
    assert_eq!(d.pending_approval_level, None);
    close(d.demand_units_per_second, 488.1);
    close(d.admitted_units_per_second, 400.1);
    assert_eq!(d.desired_replicas, Some(9));
    let want = [
        ("p0-disruption-assist", LaneState::Admitted, 93.6),
        ("p1-agent-assist", LaneState::Admitted, 180.0),
        ("p2-email-extract", LaneState::Admitted, 66.5),
        ("p3-shift-batch", LaneState::Capped, 60.0),
        ("p4-eval-backfill", LaneState::Paused, 0.0),
    ];
    for (name, state, admitted) in want {
        let l = lane(&d, name);
        assert_eq!(l.state, state, "{name}");
        close(l.admitted_units_per_second, admitted);
        close(l.borrowed_units_per_second, 0.0);
    }
    assert_eq!(
        lane(&d, "p3-shift-batch").level_cap_units_per_second,
        Some(60.0)
    );
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
}

#[test]
fn inc47_timeline() {
    let text = include_str!("../../examples/inc-47/signals.yaml");
    let timeline: SignalsFile = serde_yaml::from_str(text).expect("signals parse");
    let mut run = Run::new(INC47);
    let mut prev_exit: Option<i64> = None;
    let mut last_change: Option<i64> = None;
    let mut downs = 0;
    for s in &timeline.steps {
        let d = run.step(s);
        let cap = d.capacity_units_per_second.expect("known throughout");
        if (cap - 420.0).abs() < 1e-9 {
            assert_eq!((d.level, d.level_name.as_str()), (2, "shed"), "at {}", s.at);
            close(d.admitted_units_per_second, 400.1);
        }
        if let Some(t) = &d.transition
            && t.to < t.from
        {
            downs += 1;
            assert_eq!(t.from - t.to, 1, "one level at a time at {}", s.at);
            let began = prev_exit.expect("a step down needs an exit window");
            assert!(
                s.at - began >= 300,
                "stepped down at {} after a window from {began}",
                s.at
            );
            if let Some(c) = last_change {
                assert!(
                    s.at - c >= 300,
                    "two changes within 300 s: {c} and {}",
                    s.at
                );
            }
        }
        if d.transition.is_some() {
            last_change = Some(s.at);
        }
        prev_exit = d.exit_holding_since;
    }
    assert_eq!(downs, 2, "2 -> 1 -> 0 on recovery");
    // It ends back at normal.
    let last = run.state.profiles[INC47_PROFILE].level;
    assert_eq!(last, 0);
}

/// Drain requests by annotation are honoured within the bound, before
/// error-ratio candidates, and released when withdrawn.
#[test]
fn drain_requests_go_first_within_the_bound_and_are_released_when_withdrawn() {
    use lanekeeper::api::DrainSpec;
    use lanekeeper::policy::DrainAction;
    use lanekeeper::policy::drain::decide;
    use std::collections::BTreeMap;
    let spec: DrainSpec = serde_yaml::from_str(
        "{maxDrained: \"25%\", minServing: 2, errorRatioAbove: \"0.20\", healthyForSeconds: 60}",
    )
    .unwrap();
    let mut sig = lanekeeper::snapshot::ProfileSignals::default();
    for i in 0..8 {
        let name = format!("pod-{i}");
        let err = if i < 3 { 0.9 - i as f64 * 0.1 } else { 0.01 };
        sig.pods.insert(
            name,
            PodSignals {
                ready: Some(true),
                error_ratio: Some(err),
                drain_requested: (i == 6).then_some(true),
                revision: None,
            },
        );
    }
    let (out, out_drained) = decide(Some(&spec), Some(&sig), 0, true, false, &BTreeMap::new());
    let drained: Vec<&str> = out
        .actions
        .iter()
        .filter(|a| a.action == DrainAction::Drain)
        .map(|a| a.pod.as_str())
        .collect();
    // Bound 2: the request first, then the worst error ratio.
    assert_eq!(drained, vec!["pod-0", "pod-6"]);
    assert!(
        out_drained["pod-6"]
            .reason
            .to_string()
            .starts_with("DrainRequested")
    );
    assert_eq!(
        out.actions
            .iter()
            .filter(|a| a.action == DrainAction::Refused)
            .count(),
        2
    );
    // Still requested: kept. Withdrawn: undrained at once (its error ratio is fine).
    let (_, kept_drained) = decide(Some(&spec), Some(&sig), 10, true, false, &out_drained);
    assert!(kept_drained.contains_key("pod-6"));
    sig.pods.get_mut("pod-6").unwrap().drain_requested = None;
    let (released, released_drained) =
        decide(Some(&spec), Some(&sig), 20, true, false, &kept_drained);
    assert!(!released_drained.contains_key("pod-6"));
    assert!(released.actions.iter().any(|a| a.pod == "pod-6"
        && a.action == DrainAction::Undrain
        && a.reason.to_string() == "DrainRequestWithdrawn"));
    // A request on a pod that is not ready is not drained.
    let mut sig2 = sig.clone();
    sig2.pods.get_mut("pod-7").unwrap().drain_requested = Some(true);
    sig2.pods.get_mut("pod-7").unwrap().ready = Some(false);
    let (_, out2_drained) = decide(Some(&spec), Some(&sig2), 0, true, false, &BTreeMap::new());
    assert!(!out2_drained.contains_key("pod-7"));
}

/// A configured capacity measurement that is missing makes capacity Unknown:
/// no fallback to ready replicas (every replica can be ready while the
/// provider is degraded).
#[test]
fn a_missing_capacity_measurement_is_not_replaced_by_replica_counts() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/inc-47/inc-47.yaml"
    ))
    .unwrap();
    let mut loaded = lanekeeper::manifest::Loaded::default();
    lanekeeper::manifest::load_str(std::path::Path::new("inc-47.yaml"), &text, &mut loaded)
        .unwrap();
    let mut snap = lanekeeper::snapshot::Snapshot::default();
    let mut sig = lanekeeper::snapshot::ProfileSignals {
        ready_replicas: Some(8),
        ..Default::default()
    };
    snap.profiles
        .insert("ai-platform/agent-assist".into(), sig.clone());
    let (known, _) = lanekeeper::policy::evaluate(
        &loaded.world,
        &snap,
        &Default::default(),
        &Default::default(),
    );
    assert_eq!(
        known.profiles[0].capacity_units_per_second,
        Some(560.0),
        "ready replicas give capacity when nothing is measured"
    );
    sig.unknown.insert(
        "availableUnitsPerSecond".into(),
        "unreachable: connection refused".into(),
    );
    snap.profiles.insert("ai-platform/agent-assist".into(), sig);
    let (unknown, _) = lanekeeper::policy::evaluate(
        &loaded.world,
        &snap,
        &Default::default(),
        &Default::default(),
    );
    assert_eq!(unknown.profiles[0].capacity_units_per_second, None);
    assert_eq!(
        unknown.profiles[0].telemetry,
        lanekeeper::policy::Telemetry::Unknown
    );
}

/// A trigger on a signal nobody provides (no source configured, nothing
/// reported Unknown) never holds and does not pin its level: INC-47's
/// `protect` level (overCapacity or inFlightAbove) is left with cluster-only
/// signals once capacity is back.
#[test]
fn a_trigger_on_a_signal_nobody_provides_does_not_pin_the_level() {
    let mut run = queue_ladder(300);
    assert_eq!(run.step(&snap(0, Some(queue(15.0)), &[])).level, 1);
    let d = run.step(&snap(60, Some(avail(1000.0)), &[]));
    assert_eq!(d.exit_holding_since, Some(60));
    assert_eq!(run.step(&snap(360, Some(avail(1000.0)), &[])).level, 0);
}

/// The policy's `Valid` condition lists every overridden action of the whole
/// ladder, active or not, with the engine's own rule.
#[test]
fn contract_overrides_cover_every_level() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/inc-47/inc-47.yaml"
    ))
    .unwrap()
    .replace(
        "cap: [{lanes: [p2-email-extract], unitsPerSecond: \"40\"}]",
        "cap: [{lanes: [p0-disruption-assist], unitsPerSecond: \"40\"}]",
    )
    .replace(
        "pause: [{priorityAtLeast: 4}]",
        "pause: [{priorityAtLeast: 3}]",
    );
    let mut loaded = lanekeeper::manifest::Loaded::default();
    lanekeeper::manifest::load_str(std::path::Path::new("inc-47.yaml"), &text, &mut loaded)
        .unwrap();
    let lanes: Vec<&lanekeeper::api::LaneContract> = loaded.world.lanes.iter().collect();
    let o = lanekeeper::policy::contract_overrides(&loaded.world.policies[0], &lanes);
    assert_eq!(o.len(), 2, "{o:#?}");
    assert!(
        o.iter().any(|w| w
            .to_string()
            .contains("level 2 (shed) would pause lane p3-shift-batch")),
        "{o:#?}"
    );
    assert!(
        o.iter().any(|w| w
            .to_string()
            .contains("level 3 (protect) would cap lane p0-disruption-assist")),
        "{o:#?}"
    );
    // The unmodified example overrides nothing.
    let mut plain = lanekeeper::manifest::Loaded::default();
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/inc-47/inc-47.yaml"
    ))
    .unwrap();
    lanekeeper::manifest::load_str(std::path::Path::new("inc-47.yaml"), &text, &mut plain).unwrap();
    let lanes: Vec<&lanekeeper::api::LaneContract> = plain.world.lanes.iter().collect();
    assert!(lanekeeper::policy::contract_overrides(&plain.world.policies[0], &lanes).is_empty());
}
