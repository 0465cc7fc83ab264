//! Limits of the whole pool that hold next to the lanes' own: the model
//! server's slots (`concurrency.max`: requests in flight, every lane's,
//! those never shed included) and the long-context requests in flight
//! (`longContext`: requests whose estimated input is above
//! `aboveInputTokens` may hold at most `maxConcurrency` places, so a burst
//! of long prompts cannot fill the pool's KV cache while short requests
//! keep flowing). Each replica enforces its share (1/N, rounded up, at
//! least 1).
//!
//! An arrival over either limit is refused at once with its own reason
//! ([`Limit::ModelSlots`], [`Limit::LongContext`]) and a `Retry-After` of
//! the expected wait for a place (a `Defer` lane defers it). A waiting
//! request is held in its queue while the model slots are taken; a waiting
//! long request whose turn comes while the long places are taken is refused
//! then, so it does not hold the short requests behind it.

use serde::{Deserialize, Serialize};

use crate::config::GatewayConfig;
use crate::core::Core;
use crate::expected_wait::whole;
use crate::fair_queue::{Key, TenantId};
use crate::validate::ConfigError;
use crate::verdict::{Limit, Outcome, Refusal, Resolution, Ticket};

/// The pool's model slots (the CapacityProfile's `spec.concurrency`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelSlots {
    /// Most requests in flight to the pool, every lane's.
    pub max: u64,
}

/// The pool's long-context limit (the CapacityProfile's
/// `spec.longContext`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LongContext {
    /// A request whose estimated input tokens are above this is long.
    pub above_input_tokens: u64,
    /// Most long requests in flight.
    pub max_concurrency: u64,
}

/// Both limits >= 1.
pub(crate) fn check_pool(cfg: &GatewayConfig) -> Result<(), ConfigError> {
    let bad = |field: &'static str| ConfigError::Field {
        lane: "*pool*".to_owned(),
        field,
        value: "0".to_owned(),
        expected: "must be >= 1",
    };
    if cfg.concurrency.is_some_and(|c| c.max == 0) {
        return Err(bad("concurrency.max"));
    }
    if let Some(l) = cfg.long_context {
        if l.above_input_tokens == 0 {
            return Err(bad("longContext.aboveInputTokens"));
        }
        if l.max_concurrency == 0 {
            return Err(bad("longContext.maxConcurrency"));
        }
    }
    Ok(())
}

/// The pool limits as this replica enforces them.
#[derive(Debug, Default)]
pub(crate) struct PoolGate {
    /// Model slots (this replica's share).
    slots: Option<u64>,
    /// (aboveInputTokens, maxConcurrency as this replica's share).
    long: Option<(u64, u64)>,
    /// Long requests in flight.
    long_in_flight: u64,
}

fn share_of(n: u64, share: f64) -> u64 {
    ((n as f64 * share).ceil() as u64).max(1)
}

impl PoolGate {
    pub(crate) fn new(cfg: &GatewayConfig, share: f64) -> PoolGate {
        PoolGate {
            slots: cfg.concurrency.map(|c| share_of(c.max, share)),
            long: cfg
                .long_context
                .map(|l| (l.above_input_tokens, share_of(l.max_concurrency, share))),
            long_in_flight: 0,
        }
    }

    /// The long-context threshold, when the pool has one.
    pub(crate) fn long_above(&self) -> Option<u64> {
        self.long.map(|l| l.0)
    }

    /// A long request passed.
    pub(crate) fn took(&mut self, long_context: bool) {
        if long_context {
            self.long_in_flight += 1;
        }
    }

    /// A long request ended: whether a place was taken (and is free now).
    pub(crate) fn release_long(&mut self) -> bool {
        let had = self.long_in_flight > 0;
        self.long_in_flight = self.long_in_flight.saturating_sub(1);
        had
    }

    /// Whether every long place is taken.
    pub(crate) fn long_full(&self) -> bool {
        self.long.is_some_and(|(_, max)| self.long_in_flight >= max)
    }

    /// The requests in flight keep their places across a config swap.
    pub(crate) fn carry_into(&self, next: &mut PoolGate) {
        next.long_in_flight = self.long_in_flight;
    }
}

impl Core {
    /// Whether a model slot is free with `taken` passes of this call not
    /// counted in flight yet.
    pub(crate) fn model_slot_free(&self, taken: u64) -> bool {
        self.pool
            .slots
            .is_none_or(|max| self.pressure.in_flight().saturating_add(taken) < max)
    }

    /// The pool limit an arrival would break now, if any.
    pub(crate) fn pool_limit(&self, long_context: bool) -> Option<Limit> {
        if !self.model_slot_free(0) {
            return Some(Limit::ModelSlots);
        }
        (long_context && self.pool.long_full()).then_some(Limit::LongContext)
    }

    /// The expected wait for a place under `limit` for lane `li`: model
    /// slots free at the rate requests finish; long places at the rate
    /// long requests finish, each taking the lane's expected service time.
    pub(crate) fn pool_wait(&self, limit: Limit, li: usize, now: f64) -> i64 {
        let service = self.lanes[li].expected_service.max(1.0);
        let seconds = match limit {
            Limit::ModelSlots => {
                let rate = self.pressure.drain_rate(now);
                if rate > 0.0 { 1.0 / rate } else { service }
            }
            _ => service / self.pool.long.map_or(1, |l| l.1) as f64,
        };
        whole(seconds)
    }

    /// Refuses the waiting long request at the front of lane `li` (the
    /// long places are taken), so the requests behind it are not held.
    pub(crate) fn refuse_long(
        &mut self,
        li: usize,
        tenant: TenantId,
        key: Key,
        now: f64,
    ) -> (Ticket, Resolution) {
        let retry_after = self.pool_wait(Limit::LongContext, li, now);
        let lane = &mut self.lanes[li];
        let w = lane.queue.remove(tenant, key).expect("the front exists");
        self.tickets.remove(&w.ticket);
        let refusal = Refusal {
            lane: li,
            attempt: w.attempt,
            outcome: Outcome::RejectedOverload,
            limit: Limit::LongContext,
            retry_after_seconds: Some(retry_after),
            inside_floor: lane.inside_floor(),
        };
        (w.ticket, Resolution::Refuse(refusal))
    }

    /// Whether a finished request freed the model slot a waiting request
    /// is held for.
    pub(crate) fn model_slot_freed_for_waiting(&self) -> bool {
        self.pool.slots.is_some()
            && self.model_slot_free(0)
            && self.lanes.iter().any(|l| !l.queue.is_empty())
    }
}

#[cfg(test)]
#[path = "pool_limits_tests.rs"]
mod tests;
