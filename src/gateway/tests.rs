//! The request path in-process: the real router (`proxy_router`) and state
//! driven with tower's `oneshot`, no sockets. Forwarding to a live upstream
//! is covered by tests/it/gateway.rs with the real binary.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use clap::Parser;
use lanes::{GatewayConfig, Mode};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower::ServiceExt;

use super::args::GatewayArgs;
use super::conn::{self, Activity, Clocks, Serves};
use super::run::{proxy_head_check, proxy_router};
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

/// Every route of the example on a port where nothing listens: a pass is
/// a 502 `upstream_error`.
const DEAD_ROUTES: [&str; 8] = [
    "--route",
    "agent-large=http://127.0.0.1:1",
    "--route",
    "extract-small=http://127.0.0.1:1",
    "--route",
    "batch-medium=http://127.0.0.1:1",
    "--route",
    "eval-large=http://127.0.0.1:1",
];

/// A gateway whose routes lead nowhere, with `cfg` installed when given.
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
    argv.extend_from_slice(&DEAD_ROUTES);
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
    send(gw, req.body(Body::from(body.to_owned())).unwrap()).await
}

async fn send(gw: &Arc<Gateway>, req: Request<Body>) -> (StatusCode, Value, header::HeaderMap) {
    let resp = proxy_router(gw.clone()).oneshot(req).await.unwrap();
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
async fn an_unreachable_upstream_is_a_502_and_leaves_nothing_in_flight() {
    let gw = gateway(Some(example()), &[]);
    let (status, body, headers) = call(&gw, Some("p1-agent-assist"), "{}").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(body["error"]["code"], "upstream_error");
    assert_eq!(
        headers["x-lanekeeper-decision"],
        "lane=p1-agent-assist; verdict=failed; reason=upstream_error"
    );
    assert_eq!(gw.lock().core.as_ref().unwrap().in_flight(), 0);
    assert_eq!(metric(&gw, "lanekeeper_gateway_in_flight"), 0.0);
}

#[tokio::test]
async fn a_config_naming_a_route_without_a_url_is_refused_at_load() {
    let argv = [
        "gw",
        "--config",
        "unused.json",
        "--trust-lane-header",
        "--route",
        "agent-large=http://127.0.0.1:1",
    ];
    let gw = Arc::new(Gateway::new(Cli::parse_from(argv).args, true));
    gw.install(example(), "test");
    assert!(
        gw.lock().core.is_none(),
        "refused: extract-small has no URL"
    );
    let (status, body, _) = call(&gw, Some("p1-agent-assist"), "{}").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"]["code"], "no_config");
}

#[tokio::test]
async fn configs_that_would_cause_an_outage_are_refused_and_the_last_good_one_kept() {
    let gw = gateway(Some(example()), &[]);
    let hash = example().content_hash;
    let mut no_lanes = example();
    no_lanes.lanes.clear();
    let mut negative = example();
    negative.capacity_units_per_second = Some(-420.0);
    let mut zero = example();
    zero.capacity_units_per_second = Some(0.0);
    let mut unrouted = example();
    unrouted.lanes[0].routes = vec!["nowhere".to_owned()];
    for bad in [no_lanes, negative, zero, unrouted] {
        gw.install(bad.with_hash(), "test");
        assert_eq!(gw.lock().last_good.as_ref().unwrap().content_hash, hash);
    }
    assert_eq!(
        metric(
            &gw,
            "lanekeeper_gateway_config_loads_total{result=\"invalid\"}"
        ),
        4.0
    );
    let (status, _, _) = call(&gw, Some("p1-agent-assist"), "{}").await;
    assert_eq!(
        status,
        StatusCode::BAD_GATEWAY,
        "still admitted by the old config"
    );
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

/// Nothing the core counts: no lane's bucket was touched.
fn untouched(gw: &Gateway) {
    let (_, page) = gw.metrics.encode().unwrap();
    let page = String::from_utf8(page).unwrap();
    assert!(
        !page.contains("lanekeeper_gateway_requests_total{"),
        "no request reached the core:\n{page}"
    );
}

#[tokio::test]
async fn paths_and_methods_off_the_surface_are_answered_by_the_gateway() {
    let gw = gateway(Some(example()), &["--allow-path", "/v1/rerank"]);
    for (method, path, status) in [
        ("PUT", "/control", StatusCode::NOT_FOUND),
        ("POST", "/control", StatusCode::NOT_FOUND),
        (
            "POST",
            "/v1/chat/completions/../../control",
            StatusCode::NOT_FOUND,
        ),
        ("GET", "/metrics", StatusCode::NOT_FOUND),
        (
            "PUT",
            "/v1/chat/completions",
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        ("DELETE", "/v1/models", StatusCode::METHOD_NOT_ALLOWED),
    ] {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("x-lanekeeper-lane", "p0-disruption-assist")
            .body(Body::empty())
            .unwrap();
        let (got, body, headers) = send(&gw, req).await;
        assert_eq!(got, status, "{method} {path}: {body}");
        assert!(
            headers["x-lanekeeper-decision"]
                .to_str()
                .unwrap()
                .starts_with("lane=-; verdict=refused;"),
            "{headers:?}"
        );
        if status == StatusCode::METHOD_NOT_ALLOWED {
            assert!(headers.contains_key(header::ALLOW));
        }
    }
    untouched(&gw);
    assert_eq!(
        metric(
            &gw,
            "lanekeeper_gateway_refused_before_admission_total{reason=\"not_found\"}"
        ),
        4.0
    );
    // An allowed path goes to admission (and to the dead route).
    let req = Request::post("/v1/rerank")
        .header("x-lanekeeper-lane", "p1-agent-assist")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&gw, req).await.0, StatusCode::BAD_GATEWAY);
}

#[tokio::test]
async fn attempt_numbers_that_are_not_integers_from_1_are_refused_before_admission() {
    let gw = gateway(Some(example()), &[]);
    for bad in ["-1", "0", "abc", "1.5", "99999999999", "+1", "1 1", " "] {
        let req = Request::post("/v1/chat/completions")
            .header("x-lanekeeper-lane", "p1-agent-assist")
            .header("x-lanekeeper-attempt", bad)
            .body(Body::empty())
            .unwrap();
        let (status, body, _) = send(&gw, req).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}");
        assert_eq!(body["error"]["code"], "invalid_attempt", "{bad:?}");
    }
    let req = Request::post("/v1/chat/completions")
        .header("x-lanekeeper-lane", "p1-agent-assist")
        .header(
            "x-lanekeeper-attempt",
            axum::http::HeaderValue::from_bytes(b"\xff").unwrap(),
        )
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&gw, req).await.1["error"]["code"], "invalid_attempt");
    untouched(&gw);
    let req = Request::post("/v1/chat/completions")
        .header("x-lanekeeper-lane", "p1-agent-assist")
        .header("x-lanekeeper-attempt", "2")
        .body(Body::empty())
        .unwrap();
    let (status, body, _) = send(&gw, req).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(
        body["error"]["code"], "rejected_retry_budget",
        "the core judged it"
    );
    let retry = "lanekeeper_gateway_requests_total{attempt=\"retry\",lane=\"p1-agent-assist\"";
    assert_eq!(metric(&gw, retry), 1.0);
}

#[tokio::test]
async fn every_answer_carries_a_request_id_and_the_decision() {
    let gw = gateway(Some(example()), &[]);
    let (_, _, a) = call(&gw, Some("p4-eval-backfill"), "{}").await;
    let (_, _, b) = call(&gw, None, "{}").await;
    for h in [&a, &b] {
        assert_eq!(h["x-request-id"].len(), 32, "{h:?}");
    }
    assert_ne!(a["x-request-id"], b["x-request-id"]);
    assert!(
        a["x-lanekeeper-decision"]
            .to_str()
            .unwrap()
            .starts_with("lane=p4-eval-backfill; verdict="),
        "{a:?}"
    );
    assert_eq!(
        b["x-lanekeeper-decision"],
        "lane=-; verdict=refused; reason=unknown_lane"
    );
    let req = Request::post("/v1/chat/completions")
        .header("x-lanekeeper-lane", "p1-agent-assist")
        .header("x-request-id", "client-id-1")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&gw, req).await.2["x-request-id"], "client-id-1");
    let req = Request::post("/v1/chat/completions")
        .header("x-lanekeeper-lane", "p1-agent-assist")
        .header("x-request-id", "x".repeat(4096))
        .body(Body::empty())
        .unwrap();
    let (status, body, headers) = send(&gw, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "invalid_request_id");
    assert_eq!(headers["x-request-id"].len(), 32, "a new id, not the echo");
}

#[tokio::test]
async fn the_token_limits_the_path_reads_are_the_config_in_forces() {
    // A prompt of about 9 tokens (its 37 bytes / 4) against a limit of 5.
    let prompt = r#"{"messages":"0123456789012345678901"}"#;
    assert_eq!(prompt.len(), 37);
    let limited = |mode: Mode| {
        let mut cfg = example();
        cfg.mode = mode;
        cfg.lanes[1].tokens = Some(lanes::TokenLimits {
            max_input_tokens: Some(5),
            ..Default::default()
        });
        cfg.with_hash()
    };
    let gw = gateway(Some(limited(Mode::Enforce)), &[]);
    let status = |gw: Arc<Gateway>| async move {
        let (status, body, _) = call(&gw, Some("p1-agent-assist"), prompt).await;
        (status, body["error"]["code"].as_str().map(str::to_owned))
    };
    let too_long = (
        StatusCode::PAYLOAD_TOO_LARGE,
        Some("context_too_long".to_owned()),
    );
    let admitted = (StatusCode::BAD_GATEWAY, Some("upstream_error".to_owned()));
    assert_eq!(status(gw.clone()).await, too_long);
    // A config without the limit: the same request is admitted.
    gw.install(example().with_hash(), "test");
    assert_eq!(status(gw.clone()).await, admitted);
    // A refused config with the limit changes nothing.
    let mut bad = limited(Mode::Enforce);
    bad.lanes[0].deadline_seconds = 0;
    gw.install(bad.with_hash(), "test");
    assert_eq!(status(gw.clone()).await, admitted);
    // Observe mode checks nothing; enforcing again, the limit holds.
    gw.install(limited(Mode::Observe), "test");
    assert_eq!(status(gw.clone()).await, admitted);
    gw.install(limited(Mode::Enforce), "test");
    assert_eq!(status(gw.clone()).await, too_long);
}

#[test]
fn a_lanes_completed_units_are_counted_by_route_and_nothing_makes_no_series() {
    let gw = gateway(Some(example()), &[]);
    let meters = Arc::clone(&gw.lock().meters);
    let p1 = &meters[1];
    let series = "lanekeeper_gateway_completed_units_total{lane=\"p1-agent-assist\"";
    let page = || String::from_utf8(gw.metrics.encode().unwrap().1).unwrap();
    p1.completed_units("agent-large", 0.0);
    p1.completed_units("agent-large", f64::NAN);
    assert!(!page().contains(series), "nothing completed, no series");
    // Its own route (kept), twice, and a route of no lane (looked up).
    p1.completed("agent-large");
    p1.completed_units("agent-large", 0.5);
    p1.completed_units("elsewhere", 2.5);
    assert_eq!(
        metric(&gw, &format!("{series},route=\"agent-large\"}}")),
        1.5
    );
    assert_eq!(metric(&gw, &format!("{series},route=\"elsewhere\"}}")), 2.5);
}

/// The request's answer with `value` in header `name`: its status, error
/// code and message.
async fn with_id(gw: &Arc<Gateway>, name: &str, value: &[u8]) -> (StatusCode, Value, Value) {
    let req = Request::post("/v1/chat/completions")
        .header("x-lanekeeper-lane", "p1-agent-assist")
        .header(name, axum::http::HeaderValue::from_bytes(value).unwrap())
        .body(Body::empty())
        .unwrap();
    let (status, body, _) = send(gw, req).await;
    let error = &body["error"];
    (status, error["code"].clone(), error["message"].clone())
}

#[tokio::test]
async fn an_idempotency_key_is_held_to_the_bounds_of_an_x_request_id() {
    // The key is the request's id for the core and the shared store (a
    // Redis key, an entry of the pending deferrals): a 400 KB key, or one
    // of bytes no log or store key should hold, must not get that far.
    let gw = gateway(Some(example()), &[]);
    let too_long = vec![b'k'; 129];
    let bad: [&[u8]; 5] = [&too_long, b"", b"a key", b"tab\there", b"caf\xc3\xa9"];
    for value in bad {
        let (status, code, _) = with_id(&gw, "x-request-id", value).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_request_id"))
        );
        let (status, code, message) = with_id(&gw, "idempotency-key", value).await;
        let shown = String::from_utf8_lossy(value);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{shown:?}");
        assert_eq!(code, "invalid_request_id", "{shown:?}");
        let message = message.as_str().unwrap();
        assert!(message.contains("idempotency-key"), "{message}");
    }
    untouched(&gw);
    let refused =
        "lanekeeper_gateway_refused_before_admission_total{reason=\"invalid_request_id\"}";
    assert_eq!(metric(&gw, refused), 10.0);
    // At the bound the key is the request's id: sent again, a retry.
    let longest = vec![b'k'; 128];
    let (status, _, _) = with_id(&gw, "idempotency-key", &longest).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "admitted; no upstream");
    let (status, code, _) = with_id(&gw, "idempotency-key", &longest).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(code, "rejected_retry_budget", "the core saw the same id");
}

/// A gateway like [`gateway`]'s that checks callers (no
/// `--trust-lane-header`) and knows none: every caller is refused.
fn checking_gateway() -> Arc<Gateway> {
    let mut argv = vec!["gw", "--config", "unused.json"];
    argv.extend_from_slice(&DEAD_ROUTES);
    let gw = Arc::new(Gateway::new(Cli::parse_from(argv).args, true));
    gw.install(example(), "test");
    gw
}

/// One in-memory connection to `gw`'s proxy, served as the listener
/// serves one (the head check, then the router) with `body_read` as its
/// body clock: the client's end, and the task serving it (with the
/// shutdown signal it holds).
fn connection(gw: &Arc<Gateway>, body_read: Duration) -> (DuplexStream, JoinHandle<()>) {
    let (client, server) = tokio::io::duplex(1 << 16);
    let clocks = Clocks {
        header_read: Duration::from_secs(5),
        idle: Duration::from_secs(5),
        body_read,
        max_body_bytes: 4 << 20,
    };
    let serves = Serves {
        router: proxy_router(gw.clone()),
        head: Some(proxy_head_check(gw.clone())),
    };
    let task = tokio::spawn(async move {
        let (_shutdown, rx) = watch::channel(false);
        let activity = Arc::new(Activity::new());
        conn::serve(server, activity, serves, None, clocks, rx).await;
    });
    (client, task)
}

/// Writes `head` (no body follows) and reads until the gateway closes the
/// connection, at most 3 s: what it said, and whether it closed.
async fn head_alone(c: &mut DuplexStream, head: &str) -> (String, bool) {
    c.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(3), c.read_to_end(&mut got))
        .await
        .is_ok();
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

/// A chat request's head promising 1 MiB of body.
fn big_head(path: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: gw\r\nx-lanekeeper-lane: p1-agent-assist\r\n\
         content-length: 1048576\r\n\r\n"
    )
}

#[tokio::test]
async fn a_caller_refused_from_its_head_is_answered_before_its_body_arrives() {
    // Checking callers: no credential is 401 at once, recorded, the body
    // never waited for (30 s of body clock) and the connection closed.
    let gw = checking_gateway();
    let (mut c, _task) = connection(&gw, Duration::from_secs(30));
    let (answer, closed) = head_alone(&mut c, &big_head("/v1/chat/completions")).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("missing_credential"), "{answer}");
    assert!(answer.contains("x-request-id: "), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(closed, "the connection stayed open, its body awaited");
    let refused =
        "lanekeeper_gateway_refused_before_admission_total{reason=\"missing_credential\"}";
    assert_eq!(metric(&gw, refused), 1.0);
    // Trusting the lane header there is no caller to check, but a path
    // that is not forwarded is still refused from the head...
    let gw = gateway(Some(example()), &[]);
    let (mut c, _task) = connection(&gw, Duration::from_millis(300));
    let (answer, closed) = head_alone(&mut c, &big_head("/anything")).await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(closed);
    // ... while a request the head lets through has its body read, under
    // the body clock.
    let (mut c, _task) = connection(&gw, Duration::from_millis(300));
    let (answer, closed) = head_alone(&mut c, &big_head("/v1/chat/completions")).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    assert!(closed);
    untouched(&gw);
}
