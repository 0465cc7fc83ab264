//! The real controller with the Prometheus source, against the API double
//! and a real Prometheus scraping a tiny exporter: capacity loss in
//! Prometheus raises the level; a Prometheus outage turns TelemetryKnown
//! False with the level held.

mod prometheus_support;
mod support;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lanekeeper::controller::{self, Metrics, Readiness, Settings};
use lanekeeper::signals::SignalSource;
use lanekeeper::signals::prometheus::PrometheusSource;
use serde_json::{Value, json};
use support::apiserver::ApiServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NS: &str = "ai-platform";
const LK: &str = "lanekeeper.dev/v1alpha1";

fn inc47_objects() -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/inc-47/inc-47.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            let v: serde_yaml::Value = serde::Deserialize::deserialize(d).unwrap();
            serde_json::to_value(v).unwrap()
        })
        .collect()
}

/// A tiny exporter serving the pool's available capacity.
async fn exporter(value: Arc<Mutex<f64>>) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let v = *value.lock().unwrap();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let body = format!(
                    "# TYPE pool_available_units_per_second gauge\npool_available_units_per_second{{profile=\"agent-assist\"}} {v}\n"
                );
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

fn status(s: &ApiServer) -> Value {
    s.get_object(LK, "capacityprofiles", Some(NS), "agent-assist")
        .map(|o| o["status"].clone())
        .unwrap_or(Value::Null)
}

fn condition(st: &Value, t: &str) -> Option<String> {
    st["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
        .and_then(|c| c["status"].as_str().map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread")]
async fn capacity_loss_raises_the_level_and_an_outage_is_reported() {
    scenario(false).await;
}

/// A Prometheus outage makes the configured capacity signal Unknown, and with
/// it the capacity: no fallback to ready replicas (which in an incident like
/// INC-47 are all ready while the provider is degraded). `TelemetryKnown`
/// turns False and the level is held.
#[tokio::test(flavor = "multi_thread")]
async fn an_outage_turns_telemetry_unknown_and_holds_the_level() {
    scenario(true).await;
}

async fn scenario(check_hold: bool) {
    let value = Arc::new(Mutex::new(560.0));
    let target = exporter(value.clone()).await;
    let Some(mut prom) = prometheus_support::Prom::start_scraping("telemetry_controller", &target)
    else {
        return;
    };
    // Wait for the first scrape, so the controller never starts on missing
    // telemetry (which the policy answers with a level of its own).
    let client = lanekeeper::signals::prometheus::PromClient::new(
        &prom.url(),
        Duration::from_secs(2),
        None,
        None,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let got = client
            .raw(
                "pool_available_units_per_second",
                &lanekeeper::signals::prometheus::Window::At(now),
            )
            .await;
        if got.is_ok_and(|r| r.values().any(|v| !v.is_empty())) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "exporter never scraped"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let s = ApiServer::start().await;
    s.install_lanekeeper_crds();
    // A workload without status.readyReplicas and no pods: Prometheus is the
    // only capacity evidence.
    s.put_direct(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "vllm-agent-assist", "namespace": NS},
        "spec": {"replicas": 8, "selector": {"matchLabels": {"app": "vllm-agent-assist"}},
                 "template": {"metadata": {"labels": {"app": "vllm-agent-assist"}}, "spec": {"containers": [{"name": "vllm", "image": "vllm"}]}}},
        "status": {"replicas": 8}
    }))
    .unwrap();
    for mut o in inc47_objects() {
        if o["kind"] == "CapacityProfile" {
            o["spec"]["signals"] = json!({"prometheus": {
                "url": prom.url(), "timeoutSeconds": 1, "stalenessSeconds": 30,
                "queries": {"availableUnitsPerSecond": "pool_available_units_per_second{profile=\"agent-assist\"}"}
            }});
        }
        s.put_direct(o).unwrap();
    }

    let metrics = Metrics::new();
    let sources: Vec<Arc<dyn SignalSource>> = vec![Arc::new(PrometheusSource::new(
        Some(s.client()),
        Some(metrics.clone()),
    ))];
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let client = s.client();
    let m = metrics.clone();
    let task = tokio::spawn(async move {
        controller::run(
            client,
            Settings {
                namespaces: vec![NS.into()],
                resync: Duration::from_millis(500),
                leader_election: false,
                lease_name: "lanekeeper".into(),
                lease_namespace: "lanekeeper-system".into(),
                lease_duration_seconds: 3,
                identity: "test".into(),
            },
            m,
            Readiness::default(),
            sources,
            async move {
                let _ = rx.await;
            },
        )
        .await
    });
    let t = Duration::from_secs(20);

    // 560 from Prometheus: level 1 (utilization 87.2 %), capacity known.
    assert!(
        s.wait_until(t, |s| {
            let st = status(s);
            st["level"] == 1 && st["capacityUnitsPerSecond"] == 560.0
        })
        .await,
        "{}",
        status(&s)
    );
    assert_eq!(
        condition(&status(&s), "TelemetryKnown").as_deref(),
        Some("True")
    );

    // Capacity loss in Prometheus: 420 → level 2.
    *value.lock().unwrap() = 420.0;
    assert!(
        s.wait_until(t, |s| {
            let st = status(s);
            st["level"] == 2 && st["capacityUnitsPerSecond"] == 420.0
        })
        .await,
        "{}",
        status(&s)
    );

    // Prometheus outage: the signal is Unknown with the reason, and counted.
    prom.stop();
    assert!(
        s.wait_until(t, |s| {
            status(s)["unknownSignals"]["availableUnitsPerSecond"]
                .as_str()
                .is_some_and(|r| r.starts_with("unreachable"))
        })
        .await,
        "{}",
        status(&s)
    );
    if check_hold {
        assert!(
            s.wait_until(t, |s| condition(&status(s), "TelemetryKnown").as_deref()
                == Some("False"))
                .await,
            "{}",
            status(&s)
        );
        assert_eq!(status(&s)["level"], 2, "{}", status(&s));
    }
    let text = metrics.render();
    assert!(text.contains("lanekeeper_signal_errors_total{profile=\"ai-platform/agent-assist\",reason=\"unreachable\",signal=\"availableUnitsPerSecond\"}"), "{text}");
    if check_hold {
        // Still held a few resyncs later.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(status(&s)["level"], 2);
    }

    let _ = tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
}
