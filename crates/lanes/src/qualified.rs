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

    #[test]
    fn only_good_and_bad_have_a_label() {
        assert_eq!(Qualified::Good.label(), Some("good"));
        assert_eq!(Qualified::Bad.label(), Some("bad"));
        assert_eq!(Qualified::NotCounted.label(), None);
    }
}
