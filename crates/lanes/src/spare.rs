//! The pool's spare capacity: what no lane's rate or floor claims of
//! `capacityUnitsPerSecond`, a shared bucket in work units (one second of it
//! deep) that lanes with `spareCapacity` draw on once their own bucket is
//! empty. Unknown capacity means no spare.

use crate::config::{GatewayConfig, Telemetry};

/// Spare capacity is what the lanes' rates and floors leave of this share of
/// the pool's capacity.
pub const SPARE_UTILIZATION: f64 = 0.95;

/// The spare-capacity bucket (this replica's share).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Spare {
    /// Units per second.
    pub(crate) rate: f64,
    /// Bucket size in units.
    pub(crate) cap: f64,
    pub(crate) tokens: f64,
    last_refill: f64,
}

impl Spare {
    /// `claimed`: the units per second the lanes' rates and floors claim;
    /// `largest`: the costliest request of a lane that may use spare.
    pub(crate) fn new(
        cfg: &GatewayConfig,
        claimed: f64,
        largest: f64,
        share: f64,
        now: f64,
    ) -> Spare {
        let capacity = match (cfg.telemetry, cfg.capacity_units_per_second) {
            (Telemetry::Known, Some(c)) if c.is_finite() && c > 0.0 => c * share,
            _ => return Spare::default(),
        };
        // Lanes using spare capacity never take the pool past
        // SPARE_UTILIZATION of its capacity: a pool kept at 100 % queues
        // without bound.
        let rate = capacity * SPARE_UTILIZATION - claimed;
        if rate <= 1e-6 {
            return Spare::default();
        }
        // One second of spare, and at least one request of the costliest
        // lane that may use it.
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

    pub(crate) fn refill(&mut self, now: f64) {
        self.tokens = self.tokens_at(now);
        self.last_refill = now.max(self.last_refill);
    }

    /// Takes `units` if they are there.
    pub(crate) fn take(&mut self, now: f64, units: f64) -> bool {
        self.refill(now);
        if self.rate > 0.0 && self.tokens + 1e-9 >= units {
            self.tokens -= units;
            true
        } else {
            false
        }
    }

    /// When `units` will be there (None: never).
    pub(crate) fn ready_at(&self, now: f64, units: f64) -> Option<f64> {
        if self.rate <= 0.0 || units > self.cap + 1e-9 {
            return None;
        }
        Some(now + ((units - self.tokens_at(now)).max(0.0) / self.rate))
    }
}
