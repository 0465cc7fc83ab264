//! A finished request's reservation settled (under the core's lock): the
//! core corrects its lane's bucket with the answer's usage (or keeps the
//! reservation without one) and gives back its long-context place; the
//! metrics count the tokens, the units and the estimate's error; a priced
//! request answered in full counts the units it cost as completed work (the
//! capacity evidence), not its lane's `workUnitsPerRequest`.

use lanes::Core;

use super::dispatch::Finished;
use super::metrics::LaneMeter;
use super::token_metrics::TokenMetrics;

/// Settles `done`'s charge, if it has one; returns whether a waiting
/// request may go now.
pub(super) fn settle(
    core: &mut Core,
    meters: &[LaneMeter],
    metrics: &TokenMetrics,
    done: &Finished,
    now: f64,
) -> bool {
    let Some(charge) = &done.charge else {
        return false;
    };
    let Some(s) = core.settle(charge, done.usage, now) else {
        return false;
    };
    if charge.priced {
        metrics.settled(&charge.lane, &s);
        if let (Some(route), Some(meter)) = (&done.completed_by, meters.get(s.lane)) {
            meter.completed_units(route, s.charged_units);
        }
    }
    s.wake
}
