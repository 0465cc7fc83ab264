//! A burst of long prompts in a low lane cannot starve a higher lane
//! (examples/long-context): `research` (priority 3) bursts to 6 requests/s
//! of prompts around 20,000 tokens, each holding one of the pool's 100
//! model slots for tens of seconds. With the profile's `longContext` (at
//! most 8 prompts above 16,000 tokens in flight) `chat` loses nothing; the
//! same run without it loses chat's requests to `concurrency.max`. The
//! simulate output is a golden (tests/golden/long-context-simulate.txt;
//! `UPDATE_GOLDEN=1` regenerates it) and docs/simulate.md quotes its token
//! lines.

use std::sync::OnceLock;

use lanekeeper::policy::World;
use lanekeeper::sim::report::{self, SimReport};
use lanekeeper::sim::{self, Scenario, Strategy};

const MANIFESTS: &str = "examples/long-context/long-context.yaml";
const SCENARIO: &str = "examples/long-context/scenario.yaml";

use crate::cli::root;

fn world() -> World {
    lanekeeper::manifest::load(&[root().join(MANIFESTS)])
        .unwrap()
        .world
}

fn scenario() -> Scenario {
    lanekeeper::scenario::load(&root().join(SCENARIO)).unwrap()
}

/// The example, and the same without the long-context limit.
fn runs() -> &'static (SimReport, SimReport) {
    static RUNS: OnceLock<(SimReport, SimReport)> = OnceLock::new();
    RUNS.get_or_init(|| {
        let (w, sc) = (world(), scenario());
        assert!(w.profiles[0].spec.long_context.is_some());
        let with = sim::simulate(&w, &sc, Strategy::Lanekeeper).unwrap().1;
        let mut without = w;
        without.profiles[0].spec.long_context = None;
        let without = sim::simulate(&without, &sc, Strategy::Lanekeeper)
            .unwrap()
            .1;
        (with, without)
    })
}

#[test]
fn the_long_context_limit_keeps_chat_whole_through_the_burst() {
    let (with, _) = runs();
    let chat = with.lane("chat").unwrap();
    assert_eq!(chat.offered, 9085);
    assert_eq!(chat.rejected + chat.expired + chat.failed, 0, "{chat:#?}");
    assert_eq!(chat.within_deadline_percent, Some(99.923));
    let research = with.lane("research").unwrap();
    let t = research
        .tokens
        .as_ref()
        .expect("research's tokens are in play");
    // The burst pays: its long prompts beyond the 8 places are refused.
    assert_eq!(t.long_context_refusals, 421);
    assert_eq!(research.rejected, 426);
    // Five prompts above maxInputTokens (100,000) were refused before
    // admission.
    assert_eq!(t.context_too_long, 5);
    assert_eq!(t.estimate, None, "research has no cost: nothing settles");
}

#[test]
fn without_it_the_burst_takes_the_model_slots_from_chat() {
    let (with, without) = runs();
    let chat = without.lane("chat").unwrap();
    assert_eq!(chat.rejected, 1294);
    assert_eq!(chat.within_deadline_percent, Some(85.642));
    assert!(
        chat.within_deadline_percent < with.lane("chat").unwrap().within_deadline_percent,
        "the limit is what keeps chat"
    );
    let research = without.lane("research").unwrap();
    assert_eq!(research.tokens.as_ref().unwrap().long_context_refusals, 0);
    // More long prompts got in, and the research answered took longer.
    assert!(research.admitted > with.lane("research").unwrap().admitted);
}

#[test]
fn chat_reserves_more_than_its_answers_cost_and_settles_the_difference() {
    let (with, _) = runs();
    let t = with.lane("chat").unwrap().tokens.clone().unwrap();
    let e = t.estimate.expect("chat is priced");
    // Reserved at the P95 of its answers (256 tokens before 20 settled),
    // settled at their actual length: a few answers above the P95 cost
    // more than they reserved.
    assert_eq!(e.settled, t.answered);
    assert!(
        e.mean_settled_to_reserved < 0.7 && e.p95_settled_to_reserved < 1.05,
        "{e:?}"
    );
    assert_eq!(t.input.median_per_request, Some(599));
    assert_eq!(t.output.p95_per_request, Some(492));
}

#[test]
fn the_golden_is_the_simulate_output_and_the_docs_quote_it() {
    // `simulate`'s table is the report rendered (src/sim/cli.rs).
    let text = report::render_table(&runs().0);
    crate::plan_cli::golden("long-context-simulate.txt", &text);
    let docs = std::fs::read_to_string(root().join("docs/simulate.md")).unwrap();
    for line in text
        .lines()
        .filter(|l| l.trim_start().starts_with("tokens "))
    {
        assert!(
            docs.contains(line.trim_start()),
            "docs/simulate.md should quote:\n{line}"
        );
    }
}

/// docs/simulate.md's row for a run.
fn docs_row(label: &str, r: &SimReport) -> String {
    let (chat, research) = (r.lane("chat").unwrap(), r.lane("research").unwrap());
    format!(
        "| {label} | {:.3} % | {} | {} |",
        chat.within_deadline_percent.unwrap(),
        chat.rejected,
        research.tokens.as_ref().unwrap().long_context_refusals
    )
}

#[test]
fn the_docs_table_is_the_two_runs() {
    let (with, without) = runs();
    let docs = std::fs::read_to_string(root().join("docs/simulate.md")).unwrap();
    let rows = [
        docs_row("**with `longContext` (the example)**", with),
        docs_row("without `longContext`", without),
    ];
    for row in rows {
        assert!(docs.contains(&row), "docs/simulate.md should have:\n{row}");
    }
}
