//! The real controller against the in-process API double.

mod support;

use std::time::Duration;

use lanekeeper::controller::{self, Metrics, Readiness};
use prometheus::core::Collector;
use serde_json::{Value, json};
use support::apiserver::{ApiServer, Fault};
use support::operator::*;

fn lane<'a>(cfg: &'a Value, name: &str) -> Option<&'a Value> {
    cfg["lanes"].as_array()?.iter().find(|l| l["name"] == name)
}

fn close(v: &Value, want: f64) -> bool {
    v.as_f64().is_some_and(|x| (x - want).abs() < 1e-6)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_to_start_without_crds() {
    let s = ApiServer::start().await;
    let err = controller::run(
        s.client(),
        settings(false, "a"),
        Metrics::new(),
        Readiness::default(),
        Vec::new(),
        async {},
    )
    .await
    .unwrap_err();
    assert!(matches!(err, controller::Error::CrdsMissing(_)), "{err}");
    assert!(err.to_string().contains("kubectl apply -f crds/"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inc47_end_to_end() {
    let s = cluster().await;
    apply_inc47(&s, None);
    let c = start(&s, settings(false, "a"));

    // Normal peak on 8 ready replicas × 70 = 560: level 1, everything admitted,
    // the pool scaled to 9.
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes")
            .is_some_and(|c| c["level"] == 1))
            .await,
        "config at level 1"
    );
    let cfg = lanes_json(&s, "agent-assist-lanes").unwrap();
    assert_eq!(cfg["schemaVersion"], 1);
    assert_eq!(cfg["levelName"], "conserve");
    assert!(close(&cfg["capacityUnitsPerSecond"], 560.0));
    assert_eq!(cfg["flags"]["rejectOptionalContext"], true);
    assert_eq!(cfg["inFlight"]["stopAt"], 1500);
    for (name, units) in [
        ("p0-disruption-assist", 93.6),
        ("p1-agent-assist", 180.0),
        ("p2-email-extract", 66.5),
        ("p3-shift-batch", 99.0),
        ("p4-eval-backfill", 49.0),
    ] {
        let l = lane(&cfg, name).unwrap();
        assert_eq!(l["state"], "Admitted", "{name}");
        assert!(close(&l["admittedUnitsPerSecond"], units), "{name}: {l}");
    }
    let p1 = lane(&cfg, "p1-agent-assist").unwrap();
    assert_eq!(
        p1["optionalContext"]["historyTurns"], 8,
        "degraded history at conserve"
    );
    let cm = s
        .get_object("v1", "configmaps", Some(NS), "agent-assist-lanes")
        .unwrap();
    assert_eq!(
        cm["metadata"]["annotations"]["lanekeeper.dev/config-hash"],
        cfg["contentHash"]
    );
    assert_eq!(
        cm["metadata"]["ownerReferences"][0]["kind"],
        "CapacityProfile"
    );
    assert!(
        s.wait_until(T, |s| s
            .get_object("apps/v1", "deployments", Some(NS), "vllm-agent-assist")
            .is_some_and(|d| d["spec"]["replicas"] == 9))
            .await,
        "scaled to 9"
    );
    assert!(
        s.wait_until(T, |s| {
            let st = profile_status(s);
            st["level"] == 1
                && st["desiredReplicas"] == 9
                && close(&st["capacityUnitsPerSecond"], 560.0)
                && close(&st["admittedUnitsPerSecond"], 488.1)
        })
        .await,
        "profile status: {}",
        profile_status(&s)
    );
    let scaled = s.requests_matching(Some("PATCH"), "/scale");
    assert!(
        scaled
            .iter()
            .all(|r| r.field_manager.as_deref() == Some("lanekeeper")),
        "server-side apply as lanekeeper"
    );
    assert!(
        s.wait_until(T, |s| s
            .get_object(LK, "lanecontracts", Some(NS), "p3-shift-batch")
            .is_some_and(|l| l["status"]["state"] == "Admitted"))
            .await
    );

    // Capacity drops to 6 × 70 = 420: level 2, P4 paused, P3 capped, with an event.
    set_ready(&s, 6);
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes")
            .is_some_and(|c| c["level"] == 2))
            .await,
        "level 2"
    );
    let cfg = lanes_json(&s, "agent-assist-lanes").unwrap();
    assert!(close(&cfg["capacityUnitsPerSecond"], 420.0));
    let p4 = lane(&cfg, "p4-eval-backfill").unwrap();
    assert_eq!(p4["state"], "Paused");
    assert!(close(&p4["admittedUnitsPerSecond"], 0.0));
    assert_eq!(p4["burst"], 0);
    assert_eq!(p4["retryAfterSeconds"], 300);
    let p3 = lane(&cfg, "p3-shift-batch").unwrap();
    assert_eq!(p3["state"], "Capped");
    assert!(close(&p3["admittedUnitsPerSecond"], 60.0));
    let total: f64 = cfg["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["admittedUnitsPerSecond"].as_f64().unwrap())
        .sum();
    assert!((total - 400.1).abs() < 1e-6, "{total}");
    assert!(
        s.wait_until(T, |s| events(s, "LevelRaised")
            .iter()
            .any(|e| e["note"].as_str().unwrap_or_default().contains("1 -> 2")))
            .await,
        "LevelRaised event for 1 -> 2: {:?}",
        events(&s, "LevelRaised")
    );
    let ev = events(&s, "LevelRaised");
    assert!(ev.iter().all(|e| e["type"] == "Warning"));
    assert!(
        s.wait_until(T, |s| s
            .get_object(LK, "degradationpolicies", Some(NS), "agent-assist-ladder")
            .is_some_and(
                |p| p["status"]["level"] == 2 && p["status"]["levelName"] == "shed"
            ))
        .await
    );

    // A lane changes: the config follows.
    s.merge_patch_direct(
        LK,
        "lanecontracts",
        Some(NS),
        "p1-agent-assist",
        json!({"spec": {"expectedRequestsPerSecond": "150"}}),
        None,
    )
    .unwrap();
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes")
            .and_then(|c| lane(&c, "p1-agent-assist").cloned())
            .is_some_and(|l| close(&l["admittedUnitsPerSecond"], 150.0)))
            .await,
        "p1 follows its contract"
    );

    // A lane is deleted: it leaves the config.
    s.delete_direct(LK, "lanecontracts", Some(NS), "p4-eval-backfill")
        .unwrap();
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes")
            .is_some_and(|c| lane(&c, "p4-eval-backfill").is_none()))
            .await,
        "p4 left the config"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_state_makes_no_writes() {
    let s = cluster().await;
    apply_inc47(&s, None);
    let c = start(&s, settings(false, "a"));
    assert!(
        s.wait_until(T, |s| profile_status(s)["level"] == 1
            && s.get_object(
                "apps/v1",
                "deployments",
                Some(NS),
                "vllm-agent-assist"
            )
            .is_some_and(|d| d["spec"]["replicas"] == 9))
            .await
    );
    // Let it settle, then count writes over many resync ticks (500 ms each).
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.clear_requests();
    let before = c.writes();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let writes: Vec<_> = s
        .requests()
        .into_iter()
        .filter(|r| r.is_write())
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(writes.is_empty(), "writes at steady state: {writes:#?}");
    assert_eq!(c.writes(), before);
    // It did evaluate: reads happened on every tick.
    let reads = s
        .requests()
        .iter()
        .filter(|r| !r.is_write() && r.path.ends_with("/scale"))
        .count();
    assert!(
        reads >= 5,
        "expected periodic evaluations, saw {reads} scale reads"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_mode_writes_no_scale_and_no_enforced_config() {
    let s = cluster().await;
    s.put_direct(deployment("vllm-agent-assist", 8, 6)).unwrap();
    for mut o in inc47_objects() {
        if o["kind"] == "DegradationPolicy" {
            o["spec"]["mode"] = json!("Observe");
        }
        s.put_direct(o).unwrap();
    }
    let c = start(&s, settings(false, "a"));
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes-observe")
            .is_some_and(|c| c["level"] == 2 && c["mode"] == "Observe"))
            .await
    );
    assert!(
        s.wait_until(T, |s| profile_status(s)["level"] == 2).await,
        "status reports the level"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        s.get_object("v1", "configmaps", Some(NS), "agent-assist-lanes")
            .is_none(),
        "no enforced config"
    );
    assert!(
        s.requests_matching(Some("PATCH"), "/scale").is_empty(),
        "no scale writes"
    );
    assert_eq!(
        s.get_object("apps/v1", "deployments", Some(NS), "vllm-agent-assist")
            .unwrap()["spec"]["replicas"],
        8
    );
    assert!(
        !events(&s, "LevelRaised").is_empty(),
        "events still reported"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hpa_on_the_target_is_not_fought() {
    let s = cluster().await;
    apply_inc47(&s, None);
    s.put_direct(json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "vllm", "namespace": NS},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-agent-assist"}, "minReplicas": 2, "maxReplicas": 12}
    }))
    .unwrap();
    let c = start(&s, settings(false, "a"));
    assert!(
        s.wait_until(T, |s| profile_status(s)["conditions"]
            .as_array()
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "ScalingConflict" && c["status"] == "True")
            }))
        .await
    );
    assert!(
        s.wait_until(T, |s| !events(s, "ScalingConflict").is_empty())
            .await
    );
    assert!(s.requests_matching(Some("PATCH"), "/scale").is_empty());
    // The user's switch: raise the HPA's minimum instead.
    s.merge_patch_direct(
        LK,
        "capacityprofiles",
        Some(NS),
        "agent-assist",
        json!({"spec": {"scaling": {"mode": "HPAMinReplicas"}}}),
        None,
    )
    .unwrap();
    assert!(
        s.wait_until(T, |s| s
            .get_object(
                "autoscaling/v2",
                "horizontalpodautoscalers",
                Some(NS),
                "vllm"
            )
            .is_some_and(|h| h["spec"]["minReplicas"] == 9))
            .await
    );
    assert!(s.requests_matching(Some("PATCH"), "/scale").is_empty());
    c.stop().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbound_lane_and_duplicate_policy_are_reported() {
    let s = cluster().await;
    apply_inc47(&s, None);
    s.put_direct(json!({
        "apiVersion": LK, "kind": "LaneContract",
        "metadata": {"name": "stray", "namespace": NS},
        "spec": {"profile": "no-such-pool", "priority": 1, "workUnitsPerRequest": "1", "expectedRequestsPerSecond": "1",
                 "deadlineSeconds": 10, "queue": {"maxDepth": 1, "ttlSeconds": 1}, "retry": {"maxAttempts": 1}, "routes": {"primary": ["x"]}}
    }))
    .unwrap();
    let mut dup = inc47_objects()
        .into_iter()
        .find(|o| o["kind"] == "DegradationPolicy")
        .unwrap();
    dup["metadata"]["name"] = json!("second-ladder");
    dup["metadata"]["creationTimestamp"] = json!("2030-01-01T00:00:00Z");
    s.put_direct(dup).unwrap();
    let c = start(&s, settings(false, "a"));
    assert!(
        s.wait_until(T, |s| s
            .get_object(LK, "lanecontracts", Some(NS), "stray")
            .is_some_and(|l| l["status"]["conditions"].as_array().is_some_and(
                |cs| cs
                    .iter()
                    .any(|c| c["type"] == "Bound" && c["status"] == "False")
            )))
        .await
    );
    assert!(
        s.wait_until(T, |s| s
            .get_object(LK, "degradationpolicies", Some(NS), "second-ladder")
            .is_some_and(|p| p["status"]["conditions"].as_array().is_some_and(
                |cs| cs
                    .iter()
                    .any(|c| c["type"] == "Valid" && c["status"] == "False")
            )))
        .await
    );
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes")
            .is_some_and(|c| c["level"] == 1))
            .await,
        "the older policy governs"
    );
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
    s.inject(Fault::status(503).method("GET").path("/scale").times(2));
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
async fn restart_mid_incident_continues_the_hysteresis() {
    let s = cluster().await;
    apply_inc47(&s, Some(4));
    set_ready(&s, 6);
    let a = start(&s, settings(false, "a"));
    assert!(s.wait_until(T, |s| profile_status(s)["level"] == 2).await);
    // Recovery begins: capacity back to 560; the exit window of level 2 starts.
    set_ready(&s, 8);
    assert!(
        s.wait_until(T, |s| s
            .get_object(LK, "degradationpolicies", Some(NS), "agent-assist-ladder")
            .is_some_and(|p| p["status"]["exitHoldingSince"].is_string()))
            .await
    );
    let policy = s
        .get_object(LK, "degradationpolicies", Some(NS), "agent-assist-ladder")
        .unwrap();
    let exit_since: k8s_openapi::jiff::Timestamp = policy["status"]["exitHoldingSince"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.stop().await;
    assert_eq!(
        profile_status(&s)["level"],
        2,
        "still level 2 when the first controller stops"
    );

    // A new controller continues from status: it steps down to 1 once the
    // window that began under the first controller has lasted 4 s, not 4 s
    // after its own start.
    let started = k8s_openapi::jiff::Timestamp::now();
    let b = start(&s, settings(false, "b"));
    assert!(s.wait_until(T, |s| profile_status(s)["level"] == 1).await);
    let stepped = k8s_openapi::jiff::Timestamp::now();
    assert!(
        stepped.as_second() >= exit_since.as_second() + 4,
        "not before the window"
    );
    assert!(
        stepped.as_second() - started.as_second() <= 4,
        "the window continued from status instead of restarting"
    );
    assert!(
        s.wait_until(T, |s| s
            .get_object(LK, "degradationpolicies", Some(NS), "agent-assist-ladder")
            .is_some_and(|p| p["status"]["level"] == 1))
            .await
    );
    let policy = s
        .get_object(LK, "degradationpolicies", Some(NS), "agent-assist-ladder")
        .unwrap();
    let t: Vec<(u64, u64)> = policy["status"]["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["from"].as_u64().unwrap(), t["to"].as_u64().unwrap()))
        .collect();
    assert_eq!(t, vec![(0, 2), (2, 1)], "no repeated or skipped transition");
    assert!(
        s.wait_until(T, |s| events(s, "LevelLowered").len() == 1)
            .await
    );
    assert_eq!(events(&s, "LevelRaised").len(), 1);
    b.stop().await;
    assert_eq!(events(&s, "LevelLowered").len(), 1, "no repeated event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_writes_and_a_standby_takes_over() {
    let s = cluster().await;
    apply_inc47(&s, None);
    let a = start(&s, settings(true, "a"));
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes").is_some())
            .await
    );
    let b = start(&s, settings(true, "b"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(a.leader() && !b.leader(), "a leads, b waits");
    assert!(a.writes() > 0);
    assert_eq!(b.writes(), 0, "the standby never writes");
    let lease = s
        .get_object(
            "coordination.k8s.io/v1",
            "leases",
            Some("lanekeeper-system"),
            "lanekeeper",
        )
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "a");

    // The leader dies without a graceful release: its task is aborted.
    a.task.abort();
    drop(a.stop);
    let died = std::time::Instant::now();
    s.merge_patch_direct(
        LK,
        "lanecontracts",
        Some(NS),
        "p1-agent-assist",
        json!({"spec": {"expectedRequestsPerSecond": "150"}}),
        None,
    )
    .unwrap();
    assert!(
        s.wait_until(Duration::from_secs(15), |s| lanes_json(
            s,
            "agent-assist-lanes"
        )
        .and_then(|c| lane(&c, "p1-agent-assist").cloned())
        .is_some_and(|l| close(&l["admittedUnitsPerSecond"], 150.0)))
            .await,
        "the standby took over and acted"
    );
    assert!(b.leader());
    assert!(b.writes() > 0);
    assert!(
        died.elapsed() < Duration::from_secs(3 + 5),
        "took over within about one lease duration"
    );
    b.stop().await;
    let lease = s
        .get_object(
            "coordination.k8s.io/v1",
            "leases",
            Some("lanekeeper-system"),
            "lanekeeper",
        )
        .unwrap();
    assert!(
        lease["spec"]["holderIdentity"].is_null() || lease["spec"]["holderIdentity"] != "b",
        "released on shutdown: {lease}"
    );
}
