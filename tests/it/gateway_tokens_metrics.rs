//! The per-request histograms on real sockets: `lanekeeper gateway` in
//! front of `lanekeeper-fake-model` (which reports `usage` and takes
//! `prefillMicrosPerToken` per prompt token before its first byte). A
//! priced lane's input tokens, output tokens and settled cost land in
//! their buckets one observation per answer with usage; the time to the
//! first byte is never shorter than the model's prefill, for JSON answers
//! and for streams alike, and is kept for lanes without a cost too.

use serde_json::json;

use crate::gateway::{client, config_file, gateway_to, metrics, model, ready, sample};
use crate::gateway_tokens_settle::{LANE, body_of, priced, send};

/// An unpriced lane of INC-47.
const UNPRICED: &str = "p1-agent-assist";

/// Microseconds of prefill per prompt token: a 1,000-token prompt waits
/// 0.5 s for its first token, a 100-token one 0.05 s.
const PREFILL_MICROS: &str = "500";

fn bucket(text: &str, family: &str, lane: &str, le: &str) -> f64 {
    sample(
        text,
        &[
            &format!("{family}_bucket{{"),
            &format!("lane=\"{lane}\""),
            &format!("le=\"{le}\""),
        ],
    )
}

fn count(text: &str, family: &str, lane: &str) -> f64 {
    sample(
        text,
        &[&format!("{family}_count{{"), &format!("lane=\"{lane}\"")],
    )
}

const INPUT: &str = "lanekeeper_gateway_lane_request_input_tokens";
const OUTPUT: &str = "lanekeeper_gateway_lane_request_output_tokens";
const COST: &str = "lanekeeper_gateway_lane_request_cost_units";
const TTFT: &str = "lanekeeper_gateway_lane_ttft_seconds";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_request_histograms_move_and_the_ttft_waits_for_the_prefill() {
    let m = model(&[
        "--service-millis",
        "0",
        "--completion-tokens",
        "20",
        "--prefill-micros-per-token",
        PREFILL_MICROS,
    ]);
    let gw = gateway_to(
        &config_file("tokens-metrics", &priced(1000.0)),
        &m.addr,
        &[],
    );
    let c = client();
    ready(&c, &gw).await;
    // Four short prompts, four long ones, two long streams (asking for
    // their usage chunk: the body goes upstream as it is).
    let mut sent = Vec::new();
    for _ in 0..4 {
        sent.push(body_of(100, ""));
        sent.push(body_of(1000, ""));
    }
    for _ in 0..2 {
        sent.push(body_of(
            1000,
            r#", "stream": true, "stream_options": {"include_usage": true}"#,
        ));
    }
    for body in sent {
        let r = send(&c, &gw, LANE, body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    let text = metrics(&c, &gw).await;
    // Input tokens: 100 each (the model counts 4 bytes a token), and 1,000.
    assert_eq!(count(&text, INPUT, LANE), 10.0);
    assert_eq!(bucket(&text, INPUT, LANE, "70"), 0.0);
    assert_eq!(bucket(&text, INPUT, LANE, "100"), 4.0);
    assert_eq!(bucket(&text, INPUT, LANE, "700"), 4.0);
    assert_eq!(bucket(&text, INPUT, LANE, "1000"), 10.0);
    // Output tokens: 20 each.
    assert_eq!(bucket(&text, OUTPUT, LANE, "10"), 0.0);
    assert_eq!(bucket(&text, OUTPUT, LANE, "20"), 10.0);
    // Cost: 0.1 + 0.001 x 100 + 0.004 x 20 = 0.28 units, and 1.18.
    assert_eq!(bucket(&text, COST, LANE, "0.2"), 0.0);
    assert_eq!(bucket(&text, COST, LANE, "0.3"), 4.0);
    assert_eq!(bucket(&text, COST, LANE, "1"), 4.0);
    assert_eq!(bucket(&text, COST, LANE, "1.5"), 10.0);
    let cost_sum = sample(&text, &[&format!("{COST}_sum{{"), LANE]);
    assert!(
        (cost_sum - (4.0 * 0.28 + 6.0 * 1.18)).abs() < 1e-9,
        "{cost_sum}"
    );
    // Time to the first byte: never before the prefill (0.05 s short,
    // 0.5 s long), so no answer is at or below 0.05 s, and none of the six
    // long ones at or below 0.5 s.
    assert_eq!(count(&text, TTFT, LANE), 10.0);
    assert_eq!(bucket(&text, TTFT, LANE, "0.05"), 0.0);
    assert!(bucket(&text, TTFT, LANE, "0.5") <= 4.0, "{text}");
    let ttft_sum = sample(&text, &[&format!("{TTFT}_sum{{"), LANE]);
    assert!(ttft_sum >= 4.0 * 0.05 + 6.0 * 0.5, "{ttft_sum}");

    // An answer without usage: its tokens and cost are not measured (the
    // histograms keep their counts), its first byte is.
    c.put(format!("http://{}/control", m.addr))
        .body(json!({"omitUsage": true}).to_string())
        .send()
        .await
        .unwrap();
    let r = send(&c, &gw, LANE, body_of(100, "")).send().await.unwrap();
    r.bytes().await.unwrap();
    // A lane without a cost: its first byte is timed, nothing else.
    let r = send(&c, &gw, UNPRICED, body_of(1000, ""))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    let text = metrics(&c, &gw).await;
    for family in [INPUT, OUTPUT, COST] {
        assert_eq!(count(&text, family, LANE), 10.0, "{family}");
        assert_eq!(count(&text, family, UNPRICED), 0.0, "{family}");
    }
    assert_eq!(count(&text, TTFT, LANE), 11.0);
    assert_eq!(count(&text, TTFT, UNPRICED), 1.0);
    assert_eq!(bucket(&text, TTFT, UNPRICED, "0.5"), 0.0);
}
