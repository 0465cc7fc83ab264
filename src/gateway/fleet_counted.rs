//! How much of the fleet shares its budgets through the store: once a
//! second a shared replica notes itself in the store and counts the
//! replicas noted (`fleet_store_replicas`). With k of N replicas cut off
//! from the store, each of them enforces its 1/N share alone; the shared
//! buckets then run at (N - k)/N of the lanes' rates, so the fleet as a
//! whole stays at the rate instead of the rate × (1 + k/N).

use lanes::fleet_core::LeaseNeed;
use lanes::fleet_spare::SpareNeed;

use super::fleet_metrics::StoreOp;
use super::fleet_share::{Fleet, FleetHost, locked};
use super::fleet_store::FleetStore;

/// Seconds between two counts.
const EVERY: f64 = 1.0;

impl Fleet {
    /// Notes this replica and counts the sharing ones, when due (at once
    /// after a fall back).
    pub(super) async fn count_replicas(
        &self,
        gw: &impl FleetHost,
        store: &FleetStore,
    ) -> Result<(), (StoreOp, String)> {
        let now = gw.now();
        if now < locked(&self.counted).due {
            return Ok(());
        }
        let Some((profile, share)) = gw.with_core(|c| (c.config().profile.clone(), c.share()))
        else {
            return Ok(());
        };
        let alive = store
            .heartbeat(&profile, &self.replica())
            .await
            .map_err(|e| (StoreOp::Heartbeat, e.to_string()))?;
        self.metrics.call(StoreOp::Heartbeat, true);
        let fraction = sharing_fraction(alive, share);
        *locked(&self.counted) = super::fleet_share::Counted {
            fraction,
            due: now + EVERY,
        };
        Ok(())
    }

    /// The leases' limits for the replicas sharing now: each lane's and
    /// the spare bucket's rate times the fraction sharing.
    pub(super) fn scale_to_sharing(&self, lanes: &mut [LeaseNeed], spare: Option<&mut SpareNeed>) {
        let f = locked(&self.counted).fraction;
        for n in lanes {
            n.limits.rate *= f;
        }
        if let Some(s) = spare {
            s.limits.rate *= f;
        }
    }
}

/// `alive` replicas noted of a fleet whose replicas each have `share`
/// (1/N): their fraction of the fleet, at least this replica's own share
/// and at most the whole.
pub(super) fn sharing_fraction(alive: u64, share: f64) -> f64 {
    (alive.max(1) as f64 * share).clamp(share, 1.0)
}

#[cfg(test)]
mod tests {
    use super::sharing_fraction;

    #[test]
    fn the_fraction_is_the_replicas_counted_over_the_fleet_within_bounds() {
        let third = 1.0 / 3.0;
        assert!((sharing_fraction(3, third) - 1.0).abs() < 1e-12);
        assert!((sharing_fraction(2, third) - 2.0 / 3.0).abs() < 1e-12);
        // More noted than the fleet has (a fallen-back replica's old note,
        // an endpoint count that lags): never more than the whole.
        assert!((sharing_fraction(5, third) - 1.0).abs() < 1e-12);
        // Never less than its own share, even if the count were 0.
        assert!((sharing_fraction(0, third) - third).abs() < 1e-12);
    }
}
