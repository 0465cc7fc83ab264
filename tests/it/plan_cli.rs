//! `lanekeeper plan` end to end: the INC-47 numbers, the golden outputs, and
//! invalid input.
//!
//! Golden files live in tests/golden/; after an intended change regenerate
//! them with `UPDATE_GOLDEN=1 cargo test --test it -- plan_cli::` and review the diff.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::cli::{lanekeeper, lanekeeper_ok, root, stdout_of};
use crate::scratch::{Scratch, ScratchFile};

fn json_of(out: &Output) -> Value {
    serde_json::from_str(&stdout_of(out)).expect("plan -o json prints JSON")
}

/// Goldens are rewritten only when `UPDATE_GOLDEN` is exactly `1`
/// (`UPDATE_GOLDEN=0` or an empty value compares, as CI does).
fn regenerate(value: Option<&str>) -> bool {
    value == Some("1")
}

#[test]
fn goldens_regenerate_only_on_update_golden_1() {
    assert!(regenerate(Some("1")));
    for v in [
        None,
        Some(""),
        Some("0"),
        Some("true"),
        Some("yes"),
        Some("1 "),
    ] {
        assert!(!regenerate(v), "{v:?}");
    }
}

/// Compares `actual` with `tests/golden/NAME`, or rewrites it under
/// `UPDATE_GOLDEN=1`.
pub(crate) fn golden(name: &str, actual: &str) {
    let path = root().join("tests/golden").join(name);
    if regenerate(std::env::var("UPDATE_GOLDEN").ok().as_deref()) {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create)",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "{} differs from the output; if the change is intended, regenerate with UPDATE_GOLDEN=1 and review the diff",
        path.display()
    );
}

fn lane<'a>(profile: &'a Value, name: &str) -> &'a Value {
    profile["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == name)
        .unwrap()
}

fn close(v: &Value, want: f64) -> bool {
    v.as_f64().is_some_and(|x| (x - want).abs() < 1e-6)
}

#[test]
fn inc47_without_signals() {
    let out = lanekeeper(["plan", "-f", "examples/inc-47", "-o", "json"]);
    let plan = json_of(&out);
    let steps = plan["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0]["at"], 0);
    let p = &steps[0]["profiles"][0];
    assert_eq!(p["namespace"], "ai-platform");
    assert_eq!(p["name"], "agent-assist");
    assert_eq!(p["telemetry"], "Known");
    assert_eq!(p["level"], 1);
    assert_eq!(p["levelName"], "conserve");
    assert!(p["pendingApprovalLevel"].is_null());
    assert!(close(&p["capacityUnitsPerSecond"], 560.0));
    assert!(close(&p["demandUnitsPerSecond"], 488.1));
    assert!(close(&p["admittedUnitsPerSecond"], 488.1));
    assert_eq!(p["desiredReplicas"], 9);
    assert_eq!(p["drain"], serde_json::json!([]));
    assert_eq!(p["warnings"], serde_json::json!([]));
    assert_eq!(p["gateway"]["rejectOptionalContext"], true);
    assert_eq!(p["gateway"]["useFallbackRoutes"], false);
    assert_eq!(p["gateway"]["readOnly"], false);
    assert_eq!(p["gateway"]["inFlight"]["conserveAt"], 1350);
    for l in p["lanes"].as_array().unwrap() {
        assert_eq!(l["state"], "Admitted", "{l}");
        assert!(close(&l["borrowedUnitsPerSecond"], 0.0));
    }
    assert_eq!(lane(p, "p0-disruption-assist")["priority"], 0);
    assert!(close(
        &lane(p, "p0-disruption-assist")["demandUnitsPerSecond"],
        93.6
    ));
    // The signals file and the scenario beside the manifests are not
    // manifests: skipped without a note.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("signals.yaml") && !stderr.contains("scenario.yaml"),
        "{stderr}"
    );
    golden("inc-47-plan.json", &String::from_utf8_lossy(&out.stdout));
}

#[test]
fn inc47_with_signals() {
    let out = lanekeeper([
        "plan",
        "-f",
        "examples/inc-47",
        "--signals",
        "examples/inc-47/signals.yaml",
        "-o",
        "json",
    ]);
    let plan = json_of(&out);
    let steps = plan["steps"].as_array().unwrap();
    let mut saw_incident = false;
    for s in steps {
        let p = &s["profiles"][0];
        if close(&p["capacityUnitsPerSecond"], 420.0) {
            saw_incident = true;
            assert_eq!(p["level"], 2, "at {}", s["at"]);
            assert_eq!(p["levelName"], "shed");
            assert!(close(&p["admittedUnitsPerSecond"], 400.1));
            let want = [
                ("p0-disruption-assist", "Admitted", 93.6),
                ("p1-agent-assist", "Admitted", 180.0),
                ("p2-email-extract", "Admitted", 66.5),
                ("p3-shift-batch", "Capped", 60.0),
                ("p4-eval-backfill", "Paused", 0.0),
            ];
            for (name, state, admitted) in want {
                let l = lane(p, name);
                assert_eq!(l["state"], state, "{name} at {}", s["at"]);
                assert!(close(&l["admittedUnitsPerSecond"], admitted), "{name}: {l}");
            }
        }
    }
    assert!(saw_incident);

    // Recovery: one level at a time, each no sooner than 300 s after its exit
    // condition began to hold.
    let mut downs = Vec::new();
    let mut prev_level = None;
    for s in steps {
        let p = &s["profiles"][0];
        let level = p["level"].as_u64().unwrap();
        if let Some(prev) = prev_level
            && level < prev
        {
            assert_eq!(prev - level, 1, "more than one level down at {}", s["at"]);
            downs.push((s["at"].as_i64().unwrap(), level));
        }
        prev_level = Some(level);
    }
    assert_eq!(downs.len(), 2, "{downs:?}");
    // Capacity came back at 1500 (overCapacity stopped holding then).
    assert!(downs[0].0 >= 1500 + 300, "{downs:?}");
    assert!(downs[1].0 >= downs[0].0 + 300, "{downs:?}");
    golden(
        "inc-47-plan-signals.json",
        &String::from_utf8_lossy(&out.stdout),
    );

    let table = lanekeeper([
        "plan",
        "-f",
        "examples/inc-47",
        "--signals",
        "examples/inc-47/signals.yaml",
    ]);
    assert!(table.status.success());
    golden(
        "inc-47-plan-signals.txt",
        &String::from_utf8_lossy(&table.stdout),
    );
}

fn write_temp(name: &str, text: &str) -> ScratchFile {
    ScratchFile::new(&format!("plan-{name}"), "bad.yaml", text)
}

fn profile_with(replicas: &str) -> String {
    let base = std::fs::read_to_string(root().join("examples/inc-47/inc-47.yaml")).unwrap();
    base.replace(
        "replicas: {min: 4, max: 16, maxScaleUpStep: 4, scaleDownStabilizationSeconds: 300}",
        replicas,
    )
}

fn assert_invalid(path: &Path, field: &str, message: &str) {
    let out = lanekeeper(["plan", "-f", path.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&path.display().to_string()),
        "names the file: {stderr}"
    );
    assert!(stderr.contains(field), "names the field {field}: {stderr}");
    assert!(stderr.contains(message), "says why ({message}): {stderr}");
}

#[test]
fn invalid_replicas_exit_2_naming_file_object_field() {
    let path = write_temp("replicas", &profile_with("replicas: {min: 9, max: 4}"));
    assert_invalid(
        &path,
        "CapacityProfile ai-platform/agent-assist: spec.replicas",
        "replicas.min must be <= replicas.max",
    );
}

#[test]
fn invalid_priority_type_exit_2() {
    let base = std::fs::read_to_string(root().join("examples/inc-47/inc-47.yaml")).unwrap();
    let path = write_temp(
        "priority",
        &base.replacen("priority: 1\n", "priority: \"high\"\n", 1),
    );
    assert_invalid(
        &path,
        "LaneContract ai-platform/p1-agent-assist: spec.priority",
        "invalid type",
    );
}

/// kubectl validates strictly by default and the API server refuses a field
/// the CRD does not declare; so does plan, naming it (the same case runs on
/// a real server in tests/e2e/e2e.rs).
#[test]
fn undeclared_fields_exit_2_naming_the_field() {
    let base = std::fs::read_to_string(root().join("examples/inc-47/inc-47.yaml")).unwrap();
    for (name, text, field) in [
        (
            "spec",
            base.replacen(
                "floorUnitsPerSecond: \"93.6\"",
                "flooorUnitsPerSecond: \"93.6\"",
                1,
            ),
            "LaneContract ai-platform/p0-disruption-assist: spec.flooorUnitsPerSecond",
        ),
        (
            "nested",
            base.replacen(
                "queue: {maxDepth: 600, ttlSeconds: 8}",
                "queue: {maxDepth: 600, ttlSeconds: 8, ttl: 5}",
                1,
            ),
            "LaneContract ai-platform/p0-disruption-assist: spec.queue.ttl",
        ),
        (
            "list item",
            base.replacen(
                "enterWhen: {",
                "enterWhen: {utilisationPercentAbove: 90, ",
                1,
            ),
            "DegradationPolicy ai-platform/agent-assist-ladder: spec.levels[0].enterWhen.utilisationPercentAbove",
        ),
        (
            "metadata",
            base.replacen(
                "metadata: {name: agent-assist, namespace: ai-platform}",
                "metadata: {name: agent-assist, namespace: ai-platform, lables: {a: b}}",
                1,
            ),
            "CapacityProfile ai-platform/agent-assist: metadata.lables",
        ),
    ] {
        assert_ne!(text, base, "{name}: the example changed shape");
        let path = write_temp(&format!("undeclared-{}", name.replace(' ', "-")), &text);
        assert_invalid(&path, field, "unknown field");
    }
}

#[test]
fn invalid_quantity_exit_2() {
    let base = std::fs::read_to_string(root().join("examples/inc-47/inc-47.yaml")).unwrap();
    let path = write_temp(
        "quantity",
        &base.replacen(
            "workUnitsPerRequest: \"1.80\"",
            "workUnitsPerRequest: \"lots\"",
            1,
        ),
    );
    assert_invalid(
        &path,
        "LaneContract ai-platform/p0-disruption-assist: spec.workUnitsPerRequest",
        "not a decimal quantity",
    );
}

#[test]
fn other_kinds_are_skipped_with_a_note() {
    let text = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n---\njust: data\n---\n";
    let path = write_temp("others", text);
    let out = lanekeeper(["plan", "-f", path.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Deployment") && stderr.contains("not a lanekeeper kind"),
        "{stderr}"
    );
    assert!(stderr.contains("not a Kubernetes object"), "{stderr}");
}

#[test]
fn the_signals_file_is_not_reported_as_a_skipped_manifest() {
    for files in [
        &["examples/inc-47"][..],
        &[
            "examples/inc-47/inc-47.yaml",
            "examples/inc-47/signals.yaml",
        ][..],
    ] {
        let mut args = vec!["plan", "-f"];
        args.extend(files);
        args.extend(["--signals", "examples/inc-47/signals.yaml"]);
        let out = lanekeeper(&args);
        assert!(out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("skipped"), "{files:?}: {stderr}");
    }
}

#[test]
fn signals_that_name_no_loaded_object_are_named_on_stderr() {
    let path = write_temp(
        "typo",
        "steps:\n- at: 0\n  profiles:\n    ai-platform/agent-assist: {availableUnitsPerSecond: 420}\n  \
         lanes:\n    ai-platform/p1-agent-asist: {requestsPerSecond: 400}\n\
         - at: 15\n  lanes:\n    ai-platform/p1-agent-asist: {requestsPerSecond: 400}\n",
    );
    let out = lanekeeper([
        "plan",
        "-f",
        "examples/inc-47/inc-47.yaml",
        "--signals",
        path.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let note = "note: signals lanes.ai-platform/p1-agent-asist (from the step at 0) name no loaded object: ignored";
    assert_eq!(
        stderr.matches(note).count(),
        1,
        "once, at its first step: {stderr}"
    );
    assert!(!stderr.contains("agent-assist (from"), "{stderr}");
}

#[test]
fn bad_signals_file_exit_2() {
    let path = write_temp(
        "signals",
        "steps:\n- at: 0\n  profiles:\n    ai-platform/agent-assist: {availableUnitsPerSecnd: 420}\n",
    );
    let out = lanekeeper([
        "plan",
        "-f",
        "examples/inc-47/inc-47.yaml",
        "--signals",
        path.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("availableUnitsPerSecnd"), "{stderr}");
}

#[test]
fn approve_flag_grants_a_confirm_level() {
    // Capacity far below demand even after levels 1..3 → level 4 (Confirm)
    // holds; without approval it is pending, with --approve it is entered.
    let path = write_temp(
        "approve",
        "steps:\n- at: 0\n  profiles:\n    ai-platform/agent-assist: {availableUnitsPerSecond: 200, inFlight: 1000}\n",
    );
    let s = path.to_str().unwrap();
    let pending = json_of(&lanekeeper([
        "plan",
        "-f",
        "examples/inc-47/inc-47.yaml",
        "--signals",
        s,
        "-o",
        "json",
    ]));
    let p = &pending["steps"][0]["profiles"][0];
    assert_eq!(p["level"], 3);
    assert_eq!(p["pendingApprovalLevel"], 4);
    let approved = json_of(&lanekeeper([
        "plan",
        "-f",
        "examples/inc-47/inc-47.yaml",
        "--signals",
        s,
        "--approve",
        "ai-platform/agent-assist=4",
        "-o",
        "json",
    ]));
    let p = &approved["steps"][0]["profiles"][0];
    assert_eq!(p["level"], 4);
    assert!(p["pendingApprovalLevel"].is_null());
    assert_eq!(p["gateway"]["readOnly"], true);
}

/// A file reached twice (a directory and a file in it, or one file by two
/// spellings) is read once: INC-47 plans as from the file alone (level 1,
/// demand 488.1), not with every object twice (level 3, demand 976.2).
#[test]
fn a_file_reached_twice_is_read_once() {
    let alone = lanekeeper_ok(["plan", "-f", "examples/inc-47/inc-47.yaml", "-o", "json"]);
    for twice in [
        ["examples/inc-47", "examples/inc-47/inc-47.yaml"],
        [
            "examples/inc-47/inc-47.yaml",
            "examples/../examples/inc-47/inc-47.yaml",
        ],
    ] {
        let out = lanekeeper(["plan", "-f", twice[0], "-f", twice[1], "-o", "json"]);
        let plan = json_of(&out);
        let profiles = plan["steps"][0]["profiles"].as_array().unwrap();
        assert_eq!(profiles.len(), 1, "{twice:?}");
        assert_eq!(profiles[0]["level"], 1, "{twice:?}");
        assert!(
            close(&profiles[0]["demandUnitsPerSecond"], 488.1),
            "{twice:?}"
        );
        assert_eq!(
            profiles[0]["lanes"].as_array().unwrap().len(),
            5,
            "{twice:?}"
        );
        assert_eq!(stdout_of(&out), alone, "{twice:?}");
    }
}

/// Two documents with one kind, namespace and name are refused (exit 2),
/// naming both: `kubectl apply` would keep one of them, and which one a
/// pull request means is not for `plan` to guess. In two files (with other
/// values) and within one file.
#[test]
fn two_documents_defining_one_object_exit_2_naming_both() {
    let base = std::fs::read_to_string(root().join("examples/inc-47/inc-47.yaml")).unwrap();
    let lane = base
        .split("---\n")
        .find(|d| d.contains("name: p1-agent-assist,"))
        .unwrap()
        .to_owned();
    let other = ScratchFile::new(
        "plan-duplicate",
        "lane.yaml",
        lane.replace(
            "expectedRequestsPerSecond: \"180\"",
            "expectedRequestsPerSecond: \"90\"",
        ),
    );
    let out = lanekeeper([
        "plan",
        "-f",
        "examples/inc-47/inc-47.yaml",
        "-f",
        other.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    for part in [
        "LaneContract ai-platform/p1-agent-assist",
        "examples/inc-47/inc-47.yaml: document 3",
        &format!("{}: document 1", other.display()),
    ] {
        assert!(stderr.contains(part), "names {part}: {stderr}");
    }

    let one = write_temp("duplicate-in-one-file", &format!("{base}---\n{lane}"));
    assert_invalid(
        &one,
        &format!(
            "{}: document 8: LaneContract ai-platform/p1-agent-assist is also defined in",
            one.display()
        ),
        &format!("{}: document 3", one.display()),
    );
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Names reach paths (`--emit-gateway-config DIR` writes
/// `DIR/NAMESPACE/CONFIGMAP/lanes.json`) and PromQL, so they are checked as
/// the API server checks them: a namespace `../evil` was written outside
/// DIR and an absolute one replaced it, `Agent_Assist` is no Kubernetes
/// name, a profile's lanes ConfigMap needs a valid name too, and a scale
/// target's name is put inside a quoted PromQL regex. Each exits 2 naming
/// the field, and nothing is written.
#[test]
fn names_that_are_not_kubernetes_names_exit_2_and_write_nothing() {
    let base = std::fs::read_to_string(root().join("examples/inc-47/inc-47.yaml")).unwrap();
    let scratch = Scratch::new("plan-names");
    let absolute = scratch.join("absolute-target");
    let meta = "metadata: {name: agent-assist, namespace: ai-platform}";
    let with_meta = |name: &str, ns: &str| {
        base.replacen(
            meta,
            &format!("metadata: {{name: {name}, namespace: \"{ns}\"}}"),
            1,
        )
    };
    let long = "a".repeat(240);
    for (case, text, field, message) in [
        (
            "dotdot",
            with_meta("agent-assist", "../evil"),
            "CapacityProfile ../evil/agent-assist: metadata.namespace",
            "a namespace is a lowercase RFC 1123 label",
        ),
        (
            "absolute",
            with_meta("agent-assist", &absolute.display().to_string()),
            "metadata.namespace",
            "a namespace is a lowercase RFC 1123 label",
        ),
        (
            "upper",
            with_meta("Agent_Assist", "ai-platform"),
            "CapacityProfile ai-platform/Agent_Assist: metadata.name",
            "a name is a lowercase RFC 1123 subdomain",
        ),
        (
            "lane",
            base.replacen("name: p1-agent-assist,", "name: P1_agent_assist,", 1),
            "LaneContract ai-platform/P1_agent_assist: metadata.name",
            "a name is a lowercase RFC 1123 subdomain",
        ),
        (
            "long",
            with_meta(&long, "ai-platform"),
            "metadata.name",
            "its lanes ConfigMap",
        ),
        (
            "target",
            base.replacen(
                "name: vllm-agent-assist}",
                "name: 'vllm-agent-assist\"} or vector(1) #'}",
                1,
            ),
            "CapacityProfile ai-platform/agent-assist: spec.pool.scaleTargetRef.name",
            "a name is a lowercase RFC 1123 subdomain",
        ),
    ] {
        assert_ne!(text, base, "{case}: the example changed shape");
        let dir = scratch.join(case);
        std::fs::create_dir(&dir).unwrap();
        let file = dir.join("m.yaml");
        std::fs::write(&file, &text).unwrap();
        let out_dir = dir.join("out");
        let out = lanekeeper([
            "plan",
            "-f",
            file.to_str().unwrap(),
            "--emit-gateway-config",
            out_dir.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{case}: {stderr}");
        for part in [file.display().to_string().as_str(), field, message] {
            assert!(stderr.contains(part), "{case}: names {part}: {stderr}");
        }
    }
    let mut written = files_under(&scratch);
    written.sort();
    let mut manifests: Vec<_> = ["absolute", "dotdot", "long", "lane", "target", "upper"]
        .iter()
        .map(|c| scratch.join(c).join("m.yaml"))
        .collect();
    manifests.sort();
    assert_eq!(written, manifests, "nothing but the manifests");
}

/// `text`'s documents as the items of one `v1 List`, as `kubectl get -o
/// yaml` prints them.
fn as_list(text: &str) -> String {
    use serde::Deserialize;
    let items: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect();
    let mut list = serde_yaml::Mapping::new();
    list.insert("apiVersion".into(), "v1".into());
    list.insert("kind".into(), "List".into());
    list.insert("items".into(), items.into());
    let list = serde_yaml::to_string(&list).unwrap();
    assert!(list.starts_with("apiVersion: v1\nkind: List\n"), "{list}");
    list
}

/// A `kind: List` (`kubectl get capacityprofiles,lanecontracts,... -o
/// yaml`) stands for its items: INC-47 as a List plans exactly as the file
/// does (it was skipped with a note, and plan exited 0 having evaluated
/// nothing).
#[test]
fn a_list_plans_as_its_items() {
    let base = std::fs::read_to_string(root().join("examples/inc-47/inc-47.yaml")).unwrap();
    let list = ScratchFile::new("plan-list", "list.yaml", as_list(&base));
    let out = lanekeeper(["plan", "-f", list.to_str().unwrap(), "-o", "json"]);
    let plan = json_of(&out);
    assert_eq!(plan["steps"][0]["profiles"][0]["level"], 1);
    let file = lanekeeper_ok(["plan", "-f", "examples/inc-47/inc-47.yaml", "-o", "json"]);
    assert_eq!(stdout_of(&out), file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("skipped"), "{stderr}");
}

/// Each item of a List is validated as a document: an invalid profile in
/// one exits 2 naming it; an item of another kind is skipped with a note
/// naming where it is; a List without items is refused.
#[test]
fn a_lists_items_are_validated_as_documents() {
    let bad = write_temp(
        "list-invalid",
        &as_list(&profile_with("replicas: {min: 9, max: 4}")),
    );
    assert_invalid(
        &bad,
        "CapacityProfile ai-platform/agent-assist: spec.replicas",
        "replicas.min must be <= replicas.max",
    );

    let other = write_temp(
        "list-other",
        &as_list("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n"),
    );
    let out = lanekeeper(["plan", "-f", other.to_str().unwrap()]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("document 1, items[0]: Deployment (apps/v1) is not a lanekeeper kind"),
        "{stderr}"
    );

    let empty = write_temp("list-no-items", "apiVersion: v1\nkind: List\n");
    assert_invalid(&empty, "document 1: List: items", "is required");
}

/// `plan --prometheus` counts a window's steps before it lists them, and
/// its time arithmetic is checked: 4 billion steps exit 2 at once (they
/// were listed first, and memory ran out), a window at the end of time is
/// one step (listing it overflowed: a panic in a debug build), and a step
/// longer than i64::MAX seconds exits 2 (it overflowed: a panic, or in a
/// release build 101 steps of 1 s). Nothing listens at the URL; no query
/// is needed to refuse a window.
#[test]
fn plan_prometheus_counts_steps_and_checks_time_arithmetic() {
    let run = |from: &str, to: &str, step: &str| {
        let out = lanekeeper([
            "plan",
            "-f",
            "examples/inc-47/inc-47.yaml",
            "--prometheus",
            "http://127.0.0.1:9",
            "--prometheus-timeout",
            "1",
            "--from",
            from,
            "--to",
            to,
            "--step",
            step,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains("panicked"), "{stderr}");
        (out.status.code(), stderr)
    };
    let (code, stderr) = run("0", "4000000000", "1s");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("4000000001 steps: Prometheus answers at most 11,000 points per series"),
        "{stderr}"
    );
    let (code, stderr) = run("0", "300", "5124095576030431h");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--step \"5124095576030431h\": too large"),
        "{stderr}"
    );
    let (code, stderr) = run("9223372036854775000", "9223372036854775807", "1000");
    assert_eq!(code, Some(0), "one step, its signals Unknown: {stderr}");
}
