//! The `Retry-After` of a refusal: the wait the caller can expect, from
//! the lane's queue and its drain rate. Pure, whole seconds.
//!
//! A lane that admits `rate` requests a second serves the `ahead` requests
//! before a newcomer (its queue, plus the newcomer, less the tokens at hand)
//! in `ahead ÷ rate` seconds: that is the wait, rounded up, at least 1 s
//! (a newcomer always needs one token). A lane that admits nothing (paused,
//! or no rate) cannot drain; its wait is the controller's expected time to
//! resume. A deferral is never told to wait longer than the controller's
//! deferral estimate, which counts on a step down within its stable window.

/// The longest `Retry-After`, in seconds (a day).
pub const MAX_RETRY_AFTER_SECONDS: i64 = 86_400;

/// What the lane looks like to a refused newcomer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LaneWait {
    /// Requests waiting in the lane's queue.
    pub queued: usize,
    /// Tokens at hand in the lane's bucket.
    pub tokens: f64,
    /// Requests per second the lane admits now (0: paused or no rate).
    pub drain_rate: f64,
    /// The controller's expected time to resume, when it gives one
    /// (`retryAfterSeconds`, or a deferral's).
    pub resume_seconds: Option<i64>,
    /// The controller's bound for a deferral (`deferral.retryAfterSeconds`).
    pub deferral_bound: Option<i64>,
    /// The lane's queue TTL, the wait when nothing better is known.
    pub ttl_seconds: i64,
}

/// The expected wait in seconds (unrounded); None when the lane does not
/// drain.
pub fn drain_wait(queued: usize, tokens: f64, drain_rate: f64) -> Option<f64> {
    if drain_rate.is_nan() || drain_rate <= 0.0 {
        return None;
    }
    let ahead = (queued as f64 + 1.0 - tokens.max(0.0)).max(1.0);
    Some(ahead / drain_rate)
}

/// The `Retry-After` in whole seconds.
pub fn retry_after_seconds(w: &LaneWait) -> i64 {
    let wait = match drain_wait(w.queued, w.tokens, w.drain_rate) {
        Some(s) => whole(s),
        None => w.resume_seconds.unwrap_or(w.ttl_seconds),
    };
    let wait = match w.deferral_bound {
        Some(b) if b >= 1 => wait.min(b),
        _ => wait,
    };
    wait.clamp(1, MAX_RETRY_AFTER_SECONDS)
}

/// Seconds rounded up (a hair under a whole second is that second: 150.0000001
/// of float noise is still 150).
pub fn whole(seconds: f64) -> i64 {
    if !seconds.is_finite() {
        return MAX_RETRY_AFTER_SECONDS;
    }
    (seconds - 1e-6)
        .ceil()
        .clamp(1.0, MAX_RETRY_AFTER_SECONDS as f64) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lane(queued: usize, tokens: f64, rate: f64) -> LaneWait {
        LaneWait {
            queued,
            tokens,
            drain_rate: rate,
            resume_seconds: None,
            deferral_bound: None,
            ttl_seconds: 30,
        }
    }

    #[test]
    fn the_wait_is_the_queue_ahead_at_the_drain_rate() {
        // 99 waiting and the newcomer at 10/s: 10 s.
        assert_eq!(retry_after_seconds(&lane(99, 0.0, 10.0)), 10);
        // INC-47's P3: 20,000 at 133.33/s, 150 s.
        assert_eq!(retry_after_seconds(&lane(19_999, 0.0, 60.0 / 0.45)), 150);
        // Tokens at hand shorten it; one token is always needed.
        assert_eq!(retry_after_seconds(&lane(9, 5.0, 1.0)), 5);
        assert_eq!(retry_after_seconds(&lane(0, 50.0, 0.25)), 4);
        // Never under a second.
        assert_eq!(retry_after_seconds(&lane(0, 0.0, 1_000.0)), 1);
    }

    #[test]
    fn a_lane_that_does_not_drain_waits_for_the_controller() {
        let mut w = lane(10, 0.0, 0.0);
        w.resume_seconds = Some(300);
        assert_eq!(retry_after_seconds(&w), 300);
        w.resume_seconds = None;
        assert_eq!(retry_after_seconds(&w), 30, "the queue TTL");
        w.drain_rate = f64::NAN;
        assert_eq!(retry_after_seconds(&w), 30);
    }

    #[test]
    fn a_deferral_is_bounded_by_the_controllers_estimate() {
        let mut w = lane(100_000, 0.0, 10.0);
        w.deferral_bound = Some(300);
        assert_eq!(retry_after_seconds(&w), 300);
        w.deferral_bound = Some(0);
        assert_eq!(retry_after_seconds(&w), 10_001);
    }

    proptest! {
        /// Whole, between 1 s and a day, and within one second of the drain
        /// time when the lane drains.
        #[test]
        fn the_wait_tracks_the_drain(queued in 0usize..1_000_000, tokens in 0.0..100.0f64, rate in 0.001..10_000.0f64) {
            let r = retry_after_seconds(&lane(queued, tokens, rate));
            prop_assert!((1..=MAX_RETRY_AFTER_SECONDS).contains(&r));
            let exact = drain_wait(queued, tokens, rate).unwrap();
            if exact < MAX_RETRY_AFTER_SECONDS as f64 {
                prop_assert!(r as f64 >= exact - 1e-5 && (r as f64) < exact.max(1.0) + 1.0, "{r} vs {exact}");
            }
        }
    }
}
