//! The controller keeps each profile's LaneFreeze (the change freeze's
//! parameters) against the API double: created by server-side apply when a
//! lane with an objective freezes something, owned by its profile (so it
//! goes with it), naming the lanes with their bands, the objects covered
//! and the minute clock; set back to open, not deleted, when the freeze
//! lifts; and never written for a profile without objectives. What the API
//! server does with it is tests/e2e/e2e_freeze.rs.

use crate::support;

use serde_json::{Value, json};
use support::operator::*;

const P0: &str = "p0-disruption-assist";

fn lane_freeze(s: &support::apiserver::ApiServer) -> Option<Value> {
    s.get_object(LK, "lanefreezes", Some(NS), "agent-assist")
}

fn p0(objective: Option<Value>) -> Value {
    let mut p0 = inc47_objects()
        .into_iter()
        .find(|o| o["kind"] == "LaneContract" && o["metadata"]["name"] == P0)
        .unwrap();
    if let Some(o) = objective {
        p0["spec"]["objective"] = o;
    }
    p0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lane_freeze_is_owned_by_its_profile_and_follows_the_bands() {
    let s = cluster().await;
    apply_inc47(&s, None);
    let c = start(&s, settings(false, "a"));
    // No objective: the profile decides (level 1) and writes no LaneFreeze.
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes").is_some())
            .await
    );
    assert!(s.wait_until(T, |s| profile_status(s)["level"] == 1).await);
    assert_eq!(lane_freeze(&s), None, "no objective: no LaneFreeze");

    // An objective without budget data: Restricted, rollouts frozen.
    s.put_direct(p0(Some(
        json!({"withinDeadlinePercent": "99.9", "window": "28d"}),
    )))
    .unwrap();
    assert!(
        s.wait_until(T, |s| lane_freeze(s)
            .is_some_and(|f| f["spec"]["state"] == "Rollouts"))
            .await
    );
    let f = lane_freeze(&s).unwrap();
    let owner = &f["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["name"], &owner["controller"]),
        (
            &json!("CapacityProfile"),
            &json!("agent-assist"),
            &json!(true)
        ),
        "owned by its profile: {f}"
    );
    let profile = s
        .get_object(LK, "capacityprofiles", Some(NS), "agent-assist")
        .unwrap();
    assert_eq!(owner["uid"], profile["metadata"]["uid"]);
    assert_eq!(f["spec"]["profile"], "agent-assist");
    assert_eq!(
        f["spec"]["lanes"],
        json!([{"name": P0, "band": "Restricted"}])
    );
    let objects = f["spec"]["objects"].as_array().unwrap();
    for (kind, name, role) in [
        ("Deployment", POOL, "ScaleTarget"),
        ("CapacityProfile", "agent-assist", "Profile"),
        ("LaneContract", P0, "Lane"),
        ("LaneContract", "p4-eval-backfill", "Lane"),
        ("DegradationPolicy", "agent-assist-ladder", "Policy"),
    ] {
        assert!(
            objects.contains(&json!({"kind": kind, "name": name, "role": role})),
            "{kind} {name} {role} in {objects:?}"
        );
    }
    let clock = f["spec"]["clock"].as_str().unwrap();
    assert!(
        clock.ends_with(":00Z") && clock.len() == 20,
        "whole minutes: {clock}"
    );
    // The profile's status says the same.
    assert!(
        s.wait_until(T, |s| profile_status(s)["freeze"]["state"] == "Rollouts")
            .await
    );

    // The objective goes: the freeze lifts, the LaneFreeze stays, open.
    s.put_direct(p0(None)).unwrap();
    assert!(
        s.wait_until(T, |s| lane_freeze(s)
            .is_some_and(|f| f["spec"]["state"] == "Open"))
            .await
    );
    let f = lane_freeze(&s).unwrap();
    assert_eq!(f["spec"]["lanes"], json!([]));
    assert_eq!(f["spec"]["objects"], json!([]));
    assert!(f["spec"].get("clock").is_none(), "{f}");
    c.stop().await;
}
