//! The issuers' key sets (JWKS), fetched (a URL with reqwest, or a
//! ConfigMap key) and kept: re-read every [`JWKS_MAX_AGE`], and sooner when
//! a token names a key id the set lacks, at most once per
//! [`JWKS_MIN_REFETCH`] (a stream of made-up key ids cannot make the
//! gateway hammer the issuer). Each source is fetched on its own: a slow
//! issuer delays only the tokens that wait for its keys, and one fetch of a
//! source serves every caller that wants it meanwhile. A set past its age
//! still answers at once while it is read again in the background
//! (stale-while-revalidate): only a token whose key id the kept set lacks,
//! or a source never read, waits for a fetch.
//!
//! A URL is read as configured, never through a redirect, and only when it
//! is `https://` or `http://` to a loopback address ([`jwks_url`]):
//! whoever can change the keys on the way decides who gets in.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use lanes::JwksSource;

/// A key set older than this is fetched again.
pub(super) const JWKS_MAX_AGE: Duration = Duration::from_secs(300);
/// The least time between two fetches of one key set.
pub(super) const JWKS_MIN_REFETCH: Duration = Duration::from_secs(30);
/// Where the API server serves the ServiceAccount token keys.
const SERVICE_ACCOUNT_KEYS: &str = "/openid/v1/jwks";
/// The largest key set read, in bytes.
const MAX_JWKS_BYTES: usize = 1 << 20;

/// Where a key set is read from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum KeySource {
    /// A JWT issuer's keys, as a lane's rule names them.
    Issuer(JwksSource),
    /// The keys the cluster signs ServiceAccount tokens with: the API
    /// server's `/openid/v1/jwks` (ServiceAccount issuer discovery).
    ServiceAccounts,
}

/// How old a kept set may get, and how soon a set may be fetched again.
#[derive(Clone, Copy, Debug)]
struct Ages {
    max_age: Duration,
    min_refetch: Duration,
}

/// One key set as fetched.
#[derive(Default)]
struct Entry {
    set: Option<JwkSet>,
    fetched: Option<Instant>,
    tried: Option<Instant>,
    /// Why the last fetch failed, while no set could be read.
    error: Option<String>,
}

impl Entry {
    /// Whether a fetch would help: no set yet, one older than
    /// [`JWKS_MAX_AGE`], or `stale` (a token names a key id it lacks).
    fn wants(&self, now: Instant, stale: bool, ages: Ages) -> bool {
        stale
            || self
                .fetched
                .is_none_or(|t| now.duration_since(t) > ages.max_age)
    }

    /// Whether a fetch may start: wanted, and none tried within
    /// [`JWKS_MIN_REFETCH`].
    fn due(&self, now: Instant, stale: bool, ages: Ages) -> bool {
        self.wants(now, stale, ages)
            && self
                .tried
                .is_none_or(|t| now.duration_since(t) >= ages.min_refetch)
    }

    fn answer(&self, source: &KeySource) -> Result<JwkSet, String> {
        self.set.clone().ok_or_else(|| {
            let why = self.error.as_deref().unwrap_or("not tried");
            format!("the JWKS {source:?} could not be read yet: {why}")
        })
    }

    fn fetched(&mut self, source: &KeySource, at: Instant, got: Result<JwkSet, String>) {
        match got {
            Ok(set) => {
                self.set = Some(set);
                self.fetched = Some(at);
                self.error = None;
            }
            Err(err) => {
                tracing::warn!(source = ?source, error = %err,
                    "reading a JWKS failed; keeping the last one read");
                self.error = Some(err);
            }
        }
    }
}

/// One source's key set, and its fetch under way. `entry` is locked only
/// to look or to write, never across I/O. `flight` is held by the one
/// fetch of this source in flight: whoever else wants a fetch of it waits
/// for that one and takes its result (single flight), while a caller whose
/// set is fresh never waits, and other sources are never touched.
#[derive(Default)]
struct Source {
    entry: std::sync::Mutex<Entry>,
    flight: Arc<tokio::sync::Mutex<()>>,
}

impl Source {
    fn entry(&self) -> std::sync::MutexGuard<'_, Entry> {
        self.entry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks a fetch as started when one is due: its start.
    fn claim(&self, stale: bool, ages: Ages) -> Option<Instant> {
        let mut e = self.entry();
        let now = Instant::now();
        e.due(now, stale, ages).then(|| {
            e.tried = Some(now);
            now
        })
    }
}

/// The key sets, fetched on demand and kept, each source on its own.
pub(super) struct KeySets {
    http: reqwest::Client,
    /// The sources; the map is locked only to look one up.
    sources: std::sync::Mutex<HashMap<KeySource, Arc<Source>>>,
    ages: Ages,
}

impl KeySets {
    pub(super) fn new() -> KeySets {
        KeySets::with_ages(JWKS_MAX_AGE, JWKS_MIN_REFETCH)
    }

    /// With other ages than [`JWKS_MAX_AGE`] and [`JWKS_MIN_REFETCH`]
    /// (tests).
    pub(super) fn with_ages(max_age: Duration, min_refetch: Duration) -> KeySets {
        KeySets {
            ages: Ages {
                max_age,
                min_refetch,
            },
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                // A JWKS endpoint that redirects is a configuration error
                // (reported by `read_url`), and a redirect could lead from
                // https:// to http:// or to anywhere else.
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("an HTTP client"),
            sources: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn source(&self, source: &KeySource) -> Arc<Source> {
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = sources.get(source) {
            return s.clone();
        }
        sources.entry(source.clone()).or_default().clone()
    }

    /// The key set of a source: the kept one while fresh (or when `stale`
    /// asks for a re-read too soon); past its age, the kept one too, read
    /// again in the background; else (none kept, or `stale`: a token's key
    /// id is not in it) fetched, and waited for. A failed fetch keeps the
    /// last good set. A caller that wants a fetch while one is under way
    /// waits for it instead of starting another.
    pub(super) async fn get(
        &self,
        kube: Option<&kube::Client>,
        source: &KeySource,
        stale: bool,
    ) -> Result<JwkSet, String> {
        let s = self.source(source);
        let (wants, kept) = {
            let e = s.entry();
            (e.wants(Instant::now(), stale, self.ages), e.set.is_some())
        };
        if wants && kept && !stale {
            // Stale-while-revalidate: the tokens whose keys are kept never
            // wait for an issuer that may hang.
            if s.entry().due(Instant::now(), false, self.ages) {
                drop(self.spawn_fetch(kube, source, &s, false));
            }
        } else if wants && let Err(e) = self.spawn_fetch(kube, source, &s, stale).await {
            s.entry().error = Some(format!("the fetch failed: {e}"));
        }
        s.entry().answer(source)
    }

    /// A fetch of a source in a task of its own, once the source's flight
    /// is its own and if a fetch is still due then (else it ends at once):
    /// a caller that goes away (its client hung up) does not cancel the
    /// fetch that the others wait for and that counts as this source's try.
    fn spawn_fetch(
        &self,
        kube: Option<&kube::Client>,
        source: &KeySource,
        s: &Arc<Source>,
        stale: bool,
    ) -> tokio::task::JoinHandle<()> {
        let (http, kube, src, slot, ages) = (
            self.http.clone(),
            kube.cloned(),
            source.clone(),
            s.clone(),
            self.ages,
        );
        tokio::spawn(async move {
            let _flight = slot.flight.clone().lock_owned().await;
            if let Some(at) = slot.claim(stale, ages) {
                let got = fetch(&http, kube.as_ref(), &src).await;
                slot.entry().fetched(&src, at, got);
            }
        })
    }
}

/// A key set, read from its source.
async fn fetch(
    http: &reqwest::Client,
    kube: Option<&kube::Client>,
    source: &KeySource,
) -> Result<JwkSet, String> {
    let bytes = match source {
        KeySource::Issuer(JwksSource::Url(url)) => read_url(http, url).await?,
        KeySource::Issuer(JwksSource::ConfigMap(k)) => {
            let client = kube.cloned().ok_or("no Kubernetes client")?;
            let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
                kube::Api::namespaced(client, &k.namespace);
            let cm = api.get(&k.name).await.map_err(|e| e.to_string())?;
            cm.data
                .and_then(|mut d| d.remove(&k.key))
                .ok_or_else(|| format!("the ConfigMap has no key {}", k.key))?
                .into_bytes()
        }
        KeySource::ServiceAccounts => {
            let client = kube.cloned().ok_or("no Kubernetes client")?;
            let req = axum::http::Request::get(SERVICE_ACCOUNT_KEYS)
                .body(Vec::new())
                .map_err(|e| e.to_string())?;
            client
                .request_text(req)
                .await
                .map_err(|e| format!("{SERVICE_ACCOUNT_KEYS}: {e}"))?
                .into_bytes()
        }
    };
    if bytes.len() > MAX_JWKS_BYTES {
        return Err(format!("the JWKS is larger than {MAX_JWKS_BYTES} bytes"));
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("not a JWKS: {e}"))
}

/// The URL a key set may be read from: `https://`, or `http://` to a
/// loopback address written as an IP (127.0.0.0/8, `[::1]`; not
/// `localhost`, a name): traffic that never leaves the host, for an issuer
/// beside the gateway or a test. Anything else is refused.
pub(super) fn jwks_url(url: &str) -> Result<reqwest::Url, String> {
    let u = reqwest::Url::parse(url).map_err(|e| format!("the JWKS URL {url:?}: {e}"))?;
    let loopback = u
        .host_str()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
        .and_then(|h| h.parse::<IpAddr>().ok())
        .is_some_and(|ip| ip.is_loopback());
    match u.scheme() {
        "https" => Ok(u),
        "http" if loopback => Ok(u),
        _ => Err(format!(
            "the JWKS URL {url:?} is not https:// (http:// only to a loopback address, 127.0.0.1 or [::1])"
        )),
    }
}

/// A key set's bytes from its URL: as configured, never redirected.
async fn read_url(http: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let r = http
        .get(jwks_url(url)?)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    if status.is_redirection() {
        let to = r
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        return Err(format!(
            "the JWKS URL {url} answered {status}, a redirect to {to:?}: redirects are not followed, configure the URL the keys are served at"
        ));
    }
    if !status.is_success() {
        return Err(format!("the JWKS URL {url} answered {status}"));
    }
    read_limited(r).await
}

/// A body of at most [`MAX_JWKS_BYTES`]: a larger one is refused by its
/// `Content-Length`, else as soon as the bytes that arrived pass the limit,
/// never read to its end (an endless body would otherwise be read, and
/// kept, until the timeout).
async fn read_limited(mut r: reqwest::Response) -> Result<Vec<u8>, String> {
    let too_large = || format!("the JWKS is larger than {MAX_JWKS_BYTES} bytes");
    if r.content_length()
        .is_some_and(|n| n > MAX_JWKS_BYTES as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = r.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > MAX_JWKS_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jwks_url_is_https_or_http_to_a_loopback_ip() {
        for ok in [
            "https://idp.example/jwks",
            "https://10.0.0.7:8443/keys",
            "http://127.0.0.1:5556/keys",
            "http://127.0.0.2/keys",
            "http://[::1]:8080/keys",
        ] {
            assert!(jwks_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://idp.example/jwks",
            "http://10.0.0.7/keys",
            "http://localhost/keys",
            "http://127.0.0.1.nip.io/keys",
            "http://[::ffff:127.0.0.1]/keys",
            "ftp://127.0.0.1/keys",
            "file:///etc/jwks.json",
            "idp.example/jwks",
        ] {
            let err = jwks_url(bad).unwrap_err();
            assert!(err.contains(bad), "{bad}: {err}");
        }
    }
}
