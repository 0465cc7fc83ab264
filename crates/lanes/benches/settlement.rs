//! The admission core's per-request cost with tokens as the cost: a
//! request of a lane with `cost` sized, estimated and reserved
//! (`admit_sized`), then settled with its usage (`settle`), against the
//! same lanes charged one request each (`admit`). 100 lanes, 10,000
//! tenants, every request finding its tokens.
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

criterion_group!(benches, bench);
criterion_main!(benches);
