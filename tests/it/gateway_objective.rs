//! The gateway's qualified outcomes on real sockets (`lanekeeper gateway`
//! in front of `lanekeeper-fake-model`): answers in time are good, an
//! unreachable upstream and a timed-out answer are bad, and refusals the
//! contract allows (a paused lane) and requests naming no lane are not
//! counted.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::gateway::{
    ConfigFile, Proc, client, config_file, gateway_to, inc47, lane_mut, metrics, model, ready,
    sample, status_of,
};

/// The shipped INC-47 config with P1's deadline at `p1_deadline` seconds
/// and no queue (a late answer cannot come from waiting).
fn config(test: &str, p1_deadline: i64) -> ConfigFile {
    let mut cfg = inc47();
    let p1 = lane_mut(&mut cfg, "p1-agent-assist");
    p1["deadlineSeconds"] = json!(p1_deadline);
    p1["expectedServiceSeconds"] = Value::Null;
    p1["queue"]["ttlSeconds"] = json!(0);
    config_file(&format!("objective-{test}"), &cfg)
}

/// A gateway trusting the lane header (objectives are counted whoever the
/// caller is) in front of `upstream`.
fn gateway(config: &Path, upstream: &str) -> Proc {
    gateway_to(config, upstream, &[])
}

async fn send(c: &reqwest::Client, gw: &Proc, lane: &str) -> u16 {
    status_of(c, gw, lane).await.as_u16()
}

/// `lanekeeper_gateway_qualified_requests_total` of `lane` and `outcome`
/// (0 when absent).
async fn qualified(c: &reqwest::Client, gw: &Proc, lane: &str, outcome: &str) -> f64 {
    let page = metrics(c, gw).await;
    sample(
        &page,
        &[
            "lanekeeper_gateway_qualified_requests_total{",
            &format!("lane=\"{lane}\""),
            &format!("outcome=\"{outcome}\""),
        ],
    )
}

#[tokio::test]
async fn answers_in_time_are_good_and_allowed_refusals_are_not_counted() {
    let m = model(&["--service-millis", "0"]);
    let cfg = config("good", 30);
    let gw = gateway(&cfg, &m.addr);
    let c = client();
    ready(&c, &gw).await;
    for _ in 0..3 {
        assert_eq!(send(&c, &gw, "p1-agent-assist").await, 200);
    }
    // P4 is paused at 420 units/s: a refusal the contract allows.
    assert_eq!(send(&c, &gw, "p4-eval-backfill").await, 429);
    // A lane the config does not have: a client's bad request.
    assert_eq!(send(&c, &gw, "no-such-lane").await, 400);
    // The answer ends (and is counted) when its body is done.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(qualified(&c, &gw, "p1-agent-assist", "good").await, 3.0);
    assert_eq!(qualified(&c, &gw, "p1-agent-assist", "bad").await, 0.0);
    assert_eq!(qualified(&c, &gw, "p4-eval-backfill", "good").await, 0.0);
    assert_eq!(qualified(&c, &gw, "p4-eval-backfill", "bad").await, 0.0);
    assert_eq!(qualified(&c, &gw, "no-such-lane", "bad").await, 0.0);
}

#[tokio::test]
async fn an_answer_past_the_deadline_is_bad() {
    // The model takes 2.5 s; P1's deadline is 1 s.
    let m = model(&["--service-millis", "2500"]);
    let cfg = config("late", 1);
    let gw = gateway(&cfg, &m.addr);
    let c = client();
    ready(&c, &gw).await;
    assert_eq!(send(&c, &gw, "p1-agent-assist").await, 504);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(qualified(&c, &gw, "p1-agent-assist", "bad").await, 1.0);
    assert_eq!(qualified(&c, &gw, "p1-agent-assist", "good").await, 0.0);
}

#[tokio::test]
async fn an_unreachable_upstream_is_bad() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = config("down", 30);
    let gw = gateway(&cfg, &format!("127.0.0.1:{port}"));
    let c = client();
    ready(&c, &gw).await;
    assert_eq!(send(&c, &gw, "p1-agent-assist").await, 502);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(qualified(&c, &gw, "p1-agent-assist", "bad").await, 1.0);
    assert_eq!(qualified(&c, &gw, "p1-agent-assist", "good").await, 0.0);
}
