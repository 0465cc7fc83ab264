//! The entries of [`crate::remembered::Remembered`] in the order they were
//! written: a queue in fixed-size chunks, addressed by a position that
//! only grows. Its memory follows what it holds (a chunk is freed, or kept
//! for reuse, as soon as its last entry leaves), never twice that as a
//! doubling buffer's would.

use std::collections::VecDeque;

/// Entries per chunk (4,096 entries of 24 bytes: 96 KiB).
const CHUNK: usize = 4096;

/// A first-in, first-out queue with stable positions.
#[derive(Debug)]
pub(crate) struct IdRing<T> {
    /// Full chunks, then the one being filled; entries before `head` in
    /// the first chunk are gone.
    chunks: VecDeque<Vec<T>>,
    /// The position of the first chunk's first slot.
    base: u64,
    /// The position of the oldest entry.
    head: u64,
    /// The position the next entry gets.
    tail: u64,
    /// An emptied chunk kept for the next one needed.
    spare: Option<Vec<T>>,
}

impl<T> Default for IdRing<T> {
    fn default() -> Self {
        IdRing {
            chunks: VecDeque::new(),
            base: 0,
            head: 0,
            tail: 0,
            spare: None,
        }
    }
}

impl<T> IdRing<T> {
    /// Appends an entry; returns its position.
    pub(crate) fn push(&mut self, entry: T) -> u64 {
        if self.chunks.back().is_none_or(|c| c.len() == CHUNK) {
            let chunk = self
                .spare
                .take()
                .unwrap_or_else(|| Vec::with_capacity(CHUNK));
            self.chunks.push_back(chunk);
        }
        self.chunks.back_mut().expect("a chunk").push(entry);
        self.tail += 1;
        self.tail - 1
    }

    /// The oldest entry.
    pub(crate) fn front(&self) -> Option<&T> {
        (self.head < self.tail).then(|| self.get(self.head))
    }

    /// Drops the oldest entry.
    pub(crate) fn pop_front(&mut self) {
        if self.head == self.tail {
            return;
        }
        self.head += 1;
        if self.head - self.base == CHUNK as u64 {
            let mut chunk = self.chunks.pop_front().expect("the head's chunk");
            chunk.clear();
            self.spare = Some(chunk);
            self.base += CHUNK as u64;
        }
    }

    /// The position of the oldest entry (of the next one when empty).
    pub(crate) fn head(&self) -> u64 {
        self.head
    }

    /// Whether the entry at `pos` is still held.
    pub(crate) fn holds(&self, pos: u64) -> bool {
        self.head <= pos && pos < self.tail
    }

    /// The entry at a position held now (`head <= pos < tail`).
    pub(crate) fn get(&self, pos: u64) -> &T {
        let i = (pos - self.base) as usize;
        &self.chunks[i / CHUNK][i % CHUNK]
    }

    /// The entry at a position held now, to change.
    pub(crate) fn get_mut(&mut self, pos: u64) -> &mut T {
        let i = (pos - self.base) as usize;
        &mut self.chunks[i / CHUNK][i % CHUNK]
    }

    /// The full position of a held entry from its low 32 bits (what an
    /// index keeps): entries held span fewer than 2^32 positions (that many
    /// would take over 100 GiB).
    pub(crate) fn position(&self, low: u32) -> u64 {
        self.head + u64::from(low.wrapping_sub(self.head as u32))
    }

    /// Entries held, the stale ones included.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        (self.tail - self.head) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_stay_put_across_chunks_and_chunks_are_reused() {
        let mut r = IdRing::default();
        for i in 0..(3 * CHUNK as u64 + 5) {
            assert_eq!(r.push(i), i);
        }
        for i in 0..(2 * CHUNK as u64 + 1) {
            assert_eq!(r.front(), Some(&i));
            r.pop_front();
        }
        assert_eq!(r.chunks.len(), 2, "emptied chunks are freed");
        assert!(r.spare.is_some(), "one is kept for reuse");
        let at = 2 * CHUNK as u64 + 7;
        assert_eq!(*r.get(at), at);
        *r.get_mut(at) = 1;
        assert_eq!(*r.get(at), 1);
        assert_eq!(r.position(at as u32), at);
        assert_eq!(r.len(), CHUNK + 4);
        assert!(r.holds(at) && !r.holds(2 * CHUNK as u64) && !r.holds(3 * CHUNK as u64 + 5));
        assert_eq!(r.head(), 2 * CHUNK as u64 + 1);
        while r.front().is_some() {
            r.pop_front();
        }
        r.pop_front();
        assert_eq!(r.len(), 0);
        assert_eq!(r.push(9), 3 * CHUNK as u64 + 5);
    }

    #[test]
    fn the_low_bits_find_the_position_past_32_bits() {
        let mut r: IdRing<u8> = IdRing {
            base: (1 << 32) - 2,
            head: (1 << 32) - 2,
            tail: (1 << 32) - 2,
            ..IdRing::default()
        };
        let a = r.push(1);
        let b = r.push(2);
        let c = r.push(3);
        assert_eq!(c, 1u64 << 32);
        for p in [a, b, c] {
            assert_eq!(r.position(p as u32), p);
        }
    }
}
