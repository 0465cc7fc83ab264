//! The gateway's capacity evidence in `simulate` (issue 22 item 4): with
//! `controller.gatewayEvidence`, INC-47's capacity drop reaches the engine
//! as the gateway's goodput while saturated, one scrape old, so the ladder
//! sheds before the lagged capacity signal shows the drop; without it the
//! step waits for the lag. The evidence never raises the capacity.

use std::path::Path;

use lanekeeper::policy::{GOODPUT_SIGNAL, World};
use lanekeeper::scenario::{GatewayEvidence, Scenario};
use lanekeeper::sim::{self, Run, Strategy};

const DROP: i64 = 180;

fn inc47(duration: f64) -> (World, Scenario) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let world = lanekeeper::manifest::load(&[root.join("examples/inc-47/inc-47.yaml")])
        .unwrap()
        .world;
    let mut sc = lanekeeper::scenario::load(&root.join("examples/inc-47/scenario.yaml")).unwrap();
    sc.duration_seconds = duration;
    (world, sc)
}

/// When the ladder first reached `shed` (level 2), and the capacity and its
/// source the engine decided on then.
fn shed(run: &Run) -> (i64, f64, String) {
    run.evaluations
        .iter()
        .find_map(|e| {
            let d = &e.profiles[0];
            (d.level >= 2).then(|| {
                (
                    e.at,
                    d.capacity_units_per_second.unwrap(),
                    d.capacity_source.clone().unwrap_or_default(),
                )
            })
        })
        .expect("the ladder sheds")
}

fn run(sc: &Scenario, world: &World) -> Run {
    sim::run(world, sc, Strategy::Lanekeeper).unwrap()
}

#[test]
fn the_gateways_evidence_sheds_before_the_lagged_capacity_does() {
    let (world, sc) = inc47(300.0);
    let scrape = sc
        .controller
        .gateway_evidence
        .as_ref()
        .expect("the example reads the gateway's evidence")
        .scrape_interval_seconds;
    let with = run(&sc, &world);
    let mut without_sc = sc.clone();
    without_sc.controller.gateway_evidence = None;
    let without = run(&without_sc, &world);

    let (at_with, cap_with, src_with) = shed(&with);
    let (at_without, cap_without, src_without) = shed(&without);
    // Without: 30 s of telemetry lag, then the evaluation that sees it.
    assert_eq!(at_without, 225, "{cap_without} from {src_without}");
    assert_eq!(src_without, "availableUnitsPerSecond");
    // With: the scrape after the gateway saturates, and the evaluation
    // after that.
    assert!(
        at_with < at_without && at_with <= DROP + scrape as i64 + 15,
        "shed at {at_with} s with the evidence, {at_without} s without"
    );
    assert_eq!(src_with, GOODPUT_SIGNAL);
    // What the pool did while saturated: about the 420 it has, never more.
    assert!(
        (400.0..=420.5).contains(&cap_with),
        "goodput while saturated {cap_with}"
    );
    // Before the drop the gateway is not saturated: no evidence, and the
    // two runs decide alike.
    for (a, b) in with.evaluations.iter().zip(&without.evaluations) {
        if a.at > DROP {
            break;
        }
        assert_eq!(a.profiles[0].level, b.profiles[0].level, "at {}", a.at);
        assert_eq!(
            a.profiles[0].capacity_source.as_deref(),
            Some("availableUnitsPerSecond"),
            "at {}",
            a.at
        );
    }
}

#[test]
fn the_evidence_never_raises_the_capacity_above_the_measured_one() {
    let (world, sc) = inc47(600.0);
    let with = run(&sc, &world);
    // The measured signal is the scenario's capacity, 30 s lagged over a
    // 30 s window: never above 560 before the drop and 420 once it shows.
    for e in &with.evaluations {
        let d = &e.profiles[0];
        let cap = d.capacity_units_per_second.unwrap();
        assert!(cap <= 560.0 + 1e-6, "at {}: {cap}", e.at);
        if e.at >= DROP + 60 {
            assert!(cap <= 420.0 + 1e-6, "at {}: {cap}", e.at);
        }
        if d.capacity_source.as_deref() == Some(GOODPUT_SIGNAL) {
            assert!(e.at > DROP, "saturated only after the drop: {}", e.at);
        }
    }
}

#[test]
fn a_bad_gateway_evidence_setting_is_refused() {
    let (_, mut sc) = inc47(300.0);
    for (scrape, window) in [(0.0, 60.0), (f64::NAN, 60.0), (15.0, 0.5)] {
        sc.controller.gateway_evidence = Some(GatewayEvidence {
            scrape_interval_seconds: scrape,
            window_seconds: window,
        });
        let err = lanekeeper::scenario::check(&sc).unwrap_err();
        assert!(
            err.to_string().contains("controller.gatewayEvidence"),
            "{err}"
        );
    }
}
