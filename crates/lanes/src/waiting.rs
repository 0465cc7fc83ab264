//! [`Core::poll`] and [`Core::next_wake`]: waiting requests resolved when
//! their turn comes (a token, in the fair queue's order, and a slot of the
//! in-flight limit, highest priority first) or their wait runs out (TTL, or
//! a deadline that can no longer be met).

use crate::core::Core;
use crate::fair_queue::Waiting;
use crate::history::history_turns;
use crate::lane::{Lane, effective_rate};
use crate::verdict::{Limit, Outcome, Pass, Refusal, Resolution, Ticket};

impl Core {
    /// Resolves waiting requests at `now`: those whose wait ran out first,
    /// then those whose turn came, lane by lane in priority order (free
    /// slots of the in-flight limit go to the highest priority first).
    pub fn poll(&mut self, now: f64) -> Vec<(Ticket, Resolution)> {
        let mut out = std::mem::take(&mut self.pending);
        self.pressure.update(now);
        for li in 0..self.lanes.len() {
            if self.lanes[li].queue.is_empty() {
                continue;
            }
            let rate = effective_rate(&self.lanes, li, now);
            self.lanes[li].refill(now, rate);
            self.expire(li, now, &mut out);
        }
        let mut taken = 0;
        for k in 0..self.order.len() {
            let li = self.order[k];
            if !self.lanes[li].queue.is_empty() {
                self.serve(li, now, &mut taken, &mut out);
            }
        }
        out
    }

    /// Refuses (or defers) the waiting requests past their TTL or unable to
    /// meet their deadline: such a request is never served.
    fn expire(&mut self, li: usize, now: f64, out: &mut Vec<(Ticket, Resolution)>) {
        self.lanes[li].refresh_service(now);
        loop {
            let lane = &mut self.lanes[li];
            let ttl = lane.cfg.queue.ttl_seconds as f64;
            let deadline = lane.cfg.deadline_seconds as f64;
            let svc = lane.expected_service;
            let by_ttl = lane.queue.oldest_queued().filter(|(q, _, _)| now - q > ttl);
            let by_deadline = lane
                .queue
                .oldest_arrival()
                .filter(|(fa, _, _)| fa + deadline - now < svc);
            let Some((_, key, tenant)) = by_deadline.or(by_ttl) else {
                return;
            };
            let blocked = lane.tenants.at_max(lane.queue.tenant_name(tenant));
            let w = lane.queue.remove(tenant, key).expect("indexed");
            self.tickets.remove(&w.ticket);
            let past_deadline = w.first_arrival + deadline - now < svc;
            out.push((
                w.ticket,
                Resolution::Refuse(expired(lane, li, &w, past_deadline, blocked)),
            ));
        }
    }

    /// Serves in fair order while there are tokens (the lane's own, then
    /// spare capacity) and, for a sheddable lane, free slots; `taken`
    /// counts the passes of this poll.
    fn serve(&mut self, li: usize, now: f64, taken: &mut u64, out: &mut Vec<(Ticket, Resolution)>) {
        loop {
            let slot = self.has_slot(li, *taken);
            let lane = &mut self.lanes[li];
            if !slot || !lane.queue.ready(&lane.tenants) {
                lane.bucket.tokens = lane.bucket.tokens.min(lane.bucket.cap());
                return;
            }
            let (tenant, key, head) = lane.queue.head().expect("a ready tenant has a head");
            let sized = head.sized;
            if sized.long_context() && self.pool.long_full() {
                out.push(self.refuse_long(li, tenant, key, now));
                continue;
            }
            if !self.take_for(li, &sized, now) {
                return;
            }
            let lane = &mut self.lanes[li];
            let Some((w, tenant_slot)) = lane.queue.pop_ready(&mut lane.tenants) else {
                return;
            };
            *taken += 1;
            lane.bucket.used.add_n(now, sized.tokens);
            self.pool.took(sized.long_context());
            self.tickets.remove(&w.ticket);
            let pass = Pass {
                lane: li,
                attempt: w.attempt,
                history_turns: history_turns(
                    lane.cfg.optional_context.as_ref(),
                    self.pressure.state(),
                ),
                remaining_seconds: w.first_arrival + lane.cfg.deadline_seconds as f64 - now,
                waited_seconds: now - w.queued_at,
                tenant_slot,
                charge: lane.charge(&sized),
            };
            out.push((w.ticket, Resolution::Pass(pass)));
        }
    }

    /// When [`Core::poll`] next has something to do (a token for a waiting
    /// request, or a wait running out), or None when nothing waits.
    pub fn next_wake(&self, now: f64) -> Option<f64> {
        if !self.pending.is_empty() {
            // A request deferred to make room is told at once.
            return Some(now);
        }
        (0..self.lanes.len())
            .filter(|&li| !self.lanes[li].queue.is_empty())
            .filter_map(|li| self.lane_wake(li, now))
            .reduce(f64::min)
    }

    /// When lane `li`'s queue next needs a poll. A lane held by the
    /// in-flight limit waits for a slot (its driver is woken when one frees,
    /// see [`Core::finished`]), not for a token.
    fn lane_wake(&self, li: usize, now: f64) -> Option<f64> {
        let lane = &self.lanes[li];
        let rate = effective_rate(&self.lanes, li, now);
        // Tenants at their maximum wait for a request to finish, not for a
        // token; sheddable lanes wait for a slot.
        let ready = self.has_slot(li, 0) && lane.queue.has_ready();
        let next = lane.queue.head().map(|(_, _, w)| w.sized);
        let need = next.map_or(1.0, |s| {
            if s.tokens == 1.0 {
                1.0
            } else {
                s.tokens.min(lane.bucket.cap())
            }
        });
        let token = (ready && rate > 0.0)
            .then(|| now + ((need - lane.bucket.tokens_at(now, rate)).max(0.0) / rate));
        let spare = if ready && lane.draws_on_spare() {
            let units = next.map_or(lane.cfg.work_units_per_request, |s| s.units);
            let spare = self.spare.ready_at(now, units);
            match &lane.ceiling {
                None => spare,
                Some(c) => spare.zip(c.ready_at(units, now)).map(|(s, c)| s.max(c)),
            }
        } else {
            None
        };
        let ttl = lane
            .queue
            .oldest_queued()
            .map(|(q, _, _)| q + lane.cfg.queue.ttl_seconds as f64 + 1e-6);
        let deadline = lane
            .queue
            .oldest_arrival()
            .map(|(fa, _, _)| fa + lane.cfg.deadline_seconds as f64 - lane.expected_service + 1e-6);
        let grants = lane
            .bucket
            .grants
            .iter()
            .map(|g| g.expires)
            .filter(|&e| e > now)
            .reduce(f64::min);
        // The earliest, taken in this order (as `reduce(f64::min)` over
        // an array of the five would, without the array: reading it back
        // stalled on the stores that had just filled it).
        let wake = earliest(earliest(token, spare), ttl);
        earliest(earliest(wake, deadline), grants)
    }
}

/// The earlier of two times either of which may be missing.
fn earliest(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// The refusal of a request whose wait ran out: deferred on a `Defer` lane
/// while its deadline can still be met, expired otherwise; told the
/// expected wait (`Retry-After`) unless its deadline passed.
fn expired(
    lane: &mut Lane,
    li: usize,
    w: &Waiting,
    past_deadline: bool,
    tenant_blocked: bool,
) -> Refusal {
    let deferred = lane.defers() && !past_deadline;
    if deferred {
        lane.seen.mark_deferred(w.request_key);
    }
    Refusal {
        lane: li,
        attempt: w.attempt,
        outcome: if deferred {
            Outcome::Deferred
        } else {
            Outcome::Expired
        },
        limit: if deferred {
            Limit::Deferred
        } else if past_deadline {
            Limit::Deadline
        } else if tenant_blocked {
            Limit::TenantConcurrency
        } else {
            Limit::QueueTtl
        },
        // Coming back helps unless its deadline can no longer be met: the
        // expected wait, as every refusal that may be retried is told.
        retry_after_seconds: if past_deadline && !deferred {
            None
        } else {
            lane.retry_after()
        },
        inside_floor: lane.inside_floor(),
    }
}
