//! The decide-on-evidence rules at their edges: unknown never relaxes,
//! sustained triggers, the cool-down, staged recovery, human gates and
//! approvals, retries apart from demand. (The property over random timelines
//! is `unknown_never_relaxes` in tests/it/engine_properties.rs.)

use std::path::Path;

use lanekeeper::api::Approval;
use lanekeeper::manifest::{Loaded, load_str};
use lanekeeper::policy::{Approvals, EngineState, LaneState, ProfileDecision, World, evaluate};
use lanekeeper::snapshot::{LaneSignals, ProfileSignals, Snapshot};

const POOL: &str = "t/pool";

fn world(policy_body: &str, lanes: &[(&str, i32, &str)]) -> World {
    let mut yaml = String::from(
        r#"---
apiVersion: lanekeeper.dev/v1alpha1
kind: CapacityProfile
metadata: {name: pool, namespace: t}
spec:
  pool:
    scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: pool}
    podSelector: {matchLabels: {app: pool}}
  capacity: {safeUnitsPerSecond: "100", unitsPerReplica: "10", warningUtilizationPercent: 100}
  replicas: {min: 1, max: 50, maxScaleUpStep: 50, scaleDownStabilizationSeconds: 0}
"#,
    );
    for (name, prio, extra) in lanes {
        yaml.push_str(&format!(
            r#"---
apiVersion: lanekeeper.dev/v1alpha1
kind: LaneContract
metadata: {{name: {name}, namespace: t}}
spec: {{profile: pool, priority: {prio}, workUnitsPerRequest: "1", expectedRequestsPerSecond: "40", deadlineSeconds: 100, queue: {{maxDepth: 10, ttlSeconds: 50}}, retry: {{maxAttempts: 1}}, routes: {{primary: [r]}}{extra}}}
"#
        ));
    }
    yaml.push_str(&format!(
        "---\napiVersion: lanekeeper.dev/v1alpha1\nkind: DegradationPolicy\nmetadata: {{name: ladder, namespace: t}}\nspec:\n  profile: pool\n{policy_body}"
    ));
    let mut loaded = Loaded::default();
    load_str(Path::new("test.yaml"), &yaml, &mut loaded).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    loaded.world
}

/// Two lanes: `a` (Never, priority 0) and `b` (Defer to 10, priority 3);
/// level 1 caps `b` at 10 when over capacity.
const SHED: &str = r#"  hysteresis: {stableForSeconds: 60}
  levels:
  - name: shed
    enterWhen: {overCapacity: true}
    actions: {cap: [{lanes: [b], unitsPerSecond: "10"}]}
"#;

fn lanes_ab() -> Vec<(&'static str, i32, &'static str)> {
    vec![
        ("a", 0, ", shedding: {mode: Never}"),
        (
            "b",
            3,
            r#", shedding: {mode: Defer, minUnitsPerSecond: "10"}"#,
        ),
    ]
}

struct Run {
    world: World,
    state: EngineState,
    approvals: Approvals,
}

impl Run {
    fn new(world: World) -> Self {
        Self {
            world,
            state: EngineState::default(),
            approvals: Approvals::new(),
        }
    }
    fn step(&mut self, s: &Snapshot) -> ProfileDecision {
        let (e, next) = evaluate(&self.world, s, &self.approvals, &self.state);
        self.state = next;
        e.profiles.into_iter().next().unwrap()
    }
}

fn snap(at: i64, capacity: Option<f64>, queue: Option<f64>, lanes: &[(&str, f64)]) -> Snapshot {
    let mut s = Snapshot {
        at,
        ..Default::default()
    };
    let mut p = ProfileSignals {
        available_units_per_second: capacity,
        queue_depth: queue,
        ..Default::default()
    };
    if capacity.is_none() {
        p.unknown
            .insert("availableUnitsPerSecond".into(), "timeout".into());
    }
    if queue.is_none() {
        p.unknown
            .insert("queueDepth".into(), "scrape failed".into());
    }
    s.profiles.insert(POOL.into(), p);
    for (l, rps) in lanes {
        s.lanes.insert(
            format!("t/{l}"),
            LaneSignals {
                requests_per_second: Some(*rps),
                ..Default::default()
            },
        );
    }
    s
}

fn admitted(d: &ProfileDecision, lane: &str) -> f64 {
    d.lanes
        .iter()
        .find(|l| l.name == lane)
        .unwrap()
        .admitted_units_per_second
}

fn lane_of<'a>(d: &'a ProfileDecision, lane: &str) -> &'a lanekeeper::policy::LaneDecision {
    d.lanes.iter().find(|l| l.name == lane).unwrap()
}

// --- Rule 1: unknown never relaxes ---------------------------------------

#[test]
fn a_failed_lane_rate_holds_its_last_known_value_and_nothing_relaxes() {
    let mut run = Run::new(world(SHED, &lanes_ab()));
    let d = run.step(&snap(0, Some(60.0), Some(0.0), &[("a", 40.0), ("b", 40.0)]));
    assert_eq!(d.level, 1);
    assert_eq!(admitted(&d, "b"), 10.0);
    let replicas = d.desired_replicas;
    // Capacity is back, but b's rate source fails: b holds 40 (not its
    // expected rate, not zero), the level holds, b stays capped.
    let mut s = snap(120, Some(200.0), Some(0.0), &[("a", 40.0)]);
    s.lanes.insert(
        "t/b".into(),
        LaneSignals {
            requests_per_second: Some(f64::NAN),
            ..Default::default()
        },
    );
    for at in [120, 180, 240, 300] {
        s.at = at;
        let d = run.step(&s);
        assert_eq!(d.level, 1, "no step down on an unknown lane rate at {at}");
        let b = lane_of(&d, "b");
        assert_eq!(b.demand_source, "Held");
        assert_eq!(b.demand_units_per_second, 40.0);
        assert_eq!(b.admitted_units_per_second, 10.0);
        assert!(d.desired_replicas >= replicas);
    }
    // Known again: the way down starts from the first known step.
    let d = run.step(&snap(
        360,
        Some(200.0),
        Some(0.0),
        &[("a", 40.0), ("b", 40.0)],
    ));
    assert_eq!((d.level, d.exit_holding_since), (1, Some(360)));
    assert_eq!(
        run.step(&snap(
            419,
            Some(200.0),
            Some(0.0),
            &[("a", 40.0), ("b", 40.0)]
        ))
        .level,
        1
    );
    assert_eq!(
        run.step(&snap(
            420,
            Some(200.0),
            Some(0.0),
            &[("a", 40.0), ("b", 40.0)]
        ))
        .level,
        0
    );
}

#[test]
fn a_lane_without_a_rate_source_uses_its_expected_rate_and_one_never_known_too() {
    let mut run = Run::new(world(SHED, &lanes_ab()));
    let d = run.step(&snap(0, Some(200.0), Some(0.0), &[]));
    assert_eq!(lane_of(&d, "a").demand_source, "Expected");
    assert_eq!(lane_of(&d, "a").demand_units_per_second, 40.0);
    let mut s = snap(60, Some(200.0), Some(0.0), &[]);
    s.lanes.insert(
        "t/a".into(),
        LaneSignals {
            unknown: [("requestsPerSecond".to_owned(), "query failed".to_owned())].into(),
            ..Default::default()
        },
    );
    let d = run.step(&s);
    // Never known: it holds the expected rate, but as Held (nothing relaxes).
    assert_eq!(lane_of(&d, "a").demand_source, "Held");
    assert_eq!(lane_of(&d, "a").demand_units_per_second, 40.0);
}

#[test]
fn unknown_capacity_never_raises_an_admitted_rate() {
    let mut run = Run::new(world(SHED, &lanes_ab()));
    run.step(&snap(0, Some(60.0), Some(0.0), &[("a", 40.0), ("b", 40.0)]));
    // Capacity unknown while a's demand grows: a holds at 40.
    let d = run.step(&snap(60, None, Some(0.0), &[("a", 90.0), ("b", 40.0)]));
    assert_eq!(admitted(&d, "a"), 40.0);
    assert_eq!(d.level, 1);
}

#[test]
fn a_failed_scrape_makes_its_trigger_unknown_and_pins_the_level() {
    let body = "  hysteresis: {stableForSeconds: 10}\n  levels:\n  - name: one\n    enterWhen: {queueDepthAbove: 100}\n";
    let mut run = Run::new(world(body, &lanes_ab()));
    let lanes = [("a", 10.0), ("b", 10.0)];
    assert_eq!(
        run.step(&snap(0, Some(200.0), Some(500.0), &lanes)).level,
        1
    );
    for at in (10..=300).step_by(10) {
        let mut s = snap(at, Some(200.0), Some(0.0), &lanes);
        let p = s.profiles.get_mut(POOL).unwrap();
        p.queue_depth = None;
        p.unknown
            .insert("scrape:queueDepth".into(), "vllm-2: timeout".into());
        assert_eq!(run.step(&s).level, 1, "at {at}: the scrape source failed");
    }
    assert_eq!(
        run.step(&snap(310, Some(200.0), Some(0.0), &lanes)).level,
        1
    );
    assert_eq!(
        run.step(&snap(320, Some(200.0), Some(0.0), &lanes)).level,
        0
    );
}

// --- Rule 2: sustained triggers ------------------------------------------

const SUSTAINED: &str = r#"  hysteresis: {stableForSeconds: 60}
  levels:
  - name: conserve
    enterWhen: {queueDepthAbove: 100, forSeconds: 60}
"#;

#[test]
fn a_level_is_entered_once_its_trigger_held_for_for_seconds_on_known_data() {
    let mut run = Run::new(world(SUSTAINED, &lanes_ab()));
    let q = |at, v| snap(at, Some(200.0), v, &[("a", 40.0), ("b", 40.0)]);
    assert_eq!(run.step(&q(0, Some(500.0))).level, 0);
    assert_eq!(run.step(&q(59, Some(500.0))).level, 0, "59 s < 60 s");
    assert_eq!(run.step(&q(60, Some(500.0))).level, 1, "held 60 s");
    // Down again, then an interruption by unknown data restarts the clock.
    let mut run = Run::new(world(SUSTAINED, &lanes_ab()));
    run.step(&q(0, Some(500.0)));
    run.step(&q(30, None));
    assert_eq!(
        run.step(&q(60, Some(500.0))).level,
        0,
        "the clock restarted at 60"
    );
    assert_eq!(run.step(&q(119, Some(500.0))).level, 0);
    assert_eq!(run.step(&q(120, Some(500.0))).level, 1);
    // A step where it does not hold restarts it too.
    let mut run = Run::new(world(SUSTAINED, &lanes_ab()));
    run.step(&q(0, Some(500.0)));
    run.step(&q(30, Some(50.0)));
    assert_eq!(run.step(&q(60, Some(500.0))).level, 0);
}

// --- Rule 3: the cool-down ------------------------------------------------

#[test]
fn the_first_step_down_waits_factor_times_the_time_degraded() {
    let body = r#"  hysteresis: {stableForSeconds: 60, cooldownFactor: "2"}
  levels:
  - name: one
    enterWhen: {queueDepthAbove: 100}
  - name: two
    enterWhen: {queueDepthAbove: 200}
"#;
    let mut run = Run::new(world(body, &lanes_ab()));
    let q = |at, v| snap(at, Some(200.0), Some(v), &[("a", 40.0), ("b", 40.0)]);
    assert_eq!(run.step(&q(0, 500.0)).level, 2);
    run.step(&q(100, 500.0));
    // Exit holds from 150: D = 150, wait max(60, 2 x 150) = 300 -> 450.
    run.step(&q(150, 0.0));
    assert_eq!(run.step(&q(449, 0.0)).level, 2);
    let d = run.step(&q(450, 0.0));
    assert_eq!(d.level, 1);
    // Later steps of the episode wait stableForSeconds only.
    assert_eq!(run.step(&q(509, 0.0)).level, 1);
    assert_eq!(run.step(&q(510, 0.0)).level, 0);
    // A new episode starts its own clock: a short one waits the window.
    assert_eq!(run.step(&q(600, 500.0)).level, 2);
    run.step(&q(610, 0.0));
    assert_eq!(run.step(&q(669, 0.0)).level, 2);
    assert_eq!(run.step(&q(670, 0.0)).level, 1, "max(60, 2 x 10) = 60");
}

// --- Rule 4: staged recovery ----------------------------------------------

/// Level 2 caps `b` at 10 while over capacity, level 1 holds while the
/// queue is above 100; a released lane regains its rate 1 % and then 10 %
/// of the way, 100 s each.
const RAMPED: &str = r#"  hysteresis: {stableForSeconds: 60, recovery: {stepsPercent: [1, 10], stepSeconds: 100}}
  levels:
  - name: slow
    enterWhen: {queueDepthAbove: 100}
  - name: shed
    enterWhen: {overCapacity: true}
    actions: {cap: [{lanes: [b], unitsPerSecond: "10"}]}
"#;

/// A and b at 40 units/s each, with `capacity` and `queue`.
fn ramp_step(at: i64, capacity: Option<f64>, queue: f64) -> Snapshot {
    snap(at, capacity, Some(queue), &[("a", 40.0), ("b", 40.0)])
}

/// [`RAMPED`] over capacity at 0, then at 70 the step 2 -> 1 that releases
/// b's cap (the queue of 500 holds level 1); the run and that decision.
fn released_at_70() -> (Run, ProfileDecision) {
    let mut run = Run::new(world(RAMPED, &lanes_ab()));
    assert_eq!(run.step(&ramp_step(0, Some(60.0), 500.0)).level, 2);
    run.step(&ramp_step(10, Some(200.0), 500.0));
    let d = run.step(&ramp_step(70, Some(200.0), 500.0));
    assert_eq!(d.level, 1, "2 -> 1 releases b's cap");
    (run, d)
}

#[test]
fn a_released_lane_ramps_and_the_next_window_waits_for_the_ramp() {
    let (mut run, d) = released_at_70();
    let s = |at, cap, q| ramp_step(at, Some(cap), q);
    let b = lane_of(&d, "b");
    assert_eq!(b.state, LaneState::Recovering);
    assert_eq!(b.limited_by.as_deref(), Some("recovery 1%"));
    assert!(
        (b.admitted_units_per_second - 10.3).abs() < 1e-6,
        "10 + 1% of 30"
    );
    let d = run.step(&s(169, 200.0, 0.0));
    assert!((admitted(&d, "b") - 10.3).abs() < 1e-6);
    let d = run.step(&s(170, 200.0, 0.0));
    assert!((admitted(&d, "b") - 13.0).abs() < 1e-6, "10 + 10% of 30");
    let d = run.step(&s(270, 200.0, 0.0));
    assert_eq!(admitted(&d, "b"), 40.0);
    assert_eq!(lane_of(&d, "b").state, LaneState::Admitted);
    // Level 1's exit held from 169, but its window starts at the ramp's end.
    assert_eq!(run.step(&s(329, 200.0, 0.0)).level, 1);
    assert_eq!(run.step(&s(330, 200.0, 0.0)).level, 0);
}

/// A ramp does not run while the evidence is Unknown (rates are held at the
/// previous step's then): a lane held through blindness goes on from the
/// stage it was in, instead of skipping the stages that passed meanwhile
/// and jumping to its full rate.
#[test]
fn a_ramp_does_not_run_while_the_evidence_is_unknown() {
    let (mut run, d) = released_at_70();
    let s = |at, cap| ramp_step(at, cap, 500.0);
    assert_eq!(lane_of(&d, "b").limited_by.as_deref(), Some("recovery 1%"));
    // Blind from 80 to 260: never above the 1 % stage (10 + 1 % of 30).
    for at in (80..=260).step_by(10) {
        let d = run.step(&s(at, None));
        assert!(admitted(&d, "b") <= 10.3 + 1e-6, "at {at}");
    }
    // Known again: 10 s of the ramp have run (70 to 80), not 200.
    let d = run.step(&s(270, Some(200.0)));
    assert_eq!(lane_of(&d, "b").limited_by.as_deref(), Some("recovery 1%"));
    assert!((admitted(&d, "b") - 10.3).abs() < 1e-6);
    let d = run.step(&s(360, Some(200.0)));
    assert!((admitted(&d, "b") - 13.0).abs() < 1e-6, "10 + 10% of 30");
    let d = run.step(&s(460, Some(200.0)));
    assert_eq!(admitted(&d, "b"), 40.0);
}

#[test]
fn entering_a_level_again_ends_the_ramp() {
    let body = r#"  hysteresis: {stableForSeconds: 0, recovery: {stepsPercent: [1], stepSeconds: 1000}}
  levels:
  - name: shed
    enterWhen: {overCapacity: true}
    actions: {cap: [{lanes: [b], unitsPerSecond: "10"}]}
"#;
    let mut run = Run::new(world(body, &lanes_ab()));
    let s = |at, cap| snap(at, Some(cap), Some(0.0), &[("a", 40.0), ("b", 40.0)]);
    run.step(&s(0, 60.0));
    assert_eq!(
        lane_of(&run.step(&s(10, 200.0)), "b").state,
        LaneState::Recovering
    );
    let d = run.step(&s(20, 60.0));
    assert_eq!(d.level, 1);
    assert_eq!(lane_of(&d, "b").state, LaneState::Capped);
    assert!(run.state.profiles[POOL].ramps.is_empty());
}

// --- Rule 5: human gates and approvals ------------------------------------

const GATED: &str = r#"  hysteresis: {stableForSeconds: 0}
  levels:
  - name: read-only
    enterWhen: {queueDepthAbove: 100}
    actions: {readOnly: true}
"#;

#[test]
fn a_read_only_level_waits_for_a_person_by_default() {
    let mut run = Run::new(world(GATED, &lanes_ab()));
    let q = |at| snap(at, Some(200.0), Some(500.0), &[("a", 40.0), ("b", 40.0)]);
    for at in [0, 3600, 86400] {
        let d = run.step(&q(at));
        assert_eq!((d.level, d.pending_approval_level), (0, Some(1)));
    }
}

#[test]
fn an_approval_is_used_once_and_lapses_unused() {
    let q = |at, v| snap(at, Some(200.0), Some(v), &[("a", 40.0), ("b", 40.0)]);
    // Used: enters, consumed; after the level is left, the same approval
    // approves nothing.
    let mut run = Run::new(world(GATED, &lanes_ab()));
    run.approvals.insert(
        POOL.into(),
        Approval {
            level: 1,
            given_at: Some(0),
        },
    );
    let d = run.step(&q(10, 500.0));
    assert_eq!((d.level, d.approval_consumed), (1, Some(1)));
    assert_eq!(run.step(&q(20, 0.0)).level, 0);
    let d = run.step(&q(30, 500.0));
    assert_eq!(
        (d.level, d.pending_approval_level),
        (0, Some(1)),
        "used once"
    );
    // Lapsed: given at 0, valid 3600 s by default.
    let mut run = Run::new(world(GATED, &lanes_ab()));
    run.approvals.insert(
        POOL.into(),
        Approval {
            level: 1,
            given_at: Some(0),
        },
    );
    run.step(&q(10, 0.0));
    let d = run.step(&q(3599, 0.0));
    assert_eq!(d.approval_lapsed, None);
    let d = run.step(&q(3600, 500.0));
    assert_eq!((d.level, d.approval_lapsed), (0, Some(1)));
}

#[test]
fn read_only_without_a_person_needs_allow_unattended() {
    let bad = GATED.replace(
        "actions: {readOnly: true}",
        "actions: {readOnly: true}\n    approval: {mode: Automatic}",
    );
    let yaml_err = std::panic::catch_unwind(|| world(&bad, &lanes_ab()));
    assert!(
        yaml_err.is_err(),
        "Automatic on a read-only level is refused"
    );
    let ok = GATED.replace(
        "actions: {readOnly: true}",
        "actions: {readOnly: true}\n    approval: {mode: Automatic, allowUnattended: true}",
    );
    let mut run = Run::new(world(&ok, &lanes_ab()));
    let d = run.step(&snap(
        0,
        Some(200.0),
        Some(500.0),
        &[("a", 40.0), ("b", 40.0)],
    ));
    assert_eq!(d.level, 1);
}

// --- Rule 6: retries apart ------------------------------------------------

#[test]
fn retries_are_not_demand_but_a_storm_is_a_trigger() {
    let body = r#"  hysteresis: {stableForSeconds: 0}
  levels:
  - name: storm
    enterWhen: {retryAmplificationAbove: "1.25"}
"#;
    let mut run = Run::new(world(body, &lanes_ab()));
    let with_retries = |at, retries| {
        let mut s = snap(at, Some(200.0), Some(0.0), &[("b", 40.0)]);
        s.lanes.insert(
            "t/a".into(),
            LaneSignals {
                requests_per_second: Some(40.0),
                retry_requests_per_second: Some(retries),
                ..Default::default()
            },
        );
        s
    };
    let d = run.step(&with_retries(0, 10.0));
    assert_eq!(d.level, 0, "(40 + 10) / 40 = 1.25 is not above 1.25");
    assert_eq!(lane_of(&d, "a").retry_amplification, Some(1.25));
    assert_eq!(d.demand_units_per_second, 80.0, "retries are not demand");
    let d = run.step(&with_retries(10, 11.0));
    assert_eq!(d.level, 1);
    assert_eq!(d.demand_units_per_second, 80.0);
    assert_eq!(lane_of(&d, "b").retry_amplification, None, "not measured");
}

/// A garbage figure (`.nan`, infinite, negative) in the signals is a
/// failed measurement, as a source's reported failure is: a level entered
/// on it is not left while it stays garbage, and left once it is measured
/// below the threshold again.
#[test]
fn a_garbage_figure_holds_a_level_entered_on_it() {
    let body = r#"  hysteresis: {stableForSeconds: 0}
  levels:
  - name: slow
    enterWhen: {p95LatencySecondsAbove: "2"}
"#;
    let mut run = Run::new(world(body, &lanes_ab()));
    let with_p95 = |at, p95| {
        let mut s = snap(at, Some(200.0), Some(0.0), &[("a", 10.0), ("b", 10.0)]);
        s.profiles.get_mut(POOL).unwrap().p95_latency_seconds = Some(p95);
        s
    };
    assert_eq!(run.step(&with_p95(0, 3.0)).level, 1);
    for (at, bad) in [(10, f64::NAN), (20, f64::INFINITY), (30, -1.0)] {
        assert_eq!(run.step(&with_p95(at, bad)).level, 1, "p95 {bad}");
    }
    assert_eq!(run.step(&with_p95(40, 1.0)).level, 0);
}

/// A storm seen on one lane is not over because that lane's retries went
/// missing: the amplification over the lanes still measured (here 1.0) is
/// no evidence about the storming one, so the level holds; it is left once
/// every lane's retries are measured again and calm.
#[test]
fn a_storm_is_not_over_when_the_storming_lanes_retries_go_missing() {
    let body = r#"  hysteresis: {stableForSeconds: 0}
  levels:
  - name: storm
    enterWhen: {retryAmplificationAbove: "1.25"}
"#;
    let mut run = Run::new(world(body, &lanes_ab()));
    let lanes = |at, a_retries: Option<f64>| {
        let mut s = snap(at, Some(200.0), Some(0.0), &[]);
        for (lane, retries) in [("a", a_retries), ("b", Some(0.0))] {
            let mut l = LaneSignals {
                requests_per_second: Some(40.0),
                retry_requests_per_second: retries,
                ..Default::default()
            };
            if retries.is_none() {
                l.unknown
                    .insert("retryRequestsPerSecond".into(), "timeout".into());
            }
            s.lanes.insert(format!("t/{lane}"), l);
        }
        s
    };
    assert_eq!(run.step(&lanes(0, Some(40.0))).level, 1, "(80 + 40) / 80");
    for at in [10, 20, 30] {
        let d = run.step(&lanes(at, None));
        assert_eq!(d.level, 1, "at {at}: a's retries are Unknown");
        assert_eq!(lane_of(&d, "b").retry_amplification, Some(1.0));
    }
    assert_eq!(
        run.step(&lanes(40, Some(0.0))).level,
        0,
        "measured and calm"
    );
}
