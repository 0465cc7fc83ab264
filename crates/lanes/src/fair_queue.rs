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

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, HashMap};

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

/// One tenant's waiting requests, earliest first arrival first.
#[derive(Debug, Default)]
struct TenantQueue {
    name: String,
    waiting: BTreeMap<Key, Waiting>,
    /// Its weight (looked up once, when it is interned).
    weight: f64,
    /// Generation of its live heap entry (older entries are stale; 0: none).
    heap_gen: u64,
    /// Off the schedule: the tenant has its maximum in flight.
    parked: bool,
}

impl TenantQueue {
    /// What serving its head adds to its tag.
    fn step(&self) -> f64 {
        self.waiting
            .first_key_value()
            .map_or(1.0, |(_, w)| w.cost / self.weight)
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

    /// Whether a waiting tenant may be on the schedule (not parked). A
    /// tenant that reached its maximum since it was scheduled is counted
    /// until [`FairQueue::ready`] parks it.
    pub(crate) fn has_ready(&self) -> bool {
        self.ids.len() > self.parked
    }

    /// Queues a request of `tenant` (its weight from `gate`); returns its
    /// tenant's id and its key.
    pub(crate) fn push(&mut self, tenant: &str, w: Waiting, gate: &TenantGate) -> (TenantId, Key) {
        self.seq += 1;
        let key = (OrdF64(w.first_arrival), self.seq);
        let id = self.intern(tenant, gate);
        self.by_arrival.insert(key, id);
        self.by_queued
            .insert((OrdF64(w.queued_at), self.seq), (key.0, id));
        self.ends.pushed((key.0.0, key, id), w.queued_at);
        let tq = &mut self.tenants[id as usize];
        let was_empty = tq.waiting.is_empty();
        tq.waiting.insert(key, w);
        if was_empty {
            // F = max(V, F_prev) + cost / weight, and F_prev <= V for a
            // tenant that had emptied.
            let step = tq.step();
            self.schedule(id, self.virtual_time + step);
        }
        (id, key)
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
        fn first((id, t): (usize, &TenantQueue)) -> Option<(TenantId, Key, &Waiting)> {
            let (k, w) = t.waiting.first_key_value()?;
            Some((id as TenantId, *k, w))
        }
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
        let (&key, _) = tq.waiting.first_key_value()?;
        let slot = gate.take(&tq.name);
        self.virtual_time = self.virtual_time.max(tag.0);
        let w = self.remove(id, key).expect("the head exists");
        let tq = &self.tenants[id as usize];
        if !tq.waiting.is_empty() {
            let step = tq.step();
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
        let step = tq.step();
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
            .filter_map(|(i, t)| {
                let (key, _) = t.waiting.last_key_value()?;
                Some((i as TenantId, t.waiting.len(), *key))
            })
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

    /// Takes every waiting request out (parked tenants' too), earliest
    /// first arrival first.
    pub(crate) fn drain(&mut self) -> Vec<Waiting> {
        let all: Vec<(TenantId, Key)> = self.by_arrival.iter().map(|(k, t)| (*t, *k)).collect();
        let out = all
            .into_iter()
            .filter_map(|(t, k)| self.remove(t, k))
            .collect();
        self.heap.clear();
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

/// Whether two tenant names are the same; most requests name no tenant,
/// and two empty names are told apart without a call to `memcmp`.
fn same_name(a: &str, b: &str) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
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
        let (a, ka) = q.push("a", waiting(1, 0.0), &g);
        assert!(q.remove(a, ka).is_some());
        let (b, _) = q.push("b", waiting(2, 1.0), &g);
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

    #[test]
    fn the_ends_kept_at_hand_are_the_indexes_ends() {
        let mut q = FairQueue::default();
        let mut g = gate(&[]);
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
                    live.push(q.push(["a", "b", "c"][(r % 3) as usize], w, &g));
                }
                2 if !live.is_empty() => {
                    let (t, k) = live.swap_remove((r as usize) % live.len());
                    assert!(q.remove(t, k).is_some());
                }
                _ => {
                    pop(&mut q, &mut g);
                    live.retain(|&(t, k)| q.tenants[t as usize].waiting.contains_key(&k));
                }
            }
            assert_eq!(q.oldest_arrival(), first_arrival(&q.by_arrival));
            assert_eq!(q.newest(), last_arrival(&q.by_arrival));
            assert_eq!(q.oldest_queued(), first_queued(&q.by_queued));
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
