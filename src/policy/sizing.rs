//! Pool sizing: desired replicas from demand, scale up fast (bounded per
//! step), scale down only after a stable window and never while degraded or
//! blind.

use crate::api::CapacityProfile;

use super::decision::{ProfileState, Telemetry};

/// The sizing result.
#[derive(Debug, Default, PartialEq)]
pub struct Sizing {
    /// Desired replicas.
    pub desired: Option<i32>,
    /// Since when demand has wanted fewer replicas.
    pub scale_down_since: Option<i64>,
    /// Highest count wanted during that window.
    pub scale_down_want: Option<i32>,
}

/// What demand alone asks for: ceil(demand ÷ (unitsPerReplica × target
/// utilization)), clamped to [min, max].
pub fn recommended(profile: &CapacityProfile, demand: f64) -> i32 {
    let spec = &profile.spec;
    let per_replica = spec.capacity.units_per_replica.value()
        * f64::from(spec.capacity.warning_utilization_percent)
        / 100.0;
    let raw = if per_replica > 0.0 {
        // Round before ceil so 8.000000001 from float noise stays 8.
        let x = demand / per_replica;
        let r = (x * 1e9).round() / 1e9;
        r.ceil().min(f64::from(i32::MAX)) as i32
    } else {
        spec.replicas.max
    };
    let (min, max) = (spec.replicas.min, spec.replicas.max.max(spec.replicas.min));
    raw.clamp(min, max)
}

/// Limits an increase to `maxScaleUpStep` above the ready replicas (when
/// known). Never lowers below `floor` (the last desired value, or the
/// minimum): a drop in ready replicas is not a reason to shrink the pool.
fn limit_scale_up(profile: &CapacityProfile, want: i32, ready: Option<u32>, floor: i32) -> i32 {
    let Some(r) = ready else { return want };
    let step = i64::from(profile.spec.replicas.max_scale_up_step.max(1));
    let limit = (i64::from(r) + step).min(i64::from(i32::MAX)) as i32;
    want.min(limit.max(floor))
}

/// Desired replicas for this evaluation.
pub fn desired(
    profile: &CapacityProfile,
    demand: f64,
    ready: Option<u32>,
    level: u32,
    telemetry: Telemetry,
    at: i64,
    prev: &ProfileState,
) -> Sizing {
    if telemetry == Telemetry::Unknown {
        // Hold the last known value; no opinion if there never was one.
        return Sizing {
            desired: prev.desired_replicas,
            ..Default::default()
        };
    }
    let want = recommended(profile, demand);
    let Some(last) = prev.desired_replicas else {
        return Sizing {
            desired: Some(limit_scale_up(
                profile,
                want,
                ready,
                profile.spec.replicas.min,
            )),
            ..Default::default()
        };
    };
    if want >= last {
        return Sizing {
            desired: Some(limit_scale_up(profile, want, ready, last)),
            ..Default::default()
        };
    }
    if level > 0 {
        // Never scale down while degraded; the window restarts afterwards.
        return Sizing {
            desired: Some(last),
            ..Default::default()
        };
    }
    let since = prev.scale_down_since.unwrap_or(at);
    let peak = prev.scale_down_want.map_or(want, |w| w.max(want));
    if at - since >= profile.spec.replicas.scale_down_stabilization_seconds {
        Sizing {
            desired: Some(peak.min(last)),
            ..Default::default()
        }
    } else {
        Sizing {
            desired: Some(last),
            scale_down_since: Some(since),
            scale_down_want: Some(peak),
        }
    }
}
