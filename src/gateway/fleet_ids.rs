//! Request ids across the fleet, the gateway's side: before the core
//! decides, the fleet's memory of the request's id says how it counts (the
//! first sighting anywhere is an original, a later one a retry whatever its
//! attempt header said, one deferred by any replica a return with its
//! first arrival); a deferral is written back, so the request is a return
//! wherever it comes back. Only in shared mode: on the local share the
//! replica's own memory counts.

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use lanes::fleet_mode::FleetMode;

use super::decision::{Reason, Verdict};
use super::fleet_metrics::StoreOp;
use super::fleet_share::{Fleet, FleetHost, PendingDeferral, locked};
use super::fleet_store::FleetStore;
use super::fleet_store_ids::Sighting;

/// Most deferrals kept for a store that does not answer.
const MAX_PENDING_DEFERRALS: usize = 10_000;
/// Kept deferrals written per lease round, in one pipelined call (10,000
/// are written within 16 s of the store's return, each round's call a few
/// kilobytes).
const DEFERRALS_PER_ROUND: usize = 64;

impl Fleet {
    /// Where the fleet remembers ids of `lane` (the store's key, how long
    /// an id is kept, the store), when this replica is in shared mode and
    /// connected; `None` otherwise (ids stay local).
    fn shared_id_key(&self, lane: &str) -> Option<(String, u64, FleetStore)> {
        if self.mode() != FleetMode::Shared {
            return None;
        }
        let (key, seconds) = self.lane_key(lane)?;
        Some((key, seconds, self.connected()?))
    }

    /// The fleet's sighting of `id` in `lane`: a retry has `attempt`
    /// raised to at least 2 and any deferral of it this replica remembers
    /// taken off (its return consumed it elsewhere); a return is noted in
    /// the core (its first arrival on this replica's clock).
    pub(super) async fn count_sighting(
        &self,
        gw: &impl FleetHost,
        lane: Option<&str>,
        id: Option<&str>,
        attempt: &mut Option<u32>,
    ) {
        let (Some(lane), Some(id)) = (lane, id) else {
            return;
        };
        let Some((key, seconds, store)) = self.shared_id_key(lane) else {
            return;
        };
        let for_how_long = Duration::from_secs(seconds.max(1));
        match store.sighting(&key, id, for_how_long).await {
            Ok(s) => {
                self.metrics.call(StoreOp::Sighting, true);
                match s {
                    Sighting::First => {}
                    Sighting::Again => {
                        *attempt = Some(attempt.unwrap_or(1).max(2));
                        // A deferral this replica made may have been
                        // consumed by a return elsewhere.
                        gw.with_core(|c| c.note_retry(lane, id));
                    }
                    Sighting::Deferred { age_seconds } => {
                        let first = gw.now() - age_seconds;
                        gw.with_core(|c| c.note_returning(lane, id, first));
                    }
                }
            }
            Err(e) => self.failed(gw, StoreOp::Sighting, &e.to_string()),
        }
    }

    /// The answer to a request of `lane` with `id` was a deferral: the
    /// fleet remembers it deferred (in the background: the answer does not
    /// wait; the client comes back after its Retry-After, a second or
    /// more).
    pub(super) fn note_deferral<G: FleetHost + 'static>(
        self: &Arc<Self>,
        gw: &Arc<G>,
        lane: Option<&str>,
        id: Option<&str>,
        answer: &Response,
    ) {
        let reason = answer.extensions().get::<Reason>().copied();
        if Verdict::of(answer.status(), reason) != Verdict::Deferred {
            return;
        }
        let (Some(lane), Some(id)) = (lane, id) else {
            return;
        };
        let Some((key, seconds, store)) = self.shared_id_key(lane) else {
            // On the local share: written once the store answers again
            // (its sighting may have reached the store after the deadline).
            if let Some((key, seconds)) = self.lane_key(lane) {
                self.defer_later(PendingDeferral {
                    key,
                    id: id.to_owned(),
                    seconds,
                });
            }
            return;
        };
        let (fleet, gw, id) = (Arc::clone(self), Arc::clone(gw), id.to_owned());
        tokio::spawn(async move {
            let for_how_long = Duration::from_secs(seconds.max(1));
            match store.deferred(&key, &id, for_how_long).await {
                Ok(()) => fleet.metrics.call(StoreOp::Deferral, true),
                Err(e) => {
                    fleet.defer_later(PendingDeferral { key, id, seconds });
                    fleet.failed(&*gw, StoreOp::Deferral, &e.to_string());
                }
            }
        });
    }

    /// Keeps a deferral for the store (the oldest dropped past
    /// [`MAX_PENDING_DEFERRALS`]).
    fn defer_later(&self, d: PendingDeferral) {
        let mut pending = locked(&self.pending_deferrals);
        if pending.len() >= MAX_PENDING_DEFERRALS {
            pending.pop_front();
        }
        pending.push_back(d);
    }

    /// Writes up to [`DEFERRALS_PER_ROUND`] of the deferrals kept while the
    /// store did not answer, in one call (shared mode only; the round's
    /// last move, so leases never wait behind them); the rest, and a batch
    /// the store did not take, wait for the next round.
    pub(super) async fn write_pending_deferrals(&self, gw: &impl FleetHost, store: &FleetStore) {
        if self.mode() != FleetMode::Shared {
            return;
        }
        let batch: Vec<PendingDeferral> = {
            let mut pending = locked(&self.pending_deferrals);
            let n = pending.len().min(DEFERRALS_PER_ROUND);
            pending.drain(..n).collect()
        };
        if batch.is_empty() {
            return;
        }
        let items: Vec<(&str, &str, Duration)> = batch
            .iter()
            .map(|d| {
                (
                    d.key.as_str(),
                    d.id.as_str(),
                    Duration::from_secs(d.seconds.max(1)),
                )
            })
            .collect();
        match store.deferred_all(&items).await {
            Ok(()) => self.metrics.call(StoreOp::Deferral, true),
            Err(e) => {
                let mut pending = locked(&self.pending_deferrals);
                for d in batch.into_iter().rev() {
                    pending.push_front(d);
                }
                pending.truncate(MAX_PENDING_DEFERRALS);
                drop(pending);
                self.failed(gw, StoreOp::Deferral, &e.to_string());
            }
        }
    }
}
