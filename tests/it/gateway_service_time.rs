//! The service time a lane's deadline check counts, learned and exported,
//! on real sockets: `lanekeeper gateway` in front of
//! `lanekeeper-fake-model` answering in 300 ms, for a lane whose contract
//! says 50 ms. Before any answer the gauge is the contract's figure; once
//! 20 answers ended within 10 s it is their p95 (from pass to the answer's
//! end), never shorter than the model's 300 ms.

use std::time::Duration;

use serde_json::json;

use crate::gateway::{client, config_file, gateway_to, lane_mut, metrics, model, ready, sample};
use crate::gateway_tokens_settle::{LANE, body_of, priced, send};

const GAUGE: &str = "lanekeeper_gateway_lane_expected_service_seconds";

/// The gauge for [`LANE`] once it reads `want` (the gateway's driver sets
/// it at least every 250 ms), or the last value read after 5 s.
async fn gauge_until(
    c: &reqwest::Client,
    gw: &crate::gateway::Proc,
    want: impl Fn(f64) -> bool,
) -> f64 {
    let mut last = f64::NAN;
    for _ in 0..50 {
        let text = metrics(c, gw).await;
        last = sample(&text, &[&format!("{GAUGE}{{"), &format!("lane=\"{LANE}\"")]);
        if want(last) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lanes_expected_service_time_is_learned_and_exported() {
    let m = model(&["--service-millis", "300"]);
    let mut cfg = priced(1000.0);
    lane_mut(&mut cfg, LANE)["expectedServiceSeconds"] = json!(0.05);
    let file = config_file("service-time", &cfg);
    let gw = gateway_to(&file, &m.addr, &[]);
    let c = client();
    ready(&c, &gw).await;
    let before = gauge_until(&c, &gw, |v| v == 0.05).await;
    assert_eq!(before, 0.05, "the contract's figure before any answer");
    // 24 answers of 300 ms at once, then, a second later (the lane reads
    // its window at most once a second), one more request: its admission
    // reads the window.
    let answers =
        futures::future::join_all((0..24).map(|_| send(&c, &gw, LANE, body_of(100, "")).send()))
            .await;
    for r in answers {
        assert_eq!(r.unwrap().status(), 200);
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = send(&c, &gw, LANE, body_of(100, "")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let learned = gauge_until(&c, &gw, |v| v >= 0.3).await;
    assert!(
        (0.3..5.0).contains(&learned),
        "the p95 of 300 ms answers, not the contract's 50 ms: {learned}"
    );
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/gateway.md"),
    )
    .unwrap();
    assert!(
        docs.contains(&format!("| `{GAUGE}` |")),
        "{GAUGE} is not in docs/gateway.md"
    );
}
