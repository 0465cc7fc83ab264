//! docs/gateway-config.md follows src/gateway.rs: every field of a built
//! `lanes.json` is documented, and the INC-47 example in the doc is what
//! `gateway::build` produces today.

use std::collections::BTreeSet;
use std::path::PathBuf;

use lanekeeper::gateway::{self, GatewayConfig};
use lanekeeper::policy::{self, Binding, ProfileState, World};
use lanekeeper::snapshot::{LaneSignals, ProfileSignals, Snapshot};
use serde_json::Value;

const PROFILE: &str = "ai-platform/agent-assist";
/// The fixed clock of the example (2026-08-01T00:00:00Z).
const NOW: i64 = 1_785_542_400;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The INC-47 objects, each at generation 1 as on a cluster after `kubectl
/// apply`.
fn inc47() -> World {
    let mut world = lanekeeper::manifest::load(&[root().join("examples/inc-47/inc-47.yaml")])
        .expect("examples load")
        .world;
    for p in &mut world.profiles {
        p.metadata.generation = Some(1);
    }
    for l in &mut world.lanes {
        l.metadata.generation = Some(1);
    }
    for p in &mut world.policies {
        p.metadata.generation = Some(1);
    }
    world
}

/// The config the controller publishes for INC-47 with `ready` replicas
/// ready (70 units/s each), lane request rates overridden by `lane_rps`.
fn build(world: &World, ready: u32, lane_rps: &[(&str, f64)]) -> GatewayConfig {
    let bound = policy::bind::bind(world);
    let b: &Binding<'_> = bound
        .bindings
        .iter()
        .find(|b| b.profile.metadata.name.as_deref() == Some("agent-assist"))
        .expect("profile bound");
    let mut snapshot = Snapshot {
        at: NOW,
        ..Default::default()
    };
    snapshot.profiles.insert(
        PROFILE.into(),
        ProfileSignals {
            ready_replicas: Some(ready),
            ..Default::default()
        },
    );
    for (lane, rps) in lane_rps {
        snapshot.lanes.insert(
            format!("ai-platform/{lane}"),
            LaneSignals {
                requests_per_second: Some(*rps),
                ..Default::default()
            },
        );
    }
    let (decision, _) = policy::evaluate_profile(b, &snapshot, None, &ProfileState::default());
    gateway::build(
        &decision,
        &b.lanes,
        b.policy,
        b.profile.metadata.generation.unwrap_or(0),
        None,
        NOW,
    )
}

/// Every key path of a JSON value: `a.b`, arrays as `a[].b`.
fn key_paths(prefix: &str, v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                // Map keys that are lane names, not fields.
                let p = if prefix.is_empty() {
                    k.clone()
                } else if prefix == "generations.lanes" {
                    continue;
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(p.clone());
                key_paths(&p, child, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                key_paths(&format!("{prefix}[]"), item, out);
            }
        }
        _ => {}
    }
}

fn doc() -> String {
    std::fs::read_to_string(root().join("docs/gateway-config.md")).expect("docs/gateway-config.md")
}

/// The configs that together fill every field: INC-47 at 420 units/s, and a
/// borrowing case (P0 quiet at 20 req/s leaves idle floor that P3 borrows).
fn samples() -> Vec<GatewayConfig> {
    let world = inc47();
    vec![
        build(&world, 6, &[]),
        build(&world, 5, &[("p0-disruption-assist", 20.0)]),
    ]
}

#[test]
fn every_field_of_the_config_is_documented() {
    let doc = doc();
    let mut paths = BTreeSet::new();
    for cfg in samples() {
        key_paths("", &serde_json::to_value(&cfg).unwrap(), &mut paths);
    }
    assert!(
        paths.contains("lanes[].borrowing[].expiresAt"),
        "the samples cover a borrowing grant: {paths:#?}"
    );
    assert!(paths.contains("inFlight.conserveAt"));
    assert!(paths.contains("lanes[].optionalContext.historyTurns"));
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| !doc.contains(&format!("`{p}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "fields of lanes.json missing from docs/gateway-config.md (write them as `path`): {missing:#?}"
    );
}

/// The JSON between the example markers in the doc.
fn doc_example(doc: &str, marker: &str) -> Value {
    let start = doc
        .find(&format!("<!-- {marker} -->"))
        .unwrap_or_else(|| panic!("marker {marker} in the doc"));
    let rest = &doc[start..];
    let open = rest
        .find("```json\n")
        .expect("a json block after the marker")
        + 8;
    let close = rest[open..].find("```").expect("the block closes") + open;
    serde_json::from_str(&rest[open..close]).expect("the example is valid JSON")
}

#[test]
fn the_doc_examples_are_what_build_produces() {
    let doc = doc();
    let s = samples();
    assert_eq!(
        doc_example(&doc, "example: inc-47 at 420"),
        serde_json::to_value(&s[0]).unwrap(),
        "regenerate with `cargo test --test gateway_doc -- --ignored --nocapture`"
    );
    // The same config ships as a file, for `lanekeeper gateway --config`.
    assert_eq!(
        std::fs::read_to_string(root().join("examples/inc-47/lanes-420.json")).unwrap(),
        gateway::to_json(&s[0]),
        "examples/inc-47/lanes-420.json is the INC-47 config at 420 units/s (print it with `cargo test --test gateway_doc -- --ignored --nocapture`)"
    );
    let lane = s[1]
        .lanes
        .iter()
        .find(|l| l.name == "p3-shift-batch")
        .expect("p3");
    assert_eq!(
        doc_example(&doc, "example: borrowing"),
        serde_json::to_value(lane).unwrap(),
        "regenerate with `cargo test --test gateway_doc -- --ignored --nocapture`"
    );
}

/// Prints the examples for the doc.
#[test]
#[ignore = "prints the examples of docs/gateway-config.md"]
fn print_examples() {
    let s = samples();
    println!("{}", gateway::to_json(&s[0]));
    let lane = s[1]
        .lanes
        .iter()
        .find(|l| l.name == "p3-shift-batch")
        .expect("p3");
    println!("{}", serde_json::to_string_pretty(lane).unwrap());
    println!(
        "level {} capacity {:?}",
        s[1].level, s[1].capacity_units_per_second
    );
}
