//! The controller at scale on a real control plane (any cluster `KUBECONFIG`
//! names; kwok nodes make the pods cheap). Not a timed test: it prints the
//! figures of docs/performance.md, "Controller at scale on a real control
//! plane".
//!
//! ```sh
//! bash e2e/cluster.sh up
//! KUBECONFIG=$PWD/e2e/.cluster/kubeconfig \
//! LANEKEEPER_SCALE_AUDIT_LOG=$PWD/e2e/.cluster/audit.log \
//! LANEKEEPER_SCALE_PODS=2000 cargo bench --bench scale_cluster
//! ```
//!
//! Without `KUBECONFIG` it says so and does nothing (so `cargo bench` runs
//! anywhere). What it does:
//!
//! 1. installs the CRDs, and kwok GPU nodes (`lk-scale-gpu-N`, 64 GPUs and
//!    1,000 pods each, the kwok node annotation) for the pool pods;
//! 2. creates 50 CapacityProfiles in 10 namespaces (`lk-scale-00`..), each
//!    with a Deployment of PODS/50 pods asking for one GPU each, 20
//!    LaneContracts (1,000 in all) and a DegradationPolicy (50), and waits
//!    for every pod to be Ready;
//! 3. starts the release `lanekeeper run` (leader election on, the default
//!    15 s resync, all namespaces) as a ServiceAccount of its own
//!    (cluster-admin, so RBAC does not interfere), and times its start to
//!    every gateway ConfigMap and every profile status written;
//! 4. at steady state, counts the controller's API requests per minute by
//!    verb and resource: exactly, from the audit log by user when
//!    `LANEKEEPER_SCALE_AUDIT_LOG` names it; and from the API server's
//!    `apiserver_request_total`, as the difference between a window with
//!    the controller and one without it;
//! 5. reads the controller's memory from /proc/PID/status: VmRSS sampled
//!    every 20 ms from its start until every status is written (through
//!    the initial lists), VmHWM (the peak) then, at steady state and at the
//!    end, VmRSS at each; a failed read stops the bench;
//! 6. reaction to cluster signals: `CHANGES` times (default 100) turns a
//!    pool pod's ContainersReady False (then True again, as a kubelet
//!    would) and times the patch to the ConfigMap whose capacity reflects
//!    it, as this process's watch receives it;
//! 7. reaction to Prometheus: one profile reads its capacity from a
//!    Prometheus HTTP API served here (interval 1 s); `CHANGES` times the
//!    answer changes, timed to the ConfigMap that reflects it.
//!
//! Environment: `LANEKEEPER_SCALE_PODS` (2000), `LANEKEEPER_SCALE_CHANGES`
//! (100), `LANEKEEPER_SCALE_STEADY_SECONDS` (60),
//! `LANEKEEPER_SCALE_KEEP=1` to leave the objects behind (a later run
//! reuses them: it deletes the gateway ConfigMaps and clears the profiles'
//! statuses before the controller starts), `LANEKEEPER_SCALE_BIN` for
//! another build of `lanekeeper` than this one (to compare two builds on
//! one world).

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const NAMESPACES: usize = 10;
const PROFILES_PER_NS: usize = 5;
const LANES_PER_PROFILE: usize = 20;
const UNITS_PER_REPLICA: u64 = 70;
const GPUS_PER_NODE: usize = 64;
const SYSTEM_NS: &str = "lk-scale-system";
const SA: &str = "lanekeeper-scale";
const MANAGER: &str = "lanekeeper-scale-bench";

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ns_name(i: usize) -> String {
    format!("lk-scale-{i:02}")
}

fn api_of(client: &Client, v: &Value) -> Api<DynamicObject> {
    let api_version = v["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = v["kind"].as_str().unwrap();
    let plural = match kind {
        "DegradationPolicy" => "degradationpolicies".to_owned(),
        "CustomResourceDefinition" => "customresourcedefinitions".to_owned(),
        k => format!("{}s", k.to_lowercase()),
    };
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural);
    match v["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

async fn apply(client: &Client, v: &Value) {
    let name = v["metadata"]["name"].as_str().unwrap().to_owned();
    api_of(client, v)
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(v),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {} {name}: {e}", v["kind"]));
}

/// The example's lanes and policy, renamed and multiplied to 20 lanes per
/// profile (each copy of a lane carries a quarter of its demand and floor).
fn world_objects(ns: &str, profile: &str, replicas: usize, prom: Option<&str>) -> Vec<Value> {
    let text = std::fs::read_to_string("examples/inc-47/inc-47.yaml").unwrap();
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            let y: serde_yaml::Value = serde::Deserialize::deserialize(d).unwrap();
            serde_json::to_value(y).unwrap()
        })
        .collect();
    let pool = format!("{profile}-pool");
    let mut out = vec![json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": pool, "namespace": ns, "labels": {"app": pool}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": pool}},
            "template": {
                "metadata": {"labels": {"app": pool}},
                "spec": {
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "vllm", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi", "nvidia.com/gpu": "1"},
                                      "limits": {"nvidia.com/gpu": "1"}}
                    }]
                }
            }
        }
    })];
    let copies = LANES_PER_PROFILE / 5;
    let rename = |n: &str, k: usize| format!("{n}-{k}");
    for d in &docs {
        let mut v = d.clone();
        v["metadata"]["namespace"] = json!(ns);
        match d["kind"].as_str().unwrap() {
            "CapacityProfile" => {
                v["metadata"]["name"] = json!(profile);
                let s = &mut v["spec"];
                s["pool"]["scaleTargetRef"]["name"] = json!(pool);
                s["pool"]["podSelector"] = json!({"matchLabels": {"app": pool}});
                let cap = replicas as u64 * UNITS_PER_REPLICA;
                s["capacity"] = json!({"safeUnitsPerSecond": cap.to_string(),
                    "unitsPerReplica": UNITS_PER_REPLICA.to_string(), "warningUtilizationPercent": 85});
                s["replicas"] = json!({"min": 1, "max": replicas.max(1) * 2});
                s["scaling"] = json!({"mode": "Disabled"});
                if let Some(url) = prom {
                    s["signals"] = json!({"prometheus": {"url": url, "intervalSeconds": 1,
                        "timeoutSeconds": 2, "stalenessSeconds": 30,
                        "queries": {"availableUnitsPerSecond": "pool_available_units_per_second"}}});
                }
                out.push(v);
            }
            "LaneContract" => {
                for k in 0..copies {
                    let mut l = v.clone();
                    let name = d["metadata"]["name"].as_str().unwrap();
                    l["metadata"]["name"] = json!(rename(name, k));
                    l["spec"]["profile"] = json!(profile);
                    let quarter = |f: &Value| {
                        f.as_str()
                            .and_then(|x| x.parse::<f64>().ok())
                            .map(|x| json!(format!("{}", x / copies as f64)))
                    };
                    for f in ["expectedRequestsPerSecond", "floorUnitsPerSecond"] {
                        if let Some(q) = quarter(&d["spec"][f]) {
                            l["spec"][f] = q;
                        }
                    }
                    if let Some(from) = d["spec"]["borrowing"]["from"].as_array() {
                        l["spec"]["borrowing"]["from"] = json!(
                            from.iter()
                                .map(|f| rename(f.as_str().unwrap(), k))
                                .collect::<Vec<_>>()
                        );
                    }
                    out.push(l);
                }
            }
            "DegradationPolicy" => {
                v["metadata"]["name"] = json!(format!("{profile}-ladder"));
                v["spec"]["profile"] = json!(profile);
                // Lane names in cap actions: the first copy of each.
                if let Some(levels) = v["spec"]["levels"].as_array_mut() {
                    for level in levels {
                        // get_mut, not IndexMut: indexing would insert
                        // `cap: null` into levels without caps.
                        if let Some(caps) = level
                            .get_mut("actions")
                            .and_then(|a| a.get_mut("cap"))
                            .and_then(Value::as_array_mut)
                        {
                            for c in caps {
                                if let Some(ls) = c["lanes"].as_array_mut() {
                                    for l in ls {
                                        *l = json!(rename(l.as_str().unwrap(), 0));
                                    }
                                }
                            }
                        }
                    }
                }
                out.push(v);
            }
            _ => {}
        }
    }
    out
}

/// A Prometheus HTTP API answering every instant query with one sample of
/// the current value (and `timestamp(...)` with the evaluation time).
async fn fake_prometheus(value: Arc<Mutex<f64>>) -> String {
    use axum::extract::{RawQuery, State};
    let app = axum::Router::new()
        .route(
            "/api/v1/query",
            axum::routing::get(
                |State(v): State<Arc<Mutex<f64>>>, RawQuery(q): RawQuery| async move {
                    let q: HashMap<String, String> =
                        url::form_urlencoded::parse(q.unwrap_or_default().as_bytes())
                            .into_owned()
                            .collect();
                    let t: f64 = q.get("time").and_then(|t| t.parse().ok()).unwrap_or(0.0);
                    let query = q.get("query").cloned().unwrap_or_default();
                    let x = if query.starts_with("timestamp(") {
                        t
                    } else {
                        *v.lock().unwrap()
                    };
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        json!({"status": "success", "data": {"resultType": "vector",
                            "result": [{"metric": {}, "value": [t, x.to_string()]}]}})
                        .to_string(),
                    )
                },
            ),
        )
        .with_state(value);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    url
}

/// A kubeconfig for the bench's own ServiceAccount (cluster-admin), so the
/// audit log tells the controller's requests from everyone else's.
async fn controller_kubeconfig(client: &Client) -> std::path::PathBuf {
    apply(
        client,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NS}}),
    )
    .await;
    apply(
        client,
        &json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": SA, "namespace": SYSTEM_NS}}),
    )
    .await;
    apply(client, &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": SA},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": SYSTEM_NS}]}))
    .await;
    let req = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(7200),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), SYSTEM_NS)
        .create_token_request(SA, &PostParams::default(), &req)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let kc = kube::config::Kubeconfig::read().unwrap();
    let ctx_name = kc.current_context.clone().unwrap_or_default();
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)
        .and_then(|c| c.context.clone())
        .unwrap();
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.clone())
        .unwrap();
    let mut cluster = serde_json::to_value(&cluster).unwrap();
    if let Some(path) = cluster["certificate-authority"].as_str().map(str::to_owned) {
        let pem = std::fs::read(path).unwrap();
        cluster["certificate-authority-data"] =
            serde_json::to_value(k8s_openapi::ByteString(pem)).unwrap();
        cluster
            .as_object_mut()
            .unwrap()
            .remove("certificate-authority");
    }
    let out = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "scale", "cluster": cluster}],
        "users": [{"name": SA, "user": {"token": token}}],
        "contexts": [{"name": "scale", "context": {"cluster": "scale", "user": SA}}],
        "current-context": "scale"
    });
    let path = std::env::temp_dir().join("lanekeeper-scale.kubeconfig");
    std::fs::write(&path, serde_json::to_string(&out).unwrap()).unwrap();
    path
}

/// A field of the controller's /proc/PID/status in MiB: `VmRSS` (resident
/// now) or `VmHWM` (the peak resident set so far). A failed read is an
/// error, never 0.
fn memory_mib(pid: u32, field: &str) -> Result<f64, String> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let kib: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("{path}: no {field} line"))?;
    Ok(kib / 1024.0)
}

fn mib(pid: u32, field: &str) -> f64 {
    memory_mib(pid, field).unwrap_or_else(|e| panic!("reading the controller's memory: {e}"))
}

/// Samples the controller's VmRSS every 20 ms from its start until
/// stopped: what its memory does through the initial lists.
struct Sampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: std::thread::JoinHandle<Result<Vec<(Duration, f64)>, String>>,
}

impl Sampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let task = std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut samples = Vec::new();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                samples.push((t0.elapsed(), memory_mib(pid, "VmRSS")?));
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(samples)
        });
        Self { stop, task }
    }

    /// The samples taken.
    fn finish(self) -> Vec<(Duration, f64)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task
            .join()
            .expect("the sampler thread")
            .unwrap_or_else(|e| panic!("sampling the controller's memory: {e}"))
    }
}

/// Removes what an earlier run's controller wrote (the gateway ConfigMaps,
/// the profiles' statuses), so that a kept world (`LANEKEEPER_SCALE_KEEP`)
/// times a start from nothing written again.
async fn clear_outputs(client: &Client, names: &[(String, String)]) {
    for (ns, profile) in names {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        for name in [
            format!("{profile}-lanes"),
            format!("{profile}-lanes-observe"),
        ] {
            match cms.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => panic!("delete ConfigMap {ns}/{name}: {e}"),
            }
        }
        let api = Api::<DynamicObject>::namespaced_with(
            client.clone(),
            ns,
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("lanekeeper.dev", "v1alpha1", "CapacityProfile"),
                "capacityprofiles",
            ),
        );
        api.patch_status(
            profile,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": null})),
        )
        .await
        .unwrap_or_else(|e| panic!("clear the status of {ns}/{profile}: {e}"));
    }
}

/// `apiserver_request_total` summed by (verb, resource[/subresource]).
async fn apiserver_requests(client: &Client) -> BTreeMap<String, f64> {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(req).await.unwrap_or_default();
    let mut out = BTreeMap::new();
    for l in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let label = |k: &str| {
            l.split(&format!("{k}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
        };
        let res = match label("subresource") {
            "" => label("resource").to_owned(),
            s => format!("{}/{s}", label("resource")),
        };
        let v: f64 = l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *out.entry(format!("{} {res}", label("verb"))).or_insert(0.0) += v;
    }
    out
}

fn diff(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    b.iter()
        .map(|(k, v)| (k.clone(), v - a.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

/// The controller's requests in the audit log (by user), between two byte
/// offsets, by verb and resource.
fn audited(path: &str, user: &str, from: u64) -> (BTreeMap<String, u64>, u64) {
    let text = std::fs::read(path).unwrap_or_default();
    let mut out = BTreeMap::new();
    for l in text[from.min(text.len() as u64) as usize..].split(|b| *b == b'\n') {
        let Ok(e) = serde_json::from_slice::<Value>(l) else {
            continue;
        };
        if e["stage"] != "ResponseComplete" || e["user"]["username"] != user {
            continue;
        }
        let res = match e["objectRef"]["subresource"].as_str() {
            Some(s) => format!("{}/{s}", e["objectRef"]["resource"].as_str().unwrap_or("")),
            None => e["objectRef"]["resource"].as_str().unwrap_or("").to_owned(),
        };
        *out.entry(format!("{} {res}", e["verb"].as_str().unwrap_or("")))
            .or_insert(0) += 1;
    }
    (out, text.len() as u64)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i]
}

type Seen = Arc<Mutex<HashMap<String, (Value, Instant)>>>;

/// Watches the gateway ConfigMaps of every namespace: per `ns/name` the
/// config and when this process received it.
fn watch_configmaps(client: &Client) -> Seen {
    let seen: Seen = Arc::default();
    let api: Api<ConfigMap> = Api::all(client.clone());
    let s = seen.clone();
    tokio::spawn(async move {
        let stream = watcher(
            api,
            watcher::Config::default().labels("app.kubernetes.io/managed-by=lanekeeper"),
        )
        .default_backoff()
        .applied_objects();
        futures::pin_mut!(stream);
        while let Some(Ok(cm)) = stream.next().await {
            let cfg: Value = cm
                .data
                .as_ref()
                .and_then(|d| d.get("lanes.json"))
                .and_then(|t| serde_json::from_str(t).ok())
                .unwrap_or(Value::Null);
            let key = format!("{}/{}", cm.namespace().unwrap_or_default(), cm.name_any());
            s.lock().unwrap().insert(key, (cfg, Instant::now()));
        }
    });
    seen
}

async fn wait_for<F: FnMut() -> bool>(what: &str, timeout: Duration, mut f: F) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    t0.elapsed()
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if std::env::var_os("KUBECONFIG").is_none() {
        eprintln!(
            "scale_cluster: KUBECONFIG is not set; nothing measured (see benches/scale_cluster.rs)"
        );
        return;
    }
    let pods = env_num("LANEKEEPER_SCALE_PODS", 2000);
    let changes = env_num("LANEKEEPER_SCALE_CHANGES", 100);
    let steady = Duration::from_secs(env_num("LANEKEEPER_SCALE_STEADY_SECONDS", 60) as u64);
    let audit = std::env::var("LANEKEEPER_SCALE_AUDIT_LOG").ok();
    let profiles = NAMESPACES * PROFILES_PER_NS;
    let per_profile = pods / profiles;
    let client = Client::try_default().await.expect("a cluster");
    println!(
        "scale_cluster: {profiles} profiles in {NAMESPACES} namespaces, {} lanes, {profiles} policies, {} pool pods",
        profiles * LANES_PER_PROFILE,
        per_profile * profiles
    );

    // 1. CRDs and nodes.
    for e in std::fs::read_dir("crds").unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        let y: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        apply(&client, &serde_json::to_value(y).unwrap()).await;
    }
    let nodes = (per_profile * profiles).div_ceil(GPUS_PER_NODE);
    let status_of = || {
        json!({"status": {
            "allocatable": {"cpu": "256", "memory": "2Ti", "pods": "1000", "nvidia.com/gpu": GPUS_PER_NODE.to_string()},
            "capacity": {"cpu": "256", "memory": "2Ti", "pods": "1000", "nvidia.com/gpu": GPUS_PER_NODE.to_string()}}})
    };
    for n in 0..nodes {
        let name = format!("lk-scale-gpu-{n}");
        apply(&client, &json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64", "type": "kwok", "nvidia.com/gpu.present": "true"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}
        }))
        .await;
        let status = status_of();
        Api::<Node>::all(client.clone())
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }
    // kwok takes a new node over by writing its status, which can land after
    // the patch above and drop the GPUs (seen with 157 nodes: 23 lost them,
    // and 1,408 pods stayed Pending). Patch again until every node has them.
    let gpus_of = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("nvidia.com/gpu"))
            .map(|q| q.0.clone())
    };
    for round in 0.. {
        let mut missing = Vec::new();
        for n in 0..nodes {
            let name = format!("lk-scale-gpu-{n}");
            let node = Api::<Node>::all(client.clone()).get(&name).await.unwrap();
            if gpus_of(&node).as_deref() != Some(&GPUS_PER_NODE.to_string()) {
                missing.push(name);
            }
        }
        if missing.is_empty() {
            break;
        }
        assert!(
            round < 30,
            "nodes without their GPUs after 30 rounds: {missing:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        for name in missing {
            Api::<Node>::all(client.clone())
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status_of()))
                .await
                .unwrap();
        }
    }

    // 2. The world.
    let value = Arc::new(Mutex::new((per_profile as u64 * UNITS_PER_REPLICA) as f64));
    let prom = fake_prometheus(value.clone()).await;
    let t_setup = Instant::now();
    let mut names = Vec::new();
    for i in 0..NAMESPACES {
        let ns = ns_name(i);
        apply(
            &client,
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
        for j in 0..PROFILES_PER_NS {
            let profile = format!("pool-{j}");
            let p = (i == 0 && j == 0).then_some(prom.as_str());
            for o in world_objects(&ns, &profile, per_profile, p) {
                apply(&client, &o).await;
            }
            names.push((ns.clone(), profile));
        }
    }
    let deployments: Api<Deployment> = Api::all(client.clone());
    let ready = |d: &Deployment| {
        d.status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0) as usize
            == per_profile
    };
    loop {
        let list = deployments
            .list(&ListParams::default().labels("app"))
            .await
            .unwrap();
        let done = list
            .items
            .iter()
            .filter(|d| d.namespace().is_some_and(|n| n.starts_with("lk-scale-")) && ready(d))
            .count();
        if done == profiles {
            break;
        }
        assert!(
            t_setup.elapsed() < Duration::from_secs(1800),
            "pods not ready after 30 minutes: {done} of {profiles} pools"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    println!(
        "setup: every pool pod Ready {:.0} s after the first object",
        t_setup.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(10)).await;

    // Baseline: the API server's requests with no controller.
    let base0 = apiserver_requests(&client).await;
    tokio::time::sleep(steady).await;
    let base = diff(&base0, &apiserver_requests(&client).await);

    // 3. Start the controller.
    clear_outputs(&client, &names).await;
    let seen = watch_configmaps(&client);
    let kc = controller_kubeconfig(&client).await;
    let audit_start = audit
        .as_deref()
        .map_or(0, |p| std::fs::metadata(p).map_or(0, |m| m.len()));
    let started = Instant::now();
    let bin = std::env::var("LANEKEEPER_SCALE_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_lanekeeper").to_owned());
    println!("controller: {bin}");
    let mut ctl: Child = Command::new(&bin)
        .args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--health-addr",
            "127.0.0.1:0",
            "--lease-namespace",
            SYSTEM_NS,
            "--identity",
            "scale",
        ])
        .env("KUBECONFIG", &kc)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the lanekeeper binary");
    let pid = ctl.id();
    let sampler = Sampler::start(pid);
    let cms = wait_for("every gateway ConfigMap", Duration::from_secs(600), || {
        let s = seen.lock().unwrap();
        names.iter().all(|(ns, p)| {
            s.get(&format!("{ns}/{p}-lanes"))
                .is_some_and(|(c, _)| c.is_object())
        })
    })
    .await;
    let profiles_api = Api::<DynamicObject>::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("lanekeeper.dev", "v1alpha1", "CapacityProfile"),
            "capacityprofiles",
        ),
    );
    let statuses = loop {
        let list = profiles_api.list(&ListParams::default()).await.unwrap();
        let done = list
            .items
            .iter()
            .filter(|p| {
                p.namespace().is_some_and(|n| n.starts_with("lk-scale-"))
                    && p.data["status"]["level"].is_u64()
            })
            .count();
        if done == profiles {
            break started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let samples = sampler.finish();
    let rss_converged = mib(pid, "VmRSS");
    let hwm_converged = mib(pid, "VmHWM");
    println!(
        "start → all {profiles} ConfigMaps: {:.2} s; all {profiles} profile statuses: {:.2} s",
        cms.as_secs_f64(),
        statuses.as_secs_f64()
    );
    let (peak_at, peak) = samples
        .iter()
        .copied()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("at least one sample");
    println!(
        "controller memory through start-up: peak (VmHWM) {hwm_converged:.1} MiB; \
         VmRSS sampled every 20 ms ({} samples): highest {peak:.1} MiB at {:.2} s; \
         VmRSS once converged {rss_converged:.1} MiB",
        samples.len(),
        peak_at.as_secs_f64()
    );
    let at = |t: f64| {
        samples
            .iter()
            .take_while(|(d, _)| d.as_secs_f64() <= t)
            .last()
            .map_or(f64::NAN, |s| s.1)
    };
    println!(
        "  VmRSS at 0.25 / 0.5 / 1 / 2 s: {:.1} / {:.1} / {:.1} / {:.1} MiB",
        at(0.25),
        at(0.5),
        at(1.0),
        at(2.0)
    );

    // 4. Steady state.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (_, audit_mark) = audit
        .as_deref()
        .map_or((BTreeMap::new(), 0), |p| audited(p, "", u64::MAX));
    let m0 = apiserver_requests(&client).await;
    tokio::time::sleep(steady).await;
    let with = diff(&m0, &apiserver_requests(&client).await);
    let minutes = steady.as_secs_f64() / 60.0;
    let user = format!("system:serviceaccount:{SYSTEM_NS}:{SA}");
    if let Some(p) = audit.as_deref() {
        let (calls, _) = audited(p, &user, audit_mark);
        println!("steady state, the controller's requests per minute (audit log, by user):");
        if calls.is_empty() {
            println!("  none");
        }
        for (k, v) in &calls {
            println!("  {k}: {:.1}", *v as f64 / minutes);
        }
        let (all, _) = audited(p, &user, audit_start);
        println!(
            "  (from start, all requests: {} in total)",
            all.values().sum::<u64>()
        );
    }
    println!("steady state, apiserver_request_total per minute: with the controller − without:");
    let mut keys: Vec<&String> = with.keys().chain(base.keys()).collect();
    keys.sort();
    keys.dedup();
    for k in keys {
        let a = with.get(k).copied().unwrap_or(0.0) / minutes;
        let b = base.get(k).copied().unwrap_or(0.0) / minutes;
        if (a - b).abs() >= 0.5 {
            println!("  {k}: {a:.1} − {b:.1} = {:+.1}", a - b);
        }
    }
    println!(
        "controller memory at steady state: VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        mib(pid, "VmRSS"),
        mib(pid, "VmHWM")
    );

    // 6. Reaction to a pod's readiness.
    let mut cluster_ms = Vec::new();
    for n in 0..changes {
        // Every profile but the first, whose capacity comes from Prometheus.
        let (ns, profile) = &names[1 + (n / 2) % (names.len() - 1)];
        let key = format!("{ns}/{profile}-lanes");
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let pod = api
            .list(&ListParams::default().labels(&format!("app={profile}-pool")))
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|p| p.name_any())
            .min()
            .unwrap();
        let before = seen.lock().unwrap()[&key].0["capacityUnitsPerSecond"].clone();
        let status = if n % 2 == 0 { "False" } else { "True" };
        let t0 = Instant::now();
        api.patch_status(
            &pod,
            &PatchParams::default(),
            &Patch::Strategic(
                &json!({"status": {"conditions": [{"type": "ContainersReady", "status": status}]}}),
            ),
        )
        .await
        .unwrap();
        wait_for(
            "the ConfigMap reflecting the pod",
            Duration::from_secs(60),
            || seen.lock().unwrap()[&key].0["capacityUnitsPerSecond"] != before,
        )
        .await;
        let at = seen.lock().unwrap()[&key].1;
        cluster_ms.push((at - t0).as_secs_f64() * 1000.0);
    }

    // 7. Reaction to Prometheus.
    let key = format!("{}/{}-lanes", names[0].0, names[0].1);
    let mut prom_ms = Vec::new();
    let full = (per_profile as u64 * UNITS_PER_REPLICA) as f64;
    for n in 0..changes {
        let before = seen.lock().unwrap()[&key].0["capacityUnitsPerSecond"].clone();
        let t0 = Instant::now();
        *value.lock().unwrap() = if n % 2 == 0 { full - 70.0 } else { full };
        wait_for(
            "the ConfigMap reflecting Prometheus",
            Duration::from_secs(60),
            || seen.lock().unwrap()[&key].0["capacityUnitsPerSecond"] != before,
        )
        .await;
        let at = seen.lock().unwrap()[&key].1;
        prom_ms.push((at - t0).as_secs_f64() * 1000.0);
    }
    let (rss_end, hwm_end) = (mib(pid, "VmRSS"), mib(pid, "VmHWM"));
    println!(
        "reaction to a pod's readiness ({} changes): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        cluster_ms.len(),
        percentile(&mut cluster_ms, 50.0),
        percentile(&mut cluster_ms, 99.0),
        percentile(&mut cluster_ms, 100.0)
    );
    println!(
        "reaction to a Prometheus answer, interval 1 s ({} changes): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        prom_ms.len(),
        percentile(&mut prom_ms, 50.0),
        percentile(&mut prom_ms, 99.0),
        percentile(&mut prom_ms, 100.0)
    );
    println!("controller memory after the changes: VmRSS {rss_end:.1} MiB, VmHWM {hwm_end:.1} MiB");

    let _ = ctl.kill();
    let _ = ctl.wait();
    if std::env::var_os("LANEKEEPER_SCALE_KEEP").is_none() {
        for i in 0..NAMESPACES {
            let _ = Api::<Namespace>::all(client.clone())
                .delete(&ns_name(i), &DeleteParams::default())
                .await;
        }
        for n in 0..nodes {
            let _ = Api::<Node>::all(client.clone())
                .delete(&format!("lk-scale-gpu-{n}"), &DeleteParams::default())
                .await;
        }
    }
}
