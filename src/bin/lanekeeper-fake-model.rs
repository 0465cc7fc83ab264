//! `lanekeeper-fake-model`: a stand-in for a vLLM model server, for the kind
//! end-to-end suite and for demos. It serves no model: it serves the vLLM
//! metrics page with numbers a test sets over HTTP, and a readiness endpoint
//! a test can flip.
//!
//! Endpoints:
//! - `GET /metrics`: Prometheus text format with `vllm:num_requests_running`,
//!   `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (and the older
//!   `vllm:gpu_cache_usage_perc`), `vllm:request_success_total` and
//!   `vllm:request_errors_total` (a request error counter), the token
//!   counters `vllm:prompt_tokens_total` and `vllm:generation_tokens_total`
//!   and the histogram `vllm:time_to_first_token_seconds` of the chat
//!   answers served.
//! - `GET /health`: 200 while ready, 503 otherwise (use it as the pod's
//!   readiness probe). `GET /livez`: always 200.
//! - `GET /control`: the current numbers as JSON.
//! - `PUT /control`: a JSON object with any of the fields of `GET /control`;
//!   the fields given replace the current values, unknown fields are a 400.
//! - `POST /v1/chat/completions`: an OpenAI-style answer after
//!   `serviceMillis` (plus `tokenMillis` per completion token when
//!   streaming; a request's `x-fake-service-millis` header replaces
//!   `serviceMillis` for that request), `completionTokens` tokens; with
//!   `"stream": true` the tokens
//!   come as server-sent events, one every `tokenMillis`, then `data: [DONE]`.
//!   `GET /control` counts the chat requests received (`chatRequests`), the
//!   ones in progress (`chatInFlight`), the ones whose client went away
//!   before the end (`chatCancelled`), and echoes the last request's
//!   `x-lanekeeper-*`, `authorization` and `x-request-id` headers and
//!   message count (`lastHeaders`,
//!   `lastMessages`), so tests can see what a gateway sent.
//!   Every answer carries `usage`: `prompt_tokens` is the request body's
//!   bytes / 4 (rounded up), `completion_tokens` the lower of the request's
//!   `max_completion_tokens` (else `max_tokens`, as vLLM reads them) and
//!   `completionTokens`; a
//!   stream ends with a usage chunk (empty `choices`) when the request sets
//!   `stream_options.include_usage`. With `prefillMicrosPerToken` and
//!   `decodeMicrosPerToken` an answer takes that long per prompt token
//!   before its first token and per completion token after it (a stream's
//!   tokens also keep `tokenMillis` between them). `lastMaxTokens` and
//!   `lastMaxCompletionTokens` echo the last request's fields as sent,
//!   `lastIncludeUsage` its `stream_options.include_usage`; with
//!   `omitUsage` no answer carries usage (nor a usage chunk).
//!   `chatInFlightPeak` is the most in progress at once (settable, to
//!   reset it). With `chatStatus` set (500, 429, 503, ...) every chat
//!   request is answered with that status after `serviceMillis`, with
//!   `Retry-After: chatRetryAfter` when set: a failing or overloaded
//!   upstream on demand. With `chatSlots` set (or `--slots`), at most that
//!   many chat requests are served at once and the others wait for a slot
//!   in arrival order, as a model server's batch does (`chatWaiting` counts
//!   them); lowering it takes effect as requests finish: a capacity cut.
//!
//! ```sh
//! lanekeeper-fake-model --listen 0.0.0.0:8000 --running 12 --waiting 3
//! curl -X PUT localhost:8000/control -d '{"ready": false}'
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use clap::Parser;
use serde::{Deserialize, Serialize};

/// A fake vLLM model server whose metrics and readiness a test sets over HTTP.
#[derive(Parser, Debug)]
#[command(name = "lanekeeper-fake-model", version)]
struct Args {
    /// Address to listen on (port 0 picks a free port; the chosen address is
    /// printed as `listening on ADDR`).
    #[arg(long, env = "FAKE_MODEL_LISTEN", default_value = "0.0.0.0:8000")]
    listen: SocketAddr,
    /// Initial `vllm:num_requests_running`.
    #[arg(long, default_value_t = 0.0)]
    running: f64,
    /// Initial `vllm:num_requests_waiting`.
    #[arg(long, default_value_t = 0.0)]
    waiting: f64,
    /// Initial `vllm:kv_cache_usage_perc` (0..1).
    #[arg(long, default_value_t = 0.0)]
    kv_cache: f64,
    /// The `model_name` label of every series.
    #[arg(long, env = "FAKE_MODEL_NAME", default_value = "fake-model")]
    model_name: String,
    /// Start not ready (`/health` answers 503 until set ready).
    #[arg(long)]
    not_ready: bool,
    /// Time to answer a chat completion, in milliseconds.
    #[arg(long, env = "FAKE_MODEL_SERVICE_MILLIS", default_value_t = 20)]
    service_millis: u64,
    /// Time between streamed tokens, in milliseconds.
    #[arg(long, env = "FAKE_MODEL_TOKEN_MILLIS", default_value_t = 5)]
    token_millis: u64,
    /// Completion tokens per answer (fewer when the request's `max_tokens`
    /// is lower).
    #[arg(long, env = "FAKE_MODEL_COMPLETION_TOKENS", default_value_t = 16)]
    completion_tokens: u64,
    /// Chat requests served at once (0: no limit); the others wait.
    #[arg(long, default_value_t = 0)]
    slots: u64,
    /// Prefill time per prompt token, in microseconds (before the first
    /// token).
    #[arg(long, env = "FAKE_MODEL_PREFILL_MICROS_PER_TOKEN", default_value_t = 0)]
    prefill_micros_per_token: u64,
    /// Decode time per completion token, in microseconds.
    #[arg(long, env = "FAKE_MODEL_DECODE_MICROS_PER_TOKEN", default_value_t = 0)]
    decode_micros_per_token: u64,
}

/// The numbers the server reports; `PUT /control` replaces any of them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Numbers {
    /// `vllm:num_requests_running`.
    num_requests_running: f64,
    /// `vllm:num_requests_waiting`.
    num_requests_waiting: f64,
    /// `vllm:kv_cache_usage_perc` and `vllm:gpu_cache_usage_perc` (0..1).
    kv_cache_usage_perc: f64,
    /// `vllm:request_success_total`.
    request_success_total: u64,
    /// `vllm:request_errors_total`.
    request_errors_total: u64,
    /// Whether `/health` answers 200.
    ready: bool,
    /// Delay before answering `/metrics`, in milliseconds (for scrape
    /// timeouts).
    metrics_delay_millis: u64,
    /// Time to answer a chat completion, in milliseconds.
    #[serde(default)]
    service_millis: u64,
    /// Time between streamed tokens, in milliseconds.
    #[serde(default)]
    token_millis: u64,
    /// Completion tokens per answer.
    #[serde(default)]
    completion_tokens: u64,
    /// Chat requests received (read-only).
    #[serde(default)]
    chat_requests: u64,
    /// Chat requests in progress (read-only).
    #[serde(default)]
    chat_in_flight: u64,
    /// Chat requests whose client went away before the answer ended
    /// (read-only).
    #[serde(default)]
    chat_cancelled: u64,
    /// The last chat request's `x-lanekeeper-*` headers (read-only).
    #[serde(default)]
    last_headers: std::collections::BTreeMap<String, String>,
    /// The number of messages of the last chat request (read-only).
    #[serde(default)]
    last_messages: usize,
    /// The status of every chat answer when not 200 (a failing or
    /// overloaded upstream: 500, 429, 503); 0 or 200: answer normally.
    #[serde(default)]
    chat_status: u16,
    /// The `Retry-After` (seconds) of a chat answer with `chatStatus` (0:
    /// none).
    #[serde(default)]
    chat_retry_after: u64,
    /// Most chat requests in progress at once (read-only).
    #[serde(default)]
    chat_in_flight_peak: u64,
    /// Chat requests served at once (0: no limit).
    #[serde(default)]
    chat_slots: u64,
    /// Chat requests waiting for a slot (read-only).
    #[serde(default)]
    chat_waiting: u64,
    /// Prefill time per prompt token, in microseconds.
    #[serde(default)]
    prefill_micros_per_token: u64,
    /// Decode time per completion token, in microseconds.
    #[serde(default)]
    decode_micros_per_token: u64,
    /// The token counters and the time-to-first-token histogram (read-only).
    #[serde(default)]
    tokens: TokenCounters,
    /// The last chat request's `max_tokens`, as sent (read-only).
    #[serde(default)]
    last_max_tokens: Option<serde_json::Value>,
    /// The last chat request's `max_completion_tokens`, as sent
    /// (read-only).
    #[serde(default)]
    last_max_completion_tokens: Option<serde_json::Value>,
    /// Answer without `usage` (and with no usage chunk): an upstream that
    /// does not report what a request cost.
    #[serde(default)]
    omit_usage: bool,
    /// The last chat request's `stream_options.include_usage`, as sent
    /// (read-only).
    #[serde(default)]
    last_include_usage: Option<serde_json::Value>,
}

/// Bounds of `vllm:time_to_first_token_seconds` (vLLM's).
const TTFT_BUCKETS: [f64; 15] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
];

/// Tokens served and the time to the first token of each answer.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct TokenCounters {
    /// `vllm:prompt_tokens_total`.
    prompt_tokens_total: u64,
    /// `vllm:generation_tokens_total`.
    generation_tokens_total: u64,
    /// `vllm:time_to_first_token_seconds` per bucket of [`TTFT_BUCKETS`]
    /// (not cumulative), then the count above the last bound.
    ttft_buckets: Vec<u64>,
    /// The histogram's sum of seconds.
    ttft_sum: f64,
    /// The histogram's count.
    ttft_count: u64,
}

/// A partial update: every field optional.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Update {
    num_requests_running: Option<f64>,
    num_requests_waiting: Option<f64>,
    kv_cache_usage_perc: Option<f64>,
    request_success_total: Option<u64>,
    request_errors_total: Option<u64>,
    ready: Option<bool>,
    metrics_delay_millis: Option<u64>,
    service_millis: Option<u64>,
    token_millis: Option<u64>,
    completion_tokens: Option<u64>,
    chat_status: Option<u16>,
    chat_retry_after: Option<u64>,
    chat_in_flight_peak: Option<u64>,
    chat_slots: Option<u64>,
    prefill_micros_per_token: Option<u64>,
    decode_micros_per_token: Option<u64>,
    omit_usage: Option<bool>,
}

#[derive(Clone)]
struct App {
    model: String,
    numbers: Arc<Mutex<Numbers>>,
    slots: Arc<Slots>,
}

/// The permits of "no limit": more than any test sends at once.
const UNLIMITED_SLOTS: u64 = 1 << 20;

/// The chat slots: a semaphore whose size a test changes. Growing adds
/// permits at once; shrinking takes permits back as requests finish.
struct Slots {
    permits: Arc<tokio::sync::Semaphore>,
    size: Mutex<u64>,
}

impl Slots {
    fn new(slots: u64) -> Self {
        let size = if slots == 0 { UNLIMITED_SLOTS } else { slots };
        Self {
            permits: Arc::new(tokio::sync::Semaphore::new(size as usize)),
            size: Mutex::new(size),
        }
    }

    /// Sets the number of slots (0: no limit).
    fn resize(&self, slots: u64) {
        let want = if slots == 0 { UNLIMITED_SLOTS } else { slots };
        let mut size = self.size.lock().expect("not poisoned");
        if want > *size {
            self.permits.add_permits((want - *size) as usize);
        } else if want < *size {
            let fewer = (*size - want) as u32;
            let permits = self.permits.clone();
            tokio::spawn(async move {
                if let Ok(p) = permits.acquire_many_owned(fewer).await {
                    p.forget();
                }
            });
        }
        *size = want;
    }
}

impl App {
    fn snapshot(&self) -> Numbers {
        self.numbers.lock().expect("not poisoned").clone()
    }
}

/// Escapes a label value for the text exposition format.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn metrics_text(model: &str, n: &Numbers) -> String {
    let l = format!("model_name=\"{}\"", label(model));
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, labels: &str, value: String| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        out.push_str(&format!("{name}{{{labels}}} {value}\n"));
    };
    family(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        &l,
        n.num_requests_running.to_string(),
    );
    family(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        &l,
        n.num_requests_waiting.to_string(),
    );
    family(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        &l,
        n.kv_cache_usage_perc.to_string(),
    );
    family(
        "vllm:gpu_cache_usage_perc",
        "gauge",
        "GPU KV-cache usage (older name). 1 means 100 percent usage.",
        &l,
        n.kv_cache_usage_perc.to_string(),
    );
    family(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        &format!("{l},finished_reason=\"stop\""),
        n.request_success_total.to_string(),
    );
    family(
        "vllm:request_errors_total",
        "counter",
        "Count of requests that failed.",
        &l,
        n.request_errors_total.to_string(),
    );
    token_metrics(&mut out, &l, &n.tokens);
    out
}

/// The token counters and the TTFT histogram, in vLLM's names.
fn token_metrics(out: &mut String, labels: &str, t: &TokenCounters) {
    for (name, help, v) in [
        (
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            t.prompt_tokens_total,
        ),
        (
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            t.generation_tokens_total,
        ),
    ] {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{labels}}} {v}\n"
        ));
    }
    let name = "vllm:time_to_first_token_seconds";
    out.push_str(&format!(
        "# HELP {name} Histogram of time to first token in seconds.\n# TYPE {name} histogram\n"
    ));
    let mut cumulative = 0;
    for (i, le) in TTFT_BUCKETS.iter().enumerate() {
        cumulative += t.ttft_buckets.get(i).copied().unwrap_or(0);
        out.push_str(&format!(
            "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}\n"
        ));
    }
    out.push_str(&format!(
        "{name}_bucket{{{labels},le=\"+Inf\"}} {}\n{name}_sum{{{labels}}} {}\n{name}_count{{{labels}}} {}\n",
        t.ttft_count, t.ttft_sum, t.ttft_count
    ));
}

/// A chat request's tokens: its prompt from the body's bytes (4 a token,
/// rounded up), its completion the lower of what it asks for (as vLLM
/// reads it: `max_completion_tokens`, else `max_tokens`) and the
/// configured answer length.
fn request_tokens(body_len: usize, request: &serde_json::Value, configured: u64) -> (u64, u64) {
    let prompt = (body_len as u64).div_ceil(4);
    let asked = request
        .as_object()
        .and_then(lanes::request_shape::output_ceiling);
    (prompt, asked.map_or(configured, |a| a.min(configured)))
}

/// The `usage` object of an answer.
fn usage(prompt: u64, completion: u64) -> serde_json::Value {
    serde_json::json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion
    })
}

/// Counts an answer's tokens and its time to the first token.
fn count_tokens(numbers: &Mutex<Numbers>, prompt: u64, completion: u64, ttft: Duration) {
    let mut n = numbers.lock().expect("not poisoned");
    let t = &mut n.tokens;
    t.prompt_tokens_total += prompt;
    t.generation_tokens_total += completion;
    if t.ttft_buckets.len() != TTFT_BUCKETS.len() + 1 {
        t.ttft_buckets = vec![0; TTFT_BUCKETS.len() + 1];
    }
    let secs = ttft.as_secs_f64();
    let i = TTFT_BUCKETS
        .iter()
        .position(|le| secs <= *le)
        .unwrap_or(TTFT_BUCKETS.len());
    t.ttft_buckets[i] += 1;
    t.ttft_sum += secs;
    t.ttft_count += 1;
}

/// The time a request's tokens take: prefill before the first token, and
/// decode per completion token.
fn token_time(
    prompt: u64,
    per_prompt_micros: u64,
    tokens: u64,
    per_token_micros: u64,
) -> (Duration, Duration) {
    (
        Duration::from_micros(prompt.saturating_mul(per_prompt_micros)),
        Duration::from_micros(tokens.saturating_mul(per_token_micros)),
    )
}

/// Waits `d`; no time at all waits for nothing. (A timer of zero still
/// waits for the runtime's next millisecond tick: two of them put about
/// 2.4 ms into every answer of a model configured to take none, and the
/// jitter of that tick into every latency measured through it.)
async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

async fn metrics(State(app): State<App>) -> Response {
    pause(Duration::from_millis(app.snapshot().metrics_delay_millis)).await;
    // Read after the delay, so a slow scrape sees the newest numbers.
    let n = app.snapshot();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics_text(&app.model, &n),
    )
        .into_response()
}

async fn health(State(app): State<App>) -> Response {
    if app.snapshot().ready {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

fn json(status: StatusCode, n: &Numbers) -> Response {
    let body = serde_json::to_string(n).expect("numbers serialize");
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn json_value(status: StatusCode, v: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

async fn get_control(State(app): State<App>) -> Response {
    json(StatusCode::OK, &app.snapshot())
}

async fn put_control(State(app): State<App>, body: Bytes) -> Response {
    let update: Update = match serde_json::from_slice(&body) {
        Ok(u) => u,
        Err(e) => {
            return (StatusCode::BAD_REQUEST, format!("bad control body: {e}\n")).into_response();
        }
    };
    for (name, v) in [
        ("numRequestsRunning", update.num_requests_running),
        ("numRequestsWaiting", update.num_requests_waiting),
        ("kvCacheUsagePerc", update.kv_cache_usage_perc),
    ] {
        if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
            return (
                StatusCode::BAD_REQUEST,
                format!("{name} must be a finite number >= 0\n"),
            )
                .into_response();
        }
    }
    let mut n = app.numbers.lock().expect("not poisoned");
    if let Some(v) = update.num_requests_running {
        n.num_requests_running = v;
    }
    if let Some(v) = update.num_requests_waiting {
        n.num_requests_waiting = v;
    }
    if let Some(v) = update.kv_cache_usage_perc {
        n.kv_cache_usage_perc = v;
    }
    if let Some(v) = update.request_success_total {
        n.request_success_total = v;
    }
    if let Some(v) = update.request_errors_total {
        n.request_errors_total = v;
    }
    if let Some(v) = update.ready {
        n.ready = v;
    }
    if let Some(v) = update.metrics_delay_millis {
        n.metrics_delay_millis = v;
    }
    if let Some(v) = update.service_millis {
        n.service_millis = v;
    }
    if let Some(v) = update.token_millis {
        n.token_millis = v;
    }
    if let Some(v) = update.completion_tokens {
        n.completion_tokens = v;
    }
    if let Some(v) = update.chat_status {
        n.chat_status = v;
    }
    if let Some(v) = update.chat_retry_after {
        n.chat_retry_after = v;
    }
    if let Some(v) = update.chat_in_flight_peak {
        n.chat_in_flight_peak = v;
    }
    if let Some(v) = update.chat_slots {
        n.chat_slots = v;
        app.slots.resize(v);
    }
    if let Some(v) = update.prefill_micros_per_token {
        n.prefill_micros_per_token = v;
    }
    if let Some(v) = update.decode_micros_per_token {
        n.decode_micros_per_token = v;
    }
    if let Some(v) = update.omit_usage {
        n.omit_usage = v;
    }
    let now = n.clone();
    drop(n);
    json(StatusCode::OK, &now)
}

/// Counts a chat request in progress; one dropped before `done` was set
/// (its client went away) counts as cancelled.
struct InProgress {
    numbers: Arc<Mutex<Numbers>>,
    done: bool,
    /// The chat slot it holds until it ends.
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Counts a chat request waiting for a slot while it waits.
struct Waiting(Arc<Mutex<Numbers>>);

impl Waiting {
    fn new(numbers: &Arc<Mutex<Numbers>>) -> Self {
        numbers.lock().expect("not poisoned").chat_waiting += 1;
        Self(numbers.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut n = self.0.lock().expect("not poisoned");
        n.chat_waiting = n.chat_waiting.saturating_sub(1);
    }
}

/// Waits for a free chat slot, in arrival order.
async fn take_slot(app: &App) -> tokio::sync::OwnedSemaphorePermit {
    let _waiting = Waiting::new(&app.numbers);
    app.slots
        .permits
        .clone()
        .acquire_owned()
        .await
        .expect("the slots are never closed")
}

impl Drop for InProgress {
    fn drop(&mut self) {
        let mut n = self.numbers.lock().expect("not poisoned");
        n.chat_in_flight = n.chat_in_flight.saturating_sub(1);
        if !self.done {
            n.chat_cancelled += 1;
        }
    }
}

/// The answer of a failing or overloaded upstream.
fn failure(status: u16, retry_after: Option<u64>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let err = serde_json::json!({"error": {"message": "the fake model was told to fail", "type": "server_error"}});
    let mut r = json_value(status, &err);
    if let Some(s) = retry_after {
        r.headers_mut()
            .insert(header::RETRY_AFTER, axum::http::HeaderValue::from(s));
    }
    r
}

/// What one chat request is served with, read under the lock.
struct Served {
    service: u64,
    token: u64,
    completion_tokens: u64,
    prefill_micros: u64,
    decode_micros: u64,
    failing: Option<(u16, Option<u64>)>,
    omit_usage: bool,
}

/// Counts a chat request and records what it carried (under the lock).
fn received(app: &App, headers: &axum::http::HeaderMap, request: &serde_json::Value) -> Served {
    let mut n = app.numbers.lock().expect("not poisoned");
    n.chat_requests += 1;
    n.chat_in_flight += 1;
    n.chat_in_flight_peak = n.chat_in_flight_peak.max(n.chat_in_flight);
    n.last_headers = headers
        .iter()
        .filter(|(k, _)| {
            let k = k.as_str();
            k.starts_with("x-lanekeeper-") || k == "authorization" || k == "x-request-id"
        })
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                v.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    n.last_messages = request["messages"].as_array().map_or(0, Vec::len);
    n.last_max_tokens = request.get("max_tokens").cloned();
    n.last_max_completion_tokens = request.get("max_completion_tokens").cloned();
    n.last_include_usage = request
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .cloned();
    Served {
        service: n.service_millis,
        token: n.token_millis,
        completion_tokens: n.completion_tokens,
        prefill_micros: n.prefill_micros_per_token,
        decode_micros: n.decode_micros_per_token,
        omit_usage: n.omit_usage,
        failing: (n.chat_status != 0 && n.chat_status != 200).then_some((
            n.chat_status,
            (n.chat_retry_after > 0).then_some(n.chat_retry_after),
        )),
    }
}

/// The request's own service time, `x-fake-service-millis` (a replay
/// gives each request the time its simulated pool took).
fn header_millis(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get("x-fake-service-millis")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

async fn chat(State(app): State<App>, headers: axum::http::HeaderMap, body: Bytes) -> Response {
    let started = tokio::time::Instant::now();
    let request: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            let err = serde_json::json!({"error": {"message": format!("bad JSON: {e}"), "type": "invalid_request_error"}});
            return json_value(StatusCode::BAD_REQUEST, &err);
        }
    };
    let stream = request["stream"].as_bool().unwrap_or(false);
    let include_usage = request["stream_options"]["include_usage"]
        .as_bool()
        .unwrap_or(false);
    let served = received(&app, &headers, &request);
    let (prompt, tokens) = request_tokens(body.len(), &request, served.completion_tokens);
    let (prefill, decode) = token_time(prompt, served.prefill_micros, tokens, served.decode_micros);
    let mut guard = InProgress {
        numbers: app.numbers.clone(),
        done: false,
        slot: None,
    };
    guard.slot = Some(take_slot(&app).await);
    let model = request["model"].as_str().unwrap_or(&app.model).to_owned();
    let service = header_millis(&headers).unwrap_or(served.service);
    pause(Duration::from_millis(service) + prefill).await;
    if let Some((status, retry_after)) = served.failing {
        guard.done = true;
        drop(guard);
        return failure(status, retry_after);
    }
    count_tokens(&app.numbers, prompt, tokens, started.elapsed());
    if !stream {
        pause(decode).await;
        guard.done = true;
        drop(guard);
        let content = "ok ".repeat(tokens as usize);
        let mut answer = serde_json::json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content.trim_end()}, "finish_reason": "stop"}],
            "usage": usage(prompt, tokens)
        });
        if served.omit_usage {
            answer.as_object_mut().expect("an object").remove("usage");
        }
        return json_value(StatusCode::OK, &answer);
    }
    let per_token =
        Duration::from_millis(served.token) + Duration::from_micros(served.decode_micros);
    let last = (include_usage && !served.omit_usage).then(|| usage(prompt, tokens));
    streamed(guard, model, tokens, per_token, last)
}

/// A streamed answer: `tokens` chunks `per_token` apart, the usage chunk
/// when asked for, then `[DONE]`.
fn streamed(
    guard: InProgress,
    model: String,
    tokens: u64,
    per_token: Duration,
    usage: Option<serde_json::Value>,
) -> Response {
    let events = futures::stream::unfold((0u64, Some(guard)), move |(i, guard)| {
        let model = model.clone();
        let usage = usage.clone();
        async move {
            let mut guard = guard?;
            if i > tokens {
                return None;
            }
            if i == tokens {
                guard.done = true;
                drop(guard);
                let mut text = String::new();
                if let Some(u) = usage {
                    let chunk = serde_json::json!({
                        "id": "chatcmpl-fake",
                        "object": "chat.completion.chunk",
                        "model": model,
                        "choices": [],
                        "usage": u
                    });
                    text.push_str(&format!("data: {chunk}\n\n"));
                }
                text.push_str("data: [DONE]\n\n");
                return Some((
                    Ok::<_, std::convert::Infallible>(Bytes::from(text)),
                    (i + 1, None),
                ));
            }
            pause(per_token).await;
            let chunk = serde_json::json!({
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "model": model,
                "choices": [{"index": 0, "delta": {"content": "ok "}, "finish_reason": null}]
            });
            Some((
                Ok(Bytes::from(format!("data: {chunk}\n\n"))),
                (i + 1, Some(guard)),
            ))
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(axum::body::Body::from_stream(events))
        .expect("valid response")
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let app = App {
        model: args.model_name,
        numbers: Arc::new(Mutex::new(Numbers {
            num_requests_running: args.running,
            num_requests_waiting: args.waiting,
            kv_cache_usage_perc: args.kv_cache,
            request_success_total: 0,
            request_errors_total: 0,
            ready: !args.not_ready,
            metrics_delay_millis: 0,
            service_millis: args.service_millis,
            token_millis: args.token_millis,
            completion_tokens: args.completion_tokens,
            chat_requests: 0,
            chat_in_flight: 0,
            chat_cancelled: 0,
            last_headers: Default::default(),
            last_messages: 0,
            chat_status: 0,
            chat_retry_after: 0,
            chat_in_flight_peak: 0,
            chat_slots: args.slots,
            chat_waiting: 0,
            prefill_micros_per_token: args.prefill_micros_per_token,
            decode_micros_per_token: args.decode_micros_per_token,
            tokens: TokenCounters::default(),
            last_max_tokens: None,
            last_max_completion_tokens: None,
            omit_usage: false,
            last_include_usage: None,
        })),
        slots: Arc::new(Slots::new(args.slots)),
    };
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/control", get(get_control).put(put_control))
        .route("/v1/chat/completions", axum::routing::post(chat))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown_signal())
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[tokio::test]
    async fn no_time_is_no_wait_and_any_time_waits_for_its_timer() {
        // Ready on its first poll: no timer, so no millisecond tick.
        assert!(pause(Duration::ZERO).now_or_never().is_some());
        assert!(pause(Duration::from_micros(1)).now_or_never().is_none());
    }
}
