//! A lane's expected service time: how long a request of the lane takes
//! once it has passed (until its answer ends). The configured
//! `expectedServiceSeconds` is the least it is ever taken to be; once the
//! lane has enough recent answers, their p95 is used when it is longer (a
//! capacity cut that doubles the real time is seen within seconds, so a
//! request that cannot make its deadline is refused at once instead of
//! waiting to be cut). Never shorter than configured: measuring never
//! relaxes a limit.

use crate::latency_window::LatencyWindow;

/// Answers in the window before their p95 counts.
pub const MIN_SERVICE_SAMPLES: u64 = 20;

/// The service times of a lane's recent answers.
#[derive(Debug)]
pub(crate) struct ServiceTime {
    configured: f64,
    window: LatencyWindow,
    /// The expected service time as last computed, and the second it was.
    expected: f64,
    computed_at: i64,
}

impl ServiceTime {
    pub(crate) fn new(configured: Option<f64>) -> ServiceTime {
        let configured = configured.unwrap_or(0.0);
        ServiceTime {
            configured,
            window: LatencyWindow::new(),
            expected: configured,
            computed_at: i64::MIN,
        }
    }

    /// An answer of the lane ended `seconds` after it passed.
    pub(crate) fn record(&mut self, now: f64, seconds: f64) {
        if seconds.is_finite() && seconds >= 0.0 {
            self.window.record(now, seconds);
        }
    }

    /// The expected service time now: the configured one, or the p95 of
    /// the last window's answers when longer. Computed at most once a
    /// second.
    pub(crate) fn expected(&mut self, now: f64) -> f64 {
        let sec = now.floor() as i64;
        if sec != self.computed_at {
            self.computed_at = sec;
            let measured = self.window.p95_of_at_least(now, MIN_SERVICE_SAMPLES);
            self.expected = measured.map_or(self.configured, |m| m.max(self.configured));
        }
        self.expected
    }

    /// This lane's measurements under a new config's configured time.
    pub(crate) fn carry_into(self, next: &mut ServiceTime) {
        next.window = self.window;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers(s: &mut ServiceTime, now: f64, n: u32, seconds: f64) {
        for _ in 0..n {
            s.record(now, seconds);
        }
    }

    #[test]
    fn the_configured_time_holds_until_enough_answers_are_measured() {
        let mut s = ServiceTime::new(Some(0.1));
        answers(&mut s, 1.0, (MIN_SERVICE_SAMPLES - 1) as u32, 2.0);
        assert_eq!(s.expected(1.0), 0.1);
        answers(&mut s, 1.0, 1, 2.0);
        // Recomputed in the next second, at most once a second.
        assert_eq!(s.expected(1.5), 0.1);
        let e = s.expected(2.0);
        assert!((2.0..2.1).contains(&e), "{e}");
    }

    #[test]
    fn a_shorter_measured_time_never_relaxes_the_configured_one() {
        let mut s = ServiceTime::new(Some(1.0));
        answers(&mut s, 1.0, 100, 0.05);
        assert_eq!(s.expected(2.0), 1.0);
    }

    #[test]
    fn the_measured_time_is_the_p95_and_old_answers_age_out() {
        let mut s = ServiceTime::new(None);
        answers(&mut s, 1.0, 94, 0.1);
        answers(&mut s, 1.0, 6, 3.0);
        let e = s.expected(2.0);
        assert!((3.0..3.13).contains(&e), "p95 is a slow answer: {e}");
        // Ten seconds later the window is empty: back to the configured 0.
        assert_eq!(s.expected(30.0), 0.0);
    }

    #[test]
    fn garbage_latencies_are_not_measured() {
        let mut s = ServiceTime::new(Some(0.2));
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            answers(&mut s, 1.0, 50, bad);
        }
        assert_eq!(s.expected(2.0), 0.2);
    }

    #[test]
    fn a_new_config_keeps_the_measurements_under_its_own_floor() {
        let mut old = ServiceTime::new(Some(0.1));
        answers(&mut old, 1.0, 50, 0.5);
        let mut next = ServiceTime::new(Some(2.0));
        old.carry_into(&mut next);
        assert_eq!(next.expected(2.0), 2.0);
        let mut next = ServiceTime::new(Some(0.01));
        let mut old = ServiceTime::new(Some(0.1));
        answers(&mut old, 1.0, 50, 0.5);
        old.carry_into(&mut next);
        assert!(next.expected(2.0) >= 0.5);
    }
}
