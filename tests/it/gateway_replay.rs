//! `simulate` and the real gateway agree: the arrivals (and the returns
//! after deferrals) that `simulate` drew are replayed, faster, through the
//! real `lanekeeper gateway` in front of `lanekeeper-fake-model`, with the
//! configs the simulated controller published switched in at the same
//! (scaled) times, and both must admit and refuse the same number of
//! requests per lane, within 2 % plus one request.
//!
//! - `examples/replay`: queues and refusals in every lane.
//! - `examples/replay-pressure`: an in-flight limit that binds, a `Defer`
//!   lane whose deferred requests come back, and a lane borrowing another's
//!   floor. Each answer takes the time the simulated pool took to answer
//!   that request (`x-fake-service-millis`), so the gateway sees the same
//!   requests in flight.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lanekeeper::sim::Run;
use serde_json::Value;

use crate::gateway::{chat, client, config_file, gateway, model, ready, root, write_config};

/// Seconds `s` of the simulation at `speedup` times the pace, which must
/// come out whole.
fn whole(s: i64, speedup: f64) -> i64 {
    let v = s as f64 / speedup;
    assert_eq!(v.fract(), 0.0, "{s} s does not scale to whole seconds");
    v as i64
}

/// `simulate`'s gateway config at `speedup` times the pace: rates times
/// `speedup`, durations divided by it (token counts, queue depths and
/// limits stay as they are). `start_unix` is the wall clock at the
/// replay's start: a borrowing grant that lapses at simulated second `E`
/// (the simulation's clock starts at 0) lapses at `start_unix + E /
/// speedup`.
fn faster(cfg: &lanes::GatewayConfig, speedup: f64, start_unix: f64) -> Value {
    let mut c = cfg.clone();
    c.capacity_units_per_second = c.capacity_units_per_second.map(|u| u * speedup);
    if let Some(f) = c.in_flight.as_mut() {
        f.resume_after_stable_seconds = f.resume_after_stable_seconds.map(|s| whole(s, speedup));
    }
    for l in &mut c.lanes {
        l.admitted_requests_per_second *= speedup;
        l.admitted_units_per_second *= speedup;
        l.floor_units_per_second = l.floor_units_per_second.map(|u| u * speedup);
        l.expected_service_seconds = l.expected_service_seconds.map(|s| s / speedup);
        l.deadline_seconds = whole(l.deadline_seconds, speedup);
        l.queue.ttl_seconds = whole(l.queue.ttl_seconds, speedup);
        for b in &mut l.borrowing {
            b.units_per_second *= speedup;
            b.release_within_seconds = whole(b.release_within_seconds, speedup);
            let lapses = start_unix + b.expires_at.as_second() as f64 / speedup;
            b.expires_at = lanes::jiff::Timestamp::from_second(lapses as i64).unwrap();
        }
        // What a deferral tells the client only: the replay sends each
        // return when the simulated client came back.
        if let Some(d) = l.deferral.as_mut() {
            d.retry_after_seconds = (d.retry_after_seconds as f64 / speedup).ceil().max(1.0) as i64;
        }
    }
    c.content_hash = lanes::hash(&c);
    serde_json::to_value(&c).unwrap()
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// What the gateway answered, per lane of the run.
struct Replayed {
    admitted: Vec<u64>,
    refused: Vec<u64>,
    /// Each lane's arrivals in the trace (originals, retries, returns).
    sent: Vec<u64>,
}

/// The attempt's answer: admitted (a 200, an answer cut at its deadline, or
/// a 504 when the upstream outlived the deadline: admitted, then late),
/// refused (a 429, deferrals included), or
/// anything else, which fails the test.
enum Answer {
    Admitted,
    Refused,
    Other(String),
}

async fn answer(req: reqwest::RequestBuilder) -> Answer {
    match req.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            match (status, r.bytes().await) {
                (200, Ok(_)) => Answer::Admitted,
                (429, Ok(_)) => Answer::Refused,
                (200, Err(e)) if !e.is_connect() && !e.is_timeout() => Answer::Admitted,
                // Admitted, and its upstream outlived the deadline: the
                // simulation's "late".
                (504, Ok(b)) if b.windows(27).any(|w| w == b"lanekeeper_upstream_timeout") => {
                    Answer::Admitted
                }
                (s, b) => Answer::Other(format!("{s}: {b:?}")),
            }
        }
        Err(e) => Answer::Other(e.to_string()),
    }
}

/// Replays `run`'s trace at `speedup` through a gateway in front of a fake
/// model answering after `model_millis`; with `timed`, each request the
/// simulation admitted takes as long as its simulated pool took.
async fn replay(name: &str, run: &Run, speedup: f64, model_millis: u64, timed: bool) -> Replayed {
    let trace = run.trace.as_ref().unwrap();
    let lanes: Vec<&str> = run.lanes.iter().map(|l| l.name.as_str()).collect();
    let m = model(&["--service-millis", &model_millis.to_string()]);
    let path = config_file(name, &faster(&trace.configs[0].2, speedup, unix_now()));
    let gw = gateway(&path, &m, &["--route", &format!("pool=http://{}", m.addr)]);
    let c = client();
    ready(&c, &gw).await;
    let start = tokio::time::Instant::now();
    let start_unix = unix_now();
    write_config(&path, &faster(&trace.configs[0].2, speedup, start_unix));
    let at = move |t: f64| start + Duration::from_secs_f64(t / speedup);
    let configs: Vec<(f64, Value)> = trace.configs[1..]
        .iter()
        .map(|(t, _, cfg)| (*t, faster(cfg, speedup, start_unix)))
        .collect();
    let writer = {
        let path = path.to_path_buf();
        tokio::spawn(async move {
            for (t, cfg) in configs {
                tokio::time::sleep_until(at(t)).await;
                write_config(&path, &cfg);
            }
        })
    };
    let mut tasks = Vec::with_capacity(trace.arrivals.len());
    let mut late = Duration::ZERO;
    let mut sent = vec![0u64; lanes.len()];
    for a in &trace.arrivals {
        let when = at(a.at);
        tokio::time::sleep_until(when).await;
        late = late.max(tokio::time::Instant::now() - when);
        sent[a.lane] += 1;
        let mut req = chat(&c, &gw, Some(lanes[a.lane]))
            .header("x-request-id", a.request_id.to_string())
            .header("x-lanekeeper-attempt", a.attempt.to_string());
        if let Some(s) = trace
            .served
            .get(&(a.request_id, a.attempt))
            .filter(|_| timed)
        {
            let millis = (s / speedup * 1e3).round() as u64;
            req = req.header("x-fake-service-millis", millis.to_string());
        }
        let lane = a.lane;
        tasks.push(tokio::spawn(async move { (lane, answer(req).await) }));
    }
    writer.await.unwrap();
    let mut out = Replayed {
        admitted: vec![0; lanes.len()],
        refused: vec![0; lanes.len()],
        sent,
    };
    for t in tasks {
        match t.await.unwrap() {
            (l, Answer::Admitted) => out.admitted[l] += 1,
            (l, Answer::Refused) => out.refused[l] += 1,
            (l, Answer::Other(what)) => panic!("lane {}: {what}", lanes[l]),
        }
    }
    eprintln!(
        "replayed {} arrivals at {speedup}x in {:.1} s (latest send {:.1} ms behind schedule)",
        trace.arrivals.len(),
        start.elapsed().as_secs_f64(),
        late.as_secs_f64() * 1e3
    );
    drop((gw, m));
    out
}

/// Per lane: the simulation's admitted and refused counts against the
/// gateway's, within 2 % plus one request.
fn assert_agree(run: &Run, g: &Replayed) {
    let within = |a: u64, b: u64| (a as f64 - b as f64).abs() <= 0.02 * a.max(b) as f64 + 1.0;
    for (i, l) in run.lanes.iter().enumerate() {
        let sim_refused = g.sent[i] - l.admitted;
        eprintln!(
            "{:<16} admitted sim {:>5} gateway {:>5}   refused sim {:>5} gateway {:>5}",
            l.name, l.admitted, g.admitted[i], sim_refused, g.refused[i]
        );
    }
    for (i, l) in run.lanes.iter().enumerate() {
        let sim_refused = g.sent[i] - l.admitted;
        assert!(
            within(l.admitted, g.admitted[i]),
            "{}: admitted {} simulated, {} through the gateway",
            l.name,
            l.admitted,
            g.admitted[i]
        );
        assert!(
            within(sim_refused, g.refused[i]),
            "{}: refused {} simulated, {} through the gateway",
            l.name,
            sim_refused,
            g.refused[i]
        );
    }
}

/// The manifests and scenario of the example in `dir`.
fn example(dir: &str) -> (lanekeeper::policy::World, lanekeeper::sim::Scenario) {
    let loaded =
        lanekeeper::manifest::load(&[root().join(format!("examples/{dir}/manifests.yaml"))])
            .unwrap();
    let sc =
        lanekeeper::scenario::load(&root().join(format!("examples/{dir}/scenario.yaml"))).unwrap();
    (loaded.world, sc)
}

/// `simulate` of the example in `dir` with its trace; every request is
/// resolved by the end (arrivals stop early).
fn simulated(dir: &str) -> Run {
    let (world, sc) = example(dir);
    let run = lanekeeper::sim::run_traced(&world, &sc).unwrap();
    for l in &run.lanes {
        assert_eq!(l.queued_end + l.retrying_end + l.deferred_end, 0, "{l:?}");
        assert_eq!(l.attempts, l.offered, "no retries in this scenario");
    }
    let trace = run.trace.as_ref().unwrap();
    assert!(
        trace.configs.len() >= 2,
        "the controller changed the config"
    );
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_and_the_gateway_admit_and_refuse_the_same_replayed_traffic() {
    let run = simulated("replay");
    let g = replay("replay", &run, 4.0, 0, false).await;
    assert_agree(&run, &g);
    // The traffic is worth comparing: one lane is refused a lot, the
    // others not at all.
    assert!(g.refused.iter().any(|&r| r > 1000), "{:?}", g.refused);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn they_agree_under_an_in_flight_limit_with_deferral_and_borrowing() {
    let run = simulated("replay-pressure");
    let trace = run.trace.as_ref().unwrap();
    // The traffic exercises what this replay is for.
    let lane = |n: &str| run.lanes.iter().position(|l| l.name == n).unwrap();
    let batch = &run.lanes[lane("s3-batch")];
    assert!(batch.deferrals > 1000 && batch.returns > 1000, "{batch:?}");
    assert!(
        trace.configs.iter().any(|(_, _, c)| c
            .lanes
            .iter()
            .any(|l| l.name == "s3-batch" && !l.borrowing.is_empty())),
        "s3-batch borrows"
    );
    // The in-flight limit binds: without it the batch lane is never
    // deferred and loses nothing.
    let (mut world, sc) = example("replay-pressure");
    world.profiles[0].spec.in_flight = None;
    let unlimited =
        lanekeeper::sim::run(&world, &sc, lanekeeper::sim::Strategy::Lanekeeper).unwrap();
    let free = &unlimited.lanes[lane("s3-batch")];
    assert_eq!(
        (free.deferrals, free.admitted),
        (0, free.offered),
        "{free:?}"
    );
    assert!(batch.admitted + 50 < free.admitted, "{batch:?}");
    // At the simulation's own pace: the slots kept for P0 are one second of
    // its requests, which a faster replay would double.
    let g = replay("replay-pressure", &run, 1.0, 2000, true).await;
    assert_agree(&run, &g);
}
