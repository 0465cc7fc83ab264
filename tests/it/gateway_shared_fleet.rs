//! Three `lanekeeper gateway` replicas (`--replicas 3`) on one real
//! `redis-server` (`--shared-state`), on real sockets: a tenant's
//! `maxConcurrency` holds over the fleet wherever its requests land (the
//! fake model counts what is in flight at once), and a request deferred by
//! one replica that comes back to another is a return, not a retry.
//! Without a server binary the tests print a loud SKIPPED line;
//! `LANEKEEPER_REQUIRE_REDIS=1` (CI) makes that a failure.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fleet_store_redis::Server;
use crate::gateway::{Proc, control, inc47, lane_mut, metrics, model, sample};
use crate::gateway_shared::{fleet, stall_store, wait_mode};

/// A chat request on `lane` as `tenant`; its status.
async fn chat_as(c: &reqwest::Client, gw: &str, lane: &str, tenant: &str) -> u16 {
    c.post(format!("http://{gw}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-lanekeeper-lane", lane)
        .header("x-lanekeeper-tenant", tenant)
        .timeout(Duration::from_secs(10))
        .body(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string())
        .send()
        .await
        .map_or(0, |r| r.status().as_u16())
}

pub(crate) const P1: &str = "p1-agent-assist";
/// The tenant's maximum in flight over the fleet.
const MAX: u64 = 4;

/// 24 clients of one tenant, each sending back to back for `secs`, the
/// i-th client to replica i mod 3: the answers' statuses.
pub(crate) async fn load(
    c: &reqwest::Client,
    gws: &[Proc],
    tenant: &'static str,
    secs: f64,
) -> Vec<u16> {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..24 {
        let (c, addr) = (c.clone(), gws[i % gws.len()].addr.clone());
        clients.spawn(async move {
            let mut out = Vec::new();
            while Instant::now() < end {
                out.push(chat_as(&c, &addr, P1, tenant).await);
            }
            out
        });
    }
    let mut all = Vec::new();
    while let Some(out) = clients.join_next().await {
        all.extend(out.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_concurrency_limit_holds_across_replicas() {
    let test = "a_tenants_concurrency_limit_holds_across_replicas";
    let Some(mut store) = Server::start(test) else {
        return;
    };
    let mut cfg = inc47();
    lane_mut(&mut cfg, P1)["tenants"] = json!({"maxConcurrency": MAX});
    // Every answer takes 0.2 s.
    let m = model(&["--service-millis", "200", "--token-millis", "0"]);
    let (gws, c, _cfg) = fleet(test, &cfg, &m, &store).await;
    let set_peak = |v: u64| {
        let (c, addr) = (c.clone(), m.addr.clone());
        async move {
            let r = c
                .put(format!("http://{addr}/control"))
                .body(json!({"chatInFlightPeak": v}).to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    };
    set_peak(0).await;
    let statuses = load(&c, &gws, "team-a", 6.0).await;
    let peak = control(&c, &m).await["chatInFlightPeak"].as_u64().unwrap();
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let other = statuses.iter().filter(|s| ![200, 429].contains(*s)).count();
    eprintln!(
        "tenant over 3 replicas: peak {peak} in flight (max {MAX}), {ok} answered of {} in 6 s",
        statuses.len()
    );
    assert_eq!(other, 0, "no 5xx, no lost answer: {statuses:?}");
    assert!(
        peak <= MAX,
        "{peak} in flight at once, the fleet's maximum is {MAX}"
    );
    assert_eq!(peak, MAX, "the tenant had its whole maximum");
    // 4 at a time, 0.2 s each: 20 a second at best; the hand-over of a
    // slot between replicas costs a lease round.
    assert!(ok >= 50, "only {ok} answered in 6 s");
    // Another tenant is not held back by team-a's waiting requests.
    let ((s, took), _) = tokio::join!(
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let started = Instant::now();
            let s = chat_as(&c, &gws[2].addr, P1, "team-b").await;
            (s, started.elapsed())
        },
        load(&c, &gws, "team-a", 1.0)
    );
    assert_eq!(s, 200);
    assert!(took < Duration::from_millis(700), "team-b waited {took:?}");
    let m0 = metrics(&c, &gws[0]).await;
    assert!(
        sample(
            &m0,
            &[
                "lanekeeper_gateway_shared_state_calls_total{",
                "op=\"slots\"",
                "result=\"ok\""
            ]
        ) > 0.0
    );
    // A store that stalls for 0.6 s under load: the replicas fall back,
    // and back in shared mode the slots they held before (still in the
    // store until their lease runs out) are not theirs any more: nothing
    // waits for a slot nobody uses, every request is answered.
    let stall = tokio::spawn(stall_store(store.url(), 0.6));
    let statuses = load(&c, &gws, "team-a", 4.0).await;
    stall.await.unwrap();
    let ok = statuses.iter().filter(|s| **s == 200).count();
    eprintln!("store stalled: {ok} answered of {}", statuses.len());
    assert!(
        statuses.iter().all(|s| [200, 429].contains(s)),
        "{statuses:?}"
    );
    wait_mode(&c, &gws, "shared", Duration::from_secs(5)).await;
    set_peak(0).await;
    let statuses = load(&c, &gws, "team-a", 3.0).await;
    let peak = control(&c, &m).await["chatInFlightPeak"].as_u64().unwrap();
    let ok = statuses.iter().filter(|s| **s == 200).count();
    eprintln!(
        "after the stall: peak {peak}, {ok} answered of {}",
        statuses.len()
    );
    assert!(
        statuses.iter().all(|s| [200, 429].contains(s)),
        "{statuses:?}"
    );
    assert!(peak <= MAX && ok >= 30, "peak {peak}, {ok} answered");
    // The store goes away: each replica falls back to its share of the
    // maximum, ceil(4 / 3) = 2, no request failed.
    store.stop();
    wait_mode(&c, &gws, "local", Duration::from_secs(3)).await;
    set_peak(0).await;
    let statuses = load(&c, &gws, "team-a", 3.0).await;
    let peak = control(&c, &m).await["chatInFlightPeak"].as_u64().unwrap();
    let ok = statuses.iter().filter(|s| **s == 200).count();
    eprintln!("store down: peak {peak} in flight, {ok} answered");
    assert!(
        statuses.iter().all(|s| [200, 429].contains(s)),
        "{statuses:?}"
    );
    assert!(peak <= 6, "{peak} in flight: more than three local shares");
    assert!(ok > 0);
}

/// The pool's `inFlight.stopAt` over the fleet.
const STOP_AT: u64 = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_in_flight_limit_holds_across_replicas() {
    let test = "the_pools_in_flight_limit_holds_across_replicas";
    let Some(store) = Server::start(test) else {
        return;
    };
    let mut cfg = inc47();
    cfg["inFlight"] = json!({"conserveAt": 5, "stopAt": STOP_AT, "resumeBelow": 4});
    // Every lane is held by the limit (no reserve kept for P0).
    lane_mut(&mut cfg, "p0-disruption-assist")["sheddable"] = json!(true);
    let m = model(&["--service-millis", "200", "--token-millis", "0"]);
    let (gws, c, _cfg) = fleet(test, &cfg, &m, &store).await;
    // All of it on one replica.
    let statuses = load(&c, &gws[..1], "anyone", 6.0).await;
    let peak = control(&c, &m).await["chatInFlightPeak"].as_u64().unwrap();
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let other = statuses.iter().filter(|s| ![200, 429].contains(*s)).count();
    eprintln!(
        "pool, all on one of 3 replicas: peak {peak} in flight (stopAt {STOP_AT}), {ok} answered of {} in 6 s",
        statuses.len()
    );
    assert_eq!(other, 0, "no 5xx, no lost answer");
    assert!(
        peak <= STOP_AT,
        "{peak} in flight at once, stopAt is {STOP_AT}"
    );
    // Without the store the replica would allow its third (2); with it,
    // the slots the idle replicas do not use.
    assert!(peak > STOP_AT / 3, "peak {peak}: no more than a third");
    assert!(ok >= 60, "only {ok} answered in 6 s");
    let m0 = metrics(&c, &gws[0]).await;
    assert!(sample(&m0, &["lanekeeper_gateway_in_flight_limit"]) <= STOP_AT as f64);
}

const P3: &str = "p3-shift-batch";

/// A P3 request with an id and an attempt header; its status.
async fn p3(c: &reqwest::Client, gw: &Proc, id: &str, attempt: u32) -> u16 {
    c.post(format!("http://{}/v1/chat/completions", gw.addr))
        .header("content-type", "application/json")
        .header("x-lanekeeper-lane", P3)
        .header("x-request-id", id)
        .header("x-lanekeeper-attempt", attempt.to_string())
        .body(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn attempts(text: &str, attempt: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("lanekeeper_gateway_requests_total{"))
        .filter(|l| l.contains(P3) && l.contains(&format!("attempt=\"{attempt}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_deferred_by_one_replica_returns_to_another_as_a_return() {
    let test = "a_request_deferred_by_one_replica_returns_to_another_as_a_return";
    let Some(store) = Server::start(test) else {
        return;
    };
    let mut cfg = inc47();
    let l = lane_mut(&mut cfg, P3);
    // One request a second over the fleet and no queue: the next is
    // deferred.
    l["admittedRequestsPerSecond"] = json!(1.0);
    l["burst"] = json!(1);
    l["queue"]["maxDepth"] = json!(0);
    l["spareCapacity"] = json!(false);
    l["floorUnitsPerSecond"] = Value::Null;
    let m = model(&["--service-millis", "0"]);
    let (gws, c, _cfg) = fleet(test, &cfg, &m, &store).await;
    // Until one is deferred (the bucket's one token taken first).
    let mut deferred = None;
    for i in 0..20 {
        let id = format!("job-{i}");
        if p3(&c, &gws[0], &id, 1).await == 429 {
            deferred = Some(id);
            break;
        }
    }
    let id = deferred.expect("a deferral");
    // The deferral is written in the background; the client comes back
    // after its Retry-After (here sooner), to another replica, saying it
    // is its second attempt.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = metrics(&c, &gws[1]).await;
    let mut back = p3(&c, &gws[1], &id, 2).await;
    let after = metrics(&c, &gws[1]).await;
    assert_eq!(
        attempts(&after, "retry") - attempts(&before, "retry"),
        0.0,
        "a return is no retry:\n{after}"
    );
    assert_eq!(
        attempts(&after, "returning") - attempts(&before, "returning"),
        1.0
    );
    // A genuine retry to a third replica is still a retry.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(p3(&c, &gws[0], "fresh", 1).await, 200);
    p3(&c, &gws[2], "fresh", 1).await;
    let m2 = metrics(&c, &gws[2]).await;
    assert_eq!(attempts(&m2, "retry"), 1.0, "{m2}");

    // The return consumed the deferral. Until it passes, each deferral is
    // followed by a return; once it passed, its next arrival is a retry,
    // on the replica that deferred it first (which remembers that
    // deferral) as on any other.
    for _ in 0..5 {
        if back != 429 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        back = p3(&c, &gws[1], &id, 2).await;
    }
    assert_eq!(back, 200, "the return passed");
    for (gw, attempt) in [(&gws[0], 3), (&gws[1], 4)] {
        let before = metrics(&c, gw).await;
        p3(&c, gw, &id, attempt).await;
        let after = metrics(&c, gw).await;
        assert_eq!(
            attempts(&after, "retry") - attempts(&before, "retry"),
            1.0,
            "attempt {attempt} is a retry:\n{after}"
        );
        assert_eq!(
            attempts(&after, "returning") - attempts(&before, "returning"),
            0.0
        );
    }
}
