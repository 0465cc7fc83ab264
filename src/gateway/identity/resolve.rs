//! The identities of one gateway (the index, the key hashes, the
//! TokenReview client and the key sets) and the resolution of a request to
//! its caller and lane.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, header};
use jsonwebtoken::jwk::JwkSet;
use lanes::{ApiKeySecret, LaneConfig};
use serde_json::{Map, Value};
use tokio::sync::watch;

use super::super::peer::PeerCertificate;
use super::api_key::{KeyStore, SecretKeys};
use super::certificate;
use super::credentials::Credentials;
use super::flags::IdentityArgs;
use super::index::{Grant, Index, NoLane, choose, grants};
use super::jwks::{KeySets, KeySource};
use super::jwt::{self, JwtRefusal};
use super::refused::AuthRefusal;
use super::service_account::{Reviewed, Reviewer, service_account_of};

/// The kinds of identity (logs and metrics name the kind, never the
/// credential).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IdentityKind {
    ApiKey,
    ServiceAccount,
    Jwt,
    Certificate,
}

impl IdentityKind {
    /// The name in logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            IdentityKind::ApiKey => "api_key",
            IdentityKind::ServiceAccount => "service_account",
            IdentityKind::Jwt => "jwt",
            IdentityKind::Certificate => "certificate",
        }
    }
}

/// An authenticated caller: its kind, the lane it sends into and the
/// tenant it is counted as there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    pub(crate) kind: IdentityKind,
    pub(crate) lane: String,
    pub(crate) tenant: String,
}

/// A credential as sent.
enum Presented<'a> {
    /// `Authorization: Bearer <token>`: a key, a JWT or a ServiceAccount
    /// token.
    Bearer(&'a str),
    /// `--api-key-header`: a key only.
    ApiKeyHeader(&'a str),
}

/// The identities of one gateway: the index, the key hashes, the
/// TokenReview client and the JWKS.
pub(crate) struct Identity {
    /// `--trust-lane-header`: no identity, the headers decide.
    pub(crate) trust: bool,
    api_key_header: Option<HeaderName>,
    index: RwLock<Arc<Index>>,
    lanes: Mutex<Vec<LaneConfig>>,
    file: Mutex<Option<Credentials>>,
    keys: RwLock<KeyStore>,
    client: OnceLock<kube::Client>,
    reviewer: Reviewer,
    jwks: KeySets,
    wanted: watch::Sender<BTreeSet<ApiKeySecret>>,
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl Identity {
    /// From the flags (an invalid `--api-key-header` was refused at start).
    pub(crate) fn new(args: &IdentityArgs) -> Identity {
        Identity {
            trust: args.trust_lane_header,
            api_key_header: args
                .api_key_header
                .as_deref()
                .and_then(|h| HeaderName::try_from(h).ok()),
            index: RwLock::new(Arc::new(Index::default())),
            lanes: Mutex::new(Vec::new()),
            file: Mutex::new(None),
            keys: RwLock::new(KeyStore::default()),
            client: OnceLock::new(),
            reviewer: Reviewer::new(args.token_audience.clone()),
            jwks: KeySets::new(),
            wanted: watch::channel(BTreeSet::new()).0,
        }
    }

    /// The Kubernetes client (Secrets, TokenReview, JWKS ConfigMaps).
    pub(crate) fn connect(&self, client: kube::Client) {
        let _ = self.client.set(client);
    }

    /// The Secrets the index names, followed by `watch::follow_secrets`.
    pub(crate) fn wanted_secrets(&self) -> watch::Receiver<BTreeSet<ApiKeySecret>> {
        self.wanted.subscribe()
    }

    /// A config is in force: its lanes' rules.
    pub(crate) fn config_installed(&self, lanes: &[LaneConfig]) {
        *self.lanes.lock().unwrap_or_else(|e| e.into_inner()) = lanes.to_vec();
        self.rebuild();
    }

    /// A credentials file was (re)loaded.
    pub(crate) fn credentials_loaded(&self, c: Credentials) {
        *self.file.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
        self.rebuild();
    }

    /// A Secret's keys now.
    pub(crate) fn secret_keys(&self, s: ApiKeySecret, keys: SecretKeys) {
        self.keys
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .put(s, keys);
    }

    /// A Secret's keys stop working.
    pub(crate) fn secret_gone(&self, s: &ApiKeySecret) {
        self.keys
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(s);
    }

    fn rebuild(&self) {
        let (ix, configured) = {
            let lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
            let file = self.file.lock().unwrap_or_else(|e| e.into_inner());
            let mut ix = Index::build(&lanes);
            if let Some(f) = file.as_ref() {
                f.add_to(&mut ix);
            }
            (ix, !lanes.is_empty())
        };
        if !self.trust && configured && ix.is_empty() {
            tracing::warn!(
                "no lane of the config lists clients and --credentials names none: every request gets 401"
            );
        }
        self.wanted.send_if_modified(|w| {
            let now = ix.secrets();
            let changed = *w != now;
            *w = now;
            changed
        });
        *self.index.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(ix);
    }

    fn index(&self) -> Arc<Index> {
        self.index.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The caller of a request and its lane, `None` with
    /// `--trust-lane-header`, or why it may send into no lane.
    pub(crate) async fn caller(
        &self,
        parts: &Parts,
        lane: Option<&str>,
    ) -> Result<Option<Caller>, AuthRefusal> {
        if self.trust {
            return Ok(None);
        }
        let ix = self.index();
        let (kind, found) = self.grants(&ix, parts).await?;
        match choose(found, lane) {
            Ok(Grant { lane, tenant }) => Ok(Some(Caller { kind, lane, tenant })),
            Err(NoLane::NotAllowed) => Err(AuthRefusal::LaneNotAllowed),
            Err(NoLane::NotNamed) => Err(AuthRefusal::LaneNotNamed),
        }
    }

    /// Removes the credential headers (`Authorization` and
    /// `--api-key-header`) from what goes upstream.
    pub(crate) fn strip_credentials(&self, headers: &mut HeaderMap) {
        headers.remove(header::AUTHORIZATION);
        if let Some(h) = &self.api_key_header {
            headers.remove(h);
        }
    }

    fn presented<'a>(&self, headers: &'a HeaderMap) -> Option<Presented<'a>> {
        let header_key = self
            .api_key_header
            .as_ref()
            .and_then(|h| headers.get(h))
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty());
        match header_key {
            Some(k) => Some(Presented::ApiKeyHeader(k)),
            None => bearer(headers).map(Presented::Bearer),
        }
    }

    /// The identity's grants: a token when one is sent, else a client
    /// certificate.
    async fn grants(
        &self,
        ix: &Index,
        parts: &Parts,
    ) -> Result<(IdentityKind, Vec<Grant>), AuthRefusal> {
        match self.presented(&parts.headers) {
            Some(Presented::ApiKeyHeader(k)) => {
                self.api_key(ix, k).ok_or(AuthRefusal::UnknownApiKey)
            }
            Some(Presented::Bearer(t)) => match self.api_key(ix, t) {
                Some(found) => Ok(found),
                None => self.token(ix, t).await,
            },
            None => match parts.extensions.get::<PeerCertificate>() {
                Some(cert) => {
                    let g = certificate::grants_of(ix, cert);
                    nonempty(
                        IdentityKind::Certificate,
                        g,
                        AuthRefusal::UnknownCertificate,
                    )
                }
                None => Err(AuthRefusal::NoCredential),
            },
        }
    }

    fn api_key(&self, ix: &Index, key: &str) -> Option<(IdentityKind, Vec<Grant>)> {
        let g = self
            .keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .grants(ix, key.as_bytes());
        (!g.is_empty()).then_some((IdentityKind::ApiKey, g))
    }

    /// A bearer token that is no key: a JWT of a listed issuer, or a token
    /// claiming to be a listed ServiceAccount.
    async fn token(&self, ix: &Index, t: &str) -> Result<(IdentityKind, Vec<Grant>), AuthRefusal> {
        let Some(claims) = jwt::unverified_claims(t) else {
            return Err(AuthRefusal::UnknownApiKey);
        };
        let claim = |c: &str| claims.get(c).and_then(|v| v.as_str());
        if let Some(iss) = claim("iss").filter(|i| ix.has_issuer(i)) {
            return self.jwt(ix, t, iss).await;
        }
        match claim("sub").map(|s| (s, service_account_of(s))) {
            Some((_, Some(sa))) if ix.service_accounts.contains_key(&sa) => {
                self.service_account(ix, t).await
            }
            Some((s, _)) if s.starts_with("system:serviceaccount:") => {
                Err(AuthRefusal::RejectedToken)
            }
            _ => Err(AuthRefusal::InvalidJwt),
        }
    }

    /// A token claiming a listed ServiceAccount: first checked here against
    /// the cluster's ServiceAccount keys (signature, audience, `exp`), so a
    /// made-up token is refused without a TokenReview and cannot spend the
    /// review budget of the tokens the cluster did issue; then reviewed.
    async fn service_account(
        &self,
        ix: &Index,
        t: &str,
    ) -> Result<(IdentityKind, Vec<Grant>), AuthRefusal> {
        let expect = jwt::Expect {
            issuer: None,
            audience: self.reviewer.audience(),
        };
        let claims = match self
            .verified(&KeySource::ServiceAccounts, |keys| {
                jwt::verify_signed(t, keys, &expect)
            })
            .await
        {
            Err(e) => {
                tracing::warn!(error = %e, "the cluster's ServiceAccount keys could not be read");
                return Err(AuthRefusal::Unavailable);
            }
            Ok(Err(_)) => return Err(AuthRefusal::RejectedToken),
            Ok(Ok(claims)) => claims,
        };
        let exp = jwt::expiry(&claims);
        match self.reviewer.review(self.client.get(), t, exp).await {
            Err(e) => {
                tracing::warn!(error = %e, "a ServiceAccount token could not be reviewed");
                Err(AuthRefusal::Unavailable)
            }
            Ok(Reviewed::Rejected) => Err(AuthRefusal::RejectedToken),
            Ok(Reviewed::Authenticated(sa)) => {
                let own = format!("{}/{}", sa.namespace, sa.name);
                let allowed = ix.service_accounts.get(&sa).into_iter().flatten();
                let g = grants(allowed, &own, &|_| None);
                nonempty(IdentityKind::ServiceAccount, g, AuthRefusal::RejectedToken)
            }
        }
    }

    /// A check of a token against a key set: with the kept set, and once
    /// more after a fetch when the set lacks the token's key id. `Err`: the
    /// set could not be read.
    async fn verified(
        &self,
        source: &KeySource,
        check: impl Fn(&JwkSet) -> Result<Map<String, Value>, JwtRefusal>,
    ) -> Result<Result<Map<String, Value>, JwtRefusal>, String> {
        let client = self.client.get();
        let set = self.jwks.get(client, source, false).await?;
        Ok(match check(&set) {
            Err(JwtRefusal::UnknownKey) => match self.jwks.get(client, source, true).await {
                Ok(set) => check(&set),
                Err(_) => Err(JwtRefusal::UnknownKey),
            },
            other => other,
        })
    }

    /// A JWT checked against every rule of its issuer; the grants of those
    /// it passes.
    async fn jwt(
        &self,
        ix: &Index,
        t: &str,
        iss: &str,
    ) -> Result<(IdentityKind, Vec<Grant>), AuthRefusal> {
        let mut out = Vec::new();
        let mut unreadable = false;
        for (rule, allowed) in ix.jwt.iter().filter(|(j, _)| j.issuer == iss) {
            let source = KeySource::Issuer(rule.jwks.clone());
            let Ok(checked) = self
                .verified(&source, |set| jwt::verify(t, rule, set))
                .await
            else {
                unreadable = true;
                continue;
            };
            if let Ok(claims) = checked {
                let own = claims
                    .get("sub")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default();
                let claim = |c: &str| claims.get(c).and_then(|v| v.as_str()).map(str::to_owned);
                out.extend(grants([allowed], own, &claim));
            }
        }
        let why = if unreadable {
            AuthRefusal::Unavailable
        } else {
            AuthRefusal::InvalidJwt
        };
        nonempty(IdentityKind::Jwt, out, why)
    }
}

fn nonempty(
    kind: IdentityKind,
    g: Vec<Grant>,
    otherwise: AuthRefusal,
) -> Result<(IdentityKind, Vec<Grant>), AuthRefusal> {
    if g.is_empty() {
        Err(otherwise)
    } else {
        Ok((kind, g))
    }
}
