//! Qualified outcomes: which requests count for a lane's objective, and
//! how. Defined here once; the gateway counts by it and the docs state it
//! (docs/concepts.md, "Objectives and error budgets").
//!
//! - **Good**: admitted and answered within the lane's deadline.
//! - **Bad**: admitted, then failed (the upstream was unreachable, answered
//!   with a 5xx, or broke off mid-answer), timed out, or answered past the
//!   deadline; or refused while the lane was inside its floor (a broken
//!   promise: the floor was not given).
//! - **Not counted**: refusals the contract allows (over the ceiling or a
//!   level's cap, a paused lane, a deferral, the retry rules), a client's
//!   bad request (answered before admission, no lane counted), and a client
//!   that went away before any answer began.

use crate::verdict::{Outcome, Refusal};

/// How one request counts for its lane's objective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Qualified {
    /// Answered within the deadline.
    Good,
    /// A broken promise: failed, late, or refused inside the floor.
    Bad,
    /// Outside the objective.
    NotCounted,
}

impl Qualified {
    /// The metric label value (`good`, `bad`); None when not counted.
    pub fn label(self) -> Option<&'static str> {
        match self {
            Qualified::Good => Some("good"),
            Qualified::Bad => Some("bad"),
            Qualified::NotCounted => None,
        }
    }
}

/// How an admitted request ended, as the proxy saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    /// The answer began (response headers came back from the upstream).
    pub answered: bool,
    /// The upstream failed: unreachable, a 5xx, or the answer broke off.
    pub failed: bool,
    /// It ended after its deadline (a timeout, or a late or cut answer).
    pub late: bool,
}

/// How an admitted request counts.
pub fn served(s: Served) -> Qualified {
    if s.failed || s.late {
        Qualified::Bad
    } else if s.answered {
        Qualified::Good
    } else {
        // The client went away before any answer began, in time.
        Qualified::NotCounted
    }
}

/// How a refusal counts: bad only when the lane was inside its floor (the
/// floor was not given) and the refusal is not one the contract allows
/// anyway (a deferral, the retry rules).
pub fn refused(r: &Refusal) -> Qualified {
    match r.outcome {
        Outcome::Deferred | Outcome::RejectedRetryBudget => Qualified::NotCounted,
        // Not refusals: an admitted or queued request counts when it ends.
        Outcome::Admitted | Outcome::Queued => Qualified::NotCounted,
        Outcome::UpstreamError => Qualified::Bad,
        Outcome::RejectedRate
        | Outcome::RejectedQueueFull
        | Outcome::RejectedDeadline
        | Outcome::RejectedOverload
        | Outcome::Expired => {
            if r.inside_floor {
                Qualified::Bad
            } else {
                Qualified::NotCounted
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::{Attempt, Limit};

    fn refusal(outcome: Outcome, inside_floor: bool) -> Refusal {
        Refusal {
            lane: 0,
            attempt: Attempt::Original,
            outcome,
            limit: Limit::Rate,
            retry_after_seconds: None,
            inside_floor,
        }
    }

    #[test]
    fn an_answer_in_time_is_good_and_every_failure_or_lateness_is_bad() {
        let s = |answered, failed, late| {
            served(Served {
                answered,
                failed,
                late,
            })
        };
        assert_eq!(s(true, false, false), Qualified::Good);
        assert_eq!(s(true, false, true), Qualified::Bad, "answered late");
        assert_eq!(s(true, true, false), Qualified::Bad, "5xx or cut");
        assert_eq!(s(false, true, false), Qualified::Bad, "unreachable");
        assert_eq!(s(false, false, true), Qualified::Bad, "timed out");
        assert_eq!(s(false, false, false), Qualified::NotCounted, "client left");
    }

    #[test]
    fn refusals_outside_the_floor_are_not_counted() {
        for o in Outcome::ALL {
            if o == Outcome::UpstreamError {
                continue;
            }
            assert_eq!(refused(&refusal(o, false)), Qualified::NotCounted, "{o:?}");
        }
    }

    #[test]
    fn a_refusal_inside_the_floor_is_a_broken_promise_unless_allowed_anyway() {
        for o in [
            Outcome::RejectedRate,
            Outcome::RejectedQueueFull,
            Outcome::RejectedDeadline,
            Outcome::RejectedOverload,
            Outcome::Expired,
        ] {
            assert_eq!(refused(&refusal(o, true)), Qualified::Bad, "{o:?}");
        }
        for o in [Outcome::Deferred, Outcome::RejectedRetryBudget] {
            assert_eq!(refused(&refusal(o, true)), Qualified::NotCounted, "{o:?}");
        }
    }

    mod core {
        use crate::Core;
        use crate::config::{InFlight, LaneConfig};
        use crate::qualified::{Qualified, refused};
        use crate::tests::{config, req};
        use crate::verdict::{Limit, Outcome, Verdict};

        /// The core tests' lane at `rps` with no queue and `floor`.
        fn lane(name: &str, rps: f64, floor: Option<f64>) -> LaneConfig {
            let mut l = crate::tests::lane(name, rps, rps as u64);
            l.queue.max_depth = 0;
            l.retry_after_seconds = Some(1);
            l.floor_units_per_second = floor;
            l
        }

        /// A pool of 1,000 units/s that holds sheddable lanes at `stop_at`
        /// in flight.
        fn core(lanes: Vec<LaneConfig>, stop_at: i64) -> Core {
            let mut cfg = config(lanes);
            cfg.capacity_units_per_second = Some(1000.0);
            cfg.in_flight = Some(InFlight {
                conserve_at: stop_at,
                stop_at,
                resume_below: 1,
                resume_after_stable_seconds: Some(30),
            });
            Core::new(cfg, 1.0, 0.0, 0.0).unwrap()
        }

        #[test]
        fn a_refusal_under_the_floor_is_bad_and_one_over_it_is_not_counted() {
            // A floor of 100 req/s; the pool holds sheddable lanes at 2 in
            // flight and one request finished in the last 5 s (a slot every
            // 5 s): the first request over the limit waits 5 s for a slot,
            // the second would wait 10 s, past its 5 s TTL, and is refused
            // with 3 admitted, far inside the floor.
            let mut floored = lane("floored", 100.0, Some(100.0));
            floored.queue.max_depth = 10;
            let mut c = core(vec![floored], 2);
            for _ in 0..2 {
                assert!(matches!(c.admit(&req("floored"), 0.0), Verdict::Pass(_)));
                c.started(0.0);
            }
            c.finished(0.0, 0.1);
            assert!(matches!(c.admit(&req("floored"), 0.0), Verdict::Pass(_)));
            c.started(0.0);
            assert!(matches!(
                c.admit(&req("floored"), 0.0),
                Verdict::Queued { .. }
            ));
            let Verdict::Refuse(r) = c.admit(&req("floored"), 0.0) else {
                panic!("held by the limit");
            };
            assert_eq!(r.limit, Limit::StopAt);
            assert_eq!(r.outcome, Outcome::RejectedOverload);
            assert!(r.inside_floor);
            assert_eq!(refused(&r), Qualified::Bad);
        }

        #[test]
        fn a_lane_over_its_floor_or_without_one_is_refused_without_breaking_a_promise() {
            let mut c = core(
                vec![lane("floored", 10.0, Some(10.0)), lane("bare", 10.0, None)],
                1_000,
            );
            for name in ["floored", "bare"] {
                for _ in 0..10 {
                    assert!(matches!(c.admit(&req(name), 0.5), Verdict::Pass(_)));
                }
                let Verdict::Refuse(r) = c.admit(&req(name), 0.5) else {
                    panic!("{name}: over its rate");
                };
                assert!(
                    matches!(
                        r.outcome,
                        Outcome::RejectedRate | Outcome::RejectedQueueFull
                    ),
                    "{name}: {r:?}"
                );
                assert!(!r.inside_floor, "{name}: 10 admitted of a floor of 10");
                assert_eq!(refused(&r), Qualified::NotCounted, "{name}");
            }
        }
    }

    #[test]
    fn only_good_and_bad_have_a_label() {
        assert_eq!(Qualified::Good.label(), Some("good"));
        assert_eq!(Qualified::Bad.label(), Some("bad"));
        assert_eq!(Qualified::NotCounted.label(), None);
    }
}
