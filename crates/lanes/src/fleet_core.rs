//! The core's side of the fleet's shared lane budgets: what the gateway's
//! lease task needs to know of each lane ([`Core::lease_needs`]) and how a
//! lease reaches a lane's bucket ([`Core::add_lease`], [`Core::take_back`]).
//! No I/O here: the gateway talks to the shared store and feeds the core.
//!
//! While leased ([`Core::set_leased`]), a lane's bucket does not refill on
//! its own: every token it spends came from the fleet's bucket, which runs
//! at the lane's whole rate (not the replica's 1/N share). Everything else
//! (queues, tenants, the in-flight limit) stays the replica's share; the
//! pool's spare capacity is leased too (`fleet_spare`). Back on the local share, the bucket refills at 1/N again
//! and keeps at most its local size of what it held.

use crate::core::Core;
use crate::fleet_lease::{FleetLimits, LEASE_SECONDS, lease_size};
use crate::id_hint::IdHint;
use crate::lane::Lane;
use crate::remembered::Seen;

/// One lane as the lease task sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseNeed {
    /// The lane's index in the config.
    pub lane: usize,
    /// The lane's name (the store's key).
    pub name: String,
    /// The lane's rate and burst for the whole fleet.
    pub limits: FleetLimits,
    /// Whole tokens this replica holds now.
    pub held: u64,
    /// The tokens it should hold for the next lease period.
    pub want: u64,
    /// The lane's deadline in seconds (how long a request id is kept).
    pub deadline_seconds: u64,
}

impl LeaseNeed {
    /// Tokens to take from the fleet's bucket now.
    pub fn to_take(&self) -> u64 {
        self.want.saturating_sub(self.held)
    }

    /// Tokens to give back now: what is held beyond twice the need (demand
    /// fell), down to the need.
    pub fn to_give_back(&self) -> u64 {
        if self.held > self.want.saturating_mul(2) {
            self.held - self.want
        } else {
            0
        }
    }
}

/// The rate a lane's queue drains at, to tell whether a wait can end in
/// time: its bucket's rate, or, leased, what its leases have let it admit
/// over the last second when that is more (all of a lane's traffic on this
/// replica drains at up to the fleet's rate, not at a 1/N share).
pub(crate) fn drain_rate(lane: &Lane, rate: f64, now: f64) -> f64 {
    if lane.bucket.leased {
        rate.max(lane.bucket.used.rate(now))
    } else {
        rate
    }
}

impl Core {
    /// Leased (the fleet's budgets) or the local share: every lane that is
    /// not paused. Leaving leases keeps at most the local bucket's size.
    /// Tenants' slots and the pool's in-flight slots follow (see
    /// `fleet_tenants`, `fleet_pool`).
    pub fn set_leased(&mut self, leased: bool) {
        for lane in &mut self.lanes {
            lane.bucket.leased = leased && !lane.bucket.paused;
            lane.bucket.tokens = lane.bucket.tokens.min(lane.bucket.cap());
        }
        self.set_spare_leased(leased);
        self.set_tenants_leased(leased);
        self.set_pool_leased(leased);
    }

    /// Whether lane buckets are leased now.
    pub fn leased(&self) -> bool {
        self.lanes.iter().any(|l| l.bucket.leased)
    }

    /// Every lane not paused: its fleet-wide limits (its bucket rate now
    /// with floor and grants, at the whole fleet's size), what it holds and
    /// what it should hold for its recent demand and its queue.
    pub fn lease_needs(&self, now: f64) -> Vec<LeaseNeed> {
        let share = self.share();
        self.lanes
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.bucket.paused)
            .map(|(i, l)| {
                let rate = self.effective_rate(i, now) / share;
                // The fleet's bucket holds at least two lease periods, so
                // what accrues between two late leases is not lost.
                let limits = FleetLimits {
                    rate,
                    burst: (l.cfg.burst as f64).max(rate * LEASE_SECONDS * 2.0),
                };
                let demand = l.bucket.demand.rate(now);
                LeaseNeed {
                    lane: i,
                    name: l.cfg.name.clone(),
                    limits,
                    held: l.bucket.tokens.max(0.0).floor() as u64,
                    want: lease_size(limits, demand, l.queue.len()),
                    deadline_seconds: l.cfg.deadline_seconds.max(1).unsigned_abs(),
                }
            })
            .collect()
    }

    /// Tokens of a lease taken from the fleet's bucket for lane `li`:
    /// `Some(true)` when a waiting request may go now (poll), `None` when
    /// the lane is not leased (any more): the caller gives them back.
    pub fn add_lease(&mut self, li: usize, tokens: u64) -> Option<bool> {
        let lane = self.lanes.get_mut(li)?;
        if !lane.bucket.leased {
            return None;
        }
        lane.bucket.tokens += tokens as f64;
        Some(!lane.queue.is_empty() && lane.bucket.tokens >= 1.0)
    }

    /// Request `id` of lane `lane` was seen by the fleet before and is not
    /// deferred now (a deferral this replica made was consumed by its
    /// return to another replica): its next [`Core::admit`] here counts it
    /// as a retry, not a return.
    pub fn note_retry(&mut self, lane: &str, id: &str) {
        let Some(li) = self.lane_index(lane) else {
            return;
        };
        let lane = &mut self.lanes[li];
        let key = lane.seen.key(id);
        lane.seen.clear_deferred(key);
    }

    /// Request `id` of lane `lane` was deferred (by any replica of the
    /// fleet) and first arrived at `first_arrival` (this core's clock): it
    /// comes back as a return, neither an original nor a retry, with its
    /// deadline from its first arrival. Remembered here as deferred, so
    /// the next [`Core::admit`] of it counts it so.
    pub fn note_returning(&mut self, lane: &str, id: &str, first_arrival: f64) {
        let Some(li) = self.lane_index(lane) else {
            return;
        };
        let lane = &mut self.lanes[li];
        let key = lane.seen.key(id);
        let deadline = lane.cfg.deadline_seconds as f64;
        lane.seen.write(key, IdHint::NONE, |seen| match seen {
            Some(s) if s.deferred => *s,
            Some(s) => Seen::new(
                s.first_arrival.min(first_arrival),
                deadline,
                s.attempts(),
                true,
            ),
            None => Seen::new(first_arrival, deadline, 1, true),
        });
    }

    /// Takes up to `tokens` whole tokens back out of lane `li`'s leased
    /// bucket, to give back to the fleet; returns how many.
    pub fn take_back(&mut self, li: usize, tokens: u64) -> u64 {
        let Some(lane) = self.lanes.get_mut(li) else {
            return 0;
        };
        if !lane.bucket.leased {
            return 0;
        }
        let n = (lane.bucket.tokens.max(0.0).floor() as u64).min(tokens);
        lane.bucket.tokens -= n as f64;
        n
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::{config, lane, req};
    use crate::{Core, Verdict};

    /// One lane of 30 req/s, burst 6, on a replica of three (share 1/3).
    fn third() -> Core {
        let mut l = lane("a", 30.0, 6);
        l.queue.ttl_seconds = 0;
        Core::new(config(vec![l]), 1.0 / 3.0, 0.0, 1_000_000.0).unwrap()
    }

    fn passes(core: &mut Core, now: f64, n: usize) -> usize {
        (0..n)
            .filter(|_| matches!(core.admit(&req("a"), now), Verdict::Pass(_)))
            .count()
    }

    #[test]
    fn a_leased_bucket_spends_only_what_its_leases_brought() {
        let mut core = third();
        core.set_leased(true);
        assert!(core.leased());
        let need = &core.lease_needs(0.0)[0];
        assert!(
            (need.limits.rate - 30.0).abs() < 1e-9,
            "the fleet's whole rate, not a third: {need:?}"
        );
        assert_eq!(need.limits.burst, 6.0);
        // The local share's two tokens, then nothing accrues by itself.
        assert_eq!(passes(&mut core, 0.0, 10), 2);
        assert_eq!(passes(&mut core, 10.0, 10), 0, "no refill while leased");
        assert_eq!(core.add_lease(0, 7), Some(false));
        assert_eq!(passes(&mut core, 10.0, 10), 7, "the lease, all of it");
        assert_eq!(passes(&mut core, 10.0, 10), 0);
    }

    #[test]
    fn a_lease_follows_demand_and_the_excess_goes_back() {
        let mut core = third();
        core.set_leased(true);
        for i in 0..40 {
            core.admit(&req("a"), 1.0 + f64::from(i) / 40.0);
        }
        let need = core.lease_needs(2.0)[0].clone();
        assert_eq!(
            need.want, 6,
            "40 arrivals a second, 0.2 s of them, capped at 0.2 s of the lane's 30"
        );
        assert_eq!(need.held, 0);
        assert_eq!(need.to_take(), 6);
        assert_eq!(core.add_lease(0, 20), Some(false));
        let need = core.lease_needs(2.0)[0].clone();
        assert_eq!((need.to_take(), need.to_give_back()), (0, 14));
        assert_eq!(core.take_back(0, 14), 14);
        assert_eq!(core.take_back(0, 100), 6, "never more than it holds");
    }

    #[test]
    fn back_on_the_local_share_the_bucket_refills_at_a_third_and_keeps_its_size() {
        let mut core = third();
        core.set_leased(true);
        assert_eq!(core.add_lease(0, 50), Some(false));
        core.set_leased(false);
        assert!(!core.leased());
        assert_eq!(
            core.add_lease(0, 5),
            None,
            "not leased: the caller gives it back"
        );
        assert_eq!(core.take_back(0, 5), 0);
        assert_eq!(
            passes(&mut core, 0.0, 60),
            2,
            "the local size, not the lease"
        );
        assert_eq!(passes(&mut core, 1.0, 60), 2, "10 req/s, capped at 2");
        assert_eq!(passes(&mut core, 1.1, 60), 1);
    }

    #[test]
    fn a_lease_serves_the_waiting_at_the_next_poll() {
        let mut l = lane("a", 30.0, 3);
        l.queue.ttl_seconds = 5;
        let mut core = Core::new(config(vec![l]), 1.0 / 3.0, 0.0, 1_000_000.0).unwrap();
        core.set_leased(true);
        assert_eq!(passes(&mut core, 0.0, 1), 1);
        assert!(matches!(core.admit(&req("a"), 0.0), Verdict::Queued { .. }));
        assert_eq!(
            core.lease_needs(0.0)[0].want,
            2,
            "one waiting: 0.2 s of 2 arrivals + 1"
        );
        assert!(core.poll(0.5).is_empty(), "no token accrued by itself");
        assert_eq!(core.add_lease(0, 1), Some(true));
        assert_eq!(core.poll(0.5).len(), 1);
    }

    /// Leased, a queue that drains at the fleet's rate (30 a second here,
    /// the lease's) is not refused as if it drained at the 1/N share (10).
    #[test]
    fn a_leased_queue_waits_at_the_rate_its_leases_bring() {
        let mut l = lane("a", 30.0, 3);
        l.queue.ttl_seconds = 1;
        l.queue.max_depth = 90;
        let mut leased = Core::new(config(vec![l.clone()]), 1.0 / 3.0, 0.0, 1_000_000.0).unwrap();
        leased.set_leased(true);
        let mut t = 0.0;
        while t < 1.0 {
            leased.add_lease(0, 1);
            assert!(matches!(leased.admit(&req("a"), t), Verdict::Pass(_)));
            t += 1.0 / 30.0;
        }
        // Passed or queued, not refused.
        let taken = |core: &mut Core| {
            (0..20)
                .filter(|_| !matches!(core.admit(&req("a"), 1.0), Verdict::Refuse(_)))
                .count()
        };
        assert_eq!(taken(&mut leased), 20, "20 ahead at 30 a second: 0.7 s");
        let mut local = Core::new(config(vec![l]), 1.0 / 3.0, 0.0, 1_000_000.0).unwrap();
        let local_taken = taken(&mut local);
        assert!(
            local_taken <= 12,
            "at 10 a second, 1 s of TTL: {local_taken}"
        );
    }

    /// A request deferred on another replica comes back here: a return,
    /// not a retry (whatever its attempt header), its deadline from its
    /// first arrival; an id this replica saw as an original turns into a
    /// return too.
    #[test]
    fn a_request_deferred_elsewhere_returns_here_as_a_return() {
        use crate::verdict::{Attempt, Request};
        let mut l = lane("a", 30.0, 6);
        l.deadline_seconds = 10;
        let mut core = Core::new(config(vec![l]), 1.0, 0.0, 1e6).unwrap();
        let req = |id| Request {
            lane: "a",
            tenant: None,
            attempt: Some(2),
            request_id: Some(id),
        };
        core.note_returning("a", "x", 5.0);
        core.note_returning("nope", "x", 5.0);
        let v = core.admit(&req("x"), 6.0);
        assert_eq!(v.attempt(), Attempt::Returning, "{v:?}");
        assert_eq!(core.admit(&req("y"), 6.0).attempt(), Attempt::Retry);
        core.note_returning("a", "y", 1.0);
        assert_eq!(core.admit(&req("y"), 7.0).attempt(), Attempt::Returning);
        // Deferred again elsewhere (its return consumed the first
        // deferral), it returns again; its deadline counts from its first
        // arrival: 10 s after 1.0.
        core.note_returning("a", "y", 1.0);
        let v = core.admit(&req("y"), 11.5);
        assert!(
            matches!(v, Verdict::Refuse(ref r) if r.limit == crate::Limit::Deadline),
            "{v:?}"
        );
    }

    /// A request this replica deferred returned to another replica and
    /// passed there; the fleet says its next arrival is a retry: here too.
    #[test]
    fn a_deferral_consumed_elsewhere_leaves_a_retry_here() {
        use crate::verdict::{Attempt, Request};
        let mut l = lane("a", 30.0, 6);
        l.deadline_seconds = 10;
        let mut core = Core::new(config(vec![l]), 1.0, 0.0, 1e6).unwrap();
        let req = |attempt| Request {
            lane: "a",
            tenant: None,
            attempt: Some(attempt),
            request_id: Some("x"),
        };
        core.note_returning("a", "x", 1.0);
        core.note_retry("a", "x");
        core.note_retry("nope", "x");
        core.note_retry("a", "never-seen");
        assert_eq!(core.admit(&req(3), 2.0).attempt(), Attempt::Retry);
    }

    #[test]
    fn a_paused_lane_is_never_leased() {
        let mut l = lane("a", 30.0, 6);
        l.state = crate::LaneState::Paused;
        let mut core = Core::new(config(vec![l]), 1.0, 0.0, 1_000_000.0).unwrap();
        core.set_leased(true);
        assert!(!core.leased());
        assert!(core.lease_needs(0.0).is_empty());
        assert_eq!(core.add_lease(0, 5), None);
        assert_eq!(core.add_lease(7, 5), None, "no such lane");
    }
}
