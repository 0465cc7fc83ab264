//! The core's side of the fleet's shared spare capacity: the pool's
//! spare-capacity bucket leased from the shared store like a lane's bucket
//! (`fleet_core`). While leased, this replica's spare bucket does not
//! refill on its own: every unit it spends came from the fleet's spare
//! bucket, which runs at the pool's whole spare rate (the replica's share
//! times the fleet's size), so one replica with all the traffic of a lane
//! that may use spare gets the fleet's whole spare, not a 1/N of it. Back on
//! the local share it refills at 1/N again and keeps at most its local size.
//! No I/O here.

use crate::core::Core;
use crate::fleet_lease::{FleetLimits, LEASE_SECONDS, lease_size};

/// The spare bucket as the lease task sees it (in work units).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpareNeed {
    /// The pool's spare rate and bucket size for the whole fleet.
    pub limits: FleetLimits,
    /// Whole units this replica holds now.
    pub held: u64,
    /// The units it should hold for the next lease period.
    pub want: u64,
}

impl SpareNeed {
    /// Units to take from the fleet's spare bucket now.
    pub fn to_take(&self) -> u64 {
        self.want.saturating_sub(self.held)
    }

    /// Units to give back now: what is held beyond twice the need (the
    /// draw on spare fell), down to the need.
    pub fn to_give_back(&self) -> u64 {
        if self.held > self.want.saturating_mul(2) {
            self.held - self.want
        } else {
            0
        }
    }
}

impl Core {
    /// The spare bucket's fleet-wide limits, what this replica holds of it
    /// and what it should hold for its recent draw on spare; `None` when
    /// there is no spare capacity (unknown capacity, or the lanes claim
    /// it all) or it is not leased.
    pub fn spare_lease_need(&self, now: f64) -> Option<SpareNeed> {
        let spare = &self.spare;
        if !spare.leased || spare.rate <= 0.0 {
            return None;
        }
        let rate = spare.rate / self.share();
        // At least two lease periods deep, as a lane's fleet bucket.
        let limits = FleetLimits {
            rate,
            burst: (spare.cap / self.share()).max(rate * LEASE_SECONDS * 2.0),
        };
        // At least the costliest request that may use spare, or it never
        // gets enough.
        let want = lease_size(limits, spare.demand.rate(now), 0).max(spare.largest.ceil() as u64);
        Some(SpareNeed {
            limits,
            held: spare.tokens.max(0.0).floor() as u64,
            want,
        })
    }

    /// Units of a lease taken from the fleet's spare bucket: `Some(true)`
    /// when a lane that may use spare has someone waiting (poll), `None`
    /// when spare is not leased (any more): the caller gives them back.
    pub fn add_spare_lease(&mut self, units: u64) -> Option<bool> {
        if !self.spare.leased || self.spare.rate <= 0.0 {
            return None;
        }
        self.spare.tokens += units as f64;
        Some(
            self.lanes
                .iter()
                .any(|l| l.draws_on_spare() && !l.queue.is_empty()),
        )
    }

    /// Takes up to `units` whole units back out of the leased spare bucket,
    /// to give back to the fleet; returns how many.
    pub fn take_back_spare(&mut self, units: u64) -> u64 {
        if !self.spare.leased {
            return 0;
        }
        let n = (self.spare.tokens.max(0.0).floor() as u64).min(units);
        self.spare.tokens -= n as f64;
        n
    }

    /// Leased or the local share, for the spare bucket (see
    /// [`Core::set_leased`]): leaving keeps at most the local size (what
    /// accrues from then on is the local share's).
    pub(crate) fn set_spare_leased(&mut self, leased: bool) {
        self.spare.leased = leased && self.spare.rate > 0.0;
        self.spare.tokens = self.spare.tokens.min(self.spare.cap);
    }
}

#[cfg(test)]
mod tests {
    use crate::fleet_lease::FleetBucket;
    use crate::tests::{config, lane, req};
    use crate::{Core, Verdict};
    use proptest::prelude::*;

    /// Capacity 100 units/s, one lane of 1 req/s that may use spare: 94
    /// spare for the fleet, a third of it (31.33) for a replica of three.
    fn replica() -> Core {
        let mut l = lane("a", 1.0, 1);
        l.spare_capacity = true;
        l.queue.ttl_seconds = 0;
        Core::new(config(vec![l]), 1.0 / 3.0, 0.0, 1_000_000.0).unwrap()
    }

    fn passes(core: &mut Core, now: f64, n: usize) -> usize {
        (0..n)
            .filter(|_| matches!(core.admit(&req("a"), now), Verdict::Pass(_)))
            .count()
    }

    #[test]
    fn leased_spare_spends_only_what_its_leases_brought_at_the_fleets_size() {
        let mut core = replica();
        assert_eq!(core.spare_lease_need(0.0), None, "not leased yet");
        core.set_leased(true);
        let need = core.spare_lease_need(0.0).unwrap();
        assert!((need.limits.rate - 94.0).abs() < 1e-9, "{need:?}");
        assert!((need.limits.burst - 94.0).abs() < 1e-9, "{need:?}");
        // Its own token, the local spare's 31, then nothing accrues.
        assert_eq!(passes(&mut core, 0.0, 100), 32);
        assert_eq!(passes(&mut core, 5.0, 100), 0, "no refill while leased");
        assert_eq!(core.add_spare_lease(40), Some(false));
        assert_eq!(passes(&mut core, 5.0, 100), 40, "the lease, all of it");
    }

    #[test]
    fn a_spare_lease_follows_the_draw_on_spare_and_the_excess_goes_back() {
        let mut core = replica();
        core.set_leased(true);
        passes(&mut core, 0.0, 32);
        // 50 units a second asked of spare.
        for i in 0..50 {
            passes(&mut core, 1.0 + f64::from(i) / 50.0, 1);
        }
        let need = core.spare_lease_need(2.0).unwrap();
        assert_eq!((need.held, need.want), (0, 10), "0.2 s of 50 a second");
        assert_eq!(core.add_spare_lease(30), Some(false));
        let need = core.spare_lease_need(2.0).unwrap();
        assert_eq!((need.to_take(), need.to_give_back()), (0, 20));
        assert_eq!(core.take_back_spare(20), 20);
        assert_eq!(core.take_back_spare(100), 10, "never more than it holds");
    }

    #[test]
    fn back_on_the_local_share_spare_keeps_its_local_size_and_takes_no_lease() {
        let mut core = replica();
        core.set_leased(true);
        passes(&mut core, 0.0, 32);
        assert_eq!(core.add_spare_lease(90), Some(false));
        core.set_leased(false);
        assert_eq!(core.add_spare_lease(5), None, "the caller gives it back");
        assert_eq!(core.take_back_spare(5), 0);
        assert_eq!(core.spare_lease_need(0.0), None);
        assert_eq!(passes(&mut core, 0.0, 100), 31, "the local size, not 90");
    }

    #[test]
    fn a_spare_lease_wakes_a_waiting_request_of_a_lane_that_may_use_it() {
        let mut l = lane("a", 1.0, 1);
        l.spare_capacity = true;
        let mut core = Core::new(config(vec![l]), 1.0 / 3.0, 0.0, 1e6).unwrap();
        core.set_leased(true);
        passes(&mut core, 0.0, 32);
        assert!(matches!(core.admit(&req("a"), 0.0), Verdict::Queued { .. }));
        assert!(core.poll(0.5).is_empty(), "nothing accrued by itself");
        assert_eq!(core.add_spare_lease(1), Some(true));
        assert_eq!(core.poll(0.5).len(), 1);
    }

    #[test]
    fn no_spare_no_lease() {
        let mut l = lane("a", 1.0, 1);
        l.spare_capacity = true;
        let mut cfg = config(vec![l]);
        cfg.capacity_units_per_second = None;
        let mut core = Core::new(cfg, 1.0 / 3.0, 0.0, 1e6).unwrap();
        core.set_leased(true);
        assert_eq!(core.spare_lease_need(0.0), None);
        assert_eq!(core.add_spare_lease(3), None);
    }

    /// What one replica does at one moment.
    #[derive(Clone, Debug)]
    enum Step {
        /// A lease round: the excess given back (if asked), the shortfall
        /// taken.
        Round { give_back: bool },
        /// Everything held goes back.
        GiveAll,
        /// Requests arrive.
        Admit(usize),
    }

    fn step() -> impl Strategy<Value = (usize, f64, Step)> {
        let s = prop_oneof![
            any::<bool>().prop_map(|give_back| Step::Round { give_back }),
            Just(Step::GiveAll),
            (0usize..60).prop_map(Step::Admit),
        ];
        (0usize..3, 0.0f64..0.3, s)
    }

    proptest! {
        /// Over any interleaving of three replicas leasing the pool's
        /// spare, giving it back and admitting, the fleet's spare bucket
        /// never grants more than its rate over the time plus one burst
        /// (net of what came back), and the fleet never admits more than
        /// that plus what the replicas held locally when they went over to
        /// leases.
        #[test]
        fn the_fleet_never_takes_more_spare_than_its_rate_plus_one_burst(
            steps in proptest::collection::vec(step(), 1..300),
        ) {
            let mut cores: Vec<Core> = (0..3).map(|_| replica()).collect();
            let mut local_at_start = 0u64;
            for c in &mut cores {
                c.set_leased(true);
                local_at_start += c.spare_lease_need(0.0).unwrap().held + 1;
            }
            let limits = cores[0].spare_lease_need(0.0).unwrap().limits;
            let mut fleet = FleetBucket::full(limits, 0.0);
            let (mut now, mut admitted, mut net_taken) = (0.0, 0u64, 0i64);
            for (r, dt, s) in &steps {
                now += dt;
                let core = &mut cores[*r];
                match s {
                    Step::Round { give_back } => {
                        let need = core.spare_lease_need(now).unwrap();
                        if *give_back {
                            let back = core.take_back_spare(need.to_give_back());
                            fleet.give_back(limits, now, back);
                            net_taken -= back as i64;
                        }
                        let got = fleet.take(limits, now, need.to_take());
                        net_taken += got as i64;
                        prop_assert!(core.add_spare_lease(got).is_some());
                    }
                    Step::GiveAll => {
                        let back = core.take_back_spare(u64::MAX);
                        fleet.give_back(limits, now, back);
                        net_taken -= back as i64;
                    }
                    Step::Admit(n) => admitted += passes(core, now, *n) as u64,
                }
                let most = limits.rate * now + limits.burst;
                prop_assert!(net_taken as f64 <= most + 1e-6, "took {} by {}", net_taken, now);
                prop_assert!(
                    admitted as f64 <= most + local_at_start as f64 + 1e-6,
                    "admitted {} by {}", admitted, now
                );
            }
        }
    }
}
