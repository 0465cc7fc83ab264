//! A fleet-wide count of slots (a tenant's `maxConcurrency`, the pool's
//! `inFlight.stopAt`) leased to the gateway replicas: the arithmetic the
//! shared store's slot script does (against the store's clock), and what a
//! replica asks of it.
//!
//! Each replica **holds** some of the slots and starts a request only on a
//! slot it holds; the store never lets the replicas' holdings add up past
//! the maximum. A holding is a lease: a replica renews it at least every
//! [`SLOT_RENEW_SECONDS`], and one that stops renewing (it crashed, or it
//! lost the store) loses its holding after [`SLOT_LEASE_SECONDS`], so its
//! slots come back to the others. Calls move a holding by a **delta** (take
//! n, give back n), so calls in flight at once from one replica add up
//! instead of overwriting each other. Each call also says how many of the
//! replica's requests wait short of a slot, and the answer says how many of
//! the others' do: a replica keeps a spare slot only while nobody else
//! waits for one.

use std::collections::BTreeMap;

/// How long a holding lives without a renewal, in seconds.
pub const SLOT_LEASE_SECONDS: f64 = 5.0;
/// How often a replica renews a holding it keeps unchanged, in seconds.
pub const SLOT_RENEW_SECONDS: f64 = 1.0;

/// What a slot call does to the caller's holding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotOp {
    /// Take up to this many more (fewer when the fleet has fewer free).
    Take(u64),
    /// Give back this many (never below zero).
    GiveBack(u64),
}

/// The store's answer to a slot call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotGrant {
    /// Slots taken by this call (0 for a give-back).
    pub granted: u64,
    /// Requests of the other replicas waiting short of a slot.
    pub others_waiting: u64,
    /// Slots the other replicas hold.
    pub others_held: u64,
}

/// One replica's holding as the store keeps it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Holding {
    held: u64,
    waiting: u64,
    expires: f64,
}

/// The store's record of one count (the slot script does exactly this).
#[derive(Clone, Debug, Default)]
pub struct FleetSlots {
    holders: BTreeMap<String, Holding>,
}

impl FleetSlots {
    /// One call of `replica` at `now`: `op` on its holding under `max`,
    /// with `waiting` of its requests short of a slot; the holding lives
    /// `lease` seconds from now.
    pub fn call(
        &mut self,
        replica: &str,
        op: SlotOp,
        waiting: u64,
        max: u64,
        now: f64,
        lease: f64,
    ) -> SlotGrant {
        self.holders.retain(|_, h| h.expires > now);
        let (others, others_waiting) = self
            .holders
            .iter()
            .filter(|(r, _)| r.as_str() != replica)
            .fold((0u64, 0u64), |(h, w), (_, o)| (h + o.held, w + o.waiting));
        let mine = self.holders.get(replica).map_or(0, |h| h.held);
        let (held, granted, waiting) = match op {
            SlotOp::Take(n) => {
                let free = max.saturating_sub(others.saturating_add(mine));
                let granted = n.min(free);
                (mine + granted, granted, waiting.max(n - granted))
            }
            SlotOp::GiveBack(n) => (mine.saturating_sub(n), 0, waiting),
        };
        if held == 0 && waiting == 0 {
            self.holders.remove(replica);
        } else {
            let expires = now + lease;
            let h = Holding {
                held,
                waiting,
                expires,
            };
            self.holders.insert(replica.to_owned(), h);
        }
        SlotGrant {
            granted,
            others_waiting,
            others_held: others,
        }
    }

    /// Slots held by every replica whose lease has not run out at `now`.
    pub fn held(&self, now: f64) -> u64 {
        self.holders
            .values()
            .filter(|h| h.expires > now)
            .map(|h| h.held)
            .sum()
    }
}

/// What a replica wants to hold of one count: what it uses, what waits on
/// it, and, while it uses some, one spare for the next arrival unless
/// another replica's requests wait for a slot. An idle count holds nothing.
pub fn slots_wanted(in_use: u64, waiting: u64, others_waiting: bool) -> u64 {
    let busy = in_use + waiting;
    busy + u64::from(busy > 0 && !others_waiting)
}

/// The call that brings a holding of `held` to `want`, if any.
pub fn slot_change(held: u64, want: u64) -> Option<SlotOp> {
    match want.cmp(&held) {
        std::cmp::Ordering::Greater => Some(SlotOp::Take(want - held)),
        std::cmp::Ordering::Less => Some(SlotOp::GiveBack(held - want)),
        std::cmp::Ordering::Equal => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn holdings_never_add_up_past_the_maximum() {
        let mut s = FleetSlots::default();
        assert_eq!(s.call("a", SlotOp::Take(3), 0, 4, 0.0, 5.0).granted, 3);
        let b = s.call("b", SlotOp::Take(3), 0, 4, 0.0, 5.0);
        assert_eq!(
            b,
            SlotGrant {
                granted: 1,
                others_waiting: 0,
                others_held: 3,
            }
        );
        let a = s.call("a", SlotOp::Take(0), 0, 4, 0.1, 5.0);
        assert_eq!(a.others_waiting, 2, "b asked for 2 it did not get");
        s.call("a", SlotOp::GiveBack(2), 0, 4, 0.2, 5.0);
        assert_eq!(s.call("b", SlotOp::Take(2), 0, 4, 0.3, 5.0).granted, 2);
        assert_eq!(s.held(0.3), 4);
        assert_eq!(s.call("c", SlotOp::Take(1), 0, 4, 0.3, 5.0).granted, 0);
    }

    #[test]
    fn a_replica_that_stops_renewing_loses_its_slots_after_the_lease() {
        let mut s = FleetSlots::default();
        assert_eq!(s.call("dead", SlotOp::Take(4), 0, 4, 0.0, 5.0).granted, 4);
        assert_eq!(s.call("b", SlotOp::Take(1), 0, 4, 4.9, 5.0).granted, 0);
        assert_eq!(s.call("b", SlotOp::Take(1), 0, 4, 5.0, 5.0).granted, 1);
        assert_eq!(s.held(5.0), 1);
    }

    #[test]
    fn a_replica_keeps_a_spare_only_while_nobody_else_waits() {
        assert_eq!(slots_wanted(2, 1, false), 4);
        assert_eq!(slots_wanted(2, 1, true), 3);
        assert_eq!(slots_wanted(0, 0, true), 0);
        assert_eq!(slots_wanted(0, 0, false), 0, "idle: nothing held");
        assert_eq!(slot_change(2, 4), Some(SlotOp::Take(2)));
        assert_eq!(slot_change(4, 1), Some(SlotOp::GiveBack(3)));
        assert_eq!(slot_change(3, 3), None);
    }

    /// What one replica does at one moment.
    #[derive(Clone, Debug)]
    enum Act {
        /// A request arrives; without a held slot free it asks for one.
        Arrive,
        /// One of its requests finishes.
        Finish,
        /// Its round: renew, take for its waiting, give back its excess.
        Round,
    }

    fn act() -> impl Strategy<Value = (usize, Act, f64)> {
        let a = prop_oneof![Just(Act::Arrive), Just(Act::Finish), Just(Act::Round)];
        (0usize..4, a, 0.0f64..0.4)
    }

    /// Four replicas' view of one count.
    #[derive(Default)]
    struct Fleet {
        held: [u64; 4],
        used: [u64; 4],
        waiting: [u64; 4],
        others: [u64; 4],
    }

    const NAMES: [&str; 4] = ["a", "b", "c", "d"];

    impl Fleet {
        /// A slot call; what it grants goes first to the waiting.
        fn call(&mut self, s: &mut FleetSlots, i: usize, op: SlotOp, max: u64, now: f64) {
            if let SlotOp::GiveBack(n) = op {
                self.held[i] -= n;
            }
            let g = s.call(NAMES[i], op, self.waiting[i], max, now, SLOT_LEASE_SECONDS);
            self.held[i] += g.granted;
            self.others[i] = g.others_waiting;
            let start = self.waiting[i].min(self.held[i].saturating_sub(self.used[i]));
            self.waiting[i] -= start;
            self.used[i] += start;
        }

        /// Every replica's round: renew, take for the waiting, give back
        /// the excess.
        fn round(&mut self, s: &mut FleetSlots, max: u64, now: f64) {
            for i in 0..4 {
                let want = slots_wanted(self.used[i], self.waiting[i], self.others[i] > 0);
                let op = slot_change(self.held[i], want).unwrap_or(SlotOp::Take(0));
                self.call(s, i, op, max, now);
            }
        }
    }

    proptest! {
        /// Over any interleaving of replicas that renew in time, taking
        /// and giving back slots as their requests come and go, requests
        /// in flight over the fleet never pass the maximum, and a replica
        /// never holds fewer slots than it uses.
        #[test]
        fn the_fleet_never_has_more_in_flight_than_the_maximum(
            max in 1u64..12,
            acts in proptest::collection::vec(act(), 1..400),
        ) {
            let mut s = FleetSlots::default();
            let mut f = Fleet::default();
            let (mut now, mut last_round) = (0.0, 0.0);
            for (r, a, dt) in &acts {
                let r = *r;
                now += dt;
                if now - last_round >= SLOT_RENEW_SECONDS {
                    f.round(&mut s, max, now);
                    last_round = now;
                }
                match a {
                    Act::Arrive if f.used[r] < f.held[r] => f.used[r] += 1,
                    Act::Arrive => {
                        f.waiting[r] += 1;
                        f.call(&mut s, r, SlotOp::Take(1), max, now);
                    }
                    Act::Finish if f.used[r] > 0 => {
                        f.used[r] -= 1;
                        if f.waiting[r] > 0 {
                            f.waiting[r] -= 1;
                            f.used[r] += 1;
                        }
                    }
                    Act::Finish => {}
                    Act::Round => {
                        f.round(&mut s, max, now);
                        last_round = now;
                    }
                }
                prop_assert!(f.used.iter().sum::<u64>() <= max, "{:?} of {}", f.used, max);
                prop_assert!(s.held(now) <= max);
                for i in 0..4 {
                    prop_assert!(f.used[i] <= f.held[i], "replica {}: {:?} {:?}", i, f.used, f.held);
                }
            }
        }
    }
}
