//! The change freeze, pure: a profile's freeze is the worst band among its
//! lanes with an objective (`Restricted` freezes rollouts, `Exhausted`
//! every spec change), and the parameters the API server's admission
//! policy (`charts/lanekeeper/templates/freeze.yaml`) reads to enforce it:
//! the spec of the profile's `LaneFreeze` (state, the lanes that cause it
//! with their bands, the objects it covers and the controller's clock in
//! whole minutes, since admission CEL has no clock). An open freeze lists
//! no lanes, no objects and no clock: nothing is frozen, and the spec does
//! not change from one minute to the next.

use crate::api::common::rfc3339;
use crate::api::{Covered, FreezeLane, FreezeState, FrozenObject, LaneFreezeSpec};

pub use super::decision::Freeze;
use super::decision::LaneDecision;

/// The freeze of a profile's lane decisions.
pub fn freeze(lanes: &[LaneDecision]) -> Freeze {
    let worst = lanes
        .iter()
        .filter_map(|l| l.objective.as_ref().map(|o| o.band))
        .max();
    let Some(band) = worst else {
        return Freeze::default();
    };
    Freeze {
        state: FreezeState::of(band),
        band: Some(band),
        lanes: lanes
            .iter()
            .filter(|l| l.objective.as_ref().is_some_and(|o| o.band == band))
            .map(|l| FreezeLane {
                name: l.name.clone(),
                band,
            })
            .collect(),
    }
}

/// The freeze of a step as `plan` reports it: None when no lane of the
/// profile has an objective.
pub fn reported(lanes: &[LaneDecision]) -> Option<Freeze> {
    let f = freeze(lanes);
    f.band.is_some().then_some(f)
}

/// The `LaneFreeze` spec of `profile` (open: no lanes, objects or clock):
/// `objects` are (kind, name, what it is), `now` the controller's time in
/// Unix seconds.
pub fn params(
    profile: &str,
    freeze: &Freeze,
    objects: &[(&str, &str, Covered)],
    now: i64,
) -> LaneFreezeSpec {
    if freeze.state == FreezeState::Open {
        return open(profile);
    }
    LaneFreezeSpec {
        profile: profile.to_owned(),
        state: freeze.state,
        lanes: freeze.lanes.clone(),
        objects: objects
            .iter()
            .map(|(kind, name, role)| FrozenObject {
                kind: (*kind).to_owned(),
                name: (*name).to_owned(),
                role: *role,
            })
            .collect(),
        clock: Some(rfc3339(now - now.rem_euclid(60))),
    }
}

/// The spec of an open freeze: nothing frozen.
pub fn open(profile: &str) -> LaneFreezeSpec {
    LaneFreezeSpec {
        profile: profile.to_owned(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Band;
    use crate::policy::decision::LaneObjective;

    fn lane(name: &str, band: Option<Band>) -> LaneDecision {
        let mut d: LaneDecision = serde_json::from_value(serde_json::json!({
            "namespace": "ns", "name": name, "priority": 0, "state": "Admitted",
            "requestsPerSecond": 1.0, "demandSource": "Expected", "demandUnitsPerSecond": 1.0,
            "admittedUnitsPerSecond": 1.0, "admittedRequestsPerSecond": 1.0,
            "borrowedUnitsPerSecond": 0.0, "reservedUnitsPerSecond": 0.0,
            "levelCapUnitsPerSecond": null, "limitedBy": null, "borrowing": []
        }))
        .unwrap();
        d.objective = band.map(|band| LaneObjective {
            band,
            remaining_percent: None,
            burn_rate: Default::default(),
            since: 0,
        });
        d
    }

    #[test]
    fn the_worst_band_among_lanes_with_objectives_decides() {
        assert_eq!(
            freeze(&[lane("p4", None)]),
            Freeze::default(),
            "no objective: open"
        );
        let f = freeze(&[
            lane("p0", Some(Band::Cautious)),
            lane("p1", Some(Band::Routine)),
            lane("p4", None),
        ]);
        assert_eq!(f.state, FreezeState::Open);
        assert_eq!(f.band, Some(Band::Cautious));
        let f = freeze(&[
            lane("p0", Some(Band::Restricted)),
            lane("p1", Some(Band::Exhausted)),
            lane("p2", Some(Band::Exhausted)),
        ]);
        assert_eq!(f.state, FreezeState::Everything);
        assert_eq!(f.lane_names(), ["p1", "p2"]);
        let f = freeze(&[
            lane("p0", Some(Band::Restricted)),
            lane("p1", Some(Band::Cautious)),
        ]);
        assert_eq!(f.state, FreezeState::Rollouts);
        assert_eq!(f.lane_names(), ["p0"]);
    }

    #[test]
    fn parameters_name_the_profile_lanes_objects_and_the_minute() {
        let objects = [
            ("Deployment", "vllm", Covered::ScaleTarget),
            ("LaneContract", "p0", Covered::Lane),
            ("CapacityProfile", "pool", Covered::Profile),
            ("DegradationPolicy", "ladder", Covered::Policy),
        ];
        let cautious = freeze(&[lane("p0", Some(Band::Cautious))]);
        assert_eq!(
            params("pool", &cautious, &objects, 125),
            open("pool"),
            "open: nothing listed, no clock"
        );
        assert!(open("pool").lanes.is_empty() && open("pool").clock.is_none());
        let f = freeze(&[lane("p0", Some(Band::Exhausted))]);
        let p = params("pool", &f, &objects, 1_796_300_059);
        assert_eq!(p.profile, "pool");
        assert_eq!(p.state, FreezeState::Everything);
        assert_eq!(
            p.lanes,
            [FreezeLane {
                name: "p0".into(),
                band: Band::Exhausted
            }]
        );
        assert_eq!(
            p.clock.as_deref(),
            Some(rfc3339(1_796_300_040).as_str()),
            "whole minutes"
        );
        assert_eq!(p.objects.len(), 4);
        assert_eq!(
            p.objects[0],
            FrozenObject {
                kind: "Deployment".into(),
                name: "vllm".into(),
                role: Covered::ScaleTarget
            }
        );
        assert_eq!(p.objects[3].role, Covered::Policy);
        // The same minute gives the same parameters (no write per evaluation).
        assert_eq!(p, params("pool", &f, &objects, 1_796_300_041));
        assert_ne!(
            p,
            params("pool", &f, &objects, 1_796_300_100),
            "next minute"
        );
    }

    #[test]
    fn plan_reports_a_freeze_only_with_objectives() {
        assert_eq!(reported(&[lane("p4", None)]), None);
        let f = reported(&[lane("p0", Some(Band::Restricted)), lane("p4", None)]).unwrap();
        assert_eq!(f.state, FreezeState::Rollouts);
        assert_eq!(f.lane_names(), ["p0"]);
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"state": "Rollouts", "band": "Restricted", "lanes": [{"name": "p0", "band": "Restricted"}]})
        );
    }
}
