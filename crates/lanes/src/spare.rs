//! The pool's spare capacity: what no lane's rate or floor claims of
//! `capacityUnitsPerSecond`, a shared bucket in work units (one second of it
//! deep) that lanes with `spareCapacity` draw on once their own bucket is
//! empty. Unknown capacity means no spare.
//!
//! With a shared store the bucket is **leased** (`fleet_spare`): it does not
//! refill on its own, every unit it spends came from the fleet's spare
//! bucket, which runs at the whole pool's spare rate, not the 1/N share.

use crate::bucket::UseMeter;
use crate::config::{GatewayConfig, Telemetry};

/// Spare capacity is what the lanes' rates and floors leave of this share of
/// the pool's capacity.
pub const SPARE_UTILIZATION: f64 = 0.95;

/// The spare-capacity bucket (this replica's share).
#[derive(Debug, Default)]
pub(crate) struct Spare {
    /// Units per second.
    pub(crate) rate: f64,
    /// Bucket size in units.
    pub(crate) cap: f64,
    pub(crate) tokens: f64,
    last_refill: f64,
    /// The costliest request of a lane that may use it, in units.
    pub(crate) largest: f64,
    /// Units asked of it per second, granted or not (what a lease follows).
    pub(crate) demand: UseMeter,
    /// Filled by leases of the fleet's spare bucket, not by the clock.
    pub(crate) leased: bool,
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
            largest,
            demand: UseMeter::default(),
            leased: false,
        }
    }

    /// The tokens there would be at `now`.
    /// (Leased, only what its leases brought.)
    fn tokens_at(&self, now: f64) -> f64 {
        if self.leased {
            return self.tokens;
        }
        let elapsed = (now - self.last_refill).max(0.0);
        (self.tokens + self.rate * elapsed).min(self.cap)
    }

    /// (Leased, the clock moves on and nothing accrues: back on the local
    /// share it accrues from the last use.)
    pub(crate) fn refill(&mut self, now: f64) {
        self.tokens = self.tokens_at(now);
        self.last_refill = now.max(self.last_refill);
    }

    /// Takes `units` if they are there.
    pub(crate) fn take(&mut self, now: f64, units: f64) -> bool {
        self.refill(now);
        if self.rate > 0.0 {
            self.demand.add_n(now, units);
        }
        if self.rate > 0.0 && self.tokens + 1e-9 >= units {
            self.tokens -= units;
            true
        } else {
            false
        }
    }

    /// When `units` will be there (None: never, or, leased, not by
    /// itself: a lease wakes the waiting).
    pub(crate) fn ready_at(&self, now: f64, units: f64) -> Option<f64> {
        if self.rate <= 0.0 || units > self.cap + 1e-9 {
            return None;
        }
        if self.leased && self.tokens + 1e-9 < units {
            return None;
        }
        Some(now + ((units - self.tokens_at(now)).max(0.0) / self.rate))
    }
}
