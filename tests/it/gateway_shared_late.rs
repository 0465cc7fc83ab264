//! Late answers of the shared store: a small TCP proxy between three
//! `lanekeeper gateway` replicas and a real `redis-server` holds the
//! store's answers back beyond `--shared-state-timeout-millis` for a
//! while, then lets them through on time again. The replicas decide
//! locally meanwhile; the answers that come late must not double-count or
//! double-admit: the lane's admitted total stays within the fleet's rate
//! plus one burst, every lease the store granted or took back is counted by
//! a replica (the bucket key's totals equal the replicas' sums: nothing
//! leaked), no 5xx, and a request whose id check came back late and that
//! was deferred returns (to another replica) as a return, not a retry.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::fleet_store_redis::Server;
use crate::gateway::{Proc, lane_mut, metrics, model};
use crate::gateway_shared::{Answers, config, fleet_at, tally, wait_mode};
use crate::gateway_shared_spare::{LANE, load};

/// How long the proxy holds each answer back while delaying: twice the
/// replicas' call deadline (200 ms).
const DELAY: Duration = Duration::from_millis(400);
const RATE: f64 = 60.0;
/// The fleet bucket's size (two lease periods of 60 req/s).
const FLEET_BURST: f64 = 12.0;
/// What each replica keeps of its leases when it falls back (its local
/// bucket's size, 6 / 3), at most twice in the run (down and back).
const KEPT: f64 = 3.0 * 2.0 * 2.0;

/// Forwards loopback connections to the store; while `delaying`, every
/// answer of the store reaches the replica its delay late (in order).
pub(crate) struct Proxy {
    port: u16,
    delaying: Arc<AtomicBool>,
}

impl Proxy {
    /// Answers `DELAY` late while [`Proxy::delay`] is on (off at first).
    async fn start(store_port: u16) -> Proxy {
        Proxy::with_delay(store_port, DELAY, false).await
    }

    /// Every answer `delay` late, from the start (a store that far away).
    pub(crate) async fn always(store_port: u16, delay: Duration) -> Proxy {
        Proxy::with_delay(store_port, delay, true).await
    }

    async fn with_delay(store_port: u16, delay: Duration, on: bool) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let delaying = Arc::new(AtomicBool::new(on));
        let d = delaying.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", store_port)).await else {
                    continue;
                };
                tokio::spawn(pipe(client, server, d.clone(), delay));
            }
        });
        Proxy { port, delaying }
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn delay(&self, on: bool) {
        self.delaying.store(on, Ordering::SeqCst);
    }
}

/// Requests straight through; answers through a queue that releases each
/// chunk at its due time.
async fn pipe(client: TcpStream, server: TcpStream, delaying: Arc<AtomicBool>, delay: Duration) {
    let (mut c_read, mut c_write) = client.into_split();
    let (mut s_read, mut s_write) = server.into_split();
    tokio::spawn(async move { tokio::io::copy(&mut c_read, &mut s_write).await });
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due.into()).await;
            if c_write.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = s_read.read(&mut buf).await {
        if n == 0 {
            return;
        }
        let late = if delaying.load(Ordering::SeqCst) {
            delay
        } else {
            Duration::ZERO
        };
        if tx.send((Instant::now() + late, buf[..n].to_vec())).is_err() {
            return;
        }
    }
}

const P3: &str = "p3-shift-batch";

/// The capped lane of `gateway_shared`, no in-flight slots, and P3 at one
/// request a second over the fleet with no queue (the next is deferred).
pub(crate) fn late_config() -> Value {
    let mut cfg = config();
    cfg["inFlight"] = Value::Null;
    let l = lane_mut(&mut cfg, P3);
    l["admittedRequestsPerSecond"] = json!(1.0);
    l["burst"] = json!(1);
    l["queue"]["maxDepth"] = json!(0);
    l["spareCapacity"] = json!(false);
    l["floorUnitsPerSecond"] = Value::Null;
    cfg
}

async fn p3(c: &reqwest::Client, gw: &Proc, id: &str, attempt: u32) -> u16 {
    c.post(format!("http://{}/v1/chat/completions", gw.addr))
        .header("content-type", "application/json")
        .header("x-lanekeeper-lane", P3)
        .header("x-request-id", id)
        .header("x-lanekeeper-attempt", attempt.to_string())
        .body(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The sum of `family{...}` samples whose line has every fragment.
fn sum(text: &str, family: &str, fragments: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter(|l| fragments.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The lane bucket's `taken` and `returned` totals in the store.
async fn store_totals(url: &str) -> (f64, f64) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("lanekeeper:lane:ai-platform/agent-assist/{LANE}:bucket");
    let (taken, returned): (Option<f64>, Option<f64>) = redis::cmd("HMGET")
        .arg(&key)
        .arg("taken")
        .arg("returned")
        .query_async(&mut conn)
        .await
        .unwrap();
    (taken.unwrap_or(0.0), returned.unwrap_or(0.0))
}

/// The replicas' own counts of the lane's lease tokens.
async fn replica_totals(c: &reqwest::Client, gws: &[Proc]) -> (f64, f64) {
    let (mut taken, mut returned) = (0.0, 0.0);
    for gw in gws {
        let m = metrics(c, gw).await;
        let lane = format!("lane=\"{LANE}\"");
        let family = "lanekeeper_gateway_shared_state_lease_units_total";
        taken += sum(&m, family, &[&lane, "direction=\"taken\""]);
        returned += sum(&m, family, &[&lane, "direction=\"returned\""]);
    }
    (taken, returned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_store_answers_are_neither_lost_nor_counted_twice() {
    let test = "late_store_answers_are_neither_lost_nor_counted_twice";
    let Some(store) = Server::start(test) else {
        return;
    };
    let proxy = Proxy::start(store.port()).await;
    let m = model(&["--service-millis", "0"]);
    let (gws, c, _cfg) = fleet_at(test, &late_config(), &m, &proxy.url()).await;
    let out: Answers = Arc::default();
    let t0 = Instant::now();
    let runner = {
        let (c, target, out) = (c.clone(), gws[0].addr.clone(), out.clone());
        tokio::spawn(async move { load(&c, &target, LANE, 2.0 * RATE, 12.0, t0, &out).await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    // P3's one token taken on replica 1, the next deferred: its bucket is
    // empty as the store turns slow.
    let mut deferred = false;
    for i in 0..20 {
        if p3(&c, &gws[1], &format!("early-{i}"), 1).await == 429 {
            deferred = true;
            break;
        }
    }
    assert!(deferred, "P3 deferred before the store turned slow");

    proxy.delay(true);
    // A request whose id check comes back late: decided on the local share
    // (deferred: P3's local bucket is empty).
    let status = p3(&c, &gws[1], "late-check", 1).await;
    assert_eq!(status, 429, "deferred on the local share");
    wait_mode(&c, &gws[..2], "local", Duration::from_secs(2)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.delay(false);
    wait_mode(&c, &gws, "shared", Duration::from_secs(5)).await;
    runner.await.unwrap();
    let secs = t0.elapsed().as_secs_f64();

    let (ok, refused, other) = tally(&out, 0.0, secs);
    let most = RATE * secs + FLEET_BURST + KEPT;
    eprintln!("late answers: {ok} admitted in {secs:.1} s ({refused} refused), at most {most:.0}");
    assert_eq!(other, 0, "no 5xx, no lost answer");
    assert!(
        ok as f64 <= most,
        "{ok} admitted in {secs:.1} s, at most {most:.0}"
    );
    let m0 = metrics(&c, &gws[0]).await;
    let late = sum(
        &m0,
        "lanekeeper_gateway_shared_state_late_answers_total",
        &[],
    );
    assert!(
        late >= 1.0,
        "the slow store answered some lease late:\n{m0}"
    );

    // Every lease the store granted or took back is one a replica counted:
    // the totals meet once the last round's calls are answered.
    let url = store.url();
    let start = Instant::now();
    loop {
        let stored = store_totals(&url).await;
        let counted = replica_totals(&c, &gws).await;
        if stored == counted && stored.0 > 0.0 {
            eprintln!(
                "leases: the store's (taken, returned) {stored:?}, the replicas' {counted:?}"
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "leases leaked: the store's (taken, returned) {stored:?}, the replicas' {counted:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The late-checked request comes back to another replica, saying it is
    // its second attempt: a return (its deferral was written once the
    // store answered again), not a retry.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let attempts = |t: &str, a: &str| {
        sum(
            t,
            "lanekeeper_gateway_requests_total",
            &[P3, &format!("attempt=\"{a}\"")],
        )
    };
    let before = metrics(&c, &gws[2]).await;
    p3(&c, &gws[2], "late-check", 2).await;
    let after = metrics(&c, &gws[2]).await;
    assert_eq!(
        attempts(&after, "retry") - attempts(&before, "retry"),
        0.0,
        "{after}"
    );
    assert_eq!(
        attempts(&after, "returning") - attempts(&before, "returning"),
        1.0
    );
}
