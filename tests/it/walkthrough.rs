//! The INC-47 walkthroughs (`README.md`, `examples/inc-47/README.md`,
//! `docs/concepts.md`) cannot drift from what `plan` prints:
//! - every line they quote from `plan` in a ```text block is a line of the
//!   golden (`tests/golden/inc-47-plan-signals.txt`), in the step it is
//!   quoted under;
//! - every figure of their prose about the timeline is rendered here from the
//!   golden JSON (`tests/golden/inc-47-plan-signals.json`) or the example's
//!   manifest, and must appear word for word.
//!
//! `plan_cli::` keeps the goldens equal to `plan`'s output, so a change of the
//! engine that moves a figure fails here until the walkthroughs say the new
//! one. The failure message prints the sentence as it should read.

use serde_json::Value;

use crate::cli::root;

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

const WALKTHROUGHS: [&str; 3] = ["README.md", "examples/inc-47/README.md", "docs/concepts.md"];

/// The golden timeline of `plan -f examples/inc-47 --signals …`.
struct Incident {
    steps: Vec<Value>,
}

impl Incident {
    fn load() -> Incident {
        let json: Value =
            serde_json::from_str(&read("tests/golden/inc-47-plan-signals.json")).unwrap();
        Incident {
            steps: json["steps"].as_array().expect("steps").clone(),
        }
    }

    fn profile(&self, at: u64) -> &Value {
        let step = self
            .steps
            .iter()
            .find(|s| s["at"].as_u64() == Some(at))
            .unwrap_or_else(|| panic!("no step at {at}"));
        &step["profiles"][0]
    }

    fn profiles(&self) -> impl Iterator<Item = (u64, &Value)> {
        self.steps
            .iter()
            .map(|s| (s["at"].as_u64().unwrap(), &s["profiles"][0]))
    }

    /// When the ladder moved from `from` to `to`.
    fn transition(&self, from: u64, to: u64) -> u64 {
        self.profiles()
            .find(|(_, p)| {
                p["transition"]["from"].as_u64() == Some(from)
                    && p["transition"]["to"].as_u64() == Some(to)
            })
            .unwrap_or_else(|| panic!("no transition {from} -> {to}"))
            .0
    }

    fn lane<'a>(&'a self, at: u64, name: &str) -> &'a Value {
        self.profile(at)["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .unwrap_or_else(|| panic!("no lane {name} at {at}"))
    }

    /// The steps at which `lane`'s `limitedBy` changed, from `after` on,
    /// with the new value (None: admitted in full).
    fn limit_changes(&self, after: u64, lane: &str) -> Vec<(u64, Option<String>)> {
        let mut out: Vec<(u64, Option<String>)> = Vec::new();
        for (at, _) in self.profiles().filter(|(at, _)| *at >= after) {
            let limit = self.lane(at, lane)["limitedBy"]
                .as_str()
                .map(str::to_string);
            if out.last().is_none_or(|(_, last)| *last != limit) {
                out.push((at, limit));
            }
        }
        out
    }

    /// The first step whose desired replica count differs from the one before.
    fn first_resize(&self) -> (u64, u64, u64) {
        let mut prev = None;
        for (at, p) in self.profiles() {
            let n = p["desiredReplicas"].as_u64().unwrap();
            if let Some(before) = prev.filter(|b| *b != n) {
                return (at, before, n);
            }
            prev = Some(n);
        }
        panic!("the pool is never resized")
    }
}

/// A time as the walkthroughs write it: `1,800`.
fn t(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A figure as `plan` prints it (no trailing zeros).
fn num(v: &Value) -> String {
    let f = v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"));
    let s = format!("{f:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn percent(limit: &Option<String>) -> String {
    let l = limit.as_deref().unwrap_or("");
    l.strip_prefix("recovery ")
        .and_then(|p| p.strip_suffix('%'))
        .unwrap_or_else(|| panic!("{l:?} is not a recovery stage"))
        .to_string()
}

/// Prose with its line breaks (and runs of spaces) as single spaces.
fn squash(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The golden text split into steps: the `at …` line and what follows it.
fn golden_steps() -> Vec<(String, Vec<String>)> {
    let mut steps: Vec<(String, Vec<String>)> = Vec::new();
    for line in read("tests/golden/inc-47-plan-signals.txt").lines() {
        let line = line.trim_end().to_string();
        if line.starts_with("at ") {
            steps.push((line, Vec::new()));
        } else if let Some((_, body)) = steps.last_mut() {
            body.push(line);
        }
    }
    steps
}

/// The INC-47 walkthrough of `path`: docs/concepts.md's section "INC-47,
/// step by step" (its other sections quote other examples), the whole file
/// otherwise.
fn walkthrough(path: &str) -> String {
    let text = read(path);
    let Some(start) = text.find("## INC-47, step by step") else {
        return text;
    };
    let rest = &text[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    rest[..end].to_string()
}

/// The ```text blocks of `doc` that quote `plan`.
fn quoted_plan_blocks(doc: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in doc.lines() {
        match (&mut current, line.trim_start().starts_with("```")) {
            (None, true) if line.trim() == "```text" => current = Some(Vec::new()),
            (Some(_), true) => blocks.push(current.take().unwrap()),
            (Some(block), false) => block.push(line.trim_end().to_string()),
            _ => {}
        }
    }
    let is_plan = |l: &String| {
        let l = l.trim_start();
        l.starts_with("at ")
            || l.starts_with("UP level")
            || l.starts_with("DOWN level")
            || l.starts_with("drain: ")
    };
    blocks.retain(|b| b.iter().find(|l| !l.is_empty()).is_some_and(is_plan));
    blocks
}

#[test]
fn quoted_plan_output_is_the_golden() {
    let golden = golden_steps();
    let mut checked = 0;
    for path in WALKTHROUGHS {
        for block in quoted_plan_blocks(&walkthrough(path)) {
            let mut step: Option<&(String, Vec<String>)> = None;
            for line in block.iter().filter(|l| !l.is_empty()) {
                if line.starts_with("at ") {
                    step = golden.iter().find(|(head, _)| head == line);
                    assert!(
                        step.is_some(),
                        "{path} quotes a plan line that plan does not print:\n{line}"
                    );
                } else {
                    let found = match step {
                        Some((_, body)) => body.contains(line),
                        None => golden.iter().any(|(_, body)| body.contains(line)),
                    };
                    assert!(
                        found,
                        "{path} quotes a line that is not in the golden step it is under:\n{line}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 20,
        "only {checked} quoted lines found: the blocks moved?"
    );
}

/// The sentences of the walkthroughs that carry the timeline's figures.
fn claims(inc: &Incident) -> Vec<(&'static str, String)> {
    let up12 = inc.transition(1, 2);
    let down21 = inc.transition(2, 1);
    let down10 = inc.transition(1, 0);
    let p0 = inc.profile(0);
    let shed = inc.profile(up12);
    let p3 = "p3-shift-batch";
    let ramp = inc.limit_changes(down21, p3);
    let [(_, first), (second_at, second), (full_at, None), ..] = ramp.as_slice() else {
        panic!("P3's recovery after the step down is not two stages then full: {ramp:?}")
    };
    let window = inc.profile(down21)["transition"]["reason"]
        .as_str()
        .and_then(|r| r.strip_prefix("level 2 (shed) exit held for "))
        .and_then(|r| r.strip_suffix('s'))
        .expect("the step down names its window")
        .to_string();
    let (resize_at, replicas_before, replicas_after) = inc.first_resize();
    let cap3 = num(&inc.lane(up12, p3)["admittedUnitsPerSecond"]);
    let unused = shed["capacityUnitsPerSecond"].as_f64().unwrap()
        - shed["admittedUnitsPerSecond"].as_f64().unwrap();
    let unused = num(&serde_json::json!((unused * 1e6).round() / 1e6));
    let (cap, dem, adm) = (
        num(&shed["capacityUnitsPerSecond"]),
        num(&shed["demandUnitsPerSecond"]),
        num(&shed["admittedUnitsPerSecond"]),
    );
    let at = |x: u64, k: &str| num(&inc.profile(x)[k]);
    let keep = |n: &str| num(&inc.lane(up12, n)["admittedUnitsPerSecond"]);
    let (first, second) = (percent(first), percent(second));
    let readme = "README.md";
    let example = "examples/inc-47/README.md";
    let concepts = "docs/concepts.md";
    vec![
        (
            readme,
            format!(
                "level 1 at {}, level 2 (`shed`) once capacity drops — P4 paused, P3 capped at {cap3}, {adm} of {dem} units/s admitted — and the way back down, one level per {window}-second stable window",
                at(0, "capacityUnitsPerSecond")
            ),
        ),
        (
            example,
            format!(
                "**t = 0: level 1 (`conserve`) at {}.**",
                at(0, "capacityUnitsPerSecond")
            ),
        ),
        (
            example,
            format!(
                "Every lane is `Admitted`, {} in total",
                num(&p0["admittedUnitsPerSecond"])
            ),
        ),
        (
            example,
            format!("desired replicas {}.", p0["desiredReplicas"]),
        ),
        (
            example,
            format!("**t = {}: level 2 (`shed`) at {cap}.**", t(up12)),
        ),
        (
            example,
            format!(
                "P4 is `Paused` (0), P3 is `Capped` at {cap3}, P0, P1 and P2 keep {}, {} and {}. Admitted {adm}, leaving {unused} units/s unused.",
                keep("p0-disruption-assist"),
                keep("p1-agent-assist"),
                keep("p2-email-extract")
            ),
        ),
        (
            example,
            format!(
                "**t = {}: `DOWN level 2 -> 1`**, {window} s after `overCapacity` stopped holding. P3 and P4 are `Recovering`: they regain what the shed denied them in stages, {first} % first ({} admitted).",
                t(down21),
                at(down21, "admittedUnitsPerSecond")
            ),
        ),
        (
            example,
            format!(
                "**t = {}: the next stage, {second} %** ({} admitted).",
                t(*second_at),
                at(*second_at, "admittedUnitsPerSecond")
            ),
        ),
        (
            example,
            format!(
                "**t = {}: the ramp ends.** Every lane is `Admitted` again ({}); level 1's stable window starts now (`exitHoldingSince: {full_at}`), not at the step down.",
                t(*full_at),
                at(*full_at, "admittedUnitsPerSecond")
            ),
        ),
        (
            example,
            format!(
                "**t = {}: `DOWN level 1 -> 0`**, a full window after the ramp ended.",
                t(down10)
            ),
        ),
        (
            example,
            format!(
                "**Replicas: {replicas_before}, then {replicas_after} at t = {}.** Demand of {} asks for fewer from t = 1,620, but the pool does not scale down while degraded. The scale-down window starts at t = {} and ends {} s later.",
                t(resize_at),
                at(resize_at, "demandUnitsPerSecond"),
                t(down10),
                resize_at - down10
            ),
        ),
        (
            concepts,
            format!(
                "- At **t = {} s**, {window} s after `overCapacity` stopped holding, the ladder steps down to level 1. P3 and P4 are released into `Recovering`: they regain what level 2 denied them in stages, {first} % first (admitted {}).",
                t(down21),
                at(down21, "admittedUnitsPerSecond")
            ),
        ),
        (
            concepts,
            format!(
                "- At **t = {} s** the next stage: {second} % (admitted {}).",
                t(*second_at),
                at(*second_at, "admittedUnitsPerSecond")
            ),
        ),
        (
            concepts,
            format!(
                "- At **t = {} s** the ramp ends and every lane is `Admitted` ({}). Level 1's own exit condition (no trigger, utilization below 80 %, in flight below 1,200) has held since t = 1,620 s, but its window starts when the ramp ends (`exitHoldingSince: {full_at}`).",
                t(*full_at),
                at(*full_at, "admittedUnitsPerSecond")
            ),
        ),
        (
            concepts,
            format!(
                "- At **t = {} s**, {window} s later, the ladder steps down to level 0 and the gateway takes optional long context again.",
                t(down10)
            ),
        ),
        (
            concepts,
            format!(
                "the pool is degraded until t = {} s, so the desired count stays at {replicas_before}. The scale-down window starts at t = {} s, and after `scaleDownStabilizationSeconds` ({} s) the desired count drops to {replicas_after}:",
                t(down10),
                t(down10),
                resize_at - down10
            ),
        ),
    ]
}

#[test]
fn walkthrough_figures_are_the_golden() {
    let inc = Incident::load();
    let mut wrong = Vec::new();
    for (path, sentence) in claims(&inc) {
        if !squash(&read(path)).contains(&squash(&sentence)) {
            wrong.push(format!("{path} should say:\n  {sentence}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The ladder as docs/concepts.md describes it is the example's: in
/// particular the `continuity` level's approval mode.
#[test]
fn concepts_describes_the_examples_approval() {
    let docs: Vec<serde_yaml::Value> =
        serde_yaml::Deserializer::from_str(&read("examples/inc-47/inc-47.yaml"))
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
    let policy = docs
        .iter()
        .find(|d| d["kind"] == "DegradationPolicy")
        .expect("a policy");
    let levels = policy["spec"]["levels"].as_sequence().unwrap();
    let continuity = levels
        .iter()
        .find(|l| l["name"] == "continuity")
        .expect("continuity");
    let mode = continuity["approval"]["mode"].as_str().unwrap();
    let valid = continuity["approval"]["validForSeconds"].as_u64().unwrap();
    let sentence = format!(
        "`continuity` (read-only, approved by a person: `{mode}`, the approval valid for {} s)",
        t(valid)
    );
    let concepts = squash(&read("docs/concepts.md"));
    assert!(
        concepts.contains(&squash(&sentence)),
        "docs/concepts.md should describe the ladder's last level as:\n  {sentence}"
    );
}

#[test]
fn times_are_written_with_thousands_separators() {
    assert_eq!(t(0), "0");
    assert_eq!(t(180), "180");
    assert_eq!(t(1800), "1,800");
    assert_eq!(t(12345678), "12,345,678");
    assert_eq!(num(&serde_json::json!(400.1)), "400.1");
    assert_eq!(num(&serde_json::json!(60.0)), "60");
    assert_eq!(num(&serde_json::json!(360.165)), "360.165");
}
