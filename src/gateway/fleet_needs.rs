//! What a replica needs of the fleet's buckets in one lease round (each
//! lane's and the pool's spare bucket's), and the round's two moves: the
//! excess given back, the shortfall taken (`fleet_lease_calls` makes the
//! calls).

use std::sync::Arc;

use lanes::fleet_core::LeaseNeed;
use lanes::fleet_mode::FleetMode;
use lanes::fleet_spare::SpareNeed;

use super::fleet_lease_calls::{Budget, Want, give_back, take_all};
use super::fleet_metrics::StoreOp;
use super::fleet_share::{Fleet, FleetHost, locked};
use super::fleet_store::FleetStore;

/// What the replica needs of the fleet's buckets in one round.
pub(super) struct Needs {
    /// The profile of the config in force.
    pub(super) profile: String,
    /// Each lane's.
    pub(super) lanes: Vec<LeaseNeed>,
    /// The pool's spare bucket's (none without spare capacity).
    pub(super) spare: Option<SpareNeed>,
}

/// What each lane and the spare bucket need now (the core leased if it is
/// not yet: a config installed while shared), and the lanes' deadlines
/// noted for sightings. `None` without a config, or when the replica went
/// back to its local share since the round began: the mode is read under
/// the core's lock, so a fall back (which sets the mode, then un-leases the
/// core) is never undone by a round that read the mode before it.
pub(super) fn needs(gw: &impl FleetHost, fleet: &Fleet) -> Option<Needs> {
    let now = gw.now();
    let mut needs = gw.with_core(|core| {
        if fleet.mode() != FleetMode::Shared {
            return None;
        }
        if !core.leased() {
            core.set_leased(true);
        }
        Some(Needs {
            profile: core.config().profile.clone(),
            lanes: core.lease_needs(now),
            spare: core.spare_lease_need(now),
        })
    })??;
    fleet.scale_to_sharing(&mut needs.lanes, needs.spare.as_mut());
    let deadlines = needs
        .lanes
        .iter()
        .map(|n| (n.name.clone(), n.deadline_seconds))
        .collect();
    *locked(&fleet.lanes) = (needs.profile.clone(), deadlines);
    Some(needs)
}

/// Gives back what each lane, and the spare bucket, holds beyond its need
/// (demand fell).
pub(super) async fn give_back_excess(
    gw: &impl FleetHost,
    fleet: &Arc<Fleet>,
    store: &FleetStore,
    needs: &Needs,
) -> Result<(), (StoreOp, String)> {
    for n in needs.lanes.iter().filter(|n| n.to_give_back() > 0) {
        let taken = gw.with_core(|core| {
            if core.lane_index(&n.name) == Some(n.lane) {
                core.take_back(n.lane, n.to_give_back())
            } else {
                0
            }
        });
        let Some(taken) = taken.filter(|t| *t > 0) else {
            continue;
        };
        let key = store.bucket_key(&format!("{}/{}", needs.profile, n.name));
        give_back(fleet, store, lane_budget(n), key, n.limits, taken).await?;
    }
    let Some(spare) = needs.spare.filter(|s| s.to_give_back() > 0) else {
        return Ok(());
    };
    let taken = gw.with_core(|core| core.take_back_spare(spare.to_give_back()));
    let Some(taken) = taken.filter(|t| *t > 0) else {
        return Ok(());
    };
    let key = store.spare_key(&needs.profile);
    give_back(fleet, store, Budget::Spare, key, spare.limits, taken).await
}

/// Takes each lane's shortfall, and the spare bucket's, from the fleet's
/// buckets, all at once, and hands the leases to the core.
pub(super) async fn top_up<G: FleetHost + 'static>(
    gw: &Arc<G>,
    fleet: &Arc<Fleet>,
    store: &FleetStore,
    needs: &Needs,
) -> Result<(), (StoreOp, String)> {
    let mut wants: Vec<Want> = needs
        .lanes
        .iter()
        .filter(|n| n.to_take() > 0)
        .map(|n| Want {
            budget: lane_budget(n),
            key: store.bucket_key(&format!("{}/{}", needs.profile, n.name)),
            limits: n.limits,
            tokens: n.to_take(),
        })
        .collect();
    if let Some(spare) = needs.spare.filter(|s| s.to_take() > 0) {
        wants.push(Want {
            budget: Budget::Spare,
            key: store.spare_key(&needs.profile),
            limits: spare.limits,
            tokens: spare.to_take(),
        });
    }
    take_all(gw, fleet, store, wants).await
}

fn lane_budget(n: &LeaseNeed) -> Budget {
    Budget::Lane {
        index: n.lane,
        name: n.name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use clap::Parser;
    use lanes::{Core, GatewayConfig};

    use super::super::fleet_args::FleetArgs;
    use super::super::fleet_share::{Fleet, FleetHost};
    use super::needs;

    struct Host(Mutex<Option<Core>>);

    impl FleetHost for Host {
        fn now(&self) -> f64 {
            1.0
        }
        fn with_core<R>(&self, f: impl FnOnce(&mut Core) -> R) -> Option<R> {
            self.0.lock().unwrap().as_mut().map(f)
        }
        fn wake(&self) {}
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        fleet: FleetArgs,
    }

    /// The race a review found: a round reads the mode (shared), a request's
    /// call fails and puts the replica on its local share (the core
    /// un-leased), then the round's `needs` leased the core again, and its
    /// buckets never refilled for the whole outage. `needs` now reads the
    /// mode under the core's lock and leases only when shared.
    #[test]
    fn a_round_never_leases_the_core_of_a_replica_on_its_local_share() {
        let text = include_str!("../../examples/inc-47/lanes-420.json");
        let cfg = GatewayConfig::from_json(text.as_bytes()).unwrap();
        let host = Host(Mutex::new(Some(Core::new(cfg, 1.0, 0.0, 1e6).unwrap())));
        let cli = Cli::parse_from(["gw", "--shared-state", "redis://127.0.0.1:1"]);
        let registry = prometheus::Registry::new();
        let fleet = Fleet::from_args(&cli.fleet, &registry, 0.0).unwrap();
        assert!(needs(&host, &fleet).is_none(), "local: no round");
        assert!(!host.with_core(|c| c.leased()).unwrap());
    }
}
