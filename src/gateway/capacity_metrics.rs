//! The gateway's capacity evidence as metrics: the work units it completed
//! per lane and route, its in-flight limit, and how long it was saturated
//! (every slot of the limit taken, a request waiting) with the units it
//! completed meanwhile. The recording rule `lanekeeper rules` prints turns
//! the last two into `gatewayGoodputWhileSaturated`.

use std::sync::Mutex;

use lanes::SaturationMeter;
use prometheus::{Counter, CounterVec, IntGauge, Opts, Registry};

/// The capacity families and the saturation they count.
pub(super) struct CapacityMetrics {
    completed: CounterVec,
    in_flight_limit: IntGauge,
    saturated_seconds: Counter,
    saturated_units: Counter,
    /// The meter, and the seconds already exported from it.
    meter: Mutex<(SaturationMeter, f64)>,
}

/// Whether `units` of a completed request count (a finite amount above 0).
pub(super) fn counts(units: f64) -> bool {
    units.is_finite() && units > 0.0
}

fn registered<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: C) -> C {
    r.register(Box::new(c.clone()))
        .expect("each metric is registered once");
    c
}

impl CapacityMetrics {
    pub(super) fn new(r: &Registry) -> CapacityMetrics {
        CapacityMetrics {
            completed: registered(
                r,
                CounterVec::new(
                    Opts::new(
                        "lanekeeper_gateway_completed_units_total",
                        "Work units of the requests the upstream answered with a 2xx in full, by lane and route (the lane's workUnitsPerRequest each): its rate is the units per second the pool served.",
                    ),
                    &["lane", "route"],
                )
                .expect("valid metric"),
            ),
            in_flight_limit: registered(
                r,
                IntGauge::new(
                    "lanekeeper_gateway_in_flight_limit",
                    "The in-flight limit in force on this replica (its share of inFlight.stopAt); 0 without one.",
                )
                .expect("valid metric"),
            ),
            saturated_seconds: registered(
                r,
                Counter::new(
                    "lanekeeper_gateway_saturated_seconds_total",
                    "Seconds this replica was saturated: every slot of its in-flight limit taken and a request waiting for one.",
                )
                .expect("valid metric"),
            ),
            saturated_units: registered(
                r,
                Counter::new(
                    "lanekeeper_gateway_saturated_completed_units_total",
                    "Work units completed (as lanekeeper_gateway_completed_units_total counts them) while this replica was saturated.",
                )
                .expect("valid metric"),
            ),
            meter: Mutex::new((SaturationMeter::default(), 0.0)),
        }
    }

    /// The gateway is (or is not) saturated from `now` (its clock) on,
    /// under `limit`.
    pub(super) fn observe(&self, now: f64, saturated: bool, limit: Option<u64>) {
        self.in_flight_limit
            .set(limit.map_or(0, |l| i64::try_from(l).unwrap_or(i64::MAX)));
        let mut m = self.meter.lock().unwrap_or_else(|e| e.into_inner());
        m.0.observe(now, saturated);
        let total = m.0.seconds(now);
        if total > m.1 {
            self.saturated_seconds.inc_by(total - m.1);
            m.1 = total;
        }
    }

    /// The completed units of `lane` answered by `route`, for a lane's
    /// meter to keep.
    pub(super) fn completed_of(&self, lane: &str, route: &str) -> Counter {
        self.completed.with_label_values(&[lane, route])
    }

    /// A request worth `units` was answered in full, counted on `counter`
    /// (one of [`CapacityMetrics::completed_of`]'s).
    pub(super) fn completed(&self, counter: &Counter, units: f64) {
        if !counts(units) {
            return;
        }
        counter.inc_by(units);
        let counted = self
            .meter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .completed(units);
        if counted {
            self.saturated_units.inc_by(units);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sum of a family's samples on the text page.
    fn value(r: &Registry, name: &str) -> f64 {
        let mut page = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &r.gather(), &mut page)
            .unwrap();
        String::from_utf8(page)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    #[test]
    fn only_work_completed_while_saturated_counts_as_evidence() {
        let r = Registry::new();
        let m = CapacityMetrics::new(&r);
        let (p1, p2) = (m.completed_of("p1", "vllm"), m.completed_of("p2", "vllm"));
        m.observe(0.0, false, Some(10));
        m.completed(&p1, 1.5);
        m.observe(1.0, true, Some(10));
        m.completed(&p1, 1.5);
        m.completed(&p2, 0.7);
        m.completed(&p2, f64::NAN);
        m.observe(3.0, true, Some(10));
        m.observe(4.0, false, Some(10));
        m.completed(&p1, 1.5);
        m.observe(9.0, false, None);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(
            value(&r, "lanekeeper_gateway_completed_units_total"),
            5.2
        ));
        assert!(close(
            value(&r, "lanekeeper_gateway_saturated_completed_units_total"),
            2.2
        ));
        assert!(close(
            value(&r, "lanekeeper_gateway_saturated_seconds_total"),
            3.0
        ));
        assert_eq!(m.in_flight_limit.get(), 0, "no limit in force");
    }
}
