//! The controller sees the fleet: three real gateway replicas on one real
//! `redis-server`, a lane's originals spread over them and their retries
//! sent to other replicas than their originals (the clients do not say they
//! retry), and the replicas' own `/metrics` turned into series for the
//! recording rules docs/telemetry.md gives (`lane:requests_per_second`,
//! `lane:retry_requests_per_second`), run by the real `promtool test
//! rules`: the demand the controller reads counts every original once and
//! every retry as a retry, over the whole fleet.

use std::time::Duration;

use serde_json::json;

use super::rules_promtool::promtool_test;
use crate::fleet_store_redis::Server;
use crate::gateway::{Proc, client, config_file, inc47, metrics, model, ready};
use crate::gateway_shared::{one_of_three, wait_mode};
use crate::prometheus_support::promtool;
use crate::scratch::Scratch;

const LANE: &str = "p0-disruption-assist";
const ORIGINALS: usize = 30;
const RETRIES: usize = 6;

/// The rule group of docs/telemetry.md's "Recording rules worth adding".
pub(crate) fn documented_rules() -> String {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/telemetry.md"),
    )
    .unwrap();
    let from = doc.find("```yaml\ngroups:\n- name: lanekeeper").unwrap() + "```yaml\n".len();
    let len = doc[from..].find("```").unwrap();
    doc[from..from + len].to_owned()
}

async fn send(c: &reqwest::Client, gw: &Proc, id: &str) -> u16 {
    c.post(format!("http://{}/v1/chat/completions", gw.addr))
        .header("content-type", "application/json")
        .header("x-lanekeeper-lane", LANE)
        .header("x-request-id", id)
        .body(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// A replica's request counters of the lane as promtool input series:
/// each grows by its value every 15 s (so its rate is value / 15).
fn as_series(text: &str, instance: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("lanekeeper_gateway_requests_total{") else {
            continue;
        };
        if !rest.contains(LANE) {
            continue;
        }
        let (labels, value) = rest.rsplit_once("} ").unwrap();
        let v: f64 = value.parse().unwrap();
        out += &format!(
            "      - series: 'lanekeeper_gateway_requests_total{{{labels},namespace=\"ai-platform\",instance=\"{instance}\"}}'\n        values: '0+{v}x20'\n"
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_series_give_the_demand_of_originals_once() {
    let test = "three_replicas_series_give_the_demand_of_originals_once";
    let Some(promtool) = promtool(test) else {
        return;
    };
    let Some(store) = Server::start(test) else {
        return;
    };
    let m = model(&["--service-millis", "0"]);
    let path = config_file(test, &inc47());
    let url = store.url();
    // Counting is what is tested here, not the fallback: a generous store
    // timeout, so a busy machine does not send an id check to the local
    // memory (where a retry on another replica looks like an original).
    let gws: Vec<Proc> = (0..3)
        .map(|_| one_of_three(&path, &m, &url, 5000))
        .collect();
    let c = client();
    for gw in &gws {
        ready(&c, gw).await;
    }
    wait_mode(&c, &gws, "shared", Duration::from_secs(5)).await;
    for i in 0..ORIGINALS {
        assert_eq!(send(&c, &gws[i % 3], &format!("o-{i}")).await, 200);
    }
    // Retries of the first few originals, each to the next replica.
    for i in 0..RETRIES {
        send(&c, &gws[(i + 1) % 3], &format!("o-{i}")).await;
    }
    let mut series = String::new();
    for (i, gw) in gws.iter().enumerate() {
        series += &as_series(&metrics(&c, gw).await, &format!("gw-{i}"));
    }
    let dir = Scratch::new("fleet-demand");
    std::fs::write(dir.join("rules.yaml"), documented_rules()).unwrap();
    let expect = |originals: f64, retries: f64| {
        let mut t = String::from(
            "rule_files: [rules.yaml]\nevaluation_interval: 15s\ntests:\n  - interval: 15s\n    input_series:\n",
        );
        t += &series;
        t += "    promql_expr_test:\n";
        for (rule, v) in [
            ("lane:requests_per_second", originals),
            ("lane:retry_requests_per_second", retries),
        ] {
            t += &format!(
                "      - expr: '{rule}'\n        eval_time: 3m\n        exp_samples:\n          - labels: '{rule}{{namespace=\"ai-platform\",lane=\"{LANE}\"}}'\n            value: {v}\n"
            );
        }
        t
    };
    // Every series grows by its count every 15 s.
    let good = expect(ORIGINALS as f64 / 15.0, RETRIES as f64 / 15.0);
    let run = promtool_test(&promtool, &dir, &good);
    assert!(
        run.status.success(),
        "promtool test rules failed:\n{}{}\n--- test file ---\n{good}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    // Retries counted as originals (each replica on its own memory) would
    // read 36 originals: promtool must say no to that.
    let wrong = expect((ORIGINALS + RETRIES) as f64 / 15.0, 0.0);
    assert!(!promtool_test(&promtool, &dir, &wrong).status.success());
}
