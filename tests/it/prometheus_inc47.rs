//! INC-47 read from a real Prometheus gives the same decisions as the
//! example's signals file; the example's OpenMetrics series file is current.

use crate::prometheus_support;

use std::time::Duration;

use lanekeeper::plan;
use lanekeeper::policy::Approvals;
use lanekeeper::signals::prometheus::{Window, signals_file};
use lanekeeper::snapshot::SignalsFile;
use prometheus_support::{Prom, minute_now, series_of};

/// The base time of examples/inc-47/prometheus/series.om
/// (2026-07-21T09:00:00Z).
const EXAMPLE_BASE: i64 = 1_784_624_400;

use crate::cli::root;

fn signals() -> SignalsFile {
    let text = std::fs::read_to_string(root().join("examples/inc-47/signals.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn world() -> lanekeeper::policy::World {
    lanekeeper::manifest::load(&[root().join("examples/inc-47-live")])
        .unwrap()
        .world
}

#[test]
fn example_series_file_is_current() {
    let want = series_of(&signals(), &world(), EXAMPLE_BASE).render();
    let path = root().join("examples/inc-47/prometheus/series.om");
    if std::env::var("LANEKEEPER_UPDATE_EXAMPLES").as_deref() == Ok("1") {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is stale: run LANEKEEPER_UPDATE_EXAMPLES=1 cargo test --test it -- prometheus_inc47::",
        path.display()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn inc47_from_prometheus_decides_like_the_signals_file() {
    let base = minute_now() - 3 * 3600;
    let sig = signals();
    let world = world();
    let Some(prom) = Prom::start(
        "inc47_from_prometheus_decides_like_the_signals_file",
        &series_of(&sig, &world, base).render(),
    ) else {
        return;
    };
    let end = base + sig.steps.last().unwrap().at;
    let (live, notes) = signals_file(
        &world,
        Some(&prom.url()),
        Duration::from_secs(10),
        &Window::Range {
            start: base,
            end,
            step: 60,
        },
    )
    .await
    .unwrap();
    assert!(notes.is_empty(), "every signal known: {notes:?}");
    assert_eq!(live.steps.len(), sig.steps.len());

    // The file, shifted to the same clock.
    let mut shifted = sig.clone();
    for s in &mut shifted.steps {
        s.at += base;
    }
    // Values read back are the file's values.
    for (a, b) in live.steps.iter().zip(&shifted.steps) {
        let (pa, pb) = (
            &a.profiles["ai-platform/agent-assist"],
            &b.profiles["ai-platform/agent-assist"],
        );
        assert_eq!(
            pa.available_units_per_second, pb.available_units_per_second,
            "at {}",
            a.at
        );
        assert_eq!(pa.in_flight, pb.in_flight);
        assert_eq!(pa.queue_depth, pb.queue_depth);
        assert_eq!(pa.p95_latency_seconds, pb.p95_latency_seconds);
        assert_eq!(pa.error_ratio, pb.error_ratio);
        for (pod, ps) in &pb.pods {
            assert_eq!(
                pa.pods[pod].error_ratio, ps.error_ratio,
                "{pod} at {}",
                a.at
            );
        }
    }
    let approvals = Approvals::new();
    let from_prom = plan::plan(&world, &live, &approvals);
    let from_file = plan::plan(&world, &shifted, &approvals);
    let levels = |p: &plan::Plan| {
        p.steps
            .iter()
            .map(|e| {
                let d = &e.profiles[0];
                (
                    e.at,
                    d.level,
                    d.lanes
                        .iter()
                        .map(|l| {
                            (
                                l.name.clone(),
                                l.state.as_str(),
                                l.admitted_units_per_second,
                            )
                        })
                        .collect::<Vec<_>>(),
                    d.desired_replicas,
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(levels(&from_prom), levels(&from_file));
    // INC-47's figures: level 2 at t=180 with P4 paused and P3 capped at 60,
    // admitted 400.1.
    let at180 = &from_prom.steps[3].profiles[0];
    assert_eq!(at180.level, 2);
    assert!((at180.admitted_units_per_second - 400.1).abs() < 1e-6);
    // Whole decisions equal, except where a lane's demand came from: every
    // lane has a measured rate (and a retry series at 0) in Prometheus,
    // while the file leaves some to expectedRequestsPerSecond (with the same
    // numbers) and measures no retries; a retry amplification exists only
    // for measured originals and retries.
    let (mut a, mut b) = (
        serde_json::to_value(&from_prom).unwrap(),
        serde_json::to_value(&from_file).unwrap(),
    );
    strip(&mut a, "demandSource");
    strip(&mut b, "demandSource");
    strip(&mut a, "retryAmplification");
    strip(&mut b, "retryAmplification");
    assert_eq!(first_difference(&a, &b, ""), None);
}

fn first_difference(a: &serde_json::Value, b: &serde_json::Value, at: &str) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys()) {
                let (va, vb) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                if let Some(d) = first_difference(va, vb, &format!("{at}.{k}")) {
                    return Some(d);
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (va, vb))| first_difference(va, vb, &format!("{at}[{i}]"))),
        _ if a == b => None,
        _ => Some(format!("{at}: {a} != {b}")),
    }
}

fn strip(v: &mut serde_json::Value, key: &str) {
    match v {
        serde_json::Value::Object(m) => {
            m.remove(key);
            m.values_mut().for_each(|x| strip(x, key));
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(|x| strip(x, key)),
        _ => {}
    }
}

/// The command, on the shipped example (whose profile configures no
/// queries): `plan -f examples/inc-47 --prometheus URL --from --to --step
/// 60s` reads the conventional recording rules of docs/telemetry.md and
/// decides like the signals file.
#[tokio::test(flavor = "multi_thread")]
async fn plan_cli_on_the_shipped_example_uses_the_conventional_recording_rules() {
    let base = minute_now() - 3 * 3600;
    let sig = signals();
    let Some(prom) = Prom::start(
        "plan_cli_on_the_shipped_example_uses_the_conventional_recording_rules",
        &series_of(&sig, &world(), base).render(),
    ) else {
        return;
    };
    let end = base + sig.steps.last().unwrap().at;
    let (url, from, to) = (prom.url(), base.to_string(), end.to_string());
    let live = crate::cli::lanekeeper_ok([
        "plan",
        "-f",
        "examples/inc-47",
        "--prometheus",
        &url,
        "--from",
        &from,
        "--to",
        &to,
        "--step",
        "60s",
        "-o",
        "json",
    ]);
    let live: serde_json::Value = serde_json::from_str(&live).unwrap();
    let shipped = lanekeeper::manifest::load(&[root().join("examples/inc-47/inc-47.yaml")])
        .unwrap()
        .world;
    let mut shifted = sig.clone();
    for s in &mut shifted.steps {
        s.at += base;
    }
    let from_file =
        serde_json::to_value(plan::plan(&shipped, &shifted, &Approvals::new())).unwrap();
    let levels = |p: &serde_json::Value| -> Vec<(i64, u64, f64)> {
        p["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let d = &s["profiles"][0];
                (
                    s["at"].as_i64().unwrap(),
                    d["level"].as_u64().unwrap(),
                    d["admittedUnitsPerSecond"].as_f64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(levels(&live), levels(&from_file));
    assert!(
        levels(&live)
            .iter()
            .any(|(_, l, a)| *l == 2 && (a - 400.1).abs() < 1e-6)
    );
}
