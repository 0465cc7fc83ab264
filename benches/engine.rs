//! One evaluation of the decision engine, small and large.
//!
//! Run: `cargo bench --bench engine`. Figures go to docs/performance.md.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, criterion_group, criterion_main};
use lanekeeper::policy::{Approvals, EngineState, World, evaluate};
use lanekeeper::snapshot::{LaneSignals, PodSignals, ProfileSignals, Snapshot};

fn inc47() -> World {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/inc-47/inc-47.yaml");
    lanekeeper::manifest::load(&[dir])
        .expect("example loads")
        .world
}

/// `profiles` copies of the INC-47 profile and policy, `lanes` lanes spread
/// over them (copies of the five INC-47 lanes), `pods` pods spread over them.
fn world(profiles: usize, lanes: usize, pods: usize) -> (World, Snapshot) {
    let base = inc47();
    let mut w = World::default();
    let mut snap = Snapshot {
        at: 0,
        ..Default::default()
    };
    for p in 0..profiles {
        let pname = format!("pool-{p}");
        let mut prof = base.profiles[0].clone();
        prof.metadata.name = Some(pname.clone());
        w.profiles.push(prof);
        let mut pol = base.policies[0].clone();
        pol.metadata.name = Some(format!("ladder-{p}"));
        pol.spec.profile = pname.clone();
        w.policies.push(pol);
        let mut sig = ProfileSignals {
            available_units_per_second: Some(420.0 * (lanes / profiles) as f64 / 5.0),
            in_flight: Some(1400.0),
            ..Default::default()
        };
        for i in 0..pods / profiles {
            sig.pods.insert(
                format!("{pname}-pod-{i}"),
                PodSignals {
                    ready: Some(i % 17 != 0),
                    error_ratio: Some(if i % 9 == 0 { 0.4 } else { 0.01 }),
                    drain_requested: None,
                    revision: None,
                },
            );
        }
        snap.profiles.insert(format!("ai-platform/{pname}"), sig);
    }
    for l in 0..lanes {
        let p = l % profiles;
        let mut lane = base.lanes[l % 5].clone();
        let name = format!("lane-{l}");
        lane.metadata.name = Some(name.clone());
        lane.spec.profile = format!("pool-{p}");
        lane.spec.borrowing = None;
        w.lanes.push(lane);
        snap.lanes.insert(
            format!("ai-platform/{name}"),
            LaneSignals {
                requests_per_second: Some(10.0 + (l % 7) as f64),
                ..Default::default()
            },
        );
    }
    (w, snap)
}

fn bench(c: &mut Criterion) {
    let approvals = Approvals::new();
    let state = EngineState::default();

    let w = inc47();
    let mut snap = Snapshot {
        at: 0,
        ..Default::default()
    };
    let mut sig = ProfileSignals {
        available_units_per_second: Some(420.0),
        in_flight: Some(1400.0),
        ..Default::default()
    };
    for i in 0..8 {
        sig.pods.insert(
            format!("vllm-agent-assist-{i}"),
            PodSignals {
                ready: Some(true),
                error_ratio: Some(if i == 5 { 0.35 } else { 0.01 }),
                drain_requested: None,
                revision: None,
            },
        );
    }
    snap.profiles.insert("ai-platform/agent-assist".into(), sig);
    c.bench_function("evaluate 1 profile x 5 lanes x 8 pods", |b| {
        b.iter(|| evaluate(black_box(&w), black_box(&snap), &approvals, &state))
    });

    let (w, snap) = world(50, 1000, 10_000);
    // Sanity: the large case really evaluates 50 profiles and 1,000 lanes.
    let (eval, _) = evaluate(&w, &snap, &approvals, &state);
    assert_eq!(eval.profiles.len(), 50);
    assert_eq!(
        eval.profiles.iter().map(|p| p.lanes.len()).sum::<usize>(),
        1000
    );
    let mut group = c.benchmark_group("large");
    group.sample_size(30);
    group.bench_function("evaluate 50 profiles x 1000 lanes x 10000 pods", |b| {
        b.iter(|| evaluate(black_box(&w), black_box(&snap), &approvals, &state))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
