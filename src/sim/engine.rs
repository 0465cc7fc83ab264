//! The simulation: Poisson arrivals, a gateway per profile (lanekeeper's, or
//! a baseline), a pool that completes work units within its capacity, clients
//! that retry, and — for `lanekeeper` — a controller that evaluates the very
//! same engine as `plan` on telemetry the simulation measured, with lag.
//!
//! Time advances in fixed ticks. Arrivals, completions, expiries and retries
//! carry exact times; the gateway dispatches to the pool at the end of each
//! tick, within the pool's per-tick budget of work units.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Exp1, StandardNormal};
use rustc_hash::FxHashMap;

use crate::api::ObjectKey;
use crate::policy::{self, Approvals, EngineState, Evaluation, World, key};
use crate::snapshot::{LaneSignals, ProfileSignals, Snapshot};
use lanes::{
    Core, GatewayConfig, Outcome, Refusal, Resolution, SaturationMeter, TenantSlot, Ticket, Verdict,
};

use crate::scenario::tenants::Tenants;
use crate::scenario::tokens::TokenSampler;
use crate::scenario::{ClientSpec, Scenario, Steps};

#[path = "engine_tokens.rs"]
mod tokens;

#[path = "engine_tenants.rs"]
mod tenants;

use tenants::TenantOutcome;
pub use tenants::TenantRun;
pub use tokens::LaneTokens;
use tokens::{Shape, TokenAttempt};

/// Which gateway runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// lanekeeper: the gateway's own admission core (`lanekeeper gateway`)
    /// enforcing the `lanes.json` of the latest decision, in front of a pool
    /// that serves what it is sent in arrival order within its capacity.
    Lanekeeper,
    /// One shared FIFO queue per pool, no priorities, no shedding.
    Fifo,
    /// Fixed per-lane rate limits at the contract floors, no ladder.
    Static,
    /// Equal weighted shares of the pool (deficit round robin across lane
    /// queues, work-conserving), no ladder.
    Fair,
}

impl Strategy {
    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Lanekeeper => "lanekeeper",
            Strategy::Fifo => "fifo",
            Strategy::Static => "static",
            Strategy::Fair => "fair",
        }
    }
}

/// Everything a run measured; [`super::report`] turns it into outcomes.
#[derive(Clone, Debug)]
pub struct Run {
    /// The policy that ran.
    pub policy: Strategy,
    /// Scenario name.
    pub scenario: String,
    /// Seed.
    pub seed: u64,
    /// Duration (seconds).
    pub duration: f64,
    /// Tick (seconds).
    pub tick: f64,
    /// Profiles in bind order.
    pub profiles: Vec<ProfileRun>,
    /// Lanes (each names its profile by index).
    pub lanes: Vec<LaneRun>,
    /// Every evaluation of the engine (lanekeeper only), in time order.
    pub evaluations: Vec<Evaluation>,
    /// Problems found while setting up (unbound lanes, lanes without traffic).
    pub warnings: Vec<String>,
    /// What reached lanekeeper's gateway, when recorded ([`run_traced`]).
    pub trace: Option<Trace>,
}

/// What reached lanekeeper's gateway in a run: every attempt as it arrived
/// (originals, retries and returns after a deferral) and every gateway
/// config the controller published, so that the same traffic can be
/// replayed through the real gateway.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// Arrivals in time order.
    pub arrivals: Vec<TracedArrival>,
    /// Published configs in time order: (time, profile index, config).
    pub configs: Vec<(f64, usize, GatewayConfig)>,
    /// How long each attempt the gateway passed took, from its pass until
    /// the pool answered it, seconds, by (request id, attempt number): what
    /// a replay's upstream must take for the gateway to see the same.
    pub served: HashMap<(u64, u16), f64>,
}

/// One attempt reaching the gateway.
#[derive(Clone, Copy, Debug)]
pub struct TracedArrival {
    /// Seconds from the start.
    pub at: f64,
    /// Index into [`Run::lanes`].
    pub lane: usize,
    /// The request's id (the same for every attempt of one request).
    pub request_id: u64,
    /// Attempt number (1 = the original).
    pub attempt: u16,
}

/// One profile's measurements.
#[derive(Clone, Debug)]
pub struct ProfileRun {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Level names, index = level (0 = normal).
    pub level_names: Vec<String>,
    /// Capacity at the start of each second.
    pub capacity: Vec<f64>,
    /// Requests in the pool at the start of each second.
    pub in_flight: Vec<u32>,
    /// Level in force at the start of each second.
    pub level: Vec<u32>,
    /// Work units dispatched to the pool in each tick.
    pub tick_units: Vec<f64>,
    /// Capacity of each tick (units/s).
    pub tick_capacity: Vec<f64>,
    /// Largest work units of one request among the profile's lanes.
    pub max_units: f64,
}

/// One lane's measurements and outcomes.
#[derive(Clone, Debug, Default)]
pub struct LaneRun {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Index of its profile.
    pub profile: usize,
    /// Priority.
    pub priority: i32,
    /// Work units per request.
    pub units: f64,
    /// Deadline (seconds).
    pub deadline: f64,
    /// Original requests (initial backlog included).
    pub offered: u64,
    /// Attempts (originals and retries) that reached the gateway. A request
    /// coming back after a deferral is not an attempt (see `returns`).
    pub attempts: u64,
    /// Requests that came back to the gateway after a deferral.
    pub returns: u64,
    /// Attempts dispatched to the pool.
    pub admitted: u64,
    /// Work units dispatched.
    pub admitted_units: f64,
    /// Requests completed within their deadline (end to end, from the first
    /// attempt).
    pub within_deadline: u64,
    /// Requests completed after their deadline.
    pub late: u64,
    /// Requests whose last attempt expired in a queue.
    pub expired: u64,
    /// Requests whose last attempt was rejected.
    pub rejected: u64,
    /// Requests whose last attempt failed in the pool.
    pub failed: u64,
    /// Requests whose last deferral told them to come back after their
    /// deadline: the client gave up.
    pub deferred_past_deadline: u64,
    /// Deferrals: answers of a `Defer` lane that told a request to come back
    /// later (its queue was full, or its wait ran out).
    pub deferrals: u64,
    /// Requests deferred at least once.
    pub deferred_requests: u64,
    /// Attempts rejected at the gateway (retried or not).
    pub rejected_attempts: u64,
    /// Attempts that expired in a queue (retried or not).
    pub expired_attempts: u64,
    /// End-to-end latency of each completed request (seconds).
    pub latencies: Vec<f32>,
    /// Attempts (originals and retries, not returns after a deferral)
    /// arriving in each second.
    pub arrivals: Vec<u32>,
    /// Original requests (first attempts) arriving in each second.
    pub originals: Vec<u32>,
    /// Retries (attempts after the first) arriving in each second.
    pub retry_arrivals: Vec<u32>,
    /// Work units dispatched in each second.
    pub served_units: Vec<f64>,
    /// Queued attempts at the start of each second (and at the end, last):
    /// waiting in the gateway, or (lanekeeper) sent and waiting in the pool.
    pub queued: Vec<u32>,
    /// Deferred requests waiting to come back at the start of each second
    /// (and at the end, last).
    pub deferred: Vec<u32>,
    /// Admitted units/s of the decision in force at the start of each second
    /// (lanekeeper) or the configured limit (static).
    pub limit: Vec<f64>,
    /// Queued at the end.
    pub queued_end: u64,
    /// In the pool at the end.
    pub in_flight_end: u64,
    /// Waiting to retry at the end.
    pub retrying_end: u64,
    /// Deferred and waiting to come back at the end.
    pub deferred_end: u64,
    /// Mean arrival rate at the end of the run (scenario), req/s.
    pub rate_end: f64,
    /// Its tokens, when they are in play (a lane with `tokens` in the
    /// scenario, under lanekeeper).
    pub tokens: Option<LaneTokens>,
    /// Its tenants' outcomes (a lane with `tenants` in the scenario).
    pub tenants: Vec<TenantRun>,
}

#[derive(Clone, Copy, Debug)]
struct Attempt {
    origin: f64,
    enq: f64,
    /// When lanekeeper's gateway sent it to the pool.
    passed: f64,
    /// The request's id (kept by its retries and returns; 4 bytes, as
    /// the hint below, so an attempt stays 40 bytes).
    id: u32,
    lane: u16,
    /// Attempt number (1 = the original); a return after a deferral keeps it.
    n: u16,
    compliant: bool,
    /// Coming back after a deferral (not a retry).
    returning: bool,
    /// Deferrals so far.
    deferrals: u16,
    /// Where lanekeeper's core wrote its id, carried back by its next
    /// attempt (as a client carries a deferral's token).
    id_hint: lanes::IdHint,
}

struct Timed<T> {
    at: f64,
    seq: u64,
    item: T,
}
impl<T> PartialEq for Timed<T> {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl<T> Eq for Timed<T> {}
impl<T> PartialOrd for Timed<T> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for Timed<T> {
    // Reversed: BinaryHeap pops the earliest first.
    fn cmp(&self, o: &Self) -> Ordering {
        o.at.total_cmp(&self.at).then(o.seq.cmp(&self.seq))
    }
}

/// Attempts that come back later, bucketed by tick: a tick takes every one
/// due before its end (the caller sorts them), at a cost independent of how
/// many wait (a heap of the hundreds of thousands of deferred requests cost
/// a quarter of a run).
struct Calendar<T> {
    dt: f64,
    buckets: Vec<Vec<Timed<T>>>,
    /// Every bucket before this one is empty.
    first: usize,
}

impl<T> Calendar<T> {
    fn new(dt: f64, ticks: usize) -> Calendar<T> {
        Calendar {
            dt,
            buckets: (0..ticks + 2).map(|_| Vec::new()).collect(),
            first: 0,
        }
    }

    fn bucket(&self, at: f64) -> usize {
        // Past the end of the run: the last bucket, never due.
        ((at / self.dt).floor().max(0.0) as usize).min(self.buckets.len() - 1)
    }

    fn push(&mut self, t: Timed<T>) {
        let b = self.bucket(t.at).max(self.first);
        self.buckets[b].push(t);
    }

    /// Moves every entry with `at < t_end` into `out`.
    fn take_before(&mut self, t_end: f64, out: &mut Vec<Timed<T>>) {
        let last = self.bucket(t_end);
        let mut first = None;
        for b in self.first..=last {
            let bucket = std::mem::take(&mut self.buckets[b]);
            let mut keep = Vec::new();
            for x in bucket {
                if x.at < t_end {
                    out.push(x);
                } else {
                    keep.push(x);
                }
            }
            if !keep.is_empty() && first.is_none() {
                first = Some(b);
            }
            self.buckets[b] = keep;
        }
        self.first = first.unwrap_or(last);
    }
}

/// Static per-lane setup.
struct LaneSetup {
    key: String,
    /// The LaneContract's name (the gateway's lane header).
    name: String,
    profile: usize,
    priority: i32,
    weight: f64,
    units: f64,
    ttl: f64,
    max_depth: usize,
    deadline: f64,
    floor: Option<f64>,
    arrivals: Steps,
    mu: f64,
    sigma: f64,
    failure: f64,
    clients: ClientSpec,
    backlog: u64,
    /// The scenario's token distribution of its requests (with tenants of
    /// their own tokens: its service times are scaled against their mean
    /// request).
    tokens: Option<TokenSampler>,
    /// Who sends its requests (none: the default tenant).
    tenants: Tenants,
}

/// A lane's token sampler: its own distribution, or (when only its tenants
/// have one) the first tenant's, with service times scaled against the
/// mean request over its tenants.
fn lane_tokens(
    lane: Option<&crate::scenario::TokenDistribution>,
    tenants: &Tenants,
) -> Option<TokenSampler> {
    let own = lane.map(crate::scenario::TokenDistribution::sampler);
    if tenants.is_empty() {
        return own;
    }
    let fallback = own.or_else(|| (0..tenants.len()).find_map(|i| tenants.sampler(i).copied()))?;
    let mean = tenants.mean_total(own.as_ref())?;
    Some(fallback.with_mean_total(mean))
}

/// A baseline gateway's view of one lane (and, for lanekeeper, the rate of
/// the decision in force, for the series).
#[derive(Clone, Debug)]
struct Gate {
    rate: f64,
    tokens: f64,
    deficit: f64,
}

#[derive(Clone, Copy)]
enum Fail {
    Rejected {
        retry_after: Option<f64>,
        final_for_compliant: bool,
    },
    Expired,
    Failed,
    /// Refused before admission for `maxInputTokens` (413: no client
    /// retries it).
    TooLong,
}

/// What a scenario key names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// A key of `profiles`.
    Profile,
    /// A key of `lanes`.
    Lane,
}

impl std::fmt::Display for KeyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeyKind::Profile => "profile",
            KeyKind::Lane => "lane",
        })
    }
}

/// Why a scenario cannot run against the manifests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// A scenario key names no profile or lane of the manifests.
    #[error("{kind} {key:?} matches nothing in the manifests (known: {})", .known.join(", "))]
    UnknownKey {
        /// Profile or lane.
        kind: KeyKind,
        /// The key as written in the scenario.
        key: String,
        /// The full keys of that kind in the manifests.
        known: Vec<String>,
    },
    /// A bare name matches in several namespaces.
    #[error("{kind} {key:?} is ambiguous: write namespace/name")]
    AmbiguousKey {
        /// Profile or lane.
        kind: KeyKind,
        /// The key as written in the scenario.
        key: String,
    },
    /// Two scenario keys resolve to the same lane.
    #[error("lane {lane} appears twice in the scenario")]
    LaneTwice {
        /// The lane's full key.
        lane: String,
    },
    /// More lanes than the engine indexes.
    #[error("too many lanes for one simulation")]
    TooManyLanes {
        /// How many lanes there are.
        lanes: usize,
    },
}

/// Resolves scenario keys (`namespace/name`, or `name` when unique) to
/// full keys among `known`.
fn resolve<'a>(kind: KeyKind, k: &str, known: &'a [String]) -> Result<&'a String, SimError> {
    if let Some(f) = known.iter().find(|x| *x == k) {
        return Ok(f);
    }
    let by_name: Vec<&String> = known
        .iter()
        .filter(|x| x.rsplit('/').next() == Some(k))
        .collect();
    match by_name.as_slice() {
        [one] => Ok(one),
        [] => Err(SimError::UnknownKey {
            kind,
            key: k.to_owned(),
            known: known.to_vec(),
        }),
        _ => Err(SimError::AmbiguousKey {
            kind,
            key: k.to_owned(),
        }),
    }
}

/// Runs a scenario under a policy.
pub fn run(world: &World, scenario: &Scenario, policy: Strategy) -> Result<Run, SimError> {
    Ok(Sim::new(world, scenario, policy)?.run())
}

/// Runs a scenario under lanekeeper and records what reached its gateway
/// ([`Run::trace`]): the arrivals and the configs published, to replay
/// through the real gateway.
pub fn run_traced(world: &World, scenario: &Scenario) -> Result<Run, SimError> {
    let mut sim = Sim::new(world, scenario, Strategy::Lanekeeper)?;
    sim.trace = Some(Trace::default());
    Ok(sim.run())
}

struct Sim<'a> {
    world: &'a World,
    sc: &'a Scenario,
    policy: Strategy,
    lanes: Vec<LaneSetup>,
    out: Run,
    // per profile
    capacity: Vec<Steps>,
    budget: Vec<f64>,
    in_flight: Vec<u32>,
    level: Vec<u32>,
    profile_lanes: Vec<Vec<usize>>,
    // per queue (lane, or profile for fifo)
    queues: Vec<VecDeque<Attempt>>,
    queued: Vec<u64>,
    gates: Vec<Gate>,
    // per lane
    next_arrival: Vec<f64>,
    rng_arrival: Vec<ChaCha8Rng>,
    rng_service: Vec<ChaCha8Rng>,
    rng_client: Vec<ChaCha8Rng>,
    retrying: Vec<u64>,
    deferred_waiting: Vec<u64>,
    pool_count: Vec<u64>,
    // telemetry per profile per second
    lat: Vec<Vec<Vec<f32>>>,
    done: Vec<Vec<u32>>,
    /// lanekeeper's gateway: when it is saturated, and per second the
    /// seconds it spent so and the work units it completed meanwhile (its
    /// capacity evidence).
    saturation: Vec<SaturationMeter>,
    saturated_seconds: Vec<Vec<f32>>,
    saturated_units: Vec<Vec<f32>>,
    errors: Vec<Vec<u32>>,
    pool_heap: BinaryHeap<Timed<(Attempt, bool)>>,
    /// Retries and returns after a deferral, by when they come back.
    retry_heap: Calendar<Attempt>,
    seq: u64,
    state: EngineState,
    // lanekeeper's gateway, per profile: the admission core (None until the
    // first config), the config published last, the pool's queue of what
    // the gateway sent (in arrival order), and the attempts waiting in the
    // core's queues by ticket.
    cores: Vec<Option<Core>>,
    published: Vec<Option<GatewayConfig>>,
    pool_queue: Vec<VecDeque<Attempt>>,
    /// Per lane: attempts in the pool's queue, not started yet (counted
    /// with the gateway's queue as the lane's queued work).
    pool_waiting: Vec<u64>,
    waiting: Vec<FxHashMap<Ticket, Attempt>>,
    /// The tenant slots of passed attempts in lanes with a maximum per
    /// tenant, by (request id, attempt), given back when they finish.
    tenant_slots: FxHashMap<(u32, u16), TenantSlot>,
    /// Sized attempts of lanes with tokens, by (request id, attempt),
    /// from their arrival until they end.
    token_attempts: FxHashMap<(u32, u16), TokenAttempt>,
    next_id: u64,
    trace: Option<Trace>,
    pending_refusals: Vec<(Attempt, Refusal)>,
}

/// `n` in decimal, written at the end of `buf` (what `format!("{n}")`
/// gives, without the formatter's machinery on every admission).
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[i..]).expect("ASCII digits")
}

fn stream(seed: u64, s: u64) -> ChaCha8Rng {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    r.set_stream(s);
    r
}

/// What a scenario says of the bound world, keyed by full `ns/name`.
struct Inputs<'w, 's> {
    bound: policy::Bound<'w>,
    pkeys: Vec<String>,
    capacity: BTreeMap<String, Steps>,
    lanes: BTreeMap<String, &'s crate::scenario::LaneScenario>,
    warnings: Vec<String>,
}

/// Binds the world and resolves the scenario's profile and lane keys.
fn inputs<'w, 's>(world: &'w World, sc: &'s Scenario) -> Result<Inputs<'w, 's>, SimError> {
    let bound = policy::bind(world);
    let warnings = bound.warnings.iter().map(ToString::to_string).collect();
    let pkeys: Vec<String> = bound.bindings.iter().map(|b| b.profile.key()).collect();
    let lane_keys: Vec<String> = bound
        .bindings
        .iter()
        .flat_map(|b| b.lanes.iter().map(|l| l.key()))
        .collect();
    let mut capacity = BTreeMap::new();
    for (k, p) in &sc.profiles {
        let full = resolve(KeyKind::Profile, k, &pkeys)?;
        if !p.capacity.is_empty() {
            let steps = p
                .capacity
                .iter()
                .map(|c| (c.at, c.units_per_second))
                .collect();
            capacity.insert(full.clone(), Steps::new(steps));
        }
    }
    let mut lanes = BTreeMap::new();
    for (k, l) in &sc.lanes {
        let full = resolve(KeyKind::Lane, k, &lane_keys)?;
        if lanes.insert(full.clone(), l).is_some() {
            return Err(SimError::LaneTwice { lane: full.clone() });
        }
    }
    Ok(Inputs {
        bound,
        pkeys,
        capacity,
        lanes,
        warnings,
    })
}

/// One lane as the simulation runs it: its contract with the scenario's
/// traffic (none, with a warning, when the scenario has none for it).
fn lane_setup(
    l: &crate::api::LaneContract,
    profile: usize,
    sc: &Scenario,
    inputs: &mut Inputs<'_, '_>,
) -> LaneSetup {
    let lk = l.key();
    let s = &l.spec;
    let scenario = inputs.lanes.get(&lk);
    let tenants = Tenants::new(scenario.map_or(&[][..], |x| x.tenants.as_slice()));
    let tokens = lane_tokens(scenario.and_then(|x| x.tokens.as_ref()), &tenants);
    let (arrivals, service, failure, clients, backlog) = match scenario {
        Some(x) => (
            Steps::new(
                x.arrivals
                    .iter()
                    .map(|r| (r.at, r.requests_per_second))
                    .collect(),
            ),
            x.service.clone(),
            x.failure_ratio,
            x.clients.clone().unwrap_or_else(|| sc.clients.clone()),
            x.initial_backlog,
        ),
        None => {
            inputs
                .warnings
                .push(format!("lane {lk} has no traffic in the scenario"));
            let service = crate::scenario::ServiceSpec {
                p50_seconds: 1.0,
                p95_seconds: 1.0,
            };
            (Steps::constant(0.0), service, 0.0, sc.clients.clone(), 0)
        }
    };
    let mu = service.p50_seconds.ln();
    let sigma = (service.p95_seconds.ln() - mu) / 1.644_853_626_951_472_2;
    LaneSetup {
        key: lk,
        name: l.metadata.name.clone().unwrap_or_default(),
        profile,
        priority: s.priority,
        weight: f64::from(s.weight.max(1)),
        units: s.work_units_per_request.value(),
        ttl: s.queue.ttl_seconds as f64,
        max_depth: s.queue.max_depth.max(0) as usize,
        deadline: s.deadline_seconds as f64,
        floor: s.floor_units_per_second.as_ref().map(|f| f.value()),
        arrivals,
        mu,
        sigma,
        failure,
        clients,
        backlog,
        tokens,
        tenants,
    }
}

/// A profile's series, sized for the run.
fn profile_run(b: &policy::Binding<'_>, nsec: usize, ticks: usize, max_units: f64) -> ProfileRun {
    let level_names = std::iter::once("normal".to_owned())
        .chain(
            b.policy
                .iter()
                .flat_map(|p| p.spec.levels.iter().map(|l| l.name.clone())),
        )
        .collect();
    ProfileRun {
        namespace: b.profile.metadata.namespace.clone().unwrap_or_default(),
        name: b.profile.metadata.name.clone().unwrap_or_default(),
        level_names,
        capacity: vec![0.0; nsec],
        in_flight: vec![0; nsec],
        level: vec![0; nsec],
        tick_units: vec![0.0; ticks],
        tick_capacity: vec![0.0; ticks],
        max_units,
    }
}

/// A lane's series, sized for the run.
fn lane_run(l: &LaneSetup, nsec: usize, dur: f64) -> LaneRun {
    let (ns, name) = l.key.split_once('/').unwrap_or(("", &l.key));
    LaneRun {
        namespace: ns.to_owned(),
        name: name.to_owned(),
        profile: l.profile,
        priority: l.priority,
        units: l.units,
        deadline: l.deadline,
        arrivals: vec![0; nsec],
        originals: vec![0; nsec],
        retry_arrivals: vec![0; nsec],
        served_units: vec![0.0; nsec],
        queued: vec![0; nsec + 1],
        deferred: vec![0; nsec + 1],
        limit: vec![f64::NAN; nsec],
        rate_end: l.arrivals.at(dur),
        tenants: (0..l.tenants.len())
            .map(|i| TenantRun {
                name: l.tenants.name(i).to_owned(),
                ..TenantRun::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// The profiles and lanes of a run, lanes of each profile in priority then
/// name order.
struct Layout {
    lanes: Vec<LaneSetup>,
    profiles: Vec<ProfileRun>,
    capacity: Vec<Steps>,
    profile_lanes: Vec<Vec<usize>>,
}

fn layout(sc: &Scenario, inputs: &mut Inputs<'_, '_>, nsec: usize, ticks: usize) -> Layout {
    let mut out = Layout {
        lanes: Vec::new(),
        profiles: Vec::new(),
        capacity: Vec::new(),
        profile_lanes: Vec::new(),
    };
    let bindings = inputs.bound.bindings.clone();
    for (pi, b) in bindings.iter().enumerate() {
        let safe = b.profile.spec.capacity.safe_units_per_second.value();
        let pk = inputs.pkeys[pi].clone();
        let steps = inputs
            .capacity
            .remove(&pk)
            .unwrap_or_else(|| Steps::constant(safe));
        out.capacity.push(steps);
        let mut ls: Vec<_> = b.lanes.clone();
        ls.sort_by(|a, c| {
            (a.spec.priority, a.metadata.name.as_deref())
                .cmp(&(c.spec.priority, c.metadata.name.as_deref()))
        });
        let mut idxs = Vec::new();
        let mut max_units: f64 = 0.0;
        for l in ls {
            let setup = lane_setup(l, pi, sc, inputs);
            max_units = max_units.max(setup.units);
            idxs.push(out.lanes.len());
            out.lanes.push(setup);
        }
        out.profile_lanes.push(idxs);
        out.profiles.push(profile_run(b, nsec, ticks, max_units));
    }
    out
}

impl<'a> Sim<'a> {
    fn new(world: &'a World, sc: &'a Scenario, policy: Strategy) -> Result<Self, SimError> {
        let mut inputs = inputs(world, sc)?;
        let dur = sc.duration_seconds;
        let nsec = dur.ceil() as usize + 1;
        let ticks = (dur / sc.tick_seconds).ceil() as usize;
        let Layout {
            lanes,
            profiles,
            capacity,
            profile_lanes,
        } = layout(sc, &mut inputs, nsec, ticks);
        if lanes.len() > usize::from(u16::MAX) {
            return Err(SimError::TooManyLanes { lanes: lanes.len() });
        }
        let (np, nl) = (profiles.len(), lanes.len());
        let lane_runs = lanes
            .iter()
            .map(|l| LaneRun {
                tokens: (l.tokens.is_some() && policy == Strategy::Lanekeeper)
                    .then(LaneTokens::default),
                ..lane_run(l, nsec, dur)
            })
            .collect();
        let nq = if policy == Strategy::Fifo { np } else { nl };
        let gates = lanes
            .iter()
            .map(|_| Gate {
                rate: 0.0,
                tokens: 0.0,
                deficit: 0.0,
            })
            .collect();
        let seed = sc.seed;
        Ok(Self {
            world,
            sc,
            policy,
            out: Run {
                policy,
                scenario: sc.name.clone().unwrap_or_else(|| "scenario".into()),
                seed,
                duration: dur,
                tick: sc.tick_seconds,
                profiles,
                lanes: lane_runs,
                evaluations: Vec::new(),
                warnings: inputs.warnings,
                trace: None,
            },
            capacity,
            budget: vec![0.0; np],
            in_flight: vec![0; np],
            level: vec![0; np],
            profile_lanes,
            queues: vec![VecDeque::new(); nq],
            queued: vec![0; nl],
            gates,
            next_arrival: vec![0.0; nl],
            rng_arrival: (0..nl).map(|i| stream(seed, 3 * i as u64)).collect(),
            rng_service: (0..nl).map(|i| stream(seed, 3 * i as u64 + 1)).collect(),
            rng_client: (0..nl).map(|i| stream(seed, 3 * i as u64 + 2)).collect(),
            retrying: vec![0; nl],
            deferred_waiting: vec![0; nl],
            pool_count: vec![0; nl],
            lat: vec![vec![Vec::new(); nsec]; np],
            done: vec![vec![0; nsec]; np],
            saturation: vec![SaturationMeter::default(); np],
            saturated_seconds: vec![vec![0.0; nsec]; np],
            saturated_units: vec![vec![0.0; nsec]; np],
            errors: vec![vec![0; nsec]; np],
            pool_heap: BinaryHeap::new(),
            retry_heap: Calendar::new(sc.tick_seconds, ticks),
            seq: 0,
            state: EngineState::default(),
            cores: (0..np).map(|_| None).collect(),
            published: vec![None; np],
            pool_queue: vec![VecDeque::new(); np],
            pool_waiting: vec![0; nl],
            waiting: (0..np).map(|_| FxHashMap::default()).collect(),
            tenant_slots: FxHashMap::default(),
            token_attempts: FxHashMap::default(),
            next_id: 0,
            trace: None,
            pending_refusals: Vec::new(),
            lanes,
        })
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// The next Poisson arrival of lane `i` strictly after `from`.
    fn draw_arrival(&mut self, i: usize, from: f64) -> f64 {
        let mut t = from;
        loop {
            let steps = &self.lanes[i].arrivals;
            let r = steps.at(t);
            let nc = steps.next_change(t).unwrap_or(f64::INFINITY);
            if r <= 0.0 {
                if nc.is_infinite() {
                    return f64::INFINITY;
                }
                t = nc;
                continue;
            }
            let e: f64 = self.rng_arrival[i].sample(Exp1);
            let next = t + e / r;
            if next < nc {
                return next;
            }
            t = nc;
        }
    }

    fn sec(&self, t: f64) -> usize {
        (t.max(0.0) as usize).min(
            self.out
                .profiles
                .first()
                .map_or(0, |p| p.capacity.len().saturating_sub(1)),
        )
    }

    fn queue_of(&self, lane: usize) -> usize {
        if self.policy == Strategy::Fifo {
            self.lanes[lane].profile
        } else {
            lane
        }
    }

    fn new_attempt(&mut self, lane: usize, at: f64, compliant: bool) -> Attempt {
        self.next_id += 1;
        let a = Attempt {
            origin: at,
            enq: at,
            passed: f64::NAN,
            id: u32::try_from(self.next_id).expect("fewer than 2^32 requests in a run"),
            lane: lane as u16,
            n: 1,
            compliant,
            returning: false,
            deferrals: 0,
            id_hint: lanes::IdHint::NONE,
        };
        self.count_tenant(&a, TenantOutcome::Offered);
        a
    }

    fn run(mut self) -> Run {
        let dt = self.sc.tick_seconds;
        let dur = self.sc.duration_seconds;
        let ticks = (dur / dt).ceil() as usize;
        let nl = self.lanes.len();
        // Initial backlogs and first arrivals. lanekeeper's gateway sees the
        // backlog arrive at once, once it has its first config.
        let mut initial = Vec::new();
        for i in 0..nl {
            for _ in 0..self.lanes[i].backlog {
                let compliant = self.draw_compliance(i);
                let a = self.new_attempt(i, 0.0, compliant);
                self.out.lanes[i].offered += 1;
                self.out.lanes[i].attempts += 1;
                if self.policy == Strategy::Lanekeeper {
                    initial.push(a);
                } else {
                    let q = self.queue_of(i);
                    self.queues[q].push_back(a);
                    self.queued[i] += 1;
                }
            }
            self.next_arrival[i] = self.draw_arrival(i, 0.0);
        }
        self.configure_baselines();
        let eval_every = self.sc.controller.evaluation_interval_seconds;
        let mut next_eval = 0.0;
        let mut next_second = 0usize;
        let mut batch: Vec<(f64, u64, Attempt, bool)> = Vec::new();
        let mut due: Vec<Timed<Attempt>> = Vec::new();
        for tick in 0..ticks {
            let t = tick as f64 * dt;
            let t_end = ((tick + 1) as f64 * dt).min(dur);
            if self.policy == Strategy::Lanekeeper {
                while next_eval <= t + 1e-9 {
                    self.evaluate(next_eval);
                    next_eval += eval_every;
                }
                for a in std::mem::take(&mut initial) {
                    self.arrive(a, 0.0);
                }
            }
            while (next_second as f64) <= t + 1e-9
                && next_second < self.out.profiles.first().map_or(0, |p| p.capacity.len())
            {
                self.sample(next_second);
                next_second += 1;
            }
            // Arrivals (fresh and retries) in [t, t_end), in time order.
            batch.clear();
            for i in 0..nl {
                while self.next_arrival[i] < t_end {
                    let at = self.next_arrival[i];
                    let compliant = self.draw_compliance(i);
                    let s = self.next_seq();
                    let a = self.new_attempt(i, at, compliant);
                    batch.push((at, s, a, true));
                    self.next_arrival[i] = self.draw_arrival(i, at);
                }
            }
            self.retry_heap.take_before(t_end, &mut due);
            for r in due.drain(..) {
                let li = usize::from(r.item.lane);
                if r.item.returning {
                    self.deferred_waiting[li] -= 1;
                } else {
                    self.retrying[li] -= 1;
                }
                batch.push((r.at, r.seq, r.item, false));
            }
            batch.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let interleave = self.policy == Strategy::Lanekeeper;
            for &(at, _, a, fresh) in &batch {
                // lanekeeper's gateway sees completions and arrivals in time
                // order (in-flight and the latency it measures drive its
                // watermarks).
                while interleave && self.pool_heap.peek().is_some_and(|c| c.at <= at) {
                    let Some(c) = self.pool_heap.pop() else { break };
                    self.complete(c.item.0, c.item.1, c.at);
                }
                let mut a = a;
                let li = usize::from(a.lane);
                let s = self.sec(at);
                let ln = &mut self.out.lanes[li];
                if a.returning {
                    ln.returns += 1;
                } else {
                    ln.attempts += 1;
                    ln.arrivals[s] += 1;
                    if fresh {
                        ln.offered += 1;
                        ln.originals[s] += 1;
                    } else {
                        ln.retry_arrivals[s] += 1;
                    }
                }
                a.enq = at;
                self.arrive(a, at);
            }
            // Completions in [t, t_end).
            while self.pool_heap.peek().is_some_and(|c| c.at < t_end) {
                let Some(c) = self.pool_heap.pop() else { break };
                self.complete(c.item.0, c.item.1, c.at);
            }
            // Expiry and dispatch at t_end.
            self.expire(t_end);
            self.dispatch(tick, t, t_end);
        }
        while next_second < self.out.profiles.first().map_or(0, |p| p.capacity.len()) {
            self.sample(next_second);
            next_second += 1;
        }
        // End state.
        for i in 0..nl {
            let ln = &mut self.out.lanes[i];
            ln.queued_end = self.queued[i] + self.pool_waiting[i];
            ln.in_flight_end = self.pool_count[i];
            ln.retrying_end = self.retrying[i];
            ln.deferred_end = self.deferred_waiting[i];
            if let Some(last) = ln.queued.last_mut() {
                *last = (self.queued[i] + self.pool_waiting[i]) as u32;
            }
            if let Some(last) = ln.deferred.last_mut() {
                *last = self.deferred_waiting[i] as u32;
            }
        }
        self.out.trace = self.trace.take();
        self.out
    }

    fn draw_compliance(&mut self, i: usize) -> bool {
        let share = self.lanes[i].clients.ignore_retry_after_share;
        if share <= 0.0 {
            return true;
        }
        self.rng_arrival[i].random::<f64>() >= share
    }

    fn sample(&mut self, s: usize) {
        let t = s as f64;
        for p in 0..self.out.profiles.len() {
            let cap = self.capacity[p].at(t);
            let pr = &mut self.out.profiles[p];
            pr.capacity[s] = cap;
            pr.in_flight[s] = self.in_flight[p];
            pr.level[s] = self.level[p];
        }
        for i in 0..self.lanes.len() {
            let ln = &mut self.out.lanes[i];
            ln.queued[s] = (self.queued[i] + self.pool_waiting[i]) as u32;
            ln.deferred[s] = self.deferred_waiting[i] as u32;
            ln.limit[s] = match self.policy {
                Strategy::Lanekeeper | Strategy::Static => self.gates[i].rate,
                _ => f64::NAN,
            };
        }
    }

    fn configure_baselines(&mut self) {
        if self.policy != Strategy::Static {
            return;
        }
        // Static: each lane limited to its floor; lanes without a floor share
        // what the floors leave of the safe capacity equally.
        let bound = policy::bind(self.world);
        for (pi, b) in bound.bindings.iter().enumerate() {
            let safe = b.profile.spec.capacity.safe_units_per_second.value();
            let idx = &self.profile_lanes[pi];
            let floors: f64 = idx.iter().filter_map(|&i| self.lanes[i].floor).sum();
            let without = idx
                .iter()
                .filter(|&&i| self.lanes[i].floor.is_none())
                .count();
            let share = if without > 0 {
                ((safe - floors) / without as f64).max(0.0)
            } else {
                0.0
            };
            for &i in idx {
                let r = self.lanes[i].floor.unwrap_or(share);
                self.gates[i].rate = r;
                self.gates[i].tokens = burst(r, self.lanes[i].units, BASELINE_BURST_SECONDS);
            }
        }
    }

    /// One controller evaluation at `now`, on telemetry measured up to
    /// `now − lag`.
    fn evaluate(&mut self, now: f64) {
        let snap = self.snapshot_at(now);
        // Later windows start no earlier: the latencies of the seconds
        // before this one's are not read again.
        let c = &self.sc.controller;
        let lo = (now - c.telemetry_lag_seconds - c.window_seconds).floor();
        for seconds in &mut self.lat {
            let done = (lo.max(0.0) as usize).min(seconds.len());
            for v in seconds[..done].iter_mut().filter(|v| v.capacity() > 0) {
                *v = Vec::new();
            }
        }
        let approvals = self.approvals_at(now);
        let (eval, next) = policy::evaluate(self.world, &snap, &approvals, &self.state);
        self.state = next;
        let bound = policy::bind(self.world);
        for (p, d) in eval.profiles.iter().enumerate() {
            self.level[p] = d.level;
            for ld in &d.lanes {
                let k = key(&ld.namespace, &ld.name);
                if let Some(&i) = self.profile_lanes[p]
                    .iter()
                    .find(|&&i| self.lanes[i].key == k)
                {
                    self.gates[i].rate = ld.admitted_units_per_second;
                }
            }
            if let Some(b) = bound.bindings.get(p) {
                self.publish(p, d, b, snap.at, now);
            }
        }
        for (a, r) in std::mem::take(&mut self.pending_refusals) {
            self.queued[usize::from(a.lane)] -= 1;
            self.refused(a, now, &r);
        }
        self.out.evaluations.push(eval);
    }

    /// The telemetry the controller sees at `now`: measured over its window,
    /// `telemetryLagSeconds` old; nothing of a profile during an outage.
    fn snapshot_at(&self, now: f64) -> Snapshot {
        let c = &self.sc.controller;
        let m = now - c.telemetry_lag_seconds;
        let hi = m.floor();
        let lo = (m - c.window_seconds).floor().max(0.0);
        let measured = hi > lo && hi >= 1.0;
        let outage = c.telemetry_outages.iter().any(|o| o.from <= m && m < o.to);
        let mut snap = Snapshot {
            at: now.round() as i64,
            ..Default::default()
        };
        let window = measured.then(|| {
            let secs = self.out.profiles.first().map_or(0, |p| p.capacity.len());
            (lo as usize, (hi as usize).min(secs))
        });
        for (p, pr) in self.out.profiles.iter().enumerate() {
            for &i in &self.profile_lanes[p] {
                snap.lanes
                    .insert(self.lanes[i].key.clone(), self.lane_signals(i, window));
            }
            if !outage {
                let mut sig = match window {
                    Some(w) => self.profile_signals(p, w),
                    None => ProfileSignals {
                        available_units_per_second: Some(self.capacity[p].at(0.0)),
                        ..Default::default()
                    },
                };
                sig.gateway_goodput_while_saturated = self.gateway_goodput(p, now);
                snap.profiles.insert(key(&pr.namespace, &pr.name), sig);
            }
        }
        snap
    }

    /// A lane's demand over the window: originals (first attempts) are
    /// demand; retries are counted apart; returns after a deferral are
    /// neither. Before anything is measured, the scenario's first rate.
    fn lane_signals(&self, i: usize, window: Option<(usize, usize)>) -> LaneSignals {
        let (rps, retry_rps) = match window {
            Some((lo, hi)) => {
                let rate = |v: &[u32]| {
                    v[lo..hi].iter().map(|&x| u64::from(x)).sum::<u64>() as f64 / (hi - lo) as f64
                };
                let ln = &self.out.lanes[i];
                (rate(&ln.originals), rate(&ln.retry_arrivals))
            }
            None => (self.lanes[i].arrivals.at(0.0), 0.0),
        };
        LaneSignals {
            requests_per_second: Some(rps),
            retry_requests_per_second: Some(retry_rps),
            ..Default::default()
        }
    }

    /// The gateway's goodput while saturated as the controller reads it at
    /// `now` (with `controller.gatewayEvidence`): work units completed while
    /// saturated ÷ seconds saturated, over the window that ends one scrape
    /// ago; None (no evidence) with less than a second saturated in it.
    fn gateway_goodput(&self, p: usize, now: f64) -> Option<f64> {
        let g = self.sc.controller.gateway_evidence.as_ref()?;
        let hi = ((now - g.scrape_interval_seconds).floor().max(0.0) as usize)
            .min(self.saturated_seconds[p].len());
        let lo = ((now - g.scrape_interval_seconds - g.window_seconds)
            .floor()
            .max(0.0) as usize)
            .min(hi);
        let secs: f64 = self.saturated_seconds[p][lo..hi]
            .iter()
            .map(|&x| f64::from(x))
            .sum();
        let units: f64 = self.saturated_units[p][lo..hi]
            .iter()
            .map(|&x| f64::from(x))
            .sum();
        (secs >= 1.0).then(|| units / secs)
    }

    /// lanekeeper's gateway after a tick: saturated or not from `now` on;
    /// the tick's saturated time is counted in its second.
    fn observe_saturation(&mut self, p: usize, t: f64, now: f64) {
        let Some(core) = self.cores[p].as_ref() else {
            return;
        };
        let was = self.saturation[p].is_saturated();
        self.saturation[p].observe(now, core.saturated());
        if was {
            let s = self.sec(t);
            self.saturated_seconds[p][s] += (now - t) as f32;
        }
    }

    /// A profile's measured signals over the window `[lo, hi)` seconds.
    fn profile_signals(&self, p: usize, (lo, hi): (usize, usize)) -> ProfileSignals {
        let pr = &self.out.profiles[p];
        let cap = pr.capacity[lo..hi].iter().sum::<f64>() / (hi - lo) as f64;
        let mut lat: Vec<f32> = self.lat[p][lo..hi].iter().flatten().copied().collect();
        let p95 = if lat.is_empty() {
            None
        } else {
            let k = ((lat.len() as f64 * 0.95).ceil() as usize).clamp(1, lat.len()) - 1;
            let (_, v, _) = lat.select_nth_unstable_by(k, f32::total_cmp);
            Some(f64::from(*v))
        };
        let sum = |v: &[u32]| v[lo..hi].iter().map(|&x| u64::from(x)).sum::<u64>();
        let (done, errs) = (sum(&self.done[p]), sum(&self.errors[p]));
        let hq = (hi - 1).min(pr.in_flight.len() - 1);
        let queue: u64 = self.profile_lanes[p]
            .iter()
            .map(|&i| u64::from(self.out.lanes[i].queued[hq]))
            .sum();
        ProfileSignals {
            available_units_per_second: Some(cap),
            in_flight: Some(f64::from(pr.in_flight[hq])),
            queue_depth: Some(queue as f64),
            p95_latency_seconds: p95,
            error_ratio: (done + errs > 0).then(|| errs as f64 / (done + errs) as f64),
            ..Default::default()
        }
    }

    /// The approvals given by `now`.
    fn approvals_at(&self, now: f64) -> Approvals {
        let mut approvals = Approvals::new();
        for a in self.sc.controller.approvals.iter().filter(|a| a.at <= now) {
            approvals.insert(
                a.profile.clone(),
                crate::api::Approval {
                    level: a.level,
                    given_at: Some(a.at.floor() as i64),
                },
            );
        }
        approvals
    }

    /// What the controller publishes (`gateway_config::build`, as it writes
    /// the ConfigMap), swapped into profile `p`'s gateway core; a config the
    /// core refuses leaves the last good one, with a warning.
    fn publish(
        &mut self,
        p: usize,
        d: &policy::ProfileDecision,
        b: &policy::Binding<'_>,
        at: i64,
        now: f64,
    ) {
        let cfg = policy::gateway_config::build(
            d,
            &b.lanes,
            b.policy,
            b.profile.metadata.generation.unwrap_or(0),
            self.published[p].as_ref(),
            at,
        );
        let unix_now = at as f64 + (now - now.round());
        let loaded = match self.cores[p].as_mut() {
            Some(core) => core.swap(cfg.clone(), 1.0, now, unix_now).map(|gone| {
                for (ticket, r) in gone {
                    if let (Some(a), Resolution::Refuse(r)) = (self.waiting[p].remove(&ticket), r) {
                        self.pending_refusals.push((a, r));
                    }
                }
            }),
            None => Core::new(cfg.clone(), 1.0, now, unix_now).map(|c| {
                self.cores[p] = Some(c);
            }),
        };
        if let Err(e) = loaded {
            let w = format!("the gateway refused the config of {}: {e}", cfg.profile);
            if !self.out.warnings.contains(&w) {
                self.out.warnings.push(w);
            }
            return;
        }
        if let Some(t) = self.trace.as_mut()
            && self.published[p]
                .as_ref()
                .is_none_or(|prev| prev.content_hash != cfg.content_hash)
        {
            t.configs.push((now, p, cfg.clone()));
        }
        self.published[p] = Some(cfg);
    }

    /// An attempt reaches the gateway.
    fn arrive(&mut self, a: Attempt, now: f64) {
        let li = usize::from(a.lane);
        let q = self.queue_of(li);
        match self.policy {
            Strategy::Fifo => {}
            Strategy::Lanekeeper => {
                self.admit(a, now);
                return;
            }
            Strategy::Static | Strategy::Fair => {
                if self.queues[q].len() >= self.lanes[li].max_depth {
                    let ra = self.retry_after(li);
                    self.fail(
                        a,
                        now,
                        Fail::Rejected {
                            retry_after: Some(ra),
                            final_for_compliant: false,
                        },
                    );
                    return;
                }
            }
        }
        self.queues[q].push_back(a);
        self.queued[li] += 1;
    }

    /// lanekeeper's gateway decides on an attempt at `now`: its admission
    /// core (the one `lanekeeper gateway` runs) sends it to the pool, queues
    /// it, refuses it or defers it. Before the first config it refuses, as
    /// the gateway does (503).
    fn admit(&mut self, a: Attempt, now: f64) {
        let li = usize::from(a.lane);
        let p = self.lanes[li].profile;
        self.poll_gateway(p, now);
        if let Some(t) = self.trace.as_mut() {
            t.arrivals.push(TracedArrival {
                at: now,
                lane: li,
                request_id: u64::from(a.id),
                attempt: a.n,
            });
        }
        if self.cores[p].is_none() {
            self.fail(
                a,
                now,
                Fail::Rejected {
                    retry_after: Some(1.0),
                    final_for_compliant: false,
                },
            );
            return;
        }
        self.decide(a, li, p, now);
    }

    /// Profile `p`'s core (it has a config) decides on attempt `a` at
    /// `now`, sized when its lane has tokens; a pass keeps its tenant slot
    /// and its charge; then the gateway acts on the verdict. (The verdict
    /// stays where the core wrote it: moving it out right after the call
    /// read it back before its stores had landed, a stall of 4 % of the
    /// run.)
    fn decide(&mut self, mut a: Attempt, li: usize, p: usize, now: f64) {
        let size = match self.shape(&a, li, p) {
            Shape::TooLong => {
                self.fail(a, now, Fail::TooLong);
                return;
            }
            Shape::Unsized => None,
            Shape::Sized(size) => Some(size),
        };
        // The request id as a client sends it, in decimal.
        let mut digits = [0u8; 20];
        let id = decimal(u64::from(a.id), &mut digits);
        let tenant = tenants::tenant_name(&self.lanes[li], self.sc.seed, &a);
        let Some(core) = self.cores[p].as_mut() else {
            return;
        };
        let req = lanes::Request {
            lane: &self.lanes[li].name,
            tenant,
            attempt: Some(u32::from(a.n)),
            request_id: Some(id),
        };
        let verdict = match size {
            Some(size) => core.admit_sized_hinted(&req, size, &mut a.id_hint, now),
            None => core.admit_hinted(&req, &mut a.id_hint, now),
        };
        if let Verdict::Pass(pass) = &verdict {
            if let Some(s) = &pass.tenant_slot {
                self.tenant_slots.insert((a.id, a.n), s.clone());
            }
            self.charged(&a, pass.charge.as_ref());
        }
        self.act(a, li, p, &verdict, now);
    }

    /// The gateway acts on profile `p`'s verdict on attempt `a`.
    fn act(&mut self, a: Attempt, li: usize, p: usize, verdict: &Verdict, now: f64) {
        if !self.cores[p].as_ref().is_some_and(Core::enforcing) {
            // Observe mode: nothing is enforced.
            if let (Verdict::Queued { ticket, .. }, Some(core)) = (verdict, self.cores[p].as_mut())
            {
                core.cancel(*ticket);
            }
            self.send_to_pool(a, now);
            return;
        }
        match verdict {
            Verdict::Pass(_) => self.send_to_pool(a, now),
            Verdict::Queued { ticket, .. } => {
                self.waiting[p].insert(*ticket, a);
                self.queued[li] += 1;
            }
            Verdict::Refuse(r) => self.refused(a, now, r),
            Verdict::UnknownLane => self.fail(
                a,
                now,
                Fail::Rejected {
                    retry_after: None,
                    final_for_compliant: true,
                },
            ),
        }
    }

    /// What the client of a refused attempt does: a deferred request comes
    /// back after `Retry-After`; a rejected one is retried (or not) as its
    /// client does; one refused for its retry budget or its deadline is not
    /// retried by a client that honours the gateway.
    fn refused(&mut self, a: Attempt, now: f64, r: &Refusal) {
        if r.limit == lanes::Limit::LongContext {
            self.count_long_context(usize::from(a.lane));
        }
        match r.outcome {
            Outcome::Deferred => {
                let wait = r.retry_after_seconds.unwrap_or(1).max(1) as f64;
                self.defer(a, now, wait);
            }
            Outcome::Expired => self.fail(a, now, Fail::Expired),
            o => self.fail(
                a,
                now,
                Fail::Rejected {
                    retry_after: r.retry_after_seconds.map(|s| s as f64),
                    final_for_compliant: matches!(
                        o,
                        Outcome::RejectedRetryBudget | Outcome::RejectedDeadline
                    ),
                },
            ),
        }
    }

    /// Hands out what profile `p`'s core resolved by `now` (its turn came,
    /// its wait ran out, or it was deferred to make room).
    fn poll_gateway(&mut self, p: usize, now: f64) {
        let Some(core) = self.cores[p].as_mut() else {
            return;
        };
        if core.next_wake(now).is_none_or(|w| w > now) {
            return;
        }
        for (ticket, r) in core.poll(now) {
            let Some(a) = self.waiting[p].remove(&ticket) else {
                continue;
            };
            self.queued[usize::from(a.lane)] -= 1;
            match r {
                Resolution::Pass(pass) => {
                    if let Some(s) = pass.tenant_slot {
                        self.tenant_slots.insert((a.id, a.n), s);
                    }
                    self.charged(&a, pass.charge.as_ref());
                    self.send_to_pool(a, now);
                }
                Resolution::Refuse(r) => self.refused(a, now, &r),
            }
        }
    }

    /// lanekeeper's gateway sends an attempt to the pool, which queues what
    /// it cannot start yet.
    fn send_to_pool(&mut self, mut a: Attempt, now: f64) {
        let li = usize::from(a.lane);
        let p = self.lanes[li].profile;
        a.passed = now;
        self.count_sent(&a);
        if let Some(core) = self.cores[p].as_mut() {
            core.started(now);
        }
        self.pool_waiting[li] += 1;
        self.pool_queue[p].push_back(a);
    }

    /// A `Defer` lane told a request to come back after `retry_after`
    /// seconds: it does if its client honours it, else on the client's own
    /// backoff. Either way the request is kept, not failed: the client gives
    /// up only when it would come back after the deadline.
    fn defer(&mut self, a: Attempt, now: f64, retry_after: f64) {
        self.forget_tokens(&a);
        let li = usize::from(a.lane);
        let l = &self.lanes[li];
        let c = &l.clients;
        let k = a.deferrals.saturating_add(1);
        let wait = if a.compliant {
            retry_after
        } else {
            let exp = c.backoff_multiplier.powi(i32::from(k) - 1);
            let backoff = (c.backoff_seconds * exp).min(c.max_backoff_seconds);
            let u: f64 = self.rng_client[li].random();
            backoff * (1.0 - c.jitter * u)
        };
        let past_deadline = c.give_up_after_deadline && now + wait > a.origin + l.deadline;
        let ln = &mut self.out.lanes[li];
        ln.deferrals += 1;
        if a.deferrals == 0 {
            ln.deferred_requests += 1;
        }
        if past_deadline {
            ln.deferred_past_deadline += 1;
            self.count_tenant(&a, TenantOutcome::Lost);
            return;
        }
        let s = self.next_seq();
        self.deferred_waiting[li] += 1;
        self.retry_heap.push(Timed {
            at: now + wait,
            seq: s,
            item: Attempt {
                returning: true,
                deferrals: k,
                ..a
            },
        });
    }

    /// Retry-After a baseline gateway gives a rejected attempt of lane `i`:
    /// the time its queue needs to drain at the lane's current rate, within
    /// 1..60 s. (lanekeeper's gateway says what `lanes.json` says.)
    fn retry_after(&self, i: usize) -> f64 {
        let l = &self.lanes[i];
        let rate = match self.policy {
            Strategy::Static => self.gates[i].rate,
            _ => {
                let p = l.profile;
                self.capacity[p].at(0.0) / self.profile_lanes[p].len().max(1) as f64
            }
        };
        if rate <= 1e-9 {
            return 60.0;
        }
        (self.queued[i] as f64 * l.units / rate)
            .clamp(1.0, 60.0)
            .ceil()
    }

    /// An attempt failed (rejected, expired or failed in the pool) at `now`:
    /// the client retries or the request ends.
    fn fail(&mut self, a: Attempt, now: f64, why: Fail) {
        self.forget_tokens(&a);
        let li = usize::from(a.lane);
        let l = &self.lanes[li];
        let c = &l.clients;
        let mut retry = u32::from(a.n) <= c.max_retries;
        let mut wait_at_least = 0.0;
        match why {
            Fail::Rejected {
                retry_after,
                final_for_compliant,
            } => {
                self.out.lanes[li].rejected_attempts += 1;
                if a.compliant {
                    if final_for_compliant {
                        retry = false;
                    }
                    wait_at_least = retry_after.unwrap_or(0.0);
                }
            }
            Fail::Expired => self.out.lanes[li].expired_attempts += 1,
            Fail::Failed => {}
            Fail::TooLong => {
                self.out.lanes[li].rejected_attempts += 1;
                if let Some(t) = self.out.lanes[li].tokens.as_mut() {
                    t.context_too_long += 1;
                }
                retry = false;
            }
        }
        if c.give_up_after_deadline && now >= a.origin + l.deadline {
            retry = false;
        }
        if !retry {
            self.count_tenant(&a, TenantOutcome::Lost);
            let ln = &mut self.out.lanes[li];
            match why {
                Fail::Rejected { .. } | Fail::TooLong => ln.rejected += 1,
                Fail::Expired => ln.expired += 1,
                Fail::Failed => ln.failed += 1,
            }
            return;
        }
        let exp = c.backoff_multiplier.powi(i32::from(a.n) - 1);
        let backoff = (c.backoff_seconds * exp).min(c.max_backoff_seconds);
        let u: f64 = self.rng_client[li].random();
        let wait = (backoff * (1.0 - c.jitter * u)).max(wait_at_least);
        let s = self.next_seq();
        self.retrying[li] += 1;
        self.retry_heap.push(Timed {
            at: now + wait,
            seq: s,
            item: Attempt {
                n: a.n + 1,
                returning: false,
                ..a
            },
        });
    }

    fn complete(&mut self, a: Attempt, failed: bool, at: f64) {
        if let Some(t) = self.trace.as_mut() {
            t.served.insert((u64::from(a.id), a.n), at - a.passed);
        }
        let li = usize::from(a.lane);
        let p = self.lanes[li].profile;
        let units = self.units_of(&a);
        self.in_flight[p] -= 1;
        self.pool_count[li] -= 1;
        // A slot of the in-flight limit freed for a waiting request, a
        // tenant below its maximum again, or a credit or a long-context
        // place back: the gateway's driver is woken and hands it out at
        // once.
        let settled = self.settle(&a, p, !failed, at);
        if let Some(core) = self.cores[p].as_mut() {
            if !failed {
                core.served(&self.lanes[li].name, at, at - a.passed);
            }
            let mut freed = core.finished(at, at - a.passed) | settled;
            if let Some(s) = self.tenant_slots.remove(&(a.id, a.n)) {
                freed |= core.release_tenant(&s);
            }
            if freed {
                self.poll_gateway(p, at);
            }
        }
        let s = self.sec(at);
        if failed {
            self.errors[p][s] += 1;
            self.fail(a, at, Fail::Failed);
            return;
        }
        let latency = at - a.origin;
        self.done[p][s] += 1;
        if self.saturation[p].completed(units) {
            self.saturated_units[p][s] += units as f32;
        }
        if self.policy == Strategy::Lanekeeper {
            // Only lanekeeper's controller reads the profile's latencies.
            self.lat[p][s].push(latency as f32);
        }
        let in_time = latency <= self.lanes[li].deadline + 1e-9;
        self.count_tenant(&a, TenantOutcome::Answered { in_time });
        let ln = &mut self.out.lanes[li];
        ln.latencies.push(latency as f32);
        if in_time {
            ln.within_deadline += 1;
        } else {
            ln.late += 1;
        }
    }

    /// Drops queued attempts whose TTL ran out by `now`. Lane queues are in
    /// arrival order, so only heads need looking at; the shared FIFO queue
    /// holds lanes with different TTLs and drops a stale entry when it
    /// reaches the head.
    fn expire(&mut self, now: f64) {
        for q in 0..self.queues.len() {
            while let Some(h) = self.queues[q].front().copied() {
                let ttl = self.lanes[usize::from(h.lane)].ttl;
                if h.enq + ttl > now {
                    break;
                }
                self.queues[q].pop_front();
                self.queued[usize::from(h.lane)] -= 1;
                let at = (h.enq + ttl).max(now - self.sc.tick_seconds);
                self.fail(h, at, Fail::Expired);
            }
        }
    }

    /// A baseline gateway dispatches a queued attempt to the pool.
    fn start(&mut self, a: Attempt, now: f64, tick: usize) {
        let li = usize::from(a.lane);
        self.queued[li] -= 1;
        self.count_sent(&a);
        self.serve(a, now, tick);
    }

    /// An attempt leaves its gateway for the pool: in flight
    /// from now, and admitted.
    fn count_sent(&mut self, a: &Attempt) {
        let li = usize::from(a.lane);
        let p = self.lanes[li].profile;
        let units = self.units_of(a);
        self.in_flight[p] += 1;
        self.pool_count[li] += 1;
        let ln = &mut self.out.lanes[li];
        ln.admitted += 1;
        ln.admitted_units += units;
    }

    /// The pool starts serving an attempt within its capacity.
    fn serve(&mut self, a: Attempt, now: f64, tick: usize) {
        let li = usize::from(a.lane);
        let (units, factor) = (self.units_of(&a), self.service_factor(&a));
        let l = &self.lanes[li];
        let z: f64 = self.rng_service[li].sample(StandardNormal);
        let service = (l.mu + l.sigma * z).exp() * factor;
        let failed = l.failure > 0.0 && self.rng_service[li].random::<f64>() < l.failure;
        let p = l.profile;
        self.budget[p] -= units;
        let s = self.sec(now - 1e-9);
        let ln = &mut self.out.lanes[li];
        ln.served_units[s] += units;
        self.out.profiles[p].tick_units[tick] += units;
        let seq = self.next_seq();
        self.pool_heap.push(Timed {
            at: now + service,
            seq,
            item: (a, failed),
        });
    }

    fn dispatch(&mut self, tick: usize, t: f64, now: f64) {
        let dt = now - t;
        for p in 0..self.out.profiles.len() {
            let cap = self.capacity[p].at(t);
            self.out.profiles[p].tick_capacity[tick] = cap;
            let max_units = self.out.profiles[p].max_units;
            // Unused capacity is lost; a remainder smaller than one request
            // carries over so that big requests are not starved.
            let most = cap * dt + max_units;
            self.budget[p] = (self.budget[p] + cap * dt).min(most);
            let lanes = self.profile_lanes[p].clone();
            match self.policy {
                Strategy::Fifo => self.dispatch_fifo(p, tick, now),
                Strategy::Lanekeeper => {
                    self.dispatch_lanekeeper(p, tick, now, most);
                    self.observe_saturation(p, t, now);
                }
                Strategy::Static => self.dispatch_static(p, &lanes, tick, dt, now),
                Strategy::Fair => self.dispatch_fair(p, &lanes, tick, now),
            }
        }
    }

    fn dispatch_fifo(&mut self, p: usize, tick: usize, now: f64) {
        while let Some(h) = self.queues[p].front().copied() {
            let l = &self.lanes[usize::from(h.lane)];
            if h.enq + l.ttl <= now {
                self.queues[p].pop_front();
                self.queued[usize::from(h.lane)] -= 1;
                self.fail(h, now, Fail::Expired);
                continue;
            }
            if self.budget[p] + 1e-9 < l.units {
                break;
            }
            self.queues[p].pop_front();
            self.start(h, now, tick);
        }
    }

    /// lanekeeper: the gateway hands out what its core resolved; the pool
    /// starts what it was sent in arrival order, within its capacity. A
    /// request still in the pool's queue at its deadline was timed out by
    /// the gateway (its upstream timeout is the remaining deadline). A
    /// request costing more than the budget can hold (`most`, a priced
    /// request of many tokens) starts once the budget is full, and leaves
    /// it in debt.
    fn dispatch_lanekeeper(&mut self, p: usize, tick: usize, now: f64, most: f64) {
        self.poll_gateway(p, now);
        while let Some(h) = self.pool_queue[p].front().copied() {
            let li = usize::from(h.lane);
            let units = self.units_of(&h);
            if h.origin + self.lanes[li].deadline <= now {
                self.pool_queue[p].pop_front();
                self.pool_waiting[li] -= 1;
                self.in_flight[p] -= 1;
                self.pool_count[li] -= 1;
                // Timed out: settled without usage (the reservation stands).
                self.settle(&h, p, false, now);
                if let Some(core) = self.cores[p].as_mut() {
                    core.finished(now, now - h.passed);
                    if let Some(s) = self.tenant_slots.remove(&(h.id, h.n)) {
                        core.release_tenant(&s);
                    }
                }
                self.fail(h, now, Fail::Failed);
                continue;
            }
            if self.budget[p] + 1e-9 < units.min(most) {
                break;
            }
            self.pool_queue[p].pop_front();
            self.pool_waiting[li] -= 1;
            self.serve(h, now, tick);
        }
    }

    fn dispatch_static(&mut self, p: usize, lanes: &[usize], tick: usize, dt: f64, now: f64) {
        for &i in lanes {
            let units = self.lanes[i].units;
            let g = &mut self.gates[i];
            g.tokens = (g.tokens + g.rate * dt).min(burst(g.rate, units, BASELINE_BURST_SECONDS));
        }
        // Oldest head first among lanes with tokens; no priorities.
        loop {
            let mut best: Option<(f64, usize)> = None;
            for &i in lanes {
                let units = self.lanes[i].units;
                if let Some(h) = self.queues[i].front()
                    && self.gates[i].tokens + 1e-9 >= units
                    && self.budget[p] + 1e-9 >= units
                    && best.is_none_or(|(e, _)| h.enq < e)
                {
                    best = Some((h.enq, i));
                }
            }
            let Some((_, i)) = best else { break };
            let Some(a) = self.queues[i].pop_front() else {
                break;
            };
            self.gates[i].tokens -= self.lanes[i].units;
            self.start(a, now, tick);
        }
    }

    fn dispatch_fair(&mut self, p: usize, lanes: &[usize], tick: usize, now: f64) {
        // Deficit round robin in work units, quantum ∝ weight.
        let quantum = self.out.profiles[p].max_units;
        loop {
            let mut progressed = false;
            for &i in lanes {
                let units = self.lanes[i].units;
                if self.queues[i].is_empty() {
                    self.gates[i].deficit = 0.0;
                    continue;
                }
                if self.budget[p] + 1e-9 < units {
                    continue;
                }
                self.gates[i].deficit += quantum * self.lanes[i].weight;
                while !self.queues[i].is_empty()
                    && self.gates[i].deficit + 1e-9 >= units
                    && self.budget[p] + 1e-9 >= units
                {
                    let Some(a) = self.queues[i].pop_front() else {
                        break;
                    };
                    self.gates[i].deficit -= units;
                    self.start(a, now, tick);
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
    }
}

/// The `static` baseline's bucket size, in seconds of its rate (as
/// `lanes.json` sizes lanekeeper's buckets).
const BASELINE_BURST_SECONDS: f64 = 1.0;

fn burst(rate: f64, units: f64, seconds: f64) -> f64 {
    if rate <= 0.0 {
        0.0
    } else {
        (rate * seconds).max(units)
    }
}

#[cfg(test)]
mod tests {
    use super::{Attempt, decimal};

    #[test]
    fn an_attempt_takes_40_bytes() {
        // Hundreds of thousands wait to come back after a deferral.
        assert_eq!(std::mem::size_of::<Attempt>(), 40);
    }

    #[test]
    fn request_ids_are_written_as_format_writes_them() {
        let mut buf = [0u8; 20];
        for n in [0, 7, 10, 99, 1_000_001, u64::MAX - 1, u64::MAX] {
            assert_eq!(decimal(n, &mut buf), n.to_string());
        }
    }
}
