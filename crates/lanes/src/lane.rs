//! One lane's live state: its bucket, its queue, its remembered ids and its
//! retry window, and the rate its bucket runs at now.

use std::sync::Arc;

use crate::bucket::{Bucket, Grant};
use crate::ceiling::Ceiling;
use crate::config::{LaneConfig, LaneState};
use crate::expected_wait::{LaneWait, retry_after_seconds};
use crate::fair_queue::FairQueue;
use crate::remembered::{Remembered, RetryWindow};
use crate::service_time::ServiceTime;
use crate::tenants::TenantGate;
use crate::token_estimate::Estimator;

/// A lane's routes as the gateway sends to them, shared: a request on its
/// way upstream holds them (and the name of the route it took) without a
/// copy of any name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaneRoutes {
    /// The routes to use now, in order (`routes`).
    pub routes: Arc<[Arc<str>]>,
    /// The approved fallbacks an open breaker may send a request to
    /// (`breakerFallbacks`).
    pub breaker_fallbacks: Arc<[Arc<str>]>,
}

impl LaneRoutes {
    /// The routes of `cfg`.
    pub fn of(cfg: &LaneConfig) -> LaneRoutes {
        let shared = |names: &[String]| names.iter().map(|n| Arc::from(n.as_str())).collect();
        LaneRoutes {
            routes: shared(&cfg.routes),
            breaker_fallbacks: shared(&cfg.breaker_fallbacks),
        }
    }
}

/// One lane's live state.
#[derive(Debug)]
pub(crate) struct Lane {
    pub(crate) cfg: LaneConfig,
    /// The lane's name, shared with what outlives a config (a request in
    /// flight).
    pub(crate) name: Arc<str>,
    /// Its routes, shared the same way.
    pub(crate) routes: LaneRoutes,
    pub(crate) bucket: Bucket,
    /// What holds its draws on spare capacity to its ceiling (None: no
    /// ceiling).
    pub(crate) ceiling: Option<Ceiling>,
    /// Most waiting requests (the replica's share of `queue.maxDepth`).
    pub(crate) max_depth: usize,
    pub(crate) queue: FairQueue,
    pub(crate) seen: Remembered,
    pub(crate) retries: RetryWindow,
    /// The expected service time in force (see [`ServiceTime`]), as of
    /// the last [`Lane::refresh_service`].
    pub(crate) expected_service: f64,
    pub(crate) service: ServiceTime,
    pub(crate) tenants: TenantGate,
    /// The lane's token estimator (learned from settled usage; carried
    /// across config swaps).
    pub(crate) estimator: Estimator,
    /// Work units its requests in flight are expected to give back when
    /// they settle (each reserved its output at the lane's P95 and is
    /// expected to use its mean): a queue's wait counts them as flowing
    /// back over the lane's expected service time.
    pub(crate) refunds_due: f64,
}

impl Lane {
    pub(crate) fn new(cfg: LaneConfig, share: f64, now: f64) -> Lane {
        let paused = cfg.state == LaneState::Paused;
        Lane {
            name: Arc::from(cfg.name.as_str()),
            routes: LaneRoutes::of(&cfg),
            bucket: Bucket::new(&cfg, paused, share, now),
            ceiling: Ceiling::new(
                cfg.ceiling_units_per_second,
                cfg.work_units_per_request,
                share,
                now,
            ),
            max_depth: (cfg.queue.max_depth as f64 * share).ceil() as usize,
            queue: FairQueue::default(),
            seen: Remembered::default(),
            retries: RetryWindow::default(),
            expected_service: cfg.expected_service_seconds.unwrap_or(0.0),
            service: ServiceTime::new(cfg.expected_service_seconds),
            tenants: TenantGate::new(&cfg, share),
            estimator: Estimator::default(),
            refunds_due: 0.0,
            cfg,
        }
    }

    /// The expected service time as measured by `now`.
    pub(crate) fn refresh_service(&mut self, now: f64) {
        self.expected_service = self.service.expected(now);
    }

    /// Grants on the lenders' indexes (`index` of a lane name).
    pub(crate) fn set_grants(
        &mut self,
        index: impl Fn(&str) -> usize,
        share: f64,
        now: f64,
        unix_now: f64,
    ) {
        let cost = self.cfg.work_units_per_request;
        self.bucket.grants = self
            .cfg
            .borrowing
            .iter()
            .map(|g| Grant {
                from: index(&g.from),
                requests_per_second: g.units_per_second / cost * share,
                units_per_second: g.units_per_second * share,
                expires: now + (g.expires_at.as_second() as f64 - unix_now),
            })
            .collect();
    }

    /// The `Retry-After` of a refusal that has one: the expected wait,
    /// the lane's queue ahead at its rate (see [`crate::expected_wait`]).
    pub(crate) fn retry_after(&self) -> Option<i64> {
        let b = &self.bucket;
        let deferral = self.cfg.deferral.as_ref().map(|d| d.retry_after_seconds);
        Some(retry_after_seconds(&LaneWait {
            queued: self.queue.len(),
            tokens: b.tokens,
            drain_rate: if b.paused {
                0.0
            } else {
                b.rate.max(b.floor_rps)
            },
            resume_seconds: deferral.or(self.cfg.retry_after_seconds),
            deferral_bound: deferral,
            ttl_seconds: self.cfg.queue.ttl_seconds,
        }))
    }

    /// Whether refusals of this lane are deferrals.
    pub(crate) fn defers(&self) -> bool {
        self.cfg.deferral.is_some()
    }

    /// May draw on the pool's spare capacity once its own bucket is empty.
    pub(crate) fn draws_on_spare(&self) -> bool {
        self.cfg.spare_capacity && !self.bucket.paused
    }

    /// Its ceiling leaves room for a draw of `units` on spare capacity
    /// (always, without a ceiling).
    pub(crate) fn below_ceiling(&mut self, units: f64, now: f64) -> bool {
        self.ceiling.as_mut().is_none_or(|c| c.holds(units, now))
    }

    /// A request of `units` passed, from its own bucket or spare capacity.
    pub(crate) fn passed(&mut self, units: f64, now: f64) {
        if let Some(c) = self.ceiling.as_mut() {
            c.charge(units, now);
        }
    }

    /// Admitted less than its floor over the last second (as of the last
    /// refill): a refusal now breaks the floor's promise. A paused lane has
    /// no floor.
    pub(crate) fn inside_floor(&self) -> bool {
        let b = &self.bucket;
        !b.paused && b.floor_rps > 0.0 && b.used.rate(b.last_refill) < b.floor_rps
    }

    /// Adds the tokens accrued since the last refill at `rate`.
    pub(crate) fn refill(&mut self, now: f64, rate: f64) {
        self.bucket.refill(now, rate, self.queue.len());
    }
}

/// A lane's bucket rate at `now`: its configured rate raised to its floor
/// (reserved), less the grants that lapsed and less what each lender took
/// back of what it lent (each borrower gives back its proportion of the
/// lent units).
pub(crate) fn effective_rate(lanes: &[Lane], li: usize, now: f64) -> f64 {
    let lane = &lanes[li].bucket;
    if lane.paused {
        return 0.0;
    }
    let mut rate = lane.rate.max(lane.floor_rps);
    for g in &lane.grants {
        if now >= g.expires {
            rate -= g.requests_per_second;
            continue;
        }
        let reclaimed = reclaimed_units(&lanes[g.from], now);
        if reclaimed > 0.0 {
            let lent = lent_units(lanes, g.from, now);
            if lent > 0.0 {
                rate -= (reclaimed.min(lent) / lent) * g.requests_per_second;
            }
        }
    }
    rate.max(0.0)
}

/// Units per second a lender uses above its configured rate: what it takes
/// back of the floor it lent.
fn reclaimed_units(lender: &Lane, now: f64) -> f64 {
    let cost = lender.cfg.work_units_per_request;
    let used_units = lender.bucket.used.rate(now) * cost;
    let rate_units = lender.bucket.rate * cost;
    (used_units - rate_units).max(0.0)
}

/// Units per second lane `from` lends now, over every borrower.
fn lent_units(lanes: &[Lane], from: usize, now: f64) -> f64 {
    lanes
        .iter()
        .flat_map(|l| l.bucket.grants.iter())
        .filter(|o| o.from == from && now < o.expires)
        .map(|o| o.units_per_second)
        .sum()
}
