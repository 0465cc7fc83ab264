//! The actions of a level: which lanes it pauses or caps (as their contracts
//! allow; an action a contract refuses is a warning), each lane's cap under
//! them, and the gateway flags it sets.

use crate::api::{CapacityProfile, DegradationPolicy, LaneContract, ObjectKey, SheddingMode};

use super::allocation::EPS;
use super::decision::{
    ContractOverride, GatewayFlags, InFlightWatermarks, OverriddenAction, Warning,
};

/// How the level actions touch one lane.
#[derive(Clone, Debug, Default)]
pub(super) struct LaneLimits {
    /// Paused by a level.
    pub(super) paused: bool,
    /// The lowest level cap on the lane, if any.
    pub(super) level_cap: Option<f64>,
}

/// Every action of the policy, at any level, that a lane contract overrides
/// (for the policy's `Valid` condition): the rule the engine applies, run
/// over the whole ladder.
pub fn contract_overrides(policy: &DegradationPolicy, lanes: &[&LaneContract]) -> Vec<Warning> {
    let (_, warnings) = apply_actions(Some(policy), policy.spec.levels.len() as u32, lanes);
    let mut texts: Vec<(String, Warning)> =
        warnings.into_iter().map(|w| (w.to_string(), w)).collect();
    texts.sort_by(|a, b| a.0.cmp(&b.0));
    texts.dedup_by(|a, b| a.0 == b.0);
    texts.into_iter().map(|(_, w)| w).collect()
}

/// Applies the actions of `levels` (1-based levels 1..=n) to each lane,
/// honouring contracts. Returns the limits and the overrides (warnings).
pub(super) fn apply_actions(
    policy: Option<&DegradationPolicy>,
    upto: u32,
    lanes: &[&LaneContract],
) -> (Vec<LaneLimits>, Vec<Warning>) {
    let mut limits = vec![LaneLimits::default(); lanes.len()];
    let mut warnings = Vec::new();
    let Some(policy) = policy else {
        return (limits, warnings);
    };
    let pname = policy.key();
    for (idx, level) in policy.spec.levels.iter().enumerate().take(upto as usize) {
        let n = idx + 1;
        for (li, lane) in lanes.iter().enumerate() {
            let lname = lane.name_str();
            let selects = |p: Option<i32>, names: &[String]| {
                p.is_some_and(|p| lane.spec.priority >= p) || names.iter().any(|x| x == lname)
            };
            for sel in &level.actions.pause {
                if selects(sel.priority_at_least, &sel.lanes) {
                    if lane.spec.shedding.mode == SheddingMode::Pause {
                        limits[li].paused = true;
                    } else {
                        warnings.push(Warning::ContractOverride(ContractOverride {
                            policy: pname.clone(),
                            level: n,
                            level_name: level.name.clone(),
                            lane: lname.to_owned(),
                            action: OverriddenAction::Pause {
                                mode: lane.spec.shedding.mode,
                            },
                        }));
                    }
                }
            }
            for cap in &level.actions.cap {
                if !selects(cap.priority_at_least, &cap.lanes) {
                    continue;
                }
                let v = cap.units_per_second.value();
                let refused = match lane.spec.shedding.mode {
                    SheddingMode::Never => Some(None),
                    SheddingMode::Defer => {
                        let min = lane
                            .spec
                            .shedding
                            .min_units_per_second
                            .as_ref()
                            .map_or(0.0, |d| d.value());
                        (v + EPS < min).then_some(Some(min))
                    }
                    _ => None,
                };
                match refused {
                    Some(below_min) => warnings.push(Warning::ContractOverride(ContractOverride {
                        policy: pname.clone(),
                        level: n,
                        level_name: level.name.clone(),
                        lane: lname.to_owned(),
                        action: OverriddenAction::Cap {
                            units: cap.units_per_second.clone(),
                            below_min,
                        },
                    })),
                    None => {
                        let c = limits[li].level_cap.map_or(v, |c: f64| c.min(v));
                        limits[li].level_cap = Some(c);
                    }
                }
            }
        }
    }
    (limits, warnings)
}

/// The lane's cap under the given limits: min(demand, ceiling, level cap), 0
/// if paused.
pub(super) fn lane_cap(lane: &LaneContract, demand: f64, l: &LaneLimits) -> f64 {
    if l.paused {
        return 0.0;
    }
    let mut c = demand;
    if let Some(ceil) = &lane.spec.ceiling_units_per_second {
        c = c.min(ceil.value());
    }
    if let Some(lc) = l.level_cap {
        c = c.min(lc);
    }
    c.max(0.0)
}

/// The gateway flags of the actions of levels 1..=`level`, and the profile's
/// in-flight watermarks.
pub(super) fn gateway_flags(
    profile: &CapacityProfile,
    policy: Option<&DegradationPolicy>,
    level: u32,
) -> GatewayFlags {
    let mut gateway = GatewayFlags::default();
    if let Some(p) = policy {
        for l in p.spec.levels.iter().take(level as usize) {
            gateway.reject_optional_context |= l.actions.reject_optional_context;
            gateway.use_fallback_routes |= l.actions.use_fallback_routes;
            gateway.read_only |= l.actions.read_only;
            gateway.static_fallback |= l.actions.static_fallback;
        }
    }
    gateway.in_flight = profile.spec.in_flight.as_ref().map(|f| InFlightWatermarks {
        conserve_at: f.conserve_at,
        stop_at: f.stop_at,
        resume_below: f.resume_below,
        resume_after_stable_seconds: f.resume_after_stable_seconds,
    });
    gateway.breakers.clone_from(&profile.spec.breakers);
    gateway.concurrency.clone_from(&profile.spec.concurrency);
    gateway.long_context = long_context(profile, policy, level);
    gateway
}

/// A warning for each level of `policy` whose `limitLongContext` has no
/// long-context limit of `profile` to hold lower.
pub fn long_context_without_limit(
    policy: &DegradationPolicy,
    profile: &CapacityProfile,
) -> Vec<Warning> {
    if profile.spec.long_context.is_some() {
        return Vec::new();
    }
    let key = policy.key();
    policy
        .spec
        .levels
        .iter()
        .enumerate()
        .filter(|(_, l)| l.actions.limit_long_context.is_some())
        .map(|(i, l)| Warning::LimitLongContextWithoutLimit {
            policy: key.clone(),
            level: i + 1,
            level_name: l.name.clone(),
        })
        .collect()
}

/// The profile's long-context limit, held to the lowest `limitLongContext`
/// of levels 1..=`level` (nothing to hold without the profile's limit).
fn long_context(
    profile: &CapacityProfile,
    policy: Option<&DegradationPolicy>,
    level: u32,
) -> Option<crate::api::LongContextSpec> {
    let mut limit = profile.spec.long_context.clone()?;
    let level_limit = policy.and_then(|p| {
        p.spec
            .levels
            .iter()
            .take(level as usize)
            .filter_map(|l| l.actions.limit_long_context)
            .min()
    });
    if let Some(n) = level_limit {
        limit.max_concurrency = limit.max_concurrency.min(n.max(1));
    }
    Some(limit)
}
