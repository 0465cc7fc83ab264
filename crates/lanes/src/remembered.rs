//! Request ids seen within a lane's deadline (to count retries and to keep
//! a deferred request's first arrival), and the originals and retries of
//! the last seconds (the retry budget).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};

use rustc_hash::FxBuildHasher;

/// Most request ids remembered per lane; the oldest are forgotten first.
pub const MAX_REMEMBERED_IDS: usize = 1_000_000;
/// Retries are counted against originals over this sliding window.
pub const RETRY_WINDOW_SECONDS: usize = 10;

/// Deadlines are remembered in an `f32`, exact for whole seconds up to
/// this (194 days); a longer deadline is remembered this long.
const MAX_REMEMBERED_DEADLINE: f64 = 16_777_216.0;

/// What is remembered of a request id: 16 bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seen {
    pub(crate) first_arrival: f64,
    /// The lane's deadline when it was seen (whole seconds).
    deadline: f32,
    attempts: u16,
    pub(crate) deferred: bool,
}

impl Seen {
    /// An id seen at `first_arrival` in a lane with `deadline` seconds.
    pub(crate) fn new(first_arrival: f64, deadline: f64, attempts: u32, deferred: bool) -> Seen {
        Seen {
            first_arrival,
            deadline: deadline.min(MAX_REMEMBERED_DEADLINE) as f32,
            attempts: attempts.min(u32::from(u16::MAX)) as u16,
            deferred,
        }
    }

    /// When it is forgotten: its deadline after its first arrival.
    pub(crate) fn forget_at(&self) -> f64 {
        self.first_arrival + f64::from(self.deadline)
    }

    /// Attempts counted so far.
    pub(crate) fn attempts(&self) -> u32 {
        u32::from(self.attempts)
    }
}

/// Request ids by a keyed 64-bit hash of the id: a million ids cost about
/// 40 bytes each (a 24-byte table slot and a 16-byte expiry entry) and no
/// string compare (a collision, about one in 10^7 among a million ids,
/// would count one request as another's retry). The key is random per
/// lane, so clients cannot aim collisions, and the map hashes the
/// already-random key cheaply.
#[derive(Debug, Default)]
pub(crate) struct Remembered {
    keys: RandomState,
    ids: HashMap<u64, Seen, FxBuildHasher>,
    /// (forget at, id key), oldest first.
    expiry: VecDeque<(f64, u64)>,
}

impl Remembered {
    /// The key of an id.
    pub(crate) fn key(&self, id: &str) -> u64 {
        self.keys.hash_one(id)
    }

    /// Marks a remembered id as deferred (its return keeps its place).
    pub(crate) fn mark_deferred(&mut self, key: Option<u64>) {
        if let Some(s) = key.and_then(|k| self.ids.get_mut(&k)) {
            s.deferred = true;
        }
    }

    /// Forgets the ids whose deadline has passed, and the oldest ones beyond
    /// [`MAX_REMEMBERED_IDS`].
    pub(crate) fn sweep(&mut self, now: f64) {
        while let Some(&(at, k)) = self.expiry.front() {
            if at > now && self.ids.len() <= MAX_REMEMBERED_IDS {
                break;
            }
            self.expiry.pop_front();
            // An id seen again later has a later forget time (and a later
            // entry): keep it.
            if self.ids.get(&k).is_some_and(|s| s.forget_at() <= at) {
                self.ids.remove(&k);
            }
        }
    }

    /// Looks an id up and remembers what `update` makes of it (given what
    /// was remembered, if anything), in one lookup; returns what was
    /// remembered before. One expiry entry per forget time (a return after a
    /// deferral keeps its first arrival, so it adds none).
    pub(crate) fn record(
        &mut self,
        key: u64,
        update: impl FnOnce(Option<&Seen>) -> Seen,
    ) -> Option<Seen> {
        let (before, forget_at, later) = match self.ids.entry(key) {
            Entry::Occupied(mut e) => {
                let before = *e.get();
                let seen = update(Some(&before));
                e.insert(seen);
                (
                    Some(before),
                    seen.forget_at(),
                    seen.forget_at() > before.forget_at(),
                )
            }
            Entry::Vacant(e) => {
                let seen = update(None);
                e.insert(seen);
                (None, seen.forget_at(), true)
            }
        };
        if later {
            self.expiry.push_back((forget_at, key));
        }
        before
    }

    /// Ids remembered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    #[cfg(test)]
    pub(crate) fn get(&self, key: u64) -> Option<&Seen> {
        self.ids.get(&key)
    }
}

/// Originals and retries per second over the last [`RETRY_WINDOW_SECONDS`].
#[derive(Debug, Default)]
pub(crate) struct RetryWindow {
    /// (second, originals, retries).
    slots: [(i64, u64, u64); RETRY_WINDOW_SECONDS],
}

impl RetryWindow {
    fn slot(&mut self, now: f64) -> &mut (i64, u64, u64) {
        let sec = now.floor() as i64;
        let i = sec.rem_euclid(RETRY_WINDOW_SECONDS as i64) as usize;
        if self.slots[i].0 != sec {
            self.slots[i] = (sec, 0, 0);
        }
        &mut self.slots[i]
    }

    pub(crate) fn original(&mut self, now: f64) {
        self.slot(now).1 += 1;
    }

    pub(crate) fn retry(&mut self, now: f64) {
        self.slot(now).2 += 1;
    }

    /// (originals, retries) over the window.
    pub(crate) fn totals(&self, now: f64) -> (u64, u64) {
        let sec = now.floor() as i64;
        self.slots
            .iter()
            .filter(|(s, _, _)| sec - s < RETRY_WINDOW_SECONDS as i64 && *s <= sec)
            .fold((0, 0), |(o, r), (_, so, sr)| (o + so, r + sr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(at: f64, deadline: f64) -> Seen {
        Seen::new(at, deadline, 1, false)
    }

    #[test]
    fn ids_are_forgotten_after_their_deadline_unless_seen_again() {
        let mut r = Remembered::default();
        let (a, b) = (r.key("a"), r.key("b"));
        assert!(r.record(a, |_| seen(0.0, 10.0)).is_none());
        r.record(b, |_| seen(0.0, 10.0));
        let before = r.record(b, |_| seen(5.0, 10.0));
        assert_eq!(before.map(|s| s.first_arrival), Some(0.0));
        r.sweep(12.0);
        assert!(r.get(a).is_none());
        assert!(r.get(b).is_some(), "seen again at 5 s: kept until 15 s");
        r.sweep(15.0);
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn the_retry_window_slides() {
        let mut w = RetryWindow::default();
        w.original(0.5);
        w.retry(3.0);
        assert_eq!(w.totals(9.9), (1, 1));
        assert_eq!(w.totals(10.0), (0, 1));
        assert_eq!(w.totals(13.0), (0, 0));
    }

    #[test]
    fn a_seen_id_takes_16_bytes_and_keeps_whole_second_deadlines_exactly() {
        assert_eq!(std::mem::size_of::<Seen>(), 16);
        let s = Seen::new(1234.567, 86_400.0, 70_000, true);
        assert_eq!(s.forget_at(), 1234.567 + 86_400.0);
        assert_eq!(s.attempts(), u32::from(u16::MAX));
        let long = Seen::new(0.0, 1e12, 1, false);
        assert_eq!(long.forget_at(), MAX_REMEMBERED_DEADLINE);
    }
}
