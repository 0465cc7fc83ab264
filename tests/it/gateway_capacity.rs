//! The gateway's capacity evidence on real sockets: the real binary in
//! front of the fake model, an in-flight limit that leaves P1 eight slots,
//! twenty P1 requests of a second each. Every answered request counts its
//! lane's work units by route, the limit in force is exported, and the time
//! the gateway was saturated (slots full, requests waiting) and the work
//! completed meanwhile are counted: the evidence the recording rule reads.

use std::time::Duration;

use serde_json::json;

use super::gateway::{client, config_file, gateway_to, inc47, metrics, model, ready, sample};

const P1: &str = "p1-agent-assist";

#[tokio::test(flavor = "multi_thread")]
async fn completed_units_the_limit_and_saturation_are_exported() {
    let mut cfg = inc47();
    // 60 slots, 52 of them kept for P0 (one second of its requests): P1
    // has eight.
    cfg["inFlight"] = json!({"conserveAt": 60, "stopAt": 60, "resumeBelow": 10});
    let m = model(&["--service-millis", "1000"]);
    let path = config_file("gateway-capacity", &cfg);
    let gw = gateway_to(&path, &m.addr, &[]);
    let c = client();
    ready(&c, &gw).await;
    // The gauges are kept by the gateway's driver, at least every 250 ms.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let before = metrics(&c, &gw).await;
    assert_eq!(
        sample(&before, &["lanekeeper_gateway_in_flight_limit "]),
        60.0
    );
    assert_eq!(
        sample(&before, &["lanekeeper_gateway_saturated_seconds_total "]),
        0.0
    );

    let calls = (0..20).map(|_| {
        c.post(format!("http://{}/v1/chat/completions", gw.addr))
            .header("content-type", "application/json")
            .header("x-lanekeeper-lane", P1)
            .body(
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
            )
            .timeout(Duration::from_secs(20))
            .send()
    });
    let answers = futures::future::join_all(calls).await;
    let ok = answers
        .into_iter()
        .filter(|r| r.as_ref().is_ok_and(|r| r.status() == 200))
        .count();
    assert_eq!(ok, 20, "every P1 request waits for a slot and is served");
    // The last answer's slot is given back as its body ends.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let page = metrics(&c, &gw).await;
    let units = sample(
        &page,
        &[
            "lanekeeper_gateway_completed_units_total{",
            "lane=\"p1-agent-assist\"",
            "route=\"agent-large\"",
        ],
    );
    assert_eq!(units, 20.0, "P1's 1.0 unit per answered request");
    let saturated = sample(&page, &["lanekeeper_gateway_saturated_seconds_total "]);
    assert!(
        (1.0..4.0).contains(&saturated),
        "three waves of eight one-second requests: saturated about two seconds, not {saturated}"
    );
    let during = sample(
        &page,
        &["lanekeeper_gateway_saturated_completed_units_total "],
    );
    assert!(
        (8.0..20.0).contains(&during),
        "the waves that finished while others waited: {during}"
    );
    // About eight requests a second while saturated: what the limit lets
    // through, the evidence the recording rule divides out.
    let goodput = during / saturated;
    assert!((4.0..=12.0).contains(&goodput), "{during} / {saturated}");
}
