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
use crate::prometheus_support::promtool;
use crate::rules_promtool::{generated_rules, promtool_test};
use crate::scratch::Scratch;

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
    let file = config_file("tokens-metrics", &priced(1000.0));
    let gw = gateway_to(&file, &m.addr, &[]);
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
    let reference = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/gateway.md"),
    )
    .unwrap();
    for family in [INPUT, OUTPUT, COST, TTFT] {
        assert!(
            reference.contains(&format!("| `{family}` |")),
            "{family} is not in docs/gateway.md's metrics"
        );
    }
    documented_rules_read_the_p95s(&text);
}

/// The lane's per-request buckets as promtool input series of two
/// replicas of the profile's gateway (`gw-0`, `gw-1`, with the gateway's
/// own `lanekeeper_gateway_config_info`), each growing by its count every
/// 15 s; and of a third replica (`gw-2`) that serves another profile, where
/// every request fell into the lowest bucket: read, it would pull the P95s
/// down.
fn as_series(text: &str) -> String {
    let mut out = String::new();
    let info = text
        .lines()
        .find(|l| l.starts_with("lanekeeper_gateway_config_info{"))
        .expect("the gateway exports its config");
    let (info_labels, _) = info
        .strip_prefix("lanekeeper_gateway_config_info{")
        .and_then(|r| r.rsplit_once("} "))
        .unwrap();
    for instance in ["gw-0", "gw-1"] {
        out += &format!(
            "      - series: 'lanekeeper_gateway_config_info{{{info_labels},instance=\"{instance}\"}}'\n        values: '1x20'\n"
        );
    }
    out += "      - series: 'lanekeeper_gateway_config_info{profile=\"ai-platform/other\",mode=\"enforce\",hash=\"h\",instance=\"gw-2\"}'\n        values: '1x20'\n";
    for family in [INPUT, OUTPUT, COST] {
        let total = count(text, family, LANE);
        for line in text.lines() {
            let Some((name, rest)) = line.split_once('{') else {
                continue;
            };
            if name != format!("{family}_bucket") || !rest.contains(LANE) {
                continue;
            }
            let (labels, value) = rest.rsplit_once("} ").unwrap();
            for instance in ["gw-0", "gw-1"] {
                out += &format!(
                    "      - series: '{name}{{{labels},namespace=\"ai-platform\",instance=\"{instance}\"}}'\n        values: '0+{value}x20'\n"
                );
            }
            out += &format!(
                "      - series: '{name}{{{labels},namespace=\"ai-platform\",instance=\"gw-2\"}}'\n        values: '0+{total}x20'\n"
            );
        }
    }
    out
}

/// The rules `lanekeeper rules` generates for examples/inc-47-tokens (its
/// profile's token group), run by the real `promtool test rules` on what
/// the gateway exported: of ten requests (the 95th percentile is the
/// 9.5th), four short (0.28 units, 100 input tokens) and six long (1.18
/// units, 1,000 tokens), all with 20 output tokens, interpolated within
/// their buckets; the replica of another profile is not read.
fn documented_rules_read_the_p95s(text: &str) {
    let test = "documented_rules_read_the_p95s";
    let Some(promtool) = promtool(test) else {
        return;
    };
    let dir = Scratch::new("tokens-p95");
    let manifests = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/inc-47-tokens/inc-47-tokens.yaml"),
    )
    .unwrap();
    let rules = generated_rules(&dir, &manifests);
    assert!(
        rules.contains("- name: lanekeeper-tokens-ai-platform-agent-assist\n"),
        "{rules}"
    );
    let expect = |cost: f64| {
        let mut t = String::from(
            "rule_files: [rules.yaml]\nevaluation_interval: 15s\ntests:\n  - interval: 15s\n    input_series:\n",
        );
        t += &as_series(text);
        t += "    promql_expr_test:\n";
        for (rule, v) in [
            // (1, 1.5]: from 4 to 10 requests.
            ("lane:p95_cost_units_per_request", cost),
            // (700, 1000]: from 4 to 10.
            ("lane:p95_input_tokens", 700.0 + 300.0 * 5.5 / 6.0),
            // (10, 20]: from 0 to 10.
            ("lane:p95_output_tokens", 10.0 + 10.0 * 9.5 / 10.0),
        ] {
            t += &format!(
                "      - expr: '{rule}'\n        eval_time: 3m\n        exp_samples:\n          - labels: '{rule}{{namespace=\"ai-platform\",profile=\"agent-assist\",lane=\"{LANE}\"}}'\n            value: {v}\n"
            );
        }
        t
    };
    let good = expect(1.0 + 0.5 * 5.5 / 6.0);
    let run = promtool_test(&promtool, &dir, &good);
    assert!(
        run.status.success(),
        "promtool test rules failed:\n{}{}\n--- test file ---\n{good}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    // The mean (0.82) is not the P95: promtool says no.
    assert!(
        !promtool_test(&promtool, &dir, &expect(0.82))
            .status
            .success()
    );
}
