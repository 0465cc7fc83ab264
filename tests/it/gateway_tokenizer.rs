//! `lanekeeper gateway --tokenizer ROUTE=FILE` on real sockets in front of
//! `lanekeeper-fake-model`: a lane on a route with a tokenizer has its
//! prompt counted, not estimated from the body's bytes, for its
//! `maxInputTokens`, both ways (a short body of many words is refused, a
//! long body of few words passes, the opposite of the estimate's verdicts
//! without the tokenizer); the refusal says the figure was counted, the
//! counts are in the metrics, and a tokenizer that does not load stops the
//! gateway at start.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::gateway::{
    ConfigFile, Proc, client, config_file, control, gateway_to, inc47, lane_mut, metrics, model,
    ready,
};
use crate::gateway_tokens::send;

const LANE: &str = "p1-agent-assist";
const ROUTE: &str = "agent-large";
const LIMIT: u64 = 50;

/// The word-level fixture: a token per word, `<s>` before the sequence.
fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer-wordlevel.json")
}

/// 60 one-letter words in 175 bytes: 61 tokens counted, 44 estimated.
fn many_words() -> String {
    json!({"model": "m", "messages": [{"role": "user", "content": "a ".repeat(60)}]}).to_string()
}

/// Two words padded with spaces: 3 tokens counted, over 100 estimated.
fn few_words() -> String {
    let content = format!("hello{}world", " ".repeat(400));
    json!({"model": "m", "messages": [{"role": "user", "content": content}]}).to_string()
}

fn limited_config(name: &str) -> ConfigFile {
    let mut cfg = inc47();
    lane_mut(&mut cfg, LANE)["tokens"] = json!({"maxInputTokens": LIMIT});
    config_file(name, &cfg)
}

async fn metric(c: &reqwest::Client, gw: &Proc, series: &str) -> Option<f64> {
    metrics(c, gw)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_tokenizer_counts_the_prompt_for_max_input_tokens_both_ways() {
    // The estimate: the body's bytes / 4.
    let estimate = |b: String| b.len().div_ceil(4) as u64;
    assert_eq!(estimate(many_words()), 44);
    let few_estimated = estimate(few_words());
    assert!(few_estimated > 100);
    let m = model(&["--service-millis", "0"]);
    let cfg = limited_config("tokenizer-limit");
    let flag = format!("{ROUTE}={}", fixture().display());
    let counted = gateway_to(&cfg, &m.addr, &["--tokenizer", &flag]);
    let estimated = gateway_to(&cfg, &m.addr, &[]);
    let c = client();
    ready(&c, &counted).await;
    ready(&c, &estimated).await;

    // Many short words: refused when counted (61 > 50), with the counted
    // figure; passed when estimated (44).
    let (status, body) = send(&c, &counted, many_words()).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "context_too_long");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("61 tokens (counted with its route's tokenizer)") && msg.contains("50"),
        "{msg}"
    );
    assert_eq!(
        control(&c, &m).await["chatRequests"],
        0,
        "refused before the model"
    );
    assert_eq!(send(&c, &estimated, many_words()).await.0, 200);
    // Few words in many bytes: passed when counted (3), refused when
    // estimated.
    assert_eq!(send(&c, &counted, few_words()).await.0, 200);
    let (status, body) = send(&c, &estimated, few_words()).await;
    assert_eq!(status, 413, "{body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&format!("about {few_estimated}")), "{msg}");
    assert_eq!(control(&c, &m).await["chatRequests"], 2);

    // Both requests of the counted gateway were counted; a body that is no
    // JSON object is estimated (and, with an output limit absent, goes on
    // by its bytes: 9 bytes, 3 tokens).
    let r = c
        .post(format!("http://{}/v1/chat/completions", counted.addr))
        .header("x-lanekeeper-lane", LANE)
        .body("not json!")
        .send()
        .await
        .unwrap();
    assert_ne!(r.status().as_u16(), 413);
    // P0 shares the route but no decision reads its input tokens (no
    // limit, no cost, no long-context limit in the pool): not counted.
    let r = c
        .post(format!("http://{}/v1/chat/completions", counted.addr))
        .header("x-lanekeeper-lane", "p0-disruption-assist")
        .body(many_words())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let series = format!("lanekeeper_gateway_input_tokens_counted_total{{route=\"{ROUTE}\"}}");
    assert_eq!(metric(&c, &counted, &series).await, Some(2.0));
    let series = format!(
        "lanekeeper_gateway_input_tokens_uncounted_total{{reason=\"not_json\",route=\"{ROUTE}\"}}"
    );
    assert_eq!(metric(&c, &counted, &series).await, Some(1.0));
    // The gateway without a tokenizer has no such series.
    let series = format!("lanekeeper_gateway_input_tokens_counted_total{{route=\"{ROUTE}\"}}");
    assert_eq!(metric(&c, &estimated, &series).await, None);
}

/// The gateway's exit code and stderr for `flags` (it must not start).
fn start_fails(cfg: &Path, flags: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lanekeeper"))
        .args([
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(cfg)
        .args(["--route", "agent-large=http://127.0.0.1:9"])
        .args(flags)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_tokenizer_that_does_not_load_stops_the_start() {
    let cfg = limited_config("tokenizer-bad");
    let missing = "agent-large=/nonexistent/tokenizer.json".to_owned();
    let garbage = format!("agent-large={}", cfg.display());
    let other = format!("elsewhere={}", fixture().display());
    for (flag, says) in [
        (missing.as_str(), "does not load"),
        (garbage.as_str(), "does not load"),
        (other.as_str(), "\"elsewhere\" is not the name of a --route"),
        ("agent-large", "is not NAME=FILE"),
    ] {
        let (code, stderr) = start_fails(&cfg, &["--tokenizer", flag]);
        assert_eq!(code, Some(2), "{flag}: {stderr}");
        assert!(stderr.contains(says), "{flag}: {stderr}");
    }
}
