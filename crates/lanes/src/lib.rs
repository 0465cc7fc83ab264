#![forbid(unsafe_code)]
//! The data path's contract and core.
//!
//! - [`config`]: `lanes.json`, what lanekeeper's controller publishes and
//!   every gateway replica enforces, parsed and checked ([`validate`]);
//!   [`clients`]: who may send into each lane (the gateway resolves the
//!   identities).
//! - [`Core`]: the gateway's per-request admission core. Pure and
//!   deterministic: no I/O, no clock of its own. Every call takes the time
//!   (`now`, monotonic seconds as an `f64`) from its caller, so
//!   `lanekeeper gateway` drives it with the process clock, `simulate` with
//!   simulated time, and tests step it by hand.
//!
//! The rules, as docs/gateway.md states them for users, each in a module:
//!
//! - **Token bucket per lane** at `admittedRequestsPerSecond` with `burst`
//!   tokens; one request takes one token. **Floors are reserved**: a lane's
//!   floor is available to it at once; when a lender uses more than its
//!   admitted rate, the lanes borrowing its idle floor are cut back at once;
//!   a grant whose `expiresAt` passes stops on its own (`bucket`, `lane`).
//! - **Spare capacity**: what no lane's rate or floor claims of the pool's
//!   capacity is a shared bucket that lanes with `spareCapacity` draw on, in
//!   priority order, once their own bucket is empty (`spare`).
//! - **A bounded queue per lane** with a TTL; a request that could not be
//!   served within its deadline is refused at once instead of queued to
//!   die; **tenant fairness** inside a lane by weighted fair queueing by
//!   cost, and a maximum in flight per tenant (`fair_queue`, `tenants`,
//!   `waiting`).
//! - **Retries**: counted by attempt header and request id, limited by
//!   `retry.maxAttempts` and the retry budget; a request back after a
//!   deferral is neither an original nor a retry (`remembered`, `arrival`).
//! - **Deferral** for lanes with a `deferral` object (`arrival`, `waiting`).
//! - **In-flight limit by priority**: `stopAt` is the number of slots the
//!   sheddable lanes share; a freed slot goes to the highest-priority
//!   waiting lane, a lane that is never shed keeps its reserve, and a
//!   request whose wait for a slot would miss its deadline is refused at
//!   once (`slots`). **Conserve with hysteresis** at `conserveAt`, left
//!   under `resumeBelow` once the p95 is stable (`pressure`), and the
//!   degraded chat history while conserving (`history`).
//! - **Several replicas**: each enforces `share` (1/N) of every rate, burst,
//!   floor, queue depth, watermark and of the spare capacity.
//! - **Qualified outcomes** for the lanes' objectives: good (answered in
//!   time), bad (failed, late, or refused inside the lane's floor, which
//!   each [`Refusal`] says), not counted (`qualified`).
//! - **Retry-After is the expected wait**: the lane's queue ahead at its
//!   drain rate (`expected_wait`).
//! - **Routes**: a circuit breaker per route (`breaker`, settings in
//!   `route_config`) and the pace of a route that pushes back
//!   (`route_pace`); the gateway drives them per request.
//! - **Saturation**: every slot of the in-flight limit taken with a
//!   request waiting; the gateway exports its time saturated and the work
//!   completed meanwhile, the controller's capacity evidence
//!   (`saturation`).
//! - **Observe mode**: a config with `mode: Observe` is evaluated but never
//!   enforced (the caller admits everything and counts the verdicts).

mod arrival;
pub mod breaker;
mod bucket;
mod ceiling;
mod charge;
pub mod clients;
pub mod config;
mod core;
pub mod expected_wait;
mod fair_queue;
pub mod fleet_core;
pub mod fleet_lease;
pub mod fleet_mode;
pub mod fleet_pool;
pub mod fleet_slots;
pub mod fleet_spare;
pub mod fleet_tenants;
mod history;
mod id_hint;
mod id_ring;
mod lane;
mod latency_window;
mod pool_limits;
mod pressure;
pub mod qualified;
mod remembered;
pub mod request_shape;
pub mod route_config;
pub mod route_pace;
pub mod saturation;
mod service_time;
pub mod settlement;
mod slots;
mod spare;
pub mod tenants;
pub mod token_estimate;
pub mod tokens;
pub mod validate;
mod verdict;
mod waiting;

pub use crate::breaker::{Breaker, BreakerSettings, BreakerState, Gate, Transition, Upshot};
pub use crate::charge::{Charge, RequestSize, Settled};
pub use crate::clients::{
    ApiKeySecret, CertificateName, ClientIdentity, ClientRule, ConfigMapKey, JwksSource, JwtIssuer,
    ServiceAccountName,
};
pub use crate::config::{
    Borrow, CONFIG_KEY, Deferral, Flags, GatewayConfig, Generations, InFlight, LaneConfig,
    LaneState, Mode, OptionalContext, QueueLimits, RetryLimits, SCHEMA_VERSION, Telemetry, hash,
    to_json,
};
pub use crate::core::{Core, DEFAULT_TENANT};
pub use crate::history::trim_chat_history;
pub use crate::id_hint::IdHint;
pub use crate::lane::LaneRoutes;
pub use crate::pool_limits::{LongContext, ModelSlots};
pub use crate::pressure::{
    DEFAULT_RESUME_AFTER_STABLE_SECONDS, DRAIN_WINDOW_SECONDS, LATENCY_RISE_FACTOR,
    LATENCY_RISE_LOOKBACK_SECONDS, LATENCY_WINDOW_SECONDS, Pressure,
};
pub use crate::qualified::{Qualified, Served};
pub use crate::remembered::{MAX_REMEMBERED_IDS, RETRY_WINDOW_SECONDS};
pub use crate::route_config::Breakers;
pub use crate::route_pace::{Paced, RoutePace};
pub use crate::saturation::SaturationMeter;
pub use crate::settlement::Usage;
pub use crate::spare::SPARE_UTILIZATION;
pub use crate::tenants::{TenantLimits, TenantOverride, TenantSlot};
pub use crate::token_estimate::TokenEstimate;
pub use crate::tokens::{TokenCost, TokenLimits};
pub use crate::validate::ConfigError;
pub use crate::verdict::{
    Attempt, Limit, Outcome, Pass, Refusal, Request, Resolution, Ticket, Verdict,
};
/// The time library of [`Borrow::expires_at`].
pub use jiff;

#[cfg(test)]
mod slots_tests;
#[cfg(test)]
mod tests;
