//! The memory request bodies hold, bounded across connections
//! (`--max-body-memory-bytes`), the real binary on real sockets: bodies
//! being sent hold their share from their head on, a head that does not
//! fit is answered 503 at once with its body unread, the lanes of the
//! highest priority keep the last quarter, and a body's share comes back
//! when its request ends.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::gateway_conn::{
    Proc, answered_before_the_body, chat, chat_head, gateway, head_then_trickle, model, ready,
};
use crate::scratch::Scratch;

/// 256 KiB bodies in a budget of four of them.
const BODY: usize = 256 << 10;
const FLAGS: [&str; 4] = [
    "--max-body-bytes",
    "262144",
    "--max-body-memory-bytes",
    "1048576",
];

/// `lanekeeper_gateway_body_bytes_held` on the gateway's `/metrics`.
async fn held(gw: &Proc) -> u64 {
    let url = format!("http://{}/metrics", gw.metrics.as_ref().unwrap());
    let page = reqwest::get(url).await.unwrap().text().await.unwrap();
    page.lines()
        .find_map(|l| l.strip_prefix("lanekeeper_gateway_body_bytes_held "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no body_bytes_held gauge in {page}"))
}

/// Waits until the gauge reads `bytes`.
async fn until_held(gw: &Proc, bytes: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while held(gw).await != bytes {
        assert!(
            Instant::now() < deadline,
            "held {} bytes, not {bytes}",
            held(gw).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn bodies_hold_memory_within_the_budget_and_the_highest_lanes_keep_a_reserve() {
    let dir = Scratch::new("body-memory");
    let m = model(&dir);
    let gw = gateway(&dir, &format!("http://{}", m.addr), &FLAGS, &[]);
    ready(&gw).await;
    // Three P3 bodies being trickled hold three quarters of the budget: the
    // part every lane may use.
    let mut sending = Vec::new();
    for _ in 0..3 {
        let head = chat_head(Some("p3-shift-batch"), BODY);
        sending.push(head_then_trickle(&gw, &head).await);
    }
    until_held(&gw, 3 * BODY as u64).await;
    // Another lane's body is refused from its head, unread, whatever its
    // size; the lane of the highest priority (P0) still gets in.
    let answer =
        answered_before_the_body(&gw, &chat_head(Some("p4-eval-backfill"), BODY), "503").await;
    assert!(answer.contains("body_memory_full"), "{answer}");
    assert!(answer.to_lowercase().contains("retry-after: 1"), "{answer}");
    assert_eq!(chat(&gw, "p1-agent-assist").await, 503, "P1, a small body");
    assert_eq!(chat(&gw, "p0-disruption-assist").await, 200, "P0's reserve");
    // A client that goes away gives its share back; so does every answer.
    for (_, trickle) in sending {
        trickle.abort();
    }
    until_held(&gw, 0).await;
    assert_eq!(chat(&gw, "p1-agent-assist").await, 200);
    until_held(&gw, 0).await;
}

#[test]
fn a_body_memory_below_the_largest_body_stops_the_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_lanekeeper"))
        .args([
            "gateway",
            "--config",
            "lanes.json",
            "--route",
            "r=http://127.0.0.1:9",
        ])
        .args([
            "--max-body-bytes",
            "2048",
            "--max-body-memory-bytes",
            "1024",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--max-body-memory-bytes 1024 is below --max-body-bytes 2048"),
        "{stderr}"
    );
}
