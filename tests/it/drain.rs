//! The bounded readiness drain through the API double with the real
//! controller, for what needs the double: random churn of pods, readiness
//! and errors with controller restarts and injected API faults.
//! The drain on a real server (bound, worst first, the serving gate and pod
//! readiness, undrain, manual requests, unready pods) is in tests/e2e/e2e.rs
//! and tests/e2e/e2e_controller.rs. Per-pod error ratios come from a test signal source
//! plugged into the controller's signals trait (the Prometheus and scrape
//! sources fill the same field in production).

use crate::support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use lanekeeper::controller::Settings;
use lanekeeper::signals::{SignalSource, SourceInput, SourceOutput};
use lanekeeper::snapshot::PodSignals;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use support::apiserver::{ApiServer, Fault};
use support::operator::*;

const APP: &str = "vllm-agent-assist";

/// Per-pod error ratios set by the test.
#[derive(Clone, Default)]
struct PodErrors(Arc<Mutex<BTreeMap<String, f64>>>);

impl PodErrors {
    fn set(&self, pod: &str, e: f64) {
        self.0.lock().unwrap().insert(pod.into(), e);
    }
}

impl SignalSource for PodErrors {
    fn collect<'a>(&'a self, input: &'a SourceInput<'a>) -> BoxFuture<'a, SourceOutput> {
        let errs = self.0.lock().unwrap().clone();
        Box::pin(async move {
            let mut out = SourceOutput::default();
            for p in input.pods.unwrap_or_default() {
                if let Some(e) = errs.get(&p.name) {
                    out.profile.pods.insert(
                        p.name.clone(),
                        PodSignals {
                            ready: None,
                            error_ratio: Some(*e),
                            drain_requested: None,
                            revision: None,
                        },
                    );
                }
            }
            out
        })
    }
}

fn pod_name(i: usize) -> String {
    format!("{APP}-{i}")
}

fn pod(i: usize, ready: bool, gate: bool) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name(i), "namespace": NS, "labels": {"app": APP}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
        "status": {
            "phase": "Running",
            "podIP": format!("10.0.0.{}", i + 10),
            "conditions": [{"type": "ContainersReady", "status": if ready { "True" } else { "False" }}]
        }
    });
    if gate {
        p["spec"]["readinessGates"] = json!([{"conditionType": "lanekeeper.dev/serving"}]);
    }
    p
}

/// The INC-47 objects, a Deployment reporting `ready` ready replicas, `n`
/// pods, and a drain spec tweak.
fn setup(s: &ApiServer, n: usize, healthy_for: i64, observe: bool, gate: bool) {
    s.install_lanekeeper_crds();
    s.put_direct(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": APP, "namespace": NS},
        "spec": {"replicas": n, "selector": {"matchLabels": {"app": APP}},
                 "template": {"metadata": {"labels": {"app": APP}}, "spec": {"containers": [{"name": "vllm", "image": "vllm"}]}}},
        "status": {"replicas": n, "readyReplicas": n}
    }))
    .unwrap();
    for mut o in inc47_objects() {
        if o["kind"] == "CapacityProfile" {
            o["spec"]["drain"]["healthyForSeconds"] = json!(healthy_for);
            // Keep the pool size out of the way: it equals the pods here.
            o["spec"]["replicas"] = json!({"min": n, "max": n});
        }
        if observe && o["kind"] == "DegradationPolicy" {
            o["spec"]["mode"] = json!("Observe");
        }
        s.put_direct(o).unwrap();
    }
    for i in 0..n {
        s.put_direct(pod(i, true, gate)).unwrap();
    }
}

fn start(s: &ApiServer, errors: &PodErrors) -> Running {
    let source: Arc<dyn SignalSource> = Arc::new(errors.clone());
    let settings = Settings {
        resync: Duration::from_millis(300),
        ..settings(false, "a")
    };
    start_with(s, settings, vec![source])
}

fn drained(s: &ApiServer) -> Vec<String> {
    let mut v: Vec<String> = s
        .list_objects("v1", "pods", Some(NS))
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["lanekeeper.dev/drain"] == "true")
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    v.sort();
    v
}

fn set_pod_ready(s: &ApiServer, i: usize, ready: bool) {
    s.merge_patch_direct(
        "v1",
        "pods",
        Some(NS),
        &pod_name(i),
        json!({"status": {"conditions": [{"type": "ContainersReady", "status": if ready { "True" } else { "False" }}]}}),
        Some("status"),
    )
    .unwrap();
}

/// Every state the double held in which a pod gained the drain label must
/// respect the bound: drained ≤ min(floor(25% × ready), ready − 2), and at
/// least minServing (2) ready pods not drained. Readiness counts the pods'
/// own ContainersReady. Returns the number of such states checked.
fn check_history(s: &ApiServer) -> usize {
    let mut pods: BTreeMap<String, Value> = BTreeMap::new();
    let mut checked = 0;
    for w in s.write_log() {
        if w.plural != "pods" {
            continue;
        }
        let before = pods.get(&w.name).cloned();
        if w.event == "DELETED" {
            pods.remove(&w.name);
            continue;
        }
        pods.insert(w.name.clone(), w.object.clone());
        let is_drained = |p: &Value| p["metadata"]["labels"]["lanekeeper.dev/drain"] == "true";
        let gained = is_drained(&w.object) && !before.as_ref().is_some_and(is_drained);
        if !gained {
            continue;
        }
        let ready_of = |p: &Value| {
            p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "ContainersReady" && c["status"] == "True")
            })
        };
        let live: Vec<&Value> = pods
            .values()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .collect();
        let ready = live.iter().filter(|p| ready_of(p)).count() as i64;
        let n_drained = live.iter().filter(|p| is_drained(p)).count() as i64;
        let bound = (ready * 25 / 100).min(ready - 2).max(0);
        assert!(
            n_drained <= bound,
            "rv {}: {n_drained} drained with {ready} ready pods exceeds the bound {bound}",
            w.resource_version
        );
        assert!(
            ready_of(&w.object),
            "rv {}: labelled a pod that was not ready",
            w.resource_version
        );
        assert!(
            ready - n_drained >= 2,
            "rv {}: fewer than minServing pods serving",
            w.resource_version
        );
        checked += 1;
    }
    checked
}

/// Random sequences of pods appearing, disappearing, flipping readiness and
/// changing error ratio, with controller restarts and injected API faults:
/// every state in which lanekeeper labelled a pod respects the bound and
/// minServing, and at the end (after things settle) drained ≤ bound holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_churn_with_restarts_and_faults_never_breaks_the_bound() {
    for seed in [7u64, 42, 1234] {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let s = ApiServer::start().await;
        setup(&s, 8, 1, false, rng.random_bool(0.5));
        let errors = PodErrors::default();
        let mut next_pod = 8;
        let mut live: Vec<usize> = (0..8).collect();
        for &i in &live {
            errors.set(&pod_name(i), if rng.random_bool(0.4) { 0.5 } else { 0.01 });
        }
        let mut c = Some(start(&s, &errors));
        for step in 0..30 {
            match rng.random_range(0..10) {
                0 if live.len() > 3 => {
                    let k = live.remove(rng.random_range(0..live.len()));
                    let _ = s.delete_direct("v1", "pods", Some(NS), &pod_name(k));
                }
                1 => {
                    let i = next_pod;
                    next_pod += 1;
                    s.put_direct(pod(i, rng.random_bool(0.7), false)).unwrap();
                    errors.set(&pod_name(i), if rng.random_bool(0.5) { 0.6 } else { 0.02 });
                    live.push(i);
                }
                2 | 3 => {
                    let k = live[rng.random_range(0..live.len())];
                    set_pod_ready(&s, k, rng.random_bool(0.6));
                }
                4..=6 => {
                    let k = live[rng.random_range(0..live.len())];
                    errors.set(
                        &pod_name(k),
                        if rng.random_bool(0.5) {
                            rng.random_range(0.21..1.0)
                        } else {
                            0.01
                        },
                    );
                }
                7 => {
                    s.inject(Fault::status(500).method("PATCH").path("/pods/").times(2));
                    s.inject(Fault::conflict().method("PATCH").path("/pods/").times(1));
                }
                8 if step % 3 == 0 => {
                    if let Some(r) = c.take() {
                        r.stop().await;
                    }
                    c = Some(start(&s, &errors));
                }
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(50..400))).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        if let Some(r) = c.take() {
            r.stop().await;
        }
        let checked = check_history(&s);
        assert!(
            checked > 0,
            "seed {seed}: the run drained nothing, so it proved nothing"
        );
        // Settled: the final state is within the bound too.
        let pods = s.list_objects("v1", "pods", Some(NS));
        let ready = pods
            .iter()
            .filter(|p| {
                p["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "ContainersReady" && c["status"] == "True")
                })
            })
            .count() as i64;
        let n = drained(&s).len() as i64;
        assert!(
            n <= (ready * 25 / 100).min(ready - 2).max(0),
            "seed {seed}: final {n} drained with {ready} ready"
        );
        eprintln!("seed {seed}: {checked} drain writes checked against the bound");
    }
}

/// The example profile's condition of a type.
fn profile_condition(s: &ApiServer, type_: &str) -> Value {
    profile_status(s)["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or(Value::Null)
}

/// A drain write the API server refuses part way through a step (the
/// second pod's) loses nothing done before it: the first pod's
/// `PodDrained` event and its count in `lanekeeper_drains_total`; the
/// refusal is named in `Ready`, and the status is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_refused_part_way_keeps_what_was_drained_before_it() {
    let s = ApiServer::start().await;
    setup(&s, 8, 1, false, false);
    let errors = PodErrors::default();
    for i in 0..8 {
        let e = match i {
            0 => 0.9,
            1 => 0.8,
            _ => 0.01,
        };
        errors.set(&pod_name(i), e);
    }
    s.inject(
        Fault::status(403)
            .method("PATCH")
            .path(&format!("/pods/{}", pod_name(1)))
            .times(1_000_000),
    );
    let c = start(&s, &errors);
    let refused = format!("drain pod {}", pod_name(1));
    assert!(
        s.wait_until(T, |s| drained(s) == [pod_name(0)]
            && profile_condition(s, "Ready")["message"]
                .as_str()
                .is_some_and(|m| m.contains(&refused)))
            .await,
        "drained {:?}; status {:#}",
        drained(&s),
        profile_status(&s)
    );
    assert!(
        s.wait_until(T, |s| !events(s, "PodDrained").is_empty())
            .await
    );
    let noted = events(&s, "PodDrained");
    assert_eq!(noted.len(), 1, "{noted:#?}");
    assert!(
        noted[0]["note"]
            .as_str()
            .unwrap()
            .starts_with(&format!("pod {} taken out of rotation", pod_name(0))),
        "{noted:#?}"
    );
    let counted = c
        .metrics
        .drains
        .with_label_values(&[NS, "agent-assist", "ErrorRatio"])
        .get();
    assert_eq!(counted, 1);
    assert!(
        s.wait_until(T, |s| profile_status(s)["drainedPods"] == 1)
            .await
    );
    c.stop().await;
}

/// The `lanekeeper.dev/serving` condition of pod `i`, if set.
fn serving(s: &ApiServer, i: usize) -> Value {
    let p = s.get_object("v1", "pods", Some(NS), &pod_name(i)).unwrap();
    p["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "lanekeeper.dev/serving"))
        .map_or(Value::Null, |c| c["status"].clone())
}

/// Removing `spec.drain` releases the drained pods (labels, annotations and
/// the serving condition), with a `PodUndrained` event each; and pods with
/// lanekeeper's readiness gate still get their serving condition without
/// it, so a new pod is not held out of rotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_drain_spec_releases_drained_pods_and_gates_still_open() {
    let s = ApiServer::start().await;
    setup(&s, 8, 1, false, true);
    let errors = PodErrors::default();
    for i in 0..8 {
        errors.set(&pod_name(i), if i == 0 { 0.9 } else { 0.01 });
    }
    let c = start(&s, &errors);
    assert!(
        s.wait_until(T, |s| drained(s) == [pod_name(0)]
            && serving(s, 0) == "False")
            .await,
        "{:?}",
        drained(&s)
    );
    s.merge_patch_direct(
        LK,
        "capacityprofiles",
        Some(NS),
        "agent-assist",
        json!({"spec": {"drain": null}}),
        None,
    )
    .unwrap();
    assert!(
        s.wait_until(T, |s| drained(s).is_empty() && serving(s, 0) == "True")
            .await,
        "drained {:?}, serving {}",
        drained(&s),
        serving(&s, 0)
    );
    let pod0 = s.get_object("v1", "pods", Some(NS), &pod_name(0)).unwrap();
    let annotations = &pod0["metadata"]["annotations"];
    assert!(
        annotations.get("lanekeeper.dev/drained-at").is_none(),
        "{annotations}"
    );
    assert!(
        s.wait_until(T, |s| events(s, "PodUndrained").iter().any(|e| e["note"]
            .as_str()
            .is_some_and(|n| n.contains("DrainDisabled"))))
            .await
    );
    // A new pod with the gate opens without a drain section.
    s.put_direct(pod(20, true, true)).unwrap();
    assert!(
        s.wait_until(T, |s| serving(s, 20) == "True").await,
        "{}",
        serving(&s, 20)
    );
    c.stop().await;
}

/// A profile that an older one outranks on the same workload drains none
/// of its pods (the older one acts on them; here it has no drain section,
/// so nothing is drained at all) and says why in `ScalingConflict`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_outranked_on_its_workload_drains_no_pod() {
    let s = ApiServer::start().await;
    setup(&s, 8, 1, false, false);
    let mut older = example_profile_named("agent-assist-b");
    older["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    older["spec"]["replicas"] = json!({"min": 8, "max": 8});
    older["spec"]["drain"] = Value::Null;
    s.put_direct(older).unwrap();
    let errors = PodErrors::default();
    for i in 0..8 {
        errors.set(&pod_name(i), if i == 0 { 0.9 } else { 0.01 });
    }
    let c = start(&s, &errors);
    assert!(
        s.wait_until(T, |s| profile_condition(s, "ScalingConflict")["reason"]
            == "ProfileTargetsWorkload")
            .await,
        "{:#}",
        profile_status(&s)
    );
    // Several passes (resync 300 ms) with pod 0 a drain candidate.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(drained(&s).is_empty(), "{:?}", drained(&s));
    assert!(events(&s, "PodDrained").is_empty());
    c.stop().await;
}

/// In observe mode no pod is drained, but pods with lanekeeper's readiness
/// gate get their serving condition, so they become ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_observe_mode_the_readiness_gates_still_open() {
    let s = ApiServer::start().await;
    setup(&s, 8, 1, true, true);
    let errors = PodErrors::default();
    for i in 0..8 {
        errors.set(&pod_name(i), if i == 0 { 0.9 } else { 0.01 });
    }
    let c = start(&s, &errors);
    assert!(
        s.wait_until(T, |s| (0..8).all(|i| serving(s, i) == "True"))
            .await,
        "{:?}",
        (0..8).map(|i| serving(&s, i)).collect::<Vec<_>>()
    );
    assert!(drained(&s).is_empty(), "{:?}", drained(&s));
    c.stop().await;
}
