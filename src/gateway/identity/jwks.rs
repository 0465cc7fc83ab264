//! The issuers' key sets (JWKS), fetched (a URL with reqwest, or a
//! ConfigMap key) and kept: re-read every [`JWKS_MAX_AGE`], and sooner when
//! a token names a key id the set lacks, at most once per
//! [`JWKS_MIN_REFETCH`] (a stream of made-up key ids cannot make the
//! gateway hammer the issuer).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use lanes::JwksSource;

/// A key set older than this is fetched again.
pub(super) const JWKS_MAX_AGE: Duration = Duration::from_secs(300);
/// The least time between two fetches of one key set.
pub(super) const JWKS_MIN_REFETCH: Duration = Duration::from_secs(30);
/// The largest key set read, in bytes.
const MAX_JWKS_BYTES: usize = 1 << 20;

/// One key set as fetched.
#[derive(Default)]
struct Entry {
    set: Option<JwkSet>,
    fetched: Option<Instant>,
    tried: Option<Instant>,
}

/// The key sets, fetched on demand and kept.
pub(super) struct KeySets {
    http: reqwest::Client,
    sets: tokio::sync::Mutex<HashMap<JwksSource, Entry>>,
}

impl KeySets {
    pub(super) fn new() -> KeySets {
        KeySets {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .expect("an HTTP client"),
            sets: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The key set of a source: the kept one while fresh (or when `stale`
    /// asks for a re-read too soon), else fetched; a failed fetch keeps the
    /// last good set.
    pub(super) async fn get(
        &self,
        kube: Option<&kube::Client>,
        source: &JwksSource,
        stale: bool,
    ) -> Result<JwkSet, String> {
        let mut sets = self.sets.lock().await;
        let e = sets.entry(source.clone()).or_default();
        let now = Instant::now();
        let old = e
            .fetched
            .is_none_or(|t| now.duration_since(t) > JWKS_MAX_AGE)
            || stale;
        let may = e
            .tried
            .is_none_or(|t| now.duration_since(t) >= JWKS_MIN_REFETCH);
        if old && may {
            e.tried = Some(now);
            match self.fetch(kube, source).await {
                Ok(set) => {
                    e.set = Some(set);
                    e.fetched = Some(now);
                }
                Err(err) => tracing::warn!(source = ?source, error = %err,
                    "reading a JWKS failed; keeping the last one read"),
            }
        }
        e.set
            .clone()
            .ok_or_else(|| format!("the JWKS {source:?} could not be read yet"))
    }

    async fn fetch(
        &self,
        kube: Option<&kube::Client>,
        source: &JwksSource,
    ) -> Result<JwkSet, String> {
        let bytes = match source {
            JwksSource::Url(url) => {
                let r = self.http.get(url).send().await.map_err(|e| e.to_string())?;
                let r = r.error_for_status().map_err(|e| e.to_string())?;
                let b = r.bytes().await.map_err(|e| e.to_string())?;
                b.to_vec()
            }
            JwksSource::ConfigMap(k) => {
                let client = kube.cloned().ok_or("no Kubernetes client")?;
                let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
                    kube::Api::namespaced(client, &k.namespace);
                let cm = api.get(&k.name).await.map_err(|e| e.to_string())?;
                cm.data
                    .and_then(|mut d| d.remove(&k.key))
                    .ok_or_else(|| format!("the ConfigMap has no key {}", k.key))?
                    .into_bytes()
            }
        };
        if bytes.len() > MAX_JWKS_BYTES {
            return Err(format!("the JWKS is larger than {MAX_JWKS_BYTES} bytes"));
        }
        serde_json::from_slice(&bytes).map_err(|e| format!("not a JWKS: {e}"))
    }
}
