//! Error-budget bands, pure: what is left of a lane's budget says how much
//! change it can take. `Routine` above 50 %, `Cautious` in (20, 50],
//! `Restricted` in (0, 20], `Exhausted` at 0 or below. Unknown budget data
//! is no budget ("not having seen failures yet is not budget"): at least
//! `Restricted`, and it never relaxes a worse band.

use std::collections::BTreeMap;

use crate::api::{Band, LaneBand, LaneContract, ObjectKey};
use crate::snapshot::{BurnRates, BurnWindow, Snapshot};

use super::decision::{LaneObjective, round6};

/// The band of `remaining` percent of the budget; with Unknown (None or
/// not finite) data, at least `Restricted` and never better than
/// `previous`.
pub fn band(remaining: Option<f64>, previous: Option<Band>) -> Band {
    match remaining.filter(|r| r.is_finite()) {
        Some(r) if r > 50.0 => Band::Routine,
        Some(r) if r > 20.0 => Band::Cautious,
        Some(r) if r > 0.0 => Band::Restricted,
        Some(_) => Band::Exhausted,
        None => previous.unwrap_or(Band::Restricted).max(Band::Restricted),
    }
}

/// Each lane's objective in this step (None for a lane without one), in
/// the order of `lanes`, and the bands to remember (by lane name).
pub fn objectives(
    lanes: &[&LaneContract],
    snapshot: &Snapshot,
    prev: &BTreeMap<String, LaneBand>,
) -> (Vec<Option<LaneObjective>>, BTreeMap<String, LaneBand>) {
    let mut remembered = BTreeMap::new();
    let out = lanes
        .iter()
        .map(|l| {
            l.spec.objective.as_ref()?;
            let sig = snapshot.lanes.get(&l.key());
            let remaining = sig
                .and_then(|s| s.error_budget_remaining_percent)
                .filter(|r| r.is_finite());
            let before = prev.get(l.name_str());
            let now = band(remaining, before.map(|b| b.band));
            let since = match before {
                Some(b) if b.band == now => b.since,
                _ => snapshot.at,
            };
            remembered.insert(l.name_str().to_owned(), LaneBand { band: now, since });
            let mut burn = BurnRates::default();
            for w in BurnWindow::ALL {
                burn.set(w, sig.and_then(|s| s.burn_rate.get(w)).map(round6));
            }
            Some(LaneObjective {
                band: now,
                remaining_percent: remaining.map(round6),
                burn_rate: burn,
                since,
            })
        })
        .collect();
    (out, remembered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_change_at_50_20_and_0() {
        assert_eq!(band(Some(100.0), None), Band::Routine);
        assert_eq!(band(Some(50.000_001), None), Band::Routine);
        assert_eq!(band(Some(50.0), None), Band::Cautious, "50 is Cautious");
        assert_eq!(band(Some(20.000_001), None), Band::Cautious);
        assert_eq!(band(Some(20.0), None), Band::Restricted, "20 is Restricted");
        assert_eq!(band(Some(0.000_001), None), Band::Restricted);
        assert_eq!(band(Some(0.0), None), Band::Exhausted, "0 is Exhausted");
        assert_eq!(band(Some(-250.0), None), Band::Exhausted, "overspent");
    }

    #[test]
    fn known_data_moves_the_band_either_way() {
        assert_eq!(band(Some(80.0), Some(Band::Exhausted)), Band::Routine);
        assert_eq!(band(Some(10.0), Some(Band::Routine)), Band::Restricted);
    }

    #[test]
    fn unknown_after_each_band_is_at_least_restricted_and_never_relaxes() {
        for (before, after) in [
            (None, Band::Restricted),
            (Some(Band::Routine), Band::Restricted),
            (Some(Band::Cautious), Band::Restricted),
            (Some(Band::Restricted), Band::Restricted),
            (Some(Band::Exhausted), Band::Exhausted),
        ] {
            assert_eq!(band(None, before), after, "Unknown after {before:?}");
            assert_eq!(band(Some(f64::NAN), before), after, "NaN after {before:?}");
            assert_eq!(
                band(Some(f64::INFINITY), before),
                after,
                "inf after {before:?}"
            );
        }
    }
}
