//! The fleet's lease round: every [`LEASE_SECONDS`], a probe when the
//! replica is on its local share; then, shared, each lane's lease topped up
//! and its excess given back (`fleet_share`), and the tenants' and the
//! pool's slots brought to what they need (`fleet_slots`).

use std::sync::Arc;
use std::time::Duration;

use lanes::fleet_lease::LEASE_SECONDS;
use lanes::fleet_mode::FleetMode;

use super::fleet_metrics::StoreOp;
use super::fleet_share::{Fleet, FleetHost, give_back, needs, quiet_for_a_second, top_up};
use super::fleet_slots::slot_round;

/// Keeps the leases topped up, every [`LEASE_SECONDS`], until the gateway
/// stops.
pub(super) async fn keep_leases(gw: Arc<impl FleetHost>, fleet: Arc<Fleet>) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(LEASE_SECONDS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        round(&*gw, &fleet).await;
    }
}

/// One round: probe when on the local share; then, shared, each lane's
/// excess given back and its lease topped up.
async fn round(gw: &impl FleetHost, fleet: &Fleet) {
    if !fleet.may_call(gw.now()) {
        return;
    }
    let Some(store) = fleet.store().await else {
        fleet.failed(gw, StoreOp::Probe, "no connection");
        return;
    };
    if fleet.mode() != FleetMode::Shared {
        match store.ping().await {
            Ok(()) => fleet.answered(gw, StoreOp::Probe),
            Err(e) => return fleet.failed(gw, StoreOp::Probe, &e.to_string()),
        }
    }
    let Some((profile, needs)) = needs(gw, fleet) else {
        return;
    };
    let busy = needs
        .iter()
        .any(|n| n.to_take() > 0 || n.to_give_back() > 0);
    if !busy && quiet_for_a_second(fleet) {
        // An idle replica asks nothing of the store: a ping once a second
        // keeps its mode true.
        if let Err(e) = store.ping().await {
            return fleet.failed(gw, StoreOp::Probe, &e.to_string());
        }
        fleet.metrics.call(StoreOp::Probe, true);
    }
    if let Err((op, why)) = give_back(gw, fleet, &store, &profile, &needs).await {
        return fleet.failed(gw, op, &why);
    }
    if let Err((op, why)) = top_up(gw, fleet, &store, &profile, &needs).await {
        return fleet.failed(gw, op, &why);
    }
    if let Err((op, why)) = slot_round(gw, fleet, &store, &profile).await {
        fleet.failed(gw, op, &why);
    }
}
