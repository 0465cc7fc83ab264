//! The fleet's lease round: every [`LEASE_SECONDS`], a probe when the
//! replica is on its local share; then, shared, each lane's lease topped up
//! and its excess given back (`fleet_share`), and the tenants' and the
//! pool's slots brought to what they need (`fleet_slots`).

use std::sync::Arc;
use std::time::Duration;

use lanes::fleet_lease::LEASE_SECONDS;
use lanes::fleet_mode::FleetMode;

use super::fleet_metrics::StoreOp;
use super::fleet_needs::{give_back_excess, needs, top_up};
use super::fleet_share::{Fleet, FleetHost};
use super::fleet_slots::slot_round;

/// Keeps the leases topped up, every [`LEASE_SECONDS`], until the gateway
/// stops.
pub(super) async fn keep_leases<G: FleetHost + 'static>(gw: Arc<G>, fleet: Arc<Fleet>) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(LEASE_SECONDS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        round(&gw, &fleet).await;
    }
}

/// One round: probe when on the local share; then, shared, each lane's
/// excess given back and its lease topped up.
async fn round<G: FleetHost + 'static>(gw: &Arc<G>, fleet: &Arc<Fleet>) {
    let gw_ref = &**gw;
    if !fleet.may_call(gw.now()) {
        return;
    }
    let Some(store) = fleet.store().await else {
        fleet.failed(gw_ref, StoreOp::Probe, "no connection");
        return;
    };
    if fleet.mode() != FleetMode::Shared {
        match store.ping().await {
            Ok(()) => fleet.answered(gw_ref, StoreOp::Probe),
            Err(e) => return fleet.failed(gw_ref, StoreOp::Probe, &e.to_string()),
        }
    }
    let Some(needs) = needs(gw_ref, fleet) else {
        return;
    };
    if let Err((op, why)) = give_back_excess(gw_ref, fleet, &store, &needs).await {
        return fleet.failed(gw_ref, op, &why);
    }
    if let Err((op, why)) = top_up(gw, fleet, &store, &needs).await {
        return fleet.failed(gw_ref, op, &why);
    }
    if let Err((op, why)) = slot_round(gw_ref, fleet, &store, &needs.profile).await {
        return fleet.failed(gw_ref, op, &why);
    }
    // After the leases: a slow store shows first on a lease call, whose
    // late answer is used or given back; the count is at most a second old.
    // It is an idle replica's one call a second, which keeps its mode true.
    if let Err((op, why)) = fleet.count_replicas(gw_ref, &store).await {
        return fleet.failed(gw_ref, op, &why);
    }
    fleet.write_pending_deferrals(gw_ref, &store).await;
}
