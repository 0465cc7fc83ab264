//! Tokens as the cost on a real API server (issue 23): the controller
//! writes the contracts' cost and token limits, the pool's model slots and
//! long-context limit into `lanes.json`; a fake model's
//! `vllm:kv_cache_usage_perc`, scraped by a real Prometheus, fires the
//! `kvCacheUsageAbove` trigger whose level holds the long-context limit
//! lower; when the model's metrics go away the signal is Unknown and the
//! level is held.

use crate::support;
use crate::world;

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::cluster::{Controller, connect, eventually};
use world::*;

/// A fake model on loopback; killed on drop.
struct Model {
    child: Child,
    addr: String,
}

impl Model {
    fn start(kv: f64) -> Model {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lanekeeper-fake-model"))
            .args(["--listen", "127.0.0.1:0", "--kv-cache", &kv.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("starts the fake model");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split_whitespace()
            .find(|w| w.contains(':'))
            .expect("the model prints its address")
            .to_owned();
        Model { child, addr }
    }

    async fn set_kv(&self, v: f64) {
        let r = reqwest::Client::new()
            .put(format!("http://{}/control", self.addr))
            .body(json!({"kvCacheUsagePerc": v}).to_string())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The INC-47 objects of `w` with tokens: p1 priced by tokens with limits,
/// the pool's slots and long-context limit, a KV-cache trigger on level 2
/// (`shed`, which the example's demand does not reach by itself: INC-47 sits
/// at level 1 on utilization) that holds long contexts to 2 and shortens
/// answers.
fn with_tokens(w: &World) -> Vec<Value> {
    let ns = w.name();
    let query = "100 * avg(vllm:kv_cache_usage_perc)";
    let mut out = Vec::new();
    for mut o in inc47_objects(ns, &w.prom.url()) {
        match (o["kind"].as_str(), o["metadata"]["name"].as_str()) {
            (Some("CapacityProfile"), _) => {
                o["spec"]["concurrency"] = json!({"max": 256});
                o["spec"]["longContext"] = json!({"aboveInputTokens": 8000, "maxConcurrency": 6});
                o["spec"]["signals"]["prometheus"]["queries"]["kvCacheUsagePercent"] = json!(query);
            }
            (Some("LaneContract"), Some("p1-agent-assist")) => {
                o["spec"]["cost"] = json!({"perRequest": "0.5", "perInputToken": "0.0001", "perOutputToken": "0.002"});
                o["spec"]["tokens"] = json!({"maxInputTokens": 32000, "maxOutputTokens": 1024});
                o["spec"]["tenants"] = json!({"maxConcurrency": 4});
            }
            (Some("DegradationPolicy"), _) => {
                let l = &mut o["spec"]["levels"][1];
                l["enterWhen"]["kvCacheUsageAbove"] = json!(90);
                l["exitWhen"]["kvCacheUsageBelow"] = json!(70);
                l["actions"]["limitLongContext"] = json!(2);
                l["actions"]["capOutputTokens"] = json!([{"priorityAtLeast": 1, "tokens": 256}]);
            }
            _ => continue,
        }
        out.push(o);
    }
    out
}

fn lane<'a>(cfg: &'a Value, name: &str) -> &'a Value {
    cfg["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {cfg}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kv_cache_trigger_fires_from_the_models_metrics_and_tightens_long_context() {
    let test = "the_kv_cache_trigger_fires_from_the_models_metrics";
    let Some(c) = connect(test).await else {
        return;
    };
    let _shared = CLUSTER.read().await;
    let kc = controller_kubeconfig(&c).await;
    let model = Model::start(0.3);
    let Some(w) = World::scraping(&c, "kv-cache", 8, 0, None, &[&model.addr]).await else {
        return;
    };
    for o in with_tokens(&w) {
        c.apply(&o).await.unwrap();
    }
    let mut ctl = Controller::start(&kc, w.name(), "tokens", &["--leader-elect=false"]);

    // At 30 % the KV trigger does not hold: level 1 on utilization, the
    // new fields in lanes.json, the profile's own long-context limit.
    let cfg = eventually("lanes.json with the pool's token limits", T, || async {
        w.lanes_json()
            .await
            .filter(|c| c["level"] == 1 && c["longContext"].is_object())
    })
    .await;
    assert_eq!(cfg["longContext"]["maxConcurrency"], 6);
    assert_eq!(cfg["concurrency"], json!({"max": 256}));
    assert_eq!(cfg["longContext"]["aboveInputTokens"], 8000);
    let p1 = lane(&cfg, "p1-agent-assist");
    assert_eq!(
        p1["cost"],
        json!({"perRequest": 0.5, "perInputToken": 0.0001, "perOutputToken": 0.002})
    );
    assert_eq!(
        p1["tokens"],
        json!({"maxInputTokens": 32000, "maxOutputTokens": 1024})
    );
    assert_eq!(p1["tenants"]["maxConcurrency"], 4);
    assert!(lane(&cfg, "p0-disruption-assist")["cost"].is_null());

    // The model's KV cache fills: the trigger fires from its metric.
    model.set_kv(0.95).await;
    let cfg = eventually("level 2 on KV-cache pressure", T, || async {
        w.lanes_json().await.filter(|c| c["level"] == 2)
    })
    .await;
    assert_eq!(cfg["longContext"]["maxConcurrency"], 2, "limitLongContext");
    assert_eq!(
        lane(&cfg, "p1-agent-assist")["tokens"]["capOutputTokens"],
        256
    );
    let status = eventually("the policy says why", T, || async {
        let s = w.policy_status().await;
        s.to_string().contains("kvCacheUsageAbove").then_some(s)
    })
    .await;
    assert_eq!(status["level"], 2, "{status}");

    // The model's metrics go away: Unknown, reported, and the level held.
    drop(model);
    eventually("kvCacheUsagePercent Unknown in status", T, || async {
        let s = w.status().await;
        s["unknownSignals"]
            .to_string()
            .contains("kvCacheUsagePercent")
            .then_some(())
    })
    .await;
    for _ in 0..(2 * STABLE_FOR) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let cfg = w.lanes_json().await.unwrap();
        assert_eq!(cfg["level"], 2, "Unknown never relaxes");
        assert_eq!(cfg["longContext"]["maxConcurrency"], 2);
    }
    assert!(ctl.running(), "{}", ctl.log_text());
}
