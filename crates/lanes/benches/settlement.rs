//! The admission core's per-request cost with tokens as the cost: a
//! request of a lane with `cost` sized, estimated and reserved
//! (`admit_sized`), then settled with its usage (`settle`), against the
//! same lanes charged one request each (`admit`). 100 lanes, 10,000
//! tenants, every request finding its tokens.
//!
//! Also reading an answer's usage (`Usage::from_answer`) against reading
//! it through a `serde_json::Value`.
//!
//! Run: `cargo bench -p lanekeeper-lanes --bench settlement`. Figures go
//! to docs/performance.md.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use lanekeeper_lanes::{Core, GatewayConfig, Request, RequestSize, TokenCost, Usage, Verdict};

const LANES: usize = 100;
const TENANTS: usize = 10_000;

/// 100 copies of INC-47's P1 admitting far more than the bench sends,
/// priced per token or not.
fn config(priced: bool) -> GatewayConfig {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/inc-47/lanes-420.json"
    ))
    .expect("the example config");
    let mut cfg: GatewayConfig = serde_json::from_str(&text).expect("valid");
    let base = cfg.lanes[1].clone();
    cfg.lanes = (0..LANES)
        .map(|i| {
            let mut l = base.clone();
            l.name = format!("lane-{i}");
            l.admitted_requests_per_second = 1e12;
            l.burst = 1_000_000_000_000;
            l.optional_context = None;
            l.cost = priced.then_some(TokenCost {
                per_request: Some(0.1),
                per_input_token: Some(0.001),
                per_output_token: Some(0.004),
            });
            l
        })
        .collect();
    cfg
}

fn request<'a>(lane: &'a str, tenant: &'a str) -> Request<'a> {
    Request {
        lane,
        tenant: Some(tenant),
        attempt: None,
        request_id: None,
    }
}

fn bench(c: &mut Criterion) {
    let lanes: Vec<String> = (0..LANES).map(|i| format!("lane-{i}")).collect();
    let tenants: Vec<String> = (0..TENANTS).map(|i| format!("tenant-{i}")).collect();
    let mut g = c.benchmark_group("settlement");
    g.throughput(Throughput::Elements(1));

    let mut core = Core::new(config(false), 1.0, 0.0, 0.0).expect("valid");
    let (mut i, mut now) = (0usize, 0.0);
    g.bench_function("admit (one request each), 100 lanes, 10k tenants", |b| {
        b.iter(|| {
            i = i.wrapping_add(7919);
            now += 1e-6;
            let v = core.admit(&request(&lanes[i % LANES], &tenants[i % TENANTS]), now);
            black_box(matches!(v, Verdict::Pass(_)))
        })
    });

    let mut core = Core::new(config(true), 1.0, 0.0, 0.0).expect("valid");
    g.bench_function(
        "admit_sized + settle (priced), 100 lanes, 10k tenants",
        |b| {
            b.iter(|| {
                i = i.wrapping_add(7919);
                now += 1e-6;
                // Prompts of 400 to 40,000 bytes, answers of 20 to 2,000 tokens.
                let bytes = 400 + (i % 100) * 400;
                let size = RequestSize {
                    body_bytes: bytes,
                    max_tokens: Some(4096),
                    input_tokens: None,
                };
                let v = core.admit_sized(
                    &request(&lanes[i % LANES], &tenants[i % TENANTS]),
                    size,
                    now,
                );
                let Verdict::Pass(p) = v else {
                    panic!("every request finds its tokens")
                };
                let usage = Usage {
                    prompt_tokens: (bytes / 4) as u64,
                    completion_tokens: 20 + (i % 100) as u64 * 20,
                };
                let charge = p.charge.expect("a sized pass carries its charge");
                black_box(core.settle(&charge, Some(usage), now))
            })
        },
    );
    g.finish();
}

/// An answer of `tokens` words of content, with its usage.
fn answer(tokens: usize) -> Vec<u8> {
    let content = "ok ".repeat(tokens);
    serde_json::to_vec(&serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 15, "completion_tokens": tokens, "total_tokens": tokens + 15},
    }))
    .expect("JSON")
}

/// The answer read into a `serde_json::Value` first, as the gateway did
/// before: the comparison for [`Usage::from_answer`].
fn usage_through_value(body: &[u8]) -> Option<Usage> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let u = v.get("usage")?;
    Some(Usage {
        prompt_tokens: u.get("prompt_tokens")?.as_u64()?,
        completion_tokens: u.get("completion_tokens")?.as_u64()?,
    })
}

/// Reading an answer's usage: the fake model's answer (16 tokens, 270
/// bytes) and a long one (4,000 tokens, 12 KB).
fn read_usage(c: &mut Criterion) {
    let mut g = c.benchmark_group("usage");
    for tokens in [16, 4000] {
        let body = answer(tokens);
        assert_eq!(Usage::from_answer(&body), usage_through_value(&body));
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(format!("from_answer, {} bytes", body.len()), |b| {
            b.iter(|| black_box(Usage::from_answer(black_box(&body))))
        });
        g.bench_function(format!("through a Value, {} bytes", body.len()), |b| {
            b.iter(|| black_box(usage_through_value(black_box(&body))))
        });
    }
    g.finish();
}

criterion_group!(benches, bench, read_usage);
criterion_main!(benches);
