//! Signals from PromQL queries against the Prometheus HTTP API.
//!
//! Each configured query is run twice per evaluation: the expression itself
//! and `timestamp(expression)`, which gives the time of the newest raw sample
//! behind each series (for a recorded or raw series; for a computed
//! expression Prometheus reports the evaluation time, so only its own
//! lookback window bounds staleness). A value becomes a signal only when it
//! is a finite, non-negative number whose sample is no older than
//! `stalenessSeconds`; anything else (stale, NaN, ±Inf, an empty vector, an
//! HTTP error, a timeout, a malformed body) makes that signal Unknown with a
//! reason, never zero. One exception: `gatewayGoodputWhileSaturated` has a
//! series only while the gateway is saturated, so its empty vector is no
//! evidence (nothing Unknown).
//!
//! The same code builds the controller's live snapshot
//! ([`PrometheusSource`]) and the `plan --prometheus` timeline
//! ([`signals_file`]), so both feed the engine identically.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, join_all};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, ResourceExt};
use serde::Deserialize;
use tokio::task::JoinHandle;

use super::{SignalSource, SourceInput, SourceOutput, Trigger, Triggers};
use crate::api::profile::{PROMETHEUS_CREDENTIAL_LABEL, PrometheusQueries, PrometheusSignals};
use crate::api::{CapacityProfile, LaneContract};
use crate::metrics::Metrics;
use crate::policy::{CAPACITY_SIGNAL, GOODPUT_SIGNAL, KV_CACHE_SIGNAL, World, bind, key};
use crate::snapshot::{BurnWindow, LaneSignals, SignalsFile, Snapshot};

/// The signal names, as in `spec.signals.prometheus.queries` and in
/// `status.unknownSignals`.
pub const SIGNALS: [&str; 18] = [
    CAPACITY_SIGNAL,
    GOODPUT_SIGNAL,
    "inFlight",
    "queueDepth",
    "p95LatencySeconds",
    "errorRatio",
    KV_CACHE_SIGNAL,
    "laneRequestsPerSecond",
    "laneRetryRequestsPerSecond",
    "podErrorRatio",
    "laneErrorBudgetRemainingPercent",
    "laneBurnRate5m",
    "laneBurnRate30m",
    "laneBurnRate1h",
    "laneBurnRate6h",
    "laneP95InputTokens",
    "laneP95OutputTokens",
    "laneP95CostUnitsPerRequest",
];

/// A per-lane value a query gives (a rate, a budget, a P95 of the
/// gateway's per-request histograms): which [`LaneSignals`] field it fills,
/// and the name it is Unknown under there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LaneRate {
    /// `laneRequestsPerSecond`: original requests, `requestsPerSecond`.
    Originals,
    /// `laneRetryRequestsPerSecond`: retries, `retryRequestsPerSecond`.
    Retries,
    /// `laneErrorBudgetRemainingPercent`: `errorBudgetRemainingPercent`.
    BudgetRemaining,
    /// `laneBurnRate5m`, ...: `burnRate.5m`, ...
    Burn(BurnWindow),
    /// `laneP95InputTokens`, `laneP95OutputTokens`,
    /// `laneP95CostUnitsPerRequest`: `p95InputTokens`, ...
    P95(PerRequest),
}

/// What a lane's per-request P95 measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PerRequest {
    InputTokens,
    OutputTokens,
    CostUnits,
}

impl LaneRate {
    /// The lane rate a query signal gives, if it is one.
    fn of(signal: &str) -> Option<Self> {
        match signal {
            "laneRequestsPerSecond" => Some(Self::Originals),
            "laneRetryRequestsPerSecond" => Some(Self::Retries),
            "laneErrorBudgetRemainingPercent" => Some(Self::BudgetRemaining),
            "laneBurnRate5m" => Some(Self::Burn(BurnWindow::M5)),
            "laneBurnRate30m" => Some(Self::Burn(BurnWindow::M30)),
            "laneBurnRate1h" => Some(Self::Burn(BurnWindow::H1)),
            "laneBurnRate6h" => Some(Self::Burn(BurnWindow::H6)),
            "laneP95InputTokens" => Some(Self::P95(PerRequest::InputTokens)),
            "laneP95OutputTokens" => Some(Self::P95(PerRequest::OutputTokens)),
            "laneP95CostUnitsPerRequest" => Some(Self::P95(PerRequest::CostUnits)),
            _ => None,
        }
    }

    /// The query signal (`spec.signals.prometheus.queries`, and the key of
    /// the profile's `unknown`).
    fn signal(self) -> &'static str {
        match self {
            Self::Originals => "laneRequestsPerSecond",
            Self::Retries => "laneRetryRequestsPerSecond",
            Self::BudgetRemaining => "laneErrorBudgetRemainingPercent",
            Self::Burn(BurnWindow::M5) => "laneBurnRate5m",
            Self::Burn(BurnWindow::M30) => "laneBurnRate30m",
            Self::Burn(BurnWindow::H1) => "laneBurnRate1h",
            Self::Burn(BurnWindow::H6) => "laneBurnRate6h",
            Self::P95(PerRequest::InputTokens) => "laneP95InputTokens",
            Self::P95(PerRequest::OutputTokens) => "laneP95OutputTokens",
            Self::P95(PerRequest::CostUnits) => "laneP95CostUnitsPerRequest",
        }
    }

    /// The lane signal it fills, and its key in [`LaneSignals::unknown`].
    fn lane_key(self) -> &'static str {
        match self {
            Self::Originals => "requestsPerSecond",
            Self::Retries => "retryRequestsPerSecond",
            Self::BudgetRemaining => "errorBudgetRemainingPercent",
            Self::Burn(BurnWindow::M5) => "burnRate.5m",
            Self::Burn(BurnWindow::M30) => "burnRate.30m",
            Self::Burn(BurnWindow::H1) => "burnRate.1h",
            Self::Burn(BurnWindow::H6) => "burnRate.6h",
            Self::P95(PerRequest::InputTokens) => "p95InputTokens",
            Self::P95(PerRequest::OutputTokens) => "p95OutputTokens",
            Self::P95(PerRequest::CostUnits) => "p95CostUnitsPerRequest",
        }
    }

    fn set(self, l: &mut LaneSignals, v: f64) {
        match self {
            Self::Originals => l.requests_per_second = Some(v),
            Self::Retries => l.retry_requests_per_second = Some(v),
            Self::BudgetRemaining => l.error_budget_remaining_percent = Some(v),
            Self::Burn(w) => l.burn_rate.set(w, Some(v)),
            Self::P95(PerRequest::InputTokens) => l.p95_input_tokens = Some(v),
            Self::P95(PerRequest::OutputTokens) => l.p95_output_tokens = Some(v),
            Self::P95(PerRequest::CostUnits) => l.p95_cost_units_per_request = Some(v),
        }
    }

    /// Whether the signal is about `lane`: the objective's signals only
    /// concern lanes with an objective, the per-request P95s lanes with a
    /// `cost` (the gateway measures priced requests only).
    fn applies(self, lane: &LaneContract) -> bool {
        match self {
            Self::Originals | Self::Retries => true,
            Self::BudgetRemaining | Self::Burn(_) => lane.spec.objective.is_some(),
            Self::P95(_) => lane.spec.cost.is_some(),
        }
    }

    /// Whether the signal is left out altogether (not Unknown) for a
    /// profile none of whose lanes it [`applies`](Self::applies) to.
    fn only_for_some(self) -> bool {
        matches!(self, Self::P95(_))
    }

    /// Whether a negative value is a value (an overspent budget), not a
    /// fault.
    fn signed(self) -> bool {
        self == Self::BudgetRemaining
    }
}

/// Why a query gave no usable answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    /// No answer within the timeout.
    Timeout,
    /// The server could not be reached.
    Unreachable(String),
    /// An HTTP status other than 200 (with Prometheus' error text if any).
    Http(u16, String),
    /// A body that is not a Prometheus API answer.
    Malformed(String),
    /// Prometheus answered with an error (bad query, ...).
    Query(String),
    /// Credentials or CA bundle could not be read.
    Auth(String),
    /// A successful answer that warns its data may be incomplete (a
    /// Thanos or Mimir partial response, a store unreachable): the first
    /// warning.
    Partial(String),
}

impl Problem {
    /// The short reason used as a metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Problem::Timeout => "timeout",
            Problem::Unreachable(_) => "unreachable",
            Problem::Http(..) => "http_error",
            Problem::Malformed(_) => "malformed",
            Problem::Query(_) => "query_error",
            Problem::Auth(_) => "auth",
            Problem::Partial(_) => "partial",
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Timeout => write!(f, "timeout: no answer from Prometheus in time"),
            Problem::Unreachable(e) => write!(f, "unreachable: {e}"),
            Problem::Http(code, e) if e.is_empty() => write!(f, "http_error: HTTP {code}"),
            Problem::Http(code, e) => write!(f, "http_error: HTTP {code}: {e}"),
            Problem::Malformed(e) => write!(f, "malformed: {e}"),
            Problem::Query(e) => write!(f, "query_error: {e}"),
            Problem::Auth(e) => write!(f, "auth: {e}"),
            Problem::Partial(e) => write!(f, "partial: {e}"),
        }
    }
}

/// When to evaluate: one instant, or every `step` seconds from `start` to
/// `end` (Unix seconds, inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// One evaluation.
    At(i64),
    /// A range of evaluations.
    Range {
        /// First evaluation.
        start: i64,
        /// Last evaluation (inclusive when on a step).
        end: i64,
        /// Seconds between evaluations (> 0).
        step: i64,
    },
}

impl Window {
    /// How many evaluation times there are, counted without listing them
    /// (saturating at `u64::MAX`): check it before [`Window::times`].
    pub fn steps(&self) -> u64 {
        match *self {
            Window::At(_) => 1,
            Window::Range { start, end, step } if start <= end => {
                (end.abs_diff(start) / step.max(1).unsigned_abs()).saturating_add(1)
            }
            Window::Range { .. } => 0,
        }
    }

    /// The evaluation times, [`Window::steps`] of them (none past
    /// `i64::MAX`).
    pub fn times(&self) -> Vec<i64> {
        match *self {
            Window::At(t) => vec![t],
            Window::Range { start, end, step } => {
                let step = step.max(1);
                (0_i64..)
                    .map_while(|i| i.checked_mul(step).and_then(|d| start.checked_add(d)))
                    .take_while(|t| *t <= end)
                    .collect()
            }
        }
    }
}

/// One series' value at one evaluation time.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// The series' labels (without `__name__`).
    pub labels: BTreeMap<String, String>,
    /// The value (may be NaN or infinite: checked later).
    pub value: f64,
    /// Time of the newest raw sample behind the value (Unix seconds).
    pub sampled_at: f64,
}

/// Series by evaluation time.
pub type Points = BTreeMap<i64, Vec<Point>>;

/// Raw values (labels, value) by evaluation time, without sample times.
pub type RawPoints = BTreeMap<i64, Vec<(BTreeMap<String, String>, f64)>>;

#[derive(Deserialize)]
struct ApiResponse {
    status: String,
    #[serde(default)]
    data: Option<ApiData>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    warnings: Vec<String>,
}

/// The largest answer read for an instant query (the controller's): a
/// vector of a few thousand pods is a few MiB.
pub const MAX_INSTANT_ANSWER_BYTES: usize = 16 << 20;

/// The largest answer read for a range query (`plan --prometheus`).
pub const MAX_RANGE_ANSWER_BYTES: usize = 256 << 20;

/// The first warning that says the data may be incomplete. Prometheus
/// before 2.52 put its PromQL notes ("PromQL info: …") among the warnings;
/// those say nothing about the data's completeness and are skipped.
fn partial_warning(warnings: &[String]) -> Option<&str> {
    warnings
        .iter()
        .map(String::as_str)
        .find(|w| !w.starts_with("PromQL info:"))
}

#[derive(Deserialize)]
#[serde(tag = "resultType", content = "result", rename_all = "lowercase")]
enum ApiData {
    Vector(Vec<VectorSample>),
    Matrix(Vec<MatrixSeries>),
    Scalar((f64, String)),
    String(serde::de::IgnoredAny),
}

#[derive(Deserialize)]
struct VectorSample {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

#[derive(Deserialize)]
struct MatrixSeries {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    values: Vec<(f64, String)>,
}

/// Why a [`PromClient`] or a [`signals_file`] timeline could not be set up
/// (problems of single queries are [`Problem`]s instead).
#[derive(Debug, thiserror::Error)]
pub enum PrometheusError {
    /// The CA bundle is not PEM.
    #[error("CA bundle: {0}")]
    CaBundle(#[source] reqwest::Error),
    /// The CA bundle holds no certificate.
    #[error("CA bundle: no certificate in it")]
    EmptyCaBundle,
    /// The HTTP client could not be built.
    #[error(transparent)]
    Client(reqwest::Error),
    /// The window has no evaluation time.
    #[error("the window has no evaluation time (is --from after --to?)")]
    EmptyWindow,
    /// More evaluation times than Prometheus returns points per series.
    #[error(
        "{steps} steps: Prometheus answers at most 11,000 points per series; use a larger --step"
    )]
    TooManySteps {
        /// Evaluation times in the window.
        steps: usize,
    },
}

/// A Prometheus HTTP API client (reqwest with rustls).
#[derive(Clone, Debug)]
pub struct PromClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl PromClient {
    /// A client for the API at `url`, with a per-request timeout, an optional
    /// bearer token and an optional PEM bundle of CAs to trust.
    pub fn new(
        url: &str,
        timeout: Duration,
        token: Option<String>,
        ca_pem: Option<&[u8]>,
    ) -> Result<Self, PrometheusError> {
        // A redirect is not followed: the bearer token and the answer stay
        // with the server the profile names.
        let mut b = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("lanekeeper/", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = ca_pem {
            let certs =
                reqwest::Certificate::from_pem_bundle(pem).map_err(PrometheusError::CaBundle)?;
            if certs.is_empty() {
                return Err(PrometheusError::EmptyCaBundle);
            }
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        let http = b.build().map_err(PrometheusError::Client)?;
        Ok(Self {
            http,
            base: url.trim_end_matches('/').to_owned(),
            token,
        })
    }

    async fn get(
        &self,
        path: &str,
        params: &[(&str, String)],
        limit: usize,
    ) -> Result<ApiData, Problem> {
        let mut req = self.http.get(format!("{}{path}", self.base)).query(params);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.map_err(classify)?;
        let code = resp.status();
        if code.is_redirection() {
            return Err(Problem::Http(
                code.as_u16(),
                "a redirect, not followed: give Prometheus' own URL".into(),
            ));
        }
        let body = read_answer(resp, limit).await?;
        let parsed: Result<ApiResponse, _> = serde_json::from_slice(&body);
        if !code.is_success() {
            let msg = parsed
                .ok()
                .and_then(|r| r.error)
                .unwrap_or_default()
                .chars()
                .take(200)
                .collect();
            if matches!(code.as_u16(), 401 | 403) {
                return Err(Problem::Auth(format!("HTTP {}: {msg}", code.as_u16())));
            }
            return Err(Problem::Http(code.as_u16(), msg));
        }
        let r =
            parsed.map_err(|e| Problem::Malformed(format!("not a Prometheus API answer: {e}")))?;
        if r.status != "success" {
            return Err(Problem::Query(format!(
                "{}: {}",
                r.error_type.unwrap_or_else(|| "error".into()),
                r.error.unwrap_or_default()
            )));
        }
        if let Some(w) = partial_warning(&r.warnings) {
            return Err(Problem::Partial(w.chars().take(200).collect()));
        }
        r.data
            .ok_or_else(|| Problem::Malformed("success without data".into()))
    }

    /// Runs `query` over the window; the values by evaluation time, without
    /// sample times (see [`PromClient::series`]).
    pub async fn raw(&self, query: &str, w: &Window) -> Result<RawPoints, Problem> {
        let data = match *w {
            Window::At(t) => {
                self.get(
                    "/api/v1/query",
                    &[("query", query.to_owned()), ("time", t.to_string())],
                    MAX_INSTANT_ANSWER_BYTES,
                )
                .await?
            }
            Window::Range { start, end, step } => {
                self.get(
                    "/api/v1/query_range",
                    &[
                        ("query", query.to_owned()),
                        ("start", start.to_string()),
                        ("end", end.to_string()),
                        ("step", step.max(1).to_string()),
                    ],
                    MAX_RANGE_ANSWER_BYTES,
                )
                .await?
            }
        };
        let num = |s: &str| {
            s.parse::<f64>()
                .map_err(|_| Problem::Malformed(format!("value {s:?} is not a number")))
        };
        let strip = |mut m: BTreeMap<String, String>| {
            m.remove("__name__");
            m
        };
        let mut out = RawPoints::new();
        match data {
            ApiData::Vector(v) => {
                for s in v {
                    let labels = strip(s.metric);
                    out.entry(s.value.0.round() as i64)
                        .or_default()
                        .push((labels, num(&s.value.1)?));
                }
            }
            ApiData::Matrix(m) => {
                for s in m {
                    let labels = strip(s.metric);
                    for (t, v) in s.values {
                        out.entry(t.round() as i64)
                            .or_default()
                            .push((labels.clone(), num(&v)?));
                    }
                }
            }
            ApiData::Scalar((t, v)) => {
                out.entry(t.round() as i64)
                    .or_default()
                    .push((BTreeMap::new(), num(&v)?));
            }
            ApiData::String(_) => {
                return Err(Problem::Malformed(
                    "the query returned a string, not a number".into(),
                ));
            }
        }
        Ok(out)
    }

    /// Runs `query` and `timestamp(query)` over the window and joins them:
    /// every value with the time of its newest sample.
    pub async fn series(&self, query: &str, w: &Window) -> Result<Points, Problem> {
        let ts_query = format!("timestamp({query})");
        let (values, stamps) = futures::join!(self.raw(query, w), self.raw(&ts_query, w));
        let values = values?;
        let stamps = stamps?;
        let mut out = Points::new();
        for (t, series) in values {
            let ts = stamps.get(&t);
            let pts = series
                .into_iter()
                .map(|(labels, value)| {
                    let sampled_at = ts
                        .and_then(|v| v.iter().find(|(l, _)| *l == labels))
                        .map(|(_, s)| *s)
                        .filter(|s| s.is_finite())
                        .unwrap_or(t as f64);
                    Point {
                        labels,
                        value,
                        sampled_at,
                    }
                })
                .collect();
            out.insert(t, pts);
        }
        Ok(out)
    }
}

/// The answer's body, at most `limit` bytes of it (malformed beyond: a
/// server the profile names cannot fill the controller's memory).
async fn read_answer(mut resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, Problem> {
    let too_large = || Problem::Malformed(format!("answer larger than {limit} bytes"));
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(classify)? {
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn classify(e: reqwest::Error) -> Problem {
    if e.is_timeout() {
        Problem::Timeout
    } else if e.is_connect() {
        Problem::Unreachable(root_cause(&e))
    } else if e.is_decode() || e.is_body() {
        Problem::Malformed(root_cause(&e))
    } else {
        Problem::Unreachable(root_cause(&e))
    }
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s = format!("{s}: {c}");
        cur = c.source();
    }
    s
}

/// One evaluation of a profile's queries: the output (values and unknown
/// reasons) plus the age of every known signal and the reason label of
/// every unknown one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueryEvaluation {
    /// Evaluation time (Unix seconds).
    pub at: i64,
    /// Signals and unknown reasons, as a source returns them.
    pub output: SourceOutput,
    /// Age in seconds of the newest sample of every known signal.
    pub ages: BTreeMap<String, f64>,
    /// Short reason (metric label) of every unknown signal.
    pub reasons: BTreeMap<String, String>,
}

/// What a value must pass to become a signal.
fn check(p: &Point, at: i64, staleness: i64) -> Result<f64, (&'static str, String)> {
    check_value(p, at, staleness, false)
}

/// [`check`], with negative values allowed when `signed`.
fn check_value(
    p: &Point,
    at: i64,
    staleness: i64,
    signed: bool,
) -> Result<f64, (&'static str, String)> {
    if p.value.is_nan() {
        return Err(("nan", "nan: the value is NaN".into()));
    }
    if p.value.is_infinite() {
        return Err(("inf", format!("inf: the value is {}", p.value)));
    }
    if p.value < 0.0 && !signed {
        return Err(("negative", format!("negative: the value is {}", p.value)));
    }
    let age = at as f64 - p.sampled_at;
    if age > staleness as f64 {
        return Err((
            "stale",
            format!(
                "stale: newest sample is {}s old (stalenessSeconds {staleness})",
                age.round()
            ),
        ));
    }
    Ok(p.value)
}

fn age(p: &Point, at: i64) -> f64 {
    (at as f64 - p.sampled_at).max(0.0)
}

fn set_unknown(e: &mut QueryEvaluation, signal: &str, reason: &str, text: String) {
    e.output.unknown.insert(signal.to_owned(), text);
    e.reasons.insert(signal.to_owned(), reason.to_owned());
}

fn list(names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(5).map(String::as_str).collect();
    if names.len() > shown.len() {
        format!("{}, ... ({} in all)", shown.join(", "), names.len())
    } else {
        shown.join(", ")
    }
}

/// Evaluates a profile's queries over a window with the given client.
///
/// `lanes` are the profile's lanes (their names are matched against the
/// `laneLabel` values); `pods`, when given, limits per-pod evidence to those
/// pods (the controller passes the pool's pods; `plan` passes none and keeps
/// every pod the query names).
pub async fn evaluate(
    client: &PromClient,
    cfg: &PrometheusSignals,
    lanes: &[&LaneContract],
    pods: Option<&[String]>,
    window: &Window,
) -> Vec<QueryEvaluation> {
    let q = &cfg.queries;
    let configured = configured(q);
    let results: Vec<Result<Points, Problem>> = join_all(
        configured
            .iter()
            .map(|(_, query)| client.series(query, window)),
    )
    .await;
    let times = window.times();
    let staleness = cfg.staleness_seconds;
    let mut evals = Vec::with_capacity(times.len());
    for &at in &times {
        let mut e = QueryEvaluation {
            at,
            ..Default::default()
        };
        for ((signal, _), res) in configured.iter().zip(&results) {
            let signal = *signal;
            if LaneRate::of(signal)
                .is_some_and(|r| r.only_for_some() && !lanes.iter().any(|l| r.applies(l)))
            {
                // No lane it measures (no lane with a cost): nothing to know.
                continue;
            }
            let pts = match res {
                Err(p) => {
                    set_unknown(&mut e, signal, p.reason(), p.to_string());
                    lanes_unknown(&mut e, lanes, signal, &p.to_string());
                    continue;
                }
                Ok(by_time) => by_time.get(&at).map(Vec::as_slice).unwrap_or_default(),
            };
            if pts.is_empty() && signal == GOODPUT_SIGNAL {
                // No series: the gateway is not saturated, so there is no
                // evidence (and nothing Unknown).
                continue;
            }
            if pts.is_empty() {
                let why = "empty: the query returned no series";
                set_unknown(&mut e, signal, "empty", why.into());
                lanes_unknown(&mut e, lanes, signal, why);
                continue;
            }
            if let Some(rate) = LaneRate::of(signal) {
                lane_values(&mut e, cfg, lanes, pts, at, rate);
                continue;
            }
            match signal {
                "podErrorRatio" => pod_values(&mut e, cfg, pods, pts, at),
                _ => {
                    if pts.len() > 1 {
                        set_unknown(
                            &mut e,
                            signal,
                            "ambiguous",
                            format!(
                                "ambiguous: the query returned {} series; aggregate it to one",
                                pts.len()
                            ),
                        );
                        continue;
                    }
                    match check(&pts[0], at, staleness) {
                        Ok(v) => {
                            let p = &mut e.output.profile;
                            match signal {
                                CAPACITY_SIGNAL => p.available_units_per_second = Some(v),
                                GOODPUT_SIGNAL => p.gateway_goodput_while_saturated = Some(v),
                                "inFlight" => p.in_flight = Some(v),
                                "queueDepth" => p.queue_depth = Some(v),
                                "p95LatencySeconds" => p.p95_latency_seconds = Some(v),
                                KV_CACHE_SIGNAL => p.kv_cache_usage_percent = Some(v),
                                _ => p.error_ratio = Some(v),
                            }
                            e.ages.insert(signal.to_owned(), age(&pts[0], at));
                        }
                        Err((reason, text)) => set_unknown(&mut e, signal, reason, text),
                    }
                }
            }
        }
        evals.push(e);
    }
    evals
}

/// Marks every lane's rate of a failed lane query (`signal`) Unknown under
/// the lane's own name for it (`requestsPerSecond`, `retryRequestsPerSecond`):
/// a configured rate source that fails is Unknown, never silently absent.
/// Does nothing for other signals.
fn lanes_unknown(e: &mut QueryEvaluation, lanes: &[&LaneContract], signal: &str, why: &str) {
    let Some(rate) = LaneRate::of(signal) else {
        return;
    };
    for lane in lanes.iter().filter(|l| rate.applies(l)) {
        let k = key(&lane.namespace().unwrap_or_default(), &lane.name_any());
        e.output
            .lanes
            .entry(k)
            .or_default()
            .unknown
            .insert(rate.lane_key().to_owned(), format!("{signal}: {why}"));
    }
}

/// A vector's series by the value of `label` (series without it left
/// out), each with how many series have that value.
fn series_by<'a>(pts: &'a [Point], label: &str) -> BTreeMap<&'a str, (&'a Point, usize)> {
    let mut by: BTreeMap<&str, (&Point, usize)> = BTreeMap::new();
    for p in pts {
        if let Some(v) = p.labels.get(label) {
            by.entry(v).or_insert((p, 0)).1 += 1;
        }
    }
    by
}

/// Why `n` series for one `label=value` are no evidence.
fn ambiguous(n: usize, label: &str, value: &str, per: &str) -> String {
    format!("ambiguous: {n} series with {label}={value}; aggregate them to one per {per}")
}

/// A lane query's vector: each lane's rate from the series whose `laneLabel`
/// is its name; a lane without a usable series, or with more than one (which
/// would be the right one?), is Unknown (in the lane's `unknown`, and named
/// under the query signal in the profile's).
fn lane_values(
    e: &mut QueryEvaluation,
    cfg: &PrometheusSignals,
    lanes: &[&LaneContract],
    pts: &[Point],
    at: i64,
    rate: LaneRate,
) {
    let signal = rate.signal();
    let by_lane = series_by(pts, &cfg.lane_label);
    let missing_why = || format!("missing: no series with {}=<lane name>", cfg.lane_label);
    let mut missing = Vec::new();
    let mut worst: Option<(&'static str, String)> = None;
    let mut oldest: Option<f64> = None;
    for lane in lanes.iter().filter(|l| rate.applies(l)) {
        let name = lane.name_any();
        let k = key(&lane.namespace().unwrap_or_default(), &name);
        let failed = match by_lane.get(name.as_str()) {
            None => missing_why(),
            Some((_, n)) if *n > 1 => {
                let why = ambiguous(*n, &cfg.lane_label, &name, "lane");
                worst.get_or_insert(("ambiguous", why.clone()));
                why
            }
            Some((p, _)) => match check_value(p, at, cfg.staleness_seconds, rate.signed()) {
                Ok(v) => {
                    rate.set(e.output.lanes.entry(k).or_default(), v);
                    let a = age(p, at);
                    oldest = Some(oldest.map_or(a, |o: f64| o.max(a)));
                    continue;
                }
                Err((reason, why)) => {
                    worst.get_or_insert((reason, why.clone()));
                    why
                }
            },
        };
        e.output
            .lanes
            .entry(k)
            .or_default()
            .unknown
            .insert(rate.lane_key().to_owned(), format!("{signal}: {failed}"));
        missing.push(name);
    }
    if let Some(a) = oldest {
        e.ages.insert(signal.into(), a);
    }
    if !missing.is_empty() {
        let (reason, why) = worst.unwrap_or(("missing", missing_why()));
        set_unknown(
            e,
            signal,
            reason,
            format!("{why}; Unknown for lanes: {}", list(&missing)),
        );
    }
}

/// The pod query's vector: each of the pool's pods' error ratio from the
/// series whose `podLabel` is its name. A pod without a series has no
/// evidence (no drain decision either way); one with a bad value or more
/// than one series is named under `podErrorRatio` in the profile's
/// `unknown`.
fn pod_values(
    e: &mut QueryEvaluation,
    cfg: &PrometheusSignals,
    pods: Option<&[String]>,
    pts: &[Point],
    at: i64,
) {
    let mut bad = Vec::new();
    let mut worst: Option<(&'static str, String)> = None;
    let mut oldest: Option<f64> = None;
    for (pod, (p, n)) in series_by(pts, &cfg.pod_label) {
        if pods.is_some_and(|known| !known.iter().any(|k| k == pod)) {
            continue;
        }
        // Several series for one pod: which would be its error ratio?
        let checked = if n > 1 {
            Err(("ambiguous", ambiguous(n, &cfg.pod_label, pod, "pod")))
        } else {
            check(p, at, cfg.staleness_seconds)
        };
        match checked {
            Ok(v) => {
                e.output
                    .profile
                    .pods
                    .entry(pod.to_owned())
                    .or_default()
                    .error_ratio = Some(v);
                let a = age(p, at);
                oldest = Some(oldest.map_or(a, |o: f64| o.max(a)));
            }
            Err(r) => {
                bad.push(pod.to_owned());
                worst.get_or_insert(r);
            }
        }
    }
    if let Some(a) = oldest {
        e.ages.insert("podErrorRatio".into(), a);
    }
    if e.output.profile.pods.is_empty() && bad.is_empty() {
        set_unknown(
            e,
            "podErrorRatio",
            "missing",
            format!(
                "missing: no series with {}=<pod name> for the pool's pods",
                cfg.pod_label
            ),
        );
    } else if let Some((reason, why)) = worst {
        set_unknown(
            e,
            "podErrorRatio",
            reason,
            format!("{why}; no evidence for pods: {}", list(&bad)),
        );
    }
}

/// The configured queries, in the order of [`SIGNALS`].
pub fn configured(q: &PrometheusQueries) -> Vec<(&'static str, &str)> {
    [
        &q.available_units_per_second,
        &q.gateway_goodput_while_saturated,
        &q.in_flight,
        &q.queue_depth,
        &q.p95_latency_seconds,
        &q.error_ratio,
        &q.kv_cache_usage_percent,
        &q.lane_requests_per_second,
        &q.lane_retry_requests_per_second,
        &q.pod_error_ratio,
        &q.lane_error_budget_remaining_percent,
        &q.lane_burn_rate_5m,
        &q.lane_burn_rate_30m,
        &q.lane_burn_rate_1h,
        &q.lane_burn_rate_6h,
        &q.lane_p95_input_tokens,
        &q.lane_p95_output_tokens,
        &q.lane_p95_cost_units_per_request,
    ]
    .into_iter()
    .zip(SIGNALS)
    .filter_map(|(q, s)| q.as_deref().map(|q| (s, q)))
    .collect()
}

/// The controller's Prometheus source. Profiles without
/// `spec.signals.prometheus` (or without queries) get nothing from it.
///
/// Each profile with queries gets a poller: a task that evaluates the
/// queries every `intervalSeconds` and, when the answer differs from the
/// last one, triggers the profile's reconcile at once. A reconcile takes the
/// poller's latest answer; it queries itself only when there is none yet or
/// the latest is older than an interval plus the query timeout (the poller
/// is stuck), so a reconcile never waits on Prometheus while the poller
/// keeps up. Credentials (bearer token, CA bundle) are read from the API
/// server when a poller starts and again every [`CREDENTIALS_TTL`], or at
/// once after Prometheus answers 401 or 403; a Secret only when it carries
/// [`PROMETHEUS_CREDENTIAL_LABEL`].
pub struct PrometheusSource {
    inner: Arc<Inner>,
}

/// How long credentials read from Secrets and ConfigMaps are reused.
pub const CREDENTIALS_TTL: Duration = Duration::from_secs(300);

/// Namespace, object name, key, and whether the object is a Secret.
type CredentialKey = (String, String, String, bool);

struct Inner {
    kube: Option<kube::Client>,
    metrics: Option<Metrics>,
    clients: Mutex<HashMap<String, PromClient>>,
    credentials: Mutex<HashMap<CredentialKey, (Instant, Vec<u8>)>>,
    triggers: Triggers,
    pollers: Mutex<HashMap<String, Poller>>,
}

/// What a poller evaluates: owned copies of what the last reconcile saw.
#[derive(Clone)]
struct PollInput {
    profile: CapacityProfile,
    lanes: Vec<LaneContract>,
    pods: Option<Vec<String>>,
}

struct Poller {
    /// The Prometheus spec it was started for (restarted when it changes).
    spec: PrometheusSignals,
    input: Arc<Mutex<PollInput>>,
    latest: Arc<Mutex<Option<(Instant, SourceOutput)>>>,
    task: JoinHandle<()>,
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PrometheusSource {
    /// A source that reads bearer tokens and CA bundles with `kube` and
    /// reports ages and errors to `metrics`.
    pub fn new(kube: Option<kube::Client>, metrics: Option<Metrics>) -> Self {
        Self {
            inner: Arc::new(Inner {
                kube,
                metrics,
                clients: Mutex::new(HashMap::new()),
                credentials: Mutex::new(HashMap::new()),
                triggers: Triggers::default(),
                pollers: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// One profile's signals: the poller's latest answer, or a query now
    /// when there is no fresh one. Starts (or restarts) the profile's
    /// poller.
    pub async fn observe(&self, input: &SourceInput<'_>) -> SourceOutput {
        let profile = input.profile;
        let pkey = key(
            &profile.namespace().unwrap_or_default(),
            &profile.name_any(),
        );
        let Some(cfg) = profile
            .spec
            .signals
            .as_ref()
            .and_then(|s| s.prometheus.as_ref())
            .filter(|c| !c.queries.is_empty())
        else {
            self.inner
                .pollers
                .lock()
                .expect("not poisoned")
                .remove(&pkey);
            return SourceOutput::default();
        };
        let poll_input = PollInput {
            profile: profile.clone(),
            lanes: input.lanes.iter().map(|l| (*l).clone()).collect(),
            pods: input
                .pods
                .map(|p| p.iter().map(|p| p.name.clone()).collect()),
        };
        let fresh_for =
            Duration::from_secs((cfg.interval_seconds + cfg.timeout_seconds).max(1) as u64 + 1);
        let latest = {
            let mut pollers = self.inner.pollers.lock().expect("not poisoned");
            if pollers.get(&pkey).is_some_and(|p| &p.spec != cfg) {
                pollers.remove(&pkey);
            }
            let poller = pollers
                .entry(pkey.clone())
                .or_insert_with(|| Inner::start(&self.inner, cfg.clone(), poll_input.clone()));
            *poller.input.lock().expect("not poisoned") = poll_input;
            poller.latest.clone()
        };
        if let Some((at, out)) = latest.lock().expect("not poisoned").as_ref()
            && at.elapsed() <= fresh_for
        {
            return out.clone();
        }
        let out = self
            .inner
            .evaluate_now(
                profile,
                cfg,
                input.lanes,
                input
                    .pods
                    .map(|p| p.iter().map(|p| p.name.clone()).collect::<Vec<_>>())
                    .as_deref(),
                input.now,
            )
            .await;
        *latest.lock().expect("not poisoned") = Some((Instant::now(), out.clone()));
        out
    }
}

impl Inner {
    /// Starts a profile's poller.
    fn start(this: &Arc<Inner>, spec: PrometheusSignals, input: PollInput) -> Poller {
        let input = Arc::new(Mutex::new(input));
        let latest: Arc<Mutex<Option<(Instant, SourceOutput)>>> = Arc::new(Mutex::new(None));
        let every = Duration::from_secs(spec.interval_seconds.max(1) as u64);
        let task = tokio::spawn({
            let (this, input, latest) = (Arc::downgrade(this), input.clone(), latest.clone());
            let spec = spec.clone();
            async move {
                loop {
                    tokio::time::sleep(every).await;
                    let Some(inner) = this.upgrade() else { return };
                    let i = input.lock().expect("not poisoned").clone();
                    let lanes: Vec<&LaneContract> = i.lanes.iter().collect();
                    let out = inner
                        .evaluate_now(&i.profile, &spec, &lanes, i.pods.as_deref(), unix_now())
                        .await;
                    let changed = {
                        let mut l = latest.lock().expect("not poisoned");
                        let changed = l.as_ref().is_none_or(|(_, prev)| *prev != out);
                        *l = Some((Instant::now(), out));
                        changed
                    };
                    if changed {
                        inner.trigger(&i.profile);
                    }
                }
            }
        });
        Poller {
            spec,
            input,
            latest,
            task,
        }
    }

    /// Sends the profile to the controller of its scope.
    fn trigger(&self, profile: &CapacityProfile) {
        let ns = profile.namespace().unwrap_or_default();
        self.triggers.send(&ns, &profile.name_any());
    }

    /// Evaluates the queries now and records ages and errors.
    async fn evaluate_now(
        &self,
        profile: &CapacityProfile,
        cfg: &PrometheusSignals,
        lanes: &[&LaneContract],
        pods: Option<&[String]>,
        now: i64,
    ) -> SourceOutput {
        let ns = profile.namespace().unwrap_or_default();
        let pkey = key(&ns, &profile.name_any());
        let eval = match self.client_for(&ns, cfg).await {
            Ok(c) => {
                let e = evaluate(&c, cfg, lanes, pods, &Window::At(now))
                    .await
                    .pop()
                    .unwrap_or_default();
                if e.reasons.values().any(|r| *r == "auth") {
                    // Credentials may have been rotated: read them again.
                    self.credentials
                        .lock()
                        .expect("not poisoned")
                        .retain(|(n, ..), _| *n != ns);
                }
                e
            }
            Err(p) => {
                let mut e = QueryEvaluation::default();
                for (s, _) in configured(&cfg.queries) {
                    set_unknown(&mut e, s, p.reason(), p.to_string());
                    lanes_unknown(&mut e, lanes, s, &p.to_string());
                }
                e
            }
        };
        if let Some(m) = &self.metrics {
            record(m, &pkey, &eval);
        }
        eval.output
    }

    async fn client_for(&self, ns: &str, cfg: &PrometheusSignals) -> Result<PromClient, Problem> {
        let token = match &cfg.bearer_token_secret_ref {
            Some(r) => Some(
                String::from_utf8(self.credential(ns, &r.name, &r.key, true).await?)
                    .map_err(|_| {
                        Problem::Auth(format!(
                            "Secret {}/{}: key {} is not UTF-8",
                            ns, r.name, r.key
                        ))
                    })?
                    .trim()
                    .to_owned(),
            ),
            None => None,
        };
        let ca = match &cfg.ca_bundle {
            Some(b) => match (&b.config_map_key_ref, &b.secret_key_ref) {
                (Some(r), _) => Some(self.credential(ns, &r.name, &r.key, false).await?),
                (None, Some(r)) => Some(self.credential(ns, &r.name, &r.key, true).await?),
                (None, None) => None,
            },
            None => None,
        };
        let fp = format!("{}|{}|{:?}|{:?}", cfg.url, cfg.timeout_seconds, token, ca);
        if let Some(c) = self.clients.lock().expect("not poisoned").get(&fp) {
            return Ok(c.clone());
        }
        let c = PromClient::new(
            &cfg.url,
            Duration::from_secs(cfg.timeout_seconds.max(1) as u64),
            token,
            ca.as_deref(),
        )
        .map_err(|e| Problem::Auth(e.to_string()))?;
        let mut cache = self.clients.lock().expect("not poisoned");
        if cache.len() > 256 {
            cache.clear();
        }
        cache.insert(fp, c.clone());
        Ok(c)
    }

    /// A key of a Secret (`secret`) or ConfigMap, reused for
    /// [`CREDENTIALS_TTL`].
    async fn credential(
        &self,
        ns: &str,
        name: &str,
        key: &str,
        secret: bool,
    ) -> Result<Vec<u8>, Problem> {
        let k = (ns.to_owned(), name.to_owned(), key.to_owned(), secret);
        if let Some((at, v)) = self.credentials.lock().expect("not poisoned").get(&k)
            && at.elapsed() < CREDENTIALS_TTL
        {
            return Ok(v.clone());
        }
        let v = if secret {
            self.secret_key(ns, name, key).await?
        } else {
            self.config_map_key(ns, name, key).await?
        };
        self.credentials
            .lock()
            .expect("not poisoned")
            .insert(k, (Instant::now(), v.clone()));
        Ok(v)
    }

    /// A key of a Secret that opted in with [`PROMETHEUS_CREDENTIAL_LABEL`].
    /// A missing Secret, one without the label and a missing key are one
    /// refusal with one text, so a profile learns nothing about Secrets it
    /// may not use.
    async fn secret_key(&self, ns: &str, name: &str, key: &str) -> Result<Vec<u8>, Problem> {
        let kube = self
            .kube
            .clone()
            .ok_or_else(|| Problem::Auth("no Kubernetes client to read Secrets".into()))?;
        let s = Api::<Secret>::namespaced(kube, ns)
            .get_opt(name)
            .await
            .map_err(|e| Problem::Auth(format!("Secret {ns}/{name}: {e}")))?;
        s.and_then(|s| opted_in_value(s, key)).ok_or_else(|| {
            Problem::Auth(format!(
                "Secret {ns}/{name} key {key}: not found, or the Secret is not labeled \
                 {PROMETHEUS_CREDENTIAL_LABEL}=true (only Secrets with that label are used)"
            ))
        })
    }

    async fn config_map_key(&self, ns: &str, name: &str, key: &str) -> Result<Vec<u8>, Problem> {
        let kube = self
            .kube
            .clone()
            .ok_or_else(|| Problem::Auth("no Kubernetes client to read ConfigMaps".into()))?;
        let c = Api::<ConfigMap>::namespaced(kube, ns)
            .get(name)
            .await
            .map_err(|e| Problem::Auth(format!("ConfigMap {ns}/{name}: {e}")))?;
        c.data
            .and_then(|mut d| d.remove(key))
            .map(String::into_bytes)
            .ok_or_else(|| Problem::Auth(format!("ConfigMap {ns}/{name} has no key {key}")))
    }
}

/// The value of `key`, if the Secret carries [`PROMETHEUS_CREDENTIAL_LABEL`]
/// set to `"true"` (the label is checked before the data is looked at).
fn opted_in_value(secret: Secret, key: &str) -> Option<Vec<u8>> {
    let opted_in = secret
        .labels()
        .get(PROMETHEUS_CREDENTIAL_LABEL)
        .is_some_and(|v| v == "true");
    if !opted_in {
        return None;
    }
    secret.data?.remove(key).map(|b| b.0)
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Reports an evaluation's ages and unknown reasons as metrics.
pub fn record(m: &Metrics, profile: &str, e: &QueryEvaluation) {
    for (s, a) in &e.ages {
        m.signal_age.with_label_values(&[profile, s]).set(*a);
    }
    for (s, r) in &e.reasons {
        if !e.ages.contains_key(s) {
            let _ = m.signal_age.remove_label_values(&[profile, s]);
        }
        m.signal_errors.with_label_values(&[profile, s, r]).inc();
    }
}

impl SignalSource for PrometheusSource {
    fn collect<'a>(&'a self, input: &'a SourceInput<'a>) -> BoxFuture<'a, SourceOutput> {
        Box::pin(self.observe(input))
    }

    fn attach(&self, scope: &Option<String>, trigger: Trigger) {
        self.inner.triggers.attach(scope, trigger);
    }

    fn detach(&self, scope: &Option<String>) {
        self.inner.triggers.detach(scope);
        self.inner
            .pollers
            .lock()
            .expect("not poisoned")
            .retain(|k, _| {
                scope
                    .as_ref()
                    .is_some_and(|ns| !k.starts_with(&format!("{ns}/")))
            });
    }

    fn forget(&self, namespace: &str, name: &str) {
        self.inner
            .pollers
            .lock()
            .expect("not poisoned")
            .remove(&key(namespace, name));
    }
}

/// The `plan --prometheus` timeline: for every profile with Prometheus
/// queries, its signals at every time of the window; lanes' rates from
/// `laneRequestsPerSecond` (originals) and `laneRetryRequestsPerSecond`
/// (retries). `url` overrides the profiles' own URLs (and lets
/// profiles with queries but no reachable URL be evaluated).
///
/// Profiles without queries have no entry in any step (their telemetry is
/// Unknown); the returned notes say so, and name every signal that was
/// Unknown with its first reason and how many steps it affected.
pub async fn signals_file(
    world: &World,
    url: Option<&str>,
    timeout: Duration,
    window: &Window,
) -> Result<(SignalsFile, Vec<String>), PrometheusError> {
    match window.steps() {
        0 => return Err(PrometheusError::EmptyWindow),
        n if n > 11_000 => {
            let steps = usize::try_from(n).unwrap_or(usize::MAX);
            return Err(PrometheusError::TooManySteps { steps });
        }
        _ => {}
    }
    let times = window.times();
    let mut steps: Vec<Snapshot> = times
        .iter()
        .map(|&at| Snapshot {
            at,
            ..Default::default()
        })
        .collect();
    let mut notes = Vec::new();
    let mut clients: HashMap<String, PromClient> = HashMap::new();
    for binding in bind(world).bindings {
        let profile = binding.profile;
        let ns = profile.namespace().unwrap_or_default();
        let pkey = key(&ns, &profile.name_any());
        let Some(cfg) = prom_config(profile, url) else {
            notes.push(format!(
                "{pkey}: no spec.signals.prometheus.queries: telemetry is Unknown in every step"
            ));
            continue;
        };
        let c = match clients.get(&cfg.url) {
            Some(c) => c.clone(),
            None => {
                let c = PromClient::new(&cfg.url, timeout, None, None)?;
                clients.insert(cfg.url.clone(), c.clone());
                c
            }
        };
        let evals = evaluate(&c, &cfg, &binding.lanes, None, window).await;
        let mut unknown: BTreeMap<String, (usize, String)> = BTreeMap::new();
        for (snap, e) in steps.iter_mut().zip(evals) {
            for (s, why) in &e.output.unknown {
                unknown.entry(s.clone()).or_insert((0, why.clone())).0 += 1;
            }
            snap.profiles.insert(pkey.clone(), e.output.profile);
            snap.lanes.extend(e.output.lanes);
        }
        for (s, (n, why)) in unknown {
            notes.push(format!(
                "{pkey}: {s} Unknown in {n} of {} steps (first: {why})",
                times.len()
            ));
        }
    }
    Ok((SignalsFile { steps }, notes))
}

/// The Prometheus settings `plan` uses for a profile: its own, with `url`
/// overriding the URL. A profile without queries gets the conventional
/// recording-rule queries (see [`conventional_queries`]) when `plan` was given
/// a URL; `None` when there is neither.
fn prom_config(profile: &CapacityProfile, url: Option<&str>) -> Option<PrometheusSignals> {
    let own = profile
        .spec
        .signals
        .as_ref()
        .and_then(|s| s.prometheus.clone());
    let mut cfg = match own {
        Some(c) if !c.queries.is_empty() => c,
        Some(mut c) => {
            url?;
            c.queries = conventional_queries(profile);
            c
        }
        None => {
            let u = url?;
            let mut c: PrometheusSignals =
                serde_json::from_value(serde_json::json!({"url": u})).ok()?;
            c.queries = conventional_queries(profile);
            c
        }
    };
    if let Some(u) = url {
        cfg.url = u.to_owned();
    }
    Some(cfg)
}

/// A PromQL regex (fully anchored, as `=~` is) of the names the workload
/// `kind`/`name` gives its pods: a Deployment's `<name>-<template hash>-<5
/// characters>`, a StatefulSet's `<name>-<ordinal>`, any other kind's
/// `<name>-…`. `<name>-.*` alone would take a sibling's pods too
/// (`vllm-canary-…` for `vllm`). The name's dots are escaped (in a PromQL
/// string, a backslash is written twice).
pub fn pods_of(kind: &str, name: &str) -> String {
    let name = name.replace('.', "\\\\.");
    match kind {
        "Deployment" => format!("{name}-[a-z0-9]{{1,10}}-[a-z0-9]{{5}}"),
        "StatefulSet" => format!("{name}-[0-9]+"),
        _ => format!("{name}-.*"),
    }
}

/// The queries of the recording rules docs/telemetry.md recommends, for a
/// profile that configures none: `pool:*{namespace,profile}` for the pool
/// signals, `lane:requests_per_second{namespace}` (originals) and
/// `lane:retry_requests_per_second{namespace}` (retries) by `lane`,
/// `lane:p95_input_tokens`, `lane:p95_output_tokens` and
/// `lane:p95_cost_units_per_request` `{namespace}` by `lane` (read by the
/// lanes with a `cost` only), and `pod:error_ratio{namespace}` by `pod`
/// restricted to the scale target's pods ([`pods_of`]).
pub fn conventional_queries(profile: &CapacityProfile) -> PrometheusQueries {
    let ns = profile.namespace().unwrap_or_default();
    let name = profile.name_any();
    let pool = |metric: &str| {
        Some(format!(
            "pool:{metric}{{namespace=\"{ns}\",profile=\"{name}\"}}"
        ))
    };
    let target = &profile.spec.pool.scale_target_ref.name;
    PrometheusQueries {
        available_units_per_second: pool("available_units_per_second"),
        // The gateway's evidence is configured, never assumed (a pool
        // without lanekeeper's gateway has none).
        gateway_goodput_while_saturated: None,
        in_flight: pool("in_flight"),
        queue_depth: pool("queue_depth"),
        p95_latency_seconds: pool("p95_latency_seconds"),
        error_ratio: pool("error_ratio"),
        // KV-cache usage is configured (or scraped), never assumed: a pool
        // that is not vLLM may have none.
        kv_cache_usage_percent: None,
        lane_requests_per_second: Some(format!("lane:requests_per_second{{namespace=\"{ns}\"}}")),
        lane_retry_requests_per_second: Some(format!(
            "lane:retry_requests_per_second{{namespace=\"{ns}\"}}"
        )),
        pod_error_ratio: Some(format!(
            "pod:error_ratio{{namespace=\"{ns}\",pod=~\"{}\"}}",
            pods_of(&profile.spec.pool.scale_target_ref.kind, target)
        )),
        // The objectives' signals are configured, never assumed.
        lane_error_budget_remaining_percent: None,
        lane_burn_rate_5m: None,
        lane_burn_rate_30m: None,
        lane_burn_rate_1h: None,
        lane_burn_rate_6h: None,
        // The P95s per request of the priced lanes, as recorded by the
        // rules docs/telemetry.md recommends.
        lane_p95_input_tokens: Some(format!("lane:p95_input_tokens{{namespace=\"{ns}\"}}")),
        lane_p95_output_tokens: Some(format!("lane:p95_output_tokens{{namespace=\"{ns}\"}}")),
        lane_p95_cost_units_per_request: Some(format!(
            "lane:p95_cost_units_per_request{{namespace=\"{ns}\"}}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::Window;

    fn range(start: i64, end: i64, step: i64) -> Window {
        Window::Range { start, end, step }
    }

    #[test]
    fn a_window_counts_its_steps_without_listing_them_and_never_overflows() {
        for (w, times) in [
            (Window::At(7), vec![7]),
            (range(0, 120, 60), vec![0, 60, 120]),
            (range(0, 119, 60), vec![0, 60]),
            (range(10, 10, 0), vec![10]),
            (range(0, 2, -5), vec![0, 1, 2]),
            (range(5, 4, 1), vec![]),
            (range(i64::MAX - 807, i64::MAX, 1000), vec![i64::MAX - 807]),
            (
                range(i64::MAX - 1, i64::MAX, 1),
                vec![i64::MAX - 1, i64::MAX],
            ),
            (range(i64::MIN, i64::MIN + 1, i64::MAX), vec![i64::MIN]),
        ] {
            assert_eq!(w.times(), times, "{w:?}");
            assert_eq!(w.steps(), times.len() as u64, "{w:?}");
        }
        // Counted, not listed: plan refuses these by the count.
        assert_eq!(range(0, 4_000_000_000, 1).steps(), 4_000_000_001);
        assert_eq!(range(i64::MIN, i64::MAX, 1).steps(), u64::MAX);
        assert_eq!(range(i64::MIN, i64::MAX, i64::MAX).steps(), 3);
    }
}
