//! `LaneContract`: one traffic lane and what may be done to it under pressure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::common::Decimal;
use super::objective::{ObjectiveSpec, ObjectiveStatus};

/// One traffic lane on a pool: its priority, cost, guaranteed floor, ceiling,
/// deadline, queue, retry budget, routes, and what may be done to it under
/// pressure.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "lanekeeper.dev",
    version = "v1alpha1",
    kind = "LaneContract",
    namespaced,
    doc = "A LaneContract describes one traffic lane on a pool: priority, cost per request, floor, ceiling, deadline, queue, retry budget, routes, and what may be done to it under pressure.",
    status = "LaneContractStatus",
    shortname = "lane",
    category = "lanekeeper",
    printcolumn = r#"{"name":"Profile","type":"string","jsonPath":".spec.profile","description":"CapacityProfile the lane runs on"}"#,
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority","description":"0 is most critical"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state","description":"Admitted, Capped, Throttled or Paused"}"#,
    printcolumn = r#"{"name":"Demand","type":"number","jsonPath":".status.demandUnitsPerSecond","description":"Demand in work units/s"}"#,
    printcolumn = r#"{"name":"Admitted","type":"number","jsonPath":".status.admittedUnitsPerSecond","description":"Admitted work units/s"}"#,
    printcolumn = r#"{"name":"P95Cost","type":"number","jsonPath":".status.p95CostUnitsPerRequest","description":"Measured P95 work units a request costs (lanes with cost)","priority":1}"#,
    printcolumn = r#"{"name":"Budget","type":"string","jsonPath":".status.objective.band","description":"Error-budget band: Routine, Cautious, Restricted or Exhausted"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.floorUnitsPerSecond) || !has(self.ceilingUnitsPerSecond) || quantity(self.floorUnitsPerSecond).compareTo(quantity(self.ceilingUnitsPerSecond)) <= 0").message("floorUnitsPerSecond must be <= ceilingUnitsPerSecond").field_path(".floorUnitsPerSecond"))]
#[x_kube(validation = Rule::new("!has(self.borrowing) || self.checkpointable").message("borrowing requires checkpointable: true").field_path(".borrowing"))]
#[x_kube(validation = Rule::new("self.queue.ttlSeconds < self.deadlineSeconds").message("queue.ttlSeconds must be less than deadlineSeconds: a request that waits its whole TTL has no time left to be served").field_path(".queue.ttlSeconds"))]
#[x_kube(validation = Rule::new("!has(self.expectedServiceSeconds) || quantity(self.expectedServiceSeconds).asApproximateFloat() + double(self.queue.ttlSeconds) <= double(self.deadlineSeconds)").message("queue.ttlSeconds + expectedServiceSeconds must be <= deadlineSeconds").field_path(".expectedServiceSeconds"))]
pub struct LaneContractSpec {
    /// Name of the CapacityProfile (same namespace) this lane runs on.
    #[x_kube(validation = Rule::new("self != ''").message("profile must not be empty"))]
    pub profile: String,
    /// Priority, 0 being the most critical. Capacity is filled in strict
    /// priority order after floors; lanes of equal priority share by weight.
    #[x_kube(validation = Rule::new("self >= 0").message("priority must be >= 0"))]
    pub priority: i32,
    /// Share of capacity among lanes of equal priority.
    #[serde(default = "default_weight")]
    #[x_kube(validation = Rule::new("self >= 1").message("weight must be >= 1"))]
    pub weight: i32,
    /// Work units one request of this lane costs (the pool's capacity is
    /// measured in work units per second).
    #[x_kube(validation = Rule::new("quantity(self).isGreaterThan(quantity('0'))").message("workUnitsPerRequest must be greater than 0"))]
    pub work_units_per_request: Decimal,
    /// Requests per second assumed when no telemetry gives the lane's rate.
    pub expected_requests_per_second: Decimal,
    /// Work units per second reserved for this lane before any other lane is
    /// served (headroom for its bursts, even when its demand is lower).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_units_per_second: Option<Decimal>,
    /// Most work units per second the lane is ever admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling_units_per_second: Option<Decimal>,
    /// What may be done to this lane under pressure.
    #[serde(default)]
    pub shedding: SheddingSpec,
    /// The lane's work can be checkpointed and resumed (required to borrow).
    #[serde(default)]
    pub checkpointable: bool,
    /// Lease of another lane's idle floor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowing: Option<BorrowingSpec>,
    /// End-to-end deadline of one request, in seconds.
    #[x_kube(validation = Rule::new("self >= 1").message("deadlineSeconds must be >= 1"))]
    pub deadline_seconds: i64,
    /// The p95 time to serve one request of the lane once admitted, in
    /// seconds (a decimal). With it, a request must be able to wait its whole
    /// queue TTL and still be served in time: `queue.ttlSeconds +
    /// expectedServiceSeconds <= deadlineSeconds`. Without it, only
    /// `queue.ttlSeconds < deadlineSeconds` is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_service_seconds: Option<Decimal>,
    /// The gateway queue for this lane.
    pub queue: QueueSpec,
    /// Client retry limits and the retry budget the gateway enforces.
    pub retry: RetrySpec,
    /// Model routes the lane may use.
    pub routes: RoutesSpec,
    /// Optional long context that may be reduced under pressure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional_context: Option<OptionalContextSpec>,
    /// Who may send requests into the lane, each identity with the tenant
    /// it is counted as. The gateway refuses a request without an identity
    /// listed here (401, or 403 for an identity of other lanes), unless it
    /// runs with `--trust-lane-header`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<super::clients::LaneClient>,
    /// Limits per tenant inside the lane: a maximum of requests in flight
    /// per tenant and the tenants' weights in the lane's fair queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<super::tenants::LaneTenants>,
    /// The cost of a request counted in tokens (absent: every request costs
    /// `workUnitsPerRequest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<super::tokens::LaneCost>,
    /// Limits on a request's input and output tokens, enforced by the
    /// gateway before admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<super::tokens::LaneTokens>,
    /// The lane's objective over qualified outcomes, and with it an error
    /// budget (`lanekeeper rules` turns it into Prometheus rules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objective: Option<ObjectiveSpec>,
}

fn default_weight() -> i32 {
    1
}

/// What may be done to a lane under pressure.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.mode != 'Defer' || has(self.minUnitsPerSecond)").message("shedding.mode Defer requires minUnitsPerSecond").field_path(".minUnitsPerSecond"))]
pub struct SheddingSpec {
    /// `Never`: never paused nor capped (it keeps its floor); `Throttle`: may be
    /// capped, never paused; `Defer`: may be capped down to `minUnitsPerSecond`;
    /// `Pause`: may be paused.
    #[serde(default)]
    pub mode: SheddingMode,
    /// For `Defer`: the lowest rate a level may cap the lane to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_units_per_second: Option<Decimal>,
}

/// What may be done to a lane under pressure.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum SheddingMode {
    /// Never paused or capped.
    Never,
    /// May be capped, never paused.
    #[default]
    Throttle,
    /// May be capped down to `minUnitsPerSecond`.
    Defer,
    /// May be paused.
    Pause,
}

/// Borrowing of other lanes' idle floors.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BorrowingSpec {
    /// Lanes (same namespace and profile) whose idle floor may be borrowed, in
    /// order of preference.
    #[x_kube(validation = Rule::new("size(self) >= 1").message("borrowing.from must name at least one lane"))]
    pub from: Vec<String>,
    /// Most work units per second borrowed in total.
    pub max_units_per_second: Decimal,
    /// How long a grant stays valid without a newer decision, in seconds.
    #[serde(default = "default_lease")]
    #[x_kube(validation = Rule::new("self >= 1").message("leaseSeconds must be >= 1"))]
    pub lease_seconds: i64,
    /// How quickly the borrower must give the capacity back when the lender's
    /// demand rises, in seconds.
    #[serde(default = "default_release")]
    #[x_kube(validation = Rule::new("self >= 0").message("releaseWithinSeconds must be >= 0"))]
    pub release_within_seconds: i64,
}

fn default_lease() -> i64 {
    300
}
fn default_release() -> i64 {
    30
}

/// The gateway queue of a lane.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QueueSpec {
    /// Most requests waiting; more are rejected.
    #[x_kube(validation = Rule::new("self >= 0").message("maxDepth must be >= 0"))]
    pub max_depth: i64,
    /// How long a request may wait before it expires, in seconds.
    #[x_kube(validation = Rule::new("self >= 0").message("ttlSeconds must be >= 0"))]
    pub ttl_seconds: i64,
}

/// Retry limits.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RetrySpec {
    /// Most attempts per request, the first included.
    #[x_kube(validation = Rule::new("self >= 1").message("maxAttempts must be >= 1"))]
    pub max_attempts: i32,
    /// Retry budget: extra attempts ÷ original requests, in percent.
    #[serde(default = "default_budget")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 100").message("budgetPercent must be within 0..100"))]
    pub budget_percent: i32,
}

fn default_budget() -> i32 {
    5
}

/// Model routes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RoutesSpec {
    /// Routes used normally.
    #[x_kube(validation = Rule::new("size(self) >= 1").message("routes.primary must name at least one route"))]
    pub primary: Vec<String>,
    /// Pre-approved fallback routes, used only when a level says so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved_fallbacks: Vec<String>,
}

/// Optional long context.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.degradedHistoryTurns <= self.historyTurns").message("degradedHistoryTurns must be <= historyTurns"))]
pub struct OptionalContextSpec {
    /// Conversation turns sent normally.
    #[x_kube(validation = Rule::new("self >= 0").message("historyTurns must be >= 0"))]
    pub history_turns: i32,
    /// Conversation turns sent when a level rejects optional context.
    #[x_kube(validation = Rule::new("self >= 0").message("degradedHistoryTurns must be >= 0"))]
    pub degraded_history_turns: i32,
}

/// Observed state of a LaneContract.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LaneContractStatus {
    /// The generation of the spec this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Admitted`, `Capped`, `Throttled`, `Paused` or `Recovering`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Where the lane's rate came from: `Observed`, `Held` (its source failed:
    /// the last known rate holds) or `Expected` (no source: the contract).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demand_source: Option<String>,
    /// All attempts ÷ original requests, while retries are measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_amplification: Option<f64>,
    /// Demand in work units per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demand_units_per_second: Option<f64>,
    /// Admitted work units per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted_units_per_second: Option<f64>,
    /// Work units per second borrowed from other lanes' idle floors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowed_units_per_second: Option<f64>,
    /// The objective's error budget: band, remaining, burn rates (lanes with
    /// an objective).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objective: Option<ObjectiveStatus>,
    /// The 95th percentile of the input (prompt) tokens of the lane's
    /// requests, as the gateway measured them (lanes with `cost`; absent:
    /// Unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_input_tokens: Option<f64>,
    /// The 95th percentile of the output (completion) tokens of the lane's
    /// requests (absent: Unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_output_tokens: Option<f64>,
    /// The 95th percentile of the work units one request cost when settled
    /// (absent: Unknown); compared with `workUnitsPerRequest` by the
    /// `CostCalibrated` condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_cost_units_per_request: Option<f64>,
    /// Conditions: `Bound`, `ContractRespected`, `CostCalibrated` (lanes
    /// with `cost`, or with a measured cost).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
