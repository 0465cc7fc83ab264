//! Kubernetes ServiceAccount tokens: a TokenReview with the gateway's
//! audience (`--token-audience`) asks the API server whether a token is
//! valid and whose it is. Answers are cached briefly, in a bounded cache
//! keyed by the token's hash, and never past the token's own `exp`; a
//! failed review (the API server unreachable) is never cached. A token is
//! only sent for review once `resolve` has checked it against the cluster's
//! ServiceAccount keys (signature, audience, `exp`) and found it claims a
//! listed ServiceAccount: a made-up token never spends the review budget.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use lanes::ServiceAccountName;

use super::api_key::sha256;

/// How long an answer of the API server is reused: a deleted
/// ServiceAccount's token stops working within this.
pub(super) const REVIEW_TTL: Duration = Duration::from_secs(10);
/// Most answers kept.
pub(super) const MAX_CACHED: usize = 10_000;
/// Longest wait for the API server.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// Most TokenReviews sent per second (answers from the cache are free), a
/// backstop for the API server: only tokens the cluster signed reach it
/// (made-up ones are refused by their signature first); beyond it a token
/// that needs a review is answered 503.
pub(super) const MAX_REVIEWS_PER_SECOND: u32 = 100;
const PREFIX: &str = "system:serviceaccount:";

/// What the API server said of a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Reviewed {
    /// Valid for the audience, of this ServiceAccount.
    Authenticated(ServiceAccountName),
    /// Not valid (expired, wrong audience, its ServiceAccount deleted, not
    /// a ServiceAccount's).
    Rejected,
}

/// The ServiceAccount a `system:serviceaccount:NS:NAME` user name names.
pub(super) fn service_account_of(username: &str) -> Option<ServiceAccountName> {
    let (ns, name) = username.strip_prefix(PREFIX)?.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then(|| ServiceAccountName {
        namespace: ns.to_owned(),
        name: name.to_owned(),
    })
}

/// How long an answer given `now` may be reused: [`REVIEW_TTL`], and never
/// past the token's `exp` (seconds since the epoch, at `wall`).
pub(super) fn reuse_until(now: Instant, wall: SystemTime, exp: Option<u64>) -> Instant {
    let left = exp.map_or(REVIEW_TTL, |exp| {
        let at = UNIX_EPOCH + Duration::from_secs(exp);
        at.duration_since(wall).unwrap_or(Duration::ZERO)
    });
    now + left.min(REVIEW_TTL)
}

/// The bounded cache, pure (the time is an argument).
#[derive(Debug, Default)]
pub(super) struct ReviewCache {
    /// The answer, and the instant it stops being reused.
    entries: HashMap<[u8; 32], (Reviewed, Instant)>,
}

impl ReviewCache {
    /// A fresh answer for the token's hash.
    pub(super) fn get(&self, key: &[u8; 32], now: Instant) -> Option<Reviewed> {
        self.entries
            .get(key)
            .filter(|(_, until)| now < *until)
            .map(|(r, _)| r.clone())
    }

    /// Keeps an answer until `until`; when full, the stale ones go, and if
    /// none is stale, everything (the cache only saves API calls).
    pub(super) fn put(&mut self, key: [u8; 32], r: Reviewed, now: Instant, until: Instant) {
        if self.entries.len() >= MAX_CACHED {
            self.entries.retain(|_, (_, u)| now < *u);
            if self.entries.len() >= MAX_CACHED {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (r, until));
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// At most [`MAX_REVIEWS_PER_SECOND`] reviews in any one-second window,
/// pure (the time is an argument).
#[derive(Debug)]
pub(super) struct ReviewBudget {
    window: Option<Instant>,
    sent: u32,
}

impl ReviewBudget {
    /// Whether one more review may be sent now (and it is counted).
    pub(super) fn take(&mut self, now: Instant) -> bool {
        if self
            .window
            .is_none_or(|w| now.duration_since(w) >= Duration::from_secs(1))
        {
            self.window = Some(now);
            self.sent = 0;
        }
        if self.sent >= MAX_REVIEWS_PER_SECOND {
            return false;
        }
        self.sent += 1;
        true
    }
}

/// The TokenReview client.
pub(super) struct Reviewer {
    audience: String,
    cache: Mutex<ReviewCache>,
    budget: Mutex<ReviewBudget>,
}

impl Reviewer {
    pub(super) fn new(audience: String) -> Reviewer {
        Reviewer {
            audience,
            cache: Mutex::new(ReviewCache::default()),
            budget: Mutex::new(ReviewBudget {
                window: None,
                sent: 0,
            }),
        }
    }

    /// The audience a token must be issued for.
    pub(super) fn audience(&self) -> &str {
        &self.audience
    }

    /// The API server's answer for a token (cached, never past `exp`, the
    /// token's own expiry), or why there is none.
    pub(super) async fn review(
        &self,
        client: Option<&kube::Client>,
        token: &str,
        exp: Option<u64>,
    ) -> Result<Reviewed, String> {
        let key = sha256(token.as_bytes());
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key, Instant::now());
        if let Some(r) = cached {
            return Ok(r);
        }
        let client = client
            .cloned()
            .ok_or("no Kubernetes client (ServiceAccount tokens need the API server)")?;
        let allowed = self
            .budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(Instant::now());
        if !allowed {
            return Err(format!(
                "more than {MAX_REVIEWS_PER_SECOND} TokenReviews in a second; not sent"
            ));
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(client);
        let answer =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| "the TokenReview timed out".to_owned())?
                .map_err(|e| format!("the TokenReview failed: {e}"))?;
        let r = self.verdict(answer);
        let now = Instant::now();
        let until = reuse_until(now, SystemTime::now(), exp);
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .put(key, r.clone(), now, until);
        Ok(r)
    }

    /// Authenticated, for our audience, as a ServiceAccount.
    fn verdict(&self, answer: TokenReview) -> Reviewed {
        let Some(st) = answer.status else {
            return Reviewed::Rejected;
        };
        let for_us = st
            .audiences
            .as_ref()
            .is_some_and(|a| a.contains(&self.audience));
        match (st.authenticated, for_us, st.user.and_then(|u| u.username)) {
            (Some(true), true, Some(user)) => {
                service_account_of(&user).map_or(Reviewed::Rejected, Reviewed::Authenticated)
            }
            _ => Reviewed::Rejected,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_service_account_user_name_names_one() {
        assert_eq!(
            service_account_of("system:serviceaccount:ns:bot"),
            Some(ServiceAccountName {
                namespace: "ns".into(),
                name: "bot".into()
            })
        );
        for not in [
            "system:serviceaccount:ns",
            "system:serviceaccount::bot",
            "system:serviceaccount:ns:",
            "system:serviceaccount:ns:bot:x",
            "kubernetes-admin",
            "system:node:n1",
        ] {
            assert_eq!(service_account_of(not), None, "{not}");
        }
    }

    #[test]
    fn answers_expire_and_the_cache_stays_bounded() {
        let mut c = ReviewCache::default();
        let t0 = Instant::now();
        c.put([1; 32], Reviewed::Rejected, t0, t0 + REVIEW_TTL);
        assert_eq!(
            c.get(&[1; 32], t0 + REVIEW_TTL / 2),
            Some(Reviewed::Rejected)
        );
        assert_eq!(
            c.get(&[1; 32], t0 + REVIEW_TTL),
            None,
            "stale after the TTL"
        );
        for i in 0..MAX_CACHED + 5 {
            let mut k = [0u8; 32];
            k[..8].copy_from_slice(&(i as u64).to_le_bytes());
            c.put(k, Reviewed::Rejected, t0, t0 + REVIEW_TTL);
        }
        assert!(c.len() <= MAX_CACHED, "{}", c.len());
    }

    #[test]
    fn an_answer_is_never_reused_past_the_tokens_exp() {
        let (t0, wall) = (Instant::now(), SystemTime::now());
        let secs = wall.duration_since(UNIX_EPOCH).unwrap().as_secs();
        // `exp` in 3 s: 3 s at most (the second `wall` is into, at most).
        let until = reuse_until(t0, wall, Some(secs + 3));
        assert!(until <= t0 + Duration::from_secs(3), "{:?}", until - t0);
        assert!(until > t0 + Duration::from_secs(2), "{:?}", until - t0);
        // Already past: not at all.
        assert_eq!(reuse_until(t0, wall, Some(secs - 1)), t0);
        // Far ahead, or unknown: the TTL.
        assert_eq!(reuse_until(t0, wall, Some(secs + 3600)), t0 + REVIEW_TTL);
        assert_eq!(reuse_until(t0, wall, None), t0 + REVIEW_TTL);
        let mut c = ReviewCache::default();
        c.put([2; 32], Reviewed::Rejected, t0, until);
        assert_eq!(c.get(&[2; 32], until), None, "gone at exp");
    }

    #[test]
    fn reviews_are_limited_per_second() {
        let mut b = ReviewBudget {
            window: None,
            sent: 0,
        };
        let t0 = Instant::now();
        let sent = (0..MAX_REVIEWS_PER_SECOND + 50)
            .filter(|_| b.take(t0 + Duration::from_millis(500)))
            .count();
        assert_eq!(sent as u32, MAX_REVIEWS_PER_SECOND);
        assert!(!b.take(t0 + Duration::from_millis(900)), "same window");
        assert!(b.take(t0 + Duration::from_millis(1600)), "a new window");
    }

    #[test]
    fn the_answer_must_be_authenticated_for_our_audience() {
        let r = Reviewer::new("lanekeeper".into());
        let answer = |auth: bool, aud: Option<&[&str]>, user: &str| -> TokenReview {
            serde_json::from_value(serde_json::json!({
                "spec": {},
                "status": {"authenticated": auth,
                           "audiences": aud,
                           "user": {"username": user}}
            }))
            .unwrap()
        };
        let sa = "system:serviceaccount:ns:bot";
        assert!(matches!(
            r.verdict(answer(true, Some(&["lanekeeper"]), sa)),
            Reviewed::Authenticated(_)
        ));
        assert_eq!(
            r.verdict(answer(false, Some(&["lanekeeper"]), sa)),
            Reviewed::Rejected
        );
        assert_eq!(
            r.verdict(answer(true, Some(&["other"]), sa)),
            Reviewed::Rejected
        );
        assert_eq!(r.verdict(answer(true, None, sa)), Reviewed::Rejected);
        assert_eq!(
            r.verdict(answer(true, Some(&["lanekeeper"]), "alice")),
            Reviewed::Rejected
        );
    }
}
