//! The INC-47 world on a real cluster, shared by the e2e test files
//! (declared once in `tests/e2e/main.rs`, next to `support` and
//! `prometheus_support`): a namespace of its own with the INC-47
//! objects, a vLLM-shaped pool Deployment on the kwok GPU nodes, a real
//! Prometheus scraping a small exporter the test drives, and readers for
//! what the controller wrote.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Mutex as AsyncMutex, RwLock};

use crate::prometheus_support::Prom;
use crate::support::cluster::{self, Cluster, LK, RELEASE, RELEASE_NS, eventually, repo};

pub const PROFILE: &str = "agent-assist";
pub const POOL: &str = "vllm-agent-assist";
pub const CONFIG: &str = "agent-assist-lanes";
pub const DRAIN_LABEL: &str = "lanekeeper.dev/drain";
pub const SERVING: &str = "lanekeeper.dev/serving";
/// The controller's identity on the server.
pub const CONTROLLER_USER: &str = "system:serviceaccount:lanekeeper-system:lanekeeper";
/// The stable window of the e2e policy (the example's 300 s, shortened).
pub const STABLE_FOR: i64 = 8;
/// How long a step of a scenario may take.
pub const T: Duration = Duration::from_secs(90);

/// GPU pods: one test at a time on the two GPU nodes.
pub static GPU: AsyncMutex<()> = AsyncMutex::const_new(());
/// Held shared by every test, alone by the restart test and the RBAC test.
pub static CLUSTER: RwLock<()> = RwLock::const_new(());

// ---- the INC-47 world, in a namespace of its own ---------------------------

/// The INC-47 objects in `ns`, with a short stable window and drain health
/// window, reading the conventional recording rules from `prom`.
pub fn inc47_objects(ns: &str, prom: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join("examples/inc-47/inc-47.yaml")).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            let y: serde_yaml::Value = serde::Deserialize::deserialize(d).unwrap();
            let mut v = serde_json::to_value(y).unwrap();
            v["metadata"]["namespace"] = json!(ns);
            if v["kind"] == "DegradationPolicy" {
                v["spec"]["hysteresis"]["stableForSeconds"] = json!(STABLE_FOR);
                // Test time: the example's cool-down and five-minute ramp
                // stages would outlast every wait (the rules themselves are
                // tested in tests/it/engine_evidence.rs).
                v["spec"]["hysteresis"]["cooldownFactor"] = json!("0");
                v["spec"]["hysteresis"]["recovery"] = json!({"stepsPercent": [1, 10], "stepSeconds": 1});
            }
            if v["kind"] == "CapacityProfile" {
                v["spec"]["drain"]["healthyForSeconds"] = json!(5);
                v["spec"]["signals"] = json!({"prometheus": {
                    "url": prom, "timeoutSeconds": 2, "stalenessSeconds": 30, "intervalSeconds": 1,
                    "laneLabel": "lane", "podLabel": "pod",
                    "queries": {
                        "availableUnitsPerSecond": format!("pool:available_units_per_second{{namespace=\"{ns}\",profile=\"{PROFILE}\"}}"),
                        "laneRequestsPerSecond": format!("lane:requests_per_second{{namespace=\"{ns}\"}}"),
                        "podErrorRatio": format!("pod:error_ratio{{namespace=\"{ns}\"}}")
                    }
                }});
            }
            v
        })
        .collect()
}

/// The example's capacity at t=0 and during the incident (t=180), from
/// examples/inc-47/signals.yaml.
pub fn inc47_capacities() -> (f64, f64) {
    let text = std::fs::read_to_string(repo().join("examples/inc-47/signals.yaml")).unwrap();
    let file: lanekeeper::snapshot::SignalsFile = serde_yaml::from_str(&text).unwrap();
    let at = |t: i64| {
        file.steps
            .iter()
            .find(|s| s.at == t)
            .and_then(|s| s.profiles["ai-platform/agent-assist"].available_units_per_second)
            .unwrap()
    };
    (at(0), at(180))
}

/// A vLLM-shaped pool Deployment: GPU requests, the serving readiness gate,
/// the GPU toleration. The image is never pulled on kwok nodes; on kind the
/// pause image runs.
pub fn pool_deployment(ns: &str, replicas: i32, gpus: u32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": POOL, "namespace": ns, "labels": {"app": POOL}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": POOL}},
            "template": {
                "metadata": {"labels": {"app": POOL}},
                "spec": {
                    "readinessGates": [{"conditionType": SERVING}],
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "vllm",
                        "image": "registry.k8s.io/pause:3.10",
                        "args": ["--model=/models/agent-large", "--port=8000", "--max-num-seqs=256"],
                        "ports": [{"name": "http", "containerPort": 8000}],
                        // Small CPU and memory requests: tests run side by
                        // side on the same nodes, and only the GPUs should
                        // run out.
                        "resources": {
                            "requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": gpus.to_string()},
                            "limits": {"memory": "4Gi", "nvidia.com/gpu": gpus.to_string()}
                        }
                    }]
                }
            }
        }
    })
}

/// A real HorizontalPodAutoscaler on the pool Deployment of `ns` (2..12
/// replicas on CPU).
pub fn pool_hpa(ns: &str) -> Value {
    json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "vllm", "namespace": ns},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": POOL},
                 "minReplicas": 2, "maxReplicas": 12,
                 "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]}
    })
}

/// A Deployment holding `gpus` GPUs on one GPU node, so the pool has exactly
/// the room a scenario wants.
pub fn gpu_blocker(ns: &str, gpus: u32) -> Value {
    let mut d = pool_deployment(ns, 1, gpus);
    d["metadata"]["name"] = json!("gpu-blocker");
    d["metadata"]["labels"] = json!({"app": "gpu-blocker"});
    d["spec"]["selector"] = json!({"matchLabels": {"app": "gpu-blocker"}});
    d["spec"]["template"]["metadata"]["labels"] = json!({"app": "gpu-blocker"});
    d["spec"]["template"]["spec"]
        .as_object_mut()
        .unwrap()
        .remove("readinessGates");
    d
}

/// What the exporter serves: the INC-47 recording rules of one namespace.
#[derive(Default)]
pub struct Telemetry {
    pub ns: String,
    pub available: f64,
    /// lane name → requests/s.
    pub lanes: BTreeMap<String, f64>,
    /// pod name → error ratio (pods not listed: 0.01, as in the example).
    pub errors: BTreeMap<String, f64>,
    /// The pool's pods, refreshed by the test.
    pub pods: Vec<String>,
    /// lane name → error budget remaining in percent (lanes not listed: no
    /// series), as `lane:error_budget_remaining_percent`.
    pub budgets: BTreeMap<String, f64>,
    /// lane name → P95 work units a request cost (lanes not listed: no
    /// series), as `lane:p95_cost_units_per_request`.
    pub costs: BTreeMap<String, f64>,
}

impl Telemetry {
    fn render(&self) -> String {
        let ns = &self.ns;
        let mut out = String::from("# TYPE pool:available_units_per_second gauge\n");
        out += &format!(
            "pool:available_units_per_second{{namespace=\"{ns}\",profile=\"{PROFILE}\"}} {}\n",
            self.available
        );
        out += "# TYPE lane:requests_per_second gauge\n";
        for (lane, rps) in &self.lanes {
            out +=
                &format!("lane:requests_per_second{{namespace=\"{ns}\",lane=\"{lane}\"}} {rps}\n");
        }
        out += "# TYPE pod:error_ratio gauge\n";
        for pod in &self.pods {
            let e = self.errors.get(pod).copied().unwrap_or(0.01);
            out += &format!("pod:error_ratio{{namespace=\"{ns}\",pod=\"{pod}\"}} {e}\n");
        }
        out += "# TYPE lane:error_budget_remaining_percent gauge\n";
        for (lane, left) in &self.budgets {
            out += &format!(
                "lane:error_budget_remaining_percent{{namespace=\"{ns}\",lane=\"{lane}\"}} {left}\n"
            );
        }
        out += "# TYPE lane:p95_cost_units_per_request gauge\n";
        for (lane, cost) in &self.costs {
            out += &format!(
                "lane:p95_cost_units_per_request{{namespace=\"{ns}\",lane=\"{lane}\"}} {cost}\n"
            );
        }
        out
    }
}

/// Serves `telemetry` on a loopback port; returns `host:port`.
pub async fn exporter(telemetry: Arc<Mutex<Telemetry>>) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let body = telemetry.lock().unwrap().render();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// A namespace with the INC-47 world: Prometheus scraping the exporter,
/// the pool Deployment, the three kinds of objects. The controller is not
/// started.
pub struct World {
    pub ns: cluster::TestNamespace,
    pub telemetry: Arc<Mutex<Telemetry>>,
    pub prom: Prom,
    pub client: Client,
}

impl World {
    /// `blocker`: GPUs to take on one GPU node before the pool is created.
    pub async fn new(
        c: &Cluster,
        test: &str,
        replicas: i32,
        gpus: u32,
        blocker: Option<u32>,
    ) -> Option<World> {
        Self::scraping(c, test, replicas, gpus, blocker, &[]).await
    }

    /// [`World::new`] with Prometheus scraping `extra` targets (`host:port`)
    /// next to the exporter, e.g. a fake model's vLLM metrics.
    pub async fn scraping(
        c: &Cluster,
        test: &str,
        replicas: i32,
        gpus: u32,
        blocker: Option<u32>,
        extra: &[&str],
    ) -> Option<World> {
        let ns = c.namespace(test).await;
        let (normal, _) = inc47_capacities();
        let mut lanes = BTreeMap::new();
        for o in inc47_objects(&ns.name, "") {
            if o["kind"] == "LaneContract" {
                let rps: f64 = o["spec"]["expectedRequestsPerSecond"]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                lanes.insert(o["metadata"]["name"].as_str().unwrap().to_owned(), rps);
            }
        }
        let telemetry = Arc::new(Mutex::new(Telemetry {
            ns: ns.name.clone(),
            available: normal,
            lanes,
            ..Default::default()
        }));
        let target = exporter(telemetry.clone()).await;
        let targets: Vec<&str> = std::iter::once(target.as_str())
            .chain(extra.iter().copied())
            .collect();
        let prom = Prom::start_scraping_all(test, &targets)?;
        let w = World {
            ns,
            telemetry,
            prom,
            client: c.client.clone(),
        };
        if let Some(g) = blocker {
            // Placed before the pool, so it finds a node with room.
            c.apply(&gpu_blocker(&w.ns.name, g)).await.unwrap();
            let api = Api::<Pod>::namespaced(c.client.clone(), &w.ns.name);
            eventually("the GPU blocker Running", T, || {
                let api = api.clone();
                async move {
                    let pods = api
                        .list(&ListParams::default().labels("app=gpu-blocker"))
                        .await
                        .ok()?;
                    pods.items.iter().any(running).then_some(())
                }
            })
            .await;
        }
        c.apply(&pool_deployment(&w.ns.name, replicas, gpus))
            .await
            .unwrap();
        for o in inc47_objects(&w.ns.name, &w.prom.url()) {
            c.apply(&o)
                .await
                .unwrap_or_else(|e| panic!("apply {}: {e}", o["kind"]));
        }
        // Prometheus has the exporter's first sample, a whole second old,
        // before the test goes on, so the controller never starts on
        // missing telemetry (answered with a level of its own).
        w.until_scraped().await;
        // The pool's pod names feed the per-pod error series.
        let (t, client, ns) = (w.telemetry.clone(), w.client.clone(), w.ns.name.clone());
        tokio::spawn(async move {
            loop {
                let pods = pool_pods(&client, &ns).await;
                t.lock().unwrap().pods = pods.iter().map(|p| p.name_any()).collect();
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        Some(w)
    }

    pub fn name(&self) -> &str {
        &self.ns.name
    }

    pub fn set(&self, f: impl FnOnce(&mut Telemetry)) {
        f(&mut self.telemetry.lock().unwrap());
    }

    /// Waits until Prometheus answers the capacity the exporter serves now
    /// (and that sample is a whole second old), so the controller's next
    /// evaluation sees it.
    pub async fn until_scraped(&self) {
        let want = self.telemetry.lock().unwrap().available;
        let query = format!(
            "{}/api/v1/query?query=pool:available_units_per_second",
            self.prom.url()
        );
        eventually("Prometheus has the exporter's capacity", T, || {
            let query = query.clone();
            async move {
                let v: Value = reqwest::get(&query).await.ok()?.json().await.ok()?;
                let got: f64 = v["data"]["result"][0]["value"][1].as_str()?.parse().ok()?;
                ((got - want).abs() < 1e-9).then_some(())
            }
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }

    pub async fn lanes_json(&self) -> Option<Value> {
        let cm = Api::<ConfigMap>::namespaced(self.client.clone(), self.name())
            .get_opt(CONFIG)
            .await
            .ok()??;
        serde_json::from_str(cm.data?.get("lanes.json")?).ok()
    }

    pub async fn status(&self) -> Value {
        let api = cluster::dynamic(
            &self.client,
            &json!({"apiVersion": LK, "kind": "CapacityProfile", "metadata": {"namespace": self.name()}}),
        );
        api.get_opt(PROFILE)
            .await
            .ok()
            .flatten()
            .map(|o| o.data["status"].clone())
            .unwrap_or(Value::Null)
    }

    /// The DegradationPolicy's status (Null before it has one).
    pub async fn policy_status(&self) -> Value {
        let api = cluster::dynamic(
            &self.client,
            &json!({"apiVersion": LK, "kind": "DegradationPolicy", "metadata": {"namespace": self.name()}}),
        );
        api.get_opt("agent-assist-ladder")
            .await
            .ok()
            .flatten()
            .map(|o| o.data["status"].clone())
            .unwrap_or(Value::Null)
    }

    /// Events of a reason in the world's namespace, each with how many times
    /// it was published (the recorder folds repeats into a series).
    pub async fn events(&self, reason: &str) -> Vec<(Value, u64)> {
        let probe = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"namespace": self.name()}});
        cluster::dynamic(&self.client, &probe)
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .filter(|e| e["reason"] == reason)
            .map(|e| {
                let n = e["series"]["count"].as_u64().unwrap_or(1);
                (e, n)
            })
            .collect()
    }

    /// Names of the drained pods of the pool, sorted.
    pub async fn drained_pods(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .pods()
            .await
            .iter()
            .filter(|p| drained(p))
            .map(|p| p.name_any())
            .collect();
        v.sort();
        v
    }

    pub async fn pods(&self) -> Vec<Pod> {
        pool_pods(&self.client, self.name()).await
    }

    pub async fn deployment(&self) -> Deployment {
        Api::<Deployment>::namespaced(self.client.clone(), self.name())
            .get(POOL)
            .await
            .unwrap()
    }
}

pub async fn pool_pods(client: &Client, ns: &str) -> Vec<Pod> {
    let mut pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("app={POOL}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    pods.retain(|p| p.metadata.deletion_timestamp.is_none());
    pods.sort_by_key(|p| p.name_any());
    pods
}

pub fn drained(p: &Pod) -> bool {
    p.labels().get(DRAIN_LABEL).is_some_and(|v| v == "true")
}

pub fn pod_condition(p: &Pod, t: &str) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| c.status.clone())
}

pub fn running(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|ph| ph == "Running")
}

pub fn condition(status: &Value, t: &str) -> Option<(String, String, String)> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["reason"].as_str().unwrap_or_default().to_owned(),
                c["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

pub fn lane<'a>(cfg: &'a Value, name: &str) -> &'a Value {
    cfg["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("{name} missing from {cfg}"))
}

pub fn close(v: &Value, want: f64) -> bool {
    v.as_f64().is_some_and(|x| (x - want).abs() < 1e-6)
}

/// The level-2 INC-47 config: P4 paused, P3 capped at 60, 400.1 admitted.
pub fn is_inc47_level2(cfg: &Value) -> bool {
    let admitted: f64 = cfg["lanes"]
        .as_array()
        .map(|ls| {
            ls.iter()
                .filter_map(|l| l["admittedUnitsPerSecond"].as_f64())
                .sum()
        })
        .unwrap_or(0.0);
    cfg["level"] == 2 && (admitted - 400.1).abs() < 1e-6
}

/// A kubeconfig with the chart ServiceAccount's token (installing the chart
/// release the first time).
pub async fn controller_kubeconfig(c: &Cluster) -> std::path::PathBuf {
    c.operator_release();
    c.service_account_kubeconfig(RELEASE_NS, RELEASE).await
}

/// Every access the controller made on the real server, from the audit log,
/// as (apiGroup, resource[/subresource], verb), and the ones refused.
pub fn audited_accesses(
    c: &Cluster,
    ns: &str,
) -> (BTreeSet<(String, String, String)>, Vec<String>) {
    let mut seen = BTreeSet::new();
    let mut refused = Vec::new();
    for e in c.audit(CONTROLLER_USER) {
        let o = &e["objectRef"];
        // The test's namespace, and cluster-scoped reads (the CRDs). The
        // release namespace is left out: the RBAC test makes refused calls
        // there on purpose.
        let in_scope = o["namespace"] == ns || o["namespace"].is_null();
        if !in_scope || o.is_null() {
            continue;
        }
        let resource = match o["subresource"].as_str() {
            Some(s) => format!("{}/{s}", o["resource"].as_str().unwrap_or_default()),
            None => o["resource"].as_str().unwrap_or_default().to_owned(),
        };
        let access = (
            o["apiGroup"].as_str().unwrap_or_default().to_owned(),
            resource,
            e["verb"].as_str().unwrap_or_default().to_owned(),
        );
        if e["responseStatus"]["code"] == 403 {
            refused.push(format!("{access:?}: {}", e["responseStatus"]["message"]));
        }
        // A server-side apply that creates its object is logged as a patch
        // and authorized as patch and create.
        if access.2 == "patch" && e["responseStatus"]["code"] == 201 {
            seen.insert((access.0.clone(), access.1.clone(), "create".to_owned()));
        }
        seen.insert(access);
    }
    (seen, refused)
}

/// The (apiGroup, resource, verb) rules the chart grants, from
/// manifests/install.yaml (the chart rendered with default values).
pub fn chart_rules() -> BTreeSet<(String, String, String)> {
    let text = std::fs::read_to_string(repo().join("manifests/install.yaml")).unwrap();
    let mut out = BTreeSet::new();
    for d in serde_yaml::Deserializer::from_str(&text) {
        let v: serde_yaml::Value = serde::Deserialize::deserialize(d).unwrap();
        let v = serde_json::to_value(v).unwrap();
        if v["kind"] != "ClusterRole" && v["kind"] != "Role" {
            continue;
        }
        for r in v["rules"].as_array().into_iter().flatten() {
            for g in r["apiGroups"].as_array().into_iter().flatten() {
                for res in r["resources"].as_array().into_iter().flatten() {
                    for verb in r["verbs"].as_array().into_iter().flatten() {
                        out.insert((
                            g.as_str().unwrap().to_owned(),
                            res.as_str().unwrap().to_owned(),
                            verb.as_str().unwrap().to_owned(),
                        ));
                    }
                }
            }
        }
    }
    out
}
