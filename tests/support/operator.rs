//! Running the real controller against the API double: the INC-47 objects,
//! a pool Deployment, start/stop, and readers for what the controller wrote.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lanekeeper::controller::{self, Metrics, Readiness, Settings};
use lanekeeper::signals::SignalSource;
use prometheus::core::Collector;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::apiserver::ApiServer;

/// The example's namespace.
pub const NS: &str = "ai-platform";
/// lanekeeper's apiVersion.
pub const LK: &str = "lanekeeper.dev/v1alpha1";
/// How long a test waits for the controller to get somewhere.
pub const T: Duration = Duration::from_secs(20);
/// The example pool's workload.
pub const POOL: &str = "vllm-agent-assist";

/// The INC-47 example objects, as JSON.
pub fn inc47_objects() -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/inc-47/inc-47.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            let v: serde_yaml::Value = serde::Deserialize::deserialize(d).unwrap();
            serde_json::to_value(v).unwrap()
        })
        .collect()
}

/// The example's CapacityProfile under another name (a second profile).
pub fn example_profile_named(name: &str) -> Value {
    let mut p = inc47_objects()
        .into_iter()
        .find(|o| o["kind"] == "CapacityProfile")
        .expect("the example has a CapacityProfile");
    p["metadata"]["name"] = json!(name);
    p
}

/// A Deployment with `replicas` wanted and `ready` ready.
pub fn deployment(name: &str, replicas: i64, ready: i64) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "vllm", "image": "vllm"}]}}
        },
        "status": {"replicas": replicas, "readyReplicas": ready}
    })
}

/// A double with the lanekeeper CRDs installed.
pub async fn cluster() -> ApiServer {
    let s = ApiServer::start().await;
    s.install_lanekeeper_crds();
    s
}

/// The example pool (8 ready) and the INC-47 objects, optionally with a
/// shorter stable window.
pub fn apply_inc47(s: &ApiServer, stable_for: Option<i64>) {
    s.put_direct(deployment(POOL, 8, 8)).unwrap();
    for mut o in inc47_objects() {
        if let Some(sf) = stable_for
            && o["kind"] == "DegradationPolicy"
        {
            o["spec"]["hysteresis"]["stableForSeconds"] = json!(sf);
        }
        s.put_direct(o).unwrap();
    }
}

/// Sets the pool's ready replicas (capacity = ready × 70).
pub fn set_ready(s: &ApiServer, ready: i64) {
    s.merge_patch_direct(
        "apps/v1",
        "deployments",
        Some(NS),
        POOL,
        json!({"status": {"readyReplicas": ready}}),
        Some("status"),
    )
    .unwrap();
}

/// A running controller.
pub struct Running {
    /// Sends the shutdown signal.
    pub stop: Option<oneshot::Sender<()>>,
    /// The controller task.
    pub task: JoinHandle<Result<(), controller::Error>>,
    /// Its metrics.
    pub metrics: Metrics,
}

impl Running {
    /// Shuts down gracefully and checks it ran without error.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        tokio::time::timeout(Duration::from_secs(20), &mut self.task)
            .await
            .expect("controller stops on shutdown")
            .expect("task joins")
            .expect("controller ran without error");
    }

    /// API writes it made.
    pub fn writes(&self) -> u64 {
        self.metrics
            .api_writes
            .collect()
            .iter()
            .flat_map(|f| f.get_metric())
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }

    /// Whether it holds the lease.
    pub fn leader(&self) -> bool {
        self.metrics.leader.get() == 1
    }
}

/// Settings for tests: the example namespace, a 500 ms resync, a 3 s lease.
pub fn settings(leader: bool, identity: &str) -> Settings {
    Settings {
        namespaces: vec![NS.into()],
        resync: Duration::from_millis(500),
        leader_election: leader,
        lease_name: "lanekeeper".into(),
        lease_namespace: "lanekeeper-system".into(),
        lease_duration_seconds: 3,
        identity: identity.into(),
    }
}

/// Starts the controller (logs with `RUST_LOG`).
pub fn start(s: &ApiServer, settings: Settings) -> Running {
    start_with(s, settings, Vec::new())
}

/// Starts the controller with extra signal sources.
pub fn start_with(
    s: &ApiServer,
    settings: Settings,
    sources: Vec<Arc<dyn SignalSource>>,
) -> Running {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into()),
        )
        .with_test_writer()
        .try_init();
    let (tx, rx) = oneshot::channel();
    let metrics = Metrics::new();
    let client = s.client();
    let m = metrics.clone();
    let task = tokio::spawn(async move {
        let operator = controller::Operator {
            client,
            settings,
            metrics: m,
            readiness: Readiness::default(),
            extra_sources: sources,
        };
        operator
            .run(async move {
                let _ = rx.await;
            })
            .await
    });
    Running {
        stop: Some(tx),
        task,
        metrics,
    }
}

/// The gateway config in a ConfigMap, parsed.
pub fn lanes_json(s: &ApiServer, name: &str) -> Option<Value> {
    let cm = s.get_object("v1", "configmaps", Some(NS), name)?;
    serde_json::from_str(cm["data"]["lanes.json"].as_str()?).ok()
}

/// Events of a reason in the example namespace.
pub fn events(s: &ApiServer, reason: &str) -> Vec<Value> {
    let mut out = s.list_objects("events.k8s.io/v1", "events", Some(NS));
    out.retain(|e| e["reason"] == reason);
    out
}

/// How many times events of a reason were published (kube's recorder folds
/// repeats into one Event with a series count).
pub fn occurrences(s: &ApiServer, reason: &str) -> u64 {
    events(s, reason)
        .iter()
        .map(|e| e["series"]["count"].as_u64().unwrap_or(1))
        .sum()
}

/// The example profile's status.
pub fn profile_status(s: &ApiServer) -> Value {
    s.get_object(LK, "capacityprofiles", Some(NS), "agent-assist")
        .map(|o| o["status"].clone())
        .unwrap_or(Value::Null)
}
