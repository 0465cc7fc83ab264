//! One of three replicas cut off from the shared store while the other two
//! reach it: the cut-off one enforces its 1/N share alone, and the two that
//! share count themselves in the store and run the lane's fleet bucket at
//! 2/3 of its rate, so the fleet stays at the lane's rate. Before, the two
//! leased the whole rate and the fleet admitted the rate × 4/3 (800 in
//! 10 s of 600 due). Real `redis-server`, one replica behind a proxy that
//! answers later than its deadline, real gateways.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::fleet_store_redis::Server;
use crate::gateway::{Proc, client, config_file, gateway_to, model, ready};
use crate::gateway_shared::{Answers, config, load_to, tally, wait_mode};
use crate::gateway_shared_late::Proxy;

const LANE: &str = "p2-email-extract";
/// The lane's fleet rate (`gateway_shared::config`).
const RATE: f64 = 60.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_the_store_does_not_add_its_share_to_the_fleets_rate() {
    let test = "a_replica_cut_off_from_the_store_does_not_add_its_share_to_the_fleets_rate";
    let Some(store) = Server::start(test) else {
        return;
    };
    // Every answer 400 ms late, twice the replicas' call deadline.
    let far = Proxy::always(store.port(), Duration::from_millis(400)).await;
    let m = model(&["--service-millis", "0"]);
    let path = config_file(test, &config());
    let flags = |url: &str| {
        [
            "--replicas",
            "3",
            "--shared-state",
            url,
            "--shared-state-timeout-millis",
            "200",
        ]
        .map(str::to_owned)
    };
    let start = |url: String| {
        let f = flags(&url);
        let f: Vec<&str> = f.iter().map(String::as_str).collect();
        gateway_to(&path, &m.addr, &f)
    };
    let gws: Vec<Proc> = vec![start(far.url()), start(store.url()), start(store.url())];
    let c = client();
    for gw in &gws {
        ready(&c, gw).await;
    }
    wait_mode(&c, &gws[1..], "shared", Duration::from_secs(5)).await;
    wait_mode(&c, &gws[..1], "local", Duration::from_secs(5)).await;
    // Let the cut-off replica's note (if it ever wrote one) run out.
    tokio::time::sleep(Duration::from_secs(4)).await;

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
