//! `CapacityProfile.spec.breakers`: the circuit breaker the gateway keeps
//! for each route of the pool's lanes.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Circuit breakers of the routes, applied per request by the gateway
/// (passed through in the gateway config). Without it every route gets the
/// defaults below.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BreakersSpec {
    /// The settings of every route not listed in `routes`.
    #[serde(default)]
    pub default: BreakerSpec,
    /// Settings of particular routes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteBreakerSpec>,
    /// While the breaker of a lane's route is open, send the lane's requests
    /// to its contract's `routes.approvedFallbacks` (false: answer 503 with
    /// the route's reopen time). Default false: approved fallbacks are
    /// otherwise used only when a degradation level says so.
    #[serde(default)]
    pub fallback_when_open: bool,
}

/// One route's breaker settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteBreakerSpec {
    /// The route's name, as the lanes' `routes` and the gateway's `--route`
    /// name it.
    #[x_kube(validation = Rule::new("size(self) >= 1").message("route must not be empty"))]
    pub route: String,
    /// Its settings.
    #[serde(flatten)]
    pub breaker: BreakerSpec,
}

/// When a breaker opens, how long it stays open and how it closes. Failures
/// are 5xx answers (except 503 with Retry-After, which paces the route),
/// connect errors and timeouts.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BreakerSpec {
    /// Open after this many failures in a row (0: never on a streak).
    #[serde(default = "default_consecutive_failures")]
    #[x_kube(validation = Rule::new("self >= 0").message("consecutiveFailures must be >= 0"))]
    pub consecutive_failures: i32,
    /// Open when at least this percent of the answers in the window are
    /// failures (0: never on a ratio).
    #[serde(default = "default_failure_ratio_percent")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 100").message("failureRatioPercent must be within 0..100"))]
    pub failure_ratio_percent: i32,
    /// The ratio counts only once the window holds this many answers.
    #[serde(default = "default_min_requests")]
    #[x_kube(validation = Rule::new("self >= 1").message("minRequests must be >= 1"))]
    pub min_requests: i32,
    /// The ratio's window, in seconds.
    #[serde(default = "default_window_seconds")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 3600").message("windowSeconds must be within 1..3600"))]
    pub window_seconds: i32,
    /// Seconds an opened breaker keeps every request away before it lets a
    /// probe through.
    #[serde(default = "default_open_seconds")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 3600").message("openSeconds must be within 0..3600"))]
    pub open_seconds: i64,
    /// Up to this percent of `openSeconds` is added at random to each open
    /// time, so the gateway's replicas do not probe in step.
    #[serde(default = "default_probe_jitter_percent")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 100").message("probeJitterPercent must be within 0..100"))]
    pub probe_jitter_percent: i32,
    /// Successful probes in a row that close the breaker.
    #[serde(default = "default_close_after_successes")]
    #[x_kube(validation = Rule::new("self >= 1").message("closeAfterSuccesses must be >= 1"))]
    pub close_after_successes: i32,
}

impl Default for BreakerSpec {
    fn default() -> BreakerSpec {
        BreakerSpec {
            consecutive_failures: default_consecutive_failures(),
            failure_ratio_percent: default_failure_ratio_percent(),
            min_requests: default_min_requests(),
            window_seconds: default_window_seconds(),
            open_seconds: default_open_seconds(),
            probe_jitter_percent: default_probe_jitter_percent(),
            close_after_successes: default_close_after_successes(),
        }
    }
}

fn default_consecutive_failures() -> i32 {
    5
}
fn default_failure_ratio_percent() -> i32 {
    50
}
fn default_min_requests() -> i32 {
    20
}
fn default_window_seconds() -> i32 {
    10
}
fn default_open_seconds() -> i64 {
    5
}
fn default_probe_jitter_percent() -> i32 {
    20
}
fn default_close_after_successes() -> i32 {
    2
}
