//! The gateway's routes on real sockets: an upstream answering 500 opens
//! its route's breaker (only probes reach it while open) and the breaker
//! closes when the upstream recovers; an upstream answering 429 with
//! `Retry-After: 5` slows its route; refusals' `Retry-After` tracks the real
//! wait; the official OpenAI Python client does not retry a paused lane and
//! retries a deferral after its wait.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::gateway::{
    ConfigFile, Proc, client, config_file, control, gateway_to, inc47, lane_mut, metrics, model,
    ready, sample,
};

fn chat(c: &reqwest::Client, gw: &Proc, lane: &str) -> reqwest::RequestBuilder {
    c.post(format!("http://{}/v1/chat/completions", gw.addr))
        .header("content-type", "application/json")
        .header("x-lanekeeper-lane", lane)
        .body(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string())
}

async fn set(c: &reqwest::Client, m: &Proc, v: Value) {
    let r = c
        .put(format!("http://{}/control", m.addr))
        .body(v.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Chat requests the fake model received so far.
async fn received(c: &reqwest::Client, m: &Proc) -> u64 {
    control(c, m).await["chatRequests"].as_u64().unwrap()
}

/// A model, and a gateway in front of it enforcing `cfg` (its file, held
/// while the gateway runs), loaded.
async fn up(
    test: &str,
    cfg: &Value,
    model_args: &[&str],
) -> (Proc, Proc, reqwest::Client, ConfigFile) {
    let m = model(model_args);
    let path = config_file(test, cfg);
    let gw = gateway_to(&path, &m.addr, &[]);
    let c = client();
    ready(&c, &gw).await;
    (m, gw, c, path)
}

const P1: &str = "p1-agent-assist";

#[tokio::test]
async fn an_upstream_answering_500_opens_the_breaker_only_probes_reach_it_and_it_closes_on_recovery()
 {
    let mut cfg = inc47();
    cfg["breakers"] = json!({"default": {
        "consecutiveFailures": 3, "failureRatioPercent": 0, "openSeconds": 1.0,
        "probeJitterPercent": 0, "closeAfterSuccesses": 2
    }});
    let (m, gw, c, _cfg) = up("breaker-500", &cfg, &["--service-millis", "0"]).await;
    set(&c, &m, json!({"chatStatus": 500})).await;
    // Three failures in a row reach the upstream and open the breaker.
    for _ in 0..3 {
        assert_eq!(chat(&c, &gw, P1).send().await.unwrap().status(), 500);
    }
    assert_eq!(received(&c, &m).await, 3);
    // For 2.5 s a request every 50 ms: the route gets only the probes (one
    // per second of open time), everything else is 503 naming the route.
    let started = Instant::now();
    let mut kept_off = 0;
    let mut probed = 0;
    while started.elapsed() < Duration::from_millis(2500) {
        let r = chat(&c, &gw, P1).send().await.unwrap();
        match r.status().as_u16() {
            503 => {
                let retry: u64 = r.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!((1..=2).contains(&retry), "Retry-After {retry}");
                assert_eq!(r.headers()["x-should-retry"], "true");
                let b: Value = r.json().await.unwrap();
                assert_eq!(b["error"]["code"], "breaker_open");
                let msg = b["error"]["message"].as_str().unwrap();
                assert!(msg.contains("route agent-large"), "{msg}");
                kept_off += 1;
            }
            500 => probed += 1,
            s => panic!("status {s}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reached = received(&c, &m).await - 3;
    assert_eq!(reached, probed);
    assert!((1..=3).contains(&reached), "{reached} probes in 2.5 s");
    assert!(kept_off >= 30, "only {kept_off} kept off");
    // The upstream recovers: after the open time two probes close it.
    set(&c, &m, json!({"chatStatus": 0})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut ok = 0;
    for _ in 0..20 {
        if chat(&c, &gw, P1).send().await.unwrap().status() == 200 {
            ok += 1;
        }
    }
    assert_eq!(ok, 20, "a probe, a probe, then the route is closed");
    let text = metrics(&c, &gw).await;
    let state = |s: &str| {
        sample(
            &text,
            &[
                "lanekeeper_gateway_route_breaker_state{",
                "route=\"agent-large\"",
                &format!("state=\"{s}\""),
            ],
        )
    };
    assert_eq!((state("closed"), state("open")), (1.0, 0.0));
    let moved = |from: &str, to: &str| {
        sample(
            &text,
            &[
                "lanekeeper_gateway_route_breaker_transitions_total{",
                &format!("from=\"{from}\""),
                "route=\"agent-large\"",
                &format!("to=\"{to}\""),
            ],
        )
    };
    assert_eq!(moved("half_open", "closed"), 1.0);
    assert_eq!(moved("closed", "open"), 1.0);
    assert!(moved("half_open", "open") >= 1.0);
}

#[tokio::test]
async fn an_upstream_429_with_retry_after_5_slows_its_route() {
    let cfg = inc47();
    let (m, gw, c, _cfg) = up("pace-429", &cfg, &["--service-millis", "300"]).await;
    set(&c, &m, json!({"chatStatus": 429, "chatRetryAfter": 5})).await;
    let burst = |n: usize| {
        let reqs: Vec<_> = (0..n).map(|_| chat(&c, &gw, P1).send()).collect();
        futures::future::join_all(reqs)
    };
    // Eight at once, all pushed back by the upstream (passed through).
    for r in burst(8).await {
        assert_eq!(r.unwrap().status(), 429);
    }
    // The upstream is fine again, but asked for 5 s: the route now takes
    // half of its peak of 8 at once.
    set(&c, &m, json!({"chatStatus": 0, "chatInFlightPeak": 0})).await;
    let before = received(&c, &m).await;
    let mut ok = 0;
    let mut paced = 0;
    for r in burst(8).await {
        let r = r.unwrap();
        match r.status().as_u16() {
            200 => ok += 1,
            429 => {
                let retry: u64 = r.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                // The rest of the 5 s hold, then 1.25 s for the share to
                // grow from 4 of 8 to 5 of 8: about 6.2 s, rounded up.
                assert!((5..=7).contains(&retry), "Retry-After {retry}");
                assert_eq!(r.headers()["x-should-retry"], "true");
                let b: Value = r.json().await.unwrap();
                assert_eq!(b["error"]["code"], "route_paced");
                paced += 1;
            }
            s => panic!("status {s}"),
        }
    }
    assert_eq!((ok, paced), (4, 4));
    let ctl = control(&c, &m).await;
    assert_eq!(ctl["chatRequests"].as_u64().unwrap() - before, 4);
    assert!(ctl["chatInFlightPeak"].as_u64().unwrap() <= 4);
    let text = metrics(&c, &gw).await;
    assert!(
        sample(
            &text,
            &[
                "lanekeeper_gateway_upstream_push_backs_total{",
                "route=\"agent-large\"",
                "status=\"429\""
            ]
        ) >= 1.0
    );
    assert_eq!(
        sample(
            &text,
            &["lanekeeper_gateway_route_share{", "route=\"agent-large\""]
        ),
        0.5
    );
    // After the 5 s hold the share grows back by a tenth a second.
    tokio::time::sleep(Duration::from_millis(5_600)).await;
    let mut ok = 0;
    for r in burst(8).await {
        if r.unwrap().status() == 200 {
            ok += 1;
        }
    }
    assert!(ok == 4 || ok == 5, "{ok} at 0.5 + 0.1 x ~0.6 s of 8");
}

#[tokio::test]
async fn retry_after_tracks_the_real_wait_within_a_factor_of_two() {
    let mut cfg = inc47();
    // P2 at 4 requests/s, a burst of 1 and room for 12 to wait.
    let p2 = lane_mut(&mut cfg, "p2-email-extract");
    p2["admittedRequestsPerSecond"] = json!(4.0);
    p2["burst"] = json!(1);
    p2["queue"]["maxDepth"] = json!(12);
    p2["floorUnitsPerSecond"] = Value::Null;
    p2["spareCapacity"] = json!(false);
    let (_m, gw, c, _cfg) = up("retry-after", &cfg, &["--service-millis", "0"]).await;
    let lane = "p2-email-extract";
    // One passes, twelve wait: the queue is full.
    let waiting: Vec<_> = (0..13)
        .map(|_| {
            let r = chat(&c, &gw, lane).send();
            tokio::spawn(async move {
                let r = r.await.unwrap();
                (r.status().as_u16(), Instant::now())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let refused_at = Instant::now();
    let r = chat(&c, &gw, lane).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-should-retry"], "true");
    let told: f64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let msg = r.json::<Value>().await.unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(msg.contains("queue is full"), "{msg}");
    // The real wait: until the last of the queue was served.
    let mut last = refused_at;
    for w in waiting {
        let (status, at) = w.await.unwrap();
        assert_eq!(status, 200);
        last = last.max(at);
    }
    let real = last.duration_since(refused_at).as_secs_f64();
    assert!(
        told <= 2.0 * real && told >= real / 2.0,
        "told {told} s, the queue drained in {real:.2} s"
    );
}

/// The OpenAI Python client, when the machine has it (`.ci/run` installs
/// it; `LANEKEEPER_REQUIRE_OPENAI=1` makes its absence a failure).
fn python_with_openai() -> Option<String> {
    let python = std::env::var("LANEKEEPER_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let has = std::process::Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if has {
        return Some(python);
    }
    assert!(
        std::env::var("LANEKEEPER_REQUIRE_OPENAI").as_deref() != Ok("1"),
        "{python} cannot import openai (pip install openai)"
    );
    eprintln!("SKIPPED: {python} cannot import openai (pip install openai)");
    None
}

const SDK_SCRIPT: &str = r#"
import json, sys, time, openai
base, lane, keys = sys.argv[1], sys.argv[2], sys.argv[3:]
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=2)
def call(key):
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-lanekeeper-lane": lane, "idempotency-key": key})
# Every key but the last goes first, back to back (taking the lane's tokens).
for k in keys[:-1]:
    call(k)
started = time.monotonic()
out = {}
try:
    call(keys[-1])
    out["status"] = 200
except openai.APIStatusError as e:
    out["status"] = e.status_code
    out["message"] = e.message
out["seconds"] = time.monotonic() - started
print(json.dumps(out))
"#;

/// The client's requests on `lane` with `keys` as idempotency keys, one
/// after the other: the last one's status, message and seconds.
async fn sdk_call(python: &str, gw: &Proc, lane: &str, keys: &[&str]) -> Value {
    let mut args = vec![
        "-c".to_owned(),
        SDK_SCRIPT.to_owned(),
        format!("http://{}/v1", gw.addr),
        lane.to_owned(),
    ];
    args.extend(keys.iter().map(|k| (*k).to_owned()));
    let python = python.to_owned();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .args(args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn the_openai_client_does_not_retry_a_paused_lane_and_retries_a_deferral_after_its_wait() {
    let Some(python) = python_with_openai() else {
        return;
    };
    let mut cfg = inc47();
    let p3 = lane_mut(&mut cfg, "p3-shift-batch");
    p3["admittedRequestsPerSecond"] = json!(0.5);
    p3["burst"] = json!(1);
    p3["queue"]["maxDepth"] = json!(0);
    let (_m, gw, c, _cfg) = up("openai-sdk", &cfg, &["--service-millis", "0"]).await;
    // Paused: one attempt, no retry (its Retry-After is 300 s anyway, but
    // x-should-retry says so first).
    let paused = sdk_call(&python, &gw, "p4-eval-backfill", &["eval-1"]).await;
    assert_eq!(paused["status"], 429, "{paused}");
    assert!(
        paused["message"].as_str().unwrap().contains("is paused"),
        "{paused}"
    );
    // P3's token goes to job-1; job-2, right after it, is deferred for 2 s
    // (one token at 0.5/s), and the client comes back after it, admitted
    // as a return.
    let deferred = sdk_call(&python, &gw, "p3-shift-batch", &["job-1", "job-2"]).await;
    assert_eq!(deferred["status"], 200, "{deferred}");
    let seconds = deferred["seconds"].as_f64().unwrap();
    assert!(seconds >= 1.5, "came back after {seconds} s");
    let text = metrics(&c, &gw).await;
    let count = |lane: &str, frags: &[&str]| {
        let lane = format!("lane=\"{lane}\"");
        let mut all = vec!["lanekeeper_gateway_requests_total{", lane.as_str()];
        all.extend_from_slice(frags);
        sample(&text, &all)
    };
    assert_eq!(
        count("p4-eval-backfill", &["outcome=\"rejected_rate\""]),
        1.0
    );
    assert_eq!(
        count(
            "p3-shift-batch",
            &["attempt=\"original\"", "outcome=\"deferred\""]
        ),
        1.0
    );
    assert_eq!(
        count(
            "p3-shift-batch",
            &["attempt=\"returning\"", "outcome=\"admitted\""]
        ),
        1.0
    );
}
