//! The simulation against closed forms: queue drain, retry amplification,
//! conservation and the capacity bound, determinism.

use std::path::Path;

use lanekeeper::manifest::{Loaded, load_str};
use lanekeeper::policy::World;
use lanekeeper::sim::{self, Scenario, Strategy};

/// One profile and one batch lane (P3-like), no ladder.
fn batch_world(units_per_request: &str, max_attempts: u32, budget: u32) -> World {
    let text = format!(
        r#"
apiVersion: lanekeeper.dev/v1alpha1
kind: CapacityProfile
metadata: {{name: pool, namespace: t}}
spec:
  pool:
    scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: pool}}
    podSelector: {{matchLabels: {{app: pool}}}}
  capacity: {{safeUnitsPerSecond: "117", unitsPerReplica: "10", warningUtilizationPercent: 85}}
  replicas: {{min: 1, max: 20, maxScaleUpStep: 4, scaleDownStabilizationSeconds: 300}}
---
apiVersion: lanekeeper.dev/v1alpha1
kind: LaneContract
metadata: {{name: batch, namespace: t}}
spec:
  profile: pool
  priority: 3
  workUnitsPerRequest: "{units_per_request}"
  expectedRequestsPerSecond: "220"
  shedding: {{mode: Throttle}}
  deadlineSeconds: 7200
  queue: {{maxDepth: 20000, ttlSeconds: 7000}}
  retry: {{maxAttempts: {max_attempts}, budgetPercent: {budget}}}
  routes: {{primary: [batch]}}
"#
    );
    let mut loaded = Loaded::default();
    load_str(Path::new("test.yaml"), &text, &mut loaded).expect("test manifests load");
    loaded.world
}

fn scenario(yaml: &str) -> Scenario {
    let s: Scenario = serde_yaml::from_str(yaml).expect("scenario parses");
    lanekeeper::scenario::check(&s).expect("scenario is valid");
    s
}

fn drain_scenario(capacity: f64) -> Scenario {
    scenario(&format!(
        r#"
seed: 7
durationSeconds: 900
tickSeconds: 0.1
profiles:
  t/pool: {{capacity: [{{at: 0, unitsPerSecond: {capacity}}}]}}
lanes:
  t/batch:
    arrivals: [{{at: 0, requestsPerSecond: 220}}]
    service: {{p50Seconds: 0.5, p95Seconds: 1.5}}
    initialBacklog: 18000
"#
    ))
}

/// The share of capacity lanekeeper's gateway fills with spare capacity.
const SPARE: f64 = lanes::SPARE_UTILIZATION;

#[test]
fn queue_drains_at_the_net_rate_as_the_closed_form_says() {
    // Service 260 jobs/s (117 units/s at 0.45 units per job), arrivals
    // 220 jobs/s: 18,000 / (260 − 220) = 450 s for gateways that use the
    // whole capacity. lanekeeper's gateway admits the lane's demand (220)
    // and serves its backlog from spare capacity, which stops at 95 % of
    // the pool: 18,000 / (247 − 220) = 667 s.
    let world = batch_world("0.45", 3, 5);
    let sc = drain_scenario(117.0);
    for policy in [Strategy::Lanekeeper, Strategy::Fifo, Strategy::Fair] {
        let service = if policy == Strategy::Lanekeeper {
            260.0 * SPARE
        } else {
            260.0
        };
        let (_, rep) = sim::simulate(&world, &sc, policy).unwrap();
        let lane = &rep.profiles[0].lanes[0];
        assert_eq!(lane.peak_backlog, 18_000, "{policy:?}");
        assert_eq!(lane.peak_backlog_at, Some(0), "{policy:?}");
        let drained = lane
            .drained_at
            .unwrap_or_else(|| panic!("{policy:?}: never drained")) as f64;
        // Drained = down to one tick's arrivals (22 jobs): (18,000 − 22) / 40 = 449.45 s.
        let expected = 18_000.0 / (service - 220.0);
        assert!(
            (drained - expected).abs() / expected < 0.03,
            "{policy:?}: drained at {drained}s, closed form {expected}s"
        );
        assert_eq!(lane.drain_end_backlog_seconds, Some(0.0), "{policy:?}");
    }
}

#[test]
fn queue_never_drains_when_service_does_not_exceed_arrivals() {
    let world = batch_world("0.45", 3, 5);
    // Service = arrivals (220 jobs/s = 99 units/s), then below them.
    for cap in [99.0, 90.0] {
        let (_, rep) = sim::simulate(&world, &drain_scenario(cap), Strategy::Lanekeeper).unwrap();
        let lane = &rep.profiles[0].lanes[0];
        assert_eq!(lane.drained_at, None, "capacity {cap}");
        assert!(
            lane.backlog_at_end >= 16_000,
            "capacity {cap}: backlog {}",
            lane.backlog_at_end
        );
        if cap < 99.0 {
            assert_eq!(
                lane.drain_end_backlog_seconds, None,
                "capacity {cap}: must never drain"
            );
            assert!(lane.backlog_at_end > 18_000);
        }
    }
}

fn retry_scenario() -> Scenario {
    scenario(
        r#"
seed: 11
durationSeconds: 1000
tickSeconds: 0.1
clients: {maxRetries: 3, backoffSeconds: 1, backoffMultiplier: 2, maxBackoffSeconds: 8, jitter: 0.5, giveUpAfterDeadline: false}
profiles:
  t/pool: {capacity: [{at: 0, unitsPerSecond: 1000}]}
lanes:
  t/batch:
    arrivals: [{at: 0, requestsPerSecond: 100}, {at: 900, requestsPerSecond: 0}]
    service: {p50Seconds: 0.2, p95Seconds: 0.5}
    failureRatio: 0.25
"#,
    )
}

#[test]
fn retry_amplification_matches_the_geometric_sum() {
    // Independent failures p = 0.25, up to k = 3 retries:
    // attempts per request = 1 + p + p² + p³ = 1.328125.
    let world = batch_world("0.45", 10, 100);
    let (run, rep) = sim::simulate(&world, &retry_scenario(), Strategy::Fifo).unwrap();
    let lane = &rep.profiles[0].lanes[0];
    assert_eq!(lane.pending, 0, "every request has an outcome");
    let n = run.lanes[0].offered as f64;
    let amp = run.lanes[0].attempts as f64 / n;
    let expected = 1.0 + 0.25 + 0.25f64.powi(2) + 0.25f64.powi(3);
    // Attempts per request have variance ≈ 0.408; allow 4 standard errors.
    let se = (0.408 / n).sqrt();
    assert!(
        (amp - expected).abs() < 4.0 * se,
        "amplification {amp}, expected {expected} ± {}",
        4.0 * se
    );
    // Requests that still fail after 4 attempts: p⁴.
    let failed = lane.failed as f64 / n;
    assert!(
        (failed - 0.25f64.powi(4)).abs() < 0.002,
        "failed share {failed}"
    );
}

#[test]
fn the_retry_budget_caps_amplification_for_clients_that_honour_it() {
    // Same failures, but lanekeeper's gateway enforces a 5 % retry budget.
    let world = batch_world("0.45", 4, 5);
    let (_, rep) = sim::simulate(&world, &retry_scenario(), Strategy::Lanekeeper).unwrap();
    let lane = &rep.profiles[0].lanes[0];
    // Clients still try once more after a failure (the gateway answers
    // that retry with a refusal), but the pool sees at most 5 % extra.
    let amp = lane.pool_amplification.unwrap();
    assert!(amp <= 1.06, "pool amplification {amp} with a 5% budget");
    assert!(amp > 1.03, "the budget is used, not refused: {amp}");
    assert!(lane.retry_amplification.unwrap() > amp);
}

/// One profile and one P3-like lane with the given shedding mode and queue
/// depth, no ladder.
fn shedding_world(mode: &str, max_depth: u32, max_attempts: u32, budget: u32) -> World {
    let min = if mode == "Defer" {
        ", minUnitsPerSecond: \"60\""
    } else {
        ""
    };
    let text = format!(
        r#"
apiVersion: lanekeeper.dev/v1alpha1
kind: CapacityProfile
metadata: {{name: pool, namespace: t}}
spec:
  pool:
    scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: pool}}
    podSelector: {{matchLabels: {{app: pool}}}}
  capacity: {{safeUnitsPerSecond: "117", unitsPerReplica: "10", warningUtilizationPercent: 85}}
  replicas: {{min: 1, max: 20, maxScaleUpStep: 4, scaleDownStabilizationSeconds: 300}}
---
apiVersion: lanekeeper.dev/v1alpha1
kind: LaneContract
metadata: {{name: batch, namespace: t}}
spec:
  profile: pool
  priority: 3
  workUnitsPerRequest: "0.45"
  expectedRequestsPerSecond: "220"
  shedding: {{mode: {mode}{min}}}
  deadlineSeconds: 7200
  queue: {{maxDepth: {max_depth}, ttlSeconds: 3600}}
  retry: {{maxAttempts: {max_attempts}, budgetPercent: {budget}}}
  routes: {{primary: [batch]}}
"#
    );
    let mut loaded = Loaded::default();
    load_str(Path::new("test.yaml"), &text, &mut loaded).expect("test manifests load");
    loaded.world
}

/// 220 jobs/s on a pool that completes only 60 units/s (133.3 jobs/s) for
/// 208 s, then 117 (260 jobs/s): INC-47's P3 backlog of about 18,000 jobs
/// builds up behind a 2,000-deep queue (and more until the controller sees
/// the capacity back) and drains at (0.95 × 260 − 220) jobs/s, the lane's
/// demand plus lanekeeper's spare capacity. A fifth of the clients ignore
/// Retry-After.
fn dip_scenario() -> Scenario {
    scenario(
        r#"
seed: 13
durationSeconds: 1400
tickSeconds: 0.1
clients: {maxRetries: 3, backoffSeconds: 1, backoffMultiplier: 2, maxBackoffSeconds: 30, jitter: 0.5, ignoreRetryAfterShare: 0.2}
profiles:
  t/pool: {capacity: [{at: 0, unitsPerSecond: 60}, {at: 208, unitsPerSecond: 117}]}
lanes:
  t/batch:
    arrivals: [{at: 0, requestsPerSecond: 220}]
    service: {p50Seconds: 0.5, p95Seconds: 1.5}
"#,
    )
}

#[test]
fn deferred_work_is_not_lost_and_drains_at_the_net_rate() {
    // maxAttempts 1 and no retry budget: returns after a deferral must count
    // against neither.
    let world = shedding_world("Defer", 2000, 1, 0);
    let (run, rep) = sim::simulate(&world, &dip_scenario(), Strategy::Lanekeeper).unwrap();
    let lane = &rep.profiles[0].lanes[0];
    assert_eq!(lane.lost, 0, "{lane:#?}");
    assert_eq!(
        lane.rejected + lane.expired + lane.deferred_past_deadline,
        0
    );
    assert_eq!(lane.late, 0, "every job within its deadline");
    assert_eq!(lane.within_deadline_percent, Some(100.0));
    assert!(lane.deferred_requests > 10_000, "{lane:#?}");
    assert!(lane.deferrals >= lane.deferred_requests);
    assert!(lane.returns > 0);
    assert_eq!(lane.retries, 0, "returns after a deferral are not retries");
    // The backlog, queue plus deferred, grows at 220 − 133 jobs/s until the
    // gateway is told capacity came back, by evaluations whose telemetry
    // (lagged 30 s, over 30 s) shows it: not before 208 + 30 s, and by the
    // first evaluation whose window lies wholly after 208 s (270 s).
    let peak = lane.peak_backlog as f64;
    let peak_at = lane.peak_backlog_at.unwrap();
    assert!((238..=270).contains(&peak_at), "peak at {peak_at}");
    let grown = (220.0 - 60.0 / 0.45) * 208.0;
    assert!(
        peak > grown && peak < grown * 1.3,
        "peak {peak}, {grown} by 208 s"
    );
    // It drains at the net rate: peak / (0.95 × 260 − 220) jobs/s (the
    // lane's own 220 and the spare capacity up to 95 % of the pool).
    let drain = lane.drain_seconds.expect("drains") as f64;
    let closed = peak / (260.0 * SPARE - 220.0);
    assert!(
        (drain - closed).abs() / closed < 0.03,
        "drained in {drain}s, closed form {closed}s"
    );
    let measured_closed = lane.drain_closed_form_seconds.unwrap();
    assert!(
        (drain - measured_closed).abs() / measured_closed < 0.01,
        "{drain} vs {measured_closed}"
    );
    // Compliant clients came back at Retry-After (≥ 1 s), not on their
    // own backoff, and the telemetry the engine saw was originals only.
    let l = &run.lanes[0];
    assert_eq!(l.deferred_end, 0);
    for e in &run.evaluations {
        let d = &e.profiles[0].lanes[0];
        assert!(
            d.requests_per_second < 240.0,
            "at {}: the engine saw {} req/s, returns included",
            e.at,
            d.requests_per_second
        );
    }
}

#[test]
fn without_deferral_the_same_dip_loses_work() {
    let world = shedding_world("Throttle", 2000, 3, 5);
    let (_, rep) = sim::simulate(&world, &dip_scenario(), Strategy::Lanekeeper).unwrap();
    let lane = &rep.profiles[0].lanes[0];
    assert!(lane.rejected > 10_000, "{lane:#?}");
    assert_eq!(lane.lost, lane.rejected + lane.expired + lane.failed);
    assert_eq!(lane.deferrals, 0);
}

#[test]
fn the_engine_sees_originals_as_demand_and_retries_apart() {
    // 100 req/s, a quarter of served attempts fail, clients retry up to 3
    // times: ≈ 33 retries/s on top of 100 originals/s.
    let world = batch_world("0.45", 10, 100);
    let (run, rep) = sim::simulate(&world, &retry_scenario(), Strategy::Lanekeeper).unwrap();
    let lane = &rep.profiles[0].lanes[0];
    assert!(lane.retries > 20_000, "{lane:#?}");
    let mid: Vec<_> = run
        .evaluations
        .iter()
        .filter(|e| (120..=840).contains(&e.at))
        .collect();
    assert!(!mid.is_empty());
    for e in mid {
        let d = &e.profiles[0].lanes[0];
        assert!(
            (d.requests_per_second - 100.0).abs() < 10.0,
            "at {}: requestsPerSecond {} is not the originals' rate",
            e.at,
            d.requests_per_second
        );
        assert!(
            (d.demand_units_per_second - 45.0).abs() < 4.5,
            "at {}: demand {} counts retries",
            e.at,
            d.demand_units_per_second
        );
    }
    // The series keeps them apart too.
    let s = &rep.profiles[0].series[20];
    assert!((s.lanes[0].originals - 100.0).abs() < 10.0, "{s:?}");
    assert!((s.lanes[0].retries - 33.0).abs() < 8.0, "{s:?}");
}

fn inc47() -> (World, Scenario) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let loaded = lanekeeper::manifest::load(&[root.join("examples/inc-47/inc-47.yaml")]).unwrap();
    let mut sc = lanekeeper::scenario::load(&root.join("examples/inc-47/scenario.yaml")).unwrap();
    // A shorter run keeps debug-mode tests quick; the incident is whole.
    sc.duration_seconds = 900.0;
    (loaded.world, sc)
}

#[test]
fn conservation_and_capacity_bound_hold_for_every_policy() {
    let (world, sc) = inc47();
    for policy in [
        Strategy::Lanekeeper,
        Strategy::Fifo,
        Strategy::Static,
        Strategy::Fair,
    ] {
        let run = sim::run(&world, &sc, policy).unwrap();
        for l in &run.lanes {
            let finished = l.within_deadline
                + l.late
                + l.expired
                + l.rejected
                + l.failed
                + l.deferred_past_deadline;
            let alive = l.queued_end + l.in_flight_end + l.retrying_end + l.deferred_end;
            assert_eq!(
                l.offered,
                finished + alive,
                "{policy:?} {}: offered = outcomes + still alive",
                l.name
            );
            assert!(l.attempts >= l.offered);
            // Returns after a deferral reach the pool too, but are no attempts.
            assert!(l.admitted <= l.attempts + l.returns);
            assert_eq!(
                l.offered,
                l.originals.iter().map(|&x| u64::from(x)).sum::<u64>(),
                "{policy:?} {}: originals per second add up (no initial backlog)",
                l.name
            );
        }
        for p in &run.profiles {
            // Over any window of whole ticks, dispatched work ≤ capacity ×
            // window + one request (the carried remainder).
            for k in [1usize, 10, 100, 600] {
                let mut units = 0.0;
                let mut cap = 0.0;
                for i in 0..p.tick_units.len() {
                    units += p.tick_units[i];
                    cap += p.tick_capacity[i] * run.tick;
                    if i >= k {
                        units -= p.tick_units[i - k];
                        cap -= p.tick_capacity[i - k] * run.tick;
                    }
                    assert!(
                        units <= cap + p.max_units + 1e-6,
                        "{policy:?}: {units} units in {k} ticks ending at tick {i}, capacity {cap}"
                    );
                }
            }
        }
    }
}

#[test]
fn same_seed_same_report_byte_for_byte() {
    let (world, mut sc) = inc47();
    sc.duration_seconds = 400.0;
    let render = |sc: &Scenario| {
        let (_, rep) = sim::simulate(&world, sc, Strategy::Lanekeeper).unwrap();
        (
            serde_json::to_string(&rep).unwrap(),
            sim::report::render_table(&rep),
        )
    };
    let a = render(&sc);
    let b = render(&sc);
    assert_eq!(a, b);
    sc.seed += 1;
    let c = render(&sc);
    assert_ne!(a.0, c.0, "another seed gives other draws");
}

#[test]
fn the_p1_surge_is_measured_as_originals_and_retries_apart() {
    // P1 180 → 320 req/s for 10 minutes at full capacity, under the
    // example's earlier in-flight limit (1,500, below the ~2,000 a full pool
    // holds): the limit holds P1 back and its clients retry. Demand counts
    // originals only, so the retries do not push the ladder to the
    // read-only level.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut world = lanekeeper::manifest::load(&[root.join("examples/p1-surge/manifests.yaml")])
        .unwrap()
        .world;
    world.profiles[0].spec.in_flight = Some(lanekeeper::api::InFlightSpec {
        conserve_at: 1350,
        stop_at: 1500,
        resume_below: 1200,
        resume_after_stable_seconds: None,
    });
    let sc = lanekeeper::scenario::load(&root.join("examples/p1-surge/scenario.yaml")).unwrap();
    let (run, rep) = sim::simulate(&world, &sc, Strategy::Lanekeeper).unwrap();
    let p = &rep.profiles[0];
    let p1 = p
        .lanes
        .iter()
        .position(|l| l.name == "p1-agent-assist")
        .unwrap();
    let surge: Vec<_> = p
        .series
        .iter()
        .filter(|s| (420..900).contains(&s.at))
        .collect();
    let mean = |f: &dyn Fn(&sim::report::SeriesPoint) -> f64| {
        surge.iter().map(|s| f(s)).sum::<f64>() / surge.len() as f64
    };
    let originals = mean(&|s| s.lanes[p1].originals);
    let retries = mean(&|s| s.lanes[p1].retries);
    assert!((originals - 320.0).abs() < 10.0, "originals {originals}");
    assert!(
        retries > 20.0,
        "the surge makes P1's clients retry: {retries}"
    );
    for e in &run.evaluations {
        let d = &e.profiles[0];
        let l = d
            .lanes
            .iter()
            .find(|l| l.name == "p1-agent-assist")
            .unwrap();
        assert!(
            l.requests_per_second < 345.0,
            "at {}: P1 demand counts retries ({} req/s)",
            e.at,
            l.requests_per_second
        );
        assert!(
            !d.gateway.read_only,
            "at {}: read-only on a surge of {} req/s",
            e.at, l.requests_per_second
        );
    }
    let p3 = p.lanes.iter().find(|l| l.name == "p3-shift-batch").unwrap();
    assert_eq!(p3.lost, 0, "P3 is deferred, not lost");
}
