//! INC-47 with error budgets (examples/inc-47-budget): the reference incident
//! with an objective on P0..P2 and a fast-burn trigger on `shed`. The fast
//! burn of P0's budget sheds at t=60, two evaluations before the capacity
//! evidence (t=180) would; P0's budget crosses 20 % at t=180 and the change
//! freeze holds rollouts from then on. The example is INC-47 and nothing
//! else (its manifests and timeline are checked against examples/inc-47),
//! the JSON is a golden (tests/golden/inc47-budget-plan.json;
//! `UPDATE_GOLDEN=1` regenerates it), and the figures quoted in
//! docs/concepts.md and examples/inc-47/README.md are checked against it.

use lanekeeper::plan;
use lanekeeper::policy::{Approvals, World};
use lanekeeper::snapshot::{BurnRates, SignalsFile};
use serde_json::Value;

use crate::cli::{lanekeeper_ok as run, root};
use crate::objectives_plan::lane;

const MANIFESTS: &str = "examples/inc-47-budget/inc-47-budget.yaml";
const SIGNALS: &str = "examples/inc-47-budget/signals.yaml";
const P0: &str = "p0-disruption-assist";

fn plan_text() -> String {
    run(["plan", "-f", MANIFESTS, "--signals", SIGNALS])
}

fn plan_json() -> (String, Value) {
    let text = run(["plan", "-f", MANIFESTS, "--signals", SIGNALS, "-o", "json"]);
    let v = serde_json::from_str(&text).unwrap();
    (text, v)
}

fn world(path: &str) -> World {
    lanekeeper::manifest::load(&[root().join(path)])
        .unwrap()
        .world
}

fn timeline(path: &str) -> SignalsFile {
    serde_yaml::from_str(&std::fs::read_to_string(root().join(path)).unwrap()).unwrap()
}

/// The budget example without what it adds: no objective, no burn trigger.
fn without_budget(mut w: World) -> World {
    for l in &mut w.lanes {
        l.spec.objective = None;
    }
    for p in &mut w.policies {
        for level in &mut p.spec.levels {
            level.enter_when.burn_rate_above = None;
        }
    }
    w
}

/// The budget timeline without its budget data (lane entries left empty go).
fn without_budget_data(mut s: SignalsFile) -> SignalsFile {
    for step in &mut s.steps {
        for l in step.lanes.values_mut() {
            l.error_budget_remaining_percent = None;
            l.burn_rate = BurnRates::default();
        }
        step.lanes.retain(|_, l| *l != Default::default());
    }
    s
}

fn json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap()
}

#[test]
fn the_example_is_inc47_plus_objectives_and_a_burn_trigger() {
    let (budget, inc47) = (world(MANIFESTS), world("examples/inc-47"));
    assert!(budget.lanes.iter().any(|l| l.spec.objective.is_some()));
    assert_eq!(json(&without_budget(budget).lanes), json(&inc47.lanes));
    let budget = world(MANIFESTS);
    assert_eq!(json(&budget.profiles), json(&inc47.profiles));
    assert_eq!(
        json(&without_budget(budget).policies),
        json(&inc47.policies)
    );
}

#[test]
fn the_timeline_is_inc47s_plus_budget_data() {
    let budget = timeline(SIGNALS);
    let every_step_has_p0s_budget = budget.steps.iter().all(|s| {
        s.lanes[&format!("ai-platform/{P0}")]
            .error_budget_remaining_percent
            .is_some()
    });
    assert!(every_step_has_p0s_budget);
    assert_eq!(
        without_budget_data(budget),
        timeline("examples/inc-47/signals.yaml")
    );
}

/// (at, level) of each step where the level changes, and why.
fn level_changes(plan: &Value) -> Vec<(i64, i64, String)> {
    plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| {
            let p = &s["profiles"][0];
            let t = p.get("transition").filter(|t| !t.is_null())?;
            Some((
                s["at"].as_i64().unwrap(),
                p["level"].as_i64().unwrap(),
                t["reason"].as_str().unwrap().to_owned(),
            ))
        })
        .collect()
}

#[test]
fn the_fast_burn_sheds_before_the_capacity_evidence_does() {
    let (_, with_burn) = plan_json();
    let alone = json(&plan::plan(
        &world(MANIFESTS),
        &without_budget_data(timeline(SIGNALS)),
        &Approvals::new(),
    ));
    let shed_at = |p: &Value| level_changes(p).into_iter().find(|c| c.1 == 2);
    let (at, _, why) = shed_at(&with_burn).expect("sheds");
    assert_eq!(at, 60);
    assert_eq!(
        why,
        "burnRateAbove: lane p0-disruption-assist burns 1h 15.15, 5m 60 > 14.4"
    );
    let (at, _, why) = shed_at(&alone).expect("sheds on capacity alone");
    assert_eq!(at, 180);
    assert!(why.starts_with("overCapacity"), "{why}");
    // At t=0 the 5m window burns 60x but the 1h one 14.15x: no page yet.
    assert_eq!(with_burn["steps"][0]["profiles"][0]["level"], 1);
    // The way back is the same: down at 1800 and 2700 in both.
    let downs = |p: &Value| -> Vec<(i64, i64)> {
        level_changes(p)
            .into_iter()
            .filter(|c| c.2.contains("exit held"))
            .map(|c| (c.0, c.1))
            .collect()
    };
    assert_eq!(downs(&with_burn), [(1800, 1), (2700, 0)]);
    assert_eq!(downs(&with_burn), downs(&alone));
}

#[test]
fn p0_turns_restricted_and_the_freeze_holds_rollouts() {
    let (_, v) = plan_json();
    for s in v["steps"].as_array().unwrap() {
        let at = s["at"].as_i64().unwrap();
        let band = lane(s, P0)["objective"]["band"].as_str().unwrap();
        let freeze = s["profiles"][0]["freeze"]["state"].as_str().unwrap();
        let (want_band, want_freeze) = if at < 180 {
            ("Cautious", "Open")
        } else {
            ("Restricted", "Rollouts")
        };
        assert_eq!((band, freeze), (want_band, want_freeze), "at {at}");
        for other in ["p1-agent-assist", "p2-email-extract"] {
            assert_eq!(lane(s, other)["objective"]["band"], "Routine", "{other}");
        }
        assert!(lane(s, "p3-shift-batch").get("objective").is_none());
    }
}

#[test]
fn the_golden_is_the_plan() {
    let (text, _) = plan_json();
    crate::plan_cli::golden("inc47-budget-plan.json", &text);
}

/// The lines of the table the docs quote: the level changes, the freeze
/// and the objectives' summary.
fn quoted_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = String::new();
    for line in text.lines() {
        if line.starts_with("at ") {
            // "at     60s  ai-platform/…" is quoted as "t=60s" (a line
            // starting with "at " would read as INC-47's own walkthrough).
            at = format!("t={}", line.split_whitespace().nth(1).unwrap());
        }
        let t = line.trim_start();
        if t.starts_with("UP ") || t.starts_with("freeze ") {
            out.push(format!("{at}: {t}"));
        }
        if line.starts_with("objective ") {
            out.push(line.to_owned());
        }
    }
    out
}

#[test]
fn the_docs_quote_the_plan() {
    let lines = quoted_lines(&plan_text());
    assert_eq!(lines.len(), 6, "{lines:#?}");
    let quote = format!("```text\n{}\n```", lines.join("\n"));
    for doc in ["docs/concepts.md", "examples/inc-47/README.md"] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        assert!(text.contains(&quote), "{doc} should quote:\n{quote}");
    }
}
