//! Lease calls of the fleet's budgets (each lane's bucket and the pool's
//! spare-capacity bucket), the gateway's side, and what becomes of an
//! answer that comes after the call's deadline.
//!
//! A late answer is never lost nor counted twice: the store ran the
//! script, so the tokens of a late grant are the replica's. When they come,
//! they go to the core if it is (again) on leases of that budget, and else
//! straight back to the store; tokens given back late were taken out of
//! the core before the call, so they are counted once, when the answer
//! comes. Every answer, in time or late, is counted in
//! `lanekeeper_gateway_shared_state_lease_units_total`, which adds up over
//! the replicas to the `taken` and `returned` totals the store keeps in
//! each bucket's key.

use std::sync::Arc;

use lanes::Core;
use lanes::fleet_lease::FleetLimits;

use super::fleet_metrics::{BudgetKind, LeaseDirection, StoreOp};
use super::fleet_share::{Fleet, FleetHost};
use super::fleet_store::{Answer, FleetStore, LeaseOp};

/// Which of the fleet's buckets a lease is of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Budget {
    /// A lane's: its index in the config and its name.
    Lane { index: usize, name: String },
    /// The pool's spare capacity.
    Spare,
}

impl Budget {
    /// Hands `tokens` of a lease to the core: `Some(true)` when someone
    /// waiting may go now, `None` when the core is not on leases of this
    /// budget (any more; a lane also when the config changed under it).
    fn credit(&self, core: &mut Core, tokens: u64) -> Option<bool> {
        match self {
            Budget::Lane { index, name } => {
                if core.lane_index(name) != Some(*index) {
                    return None;
                }
                core.add_lease(*index, tokens)
            }
            Budget::Spare => core.add_spare_lease(tokens),
        }
    }

    /// Its kind and lane name (`""` for spare): the metric's labels.
    fn labels(&self) -> (BudgetKind, &str) {
        match self {
            Budget::Lane { name, .. } => (BudgetKind::Lane, name),
            Budget::Spare => (BudgetKind::Spare, ""),
        }
    }
}

/// One lease to take: of which budget, the store's key, the bucket's
/// fleet-wide limits and how many tokens.
pub(super) struct Want {
    pub(super) budget: Budget,
    pub(super) key: String,
    pub(super) limits: FleetLimits,
    pub(super) tokens: u64,
}

/// Takes every lease of `wants` at once and hands them to the core (waking
/// the driver when a waiting request may go). A failed call is the error
/// (the first); a late one is settled when its answer comes.
pub(super) async fn take_all<G: FleetHost + 'static>(
    gw: &Arc<G>,
    fleet: &Arc<Fleet>,
    store: &FleetStore,
    wants: Vec<Want>,
) -> Result<(), (StoreOp, String)> {
    let calls = wants
        .iter()
        .map(|w| store.lease(w.key.clone(), w.limits, LeaseOp::Take, w.tokens));
    let answers = futures::future::join_all(calls).await;
    let mut failure = None;
    for (w, answer) in wants.into_iter().zip(answers) {
        match answer {
            Answer::InTime(Ok(got)) => {
                fleet.metrics.call(StoreOp::Take, true);
                granted(gw, fleet, store, w, got);
            }
            Answer::InTime(Err(e)) => failure = Some((StoreOp::Take, e.to_string())),
            Answer::Late(late) => {
                failure = Some((
                    StoreOp::Take,
                    format!("no answer within {:?}", store.deadline),
                ));
                let (gw, fleet, store) = (Arc::clone(gw), Arc::clone(fleet), store.clone());
                tokio::spawn(async move {
                    if let Ok(Ok(got)) = late.await {
                        fleet.metrics.late(StoreOp::Take);
                        granted(&gw, &fleet, &store, w, got);
                    }
                });
            }
        }
    }
    failure.map_or(Ok(()), Err)
}

/// `got` tokens granted for `w`: counted, to the core, or back to the store
/// when the core does not take them.
fn granted<G: FleetHost + 'static>(
    gw: &Arc<G>,
    fleet: &Arc<Fleet>,
    store: &FleetStore,
    w: Want,
    got: u64,
) {
    if got == 0 {
        return;
    }
    fleet
        .metrics
        .lease_units(w.budget.labels(), LeaseDirection::Taken, got);
    match gw.with_core(|core| w.budget.credit(core, got)).flatten() {
        Some(true) => gw.wake(),
        Some(false) => {}
        None => {
            let (fleet, store) = (Arc::clone(fleet), store.clone());
            tokio::spawn(async move {
                give_back_until_answered(&fleet, &store, &w.budget, w.key, w.limits, got).await;
            });
        }
    }
}

/// Gives `tokens` (already out of the core) back to the bucket at `key`;
/// an error when the answer did not come in time (it is still counted
/// when it comes).
pub(super) async fn give_back(
    fleet: &Arc<Fleet>,
    store: &FleetStore,
    budget: Budget,
    key: String,
    limits: FleetLimits,
    tokens: u64,
) -> Result<(), (StoreOp, String)> {
    match store.lease(key, limits, LeaseOp::Give, tokens).await {
        Answer::InTime(Ok(_)) => {
            fleet.metrics.call(StoreOp::GiveBack, true);
            fleet
                .metrics
                .lease_units(budget.labels(), LeaseDirection::Returned, tokens);
            Ok(())
        }
        // Tokens given back to a store that does not take them are lost to
        // the fleet: safe (fewer admitted), never more.
        Answer::InTime(Err(e)) => Err((StoreOp::GiveBack, e.to_string())),
        Answer::Late(late) => {
            let fleet = Arc::clone(fleet);
            tokio::spawn(async move {
                if let Ok(Ok(_)) = late.await {
                    fleet.metrics.late(StoreOp::GiveBack);
                    fleet
                        .metrics
                        .lease_units(budget.labels(), LeaseDirection::Returned, tokens);
                }
            });
            Err((
                StoreOp::GiveBack,
                format!("no answer within {:?}", store.deadline),
            ))
        }
    }
}

/// Gives tokens back and waits for the answer however late (the store's
/// connection times out after a few seconds): a late grant the core did not
/// take.
async fn give_back_until_answered(
    fleet: &Fleet,
    store: &FleetStore,
    budget: &Budget,
    key: String,
    limits: FleetLimits,
    tokens: u64,
) {
    let answer = match store.lease(key, limits, LeaseOp::Give, tokens).await {
        Answer::InTime(a) => a,
        Answer::Late(late) => late
            .await
            .unwrap_or_else(|e| Err(super::fleet_store::FleetStoreError::Lost(e.to_string()))),
    };
    if answer.is_ok() {
        fleet
            .metrics
            .lease_units(budget.labels(), LeaseDirection::Returned, tokens);
    }
}
