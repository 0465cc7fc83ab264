//! `DegradationPolicy`: the ordered ladder of degradation levels.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::common::Decimal;
use crate::snapshot::BurnWindow;

/// The ordered ladder of degradation levels of one CapacityProfile: when each
/// level is entered, what it does, and how the way back down is governed.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "lanekeeper.dev",
    version = "v1alpha1",
    kind = "DegradationPolicy",
    namespaced,
    doc = "A DegradationPolicy is the ordered ladder of degradation levels of one pool: triggers, actions, approvals, and the hysteresis of the way back down.",
    status = "DegradationPolicyStatus",
    shortname = "degpol",
    category = "lanekeeper",
    printcolumn = r#"{"name":"Profile","type":"string","jsonPath":".spec.profile","description":"CapacityProfile the ladder governs"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode","description":"Enforce or Observe"}"#,
    printcolumn = r#"{"name":"Level","type":"integer","jsonPath":".status.level","description":"Current level (0 = normal)"}"#,
    printcolumn = r#"{"name":"Name","type":"string","jsonPath":".status.levelName","description":"Current level name"}"#,
    printcolumn = r#"{"name":"Pending","type":"integer","jsonPath":".status.pendingApprovalLevel","description":"Level waiting for approval"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.levels.all(a, self.levels.exists_one(b, b.name == a.name))").message("level names must be unique").field_path(".levels"))]
#[x_kube(validation = Rule::new("self.onMissingTelemetry != 'EnterLevel' || (has(self.missingTelemetryLevel) && self.missingTelemetryLevel <= size(self.levels))").message("onMissingTelemetry EnterLevel requires missingTelemetryLevel within 1..number of levels").field_path(".missingTelemetryLevel"))]
pub struct DegradationPolicySpec {
    /// Name of the CapacityProfile (same namespace) this ladder governs. At
    /// most one DegradationPolicy may name a profile.
    #[x_kube(validation = Rule::new("self != ''").message("profile must not be empty"))]
    pub profile: String,
    /// `Enforce` (default) acts; `Observe` computes and reports everything but
    /// changes no replicas and no admitted rates that gateways read (shadow
    /// mode).
    #[serde(default)]
    pub mode: PolicyMode,
    /// How the ladder steps back down.
    #[serde(default)]
    pub hysteresis: HysteresisSpec,
    /// What happens while the profile's telemetry is unknown: `Hold` (default)
    /// keeps the current level and never steps down; `EnterLevel` goes at least
    /// to `missingTelemetryLevel` (never down).
    #[serde(default)]
    pub on_missing_telemetry: MissingTelemetry,
    /// For `onMissingTelemetry: EnterLevel`: the level (1-based) to hold at
    /// least while telemetry is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("missingTelemetryLevel must be >= 1"))]
    pub missing_telemetry_level: Option<i32>,
    /// The levels, in order: the first entry is level 1. Level 0 is normal
    /// operation and is implicit.
    #[schemars(length(min = 1, max = 16))]
    pub levels: Vec<LevelSpec>,
}

/// Enforce or observe.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum PolicyMode {
    /// Act on decisions.
    #[default]
    Enforce,
    /// Only compute and report (shadow mode).
    Observe,
}

/// Unknown-telemetry behaviour.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum MissingTelemetry {
    /// Keep the current level; no step up, no step down.
    #[default]
    Hold,
    /// Go at least to `missingTelemetryLevel`; never step down.
    EnterLevel,
}

/// Hysteresis of the way down.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HysteresisSpec {
    /// How long a level's exit condition must hold continuously before the
    /// ladder steps down one level, in seconds. The window restarts after each
    /// step down.
    #[serde(default = "default_stable_for")]
    #[x_kube(validation = Rule::new("self >= 0").message("stableForSeconds must be >= 0"))]
    pub stable_for_seconds: i64,
    /// Cool-down that grows with the incident. An episode runs from leaving
    /// level 0 to returning to it. Its first step down waits
    /// max(`stableForSeconds`, `cooldownFactor` × D) after the current level's
    /// exit condition began to hold, where D is the time from the episode's
    /// start to that moment; later steps down wait `stableForSeconds`.
    /// `"2"` is "twice the time spent degraded". Default `"0"` (off).
    #[serde(default = "default_cooldown_factor")]
    #[x_kube(validation = Rule::new("quantity(self).compareTo(quantity('100')) <= 0").message("cooldownFactor must be within 0..100"))]
    pub cooldown_factor: Decimal,
    /// Staged recovery: a lane released by a step down (a pause lifted, a cap
    /// removed or raised) regains what it was denied in stages instead of at
    /// once. Absent: released lanes get their full rate at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoverySpec>,
}

/// Staged recovery of released lanes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.stepsPercent.all(p, p >= 1 && p <= 100)").message("stepsPercent must be within 1..100").field_path(".stepsPercent"))]
#[x_kube(validation = Rule::new("size(self.stepsPercent) < 2 || self.stepsPercent.all(p, self.stepsPercent.filter(q, q == p).size() == 1)").message("stepsPercent must not repeat a value").field_path(".stepsPercent"))]
// The index list covers the ten items `stepsPercent` may hold (maxItems 10).
#[x_kube(validation = Rule::new("[0, 1, 2, 3, 4, 5, 6, 7, 8].all(i, i + 1 >= size(self.stepsPercent) || self.stepsPercent[i] < self.stepsPercent[i + 1])").message("stepsPercent must increase: each stage larger than the one before").field_path(".stepsPercent"))]
pub struct RecoverySpec {
    /// The stages, in percent of the amount released: for `stepSeconds` a
    /// released lane may exceed its pre-release rate by only the first
    /// percentage of what it regains, then the next, then all of it.
    /// Strictly increasing (applied in the order written), e.g. `[1, 10]`.
    #[schemars(length(min = 1, max = 10))]
    pub steps_percent: Vec<i32>,
    /// How long each stage lasts, in seconds.
    #[x_kube(validation = Rule::new("self >= 1").message("stepSeconds must be >= 1"))]
    pub step_seconds: i64,
}

impl Default for HysteresisSpec {
    fn default() -> Self {
        Self {
            stable_for_seconds: default_stable_for(),
            cooldown_factor: default_cooldown_factor(),
            recovery: None,
        }
    }
}

fn default_cooldown_factor() -> Decimal {
    Decimal::parse("0").expect("0 is a decimal")
}

fn default_stable_for() -> i64 {
    300
}

/// One level of the ladder.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.actions) || !((has(self.actions.readOnly) && self.actions.readOnly) || (has(self.actions.staticFallback) && self.actions.staticFallback)) || !has(self.approval) || self.approval.mode == 'Manual' || (has(self.approval.allowUnattended) && self.approval.allowUnattended)").message("a level that sets readOnly or staticFallback needs approval mode Manual (a person confirms what users will see), unless approval.allowUnattended is true").field_path(".approval"))]
pub struct LevelSpec {
    /// Name of the level, unique within the policy (shown in status and
    /// events).
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Triggers, any one of which enters the level.
    pub enter_when: EnterWhen,
    /// Conditions that must all hold (besides no enter trigger holding) for the
    /// stable window before the level is left. Without it the level is left
    /// when no enter trigger has held for the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_when: Option<ExitWhen>,
    /// What the level does. Actions of all levels up to the current one apply.
    #[serde(default)]
    pub actions: Actions,
    /// Whether entering the level needs a human's approval. Omitted: `Manual`
    /// for a level whose actions set `readOnly` or `staticFallback` (users
    /// see those), `Automatic` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalSpec>,
}

impl LevelSpec {
    /// Whether the level changes what users see (read-only, static fallback).
    pub fn user_visible(&self) -> bool {
        self.actions.read_only || self.actions.static_fallback
    }

    /// The approval mode in force: the given one, else `Manual` for a
    /// user-visible level and `Automatic` otherwise.
    pub fn approval_mode(&self) -> ApprovalMode {
        match &self.approval {
            Some(a) => a.mode,
            None if self.user_visible() => ApprovalMode::Manual,
            None => ApprovalMode::Automatic,
        }
    }

    /// How long an approval of this level stays valid after it was given, in
    /// seconds.
    pub fn approval_valid_for(&self) -> i64 {
        self.approval
            .as_ref()
            .map_or(DEFAULT_APPROVAL_VALID_FOR, |a| a.valid_for_seconds)
    }
}

/// An approval lapses this long after it was given unless the level says
/// otherwise.
pub const DEFAULT_APPROVAL_VALID_FOR: i64 = 3600;

/// Enter triggers (alternatives). A trigger whose signal is unknown does not
/// hold.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.utilizationPercentAbove) || has(self.inFlightAbove) || (has(self.overCapacity) && self.overCapacity) || has(self.queueDepthAbove) || has(self.p95LatencySecondsAbove) || has(self.errorRatioAbove) || has(self.retryAmplificationAbove) || has(self.burnRateAbove) || has(self.kvCacheUsageAbove)").message("enterWhen needs at least one trigger"))]
pub struct EnterWhen {
    /// How long the triggers must hold (any of them, at every evaluation, on
    /// known data) before the level is entered, in seconds, counted from the
    /// first evaluation where one held. A step with unknown data restarts the
    /// count. For a `Confirm` level the approval timeout starts after this.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[x_kube(validation = Rule::new("self >= 0").message("forSeconds must be >= 0"))]
    pub for_seconds: i64,
    /// Holds when demand ÷ capacity, in percent, is above this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 100").message("utilizationPercentAbove must be within 0..100"))]
    pub utilization_percent_above: Option<i32>,
    /// Holds when the pool's requests in flight are above this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("inFlightAbove must be >= 0"))]
    pub in_flight_above: Option<i64>,
    /// Holds when total demand, after the caps and pauses of all lower levels,
    /// exceeds capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over_capacity: Option<bool>,
    /// Holds when the pool's queue depth is above this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("queueDepthAbove must be >= 0"))]
    pub queue_depth_above: Option<i64>,
    /// Holds when the pool's p95 latency in seconds is above this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_latency_seconds_above: Option<Decimal>,
    /// Holds when the pool's error ratio (0..1) is above this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("quantity(self).compareTo(quantity('1')) <= 0").message("errorRatioAbove must be within 0..1"))]
    pub error_ratio_above: Option<Decimal>,
    /// Holds when the profile's retry amplification (all attempts ÷ original
    /// requests, over every lane with a known rate) is above this, e.g.
    /// `"1.25"`: a retry storm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("quantity(self).compareTo(quantity('1')) >= 0").message("retryAmplificationAbove must be >= 1"))]
    pub retry_amplification_above: Option<Decimal>,
    /// Holds when one of the listed lanes burns its error budget faster
    /// than `factor` over every listed window, e.g. `{lanes: [p0], factor:
    /// "14.4", windows: ["1h", "5m"]}`: a fast burn climbs the ladder before
    /// the objective has failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burn_rate_above: Option<BurnRateAbove>,
    /// Holds when the pool's KV-cache usage, in percent (0..100; vLLM's
    /// `kv_cache_usage_perc` × 100), is above this. Unlike the other pool
    /// triggers it is Unknown whenever the signal is missing, even when no
    /// source was configured for it: a KV-cache trigger without KV-cache
    /// evidence pins the level instead of passing silently.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 100").message("kvCacheUsageAbove must be within 0..100"))]
    pub kv_cache_usage_above: Option<i32>,
}

/// A burn-rate trigger: lanes, a factor and the windows that must all be
/// above it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BurnRateAbove {
    /// LaneContracts (same namespace and profile, with an objective) whose
    /// burn rates are watched; any one of them can hold the trigger.
    #[x_kube(validation = Rule::new("size(self) >= 1").message("burnRateAbove.lanes must name at least one lane"))]
    pub lanes: Vec<String>,
    /// The burn-rate factor (1: the budget lasts exactly the objective's
    /// window; 14.4: 2 % of a 30-day budget in an hour).
    #[x_kube(validation = Rule::new("quantity(self).isGreaterThan(quantity('0'))").message("burnRateAbove.factor must be greater than 0"))]
    pub factor: Decimal,
    /// The windows (`5m`, `30m`, `1h`, `6h`) that must all be above the
    /// factor: a long one so that it is real, a short one so that it is
    /// still going on.
    #[x_kube(validation = Rule::new("size(self) >= 1").message("burnRateAbove.windows must name at least one window"))]
    pub windows: Vec<BurnWindow>,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// Exit conditions (all must hold). A condition whose signal is unknown does
/// not hold.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ExitWhen {
    /// Holds when demand ÷ capacity, in percent, is below this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 100").message("utilizationPercentBelow must be within 0..100"))]
    pub utilization_percent_below: Option<i32>,
    /// Holds when the pool's requests in flight are below this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("inFlightBelow must be >= 0"))]
    pub in_flight_below: Option<i64>,
    /// Holds when the pool's queue depth is below this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("queueDepthBelow must be >= 0"))]
    pub queue_depth_below: Option<i64>,
    /// Holds when the pool's p95 latency in seconds is below this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_latency_seconds_below: Option<Decimal>,
    /// Holds when the pool's error ratio (0..1) is below this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("quantity(self).compareTo(quantity('1')) <= 0").message("errorRatioBelow must be within 0..1"))]
    pub error_ratio_below: Option<Decimal>,
    /// Holds when the pool's KV-cache usage, in percent, is below this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 100").message("kvCacheUsageBelow must be within 0..100"))]
    pub kv_cache_usage_below: Option<i32>,
}

/// What a level does.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Actions {
    /// Gateways reject optional long context (lanes send their degraded
    /// history).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reject_optional_context: bool,
    /// Gateways use the lanes' approved fallback routes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub use_fallback_routes: bool,
    /// The service goes read-only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// Gateways answer from a static fallback.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub static_fallback: bool,
    /// Lanes to pause (only lanes with `shedding.mode: Pause` are paused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pause: Vec<LaneSelector>,
    /// Lanes to cap at a rate (`Never` lanes are not capped; `Defer` lanes not
    /// below their `minUnitsPerSecond`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cap: Vec<CapAction>,
    /// Lanes whose answers are held to at most this many output tokens
    /// (the "shorter answers" rung): the gateway lowers a request's
    /// `max_tokens` to it, or sets it, like the lane's
    /// `tokens.maxOutputTokens` (the lower of the two applies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cap_output_tokens: Vec<super::tokens::CapOutputTokensAction>,
    /// Holds the pool's long-context limit to at most this many long
    /// requests in flight (the lower of it and the profile's
    /// `longContext.maxConcurrency`; the lowest of the levels in force
    /// applies): under KV-cache pressure fewer long prompts hold the cache.
    /// Needs the profile's `spec.longContext` (it says which requests are
    /// long); without it the action does nothing and `plan` says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("limitLongContext must be >= 1"))]
    pub limit_long_context: Option<i64>,
}

/// Selects lanes by priority or by name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.priorityAtLeast) || (has(self.lanes) && size(self.lanes) > 0)").message("a lane selector needs priorityAtLeast or lanes"))]
pub struct LaneSelector {
    /// Selects lanes whose priority number is at least this (less critical).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("priorityAtLeast must be >= 0"))]
    pub priority_at_least: Option<i32>,
    /// Selects lanes by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<String>,
}

/// Caps the selected lanes at a rate.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.priorityAtLeast) || (has(self.lanes) && size(self.lanes) > 0)").message("a cap needs priorityAtLeast or lanes"))]
pub struct CapAction {
    /// Selects lanes whose priority number is at least this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("priorityAtLeast must be >= 0"))]
    pub priority_at_least: Option<i32>,
    /// Selects lanes by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<String>,
    /// The cap, in work units per second, for each selected lane.
    pub units_per_second: Decimal,
}

/// Approval of a level.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.mode != 'Confirm' || (has(self.timeoutSeconds) && self.timeoutSeconds > 0)").message("approval mode Confirm needs timeoutSeconds > 0").field_path(".timeoutSeconds"))]
pub struct ApprovalSpec {
    /// `Automatic` (default) enters at once; `Confirm` waits for approval but
    /// enters by itself once the trigger has held for `timeoutSeconds`;
    /// `Manual` waits for approval only. Approve with the annotation
    /// `lanekeeper.dev/approve-level: "<n>"` on the policy.
    #[serde(default)]
    pub mode: ApprovalMode,
    /// For `Confirm`: how long the trigger must hold before the level is
    /// entered without approval, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i64>,
    /// For a level that sets `readOnly` or `staticFallback`: `true` allows
    /// `Automatic` or `Confirm`, saying someone chose on purpose to let it
    /// enter without a person's confirmation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_unattended: bool,
    /// How long an approval stays valid after it was given, in seconds
    /// (default 3600). A lapsed approval approves nothing (an event says so);
    /// an approval is consumed when it is used to enter a level.
    #[serde(default = "default_valid_for")]
    #[x_kube(validation = Rule::new("self >= 1").message("validForSeconds must be >= 1"))]
    pub valid_for_seconds: i64,
}

fn default_valid_for() -> i64 {
    DEFAULT_APPROVAL_VALID_FOR
}

/// Approval mode.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum ApprovalMode {
    /// Enter at once.
    #[default]
    Automatic,
    /// Wait for approval, or for the trigger to hold for the timeout.
    Confirm,
    /// Wait for approval only.
    Manual,
}

/// Observed state of a DegradationPolicy.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DegradationPolicyStatus {
    /// The generation of the spec this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Current level (0 = normal).
    #[serde(default)]
    pub level: u32,
    /// Name of the current level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level_name: Option<String>,
    /// When the current level was entered (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// When the current level's exit condition began to hold (RFC 3339);
    /// absent while it does not hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_holding_since: Option<String>,
    /// A level whose trigger holds but which waits for approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_approval_level: Option<u32>,
    /// The highest level approved by annotation, until it is consumed (used
    /// to enter a level) or lapses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_level: Option<u32>,
    /// When the controller first saw the approval (RFC 3339): it lapses the
    /// approved level's `approval.validForSeconds` later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_at: Option<String>,
    /// The last transitions, newest last (at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transitions: Vec<Transition>,
    /// Conditions: `Valid`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One level transition.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Transition {
    /// When it happened (RFC 3339).
    pub at: String,
    /// Level before.
    pub from: u32,
    /// Level after.
    pub to: u32,
    /// Why (the trigger, or the exit condition that held).
    pub reason: String,
}
