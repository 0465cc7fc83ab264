//! The per-request P95s of the priced lanes (`laneP95InputTokens`,
//! `laneP95OutputTokens`, `laneP95CostUnitsPerRequest`) from a real
//! Prometheus over the gateway's histograms, summed over the replicas: a
//! lane's value is the quantile of all replicas' requests together; a lane
//! with no request in the window (NaN) or no series is Unknown, never 0; a
//! lane without a cost is not measured at all.

use std::time::Duration;

use lanekeeper::api::LaneContract;
use lanekeeper::api::profile::PrometheusSignals;
use lanekeeper::signals::prometheus::{PromClient, QueryEvaluation, Window, evaluate};
use serde_json::json;

use crate::prometheus_support::{Prom, Series, minute_now};

const COST: &str = "lanekeeper_gateway_lane_request_cost_units_bucket";
const INPUT: &str = "lanekeeper_gateway_lane_request_input_tokens_bucket";

/// The query the docs recommend, over `family`'s buckets.
fn p95(family: &str) -> String {
    format!("histogram_quantile(0.95, sum by (le, lane) (rate({family}[5m])))")
}

fn lane(name: &str, priced: bool) -> LaneContract {
    let mut spec = json!({
        "profile": "pool", "priority": 1, "workUnitsPerRequest": "1", "expectedRequestsPerSecond": "5", "deadlineSeconds": 60,
        "queue": {"maxDepth": 100, "ttlSeconds": 60}, "retry": {"maxAttempts": 1, "budgetPercent": 5},
        "routes": {"primary": ["m"]}, "shedding": {"mode": "Throttle"}
    });
    if priced {
        spec["cost"] = json!({"perRequest": "0.1", "perOutputToken": "0.01"});
    }
    serde_json::from_value(json!({
        "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "LaneContract",
        "metadata": {"name": name, "namespace": "ns"}, "spec": spec
    }))
    .unwrap()
}

/// Cumulative bucket counters of one replica's lane, growing by `per_minute`
/// (one count per `le` of `les`, cumulative) every minute for ten minutes
/// before `t`.
fn histogram(
    s: &mut Series,
    family: &str,
    lane: &str,
    replica: &str,
    t: i64,
    les: &[&str],
    per_minute: &[f64],
) {
    for i in 0..10 {
        let ts = t - 540 + i * 60;
        for (le, inc) in les.iter().zip(per_minute) {
            let labels = format!("instance=\"{replica}\",lane=\"{lane}\",le=\"{le}\"");
            s.add(family, &labels, ts, inc * (i + 1) as f64);
        }
    }
}

fn series(t: i64) -> String {
    let les = ["0.5", "1", "2", "+Inf"];
    let mut s = Series::default();
    // Replica a: 10 requests a minute up to 0.5 units, 50 up to 1, 100 up
    // to 2; replica b: 100 a minute, all between 1 and 2 units.
    histogram(
        &mut s,
        COST,
        "busy",
        "a",
        t,
        &les,
        &[10.0, 50.0, 100.0, 100.0],
    );
    histogram(
        &mut s,
        COST,
        "busy",
        "b",
        t,
        &les,
        &[0.0, 0.0, 100.0, 100.0],
    );
    // A lane with no request in the window: its counters stand still.
    histogram(&mut s, COST, "quiet", "a", t, &les, &[0.0, 0.0, 0.0, 0.0]);
    let tokens = ["100", "1000", "10000", "+Inf"];
    histogram(
        &mut s,
        INPUT,
        "busy",
        "a",
        t,
        &tokens,
        &[80.0, 90.0, 100.0, 100.0],
    );
    histogram(
        &mut s,
        INPUT,
        "busy",
        "b",
        t,
        &tokens,
        &[0.0, 0.0, 100.0, 100.0],
    );
    s.render()
}

async fn eval_at(url: &str, lanes: &[&LaneContract], at: i64) -> QueryEvaluation {
    let cfg: PrometheusSignals = serde_json::from_value(json!({
        "url": url, "timeoutSeconds": 2, "stalenessSeconds": 120,
        "queries": {
            "laneP95CostUnitsPerRequest": p95(COST),
            "laneP95InputTokens": p95(INPUT),
            "laneP95OutputTokens": p95("lanekeeper_gateway_lane_request_output_tokens_bucket"),
        }
    }))
    .unwrap();
    let client = PromClient::new(url, Duration::from_secs(2), None, None).unwrap();
    evaluate(&client, &cfg, lanes, None, &Window::At(at))
        .await
        .pop()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lanes_p95_per_request_is_over_every_replica_and_unknown_without_requests() {
    let t = minute_now() - 3600;
    let Some(prom) = Prom::start("p95_per_request", &series(t)) else {
        return;
    };
    let owned = [
        lane("busy", true),
        lane("quiet", true),
        lane("unseen", true),
        lane("unpriced", false),
    ];
    let lanes: Vec<&LaneContract> = owned.iter().collect();
    let e = eval_at(&prom.url(), &lanes, t).await;
    let busy = &e.output.lanes["ns/busy"];
    // Both replicas: 10, 50, 200, 200 a minute; the 190th of 200 lies in
    // (1, 2] between the 50th and the 200th: 1 + 140/150 (replica a alone
    // would say 1.9).
    let cost = busy.p95_cost_units_per_request.unwrap();
    assert!((cost - (1.0 + 140.0 / 150.0)).abs() < 1e-9, "{cost}");
    // Input: 80, 90, 200, 200: the 190th in (1000, 10000] from the 90th.
    let input = busy.p95_input_tokens.unwrap();
    assert!(
        (input - (1000.0 + 9000.0 * 100.0 / 110.0)).abs() < 1e-6,
        "{input}"
    );
    // No output histogram at all: Unknown, with why.
    assert_eq!(busy.p95_output_tokens, None);
    assert!(
        busy.unknown["p95OutputTokens"].contains("empty"),
        "{:?}",
        busy.unknown
    );
    assert!(!busy.unknown.contains_key("p95CostUnitsPerRequest"));
    // No request in the window: NaN, Unknown, never 0.
    let quiet = &e.output.lanes["ns/quiet"];
    assert_eq!(quiet.p95_cost_units_per_request, None);
    assert!(
        quiet.unknown["p95CostUnitsPerRequest"].contains("NaN"),
        "{quiet:?}"
    );
    // No series: Unknown, named under the query's signal.
    let unseen = &e.output.lanes["ns/unseen"];
    assert_eq!(unseen.p95_cost_units_per_request, None);
    assert!(unseen.unknown["p95CostUnitsPerRequest"].contains("missing"));
    assert!(e.output.unknown["laneP95CostUnitsPerRequest"].contains("unseen"));
    // A lane without a cost is not measured, and not Unknown either.
    assert!(
        e.output
            .lanes
            .get("ns/unpriced")
            .is_none_or(|l| l.p95_cost_units_per_request.is_none() && l.unknown.is_empty()),
        "{:?}",
        e.output.lanes.get("ns/unpriced")
    );
    // A profile without a priced lane: the P95 queries are left out, no
    // signal Unknown for them.
    let only_unpriced = [&owned[3]];
    let e = eval_at(&prom.url(), &only_unpriced, t).await;
    assert!(e.output.unknown.is_empty(), "{:?}", e.output.unknown);
}
