//! Deferrals kept while the shared store was down are written back after
//! it returns without holding up the lease round: a replica with 1,500 of
//! them keeps admitting its lanes at their rates the moment it is shared
//! again. Before, they were written one awaited call at a time ahead of
//! the leases: with the store 3 ms away the replica admitted nothing for
//! six seconds, P0 included. Real `redis-server` behind a delaying proxy,
//! real gateway binaries.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::fleet_store_redis::Server;
use crate::gateway::model;
use crate::gateway_shared::{Answers, fleet_at, load_to, tally, wait_mode};
use crate::gateway_shared_late::{Proxy, late_config};

const P2: &str = "p2-email-extract";
const P3: &str = "p3-shift-batch";

async fn defer_many(c: &reqwest::Client, target: &str) -> usize {
    let mut deferred = 0;
    for batch in 0..30 {
        let calls = (0..50).map(|i| {
            let r = c
                .post(format!("http://{target}/v1/chat/completions"))
                .header("content-type", "application/json")
                .header("x-lanekeeper-lane", P3)
                .header("x-request-id", format!("d-{batch}-{i}"))
                .timeout(Duration::from_secs(10))
                .body(
                    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
                        .to_string(),
                );
            async move { r.send().await.map_or(0, |r| r.status().as_u16()) }
        });
        let answers = futures::future::join_all(calls).await;
        deferred += answers.iter().filter(|s| **s == 429).count();
    }
    deferred
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferrals_kept_while_the_store_was_down_do_not_stall_the_leases() {
    let test = "deferrals_kept_while_the_store_was_down_do_not_stall_the_leases";
    let Some(mut store) = Server::start(test) else {
        return;
    };
    let proxy = Proxy::always(store.port(), Duration::from_millis(3)).await;
    let m = model(&["--service-millis", "0"]);
    let url = proxy.url();
    let (gws, c, _cfg) = fleet_at(test, &late_config(), &m, &url).await;
    store.stop();
    wait_mode(&c, &gws, "local", Duration::from_secs(3)).await;
    let target = gws[1].addr.clone();
    let deferred = defer_many(&c, &target).await;
    assert!(deferred > 1_000, "only {deferred} deferred");
    store.restart();
    wait_mode(&c, &gws[1..2], "shared", Duration::from_secs(5)).await;

    let (p2, p0): (Answers, Answers) = (Arc::default(), Arc::default());
    let t0 = Instant::now();
    let targets = [target.clone()];
    tokio::join!(
        load_to(&c, &targets, |_| 0, (P2, 120.0), 4.0, t0, &p2),
        load_to(
            &c,
            &targets,
            |_| 0,
            ("p0-disruption-assist", 10.0),
            4.0,
            t0,
            &p0
        )
    );
    // P2's fleet rate is 60/s and this replica alone asks for it: seconds
    // 1 to 4 admit close to 180 (before the fix: none).
    let (ok, _, other) = tally(&p2, 1.0, 4.0);
    assert!(ok >= 120, "P2 admitted {ok} in seconds 1..4 (rate 60/s)");
    assert_eq!(other, 0, "P2 answers other than 200 and 429");
    let (ok, refused, other) = tally(&p0, 0.0, 4.0);
    assert_eq!(
        (refused, other),
        (0, 0),
        "P0: {ok} admitted, {refused} refused, {other} failed or unanswered"
    );
    // And every kept deferral reaches the store, a batch per round.
    let start = Instant::now();
    let mut written = 0;
    while start.elapsed() < Duration::from_secs(20) {
        written = deferred_ids_in(&store.url()).await;
        if written >= deferred {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(written, deferred, "deferrals in the store");
}

/// How many request ids the store holds as deferred.
async fn deferred_ids_in(url: &str) -> usize {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("lanekeeper:*:id:d-*")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut n = 0;
    for k in keys {
        let v: String = redis::cmd("GET")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        n += usize::from(v.starts_with('d'));
    }
    n
}
