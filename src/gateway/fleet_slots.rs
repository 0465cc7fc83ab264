//! Tenant concurrency across the fleet, the gateway's side: the slots
//! this replica holds of each tenant's fleet-wide `maxConcurrency`, taken
//! from and given back to the shared store around the core.
//!
//! - In the lease round ([`slot_round`], every lease period): each tenant
//!   that holds, uses or waits for slots is brought to what it wants (in
//!   use + waiting + one spare while nobody else waits), and a holding
//!   kept unchanged is renewed once a second (the store drops a holding
//!   not renewed within its lease, so a crashed replica's slots come back).
//! - On the request path ([`Fleet::take_tenant_slot`]), only when an
//!   arriving request's tenant has no free slot held here: one call that
//!   takes it one (and the spare), before the core decides.
//!
//! A failed call puts the replica on its local share like any other.

use std::time::Duration;

use futures::future::join_all;
use lanes::fleet_mode::FleetMode;
use lanes::fleet_slots::{
    SLOT_LEASE_SECONDS, SLOT_RENEW_SECONDS, SlotGrant, SlotOp, slot_change, slots_wanted,
};
use lanes::fleet_tenants::TenantNeed;

use super::fleet_metrics::StoreOp;
use super::fleet_share::{Fleet, FleetHost, locked};
use super::fleet_store::{FleetStore, FleetStoreError};
use super::fleet_store_slots::{SlotCall, SlotCount};

/// What the store last said of one count this replica holds or asked for.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SlotSeen {
    /// When (the core's clock).
    at: f64,
    /// The other replicas' requests waiting short of a slot.
    others_waiting: u64,
}

/// The store's lane name of a need, and this replica's key of its count.
fn names(profile: &str, n: &TenantNeed) -> (String, String) {
    let lane = format!("{profile}/{}", n.lane_name);
    let key = format!("{lane}\u{0}{}", n.tenant);
    (lane, key)
}

/// The call a tenant needs this round: to its want, else a renewal when
/// one is due.
fn round_op(n: &TenantNeed, seen: Option<SlotSeen>, now: f64) -> Option<SlotOp> {
    let others = seen.is_some_and(|s| s.others_waiting > 0);
    let due = seen.is_none_or(|s| now - s.at >= SLOT_RENEW_SECONDS);
    match slot_change(n.held, slots_wanted(n.in_use, n.waiting, others)) {
        Some(op) => Some(op),
        None if due && n.held > 0 => Some(SlotOp::Take(0)),
        None => None,
    }
}

impl Fleet {
    /// Before the core decides on a request of `tenant` in `lane`: when
    /// the tenant has no free slot held here (and the replica is shared),
    /// takes one from the fleet, with a spare while nobody else waits.
    pub(super) async fn take_tenant_slot(
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
            let n = c.tenant_short(lane, tenant)?;
            Some((n, c.config().profile.clone()))
        });
        let (Some((n, profile)), Some(store)) = (short.flatten(), self.connected()) else {
            return;
        };
        let (lane, key) = names(&profile, &n);
        let others = locked(&self.slot_seen)
            .get(&key)
            .is_some_and(|s| s.others_waiting > 0);
        // This request, beside what is in use and waiting already.
        let want = slots_wanted(n.in_use, n.waiting + 1, others);
        let op = SlotOp::Take(want.saturating_sub(n.held).max(1));
        let got = call(self, &store, &lane, &n, op).await;
        if let Err(e) = self.apply(gw, &store, &n, &lane, &key, got).await {
            self.failed(gw, StoreOp::TenantSlots, &e.to_string());
        }
    }

    /// A call's answer: what it granted goes to the core (or back, when
    /// the core no longer leases the lane's tenants).
    async fn apply(
        &self,
        gw: &impl FleetHost,
        store: &FleetStore,
        n: &TenantNeed,
        lane: &str,
        key: &str,
        got: Result<SlotGrant, FleetStoreError>,
    ) -> Result<(), FleetStoreError> {
        let g = got?;
        self.metrics.call(StoreOp::TenantSlots, true);
        let seen = SlotSeen {
            at: gw.now(),
            others_waiting: g.others_waiting,
        };
        locked(&self.slot_seen).insert(key.to_owned(), seen);
        let added = gw.with_core(|c| {
            let ours = c.lane_index(&n.lane_name) == Some(n.lane);
            ours.then(|| c.add_tenant_slots(n.lane, &n.tenant, g.granted))
                .flatten()
        });
        match added.flatten() {
            Some(true) => gw.wake(),
            Some(false) => {}
            None if g.granted > 0 => {
                call(self, store, lane, n, SlotOp::GiveBack(g.granted)).await?;
            }
            None => {}
        }
        Ok(())
    }
}

/// One slot call for a tenant's count.
async fn call(
    fleet: &Fleet,
    store: &FleetStore,
    lane: &str,
    n: &TenantNeed,
    op: SlotOp,
) -> Result<SlotGrant, FleetStoreError> {
    let waiting = match op {
        SlotOp::Take(k) => n.short().max(k),
        SlotOp::GiveBack(_) => n.short(),
    };
    store
        .slots(SlotCall {
            count: SlotCount::Tenant {
                lane,
                tenant: &n.tenant,
            },
            replica: &fleet.replica,
            op,
            waiting,
            max: n.max,
            lease: Duration::from_secs_f64(SLOT_LEASE_SECONDS),
        })
        .await
}

/// The lease round's part for tenant slots: every tenant's holding brought
/// to its want (what is given back is taken out of the core first), the
/// others renewed when due, all calls at once.
pub(super) async fn slot_round(
    gw: &impl FleetHost,
    fleet: &Fleet,
    store: &FleetStore,
    profile: &str,
) -> Result<(), (StoreOp, String)> {
    let now = gw.now();
    let Some(needs) = gw.with_core(|c| c.tenant_needs()) else {
        return Ok(());
    };
    let mut calls = Vec::new();
    {
        let mut seen = locked(&fleet.slot_seen);
        let keys: Vec<(String, String)> = needs.iter().map(|n| names(profile, n)).collect();
        seen.retain(|k, _| keys.iter().any(|(_, key)| key == k));
        for (n, (lane, key)) in needs.into_iter().zip(keys) {
            if let Some(op) = round_op(&n, seen.get(&key).copied(), now) {
                calls.push((n, lane, key, op));
            }
        }
    }
    for (n, _, _, op) in &mut calls {
        if let SlotOp::GiveBack(k) = op {
            let back = gw.with_core(|c| c.take_back_tenant_slots(n.lane, &n.tenant, *k));
            *k = back.unwrap_or(0);
        }
    }
    let answers = join_all(
        calls
            .iter()
            .map(|(n, lane, _, op)| call(fleet, store, lane, n, *op)),
    )
    .await;
    let mut failure = None;
    for ((n, lane, key, _), got) in calls.iter().zip(answers) {
        if let Err(e) = fleet.apply(gw, store, n, lane, key, got).await {
            failure = Some((StoreOp::TenantSlots, e.to_string()));
        }
    }
    failure.map_or(Ok(()), Err)
}
