//! Whether a replica enforces the fleet's shared budgets or its local 1/N
//! share: failure is safe, never open. One failed or late call to the
//! shared store puts the replica on its local share at once; while there it
//! asks the store again only once per [`PROBE_SECONDS`] (a probe), and the
//! first probe answered in time brings it back.

/// How often a replica on its local share probes the store.
pub const PROBE_SECONDS: f64 = 1.0;

/// Which budgets a replica enforces now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FleetMode {
    /// The fleet's, through the shared store.
    Shared,
    /// Its own 1/N share, since the given time, the store being down or slow.
    Local {
        /// When the replica fell back.
        since: f64,
    },
}

impl FleetMode {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            FleetMode::Shared => "shared",
            FleetMode::Local { .. } => "local",
        }
    }
}

/// The replica's view of the store's health.
#[derive(Clone, Debug)]
pub struct FleetHealth {
    mode: FleetMode,
    next_probe: f64,
}

impl FleetHealth {
    /// A replica starts on its local share and probes at once: nothing is
    /// shared before the store has answered.
    pub fn new(now: f64) -> FleetHealth {
        FleetHealth {
            mode: FleetMode::Local { since: now },
            next_probe: now,
        }
    }

    /// The mode now.
    pub fn mode(&self) -> FleetMode {
        self.mode
    }

    /// Whether to call the store at `now`: always when shared, once per
    /// probe interval when local.
    pub fn may_call(&mut self, now: f64) -> bool {
        match self.mode {
            FleetMode::Shared => true,
            FleetMode::Local { .. } if now >= self.next_probe => {
                self.next_probe = now + PROBE_SECONDS;
                true
            }
            FleetMode::Local { .. } => false,
        }
    }

    /// A call answered in time. Returns the new mode when it changed.
    pub fn answered(&mut self) -> Option<FleetMode> {
        let changed = self.mode != FleetMode::Shared;
        self.mode = FleetMode::Shared;
        changed.then_some(self.mode)
    }

    /// A call failed or missed its deadline at `now`. Returns the new mode
    /// when it changed.
    pub fn failed(&mut self, now: f64) -> Option<FleetMode> {
        self.next_probe = now + PROBE_SECONDS;
        match self.mode {
            FleetMode::Shared => {
                self.mode = FleetMode::Local { since: now };
                Some(self.mode)
            }
            FleetMode::Local { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_shares_nothing_before_the_store_answers() {
        let mut h = FleetHealth::new(0.0);
        assert_eq!(h.mode(), FleetMode::Local { since: 0.0 });
        assert!(h.may_call(0.0), "it probes at once");
        assert!(!h.may_call(0.5), "then once a second");
        assert_eq!(h.answered(), Some(FleetMode::Shared));
        assert_eq!(h.answered(), None);
    }

    #[test]
    fn one_failure_falls_back_at_once_and_probes_bring_it_back() {
        let mut h = FleetHealth::new(0.0);
        h.answered();
        assert!(h.may_call(1.0));
        assert_eq!(h.failed(1.0), Some(FleetMode::Local { since: 1.0 }));
        assert_eq!(
            h.failed(1.001),
            None,
            "still local, since the first failure"
        );
        assert_eq!(h.mode(), FleetMode::Local { since: 1.0 });
        assert!(!h.may_call(1.5), "no call until the probe is due");
        assert!(h.may_call(2.001));
        assert!(!h.may_call(2.5), "one probe per interval");
        assert_eq!(h.failed(2.01), None);
        assert!(h.may_call(3.01));
        assert_eq!(h.answered(), Some(FleetMode::Shared));
        assert!(
            h.may_call(3.02) && h.may_call(3.03),
            "shared: every call goes"
        );
        assert_eq!(h.mode().as_str(), "shared");
    }
}
