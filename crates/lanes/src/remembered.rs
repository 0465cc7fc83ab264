//! Request ids seen within a lane's deadline (to count retries and to keep
//! a deferred request's first arrival), and the originals and retries of
//! the last seconds (the retry budget).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};

use rustc_hash::FxBuildHasher;

/// Most request ids remembered per lane; the oldest are forgotten first.
pub const MAX_REMEMBERED_IDS: usize = 1_000_000;
/// Retries are counted against originals over this sliding window.
pub const RETRY_WINDOW_SECONDS: usize = 10;

/// What is remembered of a request id.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seen {
    pub(crate) first_arrival: f64,
    pub(crate) forget_at: f64,
    pub(crate) attempts: u32,
    pub(crate) deferred: bool,
}

/// Request ids by a keyed 64-bit hash of the id: a million ids cost about
/// 40 bytes each and no string compare (a collision, about one in 10^7
/// among a million ids, would count one request as another's retry). The
/// key is random per lane, so clients cannot aim collisions, and the map
/// hashes the already-random key cheaply.
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

    pub(crate) fn get(&self, key: u64) -> Option<&Seen> {
        self.ids.get(&key)
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
            // An id seen again later has a later forget_at (and a later
            // entry): keep it.
            if self.ids.get(&k).is_some_and(|s| s.forget_at <= at) {
                self.ids.remove(&k);
            }
        }
    }

    /// Remembers an id; one expiry entry per forget time (a return after a
    /// deferral keeps its first arrival, so it adds none).
    pub(crate) fn touch(&mut self, key: u64, seen: Seen) {
        match self.ids.get_mut(&key) {
            Some(s) => {
                let later = seen.forget_at > s.forget_at;
                *s = seen;
                if later {
                    self.expiry.push_back((seen.forget_at, key));
                }
            }
            None => {
                self.ids.insert(key, seen);
                self.expiry.push_back((seen.forget_at, key));
            }
        }
    }

    /// Ids remembered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
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
        Seen {
            first_arrival: at,
            forget_at: at + deadline,
            attempts: 1,
            deferred: false,
        }
    }

    #[test]
    fn ids_are_forgotten_after_their_deadline_unless_seen_again() {
        let mut r = Remembered::default();
        let (a, b) = (r.key("a"), r.key("b"));
        r.touch(a, seen(0.0, 10.0));
        r.touch(b, seen(0.0, 10.0));
        r.touch(b, seen(5.0, 10.0));
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
}
