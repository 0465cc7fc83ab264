//! The fleet's shared-state metric families: which budgets a replica
//! enforces now (`shared` or `local`), how often it fell back, and the calls
//! it made to the store by operation and result.

use lanes::fleet_mode::FleetMode;
use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};

/// A call to the shared store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StoreOp {
    /// Tokens of a lease taken.
    Take,
    /// Unused tokens given back.
    GiveBack,
    /// A request id's first sighting.
    Sighting,
    /// A probe while on the local share (connect or ping).
    Probe,
    /// Slots of a tenant's or the pool's count taken, given back or
    /// renewed.
    Slots,
    /// A request id marked deferred.
    Deferral,
    /// The replica noted as sharing, and the sharing replicas counted.
    Heartbeat,
}

impl StoreOp {
    fn as_str(self) -> &'static str {
        match self {
            StoreOp::Take => "take",
            StoreOp::GiveBack => "give_back",
            StoreOp::Sighting => "sighting",
            StoreOp::Probe => "probe",
            StoreOp::Slots => "slots",
            StoreOp::Deferral => "deferral",
            StoreOp::Heartbeat => "heartbeat",
        }
    }
}

/// Which kind of the fleet's buckets a lease is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BudgetKind {
    /// A lane's bucket.
    Lane,
    /// The pool's spare-capacity bucket.
    Spare,
}

/// Which way lease tokens went between a replica and the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LeaseDirection {
    /// Granted by the store to this replica.
    Taken,
    /// Given back by this replica to the store.
    Returned,
}

impl LeaseDirection {
    fn as_str(self) -> &'static str {
        match self {
            LeaseDirection::Taken => "taken",
            LeaseDirection::Returned => "returned",
        }
    }
}

/// The shared-state families.
pub(super) struct FleetMetrics {
    mode: IntGaugeVec,
    fallbacks: IntCounter,
    calls: IntCounterVec,
    lease_units: IntCounterVec,
    late: IntCounterVec,
}

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(c.clone())).expect("registered once");
    c
}

impl FleetMetrics {
    pub(super) fn new(r: &Registry) -> FleetMetrics {
        let mode = IntGaugeVec::new(
            Opts::new(
                "lanekeeper_gateway_shared_state_mode",
                "1 for the budgets this replica enforces now: shared (the fleet's, through --shared-state) or local (its 1/N share: no store, or the store down or slow), 0 for the other.",
            ),
            &["mode"],
        )
        .expect("valid metric");
        r.register(Box::new(mode.clone())).expect("registered once");
        let fallbacks = IntCounter::new(
            "lanekeeper_gateway_shared_state_fallbacks_total",
            "Times this replica fell back from the shared store to its local 1/N share.",
        )
        .expect("valid metric");
        r.register(Box::new(fallbacks.clone()))
            .expect("registered once");
        let calls = IntCounterVec::new(
            Opts::new(
                "lanekeeper_gateway_shared_state_calls_total",
                "Calls to the shared store by operation (take, give_back, sighting, probe, slots, deferral) and result (ok, failed).",
            ),
            &["op", "result"],
        )
        .expect("valid metric");
        r.register(Box::new(calls.clone()))
            .expect("registered once");
        let lease_units = counter_vec(
            r,
            "lanekeeper_gateway_shared_state_lease_units_total",
            "Tokens of the fleet's buckets this replica was granted (taken) or gave back (returned), counted when the store's answer came, in time or late; by budget (lane, or spare for the pool's spare capacity) and lane. Summed over the replicas they equal the taken and returned totals in each bucket's key.",
            &["budget", "lane", "direction"],
        );
        let late = counter_vec(
            r,
            "lanekeeper_gateway_shared_state_late_answers_total",
            "Lease calls whose answer came after the call's deadline (the replica had gone on on its local share): a late grant is used or given back, a late give-back is counted once.",
            &["op"],
        );
        let m = FleetMetrics {
            mode,
            fallbacks,
            calls,
            lease_units,
            late,
        };
        m.mode(FleetMode::Local { since: 0.0 });
        m
    }

    /// The mode now.
    pub(super) fn mode(&self, mode: FleetMode) {
        let shared = matches!(mode, FleetMode::Shared);
        self.mode
            .with_label_values(&["shared"])
            .set(i64::from(shared));
        self.mode
            .with_label_values(&["local"])
            .set(i64::from(!shared));
    }

    /// The replica fell back to its local share.
    pub(super) fn fell_back(&self) {
        self.fallbacks.inc();
    }

    /// Lease tokens granted or given back (answered).
    pub(super) fn lease_units(
        &self,
        (kind, lane): (BudgetKind, &str),
        direction: LeaseDirection,
        n: u64,
    ) {
        let kind = match kind {
            BudgetKind::Lane => "lane",
            BudgetKind::Spare => "spare",
        };
        self.lease_units
            .with_label_values(&[kind, lane, direction.as_str()])
            .inc_by(n);
    }

    /// A lease call answered after its deadline.
    pub(super) fn late(&self, op: StoreOp) {
        self.late.with_label_values(&[op.as_str()]).inc();
    }

    /// A call and whether it was answered in time.
    pub(super) fn call(&self, op: StoreOp, ok: bool) {
        self.calls
            .with_label_values(&[op.as_str(), if ok { "ok" } else { "failed" }])
            .inc();
    }
}
