//! The decision engine's state as the CapacityProfile status stores it, and
//! the reasons a pod is drained, undrained or left alone.
//!
//! These are API types: status carries them across restarts and leader
//! changes, so their serialized form is part of the contract. The engine
//! (`crate::policy`) reads and writes them; it never defines what status
//! stores.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::objective::Band;

/// A lane's error-budget band as the engine remembers it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LaneBand {
    /// The band.
    pub band: Band,
    /// When the lane entered it (Unix seconds live, the timeline's clock in
    /// `plan`).
    pub since: i64,
}

/// State the engine carries between evaluations of one profile. Everything
/// the hysteresis needs is here, so it can be stored in status and read back
/// after a restart.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProfileState {
    /// Current level.
    #[serde(default)]
    pub level: u32,
    /// When the current level was entered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level_since: Option<i64>,
    /// When the current level's exit condition began to hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_since: Option<i64>,
    /// For levels that need approval: since when their trigger has held.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "level_keys"
    )]
    // Level numbers are map keys, so JSON strings: a plain string-keyed map
    // in the schema (the API server refuses schemars' patternProperties).
    #[schemars(with = "BTreeMap<String, i64>")]
    pub gate_since: BTreeMap<u32, i64>,
    /// Last desired replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,
    /// Since when demand has wanted fewer replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down_since: Option<i64>,
    /// The highest replica count wanted during the scale-down window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down_want: Option<i32>,
    /// Drained pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub drained: BTreeMap<String, DrainedPod>,
    /// The last known capacity, held while telemetry is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_capacity: Option<f64>,
    /// Per level: since when its enter trigger has held on known data (the
    /// `forSeconds` clock).
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "level_keys"
    )]
    #[schemars(with = "BTreeMap<String, i64>")]
    pub trigger_since: BTreeMap<u32, i64>,
    /// When the current episode (leaving level 0 until returning to it)
    /// began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub episode_since: Option<i64>,
    /// Whether the episode has made its first step down (the cool-down
    /// applies to the first one only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stepped_down: bool,
    /// Per lane: the admitted work units/s of the last evaluation (nothing
    /// rises above it on unknown data; a ramp starts from it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub admitted: BTreeMap<String, f64>,
    /// Per lane: the last known original requests/s (a lane whose rate is
    /// unknown holds it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lane_rates: BTreeMap<String, f64>,
    /// Per lane released by a step down: its staged recovery.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ramps: BTreeMap<String, Ramp>,
    /// The approval last used to enter a level (it approves nothing more).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_used: Option<Approval>,
    /// Per lane with an objective: its error-budget band and since when (an
    /// Unknown budget never relaxes it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub objectives: BTreeMap<String, LaneBand>,
}

/// A released lane's staged recovery.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ramp {
    /// When the lane was released (the ramp's start), moved on by the time
    /// the evidence was Unknown since.
    pub since: i64,
    /// Its admitted work units/s before the release.
    pub base: f64,
    /// Since when the evidence has been Unknown (capacity or a lane's rate),
    /// while it is: the ramp stays at its stage of that moment, and `since`
    /// moves on by that time once the evidence is back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blind_since: Option<i64>,
}

/// An approval: levels up to `level`, given at `givenAt` (absent: given
/// before anything was evaluated; it does not lapse).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Approval {
    /// The highest level approved.
    pub level: u32,
    /// When it was given (seconds, the evaluation clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub given_at: Option<i64>,
}

impl From<u32> for Approval {
    fn from(level: u32) -> Self {
        Approval {
            level,
            given_at: None,
        }
    }
}

/// A drained pod as the engine remembers it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainedPod {
    /// When it was drained.
    pub since: i64,
    /// Why.
    pub reason: DrainReason,
    /// Since when it has looked healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_since: Option<i64>,
}

/// A level number as a map key: JSON object keys are strings ("4"), and not
/// every deserializer turns them into integers (kube's `DeserializeGuard`
/// buffers the object first, after which `"4"` no longer reads as a `u32`),
/// so accept both forms.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct LevelKey(u32);

impl<'de> Deserialize<'de> for LevelKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = LevelKey;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a level number")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<LevelKey, E> {
                u32::try_from(v).map(LevelKey).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<LevelKey, E> {
                u32::try_from(v).map(LevelKey).map_err(E::custom)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<LevelKey, E> {
                v.trim().parse().map(LevelKey).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

fn level_keys<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<u32, i64>, D::Error> {
    let m = BTreeMap::<LevelKey, i64>::deserialize(d)?;
    Ok(m.into_iter().map(|(k, v)| (k.0, v)).collect())
}

/// Why a pod is drained, undrained or left as it is. Typed from the engine to
/// the edge; rendered to text only where a person reads it (the pod's
/// `lanekeeper.dev/drain-reason` annotation, status, events, `plan`). The text
/// of each variant starts with its [code](DrainReason::code).
#[derive(Clone, Debug, PartialEq)]
pub enum DrainReason {
    /// Someone asked for the drain with the `lanekeeper.dev/drain-request`
    /// annotation.
    Requested,
    /// The pod's error ratio is above the profile's threshold.
    ErrorRatio {
        /// The pod's error ratio.
        ratio: f64,
        /// `drain.errorRatioAbove`.
        threshold: f64,
    },
    /// The pod carries the drain label but no reason lanekeeper wrote.
    LabelledByHand,
    /// The drain request was withdrawn and nothing says the pod is bad.
    RequestWithdrawn,
    /// The profile no longer has a drain section.
    Disabled,
    /// The pod looked healthy for long enough to serve again.
    Healthy {
        /// `drain.errorRatioAbove`.
        threshold: f64,
        /// How long it has looked healthy.
        seconds: i64,
    },
    /// Fewer pods may be drained than are (pods left, readiness dropped).
    OverBound {
        /// The bound now.
        bound: u32,
    },
    /// A candidate the bound does not allow.
    BudgetExhausted {
        /// Pods drained.
        drained: u32,
        /// The bound.
        bound: u32,
    },
    /// No new drains while telemetry is unknown or the pool scales down.
    Held,
    /// No new drain while the pool's workload rolls out a new revision.
    RolloutInProgress,
    /// A drained pod made from an older revision than the pool's current
    /// one: kept drained until the rollout replaces it, never undrained.
    OutdatedRevision,
    /// A pod that is not ready is never labelled.
    NotReady,
    /// The pod changed between the read and the write.
    Conflict,
    /// The policy is in observe mode: no pod is drained.
    Observe,
    /// An older CapacityProfile names the same workload and drains its
    /// pods: this profile drains none.
    ProfileTargetsWorkload,
    /// A reason lanekeeper does not recognise (an annotation edited by hand).
    Other(String),
}

impl DrainReason {
    /// The reason's code: a CamelCase word for metric labels and conditions.
    pub fn code(&self) -> &str {
        match self {
            DrainReason::Requested => "DrainRequested",
            DrainReason::ErrorRatio { .. } => "ErrorRatio",
            DrainReason::LabelledByHand => "DrainLabel",
            DrainReason::RequestWithdrawn => "DrainRequestWithdrawn",
            DrainReason::Disabled => "DrainDisabled",
            DrainReason::Healthy { .. } => "Healthy",
            DrainReason::OverBound { .. } => "OverBound",
            DrainReason::BudgetExhausted { .. } => "DrainBudgetExhausted",
            DrainReason::Held => "DrainHeld",
            DrainReason::RolloutInProgress => "RolloutInProgress",
            DrainReason::OutdatedRevision => "OutdatedRevision",
            DrainReason::NotReady => "NotReady",
            DrainReason::Conflict => "Conflict",
            DrainReason::Observe => "Observe",
            DrainReason::ProfileTargetsWorkload => "ProfileTargetsWorkload",
            DrainReason::Other(s) => s.split(':').next().unwrap_or(s),
        }
    }
}

impl fmt::Display for DrainReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DrainReason::Requested => {
                f.write_str("DrainRequested: annotation lanekeeper.dev/drain-request")
            }
            DrainReason::ErrorRatio { ratio, threshold } => {
                write!(f, "ErrorRatio: {ratio} > {threshold}")
            }
            DrainReason::LabelledByHand => f.write_str("DrainLabel: labelled by hand"),
            DrainReason::RequestWithdrawn => f.write_str("DrainRequestWithdrawn"),
            DrainReason::Disabled => f.write_str("DrainDisabled"),
            DrainReason::Healthy { threshold, seconds } => write!(
                f,
                "Healthy: error ratio at or below {threshold} for {seconds}s"
            ),
            DrainReason::OverBound { bound } => {
                write!(f, "OverBound: at most {bound} pods may be drained")
            }
            DrainReason::BudgetExhausted { drained, bound } => {
                write!(f, "DrainBudgetExhausted: {drained} of {bound} drained")
            }
            DrainReason::Held => f.write_str("DrainHeld: telemetry unknown or pool scaling down"),
            DrainReason::RolloutInProgress => {
                f.write_str("RolloutInProgress: no new drain while the pool rolls out a new revision")
            }
            DrainReason::OutdatedRevision => f.write_str(
                "OutdatedRevision: from an older revision than the pool's; stays drained until replaced",
            ),
            DrainReason::NotReady => {
                f.write_str("NotReady: a pod that is not ready is never labelled")
            }
            DrainReason::Conflict => {
                f.write_str("Conflict: the pod changed while draining; re-evaluated next time")
            }
            DrainReason::Observe => {
                f.write_str("Observe: the policy is in observe mode; no pod is drained")
            }
            DrainReason::ProfileTargetsWorkload => f.write_str(
                "ProfileTargetsWorkload: an older CapacityProfile acts on the workload; this one drains no pod",
            ),
            DrainReason::Other(s) => f.write_str(s),
        }
    }
}

impl FromStr for DrainReason {
    type Err = std::convert::Infallible;

    /// Reads a reason back from its text (an annotation, a stored status).
    /// Every text [`Display`](fmt::Display) writes reads back to the same
    /// value; anything else is [`DrainReason::Other`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fixed = [
            DrainReason::Requested,
            DrainReason::LabelledByHand,
            DrainReason::RequestWithdrawn,
            DrainReason::Disabled,
            DrainReason::Held,
            DrainReason::RolloutInProgress,
            DrainReason::OutdatedRevision,
            DrainReason::NotReady,
            DrainReason::Conflict,
            DrainReason::Observe,
            DrainReason::ProfileTargetsWorkload,
        ];
        if let Some(r) = fixed.into_iter().find(|r| r.to_string() == s) {
            return Ok(r);
        }
        let parsed = if let Some(rest) = s.strip_prefix("ErrorRatio: ") {
            rest.split_once(" > ").and_then(|(r, t)| {
                Some(DrainReason::ErrorRatio {
                    ratio: r.parse().ok()?,
                    threshold: t.parse().ok()?,
                })
            })
        } else if let Some(rest) = s.strip_prefix("Healthy: error ratio at or below ") {
            rest.split_once(" for ").and_then(|(t, secs)| {
                Some(DrainReason::Healthy {
                    threshold: t.parse().ok()?,
                    seconds: secs.strip_suffix('s')?.parse().ok()?,
                })
            })
        } else if let Some(rest) = s.strip_prefix("OverBound: at most ") {
            rest.strip_suffix(" pods may be drained")
                .and_then(|b| b.parse().ok())
                .map(|bound| DrainReason::OverBound { bound })
        } else if let Some(rest) = s.strip_prefix("DrainBudgetExhausted: ") {
            rest.strip_suffix(" drained")
                .and_then(|r| r.split_once(" of "))
                .and_then(|(d, b)| {
                    Some(DrainReason::BudgetExhausted {
                        drained: d.parse().ok()?,
                        bound: b.parse().ok()?,
                    })
                })
        } else {
            None
        };
        Ok(parsed.unwrap_or_else(|| DrainReason::Other(s.to_owned())))
    }
}

impl From<&str> for DrainReason {
    fn from(s: &str) -> Self {
        s.parse()
            .unwrap_or_else(|e: std::convert::Infallible| match e {})
    }
}

impl Serialize for DrainReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DrainReason {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(DrainReason::from(String::deserialize(d)?.as_str()))
    }
}

impl schemars::JsonSchema for DrainReason {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "DrainReason".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        String::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::DrainReason;

    #[test]
    fn every_reason_reads_back_from_its_text() {
        let all = [
            DrainReason::Requested,
            DrainReason::ErrorRatio {
                ratio: 0.35,
                threshold: 0.2,
            },
            DrainReason::LabelledByHand,
            DrainReason::RequestWithdrawn,
            DrainReason::Disabled,
            DrainReason::Healthy {
                threshold: 0.2,
                seconds: 120,
            },
            DrainReason::OverBound { bound: 2 },
            DrainReason::BudgetExhausted {
                drained: 2,
                bound: 2,
            },
            DrainReason::Held,
            DrainReason::RolloutInProgress,
            DrainReason::OutdatedRevision,
            DrainReason::NotReady,
            DrainReason::Conflict,
            DrainReason::Observe,
            DrainReason::ProfileTargetsWorkload,
            DrainReason::Other("drained by the on-call: bad GPU".into()),
        ];
        for r in all {
            let text = r.to_string();
            assert!(
                text.starts_with(r.code()),
                "{text} starts with {}",
                r.code()
            );
            assert_eq!(text.parse::<DrainReason>().unwrap(), r, "{text}");
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<DrainReason>(&json).unwrap(), r);
        }
    }

    #[test]
    fn unrecognised_text_is_kept_verbatim() {
        let r: DrainReason = "ErrorRatio: lots".parse().unwrap();
        assert_eq!(r, DrainReason::Other("ErrorRatio: lots".into()));
        assert_eq!(r.code(), "ErrorRatio");
        assert_eq!(r.to_string(), "ErrorRatio: lots");
    }
}
