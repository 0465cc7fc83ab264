//! The gateway's side of the fleet's shared state: a task that keeps each
//! lane's leased bucket, and the pool's spare bucket, topped up from the
//! shared store ahead of need (every [`lanes::fleet_lease::LEASE_SECONDS`], sized from the
//! replica's own recent demand and queue; the calls and their late answers
//! in `fleet_lease_calls`) and gives back what demand no longer needs, and
//! the fleet-wide
//! first sighting of a request id (a retry sent to another replica than its
//! original is a retry).
//!
//! Failure is safe, never open ([`FleetHealth`]): one failed or late call
//! puts the replica on its local 1/N share at once (the core's buckets
//! refill on their own again), with a log line and the mode metric; it
//! probes the store once a second and goes back to the fleet's budgets by
//! itself. A request never waits on the store beyond one call's deadline
//! (its sighting and its slot take run at once; a slot granted just as the
//! replica fell back is given back, one more call)
//! and is never failed because the store is down.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lanes::Core;
use lanes::fleet_mode::{FleetHealth, FleetMode};
use prometheus::Registry;

use super::fleet_args::FleetArgs;
use super::fleet_metrics::{FleetMetrics, StoreOp};
use super::fleet_store::FleetStore;
use super::fleet_store_slots::SlotSeen;

/// What the fleet's link needs of the gateway (implemented by the gateway's
/// shared state in `fleet_host`, so that this file does not import it).
pub(super) trait FleetHost: Send + Sync {
    /// The core's clock.
    fn now(&self) -> f64;
    /// Runs `f` on the core under the gateway's lock, if a config is loaded.
    fn with_core<R>(&self, f: impl FnOnce(&mut Core) -> R) -> Option<R>;
    /// Wakes the driver of waiting requests.
    fn wake(&self);
}

/// At most one warning this often while the store stays unusable.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Keys of the store start with this (then the profile and the lane).
const KEY_PREFIX: &str = "lanekeeper";

/// One replica's link to the fleet's shared state.
pub(super) struct Fleet {
    url: String,
    password: Option<String>,
    root_ca: Option<Vec<u8>>,
    deadline: Duration,
    store: Mutex<Option<FleetStore>>,
    health: Mutex<FleetHealth>,
    pub(super) metrics: FleetMetrics,
    /// This replica's name in the store's slot counts: random per process,
    /// and a new one after every fall back to the local share (see
    /// [`Fleet::replica`]).
    replica: Mutex<String>,
    /// What the store last said of each slot count this replica holds or
    /// asked for (see `fleet_slots`).
    pub(super) slot_seen: Mutex<HashMap<String, SlotSeen>>,
    /// The profile of the config in force and each lane's deadline in
    /// seconds (how long a request id is remembered), as of the last round.
    pub(super) lanes: Mutex<(String, HashMap<String, u64>)>,
    /// Deferrals the store has not taken yet (see `fleet_ids`).
    pub(super) pending_deferrals: Mutex<VecDeque<PendingDeferral>>,
    /// When the last warning about the store was logged.
    warned_at: Mutex<Option<std::time::Instant>>,
    /// The replicas sharing now, as a fraction of the fleet, and when it
    /// is next counted (see `fleet_counted`).
    pub(super) counted: Mutex<Counted>,
}

/// The fraction of the fleet's replicas that share its budgets through
/// the store (the others, cut off, enforce their 1/N share alone), and the
/// core's clock when it is next counted.
#[derive(Clone, Copy, Debug)]
pub(super) struct Counted {
    /// The fraction of the fleet noted as sharing.
    pub(super) fraction: f64,
    /// Replicas of the fleet not noted (cut off from the store).
    pub(super) cut_off: u64,
    /// Each replica's share (1/N) when counted.
    pub(super) share: f64,
    pub(super) due: f64,
}

/// A request id deferred while the store did not answer: written to the
/// store once it does, so that wherever the request comes back it is a
/// return, not a retry (its sighting may have reached the store late).
#[derive(Clone, Debug)]
pub(super) struct PendingDeferral {
    /// The store's name of its lane.
    pub(super) key: String,
    pub(super) id: String,
    /// How long it is remembered (the lane's deadline).
    pub(super) seconds: u64,
}

pub(super) fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Fleet {
    /// The link `--shared-state` asks for (none without it); `now` is the
    /// core's clock. The flags were checked at start ([`Fleet::check`]).
    pub(super) fn from_args(args: &FleetArgs, r: &Registry, now: f64) -> Option<Arc<Fleet>> {
        let url = args.url().ok().flatten()?.to_owned();
        tracing::info!(
            store = %store_host(&url),
            tls = url.starts_with("rediss://"),
            "shared state: lane budgets are shared through the store; this replica's 1/N share until it answers"
        );
        Some(Arc::new(Fleet {
            url,
            password: args.password().ok().flatten(),
            root_ca: args.ca().ok().flatten(),
            deadline: args.deadline(),
            store: Mutex::new(None),
            health: Mutex::new(FleetHealth::new(now)),
            metrics: FleetMetrics::new(r),
            replica: Mutex::new(replica_name()),
            slot_seen: Mutex::new(HashMap::new()),
            lanes: Mutex::new((String::new(), HashMap::new())),
            pending_deferrals: Mutex::new(VecDeque::new()),
            warned_at: Mutex::new(None),
            counted: Mutex::new(Counted {
                fraction: 1.0,
                cut_off: 0,
                share: 1.0,
                due: 0.0,
            }),
        }))
    }

    /// The flags' errors that stop the gateway starting: a URL that is not
    /// `redis://` or `rediss://`, an unreadable or empty password file.
    pub(super) fn check(args: &FleetArgs) -> Result<(), String> {
        args.url()?;
        args.ca()?;
        args.password().map(|_| ())
    }

    /// This replica's name in the store's slot counts now. Back on the
    /// local share the core forgets the slots it held, so the holdings
    /// under the old name must not be counted as its own again (they would
    /// be renewed and never used): each fall back takes a new name, and the
    /// old holdings run out with their lease.
    pub(super) fn replica(&self) -> String {
        locked(&self.replica).clone()
    }

    /// The mode now.
    pub(super) fn mode(&self) -> FleetMode {
        locked(&self.health).mode()
    }

    /// Whether to call the store at `now` (always when shared, a probe once
    /// a second when not).
    pub(super) fn may_call(&self, now: f64) -> bool {
        locked(&self.health).may_call(now)
    }

    /// The store, once connected.
    pub(super) fn connected(&self) -> Option<FleetStore> {
        locked(&self.store).clone()
    }

    /// The store, connected on first use (a probe).
    pub(super) async fn store(&self) -> Option<FleetStore> {
        if let Some(s) = locked(&self.store).clone() {
            return Some(s);
        }
        let prefix = KEY_PREFIX;
        let connected = FleetStore::connect_with(
            &self.url,
            self.password.as_deref(),
            self.root_ca.as_deref(),
            prefix,
            self.deadline,
        )
        .await;
        match connected {
            Ok(s) => {
                *locked(&self.store) = Some(s.clone());
                Some(s)
            }
            Err(e) => {
                if self.warn_now() {
                    tracing::warn!(
                        store = %store_host(&self.url),
                        error = %e,
                        "shared state: cannot connect to the store (address, password, TLS?); enforcing this replica's 1/N share"
                    );
                }
                None
            }
        }
    }

    /// A call failed or missed its deadline: the local share at once.
    pub(super) fn failed(&self, gw: &impl FleetHost, op: StoreOp, why: &str) {
        self.metrics.call(op, false);
        let now = gw.now();
        let Some(mode) = locked(&self.health).failed(now) else {
            if self.warn_now() {
                tracing::warn!(
                    error = why,
                    "shared state: the store still does not answer; enforcing this replica's 1/N share"
                );
            }
            return;
        };
        *locked(&self.warned_at) = Some(std::time::Instant::now());
        self.metrics.mode(mode);
        self.metrics.fell_back();
        *locked(&self.replica) = replica_name();
        locked(&self.slot_seen).clear();
        locked(&self.counted).due = 0.0;
        tracing::warn!(
            error = why,
            "shared state: the store is down or slow; enforcing this replica's 1/N share until it answers again"
        );
        gw.with_core(|core| core.set_leased(false));
        gw.wake();
    }

    /// Whether a warning about the store is due: at most one a minute
    /// while it stays unusable (the first at once).
    fn warn_now(&self) -> bool {
        let mut at = locked(&self.warned_at);
        if at.is_some_and(|t| t.elapsed() < WARN_EVERY) {
            return false;
        }
        *at = Some(std::time::Instant::now());
        true
    }

    /// A call answered in time: the fleet's budgets (again).
    pub(super) fn answered(&self, gw: &impl FleetHost, op: StoreOp) {
        self.metrics.call(op, true);
        let Some(mode) = locked(&self.health).answered() else {
            return;
        };
        self.metrics.mode(mode);
        tracing::info!("shared state: the store answers; enforcing the fleet's budgets");
        gw.with_core(|core| core.set_leased(true));
    }

    /// The store's name of a lane of the config in force, and its deadline.
    pub(super) fn lane_key(&self, lane: &str) -> Option<(String, u64)> {
        let l = locked(&self.lanes);
        let seconds = *l.1.get(lane)?;
        Some((format!("{}/{lane}", l.0), seconds))
    }
}

/// The store's host and port, for logs (never the password a URL may
/// hold).
pub(super) fn store_host(url: &str) -> String {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port().unwrap_or(6379))))
        .unwrap_or_else(|| "(unparsable URL)".to_owned())
}

/// A name for this replica's holdings in the store: random per process, so
/// a restarted replica's old holdings run out by themselves.
fn replica_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}
