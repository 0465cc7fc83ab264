//! The core's side of the pool's in-flight watermarks across the fleet:
//! while the replica enforces the fleet's shared budgets, `inFlight.stopAt`
//! is a count of slots leased to the replicas ([`crate::fleet_slots`]) and
//! this replica's in-flight limit is the slots it holds of it, not its 1/N
//! share; `conserveAt` and `resumeBelow` are judged on the fleet's in
//! flight (this replica's, and the slots the others hold). The gateway
//! takes and gives back slots around the core, as for tenants.
//!
//! Back on the local share, the limit and the watermarks are the replica's
//! 1/N share again.

use crate::core::Core;
use crate::pressure::FleetSlotsHeld;

/// The pool's slots on this replica, as the lease round sees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolNeed {
    /// The profile (the store's key).
    pub profile: String,
    /// `inFlight.stopAt` for the whole fleet.
    pub max: u64,
    /// Slots in use here: requests in flight and the reserve kept for the
    /// lanes never shed.
    pub in_use: u64,
    /// The slots this replica holds.
    pub held: u64,
    /// Requests of the sheddable lanes waiting here with a token (ready
    /// but for a slot).
    pub waiting: u64,
}

impl PoolNeed {
    /// Requests waiting short of a slot (beyond the free held ones).
    pub fn short(&self) -> u64 {
        self.waiting
            .saturating_sub(self.held.saturating_sub(self.in_use))
    }
}

impl Core {
    /// The pool's slots leased from the fleet (or its local share).
    pub(crate) fn set_pool_leased(&mut self, leased: bool) {
        match (leased, self.pressure.fleet.is_some()) {
            (true, false) => self.pressure.fleet = Some(FleetSlotsHeld::default()),
            (false, true) => self.pressure.fleet = None,
            _ => {}
        }
    }

    /// The pool's need, when its slots are leased (and it has `inFlight`).
    pub fn pool_need(&self) -> Option<PoolNeed> {
        let held = self.pressure.fleet?.held;
        let f = self.config.in_flight.as_ref()?;
        let waiting: f64 = self
            .lanes
            .iter()
            .filter(|l| l.cfg.sheddable)
            .map(|l| (l.queue.len() as f64).min(l.bucket.tokens.floor().max(0.0)))
            .sum();
        Some(PoolNeed {
            profile: self.config.profile.clone(),
            max: u64::try_from(f.stop_at).unwrap_or(0),
            in_use: self.pressure.in_flight() + self.reserve,
            held,
            waiting: waiting as u64,
        })
    }

    /// The pool's need when an arrival of a sheddable lane would find no
    /// free slot held here (None: it has one, or nothing is leased).
    pub fn pool_short(&self) -> Option<PoolNeed> {
        self.pool_need().filter(|n| n.in_use + n.waiting >= n.held)
    }

    /// `n` slots taken from the fleet, the others holding `others_held`:
    /// `Some(true)` when a waiting request may take one now (poll), `None`
    /// when the pool is not leased (any more): the caller gives them back.
    pub fn add_pool_slots(&mut self, n: u64, others_held: u64) -> Option<bool> {
        let fleet = self.pressure.fleet.as_mut()?;
        fleet.held = fleet.held.saturating_add(n);
        fleet.others = others_held;
        let waiting = self
            .lanes
            .iter()
            .any(|l| l.cfg.sheddable && !l.queue.is_empty());
        Some(n > 0 && waiting && self.free_slots(0) > 0)
    }

    /// Takes up to `n` of the held slots back (not those in use or kept in
    /// reserve), to give back to the fleet; returns how many.
    pub fn take_back_pool_slots(&mut self, n: u64) -> u64 {
        let in_use = self.pressure.in_flight() + self.reserve;
        let Some(fleet) = self.pressure.fleet.as_mut() else {
            return 0;
        };
        let back = fleet.held.saturating_sub(in_use).min(n);
        fleet.held -= back;
        back
    }
}

#[cfg(test)]
mod tests {
    use crate::config::InFlight;
    use crate::tests::{config, lane, req};
    use crate::{Core, Pressure, Verdict};

    /// One sheddable lane; the fleet's `stopAt` 30, `conserveAt` 20, on a
    /// replica of three (10 and 6.67 on its share).
    fn core() -> Core {
        let mut l = lane("a", 1000.0, 1000);
        l.queue.ttl_seconds = 5;
        let mut cfg = config(vec![l]);
        cfg.in_flight = Some(InFlight {
            conserve_at: 20,
            stop_at: 30,
            resume_below: 15,
            resume_after_stable_seconds: None,
        });
        Core::new(cfg, 1.0 / 3.0, 0.0, 1e6).unwrap()
    }

    fn pass(c: &mut Core, now: f64) -> bool {
        let ok = matches!(c.admit(&req("a"), now), Verdict::Pass(_));
        if ok {
            c.started(now);
        }
        ok
    }

    #[test]
    fn leased_the_limit_is_the_slots_held_and_the_watermarks_the_fleets() {
        let mut c = core();
        assert_eq!(c.in_flight_limit(), Some(10), "a third of 30");
        c.set_leased(true);
        assert_eq!(c.in_flight_limit(), Some(0));
        let need = c.pool_short().expect("no slot held");
        assert_eq!((need.max, need.held, need.in_use), (30, 0, 0));
        assert!(!pass(&mut c, 0.0), "no slot held: it waits");
        assert_eq!(c.add_pool_slots(25, 0), Some(true));
        assert_eq!(c.poll(0.0).len(), 1);
        c.started(0.0);
        for _ in 0..18 {
            assert!(pass(&mut c, 0.0));
        }
        assert_eq!(c.pressure(), Pressure::Normal, "19 of the fleet's 20");
        assert!(pass(&mut c, 0.0));
        assert_eq!(
            c.pressure(),
            Pressure::Conserve,
            "20: the fleet's conserveAt"
        );
        // The others hold 6: 26 over the fleet.
        assert_eq!(c.add_pool_slots(0, 6), Some(false));
        for _ in 0..5 {
            assert!(pass(&mut c, 0.0));
        }
        assert!(!pass(&mut c, 0.0), "the 25 held are all in flight");
        assert_eq!(c.take_back_pool_slots(9), 0, "none free");
        c.finished(0.1, 0.1);
        c.finished(0.1, 0.1);
        assert_eq!(c.pool_need().unwrap().waiting, 1);
        assert_eq!(c.take_back_pool_slots(9), 2);
        c.set_leased(false);
        assert_eq!(c.in_flight_limit(), Some(10), "the local share again");
        assert_eq!(c.pool_need(), None);
        assert_eq!(c.add_pool_slots(1, 0), None);
    }
}
