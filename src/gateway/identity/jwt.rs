//! JWTs from an OIDC issuer: the signature checked against the issuer's
//! JWKS (asymmetric keys only), then `iss`, `aud`, `exp` and `nbf`, by
//! jsonwebtoken. The key sets are fetched (a URL with reqwest, or a
//! ConfigMap key) and kept: re-read every [`JWKS_MAX_AGE`], and sooner when
//! a token names a key id the set lacks, at most once per
//! [`JWKS_MIN_REFETCH`] (a stream of made-up key ids cannot make the
//! gateway hammer the issuer).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{DecodingKey, Validation, decode, decode_header};
use lanes::{JwksSource, JwtIssuer};
use serde_json::{Map, Value};

/// A key set older than this is fetched again.
pub(super) const JWKS_MAX_AGE: Duration = Duration::from_secs(300);
/// The least time between two fetches of one key set.
pub(super) const JWKS_MIN_REFETCH: Duration = Duration::from_secs(30);
/// Clock skew allowed on `exp` and `nbf`, in seconds.
const LEEWAY_SECONDS: u64 = 30;
/// The largest key set read, in bytes.
const MAX_JWKS_BYTES: usize = 1 << 20;

/// A token's claims, before any check: only to pick the rules to check it
/// against (the issuer, the ServiceAccount it claims to be).
pub(super) fn unverified_claims(token: &str) -> Option<Map<String, Value>> {
    let mut parts = token.split('.');
    let (_, payload, _, None) = (parts.next()?, parts.next()?, parts.next()?, parts.next()) else {
        return None;
    };
    let bytes = URL_SAFE_NO_PAD.decode(payload).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Why a token is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum JwtRefusal {
    /// No key of the set has the token's key id (or fits its algorithm).
    UnknownKey,
    /// The check failed: signature, issuer, audience, time, subject.
    Invalid(String),
}

/// Checks a token against one rule with its issuer's key set: the claims
/// when it passes.
pub(super) fn verify(
    token: &str,
    rule: &JwtIssuer,
    keys: &JwkSet,
) -> Result<Map<String, Value>, JwtRefusal> {
    let header = decode_header(token).map_err(|e| JwtRefusal::Invalid(e.to_string()))?;
    let candidates = keys
        .keys
        .iter()
        .filter(|k| header.kid.is_none() || k.common.key_id.as_deref() == header.kid.as_deref());
    let mut last = JwtRefusal::UnknownKey;
    for jwk in candidates {
        // Symmetric keys never: a public key set must not become an HMAC
        // secret (algorithm confusion).
        if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
            continue;
        }
        if jwk
            .common
            .key_algorithm
            .is_some_and(|a| format!("{a:?}") != format!("{:?}", header.alg))
        {
            continue;
        }
        let Ok(key) = DecodingKey::from_jwk(jwk) else {
            continue;
        };
        let mut v = Validation::new(header.alg);
        v.leeway = LEEWAY_SECONDS;
        v.validate_nbf = true;
        v.set_issuer(&[rule.issuer.as_str()]);
        v.set_audience(&[rule.audience.as_str()]);
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        match decode::<Map<String, Value>>(token, &key, &v) {
            Ok(data) => return subject_matches(rule, data.claims),
            Err(e) => last = JwtRefusal::Invalid(e.to_string()),
        }
    }
    Err(last)
}

fn subject_matches(
    rule: &JwtIssuer,
    claims: Map<String, Value>,
) -> Result<Map<String, Value>, JwtRefusal> {
    match &rule.subject {
        Some(s) if claims.get("sub").and_then(Value::as_str) != Some(s.as_str()) => Err(
            JwtRefusal::Invalid("the subject is not the rule's".to_owned()),
        ),
        _ => Ok(claims),
    }
}

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
