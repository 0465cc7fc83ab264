//! The Prometheus source's queries against a real Prometheus (and a few fake
//! servers): every failure is Unknown with a reason, never zero.

use crate::prometheus_support;

use std::collections::BTreeMap;
use std::time::Duration;

use lanekeeper::api::LaneContract;
use lanekeeper::api::profile::PrometheusSignals;
use lanekeeper::signals::prometheus::{PromClient, QueryEvaluation, Window, evaluate, pods_of};
use prometheus_support::{Prom, Series, free_port, minute_now};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn cfg(url: &str, queries: serde_json::Value) -> PrometheusSignals {
    serde_json::from_value(json!({
        "url": url, "timeoutSeconds": 2, "stalenessSeconds": 120, "queries": queries
    }))
    .unwrap()
}

fn lane(name: &str) -> LaneContract {
    serde_json::from_value(json!({
        "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "LaneContract",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"profile": "pool", "priority": 1, "workUnitsPerRequest": "1", "expectedRequestsPerSecond": "5", "deadlineSeconds": 60,
                 "queue": {"maxDepth": 100, "ttlSeconds": 60}, "retry": {"maxAttempts": 1, "budgetPercent": 5},
                 "routes": {"primary": ["m"]}, "shedding": {"mode": "Throttle"}}
    }))
    .unwrap()
}

async fn eval_at(
    url: &str,
    queries: serde_json::Value,
    lanes: &[&LaneContract],
    at: i64,
) -> QueryEvaluation {
    let c = cfg(url, queries);
    let client = PromClient::new(url, Duration::from_secs(2), None, None).unwrap();
    evaluate(&client, &c, lanes, None, &Window::At(at))
        .await
        .pop()
        .unwrap()
}

/// Evaluation time, an hour back (the backfilled blocks lie before it).
fn t0() -> i64 {
    minute_now() - 3600
}

fn series(t: i64) -> String {
    let mut s = Series::default();
    for i in 0..10 {
        let ts = t - 540 + i * 60;
        s.add("fresh_units", "", ts, 420.0);
        s.add("nan_units", "", ts, f64::NAN);
        s.add("inf_units", "", ts, f64::INFINITY);
        s.add("two_series", "a=\"1\"", ts, 1.0);
        s.add("two_series", "a=\"2\"", ts, 2.0);
    }
    // Last sample 240 s before t: still inside Prometheus' 5-minute lookback,
    // but older than stalenessSeconds (120).
    for i in 0..5 {
        s.add("old_units", "", t - 480 + i * 60, 560.0);
    }
    for l in 0..1000 {
        s.add(
            "lane_rps",
            &format!("lane=\"lane-{l:04}\""),
            t - 30,
            f64::from(l),
        );
    }
    // Retries of two lanes: lane-0001 fresh, lane-0002 stale.
    s.add("lane_retry_rps", "lane=\"lane-0001\"", t - 30, 0.25);
    s.add("lane_retry_rps", "lane=\"lane-0002\"", t - 240, 3.0);
    // One series a gateway replica: lane-0000 has two, lane-0001 one.
    for (lane, replica, v) in [("0000", "a", 3.0), ("0000", "b", 4.0), ("0001", "a", 5.0)] {
        let labels = format!("lane=\"lane-{lane}\",replica=\"{replica}\"");
        s.add("lane_rps_by_replica", &labels, t - 30, v);
    }
    // Pod error ratios: pod-b has one series a container.
    for (pod, container, v) in [("a", "x", 0.1), ("b", "x", 0.2), ("b", "y", 0.5)] {
        let labels = format!("pod=\"pod-{pod}\",container=\"{container}\"");
        s.add("pod_err", &labels, t - 30, v);
    }
    // Pods of a Deployment `vllm`, a StatefulSet `vllm.v2`, and their
    // siblings' that share the prefix.
    for pod in [
        "vllm-7d9f8b6c4-x2k9p",
        "vllm-canary-7d9f8b6c4-q8w2z",
        "vllm.v2-0",
        "vllm.v2-canary-0",
        "vllmxv2-1",
    ] {
        let labels = format!("namespace=\"ns\",pod=\"{pod}\"");
        s.add("pod:error_ratio", &labels, t - 30, 0.01);
    }
    s.render()
}

#[tokio::test(flavor = "multi_thread")]
async fn fresh_stale_nan_inf_empty_and_ambiguous() {
    let t = t0();
    let Some(prom) = Prom::start("fresh_stale_nan_inf_empty_and_ambiguous", &series(t)) else {
        return;
    };
    let e = eval_at(
        &prom.url(),
        json!({
            "availableUnitsPerSecond": "fresh_units",
            "inFlight": "old_units",
            "queueDepth": "nan_units",
            "p95LatencySeconds": "missing_metric_nobody_has",
            "errorRatio": "inf_units",
        }),
        &[],
        t,
    )
    .await;
    let p = &e.output.profile;
    assert_eq!(p.available_units_per_second, Some(420.0));
    assert!(e.ages["availableUnitsPerSecond"] <= 60.0);
    assert_eq!(p.in_flight, None, "stale is unknown, not its last value");
    assert_eq!(p.queue_depth, None, "NaN is unknown");
    assert_eq!(p.p95_latency_seconds, None, "empty is unknown");
    assert_eq!(p.error_ratio, None, "+Inf is unknown");
    assert_eq!(e.reasons["inFlight"], "stale");
    assert!(
        e.output.unknown["inFlight"].contains("240s old"),
        "{:?}",
        e.output.unknown
    );
    assert_eq!(e.reasons["queueDepth"], "nan");
    assert_eq!(e.reasons["p95LatencySeconds"], "empty");
    assert_eq!(e.reasons["errorRatio"], "inf");
    assert!(!e.output.unknown.contains_key("availableUnitsPerSecond"));

    let e = eval_at(&prom.url(), json!({"inFlight": "two_series"}), &[], t).await;
    assert_eq!(e.reasons["inFlight"], "ambiguous");
    let e = eval_at(&prom.url(), json!({"inFlight": "sum(two_series)"}), &[], t).await;
    assert_eq!(e.output.profile.in_flight, Some(3.0));
    // A query Prometheus rejects.
    let e = eval_at(&prom.url(), json!({"inFlight": "sum(("}), &[], t).await;
    assert_eq!(e.output.profile.in_flight, None);
    assert!(
        e.output.unknown["inFlight"].contains("HTTP 400"),
        "{:?}",
        e.output.unknown
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vector_of_1000_lanes() {
    let t = t0();
    let Some(prom) = Prom::start("a_vector_of_1000_lanes", &series(t)) else {
        return;
    };
    let owned: Vec<LaneContract> = (0..1001).map(|l| lane(&format!("lane-{l:04}"))).collect();
    let lanes: Vec<&LaneContract> = owned.iter().collect();
    let before = queries_answered(&prom).await;
    let e = eval_at(
        &prom.url(),
        json!({"laneRequestsPerSecond": "lane_rps"}),
        &lanes,
        t,
    )
    .await;
    assert_eq!(
        e.output.lanes["ns/lane-0999"].requests_per_second,
        Some(999.0)
    );
    assert_eq!(
        e.output.lanes["ns/lane-0000"].requests_per_second,
        Some(0.0)
    );
    // lane-1000 has no series: Unknown under the lane's own name for the
    // signal, and named under the query's.
    let l1000 = &e.output.lanes["ns/lane-1000"];
    assert_eq!(l1000.requests_per_second, None);
    assert!(
        l1000.unknown["requestsPerSecond"].contains("missing"),
        "{l1000:?}"
    );
    assert!(e.output.unknown["laneRequestsPerSecond"].contains("lane-1000"));
    assert_eq!(e.reasons["laneRequestsPerSecond"], "missing");
    assert!(
        e.output.lanes["ns/lane-0999"].unknown.is_empty(),
        "a lane with a rate is not Unknown"
    );
    assert_eq!(e.output.lanes.len(), 1001);
    // One vector query (and its `timestamp(...)`, for staleness) answers
    // every lane, not one query per lane (the server counts a query before
    // the last chunk of its answer).
    let queries = queries_answered(&prom).await - before;
    assert_eq!(queries, 2.0, "instant queries for 1001 lanes");
}

/// Instant queries the Prometheus server has answered, by its own
/// `prometheus_http_requests_total` (no series yet: none).
async fn queries_answered(prom: &Prom) -> f64 {
    let page = reqwest::get(format!("{}/metrics", prom.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("prometheus_http_requests_total"), "{page}");
    page.lines()
        .filter(|l| {
            l.starts_with("prometheus_http_requests_total{")
                && l.contains("handler=\"/api/v1/query\"")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn server_down_is_unknown() {
    let Some(mut prom) = Prom::start("server_down_is_unknown", &series(t0())) else {
        return;
    };
    prom.stop();
    let e = eval_at(
        &prom.url(),
        json!({"availableUnitsPerSecond": "fresh_units"}),
        &[],
        t0(),
    )
    .await;
    assert_eq!(e.output.profile.available_units_per_second, None);
    assert_eq!(e.reasons["availableUnitsPerSecond"], "unreachable");
    // Nothing listening at all.
    let url = format!("http://127.0.0.1:{}", free_port());
    let e = eval_at(&url, json!({"inFlight": "x"}), &[], t0()).await;
    assert_eq!(e.reasons["inFlight"], "unreachable");
}

/// A lane query that is not aggregated to one series a lane (here one a
/// gateway replica) gives each lane with several series no rate: taking one
/// of them would read a third of the lane's demand as all of it.
#[tokio::test(flavor = "multi_thread")]
async fn a_lane_with_more_than_one_series_is_unknown() {
    let t = t0();
    let test = "a_lane_with_more_than_one_series_is_unknown";
    let Some(prom) = Prom::start(test, &series(t)) else {
        return;
    };
    let owned: Vec<LaneContract> = (0..2).map(|l| lane(&format!("lane-{l:04}"))).collect();
    let lanes: Vec<&LaneContract> = owned.iter().collect();
    let rate_of = |query: &str| json!({"laneRequestsPerSecond": query});
    let e = eval_at(&prom.url(), rate_of("lane_rps_by_replica"), &lanes, t).await;
    let l0 = &e.output.lanes["ns/lane-0000"];
    assert_eq!(l0.requests_per_second, None);
    assert!(
        l0.unknown["requestsPerSecond"].contains("ambiguous: 2 series with lane=lane-0000"),
        "{l0:?}"
    );
    assert_eq!(
        e.output.lanes["ns/lane-0001"].requests_per_second,
        Some(5.0)
    );
    assert_eq!(e.reasons["laneRequestsPerSecond"], "ambiguous");
    let summed = rate_of("sum by (lane) (lane_rps_by_replica)");
    let e = eval_at(&prom.url(), summed, &lanes, t).await;
    assert_eq!(
        e.output.lanes["ns/lane-0000"].requests_per_second,
        Some(7.0)
    );
}

/// The same for a pod: several series for one pod give it no error ratio
/// (a drain would follow whichever came last), the others keep theirs.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_with_more_than_one_series_has_no_error_ratio() {
    let t = t0();
    let test = "a_pod_with_more_than_one_series_has_no_error_ratio";
    let Some(prom) = Prom::start(test, &series(t)) else {
        return;
    };
    let c = cfg(&prom.url(), json!({"podErrorRatio": "pod_err"}));
    let client = PromClient::new(&prom.url(), Duration::from_secs(2), None, None).unwrap();
    let pods = ["pod-a".to_owned(), "pod-b".to_owned()];
    let e = evaluate(&client, &c, &[], Some(&pods), &Window::At(t))
        .await
        .pop()
        .unwrap();
    let p = &e.output.profile;
    assert_eq!(p.pods["pod-a"].error_ratio, Some(0.1));
    assert!(!p.pods.contains_key("pod-b"), "{:?}", p.pods);
    assert_eq!(e.reasons["podErrorRatio"], "ambiguous");
    let why = &e.output.unknown["podErrorRatio"];
    assert!(
        why.contains("ambiguous: 2 series with pod=pod-b") && why.ends_with("pods: pod-b"),
        "{why}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_conventional_pod_query_takes_the_scale_targets_pods_only() {
    let t = t0();
    let test = "the_conventional_pod_query_takes_the_scale_targets_pods_only";
    let Some(prom) = Prom::start(test, &series(t)) else {
        return;
    };
    let client = PromClient::new(&prom.url(), Duration::from_secs(2), None, None).unwrap();
    for (kind, name, want) in [
        ("Deployment", "vllm", vec!["vllm-7d9f8b6c4-x2k9p"]),
        ("StatefulSet", "vllm.v2", vec!["vllm.v2-0"]),
    ] {
        let query = format!(
            "pod:error_ratio{{namespace=\"ns\",pod=~\"{}\"}}",
            pods_of(kind, name)
        );
        let c = cfg(&prom.url(), json!({"podErrorRatio": query}));
        let e = evaluate(&client, &c, &[], None, &Window::At(t))
            .await
            .pop()
            .unwrap();
        let got: Vec<&str> = e.output.profile.pods.keys().map(String::as_str).collect();
        assert_eq!(got, want, "{kind} {name}: {:?}", e.reasons);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn retries_are_a_lane_signal_of_their_own() {
    let t = t0();
    let Some(prom) = Prom::start("retries_are_a_lane_signal_of_their_own", &series(t)) else {
        return;
    };
    let owned: Vec<LaneContract> = (0..4).map(|l| lane(&format!("lane-{l:04}"))).collect();
    let lanes: Vec<&LaneContract> = owned.iter().collect();
    let e = eval_at(
        &prom.url(),
        json!({"laneRequestsPerSecond": "lane_rps", "laneRetryRequestsPerSecond": "lane_retry_rps"}),
        &lanes,
        t,
    )
    .await;
    let l1 = &e.output.lanes["ns/lane-0001"];
    assert_eq!(l1.requests_per_second, Some(1.0));
    assert_eq!(l1.retry_requests_per_second, Some(0.25));
    assert!(l1.unknown.is_empty(), "{l1:?}");
    assert!(e.ages.contains_key("laneRetryRequestsPerSecond"));
    // A stale retry series and a missing one: Unknown, not zero, and the
    // originals are unaffected.
    let l2 = &e.output.lanes["ns/lane-0002"];
    assert_eq!(l2.requests_per_second, Some(2.0));
    assert_eq!(l2.retry_requests_per_second, None);
    assert!(
        l2.unknown["retryRequestsPerSecond"].contains("stale"),
        "{l2:?}"
    );
    let l3 = &e.output.lanes["ns/lane-0003"];
    assert_eq!(l3.retry_requests_per_second, None);
    assert!(l3.unknown["retryRequestsPerSecond"].contains("missing"));
    assert!(!l3.unknown.contains_key("requestsPerSecond"));
    assert_eq!(e.reasons["laneRetryRequestsPerSecond"], "stale");
    assert!(e.output.unknown["laneRetryRequestsPerSecond"].contains("lane-0003"));
    assert!(!e.output.unknown.contains_key("laneRequestsPerSecond"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_lane_query_makes_every_lane_rate_unknown() {
    let t = t0();
    let Some(mut prom) = Prom::start(
        "a_failing_lane_query_makes_every_lane_rate_unknown",
        &series(t),
    ) else {
        return;
    };
    let owned: Vec<LaneContract> = (0..3).map(|l| lane(&format!("lane-{l:04}"))).collect();
    let lanes: Vec<&LaneContract> = owned.iter().collect();
    let every_lane = |e: &QueryEvaluation, key: &str, what: &str| {
        assert_eq!(e.output.lanes.len(), 3, "{:?}", e.output.lanes);
        for (k, l) in &e.output.lanes {
            assert_eq!(l.requests_per_second, None, "{k}");
            assert_eq!(l.retry_requests_per_second, None, "{k}");
            assert!(
                l.unknown.get(key).is_some_and(|w| w.contains(what)),
                "{k}: {:?}",
                l.unknown
            );
        }
    };
    // Prometheus rejects the query.
    let e = eval_at(
        &prom.url(),
        json!({"laneRequestsPerSecond": "sum((", "laneRetryRequestsPerSecond": "sum(("}),
        &lanes,
        t,
    )
    .await;
    every_lane(&e, "requestsPerSecond", "HTTP 400");
    every_lane(&e, "retryRequestsPerSecond", "HTTP 400");
    assert_eq!(e.reasons["laneRequestsPerSecond"], "http_error");
    // No series at all.
    let e = eval_at(
        &prom.url(),
        json!({"laneRequestsPerSecond": "nobody_has_this", "laneRetryRequestsPerSecond": "nor_this"}),
        &lanes,
        t,
    )
    .await;
    every_lane(&e, "requestsPerSecond", "empty");
    every_lane(&e, "retryRequestsPerSecond", "empty");
    // The server is down.
    prom.stop();
    let e = eval_at(
        &prom.url(),
        json!({"laneRequestsPerSecond": "lane_rps", "laneRetryRequestsPerSecond": "lane_retry_rps"}),
        &lanes,
        t,
    )
    .await;
    every_lane(&e, "requestsPerSecond", "unreachable");
    every_lane(&e, "retryRequestsPerSecond", "unreachable");
    assert_eq!(e.reasons["laneRetryRequestsPerSecond"], "unreachable");
}

/// A tiny fake HTTP server answering every request with `body` under
/// `status` after `delay`.
async fn fake_server(status: &str, body: &str, delay: Duration) -> String {
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    fake_server_answering(response, delay).await
}

/// A tiny fake HTTP server answering every request with the whole
/// `response` (status line, headers, body) after `delay`.
async fn fake_server_answering(response: String, delay: Duration) -> String {
    let response: &'static str = Box::leak(response.into_boxed_str());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                tokio::time::sleep(delay).await;
                let _ = s.write_all(response.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    url
}

#[tokio::test]
async fn a_slow_server_times_out() {
    // The server answers after 10 s, the timeout is 2 s: "timeout" (not
    // the answer) shows the client gave up first.
    let url = fake_server("200 OK", "{}", Duration::from_secs(10)).await;
    let e = eval_at(&url, json!({"inFlight": "x", "queueDepth": "y"}), &[], 1000).await;
    assert_eq!(e.reasons["inFlight"], "timeout");
    assert_eq!(e.reasons["queueDepth"], "timeout");
    assert_eq!(e.output.profile.in_flight, None);
}

#[tokio::test]
async fn a_malformed_body_is_unknown() {
    let url = fake_server("200 OK", "<html>oops</html>", Duration::ZERO).await;
    let e = eval_at(&url, json!({"inFlight": "x"}), &[], 1000).await;
    assert_eq!(e.reasons["inFlight"], "malformed");
    assert_eq!(e.output.profile.in_flight, None);
    // Valid JSON with a value that is not a number.
    let url = fake_server(
        "200 OK",
        "{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":[{\"metric\":{},\"value\":[1000,\"x\"]}]}}",
        Duration::ZERO,
    )
    .await;
    let e = eval_at(&url, json!({"inFlight": "x"}), &[], 1000).await;
    assert_eq!(e.reasons["inFlight"], "malformed");
}

#[tokio::test]
async fn an_http_error_is_unknown() {
    let url = fake_server(
        "503 Service Unavailable",
        "{\"status\":\"error\",\"errorType\":\"unavailable\",\"error\":\"busy\"}",
        Duration::ZERO,
    )
    .await;
    let e = eval_at(&url, json!({"inFlight": "x"}), &[], 1000).await;
    assert_eq!(e.reasons["inFlight"], "http_error");
    assert!(e.output.unknown["inFlight"].contains("503"));
    assert!(e.output.unknown["inFlight"].contains("busy"));
    let _: BTreeMap<String, String> = e.reasons;
}

/// A vector answer of one series valued (and sampled at) 1000, with
/// `warnings`.
fn answer_warning(warnings: &[&str]) -> String {
    json!({"status": "success", "warnings": warnings,
           "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1000, "1000"]}]}})
    .to_string()
}

#[tokio::test]
async fn a_partial_answer_is_unknown_and_a_promql_note_is_not() {
    let partial = answer_warning(&["partial response: store 10.0.0.7:10901 unreachable"]);
    let url = fake_server("200 OK", &partial, Duration::ZERO).await;
    let e = eval_at(&url, json!({"inFlight": "x"}), &[], 1000).await;
    assert_eq!(e.reasons["inFlight"], "partial");
    assert!(e.output.unknown["inFlight"].contains("10.0.0.7"));
    assert_eq!(e.output.profile.in_flight, None);
    let note = answer_warning(&[
        "PromQL info: metric might not be a counter, name does not end in _total/_sum/_count/_bucket: \"x\"",
    ]);
    let url = fake_server("200 OK", &note, Duration::ZERO).await;
    let e = eval_at(&url, json!({"inFlight": "x"}), &[], 1000).await;
    assert_eq!(e.output.profile.in_flight, Some(1000.0), "{:?}", e.reasons);
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_a_huge_answer_not_read() {
    let elsewhere = fake_server("200 OK", &answer_warning(&[]), Duration::ZERO).await;
    let redirect = format!(
        "HTTP/1.1 302 Found\r\nlocation: {elsewhere}/api/v1/query\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    let url = fake_server_answering(redirect, Duration::ZERO).await;
    let e = eval_at(&url, json!({"inFlight": "x"}), &[], 1000).await;
    assert_eq!(e.reasons["inFlight"], "http_error");
    assert!(e.output.unknown["inFlight"].contains("redirect"));
    // Past the limit with no length announced: read no further.
    let limit = lanekeeper::signals::prometheus::MAX_INSTANT_ANSWER_BYTES;
    let huge = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{{\"status\":\"success\",\"warnings\":[\"{}\"]}}",
        "x".repeat(limit + 1)
    );
    let url = fake_server_answering(huge, Duration::ZERO).await;
    let e = eval_at(&url, json!({"inFlight": "x"}), &[], 1000).await;
    assert_eq!(e.reasons["inFlight"], "malformed");
    assert!(e.output.unknown["inFlight"].contains("larger than"));
}

fn lane_with_objective(name: &str) -> LaneContract {
    let mut l = lane(name);
    l.spec.objective =
        Some(serde_json::from_value(json!({"withinDeadlinePercent": "99.9"})).unwrap());
    l
}

#[tokio::test(flavor = "multi_thread")]
async fn objective_signals_are_lane_signals_and_missing_is_unknown() {
    let t = t0();
    let mut s = Series::default();
    // lane-a: overspent (-35 %) and burning; lane-b: nothing recorded;
    // lane-c has no objective (its series are ignored, it is never Unknown).
    s.add("budget", "lane=\"lane-a\"", t - 30, -35.0);
    s.add("budget", "lane=\"lane-c\"", t - 30, 80.0);
    s.add("burn5m", "lane=\"lane-a\"", t - 30, 16.5);
    s.add("burn1h", "lane=\"lane-a\"", t - 30, 15.0);
    s.add("burn1h", "lane=\"lane-b\"", t - 30, f64::NAN);
    let Some(prom) = Prom::start("objective_signals_are_lane_signals", &s.render()) else {
        return;
    };
    let owned = [
        lane_with_objective("lane-a"),
        lane_with_objective("lane-b"),
        lane("lane-c"),
    ];
    let lanes: Vec<&LaneContract> = owned.iter().collect();
    let e = eval_at(
        &prom.url(),
        json!({
            "laneErrorBudgetRemainingPercent": "budget",
            "laneBurnRate5m": "burn5m",
            "laneBurnRate1h": "burn1h",
            "laneBurnRate6h": "burn6h_nobody_records",
        }),
        &lanes,
        t,
    )
    .await;
    let a = &e.output.lanes["ns/lane-a"];
    assert_eq!(
        a.error_budget_remaining_percent,
        Some(-35.0),
        "overspent is a value"
    );
    assert_eq!(a.burn_rate.m5, Some(16.5));
    assert_eq!(a.burn_rate.h1, Some(15.0));
    assert_eq!(a.burn_rate.m30, None, "not configured");
    assert_eq!(a.burn_rate.h6, None);
    assert!(a.unknown["burnRate.6h"].contains("empty"), "{a:?}");
    let b = &e.output.lanes["ns/lane-b"];
    assert_eq!(b.error_budget_remaining_percent, None);
    assert!(
        b.unknown["errorBudgetRemainingPercent"].contains("missing"),
        "{b:?}"
    );
    assert!(b.unknown["burnRate.1h"].contains("nan"), "{b:?}");
    assert!(
        e.output.unknown["laneErrorBudgetRemainingPercent"].contains("lane-b"),
        "{:?}",
        e.output.unknown
    );
    let c = e.output.lanes.get("ns/lane-c").cloned().unwrap_or_default();
    assert_eq!(c.error_budget_remaining_percent, None);
    assert!(c.unknown.is_empty(), "a lane without an objective: {c:?}");
    // The timeline form: burnRate keyed by window.
    let y = serde_yaml::to_string(a).unwrap();
    assert!(y.contains("burnRate:\n  5m: 16.5\n  1h: 15.0"), "{y}");
    assert!(y.contains("errorBudgetRemainingPercent: -35.0"), "{y}");
}
