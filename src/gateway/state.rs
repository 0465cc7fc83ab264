//! What the gateway's tasks share: the admission core behind one lock, the
//! waiters of its queued tickets, the replica count, the last good config,
//! and the per-lane meters of the config in force. Installing a config and
//! re-sharing the rates happen here; every decision is the core's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use lanes::{Core, GatewayConfig, Resolution, Ticket};
use tokio::sync::{Notify, oneshot};

use super::args::GatewayArgs;
use super::body_budget::BodyBudget;
use super::decision::{DecisionLog, IdMaker};
use super::dispatch::{Dispatch, Finished, InFlightSink};
use super::fleet_share::Fleet;
use super::identity::Identity;
use super::metrics::{ConfigLoad, GatewayMetrics, LaneMeter};
use super::route_health::RouteHealth;
use super::route_metrics::RouteMetrics;
use super::settle::settle;
use super::surface::Surface;
use super::token_size::RulesInForce;
use super::tokenizer::Tokenizers;
use super::upstream::Upstream;

/// A waiting request's answer: its resolution and, for a pass, what to send
/// (already counted in flight).
pub(super) type Resolved = (Resolution, Option<Dispatch>);

/// The shared state of one gateway process.
pub(super) struct Gateway {
    pub(super) args: GatewayArgs,
    start: Instant,
    pub(super) state: Mutex<State>,
    pub(super) wake: Notify,
    pub(super) metrics: GatewayMetrics,
    pub(super) upstream: Upstream,
    /// The paths forwarded.
    pub(super) surface: Surface,
    /// New request ids.
    pub(super) ids: IdMaker,
    /// Which decisions get a log line.
    pub(super) decisions: DecisionLog,
    /// Who may use which lane (from the config in force and `--credentials`).
    pub(super) identity: Arc<Identity>,
    /// The fleet's shared state, with `--shared-state`.
    pub(super) fleet: Option<Arc<Fleet>>,
    /// The routes' tokenizers (`--tokenizer`, installed by `run`).
    pub(super) tokenizers: Tokenizers,
    /// What the request path reads of each lane before admission, for the
    /// config in force (replaced with it; read without the lock).
    pub(super) rules: ArcSwap<RulesInForce>,
    /// The memory request bodies hold (`--max-body-memory-bytes`).
    pub(super) bodies: Arc<BodyBudget>,
}

/// Everything under the lock.
pub(super) struct State {
    pub(super) core: Option<Core>,
    /// The meters of the config in force, by lane index.
    pub(super) meters: Arc<Vec<LaneMeter>>,
    pub(super) waiters: HashMap<Ticket, oneshot::Sender<Resolved>>,
    pub(super) replicas: u32,
    /// Whether `replicas` is known: always with `--replicas`; with
    /// `--endpoints-service` once the EndpointSlices have been listed.
    /// Until then the gateway is not ready.
    pub(super) replicas_known: bool,
    /// The last good config, to rebuild the core when N changes.
    pub(super) last_good: Option<GatewayConfig>,
}

/// Wall-clock seconds (to place grants' `expiresAt` on the monotonic clock).
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Gateway {
    /// A gateway with no config yet.
    pub(super) fn new(args: GatewayArgs, replicas_known: bool) -> Gateway {
        let replicas = args.replicas.unwrap_or(1).max(1);
        let metrics = GatewayMetrics::new();
        metrics.replicas(replicas);
        Gateway {
            upstream: Upstream::new(
                &args,
                RouteHealth::new(RouteMetrics::new(metrics.registry())),
            ),
            surface: Surface::new(&args.allow_paths),
            ids: IdMaker::new(),
            decisions: DecisionLog::new(
                args.decision_log_sample,
                args.decision_log_refusals_per_second,
            ),
            identity: Arc::new(Identity::new(&args.identity)),
            fleet: Fleet::from_args(&args.fleet, metrics.registry(), 0.0),
            tokenizers: Tokenizers::new(metrics.registry()),
            rules: ArcSwap::from_pointee(RulesInForce::default()),
            bodies: BodyBudget::new(args.max_body_memory_bytes, metrics.body_bytes_held()),
            start: Instant::now(),
            state: Mutex::new(State {
                core: None,
                meters: Arc::new(Vec::new()),
                waiters: HashMap::new(),
                replicas,
                replicas_known,
                last_good: None,
            }),
            wake: Notify::new(),
            metrics,
            args,
        }
    }

    /// Monotonic seconds since start: the core's clock.
    pub(super) fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// The lock (a panic while holding it is a bug; its state is still the
    /// core's own, so go on with it).
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Installs a config (the first, or a swap), or refuses it and keeps the
    /// last good one. `source` names where it came from, for the log.
    pub(super) fn install(&self, cfg: GatewayConfig, source: &str) {
        let now = self.now();
        let mut st = self.lock();
        let same = st
            .last_good
            .as_ref()
            .is_some_and(|g| !cfg.content_hash.is_empty() && g.content_hash == cfg.content_hash);
        if same {
            self.metrics.config_load(ConfigLoad::Unchanged);
            return;
        }
        let share = 1.0 / f64::from(st.replicas.max(1));
        let loaded = match self.upstream.unrouted(&cfg) {
            Some((lane, route)) => Err(format!(
                "lane {lane:?} uses route {route:?}, which no --route names"
            )),
            None => st
                .put(cfg.clone(), share, now, &self.metrics)
                .map_err(|e| e.to_string()),
        };
        if let Err(e) = loaded {
            self.metrics.config_load(ConfigLoad::Invalid);
            match &st.last_good {
                Some(g) => tracing::error!(source, error = %e, kept = %g.content_hash,
                    "gateway config refused; keeping the last good one"),
                None => tracing::error!(source, error = %e,
                    "gateway config refused; no config loaded yet, every request gets 503 until a valid one arrives"),
            }
            return;
        }
        self.metrics.config_in_force(&cfg);
        self.metrics.config_load(ConfigLoad::Loaded);
        tracing::info!(
            source,
            profile = %cfg.profile,
            mode = cfg.mode.as_str(),
            level = cfg.level,
            hash = %cfg.content_hash,
            previous = ?st.last_good.as_ref().map(|g| &g.content_hash),
            "gateway config loaded"
        );
        if let Some(core) = &st.core {
            self.rules
                .store(Arc::new(RulesInForce::of(core, &self.tokenizers)));
        }
        self.identity.config_installed(&cfg.lanes);
        self.upstream.health.configure(cfg.breakers.as_ref());
        st.last_good = Some(cfg);
        drop(st);
        self.wake.notify_one();
    }

    /// A config source failed; `invalid` when it was read but is no
    /// `lanes.json`.
    pub(super) fn source_failed(&self, source: &str, why: &str, invalid: bool) {
        self.metrics.config_load(if invalid {
            ConfigLoad::Invalid
        } else {
            ConfigLoad::Unreadable
        });
        let kept = self
            .lock()
            .last_good
            .as_ref()
            .map(|g| g.content_hash.clone());
        match kept {
            Some(hash) => tracing::error!(source, error = why, kept = %hash,
                "gateway config not loaded; keeping the last good one"),
            None => tracing::error!(
                source,
                error = why,
                "gateway config not loaded; no config loaded yet, every request gets 503 until a valid one arrives"
            ),
        }
    }

    /// N gateway replicas share the rates now.
    pub(super) fn reshare(&self, n: u32) {
        let now = self.now();
        let mut st = self.lock();
        st.replicas_known = true;
        if st.replicas == n {
            return;
        }
        tracing::info!(
            from = st.replicas,
            to = n,
            "gateway replicas changed; re-sharing the rates"
        );
        st.replicas = n;
        self.metrics.replicas(n);
        if let Some(cfg) = st.last_good.clone()
            && let Err(e) = st.put(cfg, 1.0 / f64::from(n), now, &self.metrics)
        {
            tracing::error!(error = %e, "re-sharing the config failed");
        }
        drop(st);
        self.wake.notify_one();
    }
}

impl Gateway {
    /// Under the lock: a pass counted in flight, with what it takes
    /// upstream.
    pub(super) fn dispatch(
        self: &Arc<Self>,
        core: &mut Core,
        meters: &Arc<Vec<LaneMeter>>,
        pass: &lanes::Pass,
        now: f64,
    ) -> Dispatch {
        core.started(now);
        self.metrics.in_flight(1);
        Dispatch::new(
            Arc::clone(self) as Arc<dyn InFlightSink>,
            core,
            meters,
            pass,
        )
    }
}

impl InFlightSink for Gateway {
    fn finished(&self, done: Finished) {
        self.metrics.in_flight(-1);
        if let Some(seconds) = done.first_byte {
            self.metrics.tokens.first_byte(&done.lane, seconds);
        }
        let now = self.now();
        let mut wake = false;
        let mut st = self.lock();
        let State { core, meters, .. } = &mut *st;
        if let Some(core) = core.as_mut() {
            wake |= settle(core, meters, &self.metrics.tokens, &done, now);
            if let Some(seconds) = done.served {
                core.served(&done.lane, now, seconds);
            }
            // A slot of the in-flight limit a waiting request was held for.
            wake |= core.finished(now, done.latency);
            // A request of a tenant that was at its maximum may go now.
            wake |= done.tenant.is_some_and(|t| core.release_tenant(&t));
        }
        drop(st);
        if wake {
            self.wake.notify_one();
        }
    }
}

impl State {
    /// Builds or swaps the core; waiting requests of removed lanes are
    /// answered.
    fn put(
        &mut self,
        cfg: GatewayConfig,
        share: f64,
        now: f64,
        metrics: &GatewayMetrics,
    ) -> Result<(), lanes::ConfigError> {
        let meters = metrics.lanes(&cfg);
        let refused = match self.core.as_mut() {
            Some(core) => core.swap(cfg, share, now, unix_now())?,
            None => {
                self.core = Some(Core::new(cfg, share, now, unix_now())?);
                Vec::new()
            }
        };
        self.meters = Arc::new(meters);
        for (ticket, r) in refused {
            if let Some(tx) = self.waiters.remove(&ticket) {
                let _ = tx.send((r, None));
            }
        }
        Ok(())
    }
}

/// Resolves queued requests when their turn comes or their wait runs out,
/// and keeps the queue and pressure gauges current.
pub(super) async fn drive(gw: Arc<Gateway>) {
    loop {
        let wake = poll_once(&gw);
        let sleep = wake.map_or(Duration::from_millis(250), |s| {
            Duration::from_secs_f64(s.min(0.25)).max(Duration::from_micros(200))
        });
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = gw.wake.notified() => {}
        }
    }
}

/// One poll of the core: seconds until the next one is due.
fn poll_once(gw: &Arc<Gateway>) -> Option<f64> {
    let now = gw.now();
    let mut st = gw.lock();
    let State {
        core,
        waiters,
        meters,
        ..
    } = &mut *st;
    let core = core.as_mut()?;
    let meters = Arc::clone(meters);
    for (ticket, r) in core.poll(now) {
        // A send fails only when the client went away as its turn came:
        // nothing is started for it.
        let Some(tx) = waiters.remove(&ticket) else {
            continue;
        };
        let dispatch = match &r {
            lanes::Resolution::Pass(p) => Some(gw.dispatch(core, &meters, p, now)),
            lanes::Resolution::Refuse(_) => None,
        };
        if let Err((_, Some(d))) = tx.send((r, dispatch)) {
            let (slot, charge) = d.disarm();
            core.finished(now, f64::NAN);
            if let Some(c) = charge {
                // It never went upstream: its reservation stands, its
                // long-context place is given back.
                core.settle(&c, None, now);
            }
            if let Some(t) = slot {
                core.release_tenant(&t);
            }
            gw.metrics.in_flight(-1);
        }
    }
    // The meters were made from the config the core holds: one per lane.
    for (i, m) in meters.iter().enumerate() {
        m.queue_depth(core.queue_depth(i));
        m.expected_service(core.last_expected_service(i));
    }
    gw.metrics.pressure(core.pressure());
    gw.metrics
        .capacity
        .observe(now, core.saturated(), core.in_flight_limit());
    core.next_wake(now).map(|t| (t - now).max(0.0))
}
