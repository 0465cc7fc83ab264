//! The gateway's qualified outcomes on real sockets (`lanekeeper gateway`
//! in front of `lanekeeper-fake-model`): answers in time are good, an
//! unreachable upstream and a timed-out answer are bad, and refusals the
//! contract allows (a paused lane) and requests naming no lane are not
//! counted.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A child process killed when dropped, with the addresses it printed.
struct Proc {
    child: Child,
    addr: String,
    metrics: Option<String>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(bin: &str, args: &[&str]) -> Proc {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
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

fn model(service_millis: &str) -> Proc {
    spawn(
        env!("CARGO_BIN_EXE_lanekeeper-fake-model"),
        &[
            "--listen",
            "127.0.0.1:0",
            "--service-millis",
            service_millis,
        ],
    )
}

fn config(test: &str, p1_deadline: i64) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("examples/inc-47/lanes-420.json")).unwrap(),
    )
    .unwrap();
    for l in cfg["lanes"].as_array_mut().unwrap() {
        if l["name"] == "p1-agent-assist" {
            l["deadlineSeconds"] = json!(p1_deadline);
            l["expectedServiceSeconds"] = Value::Null;
            l["queue"]["ttlSeconds"] = json!(0);
        }
    }
    let dir = std::env::temp_dir().join(format!("lanekeeper-gwo-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lanes.json");
    std::fs::write(&path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    path
}

fn gateway(config: &Path, upstream: &str) -> Proc {
    let mut args = vec![
        "gateway".to_owned(),
        "--listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--metrics-addr".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--config".to_owned(),
        config.display().to_string(),
        // Objectives are counted whoever the caller is.
        "--trust-lane-header".to_owned(),
    ];
    for r in ["agent-large", "extract-small", "batch-medium", "eval-large"] {
        args.push("--route".to_owned());
        args.push(format!("{r}=http://{upstream}"));
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    spawn(env!("CARGO_BIN_EXE_lanekeeper"), &refs)
}

async fn ready(c: &reqwest::Client, gw: &Proc) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c
        .get(format!("http://{}/readyz", gw.metrics.as_ref().unwrap()))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
    {
        assert!(
            Instant::now() < deadline,
            "the gateway never loaded its config"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn send(c: &reqwest::Client, gw: &Proc, lane: &str) -> u16 {
    c.post(format!("http://{}/v1/chat/completions", gw.addr))
        .header("content-type", "application/json")
        .header("x-lanekeeper-lane", lane)
        .body(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// `lanekeeper_gateway_qualified_requests_total` of `lane` and `outcome`
/// (0 when absent).
async fn qualified(c: &reqwest::Client, gw: &Proc, lane: &str, outcome: &str) -> f64 {
    let page = c
        .get(format!("http://{}/metrics", gw.metrics.as_ref().unwrap()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    page.lines()
        .filter(|l| l.starts_with("lanekeeper_gateway_qualified_requests_total{"))
        .find(|l| {
            l.contains(&format!("lane=\"{lane}\"")) && l.contains(&format!("outcome=\"{outcome}\""))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn answers_in_time_are_good_and_allowed_refusals_are_not_counted() {
    let m = model("0");
    let gw = gateway(&config("good", 30), &m.addr);
    let c = reqwest::Client::new();
    ready(&c, &gw).await;
    for _ in 0..3 {
        assert_eq!(send(&c, &gw, "p1-agent-assist").await, 200);
    }
    // P4 is paused at 420 units/s: a refusal the contract allows.
    assert_eq!(send(&c, &gw, "p4-eval-backfill").await, 429);
    // A lane the config does not have: a client's bad request.
    assert_eq!(send(&c, &gw, "no-such-lane").await, 400);
    // The answer ends (and is counted) when its body is done.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(qualified(&c, &gw, "p1-agent-assist", "good").await, 3.0);
    assert_eq!(qualified(&c, &gw, "p1-agent-assist", "bad").await, 0.0);
    assert_eq!(qualified(&c, &gw, "p4-eval-backfill", "good").await, 0.0);
    assert_eq!(qualified(&c, &gw, "p4-eval-backfill", "bad").await, 0.0);
    assert_eq!(qualified(&c, &gw, "no-such-lane", "bad").await, 0.0);
}

#[tokio::test]
async fn an_answer_past_the_deadline_is_bad() {
    // The model takes 2.5 s; P1's deadline is 1 s.
    let m = model("2500");
    let gw = gateway(&config("late", 1), &m.addr);
    let c = reqwest::Client::new();
    ready(&c, &gw).await;
    assert_eq!(send(&c, &gw, "p1-agent-assist").await, 504);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(qualified(&c, &gw, "p1-agent-assist", "bad").await, 1.0);
    assert_eq!(qualified(&c, &gw, "p1-agent-assist", "good").await, 0.0);
}

#[tokio::test]
async fn an_unreachable_upstream_is_bad() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let gw = gateway(&config("down", 30), &format!("127.0.0.1:{port}"));
    let c = reqwest::Client::new();
    ready(&c, &gw).await;
    assert_eq!(send(&c, &gw, "p1-agent-assist").await, 502);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(qualified(&c, &gw, "p1-agent-assist", "bad").await, 1.0);
    assert_eq!(qualified(&c, &gw, "p1-agent-assist", "good").await, 0.0);
}
