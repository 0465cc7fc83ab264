//! `lanekeeper plan` and the cost calibration: INC-47 with P2 priced by
//! tokens (`workUnitsPerRequest` 0.70) and a signals file measuring its P95
//! cost per request at exactly 20 % above (0.84: no warning), above (0.85:
//! a `CostUnderestimated` warning, in the text and in the JSON) and not at
//! all (`.nan`: Unknown, no warning).

use std::path::PathBuf;

use serde_json::Value;

use crate::cli::{lanekeeper_ok, root};
use crate::scratch::Scratch;

const SIGNALS: &str = "steps:
- at: 0
  lanes:
    ai-platform/p2-email-extract: {p95CostUnitsPerRequest: 0.84, p95InputTokens: 1800, p95OutputTokens: 150}
- at: 60
  lanes:
    ai-platform/p2-email-extract: {p95CostUnitsPerRequest: 0.85}
- at: 120
  lanes:
    ai-platform/p2-email-extract: {p95CostUnitsPerRequest: .nan}
";

/// The INC-47 manifests with P2 priced (`inc-47.yaml`), and the signals
/// (`signals.yaml`), in a fresh dir.
fn inputs() -> Scratch {
    let dir = Scratch::new("plan-cost");
    let text = std::fs::read_to_string(root().join("examples/inc-47/inc-47.yaml")).unwrap();
    let wpr = "  workUnitsPerRequest: \"0.70\"\n";
    assert_eq!(text.matches(wpr).count(), 1, "P2's line");
    let priced = text.replace(
        wpr,
        &format!("{wpr}  cost: {{perRequest: \"0.1\", perOutputToken: \"0.004\"}}\n"),
    );
    let (manifests, signals) = (dir.join("inc-47.yaml"), dir.join("signals.yaml"));
    std::fs::write(&manifests, priced).unwrap();
    std::fs::write(&signals, SIGNALS).unwrap();
    dir
}

fn plan(extra: &[&str]) -> String {
    let dir = inputs();
    let (manifests, signals) = (dir.join("inc-47.yaml"), dir.join("signals.yaml"));
    let mut args = vec![
        "plan".to_owned(),
        "-f".to_owned(),
        manifests.display().to_string(),
        "--signals".to_owned(),
        signals.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    lanekeeper_ok(&args)
}

#[test]
fn plan_warns_when_the_p95_cost_is_more_than_20_percent_above_work_units_per_request() {
    let text = plan(&[]);
    let warned: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("CostUnderestimated"))
        .collect();
    assert_eq!(warned.len(), 1, "{text}");
    assert!(
        warned[0].contains("lane p2-email-extract costs 0.85 work units")
            && warned[0].contains("workUnitsPerRequest 0.7"),
        "{text}"
    );
    // The runbook shows this very line.
    let runbook = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"),
    )
    .unwrap();
    let shown = runbook
        .lines()
        .find(|l| l.starts_with("warning: CostUnderestimated"))
        .expect("docs/operations.md shows the warning");
    assert_eq!(warned[0].trim(), shown, "docs/operations.md drifted");

    let v: Value = serde_json::from_str(&plan(&["-o", "json"])).unwrap();
    let steps = v["steps"].as_array().unwrap();
    let p2 = |i: usize| {
        steps[i]["profiles"][0]["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == "p2-email-extract")
            .unwrap()["cost"]
            .clone()
    };
    let warnings = |i: usize| steps[i]["profiles"][0]["warnings"].to_string();
    // Exactly 20 % above: calibrated, measured figures carried.
    assert_eq!(p2(0)["calibration"], "Calibrated");
    assert_eq!(p2(0)["p95CostUnitsPerRequest"], 0.84);
    assert_eq!(p2(0)["p95InputTokens"], 1800.0);
    assert_eq!(p2(0)["p95OutputTokens"], 150.0);
    assert!(!warnings(0).contains("CostUnderestimated"));
    // Above: the warning is in the JSON.
    assert_eq!(p2(1)["calibration"], "Underestimated");
    assert!(warnings(1).contains("CostUnderestimated: lane p2-email-extract"));
    // Not measured: Unknown, never a warning, never 0.
    assert_eq!(p2(2)["calibration"], "Unknown");
    assert!(p2(2).get("p95CostUnitsPerRequest").is_none());
    assert!(!warnings(2).contains("CostUnderestimated"));
    // A lane without a cost and without measurements is not judged.
    let p1 = steps[0]["profiles"][0]["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "p1-agent-assist")
        .unwrap()
        .clone();
    assert!(p1.get("cost").is_none(), "{p1}");
}
