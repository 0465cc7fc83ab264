//! The memory request bodies hold, bounded across every connection
//! (`--max-body-memory-bytes`). `--max-body-bytes` bounds one body; without
//! a bound on their sum, a few hundred callers (or one caller's few hundred
//! connections) sending large bodies at once would buffer more than the
//! gateway's memory before any lane saw them, and the pod would be killed
//! with every lane's traffic in it.
//!
//! A request's head takes its share before a byte of its body is read: its
//! `content-length`, or `--max-body-bytes` for a body of unknown length
//! (shrunk to what arrived once it is read). The share is held until the
//! request's handler is done with the body (forwarded, or refused). A head
//! that does not fit is answered 503 `body_memory_full` with `Retry-After`,
//! its body unread. The lanes of the config's highest priority may use the
//! whole budget; the others leave a quarter of it to them
//! ([`RESERVED_PART`]; rule 14: the lowest lanes are refused first, P0 keeps
//! its reserve). Nothing waits for memory: a request is held or refused at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use prometheus::IntGauge;

/// The part of the budget held for the lanes of the highest priority: one
/// in this many bytes (a quarter).
pub(super) const RESERVED_PART: usize = 4;

/// Who may use the part of the budget held for the highest priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BodyClass {
    /// A lane of the config's highest priority: the whole budget.
    Reserved,
    /// Any other lane: all but its reserved part.
    Shared,
}

/// The bytes held by bodies, against the budget.
#[derive(Debug)]
pub(super) struct BodyBudget {
    held: AtomicUsize,
    limit: usize,
    gauge: IntGauge,
}

impl BodyBudget {
    /// A budget of `limit` bytes, its use shown by `gauge`.
    pub(super) fn new(limit: usize, gauge: IntGauge) -> Arc<BodyBudget> {
        Arc::new(BodyBudget {
            held: AtomicUsize::new(0),
            limit,
            gauge,
        })
    }

    /// The most `class` may bring the held bytes to.
    fn ceiling(&self, class: BodyClass) -> usize {
        match class {
            BodyClass::Reserved => self.limit,
            BodyClass::Shared => self.limit - self.limit / RESERVED_PART,
        }
    }

    /// `bytes` held for a body of `class`, or None when they do not fit.
    pub(super) fn hold(self: &Arc<Self>, bytes: usize, class: BodyClass) -> Option<BodyHold> {
        let ceiling = self.ceiling(class);
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&after| after <= ceiling)
            })
            .ok()?;
        self.gauge.add(gauge_delta(bytes));
        Some(BodyHold(Arc::new(Held {
            budget: Arc::clone(self),
            bytes: AtomicUsize::new(bytes),
        })))
    }

    fn release(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
        self.gauge.sub(gauge_delta(bytes));
    }

    /// The bytes held now.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

fn gauge_delta(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// A body's share of the budget, given back when its last copy is dropped
/// (the request's extensions and its handler each keep one).
#[derive(Clone, Debug)]
pub(super) struct BodyHold(Arc<Held>);

#[derive(Debug)]
struct Held {
    budget: Arc<BodyBudget>,
    bytes: AtomicUsize,
}

impl BodyHold {
    /// The share cut to `bytes` (a body of unknown length, once read);
    /// never grown.
    pub(super) fn shrink_to(&self, bytes: usize) {
        let before = self.0.bytes.fetch_min(bytes, Ordering::AcqRel);
        if before > bytes {
            self.0.budget.release(before - bytes);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.release(*self.bytes.get_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn budget(limit: usize) -> Arc<BodyBudget> {
        BodyBudget::new(limit, IntGauge::new("held", "held").unwrap())
    }

    #[test]
    fn the_lower_lanes_leave_the_reserve_to_the_highest() {
        let b = budget(1000);
        let shared = b
            .hold(750, BodyClass::Shared)
            .expect("within three quarters");
        assert!(
            b.hold(1, BodyClass::Shared).is_none(),
            "past three quarters"
        );
        let top = b.hold(250, BodyClass::Reserved).expect("the reserve");
        assert!(b.hold(1, BodyClass::Reserved).is_none(), "past the budget");
        drop(shared);
        assert_eq!(b.held(), 250);
        assert!(b.hold(500, BodyClass::Shared).is_some());
        drop(top);
    }

    #[test]
    fn a_share_is_given_back_once_by_its_last_copy_and_shrinks_only() {
        let b = budget(1000);
        let h = b.hold(600, BodyClass::Reserved).unwrap();
        let copy = h.clone();
        h.shrink_to(100);
        h.shrink_to(400);
        assert_eq!(b.held(), 100, "shrunk, never grown");
        drop(h);
        assert_eq!(b.held(), 100, "a copy still holds it");
        drop(copy);
        assert_eq!(b.held(), 0);
        assert_eq!(b.gauge.get(), 0);
    }

    proptest! {
        /// Whatever the order of holds, shrinks and drops, the bytes held
        /// never pass the budget (or three quarters of it for the lower lanes) and
        /// come back to zero.
        #[test]
        fn held_bytes_stay_within_the_budget(
            ops in prop::collection::vec((0usize..400, any::<bool>(), 0usize..400, any::<bool>()), 1..60),
        ) {
            let b = budget(1000);
            let mut holds = Vec::new();
            for (bytes, top, shrink, drop_one) in ops {
                let class = if top { BodyClass::Reserved } else { BodyClass::Shared };
                let before = b.held();
                match b.hold(bytes, class) {
                    Some(h) => {
                        prop_assert!(b.held() <= b.ceiling(class));
                        h.shrink_to(shrink);
                        holds.push(h);
                    }
                    None => prop_assert!(before + bytes > b.ceiling(class)),
                }
                if drop_one && !holds.is_empty() {
                    holds.swap_remove(0);
                }
                prop_assert!(b.held() <= 1000);
                prop_assert_eq!(b.gauge.get(), i64::try_from(b.held()).unwrap());
            }
            holds.clear();
            prop_assert_eq!(b.held(), 0);
        }
    }
}
