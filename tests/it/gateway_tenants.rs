//! Tenant limits inside a lane, through the real gateway binary on real
//! sockets: a tenant at its maximum in flight waits for one of its own
//! requests to finish while other tenants go, and one that cannot wait gets
//! 429 naming its limit and no other tenant.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::gateway::{
    client, config_file, gateway_to, inc47, lane_mut, metrics, model, ready, sample,
};

/// A chat request on `lane` as `tenant` (the gateway trusts the headers).
async fn chat_as(c: &reqwest::Client, addr: &str, lane: &str, tenant: &str) -> (u16, String, f64) {
    let start = Instant::now();
    let r = c
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-lanekeeper-lane", lane)
        .header("x-lanekeeper-tenant", tenant)
        .body(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    (status, body, start.elapsed().as_secs_f64())
}

fn with_tenants<'a>(cfg: &'a mut Value, lane: &str, tenants: Value) -> &'a mut Value {
    let l = lane_mut(cfg, lane);
    l["tenants"] = tenants;
    l
}

#[tokio::test]
async fn a_tenant_at_its_maximum_waits_for_its_own_request_while_others_go() {
    let mut cfg = inc47();
    with_tenants(
        &mut cfg,
        "p1-agent-assist",
        json!({"maxConcurrency": 1, "overrides": [{"name": "team-big", "maxConcurrency": 2}]}),
    );
    // Every answer takes 0.8 s.
    let m = model(&["--service-millis", "800", "--token-millis", "0"]);
    let path = config_file("tenant-wait", &cfg);
    let gw = gateway_to(&path, &m.addr, &[]);
    let c = client();
    ready(&c, &gw).await;
    let lane = "p1-agent-assist";
    let (a1, a2, b1, big1, big2) = tokio::join!(
        chat_as(&c, &gw.addr, lane, "team-a"),
        async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            chat_as(&c, &gw.addr, lane, "team-a").await
        },
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            chat_as(&c, &gw.addr, lane, "team-b").await
        },
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            chat_as(&c, &gw.addr, lane, "team-big").await
        },
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            chat_as(&c, &gw.addr, lane, "team-big").await
        },
    );
    for (s, body, _) in [&a1, &a2, &b1, &big1, &big2] {
        assert_eq!(*s, 200, "{body}");
    }
    // team-a's second request waited for its first (0.8 s from the start,
    // sent at 0.15 s), then took its own 0.8 s.
    assert!(a2.2 >= 1.35, "team-a's second request did not wait: {a2:?}");
    // team-b and team-big (maximum 2) were not held back by team-a.
    for (who, r) in [("team-b", &b1), ("team-big", &big1), ("team-big", &big2)] {
        assert!(r.2 < 1.3, "{who} waited: {r:?}");
    }
    let text = metrics(&c, &gw).await;
    assert_eq!(sample(&text, &["lanekeeper_gateway_in_flight "]), 0.0);
    // Released on finish: team-a goes at once now.
    let (s, _, t) = chat_as(&c, &gw.addr, lane, "team-a").await;
    assert_eq!(s, 200);
    assert!(t < 1.3, "team-a's slot was not given back: {t}");
}

#[tokio::test]
async fn a_tenant_at_its_maximum_that_cannot_wait_gets_429_naming_only_its_limit() {
    let mut cfg = inc47();
    // No wait at all in this lane.
    let l = with_tenants(&mut cfg, "p2-email-extract", json!({"maxConcurrency": 1}));
    l["queue"]["ttlSeconds"] = json!(0);
    let m = model(&["--service-millis", "800", "--token-millis", "0"]);
    let path = config_file("tenant-refuse", &cfg);
    let gw = gateway_to(&path, &m.addr, &[]);
    let c = client();
    ready(&c, &gw).await;
    let lane = "p2-email-extract";
    let (first, other, refused) = tokio::join!(
        chat_as(&c, &gw.addr, lane, "team-a"),
        chat_as(&c, &gw.addr, lane, "team-secret-neighbour"),
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            chat_as(&c, &gw.addr, lane, "team-a").await
        },
    );
    assert_eq!(first.0, 200, "{first:?}");
    assert_eq!(other.0, 200, "another tenant is not limited: {other:?}");
    assert_eq!(refused.0, 429, "{refused:?}");
    assert!(refused.2 < 0.5, "refused at once: {refused:?}");
    let body: Value = serde_json::from_str(&refused.1).unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("tenants.maxConcurrency"), "{message}");
    assert!(message.contains(lane), "{message}");
    assert!(
        !refused.1.contains("team-secret-neighbour"),
        "{}",
        refused.1
    );
    assert!(!refused.1.contains("team-a"), "{}", refused.1);
    // Once its request has finished, team-a goes again.
    assert_eq!(chat_as(&c, &gw.addr, lane, "team-a").await.0, 200);
}
