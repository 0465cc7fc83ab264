//! The bounded readiness drain on real pods, through the API double with the
//! real controller. Per-pod error ratios come from a test signal source
//! plugged into the controller's signals trait (the Prometheus and scrape
//! sources fill the same field in production).

mod support;

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
    fn name(&self) -> &'static str {
        "test-pod-errors"
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_ready_five_bad_drains_exactly_the_two_worst() {
    let s = ApiServer::start().await;
    setup(&s, 8, 120, false, false);
    let errors = PodErrors::default();
    for (i, e) in [
        (0, 0.01),
        (1, 0.5),
        (2, 0.9),
        (3, 0.3),
        (4, 0.7),
        (5, 0.25),
        (6, 0.01),
        (7, 0.01),
    ] {
        errors.set(&pod_name(i), e);
    }
    let c = start(&s, &errors);
    assert!(
        s.wait_until(T, |s| drained(s).len() == 2).await,
        "drained: {:?}",
        drained(&s)
    );
    // Several more evaluations: still exactly the two worst.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(drained(&s), vec![pod_name(2), pod_name(4)]);
    let p2 = s.get_object("v1", "pods", Some(NS), &pod_name(2)).unwrap();
    assert!(p2["metadata"]["annotations"]["lanekeeper.dev/drained-at"].is_string());
    assert!(
        p2["metadata"]["annotations"]["lanekeeper.dev/drain-reason"]
            .as_str()
            .unwrap()
            .starts_with("ErrorRatio")
    );
    assert!(
        s.wait_until(T, |s| profile_status(s)["drainedPods"] == 2
            && profile_status(s)["drainBudget"] == 2)
            .await,
        "{}",
        profile_status(&s)
    );
    assert!(
        s.wait_until(T, |s| !events(s, "DrainBudgetExhausted").is_empty())
            .await
    );
    let cond = profile_status(&s)["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "DrainBudgetExhausted")
        .cloned()
        .unwrap();
    assert_eq!(cond["status"], "True");
    for p in [1, 3, 5] {
        assert!(
            cond["message"].as_str().unwrap().contains(&pod_name(p)),
            "{cond}"
        );
    }
    assert_eq!(events(&s, "PodDrained").len(), 2);
    assert!(check_history(&s) == 2);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_ready_pods_allow_no_drain() {
    let s = ApiServer::start().await;
    setup(&s, 3, 120, false, false);
    let errors = PodErrors::default();
    for i in 0..3 {
        errors.set(&pod_name(i), 0.9);
    }
    let c = start(&s, &errors);
    assert!(
        s.wait_until(T, |s| profile_status(s)["drainBudget"] == 0
            && profile_status(s)["drainedPods"] == 0)
            .await,
        "{}",
        profile_status(&s)
    );
    assert!(
        s.wait_until(T, |s| !events(s, "DrainBudgetExhausted").is_empty())
            .await
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(drained(&s).is_empty(), "floor(25% of 3) is 0");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_never_goes_past_the_bound() {
    let s = ApiServer::start().await;
    setup(&s, 8, 120, false, false);
    let errors = PodErrors::default();
    for i in 0..8 {
        errors.set(&pod_name(i), 0.01);
    }
    errors.set(&pod_name(3), 0.8);
    let a = start(&s, &errors);
    assert!(s.wait_until(T, |s| drained(s) == vec![pod_name(3)]).await);
    a.stop().await;
    // While no controller runs, four more pods go bad.
    for (i, e) in [(0, 0.6), (1, 0.95), (5, 0.5), (6, 0.4)] {
        errors.set(&pod_name(i), e);
    }
    let b = start(&s, &errors);
    assert!(s.wait_until(T, |s| drained(s).len() == 2).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The first drain is kept (it is read back from the label); one more slot
    // goes to the worst of the new ones.
    assert_eq!(drained(&s), vec![pod_name(1), pod_name(3)]);
    assert_eq!(check_history(&s), 2);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undrained_after_the_healthy_window() {
    let s = ApiServer::start().await;
    setup(&s, 8, 2, false, false);
    let errors = PodErrors::default();
    for i in 0..8 {
        errors.set(&pod_name(i), 0.01);
    }
    errors.set(&pod_name(4), 0.6);
    let c = start(&s, &errors);
    assert!(s.wait_until(T, |s| drained(s) == vec![pod_name(4)]).await);
    errors.set(&pod_name(4), 0.01);
    let healthy_at = std::time::Instant::now();
    assert!(s.wait_until(T, |s| drained(s).is_empty()).await);
    assert!(
        healthy_at.elapsed() >= Duration::from_secs(1),
        "not before the healthy window"
    );
    let p = s.get_object("v1", "pods", Some(NS), &pod_name(4)).unwrap();
    assert!(
        p["metadata"]["annotations"]["lanekeeper.dev/drained-at"].is_null(),
        "annotations removed"
    );
    assert!(
        s.wait_until(T, |s| !events(s, "PodUndrained").is_empty())
            .await
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_drain_request_is_honoured_within_the_bound() {
    let s = ApiServer::start().await;
    setup(&s, 8, 1, false, false);
    let errors = PodErrors::default();
    for i in 0..8 {
        errors.set(&pod_name(i), 0.01);
    }
    errors.set(&pod_name(0), 0.9);
    errors.set(&pod_name(1), 0.8);
    let c = start(&s, &errors);
    assert!(s.wait_until(T, |s| drained(s).len() == 2).await);
    // The bound is full: a request waits.
    s.merge_patch_direct(
        "v1",
        "pods",
        Some(NS),
        &pod_name(6),
        json!({"metadata": {"annotations": {"lanekeeper.dev/drain-request": "true"}}}),
        None,
    )
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(drained(&s), vec![pod_name(0), pod_name(1)]);
    // A slot frees: pod 1 recovers and is undrained after its healthy window.
    errors.set(&pod_name(1), 0.01);
    assert!(
        s.wait_until(T, |s| drained(s) == vec![pod_name(0), pod_name(6)])
            .await,
        "{:?}",
        drained(&s)
    );
    let p6 = s.get_object("v1", "pods", Some(NS), &pod_name(6)).unwrap();
    assert!(
        p6["metadata"]["annotations"]["lanekeeper.dev/drain-reason"]
            .as_str()
            .unwrap()
            .starts_with("DrainRequested")
    );
    // The request is withdrawn: the pod comes back.
    s.merge_patch_direct(
        "v1",
        "pods",
        Some(NS),
        &pod_name(6),
        json!({"metadata": {"annotations": {"lanekeeper.dev/drain-request": null}}}),
        None,
    )
    .unwrap();
    assert!(
        s.wait_until(T, |s| drained(s) == vec![pod_name(0)]).await,
        "{:?}",
        drained(&s)
    );
    assert!(check_history(&s) >= 2);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_gate_mode_sets_the_serving_condition() {
    let s = ApiServer::start().await;
    setup(&s, 8, 120, false, true);
    s.put_direct(pod(7, false, true)).unwrap(); // not ready yet: no opinion
    let errors = PodErrors::default();
    for i in 0..8 {
        errors.set(&pod_name(i), 0.01);
    }
    errors.set(&pod_name(2), 0.9);
    let c = start(&s, &errors);
    let serving = |s: &ApiServer, i: usize| -> Option<String> {
        let p = s.get_object("v1", "pods", Some(NS), &pod_name(i))?;
        p["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "lanekeeper.dev/serving")
            .map(|c| c["status"].as_str().unwrap().to_owned())
    };
    assert!(
        s.wait_until(T, |s| serving(s, 2).as_deref() == Some("False")
            && [0, 1, 3, 4, 5, 6]
                .iter()
                .all(|&i| serving(s, i).as_deref() == Some("True")))
            .await
    );
    assert_eq!(drained(&s), vec![pod_name(2)]);
    for i in [0, 1, 3, 4, 5, 6] {
        assert_eq!(serving(&s, i).as_deref(), Some("True"), "pod {i}");
    }
    assert_eq!(
        serving(&s, 7),
        None,
        "a pod whose containers are not ready gets no opinion"
    );
    // Its containers become ready: it is let in at once.
    set_pod_ready(&s, 7, true);
    assert!(
        s.wait_until(T, |s| serving(s, 7).as_deref() == Some("True"))
            .await
    );
    // The ContainersReady condition was kept (strategic merge by type).
    let p7 = s.get_object("v1", "pods", Some(NS), &pod_name(7)).unwrap();
    assert!(
        p7["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "ContainersReady")
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unready_pods_are_never_labelled_and_observe_mode_writes_nothing() {
    let s = ApiServer::start().await;
    setup(&s, 8, 120, true, false);
    set_pod_ready(&s, 5, false);
    let errors = PodErrors::default();
    for i in 0..8 {
        errors.set(&pod_name(i), 0.01);
    }
    errors.set(&pod_name(5), 0.99);
    errors.set(&pod_name(6), 0.5);
    let c = start(&s, &errors);
    assert!(
        s.wait_until(T, |s| profile_status(s)["drainBudget"].is_number())
            .await
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        drained(&s).is_empty(),
        "observe mode: the decision is only reported"
    );
    assert!(s.requests_matching(Some("PATCH"), "/pods/").is_empty());
    c.stop().await;

    // Enforcing now: pod 6 is drained, pod 5 (not ready) never.
    s.merge_patch_direct(
        LK,
        "degradationpolicies",
        Some(NS),
        "agent-assist-ladder",
        json!({"spec": {"mode": "Enforce"}}),
        None,
    )
    .unwrap();
    let c = start(&s, &errors);
    assert!(
        s.wait_until(T, |s| drained(s) == vec![pod_name(6)]).await,
        "{:?}",
        drained(&s)
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(drained(&s), vec![pod_name(6)]);
    c.stop().await;
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
