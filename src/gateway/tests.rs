//! The request path in-process: the real router (`proxy_router`) and state
//! driven with tower's `oneshot`, no sockets. Forwarding to a live upstream
//! is covered by tests/it/gateway.rs with the real binary.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use clap::Parser;
use lanes::{GatewayConfig, Mode};
use serde_json::Value;
use tower::ServiceExt;

use super::args::GatewayArgs;
use super::run::proxy_router;
use super::state::Gateway;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: GatewayArgs,
}

fn example() -> GatewayConfig {
    let text = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/inc-47/lanes-420.json"
    ))
    .expect("the example config");
    GatewayConfig::from_json(&text).expect("valid")
}

/// A gateway without routes (nothing can reach an upstream), with `cfg`
/// installed when given.
fn gateway(cfg: Option<GatewayConfig>, extra: &[&str]) -> Arc<Gateway> {
    // The lane and tenant from the headers: who may use a lane is tested
    // in identity/tests.rs.
    let mut argv = vec![
        "gw",
        "--config",
        "unused.json",
        "--max-body-bytes",
        "64",
        "--trust-lane-header",
    ];
    argv.extend_from_slice(extra);
    let gw = Arc::new(Gateway::new(Cli::parse_from(argv).args, true));
    if let Some(cfg) = cfg {
        gw.install(cfg, "test");
    }
    gw
}

async fn call(
    gw: &Arc<Gateway>,
    lane: Option<&str>,
    body: &str,
) -> (StatusCode, Value, header::HeaderMap) {
    let mut req = Request::post("/v1/chat/completions");
    if let Some(l) = lane {
        req = req.header("x-lanekeeper-lane", l);
    }
    let resp = proxy_router(gw.clone())
        .oneshot(req.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (parts.status, json, parts.headers)
}

fn metric(gw: &Gateway, needle: &str) -> f64 {
    let (_, page) = gw.metrics.encode().unwrap();
    let page = String::from_utf8(page).unwrap();
    page.lines()
        .find(|l| l.starts_with(needle))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no series {needle} in\n{page}"))
}

#[tokio::test]
async fn without_a_config_nothing_is_admitted() {
    let gw = gateway(None, &[]);
    let (status, body, _) = call(&gw, Some("p1-agent-assist"), "{}").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"]["code"], "no_config");
}

#[tokio::test]
async fn an_unknown_lane_is_refused_naming_the_lanes() {
    let gw = gateway(Some(example()), &[]);
    for lane in [None, Some("p0-i-am-important")] {
        let (status, body, _) = call(&gw, lane, "{}").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["error"]["code"], "unknown_lane");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("p0-disruption-assist, p1-agent-assist"),
            "{msg}"
        );
    }
}

#[tokio::test]
async fn a_paused_lane_gets_a_429_and_the_refusal_is_counted() {
    let gw = gateway(Some(example()), &[]);
    let (status, body, headers) = call(&gw, Some("p4-eval-backfill"), "{}").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(headers.contains_key(header::RETRY_AFTER));
    let code = body["error"]["code"].as_str().unwrap().to_owned();
    assert!(code == "deferred" || code == "rejected_rate", "{code}");
    let series = format!(
        "lanekeeper_gateway_requests_total{{attempt=\"original\",lane=\"p4-eval-backfill\",outcome=\"{code}\",tenant_class=\"default\"}}"
    );
    assert_eq!(metric(&gw, &series), 1.0);
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_before_admission() {
    let gw = gateway(Some(example()), &[]);
    let (status, body, _) = call(&gw, Some("p1-agent-assist"), &"x".repeat(65)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["error"]["code"], "body_too_large");
    assert_eq!(gw.lock().core.as_ref().unwrap().in_flight(), 0);
}

#[tokio::test]
async fn a_pass_without_a_route_url_is_a_502_and_leaves_nothing_in_flight() {
    let gw = gateway(Some(example()), &[]);
    let (status, body, _) = call(&gw, Some("p1-agent-assist"), "{}").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(body["error"]["code"], "unknown_route");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--route agent-large=URL")
    );
    assert_eq!(gw.lock().core.as_ref().unwrap().in_flight(), 0);
    assert_eq!(metric(&gw, "lanekeeper_gateway_in_flight"), 0.0);
}

#[tokio::test]
async fn observe_mode_admits_and_counts_what_enforcing_would_have_done() {
    let mut cfg = example();
    cfg.mode = Mode::Observe;
    let gw = gateway(Some(cfg.with_hash()), &[]);
    let (status, _, _) = call(&gw, Some("p4-eval-backfill"), "{}").await;
    assert_eq!(
        status,
        StatusCode::BAD_GATEWAY,
        "admitted, then no route URL"
    );
    let shadow =
        "lanekeeper_gateway_shadow_requests_total{attempt=\"original\",lane=\"p4-eval-backfill\"";
    assert_eq!(metric(&gw, shadow), 1.0);
}

#[tokio::test]
async fn an_invalid_config_is_refused_and_the_last_good_one_kept() {
    let gw = gateway(Some(example()), &[]);
    let mut bad = example();
    bad.lanes[0].deadline_seconds = 0;
    gw.install(bad.with_hash(), "test");
    let hash = example().content_hash;
    assert_eq!(gw.lock().last_good.as_ref().unwrap().content_hash, hash);
    assert_eq!(
        metric(
            &gw,
            "lanekeeper_gateway_config_loads_total{result=\"invalid\"}"
        ),
        1.0
    );
}
