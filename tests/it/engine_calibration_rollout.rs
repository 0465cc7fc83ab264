//! The engine's rules 9 and 10 of issue 12 at their edges, through the
//! public API (`lanekeeper::policy::evaluate`):
//!
//! - calibration follows the pool: the profile signal `calibrationStale`
//!   and `capacity.onStaleCalibration` (`Warn` reports, `Hold` makes the
//!   capacity derived from calibration numbers Unknown while a measured
//!   `availableUnitsPerSecond` still counts);
//! - drain with the rollout in mind: no new drain while `rolloutInProgress`,
//!   and a drained pod whose `revision` differs from `currentRevision` is
//!   never undrained (only the bound releases one, after the pods of the
//!   current revision).

use std::path::Path;

use lanekeeper::manifest::{Loaded, load_str};
use lanekeeper::policy::{
    Approvals, CalibrationStale, DrainAction, DrainReason, EngineState, ProfileDecision, Telemetry,
    World, evaluate,
};
use lanekeeper::snapshot::{PodSignals, ProfileSignals, SignalsFile, Snapshot};

const POOL: &str = "t/pool";
const OLD: &str = "5d8f7b9c6";
const NEW: &str = "7c9d4e2f1";

fn world(capacity_extra: &str) -> World {
    let yaml = format!(
        r#"---
apiVersion: lanekeeper.dev/v1alpha1
kind: CapacityProfile
metadata: {{name: pool, namespace: t}}
spec:
  pool:
    scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: pool}}
    podSelector: {{matchLabels: {{app: pool}}}}
  capacity: {{safeUnitsPerSecond: "100", unitsPerReplica: "10", warningUtilizationPercent: 100{capacity_extra}}}
  replicas: {{min: 1, max: 50, maxScaleUpStep: 50, scaleDownStabilizationSeconds: 300}}
  drain: {{maxDrained: "25%", minServing: 2, errorRatioAbove: "0.20", healthyForSeconds: 120}}
---
apiVersion: lanekeeper.dev/v1alpha1
kind: LaneContract
metadata: {{name: chat, namespace: t}}
spec: {{profile: pool, priority: 0, workUnitsPerRequest: "1", expectedRequestsPerSecond: "80", floorUnitsPerSecond: "50", shedding: {{mode: Never}}, deadlineSeconds: 10, queue: {{maxDepth: 10, ttlSeconds: 5}}, retry: {{maxAttempts: 1}}, routes: {{primary: [r]}}}}
---
apiVersion: lanekeeper.dev/v1alpha1
kind: LaneContract
metadata: {{name: batch, namespace: t}}
spec: {{profile: pool, priority: 3, workUnitsPerRequest: "1", expectedRequestsPerSecond: "40", shedding: {{mode: Pause}}, deadlineSeconds: 600, queue: {{maxDepth: 10, ttlSeconds: 60}}, retry: {{maxAttempts: 1}}, routes: {{primary: [r]}}}}
"#
    );
    let mut loaded = Loaded::default();
    load_str(Path::new("test.yaml"), &yaml, &mut loaded)
        .unwrap_or_else(|e| panic!("test manifest invalid: {e}"));
    loaded.world
}

struct Run {
    world: World,
    state: EngineState,
}

impl Run {
    fn new(capacity_extra: &str) -> Self {
        Self {
            world: world(capacity_extra),
            state: EngineState::default(),
        }
    }

    fn step(&mut self, at: i64, sig: Option<ProfileSignals>) -> ProfileDecision {
        let mut snap = Snapshot {
            at,
            ..Default::default()
        };
        if let Some(s) = sig {
            snap.profiles.insert(POOL.into(), s);
        }
        let (e, next) = evaluate(&self.world, &snap, &Approvals::new(), &self.state);
        self.state = next;
        e.profiles.into_iter().next().expect("one profile")
    }

    fn drained(&self) -> Vec<String> {
        self.state.profiles[POOL].drained.keys().cloned().collect()
    }
}

fn pod(err: f64, revision: Option<&str>) -> PodSignals {
    PodSignals {
        ready: Some(true),
        error_ratio: Some(err),
        drain_requested: None,
        revision: revision.map(str::to_owned),
    }
}

/// Eight ready pods `pod-0..7` of `revision`, with the given error ratios
/// for the first ones (the rest 0.01).
fn pool(
    errs: &[f64],
    revision: &str,
    current: Option<&str>,
    rollout: Option<bool>,
) -> ProfileSignals {
    let mut s = ProfileSignals {
        current_revision: current.map(str::to_owned),
        rollout_in_progress: rollout,
        ..Default::default()
    };
    for i in 0..8 {
        let e = errs.get(i).copied().unwrap_or(0.01);
        s.pods.insert(format!("pod-{i}"), pod(e, Some(revision)));
    }
    s
}

fn action(d: &ProfileDecision, p: &str) -> Option<(DrainAction, DrainReason)> {
    d.drain
        .actions
        .iter()
        .find(|a| a.pod == p)
        .map(|a| (a.action, a.reason.clone()))
}

// ---------------------------------------------------------------------------
// Rule 10: drain with the rollout in mind
// ---------------------------------------------------------------------------

#[test]
fn a_rollout_refuses_every_new_drain_and_the_drains_follow_it() {
    let mut run = Run::new("");
    let d = run.step(0, Some(pool(&[0.9, 0.8], NEW, Some(NEW), Some(true))));
    assert!(run.drained().is_empty());
    for p in ["pod-0", "pod-1"] {
        assert_eq!(
            action(&d, p),
            Some((DrainAction::Refused, DrainReason::RolloutInProgress)),
            "{p}"
        );
    }
    assert_eq!(d.drain.drain_budget, 2, "the bound itself is unchanged");
    // Not a bound refusal: DrainBudgetExhausted does not name them.
    assert_eq!(d.drain.refused_by_bound().count(), 0);
    // The rollout is over: both are drained within the bound.
    let d = run.step(60, Some(pool(&[0.9, 0.8], NEW, Some(NEW), Some(false))));
    assert_eq!(action(&d, "pod-0").unwrap().0, DrainAction::Drain);
    assert_eq!(action(&d, "pod-1").unwrap().0, DrainAction::Drain);
    assert_eq!(run.drained(), ["pod-0", "pod-1"]);
}

#[test]
fn an_unknown_rollout_does_not_hold_drains() {
    let mut run = Run::new("");
    let d = run.step(0, Some(pool(&[0.9], NEW, None, None)));
    assert_eq!(action(&d, "pod-0").unwrap().0, DrainAction::Drain);
}

#[test]
fn a_drain_request_waits_for_the_rollout_too() {
    let mut run = Run::new("");
    let mut s = pool(&[], NEW, Some(NEW), Some(true));
    s.pods.get_mut("pod-3").unwrap().drain_requested = Some(true);
    let d = run.step(0, Some(s.clone()));
    assert_eq!(
        action(&d, "pod-3"),
        Some((DrainAction::Refused, DrainReason::RolloutInProgress))
    );
    s.rollout_in_progress = Some(false);
    let d = run.step(60, Some(s));
    assert_eq!(
        action(&d, "pod-3"),
        Some((DrainAction::Drain, DrainReason::Requested))
    );
}

#[test]
fn the_rollout_is_named_even_when_telemetry_would_hold_the_drain() {
    // No capacity at all: the drain would be Held; the rollout says more.
    let mut run = Run::new("");
    let mut s = pool(&[0.9], NEW, Some(NEW), Some(true));
    s.unknown
        .insert("availableUnitsPerSecond".into(), "timeout".into());
    let d = run.step(0, Some(s.clone()));
    assert_eq!(d.telemetry, Telemetry::Unknown);
    assert_eq!(
        action(&d, "pod-0").unwrap().1,
        DrainReason::RolloutInProgress
    );
    s.rollout_in_progress = Some(false);
    let d = run.step(60, Some(s));
    assert_eq!(action(&d, "pod-0").unwrap().1, DrainReason::Held);
}

#[test]
fn a_drained_pod_of_an_older_revision_is_never_undrained_and_leaves_when_replaced() {
    let mut run = Run::new("");
    run.step(0, Some(pool(&[0.9], OLD, Some(OLD), Some(false))));
    assert_eq!(run.drained(), ["pod-0"]);
    // The rollout begins; pod-0 looks healthy from now on.
    let d = run.step(60, Some(pool(&[0.01], OLD, Some(NEW), Some(true))));
    assert_eq!(
        action(&d, "pod-0"),
        Some((DrainAction::Keep, DrainReason::OutdatedRevision))
    );
    // Long past healthyForSeconds, rollout over or not: kept.
    for (at, rollout) in [(180, true), (300, false), (3600, false)] {
        let d = run.step(at, Some(pool(&[0.01], OLD, Some(NEW), Some(rollout))));
        assert_eq!(
            action(&d, "pod-0"),
            Some((DrainAction::Keep, DrainReason::OutdatedRevision)),
            "at {at}"
        );
    }
    // The stored reason is still why it was drained.
    assert!(matches!(
        run.state.profiles[POOL].drained["pod-0"].reason,
        DrainReason::ErrorRatio { .. }
    ));
    // Replaced: it leaves the drained set without an undrain.
    let mut s = pool(&[], NEW, Some(NEW), Some(false));
    s.pods.remove("pod-0");
    let d = run.step(3660, Some(s));
    assert!(run.drained().is_empty());
    assert!(
        d.drain
            .actions
            .iter()
            .all(|a| a.action != DrainAction::Undrain)
    );
}

#[test]
fn a_withdrawn_request_does_not_release_an_outdated_pod() {
    let mut run = Run::new("");
    let mut s = pool(&[], OLD, Some(OLD), Some(false));
    s.pods.get_mut("pod-2").unwrap().drain_requested = Some(true);
    run.step(0, Some(s));
    assert_eq!(run.drained(), ["pod-2"]);
    let d = run.step(60, Some(pool(&[], OLD, Some(NEW), Some(false))));
    assert_eq!(
        action(&d, "pod-2"),
        Some((DrainAction::Keep, DrainReason::OutdatedRevision))
    );
    // The same with the pod of the current revision: released at once.
    let mut run = Run::new("");
    let mut s = pool(&[], NEW, Some(NEW), Some(false));
    s.pods.get_mut("pod-2").unwrap().drain_requested = Some(true);
    run.step(0, Some(s));
    let d = run.step(60, Some(pool(&[], NEW, Some(NEW), Some(false))));
    assert_eq!(
        action(&d, "pod-2"),
        Some((DrainAction::Undrain, DrainReason::RequestWithdrawn))
    );
}

#[test]
fn without_both_revisions_no_pod_is_outdated() {
    // The pod's revision unknown, or the pool's: undrained on health as
    // before.
    for (pod_rev, current) in [(None, Some(NEW)), (Some(OLD), None), (None, None)] {
        let mut run = Run::new("");
        let mut s = pool(&[0.9], OLD, current, Some(false));
        s.pods.get_mut("pod-0").unwrap().revision = pod_rev.map(str::to_owned);
        run.step(0, Some(s.clone()));
        s.pods.get_mut("pod-0").unwrap().error_ratio = Some(0.01);
        run.step(60, Some(s.clone()));
        let d = run.step(180, Some(s));
        assert_eq!(
            action(&d, "pod-0").map(|a| a.0),
            Some(DrainAction::Undrain),
            "pod {pod_rev:?}, current {current:?}"
        );
    }
}

#[test]
fn a_rollback_makes_a_drained_pod_current_again() {
    let mut run = Run::new("");
    run.step(0, Some(pool(&[0.9], OLD, Some(OLD), Some(false))));
    run.step(60, Some(pool(&[0.01], OLD, Some(NEW), Some(true))));
    let d = run.step(180, Some(pool(&[0.01], OLD, Some(NEW), Some(true))));
    assert_eq!(
        action(&d, "pod-0").unwrap().1,
        DrainReason::OutdatedRevision
    );
    // Rolled back: OLD is current again, and the pod has looked healthy
    // since 60.
    let d = run.step(240, Some(pool(&[0.01], OLD, Some(OLD), Some(false))));
    assert_eq!(action(&d, "pod-0").unwrap().0, DrainAction::Undrain);
}

#[test]
fn over_the_bound_pods_of_the_current_revision_are_released_before_outdated_ones() {
    let mut run = Run::new("");
    // Two drained: pod-0 (will be outdated, healthier) and pod-1 (current,
    // worse).
    run.step(0, Some(pool(&[0.5, 0.9], OLD, Some(OLD), Some(false))));
    assert_eq!(run.drained(), ["pod-0", "pod-1"]);
    // Four pods left (bound min(1, 2) = 1); pod-1 already of the new
    // revision, pod-0 of the old one.
    let mut s = pool(&[0.3, 0.9], NEW, Some(NEW), Some(false));
    for i in 4..8 {
        s.pods.remove(&format!("pod-{i}"));
    }
    s.pods.get_mut("pod-0").unwrap().revision = Some(OLD.into());
    let d = run.step(60, Some(s.clone()));
    assert_eq!(d.drain.drain_budget, 1);
    assert_eq!(
        action(&d, "pod-1"),
        Some((DrainAction::Undrain, DrainReason::OverBound { bound: 1 }))
    );
    assert_eq!(
        action(&d, "pod-0"),
        Some((DrainAction::Keep, DrainReason::OutdatedRevision))
    );
    // The bound outranks the rule: at 2 ready pods (bound 0) the outdated
    // pod is released too.
    for i in 2..4 {
        s.pods.remove(&format!("pod-{i}"));
    }
    let d = run.step(120, Some(s));
    assert_eq!(d.drain.drain_budget, 0);
    assert_eq!(action(&d, "pod-0").unwrap().0, DrainAction::Undrain);
    assert!(run.drained().is_empty());
}

// ---------------------------------------------------------------------------
// Rule 9: calibration follows the pool
// ---------------------------------------------------------------------------

fn replicas(ready: u32, stale: Option<CalibrationStale>) -> ProfileSignals {
    ProfileSignals {
        ready_replicas: Some(ready),
        calibration_stale: stale,
        ..Default::default()
    }
}

#[test]
fn warn_reports_a_stale_calibration_and_decides_as_before() {
    for extra in ["", ", onStaleCalibration: Warn"] {
        let mut run = Run::new(extra);
        let d = run.step(0, Some(replicas(9, Some(CalibrationStale::PoolChanged))));
        assert_eq!(d.telemetry, Telemetry::Known);
        assert_eq!(d.capacity_units_per_second, Some(90.0));
        assert_eq!(d.capacity_source.as_deref(), Some("readyReplicas"));
        assert_eq!(d.calibration_stale, Some(CalibrationStale::PoolChanged));
        assert!(!d.calibration_held);
    }
}

#[test]
fn hold_makes_capacity_from_replicas_and_pods_unknown() {
    for stale in [CalibrationStale::PoolChanged, CalibrationStale::Expired] {
        let mut run = Run::new(", onStaleCalibration: Hold");
        let d = run.step(0, Some(replicas(9, Some(stale))));
        assert_eq!(d.telemetry, Telemetry::Unknown, "{stale:?}");
        assert_eq!(d.capacity_units_per_second, None);
        assert_eq!(d.capacity_source, None);
        assert!(d.calibration_held);
        assert_eq!(d.calibration_stale, Some(stale));
        // Ready replicas are still seen; sizing holds as under any Unknown
        // (here: never known, no opinion).
        assert_eq!(d.ready_replicas, Some(9));
        assert_eq!(d.desired_replicas, None);
        // Ready pods alone: Unknown too.
        let mut run = Run::new(", onStaleCalibration: Hold");
        let mut s = pool(&[], NEW, None, None);
        s.calibration_stale = Some(stale);
        let d = run.step(0, Some(s));
        assert_eq!(d.telemetry, Telemetry::Unknown);
    }
}

#[test]
fn hold_still_counts_a_measured_capacity() {
    let mut run = Run::new(", onStaleCalibration: Hold");
    let mut s = replicas(9, Some(CalibrationStale::PoolChanged));
    s.available_units_per_second = Some(70.0);
    let d = run.step(0, Some(s));
    assert_eq!(d.telemetry, Telemetry::Known);
    assert_eq!(d.capacity_units_per_second, Some(70.0));
    assert_eq!(
        d.capacity_source.as_deref(),
        Some("availableUnitsPerSecond")
    );
    assert!(d.calibration_held);
    // Pool sizing still divides demand (120) by unitsPerReplica (10): a
    // size, not a capacity.
    assert_eq!(d.desired_replicas, Some(12));
}

#[test]
fn hold_without_a_stale_calibration_changes_nothing() {
    let mut run = Run::new(", onStaleCalibration: Hold");
    let d = run.step(0, Some(replicas(9, None)));
    assert_eq!(d.capacity_units_per_second, Some(90.0));
    assert!(!d.calibration_held);
    assert_eq!(d.calibration_stale, None);
}

#[test]
fn hold_admits_against_the_last_known_capacity_else_the_floors_only() {
    // Warn: capacity from replicas (90) admits 90 of 120.
    let mut warn = Run::new("");
    let d = warn.step(0, Some(replicas(9, Some(CalibrationStale::Expired))));
    assert_eq!(d.admitted_units_per_second, 90.0);
    // Never known and no signals: safeUnitsPerSecond (100) is assumed.
    let mut warn = Run::new("");
    let d = warn.step(0, None);
    assert_eq!(d.admitted_units_per_second, 100.0);
    // Hold, never known: no calibrated figure is assumed; the floors only
    // (chat's 50; batch has none).
    let mut hold = Run::new(", onStaleCalibration: Hold");
    let d = hold.step(0, Some(replicas(9, Some(CalibrationStale::PoolChanged))));
    assert_eq!(d.admitted_units_per_second, 50.0);
    let chat = d.lanes.iter().find(|l| l.name == "chat").unwrap();
    assert_eq!(chat.admitted_units_per_second, 50.0);
    // Hold after a known capacity: the last known one holds (60).
    let mut hold = Run::new(", onStaleCalibration: Hold");
    hold.step(0, Some(replicas(6, None)));
    let d = hold.step(60, Some(replicas(9, Some(CalibrationStale::PoolChanged))));
    assert_eq!(d.telemetry, Telemetry::Unknown);
    assert_eq!(d.admitted_units_per_second, 60.0);
    // Valid again: capacity from replicas again.
    let d = hold.step(120, Some(replicas(9, None)));
    assert_eq!(d.capacity_units_per_second, Some(90.0));
}

#[test]
fn the_decision_names_staleness_only_when_there_is_some() {
    let mut run = Run::new("");
    let d = run.step(0, Some(replicas(9, None)));
    let json = serde_json::to_value(&d).unwrap();
    assert!(json.get("calibrationStale").is_none());
    assert!(json.get("calibrationHeld").is_none());
    let mut run = Run::new(", onStaleCalibration: Hold");
    let d = run.step(0, Some(replicas(9, Some(CalibrationStale::Expired))));
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(json["calibrationStale"], "Expired");
    assert_eq!(json["calibrationHeld"], true);
}

#[test]
fn the_signals_file_carries_both_rules() {
    let yaml = r#"
steps:
- at: 0
  profiles:
    t/pool:
      readyReplicas: 4
      calibrationStale: PoolChanged
      rolloutInProgress: true
      currentRevision: "7c9d4e2f1"
      pods:
        pod-0: {errorRatio: 0.5, revision: "5d8f7b9c6"}
"#;
    let f: SignalsFile = serde_yaml::from_str(yaml).unwrap();
    let p = &f.steps[0].profiles[POOL];
    assert_eq!(p.calibration_stale, Some(CalibrationStale::PoolChanged));
    assert_eq!(p.rollout_in_progress, Some(true));
    assert_eq!(p.current_revision.as_deref(), Some(NEW));
    assert_eq!(p.pods["pod-0"].revision.as_deref(), Some(OLD));
    assert!(p.is_outdated(&p.pods["pod-0"]));
    let bad = yaml.replace("PoolChanged", "Stale");
    assert!(serde_yaml::from_str::<SignalsFile>(&bad).is_err());
}
