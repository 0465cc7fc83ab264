//! Approval state in a profile's status stays readable by the controller's
//! watch, and a consumed approval whose annotation could not be removed is
//! not used again. The approval flow itself (pending → granted → consumed)
//! runs on a real API server: tests/e2e/e2e_controller.rs.

use crate::support;

use std::time::Duration;

use lanekeeper::controller::APPROVE_ANNOTATION;
use serde_json::{Value, json};
use support::apiserver::{ApiServer, Fault};
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

const POLICY: &str = "agent-assist-ladder";

fn policy(s: &ApiServer) -> Value {
    s.get_object(LK, "degradationpolicies", Some(NS), POLICY)
        .unwrap()
}

fn annotated(s: &ApiServer) -> bool {
    !policy(s)["metadata"]["annotations"][APPROVE_ANNOTATION].is_null()
}

/// INC-47 with level 1 (`conserve`) behind a Manual approval, entered above
/// 85 % and left below 80 % after a stable second.
fn apply_gated(s: &ApiServer) {
    s.put_direct(deployment(POOL, 8, 8)).unwrap();
    for mut o in inc47_objects() {
        if o["kind"] == "DegradationPolicy" {
            let level = &mut o["spec"]["levels"][0];
            level["approval"] = json!({"mode": "Manual", "validForSeconds": 3600});
            level["enterWhen"] = json!({"utilizationPercentAbove": 85});
            level["exitWhen"] = json!({"utilizationPercentBelow": 80});
            o["spec"]["hysteresis"]["stableForSeconds"] = json!(1);
        }
        s.put_direct(o).unwrap();
    }
}

/// An approval used to enter a level whose annotation could not be removed
/// (a failed PATCH, or the controller stopping in between) is not given
/// again: the policy's status keeps when it was given until the annotation
/// is gone, so the next pass knows it as used and removes it. The next
/// incident waits for a new approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumed_approval_whose_removal_failed_is_removed_and_not_used_again() {
    let s = cluster().await;
    apply_gated(&s);
    let c = start(&s, settings(false, "a"));
    // 8 ready: 87.2 %, level 1 wanted.
    assert!(
        s.wait_until(T, |s| policy(s)["status"]["pendingApprovalLevel"] == 1)
            .await,
        "{:#}",
        policy(&s)["status"]
    );
    // The annotation's removal fails once (its PATCH, not the status's).
    s.inject(
        Fault::status(500)
            .method("PATCH")
            .path(&format!("degradationpolicies/{POLICY}"))
            .not_path("/status")
            .times(1),
    );
    s.merge_patch_direct(
        LK,
        "degradationpolicies",
        Some(NS),
        POLICY,
        json!({"metadata": {"annotations": {APPROVE_ANNOTATION: "1"}}}),
        None,
    )
    .unwrap();
    assert!(
        s.wait_until(T, |s| profile_status(s)["level"] == 1
            && s.pending_faults().is_empty()
            && !annotated(s)
            && policy(s)["status"]["approvedLevel"].is_null())
            .await,
        "level {}; faults {:?}; policy {:#}",
        profile_status(&s)["level"],
        s.pending_faults(),
        policy(&s)
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(occurrences(&s, "ApprovalGranted"), 1);
    assert_eq!(occurrences(&s, "ApprovalConsumed"), 1);

    // Recovery to level 0 (10 ready: 69.7 %), then load again.
    set_ready(&s, 10);
    assert!(
        s.wait_until(Duration::from_secs(30), |s| profile_status(s)["level"] == 0)
            .await,
        "{:#}",
        profile_status(&s)["engine"]
    );
    set_ready(&s, 8);
    assert!(
        s.wait_until(T, |s| policy(s)["status"]["pendingApprovalLevel"] == 1)
            .await,
        "the level waits for a new approval: {:#}",
        policy(&s)["status"]
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(profile_status(&s)["level"], 0);
    assert_eq!(lanes_json(&s, "agent-assist-lanes").unwrap()["level"], 0);
    c.stop().await;
}
