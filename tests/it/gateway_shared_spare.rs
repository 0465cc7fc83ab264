//! The pool's spare capacity shared by three `lanekeeper gateway` replicas
//! through a real `redis-server`: a lane that may use spare capacity, with
//! all its traffic on one replica, gets its own rate plus the fleet's whole
//! spare (not a third of it); with the store stopped it falls back to the
//! replica's local 1/N share, without a 5xx.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fleet_store_redis::Server;
use crate::gateway::{inc47, lane_mut, model};
use crate::gateway_shared::{Answers, fleet, load_to, tally, wait_mode};

/// The lane that may use spare: 10 req/s of its own, one unit a request.
pub(crate) const LANE: &str = "p2-email-extract";
pub(crate) const RATE: f64 = 10.0;
/// The pool's capacity: 95 % of it less the lane's 10 is spare, 85 units
/// (requests) a second for the fleet.
pub(crate) const CAPACITY: f64 = 100.0;
const SPARE: f64 = CAPACITY * 0.95 - RATE;
/// The load offered, all to one replica: more than the lane and spare.
const OFFERED: f64 = 150.0;

/// Only the spare lane admitted (the others paused, claiming nothing), at
/// `RATE` of its own with no queue, drawing on spare capacity.
pub(crate) fn config() -> Value {
    let mut cfg = inc47();
    cfg["capacityUnitsPerSecond"] = json!(CAPACITY);
    cfg["inFlight"] = Value::Null;
    for l in cfg["lanes"].as_array_mut().unwrap() {
        if l["name"] != LANE {
            l["state"] = json!("Paused");
        }
    }
    let p2 = lane_mut(&mut cfg, LANE);
    p2["admittedRequestsPerSecond"] = json!(RATE);
    p2["admittedUnitsPerSecond"] = json!(RATE);
    p2["workUnitsPerRequest"] = json!(1.0);
    p2["burst"] = json!(2);
    p2["queue"]["maxDepth"] = json!(0);
    p2["floorUnitsPerSecond"] = Value::Null;
    p2["spareCapacity"] = json!(true);
    cfg
}

/// Sends `rate` req/s of `lane` to `target` for `secs`; every answer noted
/// against `t0`.
pub(crate) async fn load(
    c: &reqwest::Client,
    target: &str,
    lane: &'static str,
    rate: f64,
    secs: f64,
    t0: Instant,
    out: &Answers,
) {
    let targets = [target.to_owned()];
    load_to(c, &targets, |_| 0, (lane, rate), secs, t0, out).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_gets_the_fleets_whole_spare_and_falls_back_to_its_share() {
    let test = "one_replica_gets_the_fleets_whole_spare_and_falls_back_to_its_share";
    let Some(mut store) = Server::start(test) else {
        return;
    };
    let m = model(&["--service-millis", "0"]);
    let (gws, c, _cfg) = fleet(test, &config(), &m, &store).await;
    let out: Answers = Arc::default();
    let t0 = Instant::now();

    // 1. All the lane's traffic on replica 0 for 12 s; measured over the
    // last 10 (the buckets full at the start drained in the first two).
    load(&c, &gws[0].addr, LANE, OFFERED, 12.0, t0, &out).await;
    let (ok, refused, other) = tally(&out, 2.0, 12.0);
    let due = (RATE + SPARE) * 10.0;
    let third = due / 3.0;
    eprintln!(
        "shared spare: {ok} admitted in 10 s ({refused} refused), {due} due, a third {third:.0}"
    );
    assert_eq!(other, 0, "no 5xx, no lost answer");
    assert!(
        (ok as f64 - due).abs() <= 0.10 * due,
        "shared spare: {ok} admitted in 10 s, {due} due (a third: {third:.0})"
    );

    // 2. The store stopped: replica 0 back on its local share (a third of
    // the lane's rate and of the spare), no 5xx.
    store.stop();
    let t1 = t0.elapsed().as_secs_f64();
    load(&c, &gws[0].addr, LANE, OFFERED, 8.0, t0, &out).await;
    wait_mode(&c, &gws[..1], "local", Duration::from_secs(1)).await;
    let (ok, _, other) = tally(&out, t1 + 2.0, t1 + 8.0);
    let share = (RATE + SPARE) / 3.0 * 6.0;
    eprintln!("store stopped: {ok} admitted in 6 s, the local share {share:.0}");
    assert_eq!(other, 0, "no 5xx with the store stopped");
    assert!(
        (ok as f64 - share).abs() <= 0.10 * share + 3.0,
        "store stopped: {ok} admitted in 6 s, the local share {share:.0}"
    );
}
