//! The `burnRateAbove` trigger, pure: it holds when one of its lanes burns
//! its error budget faster than the factor over every listed window.

use std::collections::BTreeMap;

use crate::api::{BurnRateAbove, DegradationPolicy, LaneContract, ObjectKey};
use crate::snapshot::LaneSignals;

use super::decision::{Warning, round6};

/// A warning for each lane a `burnRateAbove` trigger of `policy` names that
/// is not one of `lanes` with an objective.
pub fn lanes_without_objective(
    policy: &DegradationPolicy,
    lanes: &[&LaneContract],
) -> Vec<Warning> {
    let with_objective = |name: &str| {
        lanes
            .iter()
            .any(|l| l.name_str() == name && l.spec.objective.is_some())
    };
    let mut out = Vec::new();
    for (i, level) in policy.spec.levels.iter().enumerate() {
        let Some(b) = &level.enter_when.burn_rate_above else {
            continue;
        };
        for lane in b.lanes.iter().filter(|l| !with_objective(l)) {
            out.push(Warning::BurnLaneWithoutObjective {
                policy: policy.key(),
                level: i + 1,
                level_name: level.name.clone(),
                lane: lane.clone(),
            });
        }
    }
    out
}

/// What the trigger says in one evaluation.
#[derive(Clone, Debug, PartialEq)]
pub enum TriggerState {
    /// It holds, on known data: why.
    Holds(String),
    /// It does not hold, on known data (or on none at all).
    Clear,
    /// It does not hold, and a window's source reported it Unknown.
    Unknown,
}

/// Whether `b` holds for the lanes of `namespace` in `lanes` (keyed
/// `namespace/name`). A window whose source reported it Unknown makes the
/// trigger Unknown unless another lane holds; a window nobody provides is
/// no evidence either way (the trigger does not hold and pins nothing).
pub fn holds(
    b: &BurnRateAbove,
    namespace: &str,
    lanes: &BTreeMap<String, LaneSignals>,
) -> TriggerState {
    let factor = b.factor.value();
    let mut unknown = false;
    for lane in &b.lanes {
        // The snapshot's key of a lane: `namespace/name`.
        let sig = lanes.get(&format!("{namespace}/{lane}"));
        let mut all_above = !b.windows.is_empty();
        let mut seen = Vec::with_capacity(b.windows.len());
        for w in &b.windows {
            match sig.and_then(|s| s.burn_rate.get(*w)) {
                Some(v) if v > factor => seen.push(format!("{} {}", w.as_str(), round6(v))),
                Some(_) => all_above = false,
                None => {
                    all_above = false;
                    let failed = sig.is_some_and(|s| {
                        s.unknown.contains_key(&format!("burnRate.{}", w.as_str()))
                    });
                    unknown |= failed;
                }
            }
        }
        if all_above {
            return TriggerState::Holds(format!(
                "burnRateAbove: lane {lane} burns {} > {}",
                seen.join(", "),
                round6(factor)
            ));
        }
    }
    if unknown {
        TriggerState::Unknown
    } else {
        TriggerState::Clear
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Decimal;
    use crate::snapshot::{BurnRates, BurnWindow};

    fn trigger(lanes: &[&str], windows: &[BurnWindow]) -> BurnRateAbove {
        BurnRateAbove {
            lanes: lanes.iter().map(|l| (*l).to_owned()).collect(),
            factor: Decimal::parse("14.4").unwrap(),
            windows: windows.to_vec(),
        }
    }

    fn lane(h1: Option<f64>, m5: Option<f64>, unknown: &[&str]) -> LaneSignals {
        LaneSignals {
            burn_rate: BurnRates {
                h1,
                m5,
                ..Default::default()
            },
            unknown: unknown
                .iter()
                .map(|k| ((*k).to_owned(), "stale".to_owned()))
                .collect(),
            ..Default::default()
        }
    }

    fn signals(pairs: &[(&str, LaneSignals)]) -> BTreeMap<String, LaneSignals> {
        pairs
            .iter()
            .map(|(n, s)| (format!("ns/{n}"), s.clone()))
            .collect()
    }

    const FAST: [BurnWindow; 2] = [BurnWindow::H1, BurnWindow::M5];

    /// The objectives example, its trigger naming `lane`.
    fn example_naming(lane: &str) -> crate::policy::World {
        let text = include_str!("../../examples/objectives/manifests.yaml")
            .replace("lanes: [tier0-live-agent]", &format!("lanes: [{lane}]"));
        let mut loaded = crate::manifest::Loaded::default();
        crate::manifest::load_str(std::path::Path::new("m.yaml"), &text, &mut loaded).unwrap();
        loaded.world
    }

    #[test]
    fn a_trigger_naming_a_lane_without_an_objective_is_a_warning_in_every_plan_step() {
        for (lane, warned) in [
            ("tier0-live-agent", false),
            ("batch-backfill", true),
            ("no-such-lane", true),
        ] {
            let world = example_naming(lane);
            let lanes: Vec<&LaneContract> = world.lanes.iter().collect();
            let w = lanes_without_objective(&world.policies[0], &lanes);
            assert_eq!(w.len(), usize::from(warned), "{lane}: {w:?}");
            let plan = crate::plan::plan(
                &world,
                &crate::plan::default_timeline(&world),
                &Default::default(),
            );
            let texts: Vec<String> = plan.steps[0].profiles[0]
                .warnings
                .iter()
                .map(ToString::to_string)
                .collect();
            let expected = format!(
                "policy ai-platform/support-assist-ladder level 1 (protect-tier0): burnRateAbove names lane {lane}, which has no objective on this profile (the trigger never holds for it)"
            );
            assert_eq!(texts.contains(&expected), warned, "{lane}: {texts:?}");
        }
    }

    #[test]
    fn holds_only_when_every_window_is_above_the_factor() {
        let t = trigger(&["p0"], &FAST);
        let both = signals(&[("p0", lane(Some(20.0), Some(16.0), &[]))]);
        assert_eq!(
            holds(&t, "ns", &both),
            TriggerState::Holds("burnRateAbove: lane p0 burns 1h 20, 5m 16 > 14.4".into())
        );
        // The burn stopped: the short window says so at once.
        let long_only = signals(&[("p0", lane(Some(20.0), Some(2.0), &[]))]);
        assert_eq!(holds(&t, "ns", &long_only), TriggerState::Clear);
        // A blip: the long window is not convinced.
        let short_only = signals(&[("p0", lane(Some(3.0), Some(40.0), &[]))]);
        assert_eq!(holds(&t, "ns", &short_only), TriggerState::Clear);
        // At the factor is not above it.
        let at = signals(&[("p0", lane(Some(14.4), Some(14.4), &[]))]);
        assert_eq!(holds(&t, "ns", &at), TriggerState::Clear);
    }

    #[test]
    fn any_listed_lane_holds_it_and_others_do_not() {
        let t = trigger(&["p0", "p1"], &FAST);
        let s = signals(&[
            ("p0", lane(Some(1.0), Some(1.0), &[])),
            ("p1", lane(Some(30.0), Some(30.0), &[])),
            ("p9", lane(Some(99.0), Some(99.0), &[])),
        ]);
        assert!(matches!(holds(&t, "ns", &s), TriggerState::Holds(r) if r.contains("lane p1")));
        let only_unlisted = signals(&[("p9", lane(Some(99.0), Some(99.0), &[]))]);
        assert_eq!(holds(&t, "ns", &only_unlisted), TriggerState::Clear);
        // Another namespace's lane of the same name is not this one.
        assert_eq!(holds(&t, "other", &s), TriggerState::Clear);
    }

    #[test]
    fn an_unknown_window_is_unknown_and_an_absent_one_is_no_evidence() {
        let t = trigger(&["p0"], &FAST);
        let failed = signals(&[("p0", lane(Some(20.0), None, &["burnRate.5m"]))]);
        assert_eq!(holds(&t, "ns", &failed), TriggerState::Unknown);
        let absent = signals(&[("p0", lane(Some(20.0), None, &[]))]);
        assert_eq!(holds(&t, "ns", &absent), TriggerState::Clear);
        let nan = signals(&[("p0", lane(Some(20.0), Some(f64::NAN), &["burnRate.5m"]))]);
        assert_eq!(holds(&t, "ns", &nan), TriggerState::Unknown);
        // An unknown lane does not hide another lane that holds.
        let t2 = trigger(&["p0", "p1"], &FAST);
        let s = signals(&[
            ("p0", lane(None, None, &["burnRate.1h", "burnRate.5m"])),
            ("p1", lane(Some(20.0), Some(20.0), &[])),
        ]);
        assert!(matches!(holds(&t2, "ns", &s), TriggerState::Holds(_)));
    }
}
