//! Approving a gated level through the annotation, with the real controller
//! against the in-process API double: pending → granted → consumed.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::apiserver::ApiServer;
use support::operator::*;

const POLICY: &str = "agent-assist-ladder";
const APPROVE: &str = "lanekeeper.dev/approve-level";

fn policy(s: &ApiServer) -> Value {
    s.get_object(LK, "degradationpolicies", Some(NS), POLICY)
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_level_waits_for_the_annotation_which_is_consumed_on_the_way_down() {
    let s = ApiServer::start().await;
    s.install_lanekeeper_crds();
    // 2 ready replicas × 70 = 140 units/s: even after levels 1..3 the demand
    // (373.6) exceeds capacity, so the ladder wants level 4 (continuity,
    // Confirm). Its timeout is pushed far out so only the annotation can let
    // the ladder in; a short stable window lets it come down within the test.
    s.put_direct(deployment("vllm-agent-assist", 8, 2)).unwrap();
    for mut o in inc47_objects() {
        if o["kind"] == "DegradationPolicy" {
            o["spec"]["hysteresis"]["stableForSeconds"] = json!(1);
            o["spec"]["levels"][3]["approval"]["timeoutSeconds"] = json!(100_000);
        }
        s.put_direct(o).unwrap();
    }
    let c = start(&s, settings(false, "a"));

    // Held at level 3 with level 4 pending approval.
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes")
            .is_some_and(|c| c["level"] == 3 && c["pendingApprovalLevel"] == 4))
            .await,
        "config at level 3 with level 4 pending: {:?}",
        lanes_json(&s, "agent-assist-lanes")
    );
    let cfg = lanes_json(&s, "agent-assist-lanes").unwrap();
    assert_eq!(cfg["levelName"], "protect");
    assert_eq!(cfg["flags"]["readOnly"], false);
    assert_eq!(cfg["flags"]["useFallbackRoutes"], true);
    assert!(
        s.wait_until(T, |s| policy(s)["status"]["pendingApprovalLevel"] == 4
            && policy(s)["status"]["level"] == 3)
            .await,
        "policy status: {}",
        policy(&s)["status"]
    );
    assert!(
        s.wait_until(T, |s| !events(s, "ApprovalPending").is_empty())
            .await,
        "ApprovalPending event"
    );
    let pending = events(&s, "ApprovalPending");
    assert_eq!(pending[0]["type"], "Warning");
    let note = pending[0]["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("level 4") && note.contains(APPROVE),
        "the event says how to approve: {note}"
    );
    // It stays there: no timeout, no approval.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(lanes_json(&s, "agent-assist-lanes").unwrap()["level"], 3);
    assert!(policy(&s)["status"]["approvedLevel"].is_null());

    // A human approves level 4.
    s.merge_patch_direct(
        LK,
        "degradationpolicies",
        Some(NS),
        POLICY,
        json!({"metadata": {"annotations": {APPROVE: "4"}}}),
        None,
    )
    .unwrap();
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes").is_some_and(
            |c| c["level"] == 4
                && c["flags"]["readOnly"] == true
                && c["pendingApprovalLevel"].is_null()
        ))
        .await,
        "config at level 4, read-only: {:?}",
        lanes_json(&s, "agent-assist-lanes")
    );
    assert_eq!(
        lanes_json(&s, "agent-assist-lanes").unwrap()["levelName"],
        "continuity"
    );
    assert!(
        s.wait_until(T, |s| {
            let st = &policy(s)["status"];
            st["approvedLevel"] == 4 && st["level"] == 4 && st["pendingApprovalLevel"].is_null()
        })
        .await,
        "policy status: {}",
        policy(&s)["status"]
    );
    assert!(
        s.wait_until(T, |s| !events(s, "ApprovalGranted").is_empty())
            .await,
        "ApprovalGranted event"
    );
    // Published at the end of the same reconcile, after the policy's events.
    assert!(
        s.wait_until(T, |s| events(s, "LevelRaised")
            .iter()
            .any(|e| e["note"].as_str().unwrap_or_default().contains("3 -> 4")))
            .await,
        "LevelRaised 3 -> 4: {:?}",
        events(&s, "LevelRaised")
    );
    // The annotation stays while the level is at or above it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(policy(&s)["metadata"]["annotations"][APPROVE], "4");

    // Capacity is back (8 × 70 = 560): the ladder steps down one level per
    // stable window; once below 4 the approval is consumed.
    set_ready(&s, 8);
    assert!(
        s.wait_until(T, |s| policy(s)["metadata"]["annotations"][APPROVE]
            .is_null())
            .await,
        "annotation consumed; policy: {}",
        policy(&s)
    );
    assert!(
        s.wait_until(T, |s| !events(s, "ApprovalConsumed").is_empty())
            .await,
        "ApprovalConsumed event"
    );
    assert!(
        s.wait_until(T, |s| policy(s)["status"]["approvedLevel"].is_null())
            .await,
        "approvedLevel cleared: {}",
        policy(&s)["status"]
    );
    let level_now = lanes_json(&s, "agent-assist-lanes").unwrap()["level"]
        .as_u64()
        .unwrap();
    assert!(level_now < 4, "consumed only below the approved level");
    // The ladder keeps stepping down one level per window. No source gives
    // an in-flight signal here, so `protect`'s inFlightAbove simply never
    // holds and does not pin level 3; level 1 (`conserve`) is kept, because
    // its exitWhen needs inFlightBelow, which an absent signal never
    // satisfies.
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes")
            .is_some_and(|c| c["level"] == 1))
            .await,
        "stepped down to 1: {:?}",
        lanes_json(&s, "agent-assist-lanes")
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(lanes_json(&s, "agent-assist-lanes").unwrap()["level"], 1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Each approval event once.
    assert_eq!(
        occurrences(&s, "ApprovalGranted"),
        1,
        "{:#?}",
        events(&s, "ApprovalGranted")
    );
    assert_eq!(
        occurrences(&s, "ApprovalConsumed"),
        1,
        "{:#?}",
        events(&s, "ApprovalConsumed")
    );
    assert_eq!(
        occurrences(&s, "ApprovalPending"),
        1,
        "{:#?}",
        events(&s, "ApprovalPending")
    );
    let transitions: Vec<(u64, u64)> = policy(&s)["status"]["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["from"].as_u64().unwrap(), t["to"].as_u64().unwrap()))
        .collect();
    assert_eq!(transitions, vec![(0, 3), (3, 4), (4, 3), (3, 2), (2, 1)]);
    c.stop().await;
}

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
