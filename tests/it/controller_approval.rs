//! Approval state in a profile's status stays readable by the controller's
//! watch. The approval flow itself (pending → granted → consumed) runs on a
//! real API server: tests/e2e/e2e_controller.rs.

use crate::support;

use serde_json::json;
use support::operator::*;

/// The engine state in a profile's status keeps Confirm/Manual gate clocks
/// keyed by level (`gateSince: {"4": …}`); the controller's watch reads
/// profiles through `DeserializeGuard`, which must still accept them.
#[test]
fn a_profile_with_gate_clocks_in_status_stays_readable() {
    let mut profile = inc47_objects()
        .into_iter()
        .find(|o| o["kind"] == "CapacityProfile")
        .unwrap();
    profile["status"] = json!({"engine": {"level": 3, "gateSince": {"4": 1_785_542_400}}});
    let guard: kube::core::DeserializeGuard<lanekeeper::api::CapacityProfile> =
        serde_json::from_value(profile).unwrap();
    let p = guard.0.expect("the profile reads back");
    let engine = p.status.unwrap().engine.unwrap();
    assert_eq!(engine.gate_since.get(&4), Some(&1_785_542_400));
}
