//! One tenant's long prompts under fixed costs and priced by tokens
//! (examples/tenant-tokens): `assist` takes 30 requests/s from three
//! tenants, team-a and team-b asking short questions and bulk (30 %)
//! sending documents of about 20,000 tokens, on a pool of 80 model slots
//! shared with a `batch` lane. Under fixed costs (fixed.yaml: every request
//! one work unit) bulk's prompts are admitted as freely as the teams' and
//! hold the slots: the teams and batch are refused at `concurrency.max`.
//! Priced by tokens (priced.yaml: the same with `cost`), the lane's bucket
//! and fair queue charge bulk for its prompts: the teams and batch keep
//! theirs and bulk waits for what is left. The priced run's output is a
//! golden (tests/golden/tenant-tokens-simulate.txt; `UPDATE_GOLDEN=1`
//! regenerates it) and docs/simulate.md quotes both runs' tenant lines.

use std::sync::OnceLock;

use lanekeeper::sim::report::{self, SimReport};
use lanekeeper::sim::tenant_report::TenantReport;
use lanekeeper::sim::{self, Scenario, Strategy};

const SCENARIO: &str = "examples/tenant-tokens/scenario.yaml";

use crate::cli::root;

fn run(manifests: &str) -> SimReport {
    let w = lanekeeper::manifest::load(&[root().join(manifests)])
        .unwrap()
        .world;
    let sc: Scenario = lanekeeper::scenario::load(&root().join(SCENARIO)).unwrap();
    sim::simulate(&w, &sc, Strategy::Lanekeeper).unwrap().1
}

/// (fixed costs, priced by tokens).
fn runs() -> &'static (SimReport, SimReport) {
    static RUNS: OnceLock<(SimReport, SimReport)> = OnceLock::new();
    RUNS.get_or_init(|| {
        (
            run("examples/tenant-tokens/fixed.yaml"),
            run("examples/tenant-tokens/priced.yaml"),
        )
    })
}

fn tenant<'a>(r: &'a SimReport, name: &str) -> &'a TenantReport {
    r.lane("assist")
        .unwrap()
        .tenants
        .iter()
        .find(|t| t.name == name)
        .unwrap()
}

fn in_time(t: &TenantReport) -> f64 {
    t.within_deadline_percent.unwrap()
}

#[test]
fn the_same_requests_come_from_the_same_tenants_in_both_runs() {
    let (fixed, priced) = runs();
    for name in ["team-a", "team-b", "bulk"] {
        assert_eq!(tenant(fixed, name).offered, tenant(priced, name).offered);
    }
    let offered: u64 = fixed
        .lane("assist")
        .unwrap()
        .tenants
        .iter()
        .map(|t| t.offered)
        .sum();
    assert_eq!(offered, fixed.lane("assist").unwrap().offered);
    // The shares: 35 %, 35 %, 30 % of 9,110.
    assert_eq!(tenant(fixed, "bulk").offered, 2733);
}

#[test]
fn under_fixed_costs_bulks_prompts_starve_the_teams_and_priced_they_do_not() {
    let (fixed, priced) = runs();
    for team in ["team-a", "team-b"] {
        let (f, p) = (tenant(fixed, team), tenant(priced, team));
        // Fixed costs: about 40 % of the teams' questions lost.
        assert!(in_time(f) < 60.0, "{f:?}");
        // Priced: 99 % answered in time.
        assert!(in_time(p) > 99.0, "{p:?}");
    }
    // The lane below loses as the teams do under fixed costs, and not
    // priced.
    let (fb, pb) = (fixed.lane("batch").unwrap(), priced.lane("batch").unwrap());
    assert!(fb.within_deadline_percent < Some(60.0), "{fb:?}");
    assert!(pb.within_deadline_percent > Some(99.0), "{pb:?}");
    // Bulk pays for its own prompts.
    assert!(in_time(tenant(priced, "bulk")) < in_time(tenant(fixed, "bulk")));
}

#[test]
fn the_golden_is_the_priced_output_and_the_docs_quote_both_runs() {
    let (fixed, priced) = runs();
    let text = report::render_table(priced);
    crate::plan_cli::golden("tenant-tokens-simulate.txt", &text);
    let docs = std::fs::read_to_string(root().join("docs/simulate.md")).unwrap();
    for run in [fixed, priced] {
        for line in report::render_table(run)
            .lines()
            .filter(|l| l.trim_start().starts_with("tenant "))
        {
            assert!(
                docs.contains(line.trim_start()),
                "docs/simulate.md should quote:\n{line}"
            );
        }
    }
    for (label, r) in [("fixed costs", fixed), ("priced by tokens", priced)] {
        let row = docs_row(label, r);
        assert!(docs.contains(&row), "docs/simulate.md should have:\n{row}");
    }
}

/// docs/simulate.md's row for a run.
fn docs_row(label: &str, r: &SimReport) -> String {
    format!(
        "| {label} | {:.3} % | {:.3} % | {:.3} % | {:.3} % |",
        in_time(tenant(r, "team-a")),
        in_time(tenant(r, "team-b")),
        in_time(tenant(r, "bulk")),
        r.lane("batch").unwrap().within_deadline_percent.unwrap()
    )
}
