//! One lane's waiting requests: weighted fair queueing across tenants
//! (self-clocked: finish tag `F = max(V, F_prev) + cost / weight`, `V` the
//! tag of the request served last; cost and weight 1), earliest first
//! arrival first inside one tenant.
//!
//! Tenants are interned to small integers while they have requests waiting
//! (an id is reused once its tenant's queue empties), so the indexes hold no
//! strings and a tenant name is hashed once per request.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use crate::remembered::IdRef;
use crate::verdict::{Attempt, Ticket};

/// A total order on finite f64 (never NaN here).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct OrdF64(pub(crate) f64);

impl Eq for OrdF64 {}

impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A waiting request's key inside its lane: (first arrival, sequence).
pub(crate) type Key = (OrdF64, u64);

/// A tenant's id while it has requests waiting.
pub(crate) type TenantId = u32;

/// A queued request.
#[derive(Clone, Debug)]
pub(crate) struct Waiting {
    pub(crate) ticket: Ticket,
    pub(crate) attempt: Attempt,
    /// First arrival (kept across deferrals): the queue's order and the
    /// deadline's start.
    pub(crate) first_arrival: f64,
    /// When it joined the queue (the TTL's start).
    pub(crate) queued_at: f64,
    /// Its request id in the lane's remembered ids, if it has one.
    pub(crate) request_key: Option<IdRef>,
}

/// A request found by one of the indexes: when, its key, its tenant.
pub(crate) type Found = (f64, Key, TenantId);

/// One tenant's waiting requests, earliest first arrival first.
#[derive(Debug, Default)]
struct TenantQueue {
    name: String,
    waiting: BTreeMap<Key, Waiting>,
    /// Generation of its live heap entry (older entries are stale).
    heap_gen: u64,
}

/// Weighted fair queueing across tenants, EDF within one.
#[derive(Debug, Default)]
pub(crate) struct FairQueue {
    ids: HashMap<String, TenantId>,
    /// The tenant interned last: most requests come from the tenant the
    /// previous one came from, and comparing its name is cheaper than
    /// hashing it.
    last: TenantId,
    tenants: Vec<TenantQueue>,
    free: Vec<TenantId>,
    /// (finish tag, generation, tenant), smallest tag first.
    heap: BinaryHeap<Reverse<(OrdF64, u64, TenantId)>>,
    /// Every waiting request by key: the newest (deferred when the queue is
    /// full) and the oldest first arrival (the first deadline).
    by_arrival: BTreeMap<Key, TenantId>,
    /// By (queued at, seq): the order in which TTLs run out.
    by_queued: BTreeMap<(OrdF64, u64), (OrdF64, TenantId)>,
    /// The first and last of `by_arrival` and the first of `by_queued`,
    /// kept at hand: `next_wake` asks for them on every arrival, and they
    /// change only when a request joins or leaves at an end.
    ends: Ends,
    /// The tag of the request served last (the virtual time V).
    virtual_time: f64,
    seq: u64,
    generation: u64,
}

impl FairQueue {
    pub(crate) fn len(&self) -> usize {
        self.by_arrival.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_arrival.is_empty()
    }

    /// Queues a request; returns its tenant's id and its key.
    pub(crate) fn push(&mut self, tenant: &str, w: Waiting) -> (TenantId, Key) {
        self.seq += 1;
        let key = (OrdF64(w.first_arrival), self.seq);
        let id = self.intern(tenant);
        self.by_arrival.insert(key, id);
        self.by_queued
            .insert((OrdF64(w.queued_at), self.seq), (key.0, id));
        self.ends.pushed((key.0.0, key, id), w.queued_at);
        let tq = &mut self.tenants[id as usize];
        let was_empty = tq.waiting.is_empty();
        tq.waiting.insert(key, w);
        if was_empty {
            // F = max(V, F_prev) + 1, and F_prev <= V for a tenant that had
            // emptied.
            self.schedule(id, self.virtual_time + 1.0);
        }
        (id, key)
    }

    fn intern(&mut self, tenant: &str) -> TenantId {
        // A tenant with requests waiting is interned (and one without is
        // not).
        if let Some(tq) = self.tenants.get(self.last as usize)
            && !tq.waiting.is_empty()
            && tq.name == tenant
        {
            return self.last;
        }
        if let Some(&id) = self.ids.get(tenant) {
            self.last = id;
            return id;
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.tenants.push(TenantQueue::default());
                (self.tenants.len() - 1) as TenantId
            }
        };
        self.tenants[id as usize].name = tenant.to_owned();
        self.ids.insert(tenant.to_owned(), id);
        self.last = id;
        id
    }

    fn schedule(&mut self, id: TenantId, tag: f64) {
        self.generation += 1;
        self.tenants[id as usize].heap_gen = self.generation;
        self.heap.push(Reverse((OrdF64(tag), self.generation, id)));
    }

    /// Removes one waiting request by tenant and key, keeping the indexes.
    pub(crate) fn remove(&mut self, id: TenantId, key: Key) -> Option<Waiting> {
        let tq = self.tenants.get_mut(id as usize)?;
        let w = tq.waiting.remove(&key)?;
        self.by_arrival.remove(&key);
        self.by_queued.remove(&(OrdF64(w.queued_at), key.1));
        let is = |e: Option<Found>| e.is_some_and(|f| f.1.1 == key.1);
        if is(self.ends.oldest) {
            self.ends.oldest = first_arrival(&self.by_arrival);
        }
        if is(self.ends.newest) {
            self.ends.newest = last_arrival(&self.by_arrival);
        }
        if is(self.ends.first_queued) {
            self.ends.first_queued = first_queued(&self.by_queued);
        }
        if tq.waiting.is_empty() {
            let name = std::mem::take(&mut tq.name);
            tq.heap_gen = 0;
            self.ids.remove(&name);
            self.free.push(id);
        }
        Some(w)
    }

    /// The next request by finish tag.
    pub(crate) fn pop(&mut self) -> Option<Waiting> {
        while let Some(Reverse((tag, generation, id))) = self.heap.pop() {
            let tq = &self.tenants[id as usize];
            if tq.heap_gen != generation {
                continue;
            }
            let (&key, _) = tq.waiting.iter().next()?;
            self.virtual_time = self.virtual_time.max(tag.0);
            let w = self.remove(id, key).expect("the head exists");
            if !self.tenants[id as usize].waiting.is_empty() {
                self.schedule(id, tag.0 + 1.0);
            }
            return Some(w);
        }
        None
    }

    /// The request with the latest first arrival.
    pub(crate) fn newest(&self) -> Option<Found> {
        self.ends.newest
    }

    /// The request that joined the queue first.
    pub(crate) fn oldest_queued(&self) -> Option<Found> {
        self.ends.first_queued
    }

    /// The earliest deadline start among the waiting (the oldest first
    /// arrival).
    pub(crate) fn oldest_arrival(&self) -> Option<Found> {
        self.ends.oldest
    }

    /// Every waiting request with its tenant id and key (for re-indexing
    /// tickets after a config swap).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (TenantId, Key, &Waiting)> {
        self.by_arrival.iter().map(|(k, t)| {
            let w = &self.tenants[*t as usize].waiting[k];
            (*t, *k, w)
        })
    }

    /// Takes every waiting request out, in fair order.
    pub(crate) fn drain(&mut self) -> Vec<Waiting> {
        let mut out = Vec::with_capacity(self.len());
        while let Some(w) = self.pop() {
            out.push(w);
        }
        out
    }
}

/// The ends of a queue's indexes.
#[derive(Debug, Default)]
struct Ends {
    oldest: Option<Found>,
    newest: Option<Found>,
    /// (queued at, key, tenant).
    first_queued: Option<Found>,
}

impl Ends {
    /// A request joined with first arrival `f` (its key and tenant) at
    /// `queued_at`: it may be a new end.
    fn pushed(&mut self, f: Found, queued_at: f64) {
        if self.oldest.is_none_or(|o| f.1 < o.1) {
            self.oldest = Some(f);
        }
        if self.newest.is_none_or(|n| f.1 > n.1) {
            self.newest = Some(f);
        }
        let q = (queued_at, f.1, f.2);
        if self
            .first_queued
            .is_none_or(|o| (OrdF64(q.0), q.1.1) < (OrdF64(o.0), o.1.1))
        {
            self.first_queued = Some(q);
        }
    }
}

fn first_arrival(by_arrival: &BTreeMap<Key, TenantId>) -> Option<Found> {
    by_arrival.first_key_value().map(|(k, t)| (k.0.0, *k, *t))
}

fn last_arrival(by_arrival: &BTreeMap<Key, TenantId>) -> Option<Found> {
    by_arrival.last_key_value().map(|(k, t)| (k.0.0, *k, *t))
}

fn first_queued(by_queued: &BTreeMap<(OrdF64, u64), (OrdF64, TenantId)>) -> Option<Found> {
    by_queued
        .first_key_value()
        .map(|(k, (fa, t))| (k.0.0, (*fa, k.1), *t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(t: u64, at: f64) -> Waiting {
        Waiting {
            ticket: Ticket(t),
            attempt: Attempt::Original,
            first_arrival: at,
            queued_at: at,
            request_key: None,
        }
    }

    #[test]
    fn tenants_alternate_and_each_is_served_in_arrival_order() {
        let mut q = FairQueue::default();
        for i in 0..4 {
            q.push("a", waiting(i, i as f64));
        }
        q.push("b", waiting(10, 5.0));
        q.push("b", waiting(11, 6.0));
        let order: Vec<u64> = q.drain().into_iter().map(|w| w.ticket.0).collect();
        assert_eq!(order, vec![0, 10, 1, 11, 2, 3]);
        assert!(q.is_empty());
    }

    #[test]
    fn an_emptied_tenant_gives_its_id_back() {
        let mut q = FairQueue::default();
        let (a, ka) = q.push("a", waiting(1, 0.0));
        assert!(q.remove(a, ka).is_some());
        let (b, _) = q.push("b", waiting(2, 1.0));
        assert_eq!(a, b, "the id is reused");
        assert_eq!(q.tenants.len(), 1);
        assert_eq!(q.ids.len(), 1);
        assert_eq!(q.pop().map(|w| w.ticket), Some(Ticket(2)));
    }

    #[test]
    fn the_indexes_find_the_newest_and_the_oldest() {
        let mut q = FairQueue::default();
        q.push("a", waiting(1, 3.0));
        let w = Waiting {
            queued_at: 9.0,
            ..waiting(2, 1.0)
        };
        q.push("b", w);
        assert_eq!(q.newest().map(|f| f.0), Some(3.0));
        assert_eq!(q.oldest_arrival().map(|f| f.0), Some(1.0));
        assert_eq!(q.oldest_queued().map(|f| f.0), Some(3.0));
    }

    #[test]
    fn the_ends_kept_at_hand_are_the_indexes_ends() {
        let mut q = FairQueue::default();
        let mut live: Vec<(TenantId, Key)> = Vec::new();
        // A fixed pseudo-random walk of pushes, removals and pops.
        let mut x: u64 = 47;
        for i in 0..5_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = x >> 33;
            match r % 4 {
                0 | 1 => {
                    let w = Waiting {
                        queued_at: (i / 3) as f64,
                        ..waiting(i, (r % 97) as f64)
                    };
                    live.push(q.push(["a", "b", "c"][(r % 3) as usize], w));
                }
                2 if !live.is_empty() => {
                    let (t, k) = live.swap_remove((r as usize) % live.len());
                    assert!(q.remove(t, k).is_some());
                }
                _ => {
                    q.pop();
                    live.retain(|&(t, k)| q.tenants[t as usize].waiting.contains_key(&k));
                }
            }
            assert_eq!(q.oldest_arrival(), first_arrival(&q.by_arrival));
            assert_eq!(q.newest(), last_arrival(&q.by_arrival));
            assert_eq!(q.oldest_queued(), first_queued(&q.by_queued));
        }
    }
}
