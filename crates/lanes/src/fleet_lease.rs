//! One lane's budget shared by every gateway replica: the fleet bucket the
//! shared store keeps (the store's script does exactly this arithmetic,
//! against the store's clock) and the size of the lease a replica asks for.
//!
//! A replica does not ask the store for every request: it takes a **lease**
//! of a few tokens sized from its own recent demand (about
//! [`LEASE_SECONDS`] of it), spends it locally, and gives back what it did
//! not use when the lease ends. The store sees a few calls per lane per
//! replica per second, and the fleet never admits more than the lane's rate
//! plus one burst: every token a replica spends was taken from the fleet
//! bucket, and what is given back never lifts the bucket above its burst.

/// How much of a replica's own demand one lease covers, in seconds.
pub const LEASE_SECONDS: f64 = 0.1;

/// A lane's rate and burst for the whole fleet (not a replica's share).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FleetLimits {
    /// Requests per second.
    pub rate: f64,
    /// Most tokens the fleet bucket holds.
    pub burst: f64,
}

/// The fleet bucket as the store holds it: tokens as of `updated` (the
/// store's clock, seconds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FleetBucket {
    /// Tokens left as of `updated`.
    pub tokens: f64,
    /// When `tokens` was last brought up to date.
    pub updated: f64,
}

impl FleetBucket {
    /// A bucket first seen at `now`: full.
    pub fn full(limits: FleetLimits, now: f64) -> FleetBucket {
        FleetBucket {
            tokens: limits.burst,
            updated: now,
        }
    }

    /// Adds what accrued since `updated` at the rate, up to the burst. A
    /// clock that went back adds nothing.
    fn refill(&mut self, limits: FleetLimits, now: f64) {
        let elapsed = (now - self.updated).max(0.0);
        self.tokens = (self.tokens + elapsed * limits.rate).min(limits.burst);
        self.updated = self.updated.max(now);
    }

    /// Grants up to `want` whole tokens (fewer when fewer are there).
    pub fn take(&mut self, limits: FleetLimits, now: f64, want: u64) -> u64 {
        self.refill(limits, now);
        let granted = (want as f64).min(self.tokens.floor()).max(0.0);
        self.tokens -= granted;
        granted as u64
    }

    /// Takes back `unused` tokens of an ended lease, never above the burst.
    pub fn give_back(&mut self, limits: FleetLimits, now: f64, unused: u64) {
        self.refill(limits, now);
        self.tokens = (self.tokens + unused as f64).min(limits.burst);
    }
}

/// The tokens a replica asks for in one lease: its own demand over two
/// [`LEASE_SECONDS`] (arrivals bunch: a lease of one period's average runs
/// dry before the next top-up, and the requests after it wait for that)
/// plus the requests waiting on it, at least one and at
/// most two lease periods of the whole lane (its burst when that is more):
/// enough to take all that accrued when a lease comes a little late, not so
/// much that one busy replica empties the bucket for the others for long.
pub fn lease_size(limits: FleetLimits, demand_per_second: f64, waiting: usize) -> u64 {
    let demand = demand_per_second.max(0.0) * LEASE_SECONDS * 2.0 + waiting as f64;
    let most = (limits.rate * LEASE_SECONDS * 2.0)
        .max(limits.burst)
        .ceil()
        .max(1.0);
    demand.ceil().clamp(1.0, most) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LANE: FleetLimits = FleetLimits {
        rate: 50.0,
        burst: 10.0,
    };

    #[test]
    fn a_bucket_refills_at_the_rate_up_to_the_burst() {
        let mut b = FleetBucket::full(LANE, 0.0);
        assert_eq!(b.take(LANE, 0.0, 25), 10);
        assert_eq!(b.take(LANE, 0.0, 1), 0);
        assert_eq!(b.take(LANE, 0.1, 25), 5);
        assert_eq!(b.take(LANE, 100.0, 25), 10, "never more than the burst");
    }

    #[test]
    fn a_clock_that_goes_back_adds_nothing() {
        let mut b = FleetBucket::full(LANE, 10.0);
        assert_eq!(b.take(LANE, 10.0, 10), 10);
        assert_eq!(b.take(LANE, 5.0, 10), 0);
        assert_eq!(b.take(LANE, 10.0, 10), 0, "the time went back, not forward");
    }

    #[test]
    fn given_back_tokens_never_lift_the_bucket_above_its_burst() {
        let mut b = FleetBucket::full(LANE, 0.0);
        assert_eq!(b.take(LANE, 0.0, 4), 4);
        b.give_back(LANE, 0.0, 1_000);
        assert_eq!(b.tokens, LANE.burst);
    }

    #[test]
    fn a_lease_follows_the_replicas_demand_within_bounds() {
        assert_eq!(
            lease_size(LANE, 0.0, 0),
            1,
            "an idle replica still asks for one"
        );
        assert_eq!(lease_size(LANE, 40.0, 0), 8);
        assert_eq!(lease_size(LANE, 30.0, 3), 9);
        assert_eq!(lease_size(LANE, 10_000.0, 500), 10, "capped at the burst");
        let fast = FleetLimits {
            rate: 1_000.0,
            burst: 10.0,
        };
        assert_eq!(
            lease_size(fast, 10_000.0, 0),
            200,
            "or two lease periods of the lane"
        );
        assert_eq!(lease_size(LANE, f64::NAN, 0), 1);
    }

    /// One replica with all of a lane's traffic gets the lane's whole rate,
    /// not its 1/N share: it leases every LEASE_SECONDS from its demand.
    #[test]
    fn one_replica_with_all_the_traffic_gets_the_whole_rate() {
        let mut fleet = FleetBucket::full(LANE, 0.0);
        let (demand, mut admitted) = (80.0, 0u64);
        let mut t = 0.0;
        while t < 20.0 {
            let lease = fleet.take(LANE, t, lease_size(LANE, demand, 0));
            let used = lease.min((demand * LEASE_SECONDS).ceil() as u64);
            admitted += used;
            fleet.give_back(LANE, t + LEASE_SECONDS, lease - used);
            t += LEASE_SECONDS;
        }
        let due = LANE.rate * 20.0;
        assert!(
            (admitted as f64 - due).abs() <= 0.05 * due + LANE.burst,
            "admitted {admitted} of {due}"
        );
    }

    /// What one replica does at one moment.
    #[derive(Clone, Debug)]
    struct Step {
        replica: usize,
        dt: f64,
        want: u64,
        use_fraction: f64,
        give_back: bool,
    }

    fn step() -> impl Strategy<Value = Step> {
        (
            0usize..5,
            0.0f64..0.3,
            0u64..40,
            0.0f64..=1.0,
            any::<bool>(),
        )
            .prop_map(|(replica, dt, want, use_fraction, give_back)| Step {
                replica,
                dt,
                want,
                use_fraction,
                give_back,
            })
    }

    proptest! {
        /// Over any interleaving of replicas taking leases, spending part
        /// of them and giving the rest back, the fleet never admits more
        /// than the lane's rate over the time plus one burst.
        #[test]
        fn the_fleet_never_admits_more_than_the_rate_plus_one_burst(
            rate in 0.0f64..500.0,
            burst in 1.0f64..100.0,
            steps in proptest::collection::vec(step(), 1..400),
        ) {
            let limits = FleetLimits { rate, burst };
            let mut fleet = FleetBucket::full(limits, 0.0);
            let mut held = [0u64; 5];
            let (mut now, mut admitted) = (0.0, 0u64);
            for s in &steps {
                now += s.dt;
                held[s.replica] += fleet.take(limits, now, s.want);
                let used = (held[s.replica] as f64 * s.use_fraction).floor() as u64;
                admitted += used;
                held[s.replica] -= used;
                if s.give_back {
                    fleet.give_back(limits, now, held[s.replica]);
                    held[s.replica] = 0;
                }
                prop_assert!(
                    admitted as f64 <= rate * now + burst + 1e-6,
                    "admitted {} by {}: rate {} burst {}", admitted, now, rate, burst
                );
            }
        }
    }
}
