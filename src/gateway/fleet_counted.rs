//! How much of the fleet shares its budgets through the store: once a
//! second a shared replica notes itself in the store and counts the
//! replicas noted (`fleet_store_replicas`). With k of N replicas cut off
//! from the store, each of them enforces its 1/N share alone; the shared
//! buckets then run at (N - k)/N of the lanes' rates, so the fleet as a
//! whole stays at the rate instead of the rate × (1 + k/N). Slot maxima
//! (a tenant's `maxConcurrency`, the pool's `stopAt`) leave room the same
//! way: the sharing replicas hold at most the maximum less what the k
//! cut-off replicas may each hold on their local share.

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
        *locked(&self.counted) = super::fleet_share::Counted {
            fraction: sharing_fraction(alive, share),
            cut_off: cut_off(alive, share),
            share,
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

    /// The most slots the sharing replicas may hold together of a count
    /// whose fleet-wide maximum is `max`.
    pub(super) fn sharing_slot_max(&self, max: u64) -> u64 {
        let c = locked(&self.counted);
        slot_max(max, c.cut_off, c.share)
    }
}

/// Replicas of the fleet (1/`share` of them) not among the `alive` noted.
fn cut_off(alive: u64, share: f64) -> u64 {
    let fleet = (1.0 / share).round() as u64;
    fleet.saturating_sub(alive.max(1))
}

/// A count's maximum `max` less what `cut_off` replicas may each hold on
/// their local share (`max` × `share` rounded up, at least 1, as the core
/// enforces it there); none left when they may hold it all.
fn slot_max(max: u64, cut_off: u64, share: f64) -> u64 {
    let local = ((max as f64 * share).ceil() as u64).max(1);
    max.saturating_sub(cut_off.saturating_mul(local))
}

/// `alive` replicas noted of a fleet whose replicas each have `share`
/// (1/N): their fraction of the fleet, at least this replica's own share
/// and at most the whole.
pub(super) fn sharing_fraction(alive: u64, share: f64) -> f64 {
    (alive.max(1) as f64 * share).clamp(share, 1.0)
}

#[cfg(test)]
mod tests {
    use super::{cut_off, sharing_fraction, slot_max};

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

    #[test]
    fn the_sharing_replicas_leave_the_cut_off_ones_their_local_slots() {
        let third = 1.0 / 3.0;
        assert_eq!(cut_off(3, third), 0);
        assert_eq!(cut_off(2, third), 1);
        assert_eq!(cut_off(7, third), 0);
        assert_eq!(cut_off(0, third), 2, "this replica counts itself");
        // All sharing: the whole maximum.
        assert_eq!(slot_max(4, 0, third), 4);
        // One of three cut off holds up to ceil(4 / 3) = 2 on its own.
        assert_eq!(slot_max(4, 1, third), 2);
        assert_eq!(slot_max(8, 1, third), 5);
        // Two cut off may hold it all: none left for the one sharing.
        assert_eq!(slot_max(4, 2, third), 0);
        // A local share is at least one slot.
        assert_eq!(slot_max(2, 1, 0.1), 1);
    }
}
