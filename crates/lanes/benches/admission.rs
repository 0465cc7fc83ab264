//! The gateway's admission core: decisions per second on one core, with 100
//! lanes and 10,000 tenants, and the same with every request queued and
//! served through the fair queue.
//!
//! Run: `cargo bench --bench admission`. Figures go to docs/performance.md.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use lanekeeper_lanes::GatewayConfig;
use lanekeeper_lanes::{Core, Request, Verdict};

const LANES: usize = 100;
const TENANTS: usize = 10_000;

/// 100 copies of the INC-47 lanes (at 420 units/s), each admitting `rps`
/// requests/s with a queue of `depth`.
fn config(rps: f64, depth: i64) -> GatewayConfig {
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
            l.admitted_requests_per_second = rps;
            l.burst = rps.ceil() as u64;
            l.queue.max_depth = depth;
            l.queue.ttl_seconds = 1_000_000;
            l.deadline_seconds = 1_000_000;
            l.optional_context = None;
            l
        })
        .collect();
    cfg
}

fn request<'a>(lane: &'a str, tenant: Option<&'a str>) -> Request<'a> {
    Request {
        lane,
        tenant,
        attempt: None,
        request_id: None,
    }
}

fn names() -> (Vec<String>, Vec<String>) {
    (
        (0..LANES).map(|i| format!("lane-{i}")).collect(),
        (0..TENANTS).map(|i| format!("tenant-{i}")).collect(),
    )
}

fn bench(c: &mut Criterion) {
    let (lanes, tenants) = names();
    let mut g = c.benchmark_group("admission");
    g.throughput(Throughput::Elements(1));

    // Every request finds a token: the bucket path.
    let mut core = Core::new(config(1e12, 100), 1.0, 0.0, 0.0).expect("valid");
    let mut i = 0usize;
    let mut now = 0.0;
    g.bench_function("admit (token), 100 lanes, 10k tenants", |b| {
        b.iter(|| {
            i = i.wrapping_add(7919);
            now += 1e-6;
            let v = core.admit(
                &request(&lanes[i % LANES], Some(&tenants[i % TENANTS])),
                now,
            );
            black_box(matches!(v, Verdict::Pass(_)))
        })
    });

    // Every request queues, and one poll a request serves one from the fair
    // queue (the rate equals the arrival rate): enqueue + WFQ dispatch.
    let mut core = Core::new(config(10_000.0, 1_000_000), 1.0, 0.0, 0.0).expect("valid");
    // Spend the initial burst so everything queues.
    for l in &lanes {
        for _ in 0..10_000 {
            let _ = core.admit(&request(l, None), 0.0);
        }
    }
    let _ = core.poll(0.0);
    let mut now = 0.0;
    g.bench_function("admit (queued) + poll, 100 lanes, 10k tenants", |b| {
        b.iter(|| {
            i = i.wrapping_add(7919);
            now += 1e-6;
            let v = core.admit(
                &request(&lanes[i % LANES], Some(&tenants[i % TENANTS])),
                now,
            );
            black_box(v);
            black_box(core.poll(now).len())
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
