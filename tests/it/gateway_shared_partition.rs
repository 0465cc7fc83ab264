//! One of three replicas cut off from the shared store while the other two
//! reach it: the cut-off one enforces its 1/N share alone, and the two that
//! share count themselves in the store and run the lane's fleet bucket at
//! 2/3 of its rate, so the fleet stays at the lane's rate. Before, the two
//! leased the whole rate and the fleet admitted the rate × 4/3 (800 in
//! 10 s of 600 due). A tenant's `maxConcurrency` holds the same way: the
//! two hold at most the maximum less the cut-off one's local share (before,
//! 6 in flight of a maximum of 4). Real `redis-server`, one replica behind
//! a proxy that answers later than its deadline, real gateways.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fleet_store_redis::Server;
use crate::gateway::{Proc, client, config_file, control, inc47, lane_mut, model, ready};
use crate::gateway_shared::{Answers, config, load_to, one_of_three, tally, wait_mode};
use crate::gateway_shared_fleet::{P1, load};
use crate::gateway_shared_late::Proxy;

const LANE: &str = "p2-email-extract";
/// The lane's fleet rate (`gateway_shared::config`).
const RATE: f64 = 60.0;

/// Three replicas of `cfg` on `store`, the first behind a proxy that
/// answers every call 400 ms late (twice its deadline): once the first is
/// on its local share and the others share, and any note of the first has
/// run out.
async fn one_cut_off(test: &str, cfg: &Value, m: &Proc, store: &Server) -> (Vec<Proc>, Proxy) {
    let far = Proxy::always(store.port(), Duration::from_millis(400)).await;
    let path = config_file(test, cfg);
    let start = |url: String| one_of_three(&path, m, &url, 200);
    let gws: Vec<Proc> = vec![start(far.url()), start(store.url()), start(store.url())];
    let c = client();
    for gw in &gws {
        ready(&c, gw).await;
    }
    wait_mode(&c, &gws[1..], "shared", Duration::from_secs(5)).await;
    wait_mode(&c, &gws[..1], "local", Duration::from_secs(5)).await;
    // Let the cut-off replica's note (if it ever wrote one) run out.
    tokio::time::sleep(Duration::from_secs(4)).await;
    (gws, far)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_the_store_does_not_add_its_share_to_the_fleets_rate() {
    let test = "a_replica_cut_off_from_the_store_does_not_add_its_share_to_the_fleets_rate";
    let Some(store) = Server::start(test) else {
        return;
    };
    let m = model(&["--service-millis", "0"]);
    let (gws, _far) = one_cut_off(test, &config(), &m, &store).await;
    let c = client();
    let out: Answers = Arc::default();
    let targets: Vec<String> = gws.iter().map(|g| g.addr.clone()).collect();
    let t0 = Instant::now();
    load_to(
        &c,
        &targets,
        |i| (i % 3) as usize,
        (LANE, 2.0 * RATE),
        12.0,
        t0,
        &out,
    )
    .await;
    let (ok, _, other) = tally(&out, 2.0, 12.0);
    assert_eq!(other, 0, "answers other than 200 and 429");
    let due = RATE * 10.0;
    eprintln!("{test}: {ok} admitted in 10 s of {due} due");
    assert!(
        (ok as f64) <= due * 1.1,
        "{ok} admitted in 10 s of {due} due: the cut-off replica's share came on top"
    );
    assert!(
        (ok as f64) >= due * 0.85,
        "{ok} admitted in 10 s of {due} due"
    );
}

/// A tenant's fleet-wide maximum in flight.
const MAX: u64 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_the_store_does_not_add_its_share_to_a_tenants_maximum() {
    let test = "a_replica_cut_off_from_the_store_does_not_add_its_share_to_a_tenants_maximum";
    let Some(store) = Server::start(test) else {
        return;
    };
    let mut cfg = inc47();
    lane_mut(&mut cfg, P1)["tenants"] = json!({"maxConcurrency": MAX});
    // Every answer takes 0.2 s.
    let m = model(&["--service-millis", "200", "--token-millis", "0"]);
    let (gws, _far) = one_cut_off(test, &cfg, &m, &store).await;
    let c = client();
    let r = c
        .put(format!("http://{}/control", m.addr))
        .body(json!({"chatInFlightPeak": 0}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // 24 clients of one tenant, 8 on each replica, for 4 s: the cut-off
    // replica holds ceil(4 / 3) = 2 on its own, the two sharing the rest.
    let statuses = load(&c, &gws, "team-a", 4.0).await;
    let peak = control(&c, &m).await["chatInFlightPeak"].as_u64().unwrap();
    let ok = statuses.iter().filter(|s| **s == 200).count();
    eprintln!("{test}: peak {peak} in flight (max {MAX}), {ok} answered");
    assert!(
        statuses.iter().all(|s| [200, 429].contains(s)),
        "{statuses:?}"
    );
    assert!(
        peak <= MAX,
        "{peak} in flight at once: the cut-off replica's share came on top of {MAX}"
    );
    assert!(ok >= 20, "only {ok} answered in 4 s");
}
