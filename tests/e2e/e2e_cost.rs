//! The cost calibration on a real API server (issue 23 item 6): P2 priced
//! by tokens, a real Prometheus serving its P95 cost per request
//! (`laneP95CostUnitsPerRequest`), the controller running with the chart's
//! RBAC. The server keeps the new status fields (the CRD's schema has
//! them), `CostCalibrated` follows the measurement (True at exactly 20 %
//! above `workUnitsPerRequest` 0.70, False above), and the Warning event
//! `CostUnderestimated` is on the LaneContract.

use crate::support;
use crate::world;

use kube::ResourceExt;
use serde_json::{Value, json};
use support::cluster::{Cluster, Controller, connect, dynamic, eventually};
use world::*;

const P2: &str = "p2-email-extract";

/// The world with P2 priced and the profile reading its P95 cost from
/// Prometheus, at `cost` work units a request.
async fn cost_world(c: &Cluster, cost: f64) -> Option<World> {
    let w = World::new(c, "cost", 8, 0, None).await?;
    w.set(|t| {
        t.costs.insert(P2.into(), cost);
    });
    let ns = w.name().to_owned();
    for mut o in inc47_objects(&ns, &w.prom.url()) {
        if o["kind"] == "LaneContract" && o["metadata"]["name"] == P2 {
            o["spec"]["cost"] = json!({"perRequest": "0.1", "perOutputToken": "0.004"});
        } else if o["kind"] == "CapacityProfile" {
            o["spec"]["signals"]["prometheus"]["queries"]["laneP95CostUnitsPerRequest"] = json!(
                format!("lane:p95_cost_units_per_request{{namespace=\"{ns}\"}}")
            );
        } else {
            continue;
        }
        c.apply(&o).await.unwrap();
    }
    Some(w)
}

async fn lane_status(w: &World) -> Value {
    let probe = json!({"apiVersion": support::cluster::LK, "kind": "LaneContract", "metadata": {"namespace": w.name()}});
    dynamic(&w.client, &probe)
        .get_opt(P2)
        .await
        .ok()
        .flatten()
        .map(|o| o.data["status"].clone())
        .unwrap_or(Value::Null)
}

/// Waits until P2's `CostCalibrated` has `status` and its status shows the
/// P95 cost `cost`.
async fn until_cost(w: &World, status: &str, cost: f64) -> Value {
    eventually("P2's CostCalibrated and P95 cost", T, || async {
        let st = lane_status(w).await;
        let c = st["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "CostCalibrated")?
            .clone();
        (c["status"] == status && st["p95CostUnitsPerRequest"].as_f64() == Some(cost)).then_some(st)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_underestimated_cost_shows_in_the_lanes_status_and_events() {
    let test = "an_underestimated_cost_shows_in_the_lanes_status_and_events";
    let Some(c) = connect(test).await else {
        return;
    };
    let _shared = CLUSTER.read().await;
    let kc = controller_kubeconfig(&c).await;
    let Some(w) = cost_world(&c, 0.84).await else {
        return;
    };
    let _ctl = Controller::start(&kc, w.name(), "cost", &["--leader-elect=false"]);
    let st = until_cost(&w, "True", 0.84).await;
    assert!(w.events("CostUnderestimated").await.is_empty(), "{st:#}");
    w.set(|t| {
        t.costs.insert(P2.into(), 0.85);
    });
    let st = until_cost(&w, "False", 0.85).await;
    let reason = st["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "CostCalibrated")
        .unwrap()["reason"]
        .clone();
    assert_eq!(reason, "CostUnderestimated");
    let warned = eventually("a CostUnderestimated event", T, || async {
        let e = w.events("CostUnderestimated").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    let (e, _) = &warned[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["regarding"]["kind"], "LaneContract");
    assert_eq!(e["regarding"]["name"], P2);
    // The other lanes have no cost and no measurement: not judged.
    let probe = json!({"apiVersion": support::cluster::LK, "kind": "LaneContract", "metadata": {"namespace": w.name()}});
    let lanes = dynamic(&w.client, &probe)
        .list(&Default::default())
        .await
        .unwrap();
    for l in lanes.items.iter().filter(|l| l.name_any() != P2) {
        let conds = l.data["status"]["conditions"].to_string();
        assert!(
            !conds.contains("CostCalibrated"),
            "{}: {conds}",
            l.name_any()
        );
    }
}
