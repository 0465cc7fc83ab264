//! Slot counts across the fleet, the gateway's side: the slots this
//! replica holds of each tenant's fleet-wide `maxConcurrency` and of the
//! pool's `inFlight.stopAt`, taken from and given back to the shared store
//! around the core.
//!
//! - In the lease round ([`slot_round`], every lease period): each count
//!   that holds, uses or waits for slots is brought to what it wants (in
//!   use + waiting + one spare while nobody else waits), and a holding
//!   kept unchanged is renewed once a second (the store drops a holding
//!   not renewed within its lease, so a crashed replica's slots come back).
//! - On the request path ([`Fleet::take_slots`]), only when an arriving
//!   request's tenant (or, for a sheddable lane, the pool) has no free
//!   slot held here: one call per count that takes it one (and the
//!   spare), before the core decides.
//!
//! A failed call puts the replica on its local share like any other.

use std::time::Duration;

use futures::future::join_all;
use lanes::Core;
use lanes::fleet_mode::FleetMode;
use lanes::fleet_pool::PoolNeed;
use lanes::fleet_slots::{
    SLOT_LEASE_SECONDS, SLOT_RENEW_SECONDS, SlotGrant, SlotOp, slot_change, slots_wanted,
};
use lanes::fleet_tenants::TenantNeed;

use super::fleet_metrics::StoreOp;
use super::fleet_share::{Fleet, FleetHost, locked};
use super::fleet_store::{FleetStore, FleetStoreError};
use super::fleet_store_slots::{SlotCall, SlotCount, SlotSeen};

/// Which count a need is of.
#[derive(Clone, Debug)]
enum Of {
    /// A tenant's, in lane `lane` (its index) of `profile/lane_name`.
    Tenant {
        lane: usize,
        lane_name: String,
        store_lane: String,
        tenant: String,
    },
    /// The pool's `stopAt`.
    Pool { profile: String },
}

/// One count's slots here, whichever count.
#[derive(Clone, Debug)]
struct Need {
    of: Of,
    max: u64,
    in_use: u64,
    held: u64,
    waiting: u64,
}

impl Need {
    fn tenant(profile: &str, n: TenantNeed) -> Need {
        Need {
            of: Of::Tenant {
                lane: n.lane,
                store_lane: format!("{profile}/{}", n.lane_name),
                lane_name: n.lane_name,
                tenant: n.tenant,
            },
            max: n.max,
            in_use: n.in_use,
            held: n.held,
            waiting: n.waiting,
        }
    }

    fn pool(n: PoolNeed) -> Need {
        Need {
            of: Of::Pool { profile: n.profile },
            max: n.max,
            in_use: n.in_use,
            held: n.held,
            waiting: n.waiting,
        }
    }

    /// This replica's key of the count (for what the store last said).
    fn key(&self) -> String {
        match &self.of {
            Of::Tenant {
                store_lane, tenant, ..
            } => format!("{store_lane}\u{0}{tenant}"),
            Of::Pool { profile } => format!("{profile}\u{0}"),
        }
    }

    fn count(&self) -> SlotCount<'_> {
        match &self.of {
            Of::Tenant {
                store_lane, tenant, ..
            } => SlotCount::Tenant {
                lane: store_lane,
                tenant,
            },
            Of::Pool { profile } => SlotCount::Pool { profile },
        }
    }

    /// Requests waiting short of a slot.
    fn short(&self) -> u64 {
        let free = self.held.saturating_sub(self.in_use);
        self.waiting.saturating_sub(free)
    }

    /// The call it needs in the lease round: to its want, else a renewal
    /// when one is due.
    fn round_op(&self, seen: Option<SlotSeen>, now: f64) -> Option<SlotOp> {
        let others = seen.is_some_and(|s| s.others_waiting > 0);
        let due = seen.is_none_or(|s| now - s.at >= SLOT_RENEW_SECONDS);
        match slot_change(self.held, slots_wanted(self.in_use, self.waiting, others)) {
            Some(op) => Some(op),
            None if due && self.held > 0 => Some(SlotOp::Take(0)),
            None => None,
        }
    }

    /// Under the lock: `n` slots given to the core. `Some(wake)`, or None
    /// when the core does not lease the count (any more).
    fn add(&self, core: &mut Core, g: SlotGrant) -> Option<bool> {
        match &self.of {
            Of::Tenant {
                lane,
                lane_name,
                tenant,
                ..
            } => {
                let ours = core.lane_index(lane_name) == Some(*lane);
                ours.then(|| core.add_tenant_slots(*lane, tenant, g.granted))
                    .flatten()
            }
            Of::Pool { profile } => (core.config().profile == *profile)
                .then(|| core.add_pool_slots(g.granted, g.others_held))
                .flatten(),
        }
    }

    /// Under the lock: up to `n` free slots taken out of the core.
    fn take_back(&self, core: &mut Core, n: u64) -> u64 {
        match &self.of {
            Of::Tenant { lane, tenant, .. } => core.take_back_tenant_slots(*lane, tenant, n),
            Of::Pool { .. } => core.take_back_pool_slots(n),
        }
    }
}

impl Fleet {
    /// Before the core decides on a request of `tenant` in `lane`: when
    /// the tenant, or the pool for a sheddable lane, has no free slot held
    /// here (and the replica is shared), takes one from the fleet, with a
    /// spare while nobody else waits.
    pub(super) async fn take_slots(
        &self,
        gw: &impl FleetHost,
        lane: Option<&str>,
        tenant: Option<&str>,
    ) {
        let Some(lane) = lane else { return };
        if self.mode() != FleetMode::Shared {
            return;
        }
        let tenant = tenant.unwrap_or(lanes::DEFAULT_TENANT);
        let short = gw.with_core(|c| {
            let profile = c.config().profile.clone();
            let sheddable = c.lane_index(lane).is_some_and(|i| c.lane(i).sheddable);
            let pool = sheddable.then(|| c.pool_short()).flatten().map(Need::pool);
            let tenant = c.tenant_short(lane, tenant);
            (pool, tenant.map(|n| Need::tenant(&profile, n)))
        });
        let (Some((pool, tenant)), Some(store)) = (short, self.connected()) else {
            return;
        };
        let needs: Vec<Need> = pool.into_iter().chain(tenant).collect();
        let calls = needs.iter().map(|n| async {
            let others = locked(&self.slot_seen)
                .get(&n.key())
                .is_some_and(|s| s.others_waiting > 0);
            // This request, beside what is in use and waiting already.
            let want = slots_wanted(n.in_use, n.waiting + 1, others);
            let op = SlotOp::Take(want.saturating_sub(n.held).max(1));
            let got = call(self, &store, n, op, n.held).await;
            self.apply(gw, &store, n, got).await
        });
        for r in join_all(calls).await {
            if let Err(e) = r {
                self.failed(gw, StoreOp::Slots, &e.to_string());
            }
        }
    }

    /// A call's answer: what it granted goes to the core (or back, when
    /// the core no longer leases the count).
    async fn apply(
        &self,
        gw: &impl FleetHost,
        store: &FleetStore,
        n: &Need,
        got: Result<SlotGrant, FleetStoreError>,
    ) -> Result<(), FleetStoreError> {
        let g = got?;
        self.metrics.call(StoreOp::Slots, true);
        let seen = SlotSeen {
            at: gw.now(),
            others_waiting: g.others_waiting,
        };
        locked(&self.slot_seen).insert(n.key(), seen);
        match gw.with_core(|c| n.add(c, g)).flatten() {
            Some(true) => gw.wake(),
            Some(false) => {}
            None if g.granted > 0 => {
                // The core no longer leases the count: it holds none.
                call(self, store, n, SlotOp::GiveBack(g.granted), 0).await?;
            }
            None => {}
        }
        Ok(())
    }
}

/// One slot call for a count; `held`: what the core holds of it, before
/// a take's grant or after a give back.
async fn call(
    fleet: &Fleet,
    store: &FleetStore,
    n: &Need,
    op: SlotOp,
    held: u64,
) -> Result<SlotGrant, FleetStoreError> {
    let waiting = match op {
        SlotOp::Take(k) => n.short().max(k),
        SlotOp::GiveBack(_) => n.short(),
    };
    store
        .slots(SlotCall {
            count: n.count(),
            replica: &fleet.replica(),
            op,
            waiting,
            max: fleet.sharing_slot_max(n.max),
            lease: Duration::from_secs_f64(SLOT_LEASE_SECONDS),
            held,
        })
        .await
}

/// The lease round's part for slots (the pool's and every tenant's): each
/// holding brought to its want (what is given back is taken out of the
/// core first), the others renewed when due, all calls at once.
pub(super) async fn slot_round(
    gw: &impl FleetHost,
    fleet: &Fleet,
    store: &FleetStore,
    profile: &str,
) -> Result<(), (StoreOp, String)> {
    let now = gw.now();
    let Some(needs) = gw.with_core(|c| {
        let tenants = c.tenant_needs().into_iter();
        let pool = c.pool_need().map(Need::pool);
        pool.into_iter()
            .chain(tenants.map(|n| Need::tenant(profile, n)))
            .collect::<Vec<Need>>()
    }) else {
        return Ok(());
    };
    let mut calls = Vec::new();
    {
        let mut seen = locked(&fleet.slot_seen);
        let keys: Vec<String> = needs.iter().map(Need::key).collect();
        seen.retain(|k, _| keys.contains(k));
        for n in needs {
            if let Some(op) = n.round_op(seen.get(&n.key()).copied(), now) {
                calls.push((n, op));
            }
        }
    }
    for (n, op) in &mut calls {
        if let SlotOp::GiveBack(k) = op {
            *k = gw.with_core(|c| n.take_back(c, *k)).unwrap_or(0);
        }
    }
    let answers = join_all(calls.iter().map(|(n, op)| {
        let held = match op {
            SlotOp::Take(_) => n.held,
            SlotOp::GiveBack(k) => n.held.saturating_sub(*k),
        };
        call(fleet, store, n, *op, held)
    }))
    .await;
    let mut failure = None;
    for ((n, _), got) in calls.iter().zip(answers) {
        if let Err(e) = fleet.apply(gw, store, n, got).await {
            failure = Some((StoreOp::Slots, e.to_string()));
        }
    }
    failure.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(in_use: u64, held: u64, waiting: u64) -> Need {
        Need {
            of: Of::Pool {
                profile: "p".to_owned(),
            },
            max: 10,
            in_use,
            held,
            waiting,
        }
    }

    fn seen(at: f64, others_waiting: u64) -> Option<SlotSeen> {
        Some(SlotSeen { at, others_waiting })
    }

    #[test]
    fn a_round_takes_for_the_waiting_keeps_a_spare_and_renews_once_a_second() {
        // Two in use, one waiting: three and a spare.
        assert_eq!(
            need(2, 2, 1).round_op(seen(0.0, 0), 0.1),
            Some(SlotOp::Take(2))
        );
        // Others wait: no spare, and what is free goes back.
        assert_eq!(
            need(2, 4, 0).round_op(seen(0.0, 3), 0.1),
            Some(SlotOp::GiveBack(2))
        );
        // As wanted: nothing until the renewal is due.
        assert_eq!(need(2, 3, 0).round_op(seen(0.0, 0), 0.5), None);
        assert_eq!(
            need(2, 3, 0).round_op(seen(0.0, 0), 1.0),
            Some(SlotOp::Take(0))
        );
        assert_eq!(need(2, 3, 0).round_op(None, 0.0), Some(SlotOp::Take(0)));
        // Idle and holding nothing: no call at all.
        assert_eq!(need(0, 0, 0).round_op(None, 5.0), None);
        assert_eq!(
            need(0, 1, 0).round_op(seen(0.0, 0), 0.1),
            Some(SlotOp::GiveBack(1))
        );
        assert_eq!(need(1, 1, 4).short(), 4);
        assert_eq!(need(0, 3, 4).short(), 1);
    }
}
