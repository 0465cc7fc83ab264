//! The simulation: Poisson arrivals, a gateway per profile (lanekeeper's, or
//! a baseline), a pool that completes work units within its capacity, clients
//! that retry, and — for `lanekeeper` — a controller that evaluates the very
//! same engine as `plan` on telemetry the simulation measured, with lag.
//!
//! Time advances in fixed ticks. Arrivals, completions, expiries and retries
//! carry exact times; the gateway dispatches to the pool at the end of each
//! tick, within the pool's per-tick budget of work units.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Exp1, StandardNormal};

use crate::api::SheddingMode;
use crate::gateway;
use crate::policy::{self, Approvals, EngineState, Evaluation, LaneState, World, key};
use crate::snapshot::{LaneSignals, ProfileSignals, Snapshot};

use super::scenario::{ClientSpec, Scenario, Steps};

/// Which gateway runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// lanekeeper: per-lane token buckets at the admitted rate of the latest
    /// decision, priority dispatch, retry budgets, in-flight reflexes.
    Lanekeeper,
    /// One shared FIFO queue per pool, no priorities, no shedding.
    Fifo,
    /// Fixed per-lane rate limits at the contract floors, no ladder.
    Static,
    /// Equal weighted shares of the pool (deficit round robin across lane
    /// queues, work-conserving), no ladder.
    Fair,
}

impl Policy {
    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Lanekeeper => "lanekeeper",
            Policy::Fifo => "fifo",
            Policy::Static => "static",
            Policy::Fair => "fair",
        }
    }
}

/// Everything a run measured; [`super::report`] turns it into outcomes.
#[derive(Clone, Debug)]
pub struct Run {
    /// The policy that ran.
    pub policy: Policy,
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
    /// Queued attempts at the start of each second (and at the end, last).
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
}

#[derive(Clone, Copy, Debug)]
struct Attempt {
    origin: f64,
    enq: f64,
    lane: u16,
    /// Attempt number (1 = the original); a return after a deferral keeps it.
    n: u16,
    compliant: bool,
    /// Coming back after a deferral (not a retry).
    returning: bool,
    /// Deferrals so far.
    deferrals: u16,
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

/// Static per-lane setup.
struct LaneSetup {
    key: String,
    profile: usize,
    priority: i32,
    weight: f64,
    units: f64,
    ttl: f64,
    max_depth: usize,
    deadline: f64,
    never: bool,
    /// `shedding.mode: Defer`: rejections are deferrals.
    defer: bool,
    /// The policy's `hysteresis.stableForSeconds` (the longest deferral).
    stable_for: i64,
    max_attempts: u16,
    budget: f64,
    floor: Option<f64>,
    arrivals: Steps,
    mu: f64,
    sigma: f64,
    failure: f64,
    clients: ClientSpec,
    backlog: u64,
    expected_rps: f64,
}

/// The gateway's view of one lane.
#[derive(Clone, Debug)]
struct Gate {
    rate: f64,
    tokens: f64,
    state: LaneState,
    budget_tokens: f64,
    deficit: f64,
    /// Retry-After of a deferral (Defer lanes): the expected time to resume.
    resume_after: f64,
}

#[derive(Clone, Copy)]
enum Fail {
    Rejected {
        retry_after: Option<f64>,
        final_for_compliant: bool,
    },
    Expired,
    Failed,
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
pub fn run(world: &World, scenario: &Scenario, policy: Policy) -> Result<Run, SimError> {
    Ok(Sim::new(world, scenario, policy)?.run())
}

struct Sim<'a> {
    world: &'a World,
    sc: &'a Scenario,
    policy: Policy,
    lanes: Vec<LaneSetup>,
    out: Run,
    // per profile
    capacity: Vec<Steps>,
    budget: Vec<f64>,
    in_flight: Vec<u32>,
    gated: Vec<bool>,
    watermarks: Vec<Option<(f64, f64)>>,
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
    errors: Vec<Vec<u32>>,
    pool_heap: BinaryHeap<Timed<(Attempt, bool)>>,
    retry_heap: BinaryHeap<Timed<Attempt>>,
    seq: u64,
    state: EngineState,
}

fn stream(seed: u64, s: u64) -> ChaCha8Rng {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    r.set_stream(s);
    r
}

impl<'a> Sim<'a> {
    fn new(world: &'a World, sc: &'a Scenario, policy: Policy) -> Result<Self, SimError> {
        let bound = policy::bind(world);
        let mut warnings: Vec<String> = bound.warnings.iter().map(ToString::to_string).collect();
        let pkeys: Vec<String> = bound
            .bindings
            .iter()
            .map(|b| {
                key(
                    b.profile.metadata.namespace.as_deref().unwrap_or_default(),
                    b.profile.metadata.name.as_deref().unwrap_or_default(),
                )
            })
            .collect();
        let mut lane_keys = Vec::new();
        for b in &bound.bindings {
            for l in &b.lanes {
                lane_keys.push(key(
                    l.metadata.namespace.as_deref().unwrap_or_default(),
                    l.metadata.name.as_deref().unwrap_or_default(),
                ));
            }
        }
        let mut cap_by_key = BTreeMap::new();
        for (k, p) in &sc.profiles {
            let full = resolve(KeyKind::Profile, k, &pkeys)?;
            if !p.capacity.is_empty() {
                cap_by_key.insert(
                    full.clone(),
                    Steps::new(
                        p.capacity
                            .iter()
                            .map(|c| (c.at, c.units_per_second))
                            .collect(),
                    ),
                );
            }
        }
        let mut lane_sc = BTreeMap::new();
        for (k, l) in &sc.lanes {
            let full = resolve(KeyKind::Lane, k, &lane_keys)?;
            if lane_sc.insert(full.clone(), l).is_some() {
                return Err(SimError::LaneTwice { lane: full.clone() });
            }
        }
        let dur = sc.duration_seconds;
        let nsec = dur.ceil() as usize + 1;
        let ticks = (dur / sc.tick_seconds).ceil() as usize;
        let mut lanes = Vec::new();
        let mut profiles = Vec::new();
        let mut capacity = Vec::new();
        let mut watermarks = Vec::new();
        let mut profile_lanes = Vec::new();
        for (pi, b) in bound.bindings.iter().enumerate() {
            let pk = &pkeys[pi];
            let safe = b.profile.spec.capacity.safe_units_per_second.value();
            capacity.push(
                cap_by_key
                    .remove(pk)
                    .unwrap_or_else(|| Steps::constant(safe)),
            );
            watermarks.push(
                b.profile
                    .spec
                    .in_flight
                    .as_ref()
                    .map(|f| (f.stop_at as f64, f.resume_below as f64)),
            );
            let mut ls: Vec<_> = b.lanes.clone();
            ls.sort_by(|a, c| {
                (a.spec.priority, a.metadata.name.as_deref())
                    .cmp(&(c.spec.priority, c.metadata.name.as_deref()))
            });
            let mut idxs = Vec::new();
            let mut max_units: f64 = 0.0;
            for l in ls {
                let lk = key(
                    l.metadata.namespace.as_deref().unwrap_or_default(),
                    l.metadata.name.as_deref().unwrap_or_default(),
                );
                let s = l.spec.clone();
                let (arrivals, service, failure, clients, backlog) = match lane_sc.get(&lk) {
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
                        warnings.push(format!("lane {lk} has no traffic in the scenario"));
                        (
                            Steps::constant(0.0),
                            super::scenario::ServiceSpec {
                                p50_seconds: 1.0,
                                p95_seconds: 1.0,
                            },
                            0.0,
                            sc.clients.clone(),
                            0,
                        )
                    }
                };
                let mu = service.p50_seconds.ln();
                let sigma = (service.p95_seconds.ln() - mu) / 1.644_853_626_951_472_2;
                let units = s.work_units_per_request.value();
                max_units = max_units.max(units);
                idxs.push(lanes.len());
                lanes.push(LaneSetup {
                    key: lk,
                    profile: pi,
                    priority: s.priority,
                    weight: f64::from(s.weight.max(1)),
                    units,
                    ttl: s.queue.ttl_seconds as f64,
                    max_depth: s.queue.max_depth.max(0) as usize,
                    deadline: s.deadline_seconds as f64,
                    never: s.shedding.mode == SheddingMode::Never,
                    defer: s.shedding.mode == SheddingMode::Defer,
                    stable_for: gateway::stable_for_seconds(b.policy),
                    max_attempts: s.retry.max_attempts.clamp(1, i32::from(u16::MAX)) as u16,
                    budget: f64::from(s.retry.budget_percent.clamp(0, 100)) / 100.0,
                    floor: s.floor_units_per_second.as_ref().map(|f| f.value()),
                    arrivals,
                    mu,
                    sigma,
                    failure,
                    clients,
                    backlog,
                    expected_rps: s.expected_requests_per_second.value(),
                });
            }
            profile_lanes.push(idxs);
            let level_names = std::iter::once("normal".to_owned())
                .chain(
                    b.policy
                        .iter()
                        .flat_map(|p| p.spec.levels.iter().map(|l| l.name.clone())),
                )
                .collect();
            profiles.push(ProfileRun {
                namespace: b.profile.metadata.namespace.clone().unwrap_or_default(),
                name: b.profile.metadata.name.clone().unwrap_or_default(),
                level_names,
                capacity: vec![0.0; nsec],
                in_flight: vec![0; nsec],
                level: vec![0; nsec],
                tick_units: vec![0.0; ticks],
                tick_capacity: vec![0.0; ticks],
                max_units,
            });
        }
        if lanes.len() > usize::from(u16::MAX) {
            return Err(SimError::TooManyLanes { lanes: lanes.len() });
        }
        let np = profiles.len();
        let nl = lanes.len();
        let lane_runs = lanes
            .iter()
            .map(|l| {
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
                    ..Default::default()
                }
            })
            .collect();
        let nq = if policy == Policy::Fifo { np } else { nl };
        let gates = lanes
            .iter()
            .map(|l| Gate {
                rate: 0.0,
                tokens: 0.0,
                state: LaneState::Admitted,
                budget_tokens: budget_cap(l),
                deficit: 0.0,
                resume_after: l.stable_for.max(1) as f64,
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
                warnings,
            },
            capacity,
            budget: vec![0.0; np],
            in_flight: vec![0; np],
            gated: vec![false; np],
            watermarks,
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
            errors: vec![vec![0; nsec]; np],
            pool_heap: BinaryHeap::new(),
            retry_heap: BinaryHeap::new(),
            seq: 0,
            state: EngineState::default(),
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
        if self.policy == Policy::Fifo {
            self.lanes[lane].profile
        } else {
            lane
        }
    }

    fn run(mut self) -> Run {
        let dt = self.sc.tick_seconds;
        let dur = self.sc.duration_seconds;
        let ticks = (dur / dt).ceil() as usize;
        let nl = self.lanes.len();
        // Initial backlogs and first arrivals.
        for i in 0..nl {
            for _ in 0..self.lanes[i].backlog {
                let compliant = self.draw_compliance(i);
                let a = Attempt {
                    origin: 0.0,
                    enq: 0.0,
                    lane: i as u16,
                    n: 1,
                    compliant,
                    returning: false,
                    deferrals: 0,
                };
                self.out.lanes[i].offered += 1;
                self.out.lanes[i].attempts += 1;
                let q = self.queue_of(i);
                self.queues[q].push_back(a);
                self.queued[i] += 1;
            }
            self.next_arrival[i] = self.draw_arrival(i, 0.0);
        }
        self.configure_baselines();
        let eval_every = self.sc.controller.evaluation_interval_seconds;
        let mut next_eval = 0.0;
        let mut next_second = 0usize;
        let mut batch: Vec<(f64, u64, Attempt, bool)> = Vec::new();
        for tick in 0..ticks {
            let t = tick as f64 * dt;
            let t_end = ((tick + 1) as f64 * dt).min(dur);
            if self.policy == Policy::Lanekeeper {
                while next_eval <= t + 1e-9 {
                    self.evaluate(next_eval);
                    next_eval += eval_every;
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
                    batch.push((
                        at,
                        s,
                        Attempt {
                            origin: at,
                            enq: at,
                            lane: i as u16,
                            n: 1,
                            compliant,
                            returning: false,
                            deferrals: 0,
                        },
                        true,
                    ));
                    self.next_arrival[i] = self.draw_arrival(i, at);
                }
            }
            while self.retry_heap.peek().is_some_and(|r| r.at < t_end) {
                let Some(r) = self.retry_heap.pop() else {
                    break;
                };
                let li = usize::from(r.item.lane);
                if r.item.returning {
                    self.deferred_waiting[li] -= 1;
                } else {
                    self.retrying[li] -= 1;
                }
                batch.push((r.at, r.seq, r.item, false));
            }
            batch.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            for &(at, _, a, fresh) in &batch {
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
            ln.queued_end = self.queued[i];
            ln.in_flight_end = self.pool_count[i];
            ln.retrying_end = self.retrying[i];
            ln.deferred_end = self.deferred_waiting[i];
            if let Some(last) = ln.queued.last_mut() {
                *last = self.queued[i] as u32;
            }
            if let Some(last) = ln.deferred.last_mut() {
                *last = self.deferred_waiting[i] as u32;
            }
        }
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
            ln.queued[s] = self.queued[i] as u32;
            ln.deferred[s] = self.deferred_waiting[i] as u32;
            ln.limit[s] = match self.policy {
                Policy::Lanekeeper | Policy::Static => self.gates[i].rate,
                _ => f64::NAN,
            };
        }
    }

    fn configure_baselines(&mut self) {
        if self.policy != Policy::Static {
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
                self.gates[i].tokens = burst(r, self.lanes[i].units, self.sc.gateway.burst_seconds);
            }
        }
    }

    /// One controller evaluation at `now`, on telemetry measured up to
    /// `now − lag`.
    fn evaluate(&mut self, now: f64) {
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
        let (lo_s, hi_s) = (
            lo as usize,
            (hi as usize).min(self.out.profiles.first().map_or(0, |p| p.capacity.len())),
        );
        for (p, pr) in self.out.profiles.iter().enumerate() {
            let pk = key(&pr.namespace, &pr.name);
            for &i in &self.profile_lanes[p] {
                // Originals (first attempts) are demand; retries are counted
                // apart; returns after a deferral are neither.
                let (rps, retry_rps) = if measured {
                    let rate = |v: &[u32]| {
                        v[lo_s..hi_s].iter().map(|&x| u64::from(x)).sum::<u64>() as f64
                            / (hi_s - lo_s) as f64
                    };
                    let ln = &self.out.lanes[i];
                    (rate(&ln.originals), rate(&ln.retry_arrivals))
                } else {
                    (self.lanes[i].arrivals.at(0.0), 0.0)
                };
                snap.lanes.insert(
                    self.lanes[i].key.clone(),
                    LaneSignals {
                        requests_per_second: Some(rps),
                        retry_requests_per_second: Some(retry_rps),
                        ..Default::default()
                    },
                );
            }
            if outage {
                continue;
            }
            let sig = if measured {
                let cap = pr.capacity[lo_s..hi_s].iter().sum::<f64>() / (hi_s - lo_s) as f64;
                let mut lat: Vec<f32> = self.lat[p][lo_s..hi_s].iter().flatten().copied().collect();
                let p95 = if lat.is_empty() {
                    None
                } else {
                    let k = ((lat.len() as f64 * 0.95).ceil() as usize).clamp(1, lat.len()) - 1;
                    let (_, v, _) = lat.select_nth_unstable_by(k, f32::total_cmp);
                    Some(f64::from(*v))
                };
                let done: u64 = self.done[p][lo_s..hi_s].iter().map(|&x| u64::from(x)).sum();
                let errs: u64 = self.errors[p][lo_s..hi_s]
                    .iter()
                    .map(|&x| u64::from(x))
                    .sum();
                let hq = (hi_s - 1).min(pr.in_flight.len() - 1);
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
            } else {
                ProfileSignals {
                    available_units_per_second: Some(self.capacity[p].at(0.0)),
                    ..Default::default()
                }
            };
            snap.profiles.insert(pk, sig);
        }
        let mut approvals = Approvals::new();
        for a in &c.approvals {
            if a.at <= now {
                approvals.insert(
                    a.profile.clone(),
                    crate::api::Approval {
                        level: a.level,
                        given_at: Some(a.at.floor() as i64),
                    },
                );
            }
        }
        let (eval, next) = policy::evaluate(self.world, &snap, &approvals, &self.state);
        self.state = next;
        for (p, d) in eval.profiles.iter().enumerate() {
            self.level[p] = d.level;
            self.watermarks[p] = d
                .gateway
                .in_flight
                .as_ref()
                .map(|w| (w.stop_at as f64, w.resume_below as f64));
            for ld in &d.lanes {
                let k = key(&ld.namespace, &ld.name);
                if let Some(&i) = self.profile_lanes[p]
                    .iter()
                    .find(|&&i| self.lanes[i].key == k)
                {
                    let g = &mut self.gates[i];
                    let headroom = if ld.state == LaneState::Admitted {
                        1.0 + self.sc.gateway.admitted_headroom_percent / 100.0
                    } else {
                        1.0
                    };
                    g.rate = ld.admitted_units_per_second * headroom;
                    g.state = ld.state;
                    // What lanes.json tells the gateway (gateway::build).
                    g.resume_after = gateway::resume_after_seconds(
                        ld.state,
                        ld.admitted_requests_per_second,
                        self.lanes[i].max_depth as i64,
                        self.lanes[i].stable_for,
                    ) as f64;
                    // A paused (zero-rate) lane keeps no tokens.
                    g.tokens = g.tokens.min(burst(
                        g.rate,
                        self.lanes[i].units,
                        self.sc.gateway.burst_seconds,
                    ));
                }
            }
        }
        self.out.evaluations.push(eval);
    }

    /// An attempt reaches the gateway.
    fn arrive(&mut self, a: Attempt, now: f64) {
        let li = usize::from(a.lane);
        let q = self.queue_of(li);
        match self.policy {
            Policy::Fifo => {}
            Policy::Lanekeeper => {
                let (budget, cap, max_attempts, max_depth, defer) = {
                    let l = &self.lanes[li];
                    (
                        l.budget,
                        budget_cap(l),
                        l.max_attempts,
                        l.max_depth,
                        l.defer,
                    )
                };
                let g = &mut self.gates[li];
                if a.returning {
                    // Back after a deferral: neither an original nor a retry,
                    // so neither maxAttempts nor the retry budget applies.
                } else if a.n == 1 {
                    g.budget_tokens = (g.budget_tokens + budget).min(cap);
                } else if a.n > max_attempts || g.budget_tokens < 1.0 {
                    // Over the contract's maxAttempts or its retry budget:
                    // rejected without a Retry-After (do not retry).
                    self.fail(
                        a,
                        now,
                        Fail::Rejected {
                            retry_after: None,
                            final_for_compliant: true,
                        },
                    );
                    return;
                } else {
                    g.budget_tokens -= 1.0;
                }
                if defer {
                    self.enqueue_deferring(a, now);
                    return;
                }
                if self.queues[q].len() >= max_depth {
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
            Policy::Static | Policy::Fair => {
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

    /// Queues an attempt of a `Defer` lane (lanekeeper's gateway). The queue
    /// is ordered by first arrival, so a request back from a deferral keeps
    /// its place; when it is full, the request that arrived last (this one,
    /// or the latest queued) is deferred.
    fn enqueue_deferring(&mut self, a: Attempt, now: f64) {
        let li = usize::from(a.lane);
        let q = self.queue_of(li);
        let max_depth = self.lanes[li].max_depth;
        let queue = &mut self.queues[q];
        let mut bumped = None;
        if queue.len() >= max_depth {
            match queue.back() {
                Some(last) if last.origin > a.origin => {
                    bumped = queue.pop_back();
                }
                _ => {
                    self.defer(a, now);
                    return;
                }
            }
        }
        let at = queue.partition_point(|x| x.origin <= a.origin);
        queue.insert(at, a);
        if let Some(b) = bumped {
            self.defer(b, now);
        } else {
            self.queued[li] += 1;
        }
    }

    /// A `Defer` lane tells a request to come back: after Retry-After (the
    /// expected time to resume) if its client honours it, else on the
    /// client's own backoff. Either way the request is kept, not failed: the
    /// client gives up only when it would come back after the deadline.
    fn defer(&mut self, a: Attempt, now: f64) {
        let li = usize::from(a.lane);
        let l = &self.lanes[li];
        let c = &l.clients;
        let k = a.deferrals.saturating_add(1);
        let wait = if a.compliant {
            self.gates[li].resume_after
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

    /// Retry-After for a rejected attempt of lane `i`: the time its queue
    /// needs to drain at the lane's current rate, within 1..60 s.
    fn retry_after(&self, i: usize) -> f64 {
        let l = &self.lanes[i];
        let rate = match self.policy {
            Policy::Lanekeeper | Policy::Static => self.gates[i].rate,
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
        }
        if c.give_up_after_deadline && now >= a.origin + l.deadline {
            retry = false;
        }
        if !retry {
            let ln = &mut self.out.lanes[li];
            match why {
                Fail::Rejected { .. } => ln.rejected += 1,
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
        let li = usize::from(a.lane);
        let p = self.lanes[li].profile;
        self.in_flight[p] -= 1;
        self.pool_count[li] -= 1;
        let s = self.sec(at);
        if failed {
            self.errors[p][s] += 1;
            self.fail(a, at, Fail::Failed);
            return;
        }
        let latency = at - a.origin;
        self.done[p][s] += 1;
        self.lat[p][s].push(latency as f32);
        let ln = &mut self.out.lanes[li];
        ln.latencies.push(latency as f32);
        if latency <= self.lanes[li].deadline + 1e-9 {
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
                if self.policy == Policy::Lanekeeper && self.lanes[usize::from(h.lane)].defer {
                    // A Defer lane's wait ran out: deferred, not expired.
                    self.defer(h, at);
                } else {
                    self.fail(h, at, Fail::Expired);
                }
            }
        }
    }

    fn start(&mut self, a: Attempt, now: f64, tick: usize) {
        let li = usize::from(a.lane);
        let l = &self.lanes[li];
        let z: f64 = self.rng_service[li].sample(StandardNormal);
        let service = (l.mu + l.sigma * z).exp();
        let failed = l.failure > 0.0 && self.rng_service[li].random::<f64>() < l.failure;
        let p = l.profile;
        let units = l.units;
        self.budget[p] -= units;
        self.in_flight[p] += 1;
        self.pool_count[li] += 1;
        self.queued[li] -= 1;
        let s = self.sec(now - 1e-9);
        let ln = &mut self.out.lanes[li];
        ln.admitted += 1;
        ln.admitted_units += units;
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
            self.budget[p] = (self.budget[p] + cap * dt).min(cap * dt + max_units);
            let lanes = self.profile_lanes[p].clone();
            match self.policy {
                Policy::Fifo => self.dispatch_fifo(p, tick, now),
                Policy::Lanekeeper => self.dispatch_lanekeeper(p, &lanes, tick, dt, now),
                Policy::Static => self.dispatch_static(p, &lanes, tick, dt, now),
                Policy::Fair => self.dispatch_fair(p, &lanes, tick, now),
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

    fn dispatch_lanekeeper(&mut self, p: usize, lanes: &[usize], tick: usize, dt: f64, now: f64) {
        for &i in lanes {
            let units = self.lanes[i].units;
            let g = &mut self.gates[i];
            g.tokens =
                (g.tokens + g.rate * dt).min(burst(g.rate, units, self.sc.gateway.burst_seconds));
        }
        // The in-flight reflex: at stopAt, lanes that may be shed stop
        // dispatching until in-flight is below resumeBelow.
        if let Some((stop, resume)) = self.watermarks[p] {
            let f = f64::from(self.in_flight[p]);
            if f >= stop {
                self.gated[p] = true;
            } else if f < resume {
                self.gated[p] = false;
            }
        }
        let gated = self.gated[p];
        // Phase 1: each lane up to its tokens, in priority order.
        for &i in lanes {
            if gated && !self.lanes[i].never {
                continue;
            }
            let units = self.lanes[i].units;
            while !self.queues[i].is_empty()
                && self.gates[i].tokens + 1e-9 >= units
                && self.budget[p] + 1e-9 >= units
            {
                let Some(a) = self.queues[i].pop_front() else {
                    break;
                };
                self.gates[i].tokens -= units;
                self.start(a, now, tick);
            }
        }
        // Phase 2: capacity no bucket claimed goes, in priority order, to
        // lanes the decision does not hold back (Admitted, or Throttled only
        // for lack of capacity); Capped and Paused lanes stay at their rate.
        for &i in lanes {
            if gated && !self.lanes[i].never {
                continue;
            }
            if !matches!(
                self.gates[i].state,
                LaneState::Admitted | LaneState::Throttled
            ) {
                continue;
            }
            let units = self.lanes[i].units;
            while !self.queues[i].is_empty() && self.budget[p] + 1e-9 >= units {
                let Some(a) = self.queues[i].pop_front() else {
                    break;
                };
                self.start(a, now, tick);
            }
        }
    }

    fn dispatch_static(&mut self, p: usize, lanes: &[usize], tick: usize, dt: f64, now: f64) {
        for &i in lanes {
            let units = self.lanes[i].units;
            let g = &mut self.gates[i];
            g.tokens =
                (g.tokens + g.rate * dt).min(burst(g.rate, units, self.sc.gateway.burst_seconds));
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

fn burst(rate: f64, units: f64, seconds: f64) -> f64 {
    if rate <= 0.0 {
        0.0
    } else {
        (rate * seconds).max(units)
    }
}

/// The retry budget's bucket size: ten seconds of the lane's expected
/// originals times its budget share, at least one retry.
fn budget_cap(l: &LaneSetup) -> f64 {
    (l.budget * l.expected_rps * 10.0).max(if l.budget > 0.0 { 1.0 } else { 0.0 })
}
