//! `lanes.json`: what the controller publishes and every gateway replica
//! enforces, field by field as docs/gateway-config.md documents it.
//!
//! Closed sets are enums, so a document with an unknown `mode`, `state` or
//! `telemetry` does not parse; [`GatewayConfig::from_json`] also checks the
//! numbers and references (see [`crate::validate`]). The bytes are
//! canonical: [`to_json`] of an identical config is identical.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::clients::ClientRule;
use crate::route_config::Breakers;
use crate::validate::{ConfigError, validate};

/// Version of the `lanes.json` schema.
pub const SCHEMA_VERSION: u32 = 1;
/// ConfigMap key holding the config.
pub const CONFIG_KEY: &str = "lanes.json";

/// Whether a config is enforced or only evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Mode {
    /// Every verdict is enforced.
    Enforce,
    /// Verdicts are counted (shadow metrics), every request is admitted. An
    /// observe config is written under another ConfigMap name, so an
    /// enforcing gateway never loads it by accident.
    Observe,
}

impl Mode {
    /// The name as written in `lanes.json` and in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "Enforce",
            Mode::Observe => "Observe",
        }
    }
}

/// Whether the pool's capacity is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Telemetry {
    /// Capacity is known.
    Known,
    /// Capacity could not be had: hold.
    Unknown,
}

/// A lane's admission state, as the controller decided it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LaneState {
    /// Gets its whole demand.
    Admitted,
    /// Held to a level cap or its ceiling.
    Capped,
    /// Capacity ran out before its demand was met.
    Throttled,
    /// Paused by a level.
    Paused,
    /// Released by a step down and regaining its rate in stages.
    Recovering,
}

impl LaneState {
    /// The state's name as written in status and configs.
    pub fn as_str(self) -> &'static str {
        match self {
            LaneState::Admitted => "Admitted",
            LaneState::Capped => "Capped",
            LaneState::Throttled => "Throttled",
            LaneState::Paused => "Paused",
            LaneState::Recovering => "Recovering",
        }
    }
}

/// The whole config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayConfig {
    /// Schema version ([`SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// `namespace/name` of the CapacityProfile.
    pub profile: String,
    /// Enforce or observe.
    pub mode: Mode,
    /// Current level (0 = normal).
    pub level: u32,
    /// Name of the current level.
    pub level_name: String,
    /// A level waiting for approval.
    pub pending_approval_level: Option<u32>,
    /// Whether the capacity is known.
    pub telemetry: Telemetry,
    /// Capacity in work units/s (null while unknown).
    pub capacity_units_per_second: Option<f64>,
    /// Gateway-wide flags.
    pub flags: Flags,
    /// In-flight watermarks (per-request reflexes), if the profile sets them.
    pub in_flight: Option<InFlight>,
    /// The routes' circuit breakers (absent: every route gets the built-in
    /// defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breakers: Option<Breakers>,
    /// The pool's model slots: most requests in flight, every lane's (the
    /// CapacityProfile's `spec.concurrency`; absent: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<crate::pool_limits::ModelSlots>,
    /// The pool's long-context limit (the CapacityProfile's
    /// `spec.longContext`; absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub long_context: Option<crate::pool_limits::LongContext>,
    /// The generations this config was computed from.
    pub generations: Generations,
    /// Per lane, in priority order then name.
    pub lanes: Vec<LaneConfig>,
    /// `sha256:<hex>` of the config without this field.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub content_hash: String,
}

/// Gateway-wide flags.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Flags {
    /// Reject optional long context (send degraded history).
    pub reject_optional_context: bool,
    /// Use approved fallback routes.
    pub use_fallback_routes: bool,
    /// Read-only mode.
    pub read_only: bool,
    /// Answer from a static fallback.
    pub static_fallback: bool,
}

/// In-flight watermarks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InFlight {
    /// Reject optional long context at this many in flight.
    pub conserve_at: i64,
    /// Stop admitting new requests of sheddable lanes at this many.
    pub stop_at: i64,
    /// Resume below this many.
    pub resume_below: i64,
    /// ... and only once the p95 latency the gateway measures has been
    /// stable this long (absent: 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_after_stable_seconds: Option<i64>,
}

/// Generations of the inputs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Generations {
    /// The CapacityProfile's generation.
    pub profile: i64,
    /// The DegradationPolicy's generation (null without a policy).
    pub policy: Option<i64>,
    /// Each lane's generation, by name.
    pub lanes: BTreeMap<String, i64>,
}

/// One lane.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaneConfig {
    /// LaneContract name.
    pub name: String,
    /// Priority (0 most critical).
    pub priority: i32,
    /// The controller's decision for the lane.
    pub state: LaneState,
    /// May the gateway shed this lane at `inFlight.stopAt` (false for `Never`
    /// lanes).
    pub sheddable: bool,
    /// Admitted work units per second.
    pub admitted_units_per_second: f64,
    /// Admitted requests per second (units ÷ work units per request): the
    /// token-bucket rate.
    pub admitted_requests_per_second: f64,
    /// Work units per request.
    pub work_units_per_request: f64,
    /// Token-bucket size in requests: one second of the admitted rate, at
    /// least 1 unless the lane is paused.
    pub burst: u64,
    /// Queue limits.
    pub queue: QueueLimits,
    /// End-to-end deadline in seconds.
    pub deadline_seconds: i64,
    /// Retry limits.
    pub retry: RetryLimits,
    /// Seconds a rejected client should wait, when the lane is throttled,
    /// capped or paused (null when admitted).
    pub retry_after_seconds: Option<i64>,
    /// For a lane whose contract has `shedding.mode: Defer`: its rejections
    /// are deferrals (null for every other lane).
    pub deferral: Option<Deferral>,
    /// The routes to use now.
    pub routes: Vec<String>,
    /// Whether `routes` are the contract's approved fallbacks, used because
    /// the level says so (absent: false). The gateway tells clients so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fallback_routes: bool,
    /// The contract's approved fallbacks the gateway sends to while the
    /// breaker of every route in `routes` is open (absent: none; the
    /// profile's `breakers.fallbackWhenOpen` allows it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub breaker_fallbacks: Vec<String>,
    /// Optional-context limits in force now (degraded when the level rejects
    /// optional context).
    pub optional_context: Option<OptionalContext>,
    /// Borrowing grants.
    pub borrowing: Vec<Borrow>,
    /// The contract's guaranteed floor in work units/s, held to the lane's
    /// level cap: reserved by the gateway even when the admitted rate is
    /// lower (absent: no floor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_units_per_second: Option<f64>,
    /// The contract's ceiling in work units/s: the most the lane passes,
    /// also when it draws on spare capacity (absent: no ceiling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling_units_per_second: Option<f64>,
    /// The contract's expected service time in seconds: a request whose
    /// wait plus this would pass its deadline is refused at once (absent: 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_service_seconds: Option<f64>,
    /// May the lane use the pool's spare capacity (what no lane's rate or
    /// floor claims of `capacityUnitsPerSecond`) when its own bucket is
    /// empty: true for lanes the decision does not hold back (`Admitted`,
    /// `Throttled`), false for `Capped`, `Paused` and `Recovering` lanes
    /// (absent: false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spare_capacity: bool,
    /// Who may send into the lane, each identity with its tenant (the
    /// contract's `spec.clients`; absent: no identity may, unless the
    /// gateway trusts the lane header).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<ClientRule>,
    /// Per-tenant limits inside the lane: most requests in flight per
    /// tenant and the tenants' weights in the fair queue (the contract's
    /// `spec.tenants`; absent: no maximum, every weight 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<crate::tenants::TenantLimits>,
    /// What a request costs counted in tokens (the contract's `spec.cost`;
    /// absent: `workUnitsPerRequest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::tokens::TokenCost>,
    /// Limits on a request's input and output tokens (the contract's
    /// `spec.tokens` and the level's `capOutputTokens`; absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<crate::tokens::TokenLimits>,
}

/// Queue limits of a lane.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueLimits {
    /// Most requests waiting.
    pub max_depth: i64,
    /// Most seconds a request may wait.
    pub ttl_seconds: i64,
}

/// Retry limits of a lane.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryLimits {
    /// Most attempts per request, the first included.
    pub max_attempts: i32,
    /// Extra attempts ÷ original requests, in percent.
    pub budget_percent: i32,
}

/// How a `Defer` lane defers: a request that cannot queue, or whose wait
/// runs out, is told when to come back instead of being refused, and its
/// return counts against neither `retry.maxAttempts` nor the retry budget.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Deferral {
    /// The expected time to resume, in seconds: the `Retry-After` of every
    /// deferral.
    pub retry_after_seconds: i64,
}

/// Optional-context limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OptionalContext {
    /// Conversation turns to send now.
    pub history_turns: i32,
    /// Whether this is the degraded value.
    pub degraded: bool,
    /// The degraded value, which the gateway sends while it conserves at
    /// `inFlight.conserveAt` (absent: `historyTurns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded_history_turns: Option<i32>,
}

/// A borrowing grant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Borrow {
    /// Lending lane.
    pub from: String,
    /// Work units per second granted.
    pub units_per_second: f64,
    /// When the grant lapses unless renewed (RFC 3339).
    pub expires_at: Timestamp,
    /// How quickly the capacity must be given back when withdrawn, seconds.
    pub release_within_seconds: i64,
}

impl GatewayConfig {
    /// Parses and checks a `lanes.json` document: a typed error for JSON
    /// that is not a config, an unknown closed-set value, or a config that
    /// breaks a rule of [`crate::validate`].
    pub fn from_json(bytes: &[u8]) -> Result<GatewayConfig, ConfigError> {
        let cfg: GatewayConfig =
            serde_json::from_slice(bytes).map_err(|e| ConfigError::Json(e.to_string()))?;
        validate(&cfg)?;
        Ok(cfg)
    }

    /// The config with its `contentHash` set.
    pub fn with_hash(mut self) -> GatewayConfig {
        self.content_hash = hash(&self);
        self
    }
}

/// `sha256:<hex>` of the config's canonical bytes without the hash.
pub fn hash(cfg: &GatewayConfig) -> String {
    let mut c = cfg.clone();
    c.content_hash = String::new();
    let bytes = serde_json::to_vec(&c).expect("config serializes");
    let digest = Sha256::digest(&bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The canonical bytes stored under [`CONFIG_KEY`].
pub fn to_json(cfg: &GatewayConfig) -> String {
    let mut s = serde_json::to_string_pretty(cfg).expect("config serializes");
    s.push('\n');
    s
}
