//! Input tokens counted, not estimated: `--tokenizer ROUTE=FILE` mounts a
//! model's `tokenizer.json` (Hugging Face's format, the file a vLLM model
//! ships with) for a route, and a request of a lane whose route has one is
//! counted with it before admission ([`prompt_text`] says what is
//! counted). The count replaces the bytes-per-token estimate in the
//! `maxInputTokens` check, the pool's long-context limit and a priced
//! lane's reservation. The chat template's own tokens (role markers, a few
//! a message) are not in the count; settlement corrects a priced request
//! with the answer's usage all the same.
//!
//! A request whose prompt cannot be counted (not JSON, a part that is not
//! text, the tokenizer failing) is estimated from its bytes as without a
//! tokenizer, and counted in a metric. A file that does not load stops the
//! gateway at start. Bodies above [`INLINE_BYTES`] are tokenized off the
//! runtime's threads, at most one per CPU at a time, so a burst of long
//! prompts waits for the tokenizer instead of stalling every connection
//! (counting costs about a microsecond of one core per token:
//! `cargo bench --bench tokenizer`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Bytes;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use serde_json::Value;
use tokio::sync::Semaphore;

use super::args::GatewayError;
use super::prompt_text::{self, Prompt, Uncountable};

/// Bodies up to this size are tokenized on the request's own task.
pub(super) const INLINE_BYTES: usize = 8 << 10;

/// One route's tokenizer.
pub struct RouteTokenizer {
    route: String,
    tokenizer: tokenizers::Tokenizer,
    /// Special tokens added to one sequence (a beginning-of-text token).
    specials: u64,
}

impl std::fmt::Debug for RouteTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteTokenizer")
            .field("route", &self.route)
            .finish_non_exhaustive()
    }
}

impl RouteTokenizer {
    /// Loads `file`, with its truncation and padding turned off (a
    /// tokenizer saved with `truncation.max_length` would otherwise count
    /// a long prompt short).
    pub fn load(route: &str, file: &Path) -> Result<RouteTokenizer, String> {
        let mut tokenizer = tokenizers::Tokenizer::from_file(file)
            .map_err(|e| format!("route {route:?}: {} does not load: {e}", file.display()))?;
        tokenizer
            .with_truncation(None)
            .map_err(|e| format!("route {route:?}: {e}"))?;
        tokenizer.with_padding(None);
        let specials = tokenizer
            .encode_fast("", true)
            .map_err(|e| format!("route {route:?}: {} cannot encode: {e}", file.display()))?
            .len() as u64;
        Ok(RouteTokenizer {
            route: route.to_owned(),
            tokenizer,
            specials,
        })
    }

    /// The route it counts for.
    pub(super) fn route(&self) -> &str {
        &self.route
    }

    fn tokens(&self, text: &str, specials: bool) -> Result<u64, Uncountable> {
        self.tokenizer
            .encode_fast(text, specials)
            .map(|e| e.len() as u64)
            .map_err(|_| Uncountable::TokenizerFailed)
    }

    /// The tokens of a prompt.
    pub(super) fn count(&self, p: &Prompt<'_>) -> Result<u64, Uncountable> {
        let mut n = p.ids;
        if !p.texts.is_empty() || !p.json.is_empty() {
            n += self.specials;
        }
        for t in &p.texts {
            n += self.tokens(t, false)?;
        }
        for j in &p.json {
            n += self.tokens(j, false)?;
        }
        for s in &p.sequences {
            n += self.tokens(s, true)?;
        }
        Ok(n)
    }

    /// The tokens of the prompt of a request to `path` with `body`.
    pub fn count_body(&self, path: &str, body: &[u8]) -> Result<u64, Uncountable> {
        let v: Value = serde_json::from_slice(body).map_err(|_| Uncountable::NotJson)?;
        self.count(&prompt_text::prompt(path, &v)?)
    }
}

/// Loads every `--tokenizer ROUTE=FILE`; each route must be a `--route`.
pub(super) fn load(
    list: &[(String, PathBuf)],
    routes: &[(String, String)],
) -> Result<HashMap<String, Arc<RouteTokenizer>>, GatewayError> {
    let mut by_route = HashMap::new();
    for (route, file) in list {
        if !routes.iter().any(|(r, _)| r == route) {
            return Err(GatewayError::Tokenizer(format!(
                "{route:?} is not the name of a --route"
            )));
        }
        let t = RouteTokenizer::load(route, file).map_err(GatewayError::Tokenizer)?;
        by_route.insert(route.clone(), Arc::new(t));
    }
    Ok(by_route)
}

/// The routes' tokenizers, the permits for long prompts and the metrics.
pub(super) struct Tokenizers {
    by_route: HashMap<String, Arc<RouteTokenizer>>,
    permits: Arc<Semaphore>,
    metrics: TokenizerMetrics,
}

impl Tokenizers {
    /// None loaded yet, metrics registered; one long prompt counted at a
    /// time per CPU.
    pub(super) fn new(registry: &Registry) -> Tokenizers {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        Tokenizers::with_permits(registry, cpus)
    }

    fn with_permits(registry: &Registry, permits: usize) -> Tokenizers {
        Tokenizers {
            by_route: HashMap::new(),
            permits: Arc::new(Semaphore::new(permits)),
            metrics: TokenizerMetrics::new(registry),
        }
    }

    /// Installs what [`load`] loaded.
    pub(super) fn install(&mut self, by_route: HashMap<String, Arc<RouteTokenizer>>) {
        self.by_route = by_route;
    }

    /// The tokenizer of the first of `routes` that has one.
    pub(super) fn for_routes<'a>(
        &self,
        routes: impl IntoIterator<Item = &'a String>,
    ) -> Option<Arc<RouteTokenizer>> {
        if self.by_route.is_empty() {
            return None;
        }
        routes
            .into_iter()
            .find_map(|r| self.by_route.get(r).cloned())
    }

    /// The input tokens of a request to `path` with `body`, counted with
    /// `t`; None (and a metric) when they cannot be counted.
    pub(super) async fn count(
        &self,
        t: Arc<RouteTokenizer>,
        path: &str,
        body: &Bytes,
    ) -> Option<u64> {
        let counted = if body.len() <= INLINE_BYTES {
            t.count_body(path, body)
        } else {
            self.count_blocking(Arc::clone(&t), path, body.clone())
                .await
        };
        match counted {
            Ok(n) => {
                self.metrics.counted(t.route());
                Some(n)
            }
            Err(why) => {
                self.metrics.uncounted(t.route(), why);
                tracing::debug!(
                    route = t.route(),
                    reason = why.as_str(),
                    "input tokens estimated from the body's bytes"
                );
                None
            }
        }
    }

    async fn count_blocking(
        &self,
        t: Arc<RouteTokenizer>,
        path: &str,
        body: Bytes,
    ) -> Result<u64, Uncountable> {
        let waiting = Raised::new(&self.metrics.waiting);
        let permit = self.permits.acquire().await;
        drop(waiting);
        let _permit = permit.map_err(|_| Uncountable::TokenizerFailed)?;
        let _counting = Raised::new(&self.metrics.counting);
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || t.count_body(&path, &body))
            .await
            .unwrap_or(Err(Uncountable::TokenizerFailed))
    }
}

/// A gauge raised by one while this lives (a request that goes away while
/// it waits or counts lowers it again).
struct Raised<'a>(&'a IntGauge);

impl<'a> Raised<'a> {
    fn new(g: &'a IntGauge) -> Raised<'a> {
        g.inc();
        Raised(g)
    }
}

impl Drop for Raised<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Requests counted with a tokenizer, and those that could not be; long
/// prompts being counted and waiting for their turn.
struct TokenizerMetrics {
    counted: IntCounterVec,
    uncounted: IntCounterVec,
    counting: IntGauge,
    waiting: IntGauge,
}

impl TokenizerMetrics {
    fn new(r: &Registry) -> TokenizerMetrics {
        let counted = IntCounterVec::new(
            Opts::new(
                "lanekeeper_gateway_input_tokens_counted_total",
                "Requests whose input tokens were counted with their route's tokenizer, by route.",
            ),
            &["route"],
        )
        .expect("valid metric");
        let uncounted = IntCounterVec::new(
            Opts::new(
                "lanekeeper_gateway_input_tokens_uncounted_total",
                "Requests of a route with a tokenizer whose input tokens were estimated from the body's bytes instead, by route and reason.",
            ),
            &["route", "reason"],
        )
        .expect("valid metric");
        let counting = IntGauge::new(
            "lanekeeper_gateway_long_prompts_counting",
            "Long prompts (bodies over 8 KiB) being counted on a blocking thread now: at most one per CPU.",
        )
        .expect("valid metric");
        let waiting = IntGauge::new(
            "lanekeeper_gateway_long_prompts_waiting",
            "Long prompts waiting for a CPU to be counted on (their requests wait with them).",
        )
        .expect("valid metric");
        for m in [
            Box::new(counted.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(uncounted.clone()),
            Box::new(counting.clone()),
            Box::new(waiting.clone()),
        ] {
            r.register(m).expect("registered once");
        }
        TokenizerMetrics {
            counted,
            uncounted,
            counting,
            waiting,
        }
    }

    fn counted(&self, route: &str) {
        self.counted.with_label_values(&[route]).inc();
    }

    fn uncounted(&self, route: &str, why: Uncountable) {
        self.uncounted
            .with_label_values(&[route, why.as_str()])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level tokenizer (a token per word or run of punctuation, a
    /// `<s>` before each sequence) saved with `truncation.max_length: 4`.
    pub(crate) fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer-wordlevel.json")
    }

    fn loaded() -> RouteTokenizer {
        RouteTokenizer::load("vllm", &fixture()).unwrap()
    }

    #[test]
    fn a_prompt_is_counted_whole_whatever_truncation_the_file_was_saved_with() {
        let t = loaded();
        assert_eq!(t.specials, 1);
        // Six words and a sequence's <s>: seven, though the file truncates
        // at four.
        let body = br#"{"prompt": "one two three four five six"}"#;
        assert_eq!(t.count_body("/v1/completions", body), Ok(7));
        // Two prompts of a batch, each with its <s>; token ids as they are.
        let body = br#"{"prompt": ["hello, world!", "hi"], "max_tokens": 3}"#;
        assert_eq!(t.count_body("/v1/completions", body), Ok(5 + 2));
        assert_eq!(
            t.count_body("/v1/embeddings", br#"{"input": [[9, 9, 9]]}"#),
            Ok(3)
        );
    }

    #[test]
    fn a_chat_is_one_sequence_of_its_messages() {
        let t = loaded();
        let body = br#"{"messages": [
            {"role": "system", "content": "a b"},
            {"role": "user", "content": [{"type": "text", "text": "c"}]}
        ]}"#;
        assert_eq!(t.count_body("/v1/chat/completions", body), Ok(1 + 3));
        // No text at all: nothing, not even the <s>.
        let body = br#"{"messages": [{"role": "assistant", "content": null}]}"#;
        assert_eq!(t.count_body("/v1/chat/completions", body), Ok(0));
    }

    #[test]
    fn what_cannot_be_counted_says_why() {
        let t = loaded();
        assert_eq!(
            t.count_body("/v1/chat/completions", b"{not json"),
            Err(Uncountable::NotJson)
        );
        let image = br#"{"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,x"}}]}]}"#;
        assert_eq!(
            t.count_body("/v1/chat/completions", image),
            Err(Uncountable::NotText)
        );
        assert_eq!(
            t.count_body("/v1/audio/speech", b"{}"),
            Err(Uncountable::OtherPath)
        );
    }

    #[test]
    fn a_bad_flag_or_file_stops_the_start() {
        let routes = vec![("vllm".to_owned(), "http://127.0.0.1:1".to_owned())];
        let ok = load(&[("vllm".to_owned(), fixture())], &routes).unwrap();
        assert_eq!(ok["vllm"].route(), "vllm");
        let err = |list: &[(String, PathBuf)]| load(list, &routes).unwrap_err().to_string();
        let e = err(&[("other".to_owned(), fixture())]);
        assert!(e.contains("\"other\" is not the name of a --route"), "{e}");
        let e = err(&[(
            "vllm".to_owned(),
            PathBuf::from("/nonexistent/tokenizer.json"),
        )]);
        assert!(e.starts_with("tokenizer: route \"vllm\""), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let garbage = dir.path().join("tokenizer.json");
        std::fs::write(&garbage, b"{\"model\": 1}").unwrap();
        let e = err(&[("vllm".to_owned(), garbage)]);
        assert!(e.contains("does not load"), "{e}");
    }

    #[tokio::test]
    async fn a_long_body_is_counted_off_the_runtime_and_failures_are_metered() {
        let registry = Registry::new();
        let mut ts = Tokenizers::new(&registry);
        let routes = vec![("vllm".to_owned(), "http://127.0.0.1:1".to_owned())];
        ts.install(load(&[("vllm".to_owned(), fixture())], &routes).unwrap());
        let t = ts
            .for_routes(&["none".to_owned(), "vllm".to_owned()])
            .unwrap();
        assert!(ts.for_routes(&["none".to_owned()]).is_none());
        let words = "hello ".repeat(INLINE_BYTES / 3);
        let body = Bytes::from(format!(r#"{{"prompt": "{words}"}}"#));
        assert!(body.len() > INLINE_BYTES);
        let n = ts.count(Arc::clone(&t), "/v1/completions", &body).await;
        assert_eq!(n, Some(INLINE_BYTES as u64 / 3 + 1));
        let none = ts
            .count(t, "/v1/completions", &Bytes::from_static(b"[]"))
            .await;
        assert_eq!(none, None);
        let text = String::from_utf8(prometheus_text(&registry)).unwrap();
        assert!(
            text.contains(r#"lanekeeper_gateway_input_tokens_counted_total{route="vllm"} 1"#),
            "{text}"
        );
        // A JSON array is no request object.
        assert!(
            text.contains(r#"lanekeeper_gateway_input_tokens_uncounted_total{reason="not_json",route="vllm"} 1"#),
            "{text}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_long_prompts_are_counted_at_once_than_there_are_permits() {
        // Twelve long prompts at once against two permits: a sampler
        // watches the gauges the whole time. Without the permits all twelve
        // would count at once on the blocking pool.
        let registry = Registry::new();
        let mut ts = Tokenizers::with_permits(&registry, 2);
        let routes = vec![("vllm".to_owned(), "http://127.0.0.1:1".to_owned())];
        ts.install(load(&[("vllm".to_owned(), fixture())], &routes).unwrap());
        let ts = Arc::new(ts);
        let t = ts.for_routes(&["vllm".to_owned()]).unwrap();
        let words = "hello ".repeat(20_000);
        let body = Bytes::from(format!(r#"{{"prompt": "{words}"}}"#));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let (ts, done) = (Arc::clone(&ts), Arc::clone(&done));
            tokio::spawn(async move {
                let (mut counting, mut waiting) = (0, 0);
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    counting = counting.max(ts.metrics.counting.get());
                    waiting = waiting.max(ts.metrics.waiting.get());
                    tokio::task::yield_now().await;
                }
                (counting, waiting)
            })
        };
        let counts: Vec<_> = (0..12)
            .map(|_| {
                let (ts, t, body) = (Arc::clone(&ts), Arc::clone(&t), body.clone());
                tokio::spawn(async move { ts.count(t, "/v1/completions", &body).await })
            })
            .collect();
        for c in counts {
            assert_eq!(c.await.unwrap(), Some(20_001));
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        let (counting, waiting) = sampler.await.unwrap();
        assert!((1..=2).contains(&counting), "{counting} counted at once");
        assert!(waiting >= 1, "none was seen waiting for a permit");
        assert_eq!(
            (ts.metrics.counting.get(), ts.metrics.waiting.get()),
            (0, 0)
        );
    }

    fn prometheus_text(r: &Registry) -> Vec<u8> {
        use prometheus::Encoder;
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&r.gather(), &mut out)
            .unwrap();
        out
    }
}
