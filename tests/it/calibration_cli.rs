//! `lanekeeper calibration-hash` end to end, and `plan` on
//! examples/calibration (rules 9 and 10 of issue 12).

use serde_json::Value;

use crate::cli::{lanekeeper as run, lanekeeper_with_stdin, root, stdout_of as stdout};
use std::process::Output;

/// `lanekeeper ARGS`, with `stdin` on its standard input when given.
fn lanekeeper(args: &[&str], stdin: Option<&str>) -> Output {
    match stdin {
        Some(text) => lanekeeper_with_stdin(args, text),
        None => run(args),
    }
}

const DEPLOYMENT: &str = "examples/calibration/deployment.yaml";

/// The configHash the example profile records.
fn recorded_hash() -> String {
    let text =
        std::fs::read_to_string(root().join("examples/calibration/calibration.yaml")).unwrap();
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("configHash:"))
        .unwrap();
    line.split('"').nth(1).unwrap().to_owned()
}

#[test]
fn prints_the_hash_the_example_profile_records() {
    let out = stdout(&lanekeeper(&["calibration-hash", "-f", DEPLOYMENT], None));
    assert_eq!(out, format!("{}\n", recorded_hash()));
    assert!(out.starts_with("sha256:") && out.trim().len() == 7 + 64);
    // From standard input, as `kubectl get -o yaml | ...` gives it.
    let text = std::fs::read_to_string(root().join(DEPLOYMENT)).unwrap();
    let piped = stdout(&lanekeeper(&["calibration-hash", "-f", "-"], Some(&text)));
    assert_eq!(piped, out);
    // The same function the controller uses.
    let v: Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(
        lanekeeper::api::calibration::workload_config_hash(&v).unwrap(),
        out.trim()
    );
}

#[test]
fn canonical_prints_what_is_hashed() {
    let out = stdout(&lanekeeper(
        &["calibration-hash", "-f", DEPLOYMENT, "--canonical"],
        None,
    ));
    let v: Value = serde_json::from_str(out.trim()).expect("the canonical form is JSON");
    assert_eq!(v["containers"][0]["image"], "vllm/vllm-openai:v0.11.0");
    assert_eq!(
        v["containers"][0]["resources"]["limits"]["memory"],
        "68719476736"
    );
    assert_eq!(
        lanekeeper::api::calibration::hash(out.trim()),
        recorded_hash()
    );
}

#[test]
fn a_new_image_is_a_new_hash_and_labels_are_not() {
    let text = std::fs::read_to_string(root().join(DEPLOYMENT)).unwrap();
    let hash = |t: &str| stdout(&lanekeeper(&["calibration-hash", "-f", "-"], Some(t)));
    let base = hash(&text);
    assert_ne!(hash(&text.replace("v0.11.0", "v0.12.0")), base);
    assert_ne!(hash(&text.replace("\"256\"", "\"512\"")), base);
    assert_ne!(hash(&text.replace("FLASHINFER", "FLASH_ATTN")), base);
    assert_eq!(
        hash(&text.replace(
            "{labels: {app: vllm-support}}",
            "{labels: {app: vllm-support, tier: gpu}}"
        )),
        base
    );
}

#[test]
fn several_workloads_one_line_each_and_other_kinds_skipped() {
    let text = std::fs::read_to_string(root().join(DEPLOYMENT)).unwrap();
    let sts = text
        .replace("kind: Deployment", "kind: StatefulSet")
        .replace("name: vllm-support,", "name: vllm-support-sts,");
    let service = "---\napiVersion: v1\nkind: Service\nmetadata: {name: vllm-support}\nspec: {ports: [{port: 8000}]}\n";
    let all = format!("{text}\n{service}---\n{sts}");
    let out = stdout(&lanekeeper(&["calibration-hash", "-f", "-"], Some(&all)));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(
        lines[0],
        format!("{}  Deployment/vllm-support", recorded_hash())
    );
    // The same template hashes alike whatever the kind.
    assert_eq!(
        lines[1],
        format!("{}  StatefulSet/vllm-support-sts", recorded_hash())
    );
}

#[test]
fn no_pod_template_is_an_error_never_a_hash() {
    let lws = "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata: {name: pool}\nspec: {leaderWorkerTemplate: {workerTemplate: {spec: {containers: [{name: a, image: b}]}}}}\n";
    let out = lanekeeper(&["calibration-hash", "-f", "-"], Some(lws));
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no pod template to hash")
            && err.contains(
                "LeaderWorkerSet/pool: LeaderWorkerSet has no pod template at spec.template"
            ),
        "{err}"
    );
    let out = lanekeeper(&["calibration-hash", "-f", "does/not/exist.yaml"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does/not/exist.yaml"));
    let out = lanekeeper(&["calibration-hash", "-f", "-"], Some("a: [b"));
    assert_eq!(out.status.code(), Some(2));
}

fn plan_json() -> Value {
    let out = stdout(&lanekeeper(
        &[
            "plan",
            "-f",
            "examples/calibration",
            "--signals",
            "examples/calibration/signals.yaml",
            "-o",
            "json",
        ],
        None,
    ));
    serde_json::from_str(&out).unwrap()
}

fn step(plan: &Value, at: i64) -> &Value {
    plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["at"] == at)
        .map(|s| &s["profiles"][0])
        .unwrap_or_else(|| panic!("no step at {at}"))
}

fn drain(p: &Value, pod: &str) -> (String, String) {
    let a = p["drain"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["pod"] == pod)
        .unwrap_or_else(|| panic!("no drain action for {pod}: {}", p["drain"]));
    (
        a["action"].as_str().unwrap().to_owned(),
        a["reason"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn the_calibration_example_shows_both_rules() {
    let plan = plan_json();
    let p = step(&plan, 0);
    assert_eq!(p["capacityUnitsPerSecond"], 280.0);
    assert!(p.get("calibrationStale").is_none());
    let p = step(&plan, 60);
    assert_eq!(drain(p, "vllm-support-1").0, "Drain");
    // The pool changed under Hold: capacity from replicas is Unknown.
    let p = step(&plan, 120);
    assert_eq!(p["calibrationStale"], "PoolChanged");
    assert_eq!(p["calibrationHeld"], true);
    assert_eq!(p["telemetry"], "Unknown");
    assert!(p["capacityUnitsPerSecond"].is_null());
    assert_eq!(p["admittedUnitsPerSecond"], 210.0);
    let (a, r) = drain(p, "vllm-support-2");
    assert_eq!(a, "Refused");
    assert!(r.starts_with("RolloutInProgress"), "{r}");
    // Healthy for healthyForSeconds, but of the old revision: kept.
    let p = step(&plan, 240);
    let (a, r) = drain(p, "vllm-support-1");
    assert_eq!(a, "Keep");
    assert!(r.starts_with("OutdatedRevision"), "{r}");
    // A measured capacity counts under Hold.
    let p = step(&plan, 300);
    assert_eq!(p["telemetry"], "Known");
    assert_eq!(p["capacityUnitsPerSecond"], 260.0);
    assert_eq!(p["capacitySource"], "availableUnitsPerSecond");
    // Rollout over: the outdated pod left by being replaced; a new drain.
    let p = step(&plan, 360);
    assert_eq!(drain(p, "vllm-support-6").0, "Drain");
    assert!(
        plan["steps"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["profiles"][0]["drain"].as_array().unwrap())
            .all(|a| !(a["pod"] == "vllm-support-1" && a["action"] == "Undrain")),
        "the outdated pod is never undrained"
    );
    let p = step(&plan, 480);
    assert!(p.get("calibrationStale").is_none());
    assert_eq!(p["capacitySource"], "readyReplicas");
    let p = step(&plan, 600);
    assert_eq!(drain(p, "vllm-support-6").0, "Undrain");
}

#[test]
fn the_example_readme_shows_the_table_plan_prints() {
    let out = stdout(&lanekeeper(
        &[
            "plan",
            "-f",
            "examples/calibration",
            "--signals",
            "examples/calibration/signals.yaml",
        ],
        None,
    ));
    assert!(out.contains(
        "calibration stale: PoolChanged (onStaleCalibration Hold: capacity from calibration numbers is Unknown)"
    ));
    assert!(out.contains("calibration valid again"));
    let readme = std::fs::read_to_string(root().join("examples/calibration/README.md")).unwrap();
    for line in out.lines() {
        assert!(
            readme.contains(line.trim_end()),
            "README.md lacks the plan line {line:?}"
        );
    }
}
