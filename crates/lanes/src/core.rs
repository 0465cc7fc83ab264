//! The orchestration: one [`Core`] enforces one config (one
//! CapacityProfile's lanes). `new` and `swap` install a config, `admit`
//! decides on an arriving request, `poll` resolves waiting ones, `next_wake`
//! says when `poll` next has work, `cancel` gives up a waiting request, and
//! `started`/`finished` count what is in flight (every pass is counted by
//! `started` before the next call: the in-flight limit's slots). Every call takes the time.

use std::collections::HashMap;

use rustc_hash::FxBuildHasher;

use crate::config::{GatewayConfig, LaneConfig, Mode};
use crate::fair_queue::Slot;
use crate::lane::{Lane, effective_rate};
use crate::pool_limits::PoolGate;
use crate::pressure::{Pressure, PressureGauge};
use crate::slots::{priority_order, reserve};
use crate::spare::Spare;
use crate::validate::{ConfigError, validate};
use crate::verdict::{Attempt, Limit, Outcome, Refusal, Resolution, Ticket};

/// The tenant of requests that name none.
pub const DEFAULT_TENANT: &str = "";

/// The admission core for one config.
#[derive(Debug)]
pub struct Core {
    pub(crate) config: GatewayConfig,
    share: f64,
    pub(crate) lanes: Vec<Lane>,
    /// Lane indexes in the order free slots go to them (priority first).
    pub(crate) order: Vec<usize>,
    /// Slots of the in-flight limit kept for the lanes never shed.
    pub(crate) reserve: u64,
    pub(crate) spare: Spare,
    /// Lane names are the config's own (no client inserts here), so a
    /// cheap hasher will do.
    by_name: HashMap<String, usize, FxBuildHasher>,
    pub(crate) pressure: PressureGauge,
    pub(crate) next_ticket: u64,
    /// Ticket → (lane, position in its queue) of every waiting request:
    /// 16 bytes a bucket. Tickets are the core's own counter (no client
    /// chooses one): a cheap hash will do.
    pub(crate) tickets: HashMap<Ticket, Place, FxBuildHasher>,
    /// Resolutions produced inside `admit` (a queued request deferred to
    /// make room for an earlier arrival), handed out by the next `poll`.
    pub(crate) pending: Vec<(Ticket, Resolution)>,
    /// The pool's model slots and long-context limit (`pool_limits`).
    pub(crate) pool: PoolGate,
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
        let by_name: HashMap<String, usize, FxBuildHasher> = cfg
            .lanes
            .iter()
            .enumerate()
            .map(|(i, l)| (l.name.clone(), i))
            .collect();
        let mut lanes: Vec<Lane> = cfg
            .lanes
            .iter()
            .map(|l| Lane::new(l.clone(), share, now))
            .collect();
        for lane in &mut lanes {
            lane.set_grants(|n| by_name[n], share, now, unix_now);
        }
        let claimed: f64 = lanes
            .iter()
            .map(|l| l.bucket.rate.max(l.bucket.floor_rps) * l.cfg.work_units_per_request)
            .sum();
        let largest = lanes
            .iter()
            .filter(|l| l.cfg.spare_capacity)
            .map(|l| l.cfg.work_units_per_request)
            .fold(0.0, f64::max);
        let pressure = PressureGauge::new(cfg.in_flight.as_ref(), share, now);
        let pool = PoolGate::new(&cfg, share);
        Ok(Core {
            spare: Spare::new(&cfg, claimed, largest, share, now),
            reserve: reserve(&lanes, pressure.limit()),
            pressure,
            config: cfg,
            share,
            order: priority_order(&lanes),
            lanes,
            by_name,
            next_ticket: 0,
            tickets: HashMap::default(),
            pending: Vec::new(),
            pool,
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
        // The same lanes in the same order: every ticket stays where it is.
        let same_order = self.lanes.len() == next.lanes.len()
            && self
                .lanes
                .iter()
                .zip(&next.lanes)
                .all(|(a, b)| a.cfg.name == b.cfg.name);
        let mut refused = Vec::new();
        // What each lane accrued since its last refill, at the rate its
        // bucket ran at (its floor, its grants), before the lanes go.
        let rates: Vec<f64> = (0..self.lanes.len())
            .map(|i| effective_rate(&self.lanes, i, now))
            .collect();
        for (old_idx, mut old) in std::mem::take(&mut self.lanes).into_iter().enumerate() {
            old.refill(now, rates[old_idx]);
            match next.by_name.get(&old.cfg.name).copied() {
                Some(i) => carry_lane(old, &mut next.lanes[i], now),
                None => {
                    for w in old.queue.drain() {
                        self.tickets.remove(&w.ticket);
                        refused.push((
                            w.ticket,
                            Resolution::Refuse(lane_removed(old_idx, w.attempt)),
                        ));
                    }
                }
            }
        }
        next.tickets = if same_order {
            std::mem::take(&mut self.tickets)
        } else {
            next.index_tickets()
        };
        self.spare.refill(now);
        next.spare.tokens = self.spare.tokens.min(next.spare.cap);
        next.spare.leased = self.spare.leased && next.spare.rate > 0.0;
        let gauge = std::mem::replace(&mut self.pressure, PressureGauge::new(None, 1.0, now));
        gauge.carry_into(&mut next.pressure);
        self.pool.carry_into(&mut next.pool);
        next.next_ticket = self.next_ticket;
        next.pending = std::mem::take(&mut self.pending);
        *self = next;
        Ok(refused)
    }

    /// Every waiting request's ticket at its lane's new position.
    fn index_tickets(&self) -> HashMap<Ticket, Place, FxBuildHasher> {
        let mut tickets = HashMap::default();
        for (i, lane) in self.lanes.iter().enumerate() {
            for (slot, w) in lane.queue.places() {
                tickets.insert(w.ticket, Place::new(i, slot));
            }
        }
        tickets
    }

    /// The config in force.
    pub fn config(&self) -> &GatewayConfig {
        &self.config
    }

    /// Whether the config is enforced (`mode: Enforce`); an Observe config
    /// is evaluated for the shadow metrics only.
    pub fn enforcing(&self) -> bool {
        self.config.mode == Mode::Enforce
    }

    /// The replica share in force.
    pub fn share(&self) -> f64 {
        self.share
    }

    /// Whether a request's input tokens change a decision about lane `i`:
    /// the lane limits them (`tokens.maxInputTokens`), prices them
    /// (`cost`), or the pool limits long contexts. A gateway need not
    /// count a prompt no decision reads.
    pub fn reads_input_tokens(&self, i: usize) -> bool {
        let cfg = &self.lanes[i].cfg;
        cfg.cost.is_some()
            || cfg.tokens.is_some_and(|t| t.max_input_tokens.is_some())
            || self.pool.long_above().is_some()
    }

    /// The index of a lane by name.
    pub fn lane_index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The name of the lane at an index, to hand to [`Core::served`] once
    /// its request is answered.
    pub fn lane_name(&self, i: usize) -> std::sync::Arc<str> {
        std::sync::Arc::clone(&self.lanes[i].name)
    }

    /// The routes of the lane at an index, shared.
    pub fn routes(&self, i: usize) -> &crate::lane::LaneRoutes {
        &self.lanes[i].routes
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

    /// The service time lane `lane`'s deadline check counted at its last
    /// request (read only: a gauge must not refresh what the decisions
    /// use): its `expectedServiceSeconds`, or the p95 of its answers of the
    /// last 10 s (once there are 20) when longer.
    pub fn last_expected_service(&self, lane: usize) -> f64 {
        self.lanes[lane].expected_service
    }

    /// Requests in flight to the pool (as [`Core::started`] and
    /// [`Core::finished`] counted them).
    pub fn in_flight(&self) -> u64 {
        self.pressure.in_flight()
    }

    /// The pressure state.
    pub fn pressure(&self) -> Pressure {
        self.pressure.state()
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

    /// Gives up a waiting request (its client went away). Returns whether it
    /// was waiting.
    pub fn cancel(&mut self, ticket: Ticket) -> bool {
        let Some(place) = self.tickets.remove(&ticket) else {
            return false;
        };
        self.lanes[place.lane as usize]
            .queue
            .remove_at(place.slot)
            .is_some()
    }

    /// A passed request went upstream.
    pub fn started(&mut self, now: f64) {
        self.pressure.started(now);
    }

    /// A request that went upstream finished after `latency_seconds`.
    /// Returns whether its slot is the one a waiting request was held for
    /// by the in-flight limit: [`Core::poll`] has work now.
    pub fn finished(&mut self, now: f64, latency_seconds: f64) -> bool {
        self.pressure.finished(now, latency_seconds);
        self.slot_freed_for_waiting() || self.model_slot_freed_for_waiting()
    }

    /// A request of lane `lane` (by name: the config may have changed
    /// since it passed) was answered `seconds` after it passed: the lane's
    /// service time is measured from these (see `service_time`).
    pub fn served(&mut self, lane: &str, now: f64, seconds: f64) {
        if let Some(li) = self.lane_index(lane) {
            self.lanes[li].service.record(now, seconds);
        }
    }

    /// The expected service time of lane `li` now: its configured
    /// `expectedServiceSeconds`, or its answers' recent p95 when longer
    /// (refreshed, as a decision at `now` would; the gateway's gauge reads
    /// [`Core::last_expected_service`], which refreshes nothing).
    #[cfg(test)]
    pub(crate) fn expected_service_seconds(&mut self, li: usize, now: f64) -> f64 {
        self.lanes[li].refresh_service(now);
        self.lanes[li].expected_service
    }

    /// The in-flight limit in force (`inFlight.stopAt`, this replica's
    /// share), None without one.
    pub fn in_flight_limit(&self) -> Option<u64> {
        self.pressure.limit()
    }

    /// The p95 latency over the last window, as measured.
    pub fn latency_p95(&self, now: f64) -> Option<f64> {
        self.pressure.latency_p95(now)
    }
}

/// Where a waiting request is: its lane and its position in the lane's
/// queue (8 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    lane: u32,
    slot: Slot,
}

impl Place {
    pub(crate) fn new(lane: usize, slot: Slot) -> Place {
        Place {
            lane: lane as u32,
            slot,
        }
    }
}

/// A surviving lane keeps its tokens (up to the new size), its queue, its
/// remembered ids and its retry and use windows.
fn carry_lane(mut old: Lane, new: &mut Lane, now: f64) {
    new.bucket.leased = old.bucket.leased && !new.bucket.paused;
    new.bucket.tokens = old.bucket.tokens.min(new.bucket.cap());
    new.bucket.used = std::mem::take(&mut old.bucket.used);
    new.bucket.demand = std::mem::take(&mut old.bucket.demand);
    new.bucket.last_refill = now;
    if let (Some(old), Some(c)) = (&old.ceiling, &mut new.ceiling) {
        c.carry(old, now);
    }
    new.queue = std::mem::take(&mut old.queue);
    new.tenants.carry(&mut old.tenants);
    new.queue.reweigh(&new.tenants);
    new.seen = std::mem::take(&mut old.seen);
    old.service.carry_into(&mut new.service);
    new.refresh_service(now);
    new.retries = std::mem::take(&mut old.retries);
    new.estimator = std::mem::take(&mut old.estimator);
    new.refunds_due = old.refunds_due;
}

/// A waiting request whose lane the new config no longer has.
fn lane_removed(lane: usize, attempt: Attempt) -> Refusal {
    Refusal {
        lane,
        attempt,
        outcome: Outcome::RejectedRate,
        limit: Limit::LaneRemoved,
        retry_after_seconds: Some(1),
        inside_floor: false,
    }
}
