//! The gateway's admission core: what `lanes.json` says, enforced request by
//! request.
//!
//! Pure and deterministic: no I/O, no clock of its own. Every call takes the
//! time (`now`, monotonic seconds as an `f64`) from its caller, so the
//! gateway drives it with the process clock and `simulate` with simulated
//! time, and tests step it by hand. One [`Core`] enforces one config (one
//! CapacityProfile's lanes); the gateway holds it behind a lock.
//!
//! The rules, as docs/gateway.md states them for users:
//!
//! - **Token bucket per lane** at `admittedRequestsPerSecond` with `burst`
//!   tokens; one request takes one token.
//! - **Floors are reserved here**: a lane's floor (`floorUnitsPerSecond`) is
//!   available to it at once, even when its last admitted rate was lower.
//!   When a lender uses more than its admitted rate, the lanes borrowing its
//!   idle floor are cut back by what the lender took back, at once (well
//!   within `releaseWithinSeconds`). A grant whose `expiresAt` passes
//!   without a renewed config stops on its own.
//! - **A bounded queue per lane** (`queue.maxDepth`, `queue.ttlSeconds`);
//!   a request that could not be served within its deadline (its expected
//!   wait plus the lane's `expectedServiceSeconds` would pass it) is refused
//!   at once instead of queued to die.
//! - **Tenant fairness inside a lane**: self-clocked weighted fair queueing
//!   by tenant (finish tag `F = max(V, F_prev) + cost / weight`, `V` the tag
//!   of the request served last), earliest first arrival first inside one
//!   tenant; requests without a tenant share one default tenant.
//! - **Retries**: the attempt number comes from the caller (the
//!   `x-lanekeeper-attempt` header); a request id seen again within the
//!   lane's deadline is a retry whatever the header says; attempts beyond
//!   `retry.maxAttempts` are refused, and so are retries beyond
//!   `retry.budgetPercent` of the originals of the last
//!   [`RETRY_WINDOW_SECONDS`]. A request coming back after a deferral is
//!   neither an original nor a retry and keeps its first arrival.
//! - **Deferral** for lanes with a `deferral` object: what another lane
//!   would reject is deferred (told to come back after
//!   `deferral.retryAfterSeconds`); when the queue is full, the request that
//!   arrived last is the one deferred.
//! - **In-flight watermarks with hysteresis** (`inFlight`): conserve
//!   (degraded history) at `conserveAt`, refuse new requests of sheddable
//!   lanes at `stopAt`; leave either state only below `resumeBelow` and once
//!   the p95 latency the gateway measures has been stable for
//!   `resumeAfterStableSeconds`.
//! - **Spare capacity**: what no lane's rate or floor claims of the pool's
//!   `capacityUnitsPerSecond` is a shared bucket (in work units, one second
//!   of it deep) that lanes with `spareCapacity` draw on, in priority order,
//!   once their own bucket is empty. Unknown capacity means no spare.
//! - **Several replicas**: each enforces `share` (1/N) of every rate, burst,
//!   floor, queue depth, watermark and of the spare capacity.
//! - **Observe mode**: a config with `mode: Observe` is evaluated (the
//!   verdict says what enforcement would have done) but never enforced.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};

use serde_json::Value;
use thiserror::Error;

use crate::api::common::parse_rfc3339;
use crate::gateway::{GatewayConfig, LaneConfig, SCHEMA_VERSION};

/// Retries are counted against originals over this sliding window.
pub const RETRY_WINDOW_SECONDS: usize = 10;
/// Latency is summarised (p95) over this sliding window.
pub const LATENCY_WINDOW_SECONDS: usize = 10;
/// The default `inFlight.resumeAfterStableSeconds`.
pub const DEFAULT_RESUME_AFTER_STABLE_SECONDS: f64 = 300.0;
/// A p95 more than this factor above the lowest p95 of the last
/// [`LATENCY_RISE_LOOKBACK_SECONDS`] restarts the stable window.
pub const LATENCY_RISE_FACTOR: f64 = 1.25;
/// How far back a rise of the p95 is measured from.
pub const LATENCY_RISE_LOOKBACK_SECONDS: i64 = 60;
/// Spare capacity is what the lanes' rates and floors leave of this share of
/// the pool's capacity.
pub const SPARE_UTILIZATION: f64 = 0.95;
/// The tenant of requests that name none.
pub const DEFAULT_TENANT: &str = "";
/// Most request ids remembered per lane (for retries and deferrals); the
/// oldest are forgotten first.
pub const MAX_REMEMBERED_IDS: usize = 1_000_000;

/// A config the core refuses (the caller keeps its last good one).
#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    /// A `schemaVersion` other than the one this build knows.
    #[error("unknown schemaVersion {0} (this gateway knows {SCHEMA_VERSION})")]
    SchemaVersion(u32),
    /// `mode` is neither `Enforce` nor `Observe`.
    #[error("unknown mode {0:?} (Enforce or Observe)")]
    Mode(String),
    /// Two lanes with one name.
    #[error("lane {0:?} appears twice")]
    DuplicateLane(String),
    /// A number that is negative, NaN or infinite, or a limit below 1.
    #[error("lane {lane:?}: {field} is {value}, {expected}")]
    Field {
        /// The lane.
        lane: String,
        /// The field (as in `lanes.json`).
        field: &'static str,
        /// What it was.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A borrowing grant whose lender is not a lane of the config, or whose
    /// `expiresAt` is not an RFC 3339 time.
    #[error("lane {lane:?}: borrowing grant from {from:?}: {why}")]
    Grant {
        /// The borrower.
        lane: String,
        /// The lender named.
        from: String,
        /// What is wrong.
        why: &'static str,
    },
    /// Watermarks out of order.
    #[error("inFlight: need resumeBelow <= conserveAt <= stopAt, got {0}")]
    Watermarks(String),
    /// The replica share is not in (0, 1].
    #[error("replica share {0} is not in (0, 1]")]
    Share(f64),
}

/// What happened to a request, one label value of the gateway's request
/// metric each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// Sent upstream at once.
    Admitted,
    /// Waited in the lane's queue (it later resolves to another outcome).
    Queued,
    /// No token (or the lane is paused) and nowhere to wait.
    RejectedRate,
    /// The lane's queue was full.
    RejectedQueueFull,
    /// Could not be served within its deadline.
    RejectedDeadline,
    /// Beyond `retry.maxAttempts` or the lane's retry budget.
    RejectedRetryBudget,
    /// Refused at the in-flight `stopAt` watermark (sheddable lanes).
    RejectedOverload,
    /// Deferred: come back after `Retry-After` (lanes with `deferral`).
    Deferred,
    /// Waited in the queue past its TTL.
    Expired,
    /// The upstream failed (counted by the proxy, never by the core).
    UpstreamError,
}

impl Outcome {
    /// The label value (`rejected_queue_full`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Admitted => "admitted",
            Outcome::Queued => "queued",
            Outcome::RejectedRate => "rejected_rate",
            Outcome::RejectedQueueFull => "rejected_queue_full",
            Outcome::RejectedDeadline => "rejected_deadline",
            Outcome::RejectedRetryBudget => "rejected_retry_budget",
            Outcome::RejectedOverload => "rejected_overload",
            Outcome::Deferred => "deferred",
            Outcome::Expired => "expired",
            Outcome::UpstreamError => "upstream_error",
        }
    }
}

/// How a request counts for the retry rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Attempt {
    /// The first attempt of a request.
    Original,
    /// A later attempt after a failure.
    Retry,
    /// Back after a deferral: neither, and it keeps its first arrival.
    Returning,
}

impl Attempt {
    /// The metric label value (`original`, `retry`, `returning`).
    pub fn as_str(self) -> &'static str {
        match self {
            Attempt::Original => "original",
            Attempt::Retry => "retry",
            Attempt::Returning => "returning",
        }
    }
}

/// One arriving request, as the proxy read it from the headers.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The lane header's value.
    pub lane: &'a str,
    /// The tenant header's value (None: the default tenant).
    pub tenant: Option<&'a str>,
    /// `x-lanekeeper-attempt` (1 = original; None when absent).
    pub attempt: Option<u32>,
    /// `Idempotency-Key` or `x-request-id`.
    pub request_id: Option<&'a str>,
}

/// A request that may go upstream now.
#[derive(Clone, Debug, PartialEq)]
pub struct Pass {
    /// Index of the lane in the config.
    pub lane: usize,
    /// How the request counted.
    pub attempt: Attempt,
    /// The conversation turns to send, when the lane has optional context
    /// (degraded while the gateway conserves).
    pub history_turns: Option<i32>,
    /// Seconds the request may still take end to end (the upstream timeout).
    pub remaining_seconds: f64,
    /// Seconds it waited in the queue.
    pub waited_seconds: f64,
}

/// A request that may not go upstream.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// Index of the lane in the config.
    pub lane: usize,
    /// How the request counted.
    pub attempt: Attempt,
    /// Which limit (one of the rejected outcomes, `Deferred` or `Expired`).
    pub outcome: Outcome,
    /// The limit in words, for the error body (`"rate"`, `"maxAttempts"`...).
    pub limit: &'static str,
    /// `Retry-After` seconds, when there is one.
    pub retry_after_seconds: Option<i64>,
}

impl Refusal {
    /// Whether the client is told to come back (`Lanekeeper-Deferred`).
    pub fn deferred(&self) -> bool {
        self.outcome == Outcome::Deferred
    }
}

/// A queued request's place; [`Core::poll`] resolves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// The core's answer to an arriving request.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Go upstream now.
    Pass(Pass),
    /// Wait: [`Core::poll`] resolves the ticket (a Pass or a Refusal).
    Queued {
        /// Index of the lane.
        lane: usize,
        /// How the request counted.
        attempt: Attempt,
        /// Its place.
        ticket: Ticket,
    },
    /// Refused (or deferred).
    Refuse(Refusal),
    /// The lane header names no lane of the config.
    UnknownLane,
}

impl Verdict {
    /// The outcome label of the verdict on arrival.
    pub fn outcome(&self) -> Option<Outcome> {
        match self {
            Verdict::Pass(_) => Some(Outcome::Admitted),
            Verdict::Queued { .. } => Some(Outcome::Queued),
            Verdict::Refuse(r) => Some(r.outcome),
            Verdict::UnknownLane => None,
        }
    }
}

/// A queued request resolved by [`Core::poll`] (or by a config swap).
#[derive(Clone, Debug, PartialEq)]
pub enum Resolution {
    /// Its turn came: go upstream.
    Pass(Pass),
    /// Its wait ran out, or it was deferred to make room.
    Refuse(Refusal),
}

/// The in-flight pressure state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pressure {
    /// Below the watermarks.
    Normal,
    /// At `conserveAt`: send degraded history.
    Conserve,
    /// At `stopAt`: refuse new requests of sheddable lanes (and conserve).
    Stop,
}

impl Pressure {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Pressure::Normal => "normal",
            Pressure::Conserve => "conserve",
            Pressure::Stop => "stop",
        }
    }
}

/// A queued request.
#[derive(Clone, Debug)]
struct Waiting {
    ticket: Ticket,
    attempt: Attempt,
    /// First arrival (kept across deferrals): the queue's order and the
    /// deadline's start.
    first_arrival: f64,
    /// When it joined the queue (the TTL's start).
    queued_at: f64,
    /// Its request id, remembered as deferred if it is deferred.
    request_id: Option<String>,
}

/// One tenant's waiting requests inside a lane, earliest first arrival first.
#[derive(Debug, Default)]
struct TenantQueue {
    waiting: BTreeMap<(OrdF64, u64), Waiting>,
    /// Finish tag of the request at the head (valid while `heap_gen`
    /// matches the heap entry).
    head_tag: f64,
    heap_gen: u64,
}

/// A total order on finite f64 (never NaN here).
#[derive(Clone, Copy, Debug, PartialEq)]
struct OrdF64(f64);
impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Weighted fair queueing across tenants (self-clocked), EDF within one.
#[derive(Debug, Default)]
struct FairQueue {
    tenants: HashMap<String, TenantQueue>,
    /// (finish tag, generation, tenant), smallest tag first.
    heap: BinaryHeap<Reverse<(OrdF64, u64, String)>>,
    /// Every waiting request by (first arrival, seq) → tenant: to find the
    /// newest one (deferred when the queue is full) and the oldest TTL.
    by_arrival: BTreeMap<(OrdF64, u64), String>,
    /// By (queued_at, seq): the order in which TTLs run out.
    by_queued: BTreeMap<(OrdF64, u64), (OrdF64, String)>,
    /// The tag of the request served last (the virtual time V).
    virtual_time: f64,
    seq: u64,
    gen_counter: u64,
}

impl FairQueue {
    fn len(&self) -> usize {
        self.by_arrival.len()
    }

    fn push(&mut self, tenant: &str, w: Waiting) {
        self.seq += 1;
        let seq = self.seq;
        let key = (OrdF64(w.first_arrival), seq);
        self.by_arrival.insert(key, tenant.to_owned());
        self.by_queued.insert(
            (OrdF64(w.queued_at), seq),
            (OrdF64(w.first_arrival), tenant.to_owned()),
        );
        let vt = self.virtual_time;
        let tq = self.tenants.entry(tenant.to_owned()).or_default();
        let was_empty = tq.waiting.is_empty();
        tq.waiting.insert(key, w);
        if was_empty {
            // Cost 1 per request, weight 1 per tenant: F = max(V, F_prev) + 1,
            // F_prev <= V for a tenant that had emptied.
            tq.head_tag = vt + 1.0;
            self.gen_counter += 1;
            tq.heap_gen = self.gen_counter;
            self.heap.push(Reverse((
                OrdF64(tq.head_tag),
                tq.heap_gen,
                tenant.to_owned(),
            )));
        }
    }

    /// Removes one waiting request of a tenant by key, keeping the indexes.
    fn remove(&mut self, tenant: &str, key: (OrdF64, u64)) -> Option<Waiting> {
        let tq = self.tenants.get_mut(tenant)?;
        let w = tq.waiting.remove(&key)?;
        self.by_arrival.remove(&key);
        self.by_queued.remove(&(OrdF64(w.queued_at), key.1));
        if tq.waiting.is_empty() {
            self.tenants.remove(tenant);
        }
        Some(w)
    }

    /// The next request by finish tag.
    fn pop(&mut self) -> Option<Waiting> {
        while let Some(Reverse((tag, generation, tenant))) = self.heap.pop() {
            let Some(tq) = self.tenants.get_mut(&tenant) else {
                continue;
            };
            if tq.heap_gen != generation {
                continue;
            }
            let (&key, _) = tq.waiting.iter().next()?;
            self.virtual_time = self.virtual_time.max(tag.0);
            let w = self.remove(&tenant, key).expect("head exists");
            if let Some(tq) = self.tenants.get_mut(&tenant) {
                tq.head_tag = tag.0 + 1.0;
                self.gen_counter += 1;
                tq.heap_gen = self.gen_counter;
                self.heap
                    .push(Reverse((OrdF64(tq.head_tag), tq.heap_gen, tenant)));
            }
            return Some(w);
        }
        None
    }

    /// The request with the latest first arrival.
    fn newest(&self) -> Option<(f64, (OrdF64, u64), &str)> {
        self.by_arrival
            .iter()
            .next_back()
            .map(|(k, t)| (k.0.0, *k, t.as_str()))
    }

    /// The request that joined the queue first.
    fn oldest_queued(&self) -> Option<(f64, (OrdF64, u64), &str)> {
        self.by_queued
            .iter()
            .next()
            .map(|(k, (fa, t))| (k.0.0, (*fa, k.1), t.as_str()))
    }

    /// The earliest deadline start among the waiting (the oldest first
    /// arrival).
    fn oldest_arrival(&self) -> Option<(f64, (OrdF64, u64), &str)> {
        self.by_arrival
            .iter()
            .next()
            .map(|(k, t)| (k.0.0, *k, t.as_str()))
    }

    fn drain(&mut self) -> Vec<Waiting> {
        let mut out = Vec::with_capacity(self.len());
        while let Some(w) = self.pop() {
            out.push(w);
        }
        out
    }
}

/// Request ids seen within the lane's deadline, by a keyed 64-bit hash of
/// the id: a million ids cost 16 bytes of key each and no string compare (a
/// collision, about one in 10^7 among a million ids, would count one request
/// as another's retry).
#[derive(Debug, Default)]
struct Remembered {
    keys: std::hash::RandomState,
    ids: HashMap<u64, Seen>,
    /// (forget at, id hash), oldest first.
    expiry: VecDeque<(f64, u64)>,
}

#[derive(Clone, Copy, Debug)]
struct Seen {
    first_arrival: f64,
    attempts: u32,
    deferred: bool,
    forget_at: f64,
}

impl Remembered {
    fn key(&self, id: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.keys, id)
    }

    fn get(&self, id: &str) -> Option<&Seen> {
        self.ids.get(&self.key(id))
    }

    fn get_mut(&mut self, id: &str) -> Option<&mut Seen> {
        let k = self.key(id);
        self.ids.get_mut(&k)
    }

    /// Forgets the ids whose deadline has passed, and the oldest ones beyond
    /// [`MAX_REMEMBERED_IDS`].
    fn sweep(&mut self, now: f64) {
        while let Some((at, _)) = self.expiry.front() {
            if *at > now && self.ids.len() <= MAX_REMEMBERED_IDS {
                break;
            }
            let (at, k) = self.expiry.pop_front().expect("front exists");
            // An id seen again later has a later forget_at (and a later
            // entry): keep it.
            if self.ids.get(&k).is_some_and(|s| s.forget_at <= at) {
                self.ids.remove(&k);
            }
        }
    }

    /// Remembers an id; one expiry entry per forget time (a return after a
    /// deferral keeps its first arrival, so it adds none).
    fn touch(&mut self, id: &str, seen: Seen) {
        let k = self.key(id);
        match self.ids.get_mut(&k) {
            Some(s) => {
                let later = seen.forget_at > s.forget_at;
                *s = seen;
                if later {
                    self.expiry.push_back((seen.forget_at, k));
                }
            }
            None => {
                self.ids.insert(k, seen);
                self.expiry.push_back((seen.forget_at, k));
            }
        }
    }
}

/// Originals and retries per second over the last [`RETRY_WINDOW_SECONDS`].
#[derive(Debug, Default)]
struct RetryWindow {
    /// (second, originals, retries).
    slots: [(i64, u64, u64); RETRY_WINDOW_SECONDS],
}

impl RetryWindow {
    fn slot(&mut self, now: f64) -> &mut (i64, u64, u64) {
        let sec = now.floor() as i64;
        let i = sec.rem_euclid(RETRY_WINDOW_SECONDS as i64) as usize;
        if self.slots[i].0 != sec {
            self.slots[i] = (sec, 0, 0);
        }
        &mut self.slots[i]
    }
    fn totals(&self, now: f64) -> (u64, u64) {
        let sec = now.floor() as i64;
        self.slots
            .iter()
            .filter(|(s, _, _)| sec - s < RETRY_WINDOW_SECONDS as i64 && *s <= sec)
            .fold((0, 0), |(o, r), (_, so, sr)| (o + so, r + sr))
    }
}

/// Tokens taken per second over the last two seconds (the lane's own use).
#[derive(Debug, Default)]
struct UseMeter {
    /// (second, tokens).
    slots: [(i64, f64); 2],
}

impl UseMeter {
    fn add(&mut self, now: f64) {
        let sec = now.floor() as i64;
        let i = sec.rem_euclid(2) as usize;
        if self.slots[i].0 != sec {
            self.slots[i] = (sec, 0.0);
        }
        self.slots[i].1 += 1.0;
    }
    /// Requests over the last second (the current second's count plus the
    /// part of the previous second still inside the window, assumed even).
    fn rate(&self, now: f64) -> f64 {
        let sec = now.floor() as i64;
        let frac = now - sec as f64;
        let cur = self.slots[sec.rem_euclid(2) as usize];
        let prev = self.slots[(sec - 1).rem_euclid(2) as usize];
        let c = if cur.0 == sec { cur.1 } else { 0.0 };
        let p = if prev.0 == sec - 1 { prev.1 } else { 0.0 };
        c + p * (1.0 - frac)
    }
}

/// A grant as the core enforces it.
#[derive(Clone, Debug)]
struct Grant {
    from: usize,
    /// Requests per second of the borrower (units ÷ the borrower's cost).
    requests_per_second: f64,
    units_per_second: f64,
    /// Monotonic time of `expiresAt`.
    expires: f64,
}

/// One lane's live state.
#[derive(Debug)]
struct Lane {
    cfg: LaneConfig,
    /// Scaled to the replica's share.
    rate: f64,
    burst: f64,
    floor_rps: f64,
    max_depth: usize,
    grants: Vec<Grant>,
    tokens: f64,
    last_refill: f64,
    queue: FairQueue,
    seen: Remembered,
    retries: RetryWindow,
    used: UseMeter,
    paused: bool,
    expected_service: f64,
}

impl Lane {
    fn new(cfg: LaneConfig, share: f64, now: f64) -> Lane {
        let paused = cfg.state == "Paused";
        let rate = if paused {
            0.0
        } else {
            cfg.admitted_requests_per_second * share
        };
        let burst = if paused {
            0.0
        } else {
            (cfg.burst as f64 * share).ceil().max(1.0)
        };
        let floor_rps = if paused {
            0.0
        } else {
            cfg.floor_units_per_second.unwrap_or(0.0) / cfg.work_units_per_request * share
        };
        let max_depth = (cfg.queue.max_depth as f64 * share).ceil() as usize;
        Lane {
            expected_service: cfg.expected_service_seconds.unwrap_or(0.0),
            rate,
            burst,
            floor_rps,
            max_depth,
            grants: Vec::new(),
            tokens: burst.max(floor_rps.ceil()),
            last_refill: now,
            queue: FairQueue::default(),
            seen: Remembered::default(),
            retries: RetryWindow::default(),
            used: UseMeter::default(),
            paused,
            cfg,
        }
    }

    fn retry_after(&self) -> Option<i64> {
        match &self.cfg.deferral {
            Some(d) => Some(d.retry_after_seconds),
            None => self.cfg.retry_after_seconds.or(Some(1)),
        }
    }
}

/// The latency the gateway measures, per second, as log-spaced histograms.
#[derive(Debug)]
struct LatencyWindow {
    /// (second, counts).
    slots: Vec<(i64, [u32; LATENCY_BUCKETS])>,
}

const LATENCY_BUCKETS: usize = 360;
/// The lower edge of bucket 1 (seconds); bucket 0 holds everything below.
const LATENCY_BASE: f64 = 0.000_5;
/// Bucket edges 4 % apart (finer than the rise factor), up to ~650 s.
const LATENCY_GROWTH: f64 = 1.04;

fn latency_bucket(seconds: f64) -> usize {
    if seconds <= LATENCY_BASE {
        return 0;
    }
    let i = ((seconds / LATENCY_BASE).ln() / LATENCY_GROWTH.ln()).floor() as usize + 1;
    i.min(LATENCY_BUCKETS - 1)
}

fn latency_upper(bucket: usize) -> f64 {
    LATENCY_BASE * LATENCY_GROWTH.powi(bucket as i32)
}

impl LatencyWindow {
    fn new() -> LatencyWindow {
        LatencyWindow {
            slots: vec![(i64::MIN, [0; LATENCY_BUCKETS]); LATENCY_WINDOW_SECONDS],
        }
    }
    fn record(&mut self, now: f64, seconds: f64) {
        let sec = now.floor() as i64;
        let i = sec.rem_euclid(LATENCY_WINDOW_SECONDS as i64) as usize;
        if self.slots[i].0 != sec {
            self.slots[i] = (sec, [0; LATENCY_BUCKETS]);
        }
        self.slots[i].1[latency_bucket(seconds.max(0.0))] += 1;
    }
    /// The p95 over the window (the upper edge of its bucket); None without
    /// samples.
    fn p95(&self, now: f64) -> Option<f64> {
        let sec = now.floor() as i64;
        let mut merged = [0u64; LATENCY_BUCKETS];
        for (s, counts) in &self.slots {
            if *s <= sec && sec.saturating_sub(*s) < LATENCY_WINDOW_SECONDS as i64 {
                for (m, c) in merged.iter_mut().zip(counts) {
                    *m += u64::from(*c);
                }
            }
        }
        let total: u64 = merged.iter().sum();
        if total == 0 {
            return None;
        }
        let want = (total as f64 * 0.95).ceil() as u64;
        let mut acc = 0;
        for (i, c) in merged.iter().enumerate() {
            acc += c;
            if acc >= want {
                return Some(latency_upper(i));
            }
        }
        Some(latency_upper(LATENCY_BUCKETS - 1))
    }
}

/// Watermarks scaled to the replica's share.
#[derive(Clone, Copy, Debug)]
struct Watermarks {
    conserve_at: f64,
    stop_at: f64,
    resume_below: f64,
    resume_after_stable: f64,
}

/// The pool's spare capacity, in work units: what no lane's rate or floor
/// claims.
#[derive(Clone, Copy, Debug, Default)]
struct Spare {
    /// Units per second (this replica's share).
    rate: f64,
    /// Bucket size in units.
    cap: f64,
    tokens: f64,
    last_refill: f64,
}

impl Spare {
    fn new(cfg: &GatewayConfig, lanes: &[Lane], share: f64, now: f64) -> Spare {
        let capacity = match (cfg.telemetry.as_str(), cfg.capacity_units_per_second) {
            ("Known", Some(c)) if c.is_finite() && c > 0.0 => c * share,
            _ => return Spare::default(),
        };
        let claimed: f64 = lanes
            .iter()
            .map(|l| l.rate.max(l.floor_rps) * l.cfg.work_units_per_request)
            .sum();
        // Lanes using spare capacity never take the pool past
        // SPARE_UTILIZATION of its capacity: a pool kept at 100 % queues
        // without bound.
        let rate = capacity * SPARE_UTILIZATION - claimed;
        if rate <= 1e-6 {
            return Spare::default();
        }
        // One second of spare, and at least one request of the costliest
        // lane that may use it.
        let largest = lanes
            .iter()
            .filter(|l| l.cfg.spare_capacity)
            .map(|l| l.cfg.work_units_per_request)
            .fold(0.0, f64::max);
        let cap = rate.max(largest);
        Spare {
            rate,
            cap,
            tokens: cap,
            last_refill: now,
        }
    }

    /// The tokens there would be at `now`.
    fn tokens_at(&self, now: f64) -> f64 {
        let elapsed = (now - self.last_refill).max(0.0);
        (self.tokens + self.rate * elapsed).min(self.cap)
    }

    fn refill(&mut self, now: f64) {
        self.tokens = self.tokens_at(now);
        self.last_refill = now.max(self.last_refill);
    }

    /// Takes `units` if they are there.
    fn take(&mut self, now: f64, units: f64) -> bool {
        self.refill(now);
        if self.rate > 0.0 && self.tokens + 1e-9 >= units {
            self.tokens -= units;
            true
        } else {
            false
        }
    }

    /// When `units` will be there (None: never).
    fn ready_at(&self, now: f64, units: f64) -> Option<f64> {
        if self.rate <= 0.0 || units > self.cap + 1e-9 {
            return None;
        }
        Some(now + ((units - self.tokens_at(now)).max(0.0) / self.rate))
    }
}

/// The admission core for one config.
#[derive(Debug)]
pub struct Core {
    config: GatewayConfig,
    share: f64,
    enforce: bool,
    lanes: Vec<Lane>,
    spare: Spare,
    by_name: HashMap<String, usize>,
    in_flight: u64,
    pressure: Pressure,
    watermarks: Option<Watermarks>,
    latency: LatencyWindow,
    /// The p95 of each second of the last LATENCY_RISE_LOOKBACK_SECONDS,
    /// the second checked last, and since when the p95 has been stable.
    recent_p95: VecDeque<(i64, f64)>,
    checked_second: Option<i64>,
    stable_since: f64,
    below_since: Option<f64>,
    next_ticket: u64,
    /// Ticket → (lane, tenant, key) of every waiting request.
    tickets: HashMap<Ticket, (usize, String, (OrdF64, u64))>,
    /// Resolutions produced inside `admit` (a queued request deferred to
    /// make room for an earlier arrival), handed out by the next `poll`.
    pending: Vec<(Ticket, Resolution)>,
}

/// Checks a config the way [`Core::new`] does, without building one.
pub fn validate(cfg: &GatewayConfig) -> Result<(), ConfigError> {
    if cfg.schema_version != SCHEMA_VERSION {
        return Err(ConfigError::SchemaVersion(cfg.schema_version));
    }
    if cfg.mode != "Enforce" && cfg.mode != "Observe" {
        return Err(ConfigError::Mode(cfg.mode.clone()));
    }
    let mut names = HashMap::new();
    for l in &cfg.lanes {
        if names.insert(l.name.as_str(), ()).is_some() {
            return Err(ConfigError::DuplicateLane(l.name.clone()));
        }
    }
    for l in &cfg.lanes {
        let field =
            |field: &'static str, value: String, expected: &'static str| ConfigError::Field {
                lane: l.name.clone(),
                field,
                value,
                expected,
            };
        let non_negative = |name: &'static str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(field(name, v.to_string(), "must be a finite number >= 0"))
            }
        };
        non_negative("admittedRequestsPerSecond", l.admitted_requests_per_second)?;
        non_negative("admittedUnitsPerSecond", l.admitted_units_per_second)?;
        if !(l.work_units_per_request.is_finite() && l.work_units_per_request > 0.0) {
            return Err(field(
                "workUnitsPerRequest",
                l.work_units_per_request.to_string(),
                "must be > 0",
            ));
        }
        if let Some(f) = l.floor_units_per_second {
            non_negative("floorUnitsPerSecond", f)?;
        }
        if let Some(s) = l.expected_service_seconds {
            non_negative("expectedServiceSeconds", s)?;
        }
        if l.queue.max_depth < 0 {
            return Err(field(
                "queue.maxDepth",
                l.queue.max_depth.to_string(),
                "must be >= 0",
            ));
        }
        if l.queue.ttl_seconds < 0 {
            return Err(field(
                "queue.ttlSeconds",
                l.queue.ttl_seconds.to_string(),
                "must be >= 0",
            ));
        }
        if l.deadline_seconds < 1 {
            return Err(field(
                "deadlineSeconds",
                l.deadline_seconds.to_string(),
                "must be >= 1",
            ));
        }
        if l.retry.max_attempts < 1 {
            return Err(field(
                "retry.maxAttempts",
                l.retry.max_attempts.to_string(),
                "must be >= 1",
            ));
        }
        if !(0..=100).contains(&l.retry.budget_percent) {
            return Err(field(
                "retry.budgetPercent",
                l.retry.budget_percent.to_string(),
                "must be within 0..100",
            ));
        }
        for g in &l.borrowing {
            if !names.contains_key(g.from.as_str()) || g.from == l.name {
                return Err(ConfigError::Grant {
                    lane: l.name.clone(),
                    from: g.from.clone(),
                    why: "the lender is not another lane of this config",
                });
            }
            if parse_rfc3339(&g.expires_at).is_none() {
                return Err(ConfigError::Grant {
                    lane: l.name.clone(),
                    from: g.from.clone(),
                    why: "expiresAt is not an RFC 3339 time",
                });
            }
            if !(g.units_per_second.is_finite() && g.units_per_second >= 0.0) {
                return Err(ConfigError::Grant {
                    lane: l.name.clone(),
                    from: g.from.clone(),
                    why: "unitsPerSecond must be a finite number >= 0",
                });
            }
        }
    }
    if let Some(f) = &cfg.in_flight
        && !(f.resume_below <= f.conserve_at && f.conserve_at <= f.stop_at && f.resume_below >= 0)
    {
        return Err(ConfigError::Watermarks(format!(
            "resumeBelow {} conserveAt {} stopAt {}",
            f.resume_below, f.conserve_at, f.stop_at
        )));
    }
    Ok(())
}

impl Core {
    /// A core enforcing `cfg` with `share` (1/N for N replicas) of every
    /// rate. `now` is the monotonic clock, `unix_now` the wall clock at the
    /// same instant (to place the grants' `expiresAt` on the monotonic one).
    pub fn new(
        cfg: GatewayConfig,
        share: f64,
        now: f64,
        unix_now: f64,
    ) -> Result<Core, ConfigError> {
        validate(&cfg)?;
        if !(share > 0.0 && share <= 1.0) {
            return Err(ConfigError::Share(share));
        }
        let mut lanes: Vec<Lane> = cfg
            .lanes
            .iter()
            .map(|l| Lane::new(l.clone(), share, now))
            .collect();
        let by_name: HashMap<String, usize> = cfg
            .lanes
            .iter()
            .enumerate()
            .map(|(i, l)| (l.name.clone(), i))
            .collect();
        for lane in &mut lanes {
            let wupr = lane.cfg.work_units_per_request;
            lane.grants = lane
                .cfg
                .borrowing
                .iter()
                .map(|g| Grant {
                    from: by_name[&g.from],
                    requests_per_second: g.units_per_second / wupr * share,
                    units_per_second: g.units_per_second * share,
                    expires: now
                        + (parse_rfc3339(&g.expires_at).expect("validated") as f64 - unix_now),
                })
                .collect();
        }
        let watermarks = cfg.in_flight.as_ref().map(|f| Watermarks {
            conserve_at: f.conserve_at as f64 * share,
            stop_at: f.stop_at as f64 * share,
            resume_below: f.resume_below as f64 * share,
            resume_after_stable: f
                .resume_after_stable_seconds
                .map_or(DEFAULT_RESUME_AFTER_STABLE_SECONDS, |s| s as f64),
        });
        let spare = Spare::new(&cfg, &lanes, share, now);
        Ok(Core {
            enforce: cfg.mode == "Enforce",
            spare,
            config: cfg,
            share,
            lanes,
            by_name,
            in_flight: 0,
            pressure: Pressure::Normal,
            watermarks,
            latency: LatencyWindow::new(),
            recent_p95: VecDeque::new(),
            checked_second: None,
            stable_since: now,
            below_since: None,
            next_ticket: 0,
            tickets: HashMap::new(),
            pending: Vec::new(),
        })
    }

    /// Replaces the config, atomically: lanes that stay keep their tokens
    /// (capped to the new burst), queues, remembered ids and retry windows;
    /// the in-flight count, pressure state and latency carry over. Waiting
    /// requests of lanes that went away are refused (returned). On error
    /// nothing changes.
    pub fn swap(
        &mut self,
        cfg: GatewayConfig,
        share: f64,
        now: f64,
        unix_now: f64,
    ) -> Result<Vec<(Ticket, Resolution)>, ConfigError> {
        let mut next = Core::new(cfg, share, now, unix_now)?;
        let mut refused = Vec::new();
        let old_lanes = std::mem::take(&mut self.lanes);
        for (old_idx, mut old) in old_lanes.into_iter().enumerate() {
            old.refill(now, old.rate);
            match next.by_name.get(&old.cfg.name).copied() {
                Some(i) => {
                    let new = &mut next.lanes[i];
                    new.tokens = old.tokens.min(new.cap());
                    new.queue = std::mem::take(&mut old.queue);
                    new.seen = std::mem::take(&mut old.seen);
                    new.retries = std::mem::take(&mut old.retries);
                    new.used = std::mem::take(&mut old.used);
                    new.last_refill = now;
                }
                None => {
                    for w in old.queue.drain() {
                        self.tickets.remove(&w.ticket);
                        refused.push((
                            w.ticket,
                            Resolution::Refuse(Refusal {
                                lane: old_idx,
                                attempt: w.attempt,
                                outcome: Outcome::RejectedRate,
                                limit: "lane removed from the config",
                                retry_after_seconds: Some(1),
                            }),
                        ));
                    }
                }
            }
        }
        // Re-index the surviving tickets to the new lane positions.
        let mut tickets = HashMap::new();
        for (i, lane) in next.lanes.iter().enumerate() {
            for (tenant, tq) in &lane.queue.tenants {
                for (key, w) in &tq.waiting {
                    tickets.insert(w.ticket, (i, tenant.clone(), *key));
                }
            }
        }
        next.tickets = tickets;
        self.spare.refill(now);
        next.spare.tokens = self.spare.tokens.min(next.spare.cap);
        next.in_flight = self.in_flight;
        next.pressure = self.pressure;
        next.latency = std::mem::replace(&mut self.latency, LatencyWindow::new());
        next.recent_p95 = std::mem::take(&mut self.recent_p95);
        next.checked_second = self.checked_second;
        next.stable_since = self.stable_since;
        next.below_since = self.below_since;
        next.next_ticket = self.next_ticket;
        next.pending = std::mem::take(&mut self.pending);
        *self = next;
        Ok(refused)
    }

    /// The config in force.
    pub fn config(&self) -> &GatewayConfig {
        &self.config
    }

    /// Whether the config is enforced (`mode: Enforce`); an Observe config
    /// is evaluated for the shadow metrics only.
    pub fn enforcing(&self) -> bool {
        self.enforce
    }

    /// The replica share in force.
    pub fn share(&self) -> f64 {
        self.share
    }

    /// The index of a lane by name.
    pub fn lane_index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The lane at an index.
    pub fn lane(&self, i: usize) -> &LaneConfig {
        &self.lanes[i].cfg
    }

    /// The lane names, in config order.
    pub fn lane_names(&self) -> impl Iterator<Item = &str> {
        self.lanes.iter().map(|l| l.cfg.name.as_str())
    }

    /// Requests waiting in a lane's queue.
    pub fn queue_depth(&self, lane: usize) -> usize {
        self.lanes[lane].queue.len()
    }

    /// Requests in flight to the pool (as [`Core::started`] and
    /// [`Core::finished`] counted them).
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// The pressure state.
    pub fn pressure(&self) -> Pressure {
        self.pressure
    }

    /// The pool's spare capacity in work units per second (this replica's
    /// share): what lanes with `spareCapacity` may use beyond their buckets.
    pub fn spare_units_per_second(&self) -> f64 {
        self.spare.rate
    }

    /// The lane's bucket rate now, in requests per second (this replica's
    /// share, with floors reclaimed and lapsed grants dropped).
    pub fn effective_rate(&self, lane: usize, now: f64) -> f64 {
        effective_rate(&self.lanes, lane, now)
    }

    /// Decides on an arriving request at `now`.
    pub fn admit(&mut self, req: &Request<'_>, now: f64) -> Verdict {
        let Some(li) = self.lane_index(req.lane) else {
            return Verdict::UnknownLane;
        };
        self.update_pressure(now);
        let pressure = self.pressure;
        let rate = effective_rate(&self.lanes, li, now);
        let lane = &mut self.lanes[li];
        lane.refill(now, rate);
        lane.seen.sweep(now);
        let deadline = lane.cfg.deadline_seconds as f64;

        // How the request counts, and where its deadline starts.
        let mut first_arrival = now;
        let attempt = match req.request_id.and_then(|id| lane.seen.get(id).copied()) {
            Some(s) if s.deferred => {
                first_arrival = s.first_arrival;
                Attempt::Returning
            }
            Some(_) => Attempt::Retry,
            None if req.attempt.unwrap_or(1) > 1 => Attempt::Retry,
            None => Attempt::Original,
        };
        let attempts = match (attempt, req.request_id.and_then(|id| lane.seen.get(id))) {
            (Attempt::Retry, Some(s)) => (s.attempts + 1).max(req.attempt.unwrap_or(0)),
            (Attempt::Retry, None) => req.attempt.unwrap_or(2),
            (_, Some(s)) => s.attempts,
            (_, None) => 1,
        };
        if let Some(id) = req.request_id {
            let deferred = attempt == Attempt::Returning;
            lane.seen.touch(
                id,
                Seen {
                    first_arrival,
                    attempts,
                    deferred,
                    forget_at: first_arrival + deadline,
                },
            );
        }
        let refuse = |lane: &Lane, outcome: Outcome, limit: &'static str| {
            Verdict::Refuse(Refusal {
                lane: li,
                attempt,
                outcome,
                limit,
                retry_after_seconds: match outcome {
                    Outcome::RejectedDeadline | Outcome::RejectedRetryBudget => None,
                    _ => lane.retry_after(),
                },
            })
        };

        // Retries: attempts, then the budget.
        match attempt {
            Attempt::Original => lane.retries.slot(now).1 += 1,
            Attempt::Retry => {
                if attempts > lane.cfg.retry.max_attempts.max(1) as u32 {
                    return refuse(lane, Outcome::RejectedRetryBudget, "retry.maxAttempts");
                }
                let (originals, retries) = lane.retries.totals(now);
                let allowed = originals as f64 * f64::from(lane.cfg.retry.budget_percent) / 100.0;
                if (retries + 1) as f64 > allowed {
                    return refuse(lane, Outcome::RejectedRetryBudget, "retry.budgetPercent");
                }
                lane.retries.slot(now).2 += 1;
            }
            Attempt::Returning => {}
        }

        // Its deadline: nothing can serve a request whose remaining time is
        // shorter than the lane's service time.
        let remaining = first_arrival + deadline - now;
        if remaining < lane.expected_service {
            return refuse(lane, Outcome::RejectedDeadline, "deadlineSeconds");
        }

        // Overload: new requests of sheddable lanes stop at `stopAt`.
        if pressure == Pressure::Stop && lane.cfg.sheddable {
            let verdict = if lane.cfg.deferral.is_some() {
                self.defer(li, attempt, req.request_id)
            } else {
                refuse(lane, Outcome::RejectedOverload, "inFlight.stopAt")
            };
            return verdict;
        }

        // A token (its own, or spare capacity), and nobody waiting ahead: go.
        if lane.queue.len() == 0
            && (lane.tokens >= 1.0
                || (lane.draws_on_spare() && self.spare.take(now, lane.cfg.work_units_per_request)))
        {
            if lane.tokens >= 1.0 {
                lane.tokens -= 1.0;
            }
            lane.used.add(now);
            let history_turns = self.history_turns(li);
            return Verdict::Pass(Pass {
                lane: li,
                attempt,
                history_turns,
                remaining_seconds: remaining,
                waited_seconds: 0.0,
            });
        }

        // Wait, if there is room and the wait can end in time.
        let lane = &self.lanes[li];
        if lane.cfg.deferral.is_none() && lane.queue.len() >= lane.max_depth {
            return refuse(lane, Outcome::RejectedQueueFull, "queue.maxDepth");
        }
        if rate <= 0.0 && !(lane.cfg.spare_capacity && self.spare.rate > 0.0) {
            return if lane.cfg.deferral.is_some() {
                self.defer(li, attempt, req.request_id)
            } else {
                refuse(lane, Outcome::RejectedRate, "admittedRequestsPerSecond")
            };
        }
        // The wait at the lane's own rate (spare capacity, shared with other
        // lanes, is not counted on).
        let ahead = lane.queue.len() as f64 + 1.0 - lane.tokens.max(0.0);
        let wait = if rate > 0.0 {
            (ahead / rate).max(0.0)
        } else {
            0.0
        };
        let ttl = lane.cfg.queue.ttl_seconds as f64;
        if wait + lane.expected_service > remaining {
            // Queued, it would die waiting; deferred, it would come back to
            // the same wait. Refuse it now.
            return refuse(lane, Outcome::RejectedDeadline, "deadlineSeconds");
        }
        if wait > ttl {
            return if lane.cfg.deferral.is_some() {
                self.defer(li, attempt, req.request_id)
            } else {
                refuse(lane, Outcome::RejectedRate, "queue.ttlSeconds")
            };
        }
        if lane.queue.len() >= lane.max_depth {
            // (Only a `Defer` lane gets here with a full queue.) The request that arrived last is the one deferred: the
            // newcomer, or the latest one queued.
            let newest = lane
                .queue
                .newest()
                .map(|(fa, key, t)| (fa, key, t.to_owned()));
            match newest {
                Some((fa, key, tenant)) if fa > first_arrival => {
                    // Evict it (deferred), queue the newcomer in its place.
                    // The eviction is reported through `poll`.
                    self.evict_deferred(li, &tenant, key);
                }
                _ => return self.defer(li, attempt, req.request_id),
            }
        }
        let ticket = self.enqueue(li, req, attempt, first_arrival, now);
        Verdict::Queued {
            lane: li,
            attempt,
            ticket,
        }
    }

    fn enqueue(
        &mut self,
        li: usize,
        req: &Request<'_>,
        attempt: Attempt,
        first_arrival: f64,
        now: f64,
    ) -> Ticket {
        self.next_ticket += 1;
        let ticket = Ticket(self.next_ticket);
        let tenant = req.tenant.unwrap_or(DEFAULT_TENANT);
        let lane = &mut self.lanes[li];
        lane.queue.push(
            tenant,
            Waiting {
                ticket,
                attempt,
                first_arrival,
                queued_at: now,
                request_id: req.request_id.map(str::to_owned),
            },
        );
        let seq = lane.queue.seq;
        self.tickets.insert(
            ticket,
            (li, tenant.to_owned(), (OrdF64(first_arrival), seq)),
        );
        ticket
    }

    /// Defers an arriving request (remembering its id with its first
    /// arrival, so it keeps its place when it comes back).
    fn defer(&mut self, li: usize, attempt: Attempt, request_id: Option<&str>) -> Verdict {
        let lane = &mut self.lanes[li];
        if let Some(id) = request_id
            && let Some(s) = lane.seen.get_mut(id)
        {
            s.deferred = true;
        }
        Verdict::Refuse(Refusal {
            lane: li,
            attempt,
            outcome: Outcome::Deferred,
            limit: "deferred",
            retry_after_seconds: lane.retry_after(),
        })
    }

    /// Defers a queued request to make room for an earlier arrival; the
    /// next `poll` hands out its resolution.
    fn evict_deferred(&mut self, li: usize, tenant: &str, key: (OrdF64, u64)) {
        let lane = &mut self.lanes[li];
        if let Some(w) = lane.queue.remove(tenant, key) {
            self.tickets.remove(&w.ticket);
            if let Some(id) = &w.request_id
                && let Some(s) = lane.seen.get_mut(id)
            {
                s.deferred = true;
            }
            let retry_after = lane.retry_after();
            self.pending.push((
                w.ticket,
                Resolution::Refuse(Refusal {
                    lane: li,
                    attempt: w.attempt,
                    outcome: Outcome::Deferred,
                    limit: "deferred",
                    retry_after_seconds: retry_after,
                }),
            ));
        }
    }

    /// Resolves waiting requests at `now`: those whose turn came (a token
    /// and the fair queue's order) and those whose wait ran out (TTL, or a
    /// deadline that can no longer be met).
    pub fn poll(&mut self, now: f64) -> Vec<(Ticket, Resolution)> {
        let mut out = std::mem::take(&mut self.pending);
        self.update_pressure(now);
        for li in 0..self.lanes.len() {
            if self.lanes[li].queue.len() == 0 {
                continue;
            }
            let rate = effective_rate(&self.lanes, li, now);
            self.lanes[li].refill(now, rate);
            // Expired first: a request past its TTL or its deadline is never
            // served.
            loop {
                let lane = &self.lanes[li];
                let ttl = lane.cfg.queue.ttl_seconds as f64;
                let deadline = lane.cfg.deadline_seconds as f64;
                let svc = lane.expected_service;
                let by_ttl = lane
                    .queue
                    .oldest_queued()
                    .filter(|(q, _, _)| now - q > ttl)
                    .map(|(_, k, t)| (k, t.to_owned()));
                let by_deadline = lane
                    .queue
                    .oldest_arrival()
                    .filter(|(fa, _, _)| fa + deadline - now < svc)
                    .map(|(_, k, t)| (k, t.to_owned()));
                let Some((key, tenant)) = by_deadline.or(by_ttl) else {
                    break;
                };
                let defers = lane.cfg.deferral.is_some();
                let retry_after = lane.retry_after();
                let lane = &mut self.lanes[li];
                let w = lane.queue.remove(&tenant, key).expect("indexed");
                self.tickets.remove(&w.ticket);
                let past_deadline = w.first_arrival + deadline - now < svc;
                let outcome = if defers && !past_deadline {
                    if let Some(id) = &w.request_id
                        && let Some(s) = lane.seen.get_mut(id)
                    {
                        s.deferred = true;
                    }
                    Outcome::Deferred
                } else {
                    Outcome::Expired
                };
                out.push((
                    w.ticket,
                    Resolution::Refuse(Refusal {
                        lane: li,
                        attempt: w.attempt,
                        outcome,
                        limit: if outcome == Outcome::Deferred {
                            "deferred"
                        } else if past_deadline {
                            "deadlineSeconds"
                        } else {
                            "queue.ttlSeconds"
                        },
                        retry_after_seconds: if outcome == Outcome::Deferred {
                            retry_after
                        } else {
                            None
                        },
                    }),
                ));
            }
            // Then serve in fair order while there are tokens: the lane's
            // own, then spare capacity (lanes in priority order).
            let stop = self.pressure == Pressure::Stop && self.lanes[li].cfg.sheddable;
            loop {
                if stop || self.lanes[li].queue.len() == 0 {
                    let lane = &mut self.lanes[li];
                    lane.tokens = lane.tokens.min(lane.cap());
                    break;
                }
                let lane = &mut self.lanes[li];
                if lane.tokens >= 1.0 {
                    lane.tokens -= 1.0;
                } else if !(lane.draws_on_spare()
                    && self.spare.take(now, lane.cfg.work_units_per_request))
                {
                    break;
                }
                let Some(w) = lane.queue.pop() else { break };
                lane.used.add(now);
                self.tickets.remove(&w.ticket);
                let remaining = w.first_arrival + lane.cfg.deadline_seconds as f64 - now;
                let history_turns = self.history_turns(li);
                out.push((
                    w.ticket,
                    Resolution::Pass(Pass {
                        lane: li,
                        attempt: w.attempt,
                        history_turns,
                        remaining_seconds: remaining,
                        waited_seconds: now - w.queued_at,
                    }),
                ));
            }
        }
        out
    }

    /// When [`Core::poll`] next has something to do (a token for a waiting
    /// request, or a wait running out), or None when nothing waits.
    pub fn next_wake(&self, now: f64) -> Option<f64> {
        if !self.pending.is_empty() {
            // A request deferred to make room is told at once.
            return Some(now);
        }
        let mut best: Option<f64> = None;
        let mut consider = |t: f64| best = Some(best.map_or(t, |b: f64| b.min(t)));
        for (li, lane) in self.lanes.iter().enumerate() {
            if lane.queue.len() == 0 {
                continue;
            }
            let rate = effective_rate(&self.lanes, li, now);
            let elapsed = (now - lane.last_refill).max(0.0);
            let tokens = (lane.tokens + rate * elapsed).min(lane.cap());
            if rate > 0.0 {
                consider(now + ((1.0 - tokens).max(0.0) / rate));
            }
            if lane.draws_on_spare()
                && let Some(t) = self.spare.ready_at(now, lane.cfg.work_units_per_request)
            {
                consider(t);
            }
            if let Some((q, _, _)) = lane.queue.oldest_queued() {
                consider(q + lane.cfg.queue.ttl_seconds as f64 + 1e-6);
            }
            if let Some((fa, _, _)) = lane.queue.oldest_arrival() {
                consider(fa + lane.cfg.deadline_seconds as f64 - lane.expected_service + 1e-6);
            }
            for g in &lane.grants {
                if g.expires > now {
                    consider(g.expires);
                }
            }
        }
        best
    }

    /// Gives up a waiting request (its client went away). Returns whether it
    /// was waiting.
    pub fn cancel(&mut self, ticket: Ticket) -> bool {
        let Some((li, tenant, key)) = self.tickets.remove(&ticket) else {
            return false;
        };
        self.lanes[li].queue.remove(&tenant, key).is_some()
    }

    /// A passed request went upstream.
    pub fn started(&mut self, now: f64) {
        self.in_flight += 1;
        self.update_pressure(now);
    }

    /// A request that went upstream finished after `latency_seconds`.
    pub fn finished(&mut self, now: f64, latency_seconds: f64) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if latency_seconds.is_finite() {
            self.latency.record(now, latency_seconds);
        }
        self.update_pressure(now);
    }

    /// The p95 latency over the last window, as measured.
    pub fn latency_p95(&self, now: f64) -> Option<f64> {
        self.latency.p95(now)
    }

    fn history_turns(&self, li: usize) -> Option<i32> {
        let oc = self.lanes[li].cfg.optional_context.as_ref()?;
        if self.pressure >= Pressure::Conserve && !oc.degraded {
            Some(oc.degraded_history_turns.unwrap_or(oc.history_turns))
        } else {
            Some(oc.history_turns)
        }
    }

    fn update_pressure(&mut self, now: f64) {
        let Some(w) = self.watermarks else {
            self.pressure = Pressure::Normal;
            return;
        };
        // The stable window of the latency, checked once a second: restarted
        // whenever the p95 is more than LATENCY_RISE_FACTOR above the lowest
        // p95 of the last LATENCY_RISE_LOOKBACK_SECONDS. A window without
        // samples changes nothing.
        let sec = now.floor() as i64;
        if self.checked_second != Some(sec) {
            self.checked_second = Some(sec);
            if let Some(p95) = self.latency.p95(now) {
                while self
                    .recent_p95
                    .front()
                    .is_some_and(|(s, _)| sec - s > LATENCY_RISE_LOOKBACK_SECONDS)
                {
                    self.recent_p95.pop_front();
                }
                let lowest = self.recent_p95.iter().map(|(_, p)| *p).reduce(f64::min);
                if lowest.is_some_and(|low| p95 > low * LATENCY_RISE_FACTOR) {
                    self.stable_since = now;
                }
                self.recent_p95.push_back((sec, p95));
            }
        }
        let n = self.in_flight as f64;
        let entered = if n >= w.stop_at {
            Pressure::Stop
        } else if n >= w.conserve_at {
            Pressure::Conserve
        } else {
            Pressure::Normal
        };
        if entered > self.pressure {
            self.pressure = entered;
        }
        if n < w.resume_below {
            let since = *self.below_since.get_or_insert(now);
            let stable_from = since.max(self.stable_since);
            if self.pressure != Pressure::Normal && now - stable_from >= w.resume_after_stable {
                self.pressure = Pressure::Normal;
            }
        } else {
            self.below_since = None;
        }
    }
}

impl Lane {
    /// May draw on the pool's spare capacity once its own bucket is empty.
    fn draws_on_spare(&self) -> bool {
        self.cfg.spare_capacity && !self.paused
    }

    fn cap(&self) -> f64 {
        self.burst.max(self.floor_rps.ceil())
    }

    /// Adds the tokens accrued since the last refill. While requests wait,
    /// each token is theirs the moment it accrues, so what accrued between
    /// two polls is kept up to the number waiting instead of being lost to
    /// the bucket's size; [`Core::poll`] serves them and trims the rest.
    fn refill(&mut self, now: f64, rate: f64) {
        let elapsed = (now - self.last_refill).max(0.0);
        let cap = self.cap().max(self.queue.len() as f64);
        self.tokens = (self.tokens + rate * elapsed).min(cap);
        self.last_refill = now.max(self.last_refill);
    }
}

/// A lane's bucket rate at `now`: its configured rate raised to its floor
/// (reserved), less the grants that lapsed and less what each lender took
/// back of what it lent.
fn effective_rate(lanes: &[Lane], li: usize, now: f64) -> f64 {
    let lane = &lanes[li];
    if lane.paused {
        return 0.0;
    }
    let mut rate = lane.rate.max(lane.floor_rps);
    for g in &lane.grants {
        if now >= g.expires {
            rate -= g.requests_per_second;
            continue;
        }
        let lender = &lanes[g.from];
        // Units per second the lender uses above its configured rate: it
        // takes back its floor from the borrowers, largest grant first is
        // not needed: each borrower gives back its proportion of the lent
        // units.
        let lender_used_units = lender.used.rate(now) * lender.cfg.work_units_per_request;
        let lender_rate_units = lender.rate * lender.cfg.work_units_per_request;
        let reclaimed = (lender_used_units - lender_rate_units).max(0.0);
        if reclaimed > 0.0 {
            let lent: f64 = lanes
                .iter()
                .flat_map(|l| l.grants.iter())
                .filter(|o| o.from == g.from && now < o.expires)
                .map(|o| o.units_per_second)
                .sum();
            if lent > 0.0 {
                let back = (reclaimed.min(lent) / lent) * g.requests_per_second;
                rate -= back;
            }
        }
    }
    rate.max(0.0)
}

/// Trims a `/v1/chat/completions` body to the system messages and the last
/// `turns` conversation turns (a turn: a user message and every message up
/// to the next user message). Returns whether anything was removed. A body
/// without a `messages` array is left as it is.
pub fn trim_chat_history(body: &mut Value, turns: i32) -> bool {
    let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) else {
        return false;
    };
    let turns = turns.max(0) as usize;
    let is_system = |m: &Value| {
        matches!(
            m.get("role").and_then(Value::as_str),
            Some("system" | "developer")
        )
    };
    // Index of the first message of the kept turns.
    let user_starts: Vec<usize> = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.get("role").and_then(Value::as_str) == Some("user"))
        .map(|(i, _)| i)
        .collect();
    if user_starts.len() <= turns {
        return false;
    }
    let keep_from = if turns == 0 {
        // Keep at least the last user message: the request itself.
        *user_starts.last().expect("non-empty")
    } else {
        user_starts[user_starts.len() - turns]
    };
    let before = messages.len();
    let kept: Vec<Value> = messages
        .iter()
        .enumerate()
        .filter(|(i, m)| *i >= keep_from || is_system(m))
        .map(|(_, m)| m.clone())
        .collect();
    *messages = kept;
    messages.len() != before
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::{
        Borrow, Deferral, Flags, Generations, InFlight, OptionalContext, Queue, Retry,
    };
    use serde_json::json;

    fn lane(name: &str, rps: f64, burst: u64) -> LaneConfig {
        LaneConfig {
            name: name.to_owned(),
            priority: 0,
            state: "Admitted".to_owned(),
            sheddable: true,
            admitted_units_per_second: rps,
            admitted_requests_per_second: rps,
            work_units_per_request: 1.0,
            burst,
            queue: Queue {
                max_depth: 10,
                ttl_seconds: 5,
            },
            deadline_seconds: 30,
            retry: Retry {
                max_attempts: 3,
                budget_percent: 10,
            },
            retry_after_seconds: Some(5),
            deferral: None,
            routes: vec!["r".to_owned()],
            optional_context: None,
            borrowing: vec![],
            floor_units_per_second: None,
            expected_service_seconds: None,
            spare_capacity: false,
        }
    }

    fn config(lanes: Vec<LaneConfig>) -> GatewayConfig {
        GatewayConfig {
            schema_version: 1,
            profile: "ns/p".to_owned(),
            mode: "Enforce".to_owned(),
            level: 0,
            level_name: "normal".to_owned(),
            pending_approval_level: None,
            telemetry: "Known".to_owned(),
            capacity_units_per_second: Some(100.0),
            flags: Flags::default(),
            in_flight: None,
            generations: Generations::default(),
            lanes,
            content_hash: String::new(),
        }
    }

    fn req(lane: &str) -> Request<'_> {
        Request {
            lane,
            tenant: None,
            attempt: None,
            request_id: None,
        }
    }

    fn core(lanes: Vec<LaneConfig>) -> Core {
        Core::new(config(lanes), 1.0, 0.0, 1_000_000.0).unwrap()
    }

    #[test]
    fn the_bucket_admits_burst_then_rate() {
        let mut c = core(vec![lane("a", 10.0, 10)]);
        let passed = (0..15)
            .filter(|_| matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)))
            .count();
        assert_eq!(passed, 10);
        assert_eq!(c.queue_depth(0), 5);
        // 0.5 s later five tokens came: the five queued pass, in order.
        let r = c.poll(0.5);
        assert_eq!(r.len(), 5);
        assert!(r.iter().all(|(_, r)| matches!(r, Resolution::Pass(_))));
        let tickets: Vec<u64> = r.iter().map(|(t, _)| t.0).collect();
        assert_eq!(tickets, vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn an_unknown_lane_is_refused() {
        let mut c = core(vec![lane("a", 10.0, 10)]);
        assert_eq!(c.admit(&req("b"), 0.0), Verdict::UnknownLane);
    }

    #[test]
    fn a_paused_lane_admits_nothing_and_a_defer_lane_defers() {
        let mut p = lane("p", 10.0, 10);
        p.state = "Paused".to_owned();
        p.retry_after_seconds = Some(300);
        let mut d = p.clone();
        d.name = "d".to_owned();
        d.deferral = Some(Deferral {
            retry_after_seconds: 300,
        });
        let mut c = core(vec![p, d]);
        match c.admit(&req("p"), 0.0) {
            Verdict::Refuse(r) => {
                assert_eq!(r.outcome, Outcome::RejectedRate);
                assert_eq!(r.retry_after_seconds, Some(300));
            }
            v => panic!("{v:?}"),
        }
        match c.admit(&req("d"), 0.0) {
            Verdict::Refuse(r) => {
                assert!(r.deferred());
                assert_eq!(r.retry_after_seconds, Some(300));
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_wait_past_the_deadline_is_refused_at_once() {
        let mut l = lane("a", 1.0, 1);
        l.deadline_seconds = 3;
        l.queue.ttl_seconds = 100;
        l.expected_service_seconds = Some(1.0);
        let mut c = core(vec![l]);
        assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)));
        // Waits 1 s + 1 s service: fits 3 s.
        assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Queued { .. }));
        assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Queued { .. }));
        // A third would wait 3 s + 1 s service > 3 s.
        match c.admit(&req("a"), 0.0) {
            Verdict::Refuse(r) => assert_eq!(r.outcome, Outcome::RejectedDeadline),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_full_queue_rejects_and_the_ttl_expires() {
        let mut l = lane("a", 0.1, 1);
        l.queue.max_depth = 2;
        l.queue.ttl_seconds = 25;
        let mut c = core(vec![l]);
        assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)));
        assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Queued { .. }));
        assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Queued { .. }));
        match c.admit(&req("a"), 0.0) {
            Verdict::Refuse(r) => assert_eq!(r.outcome, Outcome::RejectedQueueFull),
            v => panic!("{v:?}"),
        }
        // The first queued is served at 10 s; the second at 20 s.
        assert!(matches!(
            &c.poll(10.0)[..],
            [(Ticket(1), Resolution::Pass(_))]
        ));
        assert!(matches!(
            &c.poll(20.0)[..],
            [(Ticket(2), Resolution::Pass(_))]
        ));
        // One more waits for the token of 30 s (10 s, within the 25 s TTL);
        // then the rate drops tenfold: the token would come at 120 s, and at
        // 45 s its TTL has run out.
        assert!(matches!(
            c.admit(&req("a"), 20.0),
            Verdict::Queued {
                ticket: Ticket(3),
                ..
            }
        ));
        let mut slower = lane("a", 0.01, 1);
        slower.queue.max_depth = 2;
        slower.queue.ttl_seconds = 25;
        assert!(
            c.swap(config(vec![slower]), 1.0, 20.0, 0.0)
                .unwrap()
                .is_empty()
        );
        assert!(c.poll(44.9).is_empty());
        match &c.poll(45.1)[..] {
            [(Ticket(3), Resolution::Refuse(x))] => {
                assert_eq!(x.outcome, Outcome::Expired);
                assert_eq!(x.limit, "queue.ttlSeconds");
            }
            r => panic!("{r:?}"),
        }
        assert_eq!(c.queue_depth(0), 0);
    }

    #[test]
    fn tenants_share_a_lane_fairly() {
        let mut l = lane("a", 1.0, 1);
        l.queue.max_depth = 1000;
        l.queue.ttl_seconds = 10_000;
        l.deadline_seconds = 10_000;
        let mut c = core(vec![l]);
        let at = |t: &'static str| Request {
            lane: "a",
            tenant: Some(t),
            attempt: None,
            request_id: None,
        };
        // Tenant "loop" queues 100 first; "quiet" queues 5 after.
        let _ = c.admit(&at("loop"), 0.0);
        let mut owner = HashMap::new();
        for _ in 0..100 {
            if let Verdict::Queued { ticket, .. } = c.admit(&at("loop"), 0.0) {
                owner.insert(ticket, "loop");
            }
        }
        for _ in 0..5 {
            if let Verdict::Queued { ticket, .. } = c.admit(&at("quiet"), 0.0) {
                owner.insert(ticket, "quiet");
            }
        }
        let mut served = Vec::new();
        for s in 1..=10 {
            for (t, r) in c.poll(s as f64) {
                assert!(matches!(r, Resolution::Pass(_)));
                served.push(owner[&t]);
            }
        }
        let quiet = served.iter().filter(|t| **t == "quiet").count();
        assert_eq!(served.len(), 10);
        assert_eq!(
            quiet, 5,
            "the quiet tenant alternates with the loop: {served:?}"
        );
    }

    #[test]
    fn retries_are_counted_by_id_and_limited() {
        let mut l = lane("a", 1000.0, 1000);
        l.retry.max_attempts = 2;
        l.retry.budget_percent = 10;
        let mut c = core(vec![l]);
        let with_id = |id: &'static str, attempt: Option<u32>| Request {
            lane: "a",
            tenant: None,
            attempt,
            request_id: Some(id),
        };
        // 10 originals allow one retry.
        for i in 0..10 {
            let id: &'static str = Box::leak(format!("r{i}").into_boxed_str());
            assert!(
                matches!(c.admit(&with_id(id, None), 0.0), Verdict::Pass(p) if p.attempt == Attempt::Original)
            );
        }
        // r0 again without the header: a retry.
        assert!(
            matches!(c.admit(&with_id("r0", None), 0.1), Verdict::Pass(p) if p.attempt == Attempt::Retry)
        );
        // r0 a third time: beyond maxAttempts.
        match c.admit(&with_id("r0", None), 0.2) {
            Verdict::Refuse(r) => assert_eq!(r.limit, "retry.maxAttempts"),
            v => panic!("{v:?}"),
        }
        // r1's retry: beyond the budget (1 of 10 used).
        match c.admit(&with_id("r1", Some(2)), 0.3) {
            Verdict::Refuse(r) => assert_eq!(r.limit, "retry.budgetPercent"),
            v => panic!("{v:?}"),
        }
        // Past the window, the originals no longer pay for retries.
        match c.admit(&with_id("new", Some(2)), 20.0) {
            Verdict::Refuse(r) => assert_eq!(r.outcome, Outcome::RejectedRetryBudget),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_deferred_request_returns_as_neither_and_keeps_its_arrival() {
        let mut l = lane("d", 1.0, 1);
        l.queue.max_depth = 1;
        l.queue.ttl_seconds = 100;
        l.deadline_seconds = 100;
        l.deferral = Some(Deferral {
            retry_after_seconds: 7,
        });
        let mut c = core(vec![l]);
        let r = |id: &'static str| Request {
            lane: "d",
            tenant: None,
            attempt: None,
            request_id: Some(id),
        };
        assert!(matches!(c.admit(&r("a"), 0.0), Verdict::Pass(_)));
        assert!(matches!(c.admit(&r("b"), 0.0), Verdict::Queued { .. }));
        match c.admit(&r("c"), 0.5) {
            Verdict::Refuse(x) => {
                assert!(x.deferred());
                assert_eq!(x.retry_after_seconds, Some(7));
            }
            v => panic!("{v:?}"),
        }
        // "b" is served at 1 s; "x" (new) queues at 1.2 s; "c" comes back and,
        // having arrived earlier, takes the place: "x" is deferred.
        assert_eq!(c.poll(1.0).len(), 1);
        assert!(matches!(c.admit(&r("x"), 1.2), Verdict::Queued { .. }));
        match c.admit(&r("c"), 1.3) {
            Verdict::Queued { attempt, .. } => assert_eq!(attempt, Attempt::Returning),
            v => panic!("{v:?}"),
        }
        let res = c.poll(1.3);
        assert!(
            matches!(&res[..], [(_, Resolution::Refuse(x))] if x.deferred()),
            "{res:?}"
        );
    }

    #[test]
    fn the_floor_is_there_at_once_and_borrowers_give_it_back() {
        // P0: admitted 20 req/s, floor 90; P3 borrows 60 of P0's floor.
        let mut p0 = lane("p0", 20.0, 20);
        p0.floor_units_per_second = Some(90.0);
        p0.sheddable = false;
        let mut p3 = lane("p3", 100.0, 100);
        p3.borrowing = vec![Borrow {
            from: "p0".to_owned(),
            units_per_second: 60.0,
            expires_at: "1970-01-12T13:50:00Z".to_owned(), // 1,000,200 s
            release_within_seconds: 30,
        }];
        let mut c = core(vec![p0, p3]);
        assert_eq!(c.effective_rate(1, 0.0), 100.0);
        // A P0 burst of 90 at t=0 all pass: the floor's second is reserved.
        let passed = (0..90)
            .filter(|_| matches!(c.admit(&req("p0"), 0.0), Verdict::Pass(_)))
            .count();
        assert_eq!(passed, 90);
        // P0 used 90 req/s (70 above its rate): P3 gives back the 60 it borrowed.
        assert!((c.effective_rate(1, 0.5) - 40.0).abs() < 1e-9);
        assert!((c.effective_rate(0, 0.5) - 90.0).abs() < 1e-9);
    }

    #[test]
    fn a_grant_lapses_at_expires_at_without_a_new_config() {
        let mut p0 = lane("p0", 20.0, 20);
        p0.floor_units_per_second = Some(90.0);
        let mut p3 = lane("p3", 100.0, 100);
        p3.borrowing = vec![Borrow {
            from: "p0".to_owned(),
            units_per_second: 60.0,
            expires_at: "1970-01-12T13:50:00Z".to_owned(),
            release_within_seconds: 30,
        }];
        let c = core(vec![p0, p3]);
        // unix_now 1,000,000 at mono 0: expires at mono 200.
        assert_eq!(c.effective_rate(1, 199.0), 100.0);
        assert_eq!(c.effective_rate(1, 200.0), 40.0);
    }

    #[test]
    fn watermarks_stop_sheddable_lanes_and_resume_after_a_stable_window() {
        let mut cfg = config(vec![lane("shed", 1e6, 1_000_000), {
            let mut l = lane("never", 1e6, 1_000_000);
            l.sheddable = false;
            l
        }]);
        cfg.in_flight = Some(InFlight {
            conserve_at: 8,
            stop_at: 10,
            resume_below: 5,
            resume_after_stable_seconds: Some(30),
        });
        let mut c = Core::new(cfg, 1.0, 0.0, 0.0).unwrap();
        for _ in 0..10 {
            assert!(matches!(c.admit(&req("shed"), 0.0), Verdict::Pass(_)));
            c.started(0.0);
        }
        assert_eq!(c.pressure(), Pressure::Stop);
        assert!(
            matches!(c.admit(&req("shed"), 0.0), Verdict::Refuse(r) if r.outcome == Outcome::RejectedOverload)
        );
        assert!(matches!(c.admit(&req("never"), 0.0), Verdict::Pass(_)));
        // Down to 4 in flight at t=1 with steady latency: still stopped until
        // 30 s of stability below resumeBelow.
        for _ in 0..6 {
            c.finished(1.0, 0.2);
        }
        assert_eq!(c.pressure(), Pressure::Stop);
        c.finished(20.0, 0.2);
        assert_eq!(c.pressure(), Pressure::Stop);
        c.finished(31.5, 0.2);
        assert_eq!(c.pressure(), Pressure::Normal);
    }

    #[test]
    fn a_rising_latency_restarts_the_stable_window() {
        let mut cfg = config(vec![lane("a", 1e6, 1_000_000)]);
        cfg.in_flight = Some(InFlight {
            conserve_at: 2,
            stop_at: 3,
            resume_below: 2,
            resume_after_stable_seconds: Some(10),
        });
        let mut c = Core::new(cfg, 1.0, 0.0, 0.0).unwrap();
        for _ in 0..3 {
            c.started(0.0);
        }
        assert_eq!(c.pressure(), Pressure::Stop);
        for _ in 0..3 {
            c.finished(0.5, 0.1);
        }
        // One request a second, 0.1 s each until 8 s, then ten times
        // slower. Checked once a second, the p95 (of the 10 s before) is
        // 0.1 s up to the check at 8 s and 1 s from 9 s; it is more than 25 %
        // above the lowest of the last minute until the 0.1 s of second 8
        // leaves that minute at 69 s: the stable window runs from 68 s to
        // 78 s.
        for t in 1..=77 {
            c.started(f64::from(t));
            c.finished(f64::from(t) + 0.5, if t < 8 { 0.1 } else { 1.0 });
        }
        assert_eq!(c.pressure(), Pressure::Stop, "68 s + 10 s not yet");
        c.started(78.0);
        assert_eq!(c.pressure(), Pressure::Normal);
    }

    #[test]
    fn conserving_sends_the_degraded_history() {
        let mut l = lane("a", 1e6, 1_000_000);
        l.optional_context = Some(OptionalContext {
            history_turns: 20,
            degraded: false,
            degraded_history_turns: Some(8),
        });
        let mut cfg = config(vec![l]);
        cfg.in_flight = Some(InFlight {
            conserve_at: 2,
            stop_at: 100,
            resume_below: 1,
            resume_after_stable_seconds: None,
        });
        let mut c = Core::new(cfg, 1.0, 0.0, 0.0).unwrap();
        assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Pass(p) if p.history_turns == Some(20)));
        c.started(0.0);
        c.started(0.0);
        assert_eq!(c.pressure(), Pressure::Conserve);
        assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Pass(p) if p.history_turns == Some(8)));
    }

    #[test]
    fn a_replica_enforces_its_share() {
        let cfg = config(vec![lane("a", 100.0, 100)]);
        let mut c = Core::new(cfg, 0.25, 0.0, 0.0).unwrap();
        let passed = (0..100)
            .filter(|_| matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)))
            .count();
        assert_eq!(passed, 25);
        assert_eq!(c.effective_rate(0, 0.0), 25.0);
    }

    #[test]
    fn bad_configs_are_refused() {
        let mut cfg = config(vec![lane("a", 1.0, 1)]);
        cfg.schema_version = 2;
        assert_eq!(validate(&cfg), Err(ConfigError::SchemaVersion(2)));
        let mut cfg = config(vec![lane("a", 1.0, 1), lane("a", 1.0, 1)]);
        assert!(matches!(validate(&cfg), Err(ConfigError::DuplicateLane(_))));
        cfg.lanes.pop();
        cfg.lanes[0].admitted_requests_per_second = f64::NAN;
        assert!(matches!(
            validate(&cfg),
            Err(ConfigError::Field {
                field: "admittedRequestsPerSecond",
                ..
            })
        ));
        let mut cfg = config(vec![lane("a", 1.0, 1)]);
        cfg.lanes[0].borrowing = vec![Borrow {
            from: "ghost".to_owned(),
            units_per_second: 1.0,
            expires_at: "2026-01-01T00:00:00Z".to_owned(),
            release_within_seconds: 1,
        }];
        assert!(matches!(validate(&cfg), Err(ConfigError::Grant { .. })));
        assert!(matches!(
            Core::new(config(vec![lane("a", 1.0, 1)]), 0.0, 0.0, 0.0),
            Err(ConfigError::Share(_))
        ));
    }

    #[test]
    fn a_swap_keeps_queues_and_refuses_removed_lanes() {
        let mut c = core(vec![lane("a", 1.0, 1), lane("b", 1.0, 1)]);
        let _ = c.admit(&req("a"), 0.0);
        let _ = c.admit(&req("b"), 0.0);
        assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Queued { .. }));
        assert!(matches!(c.admit(&req("b"), 0.0), Verdict::Queued { .. }));
        let refused = c
            .swap(config(vec![lane("a", 10.0, 10)]), 1.0, 0.1, 0.0)
            .unwrap();
        assert_eq!(refused.len(), 1);
        assert_eq!(c.queue_depth(0), 1);
        let r = c.poll(0.2);
        assert_eq!(r.len(), 1);
        // A bad config changes nothing.
        let mut bad = config(vec![lane("z", 1.0, 1)]);
        bad.schema_version = 9;
        assert!(c.swap(bad, 1.0, 0.3, 0.0).is_err());
        assert_eq!(c.lane_index("a"), Some(0));
    }

    #[test]
    fn cancel_removes_a_waiting_request() {
        let mut c = core(vec![lane("a", 1.0, 1)]);
        let _ = c.admit(&req("a"), 0.0);
        let Verdict::Queued { ticket, .. } = c.admit(&req("a"), 0.0) else {
            panic!()
        };
        assert!(c.cancel(ticket));
        assert!(!c.cancel(ticket));
        assert!(c.poll(5.0).is_empty());
    }

    #[test]
    fn chat_history_is_trimmed_to_system_and_last_turns() {
        let mut body = json!({"model": "m", "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "u2"},
            {"role": "assistant", "content": "a2"},
            {"role": "user", "content": "u3"}
        ]});
        assert!(trim_chat_history(&mut body, 2));
        let contents: Vec<&str> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap())
            .collect();
        assert_eq!(contents, vec!["s", "u2", "a2", "u3"]);
        assert!(!trim_chat_history(&mut body, 5));
        assert!(!trim_chat_history(&mut json!({"prompt": "x"}), 1));
    }

    #[test]
    fn spare_capacity_goes_to_lanes_that_may_use_it_in_priority_order() {
        // Capacity 100 units/s; the lanes claim 10 + 20 = 30 of 95: 65 spare.
        let mut a = lane("a", 10.0, 1);
        a.spare_capacity = true;
        a.queue.max_depth = 1000;
        let mut b = lane("b", 20.0, 1);
        b.queue.max_depth = 1000;
        let mut c = core(vec![a, b]);
        assert_eq!(c.spare_units_per_second(), 65.0);
        // Over 10 s of steady overload both lanes queue; a gets its 10/s
        // plus the 65 spare, b (spareCapacity false) its 20/s and no more.
        let mut passed = [0usize; 2];
        let mut t = 0.0;
        while t < 10.0 {
            for (i, name) in ["a", "b"].iter().enumerate() {
                if matches!(c.admit(&req(name), t), Verdict::Pass(_)) {
                    passed[i] += 1;
                }
            }
            for (_, r) in c.poll(t) {
                if let Resolution::Pass(p) = r {
                    passed[p.lane] += 1;
                }
            }
            t += 0.005;
        }
        // Rates plus each bucket's one-second burst (the spare's is 65).
        assert!((745..=830).contains(&passed[0]), "a passed {}", passed[0]);
        assert!((199..=222).contains(&passed[1]), "b passed {}", passed[1]);
    }

    #[test]
    fn no_spare_capacity_without_known_capacity_nor_for_held_lanes() {
        let mut a = lane("a", 1.0, 1);
        a.spare_capacity = true;
        let mut cfg = config(vec![a.clone()]);
        cfg.telemetry = "Unknown".to_owned();
        let c = Core::new(cfg, 1.0, 0.0, 0.0).unwrap();
        assert_eq!(c.spare_units_per_second(), 0.0, "Unknown capacity: none");
        let mut cfg = config(vec![a.clone()]);
        cfg.capacity_units_per_second = None;
        let c = Core::new(cfg, 1.0, 0.0, 0.0).unwrap();
        assert_eq!(c.spare_units_per_second(), 0.0);
        // A paused lane never passes, spare or not.
        let mut p = a.clone();
        p.state = "Paused".to_owned();
        let mut c = core(vec![p]);
        assert!(c.spare_units_per_second() > 0.0);
        assert!(!matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)));
        // Floors are claimed too; two replicas halve the spare.
        let mut f = a;
        f.floor_units_per_second = Some(50.0);
        let c = Core::new(config(vec![f]), 0.5, 0.0, 0.0).unwrap();
        assert_eq!(c.spare_units_per_second(), 100.0 * 0.5 * 0.95 - 25.0);
    }
}
