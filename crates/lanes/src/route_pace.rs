//! Pacing a route that pushes back: pure, the time comes from the caller.
//!
//! An upstream that answers `429`, or `503` with `Retry-After`, is asking to
//! be sent less. The route's share of its recent in-flight peak drops by
//! [`PACE_DECREASE`] at each push-back (never below [`PACE_MIN_SHARE`]),
//! stays there until the upstream's `Retry-After` has passed, then grows back
//! by [`PACE_RECOVERY_PER_SECOND`] each second until the route is unpaced
//! (additive increase, multiplicative decrease, as TCP does with its
//! window). While paced, the route takes at most `share × peak` requests at
//! once; the rest are told when a place is expected.

/// The share kept at each push-back.
pub const PACE_DECREASE: f64 = 0.5;
/// The smallest share.
pub const PACE_MIN_SHARE: f64 = 0.05;
/// Share regained per second once the upstream's `Retry-After` has passed.
pub const PACE_RECOVERY_PER_SECOND: f64 = 0.1;
/// The longest `Retry-After` of an upstream that is honoured, in seconds.
pub const PACE_MAX_HOLD_SECONDS: f64 = 300.0;
/// The hold after a push-back without `Retry-After`, in seconds.
pub const PACE_DEFAULT_HOLD_SECONDS: f64 = 1.0;

/// One route's pace.
#[derive(Clone, Debug)]
pub struct RoutePace {
    /// Share of `peak` (1: unpaced).
    share: f64,
    /// When `share` was last brought up to date.
    at: f64,
    /// No recovery before this time (the upstream's `Retry-After`).
    held_until: f64,
    /// The route's in-flight peak when it first pushed back: what a share
    /// is a share of.
    peak: usize,
}

impl Default for RoutePace {
    fn default() -> RoutePace {
        RoutePace {
            share: 1.0,
            at: 0.0,
            held_until: 0.0,
            peak: 0,
        }
    }
}

/// The pace's answer for one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Paced {
    /// Send it.
    Go,
    /// The route has `limit` requests in flight already: come back in
    /// `retry_in` seconds.
    Full {
        /// Requests the route takes at once now.
        limit: usize,
        /// Expected seconds until it takes one more.
        retry_in: f64,
    },
}

impl RoutePace {
    /// The upstream pushed back at `now` with `retry_after` seconds (None:
    /// no header), while the route had `in_flight` requests (this one
    /// included).
    pub fn pushed_back(&mut self, now: f64, retry_after: Option<f64>, in_flight: usize) {
        self.advance(now);
        if self.share >= 1.0 {
            self.peak = in_flight.max(1);
        } else {
            self.peak = self.peak.max(1);
        }
        // One cut per hold: the answers of requests already in flight when
        // the first push-back came say the same thing again.
        if now >= self.held_until || self.share >= 1.0 {
            self.share = (self.share * PACE_DECREASE).max(PACE_MIN_SHARE);
        }
        let hold = retry_after
            .filter(|s| s.is_finite())
            .unwrap_or(PACE_DEFAULT_HOLD_SECONDS)
            .clamp(0.0, PACE_MAX_HOLD_SECONDS);
        self.held_until = self.held_until.max(now + hold);
        self.at = now;
    }

    /// The share at `now` (1: unpaced).
    pub fn share(&mut self, now: f64) -> f64 {
        self.advance(now);
        self.share
    }

    /// Most requests the route takes at once at `now` (None: no limit).
    pub fn limit(&mut self, now: f64) -> Option<usize> {
        self.advance(now);
        (self.share < 1.0).then(|| ((self.share * self.peak as f64).floor() as usize).max(1))
    }

    /// May one more request go while the route has `in_flight` at `now`?
    pub fn admit(&mut self, now: f64, in_flight: usize) -> Paced {
        let Some(limit) = self.limit(now) else {
            return Paced::Go;
        };
        if in_flight < limit {
            return Paced::Go;
        }
        Paced::Full {
            limit,
            retry_in: self.wait_for_more(now, in_flight),
        }
    }

    /// Seconds until the limit exceeds `in_flight`: the rest of the hold,
    /// then the additive growth to `(in_flight + 1) / peak`.
    fn wait_for_more(&self, now: f64, in_flight: usize) -> f64 {
        let need = ((in_flight + 1) as f64 / self.peak.max(1) as f64).min(1.0);
        let grow = ((need - self.share).max(0.0)) / PACE_RECOVERY_PER_SECOND;
        (self.held_until - now).max(0.0) + grow
    }

    fn advance(&mut self, now: f64) {
        if now > self.at {
            let from = self.at.max(self.held_until);
            if now > from && self.share < 1.0 {
                self.share = (self.share + (now - from) * PACE_RECOVERY_PER_SECOND).min(1.0);
            }
            self.at = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_push_back_halves_the_route_holds_for_retry_after_then_recovers_additively() {
        let mut p = RoutePace::default();
        assert_eq!(p.admit(0.0, 1_000), Paced::Go);
        p.pushed_back(10.0, Some(5.0), 8);
        assert_eq!(p.limit(10.0), Some(4));
        // Held for 5 s: no recovery.
        assert_eq!(p.limit(14.9), Some(4));
        assert_eq!(p.admit(12.0, 3), Paced::Go);
        match p.admit(12.0, 4) {
            // 3 s of hold, then 0.125 of share at 0.1 a second.
            Paced::Full { limit, retry_in } => {
                assert_eq!(limit, 4);
                assert!((retry_in - 4.25).abs() < 1e-9, "{retry_in}");
            }
            g => panic!("{g:?}"),
        }
        // 0.5 + 0.1 × 2.5 = 0.75 of 8 = 6.
        assert_eq!(p.limit(17.5), Some(6));
        assert!((p.share(17.5) - 0.75).abs() < 1e-9);
        // Unpaced once the share is whole again.
        assert_eq!(p.limit(20.0), None);
        assert_eq!(p.admit(20.0, 1_000), Paced::Go);
    }

    #[test]
    fn answers_inside_one_hold_cut_once_and_a_later_push_back_cuts_again() {
        let mut p = RoutePace::default();
        p.pushed_back(0.0, Some(5.0), 10);
        p.pushed_back(0.1, Some(5.0), 9);
        p.pushed_back(0.2, None, 8);
        assert!((p.share(0.3) - 0.5).abs() < 1e-9);
        // Held until 5.1; by 6.0 it regained 0.09, then halves again.
        p.pushed_back(6.0, Some(5.0), 5);
        assert!((p.share(6.0) - 0.295).abs() < 1e-9);
        // Never below the minimum share; at least one request at a time.
        // Each push-back as the last hold (held to the 300 s maximum) ends.
        for i in 0..20 {
            p.pushed_back(20.0 + f64::from(i) * 300.0, Some(1e9), 1);
        }
        let now = 20.0 + 19.0 * 300.0;
        assert!((p.share(now) - PACE_MIN_SHARE).abs() < 1e-9);
        assert_eq!(p.limit(now), Some(1));
        // A Retry-After over the maximum is held to it.
        assert_eq!(p.limit(now + PACE_MAX_HOLD_SECONDS - 1.0), Some(1));
    }

    proptest! {
        /// The share stays in [min, 1], never rises during a hold, and never
        /// rises faster than the recovery rate.
        #[test]
        fn the_share_is_bounded_and_recovers_at_most_additively(
            events in prop::collection::vec((0.0..4.0f64, any::<bool>(), prop::option::of(0.0..10.0f64), 1usize..50), 1..100)
        ) {
            let mut p = RoutePace::default();
            let mut now = 0.0;
            let mut last = p.share(0.0);
            for (d, push, ra, inf) in events {
                let prev_now = now;
                now += d;
                let held = p.held_until;
                if push {
                    p.pushed_back(now, ra, inf);
                    let s = p.share(now);
                    prop_assert!(s <= last + (now - prev_now) * PACE_RECOVERY_PER_SECOND + 1e-9);
                    last = s;
                } else {
                    let s = p.share(now);
                    if now <= held {
                        prop_assert!(s <= last + 1e-12);
                    }
                    prop_assert!(s <= last + d * PACE_RECOVERY_PER_SECOND + 1e-9);
                    last = s;
                }
                prop_assert!((PACE_MIN_SHARE - 1e-12..=1.0).contains(&last));
                if let Some(l) = p.limit(now) {
                    prop_assert!(l >= 1);
                }
            }
        }
    }
}
