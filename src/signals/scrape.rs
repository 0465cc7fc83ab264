//! Signals scraped from the pool's own model-server pods.
//!
//! Each ready pod with an IP is fetched at `http://<pod IP>:<port><path>`
//! (at most `maxConcurrency` at once, each within `timeoutSeconds`) and its
//! page parsed as the Prometheus text format (the `openmetrics-parser`
//! crate). Per pod: requests running and waiting, KV-cache usage and,
//! when configured, an error ratio (per-pod evidence for drains). Pool
//! totals (`inFlight`, `queueDepth`) are given only when every scraped pod
//! answered: a partial sum would understate the load, so it is Unknown with
//! the pods that failed. Results are reused for `intervalSeconds`.
//!
//! A pod is not trusted with the controller's memory or its fetches: a page
//! over [`MAX_PAGE_BYTES`] is malformed (read no further), and a redirect is
//! an HTTP error, never followed. Only the families read are parsed, each
//! on its own, so a page the text format allows (no `# TYPE` lines, or
//! another family mixing label sets) still gives its evidence.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use openmetrics_parser::{PrometheusValue, prometheus::parse_prometheus};

use super::SourceOutput;
use crate::api::profile::{ScrapeMetrics, ScrapeSignals};

/// The largest metrics page read from a pod (a vLLM page is tens to
/// hundreds of KiB).
pub const MAX_PAGE_BYTES: usize = 16 << 20;

/// What one pod's page said.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodMetrics {
    /// Requests running (sum over the metric's series).
    pub running: Option<f64>,
    /// Requests waiting.
    pub waiting: Option<f64>,
    /// KV-cache usage (0..1), from the first configured name present.
    pub kv_cache_usage: Option<f64>,
    /// Error ratio (0..1), when configured and present.
    pub error_ratio: Option<f64>,
}

/// Why a pod gave no evidence.
#[derive(Clone, Debug, PartialEq)]
pub enum ScrapeError {
    /// No answer in time.
    Timeout,
    /// Connection failed.
    Unreachable(String),
    /// Not HTTP 200.
    Http(u16),
    /// Not the Prometheus text format.
    Malformed(String),
}

impl ScrapeError {
    /// Short reason (metric label).
    pub fn reason(&self) -> &'static str {
        match self {
            ScrapeError::Timeout => "timeout",
            ScrapeError::Unreachable(_) => "unreachable",
            ScrapeError::Http(_) => "http_error",
            ScrapeError::Malformed(_) => "malformed",
        }
    }
}

impl std::fmt::Display for ScrapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScrapeError::Timeout => write!(f, "timeout"),
            ScrapeError::Unreachable(e) => write!(f, "unreachable: {e}"),
            ScrapeError::Http(c @ 300..=399) => {
                write!(f, "http_error: HTTP {c} (a redirect, not followed)")
            }
            ScrapeError::Http(c) => write!(f, "http_error: HTTP {c}"),
            ScrapeError::Malformed(e) => write!(f, "malformed: {e}"),
        }
    }
}

/// Parses a metrics page and reads the configured names. Requests running
/// and waiting are summed over their series (one per model or engine); the
/// KV-cache usage is the fullest engine's; an error ratio must be one
/// series. NaN, infinite or negative values, and fractions over 1, give no
/// evidence.
pub fn parse_page(text: &str, names: &ScrapeMetrics) -> Result<PodMetrics, ScrapeError> {
    if !looks_like_text_format(text) {
        return Err(ScrapeError::Malformed(
            "not the Prometheus text format".to_owned(),
        ));
    }
    let read = |name: &str, how: Combine| read_family(text, name, how);
    let mut kv_cache_usage = None;
    for n in &names.kv_cache_usage {
        kv_cache_usage = read(n, Combine::Fullest)?;
        if kv_cache_usage.is_some() {
            break;
        }
    }
    Ok(PodMetrics {
        running: read(&names.requests_running, Combine::Sum)?,
        waiting: read(&names.requests_waiting, Combine::Sum)?,
        kv_cache_usage,
        error_ratio: match names.error_ratio.as_deref() {
            Some(n) => read(n, Combine::Single)?,
            None => None,
        },
    })
}

/// How a family's series make the pod's figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Combine {
    /// A count: the series (one per model or engine) add up.
    Sum,
    /// A fraction of a resource each series has its own of (an engine's KV
    /// cache): the fullest, each at most 1.
    Fullest,
    /// The pod's one ratio (0..1): more than one series says nothing of
    /// the pod as a whole (ambiguous, as in the Prometheus source).
    Single,
}

impl Combine {
    /// The pod's figure from its series' values (each finite, >= 0).
    fn of(self, values: &[f64]) -> Option<f64> {
        match self {
            Combine::Sum => Some(values.iter().sum()),
            Combine::Fullest if values.iter().all(|&v| v <= 1.0) => {
                values.iter().copied().reduce(f64::max)
            }
            Combine::Single if values.len() == 1 && values[0] <= 1.0 => Some(values[0]),
            Combine::Fullest | Combine::Single => None,
        }
    }
}

/// Whether every line that is not blank or a comment starts like a sample
/// (a metric name), as a metrics page's do and an HTML error page's do not.
fn looks_like_text_format(text: &str) -> bool {
    text.lines()
        .map(str::trim_start)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .all(|l| {
            l.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        })
}

/// The sample `name`'s series combined `how` (None when absent, when one is
/// NaN, infinite or negative, or when they do not combine), parsed from its
/// own lines alone.
fn read_family(text: &str, name: &str, how: Combine) -> Result<Option<f64>, ScrapeError> {
    let lines = family_lines(text, name);
    if lines.is_empty() {
        return Ok(None);
    }
    let exp = parse_prometheus(&lines).map_err(|e| {
        let e = format!("{name}: {e:?}");
        ScrapeError::Malformed(e.chars().take(200).collect())
    })?;
    let Some(fam) = exp.families.get(name) else {
        return Ok(None);
    };
    let mut values = Vec::new();
    for s in fam.iter_samples() {
        let v = match &s.value {
            PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n) => n.as_f64(),
            PrometheusValue::Counter(c) => c.value.as_f64(),
            _ => return Ok(None),
        };
        if !v.is_finite() || v < 0.0 {
            return Ok(None);
        }
        values.push(v);
    }
    if values.is_empty() {
        return Ok(None);
    }
    Ok(how.of(&values))
}

/// The lines of `text` about the sample `name`: its samples and its own
/// `# TYPE` and `# HELP` lines, each ended by a newline.
fn family_lines(text: &str, name: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let l = line.trim_start();
        let about = match l.strip_prefix('#') {
            Some(c) => {
                let mut words = c.split_whitespace();
                matches!(words.next(), Some("TYPE" | "HELP")) && words.next() == Some(name)
            }
            None => l
                .strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ', '\t'])),
        };
        if about {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// Fetches and parses one page.
pub async fn scrape_one(
    http: &reqwest::Client,
    url: &str,
    timeout: Duration,
    names: &ScrapeMetrics,
) -> Result<PodMetrics, ScrapeError> {
    let fut = async {
        let resp = http.get(url).send().await.map_err(|e| {
            if e.is_timeout() {
                ScrapeError::Timeout
            } else {
                ScrapeError::Unreachable(e.to_string())
            }
        })?;
        if !resp.status().is_success() {
            return Err(ScrapeError::Http(resp.status().as_u16()));
        }
        read_page(resp).await
    };
    let text = tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| ScrapeError::Timeout)??;
    parse_page(&text, names)
}

/// The client pods are scraped with: it follows no redirect.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .user_agent(concat!("lanekeeper/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a plain HTTP client builds")
}

/// The page's body, at most [`MAX_PAGE_BYTES`] of it.
async fn read_page(mut resp: reqwest::Response) -> Result<String, ScrapeError> {
    let too_large = || ScrapeError::Malformed(format!("page larger than {MAX_PAGE_BYTES} bytes"));
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_PAGE_BYTES as u64)
    {
        return Err(too_large());
    }
    let mut page = Vec::new();
    loop {
        let chunk = resp.chunk().await.map_err(|e| {
            if e.is_timeout() {
                ScrapeError::Timeout
            } else {
                ScrapeError::Malformed(e.to_string())
            }
        })?;
        let Some(chunk) = chunk else {
            return Ok(String::from_utf8_lossy(&page).into_owned());
        };
        if page.len() + chunk.len() > MAX_PAGE_BYTES {
            return Err(too_large());
        }
        page.extend_from_slice(&chunk);
    }
}

/// The scrape of one pool: per-pod results.
pub async fn scrape_pool(
    http: &reqwest::Client,
    cfg: &ScrapeSignals,
    pods: &[(String, String)],
) -> BTreeMap<String, Result<PodMetrics, ScrapeError>> {
    let timeout = Duration::from_secs(cfg.timeout_seconds.max(1) as u64);
    let jobs: Vec<_> = pods
        .iter()
        .cloned()
        .map(|(name, ip)| {
            let host = if ip.contains(':') {
                format!("[{ip}]")
            } else {
                ip
            };
            let url = format!("http://{host}:{}{}", cfg.port, cfg.path);
            let http = http.clone();
            let names = cfg.metrics.clone();
            async move {
                let r = scrape_one(&http, &url, timeout, &names).await;
                (name, r)
            }
        })
        .collect();
    futures::stream::iter(jobs)
        .buffer_unordered(cfg.max_concurrency.max(1) as usize)
        .collect()
        .await
}

/// The totals this source gives, each under its `scrape:<name>` key, and
/// the metric names it reads them from (an empty name: not wanted from this
/// source).
fn wanted(cfg: &ScrapeSignals) -> [(&'static str, String); 3] {
    [
        ("scrape:inFlight", cfg.metrics.requests_running.clone()),
        ("scrape:queueDepth", cfg.metrics.requests_waiting.clone()),
        (
            "scrape:kvCacheUsagePercent",
            cfg.metrics.kv_cache_usage.join(" or "),
        ),
    ]
}

/// Nothing could be scraped: every total this source gives is Unknown for
/// `why` (each under its own key, as the triggers read them), and so is the
/// source as a whole (`scrape`).
pub(super) fn nothing_scraped(
    cfg: &ScrapeSignals,
    why: &str,
    reason: &str,
) -> (SourceOutput, BTreeMap<String, String>) {
    let mut out = SourceOutput::default();
    let mut reasons = BTreeMap::new();
    let signals = wanted(cfg).into_iter().filter(|(_, name)| !name.is_empty());
    for signal in std::iter::once("scrape").chain(signals.map(|(s, _)| s)) {
        out.unknown.insert(signal.into(), why.into());
        reasons.insert(signal.into(), reason.into());
    }
    (out, reasons)
}

/// Turns per-pod results into a source output (and metric reasons).
pub fn to_output(
    cfg: &ScrapeSignals,
    results: &BTreeMap<String, Result<PodMetrics, ScrapeError>>,
) -> (SourceOutput, BTreeMap<String, String>) {
    if results.is_empty() {
        return nothing_scraped(cfg, "empty: no ready pod with an IP to scrape", "empty");
    }
    let mut out = SourceOutput::default();
    let mut reasons = BTreeMap::new();
    let mut failed = Vec::new();
    let mut reason = "";
    let (mut running, mut waiting, mut kv) = (Some(0.0), Some(0.0), Some(0.0));
    for (pod, r) in results {
        match r {
            Ok(m) => {
                running = running.zip(m.running).map(|(a, b)| a + b);
                waiting = waiting.zip(m.waiting).map(|(a, b)| a + b);
                kv = kv.zip(m.kv_cache_usage).map(|(a, b)| a + b);
                if cfg.metrics.error_ratio.is_some()
                    && let Some(e) = m.error_ratio
                {
                    out.profile.pods.entry(pod.clone()).or_default().error_ratio = Some(e);
                }
            }
            Err(e) => {
                failed.push(format!("{pod}: {e}"));
                if reason.is_empty() {
                    reason = e.reason();
                }
                running = None;
                waiting = None;
                kv = None;
            }
        }
    }
    out.profile.in_flight = running;
    out.profile.queue_depth = waiting;
    // The pool's usage: the mean of its replicas' fractions, in percent.
    let kv = kv.map(|sum| 100.0 * sum / results.len() as f64);
    out.profile.kv_cache_usage_percent = kv;
    let why = if failed.is_empty() {
        None
    } else {
        let shown: Vec<&str> = failed.iter().take(5).map(String::as_str).collect();
        Some(format!(
            "{} of {} pods gave no evidence ({})",
            failed.len(),
            results.len(),
            shown.join("; ")
        ))
    };
    for ((signal, name), v) in wanted(cfg).into_iter().zip([running, waiting, kv]) {
        if v.is_none() && !name.is_empty() {
            let text = why
                .clone()
                .unwrap_or_else(|| format!("missing: a pod does not expose {name}"));
            out.unknown.insert(signal.into(), text);
            reasons.insert(
                signal.into(),
                if reason.is_empty() { "missing" } else { reason }.into(),
            );
        }
    }
    if let Some(w) = why {
        out.unknown.insert("scrape:pods".into(), w);
        reasons.insert("scrape:pods".into(), reason.into());
    }
    (out, reasons)
}
