//! The controller's behaviours on a real API server (`LANEKEEPER_E2E=1`,
//! see tests/e2e/e2e.rs and docs/development.md): approvals, a Prometheus
//! outage, steady state, restarts, observe mode, an HPA on the pool,
//! unbound and duplicate objects, manual drain requests and unready pods.
//! Each test has a namespace, a Prometheus and a controller process of its
//! own, with the chart ServiceAccount's token. And the data path next to it:
//! `lanekeeper gateway` following the controller's ConfigMap, sharing the
//! rates by the ready endpoints of its Service (`--endpoints-service`), and
//! the chart's gateway with its RBAC.
//!
//! What stays on the API double (tests/it/controller.rs, tests/it/drain.rs):
//! injected 500s, 409s, delays and dropped watches, objects that the real
//! server's validation would never let in, and starting without the CRDs.

use crate::support;
use crate::world;

use std::time::{Duration, Instant};

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use support::cluster::{Cluster, Controller, LK, connect, dynamic, eventually};
use world::*;

const POLICY: &str = "agent-assist-ladder";
const APPROVE: &str = "lanekeeper.dev/approve-level";

/// What each test starts from: the cluster, its shared hold on it, the
/// controller's kubeconfig (the chart ServiceAccount's token) and the INC-47
/// world in a namespace of its own, with `replicas` pool pods asking for no
/// GPU (these tests need none). None when there is no cluster (SKIPPED).
struct Env {
    c: Cluster,
    kc: std::path::PathBuf,
    w: World,
    _shared: tokio::sync::RwLockReadGuard<'static, ()>,
}

async fn env(test: &str, prefix: &str, replicas: i32) -> Option<Env> {
    let c = connect(test).await?;
    let shared = CLUSTER.read().await;
    let kc = controller_kubeconfig(&c).await;
    let w = World::new(&c, prefix, replicas, 0, None).await?;
    Some(Env {
        c,
        kc,
        w,
        _shared: shared,
    })
}

fn start(kc: &std::path::Path, w: &World, identity: &str) -> Controller {
    Controller::start(kc, w.name(), identity, &["--leader-elect=false"])
}

/// One of the world's objects, by kind and name, as applied.
fn object(w: &World, kind: &str, name: &str) -> Value {
    inc47_objects(w.name(), &w.prom.url())
        .into_iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap()
}

async fn get(c: &Cluster, w: &World, kind: &str, name: &str) -> Value {
    let probe = json!({"apiVersion": LK, "kind": kind, "metadata": {"namespace": w.name()}});
    dynamic(&c.client, &probe)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .map(|o| serde_json::to_value(o).unwrap())
        .unwrap_or(Value::Null)
}

/// No call of the controller in the world's namespace was refused by the
/// real server's RBAC (the local control plane's audit log).
fn assert_no_refusals(c: &Cluster, w: &World) {
    if c.local.is_none() {
        return;
    }
    std::thread::sleep(Duration::from_millis(1500)); // the audit batch
    let refused: Vec<String> = c
        .audit("system:serviceaccount:lanekeeper-system:lanekeeper")
        .into_iter()
        .filter(|e| e["objectRef"]["namespace"] == w.name() && e["responseStatus"]["code"] == 403)
        .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
        .collect();
    assert!(
        refused.is_empty(),
        "calls refused by the chart's RBAC: {refused:#?}"
    );
}

fn has_condition(v: &Value, t: &str, status: &str) -> bool {
    v["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == t && c["status"] == status))
}

/// The controller's writes in the world's namespace so far (audit log).
fn writes(c: &Cluster, w: &World) -> Vec<String> {
    c.audit("system:serviceaccount:lanekeeper-system:lanekeeper")
        .into_iter()
        .filter(|e| e["objectRef"]["namespace"] == w.name())
        .filter(|e| !matches!(e["verb"].as_str(), Some("get" | "list" | "watch")))
        .map(|e| {
            format!(
                "{} {}/{} {}",
                e["verb"].as_str().unwrap_or_default(),
                e["objectRef"]["resource"].as_str().unwrap_or_default(),
                e["objectRef"]["subresource"].as_str().unwrap_or_default(),
                e["objectRef"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_confirmed_level_waits_for_the_annotation_which_is_consumed_on_the_way_down() {
    let Some(Env { c, kc, w, _shared }) =
        env("a_confirmed_level_waits_for_the_annotation", "approval", 8).await
    else {
        return;
    };
    // 140 units/s: even after levels 1..3 the demand exceeds capacity, so
    // the ladder wants level 4 (continuity: Manual, it changes what users
    // see), so only the annotation lets the ladder in; a short stable
    // window lets it come down within the test.
    w.set(|t| t.available = 140.0);
    w.until_scraped().await;
    let mut policy = object(&w, "DegradationPolicy", POLICY);
    policy["spec"]["hysteresis"]["stableForSeconds"] = json!(1);
    c.apply(&policy).await.unwrap();
    let mut ctl = start(&kc, &w, "approval");

    let cfg = eventually("level 3 with level 4 pending", T, || async {
        w.lanes_json()
            .await
            .filter(|c| c["level"] == 3 && c["pendingApprovalLevel"] == 4)
    })
    .await;
    assert_eq!(cfg["levelName"], "protect");
    assert_eq!(cfg["flags"]["readOnly"], false);
    assert_eq!(cfg["flags"]["useFallbackRoutes"], true);
    eventually("policy status: level 3, 4 pending", T, || async {
        let p = get(&c, &w, "DegradationPolicy", POLICY).await;
        (p["status"]["pendingApprovalLevel"] == 4 && p["status"]["level"] == 3).then_some(())
    })
    .await;
    let pending = eventually("an ApprovalPending event", T, || async {
        let e = w.events("ApprovalPending").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(pending[0].0["type"], "Warning");
    let note = pending[0].0["note"].as_str().unwrap_or_default().to_owned();
    assert!(
        note.contains("level 4") && note.contains(APPROVE),
        "the event says how to approve: {note}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        w.lanes_json().await.unwrap()["level"],
        3,
        "no approval, no entry"
    );

    // A human approves level 4, the way they would: kubectl annotate.
    c.kubectl_ok(&[
        "-n",
        w.name(),
        "annotate",
        "degradationpolicy",
        POLICY,
        &format!("{APPROVE}=4"),
    ]);
    let cfg = eventually("level 4, read-only", T, || async {
        w.lanes_json().await.filter(|c| {
            c["level"] == 4 && c["flags"]["readOnly"] == true && c["pendingApprovalLevel"].is_null()
        })
    })
    .await;
    assert_eq!(cfg["levelName"], "continuity");
    eventually("an ApprovalGranted event", T, || async {
        (!w.events("ApprovalGranted").await.is_empty()).then_some(())
    })
    .await;

    // Capacity is back: the ladder steps down; once below 4 the approval is
    // consumed (the annotation removed).
    w.set(|t| t.available = 560.0);
    eventually("the annotation consumed", T, || async {
        let p = get(&c, &w, "DegradationPolicy", POLICY).await;
        p["metadata"]["annotations"][APPROVE]
            .is_null()
            .then_some(())
    })
    .await;
    eventually("an ApprovalConsumed event", T, || async {
        (!w.events("ApprovalConsumed").await.is_empty()).then_some(())
    })
    .await;
    eventually("stepped down to level 1", T, || async {
        w.lanes_json().await.filter(|c| c["level"] == 1)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for reason in ["ApprovalPending", "ApprovalGranted", "ApprovalConsumed"] {
        let n: u64 = w.events(reason).await.iter().map(|e| e.1).sum();
        assert_eq!(n, 1, "{reason} published once");
    }
    let p = get(&c, &w, "DegradationPolicy", POLICY).await;
    let transitions: Vec<(u64, u64)> = p["status"]["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["from"].as_u64().unwrap(), t["to"].as_u64().unwrap()))
        .collect();
    assert_eq!(transitions, vec![(0, 3), (3, 4), (4, 3), (3, 2), (2, 1)]);
    assert!(ctl.running(), "{}", ctl.log_text());
    assert_no_refusals(&c, &w);
}

/// A Prometheus outage makes the configured capacity signal Unknown, and
/// with it the capacity: no fallback to ready replicas. `TelemetryKnown`
/// turns False and the level is held.
#[tokio::test(flavor = "multi_thread")]
async fn a_prometheus_outage_turns_telemetry_unknown_and_holds_the_level() {
    let Some(Env {
        c,
        kc,
        mut w,
        _shared,
    }) = env("a_prometheus_outage_turns_telemetry_unknown", "outage", 8).await
    else {
        return;
    };
    let (_, degraded) = inc47_capacities();
    let ctl = start(&kc, &w, "outage");
    eventually("level 1, capacity known", T, || async {
        let st = w.status().await;
        (st["level"] == 1 && condition(&st, "TelemetryKnown").is_some_and(|c| c.0 == "True"))
            .then_some(())
    })
    .await;
    w.set(|t| t.available = degraded);
    eventually("level 2 at 420", T, || async {
        let st = w.status().await;
        (st["level"] == 2 && close(&st["capacityUnitsPerSecond"], degraded)).then_some(())
    })
    .await;

    w.prom.stop();
    let st = eventually(
        "availableUnitsPerSecond unknown: unreachable",
        T,
        || async {
            let st = w.status().await;
            st["unknownSignals"]["availableUnitsPerSecond"]
                .as_str()
                .is_some_and(|r| r.starts_with("unreachable"))
                .then_some(st)
        },
    )
    .await;
    let known = condition(&st, "TelemetryKnown").unwrap();
    assert_eq!(
        (known.0.as_str(), known.1.as_str()),
        ("False", "CapacityUnknown"),
        "{st}"
    );
    assert_eq!(st["level"], 2, "held: {st}");
    let metrics = ctl.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("lanekeeper_signal_errors_total")
                && l.contains("reason=\"unreachable\"")
                && l.contains("signal=\"availableUnitsPerSecond\"")),
        "{metrics}"
    );
    // Still held several resyncs later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(w.status().await["level"], 2);
    assert_no_refusals(&c, &w);
}

/// The controller's reads (GET and LIST; watches excluded) in the world's
/// namespace so far (audit log).
fn reads(c: &Cluster, w: &World) -> Vec<String> {
    c.audit("system:serviceaccount:lanekeeper-system:lanekeeper")
        .into_iter()
        .filter(|e| e["objectRef"]["namespace"] == w.name())
        .filter(|e| matches!(e["verb"].as_str(), Some("get" | "list")))
        .map(|e| {
            format!(
                "{} {}",
                e["verb"].as_str().unwrap_or_default(),
                e["requestURI"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// At steady state a resync tick recomputes from the watch caches: over ten
/// ticks the controller neither writes nor reads (no GET, no LIST; only its
/// watches stay open), as the real server's audit log records.
#[tokio::test(flavor = "multi_thread")]
async fn steady_state_makes_no_api_calls() {
    let Some(Env { c, kc, w, _shared }) = env("steady_state_makes_no_api_calls", "steady", 8).await
    else {
        return;
    };
    if !c.has_local_processes(
        "steady_state_makes_no_api_calls",
        "counts calls in the local control plane's audit log",
    ) {
        return;
    }
    let ctl = start(&kc, &w, "steady");
    eventually("level 1, 9 replicas, 9 Ready pods", T, || async {
        let st = w.status().await;
        (st["level"] == 1 && st["readyReplicas"] == 9 && st["desiredReplicas"] == 9).then_some(())
    })
    .await;
    // Settle, then count the controller's calls over ten resync ticks (1 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    std::thread::sleep(Duration::from_millis(1500)); // the audit batch
    let (writes_before, reads_before) = (writes(&c, &w).len(), reads(&c, &w).len());
    let metric_before = ctl.metric_sum("lanekeeper_api_writes_total").await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    std::thread::sleep(Duration::from_millis(1500));
    let (after_w, after_r) = (writes(&c, &w), reads(&c, &w));
    assert_eq!(
        after_w.len(),
        writes_before,
        "writes at steady state: {:#?}",
        &after_w[writes_before..]
    );
    assert_eq!(
        after_r.len(),
        reads_before,
        "reads at steady state: {:#?}",
        &after_r[reads_before..]
    );
    assert!(
        reads_before > 0,
        "the audit log shows the controller's first lists"
    );
    assert_eq!(
        ctl.metric_sum("lanekeeper_api_writes_total").await,
        metric_before
    );
    assert_no_refusals(&c, &w);
}

/// A change the controller can see triggers the reconcile of the profile it
/// concerns at once, not at the next resync tick (a minute here): a pod
/// turning unready shows in status, and a changed Prometheus answer in the
/// gateway config, well before the tick.
#[tokio::test(flavor = "multi_thread")]
async fn a_changed_signal_is_acted_on_before_the_resync_tick() {
    let Some(Env { c, kc, w, _shared }) = env(
        "a_changed_signal_is_acted_on_before_the_resync_tick",
        "react",
        8,
    )
    .await
    else {
        return;
    };
    let _ctl = Controller::start(
        &kc,
        w.name(),
        "react",
        &["--leader-elect=false", "--resync-seconds", "60"],
    );
    eventually("9 Ready pods and the gateway config", T, || async {
        let st = w.status().await;
        (st["readyReplicas"] == 9 && w.lanes_json().await.is_some()).then_some(())
    })
    .await;
    // Past the first reconciles: from here on only a trigger reconciles
    // within the minute.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let within = Duration::from_secs(20);

    let pod = w.pods().await[0].name_any();
    let started = Instant::now();
    patch_pod(
        &c,
        &w,
        &pod,
        json!({"status": {"conditions": [{"type": "ContainersReady", "status": "False"}]}}),
        true,
    )
    .await;
    eventually("8 Ready pods in status", within, || async {
        (w.status().await["readyReplicas"] == 8).then_some(())
    })
    .await;
    let pod_seen = started.elapsed();

    let before = w.lanes_json().await.unwrap()["capacityUnitsPerSecond"].clone();
    let (_, degraded) = inc47_capacities();
    let started = Instant::now();
    w.set(|t| t.available = degraded);
    eventually("the new capacity in the gateway config", within, || async {
        let cfg = w.lanes_json().await?;
        (cfg["capacityUnitsPerSecond"] != before).then_some(())
    })
    .await;
    let prom_seen = started.elapsed();
    eprintln!(
        "pod readiness seen in {pod_seen:?}, Prometheus change in {prom_seen:?} (resync 60 s)"
    );
    assert_no_refusals(&c, &w);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_controller_continues_mid_incident() {
    let Some(Env { c, kc, w, _shared }) = env(
        "a_restarted_controller_continues_mid_incident",
        "restart",
        8,
    )
    .await
    else {
        return;
    };
    let (normal, degraded) = inc47_capacities();
    w.set(|t| t.available = degraded);
    w.until_scraped().await;
    let mut first = start(&kc, &w, "restart-1");
    eventually("level 2", T, || async {
        w.lanes_json().await.filter(is_inc47_level2)
    })
    .await;
    // The incident ends; the controller dies inside the stable window.
    w.set(|t| t.available = normal);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let exit_since = w.status().await["engine"]["exitSince"].clone();
    assert!(
        exit_since.is_i64(),
        "the stable window started: {}",
        w.status().await
    );
    first.kill();
    let _second = start(&kc, &w, "restart-2");
    // The new process continues the window it finds in status: level 1 no
    // sooner than exitSince + stableForSeconds, and not a full window later.
    let at = eventually("level 1 after the restart", T, || async {
        w.lanes_json().await.filter(|c| c["level"] == 1)?;
        Some(std::time::SystemTime::now())
    })
    .await;
    let t = at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let window_end = exit_since.as_i64().unwrap() + STABLE_FOR;
    assert!(
        t >= window_end,
        "stepped down at {t}, before the window ended at {window_end}"
    );
    assert!(
        t < window_end + STABLE_FOR,
        "stepped down at {t}: the restart started the window again (it ended at {window_end})"
    );
    // No repeated or skipped transition, each event once. (The policy's
    // status is written after the ConfigMap, in the same reconcile.)
    let transitions = || async {
        let p = get(&c, &w, "DegradationPolicy", POLICY).await;
        p["status"]["transitions"]
            .as_array()
            .map(|ts| {
                ts.iter()
                    .map(|t| (t["from"].as_u64().unwrap(), t["to"].as_u64().unwrap()))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    eventually("the policy status records 2 -> 1", T, || async {
        (transitions().await.len() >= 2).then_some(())
    })
    .await;
    assert_eq!(transitions().await, vec![(0, 2), (2, 1)]);
    eventually("one LevelLowered event", T, || async {
        (w.events("LevelLowered").await.len() == 1).then_some(())
    })
    .await;
    assert_eq!(w.events("LevelRaised").await.len(), 1);
    assert_no_refusals(&c, &w);
}

#[tokio::test(flavor = "multi_thread")]
async fn observe_mode_writes_no_scale_and_no_enforced_config() {
    let Some(Env { c, kc, w, _shared }) = env(
        "observe_mode_writes_no_scale_and_no_enforced_config",
        "observe",
        8,
    )
    .await
    else {
        return;
    };
    let (_, degraded) = inc47_capacities();
    w.set(|t| t.available = degraded);
    let mut policy = object(&w, "DegradationPolicy", POLICY);
    policy["spec"]["mode"] = json!("Observe");
    c.apply(&policy).await.unwrap();
    let _ctl = start(&kc, &w, "observe");
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c.client.clone(), w.name());
    eventually("the observe config at level 2", T, || async {
        let o = cm.get_opt("agent-assist-lanes-observe").await.ok()??;
        let v: Value = serde_json::from_str(o.data?.get("lanes.json")?).ok()?;
        (v["level"] == 2 && v["mode"] == "Observe").then_some(())
    })
    .await;
    eventually("status reports level 2", T, || async {
        (w.status().await["level"] == 2).then_some(())
    })
    .await;
    eventually("a LevelRaised event", T, || async {
        (!w.events("LevelRaised").await.is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        cm.get_opt(CONFIG).await.unwrap().is_none(),
        "no enforced config"
    );
    assert_eq!(
        w.deployment().await.spec.unwrap().replicas,
        Some(8),
        "no scale write"
    );
    // Observe mode drains nothing, but the pods' readiness gate still
    // opens: a pool that declares it would otherwise never become Ready
    // while lanekeeper only watches.
    eventually("every pod's gate open (serving)", T, || async {
        let pods = w.pods().await;
        (!pods.is_empty()
            && pods
                .iter()
                .all(|p| pod_condition(p, SERVING).as_deref() == Some("True")))
        .then_some(())
    })
    .await;
    assert_no_refusals(&c, &w);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_hpa_on_the_pool_is_not_fought() {
    let Some(Env { c, kc, w, _shared }) = env("an_hpa_on_the_pool_is_not_fought", "hpa", 8).await
    else {
        return;
    };
    c.apply(&pool_hpa(w.name())).await.unwrap();
    let _ctl = start(&kc, &w, "hpa");
    eventually("ScalingConflict True", T, || async {
        let st = w.status().await;
        condition(&st, "ScalingConflict")
            .is_some_and(|c| c.0 == "True")
            .then_some(())
    })
    .await;
    eventually("a ScalingConflict event", T, || async {
        (!w.events("ScalingConflict").await.is_empty()).then_some(())
    })
    .await;
    assert_eq!(
        w.deployment().await.spec.unwrap().replicas,
        Some(8),
        "replicas left alone"
    );
    // The user's switch: raise the HPA's minimum instead.
    let mut profile = object(&w, "CapacityProfile", PROFILE);
    profile["spec"]["scaling"] = json!({"mode": "HPAMinReplicas"});
    c.apply(&profile).await.unwrap();
    let hpas = Api::<HorizontalPodAutoscaler>::namespaced(c.client.clone(), w.name());
    eventually("the HPA's minReplicas raised to 9", T, || async {
        (hpas.get("vllm").await.ok()?.spec?.min_replicas? == 9).then_some(())
    })
    .await;
    assert_no_refusals(&c, &w);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unbound_lane_and_a_duplicate_policy_are_reported() {
    let Some(Env { c, kc, w, _shared }) = env(
        "an_unbound_lane_and_a_duplicate_policy_are_reported",
        "unbound",
        8,
    )
    .await
    else {
        return;
    };
    let mut stray = object(&w, "LaneContract", "p1-agent-assist");
    stray["metadata"]["name"] = json!("stray");
    stray["spec"]["profile"] = json!("no-such-pool");
    c.apply(&stray).await.unwrap();
    // Created after the first, so younger: the older policy governs.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut dup = object(&w, "DegradationPolicy", POLICY);
    dup["metadata"]["name"] = json!("second-ladder");
    c.apply(&dup).await.unwrap();
    let _ctl = start(&kc, &w, "unbound");
    eventually("the stray lane Bound False", T, || async {
        has_condition(
            &get(&c, &w, "LaneContract", "stray").await,
            "Bound",
            "False",
        )
        .then_some(())
    })
    .await;
    eventually("the second policy Valid False", T, || async {
        has_condition(
            &get(&c, &w, "DegradationPolicy", "second-ladder").await,
            "Valid",
            "False",
        )
        .then_some(())
    })
    .await;
    eventually("the older policy governs: level 1", T, || async {
        w.lanes_json().await.filter(|c| c["level"] == 1)
    })
    .await;
    assert_no_refusals(&c, &w);
}

async fn patch_pod(c: &Cluster, w: &World, pod: &str, patch: Value, status: bool) {
    let api = Api::<Pod>::namespaced(c.client.clone(), w.name());
    let pp = PatchParams::default();
    let r = if status {
        api.patch_status(pod, &pp, &Patch::Strategic(&patch)).await
    } else {
        api.patch(pod, &pp, &Patch::Merge(&patch)).await
    };
    r.unwrap_or_else(|e| panic!("patch {pod}: {e}"));
}

/// A person asks for a drain with the annotation: honoured within the bound,
/// never for a pod whose containers are not ready (a failing readiness probe,
/// played here by setting ContainersReady False as the kubelet would), and
/// undone when the annotation goes.
#[tokio::test(flavor = "multi_thread")]
async fn drain_requests_are_honoured_within_the_bound_and_unready_pods_are_left_alone() {
    let Some(Env { c, kc, w, _shared }) = env(
        "drain_requests_are_honoured_within_the_bound",
        "drainreq",
        8,
    )
    .await
    else {
        return;
    };
    let _ctl = start(&kc, &w, "drainreq");
    eventually("9 Ready pods", T, || async {
        (w.status().await["readyReplicas"] == 9).then_some(())
    })
    .await;
    let pods: Vec<String> = w.pods().await.iter().map(|p| p.name_any()).collect();
    // One pod's containers stop being ready; it is asked to drain too.
    let unready = pods[0].clone();
    patch_pod(
        &c,
        &w,
        &unready,
        json!({"status": {"conditions": [{"type": "ContainersReady", "status": "False"}]}}),
        true,
    )
    .await;
    let ask = json!({"metadata": {"annotations": {"lanekeeper.dev/drain-request": "true"}}});
    for p in &pods[..4] {
        patch_pod(&c, &w, p, ask.clone(), false).await;
    }
    // Four asked, one of them unready: the bound (25 % of 9 → 2) lets two
    // of the ready ones drain, at every sample.
    let start_t = Instant::now();
    let mut most = 0;
    while start_t.elapsed() < Duration::from_secs(20) {
        let now = w.pods().await;
        let n = now.iter().filter(|p| drained(p)).count();
        assert!(n <= 2, "{n} drained, the bound is 2");
        assert!(
            now.iter().all(|p| p.name_any() != unready || !drained(p)),
            "the unready pod was labelled"
        );
        most = most.max(n);
        if most == 2 && start_t.elapsed() > Duration::from_secs(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(most, 2);
    eventually("DrainBudgetExhausted True", T, || async {
        condition(&w.status().await, "DrainBudgetExhausted")
            .is_some_and(|c| c.0 == "True")
            .then_some(())
    })
    .await;
    // The requests are withdrawn: everything is undrained and serves again.
    let clear = json!({"metadata": {"annotations": {"lanekeeper.dev/drain-request": null}}});
    for p in &pods[..4] {
        patch_pod(&c, &w, p, clear.clone(), false).await;
    }
    patch_pod(
        &c,
        &w,
        &unready,
        json!({"status": {"conditions": [{"type": "ContainersReady", "status": "True"}]}}),
        true,
    )
    .await;
    eventually("nothing drained, every pod Ready", T, || async {
        let now = w.pods().await;
        (now.iter().all(|p| !drained(p))
            && now
                .iter()
                .all(|p| pod_condition(p, "Ready").as_deref() == Some("True")))
        .then_some(())
    })
    .await;
    assert_no_refusals(&c, &w);
}

/// Three ready pods, all bad: floor(25 % of 3) is 0, so none is drained and
/// the status and an event say the bound was reached.
#[tokio::test(flavor = "multi_thread")]
async fn three_ready_pods_allow_no_drain() {
    let Some(Env { c, kc, w, _shared }) = env("three_ready_pods_allow_no_drain", "three", 3).await
    else {
        return;
    };
    let mut profile = object(&w, "CapacityProfile", PROFILE);
    profile["spec"]["replicas"]["min"] = json!(3);
    profile["spec"]["replicas"]["max"] = json!(3);
    c.apply(&profile).await.unwrap();
    let _ctl = start(&kc, &w, "three");
    eventually("3 Ready pods", T, || async {
        (w.status().await["readyReplicas"] == 3).then_some(())
    })
    .await;
    let pods: Vec<String> = w.pods().await.iter().map(|p| p.name_any()).collect();
    w.set(|t| {
        for p in &pods {
            t.errors.insert(p.clone(), 0.9);
        }
    });
    eventually("drain budget 0, nothing drained", T, || async {
        let st = w.status().await;
        (st["drainBudget"] == 0
            && st["drainedPods"] == 0
            && condition(&st, "DrainBudgetExhausted").is_some_and(|c| c.0 == "True"))
        .then_some(())
    })
    .await;
    eventually("a DrainBudgetExhausted event", T, || async {
        (!w.events("DrainBudgetExhausted").await.is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(w.drained_pods().await.is_empty(), "floor(25% of 3) is 0");
    assert_no_refusals(&c, &w);
}

/// A drain made by one controller process is read back from the pod's label
/// by the next: it is kept, and only the slot left goes to the worst of the
/// pods that went bad while no controller ran.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_controller_never_goes_past_the_bound() {
    let Some(Env { c, kc, w, _shared }) = env(
        "a_restarted_controller_never_goes_past_the_bound",
        "redrain",
        8,
    )
    .await
    else {
        return;
    };
    // Keep the pool at 8 so the bound is 25 % of 8 = 2 throughout.
    let mut profile = object(&w, "CapacityProfile", PROFILE);
    profile["spec"]["scaling"] = json!({"mode": "Disabled"});
    c.apply(&profile).await.unwrap();
    let mut first = start(&kc, &w, "redrain-1");
    eventually("8 Ready pods", T, || async {
        (w.status().await["readyReplicas"] == 8).then_some(())
    })
    .await;
    let pods: Vec<String> = w.pods().await.iter().map(|p| p.name_any()).collect();
    w.set(|t| {
        t.errors.insert(pods[3].clone(), 0.8);
    });
    eventually("pod 3 drained", T, || async {
        (w.drained_pods().await == vec![pods[3].clone()]).then_some(())
    })
    .await;
    first.kill();
    // While no controller runs, four more pods go bad.
    w.set(|t| {
        for (i, e) in [(0, 0.6), (1, 0.95), (5, 0.5), (6, 0.4)] {
            t.errors.insert(pods[i].clone(), e);
        }
    });
    let _second = start(&kc, &w, "redrain-2");
    let mut want = vec![pods[1].clone(), pods[3].clone()];
    want.sort();
    let start_t = Instant::now();
    while start_t.elapsed() < Duration::from_secs(15) {
        let now = w.drained_pods().await;
        assert!(now.len() <= 2, "{now:?} drained, the bound is 2");
        if now == want && start_t.elapsed() > Duration::from_secs(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        w.drained_pods().await,
        want,
        "the first drain kept, the worst new one added"
    );
    assert_no_refusals(&c, &w);
}

/// Issue 12, rules 9 and 10 on a real control plane. The profile records
/// the hash of the pool Deployment as the test wrote it (the function
/// `calibration-hash` uses); the controller hashes what the API server
/// stored (defaults filled in, quantities respelled) and finds the same.
/// A new image that cannot roll out (its pods fit no node; `maxUnavailable:
/// 0` keeps every old pod) makes `Calibrated` False/`PoolChanged` with an
/// event naming the new hash, holds every new drain (the rollout is in
/// progress) and keeps a drained pod of the old revision drained after its
/// request is withdrawn (the current revision is read from the new
/// ReplicaSet). Rolled back, the old revision is current again: the pod is
/// undrained, the waiting drain request is honoured, `Calibrated` is True.
#[tokio::test(flavor = "multi_thread")]
async fn calibration_follows_the_pool_and_drains_wait_for_its_rollout() {
    use lanekeeper::api::calibration::workload_config_hash;
    let Some(Env { c, kc, w, _shared }) = env(
        "calibration_follows_the_pool_and_drains_wait_for_its_rollout",
        "calib",
        8,
    )
    .await
    else {
        return;
    };
    let written = pool_deployment(w.name(), 8, 0);
    let measured = workload_config_hash(&written).unwrap();
    let mut profile = object(&w, "CapacityProfile", PROFILE);
    profile["spec"]["capacity"]["calibration"]["configHash"] = json!(measured);
    // Measured now (the example's measurement may have expired by the
    // machine's clock).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    profile["spec"]["capacity"]["calibration"]["measuredAt"] =
        json!(lanekeeper::api::common::rfc3339(now));
    c.apply(&profile).await.unwrap();
    let _ctl = start(&kc, &w, "calib");
    eventually(
        "the stored template hashes as written; Calibrated True",
        T,
        || async {
            let st = w.status().await;
            (st["observedConfigHash"] == json!(measured)
                && condition(&st, "Calibrated").is_some_and(|c| c.0 == "True" && c.1 == "Valid")
                && st["readyReplicas"] == 9)
                .then_some(())
        },
    )
    .await;
    let pods: Vec<String> = w.pods().await.iter().map(|p| p.name_any()).collect();
    let (a, b) = (pods[0].clone(), pods[1].clone());
    let ask = json!({"metadata": {"annotations": {"lanekeeper.dev/drain-request": "true"}}});
    let clear = json!({"metadata": {"annotations": {"lanekeeper.dev/drain-request": null}}});
    patch_pod(&c, &w, &a, ask.clone(), false).await;
    eventually("the first pod drained", T, || async {
        (w.drained_pods().await == vec![a.clone()]).then_some(())
    })
    .await;

    // A new image and a node selector no node matches: a rollout that
    // stays in progress.
    let mut changed = written.clone();
    let tpl = &mut changed["spec"]["template"]["spec"];
    tpl["containers"][0]["image"] = json!("registry.k8s.io/pause:3.9");
    tpl["nodeSelector"]["lanekeeper.test/nowhere"] = json!("true");
    let new_hash = workload_config_hash(&changed).unwrap();
    assert_ne!(new_hash, measured);
    let deployments =
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(c.client.clone(), w.name());
    let roll = json!({"spec": {
        "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {"spec": {
            "nodeSelector": {"lanekeeper.test/nowhere": "true"},
            "containers": [{"name": "vllm", "image": "registry.k8s.io/pause:3.9"}]
        }}
    }});
    deployments
        .patch(POOL, &PatchParams::default(), &Patch::Strategic(&roll))
        .await
        .unwrap();
    eventually(
        "Calibrated False/PoolChanged with the new hash",
        T,
        || async {
            let st = w.status().await;
            (st["observedConfigHash"] == json!(new_hash)
                && condition(&st, "Calibrated")
                    .is_some_and(|c| c.0 == "False" && c.1 == "PoolChanged"))
            .then_some(())
        },
    )
    .await;
    eventually(
        "a CalibrationStale event naming the new hash",
        T,
        || async {
            w.events("CalibrationStale")
                .await
                .iter()
                .any(|(e, _)| e["note"].as_str().unwrap_or_default().contains(&new_hash))
                .then_some(())
        },
    )
    .await;
    eventually("the new ReplicaSet's pod exists (Pending)", T, || async {
        (w.pods().await.len() == 10).then_some(())
    })
    .await;
    // During the rollout: the old-revision pod stays drained with its
    // request withdrawn, and a new request waits.
    patch_pod(&c, &w, &a, clear.clone(), false).await;
    patch_pod(&c, &w, &b, ask.clone(), false).await;
    let held = Instant::now();
    while held.elapsed() < Duration::from_secs(8) {
        assert_eq!(
            w.drained_pods().await,
            vec![a.clone()],
            "during the rollout: {a} kept, {b} not drained"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Rolled back: the old template, so the old ReplicaSet is current
    // again and the rollout ends.
    let back = json!({"spec": {"template": {"spec": {
        "nodeSelector": {"lanekeeper.test/nowhere": null},
        "containers": [{"name": "vllm", "image": "registry.k8s.io/pause:3.10"}]
    }}}});
    deployments
        .patch(POOL, &PatchParams::default(), &Patch::Strategic(&back))
        .await
        .unwrap();
    eventually("undrained, and the waiting request honoured", T, || async {
        (w.drained_pods().await == vec![b.clone()]).then_some(())
    })
    .await;
    eventually("Calibrated True again, with its event", T, || async {
        let st = w.status().await;
        (st["observedConfigHash"] == json!(measured)
            && condition(&st, "Calibrated").is_some_and(|c| c.0 == "True")
            && !w.events("CalibrationValid").await.is_empty())
        .then_some(())
    })
    .await;
    assert_no_refusals(&c, &w);
}

/// A `lanekeeper gateway --configmap` process (killed when dropped), in
/// front of a `lanekeeper-fake-model`, its log in target/e2e.
pub(crate) struct GatewayProc {
    children: Vec<std::process::Child>,
    pub(crate) addr: String,
    metrics: String,
    log: std::path::PathBuf,
}

impl Drop for GatewayProc {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn first_line_addrs(child: &mut std::process::Child) -> Vec<String> {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.split_whitespace()
        .filter(|w| w.contains(':'))
        .map(str::to_owned)
        .collect()
}

fn gateway_for(kc: &std::path::Path, w: &World) -> GatewayProc {
    gateway(kc, &format!("{}/{CONFIG}", w.name()), &[], "gateway")
}

/// `lanekeeper gateway --configmap NS/NAME` with `kc`'s identity and
/// `extra` flags, every route of the INC-47 lanes to one fake model.
pub(crate) fn gateway(
    kc: &std::path::Path,
    configmap: &str,
    extra: &[&str],
    name: &str,
) -> GatewayProc {
    use std::process::{Command, Stdio};
    let mut model = Command::new(env!("CARGO_BIN_EXE_lanekeeper-fake-model"))
        .args(["--listen", "127.0.0.1:0", "--service-millis", "0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let model_addr = first_line_addrs(&mut model).remove(0);
    let mut args = vec![
        "gateway".to_owned(),
        "--listen=127.0.0.1:0".to_owned(),
        "--metrics-addr=127.0.0.1:0".to_owned(),
        format!("--configmap={configmap}"),
    ];
    for r in ["agent-large", "extract-small", "batch-medium", "eval-large"] {
        args.push(format!("--route={r}=http://{model_addr}"));
    }
    // The lane from the header, unless the test sets up identities.
    let identities = ["--token-audience", "--credentials", "--api-key-header"];
    if !extra
        .iter()
        .any(|a| identities.iter().any(|f| a.starts_with(f)))
    {
        args.push("--trust-lane-header".to_owned());
    }
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let log = support::cluster::scratch().join(format!("{}.log", support::cluster::unique(name)));
    let mut gw = Command::new(env!("CARGO_BIN_EXE_lanekeeper"))
        .args(&args)
        .env("KUBECONFIG", kc)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let addrs = first_line_addrs(&mut gw);
    GatewayProc {
        addr: addrs[0].clone(),
        metrics: addrs[1].clone(),
        children: vec![model, gw],
        log,
    }
}

impl GatewayProc {
    /// Its /metrics page (empty when it does not answer).
    async fn metrics_text(&self) -> String {
        match reqwest::get(format!("http://{}/metrics", self.metrics)).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// The value of an unlabelled gauge on its /metrics page.
    async fn gauge(&self, family: &str) -> Option<f64> {
        let text = self.metrics_text().await;
        text.lines()
            .find_map(|l| l.strip_prefix(family)?.strip_prefix(' ')?.parse().ok())
    }

    /// The status and body of its /readyz.
    async fn readyz(&self) -> Option<(u16, String)> {
        let r = reqwest::get(format!("http://{}/readyz", self.metrics))
            .await
            .ok()?;
        let status = r.status().as_u16();
        Some((status, r.text().await.unwrap_or_default()))
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The contentHash a gateway has in force (its config_info metric).
async fn gateway_hash(g: &GatewayProc) -> Option<String> {
    let text = reqwest::get(format!("http://{}/metrics", g.metrics))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let line = text
        .lines()
        .find(|l| l.starts_with("lanekeeper_gateway_config_info{") && l.ends_with(" 1"))?;
    let at = line.find("hash=\"")? + 6;
    Some(line[at..].split('"').next()?.to_owned())
}

/// The data path follows the controller: a gateway watching the profile's
/// ConfigMap (with the chart ServiceAccount's token, as the controller runs)
/// enforces each new config moments after the controller writes it. INC-47
/// loses capacity, the controller steps to level 2 and pauses P4, and the
/// gateway refuses P4 from then on.
#[tokio::test(flavor = "multi_thread")]
async fn the_gateway_enforces_the_controllers_configmap_moments_after_the_write() {
    let Some(Env { c, kc, w, _shared }) = env(
        "the_gateway_enforces_the_controllers_configmap_moments_after_the_write",
        "gwcm",
        8,
    )
    .await
    else {
        return;
    };
    let _ctl = start(&kc, &w, "gwcm");
    let first = eventually("the first gateway config", T, || async {
        w.lanes_json().await
    })
    .await;
    let g = gateway_for(&kc, &w);
    let want = first["contentHash"].as_str().unwrap().to_owned();
    eventually("the gateway loads the first config", T, || async {
        (gateway_hash(&g).await.as_deref() == Some(want.as_str())).then_some(())
    })
    .await;
    let http = reqwest::Client::new();
    let p4 = || {
        http.post(format!("http://{}/v1/chat/completions", g.addr))
            .header("x-lanekeeper-lane", "p4-eval-backfill")
            .body(r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#)
            .send()
    };
    assert_eq!(p4().await.unwrap().status(), 200, "P4 admitted at level 1");

    // Capacity drops: the controller writes level 2; time its write (as the
    // API server shows it) to the gateway's config in force.
    let (_, degraded) = inc47_capacities();
    w.set(|t| t.available = degraded);
    let (level2, at_write) = eventually("the controller writes level 2", T, || async {
        let cfg = w.lanes_json().await?;
        is_inc47_level2(&cfg).then(|| (cfg, Instant::now()))
    })
    .await;
    let written = level2["contentHash"].as_str().unwrap().to_owned();
    // The issue's bound: admission follows the write within 2 s (the watch
    // delivers it in milliseconds; polled every 200 ms here).
    eventually(
        "the gateway to load level 2 within 2 s of the write",
        Duration::from_secs(2),
        || async { (gateway_hash(&g).await.as_deref() == Some(written.as_str())).then_some(()) },
    )
    .await;
    let lag = at_write.elapsed();
    eprintln!("the gateway enforced the controller's write {lag:?} after the API server showed it");
    let r = p4().await.unwrap();
    assert_eq!(r.status(), 429, "P4 paused at level 2");
    // The policy's stable window (shortened in the test world).
    let retry_after = lane(&level2, "p4-eval-backfill")["retryAfterSeconds"].to_string();
    assert_eq!(r.headers()["retry-after"].to_str().unwrap(), retry_after);
    assert_no_refusals(&c, &w);
}

// ---- the gateway's replica share, and the chart's gateway -----------------

/// The gateway's own Service in the share test.
const GATEWAY_SVC: &str = "lanekeeper-gateway";
const P2: &str = "p2-email-extract";
/// P2's rate and burst in the share tests (shares of 1, 2 and 4 replicas
/// are whole requests).
const P2_RPS: f64 = 60.0;

/// The INC-47 config at 420 units/s as shipped, with P2 at 60 req/s and a
/// burst of 60, no queue and no floor, and the capacity unknown (so there is
/// no spare capacity to draw on): what P2 admits is its own bucket.
fn share_config() -> String {
    let path = support::cluster::repo().join("examples/inc-47/lanes-420.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["telemetry"] = json!("Unknown");
    v["capacityUnitsPerSecond"] = Value::Null;
    let p2 = v["lanes"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|l| l["name"] == P2)
        .unwrap();
    p2["admittedRequestsPerSecond"] = json!(P2_RPS);
    p2["burst"] = json!(P2_RPS as u64);
    p2["queue"]["maxDepth"] = json!(0);
    p2["floorUnitsPerSecond"] = Value::Null;
    let mut cfg: lanes::GatewayConfig = serde_json::from_value(v).unwrap();
    cfg.content_hash = lanes::hash(&cfg);
    lanes::to_json(&cfg)
}

pub(crate) fn lanes_configmap(ns: &str, json: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CONFIG, "namespace": ns},
        "data": {"lanes.json": json}
    })
}

/// An EndpointSlice of the gateway's Service, one endpoint per entry of
/// `ready` (its Ready condition), as the EndpointSlice controller writes
/// them. The Service has no selector, so that controller leaves the slices
/// to the test.
fn endpoint_slice(ns: &str, name: &str, first_ip: usize, ready: &[bool]) -> Value {
    let endpoints: Vec<Value> = ready
        .iter()
        .enumerate()
        .map(|(i, r)| {
            json!({
                "addresses": [format!("10.244.0.{}", first_ip + i)],
                "conditions": {"ready": r, "serving": r, "terminating": false}
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns, "labels": {
            "kubernetes.io/service-name": GATEWAY_SVC,
            "endpointslice.kubernetes.io/managed-by": "e2e.lanekeeper.dev"
        }},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints
    })
}

pub(crate) fn rolebinding(ns: &str, name: &str, service_accounts: &[&str]) -> Value {
    let subjects: Vec<Value> = service_accounts
        .iter()
        .map(|sa| json!({"kind": "ServiceAccount", "name": sa, "namespace": ns}))
        .collect();
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": subjects
    })
}

/// Waits until the gateway shares the rates with `n` replicas
/// (`lanekeeper_gateway_replicas`) and is ready.
async fn until_replicas(g: &GatewayProc, n: u32, what: &str) {
    eventually(what, T, || async {
        let replicas = g.gauge("lanekeeper_gateway_replicas").await;
        let ready = g.readyz().await.is_some_and(|(s, _)| s == 200);
        (replicas == Some(f64::from(n)) && ready).then_some(())
    })
    .await;
}

/// Sends `n` P2 requests one after another: (admitted, seconds the loop
/// took). Every other answer is P2's queue (of none) being full.
async fn p2_requests(http: &reqwest::Client, g: &GatewayProc, n: usize) -> (usize, f64) {
    let started = Instant::now();
    let mut ok = 0;
    for _ in 0..n {
        let r = http
            .post(format!("http://{}/v1/chat/completions", g.addr))
            .header("x-lanekeeper-lane", P2)
            .body(r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#)
            .send()
            .await
            .unwrap();
        match r.status().as_u16() {
            200 => ok += 1,
            429 => {
                let body: Value = r.json().await.unwrap();
                assert_eq!(body["error"]["code"], "rejected_queue_full", "{body}");
            }
            s => panic!("P2: status {s}"),
        }
    }
    (ok, started.elapsed().as_secs_f64())
}

/// P2 admits a 1/`replicas` share of its 60 req/s: its whole bucket (a
/// second of its rate, refilled while the test waited 1.5 s), plus at most
/// what refilled while the requests ran, measured, not assumed.
async fn assert_p2_share(http: &reqwest::Client, g: &GatewayProc, replicas: u32) {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rate = P2_RPS / f64::from(replicas);
    let bucket = rate.ceil() as usize;
    let sent = 2 * P2_RPS as usize;
    let (ok, secs) = p2_requests(http, g, sent).await;
    let refilled = (rate * secs).ceil() as usize;
    eprintln!("{replicas} replicas: P2 admitted {ok} of {sent} in {secs:.3} s");
    assert!(
        ok >= bucket && ok <= bucket + refilled,
        "{replicas} replicas: P2 admitted {ok} of {sent} in {secs:.3} s; \
         its share is a bucket of {bucket} and {rate} req/s ({refilled} in that time)"
    );
}

/// `lanekeeper gateway --configmap NS/NAME --endpoints-service NS/SVC` on a
/// real API server, with a ServiceAccount's token holding the chart's two
/// gateway Roles (its one ConfigMap; EndpointSlices). N of the 1/N share is
/// the number of ready endpoints in the Service's EndpointSlices
/// (`kubernetes.io/service-name: SVC`), across slices, not-ready ones left
/// out, followed as the slices change, and P2's admitted rate follows it:
/// 60 req/s in the config, 30 per replica at N=2, 15 at N=4.
///
/// When the slices cannot be read (a second gateway whose ServiceAccount
/// lacks the EndpointSlices Role) the gateway does not guess N: it logs the
/// failure, keeps N=1 and is not ready (`/readyz` 503), so a Service sends
/// it nothing; once it may read them it counts them and is ready. With no
/// ready endpoint at all (the slices deleted) N is 1: a replica counts
/// itself, never 0, and a Service only routes to ready endpoints, so a
/// replica that serves its traffic is one of them.
#[tokio::test(flavor = "multi_thread")]
async fn the_gateway_shares_the_rates_by_the_ready_endpoints_of_its_service() {
    let Some(c) =
        connect("the_gateway_shares_the_rates_by_the_ready_endpoints_of_its_service").await
    else {
        return;
    };
    let _shared = CLUSTER.read().await;
    let guard = c.namespace("gweps").await;
    let ns = guard.name.as_str();
    let objects = [
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "gateway", "namespace": ns}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "gateway-blind", "namespace": ns}}),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "gateway-config", "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CONFIG], "verbs": ["get", "list", "watch"]}]
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "gateway-endpoints", "namespace": ns},
            "rules": [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]
        }),
        rolebinding(ns, "gateway-config", &["gateway", "gateway-blind"]),
        rolebinding(ns, "gateway-endpoints", &["gateway"]),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": GATEWAY_SVC, "namespace": ns},
            "spec": {"ports": [{"name": "http", "port": 8080}]}
        }),
        lanes_configmap(ns, &share_config()),
        // Before the gateway starts: two ready endpoints and one not ready.
        endpoint_slice(ns, "gateway-a", 1, &[true, true, false]),
    ];
    for o in &objects {
        c.apply(o)
            .await
            .unwrap_or_else(|e| panic!("apply {}: {e}", o["metadata"]["name"]));
    }
    let kc = c.service_account_kubeconfig(ns, "gateway").await;
    let blind_kc = c.service_account_kubeconfig(ns, "gateway-blind").await;
    let configmap = format!("{ns}/{CONFIG}");
    let eps = format!("--endpoints-service={ns}/{GATEWAY_SVC}");
    let g = gateway(&kc, &configmap, &[&eps], "gweps");
    let blind = gateway(&blind_kc, &configmap, &[&eps], "gweps-blind");
    let http = reqwest::Client::new();

    // Slices that exist when the gateway starts count at once.
    until_replicas(&g, 2, "N=2 from the slice there at start-up").await;
    assert_p2_share(&http, &g, 2).await;

    // Unreadable slices: the config is loaded, the failure logged, N stays
    // 1 and the gateway is not ready.
    eventually(
        "the blind gateway loads its config and fails to read the slices",
        T,
        || async {
            let loaded = gateway_hash(&blind).await.is_some();
            let logged = blind
                .log_text()
                .contains("watching the gateway's EndpointSlices failed");
            (loaded && logged).then_some(())
        },
    )
    .await;
    let (status, body) = blind.readyz().await.expect("/readyz answers");
    assert_eq!(status, 503, "not ready without the slices: {body}");
    assert!(body.contains("EndpointSlices"), "{body}");
    assert_eq!(blind.gauge("lanekeeper_gateway_replicas").await, Some(1.0));

    // The third endpoint turns ready and a second slice brings a fourth.
    for o in [
        endpoint_slice(ns, "gateway-a", 1, &[true, true, true]),
        endpoint_slice(ns, "gateway-b", 10, &[true]),
    ] {
        c.apply(&o).await.unwrap();
    }
    until_replicas(&g, 4, "N=4 across two slices").await;
    assert_p2_share(&http, &g, 4).await;

    // Allowed to read the slices, the blind gateway counts them and is ready.
    c.apply(&rolebinding(
        ns,
        "gateway-endpoints",
        &["gateway", "gateway-blind"],
    ))
    .await
    .unwrap();
    until_replicas(&blind, 4, "the blind gateway, once allowed, at N=4").await;

    // No slices at all: N=1, and still ready.
    c.kubectl_ok(&[
        "-n",
        ns,
        "delete",
        "endpointslice",
        "gateway-a",
        "gateway-b",
    ]);
    until_replicas(&g, 1, "N=1 without any ready endpoint").await;
    until_replicas(&blind, 1, "N=1 without any ready endpoint").await;
    assert_p2_share(&http, &g, 1).await;
}

/// The chart with `gateway.enabled=true` on a real control plane, the
/// profile in a namespace of its own: the gateway's Deployment (the
/// `--configmap` and `--endpoints-service` flags, its ServiceAccount, the
/// `/readyz` probe), its Service (whose EndpointSlices the real
/// EndpointSlice controller writes for the placed pods), the
/// PodDisruptionBudget, the ServiceAccount and its Roles. The authorizer
/// lets the ServiceAccount get, list and watch its one ConfigMap in the
/// profile's namespace and list and watch EndpointSlices in its own; for
/// who may use a lane, create TokenReviews and list and watch Secrets in
/// the profile's namespace only (no `get`, no other namespace); and
/// nothing else asked here; the real binary with that ServiceAccount's token
/// loads the config, counts the Service's ready endpoints and has no call
/// refused.
#[tokio::test(flavor = "multi_thread")]
async fn the_charts_gateway_gets_its_configmap_and_endpointslices_and_nothing_more() {
    let Some(c) =
        connect("the_charts_gateway_gets_its_configmap_and_endpointslices_and_nothing_more").await
    else {
        return;
    };
    let _shared = CLUSTER.read().await;
    c.operator_release(); // the CRDs
    let rel_guard = c.namespace("gwchart").await;
    let prof_guard = c.namespace("gwchart-profile").await;
    let (rel_ns, prof_ns) = (rel_guard.name.as_str(), prof_guard.name.as_str());
    let cfg = share_config();
    c.apply(&lanes_configmap(prof_ns, &cfg)).await.unwrap();
    let rel = support::cluster::unique("gw");
    let gw = format!("{rel}-lanekeeper-gateway");
    let chart = support::cluster::repo().join("charts/lanekeeper");
    let mut install: Vec<String> = [
        "install",
        rel.as_str(),
        chart.to_str().unwrap(),
        "-n",
        rel_ns,
        "--set",
        "replicaCount=0",
        "--set",
        "podDisruptionBudget.enabled=false",
        "--set",
        "gateway.enabled=true",
        "--set",
        format!("gateway.profile={PROFILE}").as_str(),
        "--set",
        format!("gateway.profileNamespace={prof_ns}").as_str(),
        "--set",
        format!("gateway.routes.agent-large=http://vllm-agent-assist.{prof_ns}:8000").as_str(),
        "--wait",
        "--timeout",
        "120s",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    // On kind the pods really run (e2e/run.sh loads an image and names it).
    if let Ok(image) = std::env::var("LANEKEEPER_E2E_IMAGE") {
        let (repo_, tag) = image.rsplit_once(':').unwrap_or((&image, "latest"));
        for v in [
            format!("image.repository={repo_}"),
            format!("image.tag={tag}"),
            "image.pullPolicy=Never".to_owned(),
        ] {
            install.extend(["--set".to_owned(), v]);
        }
    }
    c.helm_ok(&install.iter().map(String::as_str).collect::<Vec<_>>());
    c.kubectl_ok(&[
        "-n",
        rel_ns,
        "rollout",
        "status",
        &format!("deployment/{gw}"),
        "--timeout=90s",
    ]);
    let get = |kind: &str, ns: &str, name: &str| -> Value {
        serde_json::from_str(&c.kubectl_ok(&["-n", ns, "get", kind, name, "-o", "json"])).unwrap()
    };

    // Who may use a lane, on the real authorizer: TokenReview create, and
    // list/watch of Secrets in the profile's namespace only, nothing more.
    let sa = format!("system:serviceaccount:{rel_ns}:{gw}");
    let can = |verb: &str, what: &str, ns: Option<&str>| -> bool {
        let mut args = vec!["auth", "can-i", verb, what, "--as", sa.as_str()];
        if let Some(n) = ns {
            args.extend(["-n", n]);
        }
        c.kubectl(&args).stdout.trim() == "yes"
    };
    assert!(can("create", "tokenreviews.authentication.k8s.io", None));
    assert!(can("list", "secrets", Some(prof_ns)) && can("watch", "secrets", Some(prof_ns)));
    for (verb, what, ns) in [
        ("get", "secrets", Some(prof_ns)),
        ("list", "secrets", Some(rel_ns)),
        ("list", "secrets", Some("default")),
        ("create", "secrets", Some(prof_ns)),
        ("create", "serviceaccounts/token", Some(prof_ns)),
        ("create", "subjectaccessreviews.authorization.k8s.io", None),
    ] {
        assert!(
            !can(verb, what, ns),
            "the chart's gateway may {verb} {what} in {ns:?}"
        );
    }

    let deploy = get("deployment", rel_ns, &gw);
    assert_eq!(deploy["spec"]["replicas"], 2);
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], json!(gw));
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let configmap = format!("{prof_ns}/{CONFIG}");
    let eps = format!("{rel_ns}/{gw}");
    for want in [
        "gateway".to_owned(),
        format!("--configmap={configmap}"),
        format!("--endpoints-service={eps}"),
        format!("--route=agent-large=http://vllm-agent-assist.{prof_ns}:8000"),
    ] {
        assert!(args.contains(&want.as_str()), "{want} in {args:?}");
    }
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    let selector = &deploy["spec"]["selector"]["matchLabels"];

    let svc = get("service", rel_ns, &gw);
    assert_eq!(&svc["spec"]["selector"], selector);
    let ports: Vec<(String, i64)> = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["port"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [("http".to_owned(), 8080), ("metrics".to_owned(), 9090)]
    );
    let pdb = get("poddisruptionbudget", rel_ns, &gw);
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], selector);
    get("serviceaccount", rel_ns, &gw);
    let role = get("role", prof_ns, &gw);
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CONFIG], "verbs": ["get", "list", "watch"]}])
    );
    let subjects = json!([{"kind": "ServiceAccount", "name": gw, "namespace": rel_ns}]);
    assert_eq!(get("rolebinding", prof_ns, &gw)["subjects"], subjects);
    let endpoints_role = format!("{gw}-endpoints");
    assert_eq!(
        get("role", rel_ns, &endpoints_role)["rules"],
        json!([{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}])
    );
    assert_eq!(
        get("rolebinding", rel_ns, &endpoints_role)["subjects"],
        subjects
    );

    // What the authorizer says for the gateway's ServiceAccount.
    let user = format!("system:serviceaccount:{rel_ns}:{gw}");
    let can = |verb: &str, resource: &str, ns: &str| -> bool {
        let o = c.kubectl(&[
            "auth",
            "can-i",
            verb,
            resource,
            "-n",
            ns,
            &format!("--as={user}"),
        ]);
        o.stdout.trim() == "yes"
    };
    let own = format!("configmaps/{CONFIG}");
    for verb in ["get", "list", "watch"] {
        assert!(can(verb, &own, prof_ns), "{verb} {own} in {prof_ns}");
    }
    for verb in ["list", "watch"] {
        assert!(
            can(verb, "endpointslices.discovery.k8s.io", rel_ns),
            "{verb} endpointslices"
        );
    }
    for (verb, resource, ns) in [
        ("get", "configmaps/another", prof_ns),
        ("list", "configmaps", prof_ns),
        ("watch", "configmaps", prof_ns),
        ("update", own.as_str(), prof_ns),
        ("delete", own.as_str(), prof_ns),
        ("get", own.as_str(), rel_ns),
        ("list", "configmaps", rel_ns),
        ("list", "endpointslices.discovery.k8s.io", prof_ns),
        ("create", "endpointslices.discovery.k8s.io", rel_ns),
        ("get", "secrets", rel_ns),
        ("list", "pods", rel_ns),
    ] {
        assert!(
            !can(verb, resource, ns),
            "{user} may {verb} {resource} in {ns}"
        );
    }

    // The Service's EndpointSlices: the real EndpointSlice controller's,
    // one ready endpoint per placed, ready gateway pod.
    let ready_endpoints = || -> usize {
        let o = c.kubectl_ok(&[
            "-n",
            rel_ns,
            "get",
            "endpointslices",
            "-l",
            &format!("kubernetes.io/service-name={gw}"),
            "-o",
            "json",
        ]);
        let v: Value = serde_json::from_str(&o).unwrap();
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
            .filter(|e| e["conditions"]["ready"] != json!(false))
            .count()
    };
    eventually(
        "2 ready endpoints in the gateway Service's slices",
        T,
        || {
            let n = ready_endpoints();
            async move { (n == 2).then_some(()) }
        },
    )
    .await;

    // The real binary with the chart ServiceAccount's token and the chart's
    // flags: it loads the config, counts the two replicas, and nothing it
    // asks is refused.
    let kc = c.service_account_kubeconfig(rel_ns, &gw).await;
    let g = gateway(
        &kc,
        &configmap,
        &[&format!("--endpoints-service={eps}")],
        "gwchart",
    );
    until_replicas(
        &g,
        2,
        "the chart's ServiceAccount: N=2 from the Service's slices",
    )
    .await;
    let want: lanes::GatewayConfig = serde_json::from_str(&cfg).unwrap();
    assert_eq!(gateway_hash(&g).await, Some(want.content_hash));
    assert!(
        !g.log_text().contains("failed"),
        "the gateway's log: {}",
        g.log_text()
    );
    if c.local.is_some() {
        std::thread::sleep(Duration::from_millis(1500)); // the audit batch
        let refused: Vec<String> = c
            .audit(&user)
            .into_iter()
            .filter(|e| e["responseStatus"]["code"] == 403)
            .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
            .collect();
        assert!(refused.is_empty(), "calls refused: {refused:#?}");
    }
    drop(g);
    c.helm_ok(&[
        "uninstall",
        &rel,
        "-n",
        rel_ns,
        "--wait",
        "--timeout",
        "120s",
    ]);
}
