//! The in-flight limit across lanes: who may take a free slot.
//!
//! The sheddable lanes share `inFlight.stopAt`'s slots less a reserve kept
//! for the lanes that are never shed (`sheddable: false`): one second of
//! their requests (their buckets' size). Those lanes are never held by the
//! limit, and their requests count in flight; the reserve keeps what they
//! add from taking in flight past `stopAt`. A slot is free again the moment a
//! request finishes, and [`Core::poll`] hands free slots to the
//! highest-priority lane with a request ready (waiting, with a token); an
//! arrival of a lower lane passes at once only when slots are left over for
//! every ready request of the lanes above it. When the wait for a slot would
//! miss a request's deadline (or outlast its TTL), it is refused at once
//! with `inFlight.stopAt` (a `Defer` lane defers it): a lane waits behind
//! every lane above it, so the lowest lanes are refused first.

use crate::core::Core;
use crate::lane::{Lane, effective_rate};

/// The slots kept for the lanes that are never shed: their buckets' size
/// (one second of their admitted rate, or their floor), leaving at least
/// one slot of `limit` to the others.
pub(crate) fn reserve(lanes: &[Lane], limit: Option<u64>) -> u64 {
    let Some(limit) = limit else { return 0 };
    let r: f64 = lanes
        .iter()
        .filter(|l| !l.cfg.sheddable)
        .map(|l| l.bucket.cap())
        .sum();
    (r.ceil() as u64).min(limit.saturating_sub(1))
}

/// Lanes in the order free slots go to them: priority, then config order.
pub(crate) fn priority_order(lanes: &[Lane]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..lanes.len()).collect();
    order.sort_by_key(|&i| (lanes[i].cfg.priority, i));
    order
}

impl Core {
    /// Slots free to the sheddable lanes now, with `taken` passes of this
    /// call not counted in flight yet (the reserve kept).
    pub(crate) fn free_slots(&self, taken: u64) -> u64 {
        self.pressure.free_slots(taken.saturating_add(self.reserve))
    }

    /// Whether lane `li`'s request may take a slot now, with `taken` passes
    /// of this call not counted in flight yet.
    pub(crate) fn has_slot(&self, li: usize, taken: u64) -> bool {
        (!self.lanes[li].cfg.sheddable || self.free_slots(taken) > 0) && self.model_slot_free(taken)
    }

    /// Whether an arrival of lane `li` may take a slot at once: a free one
    /// that no ready request of a higher-priority lane needs.
    pub(crate) fn slot_for_arrival(&self, li: usize, now: f64) -> bool {
        if !self.lanes[li].cfg.sheddable {
            return true;
        }
        let free = self.free_slots(0);
        if free == 0 {
            return false;
        }
        let priority = self.lanes[li].cfg.priority;
        let above = |j: &usize| {
            let l = &self.lanes[*j];
            l.cfg.sheddable && l.cfg.priority < priority && !l.queue.is_empty()
        };
        let waiting: usize = (0..self.lanes.len())
            .filter(above)
            .map(|j| self.lanes[j].queue.len())
            .sum();
        if free > waiting as u64 {
            return true;
        }
        let ready: f64 = (0..self.lanes.len())
            .filter(above)
            .map(|j| {
                let l = &self.lanes[j];
                let tokens = l.bucket.tokens_at(now, effective_rate(&self.lanes, j, now));
                (l.queue.len() as f64).min(tokens.floor().max(0.0))
            })
            .sum();
        free as f64 > ready
    }

    /// The expected wait for a slot of a request of lane `li` arriving now:
    /// the requests waiting in its lane and in every sheddable lane above
    /// it go first, and slots free up at the rate requests finish less the
    /// rate the reserve takes them. 0 without a limit, with a slot free for
    /// it, or before any request finished (no rate known).
    pub(crate) fn slot_wait(&self, li: usize, now: f64) -> f64 {
        let lane = &self.lanes[li];
        if !lane.cfg.sheddable || self.pressure.limit().is_none() {
            return 0.0;
        }
        let priority = lane.cfg.priority;
        let ahead: usize = self
            .lanes
            .iter()
            .filter(|l| l.cfg.sheddable && l.cfg.priority <= priority)
            .map(|l| l.queue.len())
            .sum();
        let need = (ahead as u64 + 1).saturating_sub(self.free_slots(0));
        if need == 0 {
            return 0.0;
        }
        let reserve: f64 = self
            .lanes
            .iter()
            .filter(|l| !l.cfg.sheddable)
            .map(|l| l.bucket.used.rate(now))
            .sum();
        let rate = self.pressure.drain_rate(now) - reserve;
        if rate <= 0.0 {
            return 0.0;
        }
        need as f64 / rate
    }

    /// Whether a request of a sheddable lane waits while a slot is free:
    /// the next poll has work (the caller wakes its driver).
    pub(crate) fn slot_freed_for_waiting(&self) -> bool {
        self.pressure.limit().is_some()
            && self.free_slots(0) == 1
            && self
                .lanes
                .iter()
                .any(|l| l.cfg.sheddable && !l.queue.is_empty())
    }
}
