//! Request ids seen within a lane's deadline (to count retries and to keep
//! a deferred request's first arrival), and the originals and retries of
//! the last seconds (the retry budget).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

use crate::id_hint::IdHint;
use crate::id_ring::IdRing;

/// Most request ids remembered per lane; the oldest are forgotten first.
pub const MAX_REMEMBERED_IDS: usize = 1_000_000;
/// Retries are counted against originals over this sliding window.
pub const RETRY_WINDOW_SECONDS: usize = 10;

/// The index's tables.
const SHARDS: usize = 16;

/// The table of a key: bits 32..36, which a table of fewer than 2^32 slots
/// does not use to place a key (its low bits) or to tell keys apart in a
/// group (its top 7).
fn shard(key: u64) -> usize {
    ((key >> 32) as usize) % SHARDS
}

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

/// One write of an id: what is remembered of it (stale in every write of
/// it but the last, the live one). 24 bytes. The write is forgotten at the
/// forget time it had when written: `first_arrival + deadline`, unless an
/// update in place changed those (then [`Remembered::moved`] keeps it).
#[derive(Clone, Copy, Debug)]
struct Entry {
    key: u64,
    first_arrival: f64,
    deadline: f32,
    attempts: u16,
    deferred: bool,
    /// The index points here.
    live: bool,
}

impl Entry {
    fn seen(&self) -> Seen {
        Seen {
            first_arrival: self.first_arrival,
            deadline: self.deadline,
            attempts: self.attempts,
            deferred: self.deferred,
        }
    }

    fn write(key: u64, s: Seen) -> Entry {
        Entry {
            key,
            first_arrival: s.first_arrival,
            deadline: s.deadline,
            attempts: s.attempts,
            deferred: s.deferred,
            live: true,
        }
    }
}

/// A request id as an arrival found it: its key, and where its write was
/// (so that marking it deferred later need not look the key up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IdRef {
    key: u64,
    pos: u64,
}

/// Request ids by a keyed 64-bit hash of the id, no string compare (a
/// collision, about one in 10^7 among a million ids, would count one
/// request as another's retry). The key is random per lane, so clients
/// cannot aim collisions, and it is its own hash in the index.
///
/// The writes are kept in the order they were made ([`IdRing`], 24 bytes
/// each), which is also the order their memory runs out in; the index
/// holds only the position of each id's last write (4 bytes and a control
/// byte a slot). A million ids take about 35 MB, not the 80 MB of a map of
/// ids beside a queue of their expiries.
#[derive(Debug, Default)]
pub(crate) struct Remembered {
    keys: RandomState,
    /// Every id's last write, by the low 32 bits of its position, in
    /// [`SHARDS`] tables (by bits of the key the tables do not use): each
    /// doubles on its own, so growing never holds two copies of the whole
    /// index at once.
    index: [HashTable<u32>; SHARDS],
    /// Ids in the index (the sum of its tables' lengths, kept at hand for
    /// the check on every arrival).
    ids: usize,
    writes: IdRing<Entry>,
    /// The forget time of each write updated in place to another first
    /// arrival or deadline (only when a config shortens a deadline).
    moved: HashMap<u64, f64, FxBuildHasher>,
}

impl Remembered {
    /// The key of an id.
    pub(crate) fn key(&self, id: &str) -> u64 {
        self.keys.hash_one(id)
    }

    /// The position of an id's last write.
    fn find(&self, key: u64) -> Option<u64> {
        let writes = &self.writes;
        self.index[shard(key)]
            .find(key, |&low| writes.get(writes.position(low)).key == key)
            .map(|&low| writes.position(low))
    }

    /// The position of an id's last write, read first where `hint` says
    /// (one read, no look-up, when it is right).
    fn find_hinted(&self, key: u64, hint: IdHint) -> Option<u64> {
        match hint.low().map(|low| self.writes.position(low)) {
            Some(pos) if self.is_live(pos, key) => Some(pos),
            _ => self.find(key),
        }
    }

    /// Whether the write at `pos` is held and is `key`'s live one (the one
    /// the index points to).
    fn is_live(&self, pos: u64, key: u64) -> bool {
        self.writes.holds(pos) && {
            let e = self.writes.get(pos);
            e.live && e.key == key
        }
    }

    /// When the write at `pos` is forgotten.
    fn forget_at(&self, pos: u64) -> f64 {
        match self.moved.is_empty() {
            true => self.writes.get(pos).seen().forget_at(),
            false => match self.moved.get(&pos) {
                Some(&at) => at,
                None => self.writes.get(pos).seen().forget_at(),
            },
        }
    }

    /// Marks a remembered id as deferred (its return keeps its place).
    pub(crate) fn mark_deferred(&mut self, id: Option<IdRef>) {
        let Some(IdRef { key, pos }) = id else {
            return;
        };
        let pos = if self.is_live(pos, key) {
            Some(pos)
        } else {
            // Written again since (or forgotten).
            self.find(key)
        };
        if let Some(pos) = pos {
            self.writes.get_mut(pos).deferred = true;
        }
    }

    /// Takes the deferral off a remembered id (a return elsewhere in the
    /// fleet consumed it): its next arrival here is a retry.
    pub(crate) fn clear_deferred(&mut self, key: u64) {
        if let Some(pos) = self.find(key) {
            self.writes.get_mut(pos).deferred = false;
        }
    }

    /// Forgets the ids whose deadline has passed, and the oldest ones beyond
    /// [`MAX_REMEMBERED_IDS`].
    pub(crate) fn sweep(&mut self, now: f64) {
        while let Some(&Entry { key, .. }) = self.writes.front() {
            let head = self.writes.head();
            let at = self.forget_at(head);
            if at > now && self.len() <= MAX_REMEMBERED_IDS {
                break;
            }
            // An id written again later with a later forget time (a later
            // write) is kept. The live write itself always goes: its id
            // was never given a later forget time.
            let writes = &mut self.writes;
            if let Ok(e) = self.index[shard(key)]
                .find_entry(key, |&low| writes.get(writes.position(low)).key == key)
            {
                let live = writes.position(*e.get());
                if writes.get(live).seen().forget_at() <= at {
                    e.remove();
                    self.ids -= 1;
                    writes.get_mut(live).live = false;
                }
            }
            self.writes.pop_front();
            if !self.moved.is_empty() {
                self.moved.remove(&head);
            }
        }
    }

    /// [`Remembered::write`], and what was remembered before.
    #[cfg(test)]
    pub(crate) fn record(
        &mut self,
        key: u64,
        hint: IdHint,
        update: impl FnOnce(Option<&Seen>) -> Seen,
    ) -> (Option<Seen>, IdRef) {
        let mut before = None;
        let id = self.write(key, hint, |seen| {
            before = seen.copied();
            update(seen)
        });
        (before, id)
    }

    /// Looks an id up and remembers what `update` makes of it (given what
    /// was remembered, if anything); returns the id as found. A new write
    /// when the id is new or its forget time is later (a return after a
    /// deferral keeps its first arrival, so it adds none). `hint` may say
    /// where its last write is. The answer, 16 bytes, comes back in two
    /// registers: a larger one (with what was remembered before) came
    /// back through memory, and reading it right after the call stalled on
    /// the stores that had just written it (5 % of an INC-47 simulation).
    /// `update` sees what was remembered before.
    pub(crate) fn write(
        &mut self,
        key: u64,
        hint: IdHint,
        update: impl FnOnce(Option<&Seen>) -> Seen,
    ) -> IdRef {
        let Some(pos) = self.find_hinted(key, hint) else {
            let seen = update(None);
            let writes = &mut self.writes;
            let pos = writes.push(Entry::write(key, seen));
            self.index[shard(key)]
                .insert_unique(key, pos as u32, |&low| writes.get(writes.position(low)).key);
            self.ids += 1;
            return IdRef { key, pos };
        };
        let before = self.writes.get(pos).seen();
        let seen = update(Some(&before));
        if seen.forget_at() > before.forget_at() {
            self.writes.get_mut(pos).live = false;
            let at = self.writes.push(Entry::write(key, seen));
            let writes = &self.writes;
            if let Some(low) = self.index[shard(key)]
                .find_mut(key, |&low| writes.get(writes.position(low)).key == key)
            {
                *low = at as u32;
            }
            return IdRef { key, pos: at };
        }
        let at = self.forget_at(pos);
        if seen.forget_at() != at {
            self.moved.insert(pos, at);
        }
        *self.writes.get_mut(pos) = Entry::write(key, seen);
        IdRef { key, pos }
    }

    /// Where an id as found was written: the hint its client may carry.
    pub(crate) fn hint(id: IdRef) -> IdHint {
        IdHint::at(id.pos)
    }

    /// Ids remembered now.
    pub(crate) fn len(&self) -> usize {
        debug_assert_eq!(
            self.ids,
            self.index.iter().map(HashTable::len).sum::<usize>()
        );
        self.ids
    }

    #[cfg(test)]
    pub(crate) fn get(&self, key: u64) -> Option<Seen> {
        self.find(key).map(|pos| self.writes.get(pos).seen())
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
        assert!(r.record(a, IdHint::NONE, |_| seen(0.0, 10.0)).0.is_none());
        r.record(b, IdHint::NONE, |_| seen(0.0, 10.0));
        let (before, _) = r.record(b, IdHint::NONE, |_| seen(5.0, 10.0));
        assert_eq!(before.map(|s| s.first_arrival), Some(0.0));
        r.sweep(12.0);
        assert!(r.get(a).is_none());
        assert!(r.get(b).is_some(), "seen again at 5 s: kept until 15 s");
        r.sweep(15.0);
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn a_write_shortened_in_place_is_forgotten_when_it_was_due() {
        let mut r = Remembered::default();
        let a = r.key("a");
        r.record(a, IdHint::NONE, |_| seen(0.0, 10.0));
        // A config shortened the deadline: the id is not given a later
        // forget time, so it keeps its write, due at 10 s.
        let (before, id) = r.record(a, IdHint::NONE, |_| seen(2.0, 5.0));
        assert_eq!(before.map(|s| s.forget_at()), Some(10.0));
        assert_eq!(r.get(a).map(|s| s.first_arrival), Some(2.0));
        r.sweep(9.0);
        assert!(r.get(a).is_some(), "its write is due at 10 s, not 7 s");
        r.sweep(10.0);
        assert!(r.get(a).is_none());
        assert!(r.moved.is_empty());
        // Its reference no longer marks anything.
        r.mark_deferred(Some(id));
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn an_id_written_again_is_marked_through_its_last_write() {
        let mut r = Remembered::default();
        let a = r.key("a");
        let (_, first) = r.record(a, IdHint::NONE, |_| seen(0.0, 10.0));
        let (_, second) = r.record(a, IdHint::NONE, |_| seen(3.0, 10.0));
        assert_ne!(first, second, "a later forget time is a new write");
        r.mark_deferred(Some(first));
        assert!(r.get(a).is_some_and(|s| s.deferred));
        r.sweep(10.0);
        assert!(r.get(a).is_some(), "its last write is due at 13 s");
        r.sweep(13.0);
        assert_eq!(r.len(), 0);
        assert_eq!(r.writes.len(), 0);
    }

    #[test]
    fn a_hint_finds_the_live_write_and_any_other_is_ignored() {
        let mut r = Remembered::default();
        let (a, b, c) = (r.key("a"), r.key("b"), r.key("c"));
        let (_, ia) = r.record(a, IdHint::NONE, |_| seen(0.0, 10.0));
        let (_, ib) = r.record(b, IdHint::NONE, |_| seen(0.0, 10.0));
        // Its own write: found there.
        let (before, again) = r.record(a, Remembered::hint(ia), |s| *s.expect("seen"));
        assert_eq!(before.map(|s| s.first_arrival), Some(0.0));
        assert_eq!(again, ia);
        // Another id's write: ignored, `a` is looked up; `b` is untouched.
        let (before, _) = r.record(a, Remembered::hint(ib), |_| seen(1.0, 5.0));
        assert_eq!(before.map(|s| s.first_arrival), Some(0.0));
        assert_eq!(r.get(a).map(|s| s.first_arrival), Some(1.0));
        assert_eq!(r.get(b).map(|s| s.first_arrival), Some(0.0));
        // A made-up position, or a write since replaced: looked up.
        let (before, _) = r.record(c, IdHint::at(1 << 40), |_| seen(2.0, 10.0));
        assert!(before.is_none());
        let (_, later) = r.record(b, IdHint::NONE, |_| seen(4.0, 10.0));
        assert_ne!(later, ib);
        let (before, found) = r.record(b, Remembered::hint(ib), |s| *s.expect("seen"));
        assert_eq!(before.map(|s| s.first_arrival), Some(4.0));
        assert_eq!(found, later);
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn the_oldest_ids_go_beyond_the_most_remembered() {
        let mut r = Remembered::default();
        for i in 0..=MAX_REMEMBERED_IDS {
            r.record(i as u64, IdHint::NONE, |_| seen(0.0, 100.0));
        }
        r.sweep(1.0);
        assert_eq!(r.len(), MAX_REMEMBERED_IDS);
        assert!(r.get(0).is_none() && r.get(1).is_some());
    }

    #[test]
    fn a_write_takes_24_bytes() {
        assert_eq!(std::mem::size_of::<Entry>(), 24);
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
