//! Values by [`Ticket`], for tickets handed out in increasing order (the
//! core's counter): the waiting requests' places in the core, and a
//! caller's own record of what it is waiting for (the simulator's
//! attempts).
//!
//! A hash map of tickets puts every insert at a random place in memory (a
//! cache miss each, and a rehash now and then). Tickets here are counted
//! up, so the map is a window over them instead: `ring[i]` is ticket
//! `base + i`, an insert is a push at its back (the memory just written),
//! a removal an index (one read), and the front moves on as the oldest
//! leave. A request that waits long keeps the window open behind it; when
//! the window holds far more gaps than values, its oldest values move to a
//! hash map beside it, so memory stays in proportion to what is held. A
//! ticket below the window's end (inserted out of order) goes to that map
//! too. Either way the answers are a map's: only where a value sits
//! changes.

use std::collections::{HashMap, VecDeque};

use rustc_hash::FxBuildHasher;

use crate::verdict::Ticket;

/// Gaps the window may hold beyond this many per value before its oldest
/// values move out.
const GAPS_PER_VALUE: usize = 1;
/// A window this short is never thinned.
const MIN_WINDOW: usize = 1024;

/// A map from tickets to values, fastest when tickets are inserted in
/// increasing order.
#[derive(Debug)]
pub struct TicketMap<V> {
    /// `ring[i]` holds ticket `base + i`; its front is live (or it is
    /// empty).
    ring: VecDeque<Option<V>>,
    base: u64,
    /// Values in `ring`.
    live: usize,
    /// Values out of the window (inserted out of order, or moved out of a
    /// window grown sparse).
    spill: HashMap<u64, V, FxBuildHasher>,
}

impl<V> Default for TicketMap<V> {
    fn default() -> Self {
        TicketMap {
            ring: VecDeque::new(),
            base: 0,
            live: 0,
            spill: HashMap::default(),
        }
    }
}

impl<V> TicketMap<V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many values it holds.
    pub fn len(&self) -> usize {
        self.live + self.spill.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The end of the window: the first ticket it does not cover.
    fn end(&self) -> u64 {
        self.base + self.ring.len() as u64
    }

    /// The window's index of a ticket it covers.
    fn index(&self, t: Ticket) -> Option<usize> {
        (t.0 >= self.base && t.0 < self.end()).then(|| (t.0 - self.base) as usize)
    }

    /// Holds `v` for ticket `t`; returns the value it held before.
    pub fn insert(&mut self, t: Ticket, v: V) -> Option<V> {
        if let Some(i) = self.index(t) {
            let old = self.ring[i].replace(v);
            if old.is_none() {
                self.live += 1;
            }
            return old;
        }
        if t.0 < self.base || (!self.ring.is_empty() && t.0 < self.end()) {
            return self.spill.insert(t.0, v);
        }
        let old = self.spill.remove(&t.0);
        if self.ring.is_empty() {
            self.base = t.0;
        }
        let gap = t.0 - self.end();
        if gap > (self.live * GAPS_PER_VALUE).max(MIN_WINDOW) as u64 {
            // A long jump: what the window holds moves out, and it starts
            // again at `t`.
            self.spill_front(self.ring.len());
            self.base = t.0;
        }
        let gap = t.0 - self.end();
        self.ring.extend((0..gap).map(|_| None));
        self.ring.push_back(Some(v));
        self.live += 1;
        self.thin();
        old
    }

    /// Takes ticket `t`'s value out.
    pub fn remove(&mut self, t: Ticket) -> Option<V> {
        let Some(i) = self.index(t) else {
            if self.spill.is_empty() {
                return None;
            }
            return self.spill.remove(&t.0);
        };
        let v = self.ring[i].take()?;
        self.live -= 1;
        if i == 0 {
            self.skip_gaps();
        }
        Some(v)
    }

    /// Ticket `t`'s value.
    pub fn get(&self, t: Ticket) -> Option<&V> {
        match self.index(t) {
            Some(i) => self.ring[i].as_ref(),
            None => self.spill.get(&t.0),
        }
    }

    /// Moves the window's front past the tickets it no longer holds.
    fn skip_gaps(&mut self) {
        while let Some(None) = self.ring.front() {
            self.ring.pop_front();
            self.base += 1;
        }
        if self.ring.is_empty() {
            self.base = 0;
        }
    }

    /// Moves the first `n` tickets of the window (its oldest) out of it.
    fn spill_front(&mut self, n: usize) {
        for _ in 0..n {
            let Some(slot) = self.ring.pop_front() else {
                break;
            };
            if let Some(v) = slot {
                self.live -= 1;
                self.spill.insert(self.base, v);
            }
            self.base += 1;
        }
        self.skip_gaps();
    }

    /// A window holding far more gaps than values moves its oldest values
    /// out until it does not (each value moves at most once).
    fn thin(&mut self) {
        while self.ring.len() > (self.live * GAPS_PER_VALUE).max(MIN_WINDOW) {
            self.spill_front(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_in_order_stay_in_the_window() {
        let mut m = TicketMap::new();
        for t in 1..=100 {
            assert_eq!(m.insert(Ticket(t), t * 10), None);
        }
        assert_eq!(m.remove(Ticket(50)), Some(500));
        assert_eq!(m.remove(Ticket(50)), None);
        assert_eq!(m.get(Ticket(51)), Some(&510));
        assert_eq!(m.len(), 99);
        assert!(m.spill.is_empty());
        assert_eq!(m.remove(Ticket(1)), Some(10));
        assert_eq!(m.base, 2);
    }

    #[test]
    fn an_old_request_does_not_hold_a_long_window_open() {
        let mut m = TicketMap::new();
        m.insert(Ticket(0), 0u64);
        // A million tickets come and go while ticket 0 waits.
        for t in 1..1_000_000 {
            m.insert(Ticket(t), t);
            assert_eq!(m.remove(Ticket(t)), Some(t));
        }
        assert!(m.ring.len() <= MIN_WINDOW, "window {}", m.ring.len());
        assert_eq!(m.get(Ticket(0)), Some(&0));
        assert_eq!(m.remove(Ticket(0)), Some(0));
        assert!(m.is_empty());
    }

    #[test]
    fn a_long_jump_starts_the_window_again() {
        let mut m = TicketMap::new();
        m.insert(Ticket(5), 'a');
        m.insert(Ticket(u64::MAX - 1), 'b');
        assert!(m.ring.len() <= 2);
        assert_eq!(m.get(Ticket(5)), Some(&'a'));
        assert_eq!(m.get(Ticket(u64::MAX - 1)), Some(&'b'));
        assert_eq!(m.insert(Ticket(7), 'c'), None);
        assert_eq!(m.remove(Ticket(7)), Some('c'));
    }

    /// One step: (0 insert at the next ticket, 1 insert a random ticket, 2
    /// remove, 3 get, 4 jump the counter), a pick, a value.
    type Op = (u8, u64, u32);

    fn run(ops: &[Op]) -> Result<(), String> {
        let mut m = TicketMap::new();
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut next = 0u64;
        for (i, &(kind, pick, v)) in ops.iter().enumerate() {
            let held: Vec<u64> = model.keys().copied().collect();
            let any = |p: u64| match held.len() {
                0 => p % 64,
                n => held[(p as usize) % n],
            };
            let (got, want) = match kind {
                0 => {
                    next += 1 + pick % 3;
                    (m.insert(Ticket(next), v), model.insert(next, v))
                }
                1 => {
                    let t = pick % (next + 2);
                    (m.insert(Ticket(t), v), model.insert(t, v))
                }
                2 => {
                    let t = if pick % 5 == 0 {
                        pick % (next + 2)
                    } else {
                        any(pick)
                    };
                    (m.remove(Ticket(t)), model.remove(&t))
                }
                3 => {
                    let t = any(pick);
                    (m.get(Ticket(t)).copied(), model.get(&t).copied())
                }
                _ => {
                    next += pick % 5_000;
                    (None, None)
                }
            };
            if got != want || m.len() != model.len() {
                return Err(format!(
                    "step {i} {:?}: {got:?} against {want:?}, {} values against {}",
                    ops[i],
                    m.len(),
                    model.len()
                ));
            }
            if !m.ring.is_empty() && m.ring.front().is_some_and(Option::is_none) {
                return Err(format!("step {i}: the window's front is a gap"));
            }
        }
        for (t, v) in &model {
            if m.get(Ticket(*t)) != Some(v) {
                return Err(format!("ticket {t} lost"));
            }
        }
        Ok(())
    }

    proptest::proptest! {
        #[test]
        fn the_map_answers_as_a_hash_map_would(
            ops in proptest::collection::vec(
                (proptest::prop_oneof![
                    6 => proptest::strategy::Just(0u8),
                    1 => proptest::strategy::Just(1u8),
                    6 => proptest::strategy::Just(2u8),
                    2 => proptest::strategy::Just(3u8),
                    1 => proptest::strategy::Just(4u8),
                ], 0u64..1_000_000, 0u32..1000),
                1..3000,
            ),
        ) {
            if let Err(e) = run(&ops) {
                proptest::prop_assert!(false, "{e}");
            }
        }
    }
}
