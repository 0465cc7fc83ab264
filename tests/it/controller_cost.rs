//! The cost calibration through the API double with the real controller: a
//! lane with a `cost` shows the P95 tokens and cost per request its signals
//! measure in its status; `CostCalibrated` is Unknown without a measured
//! cost, True up to 20 % above `workUnitsPerRequest` (0.70 for P2), False
//! above, with a Warning event `CostUnderestimated` on the LaneContract
//! (once), and a Normal `CostCalibrated` when it is covered again. The
//! measurements come from a test signal source plugged into the
//! controller's signals trait (the Prometheus source fills the same fields
//! in production).

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use lanekeeper::controller::Settings;
use lanekeeper::signals::{SignalSource, SourceInput, SourceOutput};
use lanekeeper::snapshot::LaneSignals;
use serde_json::{Value, json};
use support::apiserver::ApiServer;
use support::operator::*;

const LANE: &str = "p2-email-extract";

/// The lane's measured P95s, set by the test.
#[derive(Clone, Default)]
struct Measured(Arc<Mutex<LaneSignals>>);

impl Measured {
    fn set(&self, cost: Option<f64>) {
        let mut l = self.0.lock().unwrap();
        l.p95_input_tokens = cost.map(|_| 1800.0);
        l.p95_output_tokens = cost.map(|_| 120.0);
        l.p95_cost_units_per_request = cost;
    }
}

impl SignalSource for Measured {
    fn collect<'a>(&'a self, _input: &'a SourceInput<'a>) -> BoxFuture<'a, SourceOutput> {
        let lane = self.0.lock().unwrap().clone();
        Box::pin(async move {
            let mut out = SourceOutput::default();
            out.lanes.insert(format!("{NS}/{LANE}"), lane);
            out
        })
    }
}

fn lane_status(s: &ApiServer) -> Value {
    s.get_object(LK, "lanecontracts", Some(NS), LANE)
        .map(|o| o["status"].clone())
        .unwrap_or(Value::Null)
}

fn cost_condition(s: &ApiServer) -> Option<(String, String)> {
    let st = lane_status(s);
    let c = st["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "CostCalibrated")?
        .clone();
    Some((
        c["status"].as_str()?.to_owned(),
        c["reason"].as_str()?.to_owned(),
    ))
}

async fn until_condition(s: &ApiServer, status: &str, reason: &str) {
    assert!(
        s.wait_until(T, |s| cost_condition(s)
            == Some((status.to_owned(), reason.to_owned())))
            .await,
        "CostCalibrated never {status}/{reason}: {:#}",
        lane_status(s)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lane_whose_cost_is_underestimated_by_more_than_20_percent_is_warned_once() {
    let s = cluster().await;
    apply_inc47(&s, None);
    let mut p2 = s.get_object(LK, "lanecontracts", Some(NS), LANE).unwrap();
    p2["spec"]["cost"] =
        json!({"perRequest": "0.1", "perInputToken": "0.0002", "perOutputToken": "0.002"});
    s.put_direct(p2).unwrap();
    let measured = Measured::default();
    let source: Arc<dyn SignalSource> = Arc::new(measured.clone());
    let settings = Settings {
        resync: Duration::from_millis(300),
        ..settings(false, "a")
    };
    let c = start_with(&s, settings, vec![source]);

    // Nothing measured: Unknown, no figures, no warning.
    until_condition(&s, "Unknown", "CostUnknown").await;
    assert!(lane_status(&s).get("p95CostUnitsPerRequest").is_none());
    // Exactly 20 % above 0.70: covered.
    measured.set(Some(0.84));
    until_condition(&s, "True", "WithinTolerance").await;
    let st = lane_status(&s);
    assert_eq!(st["p95CostUnitsPerRequest"], json!(0.84));
    assert_eq!(st["p95InputTokens"], json!(1800.0));
    assert_eq!(st["p95OutputTokens"], json!(120.0));
    assert!(events(&s, "CostUnderestimated").is_empty());
    // Above: False, and one Warning event on the lane.
    measured.set(Some(0.85));
    until_condition(&s, "False", "CostUnderestimated").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let warned = events(&s, "CostUnderestimated");
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert_eq!(warned[0]["type"], "Warning");
    assert_eq!(warned[0]["regarding"]["kind"], "LaneContract");
    assert_eq!(warned[0]["regarding"]["name"], LANE);
    assert!(
        warned[0]["note"].as_str().unwrap().contains("0.85"),
        "{warned:#?}"
    );
    assert_eq!(occurrences(&s, "CostUnderestimated"), 1, "{warned:#?}");
    // Covered again: a Normal event.
    measured.set(Some(0.7));
    until_condition(&s, "True", "WithinTolerance").await;
    assert!(
        s.wait_until(T, |s| !events(s, "CostCalibrated").is_empty())
            .await
    );
    assert_eq!(events(&s, "CostCalibrated")[0]["type"], "Normal");
    // The measurement goes away: Unknown, not a pass, not a warning.
    measured.set(None);
    until_condition(&s, "Unknown", "CostUnknown").await;
    assert!(lane_status(&s).get("p95CostUnitsPerRequest").is_none());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(occurrences(&s, "CostUnderestimated"), 1);
    c.stop().await;
}
