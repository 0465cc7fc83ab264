//! The fake model server binary: its metrics page, its control endpoint and
//! its readiness switch, exercised over real HTTP on a loopback port.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lanekeeper-fake-model"))
        .args(["--listen", "127.0.0.1:0", "--model-name", "agent-large"])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("the fake model server starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    Server { child, addr }
}

/// One HTTP/1.1 request with `Connection: close`; returns (status, body).
fn request(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, rest) = raw.split_once("\r\n\r\n").expect("a complete response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    (
        status,
        if chunked {
            dechunk(rest)
        } else {
            rest.to_owned()
        },
    )
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

/// The value of the sample line that starts with `series`.
fn sample(page: &str, series: &str) -> f64 {
    page.lines()
        .find(|l| l.starts_with(series))
        .unwrap_or_else(|| panic!("{series} missing from\n{page}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn serves_vllm_metrics_with_initial_numbers() {
    let s = start(&["--running", "12", "--waiting", "3", "--kv-cache", "0.42"]);
    let (status, page) = request(&s.addr, "GET", "/metrics", None);
    assert_eq!(status, 200);
    let m = "{model_name=\"agent-large\"}";
    assert_eq!(
        sample(&page, &format!("vllm:num_requests_running{m}")),
        12.0
    );
    assert_eq!(sample(&page, &format!("vllm:num_requests_waiting{m}")), 3.0);
    assert_eq!(sample(&page, &format!("vllm:kv_cache_usage_perc{m}")), 0.42);
    assert_eq!(
        sample(&page, &format!("vllm:gpu_cache_usage_perc{m}")),
        0.42
    );
    assert_eq!(sample(&page, "vllm:request_errors_total{"), 0.0);
    assert!(page.contains("# TYPE vllm:num_requests_running gauge"));
    assert!(page.contains("# TYPE vllm:request_errors_total counter"));
    let (status, _) = request(&s.addr, "GET", "/health", None);
    assert_eq!(status, 200);
}

#[test]
fn control_sets_numbers_and_readiness() {
    let s = start(&[]);
    let (status, body) = request(
        &s.addr,
        "PUT",
        "/control",
        Some(
            r#"{"numRequestsRunning": 180, "numRequestsWaiting": 40, "kvCacheUsagePerc": 0.93, "requestSuccessTotal": 750, "requestErrorsTotal": 250, "ready": false}"#,
        ),
    );
    assert_eq!(status, 200, "{body}");
    let now: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(now["numRequestsRunning"], 180.0);
    assert_eq!(now["ready"], false);

    let (_, page) = request(&s.addr, "GET", "/metrics", None);
    assert_eq!(sample(&page, "vllm:num_requests_running{"), 180.0);
    assert_eq!(sample(&page, "vllm:num_requests_waiting{"), 40.0);
    assert_eq!(sample(&page, "vllm:kv_cache_usage_perc{"), 0.93);
    assert_eq!(sample(&page, "vllm:request_success_total{"), 750.0);
    assert_eq!(sample(&page, "vllm:request_errors_total{"), 250.0);

    let (status, _) = request(&s.addr, "GET", "/health", None);
    assert_eq!(status, 503, "not ready after ready: false");
    let (status, _) = request(&s.addr, "GET", "/livez", None);
    assert_eq!(status, 200, "liveness does not follow readiness");

    // A partial update leaves the other numbers alone.
    let (status, _) = request(&s.addr, "PUT", "/control", Some(r#"{"ready": true}"#));
    assert_eq!(status, 200);
    let (status, _) = request(&s.addr, "GET", "/health", None);
    assert_eq!(status, 200);
    let (_, body) = request(&s.addr, "GET", "/control", None);
    let now: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(now["numRequestsRunning"], 180.0);
    assert_eq!(now["requestErrorsTotal"], 250);
}

#[test]
fn control_rejects_bad_bodies() {
    let s = start(&[]);
    for bad in [
        r#"{"numRequestsRuning": 1}"#,
        r#"{"numRequestsRunning": -1}"#,
        r#"{"ready": "yes"}"#,
        "not json",
    ] {
        let (status, body) = request(&s.addr, "PUT", "/control", Some(bad));
        assert_eq!(status, 400, "{bad} → {body}");
    }
    let (_, body) = request(&s.addr, "GET", "/control", None);
    let now: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(now["numRequestsRunning"], 0.0, "bad updates change nothing");
}

#[test]
fn metrics_delay_slows_the_page() {
    let s = start(&["--not-ready"]);
    let (status, _) = request(&s.addr, "GET", "/health", None);
    assert_eq!(status, 503, "--not-ready starts not ready");
    request(
        &s.addr,
        "PUT",
        "/control",
        Some(r#"{"metricsDelayMillis": 300}"#),
    );
    let t = Instant::now();
    let (status, _) = request(&s.addr, "GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(t.elapsed() >= Duration::from_millis(300));
}

/// `n` chat requests at once: the seconds until the last answer, and
/// `chatWaiting` 150 ms after they were sent.
fn chats_at_once(addr: &str, n: usize) -> (f64, u64) {
    let start = Instant::now();
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let addr = addr.to_owned();
            std::thread::spawn(move || request(&addr, "POST", "/v1/chat/completions", Some(body)).0)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(150));
    let (_, control) = request(addr, "GET", "/control", None);
    let waiting = serde_json::from_str::<serde_json::Value>(&control).unwrap()["chatWaiting"]
        .as_u64()
        .unwrap();
    for t in threads {
        assert_eq!(t.join().unwrap(), 200);
    }
    (start.elapsed().as_secs_f64(), waiting)
}

#[test]
fn chat_slots_hold_the_rest_waiting_and_a_cut_takes_effect() {
    let s = start(&["--slots", "2", "--service-millis", "300"]);
    // Four answers through two slots: two wait, two rounds of 0.3 s.
    let (t, waiting) = chats_at_once(&s.addr, 4);
    assert_eq!(waiting, 2);
    assert!(t >= 0.59, "four answers through two slots took {t}");
    // Four slots: none waits.
    let (status, _) = request(&s.addr, "PUT", "/control", Some(r#"{"chatSlots": 4}"#));
    assert_eq!(status, 200);
    assert_eq!(chats_at_once(&s.addr, 4).1, 0);
    // Cut to one slot: three wait, four rounds.
    request(&s.addr, "PUT", "/control", Some(r#"{"chatSlots": 1}"#));
    let (t, waiting) = chats_at_once(&s.addr, 4);
    assert_eq!(waiting, 3);
    assert!(t >= 1.19, "four answers through one slot took {t}");
}

/// A chat body of exactly `bytes` bytes (the content padded with `x`).
fn chat_body(bytes: usize, extra: &str) -> String {
    let head = format!(r#"{{"model": "m"{extra}, "messages": [{{"role": "user", "content": ""#);
    let tail = r#""}]}"#;
    let pad = bytes - head.len() - tail.len();
    format!("{head}{}{tail}", "x".repeat(pad))
}

/// With both output fields, the fake model reads `max_completion_tokens`,
/// as vLLM does (not the lower of the two).
#[test]
fn max_completion_tokens_is_read_over_max_tokens() {
    let s = start(&["--completion-tokens", "16", "--service-millis", "0"]);
    let both = r#", "max_tokens": 1, "max_completion_tokens": 9"#;
    let (_, answer) = request(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body(400, both)),
    );
    let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 9, "{answer}");
}

#[test]
fn answers_carry_usage_from_the_body_and_max_tokens() {
    let s = start(&["--completion-tokens", "16", "--service-millis", "0"]);
    // 401 bytes: 101 prompt tokens (rounded up); no max_tokens: 16.
    let (status, body) = request(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body(401, "")),
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["usage"],
        serde_json::json!({"prompt_tokens": 101, "completion_tokens": 16, "total_tokens": 117})
    );
    // max_tokens below the answer's length shortens it; above, it does not.
    for (field, asked, want) in [
        ("max_tokens", 5, 5),
        ("max_completion_tokens", 3, 3),
        ("max_tokens", 500, 16),
    ] {
        let (_, body) = request(
            &s.addr,
            "POST",
            "/v1/chat/completions",
            Some(&chat_body(400, &format!(r#", "{field}": {asked}"#))),
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["usage"]["prompt_tokens"], 100);
        assert_eq!(v["usage"]["completion_tokens"], want, "{field} {asked}");
    }
    // What the last request asked for is echoed, as sent.
    let (_, control) = request(&s.addr, "GET", "/control", None);
    let c: serde_json::Value = serde_json::from_str(&control).unwrap();
    assert_eq!(c["lastMaxTokens"], 500);
    assert_eq!(c["lastMaxCompletionTokens"], serde_json::Value::Null);
    // The counters add up what the answers said, one TTFT sample each.
    let (_, page) = request(&s.addr, "GET", "/metrics", None);
    assert_eq!(sample(&page, "vllm:prompt_tokens_total{"), 401.0);
    assert_eq!(sample(&page, "vllm:generation_tokens_total{"), 40.0);
    assert_eq!(
        sample(&page, "vllm:time_to_first_token_seconds_count{"),
        4.0
    );
    assert_eq!(
        sample(
            &page,
            "vllm:time_to_first_token_seconds_bucket{model_name=\"agent-large\",le=\"+Inf\"}"
        ),
        4.0
    );
    assert!(page.contains("# TYPE vllm:time_to_first_token_seconds histogram"));
    assert!(page.contains("# TYPE vllm:prompt_tokens_total counter"));
}

/// The `data:` events of a streamed answer, parsed (`[DONE]` as a string).
fn events(body: &str) -> Vec<serde_json::Value> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|_| serde_json::Value::from(d)))
        .collect()
}

#[test]
fn a_stream_ends_with_a_usage_chunk_only_when_asked() {
    let s = start(&[
        "--completion-tokens",
        "4",
        "--service-millis",
        "0",
        "--token-millis",
        "1",
    ]);
    let asked = chat_body(
        200,
        r#", "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 3"#,
    );
    let (status, body) = request(&s.addr, "POST", "/v1/chat/completions", Some(&asked));
    assert_eq!(status, 200);
    let ev = events(&body);
    assert_eq!(ev.len(), 3 + 2, "{body}");
    assert_eq!(ev[4], "[DONE]");
    assert_eq!(ev[3]["choices"], serde_json::json!([]));
    assert_eq!(
        ev[3]["usage"],
        serde_json::json!({"prompt_tokens": 50, "completion_tokens": 3, "total_tokens": 53})
    );
    assert!(ev[..3].iter().all(|e| e.get("usage").is_none()));
    let plain = chat_body(200, r#", "stream": true"#);
    let (_, body) = request(&s.addr, "POST", "/v1/chat/completions", Some(&plain));
    let ev = events(&body);
    assert_eq!(ev.len(), 4 + 1, "{body}");
    assert!(ev.iter().all(|e| e.get("usage").is_none()), "{body}");
}

#[test]
fn prefill_and_decode_take_time_per_token() {
    // 1 ms per prompt token: a 1,000-token prompt waits a second before its
    // first token; 10 ms per completion token: 16 tokens add 160 ms.
    let s = start(&[
        "--service-millis",
        "0",
        "--prefill-micros-per-token",
        "1000",
        "--decode-micros-per-token",
        "10000",
    ]);
    let t = Instant::now();
    let (status, _) = request(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body(4000, "")),
    );
    assert_eq!(status, 200);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(1160), "{took:?}");
    let (_, page) = request(&s.addr, "GET", "/metrics", None);
    let ttft = sample(&page, "vllm:time_to_first_token_seconds_sum{");
    assert!((1.0..1.16).contains(&ttft), "TTFT {ttft}: prefill only");
    // A short prompt is fast: the time is per token, not per request.
    let t = Instant::now();
    request(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body(100, "")),
    );
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    // Settable over /control like the other timings.
    let (status, body) = request(
        &s.addr,
        "PUT",
        "/control",
        Some(r#"{"prefillMicrosPerToken": 0, "decodeMicrosPerToken": 0}"#),
    );
    assert_eq!(status, 200, "{body}");
}
