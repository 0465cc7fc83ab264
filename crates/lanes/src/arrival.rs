//! [`Core::admit`]: an arriving request, step by step — how it counts for
//! the retry rules, the retry limits, its deadline, a token (the lane's own
//! or spare capacity) and a slot of the in-flight limit, and else a place in
//! the queue or a refusal.

use crate::charge::{RequestSize, Sized};
use crate::core::{Core, DEFAULT_TENANT, Place};
use crate::expected_wait::whole;
use crate::fair_queue::{Key, TenantId, Waiting};
use crate::history::history_turns;
use crate::id_hint::IdHint;
use crate::lane::{Lane, effective_rate};
use crate::remembered::{IdRef, Remembered, Seen};
use crate::verdict::{
    Attempt, Limit, Outcome, Pass, Refusal, Request, Resolution, Ticket, Verdict,
};

/// An arriving request as the lane counts it.
#[derive(Clone, Copy, Debug)]
struct Arrival {
    lane: usize,
    attempt: Attempt,
    /// Attempts so far, this one included.
    attempts: u32,
    /// Where its deadline starts (kept across deferrals).
    first_arrival: f64,
    /// Its request id, if it has one.
    key: Option<IdRef>,
    /// What it charges (see `charge`).
    sized: Sized,
}

impl Core {
    /// Decides on an arriving request at `now`.
    pub fn admit(&mut self, req: &Request<'_>, now: f64) -> Verdict {
        let mut none = IdHint::NONE;
        self.admit_with(req, None, &mut none, now)
    }

    /// [`Core::admit`] for a client that carries where its request id was
    /// written (see [`IdHint`]): `hint` says where it was last time (or
    /// none) and is set to where it is now (none without a request id). The
    /// verdict is the one [`Core::admit`] gives.
    pub fn admit_hinted(&mut self, req: &Request<'_>, hint: &mut IdHint, now: f64) -> Verdict {
        self.admit_with(req, None, hint, now)
    }

    /// Decides on an arriving request, of a known size or not, with the
    /// client's hint of where its id was written.
    pub(crate) fn admit_with(
        &mut self,
        req: &Request<'_>,
        size: Option<RequestSize>,
        hint: &mut IdHint,
        now: f64,
    ) -> Verdict {
        let Some(li) = self.lane_index(req.lane) else {
            return Verdict::UnknownLane;
        };
        self.pressure.update(now);
        let rate = effective_rate(&self.lanes, li, now);
        let long_above = self.pool.long_above();
        let lane = &mut self.lanes[li];
        lane.bucket.demand.add(now);
        lane.refill(now, rate);
        lane.refresh_service(now);
        lane.seen.sweep(now);
        let mut a = count_attempt(lane, li, req, *hint, now);
        *hint = a.key.map_or(IdHint::NONE, Remembered::hint);
        a.sized = lane.size(size, long_above);
        if a.sized.tokens != 1.0 {
            // Demand (what a fleet lease follows) counts the charge.
            lane.bucket.demand.add_n(now, a.sized.tokens - 1.0);
        }
        if let Err(limit) = check_retries(lane, &a, now) {
            return refuse(lane, &a, Outcome::RejectedRetryBudget, limit);
        }
        // Nothing can serve a request whose remaining time is shorter than
        // the lane's service time.
        let remaining = a.first_arrival + lane.cfg.deadline_seconds as f64 - now;
        if remaining < lane.expected_service {
            return refuse(lane, &a, Outcome::RejectedDeadline, Limit::Deadline);
        }
        if let Some(limit) = self.pool_limit(a.sized.long_context()) {
            let verdict = self.refuse_or_defer(&a, Outcome::RejectedOverload, limit);
            return told_at_least(verdict, self.pool_wait(limit, li, now) as f64);
        }
        let tenant = req.tenant.unwrap_or(DEFAULT_TENANT);
        if let Some(pass) = self.pass_now(&a, tenant, remaining, now) {
            return Verdict::Pass(pass);
        }
        self.queue_or_refuse(&a, tenant, rate, remaining, now)
    }

    /// A token (its own, or spare capacity), a slot, nobody waiting ahead
    /// who may go, and its tenant below its maximum in flight: go.
    fn pass_now(&mut self, a: &Arrival, tenant: &str, remaining: f64, now: f64) -> Option<Pass> {
        if !self.slot_for_arrival(a.lane, now) {
            return None;
        }
        let lane = &mut self.lanes[a.lane];
        if (!lane.queue.is_empty() && lane.queue.ready(&lane.tenants))
            || lane.tenants.at_max(tenant)
        {
            return None;
        }
        if !self.take_for(a.lane, &a.sized, now) {
            return None;
        }
        let lane = &mut self.lanes[a.lane];
        lane.bucket.used.add_n(now, a.sized.tokens);
        self.pool.took(a.sized.long_context());
        Some(Pass {
            lane: a.lane,
            attempt: a.attempt,
            history_turns: history_turns(lane.cfg.optional_context.as_ref(), self.pressure.state()),
            remaining_seconds: remaining,
            waited_seconds: 0.0,
            tenant_slot: lane.tenants.take(tenant),
            charge: lane.charge(&a.sized),
        })
    }

    /// Waits, if there is room and the wait can end in time; else refuses
    /// (or defers).
    fn queue_or_refuse(
        &mut self,
        a: &Arrival,
        tenant: &str,
        rate: f64,
        remaining: f64,
        now: f64,
    ) -> Verdict {
        let lane = &self.lanes[a.lane];
        if lane.tenants.at_max(tenant)
            && (lane.queue.len() >= lane.max_depth || lane.cfg.queue.ttl_seconds == 0)
        {
            // Its tenant has its maximum in flight and it cannot wait for
            // one of them to finish.
            let outcome = if lane.queue.len() >= lane.max_depth {
                Outcome::RejectedQueueFull
            } else {
                Outcome::RejectedRate
            };
            return self.refuse_or_defer(a, outcome, Limit::TenantConcurrency);
        }
        if !lane.defers() && lane.queue.len() >= lane.max_depth && fattest(lane, tenant).is_none() {
            return refuse(lane, a, Outcome::RejectedQueueFull, Limit::QueueDepth);
        }
        if rate <= 0.0 && !(lane.cfg.spare_capacity && self.spare.rate > 0.0) {
            let limit = if lane.bucket.paused {
                Limit::Paused
            } else {
                Limit::Rate
            };
            return self.refuse_or_defer(a, Outcome::RejectedRate, limit);
        }
        // The wait at the lane's own rate (spare capacity, shared with other
        // lanes, is not counted on).
        let wait = queue_wait(lane, &a.sized, rate, now);
        if wait + lane.expected_service > remaining {
            // Queued, it would die waiting; deferred, it would come back to
            // the same wait. Refuse it now.
            return refuse(lane, a, Outcome::RejectedDeadline, Limit::Deadline);
        }
        if wait > lane.cfg.queue.ttl_seconds as f64 {
            return self.refuse_or_defer(a, Outcome::RejectedRate, Limit::QueueTtl);
        }
        // The wait for a slot of the in-flight limit, behind the lanes above.
        let slot_wait = self.slot_wait(a.lane, now);
        if slot_wait.max(wait) + lane.expected_service > remaining
            || slot_wait > lane.cfg.queue.ttl_seconds as f64
        {
            let verdict = self.refuse_or_defer(a, Outcome::RejectedOverload, Limit::StopAt);
            return told_at_least(verdict, slot_wait);
        }
        if lane.queue.len() >= lane.max_depth {
            if !lane.defers() {
                self.evict_fattest(a, tenant);
            } else if !self.make_room(a) {
                return self.defer(a);
            }
        }
        let ticket = self.enqueue(a, tenant, now);
        Verdict::Queued {
            lane: a.lane,
            attempt: a.attempt,
            ticket,
        }
    }

    /// A full queue of a lane that does not defer: a newcomer whose tenant
    /// has fewer waiting than the tenant with the most (by two or more)
    /// takes the place of that tenant's newest request, which is refused
    /// as queue full (reported by the next `poll`). One tenant cannot hold
    /// a lane's whole queue against the others.
    fn evict_fattest(&mut self, a: &Arrival, tenant: &str) {
        let lane = &mut self.lanes[a.lane];
        let Some((id, key)) = fattest(lane, tenant) else {
            return;
        };
        let Some(w) = lane.queue.remove(id, key) else {
            return;
        };
        self.tickets.remove(&w.ticket);
        let refusal = Refusal {
            lane: a.lane,
            attempt: w.attempt,
            outcome: Outcome::RejectedQueueFull,
            limit: Limit::QueueDepth,
            retry_after_seconds: lane.retry_after(),
            inside_floor: lane.inside_floor(),
        };
        self.pending.push((w.ticket, Resolution::Refuse(refusal)));
    }

    /// A full queue of a `Defer` lane: the request that arrived last is the
    /// one deferred. When a queued one arrived after this one, it is
    /// evicted (deferred, reported by the next `poll`) and this one takes
    /// its place; else this one is deferred (false).
    fn make_room(&mut self, a: &Arrival) -> bool {
        let lane = &mut self.lanes[a.lane];
        let Some((fa, key, tenant)) = lane.queue.newest() else {
            return false;
        };
        if fa <= a.first_arrival {
            return false;
        }
        if let Some(w) = lane.queue.remove(tenant, key) {
            self.tickets.remove(&w.ticket);
            lane.seen.mark_deferred(w.request_key);
            let refusal = Refusal {
                lane: a.lane,
                attempt: w.attempt,
                outcome: Outcome::Deferred,
                limit: Limit::Deferred,
                retry_after_seconds: lane.retry_after(),
                inside_floor: lane.inside_floor(),
            };
            self.pending.push((w.ticket, Resolution::Refuse(refusal)));
        }
        true
    }

    fn enqueue(&mut self, a: &Arrival, tenant: &str, now: f64) -> Ticket {
        self.next_ticket += 1;
        let ticket = Ticket(self.next_ticket);
        let waiting = Waiting {
            ticket,
            attempt: a.attempt,
            first_arrival: a.first_arrival,
            queued_at: now,
            request_key: a.key,
            cost: a.sized.units,
            sized: a.sized,
        };
        let lane = &mut self.lanes[a.lane];
        let (_, _, slot) = lane.queue.push(tenant, waiting, &lane.tenants);
        self.tickets.insert(ticket, Place::new(a.lane, slot));
        ticket
    }

    /// A `Defer` lane defers what another lane refuses.
    fn refuse_or_defer(&mut self, a: &Arrival, outcome: Outcome, limit: Limit) -> Verdict {
        if self.lanes[a.lane].defers() {
            self.defer(a)
        } else {
            refuse(&self.lanes[a.lane], a, outcome, limit)
        }
    }

    /// Defers an arriving request (its id remembered with its first
    /// arrival, so it keeps its place when it comes back).
    fn defer(&mut self, a: &Arrival) -> Verdict {
        let lane = &mut self.lanes[a.lane];
        lane.seen.mark_deferred(a.key);
        Verdict::Refuse(Refusal {
            lane: a.lane,
            attempt: a.attempt,
            outcome: Outcome::Deferred,
            limit: Limit::Deferred,
            retry_after_seconds: lane.retry_after(),
            inside_floor: lane.inside_floor(),
        })
    }
}

/// The newest request of the tenant with the most waiting in `lane`, when
/// that tenant has at least two more waiting than `tenant` (a newcomer of
/// `tenant` may take its place on a full queue).
fn fattest(lane: &Lane, tenant: &str) -> Option<(TenantId, Key)> {
    let (id, most, key) = lane.queue.fattest()?;
    (lane.queue.waiting_of(tenant) + 1 < most).then_some((id, key))
}

/// A refusal at the in-flight limit tells at least the wait for a slot (a
/// deferral keeps the controller's bound, as every deferral does).
fn told_at_least(verdict: Verdict, slot_wait: f64) -> Verdict {
    match verdict {
        Verdict::Refuse(mut r) if r.outcome == Outcome::RejectedOverload => {
            r.retry_after_seconds = r.retry_after_seconds.map(|s| s.max(whole(slot_wait)));
            Verdict::Refuse(r)
        }
        other => other,
    }
}

/// How the request counts (a remembered id is a retry whatever the header
/// says; a deferred one returns with its first arrival), remembered for the
/// lane's deadline. A return consumes its deferral: the id is remembered
/// as not deferred, so its next arrival is a retry unless it is deferred
/// again (on arrival or from the queue, which marks it deferred).
fn count_attempt(lane: &mut Lane, li: usize, req: &Request<'_>, hint: IdHint, now: f64) -> Arrival {
    let key = req.request_id.map(|id| lane.seen.key(id));
    let header = req.attempt;
    let deadline = lane.cfg.deadline_seconds as f64;
    let mut counted = None;
    let mut classify = |seen: Option<&Seen>| {
        let c = classify(seen, header, now);
        counted = Some(c);
        Seen::new(c.1, deadline, c.2, false)
    };
    let key = match key {
        Some(k) => Some(lane.seen.write(k, hint, classify)),
        None => {
            classify(None);
            None
        }
    };
    let (attempt, first_arrival, attempts) = counted.expect("classified");
    Arrival {
        lane: li,
        attempt,
        attempts,
        first_arrival,
        key,
        sized: Sized::flat(lane.cfg.work_units_per_request),
    }
}

/// (how it counts, where its deadline starts, attempts so far) of a request
/// whose id was `seen` before (or not) and whose attempt header says
/// `header`.
fn classify(seen: Option<&Seen>, header: Option<u32>, now: f64) -> (Attempt, f64, u32) {
    let (attempt, first_arrival) = match seen {
        Some(s) if s.deferred => (Attempt::Returning, s.first_arrival),
        Some(_) => (Attempt::Retry, now),
        None if header.unwrap_or(1) > 1 => (Attempt::Retry, now),
        None => (Attempt::Original, now),
    };
    let attempts = match (attempt, seen) {
        (Attempt::Retry, Some(s)) => (s.attempts() + 1).max(header.unwrap_or(0)),
        (Attempt::Retry, None) => header.unwrap_or(2),
        (_, Some(s)) => s.attempts(),
        (_, None) => 1,
    };
    (attempt, first_arrival, attempts)
}

/// Retries: `retry.maxAttempts`, then the budget over the recent originals.
/// An original or a return is counted and passes.
fn check_retries(lane: &mut Lane, a: &Arrival, now: f64) -> Result<(), Limit> {
    match a.attempt {
        Attempt::Original => lane.retries.original(now),
        Attempt::Retry => {
            if a.attempts > lane.cfg.retry.max_attempts.max(1) as u32 {
                return Err(Limit::MaxAttempts);
            }
            let (originals, retries) = lane.retries.totals(now);
            let allowed = originals as f64 * f64::from(lane.cfg.retry.budget_percent) / 100.0;
            if (retries + 1) as f64 > allowed {
                return Err(Limit::RetryBudget);
            }
            lane.retries.retry(now);
        }
        Attempt::Returning => {}
    }
    Ok(())
}

/// The wait of a newcomer of `sized` at the lane's own rate (spare
/// capacity, shared with other lanes, is not counted on). Its own charge
/// stands for each request ahead's; a priced lane's debt is waited for too,
/// while the excess its requests in flight reserved comes back as they
/// settle: spread over the lane's expected service time (its P95, slower
/// than most of it comes back), it adds to the rate.
fn queue_wait(lane: &Lane, sized: &Sized, rate: f64, now: f64) -> f64 {
    let held = if sized.tokens == 1.0 {
        lane.bucket.tokens.max(0.0)
    } else {
        lane.bucket.tokens
    };
    let ahead = (lane.queue.len() as f64 + 1.0) * sized.tokens - held;
    let mut drain = crate::fleet_core::drain_rate(lane, rate, now);
    if drain > 0.0 && lane.expected_service > 0.0 {
        drain += lane.refunds_due / lane.cfg.work_units_per_request / lane.expected_service;
    }
    if drain > 0.0 {
        (ahead / drain).max(0.0)
    } else {
        0.0
    }
}

/// A refusal; no `Retry-After` for the deadline or the retry budget (coming
/// back would not help).
fn refuse(lane: &Lane, a: &Arrival, outcome: Outcome, limit: Limit) -> Verdict {
    Verdict::Refuse(Refusal {
        lane: a.lane,
        attempt: a.attempt,
        outcome,
        limit,
        retry_after_seconds: match outcome {
            Outcome::RejectedDeadline | Outcome::RejectedRetryBudget => None,
            _ => lane.retry_after(),
        },
        inside_floor: lane.inside_floor(),
    })
}
