//! INC-47 with tokens as the cost (examples/inc-47-tokens): INC-47's lanes
//! priced by tokens (`cost`, `maxOutputTokens`) and INC-47's scenario with a
//! token distribution on every lane, nothing else (checked here). Every
//! lane ends the same or better than INC-47 with fixed costs. The simulate
//! output is a golden (tests/golden/inc47-tokens-simulate.txt;
//! `UPDATE_GOLDEN=1` regenerates it) and docs/simulate.md quotes its token
//! lines.

use std::path::PathBuf;
use std::sync::OnceLock;

use lanekeeper::policy::World;
use lanekeeper::scenario::Scenario;
use lanekeeper::sim::report::{self, LaneReport, SimReport};
use lanekeeper::sim::{self, Strategy};

const MANIFESTS: &str = "examples/inc-47-tokens/inc-47-tokens.yaml";
const SCENARIO: &str = "examples/inc-47-tokens/scenario.yaml";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn world(path: &str) -> World {
    lanekeeper::manifest::load(&[root().join(path)])
        .unwrap()
        .world
}

fn scenario(path: &str) -> Scenario {
    lanekeeper::scenario::load(&root().join(path)).unwrap()
}

fn json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap()
}

fn lane<'a>(r: &'a SimReport, name: &str) -> &'a LaneReport {
    r.profiles[0].lanes.iter().find(|l| l.name == name).unwrap()
}

fn tokens_run() -> &'static SimReport {
    static RUN: OnceLock<SimReport> = OnceLock::new();
    RUN.get_or_init(|| {
        let (w, sc) = (world(MANIFESTS), scenario(SCENARIO));
        sim::simulate(&w, &sc, Strategy::Lanekeeper).unwrap().1
    })
}

#[test]
fn the_example_is_inc47_priced_by_tokens() {
    let mut w = world(MANIFESTS);
    assert!(w.lanes.iter().all(|l| l.spec.cost.is_some()));
    for l in &mut w.lanes {
        l.spec.cost = None;
        l.spec.tokens = None;
    }
    let inc47 = world("examples/inc-47/inc-47.yaml");
    assert_eq!(json(&w.lanes), json(&inc47.lanes));
    assert_eq!(json(&w.profiles), json(&inc47.profiles));
    assert_eq!(json(&w.policies), json(&inc47.policies));

    let mut sc = scenario(SCENARIO);
    assert!(sc.lanes.values().all(|l| l.tokens.is_some()));
    for l in sc.lanes.values_mut() {
        l.tokens = None;
    }
    sc.name = Some("INC-47".to_owned());
    assert_eq!(sc, scenario("examples/inc-47/scenario.yaml"));
}

#[test]
fn every_lane_ends_the_same_or_better_than_with_fixed_costs() {
    let fixed = &crate::sim_inc47::lanekeeper_run().1;
    let tokens = tokens_run();
    for l in &fixed.profiles[0].lanes {
        let t = lane(tokens, &l.name);
        let (a, b) = (
            t.within_deadline_percent.unwrap(),
            l.within_deadline_percent.unwrap(),
        );
        assert!(a >= b, "{}: {a} % within deadline, {b} % fixed", l.name);
        if l.name != "p4-eval-backfill" {
            // P4 (Pause) is what pays in both; the others lose no more.
            assert!(
                t.lost <= l.lost,
                "{}: lost {} vs {}",
                l.name,
                t.lost,
                l.lost
            );
        }
    }
}

#[test]
fn every_lane_settles_below_its_reservations() {
    for l in &tokens_run().profiles[0].lanes {
        let t = l.tokens.as_ref().expect("tokens are in play");
        let e = t.estimate.as_ref().expect("priced lanes settle");
        assert!(e.settled > 0 && e.settled <= t.answered, "{}", l.name);
        // Output reserved at the P95 of the answers: the mean answer costs
        // less than its reservation, and nine in ten at most as much.
        assert!(e.mean_settled_to_reserved < 1.0, "{}: {e:?}", l.name);
        assert!(e.p95_settled_to_reserved <= 1.05, "{}: {e:?}", l.name);
        assert_eq!(t.context_too_long + t.long_context_refusals, 0);
    }
}

#[test]
fn the_golden_is_the_simulate_output_and_the_docs_quote_it() {
    // `simulate`'s table is the report rendered (src/sim/cli.rs).
    let text = report::render_table(tokens_run());
    crate::plan_cli::golden("inc47-tokens-simulate.txt", &text);
    let docs = std::fs::read_to_string(root().join("docs/simulate.md")).unwrap();
    let quoted = text
        .lines()
        .filter(|l| l.trim_start().starts_with("tokens p1-"));
    for line in quoted {
        assert!(
            docs.contains(line.trim_start()),
            "docs/simulate.md should quote:\n{line}"
        );
    }
}
