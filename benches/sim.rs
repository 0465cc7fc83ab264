//! The whole INC-47 scenario (70 simulated minutes, 22 of them the incident)
//! under lanekeeper and the baselines.
//!
//! Run: `cargo bench --bench sim`. Figures go to docs/performance.md.

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use lanekeeper::sim::{self, Strategy};

fn inc47(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let world = lanekeeper::manifest::load(&[root.join("examples/inc-47/inc-47.yaml")])
        .expect("example loads")
        .world;
    let full = lanekeeper::scenario::load(&root.join("examples/inc-47/scenario.yaml"))
        .expect("scenario loads");
    // The 22-minute incident alone (t = 180..1500, ~800,000 requests).
    let mut incident = full.clone();
    incident.duration_seconds = 1500.0;
    let mut g = c.benchmark_group("simulate-inc-47");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("lanekeeper incident 1500 s", |b| {
        b.iter(|| {
            sim::simulate(
                black_box(&world),
                black_box(&incident),
                Strategy::Lanekeeper,
            )
            .unwrap()
        })
    });
    for policy in [
        Strategy::Lanekeeper,
        Strategy::Fifo,
        Strategy::Static,
        Strategy::Fair,
    ] {
        g.bench_function(
            format!("{} full {} s", policy.as_str(), full.duration_seconds),
            |b| b.iter(|| sim::simulate(black_box(&world), black_box(&full), policy).unwrap()),
        );
    }
    g.finish();
}

criterion_group!(benches, inc47);
criterion_main!(benches);
