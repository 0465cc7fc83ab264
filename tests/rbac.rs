//! The chart's RBAC is exactly what the controller uses.
//!
//! The real controller runs against the API double through representative
//! scenarios (INC-47 with leader election and a capacity drop, pods of the
//! pool with a drain request and the serving readiness gate, an HPA in
//! HPAMinReplicas mode, a StatefulSet pool, malformed objects). Every request
//! in the double's log becomes (apiGroup, resource[/subresource], verb) — GET
//! on a name → get, GET on a collection → list, `?watch` → watch, POST →
//! create, PATCH → patch (and create too for a server-side apply that
//! creates its object, as the real server checks), PUT → update, DELETE →
//! delete — and the set is
//! compared with the rules of the ClusterRoles and Roles in
//! `manifests/install.yaml` (the chart rendered with default values; kept in
//! sync by `.ci/chart-check.py`): nothing missing, nothing extra. Discovery
//! endpoints need no RBAC and are left out.
//!
//! Until the drain code patches pods (label) and pods/status (the readiness
//! gate), those two rules are reported as "expected from the drain code"
//! instead of failing; once the drain-request pod in the scenario is drained,
//! the comparison is exact.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use lanekeeper::controller::Settings;
use serde_json::{Value, json};
use support::apiserver::{ApiServer, RecordedRequest, ResourceDef};
use support::operator::{
    LK, NS, T, cluster, deployment, inc47_objects, lanes_json, start, start_with,
};

/// Release namespace and Lease name of the default render.
const RELEASE_NS: &str = "lanekeeper-system";
const LEASE: &str = "lanekeeper";

/// (apiGroup, resource[/subresource], verb)
type Access = (String, String, String);

/// A Ready pod of the pool, with the serving readiness gate.
fn pod(i: usize, drain_request: bool) -> Value {
    let mut annotations = serde_json::Map::new();
    if drain_request {
        annotations.insert("lanekeeper.dev/drain-request".into(), json!("true"));
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("vllm-agent-assist-{i}"), "namespace": NS,
                     "labels": {"app": "vllm-agent-assist"}, "annotations": annotations},
        "spec": {"readinessGates": [{"conditionType": "lanekeeper.dev/serving"}],
                 "containers": [{"name": "vllm", "image": "vllm"}]},
        "status": {"phase": "Running", "podIP": format!("10.0.0.{}", i + 10), "conditions": [
            {"type": "ContainersReady", "status": "True"},
            {"type": "Ready", "status": "True"}
        ]}
    })
}

fn settings(leader: bool) -> Settings {
    Settings {
        namespaces: vec![NS.into()],
        resync: Duration::from_millis(500),
        leader_election: leader,
        lease_name: LEASE.into(),
        lease_namespace: RELEASE_NS.into(),
        lease_duration_seconds: 3,
        identity: "rbac-test".into(),
    }
}

fn events(s: &ApiServer, reason: &str) -> usize {
    s.list_objects("events.k8s.io/v1", "events", Some(NS))
        .iter()
        .filter(|e| e["reason"] == reason)
        .count()
}

fn apply_inc47(s: &ApiServer) {
    s.put_direct(deployment("vllm-agent-assist", 8, 8)).unwrap();
    for mut o in inc47_objects() {
        if o["kind"] == "DegradationPolicy" {
            o["spec"]["hysteresis"]["stableForSeconds"] = json!(1);
        }
        s.put_direct(o).unwrap();
    }
}

/// INC-47 with leader election, the pool's pods (one asks to be drained),
/// a capacity drop to level 2 and back, then a clean shutdown.
async fn scenario_inc47(log: &mut Vec<RecordedRequest>) -> bool {
    let s = cluster().await;
    apply_inc47(&s);
    for i in 0..8 {
        s.put_direct(pod(i, i == 3)).unwrap();
    }
    let c = start(&s, settings(true));
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes")
            .is_some_and(|c| c["level"] == 1))
            .await,
        "INC-47 reaches level 1"
    );
    s.merge_patch_direct(
        "apps/v1",
        "deployments",
        Some(NS),
        "vllm-agent-assist",
        json!({"status": {"readyReplicas": 6}}),
        Some("status"),
    )
    .unwrap();
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes")
            .is_some_and(|c| c["level"] == 2))
            .await,
        "capacity 420 → level 2"
    );
    // Back to level 1 and up again: the same transition repeats, which
    // kube's event recorder folds into a series (a PATCH of the event).
    assert!(
        s.wait_until(T, |s| !s
            .list_objects("events.k8s.io/v1", "events", Some(NS))
            .is_empty())
            .await,
        "the level change is an event"
    );
    for ready in [8, 6, 8, 6] {
        let want = if ready == 8 { 1 } else { 2 };
        s.merge_patch_direct(
            "apps/v1",
            "deployments",
            Some(NS),
            "vllm-agent-assist",
            json!({"status": {"readyReplicas": ready}}),
            Some("status"),
        )
        .unwrap();
        assert!(
            s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes")
                .is_some_and(|c| c["level"] == want))
                .await,
            "ready {ready} → level {want}"
        );
    }
    // A lane changes: the config follows (a configmap write after the first).
    s.merge_patch_direct(
        LK,
        "lanecontracts",
        Some(NS),
        "p1-agent-assist",
        json!({"spec": {"expectedRequestsPerSecond": "170"}}),
        None,
    )
    .unwrap();
    // Give the drain code time to act on the drain request, if it exists.
    let drained = s
        .wait_until(Duration::from_secs(8), |s| {
            s.get_object("v1", "pods", Some(NS), "vllm-agent-assist-3")
                .is_some_and(|p| p["metadata"]["labels"]["lanekeeper.dev/drain"] == "true")
        })
        .await;
    c.stop().await;
    log.extend(s.requests());
    drained
}

/// HPA on the target: first the conflict (list only), then HPAMinReplicas.
async fn scenario_hpa(log: &mut Vec<RecordedRequest>) {
    let s = cluster().await;
    apply_inc47(&s);
    s.put_direct(json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "vllm", "namespace": NS},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-agent-assist"}, "minReplicas": 2, "maxReplicas": 12}
    }))
    .unwrap();
    let c = start(&s, settings(false));
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
            .is_some_and(|h| h["spec"]["minReplicas"] != 2))
            .await,
        "HPAMinReplicas raises the HPA's minimum"
    );
    c.stop().await;
    log.extend(s.requests());
}

/// A StatefulSet pool, and malformed objects next to it.
async fn scenario_statefulset_and_malformed(log: &mut Vec<RecordedRequest>) {
    let s = cluster().await;
    s.put_direct(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "vllm-agent-assist", "namespace": NS},
        "spec": {"replicas": 3, "serviceName": "vllm", "selector": {"matchLabels": {"app": "vllm-agent-assist"}},
                 "template": {"metadata": {"labels": {"app": "vllm-agent-assist"}}, "spec": {"containers": [{"name": "vllm", "image": "vllm"}]}}},
        "status": {"replicas": 3, "readyReplicas": 3}
    }))
    .unwrap();
    for mut o in inc47_objects() {
        if o["kind"] == "CapacityProfile" {
            o["spec"]["pool"]["scaleTargetRef"]["kind"] = json!("StatefulSet");
        }
        s.put_direct(o).unwrap();
    }
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
    s.put_direct(json!({
        "apiVersion": LK, "kind": "DegradationPolicy",
        "metadata": {"name": "broken-ladder", "namespace": NS},
        "spec": {"profile": "agent-assist", "levels": "none"}
    }))
    .unwrap();
    let c = start(&s, settings(false));
    assert!(
        s.wait_until(T, |s| events(s, "InvalidObject") >= 3).await,
        "the malformed lane is reported"
    );
    assert!(
        s.wait_until(T, |s| s.requests().iter().any(
            |r| r.method == "PATCH" && r.path.ends_with("statefulsets/vllm-agent-assist/scale")
        ))
        .await,
        "the StatefulSet is scaled through its scale subresource"
    );
    c.stop().await;
    log.extend(s.requests());
}

/// A profile whose Prometheus source authenticates with a bearer token from
/// a Secret: the live source (as `lanekeeper run` wires it) reads the Secret.
async fn scenario_prometheus_secret(log: &mut Vec<RecordedRequest>) {
    let s = cluster().await;
    s.register(ResourceDef::new("", "v1", "Secret", "secrets", true));
    s.put_direct(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "prometheus-token", "namespace": NS},
        "data": {"token": "c2VjcmV0"}
    }))
    .unwrap();
    s.put_direct(deployment("vllm-agent-assist", 8, 8)).unwrap();
    for mut o in inc47_objects() {
        if o["kind"] == "CapacityProfile" {
            o["spec"]["signals"] = json!({"prometheus": {
                "url": "http://127.0.0.1:9",
                "timeoutSeconds": 1,
                "bearerTokenSecretRef": {"name": "prometheus-token", "key": "token"},
                "queries": {"availableUnitsPerSecond": "sum(vllm_capacity)"}
            }});
        }
        s.put_direct(o).unwrap();
    }
    let source: std::sync::Arc<dyn lanekeeper::signals::SignalSource> = std::sync::Arc::new(
        lanekeeper::signals::prometheus::PrometheusSource::new(Some(s.client()), None),
    );
    let c = start_with(&s, settings(false), vec![source]);
    assert!(
        s.wait_until(T, |s| s.requests().iter().any(
            |r| r.method == "GET" && r.path.ends_with("/secrets/prometheus-token")
        ))
        .await,
        "the Prometheus source reads its bearer token"
    );
    c.stop().await;
    log.extend(s.requests());
}

/// Maps a request to what RBAC authorizes; None for discovery.
fn access(r: &RecordedRequest) -> Option<(Access, Option<String>)> {
    let segs: Vec<&str> = r
        .path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, rest) = match segs.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let rest: &[&str] = match rest {
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    let (resource, name, sub) = match rest {
        [] => return None, // discovery of a group version
        [res] => (*res, None, None),
        [res, name] => (*res, Some(*name), None),
        [res, name, sub] => (*res, Some(*name), Some(*sub)),
        _ => panic!("unexpected path {}", r.path),
    };
    let watch = r.watch
        || r.query
            .get("watch")
            .is_some_and(|v| v == "true" || v == "1");
    let verb = match (r.method.as_str(), name) {
        ("GET", _) if watch => "watch",
        ("GET", Some(_)) => "get",
        ("GET", None) => "list",
        ("POST", _) => "create",
        ("PATCH", _) => "patch",
        ("PUT", _) => "update",
        ("DELETE", Some(_)) => "delete",
        ("DELETE", None) => "deletecollection",
        (m, _) => panic!("unexpected method {m} {}", r.path),
    };
    let resource = match sub {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_owned(),
    };
    Some((
        (group.to_owned(), resource, verb.to_owned()),
        name.map(str::to_owned),
    ))
}

/// The rules of the default render's ClusterRoles and Roles:
/// access → resourceNames (None: any name).
fn chart_rules() -> BTreeMap<Access, Option<BTreeSet<String>>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("manifests/install.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut out: BTreeMap<Access, Option<BTreeSet<String>>> = BTreeMap::new();
    for d in serde_yaml::Deserializer::from_str(&text) {
        let v: serde_yaml::Value = serde::Deserialize::deserialize(d).unwrap();
        let v = serde_json::to_value(v).unwrap();
        if v["kind"] != "ClusterRole" && v["kind"] != "Role" {
            continue;
        }
        for rule in v["rules"].as_array().unwrap() {
            let names: Option<BTreeSet<String>> = rule["resourceNames"]
                .as_array()
                .map(|a| a.iter().map(|n| n.as_str().unwrap().to_owned()).collect());
            for g in rule["apiGroups"].as_array().unwrap() {
                for res in rule["resources"].as_array().unwrap() {
                    for verb in rule["verbs"].as_array().unwrap() {
                        let key = (
                            g.as_str().unwrap().to_owned(),
                            res.as_str().unwrap().to_owned(),
                            verb.as_str().unwrap().to_owned(),
                        );
                        let entry = out.entry(key).or_insert_with(|| Some(BTreeSet::new()));
                        match (entry.as_mut(), &names) {
                            (Some(set), Some(n)) => set.extend(n.iter().cloned()),
                            (_, None) => *entry = None,
                            (None, Some(_)) => {}
                        }
                    }
                }
            }
        }
    }
    out
}

/// A Confirm level approved with the annotation, entered, then left: the
/// approval is consumed (the annotation removed from the policy).
async fn scenario_approval(log: &mut Vec<RecordedRequest>) {
    let s = cluster().await;
    s.put_direct(deployment("vllm-agent-assist", 8, 2)).unwrap();
    for mut o in inc47_objects() {
        if o["kind"] == "DegradationPolicy" {
            o["spec"]["hysteresis"]["stableForSeconds"] = json!(1);
            o["spec"]["levels"][3]["approval"]["timeoutSeconds"] = json!(100_000);
            o["metadata"]["annotations"] = json!({"lanekeeper.dev/approve-level": "4"});
        }
        s.put_direct(o).unwrap();
    }
    let c = start(&s, settings(false));
    assert!(
        s.wait_until(T, |s| lanes_json(s, "agent-assist-lanes")
            .is_some_and(|c| c["level"] == 4))
            .await,
        "the approved level is entered"
    );
    s.merge_patch_direct(
        "apps/v1",
        "deployments",
        Some(NS),
        "vllm-agent-assist",
        json!({"status": {"readyReplicas": 8}}),
        Some("status"),
    )
    .unwrap();
    assert!(
        s.wait_until(T, |s| s
            .get_object(LK, "degradationpolicies", Some(NS), "agent-assist-ladder")
            .is_some_and(|p| {
                p["metadata"]["annotations"]["lanekeeper.dev/approve-level"].is_null()
            }))
        .await,
        "the approval is consumed"
    );
    c.stop().await;
    log.extend(s.requests());
}

fn show(a: &Access) -> String {
    let g = if a.0.is_empty() { "core" } else { &a.0 };
    format!("{g} {} {}", a.1, a.2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_rbac_matches_the_controllers_api_calls() {
    let mut log = Vec::new();
    let drain_active = scenario_inc47(&mut log).await;
    scenario_hpa(&mut log).await;
    scenario_statefulset_and_malformed(&mut log).await;
    scenario_prometheus_secret(&mut log).await;
    scenario_approval(&mut log).await;

    let mut used: BTreeMap<Access, BTreeSet<String>> = BTreeMap::new();
    let mut denied = Vec::new();
    for r in &log {
        if r.status == 403 {
            denied.push(format!("{} {}", r.method, r.path));
        }
        if let Some((a, name)) = access(r) {
            // A server-side apply that creates its object needs create as
            // well as patch (the real API server checks both; found on it).
            let created = r.method == "PATCH"
                && r.status == 201
                && r.content_type.as_deref() == Some("application/apply-patch+yaml");
            if created {
                let c = (a.0.clone(), a.1.clone(), "create".to_owned());
                let names = used.entry(c).or_default();
                if let Some(n) = &name {
                    names.insert(n.clone());
                }
            }
            let names = used.entry(a).or_default();
            if let Some(n) = name {
                names.insert(n);
            }
        }
    }
    assert!(denied.is_empty(), "the double refused: {denied:?}");
    let rules = chart_rules();

    let drain_rules: BTreeSet<Access> = [("", "pods", "patch"), ("", "pods/status", "patch")]
        .iter()
        .map(|(g, r, v)| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
        .collect();

    let mut missing = Vec::new();
    let mut by_name = Vec::new();
    for (a, names) in &used {
        match rules.get(a) {
            None => missing.push(show(a)),
            Some(Some(allowed)) => {
                let outside: Vec<_> = names.difference(allowed).collect();
                if !outside.is_empty() || names.is_empty() {
                    by_name.push(format!(
                        "{} on {outside:?} (the rule allows only {allowed:?})",
                        show(a)
                    ));
                }
            }
            Some(None) => {}
        }
    }
    let mut extra = Vec::new();
    let mut pending = Vec::new();
    for a in rules.keys() {
        if used.contains_key(a) {
            continue;
        }
        if !drain_active && drain_rules.contains(a) {
            pending.push(show(a));
        } else {
            extra.push(show(a));
        }
    }
    println!("API calls seen ({} requests):", log.len());
    for (a, names) in &used {
        println!("  {}  {:?}", show(a), names);
    }
    if !pending.is_empty() {
        println!(
            "NOTE: granted but not exercised yet, expected from the drain code: {}",
            pending.join(", ")
        );
        println!("      (the comparison becomes exact once the drain-request pod gets drained)");
    }
    assert!(
        missing.is_empty(),
        "the chart's RBAC misses what the controller calls: {missing:?}"
    );
    assert!(by_name.is_empty(), "resourceNames too narrow: {by_name:?}");
    assert!(
        extra.is_empty(),
        "the chart grants what the controller never calls: {extra:?}"
    );
}
