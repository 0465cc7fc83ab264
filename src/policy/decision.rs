//! What the engine decides, and the state it carries between evaluations.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::api::{Band, Decimal, SheddingMode};
pub use crate::api::{DrainReason, DrainedPod, ProfileState};
use crate::snapshot::BurnRates;
pub use crate::snapshot::CalibrationStale;

pub use super::bind::BindProblem;

/// Rounds to six decimals, for output (so 488.09999999999997 reads 488.1).
pub fn round6(v: f64) -> f64 {
    let r = (v * 1e6).round() / 1e6;
    if r == 0.0 { 0.0 } else { r }
}

/// Whether a profile's capacity could be had from telemetry, and a lane's
/// admission state: the types `lanes.json` carries, one meaning each.
pub use lanes::{LaneState, Telemetry};

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
    /// The approved level whose approval was used to enter a level now (it is
    /// consumed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_consumed: Option<u32>,
    /// The approved level whose approval lapsed (older than its
    /// `validForSeconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_lapsed: Option<u32>,
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
    /// The calibration no longer describes the pool (`PoolChanged` or
    /// `Expired`, from the signals); absent while valid or unchecked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration_stale: Option<CalibrationStale>,
    /// `onStaleCalibration: Hold` is in force: capacity derived from
    /// calibration numbers is Unknown in this step.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub calibration_held: bool,
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
    /// The bounded drain: what happens to each pod, how many are drained,
    /// the bound (as flat fields `drain`, `drainedPods`, `drainBudget`).
    #[serde(flatten)]
    pub drain: Drain,
    /// Problems worth a human's attention (contract overrides, overcommitted
    /// floors, ...).
    pub warnings: Vec<Warning>,
    /// Flags for the gateway.
    pub gateway: GatewayFlags,
    /// The change freeze of the profile's error budgets in this step: its
    /// state and the lanes that cause it with their bands (absent when no
    /// lane has an objective).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze: Option<Freeze>,
    /// Per lane, in priority order then name.
    pub lanes: Vec<LaneDecision>,
}

/// A profile's change freeze in one step (what `plan -o json` shows per
/// profile; `policy::freeze` decides it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Freeze {
    /// What is frozen: `Open`, `Rollouts` or `Everything`.
    pub state: crate::api::FreezeState,
    /// The worst band among the lanes with an objective (None: no lane has
    /// one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub band: Option<crate::api::Band>,
    /// The lanes in that band with their bands, in the decision's order.
    #[serde(default)]
    pub lanes: Vec<crate::api::FreezeLane>,
}

impl Freeze {
    /// The names of the lanes that cause it.
    pub fn lane_names(&self) -> Vec<String> {
        self.lanes.iter().map(|l| l.name.clone()).collect()
    }
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
    /// The profile's route breakers (absent: the gateway's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breakers: Option<crate::api::BreakersSpec>,
    /// The profile's model slots (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<crate::api::ConcurrencySpec>,
    /// The profile's long-context limit (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub long_context: Option<crate::api::LongContextSpec>,
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
    /// ... once the gateway's p95 latency has been stable this long
    /// (absent: the gateway's default, 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_after_stable_seconds: Option<i64>,
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
    /// Allocation state.
    pub state: LaneState,
    /// Requests per second used for demand.
    pub requests_per_second: f64,
    /// Where the rate came from: `Observed` (telemetry), `Held` (the
    /// source failed: the last known rate holds) or `Expected` (no source:
    /// the contract).
    pub demand_source: String,
    /// Attempts ÷ original requests, when retries are measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_amplification: Option<f64>,
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
    /// The error budget of the lane's objective (lanes with one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objective: Option<LaneObjective>,
    /// The P95 tokens and cost measured per request and the cost
    /// calibration (lanes with a `cost`, or with measurements).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<super::cost_calibration::LaneCostMeasured>,
}

/// A lane's error budget in one step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaneObjective {
    /// The band.
    pub band: Band,
    /// Percent of the budget left (absent: Unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_percent: Option<f64>,
    /// Burn rates by window (absent windows are Unknown).
    #[serde(default, skip_serializing_if = "BurnRates::is_empty")]
    pub burn_rate: BurnRates,
    /// When the lane entered the band (same clock as `at`).
    pub since: i64,
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

/// The bounded drain of one step: the one drain type from the engine's
/// decision through the controller's actuation (which returns it as carried
/// out) to status, events and `plan`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Drain {
    /// Pods drained, undrained, kept drained or refused in this step.
    #[serde(rename = "drain")]
    pub actions: Vec<PodDrain>,
    /// Pods drained after this step.
    pub drained_pods: u32,
    /// Most pods that may be drained at once now (the bound).
    pub drain_budget: u32,
}

impl Drain {
    /// The pods refused by the bound (`DrainBudgetExhausted`).
    pub fn refused_by_bound(&self) -> impl Iterator<Item = &PodDrain> {
        self.actions.iter().filter(|a| {
            a.action == DrainAction::Refused
                && matches!(a.reason, DrainReason::BudgetExhausted { .. })
        })
    }
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
    pub reason: DrainReason,
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
    pub warnings: Vec<BindProblem>,
}

/// A problem with one profile's decision worth a person's attention. Typed
/// from the engine; rendered to text (`Display`, and as a string in JSON) only
/// at the edge: conditions, events, `plan`.
#[derive(Clone, Debug, PartialEq)]
pub enum Warning {
    /// The lanes' floors add up to more than the capacity.
    Overcommitted {
        /// Sum of the floors, work units/s.
        floors: f64,
        /// Capacity, work units/s.
        capacity: f64,
    },
    /// A level action that a lane's contract forbids: not applied.
    ContractOverride(ContractOverride),
    /// A problem of the profile's binding (a duplicate policy).
    Binding(BindProblem),
    /// The profile's `inFlight` watermarks do not fit its pool.
    InFlight(InFlightProblem),
    /// A `burnRateAbove` trigger names a lane without an objective (or not a
    /// lane of the profile): it can never hold for that lane.
    BurnLaneWithoutObjective {
        /// The policy, `namespace/name`.
        policy: String,
        /// The level (1-based).
        level: usize,
        /// The level's name.
        level_name: String,
        /// The lane the trigger names.
        lane: String,
    },
    /// A level's `limitLongContext` on a profile without `spec.longContext`:
    /// nothing says which requests are long, so the action does nothing.
    LimitLongContextWithoutLimit {
        /// The policy, `namespace/name`.
        policy: String,
        /// The level (1-based).
        level: usize,
        /// The level's name.
        level_name: String,
    },
    /// A lane's measured P95 cost per request is more than 20 % above its
    /// `workUnitsPerRequest`: its demand is counted short.
    CostUnderestimated {
        /// The lane.
        lane: String,
        /// The measured P95 work units per request.
        measured: f64,
        /// Its `workUnitsPerRequest`.
        declared: f64,
    },
    /// A warning read back from text (JSON written by an older version).
    Text(String),
}

/// What is wrong with a profile's `inFlight` watermarks.
#[derive(Clone, Debug, PartialEq)]
pub enum InFlightProblem {
    /// `stopAt` is below what a full pool holds in flight (Little's law):
    /// the limit leaves capacity idle while work waits.
    StopAtBelowFullPool {
        /// `inFlight.stopAt`.
        stop_at: i64,
        /// Requests a full pool holds in flight (at least).
        full_pool: f64,
        /// The capacity it was computed from, units/s.
        capacity: f64,
    },
    /// `resumeBelow >= conserveAt`: conserve would be left as it is entered.
    ResumeAtOrAboveConserve {
        /// `inFlight.resumeBelow`.
        resume_below: i64,
        /// `inFlight.conserveAt`.
        conserve_at: i64,
    },
}

impl InFlightProblem {
    /// The CamelCase reason (the condition's and the event's).
    pub fn reason(&self) -> &'static str {
        match self {
            InFlightProblem::StopAtBelowFullPool { .. } => "StopAtBelowFullPool",
            InFlightProblem::ResumeAtOrAboveConserve { .. } => "ResumeAtOrAboveConserve",
        }
    }
}

impl std::fmt::Display for InFlightProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InFlightProblem::StopAtBelowFullPool {
                stop_at,
                full_pool,
                capacity,
            } => write!(
                f,
                "StopAtBelowFullPool: inFlight.stopAt {stop_at} is below the {full_pool} requests a full pool holds in flight (Little's law: capacity {capacity} units/s x the lanes' expectedServiceSeconds); the limit would leave capacity idle while work waits"
            ),
            InFlightProblem::ResumeAtOrAboveConserve {
                resume_below,
                conserve_at,
            } => write!(
                f,
                "ResumeAtOrAboveConserve: inFlight.resumeBelow {resume_below} is not below conserveAt {conserve_at}; conserve would end as soon as it starts"
            ),
        }
    }
}

/// A level action a lane contract overrides.
#[derive(Clone, Debug, PartialEq)]
pub struct ContractOverride {
    /// The policy, `namespace/name`.
    pub policy: String,
    /// The level (1-based).
    pub level: usize,
    /// The level's name.
    pub level_name: String,
    /// The lane.
    pub lane: String,
    /// What the level would do.
    pub action: OverriddenAction,
}

/// The action a contract refuses.
#[derive(Clone, Debug, PartialEq)]
pub enum OverriddenAction {
    /// Pause a lane whose shedding mode is not `Pause`.
    Pause {
        /// The lane's shedding mode.
        mode: SheddingMode,
    },
    /// Cap a lane whose mode is `Never`, or a `Defer` lane below its minimum.
    Cap {
        /// The cap.
        units: Decimal,
        /// The lane's `minUnitsPerSecond` when that is what refuses (`None`
        /// for a `Never` lane).
        below_min: Option<f64>,
    },
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Warning::Overcommitted { floors, capacity } => write!(
                f,
                "Overcommitted: lane floors add up to {floors} units/s, more than capacity {capacity}"
            ),
            Warning::ContractOverride(o) => {
                let ContractOverride {
                    policy,
                    level,
                    level_name,
                    lane,
                    action,
                } = o;
                match action {
                    OverriddenAction::Pause { mode } => write!(
                        f,
                        "policy {policy} level {level} ({level_name}) would pause lane {lane}, whose shedding mode is {mode:?}: not applied"
                    ),
                    OverriddenAction::Cap { units, below_min } => {
                        write!(
                            f,
                            "policy {policy} level {level} ({level_name}) would cap lane {lane} at {units} units/s, "
                        )?;
                        match below_min {
                            None => f.write_str("whose shedding mode is Never")?,
                            Some(min) => write!(f, "below its minUnitsPerSecond {min}")?,
                        }
                        f.write_str(": not applied")
                    }
                }
            }
            Warning::Binding(b) => b.fmt(f),
            Warning::InFlight(p) => p.fmt(f),
            Warning::BurnLaneWithoutObjective {
                policy,
                level,
                level_name,
                lane,
            } => write!(
                f,
                "policy {policy} level {level} ({level_name}): burnRateAbove names lane {lane}, which has no objective on this profile (the trigger never holds for it)"
            ),
            Warning::LimitLongContextWithoutLimit {
                policy,
                level,
                level_name,
            } => write!(
                f,
                "policy {policy} level {level} ({level_name}): limitLongContext, but the profile has no spec.longContext saying which requests are long (the action does nothing)"
            ),
            Warning::CostUnderestimated {
                lane,
                measured,
                declared,
            } => write!(
                f,
                "CostUnderestimated: lane {lane} costs {measured} work units a request at the P95, more than 20 % above its workUnitsPerRequest {declared} ({:+.0} %): its demand and admitted requests are counted short; raise workUnitsPerRequest or look for what made requests longer",
                (measured / declared - 1.0) * 100.0
            ),
            Warning::Text(t) => f.write_str(t),
        }
    }
}

impl Serialize for Warning {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Warning {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Warning::Text)
    }
}
