//! A lane's ceiling (`ceilingUnitsPerSecond`) as the gateway holds it: a
//! meter of the work units the lane passes, refilled at the ceiling. Every
//! pass is charged to it, from the lane's own bucket or from the pool's
//! spare capacity; only a draw on spare capacity needs it to hold the
//! request. The lane's own bucket never runs above its ceiling (its rate,
//! its floor and its grants are all below it), so spare capacity is the one
//! way a lane could pass more, and the meter closes it: over any `T`
//! seconds a lane passes at most `ceiling × T` plus one second of its
//! ceiling (or one of its costliest requests, when that is more).
//!
//! With N replicas each holds its share (`share`) of the ceiling, so the
//! fleet together never passes more than the ceiling on spare capacity.

/// One lane's ceiling meter, in work units (this replica's share).
#[derive(Clone, Debug)]
pub(crate) struct Ceiling {
    /// Units per second.
    rate: f64,
    /// Most units it holds.
    cap: f64,
    /// What it holds now (negative: the lane's own bucket passed more than
    /// the ceiling had left; spare capacity waits until it is paid).
    units: f64,
    last: f64,
}

impl Ceiling {
    /// A full meter at `units_per_second × share`, one second deep and at
    /// least `largest` (the lane's costliest request) deep; None without a
    /// ceiling, or with one that is not a finite number ≥ 0 (which the
    /// config's validation refuses before it gets here). A ceiling of 0
    /// holds nothing: the lane never draws on spare capacity.
    pub(crate) fn new(
        units_per_second: Option<f64>,
        largest: f64,
        share: f64,
        now: f64,
    ) -> Option<Ceiling> {
        let rate = units_per_second.filter(|c| c.is_finite() && *c >= 0.0)? * share;
        let cap = rate.max(largest);
        Some(Ceiling {
            rate,
            cap,
            units: cap,
            last: now,
        })
    }

    fn units_at(&self, now: f64) -> f64 {
        let elapsed = (now - self.last).max(0.0);
        (self.units + self.rate * elapsed).min(self.cap)
    }

    fn refill(&mut self, now: f64) {
        self.units = self.units_at(now);
        self.last = now.max(self.last);
    }

    /// Charges a pass of `units` (into debt when it holds less).
    pub(crate) fn charge(&mut self, units: f64, now: f64) {
        self.refill(now);
        self.units -= units;
    }

    /// Gives back what a settled request cost less than it was charged
    /// (`units` < 0: it cost more), never past the meter's size.
    pub(crate) fn settle(&mut self, units: f64, now: f64) {
        self.refill(now);
        self.units = (self.units + units).min(self.cap);
    }

    /// Whether it holds `units` now: a draw on spare capacity may pass.
    pub(crate) fn holds(&mut self, units: f64, now: f64) -> bool {
        self.refill(now);
        self.units + 1e-9 >= units.min(self.cap)
    }

    /// When it will hold `units` (None: never, at a ceiling of 0).
    pub(crate) fn ready_at(&self, units: f64, now: f64) -> Option<f64> {
        let missing = units.min(self.cap) - self.units_at(now);
        if missing <= 0.0 {
            Some(now)
        } else if self.rate > 0.0 {
            Some(now + missing / self.rate)
        } else {
            None
        }
    }

    /// Keeps what `old` held (up to this meter's size): a new config does
    /// not refill the ceiling.
    pub(crate) fn carry(&mut self, old: &Ceiling, now: f64) {
        self.units = old.units_at(now).min(self.cap);
        self.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_passes_are_charged_and_spare_waits_for_the_ceiling_to_refill() {
        let mut c = Ceiling::new(Some(10.0), 1.0, 1.0, 0.0).unwrap();
        assert!(c.holds(10.0, 0.0), "it starts one second deep");
        c.charge(14.0, 0.0);
        assert!(!c.holds(1.0, 0.0), "4 units in debt");
        assert_eq!(c.ready_at(1.0, 0.0), Some(0.5));
        assert!(!c.holds(1.0, 0.49));
        assert!(c.holds(1.0, 0.5));
        // Never more than one second deep, however long it rests.
        c.charge(10.0, 100.0);
        assert!(!c.holds(0.5, 100.0));
    }

    #[test]
    fn a_costly_request_passes_on_a_full_meter_and_a_zero_ceiling_never() {
        let mut c = Ceiling::new(Some(2.0), 5.0, 1.0, 0.0).unwrap();
        assert!(
            c.holds(5.0, 0.0),
            "at least one of the costliest request deep"
        );
        assert!(
            c.holds(50.0, 0.0),
            "larger than the meter: passes when full"
        );
        let zero = Ceiling::new(Some(0.0), 1.0, 1.0, 0.0).unwrap();
        assert_eq!(zero.ready_at(1.0, 0.0).map(|_| ()), Some(()));
        let mut z = zero.clone();
        z.charge(1.0, 0.0);
        assert_eq!(z.ready_at(1.0, 10.0), None);
        assert!(Ceiling::new(None, 1.0, 1.0, 0.0).is_none());
        assert!(Ceiling::new(Some(f64::NAN), 1.0, 1.0, 0.0).is_none());
    }

    #[test]
    fn a_replica_holds_its_share_and_a_new_config_does_not_refill_it() {
        let mut c = Ceiling::new(Some(30.0), 1.0, 1.0 / 3.0, 0.0).unwrap();
        c.charge(9.5, 0.0);
        assert!(c.holds(0.5, 0.0));
        assert!(!c.holds(0.6, 0.0), "a third of 30 units/s, one second deep");
        c.charge(0.5, 0.0);
        let mut next = Ceiling::new(Some(60.0), 1.0, 1.0 / 3.0, 0.0).unwrap();
        next.carry(&c, 0.0);
        assert!(!next.holds(1.0, 0.0));
        // A settled credit gives back, never past the size.
        next.settle(100.0, 0.0);
        next.charge(19.5, 0.0);
        assert!(next.holds(0.5, 0.0));
        assert!(!next.holds(0.6, 0.0), "filled to its 20 units and no more");
    }
}
