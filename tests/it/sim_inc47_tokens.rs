//! INC-47 with tokens as the cost (examples/inc-47-tokens): INC-47's lanes
//! priced by tokens (`cost`, `maxOutputTokens`) and INC-47's scenario with a
//! token distribution on every lane, nothing else (checked here). The same
//! traffic under INC-47's own manifests is the fixed-cost run: every
//! request of a lane costs its `workUnitsPerRequest`. The simulate output
//! is a golden (tests/golden/inc47-tokens-simulate.txt; `UPDATE_GOLDEN=1`
//! regenerates it) and docs/simulate.md quotes its P1 token line and the
//! comparison, and says what P4 (paused in both) got: its queue held
//! through the pause, the work units of its release at 1 % and 10 %.

use std::sync::OnceLock;

use lanekeeper::policy::World;
use lanekeeper::scenario::Scenario;
use lanekeeper::sim::report::{self, LaneReport, SimReport};
use lanekeeper::sim::{self, Strategy};

const MANIFESTS: &str = "examples/inc-47-tokens/inc-47-tokens.yaml";
const SCENARIO: &str = "examples/inc-47-tokens/scenario.yaml";

use crate::cli::root;

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

fn tokens_run() -> &'static SimReport {
    static RUN: OnceLock<SimReport> = OnceLock::new();
    RUN.get_or_init(|| {
        let (w, sc) = (world(MANIFESTS), scenario(SCENARIO));
        sim::simulate(&w, &sc, Strategy::Lanekeeper).unwrap().1
    })
}

/// The same traffic (tokens and all) under INC-47's fixed costs.
fn fixed_run() -> &'static SimReport {
    static RUN: OnceLock<SimReport> = OnceLock::new();
    RUN.get_or_init(|| {
        let w = world("examples/inc-47/inc-47.yaml");
        sim::simulate(&w, &scenario(SCENARIO), Strategy::Lanekeeper)
            .unwrap()
            .1
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

/// docs/simulate.md's row for a lane: within deadline and lost, fixed
/// costs then tokens.
fn docs_row(name: &str) -> String {
    let (f, t) = (
        fixed_run().lane(name).unwrap(),
        tokens_run().lane(name).unwrap(),
    );
    let pct = |l: &LaneReport| format!("{:.3} %", l.within_deadline_percent.unwrap());
    format!(
        "| {name} | {} | {} | {} | {} |",
        pct(f),
        f.lost,
        pct(t),
        t.lost
    )
}

#[test]
fn priced_by_tokens_every_lane_ends_as_well_as_with_fixed_costs_and_the_docs_say_so() {
    let docs = std::fs::read_to_string(root().join("docs/simulate.md")).unwrap();
    for f in &fixed_run().profiles[0].lanes {
        let t = tokens_run().lane(&f.name).unwrap();
        let (pt, pf) = (
            t.within_deadline_percent.unwrap(),
            f.within_deadline_percent.unwrap(),
        );
        if f.name == "p4-eval-backfill" {
            // P4 (Pause) is what pays under both: within 0.02 points and
            // 0.05 % of its losses.
            assert!(pt >= pf - 0.02, "P4: {pt} % priced, {pf} % fixed");
            assert!(
                t.lost as f64 <= f.lost as f64 * 1.0005,
                "P4 lost {}",
                t.lost
            );
        } else {
            assert!(pt >= pf, "{}: {pt} % priced, {pf} % fixed", f.name);
            assert!(
                t.lost <= f.lost,
                "{}: lost {} vs {}",
                f.name,
                t.lost,
                f.lost
            );
        }
        let row = docs_row(&f.name);
        assert!(docs.contains(&row), "docs/simulate.md should have:\n{row}");
    }
    // The ladder moves at the same times up to the last step down, which
    // the priced run, its P3 and P4 drained sooner, takes 15 s earlier;
    // P0's late answers are the pool's (its longest prompts outlast the
    // 12 s deadline), about 4,000 either way.
    let moves = |r: &SimReport| -> Vec<(i64, u32)> {
        r.profiles[0]
            .level_timeline
            .iter()
            .map(|c| (c.at, c.to))
            .collect()
    };
    assert_eq!(
        moves(tokens_run()),
        [(0, 1), (210, 2), (1875, 1), (3810, 0)]
    );
    assert_eq!(moves(fixed_run()), [(0, 1), (210, 2), (1875, 1), (3825, 0)]);
    let p0 = |r: &SimReport| r.lane("p0-disruption-assist").unwrap().clone();
    let (f0, t0) = (p0(fixed_run()), p0(tokens_run()));
    assert_eq!(
        (f0.latency_p99_seconds, t0.latency_p99_seconds),
        (Some(15.248), Some(15.179))
    );
    assert!((3900..4100).contains(&f0.late) && (3900..4100).contains(&t0.late));
    // Under fixed costs the tokens are still counted, and nothing settles.
    for l in &fixed_run().profiles[0].lanes {
        let t = l
            .tokens
            .as_ref()
            .expect("the scenario's tokens are in play");
        assert!(t.answered > 0 && t.estimate.is_none(), "{}", l.name);
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

/// P4's series in `r`: the work units sent to the pool from `from` to
/// `to` seconds, and the least and most it had queued meanwhile.
fn p4_between(r: &SimReport, from: u64, to: u64) -> (f64, u32, u32) {
    let p = &r.profiles[0];
    let i = p
        .lanes
        .iter()
        .position(|l| l.name == "p4-eval-backfill")
        .unwrap();
    let step = r.profiles[0].series[1].at - r.profiles[0].series[0].at;
    let pts: Vec<_> = p
        .series
        .iter()
        .filter(|s| (from..to).contains(&s.at))
        .map(|s| &s.lanes[i])
        .collect();
    let units = pts.iter().map(|l| l.served).sum::<f64>() * step as f64;
    let least = pts.iter().map(|l| l.queued).min().unwrap();
    let most = pts.iter().map(|l| l.queued).max().unwrap();
    (units, least, most)
}

/// `1606.8` as the docs write it: `1,606.8`.
fn thousands(v: f64) -> String {
    let s = format!("{v:.1}");
    let (int, frac) = s.split_once('.').unwrap();
    let mut out = String::new();
    for (k, c) in int.chars().enumerate() {
        if k > 0 && (int.len() - k) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{out}.{frac}")
}

#[test]
fn p4_is_held_in_the_pause_alike_and_the_docs_say_what_its_release_got() {
    let docs = std::fs::read_to_string(root().join("docs/simulate.md")).unwrap();
    for r in [fixed_run(), tokens_run()] {
        // Paused from 210 s to 1,875 s: nothing is sent, the queue holds.
        let (units, least, most) = p4_between(r, 210, 1875);
        assert_eq!((units, least, most), (0.0, 896, 896));
        // At 10 % of its rate its queue is full (5,000; one less at the
        // instant a pass took one out).
        let (_, least, most) = p4_between(r, 2175, 2475);
        assert!(least >= 4999 && most == 5000, "{least}..{most}");
    }
    let (fixed, _, _) = p4_between(fixed_run(), 1875, 2475);
    let (priced, _, _) = p4_between(tokens_run(), 1875, 2475);
    assert!(priced < fixed, "{priced} vs {fixed}");
    assert!(fixed - priced < 0.004 * fixed, "{priced} vs {fixed}");
    let said = format!(
        "P4 is sent {} work units\nin the two stages against {} under fixed costs ({:.1} units",
        thousands(priced),
        thousands(fixed),
        fixed - priced
    );
    assert!(docs.contains(&said), "docs/simulate.md should say:\n{said}");
}
