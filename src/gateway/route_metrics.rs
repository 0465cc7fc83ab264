//! The routes' metric families: each breaker's state and transitions, each
//! route's pace and its upstream's push-backs, the requests kept away from
//! a route.

use lanes::{BreakerState, Transition};
use prometheus::{Gauge, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};

/// Why a request was kept away from a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KeptAway {
    /// Its breaker is open (or a probe is under way).
    BreakerOpen,
    /// The route is paced and full.
    Paced,
}

impl KeptAway {
    fn as_str(self) -> &'static str {
        match self {
            KeptAway::BreakerOpen => "breaker_open",
            KeptAway::Paced => "paced",
        }
    }
}

/// The route families.
pub(super) struct RouteMetrics {
    state: IntGaugeVec,
    transitions: IntCounterVec,
    share: GaugeVec,
    push_backs: IntCounterVec,
    kept_away: IntCounterVec,
    fallbacks: IntCounterVec,
}

impl RouteMetrics {
    pub(super) fn new(r: &Registry) -> RouteMetrics {
        let ints = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            r.register(Box::new(c.clone())).expect("registered once");
            c
        };
        let state = IntGaugeVec::new(
            Opts::new(
                "lanekeeper_gateway_route_breaker_state",
                "1 for the state each route's circuit breaker is in (closed, open, half_open), 0 for the others.",
            ),
            &["route", "state"],
        )
        .expect("valid metric");
        r.register(Box::new(state.clone()))
            .expect("registered once");
        let share = GaugeVec::new(
            Opts::new(
                "lanekeeper_gateway_route_share",
                "Share (0..1) of its in-flight peak a route that pushed back (429, or 503 with Retry-After) takes now; 1 when not paced.",
            ),
            &["route"],
        )
        .expect("valid metric");
        r.register(Box::new(share.clone()))
            .expect("registered once");
        RouteMetrics {
            state,
            share,
            transitions: ints(
                "lanekeeper_gateway_route_breaker_transitions_total",
                "Changes of state of each route's circuit breaker.",
                &["route", "from", "to"],
            ),
            push_backs: ints(
                "lanekeeper_gateway_upstream_push_backs_total",
                "Upstream answers asking the gateway to slow down (429, or 503 with Retry-After), by route and status.",
                &["route", "status"],
            ),
            kept_away: ints(
                "lanekeeper_gateway_route_kept_away_total",
                "Requests a route did not get because its breaker was open or it was paced (reason).",
                &["route", "reason"],
            ),
            fallbacks: ints(
                "lanekeeper_gateway_breaker_fallbacks_total",
                "Requests sent to a lane's approved fallback route because the breakers of its routes were open.",
                &["route"],
            ),
        }
    }

    /// A breaker's state now (its first sighting included).
    pub(super) fn state(&self, route: &str, now: BreakerState) {
        for s in BreakerState::ALL {
            self.state
                .with_label_values(&[route, s.as_str()])
                .set(i64::from(s == now));
        }
    }

    pub(super) fn transition(&self, route: &str, t: Transition) {
        self.transitions
            .with_label_values(&[route, t.from.as_str(), t.to.as_str()])
            .inc();
        self.state(route, t.to);
    }

    /// A route's share gauge, for its breaker and pace to keep.
    pub(super) fn share_of(&self, route: &str) -> Gauge {
        self.share.with_label_values(&[route])
    }

    pub(super) fn push_back(&self, route: &str, status: u16) {
        self.push_backs
            .with_label_values(&[route, &status.to_string()])
            .inc();
    }

    pub(super) fn kept_away(&self, route: &str, why: KeptAway) {
        self.kept_away
            .with_label_values(&[route, why.as_str()])
            .inc();
    }

    pub(super) fn fallback(&self, route: &str) {
        self.fallbacks.with_label_values(&[route]).inc();
    }
}
