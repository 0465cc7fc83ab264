//! One lane's waiting requests: weighted fair queueing across tenants by
//! cost, earliest first arrival first inside one tenant.
//!
//! Self-clocked fair queueing: each tenant with requests waiting has a
//! finish tag `F = max(V, F_prev) + cost / weight`, where `cost` is its
//! head request's charge (the lane's work units per request today) and
//! `weight` the tenant's weight; the tenant with the smallest tag is served
//! and `V` becomes its tag. Over any stretch where two tenants both wait,
//! the work each is served divided by its weight differs by at most one
//! request's cost over each weight: shares follow the weights, whatever
//! the number of requests each sends. A tenant that had nothing waiting
//! starts at `V` (it saved no credit while idle).
//!
//! A tenant at its maximum in flight is parked: taken off the schedule
//! when it reaches the front, and put back (as a tenant that was idle) when
//! one of its requests finishes. Every operation is O(log n).
//!
//! Tenants are interned to small integers while they have requests waiting
//! (an id is reused once its tenant's queue empties), so the indexes hold no
//! strings and a tenant name is hashed once per request.
//!
//! The requests themselves sit in one slab (a `Vec` with a free list); the
//! indexes hold 4-byte positions in it. Each tenant's B-tree orders its own
//! requests by first arrival; the lane-wide ends (oldest and newest first
//! arrival) come from two small sets of the tenants' ends, one entry per
//! waiting tenant, and the order in which TTLs run out from a queue in the
//! order requests joined (see [`ByQueued`]). A push or a removal touches
//! one large B-tree, not three.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};

use crate::remembered::IdRef;
use crate::tenants::{TenantGate, TenantSlot};
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
    /// What serving it charges its tenant in the fair queue (> 0): its
    /// work units.
    pub(crate) cost: f64,
    /// What it charges its lane (see `charge`).
    pub(crate) sized: crate::charge::Sized,
}

/// A request found by one of the indexes: when, its key, its tenant.
pub(crate) type Found = (f64, Key, TenantId);

/// A waiting request's position in the slab: its own while it waits (the
/// core's tickets point here).
pub(crate) type Slot = u32;

/// A waiting request in the slab, with its key and tenant.
#[derive(Debug)]
struct Entry {
    key: Key,
    tenant: TenantId,
    w: Waiting,
}

/// The waiting requests, each at a position that stays its own while it
/// waits (freed positions are reused).
#[derive(Debug, Default)]
struct Slab {
    entries: Vec<Option<Entry>>,
    vacant: Vec<Slot>,
}

impl Slab {
    fn insert(&mut self, e: Entry) -> Slot {
        match self.vacant.pop() {
            Some(s) => {
                self.entries[s as usize] = Some(e);
                s
            }
            None => {
                self.entries.push(Some(e));
                (self.entries.len() - 1) as Slot
            }
        }
    }

    fn take(&mut self, s: Slot) -> Entry {
        let e = self.entries[s as usize].take().expect("a live slot");
        self.vacant.push(s);
        e
    }

    fn get(&self, s: Slot) -> &Entry {
        self.entries[s as usize].as_ref().expect("a live slot")
    }

    /// Whether `s` holds the request of sequence `seq` (a freed or reused
    /// position does not).
    fn holds(&self, s: Slot, seq: u64) -> bool {
        self.entries[s as usize]
            .as_ref()
            .is_some_and(|e| e.key.1 == seq)
    }
}

/// The waiting requests by (queued at, sequence): the order in which TTLs
/// run out. Requests join at the time of their arrival, so nearly always in
/// that order: those go to the back of `fifo`, which stays sorted; one that
/// would not (a clock that stepped back) goes to `late`, a B-tree. A
/// removal from the middle of `fifo` is only counted (its slot no longer
/// holds its sequence) and skipped when it reaches an end; the queue is
/// compacted when the removed outnumber the live.
#[derive(Debug, Default)]
struct ByQueued {
    /// (queued at, sequence, slot), sorted; both ends live.
    fifo: VecDeque<(f64, u64, Slot)>,
    late: BTreeMap<(OrdF64, u64), Slot>,
    /// Entries of `fifo` whose request left.
    dead: usize,
}

impl ByQueued {
    fn push(&mut self, queued_at: f64, seq: u64, slot: Slot) {
        let in_order = self
            .fifo
            .back()
            .is_none_or(|b| (OrdF64(b.0), b.1) < (OrdF64(queued_at), seq));
        if in_order {
            self.fifo.push_back((queued_at, seq, slot));
        } else {
            self.late.insert((OrdF64(queued_at), seq), slot);
        }
    }

    /// The request (queued at, sequence) left `slab`.
    fn remove(&mut self, queued_at: f64, seq: u64, slab: &Slab) {
        if !self.late.is_empty() && self.late.remove(&(OrdF64(queued_at), seq)).is_some() {
            return;
        }
        self.dead += 1;
        while let Some(&(_, s, slot)) = self.fifo.front()
            && !slab.holds(slot, s)
        {
            self.fifo.pop_front();
            self.dead -= 1;
        }
        while let Some(&(_, s, slot)) = self.fifo.back()
            && !slab.holds(slot, s)
        {
            self.fifo.pop_back();
            self.dead -= 1;
        }
        if self.dead > 64 && self.dead > self.fifo.len() / 2 {
            self.fifo.retain(|&(_, s, slot)| slab.holds(slot, s));
            self.dead = 0;
        }
    }

    /// The first to run out: (queued at, sequence, slot).
    fn first(&self) -> Option<(f64, u64, Slot)> {
        let f = self.fifo.front().copied();
        let l = self.late.first_key_value().map(|(k, s)| (k.0.0, k.1, *s));
        match (f, l) {
            (Some(f), Some(l)) => Some(if (OrdF64(l.0), l.1) < (OrdF64(f.0), f.1) {
                l
            } else {
                f
            }),
            (f, l) => f.or(l),
        }
    }

    fn clear(&mut self) {
        *self = ByQueued::default();
    }
}

/// One tenant's waiting requests, earliest first arrival first.
#[derive(Debug, Default)]
struct TenantQueue {
    name: String,
    waiting: BTreeMap<Key, Slot>,
    /// Its weight (looked up once, when it is interned).
    weight: f64,
    /// Generation of its live heap entry (older entries are stale; 0: none).
    heap_gen: u64,
    /// Off the schedule: the tenant has its maximum in flight.
    parked: bool,
}

impl TenantQueue {
    /// What serving its head adds to its tag.
    fn step(&self, slab: &Slab) -> f64 {
        self.waiting
            .first_key_value()
            .map_or(1.0, |(_, s)| slab.get(*s).w.cost / self.weight)
    }

    fn first_key(&self) -> Option<Key> {
        self.waiting.first_key_value().map(|(k, _)| *k)
    }

    fn last_key(&self) -> Option<Key> {
        self.waiting.last_key_value().map(|(k, _)| *k)
    }
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
    /// Tenants parked (waiting, at their maximum in flight).
    parked: usize,
    /// (finish tag, generation, tenant), smallest tag first.
    heap: BinaryHeap<Reverse<(OrdF64, u64, TenantId)>>,
    /// Every waiting request.
    slab: Slab,
    /// How many wait.
    len: usize,
    /// (key of its oldest first arrival, tenant) of every waiting tenant:
    /// the first is the lane's oldest.
    firsts: BTreeSet<(Key, TenantId)>,
    /// (key of its newest first arrival, tenant) of every waiting tenant:
    /// the last is the lane's newest (deferred when the queue is full).
    lasts: BTreeSet<(Key, TenantId)>,
    /// The order in which TTLs run out.
    by_queued: ByQueued,
    /// The tag of the request served last (the virtual time V).
    virtual_time: f64,
    seq: u64,
    generation: u64,
}

impl FairQueue {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether a waiting tenant may be on the schedule (not parked). A
    /// tenant that reached its maximum since it was scheduled is counted
    /// until [`FairQueue::ready`] parks it.
    pub(crate) fn has_ready(&self) -> bool {
        self.ids.len() > self.parked
    }

    /// Queues a request of `tenant` (its weight from `gate`); returns its
    /// tenant's id, its key and its position (its own while it waits).
    pub(crate) fn push(
        &mut self,
        tenant: &str,
        w: Waiting,
        gate: &TenantGate,
    ) -> (TenantId, Key, Slot) {
        self.seq += 1;
        let key = (OrdF64(w.first_arrival), self.seq);
        let id = self.intern(tenant, gate);
        let queued_at = w.queued_at;
        let slot = self.slab.insert(Entry { key, tenant: id, w });
        self.by_queued.push(queued_at, self.seq, slot);
        self.len += 1;
        let tq = &mut self.tenants[id as usize];
        let ends = (tq.first_key(), tq.last_key());
        tq.waiting.insert(key, slot);
        match ends {
            (Some(first), Some(last)) => {
                if key < first {
                    self.firsts.remove(&(first, id));
                    self.firsts.insert((key, id));
                }
                if key > last {
                    self.lasts.remove(&(last, id));
                    self.lasts.insert((key, id));
                }
            }
            _ => {
                self.firsts.insert((key, id));
                self.lasts.insert((key, id));
                // F = max(V, F_prev) + cost / weight, and F_prev <= V for
                // a tenant that had emptied.
                let step = tq.step(&self.slab);
                self.schedule(id, self.virtual_time + step);
            }
        }
        (id, key, slot)
    }

    fn intern(&mut self, tenant: &str, gate: &TenantGate) -> TenantId {
        // A tenant with requests waiting is interned (and one without is
        // not).
        if let Some(tq) = self.tenants.get(self.last as usize)
            && !tq.waiting.is_empty()
            && same_name(&tq.name, tenant)
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
        let tq = &mut self.tenants[id as usize];
        tq.name = tenant.to_owned();
        tq.weight = gate.weight(tenant);
        self.ids.insert(tenant.to_owned(), id);
        self.last = id;
        id
    }

    fn schedule(&mut self, id: TenantId, tag: f64) {
        self.generation += 1;
        self.tenants[id as usize].heap_gen = self.generation;
        self.heap.push(Reverse((OrdF64(tag), self.generation, id)));
    }

    /// The name of a tenant with requests waiting.
    pub(crate) fn tenant_name(&self, id: TenantId) -> &str {
        &self.tenants[id as usize].name
    }

    /// Removes the waiting request at `slot` (as [`FairQueue::push`] gave
    /// it), keeping the indexes; None when no request is there.
    pub(crate) fn remove_at(&mut self, slot: Slot) -> Option<Waiting> {
        let e = self.slab.entries.get(slot as usize)?.as_ref()?;
        let (tenant, key) = (e.tenant, e.key);
        self.remove(tenant, key)
    }

    /// Removes one waiting request by tenant and key, keeping the indexes.
    pub(crate) fn remove(&mut self, id: TenantId, key: Key) -> Option<Waiting> {
        let tq = self.tenants.get_mut(id as usize)?;
        let slot = tq.waiting.remove(&key)?;
        let w = self.slab.take(slot).w;
        self.len -= 1;
        self.by_queued.remove(w.queued_at, key.1, &self.slab);
        let (first, last) = (tq.first_key(), tq.last_key());
        if first.is_none_or(|f| key < f) {
            self.firsts.remove(&(key, id));
            if let Some(f) = first {
                self.firsts.insert((f, id));
            }
        }
        if last.is_none_or(|l| key > l) {
            self.lasts.remove(&(key, id));
            if let Some(l) = last {
                self.lasts.insert((l, id));
            }
        }
        if tq.waiting.is_empty() {
            let name = std::mem::take(&mut tq.name);
            tq.heap_gen = 0;
            if std::mem::take(&mut tq.parked) {
                self.parked -= 1;
            }
            self.ids.remove(&name);
            self.free.push(id);
        }
        Some(w)
    }

    /// Whether a tenant may be served now: tenants at their maximum in
    /// flight that reached the front of the schedule are parked on the way.
    pub(crate) fn ready(&mut self, gate: &TenantGate) -> bool {
        while let Some(&Reverse((_, generation, id))) = self.heap.peek() {
            let tq = &mut self.tenants[id as usize];
            if tq.heap_gen != generation {
                self.heap.pop();
                continue;
            }
            if gate.at_max(&tq.name) {
                tq.heap_gen = 0;
                tq.parked = true;
                self.parked += 1;
                self.heap.pop();
                continue;
            }
            return true;
        }
        false
    }

    /// The request [`FairQueue::pop_ready`] would serve, once
    /// [`FairQueue::ready`] said there is one; else the head with the
    /// largest charge (a bound for when the next one can go).
    pub(crate) fn head(&self) -> Option<(TenantId, Key, &Waiting)> {
        let first = |(id, t): (usize, &TenantQueue)| {
            let (k, s) = t.waiting.first_key_value()?;
            Some((id as TenantId, *k, &self.slab.get(*s).w))
        };
        if let Some(&Reverse((_, generation, id))) = self.heap.peek() {
            let tq = &self.tenants[id as usize];
            if tq.heap_gen == generation {
                return first((id as usize, tq));
            }
        }
        self.tenants
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.parked)
            .filter_map(first)
            .max_by(|a, b| a.2.sized.tokens.total_cmp(&b.2.sized.tokens))
    }

    /// The next request by finish tag among the tenants below their
    /// maximum, counted in flight for its tenant (its slot, when the lane
    /// counts).
    pub(crate) fn pop_ready(
        &mut self,
        gate: &mut TenantGate,
    ) -> Option<(Waiting, Option<TenantSlot>)> {
        if !self.ready(gate) {
            return None;
        }
        let Reverse((tag, _, id)) = self.heap.pop()?;
        let tq = &self.tenants[id as usize];
        let key = tq.first_key()?;
        let slot = gate.take(&tq.name);
        self.virtual_time = self.virtual_time.max(tag.0);
        let w = self.remove(id, key).expect("the head exists");
        let tq = &self.tenants[id as usize];
        if !tq.waiting.is_empty() {
            let step = tq.step(&self.slab);
            self.schedule(id, tag.0 + step);
        }
        Some((w, slot))
    }

    /// One of `tenant`'s requests finished and it is below its maximum: a
    /// parked tenant goes back on the schedule as one that was idle.
    /// Returns whether it did.
    pub(crate) fn unpark(&mut self, tenant: &str, gate: &TenantGate) -> bool {
        let Some(&id) = self.ids.get(tenant) else {
            return false;
        };
        let tq = &mut self.tenants[id as usize];
        if !tq.parked || gate.at_max(tenant) {
            return false;
        }
        tq.parked = false;
        self.parked -= 1;
        let step = tq.step(&self.slab);
        self.schedule(id, self.virtual_time + step);
        true
    }

    /// After a config swap: every waiting tenant takes its new weight, and
    /// parked tenants below their new maximum go back on the schedule.
    pub(crate) fn reweigh(&mut self, gate: &TenantGate) {
        for id in 0..self.tenants.len() {
            let tq = &mut self.tenants[id];
            if tq.waiting.is_empty() {
                continue;
            }
            tq.weight = gate.weight(&tq.name);
            if tq.parked {
                let name = tq.name.clone();
                self.unpark(&name, gate);
            }
        }
    }

    /// The tenant with the most requests waiting: its id, how many, and the
    /// key of its newest. A scan of the waiting tenants, done only when the
    /// queue is full.
    pub(crate) fn fattest(&self) -> Option<(TenantId, usize, Key)> {
        self.tenants
            .iter()
            .enumerate()
            .filter_map(|(i, t)| Some((i as TenantId, t.waiting.len(), t.last_key()?)))
            .max_by_key(|(_, n, _)| *n)
    }

    /// How many requests `tenant` has waiting.
    pub(crate) fn waiting_of(&self, tenant: &str) -> usize {
        self.ids
            .get(tenant)
            .map_or(0, |id| self.tenants[*id as usize].waiting.len())
    }

    /// The request with the latest first arrival.
    pub(crate) fn newest(&self) -> Option<Found> {
        self.lasts.last().map(|&(k, t)| (k.0.0, k, t))
    }

    /// The request that joined the queue first.
    pub(crate) fn oldest_queued(&self) -> Option<Found> {
        let (queued_at, _, slot) = self.by_queued.first()?;
        let e = self.slab.get(slot);
        Some((queued_at, e.key, e.tenant))
    }

    /// The earliest deadline start among the waiting (the oldest first
    /// arrival).
    pub(crate) fn oldest_arrival(&self) -> Option<Found> {
        self.firsts.first().map(|&(k, t)| (k.0.0, k, t))
    }

    /// Every waiting request's tenant, key and slot, earliest first
    /// arrival first (a sort: for a config swap or a drain only).
    fn sorted(&self) -> Vec<(Key, TenantId, Slot)> {
        let mut all: Vec<(Key, TenantId, Slot)> = self
            .tenants
            .iter()
            .enumerate()
            .flat_map(|(t, tq)| tq.waiting.iter().map(move |(k, s)| (*k, t as TenantId, *s)))
            .collect();
        all.sort_unstable_by_key(|e| e.0);
        all
    }

    /// Every waiting request with its tenant id and key, earliest first
    /// arrival first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (TenantId, Key, &Waiting)> {
        self.sorted()
            .into_iter()
            .map(|(k, t, s)| (t, k, &self.slab.get(s).w))
    }

    /// Every waiting request with its position (for re-indexing tickets
    /// after a config swap), in no particular order.
    pub(crate) fn places(&self) -> impl Iterator<Item = (Slot, &Waiting)> {
        self.slab
            .entries
            .iter()
            .enumerate()
            .filter_map(|(s, e)| Some((s as Slot, &e.as_ref()?.w)))
    }

    /// Takes every waiting request out (parked tenants' too), earliest
    /// first arrival first.
    pub(crate) fn drain(&mut self) -> Vec<Waiting> {
        let out = self
            .sorted()
            .into_iter()
            .filter_map(|(k, t, _)| self.remove(t, k))
            .collect();
        self.heap.clear();
        self.by_queued.clear();
        out
    }
}

/// Whether two tenant names are the same; most requests name no tenant,
/// and two empty names are told apart without a call to `memcmp`.
fn same_name(a: &str, b: &str) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenants::{TenantLimits, TenantOverride};

    fn waiting(t: u64, at: f64) -> Waiting {
        Waiting {
            ticket: Ticket(t),
            attempt: Attempt::Original,
            first_arrival: at,
            queued_at: at,
            request_key: None,
            cost: 1.0,
            sized: crate::charge::Sized::flat(1.0),
        }
    }

    /// A gate with these (tenant, weight, max in flight) overrides.
    pub(crate) fn gate(tenants: &[(&str, i64, Option<i64>)]) -> TenantGate {
        let mut l = crate::tests::lane("l", 1.0, 1);
        l.tenants = Some(TenantLimits {
            max_concurrency: None,
            weight: None,
            overrides: tenants
                .iter()
                .map(|(n, w, m)| TenantOverride {
                    name: (*n).to_owned(),
                    max_concurrency: *m,
                    weight: Some(*w),
                })
                .collect(),
        });
        TenantGate::new(&l, 1.0)
    }

    fn pop(q: &mut FairQueue, g: &mut TenantGate) -> Option<Waiting> {
        q.pop_ready(g).map(|(w, _)| w)
    }

    #[test]
    fn tenants_alternate_and_each_is_served_in_arrival_order() {
        let mut q = FairQueue::default();
        let mut g = gate(&[]);
        for i in 0..4 {
            q.push("a", waiting(i, i as f64), &g);
        }
        q.push("b", waiting(10, 5.0), &g);
        q.push("b", waiting(11, 6.0), &g);
        let order: Vec<u64> = std::iter::from_fn(|| pop(&mut q, &mut g))
            .map(|w| w.ticket.0)
            .collect();
        assert_eq!(order, vec![0, 10, 1, 11, 2, 3]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_tenant_of_weight_three_is_served_three_times_as_often() {
        let mut q = FairQueue::default();
        let mut g = gate(&[("heavy", 3, None)]);
        for i in 0..40 {
            q.push("heavy", waiting(i, i as f64), &g);
            q.push("light", waiting(100 + i, i as f64), &g);
        }
        let first: Vec<bool> = (0..20)
            .map(|_| pop(&mut q, &mut g).unwrap().ticket.0 < 100)
            .collect();
        let heavy = first.iter().filter(|h| **h).count();
        assert_eq!(heavy, 15, "3:1 over 20 services: {first:?}");
    }

    #[test]
    fn a_costly_request_is_charged_its_cost() {
        // Same weights, but b's requests cost 4 times a's: a is served 4
        // times per b.
        let mut q = FairQueue::default();
        let mut g = gate(&[]);
        for i in 0..40 {
            q.push("a", waiting(i, i as f64), &g);
            let w = Waiting {
                cost: 4.0,
                sized: crate::charge::Sized::flat(4.0),
                ..waiting(100 + i, i as f64)
            };
            q.push("b", w, &g);
        }
        let a = (0..25)
            .filter(|_| pop(&mut q, &mut g).unwrap().ticket.0 < 100)
            .count();
        assert_eq!(a, 20);
    }

    #[test]
    fn a_tenant_at_its_maximum_is_skipped_until_a_request_finishes() {
        let mut q = FairQueue::default();
        let mut g = gate(&[("a", 1, Some(1))]);
        q.push("a", waiting(1, 0.0), &g);
        q.push("a", waiting(2, 1.0), &g);
        q.push("b", waiting(3, 2.0), &g);
        let (w, slot) = q.pop_ready(&mut g).unwrap();
        assert_eq!(w.ticket, Ticket(1));
        let slot = slot.expect("a lane with a maximum counts");
        assert_eq!(slot.tenant(), "a");
        // a has 1 in flight (its maximum): b goes first, then nothing.
        assert_eq!(pop(&mut q, &mut g).map(|w| w.ticket), Some(Ticket(3)));
        assert!(!q.ready(&g));
        assert!(!q.has_ready());
        assert_eq!(q.len(), 1);
        // Its request finishes: a is back.
        assert!(g.release(slot.tenant()));
        assert!(q.unpark("a", &g));
        assert!(q.has_ready());
        assert_eq!(pop(&mut q, &mut g).map(|w| w.ticket), Some(Ticket(2)));
    }

    #[test]
    fn a_parked_tenant_is_drained_too() {
        let mut q = FairQueue::default();
        let mut g = gate(&[("a", 1, Some(1))]);
        q.push("a", waiting(1, 0.0), &g);
        q.push("a", waiting(2, 1.0), &g);
        assert!(q.pop_ready(&mut g).is_some());
        assert!(!q.ready(&g));
        assert_eq!(q.drain().len(), 1);
        assert!(q.is_empty());
        assert_eq!(q.parked, 0);
    }

    #[test]
    fn an_emptied_tenant_gives_its_id_back() {
        let mut q = FairQueue::default();
        let mut g = gate(&[]);
        let (a, ka, _) = q.push("a", waiting(1, 0.0), &g);
        assert!(q.remove(a, ka).is_some());
        let (b, _, _) = q.push("b", waiting(2, 1.0), &g);
        assert_eq!(a, b, "the id is reused");
        assert_eq!(q.tenants.len(), 1);
        assert_eq!(q.ids.len(), 1);
        assert_eq!(pop(&mut q, &mut g).map(|w| w.ticket), Some(Ticket(2)));
    }

    #[test]
    fn the_indexes_find_the_newest_and_the_oldest() {
        let mut q = FairQueue::default();
        let g = gate(&[]);
        q.push("a", waiting(1, 3.0), &g);
        let w = Waiting {
            queued_at: 9.0,
            ..waiting(2, 1.0)
        };
        q.push("b", w, &g);
        assert_eq!(q.newest().map(|f| f.0), Some(3.0));
        assert_eq!(q.oldest_arrival().map(|f| f.0), Some(1.0));
        assert_eq!(q.oldest_queued().map(|f| f.0), Some(3.0));
    }

    /// A plain model of the fair queue: a list of the waiting requests,
    /// scanned for every answer, and each tenant's finish tag.
    #[derive(Default)]
    struct Model {
        /// (tenant, key, queued at, cost, ticket).
        live: Vec<(usize, Key, f64, f64, u64)>,
        /// Each tenant's (finish tag, generation) while it waits.
        tags: Vec<Option<(f64, u64)>>,
        weights: Vec<f64>,
        virtual_time: f64,
        seq: u64,
        generation: u64,
        /// Where the queue put each key (the test's bookkeeping, to remove
        /// by position): not part of the model's answers.
        slots: BTreeMap<Key, Slot>,
    }

    impl Model {
        fn head_of(&self, t: usize) -> Option<(usize, Key, f64, f64, u64)> {
            self.live
                .iter()
                .copied()
                .filter(|e| e.0 == t)
                .min_by_key(|e| e.1)
        }

        fn schedule(&mut self, t: usize, tag: f64) {
            self.generation += 1;
            self.tags[t] = Some((tag, self.generation));
        }

        fn push(&mut self, t: usize, fa: f64, queued_at: f64, cost: f64, ticket: u64) -> Key {
            self.seq += 1;
            let key = (OrdF64(fa), self.seq);
            let was_empty = self.head_of(t).is_none();
            self.live.push((t, key, queued_at, cost, ticket));
            if was_empty {
                self.schedule(t, self.virtual_time + cost / self.weights[t]);
            }
            key
        }

        fn remove(&mut self, key: Key) -> Option<u64> {
            let i = self.live.iter().position(|e| e.1 == key)?;
            let (t, _, _, _, ticket) = self.live.swap_remove(i);
            if self.head_of(t).is_none() {
                self.tags[t] = None;
            }
            Some(ticket)
        }

        fn pop(&mut self) -> Option<u64> {
            let (t, (tag, _)) = self
                .tags
                .iter()
                .enumerate()
                .filter_map(|(t, g)| g.map(|g| (t, g)))
                .min_by(|a, b| (OrdF64(a.1.0), a.1.1).cmp(&(OrdF64(b.1.0), b.1.1)))?;
            let head = self.head_of(t)?;
            self.virtual_time = self.virtual_time.max(tag);
            let ticket = self.remove(head.1);
            if let Some(next) = self.head_of(t) {
                self.schedule(t, tag + next.3 / self.weights[t]);
            }
            ticket
        }

        fn newest(&self) -> Option<(usize, Key)> {
            self.live.iter().max_by_key(|e| e.1).map(|e| (e.0, e.1))
        }

        fn oldest(&self) -> Option<(usize, Key)> {
            self.live.iter().min_by_key(|e| e.1).map(|e| (e.0, e.1))
        }

        fn oldest_queued(&self) -> Option<(f64, usize, Key)> {
            self.live
                .iter()
                .min_by_key(|e| (OrdF64(e.2), e.1.1))
                .map(|e| (e.2, e.0, e.1))
        }

        fn most(&self) -> usize {
            (0..self.tags.len())
                .map(|t| self.live.iter().filter(|e| e.0 == t).count())
                .max()
                .unwrap_or(0)
        }
    }

    const NAMES: [&str; 4] = ["t0", "t1", "t2", "t3"];

    /// The queue's answers against the model's after every step.
    fn agree(q: &FairQueue, m: &Model) -> Result<(), String> {
        let named = |f: Option<Found>| f.map(|(_, k, t)| (q.tenant_name(t).to_owned(), k));
        let model = |f: Option<(usize, Key)>| f.map(|(t, k)| (NAMES[t].to_owned(), k));
        let checks = [
            (q.len() == m.live.len(), "len"),
            (named(q.newest()) == model(m.newest()), "newest"),
            (
                named(q.oldest_arrival()) == model(m.oldest()),
                "oldest arrival",
            ),
            (
                q.oldest_queued()
                    .map(|(at, k, t)| (at, q.tenant_name(t).to_owned(), k))
                    == m.oldest_queued()
                        .map(|(at, t, k)| (at, NAMES[t].to_owned(), k)),
                "oldest queued",
            ),
            (q.fattest().map_or(0, |f| f.1) == m.most(), "fattest"),
            (q.iter().count() == m.live.len(), "iter"),
        ];
        match checks.iter().find(|c| !c.0) {
            Some((_, what)) => Err(format!("{what} differs")),
            None => Ok(()),
        }
    }

    /// One random step on both: 0 push, 1 remove any, 2 pop, 3 take the
    /// newest's place (a full `Defer` lane: evict the newest, push one
    /// that arrived earlier).
    fn step(q: &mut FairQueue, m: &mut Model, g: &mut TenantGate, op: (u8, usize, f64, f64, u64)) {
        let (kind, pick, fa, cost, ticket) = op;
        let queued_at = m.seq as f64 / 4.0 - if pick % 7 == 0 { 3.0 } else { 0.0 };
        let t = pick % NAMES.len();
        let w = Waiting {
            queued_at,
            cost,
            ..waiting(ticket, fa)
        };
        match kind {
            0 => {
                let (_, key, slot) = q.push(NAMES[t], w, g);
                m.slots.insert(key, slot);
                assert_eq!(key, m.push(t, fa, queued_at, cost, ticket));
            }
            // By tenant and key, or by position (as the core's tickets do).
            1 if !m.live.is_empty() => {
                let (mt, key, ..) = m.live[pick % m.live.len()];
                let id = q.ids[NAMES[mt]];
                let removed = if pick % 2 == 0 {
                    q.remove_at(m.slots[&key])
                } else {
                    q.remove(id, key)
                };
                assert_eq!(removed.map(|w| w.ticket.0), m.remove(key));
            }
            2 => assert_eq!(pop(q, g).map(|w| w.ticket.0), m.pop()),
            _ => {
                if let Some((_, key, id)) = q.newest() {
                    assert_eq!(q.remove(id, key).map(|w| w.ticket.0), m.remove(key));
                }
                let (_, key, slot) = q.push(NAMES[t], w, g);
                m.slots.insert(key, slot);
                assert_eq!(key, m.push(t, fa, queued_at, cost, ticket));
            }
        }
    }

    /// Every tenant always has requests waiting (a served one is replaced
    /// by a new one of a random cost): what each is served, over its
    /// weight.
    fn run_backlogged(weights: &[i64], costs: &[f64], pops: usize) -> Vec<(Vec<f64>, Vec<u64>)> {
        let names: Vec<String> = (0..weights.len()).map(|i| format!("t{i}")).collect();
        let spec: Vec<(&str, i64, Option<i64>)> = names
            .iter()
            .zip(weights)
            .map(|(n, w)| (n.as_str(), *w, None))
            .collect();
        let mut g = gate(&spec);
        let mut q = FairQueue::default();
        let mut next = 0u64;
        let mut push = |q: &mut FairQueue, t: usize, g: &TenantGate| {
            next += 1;
            let w = Waiting {
                cost: costs[next as usize % costs.len()],
                sized: crate::charge::Sized::flat(costs[next as usize % costs.len()]),
                ..waiting(next * 16 + t as u64, next as f64)
            };
            q.push(&names[t], w, g);
        };
        for t in 0..weights.len() {
            push(&mut q, t, &g);
            push(&mut q, t, &g);
        }
        // Per pop: (served work over weight of every tenant, tickets).
        let mut served = vec![0.0; weights.len()];
        let mut trace = Vec::with_capacity(pops);
        let mut order: Vec<Vec<u64>> = vec![Vec::new(); weights.len()];
        for _ in 0..pops {
            let w = pop(&mut q, &mut g).expect("backlogged");
            let t = (w.ticket.0 % 16) as usize;
            served[t] += w.cost / weights[t] as f64;
            order[t].push(w.ticket.0);
            push(&mut q, t, &g);
            trace.push((served.clone(), vec![t as u64]));
        }
        trace.push((served, order.concat()));
        trace
    }

    proptest::proptest! {
        #[test]
        fn the_queue_answers_as_a_plain_list_would(
            weights in proptest::collection::vec(1i64..6, 4),
            ops in proptest::collection::vec(
                (0u8..4, 0usize..1000, 0.0f64..50.0, 0.25f64..4.0),
                1..1500,
            ),
        ) {
            let spec: Vec<(&str, i64, Option<i64>)> =
                NAMES.iter().zip(&weights).map(|(n, w)| (*n, *w, None)).collect();
            let mut g = gate(&spec);
            let mut q = FairQueue::default();
            let mut m = Model {
                tags: vec![None; NAMES.len()],
                weights: weights.iter().map(|w| *w as f64).collect(),
                ..Model::default()
            };
            for (i, (kind, pick, fa, cost)) in ops.into_iter().enumerate() {
                // Pushes outweigh the rest, so the queue grows long.
                let kind = if kind == 1 && i % 3 == 0 { 0 } else { kind };
                step(&mut q, &mut m, &mut g, (kind, pick, fa.floor(), cost, i as u64));
                if let Err(e) = agree(&q, &m) {
                    proptest::prop_assert!(false, "step {i}: {e}");
                }
            }
            let drained: Vec<u64> = q.drain().iter().map(|w| w.ticket.0).collect();
            let mut expected = m.live.clone();
            expected.sort_by_key(|e| e.1);
            let expected: Vec<u64> = expected.iter().map(|e| e.4).collect();
            proptest::prop_assert_eq!(drained, expected);
            proptest::prop_assert!(q.is_empty() && q.slab.entries.iter().all(Option::is_none));
        }

        #[test]
        fn shares_follow_the_weights_within_one_request_each(
            weights in proptest::collection::vec(1i64..20, 2..6),
            costs in proptest::collection::vec(0.25f64..4.0, 1..8),
        ) {
            let c_max = costs.iter().copied().fold(0.0, f64::max);
            let trace = run_backlogged(&weights, &costs, 3_000);
            // Normalized service (work / weight) of any two backlogged
            // tenants differs by at most one request's cost over each
            // weight, at every point of the run.
            for (served, _) in &trace {
                for i in 0..weights.len() {
                    for j in 0..weights.len() {
                        let bound = c_max / weights[i] as f64 + c_max / weights[j] as f64 + 1e-9;
                        proptest::prop_assert!(
                            (served[i] - served[j]).abs() <= bound,
                            "{served:?} weights {weights:?}"
                        );
                    }
                }
            }
        }

        #[test]
        fn no_backlogged_tenant_starves(
            weights in proptest::collection::vec(1i64..1000, 2..6),
            costs in proptest::collection::vec(0.25f64..4.0, 1..8),
        ) {
            let c_max = costs.iter().copied().fold(0.0, f64::max);
            let c_min = costs.iter().copied().fold(f64::INFINITY, f64::min);
            let trace = run_backlogged(&weights, &costs, 2_000);
            // Between two services of tenant i, any other tenant j is served
            // at most (c_max/w_i + c_max/w_j) / (c_min/w_j) + 1 times.
            let total: f64 = weights
                .iter()
                .map(|wj| ((c_max / *weights.iter().min().unwrap() as f64 + c_max / *wj as f64) / (c_min / *wj as f64)).ceil() + 1.0)
                .sum();
            for i in 0..weights.len() {
                let mut since = 0usize;
                for (_, t) in trace.iter().take(trace.len() - 1) {
                    if t[0] as usize == i {
                        since = 0;
                    } else {
                        since += 1;
                        proptest::prop_assert!(since as f64 <= total, "tenant {i} waited {since} services");
                    }
                }
            }
        }

        #[test]
        fn each_tenant_is_served_in_arrival_order(
            weights in proptest::collection::vec(1i64..20, 1..6),
            costs in proptest::collection::vec(0.25f64..4.0, 1..8),
        ) {
            let trace = run_backlogged(&weights, &costs, 1_000);
            let (_, order) = trace.last().unwrap();
            // Tickets grow with arrival; each tenant's run is increasing.
            let mut last = vec![0u64; weights.len()];
            for t in order {
                let tenant = (t % 16) as usize;
                proptest::prop_assert!(*t > last[tenant]);
                last[tenant] = *t;
            }
        }
    }
}
