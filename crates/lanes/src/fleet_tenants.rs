//! The core's side of tenant concurrency across the fleet: while the
//! replica enforces the fleet's shared budgets, a tenant's
//! `maxConcurrency` is the fleet's, and this replica may have in flight
//! only the slots it holds of it ([`crate::fleet_slots`]). The gateway
//! takes and gives back slots from the shared store around the core: in
//! its lease round for every tenant that holds, uses or waits for slots
//! ([`Core::tenant_needs`]), and on the request path only when an arriving
//! request's tenant has no free slot here ([`Core::tenant_short`]).
//!
//! Back on the local share, every tenant's maximum is its 1/N share again
//! and the held slots are forgotten (the store's leases run out by
//! themselves).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::config::LaneConfig;
use crate::core::Core;
use crate::lane::Lane;

/// One tenant's slots on this replica, as the lease round sees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantNeed {
    /// The lane's index in the config.
    pub lane: usize,
    /// The lane's name (part of the store's key).
    pub lane_name: String,
    /// The tenant.
    pub tenant: String,
    /// Its `maxConcurrency` for the whole fleet.
    pub max: u64,
    /// Its requests in flight here.
    pub in_use: u64,
    /// The slots this replica holds of it.
    pub held: u64,
    /// Its requests waiting here.
    pub waiting: u64,
}

impl TenantNeed {
    /// Requests waiting short of a slot (beyond the free held ones).
    pub fn short(&self) -> u64 {
        let free = self.held.saturating_sub(self.in_use);
        self.waiting.saturating_sub(free)
    }
}

/// A tenant's `maxConcurrency` for the whole fleet (its own or the lane's).
fn fleet_max(cfg: &LaneConfig, tenant: &str) -> Option<u64> {
    let t = cfg.tenants.as_ref()?;
    let own = t.overrides.iter().find(|o| o.name == tenant);
    let max = own.and_then(|o| o.max_concurrency).or(t.max_concurrency)?;
    u64::try_from(max).ok()
}

fn need(li: usize, lane: &Lane, tenant: &str) -> Option<TenantNeed> {
    let leased = lane.tenants.leased.as_ref()?;
    if !lane.tenants.has_max(tenant) {
        return None;
    }
    Some(TenantNeed {
        lane: li,
        lane_name: lane.cfg.name.clone(),
        tenant: tenant.to_owned(),
        max: fleet_max(&lane.cfg, tenant)?,
        in_use: u64::from(lane.tenants.in_flight(tenant)),
        held: u64::from(leased.get(tenant).copied().unwrap_or(0)),
        waiting: lane.queue.waiting_of(tenant) as u64,
    })
}

impl Core {
    /// Tenant slots leased from the fleet (or each tenant's local share).
    /// Leaving the leases, parked tenants below their local share may go
    /// at the next poll.
    pub(crate) fn set_tenants_leased(&mut self, leased: bool) {
        for lane in &mut self.lanes {
            match (leased, lane.tenants.leased.is_some()) {
                (true, false) => lane.tenants.leased = Some(HashMap::new()),
                (false, true) => {
                    lane.tenants.leased = None;
                    lane.queue.reweigh(&lane.tenants);
                }
                _ => {}
            }
        }
    }

    /// Every tenant with a maximum, of a lane whose tenants are leased,
    /// that holds, uses or waits for slots here.
    pub fn tenant_needs(&self) -> Vec<TenantNeed> {
        let mut out = Vec::new();
        for (li, lane) in self.lanes.iter().enumerate() {
            let Some(leased) = &lane.tenants.leased else {
                continue;
            };
            let mut names: BTreeSet<&str> = leased.keys().map(|t| &**t).collect();
            names.extend(lane.tenants.in_flight.keys().map(|t| &**t));
            names.extend(
                lane.queue
                    .iter()
                    .map(|(id, _, _)| lane.queue.tenant_name(id)),
            );
            out.extend(names.into_iter().filter_map(|t| need(li, lane, t)));
        }
        out
    }

    /// The need of `tenant` in `lane` when an arrival of it would find no
    /// free slot held here (None: it has one, or nothing is leased).
    pub fn tenant_short(&self, lane: &str, tenant: &str) -> Option<TenantNeed> {
        let li = self.lane_index(lane)?;
        need(li, &self.lanes[li], tenant).filter(|n| n.in_use + n.waiting >= n.held)
    }

    /// `n` slots of `tenant` taken from the fleet for lane `li`:
    /// `Some(true)` when a waiting request of it may go now (poll), `None`
    /// when the lane's tenants are not leased (any more): the caller gives
    /// them back.
    pub fn add_tenant_slots(&mut self, li: usize, tenant: &str, n: u64) -> Option<bool> {
        let lane = self.lanes.get_mut(li)?;
        let leased = lane.tenants.leased.as_mut()?;
        if n == 0 {
            return Some(false);
        }
        let held = leased.entry(Arc::from(tenant)).or_insert(0);
        *held = held.saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
        let unparked = lane.queue.unpark(tenant, &lane.tenants);
        Some(unparked || lane.queue.waiting_of(tenant) > 0 && !lane.tenants.at_max(tenant))
    }

    /// Takes up to `n` of the slots `tenant` holds in lane `li` back (not
    /// those in use), to give back to the fleet; returns how many.
    pub fn take_back_tenant_slots(&mut self, li: usize, tenant: &str, n: u64) -> u64 {
        let Some(lane) = self.lanes.get_mut(li) else {
            return 0;
        };
        let in_use = lane.tenants.in_flight(tenant);
        let Some(leased) = lane.tenants.leased.as_mut() else {
            return 0;
        };
        let Some(held) = leased.get_mut(tenant) else {
            return 0;
        };
        let free = u64::from(held.saturating_sub(in_use));
        let back = free.min(n);
        *held -= back as u32;
        if *held == 0 {
            leased.remove(tenant);
        }
        back
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenants::{TenantLimits, TenantOverride};
    use crate::tests::{config, lane};
    use crate::verdict::{Request, Resolution, Verdict};

    /// A lane whose tenants may have 4 in flight over the fleet (`big`
    /// 6), on a replica of three.
    fn core() -> Core {
        let mut l = lane("l", 100.0, 100);
        l.tenants = Some(TenantLimits {
            max_concurrency: Some(4),
            weight: None,
            overrides: vec![TenantOverride {
                name: "big".to_owned(),
                max_concurrency: Some(6),
                weight: None,
            }],
        });
        Core::new(config(vec![l]), 1.0 / 3.0, 0.0, 1e6).unwrap()
    }

    fn of(tenant: &str) -> Request<'_> {
        Request {
            lane: "l",
            tenant: Some(tenant),
            attempt: None,
            request_id: None,
        }
    }

    fn passes(c: &mut Core, tenant: &str, n: usize) -> usize {
        (0..n)
            .filter(|_| matches!(c.admit(&of(tenant), 0.0), Verdict::Pass(_)))
            .count()
    }

    #[test]
    fn leased_a_tenant_has_in_flight_only_the_slots_it_holds() {
        let mut c = core();
        c.set_leased(true);
        assert_eq!(
            c.tenant_short("l", "a").map(|n| (n.max, n.held)),
            Some((4, 0)),
            "the fleet's maximum, nothing held yet"
        );
        assert_eq!(passes(&mut c, "a", 1), 0, "no slot held: it waits");
        assert_eq!(c.add_tenant_slots(0, "a", 3), Some(true));
        assert_eq!(c.poll(0.0).len(), 1);
        assert_eq!(passes(&mut c, "a", 5), 2, "three held in all");
        let needs = c.tenant_needs();
        assert_eq!(needs.len(), 1);
        assert_eq!(
            (needs[0].in_use, needs[0].held, needs[0].waiting),
            (3, 3, 3)
        );
        assert_eq!(needs[0].short(), 3);
        assert_eq!(c.tenant_short("big", "a"), None, "no such lane");
        assert_eq!(c.tenant_short("l", "big").map(|n| n.max), Some(6));
    }

    #[test]
    fn only_free_slots_go_back_and_the_local_share_returns() {
        let mut c = core();
        c.set_leased(true);
        c.add_tenant_slots(0, "a", 3);
        assert_eq!(passes(&mut c, "a", 1), 1);
        assert_eq!(c.take_back_tenant_slots(0, "a", 5), 2, "one is in use");
        assert_eq!(c.take_back_tenant_slots(0, "a", 5), 0);
        assert!(matches!(c.admit(&of("a"), 0.0), Verdict::Queued { .. }));
        // Local again: ceil(4 / 3) = 2, so the waiting one goes.
        c.set_leased(false);
        assert_eq!(c.add_tenant_slots(0, "a", 1), None, "give it back");
        let out = c.poll(0.1);
        assert!(
            matches!(out.as_slice(), [(_, Resolution::Pass(_))]),
            "{out:?}"
        );
        assert!(c.tenant_needs().is_empty());
        assert_eq!(passes(&mut c, "a", 1), 0, "two in flight: its share");
    }

    #[test]
    fn leasing_again_keeps_what_is_held() {
        let mut c = core();
        c.set_leased(true);
        c.add_tenant_slots(0, "a", 2);
        c.set_leased(true);
        assert_eq!(c.tenant_needs()[0].held, 2);
    }
}
