//! Tokens in `simulate`, on small worlds whose numbers are exact: a priced
//! lane reserves, the pool takes the actual cost of the answer (its output
//! stopped at `maxOutputTokens`), `maxInputTokens` refuses before admission
//! and no client retries it, and a lane's tokens move no other draw.

use std::path::Path;

use lanekeeper::manifest::{Loaded, load_str};
use lanekeeper::policy::World;
use lanekeeper::sim::report::LaneReport;
use lanekeeper::sim::{self, Scenario, Strategy};

/// One pool and one lane costing 0.001 a prompt token and 0.002 an answer
/// token, with `tokens` limits.
fn priced_world(tokens: &str) -> World {
    let text = format!(
        r#"
apiVersion: lanekeeper.dev/v1alpha1
kind: CapacityProfile
metadata: {{name: pool, namespace: t}}
spec:
  pool:
    scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: pool}}
    podSelector: {{matchLabels: {{app: pool}}}}
  capacity: {{safeUnitsPerSecond: "100", unitsPerReplica: "25"}}
  replicas: {{min: 4, max: 4}}
---
apiVersion: lanekeeper.dev/v1alpha1
kind: LaneContract
metadata: {{name: chat, namespace: t}}
spec:
  profile: pool
  priority: 1
  workUnitsPerRequest: "1.6"
  cost: {{perInputToken: "0.001", perOutputToken: "0.002"}}
  tokens: {tokens}
  expectedRequestsPerSecond: "10"
  shedding: {{mode: Throttle}}
  deadlineSeconds: 30
  queue: {{maxDepth: 100, ttlSeconds: 20}}
  retry: {{maxAttempts: 3, budgetPercent: 50}}
  routes: {{primary: [m]}}
"#
    );
    let mut loaded = Loaded::default();
    load_str(Path::new("test.yaml"), &text, &mut loaded).expect("test manifests load");
    loaded.world
}

/// 10 requests/s for a minute, every request of 5,000 prompt tokens and a
/// 500-token answer; clients retry up to 3 times.
fn fixed_size_scenario() -> Scenario {
    let s: Scenario = serde_yaml::from_str(
        r#"
seed: 3
durationSeconds: 60
controller: {evaluationIntervalSeconds: 5, telemetryLagSeconds: 0, windowSeconds: 5}
clients: {maxRetries: 3}
lanes:
  t/chat:
    arrivals: [{at: 0, requestsPerSecond: 10}]
    service: {p50Seconds: 1, p95Seconds: 2}
    tokens: {input: {median: 5000, p95: 5000}, output: {median: 500, p95: 500}}
"#,
    )
    .unwrap();
    lanekeeper::scenario::check(&s).unwrap();
    s
}

fn chat(world: &World, sc: &Scenario) -> LaneReport {
    let (_, r) = sim::simulate(world, sc, Strategy::Lanekeeper).unwrap();
    r.profiles[0].lanes[0].clone()
}

#[test]
fn the_pool_takes_the_answers_actual_cost_stopped_at_max_output_tokens() {
    let l = chat(
        &priced_world("{maxInputTokens: 5000, maxOutputTokens: 300}"),
        &fixed_size_scenario(),
    );
    assert!(l.admitted > 500, "{l:#?}");
    // 5,000 × 0.001 + 300 × 0.002 = 5.6 units each, not 1.6.
    assert!(
        (l.admitted_units - 5.6 * l.admitted as f64).abs() < 1e-6,
        "{} units for {} requests",
        l.admitted_units,
        l.admitted
    );
    let t = l.tokens.expect("tokens are in play");
    assert_eq!(
        t.output.median_per_request,
        Some(300),
        "stopped at the limit"
    );
    assert_eq!(t.output.p95_per_request, Some(300));
    assert_eq!(t.input.total, 5000 * t.answered);
    assert_eq!(t.context_too_long, 0, "5,000 is at the limit, not over it");
    // Reserved at the default 256 output tokens until 20 answers settled,
    // then at their P95 (300, read off the sketch within 4 %).
    let e = t.estimate.unwrap();
    assert_eq!(e.settled, t.answered);
    assert!((0.97..=1.02).contains(&e.mean_settled_to_reserved), "{e:?}");
}

#[test]
fn a_prompt_over_max_input_tokens_is_refused_before_admission_and_not_retried() {
    let l = chat(
        &priced_world("{maxInputTokens: 4999}"),
        &fixed_size_scenario(),
    );
    let t = l.tokens.unwrap();
    assert_eq!(l.admitted, 0);
    assert_eq!(t.context_too_long, l.offered);
    assert_eq!(l.rejected, l.offered);
    assert_eq!(l.retries, 0, "no client retries a 413");
    assert_eq!(t.answered, 0);
    assert_eq!(t.estimate, None);
}

#[test]
fn a_lanes_tokens_move_no_other_draw() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let world = lanekeeper::manifest::load(&[root.join("examples/long-context/long-context.yaml")])
        .unwrap()
        .world;
    let sc = lanekeeper::scenario::load(&root.join("examples/long-context/scenario.yaml")).unwrap();
    let mut plain = sc.clone();
    for l in plain.lanes.values_mut() {
        l.tokens = None;
    }
    let (a, _) = sim::simulate(&world, &sc, Strategy::Lanekeeper).unwrap();
    let (b, rb) = sim::simulate(&world, &plain, Strategy::Lanekeeper).unwrap();
    for (x, y) in a.lanes.iter().zip(&b.lanes) {
        assert_eq!(x.originals, y.originals, "{}: the same arrivals", x.name);
        assert!(x.tokens.is_some() && y.tokens.is_none());
    }
    assert!(rb.profiles[0].lanes.iter().all(|l| l.tokens.is_none()));
    let json = serde_json::to_string(&rb).unwrap();
    assert!(
        !json.contains("\"tokens\""),
        "no tokens, no tokens in the JSON"
    );
}

#[test]
fn a_request_costing_more_than_a_ticks_budget_still_starts() {
    // 10 units/s is 1 unit a tick (plus 1.6 carried over): each request
    // costs 5.6. It starts once the pool's budget is full, in debt, so the
    // pool still serves its 5.6 units/s.
    let mut sc = fixed_size_scenario();
    sc.profiles =
        serde_yaml::from_str("t/pool: {capacity: [{at: 0, unitsPerSecond: 10}]}").unwrap();
    sc.lanes.get_mut("t/chat").unwrap().arrivals =
        serde_yaml::from_str("[{at: 0, requestsPerSecond: 1}]").unwrap();
    lanekeeper::scenario::check(&sc).unwrap();
    let l = chat(
        &priced_world("{maxInputTokens: 5000, maxOutputTokens: 300}"),
        &sc,
    );
    assert!(l.offered >= 40, "{l:#?}");
    assert!(l.within_deadline + 5 >= l.offered, "{l:#?}");
    assert_eq!(l.failed, 0, "none timed out waiting for the pool");
}
