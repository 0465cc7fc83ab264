//! Saturation: when the gateway's in-flight limit, not its lanes' rates,
//! holds work back. The gateway is saturated while every slot the
//! sheddable lanes share is taken and a request waits in some lane's queue;
//! what the pool completes through it meanwhile is what the pool can do
//! now, the capacity evidence the controller reads
//! (`gatewayGoodputWhileSaturated`). A request waiting for a token of its
//! lane's bucket while slots are free is no saturation: it waits for its
//! admitted rate, and counting it would feed the rate back as capacity.

use crate::core::Core;

impl Core {
    /// Whether the gateway is saturated now: no slot free for the
    /// sheddable lanes (the reserve kept) and a request waiting. False
    /// without an in-flight limit.
    pub fn saturated(&self) -> bool {
        self.in_flight_limit().is_some()
            && self.free_slots(0) == 0
            && self.lanes.iter().any(|l| !l.queue.is_empty())
    }
}

/// Seconds spent saturated and the work units completed meanwhile, as the
/// gateway exports them (and `simulate` measures them).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SaturationMeter {
    since: Option<f64>,
    seconds: f64,
    units: f64,
}

impl SaturationMeter {
    /// The gateway is (`true`) or is not saturated from `now` on.
    pub fn observe(&mut self, now: f64, saturated: bool) {
        match (self.since, saturated) {
            (None, true) => self.since = Some(now),
            (Some(s), false) => {
                self.seconds += (now - s).max(0.0);
                self.since = None;
            }
            _ => {}
        }
    }

    /// Whether the last observation was saturated.
    pub fn is_saturated(&self) -> bool {
        self.since.is_some()
    }

    /// A request worth `units` completed: counted (and true) when
    /// saturated.
    pub fn completed(&mut self, units: f64) -> bool {
        let counted = self.since.is_some() && units.is_finite() && units > 0.0;
        if counted {
            self.units += units;
        }
        counted
    }

    /// Seconds spent saturated up to `now`.
    pub fn seconds(&self, now: f64) -> f64 {
        self.seconds + self.since.map_or(0.0, |s| (now - s).max(0.0))
    }

    /// Work units completed while saturated.
    pub fn units(&self) -> f64 {
        self.units
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slots_tests::limited;
    use crate::tests::{config, lane, req};
    use crate::{LaneConfig, Verdict};

    fn queued_lane(name: &str, rate: f64, burst: u64) -> LaneConfig {
        let mut l = lane(name, rate, burst);
        l.queue.max_depth = 100;
        l.queue.ttl_seconds = 20;
        l.deadline_seconds = 60;
        l
    }

    #[test]
    fn saturated_is_every_slot_taken_with_a_request_waiting() {
        let mut c = limited(vec![queued_lane("p1", 1e6, 1_000_000)], 2);
        for _ in 0..2 {
            assert!(matches!(c.admit(&req("p1"), 0.0), Verdict::Pass(_)));
            c.started(0.0);
        }
        assert!(!c.saturated(), "full, but nobody waits");
        assert!(matches!(c.admit(&req("p1"), 0.1), Verdict::Queued { .. }));
        assert!(c.saturated());
        assert!(c.finished(0.5, 0.5));
        assert_eq!(c.poll(0.5).len(), 1);
        c.started(0.5);
        assert!(!c.saturated(), "the waiting request took the slot");
    }

    #[test]
    fn waiting_for_a_token_with_slots_free_is_not_saturation() {
        // One request per second: the second waits for its token, not for
        // the pool; its lane's rate must never read as capacity.
        let mut c = limited(vec![queued_lane("slow", 1.0, 1)], 10);
        assert!(matches!(c.admit(&req("slow"), 0.0), Verdict::Pass(_)));
        c.started(0.0);
        assert!(matches!(c.admit(&req("slow"), 0.0), Verdict::Queued { .. }));
        assert!(!c.saturated());
        // Without an in-flight limit the gateway is never saturated.
        let mut free = Core::new(config(vec![queued_lane("slow", 1.0, 1)]), 1.0, 0.0, 0.0).unwrap();
        assert!(matches!(free.admit(&req("slow"), 0.0), Verdict::Pass(_)));
        assert!(matches!(
            free.admit(&req("slow"), 0.0),
            Verdict::Queued { .. }
        ));
        assert!(!free.saturated());
    }

    #[test]
    fn only_saturated_time_and_the_work_done_in_it_count() {
        let mut m = SaturationMeter::default();
        assert!(!m.completed(5.0), "not saturated: not counted");
        m.observe(10.0, true);
        m.observe(11.0, true);
        assert!(m.is_saturated());
        assert!(m.completed(2.0));
        assert!(!m.completed(f64::NAN), "garbage is never counted");
        assert_eq!(m.seconds(12.5), 2.5, "the running stretch counts");
        m.observe(13.0, false);
        assert!(!m.completed(7.0));
        m.observe(20.0, false);
        assert_eq!(m.seconds(30.0), 3.0, "unsaturated time does not count");
        m.observe(30.0, true);
        assert!(m.completed(1.0));
        assert_eq!(m.seconds(31.0), 4.0);
        assert_eq!(m.units(), 3.0);
    }
}
