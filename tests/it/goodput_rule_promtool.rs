//! The recording rule of the gateway's capacity evidence under `promtool
//! test rules`: `lanekeeper rules` prints it for a profile that reads
//! `gatewayGoodputWhileSaturated`, and on synthetic gateway series it
//! records the profile's goodput while saturated (the replicas' average
//! times their count), nothing while no replica is saturated, and never a
//! series of another profile's gateway.

use super::rules_promtool::{generated_rules, promtool_test};
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
    safeUnitsPerSecond: "560"
    unitsPerReplica: "56"
    calibration: {configHash: "sha256:00", measuredAt: "2026-11-02T00:00:00Z", validForSeconds: 7776000}
  replicas: {min: 1, max: 10}
  inFlight: {conserveAt: 1350, stopAt: 1500, resumeBelow: 1200}
  signals:
    prometheus:
      url: http://prometheus:9090
      queries:
        gatewayGoodputWhileSaturated: 'lanekeeper:gateway_goodput_while_saturated:units_per_second{namespace="team",profile="pool"}'
---
apiVersion: lanekeeper.dev/v1alpha1
kind: CapacityProfile
metadata: {name: quiet, namespace: team}
spec:
  pool:
    scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: quiet}
    podSelector: {matchLabels: {app: quiet}}
  capacity:
    safeUnitsPerSecond: "100"
    unitsPerReplica: "10"
    calibration: {configHash: "sha256:00", measuredAt: "2026-11-02T00:00:00Z", validForSeconds: 7776000}
  replicas: {min: 1, max: 10}
"#;

/// One gateway replica: `profile`'s config, `replicas` of them, not
/// saturated for 10 minutes, then saturated every second completing `rate`
/// units per second, in 15 s steps.
fn replica(instance: &str, profile: &str, replicas: u32, rate: u32) -> String {
    let labels = format!("instance=\"{instance}\",job=\"gw\"");
    let units = rate * 15;
    format!(
        "      - series: 'lanekeeper_gateway_config_info{{{labels},profile=\"{profile}\",mode=\"Enforce\",hash=\"h\"}}'\n        values: '1x80'\n      - series: 'lanekeeper_gateway_replicas{{{labels}}}'\n        values: '{replicas}x80'\n      - series: 'lanekeeper_gateway_saturated_seconds_total{{{labels}}}'\n        values: '0x39 0+15x40'\n      - series: 'lanekeeper_gateway_saturated_completed_units_total{{{labels}}}'\n        values: '0x39 0+{units}x40'\n"
    )
}

const RECORDED: &str = "lanekeeper:gateway_goodput_while_saturated:units_per_second";

fn test_file() -> String {
    let mut t = String::from(
        "rule_files: [rules.yaml]\nevaluation_interval: 15s\ntests:\n  - interval: 15s\n    input_series:\n",
    );
    // Two replicas of team/pool's gateway at 210 and 200 units/s while
    // saturated: 205 on average, 410 for the pair.
    t += &replica("gw-a", "team/pool", 2, 210);
    t += &replica("gw-b", "team/pool", 2, 200);
    // Another profile's gateway, saturated too: not team/pool's evidence.
    t += &replica("gw-other", "other/pool", 1, 9000);
    t += "    promql_expr_test:\n";
    t += &format!(
        "      - expr: '{RECORDED}'\n        eval_time: 15m\n        exp_samples:\n          - labels: '{RECORDED}{{namespace=\"team\",profile=\"pool\"}}'\n            value: 410\n"
    );
    // Not saturated yet: no series, no evidence.
    t += &format!("      - expr: '{RECORDED}'\n        eval_time: 5m\n        exp_samples: []\n");
    t
}

#[test]
fn promtool_passes_the_goodput_rule_on_synthetic_gateway_series() {
    let Some(promtool) = promtool("goodput_rule_promtool") else {
        return;
    };
    let dir = Scratch::new("goodput-rule");
    let rules = generated_rules(&dir, MANIFESTS);
    assert_eq!(
        rules.matches("- name: ").count(),
        1,
        "one group, for the profile that reads the evidence:\n{rules}"
    );
    assert!(
        rules.contains("name: lanekeeper-capacity-team-pool"),
        "{rules}"
    );
    let run = promtool_test(&promtool, &dir, &test_file());
    assert!(
        run.status.success(),
        "promtool test rules failed:\n{}{}\n--- rules ---\n{rules}\n--- test file ---\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
        test_file()
    );
    // A wrong expectation fails, so the test above can fail.
    let wrong = promtool_test(
        &promtool,
        &dir,
        &test_file().replace("value: 410", "value: 560"),
    );
    assert!(!wrong.status.success(), "promtool accepted 560 for 410");
}
