//! `gatewayGoodputWhileSaturated` against a real Prometheus: the query
//! `lanekeeper rules` documents reads the recorded series of its profile
//! (and not another's), no series is no evidence (not Unknown), and a NaN
//! or a stale sample is Unknown with its reason.

use crate::prometheus_support;

use std::time::Duration;

use lanekeeper::api::profile::PrometheusSignals;
use lanekeeper::policy::GOODPUT_SIGNAL;
use lanekeeper::signals::goodput_rule::{GOODPUT_WHILE_SATURATED, query};
use lanekeeper::signals::prometheus::{PromClient, QueryEvaluation, Window, evaluate};
use prometheus_support::{Prom, Series, minute_now};
use serde_json::json;

async fn eval_at(url: &str, q: &str, at: i64) -> QueryEvaluation {
    let cfg: PrometheusSignals = serde_json::from_value(json!({
        "url": url, "timeoutSeconds": 2, "stalenessSeconds": 120,
        "queries": {"gatewayGoodputWhileSaturated": q}
    }))
    .unwrap();
    let client = PromClient::new(url, Duration::from_secs(2), None, None).unwrap();
    evaluate(&client, &cfg, &[], None, &Window::At(at))
        .await
        .pop()
        .unwrap()
}

fn labels(ns: &str, profile: &str) -> String {
    format!("namespace=\"{ns}\",profile=\"{profile}\"")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_documented_query_reads_the_recorded_evidence() {
    let t = minute_now() - 3600;
    let mut s = Series::default();
    for i in 0..10 {
        let ts = t - 540 + i * 60;
        // ns/pool saturated from t − 300 on, at 410 units/s.
        if ts >= t - 300 {
            s.add(GOODPUT_WHILE_SATURATED, &labels("ns", "pool"), ts, 410.0);
        }
        s.add(GOODPUT_WHILE_SATURATED, &labels("ns", "other"), ts, 9000.0);
        s.add(
            GOODPUT_WHILE_SATURATED,
            &labels("ns", "broken"),
            ts,
            f64::NAN,
        );
    }
    // ns/old: saturated long ago, last recorded 240 s before t.
    s.add(
        GOODPUT_WHILE_SATURATED,
        &labels("ns", "old"),
        t - 240,
        300.0,
    );
    let Some(prom) = Prom::start(
        "the_documented_query_reads_the_recorded_evidence",
        &s.render(),
    ) else {
        return;
    };

    let e = eval_at(&prom.url(), &query("ns", "pool"), t).await;
    assert_eq!(
        e.output.profile.gateway_goodput_while_saturated,
        Some(410.0),
        "{e:?}"
    );
    assert!(e.output.unknown.is_empty(), "{e:?}");
    assert!(e.ages[GOODPUT_SIGNAL] <= 60.0);

    // Before the pool saturated: no series, no evidence, nothing Unknown.
    let before = eval_at(&prom.url(), &query("ns", "pool"), t - 420).await;
    assert_eq!(before.output.profile.gateway_goodput_while_saturated, None);
    assert!(before.output.unknown.is_empty(), "{before:?}");
    assert!(!before.reasons.contains_key(GOODPUT_SIGNAL));

    // NaN and stale are Unknown, with the reason: the capacity is then
    // Unknown too (the engine's rule), never the last value.
    let nan = eval_at(&prom.url(), &query("ns", "broken"), t).await;
    assert_eq!(nan.output.profile.gateway_goodput_while_saturated, None);
    assert_eq!(nan.reasons[GOODPUT_SIGNAL], "nan");
    let old = eval_at(&prom.url(), &query("ns", "old"), t).await;
    assert_eq!(old.output.profile.gateway_goodput_while_saturated, None);
    assert_eq!(old.reasons[GOODPUT_SIGNAL], "stale");

    // A query that matches two profiles' series is ambiguous, not a sum.
    let both = eval_at(
        &prom.url(),
        &format!("{GOODPUT_WHILE_SATURATED}{{namespace=\"ns\",profile=~\"pool|other\"}}"),
        t,
    )
    .await;
    assert_eq!(both.reasons[GOODPUT_SIGNAL], "ambiguous");
}
