//! Scrapes of model-server pages (vLLM names) from fake pod endpoints on
//! loopback addresses, including a pod that times out.

use crate::prometheus_support;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lanekeeper::api::CapacityProfile;
use lanekeeper::api::profile::ScrapeMetrics;
use lanekeeper::signals::scrape::{self, ScrapeError, parse_page, scrape_one};
use lanekeeper::signals::scrape_source::ScrapeSource;
use lanekeeper::signals::{PoolPod, SourceInput};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const VLLM_PAGE: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="agent-large"} 41.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="agent-large"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="agent-large"} 0.83
# HELP model:error_ratio Errors per request over the last minute.
# TYPE model:error_ratio gauge
model:error_ratio 0.02
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="agent-large"} 12345.0
"#;

const OLD_VLLM_PAGE: &str = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 1\n# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.5\n";

#[test]
fn parses_vllm_names_with_the_old_kv_cache_fallback() {
    let names = ScrapeMetrics {
        error_ratio: Some("model:error_ratio".into()),
        ..Default::default()
    };
    let m = parse_page(VLLM_PAGE, &names).unwrap();
    assert_eq!(m.running, Some(41.0));
    assert_eq!(m.waiting, Some(7.0));
    assert_eq!(m.kv_cache_usage, Some(0.83));
    assert_eq!(m.error_ratio, Some(0.02));
    let m = parse_page(OLD_VLLM_PAGE, &names).unwrap();
    assert_eq!(m.kv_cache_usage, Some(0.5));
    assert_eq!(m.error_ratio, None);
    assert!(parse_page("<html>not metrics</html>", &names).is_err());
    let nan = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running NaN\n";
    assert_eq!(parse_page(nan, &names).unwrap().running, None);
}

#[test]
fn a_page_the_text_format_allows_gives_its_evidence() {
    let names = ScrapeMetrics::default();
    // No # TYPE lines: each sample line is a family of its own.
    let m = parse_page(
        "vllm:num_requests_running 3\nvllm:num_requests_waiting 1\n",
        &names,
    )
    .unwrap();
    assert_eq!((m.running, m.waiting), (Some(3.0), Some(1.0)));
    // A family lanekeeper does not read mixes label sets.
    let mixed = "other 1\nother{x=\"a\"} 2\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 4\n";
    assert_eq!(parse_page(mixed, &names).unwrap().running, Some(4.0));
    // A family it reads that is broken still makes the page malformed.
    let broken = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=} 4\n";
    assert!(parse_page(broken, &names).is_err());
}

#[test]
fn several_series_combine_by_what_they_measure() {
    let names = ScrapeMetrics {
        error_ratio: Some("model:error_ratio".into()),
        ..Default::default()
    };
    let page = |kv: &str, errors: &str| {
        format!(
            "vllm:num_requests_running{{engine=\"0\"}} 3\nvllm:num_requests_running{{engine=\"1\"}} 4\n\
             {kv}{errors}"
        )
    };
    let two_engines =
        "vllm:kv_cache_usage_perc{engine=\"0\"} 0.3\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.9\n";
    let two_models = "model:error_ratio{model=\"a\"} 0.03\nmodel:error_ratio{model=\"b\"} 0.04\n";
    let m = parse_page(&page(two_engines, two_models), &names).unwrap();
    assert_eq!(m.running, Some(7.0), "requests add up");
    assert_eq!(m.kv_cache_usage, Some(0.9), "the fullest engine's cache");
    assert_eq!(m.error_ratio, None, "two ratios say nothing of the pod");
    let over = "vllm:kv_cache_usage_perc 1.3\n";
    let m = parse_page(&page(over, "model:error_ratio 7.5\n"), &names).unwrap();
    assert_eq!(
        (m.kv_cache_usage, m.error_ratio),
        (None, None),
        "fractions over 1"
    );
}

/// A fake pod answering `response` (status line, headers and body) to
/// every request on `ip:port`.
async fn fake_pod_answering(ip: &str, port: u16, response: Vec<u8>) -> Arc<AtomicUsize> {
    let l = tokio::net::TcpListener::bind((ip, port)).await.unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    let response = Arc::new(response);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let (counter, response) = (counter.clone(), response.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                counter.fetch_add(1, Ordering::SeqCst);
                let _ = s.write_all(&response).await;
                let _ = s.shutdown().await;
            });
        }
    });
    requests
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_cannot_redirect_the_scrape_or_fill_the_controllers_memory() {
    let port = prometheus_support::free_port();
    let names = ScrapeMetrics::default();
    let elsewhere = fake_pod("127.0.0.12", port, OLD_VLLM_PAGE, Duration::ZERO).await;
    let redirect = format!(
        "HTTP/1.1 302 Found\r\nlocation: http://127.0.0.12:{port}/metrics\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    fake_pod_answering("127.0.0.11", port, redirect.into_bytes()).await;
    let url = format!("http://127.0.0.11:{port}/metrics");
    let http = scrape::client();
    let got = scrape_one(&http, &url, Duration::from_secs(5), &names).await;
    assert_eq!(got, Err(ScrapeError::Http(302)));
    assert_eq!(
        elsewhere.load(Ordering::SeqCst),
        0,
        "the redirect was followed"
    );
    // A page past the limit, with no length announced: read no further.
    let mut huge = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n".to_vec();
    let line = b"vllm:num_requests_running 1\n";
    while huge.len() < scrape::MAX_PAGE_BYTES + 1024 {
        huge.extend_from_slice(line);
    }
    fake_pod_answering("127.0.0.13", port, huge).await;
    let url = format!("http://127.0.0.13:{port}/metrics");
    match scrape_one(&http, &url, Duration::from_secs(10), &names).await {
        Err(ScrapeError::Malformed(e)) => assert!(e.contains("larger than"), "{e}"),
        other => panic!("a page past the limit gave {other:?}"),
    }
}

/// A fake pod serving `page` on `ip:port` after `delay`; the counter it
/// returns counts the requests it has read (before it answers them).
async fn fake_pod(ip: &str, port: u16, page: &'static str, delay: Duration) -> Arc<AtomicUsize> {
    let l = tokio::net::TcpListener::bind((ip, port)).await.unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    requests
}

fn profile(port: u16) -> CapacityProfile {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/inc-47/inc-47.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let doc = serde_yaml::Deserializer::from_str(&text).next().unwrap();
    let mut v: serde_json::Value = serde::Deserialize::deserialize(doc).unwrap();
    v["spec"]["signals"] = serde_json::json!({"scrape": {
        "port": port, "timeoutSeconds": 1, "intervalSeconds": 15, "maxConcurrency": 2,
        "metrics": {"errorRatio": "model:error_ratio"}
    }});
    serde_json::from_value(v).unwrap()
}

fn pod(name: &str, ip: &str) -> PoolPod {
    PoolPod {
        name: name.into(),
        containers_ready: true,
        ip: Some(ip.into()),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn scrapes_pods_and_a_slow_pod_makes_totals_unknown() {
    let port = prometheus_support::free_port();
    let answering = [
        fake_pod("127.0.0.1", port, VLLM_PAGE, Duration::ZERO).await,
        fake_pod("127.0.0.2", port, OLD_VLLM_PAGE, Duration::ZERO).await,
    ];
    let _slow = fake_pod("127.0.0.3", port, VLLM_PAGE, Duration::from_secs(10)).await;
    let scrapes = || {
        answering
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .sum::<usize>()
    };
    let p = profile(port);
    let source = ScrapeSource::new(None);

    // Two answering pods (and one not ready, not scraped): totals known.
    let pods = vec![
        pod("vllm-0", "127.0.0.1"),
        pod("vllm-1", "127.0.0.2"),
        PoolPod {
            containers_ready: false,
            ..pod("vllm-2", "127.0.0.3")
        },
    ];
    let input = SourceInput {
        profile: &p,
        lanes: &[],
        target_ready_replicas: None,
        pods: Some(&pods),
        now: 1000,
    };
    let out = source.observe(&input).await;
    assert_eq!(out.profile.in_flight, Some(44.0));
    assert_eq!(out.profile.queue_depth, Some(8.0));
    let kv = out
        .profile
        .kv_cache_usage_percent
        .expect("both pages have one");
    assert!((kv - 66.5).abs() < 1e-9, "mean of 83 % and 50 %: {kv}");
    assert_eq!(out.profile.pods["vllm-0"].error_ratio, Some(0.02));
    assert!(
        !out.profile.pods.contains_key("vllm-1"),
        "no error ratio on its page"
    );
    assert!(out.unknown.is_empty(), "{:?}", out.unknown);

    // The third pod is ready but times out (it answers after 10 s, the
    // timeout is 1 s): per-pod evidence stays, totals are Unknown (a partial
    // sum would understate the load).
    let pods = vec![
        pod("vllm-0", "127.0.0.1"),
        pod("vllm-1", "127.0.0.2"),
        pod("vllm-2", "127.0.0.3"),
    ];
    let input = SourceInput {
        profile: &p,
        lanes: &[],
        target_ready_replicas: None,
        pods: Some(&pods),
        now: 1100,
    };
    let before = scrapes();
    let out = source.observe(&input).await;
    // The answering pods were scraped again (they answer only once they
    // have counted the request).
    assert_eq!(scrapes(), before + 2);
    assert_eq!(out.profile.in_flight, None);
    assert_eq!(out.profile.queue_depth, None);
    assert_eq!(out.profile.kv_cache_usage_percent, None);
    assert!(
        out.unknown["scrape:kvCacheUsagePercent"].contains("vllm-2: timeout"),
        "{:?}",
        out.unknown
    );
    assert_eq!(out.profile.pods["vllm-0"].error_ratio, Some(0.02));
    assert!(
        out.unknown["scrape:inFlight"].contains("vllm-2: timeout"),
        "{:?}",
        out.unknown
    );

    // Within intervalSeconds the result is reused: no pod is asked again.
    let input = SourceInput { now: 1105, ..input };
    let before = scrapes();
    let again = source.observe(&input).await;
    assert_eq!(scrapes(), before, "a scrape within intervalSeconds");
    assert_eq!(again, out);
}

/// With nothing to scrape (no ready pod with an IP, or the pod index not
/// synced yet) every total the source gives is Unknown under its own key,
/// the key the ladder's `inFlightAbove` and `queueDepthAbove` read: a level
/// entered on the in-flight figure is not left because the figure's source
/// went blind.
#[tokio::test]
async fn nothing_to_scrape_makes_every_total_unknown_under_its_own_key() {
    let p = profile(prometheus_support::free_port());
    let source = ScrapeSource::new(None);
    let not_ready = [PoolPod {
        containers_ready: false,
        ..pod("vllm-0", "127.0.0.1")
    }];
    for (now, pods, why) in [
        (1000, Some(&not_ready[..]), "no ready pod"),
        (2000, None, "has not synced"),
    ] {
        let input = SourceInput {
            profile: &p,
            lanes: &[],
            target_ready_replicas: None,
            pods,
            now,
        };
        let out = source.observe(&input).await;
        for key in [
            "scrape",
            "scrape:inFlight",
            "scrape:queueDepth",
            "scrape:kvCacheUsagePercent",
        ] {
            assert!(
                out.unknown.get(key).is_some_and(|w| w.contains(why)),
                "{key} at {now}: {:?}",
                out.unknown
            );
        }
        assert_eq!(out.profile.in_flight, None);
    }
}

/// A round longer than one pod's timeout does not hold the reconcile: with
/// four pods answering after 0.8 s each, one at a time, the round takes at
/// least 3.2 s, the reconcile waits at most `timeoutSeconds` + 1 s (2 s) and
/// gets every total Unknown (`slow`) rather than a guess. The round goes on
/// by itself and, when it ends, triggers the profile's reconcile, which then
/// has its evidence without scraping again.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_round_runs_beside_the_reconcile_and_triggers_it_when_done() {
    use futures::StreamExt;
    use lanekeeper::signals::SignalSource;
    let port = prometheus_support::free_port();
    let mut counters = Vec::new();
    let mut pods = Vec::new();
    for i in 0..4 {
        let ip = format!("127.0.0.{}", 10 + i);
        counters.push(fake_pod(&ip, port, VLLM_PAGE, Duration::from_millis(800)).await);
        pods.push(pod(&format!("vllm-{i}"), &ip));
    }
    let scraped = || {
        counters
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .sum::<usize>()
    };
    let mut v = serde_json::to_value(profile(port)).unwrap();
    v["spec"]["signals"]["scrape"]["maxConcurrency"] = serde_json::json!(1);
    let p: CapacityProfile = serde_json::from_value(v).unwrap();
    let source = ScrapeSource::new(None);
    let (tx, mut triggered) = futures::channel::mpsc::unbounded();
    source.attach(&None, tx);
    let input = SourceInput {
        profile: &p,
        lanes: &[],
        target_ready_replicas: None,
        pods: Some(&pods),
        now: 1000,
    };

    let out = source.observe(&input).await;
    assert_eq!(out.profile.in_flight, None);
    assert!(
        out.unknown["scrape:inFlight"].contains("slow: the first scrape round is still running"),
        "{:?}",
        out.unknown
    );
    assert!(scraped() < 4, "the reconcile waited for the whole round");

    let r = tokio::time::timeout(Duration::from_secs(20), triggered.next())
        .await
        .expect("the round ends and triggers the profile")
        .unwrap();
    assert_eq!(
        (r.name.as_str(), r.namespace.as_deref()),
        ("agent-assist", Some("ai-platform"))
    );
    assert_eq!(scraped(), 4);

    let out = source.observe(&SourceInput { now: 1004, ..input }).await;
    assert_eq!(out.profile.in_flight, Some(4.0 * 41.0));
    assert!(out.unknown.is_empty(), "{:?}", out.unknown);
    assert_eq!(
        scraped(),
        4,
        "the round's result is used, not scraped again"
    );
}
