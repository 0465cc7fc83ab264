//! `plan` shows each profile's change freeze at every step (issue 25): in
//! `-o json` as `steps[].profiles[].freeze` (state, band, and the lanes
//! that cause it with their bands) next to each lane's `objective`, absent
//! for a profile none of whose lanes has an objective; in the table as one
//! `freeze <before> -> <after>` line where the state changes.

use serde_json::{Value, json};

use crate::cli::lanekeeper_ok;

fn plan(args: &[&str]) -> String {
    lanekeeper_ok(std::iter::once("plan").chain(args.iter().copied()))
}

const OBJECTIVES: [&str; 4] = [
    "-f",
    "examples/objectives/manifests.yaml",
    "--signals",
    "examples/objectives/signals.yaml",
];

#[test]
fn each_step_shows_the_freeze_and_the_lanes_that_cause_it() {
    let mut args = OBJECTIVES.to_vec();
    args.extend(["-o", "json"]);
    let v: Value = serde_json::from_str(&plan(&args)).unwrap();
    let steps = v["steps"].as_array().unwrap();
    let restricted = |lanes: &[&str]| {
        json!({
            "state": "Rollouts",
            "band": "Restricted",
            "lanes": lanes.iter().map(|l| json!({"name": l, "band": "Restricted"})).collect::<Vec<_>>()
        })
    };
    let exhausted = json!({
        "state": "Everything",
        "band": "Exhausted",
        "lanes": [{"name": "tier0-live-agent", "band": "Exhausted"}]
    });
    let want = [
        // tier2 has an objective and no budget data at all: Restricted
        // from the start, so rollouts are frozen from the start.
        (0, restricted(&["tier2-summaries"])),
        (60, restricted(&["tier2-summaries"])),
        (120, restricted(&["tier2-summaries"])),
        // tier0 Cautious: not worse than tier2.
        (180, restricted(&["tier2-summaries"])),
        (240, restricted(&["tier2-summaries"])),
        // tier0's budget Unknown after Cautious: Restricted too.
        (300, restricted(&["tier0-live-agent", "tier2-summaries"])),
        (360, restricted(&["tier0-live-agent", "tier2-summaries"])),
        // tier0 Exhausted: every change frozen, tier0 alone causes it.
        (420, exhausted.clone()),
        (480, exhausted),
    ];
    assert_eq!(steps.len(), want.len());
    for (s, (at, freeze)) in steps.iter().zip(want) {
        assert_eq!(s["at"], at);
        let p = &s["profiles"][0];
        assert_eq!(p["freeze"], freeze, "at {at}");
        // The freeze agrees with the lanes' own bands in the same step.
        let worst = p["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|l| l["objective"]["band"].as_str())
            .max_by_key(|b| {
                ["Routine", "Cautious", "Restricted", "Exhausted"]
                    .iter()
                    .position(|x| x == b)
            })
            .unwrap();
        assert_eq!(p["freeze"]["band"], worst, "at {at}");
    }
}

#[test]
fn the_table_prints_a_line_where_the_freeze_changes() {
    let table = plan(&OBJECTIVES);
    let lines: Vec<&str> = table
        .lines()
        .filter(|l| l.trim_start().starts_with("freeze "))
        .map(str::trim)
        .collect();
    assert_eq!(
        lines,
        [
            "freeze Open -> Rollouts: lane tier2-summaries is Restricted",
            "freeze Rollouts -> Everything: lane tier0-live-agent is Exhausted",
        ]
    );
    // Each right under the step where it happens.
    let at = |needle: &str| {
        let all: Vec<&str> = table.lines().collect();
        let i = all.iter().position(|l| l.contains(needle)).unwrap();
        all[..i]
            .iter()
            .rev()
            .find(|l| l.starts_with("at "))
            .map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
            .unwrap()
    };
    assert_eq!(at("freeze Open -> Rollouts"), "0s");
    assert_eq!(at("freeze Rollouts -> Everything"), "420s");
    // docs/concepts.md quotes them.
    let concepts = std::fs::read_to_string(crate::cli::root().join("docs/concepts.md")).unwrap();
    for l in lines {
        assert!(
            concepts.contains(&format!("           {l}\n")),
            "concepts.md quotes {l:?}"
        );
    }
}

#[test]
fn a_profile_without_objectives_has_no_freeze() {
    let v: Value =
        serde_json::from_str(&plan(&["-f", "examples/inc-47/inc-47.yaml", "-o", "json"])).unwrap();
    for s in v["steps"].as_array().unwrap() {
        for p in s["profiles"].as_array().unwrap() {
            assert!(p.get("freeze").is_none(), "{}", p["name"]);
        }
    }
    let table = plan(&["-f", "examples/inc-47/inc-47.yaml"]);
    assert!(!table.contains("freeze "), "{table}");
}
