//! Property tests of the decision engine: the safety invariants of
//! DESIGN.md §5 and of the foundation issue, over random but valid worlds
//! (one profile, 1..8 lanes, an optional 1..4-level policy) and random
//! snapshot sequences with strictly increasing `at`, restarts included.
//!
//! Every generated world goes through `manifest::load_str`, so it passes the
//! CRDs' own CEL rules: the properties are about objects the API server
//! accepts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use lanekeeper::api::SheddingMode;
use lanekeeper::manifest::{Loaded, load_str};
use lanekeeper::policy::{
    Approvals, DrainAction, DrainedPod, EngineState, LaneState, ProfileDecision, ProfileState,
    Telemetry, World, evaluate,
};
use lanekeeper::snapshot::{LaneSignals, PodSignals, ProfileSignals, Snapshot};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};

const NS: &str = "p";
const PKEY: &str = "p/pool";
/// Error ratios pods report (small set, so ties and threshold hits happen).
const ERRS: [f64; 7] = [0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.9];
/// Drain thresholds, as written in the spec.
const THRESHOLDS: [&str; 6] = ["0", "0.05", "0.1", "0.2", "0.3", "0.5"];
const MAX_LANES: u8 = 8;
const PODS: usize = 10;
/// Tolerance of rate comparisons (values are reported rounded to 1e-6).
const TOL: f64 = 1e-6;

// ---------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct LaneGen {
    priority: i32,
    weight: i32,
    wpr_centi: u32,
    rps: u32,
    floor: Option<u32>,
    ceiling_extra: Option<u32>,
    mode: SheddingMode,
    defer_min: u32,
    borrow: Option<(Vec<u8>, u32, i64)>,
}

fn lane_gen() -> impl Strategy<Value = LaneGen> {
    (
        0..5i32,
        prop::sample::select(vec![1, 1, 1, 2, 3]),
        10..=300u32,
        0..=200u32,
        prop::option::weighted(0.5, 0..=150u32),
        prop::option::weighted(0.4, 0..=200u32),
        prop::sample::select(vec![
            SheddingMode::Never,
            SheddingMode::Throttle,
            SheddingMode::Defer,
            SheddingMode::Pause,
        ]),
        0..=100u32,
        prop::option::weighted(
            0.3,
            (
                prop::collection::vec(0..MAX_LANES, 1..3),
                0..=100u32,
                1..=600i64,
            ),
        ),
    )
        .prop_map(
            |(priority, weight, wpr_centi, rps, floor, ceiling_extra, mode, defer_min, borrow)| {
                LaneGen {
                    priority,
                    weight,
                    wpr_centi,
                    rps,
                    floor,
                    ceiling_extra,
                    mode,
                    defer_min,
                    borrow,
                }
            },
        )
}

#[derive(Clone, Debug)]
enum MaxDrained {
    Count(i32),
    Percent(u32),
}

#[derive(Clone, Debug)]
struct DrainGen {
    max: MaxDrained,
    min_serving: i32,
    threshold: usize,
    healthy_for: i64,
}

fn drain_gen() -> impl Strategy<Value = DrainGen> {
    (
        prop_oneof![
            (0..6i32).prop_map(MaxDrained::Count),
            (0..=100u32).prop_map(MaxDrained::Percent)
        ],
        0..5i32,
        0..THRESHOLDS.len(),
        prop::sample::select(vec![0i64, 30, 60, 120, 300]),
    )
        .prop_map(|(max, min_serving, threshold, healthy_for)| DrainGen {
            max,
            min_serving,
            threshold,
            healthy_for,
        })
}

#[derive(Clone, Debug)]
struct ProfileGen {
    safe: u32,
    upr: u32,
    warn: i32,
    min: i32,
    span: i32,
    step: i32,
    stab: i64,
    drain: Option<DrainGen>,
}

fn profile_gen(
    drain: impl Strategy<Value = Option<DrainGen>>,
) -> impl Strategy<Value = ProfileGen> {
    (
        1..=1000u32,
        1..=100u32,
        1..=100i32,
        0..5i32,
        0..20i32,
        1..6i32,
        prop::sample::select(vec![0i64, 60, 300, 600]),
        drain,
    )
        .prop_map(
            |(safe, upr, warn, min, span, step, stab, drain)| ProfileGen {
                safe,
                upr,
                warn,
                min,
                span,
                step,
                stab,
                drain,
            },
        )
}

#[derive(Clone, Debug)]
enum Sel {
    Priority(i32),
    Names(Vec<u8>),
}

fn sel_gen() -> impl Strategy<Value = Sel> {
    prop_oneof![
        (0..5i32).prop_map(Sel::Priority),
        prop::collection::vec(0..MAX_LANES, 1..3).prop_map(Sel::Names)
    ]
}

#[derive(Clone, Debug)]
struct LevelGen {
    over_capacity: bool,
    utilization: Option<i32>,
    in_flight: Option<i64>,
    queue: Option<i64>,
    exit: Option<(Option<i32>, Option<i64>, Option<i64>)>,
    pause: Vec<Sel>,
    cap: Vec<(Sel, u32)>,
    approval: u8,
    timeout: i64,
}

fn level_gen() -> impl Strategy<Value = LevelGen> {
    (
        any::<bool>(),
        prop::option::weighted(0.4, 50..=100i32),
        prop::option::weighted(0.3, 0..=2000i64),
        prop::option::weighted(0.4, 0..=500i64),
        prop::option::weighted(
            0.4,
            (
                prop::option::of(40..=100i32),
                prop::option::of(0..=2000i64),
                prop::option::of(0..=500i64),
            ),
        ),
        prop::collection::vec(sel_gen(), 0..3),
        prop::collection::vec((sel_gen(), 0..=150u32), 0..3),
        0..10u8,
        1..=600i64,
    )
        .prop_map(
            |(
                over_capacity,
                utilization,
                in_flight,
                queue,
                exit,
                pause,
                cap,
                approval,
                timeout,
            )| LevelGen {
                over_capacity,
                utilization,
                in_flight,
                queue,
                exit,
                pause,
                cap,
                approval,
                timeout,
            },
        )
}

#[derive(Clone, Debug)]
struct PolicyGen {
    levels: Vec<LevelGen>,
    stable: i64,
    /// `Some(k)`: onMissingTelemetry EnterLevel at level k (clamped).
    missing: Option<i32>,
}

fn policy_gen() -> impl Strategy<Value = PolicyGen> {
    (
        prop::collection::vec(level_gen(), 1..=4),
        prop::sample::select(vec![0i64, 30, 120, 300, 600]),
        prop::option::weighted(0.3, 1..=4i32),
    )
        .prop_map(|(levels, stable, missing)| PolicyGen {
            levels,
            stable,
            missing,
        })
}

/// One pod's state: present, readiness, error-ratio index (None: no evidence).
#[derive(Clone, Debug)]
struct PodGen {
    present: bool,
    ready: Option<bool>,
    err: Option<usize>,
}

fn pod_gen() -> impl Strategy<Value = PodGen> {
    (
        prop::bool::weighted(0.8),
        prop::option::weighted(0.9, prop::bool::weighted(0.85)),
        prop::option::weighted(0.85, 0..ERRS.len()),
    )
        .prop_map(|(present, ready, err)| PodGen {
            present,
            ready,
            err,
        })
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Restart {
    None,
    /// State read back whole (e.g. from status).
    Full,
    /// State re-derived from the cluster: level and desired replicas from
    /// status, the drained set from pod labels; every timer lost.
    Lossy,
}

#[derive(Clone, Debug)]
struct StepGen {
    dt: i64,
    present: bool,
    available: Option<u32>,
    ready_replicas: Option<u32>,
    in_flight: Option<u32>,
    queue: Option<u32>,
    /// Per pod: (operation, error index).
    pod_ops: Vec<(u8, usize)>,
    lane_rps: Vec<Option<u32>>,
    restart: Restart,
}

fn step_gen(churn: u8) -> impl Strategy<Value = StepGen> {
    (
        prop::sample::select(vec![1i64, 5, 30, 60, 60, 120, 300]),
        prop::bool::weighted(0.85),
        prop::option::weighted(0.4, 0..=1000u32),
        prop::option::weighted(0.4, 0..=20u32),
        prop::option::weighted(0.6, 0..=2500u32),
        prop::option::weighted(0.6, 0..=600u32),
        prop::collection::vec((0..churn, 0..ERRS.len()), PODS),
        prop::collection::vec(prop::option::weighted(0.5, 0..=300u32), MAX_LANES as usize),
        prop::sample::select(vec![
            Restart::None,
            Restart::None,
            Restart::None,
            Restart::None,
            Restart::None,
            Restart::None,
            Restart::None,
            Restart::None,
            Restart::Full,
            Restart::Lossy,
        ]),
    )
        .prop_map(
            |(
                dt,
                present,
                available,
                ready_replicas,
                in_flight,
                queue,
                pod_ops,
                lane_rps,
                restart,
            )| StepGen {
                dt,
                present,
                available,
                ready_replicas,
                in_flight,
                queue,
                pod_ops,
                lane_rps,
                restart,
            },
        )
}

#[derive(Clone, Debug)]
struct Case {
    profile: ProfileGen,
    lanes: Vec<LaneGen>,
    policy: Option<PolicyGen>,
    pods: Vec<PodGen>,
    steps: Vec<StepGen>,
    approved: Option<u32>,
}

fn case_gen(
    profile: impl Strategy<Value = ProfileGen>,
    policy: impl Strategy<Value = Option<PolicyGen>>,
    steps: std::ops::Range<usize>,
    churn: u8,
) -> impl Strategy<Value = Case> {
    (
        profile,
        prop::collection::vec(lane_gen(), 1..=MAX_LANES as usize),
        policy,
        prop::collection::vec(pod_gen(), PODS),
        prop::collection::vec(step_gen(churn), steps),
        prop::option::weighted(0.2, 0..=4u32),
    )
        .prop_map(|(profile, lanes, policy, pods, steps, approved)| Case {
            profile,
            lanes,
            policy,
            pods,
            steps,
            approved,
        })
}

// ---------------------------------------------------------------------------
// Building objects and snapshots
// ---------------------------------------------------------------------------

fn centi(v: u32) -> String {
    format!("{}.{:02}", v / 100, v % 100)
}

fn lane_name(i: u8) -> String {
    format!("l{i}")
}

fn sel_json(s: &Sel) -> Value {
    match s {
        Sel::Priority(p) => json!({"priorityAtLeast": p}),
        Sel::Names(n) => json!({"lanes": n.iter().map(|i| lane_name(*i)).collect::<Vec<_>>()}),
    }
}

fn profile_json(p: &ProfileGen) -> Value {
    let mut spec = json!({
        "pool": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "pool"},
            "podSelector": {"matchLabels": {"app": "pool"}},
        },
        "capacity": {
            "safeUnitsPerSecond": p.safe.to_string(),
            "unitsPerReplica": p.upr.to_string(),
            "warningUtilizationPercent": p.warn,
        },
        "replicas": {
            "min": p.min,
            "max": p.min.max(1) + p.span,
            "maxScaleUpStep": p.step,
            "scaleDownStabilizationSeconds": p.stab,
        },
        "inFlight": {"conserveAt": 1350, "stopAt": 1500, "resumeBelow": 1200},
    });
    if let Some(d) = &p.drain {
        let max = match d.max {
            MaxDrained::Count(n) => json!(n),
            MaxDrained::Percent(pc) => json!(format!("{pc}%")),
        };
        spec["drain"] = json!({
            "maxDrained": max,
            "minServing": d.min_serving,
            "errorRatioAbove": THRESHOLDS[d.threshold],
            "healthyForSeconds": d.healthy_for,
        });
    }
    json!({
        "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "CapacityProfile",
        "metadata": {"name": "pool", "namespace": NS}, "spec": spec,
    })
}

fn lane_json(i: usize, l: &LaneGen) -> Value {
    let mut spec = json!({
        "profile": "pool",
        "priority": l.priority,
        "weight": l.weight,
        "workUnitsPerRequest": centi(l.wpr_centi),
        "expectedRequestsPerSecond": l.rps.to_string(),
        "deadlineSeconds": 10,
        "queue": {"maxDepth": 10, "ttlSeconds": 5},
        "retry": {"maxAttempts": 1},
        "routes": {"primary": ["r"]},
    });
    if let Some(f) = l.floor {
        spec["floorUnitsPerSecond"] = json!(f.to_string());
    }
    if let Some(c) = l.ceiling_extra {
        spec["ceilingUnitsPerSecond"] = json!((l.floor.unwrap_or(0) + c).to_string());
    }
    spec["shedding"] = match l.mode {
        SheddingMode::Never => json!({"mode": "Never"}),
        SheddingMode::Throttle => json!({"mode": "Throttle"}),
        SheddingMode::Defer => {
            json!({"mode": "Defer", "minUnitsPerSecond": l.defer_min.to_string()})
        }
        SheddingMode::Pause => json!({"mode": "Pause"}),
    };
    if let Some((from, max, lease)) = &l.borrow {
        spec["checkpointable"] = json!(true);
        spec["borrowing"] = json!({
            "from": from.iter().map(|j| lane_name(*j)).collect::<Vec<_>>(),
            "maxUnitsPerSecond": max.to_string(),
            "leaseSeconds": lease,
        });
    }
    json!({
        "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "LaneContract",
        "metadata": {"name": lane_name(i as u8), "namespace": NS}, "spec": spec,
    })
}

fn policy_json(p: &PolicyGen) -> Value {
    let levels: Vec<Value> = p
        .levels
        .iter()
        .enumerate()
        .map(|(k, l)| {
            let mut enter = serde_json::Map::new();
            if let Some(u) = l.utilization {
                enter.insert("utilizationPercentAbove".into(), json!(u));
            }
            if let Some(f) = l.in_flight {
                enter.insert("inFlightAbove".into(), json!(f));
            }
            if let Some(q) = l.queue {
                enter.insert("queueDepthAbove".into(), json!(q));
            }
            if l.over_capacity || enter.is_empty() {
                enter.insert("overCapacity".into(), json!(true));
            }
            let mut level = json!({
                "name": format!("level-{}", k + 1),
                "enterWhen": enter,
                "actions": {
                    "rejectOptionalContext": k == 0,
                    "useFallbackRoutes": k >= 1,
                    "readOnly": k >= 3,
                    "pause": l.pause.iter().map(sel_json).collect::<Vec<_>>(),
                    "cap": l.cap.iter().map(|(s, u)| {
                        let mut c = sel_json(s);
                        c["unitsPerSecond"] = json!(u.to_string());
                        c
                    }).collect::<Vec<_>>(),
                },
            });
            if let Some((u, f, q)) = l.exit {
                let mut exit = serde_json::Map::new();
                if let Some(u) = u {
                    exit.insert("utilizationPercentBelow".into(), json!(u));
                }
                if let Some(f) = f {
                    exit.insert("inFlightBelow".into(), json!(f));
                }
                if let Some(q) = q {
                    exit.insert("queueDepthBelow".into(), json!(q));
                }
                level["exitWhen"] = Value::Object(exit);
            }
            // Read-only levels (k >= 3) say they may enter unattended, so the
            // generator keeps covering every approval mode on every level.
            level["approval"] = match l.approval {
                0..=6 => json!({"mode": "Automatic", "allowUnattended": k >= 3}),
                7 | 8 => json!({"mode": "Confirm", "timeoutSeconds": l.timeout, "allowUnattended": k >= 3}),
                _ => json!({"mode": "Manual"}),
            };
            level
        })
        .collect();
    let mut spec = json!({
        "profile": "pool",
        "hysteresis": {"stableForSeconds": p.stable},
        "levels": levels,
    });
    if let Some(k) = p.missing {
        spec["onMissingTelemetry"] = json!("EnterLevel");
        spec["missingTelemetryLevel"] = json!(k.min(p.levels.len() as i32));
    }
    json!({
        "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "DegradationPolicy",
        "metadata": {"name": "ladder", "namespace": NS}, "spec": spec,
    })
}

/// The world, loaded the way `plan` loads manifests (CEL rules included).
fn build_world(c: &Case) -> World {
    let mut docs = vec![profile_json(&c.profile)];
    docs.extend(c.lanes.iter().enumerate().map(|(i, l)| lane_json(i, l)));
    if let Some(p) = &c.policy {
        docs.push(policy_json(p));
    }
    let yaml: String = docs
        .iter()
        .map(|d| format!("---\n{}", serde_yaml::to_string(d).expect("yaml")))
        .collect();
    let mut loaded = Loaded::default();
    load_str(Path::new("generated.yaml"), &yaml, &mut loaded)
        .unwrap_or_else(|e| panic!("the generator made an invalid object: {e}\n{yaml}"));
    assert_eq!(loaded.world.lanes.len(), c.lanes.len());
    loaded.world
}

/// The snapshots of a case, each with the restart that precedes it.
fn build_snapshots(c: &Case) -> Vec<(Snapshot, Restart)> {
    let mut pods = c.pods.clone();
    let mut at = 0;
    let mut out = Vec::new();
    for (i, s) in c.steps.iter().enumerate() {
        if i > 0 {
            at += s.dt;
            for (p, (op, e)) in pods.iter_mut().zip(&s.pod_ops) {
                match op {
                    0 => p.present = !p.present,
                    1 => p.ready = Some(p.ready != Some(true)),
                    2 => p.err = None,
                    3 | 4 => p.err = Some(*e),
                    5 => p.ready = None,
                    _ => {}
                }
            }
        }
        let mut snap = Snapshot {
            at,
            ..Default::default()
        };
        if s.present {
            let mut sig = ProfileSignals {
                available_units_per_second: s.available.map(f64::from),
                ready_replicas: s.ready_replicas,
                in_flight: s.in_flight.map(f64::from),
                queue_depth: s.queue.map(f64::from),
                ..Default::default()
            };
            // A signal missing from a step is one its configured source
            // failed to give (live sources say so in `unknown`).
            if s.in_flight.is_none() {
                sig.unknown
                    .insert("inFlight".into(), "source failed".into());
            }
            if s.queue.is_none() {
                sig.unknown
                    .insert("queueDepth".into(), "source failed".into());
            }
            for (k, p) in pods.iter().enumerate() {
                if p.present {
                    sig.pods.insert(
                        format!("pod-{k}"),
                        PodSignals {
                            ready: p.ready,
                            error_ratio: p.err.map(|e| ERRS[e]),
                            drain_requested: None,
                            revision: None,
                        },
                    );
                }
            }
            snap.profiles.insert(PKEY.to_owned(), sig);
        }
        for (k, rps) in s.lane_rps.iter().enumerate().take(c.lanes.len()) {
            if let Some(r) = rps {
                snap.lanes.insert(
                    format!("{NS}/{}", lane_name(k as u8)),
                    LaneSignals {
                        requests_per_second: Some(f64::from(*r)),
                        ..Default::default()
                    },
                );
            }
        }
        out.push((snap, s.restart));
    }
    out
}

/// The state a restarted controller works from.
fn restart(state: &EngineState, how: Restart, at: i64) -> EngineState {
    match how {
        Restart::None => state.clone(),
        Restart::Full => serde_json::from_str(&serde_json::to_string(state).unwrap()).unwrap(),
        Restart::Lossy => EngineState {
            profiles: state
                .profiles
                .iter()
                .map(|(k, s)| {
                    let re = ProfileState {
                        level: s.level,
                        level_since: s.level_since,
                        desired_replicas: s.desired_replicas,
                        drained: s
                            .drained
                            .keys()
                            .map(|p| {
                                (
                                    p.clone(),
                                    DrainedPod {
                                        since: at,
                                        reason: "restored from pod label".into(),
                                        healthy_since: None,
                                    },
                                )
                            })
                            .collect(),
                        ..Default::default()
                    };
                    (k.clone(), re)
                })
                .collect(),
        },
    }
}

// ---------------------------------------------------------------------------
// The invariants
// ---------------------------------------------------------------------------

/// What the checks remember between steps.
#[derive(Default)]
struct History {
    /// Time of the last level change.
    last_level_change: Option<i64>,
    /// Times of steps with unknown telemetry.
    unknown_at: Vec<i64>,
    /// Times of steps at which a scale-down was not allowed (level > 0 or
    /// unknown telemetry).
    no_scale_down_at: Vec<i64>,
    level_changes: usize,
    step_downs: usize,
    drains: usize,
}

fn pool_ready(sig: &ProfileSignals) -> u32 {
    sig.pods.values().filter(|p| p.ready != Some(false)).count() as u32
}

/// The drain bound, computed independently of the engine.
fn drain_bound(d: &DrainGen, ready: u32) -> u32 {
    let share = match d.max {
        MaxDrained::Count(n) => n.max(0) as i64,
        MaxDrained::Percent(p) => (i64::from(p) * i64::from(ready)) / 100,
    };
    share
        .min(i64::from(ready) - i64::from(d.min_serving))
        .max(0) as u32
}

fn check_allocation(
    c: &Case,
    world: &World,
    d: &ProfileDecision,
    prev: &ProfileState,
    at: i64,
) -> Result<(), TestCaseError> {
    let lanes: BTreeMap<&str, &LaneGen> = c
        .lanes
        .iter()
        .enumerate()
        .map(|(i, l)| (world.lanes[i].metadata.name.as_deref().unwrap(), l))
        .collect();
    prop_assert_eq!(d.lanes.len(), c.lanes.len());
    let sum: f64 = d.lanes.iter().map(|l| l.admitted_units_per_second).sum();
    prop_assert!(
        (sum - d.admitted_units_per_second).abs() < 1e-5,
        "lanes sum {} vs total {}",
        sum,
        d.admitted_units_per_second
    );

    // Admitted total never exceeds capacity (the last known one, or the
    // declared safe capacity, while telemetry is unknown).
    let capacity = match d.telemetry {
        Telemetry::Known => d.capacity_units_per_second.expect("known capacity"),
        Telemetry::Unknown => {
            prop_assert_eq!(d.capacity_units_per_second, None);
            prev.last_capacity.unwrap_or(f64::from(c.profile.safe))
        }
    };
    prop_assert!(
        d.admitted_units_per_second <= capacity + TOL,
        "admitted {} > capacity {}",
        d.admitted_units_per_second,
        capacity
    );

    for l in &d.lanes {
        let g = lanes[l.name.as_str()];
        let ceiling = g.ceiling_extra.map(|e| f64::from(g.floor.unwrap_or(0) + e));
        let a = l.admitted_units_per_second;
        prop_assert!(a >= 0.0);
        prop_assert!(
            a <= l.demand_units_per_second + TOL,
            "{} admitted {} over demand",
            l.name,
            a
        );
        if let Some(ce) = ceiling {
            prop_assert!(
                a <= ce + TOL,
                "{} admitted {} over ceiling {}",
                l.name,
                a,
                ce
            );
        }
        if let Some(lc) = l.level_cap_units_per_second {
            prop_assert!(
                a <= lc + TOL,
                "{} admitted {} over level cap {}",
                l.name,
                a,
                lc
            );
        }
        // Contracts outrank policies.
        match g.mode {
            SheddingMode::Never => {
                prop_assert!(
                    l.state != LaneState::Paused && l.level_cap_units_per_second.is_none(),
                    "Never lane {} touched",
                    l.name
                );
            }
            SheddingMode::Defer => {
                prop_assert!(l.state != LaneState::Paused);
                if let Some(lc) = l.level_cap_units_per_second {
                    prop_assert!(
                        lc + TOL >= f64::from(g.defer_min),
                        "Defer lane {} capped at {} < min",
                        l.name,
                        lc
                    );
                }
            }
            SheddingMode::Throttle => prop_assert!(l.state != LaneState::Paused),
            SheddingMode::Pause => {}
        }
        if l.state == LaneState::Paused {
            prop_assert!(a == 0.0);
        }
        // Borrowing: only checkpointable borrowers, within their maximum,
        // with a lease.
        match &g.borrow {
            None => prop_assert!(l.borrowing.is_empty() && l.borrowed_units_per_second == 0.0),
            Some((from, max, lease)) => {
                prop_assert!(l.borrowed_units_per_second <= f64::from(*max) + TOL);
                for grant in &l.borrowing {
                    prop_assert!(
                        from.iter().any(|j| lane_name(*j) == grant.from),
                        "grant from {}",
                        grant.from
                    );
                    prop_assert!(grant.from != l.name, "a lane borrowed from itself");
                    prop_assert_eq!(grant.expires_at, at + lease);
                }
            }
        }
    }

    if d.telemetry != Telemetry::Known {
        return Ok(());
    }
    // A Never lane keeps min(floor, demand) when capacity covers the floors
    // of every lane at least as critical.
    for l in &d.lanes {
        let g = lanes[l.name.as_str()];
        if g.mode != SheddingMode::Never {
            continue;
        }
        let floors: f64 = c
            .lanes
            .iter()
            .filter(|o| o.priority <= g.priority)
            .map(|o| f64::from(o.floor.unwrap_or(0)))
            .sum();
        if capacity + TOL >= floors {
            let keep = f64::from(g.floor.unwrap_or(0)).min(l.demand_units_per_second);
            prop_assert!(
                l.admitted_units_per_second + TOL >= keep,
                "Never lane {} got {} < min(floor, demand) {} (capacity {}, floors {})",
                l.name,
                l.admitted_units_per_second,
                keep,
                capacity,
                floors
            );
        }
    }
    // Shedding order: while a lane is Throttled (capacity ran out before its
    // cap), no less critical lane gets more than its reserved floor (plus
    // what it borrows from idle floors).
    for hi in d.lanes.iter().filter(|l| l.state == LaneState::Throttled) {
        for lo in d.lanes.iter().filter(|l| l.priority > hi.priority) {
            let own = lo.admitted_units_per_second - lo.borrowed_units_per_second;
            prop_assert!(
                own <= lo.reserved_units_per_second + 1e-5,
                "{} (priority {}) got {} beyond its floor {} while {} (priority {}) is Throttled",
                lo.name,
                lo.priority,
                own,
                lo.reserved_units_per_second,
                hi.name,
                hi.priority
            );
        }
    }
    Ok(())
}

fn check_ladder(
    c: &Case,
    snap: &Snapshot,
    d: &ProfileDecision,
    prev: &ProfileState,
    h: &mut History,
) -> Result<(), TestCaseError> {
    let at = snap.at;
    let Some(p) = &c.policy else {
        prop_assert_eq!(d.level, 0);
        return Ok(());
    };
    let n = p.levels.len() as u32;
    prop_assert!(d.level <= n);
    if let Some(pending) = d.pending_approval_level {
        prop_assert!(pending > d.level && pending <= n);
    }
    prop_assert_eq!(
        d.transition.is_some(),
        d.level != prev.level,
        "transition reported iff the level changed"
    );
    if d.telemetry == Telemetry::Unknown {
        prop_assert!(
            d.level >= prev.level,
            "stepped down from {} to {} on unknown telemetry",
            prev.level,
            d.level
        );
        h.unknown_at.push(at);
    }
    if d.level < prev.level {
        h.step_downs += 1;
        prop_assert_eq!(prev.level - d.level, 1, "more than one level down at once");
        if let Some(t) = h.last_level_change {
            prop_assert!(
                at - t >= p.stable,
                "stepped down at {} only {}s after the previous level change at {} (stableForSeconds {})",
                at,
                at - t,
                t,
                p.stable
            );
        }
        for &u in &h.unknown_at {
            prop_assert!(
                u < at - p.stable,
                "stepped down at {at} with unknown telemetry at {u}, inside the window"
            );
        }
        // Missing data is no evidence: no enter trigger of the level left
        // reads a signal its source reported Unknown.
        let l = &p.levels[prev.level as usize - 1];
        let sig = snap.profiles.get(PKEY);
        prop_assert!(d.capacity_units_per_second.is_some());
        if l.utilization.is_some() {
            prop_assert!(
                d.utilization_percent.is_some(),
                "left level {} with utilization unknown",
                prev.level
            );
        }
        if l.in_flight.is_some() {
            prop_assert!(
                sig.and_then(|s| s.in_flight).is_some(),
                "left level {} with inFlight unknown",
                prev.level
            );
        }
        if l.queue.is_some() {
            prop_assert!(
                sig.and_then(|s| s.queue_depth).is_some(),
                "left level {} with queueDepth unknown",
                prev.level
            );
        }
    }
    if d.level != prev.level {
        h.level_changes += 1;
        h.last_level_change = Some(at);
    }
    Ok(())
}

fn check_sizing(
    c: &Case,
    d: &ProfileDecision,
    prev: &ProfileState,
    at: i64,
    h: &mut History,
) -> Result<(), TestCaseError> {
    let (min, max) = (c.profile.min, c.profile.min.max(1) + c.profile.span);
    if let Some(r) = d.desired_replicas {
        prop_assert!(
            r >= min && r <= max,
            "desired {} outside [{}, {}]",
            r,
            min,
            max
        );
    }
    if d.telemetry == Telemetry::Unknown {
        prop_assert_eq!(
            d.desired_replicas,
            prev.desired_replicas,
            "desired replicas held while unknown"
        );
    }
    if d.level > 0 || d.telemetry == Telemetry::Unknown {
        h.no_scale_down_at.push(at);
    }
    if let (Some(now), Some(before)) = (d.desired_replicas, prev.desired_replicas)
        && now < before
    {
        let stab = c.profile.stab;
        prop_assert!(d.level == 0 && d.telemetry == Telemetry::Known);
        // What demand alone wants now (clamped, no scale-up step limit): a
        // scale-down never goes below it.
        let per_replica = f64::from(c.profile.upr) * f64::from(c.profile.warn) / 100.0;
        let x = d.demand_units_per_second / per_replica;
        let wanted = (((x * 1e9).round() / 1e9).ceil() as i32).clamp(min, max);
        prop_assert!(
            now >= wanted,
            "scaled down to {} while demand wants {}",
            now,
            wanted
        );
        for &b in &h.no_scale_down_at {
            prop_assert!(
                b < at - stab,
                "scaled down at {at} with level > 0 or unknown telemetry at {b}"
            );
        }
    }
    Ok(())
}

fn check_drain(
    c: &Case,
    snap: &Snapshot,
    d: &ProfileDecision,
    prev: &ProfileState,
    next: &ProfileState,
    h: &mut History,
) -> Result<(), TestCaseError> {
    let before: BTreeSet<&String> = prev.drained.keys().collect();
    let after: BTreeSet<&String> = next.drained.keys().collect();
    prop_assert_eq!(d.drain.drained_pods as usize, after.len());
    let Some(spec) = &c.profile.drain else {
        prop_assert!(after.is_empty(), "drained without a drain spec");
        return Ok(());
    };
    let Some(sig) = snap.profiles.get(PKEY) else {
        // No evidence at all: no drain decision either way.
        prop_assert_eq!(before, after, "drain set changed without any pod evidence");
        return Ok(());
    };
    let thr: f64 = THRESHOLDS[spec.threshold].parse().unwrap();
    let ready = pool_ready(sig);
    let bound = drain_bound(spec, ready);
    prop_assert_eq!(
        d.drain.drain_budget,
        bound,
        "bound for {} ready pods",
        ready
    );
    prop_assert!(
        after.len() as u32 <= bound,
        "{} drained > bound {} ({} ready)",
        after.len(),
        bound,
        ready
    );
    if ready >= spec.min_serving as u32 {
        let serving = sig
            .pods
            .iter()
            .filter(|(n, p)| p.ready != Some(false) && !after.contains(n))
            .count() as u32;
        prop_assert!(
            serving >= spec.min_serving as u32
                && ready - after.len() as u32 >= spec.min_serving as u32,
            "serving {} < minServing {} ({} ready, {} drained)",
            serving,
            spec.min_serving,
            ready,
            after.len()
        );
    }
    for p in &after {
        prop_assert!(sig.pods.contains_key(*p), "gone pod {} still drained", p);
    }
    // Scaling down: the engine's own comparison of desired and ready.
    let ready_for_scale = sig.ready_replicas.or(if sig.pods.is_empty() {
        None
    } else {
        Some(ready)
    });
    let scaling_down = matches!((d.desired_replicas, ready_for_scale), (Some(w), Some(r)) if (w as i64) < i64::from(r));
    let new: Vec<&&String> = after.difference(&before).collect();
    h.drains += new.len();
    for p in &new {
        let pod = &sig.pods[p.as_str()];
        prop_assert!(
            d.telemetry == Telemetry::Known,
            "new drain of {} on unknown telemetry",
            p
        );
        prop_assert!(!scaling_down, "new drain of {} while scaling down", p);
        prop_assert!(pod.ready != Some(false), "drained unready pod {}", p);
        prop_assert!(
            pod.error_ratio.is_some_and(|e| e > thr),
            "drained {} without evidence over {}",
            p,
            thr
        );
    }
    // Worst first, ties by name: no refused candidate is worse than a pod
    // drained in this step.
    for p in &new {
        let e = sig.pods[p.as_str()].error_ratio.unwrap();
        for r in d
            .drain
            .actions
            .iter()
            .filter(|a| a.action == DrainAction::Refused)
        {
            let re = r.error_ratio.unwrap();
            prop_assert!(
                re < e || (re == e && r.pod.as_str() > p.as_str()),
                "refused {} ({}) but drained {} ({})",
                r.pod,
                re,
                p,
                e
            );
        }
    }
    // Released pods: gone, healthy for the window, or over the bound.
    for p in before.difference(&after) {
        let Some(pod) = sig.pods.get(p.as_str()) else {
            continue;
        };
        let act = d.drain.actions.iter().find(|a| &&a.pod == p);
        prop_assert!(
            act.is_some_and(|a| a.action == DrainAction::Undrain),
            "{} released without an Undrain",
            p
        );
        let act = act.unwrap();
        if act.reason.to_string().starts_with("Healthy") {
            prop_assert!(
                pod.error_ratio.is_some_and(|e| e <= thr),
                "{} undrained as healthy without evidence",
                p
            );
            let since = prev.drained[p.as_str()].healthy_since.unwrap_or(snap.at);
            prop_assert!(snap.at - since >= spec.healthy_for);
        } else {
            prop_assert!(
                act.reason.to_string().starts_with("OverBound"),
                "unexpected release reason {}",
                act.reason
            );
        }
    }
    Ok(())
}

/// Runs a case and checks every invariant at every step.
fn check_case(c: &Case) -> Result<History, TestCaseError> {
    let world = build_world(c);
    let mut shuffled = world.clone();
    shuffled.lanes.reverse();
    let mut approvals = Approvals::new();
    if let Some(a) = c.approved {
        approvals.insert(PKEY.to_owned(), a.into());
    }
    let mut state = EngineState::default();
    let mut h = History::default();
    for (snap, how) in build_snapshots(c) {
        state = restart(&state, how, snap.at);
        let (e, next) = evaluate(&world, &snap, &approvals, &state);

        // Determinism: same inputs, same outputs and state, byte for byte;
        // and the order in which lanes are listed does not matter.
        let (e2, next2) = evaluate(&world, &snap, &approvals, &state);
        prop_assert_eq!(
            serde_json::to_string(&e).unwrap(),
            serde_json::to_string(&e2).unwrap()
        );
        prop_assert_eq!(
            serde_json::to_string(&next).unwrap(),
            serde_json::to_string(&next2).unwrap()
        );
        let (e3, next3) = evaluate(&shuffled, &snap, &approvals, &state);
        prop_assert_eq!(
            serde_json::to_string(&e).unwrap(),
            serde_json::to_string(&e3).unwrap()
        );
        prop_assert_eq!(&next, &next3);
        // The state survives a round trip (a restart that reads it back).
        let back: EngineState =
            serde_json::from_str(&serde_json::to_string(&next).unwrap()).unwrap();
        prop_assert_eq!(&back, &next);

        prop_assert_eq!(e.profiles.len(), 1);
        let d = &e.profiles[0];
        let empty = ProfileState::default();
        let prev = state.profiles.get(PKEY).unwrap_or(&empty);
        let nxt = &next.profiles[PKEY];
        prop_assert_eq!(nxt.level, d.level);
        check_allocation(c, &world, d, prev, snap.at)?;
        check_ladder(c, &snap, d, prev, &mut h)?;
        check_sizing(c, d, prev, snap.at, &mut h)?;
        check_drain(c, &snap, d, prev, nxt, &mut h)?;
        state = next;
    }
    Ok(h)
}

// ---------------------------------------------------------------------------
// The properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    /// Random worlds with a policy and random timelines: every invariant at
    /// every step.
    #[test]
    fn invariants_hold_over_random_timelines(
        c in case_gen(
            profile_gen(prop::option::weighted(0.7, drain_gen())),
            prop::option::weighted(0.85, policy_gen()),
            1..30,
            12,
        )
    ) {
        check_case(&c)?;
    }

    /// The drain bound under heavy pod churn (pods appearing, disappearing,
    /// flipping readiness, changing error ratio) and restarts.
    #[test]
    fn drain_bound_holds_under_pod_churn(
        c in case_gen(profile_gen(drain_gen().prop_map(Some)), Just(None), 10..40, 7)
    ) {
        check_case(&c)?;
    }

    /// The ladder on long calm-and-storm timelines: at most one level down
    /// per stable window, never down on unknown telemetry.
    #[test]
    fn ladder_steps_down_slowly(
        c in case_gen(profile_gen(Just(None)), policy_gen().prop_map(Some), 20..50, 12)
    ) {
        check_case(&c)?;
    }
}

/// The generators reach the interesting cases (so the properties above are
/// not vacuous): level changes, step-downs, unknown steps, drains.
#[test]
fn generators_reach_interesting_cases() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = case_gen(
        profile_gen(prop::option::of(drain_gen())),
        policy_gen().prop_map(Some),
        20..40,
        12,
    );
    let (mut changes, mut downs, mut unknown, mut drains) = (0, 0, 0, 0);
    for _ in 0..60 {
        let c = strategy.new_tree(&mut runner).unwrap().current();
        let h = check_case(&c).expect("invariants");
        changes += h.level_changes;
        downs += h.step_downs;
        unknown += h.unknown_at.len();
        drains += h.drains;
    }
    assert!(changes > 20, "level changes: {changes}");
    assert!(downs > 5, "step-downs: {downs}");
    assert!(unknown > 20, "unknown steps: {unknown}");
    assert!(drains > 5, "drains: {drains}");
}

// ---------------------------------------------------------------------------
// Unknown never relaxes
// ---------------------------------------------------------------------------

/// A signal of a snapshot that can be made Unknown.
#[derive(Clone, Debug)]
enum Signal {
    Capacity,
    InFlight,
    QueueDepth,
    LaneRate(String),
}

/// The snapshot with `s` reported Unknown by its source.
fn make_unknown(snap: &Snapshot, s: &Signal) -> Snapshot {
    let mut out = snap.clone();
    match s {
        Signal::LaneRate(k) => {
            let l = out.lanes.entry(k.clone()).or_default();
            l.requests_per_second = Some(f64::NAN);
        }
        _ => {
            let Some(p) = out.profiles.get_mut(PKEY) else {
                return out;
            };
            let name = match s {
                Signal::Capacity => {
                    p.available_units_per_second = None;
                    "availableUnitsPerSecond"
                }
                Signal::InFlight => {
                    p.in_flight = None;
                    "inFlight"
                }
                _ => {
                    p.queue_depth = None;
                    "queueDepth"
                }
            };
            p.unknown
                .insert(name.into(), "made unknown by the test".into());
        }
    }
    out
}

/// Rule 1 of decide-on-evidence, at one step: with `signal` Unknown, none of
/// the five things relaxes against the previous step.
fn check_unknown_never_relaxes(
    world: &World,
    snap: &Snapshot,
    approvals: &Approvals,
    state: &EngineState,
    before: Option<&ProfileDecision>,
    signal: &Signal,
) -> Result<(), TestCaseError> {
    let blind = make_unknown(snap, signal);
    let (e, _) = evaluate(world, &blind, approvals, state);
    let d = &e.profiles[0];
    let empty = ProfileState::default();
    let prev = state.profiles.get(PKEY).unwrap_or(&empty);
    // Capacity and lane rates are what allocation, sizing and the drain
    // need; every signal may be what the current level's triggers need.
    let needed_by_all = matches!(signal, Signal::Capacity | Signal::LaneRate(_));
    if needed_by_all || d.level < prev.level {
        // A step down is allowed only when the blinded signal is none the
        // level reads: the same step down happens with the signal known.
        let (known, _) = evaluate(world, snap, approvals, state);
        prop_assert!(
            d.level >= prev.level || (!needed_by_all && known.profiles[0].level == d.level),
            "stepped down {} -> {} with {signal:?} unknown at {}",
            prev.level,
            d.level,
            snap.at
        );
    }
    if !needed_by_all {
        return Ok(());
    }
    for l in &d.lanes {
        if let Some(&was) = prev.admitted.get(&l.name) {
            prop_assert!(
                l.admitted_units_per_second <= was + TOL,
                "lane {} admitted {} > {} before, with {signal:?} unknown at {}",
                l.name,
                l.admitted_units_per_second,
                was,
                snap.at
            );
        }
        if let Some(b) = before.and_then(|b| b.lanes.iter().find(|x| x.name == l.name))
            && matches!(b.state, LaneState::Paused | LaneState::Capped)
        {
            prop_assert!(
                l.admitted_units_per_second <= b.admitted_units_per_second + TOL,
                "{:?} lane {} released with {signal:?} unknown at {}",
                b.state,
                l.name,
                snap.at
            );
        }
    }
    if let (Some(was), Some(now)) = (prev.desired_replicas, d.desired_replicas) {
        prop_assert!(
            now >= was,
            "desired replicas fell {was} -> {now} with {signal:?} unknown at {}",
            snap.at
        );
    }
    for a in &d.drain.actions {
        prop_assert!(
            a.action != DrainAction::Undrain
                || matches!(a.reason, lanekeeper::api::DrainReason::OverBound { .. }),
            "pod {} undrained ({}) with {signal:?} unknown at {}",
            a.pod,
            a.reason,
            snap.at
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Replacing any signal at any step by Unknown never makes the level
    /// step down, a lane's admitted rate rise, desired replicas fall, a pod
    /// be undrained for health, or a paused or capped lane be released.
    #[test]
    fn unknown_never_relaxes(
        c in case_gen(
            profile_gen(prop::option::weighted(0.5, drain_gen())),
            policy_gen().prop_map(Some),
            2..25,
            8,
        )
    ) {
        let world = build_world(&c);
        let mut approvals = Approvals::new();
        if let Some(a) = c.approved {
            approvals.insert(PKEY.to_owned(), a.into());
        }
        let mut state = EngineState::default();
        let mut before: Option<ProfileDecision> = None;
        for (snap, how) in build_snapshots(&c) {
            state = restart(&state, how, snap.at);
            let mut signals = vec![Signal::Capacity, Signal::InFlight, Signal::QueueDepth];
            signals.extend(world.lanes.iter().map(|l| {
                Signal::LaneRate(format!("{NS}/{}", l.metadata.name.as_deref().unwrap_or_default()))
            }));
            for s in &signals {
                check_unknown_never_relaxes(&world, &snap, &approvals, &state, before.as_ref(), s)?;
            }
            let (e, next) = evaluate(&world, &snap, &approvals, &state);
            before = e.profiles.first().cloned();
            state = next;
        }
    }
}
