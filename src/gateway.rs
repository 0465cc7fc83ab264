//! The gateway config: what a gateway hot-reloads to enforce a decision.
//!
//! Pure: built from a [`ProfileDecision`] and the specs. The bytes are
//! identical for an identical decision (stable field and lane order, no
//! timestamps except borrowing expiries, which are only renewed when half the
//! lease has run out), so nothing is written when nothing changed. Documented
//! field by field in docs/gateway-config.md.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::api::common::{parse_rfc3339, rfc3339};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use kube::api::ObjectMeta;

use crate::api::{CapacityProfile, DegradationPolicy, LaneContract, PolicyMode};
use crate::policy::{LaneState, ProfileDecision, Telemetry};

/// Version of the `lanes.json` schema.
pub const SCHEMA_VERSION: u32 = 1;
/// ConfigMap key holding the config.
pub const CONFIG_KEY: &str = "lanes.json";
/// Annotation carrying the content hash.
pub const HASH_ANNOTATION: &str = "lanekeeper.dev/config-hash";

/// The whole config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayConfig {
    /// Schema version (1).
    pub schema_version: u32,
    /// `namespace/name` of the CapacityProfile.
    pub profile: String,
    /// `Enforce` or `Observe` (an observe config is written under a different
    /// ConfigMap name and must not be loaded by an enforcing gateway).
    pub mode: String,
    /// Current level (0 = normal).
    pub level: u32,
    /// Name of the current level.
    pub level_name: String,
    /// A level waiting for approval.
    pub pending_approval_level: Option<u32>,
    /// `Known` or `Unknown`.
    pub telemetry: String,
    /// Capacity in work units/s (null while unknown).
    pub capacity_units_per_second: Option<f64>,
    /// Gateway-wide flags.
    pub flags: Flags,
    /// In-flight watermarks (per-request reflexes), if the profile sets them.
    pub in_flight: Option<InFlight>,
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
    /// `Admitted`, `Capped`, `Throttled` or `Paused`.
    pub state: String,
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
    pub queue: Queue,
    /// End-to-end deadline in seconds.
    pub deadline_seconds: i64,
    /// Retry limits.
    pub retry: Retry,
    /// Seconds a rejected client should wait, when the lane is throttled,
    /// capped or paused (null when admitted).
    pub retry_after_seconds: Option<i64>,
    /// For a lane whose contract has `shedding.mode: Defer`: its rejections
    /// are deferrals (null for every other lane).
    pub deferral: Option<Deferral>,
    /// The routes to use now.
    pub routes: Vec<String>,
    /// Optional-context limits in force now (degraded when the level rejects
    /// optional context).
    pub optional_context: Option<OptionalContext>,
    /// Borrowing grants.
    pub borrowing: Vec<Borrow>,
    /// The contract's guaranteed floor in work units/s: reserved by the
    /// gateway even when the admitted rate is lower (absent: no floor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_units_per_second: Option<f64>,
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
}

/// Queue limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Queue {
    /// Most requests waiting.
    pub max_depth: i64,
    /// Most seconds a request may wait.
    pub ttl_seconds: i64,
}

/// Retry limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Retry {
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
    /// deferral (see [`resume_after_seconds`]).
    pub retry_after_seconds: i64,
}

/// The expected time to resume of a `Defer` lane, in seconds: the
/// `Retry-After` its gateway gives a deferred request.
///
/// A paused lane resumes no sooner than the level above it can step down,
/// `stable_for` seconds (the policy's `hysteresis.stableForSeconds`). A lane
/// that admits `admitted_requests_per_second` serves a full queue of
/// `max_depth` requests in `max_depth ÷ rate` seconds; a step down may raise
/// its rate sooner, so the wait is at most `stable_for`. At least 1 s.
pub fn resume_after_seconds(
    state: LaneState,
    admitted_requests_per_second: f64,
    max_depth: i64,
    stable_for: i64,
) -> i64 {
    let longest = stable_for.max(1);
    if state == LaneState::Paused || admitted_requests_per_second <= 0.0 {
        return longest;
    }
    // The rate is rounded to 6 decimals (133.333333): don't let that round
    // 150 s up to 151.
    let drain = (max_depth.max(0) as f64 / admitted_requests_per_second - 1e-6).ceil();
    if drain.is_finite() && drain < longest as f64 {
        (drain as i64).max(1)
    } else {
        longest
    }
}

/// The `hysteresis.stableForSeconds` a gateway config uses for a profile's
/// lanes: the policy's, 300 without a policy.
pub fn stable_for_seconds(policy: Option<&DegradationPolicy>) -> i64 {
    policy.map_or(300, |p| p.spec.hysteresis.stable_for_seconds)
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
    pub expires_at: String,
    /// How quickly the capacity must be given back when withdrawn, seconds.
    pub release_within_seconds: i64,
}

/// Builds the config for a decision. `prev` is the config currently
/// published (to keep borrowing expiries stable until half the lease has run
/// out); `now` is Unix seconds.
pub fn build(
    decision: &ProfileDecision,
    lanes: &[&LaneContract],
    policy: Option<&DegradationPolicy>,
    profile_generation: i64,
    prev: Option<&GatewayConfig>,
    now: i64,
) -> GatewayConfig {
    let by_name: BTreeMap<&str, &LaneContract> = lanes
        .iter()
        .map(|l| (l.metadata.name.as_deref().unwrap_or_default(), *l))
        .collect();
    let stable_for = stable_for_seconds(policy);
    let flags = Flags {
        reject_optional_context: decision.gateway.reject_optional_context,
        use_fallback_routes: decision.gateway.use_fallback_routes,
        read_only: decision.gateway.read_only,
        static_fallback: decision.gateway.static_fallback,
    };
    let mut generations = Generations {
        profile: profile_generation,
        policy: policy.and_then(|p| p.metadata.generation),
        lanes: BTreeMap::new(),
    };
    let mut out_lanes = Vec::with_capacity(decision.lanes.len());
    for d in &decision.lanes {
        let Some(spec) = by_name.get(d.name.as_str()).map(|l| &l.spec) else {
            continue;
        };
        if let Some(l) = by_name.get(d.name.as_str()) {
            generations
                .lanes
                .insert(d.name.clone(), l.metadata.generation.unwrap_or(0));
        }
        let routes = if flags.use_fallback_routes && !spec.routes.approved_fallbacks.is_empty() {
            spec.routes.approved_fallbacks.clone()
        } else {
            spec.routes.primary.clone()
        };
        let retry_after = match d.state {
            LaneState::Admitted => None,
            LaneState::Paused => Some(stable_for.max(1)),
            LaneState::Capped | LaneState::Throttled | LaneState::Recovering => {
                Some(spec.queue.ttl_seconds.clamp(1, 60))
            }
        };
        let prev_lane = prev.and_then(|p| p.lanes.iter().find(|l| l.name == d.name));
        let release = spec
            .borrowing
            .as_ref()
            .map_or(0, |b| b.release_within_seconds);
        let lease = spec.borrowing.as_ref().map_or(0, |b| b.lease_seconds);
        let borrowing = d
            .borrowing
            .iter()
            .map(|g| {
                // Keep the published expiry while the same grant has more than
                // half its lease left; renew it otherwise.
                let kept = prev_lane
                    .and_then(|pl| pl.borrowing.iter().find(|b| b.from == g.from))
                    .filter(|b| (b.units_per_second - g.units_per_second).abs() < 1e-9)
                    .and_then(|b| parse_rfc3339(&b.expires_at))
                    .filter(|exp| exp - now > lease / 2);
                Borrow {
                    from: g.from.clone(),
                    units_per_second: g.units_per_second,
                    expires_at: rfc3339(kept.unwrap_or(now + lease)),
                    release_within_seconds: release,
                }
            })
            .collect();
        let rps = d.admitted_requests_per_second;
        let deferral = (spec.shedding.mode == crate::api::SheddingMode::Defer).then(|| Deferral {
            retry_after_seconds: resume_after_seconds(
                d.state,
                rps,
                spec.queue.max_depth,
                stable_for,
            ),
        });
        out_lanes.push(LaneConfig {
            name: d.name.clone(),
            priority: d.priority,
            state: d.state.as_str().to_owned(),
            sheddable: spec.shedding.mode != crate::api::SheddingMode::Never,
            admitted_units_per_second: d.admitted_units_per_second,
            admitted_requests_per_second: rps,
            work_units_per_request: spec.work_units_per_request.value(),
            burst: if d.state == LaneState::Paused {
                0
            } else {
                rps.ceil().max(1.0) as u64
            },
            queue: Queue {
                max_depth: spec.queue.max_depth,
                ttl_seconds: spec.queue.ttl_seconds,
            },
            deadline_seconds: spec.deadline_seconds,
            retry: Retry {
                max_attempts: spec.retry.max_attempts,
                budget_percent: spec.retry.budget_percent,
            },
            retry_after_seconds: retry_after,
            deferral,
            routes,
            optional_context: spec.optional_context.as_ref().map(|o| OptionalContext {
                history_turns: if flags.reject_optional_context {
                    o.degraded_history_turns
                } else {
                    o.history_turns
                },
                degraded: flags.reject_optional_context,
                degraded_history_turns: Some(o.degraded_history_turns),
            }),
            borrowing,
            // A paused lane's floor is not reserved (it admits nothing).
            floor_units_per_second: spec
                .floor_units_per_second
                .as_ref()
                .map(|f| f.value())
                .filter(|f| *f > 0.0 && d.state != LaneState::Paused),
            expected_service_seconds: spec.expected_service_seconds.as_ref().map(|s| s.value()),
            spare_capacity: matches!(d.state, LaneState::Admitted | LaneState::Throttled),
        });
    }
    let mut cfg = GatewayConfig {
        schema_version: SCHEMA_VERSION,
        profile: format!("{}/{}", decision.namespace, decision.name),
        mode: match policy.map(|p| p.spec.mode) {
            Some(PolicyMode::Observe) => "Observe",
            _ => "Enforce",
        }
        .to_owned(),
        level: decision.level,
        level_name: decision.level_name.clone(),
        pending_approval_level: decision.pending_approval_level,
        telemetry: match decision.telemetry {
            Telemetry::Known => "Known",
            Telemetry::Unknown => "Unknown",
        }
        .to_owned(),
        capacity_units_per_second: decision.capacity_units_per_second,
        flags,
        in_flight: decision.gateway.in_flight.as_ref().map(|f| InFlight {
            conserve_at: f.conserve_at,
            stop_at: f.stop_at,
            resume_below: f.resume_below,
            resume_after_stable_seconds: f.resume_after_stable_seconds,
        }),
        generations,
        lanes: out_lanes,
        content_hash: String::new(),
    };
    cfg.content_hash = hash(&cfg);
    cfg
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

/// The canonical bytes stored under `lanes.json`.
pub fn to_json(cfg: &GatewayConfig) -> String {
    let mut s = serde_json::to_string_pretty(cfg).expect("config serializes");
    s.push('\n');
    s
}

/// The ConfigMap name for a profile (observe mode writes elsewhere so no
/// enforcing gateway loads it).
pub fn configmap_name(profile: &str, observe: bool) -> String {
    if observe {
        format!("{profile}-lanes-observe")
    } else {
        format!("{profile}-lanes")
    }
}

/// The ConfigMap that carries `cfg` to the profile's gateways: named by
/// [`configmap_name`], labelled with the profile and the mode, annotated
/// with the content hash, owned by the profile (deleted with it).
pub fn configmap(profile: &CapacityProfile, cfg: &GatewayConfig, observe: bool) -> ConfigMap {
    let name = profile.metadata.name.clone().unwrap_or_default();
    let labels = [
        ("app.kubernetes.io/managed-by", "lanekeeper"),
        ("lanekeeper.dev/profile", name.as_str()),
        (
            "lanekeeper.dev/mode",
            if observe { "Observe" } else { "Enforce" },
        ),
    ];
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(configmap_name(&name, observe)),
            namespace: profile.metadata.namespace.clone(),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            annotations: Some(BTreeMap::from([(
                HASH_ANNOTATION.to_owned(),
                cfg.content_hash.clone(),
            )])),
            owner_references: profile.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(CONFIG_KEY.to_owned(), to_json(cfg))])),
        ..Default::default()
    }
}

/// The config a ConfigMap carries and its hash annotation (`None` for what
/// is missing or unreadable).
pub fn from_configmap(cm: &ConfigMap) -> (Option<GatewayConfig>, Option<&str>) {
    let cfg = cm
        .data
        .as_ref()
        .and_then(|d| d.get(CONFIG_KEY))
        .and_then(|s| serde_json::from_str(s).ok());
    let hash = cm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HASH_ANNOTATION))
        .map(String::as_str);
    (cfg, hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paused_lane_resumes_after_the_stable_window() {
        assert_eq!(
            resume_after_seconds(LaneState::Paused, 133.3, 20_000, 300),
            300
        );
        assert_eq!(resume_after_seconds(LaneState::Paused, 0.0, 20_000, 0), 1);
    }

    #[test]
    fn a_capped_lane_resumes_when_a_full_queue_has_drained_at_most_a_window_away() {
        // INC-47: P3 capped at 60 units/s = 133.33 jobs/s, 20,000 queued: 150 s.
        assert_eq!(
            resume_after_seconds(LaneState::Capped, 60.0 / 0.45, 20_000, 300),
            150
        );
        assert_eq!(
            resume_after_seconds(LaneState::Capped, 133.333333, 20_000, 300),
            150
        );
        // A slower lane would wait longer than a step down may take.
        assert_eq!(
            resume_after_seconds(LaneState::Capped, 10.0, 20_000, 300),
            300
        );
        // A fast one is still told at least 1 s.
        assert_eq!(resume_after_seconds(LaneState::Admitted, 1e6, 10, 300), 1);
        // No rate at all: as if paused.
        assert_eq!(
            resume_after_seconds(LaneState::Throttled, 0.0, 10, 120),
            120
        );
    }
}
