//! The real controller against the in-process API double, for what a real
//! API server cannot be made to do: start without the CRDs, hold objects its
//! validation would refuse, inject 500s, 409s, delays and dropped watches.
//! Everything else runs on a real server (tests/e2e/e2e.rs,
//! tests/e2e/e2e_controller.rs).

use crate::support;

use std::time::Duration;

use lanekeeper::controller::{self, Metrics, Readiness};
use prometheus::core::Collector;
use serde_json::{Value, json};
use support::apiserver::{ApiServer, Fault};
use support::operator::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_to_start_without_crds() {
    let s = ApiServer::start().await;
    let operator = controller::Operator {
        client: s.client(),
        settings: settings(false, "a"),
        metrics: Metrics::new(),
        readiness: Readiness::default(),
        extra_sources: Vec::new(),
    };
    let err = operator.run(async {}).await.unwrap_err();
    assert!(matches!(err, controller::Error::CrdsMissing(_)), "{err}");
    assert!(err.to_string().contains("kubectl apply -f crds/"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_objects_get_an_event_and_a_condition() {
    let s = cluster().await;
    apply_inc47(&s, None);
    // Bypass validation the way an old object or a broken admission path would.
    s.put_direct(json!({
        "apiVersion": LK, "kind": "LaneContract",
        "metadata": {"name": "broken", "namespace": NS},
        "spec": {"profile": "agent-assist", "priority": "high"}
    }))
    .unwrap();
    s.put_direct(json!({
        "apiVersion": LK, "kind": "CapacityProfile",
        "metadata": {"name": "broken-pool", "namespace": NS},
        "spec": {"pool": "nope"}
    }))
    .unwrap();
    let c = start(&s, settings(false, "a"));
    // The good profile keeps working.
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes").is_some_and(
            |c| c["level"] == 1 && c["lanes"].as_array().unwrap().len() == 5
        ))
        .await
    );
    assert!(
        s.wait_until(T, |s| events(s, "InvalidObject").len() >= 2)
            .await,
        "events: {:?}",
        events(&s, "InvalidObject")
    );
    let lane = s
        .get_object(LK, "lanecontracts", Some(NS), "broken")
        .unwrap();
    let cond = &lane["status"]["conditions"][0];
    assert_eq!(cond["status"], "False");
    assert_eq!(cond["reason"], "InvalidSpec");
    assert!(
        cond["message"].as_str().unwrap().contains("priority")
            || cond["message"].as_str().unwrap().contains("invalid type"),
        "{cond}"
    );
    let prof = s
        .get_object(LK, "capacityprofiles", Some(NS), "broken-pool")
        .unwrap();
    assert_eq!(prof["status"]["conditions"][0]["reason"], "InvalidSpec");
    // Reported once, not on every tick.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(events(&s, "InvalidObject").len(), 2);
    c.stop().await;
}

/// The end state of a run, for comparing runs.
fn end_state(s: &ApiServer) -> (Value, Value, Value) {
    let mut cfg = lanes_json(s, "agent-assist-lanes").unwrap_or(Value::Null);
    cfg["generations"] = Value::Null;
    let mut st = profile_status(s);
    st["conditions"] = Value::Null;
    st["engine"]["levelSince"] = Value::Null;
    st["engine"]["scaleDownSince"] = Value::Null;
    let replicas = s
        .get_object("apps/v1", "deployments", Some(NS), "vllm-agent-assist")
        .unwrap()["spec"]["replicas"]
        .clone();
    (cfg, st["level"].clone(), replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converges_through_injected_faults() {
    // Reference run without faults.
    let clean = cluster().await;
    apply_inc47(&clean, None);
    set_ready(&clean, 6);
    let c = start(&clean, settings(false, "a"));
    assert!(
        clean
            .wait_until(T, |s| lanes_json(s, "agent-assist-lanes")
                .is_some_and(|c| c["level"] == 2)
                && profile_status(s)["level"] == 2)
            .await
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let want = end_state(&clean);
    c.stop().await;

    let s = cluster().await;
    apply_inc47(&s, None);
    set_ready(&s, 6);
    s.inject(
        Fault::status(500)
            .method("PATCH")
            .path("configmaps")
            .times(3),
    );
    // The scale target's watch: its first lists fail (the watch backs off
    // and lists again; the reconcile holds the pool size meanwhile).
    s.inject(
        Fault::status(503)
            .method("GET")
            .path("deployments")
            .watch_only(false)
            .times(2),
    );
    s.inject(Fault::conflict().method("PATCH").path("/status").times(3));
    s.inject(
        Fault::delay(Duration::from_millis(800))
            .method("PATCH")
            .path("/scale")
            .times(1),
    );
    s.inject(Fault::drop_watch(1).path("lanecontracts").times(3));
    s.inject(
        Fault::status(500)
            .method("GET")
            .path("capacityprofiles")
            .watch_only(false)
            .times(2),
    );
    let c = start(&s, settings(false, "a"));
    assert!(
        s.wait_until(Duration::from_secs(40), |s| lanes_json(
            s,
            "agent-assist-lanes"
        )
        .is_some_and(|c| c["level"] == 2)
            && profile_status(s)["level"] == 2)
            .await,
        "did not converge; pending faults {:?}; last requests {:#?}",
        s.pending_faults(),
        s.requests()
            .iter()
            .rev()
            .take(25)
            .map(|r| format!("{} {} {:?} -> {}", r.method, r.path, r.query, r.status))
            .collect::<Vec<_>>()
    );
    assert!(
        s.wait_until(T, |s| s.pending_faults().is_empty()).await,
        "every fault fired: {:?}",
        s.pending_faults()
    );
    assert!(
        s.wait_until(T, |s| end_state(s) == want).await,
        "same end state as without faults:\n{:#?}\nvs\n{:#?}",
        end_state(&s),
        want
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Nothing lost or doubled: one level transition 0 -> 2, reported once.
    let raised = events(&s, "LevelRaised");
    assert_eq!(raised.len(), 1, "{raised:#?}");
    let policy = s
        .get_object(LK, "degradationpolicies", Some(NS), "agent-assist-ladder")
        .unwrap();
    let transitions = policy["status"]["transitions"].as_array().unwrap();
    assert_eq!(transitions.len(), 1, "{transitions:#?}");
    assert!(
        c.metrics
            .reconcile_errors
            .collect()
            .iter()
            .flat_map(|f| f.get_metric())
            .map(|m| m.get_counter().get_value())
            .sum::<f64>()
            >= 1.0,
        "the faults surfaced as reconcile errors"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_is_judged_only_once_the_pools_watches_have_synced() {
    let s = cluster().await;
    apply_inc47(&s, None);
    // The pool's first lists come late. A decision taken before them would
    // read a pod index and a scale target not yet listed as unknown
    // capacity: a TelemetryUnknown event, then TelemetryRestored.
    for what in ["/pods", "/deployments"] {
        s.inject(
            Fault::delay(Duration::from_millis(1500))
                .method("GET")
                .path(what)
                .watch_only(false),
        );
    }
    let c = start(&s, settings(false, "a"));
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes")
            .is_some_and(|c| c["level"] == 1)
            && profile_status(s)["level"] == 1)
            .await
    );
    assert!(s.pending_faults().is_empty(), "both first lists were slow");
    tokio::time::sleep(Duration::from_secs(1)).await;
    for reason in ["TelemetryUnknown", "TelemetryRestored"] {
        assert_eq!(events(&s, reason), Vec::<Value>::new(), "{reason}");
    }
    let judged_unknown: Vec<Value> = s
        .history(LK, "capacityprofiles", Some(NS), "agent-assist")
        .into_iter()
        .filter_map(|w| {
            let conditions = w.object["status"]["conditions"].as_array()?.clone();
            conditions
                .into_iter()
                .find(|c| c["type"] == "TelemetryKnown" && c["status"] == "False")
        })
        .collect();
    assert_eq!(judged_unknown, Vec::<Value>::new());
    c.stop().await;
}

/// A profile new to a pool starts from the pool's size: demand that wants
/// fewer replicas (INC-47's 488.1 units/s want 9 of 70 at 85 %) waits out
/// `scaleDownStabilizationSeconds` (300) like any scale-down, instead of
/// shrinking the 16 replicas it just adopted on its first reconcile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_profile_does_not_shrink_the_pool_it_adopts() {
    let s = cluster().await;
    apply_inc47(&s, None);
    s.put_direct(deployment(POOL, 16, 16)).unwrap();
    let c = start(&s, settings(false, "a"));
    assert!(
        s.wait_until(T, |s| profile_status(s)["engine"]["scaleDownSince"]
            .is_i64())
            .await,
        "{}",
        profile_status(&s)
    );
    let engine = &profile_status(&s)["engine"];
    assert_eq!(engine["desiredReplicas"], 16, "{engine}");
    assert_eq!(engine["scaleDownWant"], 9, "{engine}");
    let replicas = |s: &ApiServer| {
        s.get_object("apps/v1", "deployments", Some(NS), POOL)
            .unwrap()["spec"]["replicas"]
            .clone()
    };
    assert_eq!(replicas(&s), 16);
    c.stop().await;
}

/// The example profile's condition of a type.
fn condition(s: &ApiServer, type_: &str) -> Value {
    condition_of(s, "agent-assist", type_)
}

/// Profile `name`'s condition of `type_` (null without one).
fn condition_of(s: &ApiServer, name: &str, type_: &str) -> Value {
    s.get_object(LK, "capacityprofiles", Some(NS), name)
        .and_then(|p| {
            p["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == type_)
                .cloned()
        })
        .unwrap_or(Value::Null)
}

/// Scale writes the controller attempted.
fn scale_patches(s: &ApiServer) -> usize {
    s.requests_matching(Some("PATCH"), "/scale").len()
}

/// A scale write the API server refuses every time (an RBAC rule missing, a
/// webhook denying it) does not stop the rest of the reconcile: the gateway
/// config, the profile's status with the engine's state, the events. The
/// refusal is a condition and an event, the write backs off instead of
/// being retried every tick, and the ladder keeps its memory: with
/// `stableForSeconds: 300`, capacity coming back does not take the ConfigMap
/// down a level at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_scale_write_is_reported_and_the_ladder_keeps_its_memory() {
    let s = cluster().await;
    apply_inc47(&s, None);
    set_ready(&s, 6);
    s.inject(
        Fault::status(403)
            .method("PATCH")
            .path("/scale")
            .times(1_000_000),
    );
    let c = start(&s, settings(false, "a"));
    assert!(
        s.wait_until(T, |s| profile_status(s)["level"] == 2
            && condition(s, "Ready")["reason"] == "WriteRefused")
            .await,
        "{:#}",
        profile_status(&s)
    );
    let ready = condition(&s, "Ready");
    assert_eq!(ready["status"], "False", "{ready}");
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("scale Deployment {POOL} to 9 replicas")),
        "{message}"
    );
    assert_eq!(profile_status(&s)["engine"]["level"], 2);
    assert!(
        s.wait_until(T, |s| !events(s, "WriteRefused").is_empty())
            .await
    );
    assert_eq!(events(&s, "LevelRaised").len(), 1);
    assert_eq!(lanes_json(&s, "agent-assist-lanes").unwrap()["level"], 2);

    // Capacity comes back; the level holds for the stable window (300 s).
    let before = scale_patches(&s);
    set_ready(&s, 8);
    assert!(
        s.wait_until(T, |s| profile_status(s)["readyReplicas"] == 8)
            .await
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    let levels: Vec<Value> = s
        .history("v1", "configmaps", Some(NS), "agent-assist-lanes")
        .iter()
        .filter_map(|w| w.object["data"]["lanes.json"].as_str())
        .map(|j| serde_json::from_str::<Value>(j).unwrap()["level"].clone())
        .collect();
    assert_eq!(levels.last(), Some(&json!(2)), "{levels:?}");
    assert!(!levels.contains(&json!(1)), "{levels:?}");
    assert_eq!(profile_status(&s)["level"], 2);
    // Backing off: 1 s, 2 s, 4 s… between attempts, not one every tick
    // (the resync here is 500 ms).
    let retried = scale_patches(&s) - before;
    assert!(retried <= 5, "{retried} scale writes in about 7 s");
    c.stop().await;
}

/// A status write that fails once after the profile's status took the new
/// level loses nothing: the policy's transitions and the `LevelRaised`
/// event come out once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_policy_status_write_loses_no_transition() {
    let s = cluster().await;
    apply_inc47(&s, None);
    set_ready(&s, 6);
    s.inject(
        Fault::status(500)
            .method("PATCH")
            .path("degradationpolicies/agent-assist-ladder/status")
            .times(1),
    );
    let c = start(&s, settings(false, "a"));
    let policy = |s: &ApiServer| {
        s.get_object(LK, "degradationpolicies", Some(NS), "agent-assist-ladder")
            .unwrap()["status"]
            .clone()
    };
    assert!(
        s.wait_until(T, |s| policy(s)["level"] == 2
            && !events(s, "LevelRaised").is_empty())
            .await,
        "policy {:#}; LevelRaised {:?}",
        policy(&s),
        events(&s, "LevelRaised")
    );
    assert!(s.pending_faults().is_empty());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let transitions: Vec<(Value, Value)> = policy(&s)["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["from"].clone(), t["to"].clone()))
        .collect();
    assert_eq!(transitions, [(json!(0), json!(2))]);
    assert_eq!(occurrences(&s, "LevelRaised"), 1);
    c.stop().await;
}

/// The pool's `spec.replicas`.
fn pool_replicas(s: &ApiServer) -> Value {
    s.get_object("apps/v1", "deployments", Some(NS), POOL)
        .unwrap()["spec"]["replicas"]
        .clone()
}

/// Sets the pool's `spec.replicas` the way `kubectl scale` would.
fn scale_by_hand(s: &ApiServer, replicas: i64) {
    s.merge_patch_direct(
        "apps/v1",
        "deployments",
        Some(NS),
        POOL,
        json!({"spec": {"replicas": replicas}}),
        None,
    )
    .unwrap();
}

/// Scale writes the controller sent after `since`, with their replicas.
fn scale_writes_since(s: &ApiServer, since: std::time::SystemTime) -> Vec<(Value, Duration)> {
    s.requests_matching(Some("PATCH"), "/scale")
        .into_iter()
        .filter(|r| r.time >= since && r.status < 300)
        .map(|r| {
            let body = r.body.unwrap_or_default();
            let after = r.time.duration_since(since).unwrap_or_default();
            (body["spec"]["replicas"].clone(), after)
        })
        .collect()
}

/// A person scaling the pool up while it is degraded (`kubectl scale
/// --replicas=14` at INC-47's level 2, where demand wants 9) is not undone:
/// the engine starts from the replicas the pool has, and never scales down
/// while degraded (rule 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_up_by_hand_is_not_undone_while_degraded() {
    let s = cluster().await;
    apply_inc47(&s, None);
    set_ready(&s, 6);
    let c = start(&s, settings(false, "a"));
    assert!(
        s.wait_until(T, |s| profile_status(s)["level"] == 2
            && pool_replicas(s) == 9)
            .await,
        "{:#}",
        profile_status(&s)
    );
    let by_hand = std::time::SystemTime::now();
    scale_by_hand(&s, 14);
    assert!(
        s.wait_until(T, |s| profile_status(s)["engine"]["desiredReplicas"] == 14)
            .await,
        "the engine starts from the pool's replicas: {:#}",
        profile_status(&s)["engine"]
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(pool_replicas(&s), 14);
    assert_eq!(scale_writes_since(&s, by_hand), []);
    assert_eq!(profile_status(&s)["level"], 2);
    c.stop().await;
}

/// Not degraded, a person's scale-up is scaled back to what demand wants
/// only after `scaleDownStabilizationSeconds` (3 here), counted from when
/// the pool had more than demand wants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_up_by_hand_waits_out_the_stabilization_window() {
    let s = cluster().await;
    apply_inc47(&s, None);
    s.merge_patch_direct(
        LK,
        "capacityprofiles",
        Some(NS),
        "agent-assist",
        json!({"spec": {"replicas": {"scaleDownStabilizationSeconds": 3}}}),
        None,
    )
    .unwrap();
    // 700 units/s for 488.1: level 0, 9 replicas wanted.
    set_ready(&s, 10);
    let c = start(&s, settings(false, "a"));
    assert!(
        s.wait_until(T, |s| profile_status(s)["level"] == 0
            && pool_replicas(s) == 9)
            .await,
        "{:#}",
        profile_status(&s)
    );
    let by_hand = std::time::SystemTime::now();
    scale_by_hand(&s, 14);
    assert!(
        s.wait_until(T, |s| pool_replicas(s) == 9).await,
        "scaled back after the window: {:#}",
        profile_status(&s)["engine"]
    );
    let writes = scale_writes_since(&s, by_hand);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].0, 9);
    // The window is counted in whole seconds from the first evaluation
    // that saw 14: at least 2 s of the 3.
    assert!(writes[0].1 >= Duration::from_secs(2), "{writes:?}");
    c.stop().await;
}

/// An edit of the gateway ConfigMap's `lanes.json` that keeps lanekeeper's
/// hash annotation (a hand edit, a bad merge) is put back: what the gateways
/// load is what lanekeeper decided, whatever the annotation says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_gateway_config_is_put_back() {
    let s = cluster().await;
    apply_inc47(&s, None);
    let c = start(&s, settings(false, "a"));
    let data = |s: &ApiServer| {
        s.get_object("v1", "configmaps", Some(NS), "agent-assist-lanes")
            .map(|cm| cm["data"]["lanes.json"].clone())
    };
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes")
            .is_some_and(|c| c["level"] == 1))
            .await
    );
    // Settled: the next ticks write nothing.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let written = data(&s).unwrap();
    let edited = written
        .as_str()
        .unwrap()
        .replace("\"level\": 1", "\"level\": 0");
    assert_ne!(edited, written.as_str().unwrap());
    // The double records a request once it has answered it, so a put-back
    // is counted by waiting for its PATCH too, not only for the data.
    let patches = |s: &ApiServer| s.requests_matching(Some("PATCH"), "/configmaps/").len();
    for edit in [json!(edited), json!("{}")] {
        let writes = patches(&s);
        s.merge_patch_direct(
            "v1",
            "configmaps",
            Some(NS),
            "agent-assist-lanes",
            json!({"data": {"lanes.json": edit}}),
            None,
        )
        .unwrap();
        assert!(
            s.wait_until(T, |s| data(s).as_ref() == Some(&written))
                .await,
            "not put back after {edit}: {:?}",
            data(&s)
        );
        assert!(s.wait_until(T, |s| patches(s) > writes).await);
    }
    // Put back once: then steady, no ConfigMap write on the next ticks.
    let before = patches(&s);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(patches(&s), before);
    c.stop().await;
}

/// Two CapacityProfiles whose `scaleTargetRef` names the same workload do
/// not fight over its replicas: the oldest (by creation time, then name)
/// sizes it; the other writes no replica count and says why in
/// `ScalingConflict` and an event. Here the second profile is the older
/// one, so it wins although its name sorts after the example's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_profiles_on_one_workload_do_not_fight_over_its_replicas() {
    let s = cluster().await;
    apply_inc47(&s, None);
    let mut older = example_profile_named("agent-assist-b");
    older["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    older["spec"]["replicas"] = json!({"min": 12, "max": 12});
    s.put_direct(older).unwrap();
    let c = start(&s, settings(false, "a"));
    let conflict = scaling_conflict;
    assert!(
        s.wait_until(T, |s| pool_replicas(s) == 12
            && conflict(s, "agent-assist")["status"] == "True"
            && conflict(s, "agent-assist-b")["status"] == "False")
            .await,
        "replicas {}; {:#}; {:#}",
        pool_replicas(&s),
        conflict(&s, "agent-assist"),
        conflict(&s, "agent-assist-b")
    );
    let lost = conflict(&s, "agent-assist");
    assert_eq!(lost["reason"], "ProfileTargetsWorkload");
    assert!(
        lost["message"]
            .as_str()
            .unwrap()
            .contains("CapacityProfile agent-assist-b"),
        "{lost}"
    );
    assert!(
        s.wait_until(T, |s| events(s, "ScalingConflict")
            .iter()
            .any(|e| e["regarding"]["name"] == "agent-assist"))
            .await
    );
    // No back and forth, and the conflict is not written again each tick.
    let status_patches = |s: &ApiServer| {
        s.requests_matching(Some("PATCH"), "capacityprofiles/agent-assist/status")
            .len()
    };
    let before = (scale_patches(&s), status_patches(&s));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!((scale_patches(&s), status_patches(&s)), before);
    assert_eq!(pool_replicas(&s), 12);
    assert_eq!(events(&s, "ScalingConflict").len(), 1);
    c.stop().await;
}

/// A profile's `ScalingConflict` condition (null without one).
fn scaling_conflict(s: &ApiServer, name: &str) -> Value {
    condition_of(s, name, "ScalingConflict")
}

/// When the profile that acts on a shared workload is pointed at another
/// workload, or deleted, the other takes over at once: the change triggers
/// it, from the watch whose store it reads the winner from. Before, it
/// waited for the resync (a minute here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_profile_on_a_workload_takes_over_at_once() {
    let s = cluster().await;
    apply_inc47(&s, None);
    s.put_direct(deployment("vllm-b", 4, 4)).unwrap();
    let mut older = example_profile_named("agent-assist-b");
    older["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    s.put_direct(older).unwrap();
    let c = start(
        &s,
        controller::Settings {
            resync: Duration::from_secs(60),
            ..settings(false, "a")
        },
    );
    let acts = |s: &ApiServer, yes: bool| {
        scaling_conflict(s, "agent-assist")["status"] == if yes { "False" } else { "True" }
    };
    let retarget = |s: &ApiServer, to: &str| {
        let pool =
            json!({"scaleTargetRef": {"name": to}, "podSelector": {"matchLabels": {"app": to}}});
        s.merge_patch_direct(
            LK,
            "capacityprofiles",
            Some(NS),
            "agent-assist-b",
            json!({"spec": {"pool": pool}}),
            None,
        )
        .unwrap();
    };
    let soon = Duration::from_secs(15);
    assert!(s.wait_until(T, |s| acts(s, false)).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    retarget(&s, "vllm-b");
    assert!(
        s.wait_until(soon, |s| acts(s, true)).await,
        "pointed elsewhere: {:#}",
        scaling_conflict(&s, "agent-assist")
    );
    // Back on the workload: the older one acts again.
    retarget(&s, POOL);
    assert!(s.wait_until(soon, |s| acts(s, false)).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.delete_direct(LK, "capacityprofiles", Some(NS), "agent-assist-b")
        .unwrap();
    assert!(
        s.wait_until(soon, |s| acts(s, true)).await,
        "deleted: {:#}",
        scaling_conflict(&s, "agent-assist")
    );
    c.stop().await;
}

/// The controller's exported series of a lane of the example profile.
fn lane_series(c: &Running, lane: &str) -> Vec<String> {
    let label = format!(r#"lane="{lane}""#);
    c.metrics
        .render()
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(&label))
        .map(str::to_owned)
        .collect()
}

/// A deleted LaneContract's series leave the controller's metrics (they
/// were exported with their last value for as long as the controller ran);
/// the other lanes' stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lane_s_metric_series_go_with_it() {
    let s = cluster().await;
    apply_inc47(&s, None);
    let c = start(&s, settings(false, "a"));
    let gone = "p4-eval-backfill";
    let kept = "p0-disruption-assist";
    assert!(
        s.wait_until(T, |_| !lane_series(&c, gone).is_empty()
            && !lane_series(&c, kept).is_empty())
            .await
    );
    s.delete_direct(LK, "lanecontracts", Some(NS), gone)
        .unwrap();
    assert!(
        s.wait_until(T, |_| lane_series(&c, gone).is_empty()).await,
        "{:#?}",
        lane_series(&c, gone)
    );
    assert!(!lane_series(&c, kept).is_empty());
    c.stop().await;
}

/// The names of the lanes in a gateway ConfigMap.
fn config_lanes(s: &ApiServer, name: &str) -> Vec<String> {
    lanes_json(s, name)
        .and_then(|c| {
            c["lanes"].as_array().map(|l| {
                l.iter()
                    .filter_map(|l| l["name"].as_str())
                    .map(str::to_owned)
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// A LaneContract whose `spec.profile` is edited from A to B leaves A at
/// once (A is reconciled too, not only B): A's ConfigMap drops it, and so
/// do A's metric series, long before the resync (a minute here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_moved_to_another_profile_leaves_the_old_one_at_once() {
    let s = cluster().await;
    apply_inc47(&s, None);
    s.put_direct(deployment("vllm-b", 4, 4)).unwrap();
    let mut b = example_profile_named("agent-assist-b");
    b["spec"]["pool"]["scaleTargetRef"]["name"] = json!("vllm-b");
    b["spec"]["pool"]["podSelector"] = json!({"matchLabels": {"app": "vllm-b"}});
    s.put_direct(b).unwrap();
    let c = start(
        &s,
        controller::Settings {
            resync: Duration::from_secs(60),
            ..settings(false, "a")
        },
    );
    let moved = "p4-eval-backfill";
    let in_a = |s: &ApiServer| config_lanes(s, "agent-assist-lanes").contains(&moved.to_owned());
    assert!(
        s.wait_until(T, |s| in_a(s)
            && lanes_json(s, "agent-assist-b-lanes").is_some())
            .await
    );
    // Settled: the first reconciles (and those their own writes trigger)
    // are over.
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.merge_patch_direct(
        LK,
        "lanecontracts",
        Some(NS),
        moved,
        json!({"spec": {"profile": "agent-assist-b"}}),
        None,
    )
    .unwrap();
    let a_series = |c: &Running| {
        lane_series(c, moved)
            .into_iter()
            .filter(|l| l.contains(r#"profile="agent-assist""#))
            .count()
    };
    assert!(
        s.wait_until(Duration::from_secs(15), |s| !in_a(s)
            && config_lanes(s, "agent-assist-b-lanes")
                .contains(&moved.to_owned())
            && a_series(&c) == 0)
            .await,
        "A: {:?}; B: {:?}; A's series of the lane: {}",
        config_lanes(&s, "agent-assist-lanes"),
        config_lanes(&s, "agent-assist-b-lanes"),
        a_series(&c)
    );
    c.stop().await;
}
