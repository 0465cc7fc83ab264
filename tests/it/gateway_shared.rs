//! Three `lanekeeper gateway` replicas (`--replicas 3`) on one real
//! `redis-server` (`--shared-state`), on real sockets, in front of one fake
//! model: the fleet's lane budget holds whichever replica the traffic lands
//! on, a retry sent to another replica than its original is a retry, and a
//! store that goes away mid-run drops every replica to its 1/N share
//! within a second (no 5xx) and back to the fleet's rate once it returns.
//! Without a server binary the test prints a loud SKIPPED line;
//! `LANEKEEPER_REQUIRE_REDIS=1` (CI) makes that a failure.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fleet_store_redis::Server;
use crate::gateway::{
    ConfigFile, Proc, client, config_file, gateway_to, inc47, lane_mut, metrics, model, ready,
    sample,
};

/// The capped lane: 60 req/s for the fleet (20 a replica on its 1/N
/// share), a burst of 6, no queue, no floor, no spare capacity.
const LANE: &str = "p2-email-extract";
const RATE: f64 = 60.0;
const BURST: u64 = 6;
/// The fleet bucket's size: the lane's burst, or two lease periods (0.2 s)
/// of its rate when that is more.
const FLEET_BURST: f64 = 12.0;
/// The load offered: twice the lane's rate.
const OFFERED: f64 = 120.0;

pub(crate) fn config() -> Value {
    let mut cfg = inc47();
    let p2 = lane_mut(&mut cfg, LANE);
    p2["admittedRequestsPerSecond"] = json!(RATE);
    p2["burst"] = json!(BURST);
    p2["queue"]["maxDepth"] = json!(0);
    p2["floorUnitsPerSecond"] = Value::Null;
    p2["spareCapacity"] = json!(false);
    cfg
}

/// Each answer: seconds since the run's start when it was sent, and its
/// status (0: no answer).
pub(crate) type Answers = Arc<Mutex<Vec<(f64, u16)>>>;

/// Sends `OFFERED` req/s of the capped lane for `secs`, the i-th request to
/// `targets[pick(i)]`; every answer noted against `t0`.
async fn load(
    c: &reqwest::Client,
    targets: &[String],
    pick: fn(u64) -> usize,
    secs: f64,
    t0: Instant,
    out: &Answers,
) {
    load_to(c, targets, pick, (LANE, OFFERED), secs, t0, out).await;
}

/// Sends `rate` req/s of `lane` for `secs`, the i-th request to
/// `targets[pick(i)]`; every answer noted against `t0`.
pub(crate) async fn load_to(
    c: &reqwest::Client,
    targets: &[String],
    pick: fn(u64) -> usize,
    (lane, rate): (&'static str, f64),
    secs: f64,
    t0: Instant,
    out: &Answers,
) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut sent = tokio::task::JoinSet::new();
    let mut i = 0u64;
    while Instant::now() < end {
        tick.tick().await;
        let url = format!("http://{}/v1/chat/completions", targets[pick(i)]);
        i += 1;
        let (c, out) = (c.clone(), out.clone());
        sent.spawn(async move {
            let at = t0.elapsed().as_secs_f64();
            let status = c
                .post(url)
                .header("content-type", "application/json")
                .header("x-lanekeeper-lane", lane)
                .timeout(Duration::from_secs(5))
                .body(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#)
                .send()
                .await
                .map_or(0, |r| r.status().as_u16());
            out.lock().unwrap().push((at, status));
        });
    }
    while sent.join_next().await.is_some() {}
}

/// Answers sent in `[from, to)` seconds: (admitted, refused 429, other).
pub(crate) fn tally(out: &Answers, from: f64, to: f64) -> (usize, usize, usize) {
    let all = out.lock().unwrap();
    let window = all.iter().filter(|(t, _)| *t >= from && *t < to);
    window.fold((0, 0, 0), |(ok, r, o), (_, s)| match s {
        200 => (ok + 1, r, o),
        429 => (ok, r + 1, o),
        _ => (ok, r, o + 1),
    })
}

/// `ok` admitted in `secs` is the fleet's rate within ±5 % (plus, above,
/// the fleet bucket's size: it may have been full at the start).
fn at_the_fleet_rate(what: &str, ok: usize, secs: f64) {
    let due = RATE * secs;
    let (least, most) = (0.95 * due, 1.05 * due + FLEET_BURST);
    assert!(
        ok as f64 >= least && ok as f64 <= most,
        "{what}: {ok} admitted in {secs} s, {due} due ({least}..={most})"
    );
}

async fn mode_is(c: &reqwest::Client, gw: &Proc, mode: &str) -> bool {
    let m = metrics(c, gw).await;
    sample(
        &m,
        &[
            "lanekeeper_gateway_shared_state_mode{",
            &format!("mode=\"{mode}\""),
        ],
    ) == 1.0
}

/// Waits up to `within` for every replica to be in `mode`; how long it took.
pub(crate) async fn wait_mode(
    c: &reqwest::Client,
    gws: &[Proc],
    mode: &str,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        let mut all = true;
        for gw in gws {
            all &= mode_is(c, gw, mode).await;
        }
        if all {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "not all replicas {mode} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A chat request on P0 with a request id.
async fn p0(c: &reqwest::Client, gw: &Proc, id: &str) -> u16 {
    c.post(format!("http://{}/v1/chat/completions", gw.addr))
        .header("content-type", "application/json")
        .header("x-lanekeeper-lane", "p0-disruption-assist")
        .header("x-request-id", id)
        .body(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_one_budget_and_fall_back_safely() {
    let test = "three_replicas_share_one_budget_and_fall_back_safely";
    let Some(mut store) = Server::start(test) else {
        return;
    };
    let m = model(&["--service-millis", "0"]);
    let (gws, c, _cfg) = fleet("shared", &config(), &m, &store).await;
    let url = store.url();
    let addrs: Vec<String> = gws.iter().map(|g| g.addr.clone()).collect();
    let out: Answers = Arc::default();
    let t0 = Instant::now();

    // 1. All of the lane's traffic on one replica for 20 s: the fleet's
    // rate (today, without the store, a third of it).
    load(&c, &addrs, |_| 0, 20.0, t0, &out).await;
    let (ok, refused, other) = tally(&out, 0.0, 20.0);
    eprintln!("one replica: {ok} admitted in 20 s ({refused} refused, {other} other)");
    assert_eq!(other, 0, "no 5xx, no lost answer");
    at_the_fleet_rate("one replica", ok, 20.0);

    // 2. Spread unevenly (70/20/10 %) for 10 s: the fleet's rate again.
    let t1 = t0.elapsed().as_secs_f64();
    load(
        &c,
        &addrs,
        |i| [0, 0, 0, 0, 0, 0, 0, 1, 1, 2][(i % 10) as usize],
        10.0,
        t0,
        &out,
    )
    .await;
    let (ok, _, other) = tally(&out, t1, t1 + 10.0);
    eprintln!("uneven: {ok} admitted in 10 s");
    assert_eq!(other, 0);
    at_the_fleet_rate("uneven", ok, 10.0);

    // 3. A retry sent to another replica than its original is a retry:
    // counted so on the second replica (which has originals of its own to
    // pay for it out of its retry budget).
    for i in 0..40 {
        assert_eq!(p0(&c, &gws[1], &format!("o-{i}")).await, 200);
    }
    assert_eq!(p0(&c, &gws[0], "moved").await, 200);
    assert_eq!(p0(&c, &gws[1], "moved").await, 200);
    let m1 = metrics(&c, &gws[1]).await;
    let retries = sample(
        &m1,
        &[
            "lanekeeper_gateway_requests_total{",
            "p0-disruption-assist",
            "attempt=\"retry\"",
        ],
    );
    assert_eq!(retries, 1.0, "the moved request is a retry on replica 1");

    // 4. The store goes away under load, then comes back.
    let t2 = t0.elapsed().as_secs_f64();
    let runner = {
        let (c, addrs, out) = (c.clone(), addrs.clone(), out.clone());
        tokio::spawn(async move { load(&c, &addrs, |_| 0, 12.0, t0, &out).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed = t0.elapsed().as_secs_f64();
    store.stop();
    let fell = wait_mode(&c, &gws[..1], "local", Duration::from_secs(2)).await;
    assert!(fell < Duration::from_secs(1), "fell back after {fell:?}");
    // The idle replicas notice by their once-a-second note in the store.
    wait_mode(&c, &gws, "local", Duration::from_millis(1_500)).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let back_at = t0.elapsed().as_secs_f64();
    store.restart();
    let back = wait_mode(&c, &gws[..1], "shared", Duration::from_secs(5)).await;
    runner.await.unwrap();
    let (ok, _, other) = tally(&out, t2, t2 + 12.0);
    assert_eq!(other, 0, "no 5xx while the store was away ({ok} admitted)");
    // On the local share from a second after the kill: 20 req/s.
    let (local, _, _) = tally(&out, killed + 1.0, back_at);
    let secs = back_at - killed - 1.0;
    let share = RATE / 3.0 * secs;
    eprintln!("store down: {local} admitted in {secs:.1} s, {share:.0} due (back after {back:?})");
    assert!(
        (local as f64 - share).abs() <= 0.15 * share + 2.0,
        "store down: {local} admitted in {secs:.1} s, {share:.0} due"
    );
    // Back to the fleet's rate within a few seconds of the store's return.
    let from = back_at + back.as_secs_f64() + 0.5;
    let to = t2 + 12.0;
    let (again, _, _) = tally(&out, from, to);
    let due = RATE * (to - from);
    eprintln!(
        "store back: {again} admitted in {:.1} s, {due:.0} due",
        to - from
    );
    assert!(
        (again as f64 - due).abs() <= 0.15 * due + BURST as f64,
        "store back: {again} admitted in {:.1} s, {due:.0} due",
        to - from
    );
    let m0 = metrics(&c, &gws[0]).await;
    assert!(sample(&m0, &["lanekeeper_gateway_shared_state_fallbacks_total"]) >= 1.0);

    // 5. A slow store (a script that holds it for 1.5 s): a request whose
    // id is checked waits at most the call's deadline, then the replica is
    // on its local share and asks the store nothing more.
    wait_mode(&c, &gws, "shared", Duration::from_secs(5)).await;
    let stall = tokio::spawn(stall_store(url.clone(), 1.5));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let asked = Instant::now();
        assert_eq!(p0(&c, &gws[2], &format!("slow-{i}")).await, 200);
        slowest = slowest.max(asked.elapsed());
    }
    eprintln!("store stalled: slowest answer {slowest:?} (deadline 200 ms)");
    assert!(
        slowest < Duration::from_millis(200 + 150),
        "a stalled store held a request {slowest:?}"
    );
    stall.await.unwrap();
}

/// Holds the store busy for `secs` (a script that spins; the store answers
/// nobody meanwhile).
pub(crate) async fn stall_store(url: String, secs: f64) {
    let client = redis::Client::open(url).unwrap();
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let spin = "local t = redis.call('TIME') local s = t[1] + t[2] / 1e6 \
        repeat t = redis.call('TIME') until t[1] + t[2] / 1e6 - s > tonumber(ARGV[1]) return 1";
    let _: i64 = redis::cmd("EVAL")
        .arg(spin)
        .arg(0)
        .arg(secs)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// Three replicas on `store` in front of `m`, all shared.
pub(crate) async fn fleet(
    test: &str,
    cfg: &Value,
    m: &Proc,
    store: &Server,
) -> (Vec<Proc>, reqwest::Client, ConfigFile) {
    fleet_at(test, cfg, m, &store.url()).await
}

/// One replica of a fleet of three (`--replicas 3`) of the config at
/// `path` in front of `m`, on the store at `url`, each store call given
/// `timeout_millis`.
pub(crate) fn one_of_three(path: &Path, m: &Proc, url: &str, timeout_millis: u64) -> Proc {
    let timeout = timeout_millis.to_string();
    let flags = [
        "--replicas",
        "3",
        "--shared-state",
        url,
        "--shared-state-timeout-millis",
        &timeout,
    ];
    gateway_to(path, &m.addr, &flags)
}

/// Three replicas on the store at `url` in front of `m`, all shared, and
/// their config file (held while they run).
pub(crate) async fn fleet_at(
    test: &str,
    cfg: &Value,
    m: &Proc,
    url: &str,
) -> (Vec<Proc>, reqwest::Client, ConfigFile) {
    let path = config_file(test, cfg);
    let gws: Vec<Proc> = (0..3).map(|_| one_of_three(&path, m, url, 200)).collect();
    let c = client();
    for gw in &gws {
        ready(&c, gw).await;
    }
    wait_mode(&c, &gws, "shared", Duration::from_secs(5)).await;
    (gws, c, path)
}
