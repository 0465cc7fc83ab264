//! `lanekeeper rules` under `promtool test rules`: the generated rule file
//! and a test file of synthetic gateway series, run by the real promtool.
//! A fast burn fires the 14.4× alert, a slow burn only the 6× one, a
//! healthy lane nothing, and the budget remaining has the right value.

use std::path::Path;
use std::process::{Command, Output};

use crate::prometheus_support::promtool;
use crate::scratch::Scratch;

const MANIFESTS: &str = r#"
apiVersion: lanekeeper.dev/v1alpha1
kind: CapacityProfile
metadata: {name: pool, namespace: team}
spec:
  pool:
    scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: pool}
    podSelector: {matchLabels: {app: pool}}
  capacity:
    safeUnitsPerSecond: "100"
    unitsPerReplica: "10"
    calibration: {configHash: "sha256:00", measuredAt: "2026-11-02T00:00:00Z", validForSeconds: 7776000}
  replicas: {min: 1, max: 10}
"#;

/// `lanekeeper rules -f FILE` on `manifests` (written into `dir`): the
/// rule file it prints, also written to `dir/rules.yaml`.
pub(crate) fn generated_rules(dir: &Path, manifests: &str) -> String {
    let path = dir.join("manifests.yaml");
    std::fs::write(&path, manifests).unwrap();
    let rules = crate::cli::lanekeeper_ok(["rules".as_ref(), "-f".as_ref(), path.as_os_str()]);
    std::fs::write(dir.join("rules.yaml"), &rules).unwrap();
    rules
}

/// `promtool test rules` on `test` (written to `dir/rules_test.yaml`, next
/// to the rule file it names).
pub(crate) fn promtool_test(promtool: &Path, dir: &Path, test: &str) -> Output {
    std::fs::write(dir.join("rules_test.yaml"), test).unwrap();
    Command::new(promtool)
        .args(["test", "rules", "rules_test.yaml"])
        .current_dir(dir)
        .output()
        .unwrap()
}

fn lane(name: &str, objective: Option<&str>) -> String {
    let objective = objective
        .map(|o| format!("  objective: {o}\n"))
        .unwrap_or_default();
    format!(
        r#"---
apiVersion: lanekeeper.dev/v1alpha1
kind: LaneContract
metadata: {{name: {name}, namespace: team}}
spec:
  profile: pool
  priority: 1
  workUnitsPerRequest: "1"
  expectedRequestsPerSecond: "10"
  deadlineSeconds: 30
  queue: {{maxDepth: 10, ttlSeconds: 10}}
  retry: {{maxAttempts: 2}}
  routes: {{primary: [m]}}
{objective}"#
    )
}

/// Per minute: `good` good and `bad` bad outcomes, for 400 minutes.
fn series(lane: &str, good: u32, bad: u32) -> String {
    format!(
        "      - series: 'lanekeeper_gateway_qualified_requests_total{{lane=\"{lane}\",outcome=\"good\",pod=\"gw-a\"}}'\n        values: '0+{good}x400'\n      - series: 'lanekeeper_gateway_qualified_requests_total{{lane=\"{lane}\",outcome=\"bad\",pod=\"gw-a\"}}'\n        values: '0+{bad}x400'\n"
    )
}

fn labels(lane: &str) -> String {
    format!("{{lane: {lane}, namespace: team, profile: pool, severity: page}}")
}

/// The alerts expected at `at` for each lane and alert.
fn alert_case(at: &str, alert: &str, firing: &[&str]) -> String {
    let mut s =
        format!("      - eval_time: {at}\n        alertname: {alert}\n        exp_alerts:\n");
    let (f, long, short) = if alert.contains("Fast") {
        ("14.4", "1h", "5m")
    } else {
        ("6", "6h", "30m")
    };
    for l in firing {
        s += &format!("          - exp_labels: {}\n", labels(l));
        s += &format!(
            "            exp_annotations:\n              summary: 'Lane team/{l} burns its error budget {f}× too fast'\n              description: 'Over both {long} and {short}, lane team/{l} burns its error budget faster than {f}× (objective 99.9 % over 28d).'\n"
        );
    }
    if firing.is_empty() {
        s = s.replace("        exp_alerts:\n", "        exp_alerts: []\n");
    }
    s
}

fn test_file() -> String {
    let mut t = String::from(
        "rule_files: [rules.yaml]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n",
    );
    // 99.9 %: a budget of 0.1 %. fast: 2 % bad (burn 20); slow: 0.8 % bad
    // (burn 8); healthy: 0.05 % bad (burn 0.5: half the budget left).
    t += &series("fast", 980, 20);
    t += &series("slow", 992, 8);
    t += &series("healthy", 9995, 5);
    // No objective: no rules, so no alert and no record whatever it burns.
    t += &series("no-objective", 500, 500);
    t += "    alert_rule_test:\n";
    t += &alert_case("2h", "LanekeeperErrorBudgetFastBurn", &["fast"]);
    t += &alert_case("2h", "LanekeeperErrorBudgetSlowBurn", &["fast", "slow"]);
    // Before the data starts nothing has burnt.
    t += &alert_case("0m", "LanekeeperErrorBudgetFastBurn", &[]);
    t += "    promql_expr_test:\n";
    for (lane, v) in [("healthy", "50"), ("slow", "-700"), ("fast", "-1900")] {
        t += &format!(
            "      - expr: 'lanekeeper:lane_error_budget_remaining:percent{{lane=\"{lane}\"}}'\n        eval_time: 2h\n        exp_samples:\n          - labels: 'lanekeeper:lane_error_budget_remaining:percent{{lane=\"{lane}\",namespace=\"team\",profile=\"pool\"}}'\n            value: {v}\n"
        );
    }
    for (w, v) in [("5m", "0.5"), ("30m", "0.5"), ("1h", "0.5"), ("6h", "0.5")] {
        t += &format!(
            "      - expr: 'lanekeeper:lane_burn_rate:{w}{{lane=\"healthy\"}}'\n        eval_time: 6h\n        exp_samples:\n          - labels: 'lanekeeper:lane_burn_rate:{w}{{lane=\"healthy\",namespace=\"team\",profile=\"pool\"}}'\n            value: {v}\n"
        );
    }
    t += "      - expr: 'lanekeeper:lane_burn_rate:5m{lane=\"no-objective\"}'\n        eval_time: 2h\n        exp_samples: []\n";
    t
}

#[test]
fn promtool_passes_the_generated_rules_on_synthetic_burns() {
    let Some(promtool) = promtool("rules_promtool") else {
        return;
    };
    let dir = Scratch::new("rules");
    let world = [
        MANIFESTS.to_owned(),
        lane("fast", Some(r#"{withinDeadlinePercent: "99.9"}"#)),
        lane(
            "slow",
            Some(r#"{withinDeadlinePercent: "99.9", window: 28d}"#),
        ),
        lane("healthy", Some(r#"{withinDeadlinePercent: "99.9"}"#)),
        lane("no-objective", None),
    ]
    .concat();
    let rules = generated_rules(&dir, &world);
    assert_eq!(
        rules.matches("- name: ").count(),
        3,
        "one group per lane with an objective"
    );
    let check = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(dir.join("rules.yaml"))
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let run = promtool_test(&promtool, &dir, &test_file());
    assert!(
        run.status.success(),
        "promtool test rules failed:\n{}{}\n--- test file ---\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
        test_file()
    );
}

#[test]
fn promtool_fails_a_wrong_expectation_so_the_test_above_can_fail() {
    let Some(promtool) = promtool("rules_promtool") else {
        return;
    };
    let dir = Scratch::new("rules-wrong");
    generated_rules(
        &dir,
        &[
            MANIFESTS.to_owned(),
            lane("healthy", Some(r#"{withinDeadlinePercent: "99.9"}"#)),
        ]
        .concat(),
    );
    // A healthy lane paged: promtool must say no.
    let mut t = String::from(
        "rule_files: [rules.yaml]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n",
    );
    t += &series("healthy", 9995, 5);
    t += "    alert_rule_test:\n";
    t += &alert_case("2h", "LanekeeperErrorBudgetFastBurn", &["healthy"]);
    let run = promtool_test(&promtool, &dir, &t);
    assert!(!run.status.success(), "a healthy lane must not page");
}
