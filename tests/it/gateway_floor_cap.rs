//! A lane's floor as the controller publishes it and the gateway enforces
//! it: the contract's floor held to the lane's level cap, as allocation
//! reserves it, so the gateway's bucket (its rate raised to its floor)
//! never runs a lane capped below its floor above the cap.

use lanekeeper::policy::World;
use lanes::{Core, GatewayConfig};

use crate::cli::root;
use crate::gateway_doc::{NOW, at_generation_1, build};
use crate::scratch::ScratchFile;

/// INC-47 with the `shed` level also capping P2 (`Throttle`, floor 40
/// units/s) at `cap` units/s.
fn inc47_capping_p2(cap: &str) -> World {
    let text = std::fs::read_to_string(root().join("examples/inc-47/inc-47.yaml")).unwrap();
    let shed = r#"cap: [{lanes: [p3-shift-batch], unitsPerSecond: "60"}]"#;
    assert!(text.contains(shed));
    let capped = text.replace(
        shed,
        &format!(
            r#"cap: [{{lanes: [p3-shift-batch], unitsPerSecond: "60"}}, {{lanes: [p2-email-extract], unitsPerSecond: "{cap}"}}]"#
        ),
    );
    let file = ScratchFile::new("floor-cap", "inc-47.yaml", capped);
    let world = lanekeeper::manifest::load(&[file.to_path_buf()])
        .expect("loads")
        .world;
    at_generation_1(world)
}

/// Lane `name`'s bucket rate in work units/s in a gateway core enforcing
/// `cfg`.
fn bucket_units(cfg: &GatewayConfig, name: &str) -> f64 {
    let core = Core::new(cfg.clone(), 1.0, 0.0, NOW as f64).unwrap();
    let i = core.lane_index(name).unwrap();
    core.effective_rate(i, 0.0) * core.lane(i).work_units_per_request
}

#[test]
fn a_lane_capped_below_its_floor_is_held_to_the_cap_by_the_gateway() {
    let world = inc47_capping_p2("20");
    // 3 ready replicas (210 units/s): over capacity, the shed level holds.
    let cfg = build(&world, 3, &[]);
    assert!(cfg.level >= 2, "level {}", cfg.level);
    let p2 = cfg
        .lanes
        .iter()
        .find(|l| l.name == "p2-email-extract")
        .unwrap();
    assert!(p2.admitted_units_per_second <= 20.0 + 1e-6, "{p2:?}");
    assert_eq!(p2.floor_units_per_second, Some(20.0));
    let p2_bucket = bucket_units(&cfg, "p2-email-extract");
    assert!(
        p2_bucket <= 20.0 + 1e-6,
        "the gateway runs P2 at {p2_bucket} units/s, above its level cap of 20 (floor {:?})",
        p2.floor_units_per_second
    );
}
