//! `lanekeeper rules` end to end: the committed rule file of
//! examples/objectives (what the chart check renders into a PrometheusRule
//! and a ConfigMap, and what the docs quote) is the command's output, lanes
//! without an objective get no rules, and bad input is refused.
//!
//! Regenerate with `cargo run -q -- rules -f examples/objectives/manifests.yaml > examples/objectives/rules.yaml`.

use crate::cli::{lanekeeper, lanekeeper_ok, root};
use crate::scratch::Scratch;

#[test]
fn the_committed_rule_file_is_the_commands_output() {
    let out = lanekeeper_ok(["rules", "-f", "examples/objectives/manifests.yaml"]);
    let committed = std::fs::read_to_string(root().join("examples/objectives/rules.yaml")).unwrap();
    assert!(
        out == committed,
        "examples/objectives/rules.yaml is out of date: regenerate it (see this file's header)"
    );
}

#[test]
fn only_lanes_with_an_objective_get_rules_each_with_its_labels() {
    let text = lanekeeper_ok(["rules", "-f", "examples/objectives"]);
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let groups = doc["groups"].as_sequence().unwrap();
    let names: Vec<&str> = groups.iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "lanekeeper-objective-ai-platform-tier0-live-agent",
            "lanekeeper-objective-ai-platform-tier1-drafts",
            "lanekeeper-objective-ai-platform-tier2-summaries",
        ],
        "batch-backfill has no objective"
    );
    for g in groups {
        for r in g["rules"].as_sequence().unwrap() {
            let l = &r["labels"];
            assert_eq!(l["namespace"], "ai-platform");
            assert_eq!(l["profile"], "support-assist");
            assert!(
                g["name"]
                    .as_str()
                    .unwrap()
                    .ends_with(l["lane"].as_str().unwrap())
            );
        }
    }
    // The 99.95 % lane's budget is 0.05 %; the 7d window of tier 2 is used.
    assert!(text.contains(") / 0.0005\n"), "{text}");
    assert!(text.contains("[7d]"));
}

/// `lanekeeper rules -f DIR --selector job="lanekeeper-gateway"`, which
/// must succeed: its output.
fn rules_for_one_job(dir: &str) -> String {
    lanekeeper_ok([
        "rules",
        "-f",
        dir,
        "--selector",
        "job=\"lanekeeper-gateway\"",
    ])
}

#[test]
fn the_selector_is_added_to_every_gateway_series() {
    let text = rules_for_one_job("examples/objectives");
    let gateway_series = text.matches("lanekeeper_gateway_").count();
    assert!(gateway_series > 0);
    assert_eq!(
        text.matches(",job=\\\"lanekeeper-gateway\\\"").count()
            + text.matches(",job=\"lanekeeper-gateway\"").count(),
        gateway_series,
        "{text}"
    );
}

#[test]
fn an_objective_the_crd_refuses_is_refused() {
    let dir = Scratch::new("rules-cli");
    let src = std::fs::read_to_string(root().join("examples/objectives/manifests.yaml")).unwrap();
    for (bad, message) in [
        (
            "withinDeadlinePercent: \"100\"",
            "withinDeadlinePercent must be within (0, 100)",
        ),
        (
            "withinDeadlinePercent: \"99.5\", window: 30m",
            "window must be at least 1h",
        ),
    ] {
        let f = dir.join("bad.yaml");
        std::fs::write(&f, src.replace("withinDeadlinePercent: \"99.5\"", bad)).unwrap();
        let out = lanekeeper(["rules", "-f", f.to_str().unwrap()]);
        assert!(!out.status.success(), "{bad}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(message),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_rule_quoted_in_the_telemetry_doc_is_in_the_rule_file() {
    let doc = std::fs::read_to_string(root().join("docs/telemetry.md")).unwrap();
    let rules = std::fs::read_to_string(root().join("examples/objectives/rules.yaml")).unwrap();
    let section = doc
        .split("## Objectives and error budgets")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the section");
    let quoted: Vec<&str> = section
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
        .collect();
    assert!(!quoted.is_empty());
    for expr in quoted {
        assert!(
            rules.contains(&format!("expr: {expr}\n")),
            "not in rules.yaml: {expr}"
        );
    }
}

/// The block docs/telemetry.md shows after `lanekeeper rules -f
/// examples/inc-47-tokens`.
fn documented_token_rules() -> String {
    let doc = std::fs::read_to_string(root().join("docs/telemetry.md")).unwrap();
    let head = "```sh\nlanekeeper rules -f examples/inc-47-tokens\n```\n\n```yaml\n";
    let from = doc
        .find(head)
        .expect("the token rules in docs/telemetry.md")
        + head.len();
    let len = doc[from..].find("```").unwrap();
    doc[from..from + len].to_owned()
}

#[test]
fn the_token_rules_in_the_telemetry_doc_are_the_commands_output() {
    let out = lanekeeper(["rules", "-f", "examples/inc-47-tokens"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        documented_token_rules(),
        text,
        "docs/telemetry.md is out of date"
    );
    // No lane has an objective: the profile's token group only, reading
    // every replica of its gateway and nothing else.
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let groups = doc["groups"].as_sequence().unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!(
        groups[0]["name"],
        "lanekeeper-tokens-ai-platform-agent-assist"
    );
    let records: Vec<&str> = groups[0]["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r["record"].as_str().unwrap())
        .collect();
    assert_eq!(
        records,
        [
            "lane:p95_input_tokens",
            "lane:p95_output_tokens",
            "lane:p95_cost_units_per_request"
        ]
    );
    assert_eq!(
        text.matches("lanekeeper_gateway_config_info{profile=\"ai-platform/agent-assist\"}")
            .count(),
        3
    );
}

#[test]
fn a_lane_without_a_cost_gets_no_token_rules_and_the_selector_reaches_them() {
    let dir = Scratch::new("rules-tokens");
    let src =
        std::fs::read_to_string(root().join("examples/inc-47-tokens/inc-47-tokens.yaml")).unwrap();
    // Without any cost: no group at all, said on stderr.
    let unpriced: String = src
        .lines()
        .filter(|l| !l.trim_start().starts_with("cost:"))
        .map(|l| format!("{l}\n"))
        .collect();
    let f = dir.join("unpriced.yaml");
    std::fs::write(&f, unpriced).unwrap();
    let out = lanekeeper(["rules", "-f", f.to_str().unwrap()]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "groups: []\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no lane has an objective or a cost"));
    std::fs::remove_dir_all(&dir).unwrap();

    let text = rules_for_one_job("examples/inc-47-tokens");
    let gateway_series = text.matches("lanekeeper_gateway_").count();
    assert_eq!(gateway_series, 6, "{text}");
    assert_eq!(
        text.matches("{job=\"lanekeeper-gateway\"}[5m]").count()
            + text.matches("{job=\"lanekeeper-gateway\",profile=").count(),
        gateway_series,
        "{text}"
    );
}
