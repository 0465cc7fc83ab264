//! The gateway's connections under abuse, the real binary on real sockets:
//! a client trickling its headers, idle sockets, a stalled body, more
//! connections than the limit, and hundreds of idle sockets under a low
//! file-descriptor limit (`prlimit`), while new clients must still be served
//! and the config still reloaded.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::scratch::Scratch;

/// A lane of the INC-47 example that is admitted.
pub(crate) const OPEN_LANE: &str = "p1-agent-assist";

/// A child process killed when dropped, with the addresses it printed and
/// the file its stderr goes to.
pub(crate) struct Proc {
    child: Child,
    pub(crate) addr: String,
    pub(crate) metrics: Option<String>,
    pub(crate) stderr: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `argv` (program first), waiting for its `listening on ADDR
/// [metrics on ADDR]` line; stderr to `dir/<name>.log`.
pub(crate) fn spawn(dir: &Path, name: &str, argv: &[String]) -> Proc {
    let stderr = dir.join(format!("{name}.log"));
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", argv[0]));
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        words.first(),
        Some(&"listening"),
        "{name} printed {line:?}; stderr: {}",
        std::fs::read_to_string(&stderr).unwrap_or_default()
    );
    Proc {
        child,
        addr: words[2].to_owned(),
        metrics: words.get(5).map(|s| (*s).to_owned()),
        stderr,
    }
}

pub(crate) fn model(dir: &Path) -> Proc {
    slow_model(dir, 0)
}

/// A fake model taking `millis` per request.
fn slow_model(dir: &Path, millis: u64) -> Proc {
    let argv = [
        env!("CARGO_BIN_EXE_lanekeeper-fake-model").to_owned(),
        "--listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--service-millis".to_owned(),
        millis.to_string(),
    ];
    spawn(dir, "model", &argv)
}

pub(crate) fn inc47() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/inc-47/lanes-420.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Writes atomically (rename), as kubelet swaps a mounted ConfigMap.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A gateway on loopback enforcing the INC-47 example (written to
/// `dir/lanes.json`), every route at `upstream`, with `extra` flags; run
/// through `wrapper` (e.g. `prlimit …`) when given.
pub(crate) fn gateway(dir: &Path, upstream: &str, extra: &[&str], wrapper: &[&str]) -> Proc {
    gateway_with(dir, Some(&inc47()), upstream, extra, wrapper)
}

/// [`gateway`] with `config` as its `lanes.json` (none: the file is absent).
fn gateway_with(
    dir: &Path,
    config: Option<&Value>,
    upstream: &str,
    extra: &[&str],
    wrapper: &[&str],
) -> Proc {
    let path = dir.join("lanes.json");
    if let Some(config) = config {
        write_atomically(&path, &serde_json::to_vec(config).unwrap());
    }
    let mut argv: Vec<String> = wrapper.iter().map(|s| (*s).to_owned()).collect();
    argv.push(env!("CARGO_BIN_EXE_lanekeeper").to_owned());
    for a in [
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--reload-millis",
        "50",
    ] {
        argv.push(a.to_owned());
    }
    // Connections and TLS are tested here; who may use a lane in
    // gateway.rs and the identity tests (unless a test gives credentials).
    if !extra.contains(&"--credentials") {
        argv.push("--trust-lane-header".to_owned());
    }
    argv.extend(["--config".to_owned(), path.display().to_string()]);
    for r in ["agent-large", "extract-small", "batch-medium", "eval-large"] {
        argv.extend(["--route".to_owned(), format!("{r}={upstream}")]);
    }
    argv.extend(extra.iter().map(|s| (*s).to_owned()));
    spawn(dir, "gateway", &argv)
}

/// Waits for `/readyz` (the config loaded).
pub(crate) async fn ready(gw: &Proc) {
    let c = reqwest::Client::new();
    let url = format!("http://{}/readyz", gw.metrics.as_ref().unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.get(&url).send().await.is_ok_and(|r| r.status() == 200) {
        assert!(Instant::now() < deadline, "the gateway never got ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn chat_body() -> String {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string()
}

/// A chat request on a new connection (none kept for the next), to send.
pub(crate) fn chat_on_a_new_connection(gw: &Proc) -> reqwest::RequestBuilder {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
        .post(format!("http://{}/v1/chat/completions", gw.addr))
        .body(chat_body())
}

/// A chat request on `lane` on a new connection; its status.
pub(crate) async fn chat(gw: &Proc, lane: &str) -> reqwest::StatusCode {
    chat_on_a_new_connection(gw)
        .header("x-lanekeeper-lane", lane)
        .send()
        .await
        .unwrap()
        .status()
}

/// Reads what the server sends until it closes the connection (or `limit`
/// passes): the bytes, and when it closed.
async fn until_closed(s: &mut TcpStream, limit: Duration) -> (String, Option<Duration>) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((start + limit).into(), s.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), None),
            Ok(Ok(0) | Err(_)) => {
                return (
                    String::from_utf8_lossy(&got).into_owned(),
                    Some(start.elapsed()),
                );
            }
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads one response (headers and a `content-length` body): its text.
async fn one_response(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + len {
                return text;
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("a response within 5 s")
            .unwrap();
        assert!(n > 0, "closed before a whole response: {text:?}");
        got.extend_from_slice(&buf[..n]);
    }
}

/// A request whose headers promise 100 bytes of body, of which 5 come.
fn stalled_upload() -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
         x-lanekeeper-lane: {OPEN_LANE}\r\ncontent-length: 100\r\n\r\n{{\"mod"
    )
}

#[tokio::test]
async fn a_client_trickling_its_headers_is_cut_at_the_header_timeout() {
    let dir = Scratch::new("slowloris");
    let m = model(&dir);
    let gw = gateway(
        &dir,
        &format!("http://{}", m.addr),
        &["--header-read-timeout-seconds", "4"],
        &[],
    );
    ready(&gw).await;
    let (mut rx, mut tx) = TcpStream::connect(&gw.addr).await.unwrap().into_split();
    // One byte every 2 s, as a slowloris client does, for up to 20 s.
    let writer = tokio::spawn(async move {
        for b in b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" {
            if tx.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    });
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(20), rx.read(&mut buf))
        .await
        .expect("the trickling connection was never closed")
        .unwrap_or(0);
    let cut = start.elapsed();
    writer.abort();
    assert_eq!(
        n,
        0,
        "no answer, just closed: {:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    assert!(
        cut >= Duration::from_millis(3500) && cut < Duration::from_secs(7),
        "cut after {cut:?}, not at the 4 s header timeout"
    );
    // The gateway still serves.
    assert_eq!(chat(&gw, OPEN_LANE).await, 200);
}

#[tokio::test]
async fn idle_sockets_are_closed_by_the_header_clock_and_keep_alive_by_the_idle_clock() {
    let dir = Scratch::new("idle");
    let m = model(&dir);
    let flags = [
        "--header-read-timeout-seconds",
        "2",
        "--idle-timeout-seconds",
        "5",
    ];
    let gw = gateway(&dir, &format!("http://{}", m.addr), &flags, &[]);
    ready(&gw).await;

    // A socket that never sends a byte: closed at the 2 s header clock.
    let mut silent = TcpStream::connect(&gw.addr).await.unwrap();
    // A keep-alive connection after one whole request: the idle clock.
    let mut kept = TcpStream::connect(&gw.addr).await.unwrap();
    kept.write_all(b"GET /v1/models HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .unwrap();
    let answer = one_response(&mut kept).await;
    assert!(answer.starts_with("HTTP/1.1 "), "{answer}");
    let answered = Instant::now();

    let (sent, closed) = until_closed(&mut silent, Duration::from_secs(10)).await;
    let closed = closed.expect("the silent socket was never closed");
    assert!(sent.is_empty(), "{sent}");
    assert!(
        closed >= Duration::from_millis(1500) && closed < Duration::from_secs(4),
        "silent socket closed after {closed:?}, not at the 2 s header timeout"
    );
    let (sent, closed) = until_closed(&mut kept, Duration::from_secs(15)).await;
    assert!(sent.is_empty(), "{sent}");
    assert!(
        closed.is_some(),
        "the idle keep-alive connection was never closed"
    );
    let idle = answered.elapsed();
    assert!(
        idle >= Duration::from_millis(4500) && idle < Duration::from_secs(8),
        "keep-alive connection closed after {idle:?} idle, not at the 5 s idle timeout"
    );
}

#[tokio::test]
async fn a_stalled_body_gets_408_and_nothing_reaches_the_upstream() {
    let dir = Scratch::new("stalled");
    let m = model(&dir);
    let gw = gateway(
        &dir,
        &format!("http://{}", m.addr),
        &["--body-read-timeout-seconds", "2"],
        &[],
    );
    ready(&gw).await;
    let mut s = TcpStream::connect(&gw.addr).await.unwrap();
    s.write_all(stalled_upload().as_bytes()).await.unwrap();
    let (answer, closed) = until_closed(&mut s, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    let took = closed.expect("closed after the 408");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(5),
        "408 after {took:?}, not at the 2 s body timeout"
    );
    let ctl: Value = reqwest::get(format!("http://{}/control", m.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ctl["chatRequests"], 0, "{ctl}");
}

#[tokio::test]
async fn over_the_connection_limit_new_connections_are_refused_at_once_or_take_an_idle_place() {
    let dir = Scratch::new("limit");
    let m = model(&dir);
    let flags = ["--max-connections", "8", "--body-read-timeout-seconds", "6"];
    let gw = gateway(&dir, &format!("http://{}", m.addr), &flags, &[]);
    ready(&gw).await;
    // Eight connections busy (each in a request, its body stalled).
    let mut busy = Vec::new();
    for _ in 0..8 {
        let mut s = TcpStream::connect(&gw.addr).await.unwrap();
        s.write_all(stalled_upload().as_bytes()).await.unwrap();
        busy.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The ninth: a 503 and a closed connection at once, not a hang until a
    // place frees up (the busy ones hold theirs for 6 s).
    let mut ninth = TcpStream::connect(&gw.addr).await.unwrap();
    let (answer, closed) = until_closed(&mut ninth, Duration::from_secs(5)).await;
    let closed = closed.expect("the connection over the limit was left hanging");
    assert!(closed < Duration::from_secs(2), "refused after {closed:?}");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("connection_limit"), "{answer}");

    // The busy ones end with 408; then eight idle sockets hold every place,
    // and a new client still gets in (an idle one makes room).
    for s in &mut busy {
        let (a, _) = until_closed(s, Duration::from_secs(10)).await;
        assert!(a.starts_with("HTTP/1.1 408"), "{a}");
    }
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(TcpStream::connect(&gw.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Served well before any of them would time out (10 s).
    let start = Instant::now();
    assert_eq!(chat(&gw, OPEN_LANE).await, 200);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

/// A key of the credentials file `dir/credentials.yaml` written here, for
/// the open lane.
const KEY: &str = "sk-conn-test-0123456789abcdef";

fn credentials(dir: &Path) -> String {
    let file = dir.join("credentials.yaml");
    let yaml = format!(
        "apiKeys:\n  - sha256: {}\n    tenant: team-a\n    lanes: [{OPEN_LANE}]\n",
        crate::gateway::key_hash(KEY)
    );
    std::fs::write(&file, yaml).unwrap();
    file.display().to_string()
}

/// A chat request with [`KEY`] on a new connection; its status.
async fn chat_with_key(gw: &Proc) -> reqwest::StatusCode {
    chat_on_a_new_connection(gw)
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .status()
}

/// Heads of requests the gateway must refuse from the head alone, each
/// promising a 4 MiB body (the default `--max-body-bytes`), and the status:
/// no credential (a length, or chunked), a key nobody holds, a path that is
/// not forwarded.
fn refusable_heads() -> [(String, &'static str); 4] {
    let big = 4 << 20;
    let chat = "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json";
    [
        (format!("{chat}\r\ncontent-length: {big}\r\n\r\n"), "401"),
        (
            format!("{chat}\r\ntransfer-encoding: chunked\r\n\r\n"),
            "401",
        ),
        (
            format!(
                "{chat}\r\nauthorization: Bearer sk-nobody-holds-this-key-0000\r\n\
                 content-length: {big}\r\n\r\n"
            ),
            "401",
        ),
        (
            format!("POST /anything HTTP/1.1\r\nhost: gw\r\ncontent-length: {big}\r\n\r\n"),
            "404",
        ),
    ]
}

/// Sends `head`, then trickles body bytes (one every 200 ms, as a chunk
/// when chunked) until the gateway stops taking them.
pub(crate) async fn head_then_trickle(
    gw: &Proc,
    head: &str,
) -> (tokio::net::tcp::OwnedReadHalf, tokio::task::JoinHandle<()>) {
    let (rx, mut tx) = TcpStream::connect(&gw.addr).await.unwrap().into_split();
    tx.write_all(head.as_bytes()).await.unwrap();
    let piece: &'static [u8] = if head.contains("chunked") {
        b"1\r\nx\r\n"
    } else {
        b"x"
    };
    let trickle = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if tx.write_all(piece).await.is_err() {
                return;
            }
        }
    });
    (rx, trickle)
}

/// Sends `head` and trickles its body: the gateway answers `status` at
/// once and closes the connection, neither waiting for the body (30 s of
/// body clock) nor reading it. Returns the answer.
pub(crate) async fn answered_before_the_body(gw: &Proc, head: &str, status: &str) -> String {
    let (mut rx, trickle) = head_then_trickle(gw, head).await;
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match tokio::time::timeout(Duration::from_secs(3), rx.read(&mut buf)).await {
            Err(_) => break None,
            Ok(Ok(0) | Err(_)) => break Some(start.elapsed()),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    };
    trickle.abort();
    let answer = String::from_utf8_lossy(&got).into_owned();
    let first = head.lines().next().unwrap_or_default();
    assert!(
        answer.starts_with(&format!("HTTP/1.1 {status}")),
        "{first}: {answer}"
    );
    let closed = closed.unwrap_or_else(|| panic!("{first}: kept open, reading the body"));
    assert!(
        closed < Duration::from_secs(2),
        "{first}: closed after {closed:?}"
    );
    answer
}

/// A chat head promising a body of `length` bytes, with `lane` as its lane
/// header.
pub(crate) fn chat_head(lane: Option<&str>, length: usize) -> String {
    let lane = lane.map_or(String::new(), |l| format!("x-lanekeeper-lane: {l}\r\n"));
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n{lane}content-length: {length}\r\n\r\n"
    )
}

#[tokio::test]
async fn a_lane_the_config_lacks_and_no_config_are_refused_from_the_head() {
    let dir = Scratch::new("head-lane");
    let m = model(&dir);
    let upstream = format!("http://{}", m.addr);
    let gw = gateway(&dir, &upstream, &[], &[]);
    ready(&gw).await;
    for lane in [Some("nope"), None] {
        let answer = answered_before_the_body(&gw, &chat_head(lane, 4 << 20), "400").await;
        assert!(answer.contains("unknown_lane"), "{answer}");
    }
    let none = Scratch::new("head-none");
    let gw = gateway_with(&none, None, &upstream, &[], &[]);
    let answer = answered_before_the_body(&gw, &chat_head(Some(OPEN_LANE), 4 << 20), "503").await;
    assert!(answer.contains("no_config"), "{answer}");
}

#[tokio::test]
async fn callers_refused_from_the_head_are_answered_before_their_body_and_hold_no_place() {
    let dir = Scratch::new("head-first");
    let m = model(&dir);
    let creds = credentials(&dir);
    let flags = ["--credentials", creds.as_str(), "--max-connections", "8"];
    let gw = gateway(&dir, &format!("http://{}", m.addr), &flags, &[]);
    ready(&gw).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while chat_with_key(&gw).await != 200 {
        assert!(Instant::now() < deadline, "the key was never admitted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Each is answered at once, its body neither waited for (30 s of body
    // clock) nor read: the gateway closes the connection after the answer.
    for (head, status) in refusable_heads() {
        answered_before_the_body(&gw, &head, status).await;
    }
    // As many such clients as there are places, their bodies still
    // trickling: a caller with a key is still served.
    let mut held = Vec::new();
    for (head, _) in refusable_heads().iter().chain(&refusable_heads()) {
        held.push(head_then_trickle(&gw, head).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let start = Instant::now();
    assert_eq!(chat_with_key(&gw).await, 200);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    for (_, trickle) in held {
        trickle.abort();
    }
}

/// `prlimit` on PATH, or a loud skip (a failure with
/// `LANEKEEPER_REQUIRE_PRLIMIT=1`).
fn prlimit(test: &str) -> Option<&'static str> {
    let found = Command::new("prlimit")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some("prlimit");
    }
    assert!(
        std::env::var("LANEKEEPER_REQUIRE_PRLIMIT").as_deref() != Ok("1"),
        "{test}: prlimit (util-linux) is not on PATH and LANEKEEPER_REQUIRE_PRLIMIT=1"
    );
    eprintln!("SKIPPED {test}: prlimit (util-linux) is not on PATH");
    None
}

#[tokio::test]
async fn under_a_low_descriptor_limit_idle_sockets_cannot_stop_new_clients_or_reloads() {
    let test = "under_a_low_descriptor_limit";
    let Some(prlimit) = prlimit(test) else {
        return;
    };
    let dir = Scratch::new("fds");
    let m = model(&dir);
    let wrapper = [prlimit, "--nofile=256:256", "--"];
    let gw = gateway(
        &dir,
        &format!("http://{}", m.addr),
        &["--header-read-timeout-seconds", "30"],
        &wrapper,
    );
    ready(&gw).await;
    // 300 idle sockets, more than the 256 descriptors the gateway has.
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(TcpStream::connect(&gw.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // New clients are served, one after another, each quickly.
    for _ in 0..20 {
        let start = Instant::now();
        assert_eq!(chat(&gw, OPEN_LANE).await, 200);
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );
    }
    // The config is still reloaded: P4 (paused in the example) resumes.
    assert_eq!(chat(&gw, "p4-eval-backfill").await, 429);
    let mut cfg = inc47();
    let p4 = cfg["lanes"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|l| l["name"] == "p4-eval-backfill")
        .unwrap();
    p4["state"] = json!("Admitted");
    p4["admittedRequestsPerSecond"] = json!(10.0);
    p4["burst"] = json!(10);
    cfg["contentHash"] = json!("sha256:test-fds");
    write_atomically(&dir.join("lanes.json"), &serde_json::to_vec(&cfg).unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while chat(&gw, "p4-eval-backfill").await != 200 {
        assert!(Instant::now() < deadline, "the new config was not loaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = std::fs::read_to_string(&gw.stderr).unwrap();
    assert!(log.contains("rlimit_nofile=256"), "{log}");
    assert!(!log.contains("Too many open files"), "{log}");
    drop(idle);
}

#[test]
fn both_commands_listen_on_loopback_unless_told() {
    for (command, flags) in [
        ("run", ["--metrics-addr", "--health-addr"].as_slice()),
        ("gateway", ["--listen", "--metrics-addr"].as_slice()),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_lanekeeper"))
            .args([command, "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        for flag in flags {
            let at = help
                .find(&format!("      {flag} "))
                .unwrap_or_else(|| panic!("{command} {flag}: {help}"));
            let entry = &help[at..];
            let default = entry
                .find("[default: ")
                .map(|d| &entry[d + 10..])
                .and_then(|d| d.split(']').next())
                .unwrap_or_else(|| panic!("{command} {flag} has no default: {help}"));
            assert!(
                default.starts_with("127.0.0.1:"),
                "{command} {flag} defaults to {default}"
            );
        }
    }
}

/// SIGTERM to a child, through `kill` (no unsafe here).
fn terminate(p: &Proc) {
    let ok = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// Waits for the child to exit, at most `limit`: how long it took.
fn exited_within(p: &mut Proc, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if p.child.try_wait().unwrap().is_some() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A chat request on the open lane, sent from a task: its status.
fn chat_in_background(gw: &Proc) -> tokio::task::JoinHandle<reqwest::Result<u16>> {
    let addr = gw.addr.clone();
    tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("http://{addr}/v1/chat/completions"))
            .header("x-lanekeeper-lane", OPEN_LANE)
            .body(chat_body())
            .send()
            .await
            .map(|r| r.status().as_u16())
    })
}

#[tokio::test]
async fn sigterm_lets_requests_in_flight_finish_within_the_grace_and_no_longer() {
    let dir = Scratch::new("sigterm");
    let m = slow_model(&dir, 1500);
    let upstream = format!("http://{}", m.addr);
    let mut gw = gateway(&dir, &upstream, &["--shutdown-grace-seconds", "5"], &[]);
    ready(&gw).await;
    // A request in flight when SIGTERM arrives is answered.
    let in_flight = chat_in_background(&gw);
    tokio::time::sleep(Duration::from_millis(400)).await;
    terminate(&gw);
    assert_eq!(in_flight.await.unwrap().unwrap(), 200);
    let took = exited_within(&mut gw, Duration::from_secs(4)).expect("exited after the drain");
    assert!(took < Duration::from_secs(3), "{took:?}");

    // A request longer than the grace does not hold the process past it.
    let dir = Scratch::new("sigterm-bound");
    let m = slow_model(&dir, 20_000);
    let upstream = format!("http://{}", m.addr);
    let mut gw = gateway(&dir, &upstream, &["--shutdown-grace-seconds", "1"], &[]);
    ready(&gw).await;
    let stuck = chat_in_background(&gw);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let start = Instant::now();
    terminate(&gw);
    exited_within(&mut gw, Duration::from_secs(5)).expect("exited at the end of the grace");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "exited after {took:?}, not at the 1 s grace"
    );
    stuck.abort();
}
