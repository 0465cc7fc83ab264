//! KV-cache pressure as evidence: `kvCacheUsageAbove` is sustained like the
//! other triggers, Unknown whenever its signal is missing (no source
//! included), left by `kvCacheUsageBelow`, and the level's
//! `limitLongContext` tightens the pool's long-context limit the gateway
//! gets.

use std::path::Path;

use lanekeeper::manifest::{Loaded, load_str};
use lanekeeper::policy::{Approvals, EngineState, ProfileDecision, World, evaluate};
use lanekeeper::snapshot::{ProfileSignals, Snapshot};

const MANIFESTS: &str = r#"---
apiVersion: lanekeeper.dev/v1alpha1
kind: CapacityProfile
metadata: {name: pool, namespace: t}
spec:
  pool:
    scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: pool}
    podSelector: {matchLabels: {app: pool}}
  capacity: {safeUnitsPerSecond: "100", unitsPerReplica: "10"}
  replicas: {min: 1, max: 10}
  longContext: {aboveInputTokens: 8000, maxConcurrency: 6}
---
apiVersion: lanekeeper.dev/v1alpha1
kind: LaneContract
metadata: {name: a, namespace: t}
spec: {profile: pool, priority: 1, workUnitsPerRequest: "1", expectedRequestsPerSecond: "10", deadlineSeconds: 30, queue: {maxDepth: 10, ttlSeconds: 20}, retry: {maxAttempts: 1}, routes: {primary: [r]}}
---
apiVersion: lanekeeper.dev/v1alpha1
kind: DegradationPolicy
metadata: {name: ladder, namespace: t}
spec:
  profile: pool
  hysteresis: {stableForSeconds: 30}
  levels:
  - name: kv-pressure
    enterWhen: {kvCacheUsageAbove: 90, forSeconds: 20}
    exitWhen: {kvCacheUsageBelow: 70}
    actions: {limitLongContext: 2}
  - name: kv-full
    enterWhen: {kvCacheUsageAbove: 97}
    actions: {limitLongContext: 9}
"#;

fn world(manifests: &str) -> World {
    let mut loaded = Loaded::default();
    load_str(Path::new("kv.yaml"), manifests, &mut loaded).unwrap_or_else(|e| panic!("{e}"));
    loaded.world
}

fn snap(at: i64, kv: Option<f64>) -> Snapshot {
    let mut s = Snapshot {
        at,
        ..Default::default()
    };
    let p = ProfileSignals {
        available_units_per_second: Some(100.0),
        kv_cache_usage_percent: kv,
        ..Default::default()
    };
    s.profiles.insert("t/pool".into(), p);
    s
}

struct Run {
    world: World,
    state: EngineState,
}

impl Run {
    fn new(manifests: &str) -> Self {
        Self {
            world: world(manifests),
            state: EngineState::default(),
        }
    }
    fn step(&mut self, at: i64, kv: Option<f64>) -> ProfileDecision {
        let (e, next) = evaluate(&self.world, &snap(at, kv), &Approvals::new(), &self.state);
        self.state = next;
        e.profiles.into_iter().next().expect("one profile")
    }
}

fn long_places(d: &ProfileDecision) -> i64 {
    d.gateway
        .long_context
        .as_ref()
        .expect("the profile's long-context limit")
        .max_concurrency
}

#[test]
fn a_sustained_kv_trigger_enters_and_tightens_the_long_context_limit() {
    let mut run = Run::new(MANIFESTS);
    let d = run.step(0, Some(50.0));
    assert_eq!((d.level, long_places(&d)), (0, 6), "the profile's own");
    run.step(10, Some(93.0));
    assert_eq!(run.step(29, Some(93.0)).level, 0, "19 s < forSeconds 20");
    let d = run.step(30, Some(93.0));
    assert_eq!(d.level, 1, "held 20 s");
    assert_eq!(long_places(&d), 2, "limitLongContext 2 < 6");
    assert!(
        d.triggers
            .iter()
            .any(|t| t.contains("kvCacheUsageAbove: 93% > 90%")),
        "{:?}",
        d.triggers
    );
}

#[test]
fn exactly_at_the_threshold_does_not_hold() {
    let mut run = Run::new(MANIFESTS);
    run.step(0, Some(90.0));
    assert_eq!(run.step(100, Some(90.0)).level, 0);
}

#[test]
fn a_lower_levels_tighter_limit_is_kept_by_a_looser_higher_level() {
    let mut run = Run::new(MANIFESTS);
    run.step(0, Some(99.0));
    let d = run.step(20, Some(99.0));
    assert_eq!(d.level, 2);
    assert_eq!(long_places(&d), 2, "the lowest of levels 1..=2, not 9");
}

#[test]
fn missing_kv_evidence_is_unknown_and_neither_enters_nor_leaves() {
    // Never entered on missing data, and no source configured is no excuse.
    let mut run = Run::new(MANIFESTS);
    run.step(0, Some(95.0));
    run.step(10, None);
    assert_eq!(run.step(25, Some(95.0)).level, 0, "the clock restarted");
    // Once in, missing data does not let it out.
    let mut run = Run::new(MANIFESTS);
    run.step(0, Some(95.0));
    assert_eq!(run.step(20, Some(95.0)).level, 1);
    for at in (30..=600).step_by(30) {
        let d = run.step(at, None);
        assert_eq!(d.level, 1, "at {at}: Unknown never relaxes");
        assert_eq!(long_places(&d), 2);
    }
    // Known and below the exit for stableForSeconds: out.
    run.step(630, Some(60.0));
    let d = run.step(700, Some(60.0));
    assert_eq!((d.level, long_places(&d)), (0, 6));
}

#[test]
fn garbage_kv_evidence_is_unknown() {
    let mut run = Run::new(MANIFESTS);
    run.step(0, Some(95.0));
    assert_eq!(run.step(20, Some(95.0)).level, 1);
    // Each for longer than stableForSeconds: a negative value would pass
    // for "below the exit" if it were taken as a number.
    for (start, garbage) in [(100, f64::NAN), (300, 150.0), (500, -1.0)] {
        for at in (start..start + 120).step_by(20) {
            assert_eq!(run.step(at, Some(garbage)).level, 1, "{garbage} at {at}");
        }
    }
}

#[test]
fn without_the_profiles_long_context_limit_the_action_has_nothing_to_tighten() {
    let manifests = MANIFESTS.replace(
        "  longContext: {aboveInputTokens: 8000, maxConcurrency: 6}\n",
        "",
    );
    let mut run = Run::new(&manifests);
    run.step(0, Some(95.0));
    let d = run.step(20, Some(95.0));
    assert_eq!(d.level, 1);
    assert_eq!(d.gateway.long_context, None);
    let texts: Vec<String> = d.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        texts,
        [
            "policy t/ladder level 1 (kv-pressure): limitLongContext, but the profile has no spec.longContext saying which requests are long (the action does nothing)",
            "policy t/ladder level 2 (kv-full): limitLongContext, but the profile has no spec.longContext saying which requests are long (the action does nothing)"
        ]
    );
}

#[test]
fn with_the_profiles_limit_nothing_is_warned() {
    let mut run = Run::new(MANIFESTS);
    assert!(run.step(0, Some(10.0)).warnings.is_empty());
}
