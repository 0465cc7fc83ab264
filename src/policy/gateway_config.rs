//! Building `lanes.json` (the [`lanes`] crate's [`GatewayConfig`]) from a
//! decision: what every gateway replica hot-reloads to enforce it.
//!
//! Pure: built from a [`ProfileDecision`] and the specs. The bytes are
//! identical for an identical decision (stable field and lane order, no
//! timestamps except borrowing expiries, which are only renewed when half the
//! lease has run out), so nothing is written when nothing changed. Documented
//! field by field in docs/gateway-config.md.

use std::collections::BTreeMap;

use lanes::jiff::Timestamp;
use lanes::{
    ApiKeySecret, Borrow, BreakerSettings, Breakers, CertificateName, ClientIdentity, ClientRule,
    ConfigMapKey, Deferral, Flags, GatewayConfig, Generations, InFlight, JwksSource, JwtIssuer,
    LaneConfig, Mode, OptionalContext, QueueLimits, RetryLimits, SCHEMA_VERSION,
    ServiceAccountName,
};

use crate::api::{
    BreakerSpec, BreakersSpec, DegradationPolicy, LaneContract, PolicyMode, SheddingMode,
};
use crate::policy::{LaneDecision, LaneState, ProfileDecision, gateway_tokens};

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
    let flags = Flags {
        reject_optional_context: decision.gateway.reject_optional_context,
        use_fallback_routes: decision.gateway.use_fallback_routes,
        read_only: decision.gateway.read_only,
        static_fallback: decision.gateway.static_fallback,
    };
    let ctx = LaneContext {
        flags: &flags,
        fallback_when_open: decision
            .gateway
            .breakers
            .as_ref()
            .is_some_and(|b| b.fallback_when_open),
        stable_for: stable_for_seconds(policy),
        prev,
        now,
        policy,
        level: decision.level,
    };
    let mut generations = Generations {
        profile: profile_generation,
        policy: policy.and_then(|p| p.metadata.generation),
        lanes: BTreeMap::new(),
    };
    let mut out_lanes = Vec::with_capacity(decision.lanes.len());
    for d in &decision.lanes {
        let Some(contract) = by_name.get(d.name.as_str()) else {
            continue;
        };
        generations
            .lanes
            .insert(d.name.clone(), contract.metadata.generation.unwrap_or(0));
        out_lanes.push(lane_config(d, contract, &ctx));
    }
    GatewayConfig {
        schema_version: SCHEMA_VERSION,
        profile: format!("{}/{}", decision.namespace, decision.name),
        mode: match policy.map(|p| p.spec.mode) {
            Some(PolicyMode::Observe) => Mode::Observe,
            _ => Mode::Enforce,
        },
        level: decision.level,
        level_name: decision.level_name.clone(),
        pending_approval_level: decision.pending_approval_level,
        telemetry: decision.telemetry,
        capacity_units_per_second: decision.capacity_units_per_second,
        flags,
        in_flight: decision.gateway.in_flight.as_ref().map(|f| InFlight {
            conserve_at: f.conserve_at,
            stop_at: f.stop_at,
            resume_below: f.resume_below,
            resume_after_stable_seconds: f.resume_after_stable_seconds,
        }),
        breakers: decision.gateway.breakers.as_ref().map(breakers),
        concurrency: decision
            .gateway
            .concurrency
            .as_ref()
            .map(|c| lanes::ModelSlots {
                max: c.max.max(1) as u64,
            }),
        long_context: decision
            .gateway
            .long_context
            .as_ref()
            .map(|l| lanes::LongContext {
                above_input_tokens: l.above_input_tokens.max(1) as u64,
                max_concurrency: l.max_concurrency.max(1) as u64,
            }),
        generations,
        lanes: out_lanes,
        content_hash: String::new(),
    }
    .with_hash()
}

/// What every lane's entry is built with.
struct LaneContext<'a> {
    flags: &'a Flags,
    /// The profile lets an open breaker send lanes to their fallbacks.
    fallback_when_open: bool,
    stable_for: i64,
    prev: Option<&'a GatewayConfig>,
    now: i64,
    /// For the level's `capOutputTokens`.
    policy: Option<&'a DegradationPolicy>,
    level: u32,
}

/// One lane's entry: the decision's rate and state with the contract's
/// limits.
fn lane_config(d: &LaneDecision, contract: &LaneContract, ctx: &LaneContext<'_>) -> LaneConfig {
    let spec = &contract.spec;
    let rps = d.admitted_requests_per_second;
    let fallback = ctx.flags.use_fallback_routes && !spec.routes.approved_fallbacks.is_empty();
    let paused = d.state == LaneState::Paused;
    LaneConfig {
        name: d.name.clone(),
        priority: d.priority,
        state: d.state,
        sheddable: spec.shedding.mode != SheddingMode::Never,
        admitted_units_per_second: d.admitted_units_per_second,
        admitted_requests_per_second: rps,
        work_units_per_request: spec.work_units_per_request.value(),
        burst: if paused {
            0
        } else {
            rps.ceil().max(1.0) as u64
        },
        queue: QueueLimits {
            max_depth: spec.queue.max_depth,
            ttl_seconds: spec.queue.ttl_seconds,
        },
        deadline_seconds: spec.deadline_seconds,
        retry: RetryLimits {
            max_attempts: spec.retry.max_attempts,
            budget_percent: spec.retry.budget_percent,
        },
        retry_after_seconds: match d.state {
            LaneState::Admitted => None,
            LaneState::Paused => Some(ctx.stable_for.max(1)),
            LaneState::Capped | LaneState::Throttled | LaneState::Recovering => {
                Some(spec.queue.ttl_seconds.clamp(1, 60))
            }
        },
        deferral: (spec.shedding.mode == SheddingMode::Defer).then(|| Deferral {
            retry_after_seconds: resume_after_seconds(
                d.state,
                rps,
                spec.queue.max_depth,
                ctx.stable_for,
            ),
        }),
        routes: if fallback {
            spec.routes.approved_fallbacks.clone()
        } else {
            spec.routes.primary.clone()
        },
        fallback_routes: fallback,
        breaker_fallbacks: if fallback || !ctx.fallback_when_open {
            Vec::new()
        } else {
            spec.routes.approved_fallbacks.clone()
        },
        optional_context: spec.optional_context.as_ref().map(|o| OptionalContext {
            history_turns: if ctx.flags.reject_optional_context {
                o.degraded_history_turns
            } else {
                o.history_turns
            },
            degraded: ctx.flags.reject_optional_context,
            degraded_history_turns: Some(o.degraded_history_turns),
        }),
        borrowing: borrowing(d, contract, ctx),
        floor_units_per_second: floor_in_force(d, contract, paused),
        ceiling_units_per_second: spec.ceiling_units_per_second.as_ref().map(|c| c.value()),
        expected_service_seconds: spec.expected_service_seconds.as_ref().map(|s| s.value()),
        spare_capacity: matches!(d.state, LaneState::Admitted | LaneState::Throttled),
        clients: clients(contract),
        tenants: tenants(contract),
        cost: gateway_tokens::cost(contract),
        tokens: gateway_tokens::tokens(contract, ctx.policy, ctx.level),
    }
}

/// The floor a gateway reserves for the lane: the contract's, held to the
/// lane's level cap, as allocation reserves it (a lane capped below its
/// floor is held to the cap, floor included). A paused lane's floor is not
/// reserved (it admits nothing).
fn floor_in_force(d: &LaneDecision, contract: &LaneContract, paused: bool) -> Option<f64> {
    let floor = contract.spec.floor_units_per_second.as_ref()?.value();
    let floor = d
        .level_cap_units_per_second
        .map_or(floor, |cap| floor.min(cap));
    (floor > 0.0 && !paused).then_some(floor)
}

/// The profile's `spec.breakers` as `lanes.json` carries them.
fn breakers(spec: &BreakersSpec) -> Breakers {
    let settings = |b: &BreakerSpec| BreakerSettings {
        consecutive_failures: b.consecutive_failures.max(0) as u32,
        failure_ratio_percent: b.failure_ratio_percent.clamp(0, 100) as u32,
        min_requests: b.min_requests.max(1) as u32,
        window_seconds: b.window_seconds.clamp(1, 3600) as u32,
        open_seconds: b.open_seconds.clamp(0, 3600) as f64,
        probe_jitter_percent: b.probe_jitter_percent.clamp(0, 100) as u32,
        close_after_successes: b.close_after_successes.max(1) as u32,
    };
    Breakers {
        default: settings(&spec.default),
        routes: spec
            .routes
            .iter()
            .map(|r| (r.route.clone(), settings(&r.breaker)))
            .collect(),
    }
}

/// The contract's `spec.tenants` as `lanes.json` carries them (absent when
/// it sets nothing).
fn tenants(contract: &LaneContract) -> Option<lanes::TenantLimits> {
    let t = contract.spec.tenants.as_ref()?;
    let limits = lanes::TenantLimits {
        max_concurrency: t.max_concurrency.map(i64::from),
        weight: t.weight.map(i64::from),
        overrides: t
            .overrides
            .iter()
            .map(|o| lanes::TenantOverride {
                name: o.name.clone(),
                max_concurrency: o.max_concurrency.map(i64::from),
                weight: o.weight.map(i64::from),
            })
            .collect(),
    };
    (limits != lanes::TenantLimits::default()).then_some(limits)
}

/// The contract's `spec.clients` as `lanes.json` carries them: each
/// reference resolved to its namespace (the lane's unless it names one).
fn clients(contract: &LaneContract) -> Vec<ClientRule> {
    let ns = contract.metadata.namespace.clone().unwrap_or_default();
    contract
        .spec
        .clients
        .iter()
        .filter_map(|c| {
            let identity = if let Some(k) = &c.api_keys {
                ClientIdentity::ApiKeys(ApiKeySecret {
                    namespace: ns.clone(),
                    secret: k.secret_name.clone(),
                })
            } else if let Some(sa) = &c.service_account {
                ClientIdentity::ServiceAccount(ServiceAccountName {
                    namespace: sa.namespace.clone().unwrap_or_else(|| ns.clone()),
                    name: sa.name.clone(),
                })
            } else if let Some(j) = &c.jwt {
                ClientIdentity::Jwt(JwtIssuer {
                    issuer: j.issuer.clone(),
                    audience: j.audience.clone(),
                    jwks: match (&j.jwks_url, &j.jwks_config_map_key_ref) {
                        (Some(url), _) => JwksSource::Url(url.clone()),
                        (None, Some(r)) => JwksSource::ConfigMap(ConfigMapKey {
                            namespace: ns.clone(),
                            name: r.name.clone(),
                            key: r.key.clone(),
                        }),
                        // The CRD requires one of them.
                        (None, None) => return None,
                    },
                    subject: j.subject.clone(),
                })
            } else {
                ClientIdentity::Certificate(CertificateName {
                    name: c.certificate.as_ref()?.name.clone(),
                })
            };
            Some(ClientRule {
                identity,
                tenant: c.tenant.clone(),
                tenant_claim: c.tenant_claim.clone(),
            })
        })
        .collect()
}

/// The lane's grants. A grant keeps its published expiry while the same
/// grant has more than half its lease left, and is renewed otherwise.
fn borrowing(d: &LaneDecision, contract: &LaneContract, ctx: &LaneContext<'_>) -> Vec<Borrow> {
    let b = contract.spec.borrowing.as_ref();
    let release = b.map_or(0, |b| b.release_within_seconds);
    let lease = b.map_or(0, |b| b.lease_seconds);
    let prev_lane = ctx
        .prev
        .and_then(|p| p.lanes.iter().find(|l| l.name == d.name));
    d.borrowing
        .iter()
        .map(|g| {
            let kept = prev_lane
                .and_then(|pl| pl.borrowing.iter().find(|b| b.from == g.from))
                .filter(|b| (b.units_per_second - g.units_per_second).abs() < 1e-9)
                .map(|b| b.expires_at.as_second())
                .filter(|exp| exp - ctx.now > lease / 2);
            Borrow {
                from: g.from.clone(),
                units_per_second: g.units_per_second,
                expires_at: timestamp(kept.unwrap_or(ctx.now + lease)),
                release_within_seconds: release,
            }
        })
        .collect()
}

/// Unix seconds as a timestamp (clamped to the representable range).
fn timestamp(secs: i64) -> Timestamp {
    Timestamp::from_second(secs.clamp(Timestamp::MIN.as_second(), Timestamp::MAX.as_second()))
        .expect("clamped to the range")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contracts_clients_reach_lanes_json_in_the_lanes_namespace() {
        let lane: LaneContract = serde_json::from_value(serde_json::json!({
            "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "LaneContract",
            "metadata": {"name": "p1", "namespace": "ai-platform"},
            "spec": {
                "profile": "agent-assist", "priority": 1, "workUnitsPerRequest": "1",
                "expectedRequestsPerSecond": "1", "deadlineSeconds": 30,
                "queue": {"maxDepth": 1, "ttlSeconds": 1}, "retry": {"maxAttempts": 1},
                "routes": {"primary": ["r"]},
                "clients": [
                    {"apiKeys": {"secretName": "keys"}, "tenant": "team-a"},
                    {"serviceAccount": {"name": "bot"}},
                    {"serviceAccount": {"namespace": "other", "name": "bot"}},
                    {"jwt": {"issuer": "https://idp", "audience": "lk",
                             "jwksConfigMapKeyRef": {"name": "jwks", "key": "k"}}, "tenantClaim": "team"},
                    {"certificate": {"name": "cn"}}
                ]
            }
        }))
        .unwrap();
        let rules = serde_json::to_value(clients(&lane)).unwrap();
        assert_eq!(
            rules,
            serde_json::json!([
                {"apiKeys": {"namespace": "ai-platform", "secret": "keys"}, "tenant": "team-a"},
                {"serviceAccount": {"namespace": "ai-platform", "name": "bot"}},
                {"serviceAccount": {"namespace": "other", "name": "bot"}},
                {"jwt": {"issuer": "https://idp", "audience": "lk", "jwks":
                    {"configMap": {"namespace": "ai-platform", "name": "jwks", "key": "k"}}},
                 "tenantClaim": "team"},
                {"certificate": {"name": "cn"}}
            ])
        );
    }

    #[test]
    fn the_profiles_breakers_reach_lanes_json_with_per_route_settings() {
        let spec: BreakersSpec = serde_json::from_value(serde_json::json!({
            "default": {"consecutiveFailures": 3},
            "routes": [{"route": "slow", "openSeconds": 30}],
            "fallbackWhenOpen": true
        }))
        .unwrap();
        let b = breakers(&spec);
        assert_eq!(b.for_route("fast").consecutive_failures, 3);
        assert_eq!(b.for_route("fast").open_seconds, 5.0);
        assert_eq!(b.for_route("slow").open_seconds, 30.0);
        // A route's own settings start from the defaults, not `default`.
        assert_eq!(b.for_route("slow").consecutive_failures, 5);
        assert_eq!(b.out_of_range(), None);
    }

    #[test]
    fn the_contracts_tenants_reach_lanes_json_and_none_is_omitted() {
        let contract = |tenants: serde_json::Value| -> LaneContract {
            let mut lane = serde_json::json!({
                "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "LaneContract",
                "metadata": {"name": "p1", "namespace": "ai-platform"},
                "spec": {
                    "profile": "agent-assist", "priority": 1, "workUnitsPerRequest": "1",
                    "expectedRequestsPerSecond": "1", "deadlineSeconds": 30,
                    "queue": {"maxDepth": 1, "ttlSeconds": 1}, "retry": {"maxAttempts": 1},
                    "routes": {"primary": ["r"]}
                }
            });
            if !tenants.is_null() {
                lane["spec"]["tenants"] = tenants;
            }
            serde_json::from_value(lane).unwrap()
        };
        let t = tenants(&contract(serde_json::json!({
            "maxConcurrency": 4,
            "overrides": [{"name": "team-a", "maxConcurrency": 16, "weight": 3}]
        })));
        assert_eq!(
            serde_json::to_value(t).unwrap(),
            serde_json::json!({
                "maxConcurrency": 4,
                "overrides": [{"name": "team-a", "maxConcurrency": 16, "weight": 3}]
            })
        );
        assert_eq!(tenants(&contract(serde_json::Value::Null)), None);
        assert_eq!(tenants(&contract(serde_json::json!({}))), None);
    }

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
