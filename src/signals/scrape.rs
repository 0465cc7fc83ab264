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

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use kube::ResourceExt;
use openmetrics_parser::{PrometheusValue, prometheus::parse_prometheus};

use super::{SignalSource, SourceInput, SourceOutput};
use crate::api::profile::{ScrapeMetrics, ScrapeSignals};
use crate::metrics::Metrics;
use crate::policy::key;

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
            ScrapeError::Http(c) => write!(f, "http_error: HTTP {c}"),
            ScrapeError::Malformed(e) => write!(f, "malformed: {e}"),
        }
    }
}

/// Parses a metrics page and reads the configured names. A name with several
/// series (one per model or engine) is summed; NaN, infinite or negative
/// values give no evidence.
pub fn parse_page(text: &str, names: &ScrapeMetrics) -> Result<PodMetrics, ScrapeError> {
    let mut text = text.to_owned();
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let exp = parse_prometheus(&text).map_err(|e| {
        let e = format!("{e:?}");
        ScrapeError::Malformed(e.chars().take(200).collect())
    })?;
    let read = |name: &str| -> Option<f64> {
        let fam = exp.families.get(name)?;
        let mut sum = 0.0;
        let mut any = false;
        for s in fam.iter_samples() {
            let v = match &s.value {
                PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n) => n.as_f64(),
                PrometheusValue::Counter(c) => c.value.as_f64(),
                _ => return None,
            };
            if !v.is_finite() || v < 0.0 {
                return None;
            }
            sum += v;
            any = true;
        }
        any.then_some(sum)
    };
    Ok(PodMetrics {
        running: read(&names.requests_running),
        waiting: read(&names.requests_waiting),
        kv_cache_usage: names.kv_cache_usage.iter().find_map(|n| read(n)),
        error_ratio: names.error_ratio.as_deref().and_then(read),
    })
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
        resp.text().await.map_err(|e| {
            if e.is_timeout() {
                ScrapeError::Timeout
            } else {
                ScrapeError::Malformed(e.to_string())
            }
        })
    };
    let text = tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| ScrapeError::Timeout)??;
    parse_page(&text, names)
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
fn nothing_scraped(
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

/// The controller's scrape source. Profiles without `spec.signals.scrape`
/// get nothing from it.
pub struct ScrapeSource {
    http: reqwest::Client,
    metrics: Option<Metrics>,
    cache: Mutex<HashMap<String, (i64, SourceOutput)>>,
}

impl ScrapeSource {
    /// A source reporting errors to `metrics`.
    pub fn new(metrics: Option<Metrics>) -> Self {
        Self {
            http: reqwest::Client::builder()
                .user_agent(concat!("lanekeeper/", env!("CARGO_PKG_VERSION")))
                .build()
                .expect("a plain HTTP client builds"),
            metrics,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Collects one profile's scrape signals (reusing a result younger than
    /// `intervalSeconds`).
    pub async fn observe(&self, input: &SourceInput<'_>) -> SourceOutput {
        let profile = input.profile;
        let Some(cfg) = profile
            .spec
            .signals
            .as_ref()
            .and_then(|s| s.scrape.as_ref())
        else {
            return SourceOutput::default();
        };
        let pkey = key(
            &profile.namespace().unwrap_or_default(),
            &profile.name_any(),
        );
        if let Some((at, out)) = self.cache.lock().expect("not poisoned").get(&pkey)
            && input.now - at < cfg.interval_seconds
        {
            return out.clone();
        }
        let Some(pods) = input.pods else {
            return nothing_scraped(cfg, "the pod index has not synced yet", "unsynced").0;
        };
        let targets: Vec<(String, String)> = pods
            .iter()
            .filter(|p| p.signals().is_ready())
            .filter_map(|p| p.ip.clone().map(|ip| (p.name.clone(), ip)))
            .collect();
        let results = scrape_pool(&self.http, cfg, &targets).await;
        let (out, reasons) = to_output(cfg, &results);
        if let Some(m) = &self.metrics {
            for s in ["scrape:inFlight", "scrape:queueDepth"] {
                if reasons.contains_key(s) {
                    let _ = m.signal_age.remove_label_values(&[&pkey, s]);
                } else {
                    m.signal_age.with_label_values(&[&pkey, s]).set(0.0);
                }
            }
            for (s, r) in &reasons {
                m.signal_errors.with_label_values(&[&pkey, s, r]).inc();
            }
        }
        let mut cache = self.cache.lock().expect("not poisoned");
        if cache.len() > 4096 {
            cache.clear();
        }
        cache.insert(pkey, (input.now, out.clone()));
        out
    }
}

impl SignalSource for ScrapeSource {
    fn collect<'a>(&'a self, input: &'a SourceInput<'a>) -> BoxFuture<'a, SourceOutput> {
        Box::pin(self.observe(input))
    }
}
