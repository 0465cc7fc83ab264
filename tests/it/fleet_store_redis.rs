//! The fleet store's lease script on a real `redis-server` (or
//! `valkey-server`), started here on a free loopback port: it does the
//! arithmetic of `lanes::fleet_lease::FleetBucket`, concurrent replicas
//! never get more than the rate plus one burst, and a store that goes away
//! is an error within the call's deadline, then works again when it is
//! back. Without a server binary the tests print a loud SKIPPED line;
//! `LANEKEEPER_REQUIRE_REDIS=1` (CI) makes that a failure.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::scratch::Scratch;
use lanekeeper::gateway::fleet_store::FleetStore;
use lanekeeper::gateway::fleet_store_ids::Sighting;
use lanes::fleet_lease::{FleetLimits, LEASE_SECONDS, lease_size};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SanType,
};

fn on_path(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|f| f.is_file())
    })
}

/// A store server of its own; killed when dropped.
pub(crate) struct Server {
    child: Child,
    port: u16,
    bin: PathBuf,
    how: Serve,
}

/// How a store server serves.
#[derive(Clone, Default)]
pub(crate) struct Serve {
    /// A directory with `cert.pem`, `key.pem` and `ca.pem`: TLS only.
    pub(crate) tls: Option<PathBuf>,
    /// The password it requires (`requirepass`), if any.
    pub(crate) password: Option<String>,
}

impl Server {
    pub(crate) fn start(test: &str) -> Option<Server> {
        Server::start_with(test, Serve::default())
    }

    pub(crate) fn start_with(test: &str, how: Serve) -> Option<Server> {
        let Some(bin) = on_path("valkey-server").or_else(|| on_path("redis-server")) else {
            if std::env::var("LANEKEEPER_REQUIRE_REDIS").as_deref() == Ok("1") {
                panic!(
                    "{test}: no redis-server or valkey-server on PATH and LANEKEEPER_REQUIRE_REDIS=1"
                );
            }
            eprintln!(
                "\n!!!!!!!! SKIPPED {test}: no redis-server/valkey-server on PATH (apt-get install -y redis-server) !!!!!!!!\n"
            );
            return None;
        };
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = spawn(&bin, port, &how);
        let server = Server {
            child,
            port,
            bin,
            how,
        };
        server.wait_ready();
        Some(server)
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn wait_ready(&self) {
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the store did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub(crate) fn restart(&mut self) {
        self.stop();
        self.child = spawn(&self.bin, self.port, &self.how);
        self.wait_ready();
    }
}

fn spawn(bin: &PathBuf, port: u16, how: &Serve) -> Child {
    let mut cmd = Command::new(bin);
    match &how.tls {
        None => cmd.args(["--port", &port.to_string()]),
        Some(dir) => {
            let file = |f: &str| dir.join(f).display().to_string();
            cmd.args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--tls-cert-file", &file("cert.pem")])
                .args(["--tls-key-file", &file("key.pem")])
                .args(["--tls-ca-cert-file", &file("ca.pem")])
                .args(["--tls-auth-clients", "no"])
        }
    };
    if let Some(password) = &how.password {
        cmd.args(["--requirepass", password]);
    }
    cmd.args(["--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts the store")
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

const DEADLINE: Duration = Duration::from_millis(50);

#[tokio::test]
async fn the_script_is_the_fleet_buckets_arithmetic() {
    let Some(server) = Server::start("the_script_is_the_fleet_buckets_arithmetic") else {
        return;
    };
    let store = FleetStore::connect(&server.url(), "test", DEADLINE)
        .await
        .unwrap();
    // A slow lane: what accrues between two calls is far below one token.
    let lane = FleetLimits {
        rate: 0.001,
        burst: 10.0,
    };
    assert_eq!(
        store.take("p3", lane, 25).await.unwrap(),
        10,
        "a new bucket is full"
    );
    assert_eq!(store.take("p3", lane, 1).await.unwrap(), 0, "then empty");
    store.give_back("p3", lane, 4).await.unwrap();
    assert_eq!(store.take("p3", lane, 3).await.unwrap(), 3);
    store.give_back("p3", lane, 1_000).await.unwrap();
    assert_eq!(
        store.take("p3", lane, 100).await.unwrap(),
        10,
        "given back tokens never lift the bucket above its burst"
    );
    assert_eq!(
        store.take("p4", lane, 2).await.unwrap(),
        2,
        "lanes have their own buckets"
    );
    let other = FleetStore::connect(&server.url(), "other-fleet", DEADLINE)
        .await
        .unwrap();
    assert_eq!(
        other.take("p3", lane, 10).await.unwrap(),
        10,
        "and so do fleets"
    );
}

/// A damaged bucket (another writer, a restore, a failover to a host whose
/// clock is behind) neither opens its lane nor starves it: a NaN `updated`
/// used to grant a full burst on every call, forever, and an `updated` in
/// the future granted nothing until the store's clock caught up.
#[tokio::test]
async fn a_damaged_bucket_neither_opens_nor_starves_its_lane() {
    let Some(server) = Server::start("a_damaged_bucket_neither_opens_nor_starves_its_lane") else {
        return;
    };
    let store = FleetStore::connect(&server.url(), "test", DEADLINE)
        .await
        .unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let mut set = async |fields: &[(&str, String)]| {
        let mut cmd = redis::cmd("HSET");
        cmd.arg("test:lane:p3:bucket");
        for (f, v) in fields {
            cmd.arg(*f).arg(v);
        }
        let _: () = cmd.query_async(&mut raw).await.unwrap();
    };
    let slow = FleetLimits {
        rate: 0.001,
        burst: 2.0,
    };
    for (what, tokens, updated) in [
        ("a NaN time", "1".to_string(), "nan".to_string()),
        ("NaN tokens", "nan".to_string(), "1".to_string()),
        ("negative tokens", "-5".to_string(), "1".to_string()),
    ] {
        set(&[("tokens", tokens), ("updated", updated)]).await;
        let granted: Vec<u64> = [
            store.take("p3", slow, 5).await.unwrap(),
            store.take("p3", slow, 5).await.unwrap(),
            store.take("p3", slow, 5).await.unwrap(),
        ]
        .into();
        assert!(
            granted.iter().sum::<u64>() <= 2,
            "{what}: at most one burst over three takes, got {granted:?}"
        );
    }
    // A time 30 s ahead of the store's clock: the bucket refills from the
    // first call on.
    let fast = FleetLimits {
        rate: 100.0,
        burst: 10.0,
    };
    let ahead = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        + 30.0;
    set(&[("tokens", "0".into()), ("updated", format!("{ahead}"))]).await;
    assert_eq!(store.take("p3", fast, 10).await.unwrap(), 0, "empty now");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let granted = store.take("p3", fast, 10).await.unwrap();
    assert!(
        granted >= 5,
        "0.2 s at 100/s refills about 20 (at most the burst of 10); got {granted}"
    );
}

/// Three replicas leasing one lane's bucket as fast as they can for 2 s:
/// together they get the lane's rate plus one burst, never more, and not
/// much less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_replicas_share_one_rate() {
    let Some(server) = Server::start("concurrent_replicas_share_one_rate") else {
        return;
    };
    let lane = FleetLimits {
        rate: 200.0,
        burst: 20.0,
    };
    let run_for = Duration::from_secs(2);
    let start = Instant::now();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let store = FleetStore::connect(&server.url(), "fleet", Duration::from_millis(500))
            .await
            .unwrap();
        replicas.push(tokio::spawn(async move {
            let mut got = 0;
            while start.elapsed() < run_for {
                got += store
                    .take("p1", lane, lease_size(lane, 1_000.0, 0))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_secs_f64(LEASE_SECONDS / 4.0)).await;
            }
            got
        }));
    }
    let mut total = 0;
    for r in replicas {
        total += r.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let most = lane.rate * elapsed + lane.burst;
    assert!(
        total as f64 <= most,
        "{total} granted in {elapsed:.2} s, at most {most}"
    );
    assert!(
        total as f64 >= 0.9 * lane.rate * run_for.as_secs_f64(),
        "{total} granted in {elapsed:.2} s: the replicas starved"
    );
}

/// A retry sent to another replica than its original is a retry: the
/// first sighting of an id is fleet-wide, per lane, and lapses with the
/// lane's deadline.
#[tokio::test]
async fn an_id_is_an_original_once_per_fleet_and_lane() {
    let Some(server) = Server::start("an_id_is_an_original_once_per_fleet_and_lane") else {
        return;
    };
    let url = server.url();
    let a = FleetStore::connect(&url, "fleet", DEADLINE).await.unwrap();
    let b = FleetStore::connect(&url, "fleet", DEADLINE).await.unwrap();
    let deadline = Duration::from_millis(300);
    assert!(a.first_sighting("p1", "req-1", deadline).await.unwrap());
    assert!(
        !b.first_sighting("p1", "req-1", deadline).await.unwrap(),
        "the retry on b"
    );
    assert!(!a.first_sighting("p1", "req-1", deadline).await.unwrap());
    assert!(
        b.first_sighting("p2", "req-1", deadline).await.unwrap(),
        "another lane"
    );
    tokio::time::sleep(deadline + Duration::from_millis(100)).await;
    assert!(
        b.first_sighting("p1", "req-1", deadline).await.unwrap(),
        "forgotten after the deadline"
    );
}

/// A deferral is consumed by the return: the first sighting after it (on
/// any replica) is a return, with the age of the first sighting; a later
/// one is a retry; deferred again, the next is a return again. The id
/// keeps its expiry throughout.
#[tokio::test]
async fn a_return_consumes_its_deferral_across_the_fleet() {
    let Some(server) = Server::start("a_return_consumes_its_deferral_across_the_fleet") else {
        return;
    };
    let url = server.url();
    let a = FleetStore::connect(&url, "fleet", DEADLINE).await.unwrap();
    let b = FleetStore::connect(&url, "fleet", DEADLINE).await.unwrap();
    let deadline = Duration::from_millis(1_500);
    let is_return =
        |s: Sighting| matches!(s, Sighting::Deferred { age_seconds } if age_seconds < 1.5);
    assert_eq!(
        a.sighting("p3", "x", deadline).await.unwrap(),
        Sighting::First
    );
    a.deferred("p3", "x", deadline).await.unwrap();
    let back = b.sighting("p3", "x", deadline).await.unwrap();
    assert!(is_return(back), "the return on b: {back:?}");
    // Passed upstream, failed: the client's retries are retries.
    for store in [&a, &b, &a] {
        assert_eq!(
            store.sighting("p3", "x", deadline).await.unwrap(),
            Sighting::Again
        );
    }
    // A retry deferred again returns as a return once more.
    b.deferred("p3", "x", deadline).await.unwrap();
    let back = a.sighting("p3", "x", deadline).await.unwrap();
    assert!(is_return(back), "the second return on a: {back:?}");
    assert_eq!(
        b.sighting("p3", "x", deadline).await.unwrap(),
        Sighting::Again
    );
    // Forgotten at the first sighting's expiry.
    tokio::time::sleep(deadline + Duration::from_millis(100)).await;
    assert_eq!(
        b.sighting("p3", "x", deadline).await.unwrap(),
        Sighting::First
    );
}

#[tokio::test]
async fn a_store_that_goes_away_is_an_error_within_the_deadline_then_back() {
    let Some(mut server) =
        Server::start("a_store_that_goes_away_is_an_error_within_the_deadline_then_back")
    else {
        return;
    };
    let store = FleetStore::connect(&server.url(), "fleet", DEADLINE)
        .await
        .unwrap();
    let lane = FleetLimits {
        rate: 100.0,
        burst: 10.0,
    };
    assert!(store.take("p1", lane, 1).await.is_ok());
    server.stop();
    let asked = Instant::now();
    assert!(store.take("p1", lane, 1).await.is_err());
    assert!(
        asked.elapsed() < DEADLINE * 4,
        "a down store answered after {:?}",
        asked.elapsed()
    );
    server.restart();
    let back = Instant::now();
    loop {
        if store.take("p1", lane, 1).await.is_ok() {
            break;
        }
        assert!(back.elapsed() < Duration::from_secs(5), "never reconnected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_store_that_is_not_there_fails_to_connect_quickly() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let asked = Instant::now();
    let r = FleetStore::connect(&format!("redis://127.0.0.1:{port}"), "fleet", DEADLINE).await;
    assert!(r.is_err());
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}",
        asked.elapsed()
    );
    assert!(
        FleetStore::connect("http://not-a-store", "fleet", DEADLINE)
            .await
            .is_err()
    );
}

/// A CA and a certificate for 127.0.0.1 signed by it, written to a fresh
/// directory as `ca.pem`, `cert.pem` and `key.pem`.
fn tls_dir(test: &str) -> Scratch {
    let dir = Scratch::new(test);
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, "store ca");
    let ca = CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, "store");
    p.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse().unwrap())];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    std::fs::write(dir.join("cert.pem"), p.signed_by(&key, &ca).unwrap().pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    dir
}

/// `rediss://`: the store's certificate is checked against the CA given
/// (`--shared-state-ca`); a store whose certificate chains to no trusted
/// root is not reached.
#[tokio::test]
async fn a_tls_store_is_reached_with_its_ca_and_not_without() {
    let test = "a_tls_store_is_reached_with_its_ca_and_not_without";
    let dir = tls_dir(test);
    let how = Serve {
        tls: Some(dir.to_path_buf()),
        password: None,
    };
    let Some(server) = Server::start_with(test, how) else {
        return;
    };
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let ca = std::fs::read(dir.join("ca.pem")).unwrap();
    let wait = Duration::from_secs(2);
    let store = FleetStore::connect_with(&url, None, Some(&ca), "tls", wait)
        .await
        .unwrap();
    let lane = FleetLimits {
        rate: 1.0,
        burst: 5.0,
    };
    assert_eq!(store.take("p1", lane, 3).await.unwrap(), 3);
    assert!(
        FleetStore::connect_with(&url, None, None, "tls", wait)
            .await
            .is_err(),
        "the system's roots do not know the store's CA"
    );
    assert!(
        FleetStore::connect_with(
            &format!("redis://127.0.0.1:{}", server.port),
            None,
            None,
            "tls",
            wait
        )
        .await
        .is_err(),
        "plain text to a TLS port"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The slot script does `lanes::fleet_slots::FleetSlots`'s arithmetic:
/// holdings never add up past the maximum, a replica hears how many of
/// the others' requests wait, and a replica that stops renewing (it
/// crashed) loses its slots to the others once its lease runs out.
#[tokio::test]
async fn slot_holdings_stay_under_the_maximum_and_a_crashed_replicas_come_back() {
    use lanekeeper::gateway::fleet_store_slots::{SlotCall, SlotCount};
    use lanes::fleet_slots::SlotOp;
    /// (granted, others waiting) of each call.
    struct Slots<'a>(&'a FleetStore);
    impl Slots<'_> {
        async fn slots(&self, c: SlotCall<'_>) -> Result<(u64, u64), String> {
            let g = self.0.slots(c).await.map_err(|e| e.to_string())?;
            Ok((g.granted, g.others_waiting))
        }
    }
    let Some(server) =
        Server::start("slot_holdings_stay_under_the_maximum_and_a_crashed_replicas_come_back")
    else {
        return;
    };
    let store = FleetStore::connect(&server.url(), "fleet", DEADLINE)
        .await
        .unwrap();
    let call = |replica: &'static str, op, waiting, lease_ms| SlotCall {
        count: SlotCount::Tenant {
            lane: "p/l",
            tenant: "team-a",
        },
        replica,
        op,
        waiting,
        max: 4,
        lease: Duration::from_millis(lease_ms),
        held: 0,
    };
    let g = |granted, others_waiting| (granted, others_waiting);
    let s = &Slots(&store);
    assert_eq!(
        s.slots(call("dead", SlotOp::Take(3), 0, 400))
            .await
            .unwrap(),
        g(3, 0)
    );
    assert_eq!(
        s.slots(call("b", SlotOp::Take(3), 0, 5_000)).await.unwrap(),
        g(1, 0)
    );
    assert_eq!(
        s.slots(call("b", SlotOp::Take(1), 0, 5_000)).await.unwrap(),
        g(0, 0),
        "all four held"
    );
    assert_eq!(
        s.slots(call("c", SlotOp::Take(0), 0, 5_000)).await.unwrap(),
        g(0, 1),
        "b waits for one"
    );
    // Another count is another count.
    let pool = SlotCall {
        count: SlotCount::Pool { profile: "p" },
        ..call("b", SlotOp::Take(2), 0, 5_000)
    };
    assert_eq!(s.slots(pool).await.unwrap(), g(2, 0));
    let held = store
        .slots(call("c", SlotOp::Take(0), 0, 5_000))
        .await
        .unwrap();
    assert_eq!(held.others_held, 4, "dead's three and b's one");
    // "dead" never renews: after its lease its three are b's to take.
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(
        s.slots(call("b", SlotOp::Take(5), 0, 5_000)).await.unwrap(),
        g(3, 0)
    );
    assert_eq!(
        s.slots(call("b", SlotOp::GiveBack(2), 0, 5_000))
            .await
            .unwrap(),
        g(0, 0)
    );
    assert_eq!(
        s.slots(call("c", SlotOp::Take(9), 0, 5_000)).await.unwrap(),
        g(2, 0)
    );
}

/// A store that forgets the slot holdings (flushed here; the same for an
/// eviction, a failover to a lagging copy, its clock stepped past every
/// lease) while no call fails: the replicas' renewals carry what they hold,
/// so the store counts it again before it grants anyone else. Before, A's
/// renewal wrote a holding of 0 and B was granted the whole maximum again:
/// eight in flight under a `maxConcurrency` of 4.
#[tokio::test]
async fn a_store_that_forgets_slot_holdings_counts_them_again_from_the_renewals() {
    use lanekeeper::gateway::fleet_store_slots::{SlotCall, SlotCount};
    use lanes::fleet_slots::SlotOp;
    let Some(server) =
        Server::start("a_store_that_forgets_slot_holdings_counts_them_again_from_the_renewals")
    else {
        return;
    };
    let store = FleetStore::connect(&server.url(), "fleet", DEADLINE)
        .await
        .unwrap();
    let call = |replica: &'static str, op, held| SlotCall {
        count: SlotCount::Tenant {
            lane: "p/l",
            tenant: "team-a",
        },
        replica,
        op,
        waiting: 0,
        max: 4,
        lease: Duration::from_secs(5),
        held,
    };
    let granted = async |c: SlotCall<'_>| store.slots(c).await.unwrap().granted;
    assert_eq!(granted(call("a", SlotOp::Take(4), 0)).await, 4);
    let client = redis::Client::open(server.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
    // A renews what it holds (a take of 0, holding 4).
    assert_eq!(granted(call("a", SlotOp::Take(0), 4)).await, 0);
    assert_eq!(
        granted(call("b", SlotOp::Take(4), 0)).await,
        0,
        "A's four are counted again: nothing is free"
    );
    // A gives two back: it holds two, and B may have them.
    assert_eq!(granted(call("a", SlotOp::GiveBack(2), 2)).await, 0);
    assert_eq!(granted(call("b", SlotOp::Take(4), 0)).await, 2);
    // Flushed again before A's give back: its count after the give back
    // (one) is what the store keeps, and B's take carries its two, so B
    // gets the one left and no more.
    let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
    assert_eq!(granted(call("a", SlotOp::GiveBack(1), 1)).await, 0);
    assert_eq!(granted(call("b", SlotOp::Take(4), 2)).await, 1);
    assert_eq!(granted(call("c", SlotOp::Take(1), 0)).await, 0);
}

/// The replicas sharing a profile's budgets, counted in the store: each
/// note counts once, this replica's included, and a note that is not a
/// time (another writer) is dropped, never counted.
#[tokio::test]
async fn sharing_replicas_are_counted_once_each_and_garbage_is_not_a_replica() {
    let Some(server) =
        Server::start("sharing_replicas_are_counted_once_each_and_garbage_is_not_a_replica")
    else {
        return;
    };
    let store = FleetStore::connect(&server.url(), "fleet", DEADLINE)
        .await
        .unwrap();
    assert_eq!(store.heartbeat("ns/p", "a").await.unwrap(), 1);
    assert_eq!(store.heartbeat("ns/p", "a").await.unwrap(), 1, "once each");
    assert_eq!(store.heartbeat("ns/p", "b").await.unwrap(), 2);
    assert_eq!(
        store.heartbeat("ns/other", "c").await.unwrap(),
        1,
        "per profile"
    );
    let client = redis::Client::open(server.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("HSET")
        .arg("fleet:pool:ns/p:replicas")
        .arg("x")
        .arg("nan")
        .arg("y")
        .arg("soon")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(store.heartbeat("ns/p", "a").await.unwrap(), 2);
    let left: Vec<String> = redis::cmd("HKEYS")
        .arg("fleet:pool:ns/p:replicas")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(left.len(), 2, "garbage dropped: {left:?}");
}
