//! `lanekeeper gateway` and a lane's token limits, on real sockets in front
//! of `lanekeeper-fake-model`: a prompt over `maxInputTokens` is refused
//! before any upstream call, `max_tokens` reaches the upstream clamped (or
//! set), and a level's `capOutputTokens` lowers it further, hot-reloaded.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::gateway::{
    Proc, client, config_file, control, gateway_to, inc47, lane_mut, model, ready, write_config,
};

const LANE: &str = "p1-agent-assist";

/// A chat body of exactly `bytes` bytes with `extra` fields.
fn body_of(bytes: usize, extra: &str) -> String {
    let head = format!(r#"{{"model": "m"{extra}, "messages": [{{"role": "user", "content": ""#);
    let tail = r#""}]}"#;
    format!(
        "{head}{}{tail}",
        "x".repeat(bytes - head.len() - tail.len())
    )
}

/// A chat completion of lane p1-agent-assist: the status and the JSON body.
pub(crate) async fn send(c: &reqwest::Client, gw: &Proc, body: String) -> (u16, Value) {
    let r = c
        .post(format!("http://{}/v1/chat/completions", gw.addr))
        .header("content-type", "application/json")
        .header("x-lanekeeper-lane", LANE)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// INC-47 at 420 with P1's `tokens` set (and no content hash, so that a
/// rewrite with other tokens is not taken for the same config).
fn with_tokens(tokens: Value) -> Value {
    let mut cfg = inc47();
    lane_mut(&mut cfg, LANE)["tokens"] = tokens;
    cfg["contentHash"] = json!("");
    cfg
}

async fn chat_requests(c: &reqwest::Client, m: &Proc) -> u64 {
    control(c, m).await["chatRequests"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_over_max_input_tokens_is_refused_before_the_upstream() {
    let m = model(&["--service-millis", "0"]);
    let cfg = config_file("tokens-input", &with_tokens(json!({"maxInputTokens": 250})));
    let gw = gateway_to(&cfg, &m.addr, &[]);
    let c = client();
    ready(&c, &gw).await;
    // 1,001 bytes: 251 tokens at 4 bytes a token.
    for _ in 0..5 {
        let (status, body) = send(&c, &gw, body_of(1001, "")).await;
        assert_eq!(status, 413, "{body}");
        assert_eq!(body["error"]["code"], "context_too_long");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("250"),
            "{body}"
        );
    }
    assert_eq!(chat_requests(&c, &m).await, 0, "nothing reached the model");
    // Exactly at the limit passes, and reaches the model.
    let (status, body) = send(&c, &gw, body_of(1000, "")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(chat_requests(&c, &m).await, 1);
    // Another lane without limits takes the long prompt.
    let r = c
        .post(format!("http://{}/v1/chat/completions", gw.addr))
        .header("content-type", "application/json")
        .header("x-lanekeeper-lane", "p0-disruption-assist")
        .body(body_of(4000, ""))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_reaches_the_upstream_clamped_or_set() {
    let m = model(&["--service-millis", "0", "--completion-tokens", "1000"]);
    let cfg = config_file(
        "tokens-output",
        &with_tokens(json!({"maxOutputTokens": 100})),
    );
    let gw = gateway_to(&cfg, &m.addr, &[]);
    let c = client();
    ready(&c, &gw).await;
    for (extra, field, seen) in [
        (r#", "max_tokens": 4000"#, "lastMaxTokens", json!(100)),
        (r#", "max_tokens": 100"#, "lastMaxTokens", json!(100)),
        (r#", "max_tokens": 7"#, "lastMaxTokens", json!(7)),
        ("", "lastMaxTokens", json!(100)),
        (
            r#", "max_completion_tokens": 101"#,
            "lastMaxCompletionTokens",
            json!(100),
        ),
    ] {
        let (status, body) = send(&c, &gw, body_of(300, extra)).await;
        assert_eq!(status, 200, "{extra}: {body}");
        assert_eq!(control(&c, &m).await[field], seen, "{extra}");
        let used = body["usage"]["completion_tokens"].as_u64().unwrap();
        assert!(used <= 100, "{extra}: {used}");
    }
    let before = chat_requests(&c, &m).await;
    for bad in [
        r#", "max_tokens": 0"#,
        r#", "max_tokens": "lots""#,
        r#", "max_tokens": 2.5"#,
    ] {
        let (status, body) = send(&c, &gw, body_of(300, bad)).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "invalid_max_tokens");
    }
    assert_eq!(
        chat_requests(&c, &m).await,
        before,
        "no bad request went upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_levels_cap_output_tokens_applies_and_is_lifted_on_reload() {
    let m = model(&["--service-millis", "0"]);
    let capped = with_tokens(json!({"maxOutputTokens": 100, "capOutputTokens": 8}));
    let path = config_file("tokens-level", &capped);
    let gw = gateway_to(&path, &m.addr, &[]);
    let c = client();
    ready(&c, &gw).await;
    let (status, body) = send(&c, &gw, body_of(300, r#", "max_tokens": 50"#)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(control(&c, &m).await["lastMaxTokens"], 8);
    assert_eq!(body["usage"]["completion_tokens"], 8);
    // The level is left: the contract's own limit applies again.
    write_config(&path, &with_tokens(json!({"maxOutputTokens": 100})));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        send(&c, &gw, body_of(300, r#", "max_tokens": 50"#)).await;
        if control(&c, &m).await["lastMaxTokens"] == 50 {
            break;
        }
        assert!(Instant::now() < deadline, "the reload never lifted the cap");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observe_config_forwards_every_shape_as_sent() {
    let m = model(&["--service-millis", "0"]);
    let mut cfg = with_tokens(json!({"maxInputTokens": 10, "maxOutputTokens": 5}));
    cfg["mode"] = json!("Observe");
    let path = config_file("tokens-observe", &cfg);
    let gw = gateway_to(&path, &m.addr, &[]);
    let c = client();
    ready(&c, &gw).await;
    let (status, body) = send(&c, &gw, body_of(1000, r#", "max_tokens": 50"#)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(control(&c, &m).await["lastMaxTokens"], 50);
}
