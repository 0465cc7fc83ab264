//! `lanekeeper gateway` end to end: the real binary on real sockets, in front
//! of `lanekeeper-fake-model`, enforcing `lanes.json` files written here.
//! Each test starts its own model and gateway on free loopback ports.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub(crate) use crate::cli::root;
use crate::scratch::{Scratch, ScratchFile};

/// A child process killed when dropped, with the address it printed.
pub(crate) struct Proc {
    child: Child,
    pub(crate) addr: String,
    metrics: Option<String>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a binary that prints `listening on ADDR [metrics on ADDR]`.
fn spawn(bin: &str, args: &[&str]) -> Proc {
    spawn_with_env(bin, args, &[])
}

/// `spawn`, with these environment variables set.
pub(crate) fn spawn_with_env(bin: &str, args: &[&str], env: &[(&str, &Path)]) -> Proc {
    let mut child = Command::new(bin)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("{bin}: {e}"));
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"listening"), "{bin} printed {line:?}");
    Proc {
        child,
        addr: words[2].to_owned(),
        metrics: words.get(5).map(|s| (*s).to_owned()),
    }
}

pub(crate) fn model(args: &[&str]) -> Proc {
    let mut all = vec!["--listen", "127.0.0.1:0"];
    all.extend_from_slice(args);
    spawn(env!("CARGO_BIN_EXE_lanekeeper-fake-model"), &all)
}

pub(crate) fn gateway(config: &Path, model: &Proc, extra: &[&str]) -> Proc {
    gateway_to(config, &model.addr, extra)
}

/// A gateway whose every route is `http://{upstream}` (anything may
/// listen there, or nothing).
pub(crate) fn gateway_to(config: &Path, upstream: &str, extra: &[&str]) -> Proc {
    let routes: Vec<String> = ["agent-large", "extract-small", "batch-medium", "eval-large"]
        .iter()
        .map(|r| format!("{r}=http://{upstream}"))
        .collect();
    let mut args = vec![
        "gateway".to_owned(),
        "--listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--metrics-addr".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--config".to_owned(),
        config.display().to_string(),
        "--reload-millis".to_owned(),
        "50".to_owned(),
    ];
    for r in &routes {
        args.push("--route".to_owned());
        args.push(r.clone());
    }
    // The lane from the header, unless the test gives credentials (who
    // may use a lane is tested in `callers_need_a_credential_...` below
    // and in src/gateway/identity/).
    if !extra.contains(&"--credentials") {
        args.push("--trust-lane-header".to_owned());
    }
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    spawn(env!("CARGO_BIN_EXE_lanekeeper"), &refs)
}

/// The INC-47 config at 420 units/s as shipped.
pub(crate) fn inc47() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(root().join("examples/inc-47/lanes-420.json")).unwrap(),
    )
    .unwrap()
}

pub(crate) fn lane_mut<'a>(cfg: &'a mut Value, name: &str) -> &'a mut Value {
    cfg["lanes"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|l| l["name"] == name)
        .unwrap()
}

/// P2 at `rps` requests/s with a burst of `rps`, no queue, no spare capacity
/// and no floor (its 40 units/s, 57 req/s, would be reserved above that
/// rate).
fn p2_at(cfg: &mut Value, rps: u32) -> &mut Value {
    let p2 = lane_mut(cfg, "p2-email-extract");
    p2["admittedRequestsPerSecond"] = json!(f64::from(rps));
    p2["burst"] = json!(rps);
    p2["queue"]["maxDepth"] = json!(0);
    p2["floorUnitsPerSecond"] = Value::Null;
    // Only its own bucket: no spare capacity of the pool on top.
    p2["spareCapacity"] = json!(false);
    p2
}

/// A test's `lanes.json`, removed when dropped: hold it while the gateway
/// runs.
pub(crate) type ConfigFile = ScratchFile;

/// Writes `cfg` for `test`.
pub(crate) fn config_file(test: &str, cfg: &Value) -> ConfigFile {
    ScratchFile::new(
        &format!("gw-{test}"),
        "lanes.json",
        serde_json::to_vec_pretty(cfg).unwrap(),
    )
}

/// Writes atomically (rename), as kubelet swaps a mounted ConfigMap.
pub(crate) fn write_config(path: &Path, cfg: &Value) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(cfg).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap()
}

pub(crate) fn chat(c: &reqwest::Client, gw: &Proc, lane: Option<&str>) -> reqwest::RequestBuilder {
    let mut r = c
        .post(format!("http://{}/v1/chat/completions", gw.addr))
        .header("content-type", "application/json")
        .body(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string());
    if let Some(l) = lane {
        r = r.header("x-lanekeeper-lane", l);
    }
    r
}

/// A fake model streaming 50 tokens, one every 100 ms (a 5 s answer).
const SLOW_STREAM: [&str; 6] = [
    "--service-millis",
    "0",
    "--token-millis",
    "100",
    "--completion-tokens",
    "50",
];

/// A streaming chat request on `lane`, sent.
async fn stream(c: &reqwest::Client, gw: &Proc, lane: &str) -> reqwest::Response {
    chat(c, gw, Some(lane))
        .body(
            json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
                .to_string(),
        )
        .send()
        .await
        .unwrap()
}

/// The status of a plain chat request on `lane`.
pub(crate) async fn status_of(c: &reqwest::Client, gw: &Proc, lane: &str) -> reqwest::StatusCode {
    chat(c, gw, Some(lane)).send().await.unwrap().status()
}

/// Waits until the gateway answers something other than 503 "no config".
pub(crate) async fn ready(c: &reqwest::Client, gw: &Proc) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = c
            .get(format!("http://{}/readyz", gw.metrics.as_ref().unwrap()))
            .send()
            .await;
        if r.is_ok_and(|r| r.status() == 200) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the gateway never loaded its config"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) async fn metrics(c: &reqwest::Client, gw: &Proc) -> String {
    c.get(format!("http://{}/metrics", gw.metrics.as_ref().unwrap()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the first sample whose line contains every fragment.
pub(crate) fn sample(text: &str, fragments: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| fragments.iter().all(|f| l.contains(f)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

pub(crate) async fn control(c: &reqwest::Client, m: &Proc) -> Value {
    c.get(format!("http://{}/control", m.addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A fake model started with `model_args`, and a gateway in front of it
/// enforcing `cfg` (written for `test`) with `extra` flags, loaded.
struct Up {
    m: Proc,
    gw: Proc,
    path: ConfigFile,
    c: reqwest::Client,
}

async fn up(test: &str, cfg: &Value, model_args: &[&str], extra: &[&str]) -> Up {
    let m = model(model_args);
    let path = config_file(test, cfg);
    let gw = gateway(&path, &m, extra);
    let c = client();
    ready(&c, &gw).await;
    Up { m, gw, path, c }
}

#[tokio::test]
async fn no_config_means_no_admission_and_lanes_are_named() {
    let m = model(&[]);
    let dir = Scratch::new("gw-none");
    let gw = gateway(&dir.join("absent/lanes.json"), &m, &[]);
    let c = client();
    let r = chat(&c, &gw, Some("p0-disruption-assist"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "no_config");
    assert_eq!(
        control(&c, &m).await["chatRequests"],
        0,
        "nothing reached the pool"
    );

    let path = config_file("named", &inc47());
    let gw = gateway(&path, &m, &[]);
    ready(&c, &gw).await;
    for lane in [None, Some("nope")] {
        let r = chat(&c, &gw, lane).send().await.unwrap();
        assert_eq!(r.status(), 400);
        let body: Value = r.json().await.unwrap();
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(msg.contains("x-lanekeeper-lane"), "{msg}");
        assert!(
            msg.contains("p0-disruption-assist") && msg.contains("p4-eval-backfill"),
            "{msg}"
        );
        assert_eq!(body["error"]["code"], "unknown_lane");
    }
    let r = chat(&c, &gw, Some("p0-disruption-assist"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(control(&c, &m).await["chatRequests"], 1);
}

#[tokio::test]
async fn paused_lanes_are_refused_with_retry_after_and_the_rate_holds() {
    let mut cfg = inc47();
    // P2 at 20 req/s with a burst of 20 and no queue: 20 pass at once.
    let p2 = p2_at(&mut cfg, 20);
    p2["retryAfterSeconds"] = json!(3);
    let Up {
        m: _m,
        gw,
        path: _path,
        c,
    } = up("paused", &cfg, &["--service-millis", "0"], &[]).await;

    let r = chat(&c, &gw, Some("p4-eval-backfill"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "300");
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("p4-eval-backfill")
    );

    let mut ok = 0;
    let mut limited = 0;
    let started = Instant::now();
    for _ in 0..40 {
        let r = chat(&c, &gw, Some("p2-email-extract"))
            .send()
            .await
            .unwrap();
        match r.status().as_u16() {
            200 => ok += 1,
            429 => {
                // The expected wait (a token at 20/s), not the config's 3.
                assert_eq!(r.headers()["retry-after"], "1");
                let body: Value = r.json().await.unwrap();
                assert_eq!(body["error"]["code"], "rejected_queue_full");
                limited += 1;
            }
            s => panic!("status {s}"),
        }
    }
    // 20 of the burst, plus what refilled while the loop ran (20/s).
    let refilled = (20.0 * started.elapsed().as_secs_f64()).ceil() as usize;
    assert!(
        ok >= 20 && ok <= 20 + refilled,
        "admitted {ok}, {refilled} refilled"
    );
    assert_eq!(ok + limited, 40);
    let text = metrics(&c, &gw).await;
    assert_eq!(
        sample(
            &text,
            &[
                "lanekeeper_gateway_requests_total{",
                "lane=\"p2-email-extract\"",
                "outcome=\"admitted\""
            ]
        ),
        ok as f64
    );
    assert_eq!(
        sample(
            &text,
            &[
                "lanekeeper_gateway_requests_total{",
                "lane=\"p4-eval-backfill\"",
                "outcome=\"rejected_rate\""
            ]
        ),
        1.0
    );
}

#[tokio::test]
async fn a_defer_lane_defers_with_the_header_and_its_return_is_not_a_retry() {
    let mut cfg = inc47();
    let p3 = lane_mut(&mut cfg, "p3-shift-batch");
    p3["admittedRequestsPerSecond"] = json!(0.5);
    p3["burst"] = json!(1);
    p3["queue"]["maxDepth"] = json!(0);
    let Up {
        m: _m,
        gw,
        path: _path,
        c,
    } = up("defer", &cfg, &["--service-millis", "0"], &[]).await;
    let send = |id: &str| {
        chat(&c, &gw, Some("p3-shift-batch"))
            .header("idempotency-key", id)
            .send()
    };
    assert_eq!(send("job-1").await.unwrap().status(), 200);
    let r = send("job-2").await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["lanekeeper-deferred"], "true");
    // The expected wait: one token at 0.5/s (the controller's 150 s is
    // only the bound).
    assert_eq!(r.headers()["retry-after"], "2");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "lanekeeper_deferred");
    // It comes back after the token refilled: admitted, as a return.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(send("job-2").await.unwrap().status(), 200);
    let text = metrics(&c, &gw).await;
    assert_eq!(
        sample(
            &text,
            &[
                "lane=\"p3-shift-batch\"",
                "attempt=\"returning\"",
                "outcome=\"admitted\""
            ]
        ),
        1.0
    );
    assert_eq!(
        sample(&text, &["lane=\"p3-shift-batch\"", "attempt=\"retry\""]),
        0.0
    );
}

#[tokio::test]
async fn retries_beyond_the_budget_are_refused() {
    let Up {
        m: _m,
        gw,
        path: _path,
        c,
    } = up("retries", &inc47(), &["--service-millis", "0"], &[]).await;
    // P0: maxAttempts 2, budget 5 %: 20 originals pay for one retry.
    for i in 0..20 {
        let r = chat(&c, &gw, Some("p0-disruption-assist"))
            .header("x-request-id", format!("o-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let retry = |id: &str| {
        chat(&c, &gw, Some("p0-disruption-assist"))
            .header("x-request-id", id)
            .header("x-lanekeeper-attempt", "2")
            .send()
    };
    assert_eq!(retry("o-0").await.unwrap().status(), 200);
    let r = retry("o-1").await.unwrap();
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rejected_retry_budget");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("retry.budgetPercent")
    );
    // o-0 a third time: beyond maxAttempts 2, whatever the header says.
    let r = chat(&c, &gw, Some("p0-disruption-assist"))
        .header("x-request-id", "o-0")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("retry.maxAttempts")
    );
}

#[tokio::test]
async fn a_new_config_is_loaded_and_a_bad_one_keeps_the_last_good() {
    let mut cfg = inc47();
    let Up { m: _m, gw, path, c } = up("reload", &cfg, &["--service-millis", "0"], &[]).await;
    assert_eq!(status_of(&c, &gw, "p4-eval-backfill").await, 429);

    // P4 resumes in the next config: admitted within a reload or two.
    let p4 = lane_mut(&mut cfg, "p4-eval-backfill");
    p4["state"] = json!("Admitted");
    p4["admittedRequestsPerSecond"] = json!(10.0);
    p4["burst"] = json!(10);
    cfg["contentHash"] = json!("sha256:test-resumed");
    write_config(&path, &cfg);
    let deadline = Instant::now() + Duration::from_secs(10);
    while status_of(&c, &gw, "p4-eval-backfill").await != 200 {
        assert!(Instant::now() < deadline, "the new config was not loaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Garbage, then an unknown schema version: both refused (each waited
    // for in the metric), P4 still admitted.
    let invalid = |n: f64| {
        let (c, gw) = (&c, &gw);
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while sample(
                &metrics(c, gw).await,
                &["lanekeeper_gateway_config_loads_total", "invalid"],
            ) < n
            {
                assert!(Instant::now() < deadline, "config {n} not refused");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    std::fs::write(&path, b"{ not json").unwrap();
    invalid(1.0).await;
    let mut v2 = cfg.clone();
    v2["schemaVersion"] = json!(2);
    v2["contentHash"] = json!("sha256:test-v2");
    lane_mut(&mut v2, "p4-eval-backfill")["state"] = json!("Paused");
    write_config(&path, &v2);
    invalid(2.0).await;
    assert_eq!(status_of(&c, &gw, "p4-eval-backfill").await, 200);
    let text = metrics(&c, &gw).await;
    assert!(
        sample(&text, &["lanekeeper_gateway_config_loads_total", "invalid"]) >= 2.0,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            &["lanekeeper_gateway_config_info", "sha256:test-resumed"]
        ),
        1.0,
        "the last good config is in force"
    );
}

#[tokio::test]
async fn streams_pass_through_and_a_client_leaving_cancels_upstream() {
    let Up {
        m,
        gw,
        path: _path,
        c,
    } = up("stream", &inc47(), &SLOW_STREAM, &[]).await;
    let mut r = stream(&c, &gw, "p1-agent-assist").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let first = r.chunk().await.unwrap().expect("a first event");
    // Unbuffered: the first event is here while the 5 s answer is still
    // being generated upstream.
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));
    assert_eq!(control(&c, &m).await["chatInFlight"], 1);
    drop(r);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ctl = control(&c, &m).await;
        if ctl["chatCancelled"] == 1 {
            assert_eq!(ctl["chatInFlight"], 0);
            break;
        }
        assert!(Instant::now() < deadline, "upstream not cancelled: {ctl}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = metrics(&c, &gw).await;
    assert_eq!(sample(&text, &["lanekeeper_gateway_in_flight "]), 0.0);
}

#[tokio::test]
async fn the_floor_is_there_when_a_p0_burst_arrives_while_p3_borrows_it() {
    let mut cfg = inc47();
    // P0 was quiet (admitted 20 req/s) and lends 50.1 units/s of its 93.6
    // floor to P3 until well after the test.
    let p0 = lane_mut(&mut cfg, "p0-disruption-assist");
    p0["admittedRequestsPerSecond"] = json!(20.0);
    p0["admittedUnitsPerSecond"] = json!(36.0);
    p0["burst"] = json!(20);
    p0["floorUnitsPerSecond"] = json!(93.6);
    let p3 = lane_mut(&mut cfg, "p3-shift-batch");
    p3["borrowing"] = json!([{"from": "p0-disruption-assist", "unitsPerSecond": 50.1,
        "expiresAt": "2099-01-01T00:00:00Z", "releaseWithinSeconds": 30}]);
    let Up {
        m: _m,
        gw,
        path: _path,
        c,
    } = up("floor", &cfg, &["--service-millis", "0"], &[]).await;
    // A burst of 52 P0 requests (its whole floor, 93.6 / 1.8) at once.
    let burst: Vec<_> = (0..52)
        .map(|_| chat(&c, &gw, Some("p0-disruption-assist")).send())
        .collect();
    let statuses: Vec<u16> = futures::future::join_all(burst)
        .await
        .into_iter()
        .map(|r| r.unwrap().status().as_u16())
        .collect();
    let ok = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(ok, 52, "the floor's second is there at once: {statuses:?}");
    let text = metrics(&c, &gw).await;
    assert_eq!(
        sample(
            &text,
            &["lane=\"p0-disruption-assist\"", "outcome=\"admitted\""]
        ),
        52.0
    );
    assert_eq!(
        sample(
            &text,
            &["lane=\"p0-disruption-assist\"", "outcome=\"queued\""]
        ),
        0.0,
        "none of the burst waited"
    );
}

#[tokio::test]
async fn an_upstream_that_is_down_gets_502_naming_the_lane() {
    // A port with nothing listening: bind, read the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let down = Proc {
        child: Command::new("true").spawn().unwrap(),
        addr: format!("127.0.0.1:{port}"),
        metrics: None,
    };
    let path = config_file("down", &inc47());
    let gw = gateway(&path, &down, &[]);
    let c = client();
    ready(&c, &gw).await;
    let r = chat(&c, &gw, Some("p1-agent-assist")).send().await.unwrap();
    assert_eq!(r.status(), 502);
    let body: Value = r.json().await.unwrap();
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("p1-agent-assist") && msg.contains("agent-large"),
        "{msg}"
    );
    let text = metrics(&c, &gw).await;
    assert_eq!(
        sample(
            &text,
            &["lane=\"p1-agent-assist\"", "outcome=\"upstream_error\""]
        ),
        1.0
    );
}

#[tokio::test]
async fn observe_mode_admits_everything_and_counts_the_shadow() {
    let mut cfg = inc47();
    cfg["mode"] = json!("Observe");
    let Up {
        m,
        gw,
        path: _path,
        c,
    } = up("observe", &cfg, &["--service-millis", "0"], &[]).await;
    for _ in 0..3 {
        assert_eq!(status_of(&c, &gw, "p4-eval-backfill").await, 200);
    }
    let text = metrics(&c, &gw).await;
    assert_eq!(
        sample(
            &text,
            &[
                "lanekeeper_gateway_shadow_requests_total",
                "lane=\"p4-eval-backfill\"",
                "outcome=\"rejected_rate\""
            ]
        ),
        3.0
    );
    assert_eq!(control(&c, &m).await["chatRequests"], 3);
}

#[tokio::test]
async fn flags_and_degraded_history_reach_the_upstream() {
    let mut cfg = inc47();
    cfg["flags"]["readOnly"] = json!(true);
    let Up {
        m,
        gw,
        path: _path,
        c,
    } = up("flags", &cfg, &["--service-millis", "0"], &[]).await;
    // P1's history is 8 turns at this level: 12 turns are trimmed to the
    // system message and the last 8 (16 messages).
    let mut messages = vec![json!({"role": "system", "content": "s"})];
    for i in 0..12 {
        messages.push(json!({"role": "user", "content": format!("u{i}")}));
        messages.push(json!({"role": "assistant", "content": format!("a{i}")}));
    }
    let r = c
        .post(format!("http://{}/v1/chat/completions", gw.addr))
        .header("x-lanekeeper-lane", "p1-agent-assist")
        .body(json!({"model": "m", "messages": messages}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let ctl = control(&c, &m).await;
    assert_eq!(ctl["lastMessages"], 17);
    assert_eq!(ctl["lastHeaders"]["x-lanekeeper-read-only"], "true");
    assert_eq!(ctl["lastHeaders"]["x-lanekeeper-lane"], "p1-agent-assist");
}

#[tokio::test]
async fn spoofed_control_headers_and_credentials_stop_at_the_gateway_and_only_the_surface_is_forwarded()
 {
    let Up {
        m,
        gw,
        path: _path,
        c,
    } = up("spoof", &inc47(), &["--service-millis", "0"], &[]).await;
    let r = chat(&c, &gw, Some("p1-agent-assist"))
        .header("x-lanekeeper-static-fallback", "true")
        .header("x-lanekeeper-read-only", "true")
        .header("x-lanekeeper-attempt-kind", "returning")
        .header("x-lanekeeper-tenant", "someone-else")
        .header("authorization", "Bearer client-secret")
        .header("x-request-id", "req-42")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-request-id"], "req-42");
    assert_eq!(
        r.headers()["x-lanekeeper-decision"],
        "lane=p1-agent-assist; verdict=admitted; reason=within_rate"
    );
    let seen = control(&c, &m).await["lastHeaders"].clone();
    let expected = json!({
        "x-lanekeeper-lane": "p1-agent-assist",
        "x-lanekeeper-attempt-kind": "original",
        "x-request-id": "req-42",
    });
    assert_eq!(
        seen, expected,
        "only what the gateway sets reaches the upstream"
    );

    // The model server's admin endpoint is not on the surface.
    let before = control(&c, &m).await;
    for method in [reqwest::Method::PUT, reqwest::Method::GET] {
        let r = c
            .request(method.clone(), format!("http://{}/control", gw.addr))
            .header("x-lanekeeper-lane", "p0-disruption-assist")
            .body(r#"{"ready": false, "serviceMillis": 9999}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{method}");
    }
    let r = c
        .put(format!("http://{}/v1/chat/completions", gw.addr))
        .header("x-lanekeeper-lane", "p0-disruption-assist")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "POST");
    let after = control(&c, &m).await;
    assert_eq!(after["serviceMillis"], before["serviceMillis"]);
    assert_eq!(after["ready"], true);
    assert_eq!(after["chatRequests"], before["chatRequests"]);
}

/// INC-47 with P1's deadline at 1 s (and no expected service time to
/// refuse it beforehand).
fn p1_with_a_one_second_deadline() -> Value {
    let mut cfg = inc47();
    let p1 = lane_mut(&mut cfg, "p1-agent-assist");
    p1["deadlineSeconds"] = json!(1);
    p1["expectedServiceSeconds"] = Value::Null;
    cfg
}

#[tokio::test]
async fn a_stream_cut_by_its_deadline_ends_with_an_error_event_and_an_aborted_body() {
    let cfg = p1_with_a_one_second_deadline();
    let Up {
        m: _m,
        gw,
        path: _path,
        c,
    } = up("cut", &cfg, &SLOW_STREAM, &[]).await;
    let mut r = stream(&c, &gw, "p1-agent-assist").await;
    assert_eq!(r.status(), 200);
    let mut text = String::new();
    let end = loop {
        match r.chunk().await {
            Ok(Some(b)) => text.push_str(&String::from_utf8_lossy(&b)),
            Ok(None) => break "a clean end",
            Err(_) => break "an aborted body",
        }
    };
    assert_eq!(end, "an aborted body", "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    assert!(last.starts_with("event: error\ndata: "), "{last}");
    let data: Value = serde_json::from_str(last.rsplit("data: ").next().unwrap()).unwrap();
    assert_eq!(data["error"]["code"], "deadline");
    let page = metrics(&c, &gw).await;
    assert_eq!(
        sample(
            &page,
            &[
                "lanekeeper_gateway_responses_cut_total{",
                "p1-agent-assist",
                "deadline"
            ]
        ),
        1.0
    );
}

#[tokio::test]
async fn a_stream_whose_chunks_never_stop_coming_is_still_cut_at_its_deadline() {
    // The fake model streams as fast as it can, far longer than the lane's
    // deadline of 1 s: the gateway must not keep relaying past it because
    // a chunk is always ready.
    let cfg = p1_with_a_one_second_deadline();
    let endless = [
        "--service-millis",
        "0",
        "--token-millis",
        "0",
        "--completion-tokens",
        "100000000",
    ];
    let Up {
        m: _m,
        gw,
        path: _path,
        c,
    } = up("cut-endless", &cfg, &endless, &[]).await;
    let started = Instant::now();
    let mut r = stream(&c, &gw, "p1-agent-assist").await;
    assert_eq!(r.status(), 200);
    let (mut bytes, mut tail) = (0usize, String::new());
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match r.chunk().await {
                Ok(Some(b)) => {
                    bytes += b.len();
                    tail = String::from_utf8_lossy(&b).into_owned();
                }
                Ok(None) => break "a clean end",
                Err(_) => break "an aborted body",
            }
        }
    })
    .await;
    let end = read
        .unwrap_or_else(|_| panic!("still streaming 30 s after a 1 s deadline ({bytes} bytes)"));
    assert_eq!(end, "an aborted body");
    assert!(tail.contains(r#""code":"deadline""#), "{tail}");
    // The issue's bound with margin: cut at the deadline, not at the end
    // of the answer.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused() {
    let Up {
        m,
        gw,
        path: _path,
        c,
    } = up("body", &inc47(), &[], &["--max-body-bytes", "1024"]).await;
    let r = c
        .post(format!("http://{}/v1/chat/completions", gw.addr))
        .header("x-lanekeeper-lane", "p1-agent-assist")
        .body("x".repeat(4096))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(control(&c, &m).await["chatRequests"], 0);
}

#[tokio::test]
async fn each_replica_enforces_its_share() {
    let mut cfg = inc47();
    p2_at(&mut cfg, 40);
    let Up {
        m: _m,
        gw,
        path: _path,
        c,
    } = up(
        "share",
        &cfg,
        &["--service-millis", "0"],
        &["--replicas", "4"],
    )
    .await;
    let mut ok = 0;
    let started = Instant::now();
    for _ in 0..20 {
        if status_of(&c, &gw, "p2-email-extract").await == 200 {
            ok += 1;
        }
    }
    // A burst of 10 (40 / 4) and 10 req/s of refill while the loop ran.
    let refilled = (10.0 * started.elapsed().as_secs_f64()).ceil() as usize;
    assert!(
        ok >= 10 && ok <= 10 + refilled,
        "admitted {ok}, {refilled} refilled"
    );
}

/// The SHA-256 of a key, in hex, as a credentials file holds it.
pub(crate) fn key_hash(key: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Without `--trust-lane-header` a request needs a credential: none is a
/// 401 with `WWW-Authenticate`, a key for another lane a 403, and the
/// credentials file is followed (a key removed from it stops working).
#[tokio::test]
async fn callers_need_a_credential_and_the_credentials_file_is_followed() {
    let key_a = "sk-team-a-0123456789abcdef";
    let key_b = "sk-team-b-0123456789abcdef";
    let creds = |key: &str| {
        format!(
            "apiKeys:\n  - sha256: {}\n    tenant: team-a\n    lanes: [p1-agent-assist]\n",
            key_hash(key)
        )
    };
    let dir = Scratch::new("gw-creds");
    let file = dir.join("credentials.yaml");
    std::fs::write(&file, creds(key_a)).unwrap();
    let u = up(
        "credentials",
        &inc47(),
        &[],
        &["--credentials", file.to_str().unwrap()],
    )
    .await;
    let send = |key: Option<&str>, lane: &str| {
        let mut r = chat(&u.c, &u.gw, Some(lane));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    let r = send(None, "p1-agent-assist").await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().contains_key("www-authenticate"));
    let deadline = Instant::now() + Duration::from_secs(10);
    // The file is read shortly after start.
    while send(Some(key_a), "p1-agent-assist").await.unwrap().status() != 200 {
        assert!(Instant::now() < deadline, "key A never admitted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        send(Some(key_a), "p0-disruption-assist")
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(
        send(Some(key_b), "p1-agent-assist").await.unwrap().status(),
        401
    );
    // Rotated: B replaces A in the file.
    std::fs::write(&file, creds(key_b)).unwrap();
    while send(Some(key_a), "p1-agent-assist").await.unwrap().status() != 401 {
        assert!(Instant::now() < deadline, "key A still admitted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        send(Some(key_b), "p1-agent-assist").await.unwrap().status(),
        200
    );
    // An empty file (read between a writer's truncate and its write) is
    // refused: the last good one stays.
    std::fs::write(&file, "").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        send(Some(key_b), "p1-agent-assist").await.unwrap().status(),
        200,
        "an empty credentials file is not 'no callers'"
    );
    // A file with a raw key instead of its hash is refused: the last good
    // one stays.
    std::fs::write(
        &file,
        format!("apiKeys:\n  - sha256: {key_a}\n    tenant: a\n    lanes: [p1-agent-assist]\n"),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        send(Some(key_b), "p1-agent-assist").await.unwrap().status(),
        200
    );
    assert_eq!(
        send(Some(key_a), "p1-agent-assist").await.unwrap().status(),
        401
    );
    let text = metrics(&u.c, &u.gw).await;
    assert!(
        sample(
            &text,
            &["lanekeeper_gateway_auth_refusals_total", "no_credential"]
        ) >= 1.0
    );
    assert!(
        sample(
            &text,
            &["lanekeeper_gateway_auth_refusals_total", "lane_not_allowed"]
        ) >= 1.0
    );
}
