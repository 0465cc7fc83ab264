//! What the engine decides, and the state it carries between evaluations.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Whether a profile's capacity could be had from telemetry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Telemetry {
    /// Capacity is known.
    Known,
    /// Capacity could not be had: hold.
    Unknown,
}

/// A lane's admission state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LaneState {
    /// Gets its whole demand.
    Admitted,
    /// Held to a level cap or its ceiling.
    Capped,
    /// Capacity ran out before its demand was met.
    Throttled,
    /// Paused by a level.
    Paused,
}

impl LaneState {
    /// The state's name as written in status and configs.
    pub fn as_str(self) -> &'static str {
        match self {
            LaneState::Admitted => "Admitted",
            LaneState::Capped => "Capped",
            LaneState::Throttled => "Throttled",
            LaneState::Paused => "Paused",
        }
    }
}

/// The decision for one profile in one evaluation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfileDecision {
    /// Namespace of the CapacityProfile.
    pub namespace: String,
    /// Name of the CapacityProfile.
    pub name: String,
    /// The governing DegradationPolicy (`namespace/name`), if any.
    pub policy: Option<String>,
    /// `Known` or `Unknown`.
    pub telemetry: Telemetry,
    /// Current level (0 = normal).
    pub level: u32,
    /// Name of the current level (`normal` at 0).
    pub level_name: String,
    /// A level whose trigger holds but waits for approval.
    pub pending_approval_level: Option<u32>,
    /// When the current level was entered (seconds, same clock as `at`).
    pub level_since: Option<i64>,
    /// When the current level's exit condition began to hold.
    pub exit_holding_since: Option<i64>,
    /// The transition made in this evaluation, if any.
    pub transition: Option<LevelTransition>,
    /// Which enter triggers held, per level (`level: reason`).
    pub triggers: Vec<String>,
    /// Capacity in work units/s (None while unknown).
    pub capacity_units_per_second: Option<f64>,
    /// Where the capacity came from.
    pub capacity_source: Option<String>,
    /// Total demand before shedding.
    pub demand_units_per_second: f64,
    /// Total admitted.
    pub admitted_units_per_second: f64,
    /// Demand ÷ capacity in percent.
    pub utilization_percent: Option<f64>,
    /// Ready replicas seen in the signals.
    pub ready_replicas: Option<u32>,
    /// Desired pool size (None when unknown and never known).
    pub desired_replicas: Option<i32>,
    /// Pods drained, undrained, kept drained or refused in this evaluation.
    pub drain: Vec<PodDrain>,
    /// Pods drained after this evaluation.
    pub drained_pods: u32,
    /// Most pods that may be drained at once now.
    pub drain_budget: u32,
    /// Problems worth a human's attention (contract overrides, overcommitted
    /// floors, ...).
    pub warnings: Vec<String>,
    /// Flags for the gateway.
    pub gateway: GatewayFlags,
    /// Per lane, in priority order then name.
    pub lanes: Vec<LaneDecision>,
}

/// A level change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LevelTransition {
    /// Level before.
    pub from: u32,
    /// Level after.
    pub to: u32,
    /// Why.
    pub reason: String,
}

/// Gateway-wide flags.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayFlags {
    /// Reject optional long context.
    pub reject_optional_context: bool,
    /// Use approved fallback routes.
    pub use_fallback_routes: bool,
    /// Read-only service.
    pub read_only: bool,
    /// Answer from a static fallback.
    pub static_fallback: bool,
    /// The profile's in-flight watermarks (per-request reflexes).
    pub in_flight: Option<InFlightWatermarks>,
}

/// In-flight watermarks passed through to the gateway.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InFlightWatermarks {
    /// Reject optional context at this many in flight.
    pub conserve_at: i64,
    /// Stop admitting sheddable lanes at this many in flight.
    pub stop_at: i64,
    /// Resume below this many in flight.
    pub resume_below: i64,
}

/// The decision for one lane.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaneDecision {
    /// Namespace of the LaneContract.
    pub namespace: String,
    /// Name of the LaneContract.
    pub name: String,
    /// Priority.
    pub priority: i32,
    /// Admission state.
    pub state: LaneState,
    /// Requests per second used for demand.
    pub requests_per_second: f64,
    /// Whether the rate came from telemetry (`Observed`) or the contract
    /// (`Expected`).
    pub demand_source: String,
    /// Demand in work units/s.
    pub demand_units_per_second: f64,
    /// Admitted work units/s (borrowed included).
    pub admitted_units_per_second: f64,
    /// Admitted requests/s (admitted units ÷ work units per request).
    pub admitted_requests_per_second: f64,
    /// Borrowed from other lanes' idle floors.
    pub borrowed_units_per_second: f64,
    /// Capacity reserved for the lane's floor.
    pub reserved_units_per_second: f64,
    /// The cap in force from a level, if any.
    pub level_cap_units_per_second: Option<f64>,
    /// What limits the lane when it is not `Admitted`: `level`, `ceiling`,
    /// `pause` or `capacity`.
    pub limited_by: Option<String>,
    /// Borrowing grants, with their expiry.
    pub borrowing: Vec<BorrowGrant>,
}

/// A borrowing grant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BorrowGrant {
    /// The lending lane.
    pub from: String,
    /// Work units/s granted.
    pub units_per_second: f64,
    /// When the grant lapses unless a newer decision renews it (same clock as
    /// `at`).
    pub expires_at: i64,
}

/// What happens to one pod.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodDrain {
    /// Pod name.
    pub pod: String,
    /// `Drain` (new), `Keep` (stays drained), `Undrain`, or `Refused` (a
    /// candidate the bound does not allow).
    pub action: DrainAction,
    /// The pod's error ratio, if known.
    pub error_ratio: Option<f64>,
    /// Why.
    pub reason: String,
}

/// Drain actions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DrainAction {
    /// Newly drained.
    Drain,
    /// Stays drained.
    Keep,
    /// Undrained.
    Undrain,
    /// A candidate that the bound (or a hold) does not allow.
    Refused,
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
}

/// A drained pod as the engine remembers it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainedPod {
    /// When it was drained.
    pub since: i64,
    /// Why.
    pub reason: String,
    /// Since when it has looked healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_since: Option<i64>,
}

/// State for every profile, keyed `namespace/name`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineState {
    /// Per profile.
    pub profiles: BTreeMap<String, ProfileState>,
}

/// The result of one evaluation over all profiles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Evaluation {
    /// The snapshot's time.
    pub at: i64,
    /// Per profile, by namespace then name.
    pub profiles: Vec<ProfileDecision>,
    /// Problems that belong to no single profile (unbound lanes, duplicate
    /// policies).
    pub warnings: Vec<String>,
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
