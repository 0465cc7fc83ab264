//! The change freeze, pure: a profile's freeze is the worst band among its
//! lanes with an objective (`Restricted` freezes rollouts, `Exhausted`
//! every spec change), and the parameters the API server's admission
//! policy (`charts/lanekeeper/templates/freeze.yaml`) reads to enforce it.
//!
//! The parameters are one ConfigMap per profile, flat string keys (CEL in
//! the API server has no JSON parser):
//!
//! - `profile`, `band`, `lanes` (comma-separated): what the denial names;
//! - `object.<Kind>.<name>`: the objects the freeze covers, valued
//!   `scaleTarget`, `profile`, `lane` or `policy`;
//! - `clock`: the controller's time (RFC 3339, whole minutes), the "now"
//!   an exception's `expires` is checked against (admission CEL has no
//!   clock of its own).
//!
//! An open freeze has no keys at all: nothing is frozen.

use std::collections::BTreeMap;

use crate::api::common::rfc3339;
use crate::api::{Band, FreezeState};

use super::decision::LaneDecision;

/// The label every freeze parameter ConfigMap carries (what the policy
/// binding selects and the guard policy protects).
pub const PARAMS_LABEL: &str = "lanekeeper.dev/freeze-params";

/// A profile's freeze in one step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Freeze {
    /// What is frozen.
    pub state: FreezeState,
    /// The worst band among the lanes with an objective (None: no lane has
    /// one).
    pub band: Option<Band>,
    /// The lanes in that band, in the decision's order.
    pub lanes: Vec<String>,
}

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
            .map(|l| l.name.clone())
            .collect(),
    }
}

/// What an object is to the profile whose freeze covers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Covered {
    /// The pool's workload (its pod template is frozen).
    ScaleTarget,
    /// The CapacityProfile itself.
    Profile,
    /// One of its LaneContracts.
    Lane,
    /// Its governing DegradationPolicy.
    Policy,
}

impl Covered {
    /// The value in the parameters.
    pub fn as_str(self) -> &'static str {
        match self {
            Covered::ScaleTarget => "scaleTarget",
            Covered::Profile => "profile",
            Covered::Lane => "lane",
            Covered::Policy => "policy",
        }
    }
}

/// The freeze parameters of `profile` (empty while open): `objects` are
/// (kind, name, what it is), `now` the controller's time in Unix seconds.
pub fn params(
    profile: &str,
    freeze: &Freeze,
    objects: &[(&str, &str, Covered)],
    now: i64,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(band) = freeze.band.filter(|_| freeze.state != FreezeState::Open) else {
        return out;
    };
    out.insert("profile".into(), profile.to_owned());
    out.insert("band".into(), band.as_str().to_owned());
    out.insert("lanes".into(), freeze.lanes.join(", "));
    out.insert("clock".into(), rfc3339(now - now.rem_euclid(60)));
    for (kind, name, what) in objects {
        out.insert(format!("object.{kind}.{name}"), what.as_str().to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert_eq!(f.lanes, ["p1", "p2"]);
        let f = freeze(&[
            lane("p0", Some(Band::Restricted)),
            lane("p1", Some(Band::Cautious)),
        ]);
        assert_eq!(f.state, FreezeState::Rollouts);
        assert_eq!(f.lanes, ["p0"]);
    }

    #[test]
    fn parameters_name_the_profile_band_lanes_objects_and_the_minute() {
        let objects = [
            ("Deployment", "vllm", Covered::ScaleTarget),
            ("LaneContract", "p0", Covered::Lane),
            ("CapacityProfile", "pool", Covered::Profile),
            ("DegradationPolicy", "ladder", Covered::Policy),
        ];
        let open = freeze(&[lane("p0", Some(Band::Routine))]);
        assert!(
            params("pool", &open, &objects, 125).is_empty(),
            "open: no keys"
        );
        let f = freeze(&[lane("p0", Some(Band::Exhausted))]);
        let p = params("pool", &f, &objects, 1_796_300_059);
        assert_eq!(p["profile"], "pool");
        assert_eq!(p["band"], "Exhausted");
        assert_eq!(p["lanes"], "p0");
        assert_eq!(p["clock"], rfc3339(1_796_300_040), "whole minutes");
        assert_eq!(p["object.Deployment.vllm"], "scaleTarget");
        assert_eq!(p["object.LaneContract.p0"], "lane");
        assert_eq!(p["object.CapacityProfile.pool"], "profile");
        assert_eq!(p["object.DegradationPolicy.ladder"], "policy");
        assert_eq!(p.len(), 8);
        // The same minute gives the same parameters (no write per evaluation).
        assert_eq!(p, params("pool", &f, &objects, 1_796_300_041));
    }
}
