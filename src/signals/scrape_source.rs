//! The controller's scrape source: rounds of pod scrapes that run beside the
//! reconcile, never inside it for longer than one pod may take.
//!
//! A reconcile that finds the last round older than `intervalSeconds` starts
//! a round (one at a time per profile) and waits for it at most
//! `timeoutSeconds` + 1 s. A round that takes longer (many slow pods, a
//! `maxConcurrency` too small for the pool) goes on by itself; the reconcile
//! meanwhile uses the last round while it is younger than twice
//! `intervalSeconds`, and after that has every total Unknown (reason
//! `slow`). When the late round ends it triggers the profile's reconcile, so
//! its evidence is used at once, not at the next resync.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use kube::ResourceExt;
use tokio::sync::watch;

use super::scrape::{client, nothing_scraped, scrape_pool, to_output};
use super::{SignalSource, SourceInput, SourceOutput, Trigger, Triggers};
use crate::api::CapacityProfile;
use crate::api::profile::ScrapeSignals;
use crate::metrics::Metrics;
use crate::policy::key;

/// The controller's scrape source. Profiles without `spec.signals.scrape`
/// get nothing from it.
pub struct ScrapeSource {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    metrics: Option<Metrics>,
    profiles: Mutex<HashMap<String, Rounds>>,
    triggers: Triggers,
    next_round: AtomicU64,
}

/// One profile's rounds, for one scrape spec (a changed spec starts over).
struct Rounds {
    spec: ScrapeSignals,
    /// The last round that ended: when it started (Unix seconds) and what
    /// it found.
    last: Option<(i64, SourceOutput)>,
    running: Option<Running>,
}

/// A round under way.
struct Running {
    /// Which round (ids are never reused).
    id: u64,
    /// Becomes true when the round has ended.
    done: watch::Receiver<bool>,
    /// A reconcile stopped waiting for it: trigger one when it ends.
    late: bool,
}

/// What a round needs to know about its profile.
struct RoundOf {
    namespace: String,
    name: String,
    spec: ScrapeSignals,
    started: i64,
    id: u64,
}

impl ScrapeSource {
    /// A source reporting errors to `metrics`.
    pub fn new(metrics: Option<Metrics>) -> Self {
        Self {
            inner: Arc::new(Inner {
                http: client(),
                metrics,
                profiles: Mutex::new(HashMap::new()),
                triggers: Triggers::default(),
                next_round: AtomicU64::new(0),
            }),
        }
    }

    /// Collects one profile's scrape signals: the last round's while it is
    /// younger than `intervalSeconds`; otherwise a new round's, waited for
    /// at most `timeoutSeconds` + 1 s.
    pub async fn observe(&self, input: &SourceInput<'_>) -> SourceOutput {
        let profile = input.profile;
        let Some(cfg) = profile
            .spec
            .signals
            .as_ref()
            .and_then(|s| s.scrape.as_ref())
        else {
            self.forget_profile(profile);
            return SourceOutput::default();
        };
        let round = RoundOf {
            namespace: profile.namespace().unwrap_or_default(),
            name: profile.name_any(),
            spec: cfg.clone(),
            started: input.now,
            id: self.inner.next_round.fetch_add(1, Ordering::Relaxed),
        };
        let pkey = key(&round.namespace, &round.name);
        let mut done = match self.fresh_or_start(&pkey, round, input) {
            None => return nothing_scraped(cfg, "the pod index has not synced yet", "unsynced").0,
            Some(Ok(out)) => return out,
            Some(Err(done)) => done,
        };
        let wait = Duration::from_secs(cfg.timeout_seconds.max(1) as u64 + 1);
        let ended = tokio::time::timeout(wait, done.wait_for(|d| *d)).await;
        if ended.is_err() {
            self.mark_late(&pkey);
        }
        self.result(&pkey, cfg, input.now)
    }

    /// The last round's output if it is fresh (`Ok`), or the round to wait
    /// for (`Err`), started here if none is under way. `None`: nothing can
    /// be scraped yet (the pod index has not synced).
    #[allow(clippy::type_complexity)]
    fn fresh_or_start(
        &self,
        pkey: &str,
        round: RoundOf,
        input: &SourceInput<'_>,
    ) -> Option<Result<SourceOutput, watch::Receiver<bool>>> {
        let mut profiles = self.inner.profiles.lock().expect("not poisoned");
        if profiles.get(pkey).is_some_and(|r| r.spec != round.spec) {
            profiles.remove(pkey);
        }
        if profiles.len() > 4096 {
            profiles.retain(|_, r| r.running.is_some());
        }
        let rounds = profiles.entry(pkey.to_string()).or_insert_with(|| Rounds {
            spec: round.spec.clone(),
            last: None,
            running: None,
        });
        if let Some((at, out)) = &rounds.last
            && input.now - at < round.spec.interval_seconds
        {
            return Some(Ok(out.clone()));
        }
        if let Some(r) = &rounds.running {
            return Some(Err(r.done.clone()));
        }
        let pods = input.pods?;
        let targets: Vec<(String, String)> = pods
            .iter()
            .filter(|p| p.signals().is_ready())
            .filter_map(|p| p.ip.clone().map(|ip| (p.name.clone(), ip)))
            .collect();
        let (tx, rx) = watch::channel(false);
        rounds.running = Some(Running {
            id: round.id,
            done: rx.clone(),
            late: false,
        });
        tokio::spawn(Inner::round(self.inner.clone(), round, targets, tx));
        Some(Err(rx))
    }

    /// What the reconcile gets now: the last round while it is younger than
    /// twice `intervalSeconds`, else every total Unknown.
    fn result(&self, pkey: &str, cfg: &ScrapeSignals, now: i64) -> SourceOutput {
        let profiles = self.inner.profiles.lock().expect("not poisoned");
        let rounds = profiles.get(pkey).filter(|r| &r.spec == cfg);
        match rounds.and_then(|r| r.last.as_ref()) {
            Some((at, out)) if now - at < cfg.interval_seconds.saturating_mul(2) => out.clone(),
            Some((at, _)) => {
                let why = format!(
                    "slow: the last scrape round ended {}s ago and the next one is still running (raise maxConcurrency or lower timeoutSeconds)",
                    now - at
                );
                nothing_scraped(cfg, &why, "slow").0
            }
            None => nothing_scraped(cfg, "slow: the first scrape round is still running", "slow").0,
        }
    }

    fn mark_late(&self, pkey: &str) {
        let mut profiles = self.inner.profiles.lock().expect("not poisoned");
        if let Some(r) = profiles.get_mut(pkey).and_then(|r| r.running.as_mut()) {
            r.late = true;
        }
    }

    fn forget_profile(&self, profile: &CapacityProfile) {
        let pkey = key(
            &profile.namespace().unwrap_or_default(),
            &profile.name_any(),
        );
        self.inner
            .profiles
            .lock()
            .expect("not poisoned")
            .remove(&pkey);
    }
}

impl Inner {
    /// One round: scrape, record, and trigger the profile's reconcile if a
    /// reconcile stopped waiting for it.
    async fn round(
        self: Arc<Self>,
        round: RoundOf,
        targets: Vec<(String, String)>,
        done: watch::Sender<bool>,
    ) {
        let results = scrape_pool(&self.http, &round.spec, &targets).await;
        let (out, reasons) = to_output(&round.spec, &results);
        let pkey = key(&round.namespace, &round.name);
        self.record_metrics(&pkey, &reasons);
        let late = {
            let mut profiles = self.profiles.lock().expect("not poisoned");
            let this = |r: &&mut Rounds| r.running.as_ref().is_some_and(|r| r.id == round.id);
            match profiles.get_mut(&pkey).filter(this) {
                Some(r) => {
                    r.last = Some((round.started, out));
                    r.running.take().is_some_and(|r| r.late)
                }
                None => false,
            }
        };
        let _ = done.send(true);
        if late {
            self.triggers.send(&round.namespace, &round.name);
        }
    }

    fn record_metrics(&self, pkey: &str, reasons: &BTreeMap<String, String>) {
        let Some(m) = &self.metrics else {
            return;
        };
        for s in ["scrape:inFlight", "scrape:queueDepth"] {
            if reasons.contains_key(s) {
                let _ = m.signal_age.remove_label_values(&[pkey, s]);
            } else {
                m.signal_age.with_label_values(&[pkey, s]).set(0.0);
            }
        }
        for (s, r) in reasons {
            m.signal_errors.with_label_values(&[pkey, s, r]).inc();
        }
    }
}

impl SignalSource for ScrapeSource {
    fn collect<'a>(&'a self, input: &'a SourceInput<'a>) -> BoxFuture<'a, SourceOutput> {
        Box::pin(self.observe(input))
    }

    fn attach(&self, scope: &Option<String>, trigger: Trigger) {
        self.inner.triggers.attach(scope, trigger);
    }

    fn detach(&self, scope: &Option<String>) {
        self.inner.triggers.detach(scope);
        let prefix = scope.as_ref().map(|ns| format!("{ns}/"));
        self.inner
            .profiles
            .lock()
            .expect("not poisoned")
            .retain(|k, _| prefix.as_ref().is_some_and(|p| !k.starts_with(p)));
    }

    fn forget(&self, namespace: &str, name: &str) {
        self.inner
            .profiles
            .lock()
            .expect("not poisoned")
            .remove(&key(namespace, name));
    }
}
