//! `lanekeeper simulate` and `lanekeeper diff` from the command line.

use std::path::{Path, PathBuf};

use crate::cli::{lanekeeper, root, stdout_of};
use crate::scratch::Scratch;

/// INC-47 shortened to the incident and a little recovery (debug builds).
fn short_scenario(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(root().join("examples/inc-47/scenario.yaml")).unwrap();
    let text = text.replace("durationSeconds: 4200", "durationSeconds: 600");
    assert!(text.contains("durationSeconds: 600"));
    let p = dir.join("scenario.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn simulate_prints_the_table_json_and_a_chart_reproducibly() {
    let dir = Scratch::new("sim-cli-simulate");
    let sc = short_scenario(&dir);
    let sc = sc.to_str().unwrap();
    let a = lanekeeper([
        "simulate",
        "-f",
        "examples/inc-47/inc-47.yaml",
        "--scenario",
        sc,
    ]);
    let table = stdout_of(&a);
    for needle in [
        "policy lanekeeper",
        "p0-disruption-assist",
        "p4-eval-backfill",
        "WITHIN-DL%",
        "level timeline",
        "UP   1 -> 2 (shed)",
    ] {
        assert!(table.contains(needle), "missing {needle:?} in\n{table}");
    }
    let b = lanekeeper([
        "simulate",
        "-f",
        "examples/inc-47/inc-47.yaml",
        "--scenario",
        sc,
    ]);
    assert_eq!(a.stdout, b.stdout, "same seed, same bytes");

    let chart = dir.join("out.svg");
    let j = lanekeeper([
        "simulate",
        "-f",
        "examples/inc-47/inc-47.yaml",
        "--scenario",
        sc,
        "--policy",
        "fifo",
        "-o",
        "json",
        "--chart",
        chart.to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout_of(&j)).unwrap();
    assert_eq!(v["policy"], "fifo");
    let lanes = v["profiles"][0]["lanes"].as_array().unwrap();
    assert_eq!(lanes.len(), 5);
    for key in [
        "offered",
        "admitted",
        "withinDeadline",
        "withinDeadlinePercent",
        "expired",
        "rejected",
        "retries",
        "retryAmplification",
        "latencyP99Seconds",
        "backlogAtEnd",
        "drainEndBacklogSeconds",
    ] {
        assert!(lanes[0].get(key).is_some(), "lane JSON lacks {key}");
    }
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(
        svg.starts_with("<svg")
            && svg.contains("capacity")
            && svg.contains("p0-disruption-assist served")
    );

    let md = lanekeeper([
        "simulate",
        "-f",
        "examples/inc-47/inc-47.yaml",
        "--scenario",
        sc,
        "-o",
        "markdown",
    ]);
    let md = String::from_utf8(md.stdout).unwrap();
    assert!(md.contains("| p0-disruption-assist | 0 |"), "{md}");
}

#[test]
fn a_bad_scenario_exits_2_naming_the_field() {
    let dir = Scratch::new("sim-cli-bad");
    let p = dir.join("bad.yaml");
    std::fs::write(&p, "durationSeconds: 60\nlanes:\n  p0-disruption-assist:\n    service: {p50Seconds: 3, p95Seconds: 1}\n").unwrap();
    let o = lanekeeper([
        "simulate",
        "-f",
        "examples/inc-47/inc-47.yaml",
        "--scenario",
        p.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("lanes.p0-disruption-assist.service"), "{err}");

    std::fs::write(&p, "durationSeconds: 60\nlanes:\n  no-such-lane:\n    service: {p50Seconds: 1, p95Seconds: 2}\n").unwrap();
    let o = lanekeeper([
        "simulate",
        "-f",
        "examples/inc-47/inc-47.yaml",
        "--scenario",
        p.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no-such-lane"));

    std::fs::write(&p, "durationSeconds: 60\nlanez: {}\n").unwrap();
    let o = lanekeeper([
        "simulate",
        "-f",
        "examples/inc-47/inc-47.yaml",
        "--scenario",
        p.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
}

/// The INC-47 example (the base) and a copy in `dir` with `from` replaced
/// by `to` (the head); `from` must be in the example.
fn edited_example(dir: &Path, from: &str, to: &str) -> (PathBuf, PathBuf) {
    let base = root().join("examples/inc-47/inc-47.yaml");
    let text = std::fs::read_to_string(&base).unwrap();
    assert!(text.contains(from), "the example has {from:?}");
    let head = dir.join("head.yaml");
    std::fs::write(&head, text.replace(from, to)).unwrap();
    (base, head)
}

#[test]
fn diff_shows_what_removing_the_p3_cap_does() {
    let dir = Scratch::new("sim-cli-diff");
    let sc = short_scenario(&dir);
    let cap = "      cap: [{lanes: [p3-shift-batch], unitsPerSecond: \"60\"}]\n";
    let (base, head) = edited_example(&dir, cap, "");
    let o = lanekeeper([
        "diff",
        "--base",
        base.to_str().unwrap(),
        "--head",
        head.to_str().unwrap(),
        "--scenario",
        sc.to_str().unwrap(),
        "--signals",
        "examples/inc-47/signals.yaml",
        "-o",
        "markdown",
        "--fail-on",
        "p0-deadline-regression,decision-change",
    ]);
    let md = String::from_utf8(o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(1), "decision-change holds\n{md}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("decision-change"));
    assert!(!String::from_utf8_lossy(&o.stderr).contains("p0-deadline-regression"));
    assert!(md.contains("## lanekeeper diff"));
    // The first step that differs: the base caps P3 at 60, the head not.
    let line = |side: &str| {
        md.lines()
            .find(|l| l.starts_with(&format!("- {side}: ")))
            .unwrap_or_else(|| panic!("no {side} line\n{md}"))
            .to_owned()
    };
    assert!(line("base").contains("p3-shift-batch Capped 60"), "{md}");
    assert!(line("head").contains("p3-shift-batch Admitted"), "{md}");
    assert!(md.contains("| p3-shift-batch | 3 |"), "{md}");
    assert!(md.contains("| p0-disruption-assist | 0 |"), "{md}");
    // On the signals timeline the head skips to protect at 180 s.
    assert!(md.contains("head: level 3 (protect)"), "{md}");

    // Same manifests on both sides: nothing differs, no gate fails.
    let o = lanekeeper([
        "diff",
        "--base",
        base.to_str().unwrap(),
        "--head",
        base.to_str().unwrap(),
        "--scenario",
        sc.to_str().unwrap(),
        "--fail-on",
        "p0-deadline-regression,deadline-regression,decision-change,new-warnings,more-transitions",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    assert!(String::from_utf8_lossy(&o.stdout).contains("decisions identical"));
}

/// A change that only moves `inFlight.stopAt` names the field and both
/// values; no step is said to differ with the same words on both sides.
#[test]
fn diff_names_a_moved_watermark() {
    let dir = Scratch::new("sim-cli-diff-stop-at");
    let (base, head) = edited_example(&dir, "stopAt: 1500,", "stopAt: 1400,");
    let o = lanekeeper([
        "diff",
        "--base",
        base.to_str().unwrap(),
        "--head",
        head.to_str().unwrap(),
        "--signals",
        "examples/inc-47/signals.yaml",
    ]);
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(o.status.success(), "{out}");
    assert!(out.contains("51 of 51 steps differ"), "{out}");
    assert!(out.contains("base: gateway.inFlight.stopAt 1500"), "{out}");
    assert!(out.contains("head: gateway.inFlight.stopAt 1400"), "{out}");
    let bases = out.lines().filter_map(|l| l.trim().strip_prefix("base: "));
    let heads = out.lines().filter_map(|l| l.trim().strip_prefix("head: "));
    for (b, h) in bases.zip(heads) {
        assert_ne!(b, h, "{out}");
    }
}

/// A scenario of INC-47's p0 lane: `head` (durationSeconds and more) and
/// the lane's own `lane` fields; a second lane `p1-agent-assist` with
/// `other` fields when given.
fn bounded(head: &str, lane: &str, other: Option<&str>) -> lanekeeper::scenario::Scenario {
    let service = "service: {p50Seconds: 1, p95Seconds: 2}";
    let mut text = format!("{head}\nlanes:\n  p0-disruption-assist: {{{service}, {lane}}}\n");
    if let Some(o) = other {
        text.push_str(&format!("  p1-agent-assist: {{{service}, {o}}}\n"));
    }
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// What would not fit in memory is refused by the check, naming the field,
/// before the run allocates anything (these exhausted memory and aborted,
/// exit 134): a rate of 10^10 a second, a backlog of 5·10^9, and 400
/// million seconds in ticks of 10 s (under the 50 million ticks allowed,
/// but per-second series of that length). The requests count every lane
/// and every phase of the arrivals, up to 100 million.
#[test]
fn scenarios_beyond_the_bounds_are_refused_naming_the_field() {
    use lanekeeper::scenario::check;
    let one = "arrivals: [{at: 0, requestsPerSecond: 1}]";
    for (s, says) in [
        (
            bounded(
                "durationSeconds: 1",
                "arrivals: [{at: 0, requestsPerSecond: 1e10}]",
                None,
            ),
            "lanes.p0-disruption-assist.arrivals: the scenario expects 10000000000 requests",
        ),
        (
            bounded("durationSeconds: 60", "initialBacklog: 5000000000", None),
            "lanes.p0-disruption-assist.initialBacklog: the scenario expects 5000000000 requests",
        ),
        (
            bounded("durationSeconds: 400000000\ntickSeconds: 10", one, None),
            "durationSeconds must be <= 604800",
        ),
    ] {
        let err = check(&s).unwrap_err().to_string();
        assert!(err.contains(says), "{err}");
    }
    // 10,000/s for 1000 s, then 20,000/s for 3000 s: 70 million, and 30
    // million queued on another lane: 100 million, the most allowed.
    let phases =
        "arrivals: [{at: 0, requestsPerSecond: 10000}, {at: 1000, requestsPerSecond: 20000}]";
    let at_most = bounded(
        "durationSeconds: 4000",
        phases,
        Some("initialBacklog: 30000000"),
    );
    assert!(check(&at_most).is_ok());
    let over = bounded(
        "durationSeconds: 4000",
        phases,
        Some("initialBacklog: 30000001"),
    );
    let err = check(&over).unwrap_err().to_string();
    assert!(
        err.contains(
            "lanes.p0-disruption-assist.arrivals: the scenario expects 100000001 requests"
        ),
        "{err}"
    );
    assert!(check(&bounded("durationSeconds: 604800", one, None)).is_ok());
}

/// ... and `simulate` exits 2 with it.
#[test]
fn a_scenario_beyond_the_bounds_exits_2() {
    let dir = Scratch::new("sim-cli-bounds");
    let p = dir.join("huge.yaml");
    std::fs::write(
        &p,
        "durationSeconds: 1\nlanes:\n  p0-disruption-assist:\n    arrivals: [{at: 0, requestsPerSecond: 1e10}]\n    service: {p50Seconds: 1, p95Seconds: 2}\n",
    )
    .unwrap();
    let o = lanekeeper([
        "simulate",
        "-f",
        "examples/inc-47/inc-47.yaml",
        "--scenario",
        p.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("lanes.p0-disruption-assist.arrivals"), "{err}");
    assert!(
        err.contains("more than the 100000000 a run may hold"),
        "{err}"
    );
}
