//! docs/gateway-config.md follows src/gateway.rs: every field of a built
//! `lanes.json` is documented, and the INC-47 example in the doc is what
//! `policy::gateway_config::build` produces today.

use std::collections::BTreeSet;

use lanekeeper::policy::gateway_config;
use lanekeeper::policy::{self, Binding, ProfileState, World};
use lanekeeper::snapshot::{LaneSignals, ProfileSignals, Snapshot};
use lanes::GatewayConfig;
use serde_json::Value;

const PROFILE: &str = "ai-platform/agent-assist";
/// The fixed clock of the example (2026-08-01T00:00:00Z).
pub(crate) const NOW: i64 = 1_785_542_400;

use crate::cli::root;

/// The INC-47 objects, each at generation 1 as on a cluster after `kubectl
/// apply`.
fn inc47() -> World {
    let world = lanekeeper::manifest::load(&[root().join("examples/inc-47/inc-47.yaml")])
        .expect("examples load")
        .world;
    at_generation_1(world)
}

/// `world` with each object at generation 1, as on a cluster after
/// `kubectl apply`.
pub(crate) fn at_generation_1(mut world: World) -> World {
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
pub(crate) fn build(world: &World, ready: u32, lane_rps: &[(&str, f64)]) -> GatewayConfig {
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
    gateway_config::build(
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

/// INC-47 with the profile's `spec.inFlight` replaced by `in_flight` (JSON
/// as in the CRD).
fn inc47_with_in_flight(in_flight: Value) -> World {
    let mut world = inc47();
    world.profiles[0].spec.in_flight =
        Some(serde_json::from_value(in_flight).expect("a valid spec.inFlight"));
    world
}

/// INC-47 whose P1 lists one client of each kind (`spec.clients`).
fn inc47_with_clients() -> World {
    let mut world = inc47();
    let p1 = world
        .lanes
        .iter_mut()
        .find(|l| l.metadata.name.as_deref() == Some("p1-agent-assist"))
        .unwrap();
    p1.spec.clients = serde_json::from_value(serde_json::json!([
        {"apiKeys": {"secretName": "agent-keys"}},
        {"serviceAccount": {"name": "agent"}, "tenant": "agents"},
        {"jwt": {"issuer": "https://idp.example", "audience": "lanekeeper",
                 "jwksUrl": "https://idp.example/jwks", "subject": "svc"}, "tenantClaim": "team"},
        {"jwt": {"issuer": "https://idp.example", "audience": "lanekeeper",
                 "jwksConfigMapKeyRef": {"name": "idp-jwks", "key": "jwks.json"}}},
        {"certificate": {"name": "spiffe://cluster.local/ns/ops/sa/pager"}}
    ]))
    .expect("valid spec.clients");
    world
}

/// The configs that together fill every field: INC-47 at 420 units/s, a
/// borrowing case (P0 quiet at 20 req/s leaves idle floor that P3 borrows),
/// INC-47 whose profile sets `inFlight.resumeAfterStableSeconds`, and one
/// whose P1 lists clients.
fn samples() -> Vec<GatewayConfig> {
    let world = inc47();
    let resume_after = inc47_with_in_flight(serde_json::json!({
        "conserveAt": 1350, "stopAt": 1500, "resumeBelow": 1200, "resumeAfterStableSeconds": 120
    }));
    vec![
        build(&world, 6, &[]),
        build(&world, 5, &[("p0-disruption-assist", 20.0)]),
        build(&resume_after, 6, &[]),
        build(&inc47_with_clients(), 6, &[]),
        build(&inc47_with_pool_limits(), 6, &[]),
    ]
}

/// INC-47 whose profile sets the pool's model slots and long-context limit
/// (`spec.concurrency`, `spec.longContext`).
fn inc47_with_pool_limits() -> World {
    let mut world = inc47();
    let spec = &mut world.profiles[0].spec;
    spec.concurrency = Some(serde_json::from_value(serde_json::json!({"max": 256})).unwrap());
    spec.long_context = Some(
        serde_json::from_value(serde_json::json!({"aboveInputTokens": 16000, "maxConcurrency": 8}))
            .unwrap(),
    );
    world
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
    assert!(paths.contains("inFlight.resumeAfterStableSeconds"));
    assert!(paths.contains("lanes[].optionalContext.historyTurns"));
    assert!(paths.contains("lanes[].clients[].jwt.jwks.configMap.key"));
    assert!(paths.contains("concurrency.max"));
    assert!(paths.contains("longContext.maxConcurrency"));
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
        "regenerate with `cargo test --test it -- gateway_doc:: --ignored --nocapture`"
    );
    // The same config ships as a file, for `lanekeeper gateway --config`.
    assert_eq!(
        std::fs::read_to_string(root().join("examples/inc-47/lanes-420.json")).unwrap(),
        lanes::to_json(&s[0]),
        "examples/inc-47/lanes-420.json is the INC-47 config at 420 units/s (print it with `cargo test --test it -- gateway_doc:: --ignored --nocapture`)"
    );
    let lane = s[1]
        .lanes
        .iter()
        .find(|l| l.name == "p3-shift-batch")
        .expect("p3");
    assert_eq!(
        doc_example(&doc, "example: borrowing"),
        serde_json::to_value(lane).unwrap(),
        "regenerate with `cargo test --test it -- gateway_doc:: --ignored --nocapture`"
    );
}

/// The profile's `inFlight.resumeAfterStableSeconds` reaches `lanes.json`
/// as it is; without it the key is absent (the gateway then waits 300 s),
/// so configs of profiles that do not set it keep their bytes and hash.
#[test]
fn the_profiles_resume_after_stable_seconds_reaches_lanes_json() {
    let s = samples();
    let json = |c: &GatewayConfig| -> Value { serde_json::from_str(&lanes::to_json(c)).unwrap() };
    assert_eq!(
        json(&s[2])["inFlight"],
        serde_json::json!({
            "conserveAt": 1350, "stopAt": 1500, "resumeBelow": 1200, "resumeAfterStableSeconds": 120
        })
    );
    assert!(
        json(&s[0])["inFlight"]
            .as_object()
            .is_some_and(|f| !f.contains_key("resumeAfterStableSeconds")),
        "{}",
        json(&s[0])["inFlight"]
    );
    // Only the field differs between the two configs' inFlight.
    let (mut a, b) = (
        s[0].in_flight.clone().unwrap(),
        s[2].in_flight.clone().unwrap(),
    );
    a.resume_after_stable_seconds = Some(120);
    assert_eq!(a, b);
}

/// What the gateway's admission core does with the value the controller
/// wrote: after in flight falls below `resumeBelow` it keeps conserving
/// until the p95 latency has been stable `resumeAfterStableSeconds` (30
/// here); with 0 it goes back to normal at once.
#[test]
fn the_gateway_resumes_after_the_profiles_stable_window() {
    use lanes::{Core, Pressure};
    let core = |resume_after: Option<i64>| {
        let mut f = serde_json::json!({"conserveAt": 8, "stopAt": 10, "resumeBelow": 5});
        if let Some(r) = resume_after {
            f["resumeAfterStableSeconds"] = r.into();
        }
        let cfg = build(&inc47_with_in_flight(f), 6, &[]);
        // Through the bytes the ConfigMap holds, as a gateway reads them.
        let read: GatewayConfig = serde_json::from_str(&lanes::to_json(&cfg)).unwrap();
        assert_eq!(
            read.in_flight.as_ref().unwrap().resume_after_stable_seconds,
            resume_after
        );
        let mut c = Core::new(read, 1.0, 0.0, NOW as f64).expect("the gateway loads it");
        for _ in 0..10 {
            c.started(0.0);
        }
        assert_eq!(c.pressure(), Pressure::Stop);
        // Down to 4 in flight at t=1, with a steady latency.
        for _ in 0..6 {
            c.finished(1.0, 0.2);
        }
        c
    };
    let mut c = core(Some(30));
    assert_eq!(c.pressure(), Pressure::Conserve);
    c.finished(20.0, 0.2);
    assert_eq!(c.pressure(), Pressure::Conserve, "20 s stable of 30");
    c.finished(31.5, 0.2);
    assert_eq!(c.pressure(), Pressure::Normal);

    assert_eq!(core(Some(0)).pressure(), Pressure::Normal, "0: at once");

    // Absent: the default 300 s.
    let mut c = core(None);
    c.finished(200.0, 0.2);
    assert_eq!(c.pressure(), Pressure::Conserve, "200 s stable of 300");
    c.finished(301.5, 0.2);
    assert_eq!(c.pressure(), Pressure::Normal);
}

/// Prints the examples for the doc.
#[test]
#[ignore = "prints the examples of docs/gateway-config.md"]
fn print_examples() {
    let s = samples();
    println!("{}", lanes::to_json(&s[0]));
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
