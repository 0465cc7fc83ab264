//! Tokens as the cost, on real sockets: `lanekeeper gateway` in front of
//! `lanekeeper-fake-model` (which reports `usage`). A lane with a per-token
//! cost admits its work units per second whatever the mix of prompt sizes,
//! measured from the usage the answers returned; a stream is settled from
//! the usage chunk the gateway asks for, which the client sees only when it
//! asked too; an answer without usage keeps its reservation; and the pool's
//! long-context and model-slot limits refuse with their own reason while
//! other requests keep flowing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::gateway::{
    Proc, client, config_file, control, gateway_to, inc47, lane_mut, metrics, model, ready, sample,
};

pub(crate) const LANE: &str = "p2-email-extract";

/// Work units per input token and per output token, and per request.
const PER_REQUEST: f64 = 0.1;
const PER_INPUT: f64 = 0.001;
const PER_OUTPUT: f64 = 0.004;

/// INC-47 with P2 at `units` work units/s priced per token (one unit a
/// request, a burst of one second), a queue (a long prompt waits for its
/// tokens in turn instead of losing them to the short ones), no floor, no
/// spare capacity: its bucket alone decides.
pub(crate) fn priced(units: f64) -> Value {
    let mut cfg = inc47();
    let p2 = lane_mut(&mut cfg, LANE);
    p2["workUnitsPerRequest"] = json!(1.0);
    p2["admittedUnitsPerSecond"] = json!(units);
    p2["admittedRequestsPerSecond"] = json!(units);
    p2["burst"] = json!(units as u64);
    p2["queue"] = json!({"maxDepth": 16, "ttlSeconds": 30});
    p2["floorUnitsPerSecond"] = Value::Null;
    p2["spareCapacity"] = json!(false);
    p2["cost"] = json!({
        "perRequest": PER_REQUEST,
        "perInputToken": PER_INPUT,
        "perOutputToken": PER_OUTPUT,
    });
    cfg["contentHash"] = json!("");
    cfg
}

/// A chat body of about `tokens` prompt tokens (4 bytes each) with `extra`
/// fields.
pub(crate) fn body_of(tokens: usize, extra: &str) -> String {
    let head = format!(r#"{{"model": "m"{extra}, "messages": [{{"role": "user", "content": ""#);
    let tail = r#""}]}"#;
    let fill = (tokens * 4).saturating_sub(head.len() + tail.len());
    format!("{head}{}{tail}", "x".repeat(fill))
}

pub(crate) fn send(
    c: &reqwest::Client,
    gw: &Proc,
    lane: &str,
    body: String,
) -> reqwest::RequestBuilder {
    c.post(format!("http://{}/v1/chat/completions", gw.addr))
        .header("content-type", "application/json")
        .header("x-lanekeeper-lane", lane)
        .body(body)
}

fn cost_of(usage: &Value) -> f64 {
    PER_REQUEST
        + PER_INPUT * usage["prompt_tokens"].as_f64().unwrap()
        + PER_OUTPUT * usage["completion_tokens"].as_f64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priced_lane_admits_its_units_per_second_whatever_the_mix_of_prompts() {
    let m = model(&["--service-millis", "0", "--completion-tokens", "20"]);
    let units = 40.0;
    let file = config_file("settle-rate", &priced(units));
    let gw = gateway_to(&file, &m.addr, &[]);
    let c = client();
    ready(&c, &gw).await;
    // Four senders, each sending its next request as soon as the last is
    // answered, alternating 100-token and 8,000-token prompts (about 0.3
    // and 8.2 units): more than 40 units/s. Counted: the cost of every
    // answer's usage, by when it was sent, after a 2 s warm-up that spends
    // the burst.
    let start = Instant::now();
    let (warm, window) = (Duration::from_secs(2), Duration::from_secs(20));
    let gw = Arc::new(gw);
    let mut senders = Vec::new();
    for k in 0..4usize {
        let (c, gw) = (c.clone(), Arc::clone(&gw));
        senders.push(tokio::spawn(async move {
            let (mut counted, mut by_size) = (0.0, [0u32; 2]);
            let mut i = k;
            while start.elapsed() < warm + window {
                let long = i % 2 == 1;
                i += 1;
                let sent = start.elapsed();
                let r = send(&c, &gw, LANE, body_of(if long { 8000 } else { 100 }, ""))
                    .send()
                    .await
                    .unwrap();
                if r.status() == 200 {
                    let body: Value = r.json().await.unwrap();
                    if sent >= warm {
                        counted += cost_of(&body["usage"]);
                        by_size[usize::from(long)] += 1;
                    }
                } else {
                    assert_eq!(r.status(), 429);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            (counted, by_size)
        }));
    }
    let (mut total, mut by_size) = (0.0, [0u32; 2]);
    for s in senders {
        let (u, n) = s.await.unwrap();
        total += u;
        by_size[0] += n[0];
        by_size[1] += n[1];
    }
    let rate = total / window.as_secs_f64();
    eprintln!("admitted {rate:.2} units/s from usage; {by_size:?} short/long");
    assert!(
        (rate - units).abs() <= 0.10 * units,
        "{rate:.1} units/s admitted (measured from usage) vs {units}; {by_size:?} short/long"
    );
    assert!(
        by_size[0] > 20 && by_size[1] > 20,
        "long and short prompts both pass: {by_size:?}"
    );
    // The gateway's own count agrees: what it charged is what the usage
    // said, and its estimates converged.
    let text = metrics(&c, &gw).await;
    let charged = sample(
        &text,
        &[
            "lanekeeper_gateway_lane_cost_units_total{",
            LANE,
            "stage=\"charged\"",
        ],
    );
    assert!(
        charged > total,
        "{charged} charged, {total} counted after the warm-up"
    );
    let input = sample(
        &text,
        &[
            "lanekeeper_gateway_lane_tokens_total{",
            "kind=\"input\"",
            LANE,
        ],
    );
    assert!(input > 8000.0 * f64::from(by_size[1]), "{input}");
}

/// A streaming request's events as the client got them.
async fn stream_events(c: &reqwest::Client, gw: &Proc, extra: &str) -> Vec<String> {
    let body = body_of(200, &format!(r#", "stream": true{extra}"#));
    let r = send(c, gw, LANE, body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

fn settlements(text: &str, usage: &str) -> f64 {
    sample(
        text,
        &[
            "lanekeeper_gateway_lane_settlements_total{",
            LANE,
            &format!("usage=\"{usage}\""),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_settled_from_the_usage_chunk_the_client_sees_only_when_it_asked() {
    let m = model(&["--service-millis", "0", "--completion-tokens", "5"]);
    let file = config_file("settle-stream", &priced(1000.0));
    let gw = gateway_to(&file, &m.addr, &[]);
    let c = client();
    ready(&c, &gw).await;
    // Not asked: the gateway asks the model, and takes the chunk out.
    let events = stream_events(&c, &gw, "").await;
    assert_eq!(control(&c, &m).await["lastIncludeUsage"], json!(true));
    assert_eq!(events.len(), 6, "five tokens and [DONE]: {events:?}");
    assert!(
        events.iter().all(|e| !e.contains("\"usage\"")),
        "{events:?}"
    );
    assert_eq!(events.last().unwrap(), "data: [DONE]");
    let text = metrics(&c, &gw).await;
    assert_eq!(settlements(&text, "reported"), 1.0);
    // Asked: the chunk stays, and the stream is settled from it.
    let events = stream_events(&c, &gw, r#", "stream_options": {"include_usage": true}"#).await;
    assert_eq!(events.len(), 7, "{events:?}");
    let usage: Value = serde_json::from_str(events[5].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    let text = metrics(&c, &gw).await;
    assert_eq!(settlements(&text, "reported"), 2.0);
    let output = sample(
        &text,
        &[
            "lanekeeper_gateway_lane_tokens_total{",
            "kind=\"output\"",
            LANE,
        ],
    );
    assert_eq!(output, 10.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_without_usage_keeps_its_reservation() {
    let m = model(&["--service-millis", "0", "--completion-tokens", "5"]);
    let file = config_file("settle-none", &priced(1000.0));
    let gw = gateway_to(&file, &m.addr, &[]);
    let c = client();
    ready(&c, &gw).await;
    c.put(format!("http://{}/control", m.addr))
        .body(r#"{"omitUsage": true}"#)
        .send()
        .await
        .unwrap();
    for extra in ["", r#", "stream": true"#] {
        for _ in 0..3 {
            let r = send(&c, &gw, LANE, body_of(1000, extra))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap();
        }
    }
    let text = metrics(&c, &gw).await;
    assert_eq!(settlements(&text, "missing"), 6.0);
    assert_eq!(settlements(&text, "reported"), 0.0);
    let units = |stage: &str| {
        sample(
            &text,
            &[
                "lanekeeper_gateway_lane_cost_units_total{",
                LANE,
                &format!("stage=\"{stage}\""),
            ],
        )
    };
    // About 1,000 input tokens and 256 output tokens reserved each (no
    // answer ever said otherwise), all of it charged: no refund.
    assert!(units("reserved") > 6.0 * 1.9, "{}", units("reserved"));
    assert_eq!(units("charged"), units("reserved"));
}

/// A client that makes its answer long (here 1.5 million output tokens,
/// about 4.5 MB of JSON; `logprobs` or many choices make one long sooner)
/// is charged what the answer's usage says. Reading the usage used to stop
/// at 4 MiB: the request kept its reservation, its output at the lane's
/// P95 (256 tokens before any answer), whatever it really used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_json_answer_is_settled_with_its_usage() {
    let tokens = 1_500_000u64;
    let m = model(&[
        "--service-millis",
        "0",
        "--completion-tokens",
        &tokens.to_string(),
    ]);
    let file = config_file("settle-long-answer", &priced(1000.0));
    let gw = gateway_to(&file, &m.addr, &[]);
    let c = client();
    ready(&c, &gw).await;
    let r = send(&c, &gw, LANE, body_of(100, "")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let answer = r.bytes().await.unwrap();
    assert!(answer.len() > 4 << 20, "{} bytes", answer.len());
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["usage"]["completion_tokens"], tokens);
    let text = metrics(&c, &gw).await;
    assert_eq!(settlements(&text, "missing"), 0.0);
    assert_eq!(settlements(&text, "reported"), 1.0);
    let output = sample(
        &text,
        &[
            "lanekeeper_gateway_lane_tokens_total{",
            "kind=\"output\"",
            LANE,
        ],
    );
    assert_eq!(output, tokens as f64);
}

/// The answer of [`compressing_upstream`]: 5,000 output tokens.
const ANSWER: &str = r#"{"id":"chatcmpl-x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":100,"completion_tokens":5000,"total_tokens":5100}}"#;

/// [`ANSWER`] gzipped (Python's `gzip.compress(ANSWER, mtime=0)`).
const ANSWER_GZIP: [u8; 162] = [
    31, 139, 8, 0, 0, 0, 0, 0, 2, 3, 69, 142, 209, 10, 194, 48, 12, 69, 255, 229, 62, 87, 169, 15,
    190, 244, 87, 68, 70, 173, 209, 213, 109, 201, 88, 34, 12, 70, 255, 221, 22, 156, 62, 5, 206,
    77, 206, 205, 134, 124, 71, 64, 234, 163, 165, 105, 30, 15, 43, 28, 228, 246, 162, 100, 95,
    122, 76, 82, 57, 89, 22, 174, 81, 234, 37, 39, 82, 132, 203, 134, 204, 119, 90, 17, 188, 195,
    68, 170, 241, 73, 8, 27, 22, 25, 235, 68, 84, 205, 106, 145, 173, 221, 8, 27, 113, 243, 201,
    128, 226, 240, 200, 156, 181, 239, 22, 138, 90, 157, 1, 106, 50, 163, 92, 29, 222, 187, 100,
    94, 106, 167, 117, 38, 3, 113, 237, 58, 121, 223, 44, 251, 27, 63, 126, 246, 45, 48, 177, 56,
    254, 89, 93, 46, 229, 3, 163, 182, 8, 107, 214, 0, 0, 0,
];

/// An upstream that compresses its answer when the request accepts gzip,
/// as a server with compression middleware (or a proxy in front of one)
/// does; it counts the requests that accepted gzip.
async fn compressing_upstream() -> (String, Arc<std::sync::atomic::AtomicU32>) {
    use axum::http::{HeaderMap, header};
    let gzipped = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = Arc::clone(&gzipped);
    let answer = move |headers: HeaderMap| {
        let counted = Arc::clone(&counted);
        async move {
            let accepts = headers
                .get(header::ACCEPT_ENCODING)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("gzip"));
            let json = (header::CONTENT_TYPE, "application/json");
            if accepts {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let gzip = (header::CONTENT_ENCODING, "gzip");
                ([json, gzip], ANSWER_GZIP.to_vec())
            } else {
                let plain = (header::CONTENT_ENCODING, "identity");
                ([json, plain], ANSWER.as_bytes().to_vec())
            }
        }
    };
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(answer));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (addr, gzipped)
}

/// A client that accepts gzip had its `Accept-Encoding` passed on: an
/// upstream that compresses then answered in gzip, the gateway could not
/// read the usage, and the request kept only its reservation (its output
/// at the lane's P95, 256 tokens before anything is measured) for an
/// answer of 5,000. A metered request now asks for the answer as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metered_answer_is_asked_for_uncompressed_and_settled() {
    let (upstream, gzipped) = compressing_upstream().await;
    let file = config_file("settle-gzip", &priced(1000.0));
    let gw = gateway_to(&file, &upstream, &[]);
    let c = client();
    ready(&c, &gw).await;
    let r = send(&c, &gw, LANE, body_of(100, ""))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let answer = r.bytes().await.unwrap();
    let text = metrics(&c, &gw).await;
    assert_eq!(settlements(&text, "missing"), 0.0);
    assert_eq!(settlements(&text, "reported"), 1.0);
    assert_eq!(gzipped.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(answer, ANSWER.as_bytes());
}

/// INC-47 with the pool's limits set (`concurrency`, `longContext`).
fn with_pool_limits(limits: Value) -> Value {
    let mut cfg = inc47();
    for (k, v) in limits.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    cfg["contentHash"] = json!("");
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_context_concurrency_holds_while_short_requests_keep_flowing() {
    // Prefill at 250 µs a token: an 8,000-token prompt takes 2 s, a
    // 100-token one 25 ms.
    let m = model(&[
        "--service-millis",
        "0",
        "--completion-tokens",
        "1",
        "--prefill-micros-per-token",
        "250",
    ]);
    let cfg =
        with_pool_limits(json!({"longContext": {"aboveInputTokens": 4000, "maxConcurrency": 2}}));
    let file = config_file("settle-long", &cfg);
    let gw = Arc::new(gateway_to(&file, &m.addr, &[]));
    let c = client();
    ready(&c, &gw).await;
    // Six long prompts at once: two go, four are refused with the limit's
    // reason and a Retry-After.
    let longs: Vec<_> = (0..6)
        .map(|_| {
            let (c, gw) = (c.clone(), Arc::clone(&gw));
            tokio::spawn(async move {
                let r = send(&c, &gw, "p1-agent-assist", body_of(8000, ""))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let retry = r.headers().get("retry-after").is_some();
                (status, retry, r.text().await.unwrap())
            })
        })
        .collect();
    // Meanwhile short prompts keep flowing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    for _ in 0..20 {
        let r = send(&c, &gw, "p1-agent-assist", body_of(100, ""))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "twenty short requests took {:?} next to the long ones",
        t.elapsed()
    );
    let mut passed = 0;
    for l in longs {
        let (status, retry, body) = l.await.unwrap();
        match status {
            200 => passed += 1,
            429 => {
                assert!(retry, "a Retry-After: {body}");
                assert!(body.contains("longContext.maxConcurrency"), "{body}");
            }
            s => panic!("{s}: {body}"),
        }
    }
    assert_eq!(passed, 2, "at most two long prompts in flight");
    let text = metrics(&c, &gw).await;
    assert_eq!(
        sample(
            &text,
            &[
                "lanekeeper_gateway_refusals_by_limit_total{",
                "limit=\"long_context\""
            ]
        ),
        4.0
    );
    // Their places are free again once they ended.
    let r = send(&c, &gw, "p1-agent-assist", body_of(8000, ""))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_model_slots_hold_every_lane() {
    let m = model(&["--service-millis", "1500"]);
    let cfg = with_pool_limits(json!({"concurrency": {"max": 3}}));
    let file = config_file("settle-slots", &cfg);
    let gw = Arc::new(gateway_to(&file, &m.addr, &[]));
    let c = client();
    ready(&c, &gw).await;
    // Five at once, P0 (never shed) among them: three slots.
    let all: Vec<_> = [
        "p0-disruption-assist",
        "p1-agent-assist",
        "p1-agent-assist",
        "p2-email-extract",
        "p0-disruption-assist",
    ]
    .into_iter()
    .enumerate()
    .map(|(i, lane)| {
        let (c, gw) = (c.clone(), Arc::clone(&gw));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50 * i as u64)).await;
            let r = send(&c, &gw, lane, body_of(100, "")).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.text().await.unwrap())
        })
    })
    .collect();
    let mut by_status = std::collections::BTreeMap::<u16, u32>::new();
    for h in all {
        let (status, body) = h.await.unwrap();
        if status == 429 {
            assert!(body.contains("concurrency.max"), "{body}");
        }
        *by_status.entry(status).or_default() += 1;
    }
    assert_eq!(by_status, [(200, 3), (429, 2)].into(), "{by_status:?}");
    assert!(control(&c, &m).await["chatInFlightPeak"].as_u64().unwrap() <= 3);
    // Counted by the limit that refused, whichever lane it was.
    let text = metrics(&c, &gw).await;
    let refused: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("lanekeeper_gateway_refusals_by_limit_total{")
                && l.contains("limit=\"model_slots\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(refused, 2.0);
}

/// A priced lane whose chat history is trimmed on its way upstream: the
/// answers' prompt tokens count the trimmed body (4 bytes a token at the
/// fake model), so the lane's bytes-per-token ratio learns 4 from the
/// bytes sent. Learned from the longer body the client sent (about five
/// times the bytes), it would drift towards 16 and a later prompt of 2,000
/// tokens would be reserved at a fraction of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trimmed_history_teaches_the_ratio_the_bytes_sent() {
    let m = model(&["--service-millis", "0", "--completion-tokens", "20"]);
    let mut cfg = priced(1000.0);
    lane_mut(&mut cfg, LANE)["optionalContext"] = json!({"historyTurns": 2, "degraded": false});
    let file = config_file("settle-trimmed", &cfg);
    let gw = gateway_to(&file, &m.addr, &[]);
    let c = client();
    ready(&c, &gw).await;
    let mut messages = vec![json!({"role": "system", "content": "s"})];
    for i in 0..12 {
        let words = "w".repeat(120);
        messages.push(json!({"role": "user", "content": format!("u{i} {words}")}));
        messages.push(json!({"role": "assistant", "content": format!("a{i} {words}")}));
    }
    let long = json!({"model": "m", "messages": messages}).to_string();
    for _ in 0..60 {
        let r = send(&c, &gw, LANE, long.clone()).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let answer: Value = r.json().await.unwrap();
        let sent = control(&c, &m).await["lastMessages"].clone();
        assert_eq!(sent, 5, "trimmed to the system message and 2 turns");
        assert!(answer["usage"]["prompt_tokens"].as_u64().unwrap() * 4 < long.len() as u64 / 3);
    }
    // One untrimmed prompt of 2,000 tokens: reserved at 2,000 input tokens
    // (2 units), 0.1 a request and its output at the lane's P95 (20
    // tokens, 0.08).
    let reserved = |t: &str| {
        sample(
            t,
            &[
                "lanekeeper_gateway_lane_cost_units_total",
                &format!("lane=\"{LANE}\""),
                "stage=\"reserved\"",
            ],
        )
    };
    let before = reserved(&metrics(&c, &gw).await);
    let r = send(&c, &gw, LANE, body_of(2000, "")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    let probe = reserved(&metrics(&c, &gw).await) - before;
    assert!(
        (2.1..2.3).contains(&probe),
        "a 2,000-token prompt reserved {probe:.3} units"
    );
}
