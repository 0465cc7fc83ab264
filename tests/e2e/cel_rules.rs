//! Every CEL rule of the CRDs, evaluated offline (kube-cel) over good and bad
//! objects, so that a broken rule can't ship. Each bad object must be
//! rejected with the rule's own message, the good ones must pass, and every
//! rule in the generated schemas must be exercised by at least one bad case.

use crate::support;

use std::collections::BTreeSet;

use lanekeeper::manifest::cel_errors;
use serde_json::{Value, json};

fn profile() -> Value {
    json!({
        "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "CapacityProfile",
        "metadata": {"name": "agent-assist", "namespace": "ai-platform"},
        "spec": {
            "pool": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-agent-assist"},
                "podSelector": {"matchLabels": {"app": "vllm-agent-assist"}}
            },
            "capacity": {
                "safeUnitsPerSecond": "560", "unitsPerReplica": "70", "warningUtilizationPercent": 85,
                "calibration": {"configHash": "sha256:4f1c0de2", "measuredAt": "2026-07-21T00:00:00Z", "validForSeconds": 7776000}
            },
            "replicas": {"min": 4, "max": 16, "maxScaleUpStep": 4, "scaleDownStabilizationSeconds": 300},
            "inFlight": {"conserveAt": 1350, "stopAt": 1500, "resumeBelow": 1200, "resumeAfterStableSeconds": 300},
            "drain": {"maxDrained": "25%", "minServing": 2, "errorRatioAbove": "0.20", "healthyForSeconds": 120},
            "signals": {
                "prometheus": {
                    "url": "https://prometheus.monitoring:9090", "timeoutSeconds": 5, "stalenessSeconds": 120,
                    "bearerTokenSecretRef": {"name": "prom-token", "key": "token"},
                    "caBundle": {"configMapKeyRef": {"name": "prom-ca", "key": "ca.crt"}},
                    "laneLabel": "lane", "podLabel": "pod",
                    "queries": {
                        "availableUnitsPerSecond": "pool:available_units_per_second",
                        "inFlight": "pool:in_flight", "queueDepth": "pool:queue_depth",
                        "p95LatencySeconds": "pool:p95_latency_seconds", "errorRatio": "pool:error_ratio",
                        "laneRequestsPerSecond": "lane:requests_per_second", "podErrorRatio": "pod:error_ratio"
                    }
                },
                "scrape": {
                    "port": 8000, "path": "/metrics", "intervalSeconds": 15, "timeoutSeconds": 2, "maxConcurrency": 16,
                    "metrics": {
                        "requestsRunning": "vllm:num_requests_running", "requestsWaiting": "vllm:num_requests_waiting",
                        "kvCacheUsage": ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
                        "errorRatio": "model:error_ratio"
                    }
                }
            }
        }
    })
}

fn lane() -> Value {
    json!({
        "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "LaneContract",
        "metadata": {"name": "p3-shift-batch", "namespace": "ai-platform"},
        "spec": {
            "profile": "agent-assist", "priority": 3, "workUnitsPerRequest": "0.45",
            "expectedRequestsPerSecond": "220", "floorUnitsPerSecond": "10", "ceilingUnitsPerSecond": "200",
            "shedding": {"mode": "Defer", "minUnitsPerSecond": "60"},
            "checkpointable": true,
            "borrowing": {"from": ["p0-disruption-assist"], "maxUnitsPerSecond": "60", "leaseSeconds": 300, "releaseWithinSeconds": 30},
            "deadlineSeconds": 7200,
            "expectedServiceSeconds": "30",
            "queue": {"maxDepth": 20000, "ttlSeconds": 7000},
            "retry": {"maxAttempts": 3, "budgetPercent": 5},
            "routes": {"primary": ["batch-medium"], "approvedFallbacks": ["batch-small"]},
            "optionalContext": {"historyTurns": 20, "degradedHistoryTurns": 8},
            "clients": [
                {"apiKeys": {"secretName": "shift-batch-keys"}},
                {"serviceAccount": {"namespace": "batch", "name": "shift-runner"}, "tenant": "shift"},
                {"jwt": {"issuer": "https://idp.example", "audience": "lanekeeper", "jwksUrl": "https://idp.example/jwks", "subject": "svc"}, "tenantClaim": "team"},
                {"jwt": {"issuer": "https://idp.example", "audience": "lanekeeper", "jwksConfigMapKeyRef": {"name": "idp-jwks", "key": "jwks.json"}}},
                {"certificate": {"name": "spiffe://cluster.local/ns/batch/sa/shift-runner"}}
            ],
            "objective": {"withinDeadlinePercent": "99.9", "latencyP99Seconds": "15", "window": "28d"}
        }
    })
}

fn policy() -> Value {
    json!({
        "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "DegradationPolicy",
        "metadata": {"name": "agent-assist-ladder", "namespace": "ai-platform"},
        "spec": {
            "profile": "agent-assist",
            "hysteresis": {"stableForSeconds": 300, "cooldownFactor": "2",
                           "recovery": {"stepsPercent": [1, 10], "stepSeconds": 300}},
            "onMissingTelemetry": "Hold",
            "levels": [
                {"name": "conserve",
                 "enterWhen": {"forSeconds": 60, "utilizationPercentAbove": 85, "inFlightAbove": 1350, "queueDepthAbove": 5000,
                               "p95LatencySecondsAbove": "8", "errorRatioAbove": "0.05",
                               "retryAmplificationAbove": "1.25", "kvCacheUsageAbove": 90,
                               "burnRateAbove": {"lanes": ["p0-disruption-assist"], "factor": "14.4", "windows": ["1h", "5m"]}},
                 "exitWhen": {"utilizationPercentBelow": 80, "inFlightBelow": 1200, "queueDepthBelow": 1000,
                              "p95LatencySecondsBelow": "5", "errorRatioBelow": "0.02", "kvCacheUsageBelow": 70},
                 "actions": {"rejectOptionalContext": true, "limitLongContext": 2}},
                {"name": "shed", "enterWhen": {"overCapacity": true},
                 "actions": {"pause": [{"priorityAtLeast": 4}], "cap": [{"lanes": ["p3-shift-batch"], "unitsPerSecond": "60"}]}},
                {"name": "continuity", "enterWhen": {"overCapacity": true},
                 "approval": {"mode": "Confirm", "timeoutSeconds": 300, "allowUnattended": true,
                              "validForSeconds": 3600},
                 "actions": {"readOnly": true}}
            ]
        }
    })
}

/// Sets (or with `None` removes) the value at a JSON pointer.
fn with(mut v: Value, pointer: &str, new: Option<Value>) -> Value {
    let (parent, last) = pointer.rsplit_once('/').unwrap();
    let target = v
        .pointer_mut(parent)
        .unwrap_or_else(|| panic!("no {parent}"));
    match (target, new) {
        (Value::Object(m), Some(n)) => {
            m.insert(last.to_owned(), n);
        }
        (Value::Object(m), None) => {
            m.remove(last);
        }
        (Value::Array(a), Some(n)) => a[last.parse::<usize>().unwrap()] = n,
        (Value::Array(a), None) => {
            a.remove(last.parse::<usize>().unwrap());
        }
        _ => panic!("{parent} is not a container"),
    }
    v
}

fn kind_of(v: &Value) -> String {
    v["kind"].as_str().unwrap().to_owned()
}

/// (description, object, expected message)
fn bad_cases() -> Vec<(&'static str, Value, &'static str)> {
    let p = profile;
    let l = lane;
    let d = policy;
    vec![
        (
            "a cost whose every term is 0",
            with(
                l(),
                "/spec/cost",
                Some(json!({"perRequest": "0", "perInputToken": "0.0"})),
            ),
            "cost must set at least one of perRequest, perInputToken, perOutputToken greater than 0",
        ),
        (
            "a cost with no term",
            with(l(), "/spec/cost", Some(json!({}))),
            "cost must set at least one of perRequest, perInputToken, perOutputToken greater than 0",
        ),
        (
            "maxInputTokens 0",
            with(l(), "/spec/tokens", Some(json!({"maxInputTokens": 0}))),
            "maxInputTokens must be >= 1",
        ),
        (
            "maxOutputTokens -1",
            with(l(), "/spec/tokens", Some(json!({"maxOutputTokens": -1}))),
            "maxOutputTokens must be >= 1",
        ),
        (
            "capOutputTokens without a selector",
            with(
                d(),
                "/spec/levels/1/actions/capOutputTokens",
                Some(json!([{"tokens": 256}])),
            ),
            "capOutputTokens needs priorityAtLeast or lanes",
        ),
        (
            "capOutputTokens of 0 tokens",
            with(
                d(),
                "/spec/levels/1/actions/capOutputTokens",
                Some(json!([{"priorityAtLeast": 1, "tokens": 0}])),
            ),
            "tokens must be >= 1",
        ),
        (
            "capOutputTokens from priority -1",
            with(
                d(),
                "/spec/levels/1/actions/capOutputTokens",
                Some(json!([{"priorityAtLeast": -1, "tokens": 64}])),
            ),
            "priorityAtLeast must be >= 0",
        ),
        (
            "a tenant maximum of 0",
            with(l(), "/spec/tenants", Some(json!({"maxConcurrency": 0}))),
            "maxConcurrency must be >= 1",
        ),
        (
            "a tenant weight of 1001",
            with(
                l(),
                "/spec/tenants",
                Some(json!({"overrides": [{"name": "team-a", "weight": 1001}]})),
            ),
            "weight must be within 1..1000",
        ),
        (
            "an empty breaker route",
            with(
                p(),
                "/spec/breakers",
                Some(json!({"routes": [{"route": ""}]})),
            ),
            "route must not be empty",
        ),
        (
            "negative consecutive failures",
            with(
                p(),
                "/spec/breakers",
                Some(json!({"default": {"consecutiveFailures": -1}})),
            ),
            "consecutiveFailures must be >= 0",
        ),
        (
            "a failure ratio of 101 %",
            with(
                p(),
                "/spec/breakers",
                Some(json!({"default": {"failureRatioPercent": 101}})),
            ),
            "failureRatioPercent must be within 0..100",
        ),
        (
            "a breaker window of no requests",
            with(
                p(),
                "/spec/breakers",
                Some(json!({"routes": [{"route": "pool", "minRequests": 0}]})),
            ),
            "minRequests must be >= 1",
        ),
        (
            "a breaker window of 0 s",
            with(
                p(),
                "/spec/breakers",
                Some(json!({"default": {"windowSeconds": 0}})),
            ),
            "windowSeconds must be within 1..3600",
        ),
        (
            "a breaker open for over an hour",
            with(
                p(),
                "/spec/breakers",
                Some(json!({"default": {"openSeconds": 3601}})),
            ),
            "openSeconds must be within 0..3600",
        ),
        (
            "a probe jitter of 101 %",
            with(
                p(),
                "/spec/breakers",
                Some(json!({"default": {"probeJitterPercent": 101}})),
            ),
            "probeJitterPercent must be within 0..100",
        ),
        (
            "a breaker that never closes",
            with(
                p(),
                "/spec/breakers",
                Some(json!({"default": {"closeAfterSuccesses": 0}})),
            ),
            "closeAfterSuccesses must be >= 1",
        ),
        // CapacityProfile
        (
            "empty scale target apiVersion",
            with(p(), "/spec/pool/scaleTargetRef/apiVersion", Some(json!(""))),
            "apiVersion must not be empty",
        ),
        (
            "empty scale target kind",
            with(p(), "/spec/pool/scaleTargetRef/kind", Some(json!(""))),
            "kind must not be empty",
        ),
        (
            "empty scale target name",
            with(p(), "/spec/pool/scaleTargetRef/name", Some(json!(""))),
            "name must not be empty",
        ),
        (
            "zero safe capacity",
            with(p(), "/spec/capacity/safeUnitsPerSecond", Some(json!("0"))),
            "safeUnitsPerSecond must be greater than 0",
        ),
        (
            "zero units per replica",
            with(p(), "/spec/capacity/unitsPerReplica", Some(json!("0.0"))),
            "unitsPerReplica must be greater than 0",
        ),
        (
            "warning utilization 0",
            with(
                p(),
                "/spec/capacity/warningUtilizationPercent",
                Some(json!(0)),
            ),
            "warningUtilizationPercent must be within 1..100",
        ),
        (
            "warning utilization 101",
            with(
                p(),
                "/spec/capacity/warningUtilizationPercent",
                Some(json!(101)),
            ),
            "warningUtilizationPercent must be within 1..100",
        ),
        (
            "calibration valid for 0",
            with(
                p(),
                "/spec/capacity/calibration/validForSeconds",
                Some(json!(0)),
            ),
            "validForSeconds must be at least 1",
        ),
        (
            "replicas min > max",
            with(
                with(p(), "/spec/replicas/min", Some(json!(9))),
                "/spec/replicas/max",
                Some(json!(4)),
            ),
            "replicas.min must be <= replicas.max",
        ),
        (
            "replicas min < 0",
            with(p(), "/spec/replicas/min", Some(json!(-1))),
            "min must be >= 0",
        ),
        (
            "replicas max 0",
            with(
                with(p(), "/spec/replicas/max", Some(json!(0))),
                "/spec/replicas/min",
                Some(json!(0)),
            ),
            "max must be >= 1",
        ),
        (
            "maxScaleUpStep 0",
            with(p(), "/spec/replicas/maxScaleUpStep", Some(json!(0))),
            "maxScaleUpStep must be >= 1",
        ),
        (
            "negative stabilization",
            with(
                p(),
                "/spec/replicas/scaleDownStabilizationSeconds",
                Some(json!(-5)),
            ),
            "scaleDownStabilizationSeconds must be >= 0",
        ),
        (
            "resumeBelow >= conserveAt",
            with(p(), "/spec/inFlight/resumeBelow", Some(json!(1350))),
            "inFlight watermarks must satisfy resumeBelow < conserveAt <= stopAt",
        ),
        (
            "conserveAt > stopAt",
            with(p(), "/spec/inFlight/conserveAt", Some(json!(1600))),
            "inFlight watermarks must satisfy resumeBelow < conserveAt <= stopAt",
        ),
        (
            "conserveAt 0",
            with(
                with(
                    with(p(), "/spec/inFlight/conserveAt", Some(json!(0))),
                    "/spec/inFlight/resumeBelow",
                    Some(json!(0)),
                ),
                "/spec/inFlight/stopAt",
                Some(json!(5)),
            ),
            "conserveAt must be >= 1",
        ),
        (
            "stopAt 0",
            with(p(), "/spec/inFlight/stopAt", Some(json!(0))),
            "stopAt must be >= 1",
        ),
        (
            "resumeBelow negative",
            with(p(), "/spec/inFlight/resumeBelow", Some(json!(-1))),
            "resumeBelow must be >= 0",
        ),
        (
            "resumeAfterStableSeconds negative",
            with(
                p(),
                "/spec/inFlight/resumeAfterStableSeconds",
                Some(json!(-1)),
            ),
            "resumeAfterStableSeconds must be >= 0",
        ),
        (
            "maxDrained 120%",
            with(p(), "/spec/drain/maxDrained", Some(json!("120%"))),
            "maxDrained must be a non-negative integer or a percent within 0%..100%",
        ),
        (
            "maxDrained garbage",
            with(p(), "/spec/drain/maxDrained", Some(json!("a quarter"))),
            "maxDrained must be a non-negative integer or a percent within 0%..100%",
        ),
        (
            "maxDrained negative",
            with(p(), "/spec/drain/maxDrained", Some(json!(-1))),
            "maxDrained must be a non-negative integer or a percent within 0%..100%",
        ),
        (
            "minServing negative",
            with(p(), "/spec/drain/minServing", Some(json!(-1))),
            "minServing must be >= 0",
        ),
        (
            "drain error ratio > 1",
            with(p(), "/spec/drain/errorRatioAbove", Some(json!("1.5"))),
            "errorRatioAbove must be within 0..1",
        ),
        (
            "healthyFor negative",
            with(p(), "/spec/drain/healthyForSeconds", Some(json!(-1))),
            "healthyForSeconds must be >= 0",
        ),
        // CapacityProfile: spec.signals
        (
            "prometheus url scheme",
            with(
                p(),
                "/spec/signals/prometheus/url",
                Some(json!("prometheus.monitoring:9090")),
            ),
            "url must start with http:// or https://",
        ),
        (
            "prometheus timeout 0",
            with(
                p(),
                "/spec/signals/prometheus/timeoutSeconds",
                Some(json!(0)),
            ),
            "timeoutSeconds must be between 1 and 60",
        ),
        (
            "prometheus timeout over a minute",
            with(
                p(),
                "/spec/signals/prometheus/timeoutSeconds",
                Some(json!(61)),
            ),
            "timeoutSeconds must be between 1 and 60",
        ),
        (
            "prometheus staleness 0",
            with(
                p(),
                "/spec/signals/prometheus/stalenessSeconds",
                Some(json!(0)),
            ),
            "stalenessSeconds must be > 0",
        ),
        (
            "Prometheus interval 0",
            with(
                p(),
                "/spec/signals/prometheus/intervalSeconds",
                Some(json!(0)),
            ),
            "intervalSeconds must be between 1 and 3600",
        ),
        (
            "Prometheus interval over an hour",
            with(
                p(),
                "/spec/signals/prometheus/intervalSeconds",
                Some(json!(3601)),
            ),
            "intervalSeconds must be between 1 and 3600",
        ),
        (
            "bearer token secret name empty",
            with(
                p(),
                "/spec/signals/prometheus/bearerTokenSecretRef/name",
                Some(json!("")),
            ),
            "name must not be empty",
        ),
        (
            "bearer token key empty",
            with(
                p(),
                "/spec/signals/prometheus/bearerTokenSecretRef/key",
                Some(json!("")),
            ),
            "key must not be empty",
        ),
        (
            "caBundle with both sources",
            with(
                p(),
                "/spec/signals/prometheus/caBundle/secretKeyRef",
                Some(json!({"name": "s", "key": "ca.crt"})),
            ),
            "caBundle needs exactly one of configMapKeyRef and secretKeyRef",
        ),
        (
            "laneLabel not a label name",
            with(
                p(),
                "/spec/signals/prometheus/laneLabel",
                Some(json!("lane-name")),
            ),
            "laneLabel must be a Prometheus label name",
        ),
        (
            "podLabel not a label name",
            with(
                p(),
                "/spec/signals/prometheus/podLabel",
                Some(json!("1pod")),
            ),
            "podLabel must be a Prometheus label name",
        ),
        (
            "empty query availableUnitsPerSecond",
            with(
                p(),
                "/spec/signals/prometheus/queries/availableUnitsPerSecond",
                Some(json!("  ")),
            ),
            "a query must not be empty",
        ),
        (
            "empty query inFlight",
            with(
                p(),
                "/spec/signals/prometheus/queries/inFlight",
                Some(json!("  ")),
            ),
            "a query must not be empty",
        ),
        (
            "empty query queueDepth",
            with(
                p(),
                "/spec/signals/prometheus/queries/queueDepth",
                Some(json!("  ")),
            ),
            "a query must not be empty",
        ),
        (
            "empty query p95LatencySeconds",
            with(
                p(),
                "/spec/signals/prometheus/queries/p95LatencySeconds",
                Some(json!("  ")),
            ),
            "a query must not be empty",
        ),
        (
            "empty query errorRatio",
            with(
                p(),
                "/spec/signals/prometheus/queries/errorRatio",
                Some(json!("  ")),
            ),
            "a query must not be empty",
        ),
        (
            "empty query laneRequestsPerSecond",
            with(
                p(),
                "/spec/signals/prometheus/queries/laneRequestsPerSecond",
                Some(json!("  ")),
            ),
            "a query must not be empty",
        ),
        (
            "empty query podErrorRatio",
            with(
                p(),
                "/spec/signals/prometheus/queries/podErrorRatio",
                Some(json!("  ")),
            ),
            "a query must not be empty",
        ),
        (
            "scrape port 0",
            with(p(), "/spec/signals/scrape/port", Some(json!(0))),
            "port must be within 1..65535",
        ),
        (
            "scrape port 65536",
            with(p(), "/spec/signals/scrape/port", Some(json!(65536))),
            "port must be within 1..65535",
        ),
        (
            "scrape path relative",
            with(p(), "/spec/signals/scrape/path", Some(json!("metrics"))),
            "path must start with /",
        ),
        (
            "long context above 0 input tokens",
            with(
                p(),
                "/spec/longContext",
                Some(json!({"aboveInputTokens": 0, "maxConcurrency": 4})),
            ),
            "aboveInputTokens must be >= 1",
        ),
        (
            "long context of 0 places",
            with(
                p(),
                "/spec/longContext",
                Some(json!({"aboveInputTokens": 8000, "maxConcurrency": 0})),
            ),
            "maxConcurrency must be >= 1",
        ),
        (
            "scrape interval 0",
            with(p(), "/spec/signals/scrape/intervalSeconds", Some(json!(0))),
            "intervalSeconds must be between 1 and 3600",
        ),
        (
            "scrape interval over an hour",
            with(
                p(),
                "/spec/signals/scrape/intervalSeconds",
                Some(json!(3601)),
            ),
            "intervalSeconds must be between 1 and 3600",
        ),
        (
            "scrape timeout 0",
            with(p(), "/spec/signals/scrape/timeoutSeconds", Some(json!(0))),
            "timeoutSeconds must be between 1 and 60",
        ),
        (
            "scrape timeout over a minute",
            with(p(), "/spec/signals/scrape/timeoutSeconds", Some(json!(61))),
            "timeoutSeconds must be between 1 and 60",
        ),
        (
            "scrape concurrency 0",
            with(p(), "/spec/signals/scrape/maxConcurrency", Some(json!(0))),
            "maxConcurrency must be between 1 and 64",
        ),
        (
            "scrape concurrency past what the controller holds",
            with(p(), "/spec/signals/scrape/maxConcurrency", Some(json!(65))),
            "maxConcurrency must be between 1 and 64",
        ),
        (
            "scrape running name empty",
            with(
                p(),
                "/spec/signals/scrape/metrics/requestsRunning",
                Some(json!("")),
            ),
            "metric names must not be empty",
        ),
        (
            "scrape waiting name empty",
            with(
                p(),
                "/spec/signals/scrape/metrics/requestsWaiting",
                Some(json!("")),
            ),
            "metric names must not be empty",
        ),
        (
            "scrape error ratio name empty",
            with(
                p(),
                "/spec/signals/scrape/metrics/errorRatio",
                Some(json!("")),
            ),
            "metric names must not be empty",
        ),
        // LaneContract
        (
            "objective of 100 %",
            with(
                l(),
                "/spec/objective/withinDeadlinePercent",
                Some(json!("100")),
            ),
            "withinDeadlinePercent must be within (0, 100)",
        ),
        (
            "objective of 0 %",
            with(
                l(),
                "/spec/objective/withinDeadlinePercent",
                Some(json!("0")),
            ),
            "withinDeadlinePercent must be within (0, 100)",
        ),
        (
            "objective window under an hour",
            with(l(), "/spec/objective/window", Some(json!("59m"))),
            "window must be at least 1h",
        ),
        (
            "objective window of zero days",
            with(l(), "/spec/objective/window", Some(json!("0d"))),
            "window must be a whole number of minutes, hours, days or weeks, such as 28d",
        ),
        (
            "objective window in years",
            with(l(), "/spec/objective/window", Some(json!("1y"))),
            "window must be a whole number of minutes, hours, days or weeks, such as 28d",
        ),
        (
            "objective p99 of zero",
            with(l(), "/spec/objective/latencyP99Seconds", Some(json!("0"))),
            "latencyP99Seconds must be greater than 0",
        ),
        (
            "floor > ceiling",
            with(l(), "/spec/floorUnitsPerSecond", Some(json!("250"))),
            "floorUnitsPerSecond must be <= ceilingUnitsPerSecond",
        ),
        (
            "borrowing without checkpointable",
            with(l(), "/spec/checkpointable", Some(json!(false))),
            "borrowing requires checkpointable: true",
        ),
        (
            "empty profile",
            with(l(), "/spec/profile", Some(json!(""))),
            "profile must not be empty",
        ),
        (
            "negative priority",
            with(l(), "/spec/priority", Some(json!(-1))),
            "priority must be >= 0",
        ),
        (
            "weight 0",
            with(l(), "/spec/weight", Some(json!(0))),
            "weight must be >= 1",
        ),
        (
            "zero work units",
            with(l(), "/spec/workUnitsPerRequest", Some(json!("0"))),
            "workUnitsPerRequest must be greater than 0",
        ),
        (
            "Defer without min",
            with(l(), "/spec/shedding/minUnitsPerSecond", None),
            "shedding.mode Defer requires minUnitsPerSecond",
        ),
        (
            "borrowing from nobody",
            with(l(), "/spec/borrowing/from", Some(json!([]))),
            "borrowing.from must name at least one lane",
        ),
        (
            "lease 0",
            with(l(), "/spec/borrowing/leaseSeconds", Some(json!(0))),
            "leaseSeconds must be >= 1",
        ),
        (
            "release negative",
            with(l(), "/spec/borrowing/releaseWithinSeconds", Some(json!(-1))),
            "releaseWithinSeconds must be >= 0",
        ),
        (
            "deadline 0",
            with(l(), "/spec/deadlineSeconds", Some(json!(0))),
            "deadlineSeconds must be >= 1",
        ),
        (
            "queue depth negative",
            with(l(), "/spec/queue/maxDepth", Some(json!(-1))),
            "maxDepth must be >= 0",
        ),
        (
            "queue ttl as long as the deadline",
            with(
                with(l(), "/spec/expectedServiceSeconds", None),
                "/spec/queue/ttlSeconds",
                Some(json!(7200)),
            ),
            "queue.ttlSeconds must be less than deadlineSeconds: a request that waits its whole TTL has no time left to be served",
        ),
        (
            "queue ttl plus service time past the deadline",
            with(l(), "/spec/expectedServiceSeconds", Some(json!("200.5"))),
            "queue.ttlSeconds + expectedServiceSeconds must be <= deadlineSeconds",
        ),
        (
            "queue ttl negative",
            with(l(), "/spec/queue/ttlSeconds", Some(json!(-1))),
            "ttlSeconds must be >= 0",
        ),
        (
            "maxAttempts 0",
            with(l(), "/spec/retry/maxAttempts", Some(json!(0))),
            "maxAttempts must be >= 1",
        ),
        (
            "budget 101",
            with(l(), "/spec/retry/budgetPercent", Some(json!(101))),
            "budgetPercent must be within 0..100",
        ),
        (
            "budget -1",
            with(l(), "/spec/retry/budgetPercent", Some(json!(-1))),
            "budgetPercent must be within 0..100",
        ),
        (
            "no primary route",
            with(l(), "/spec/routes/primary", Some(json!([]))),
            "routes.primary must name at least one route",
        ),
        (
            "degraded history > history",
            with(
                l(),
                "/spec/optionalContext/degradedHistoryTurns",
                Some(json!(30)),
            ),
            "degradedHistoryTurns must be <= historyTurns",
        ),
        (
            "history negative",
            with(
                with(l(), "/spec/optionalContext/historyTurns", Some(json!(-1))),
                "/spec/optionalContext/degradedHistoryTurns",
                Some(json!(-2)),
            ),
            "historyTurns must be >= 0",
        ),
        (
            "degraded history negative",
            with(
                l(),
                "/spec/optionalContext/degradedHistoryTurns",
                Some(json!(-1)),
            ),
            "degradedHistoryTurns must be >= 0",
        ),
        // LaneContract clients
        (
            "a client with two identity kinds",
            with(
                l(),
                "/spec/clients/0/certificate",
                Some(json!({"name": "x"})),
            ),
            "a client names exactly one of apiKeys, serviceAccount, jwt and certificate",
        ),
        (
            "a client with no identity",
            with(l(), "/spec/clients/0/apiKeys", None),
            "a client names exactly one of apiKeys, serviceAccount, jwt and certificate",
        ),
        (
            "tenantClaim on a certificate client",
            with(l(), "/spec/clients/4/tenantClaim", Some(json!("team"))),
            "tenantClaim is for jwt clients only",
        ),
        (
            "tenant and tenantClaim",
            with(l(), "/spec/clients/2/tenant", Some(json!("team-a"))),
            "give tenant or tenantClaim, not both",
        ),
        (
            "empty tenant",
            with(l(), "/spec/clients/1/tenant", Some(json!(""))),
            "tenant must not be empty",
        ),
        (
            "empty tenantClaim",
            with(l(), "/spec/clients/2/tenantClaim", Some(json!(""))),
            "tenantClaim must not be empty",
        ),
        (
            "empty secretName",
            with(l(), "/spec/clients/0/apiKeys/secretName", Some(json!(""))),
            "secretName must not be empty",
        ),
        (
            "empty ServiceAccount namespace",
            with(
                l(),
                "/spec/clients/1/serviceAccount/namespace",
                Some(json!("")),
            ),
            "namespace must not be empty",
        ),
        (
            "empty ServiceAccount name",
            with(l(), "/spec/clients/1/serviceAccount/name", Some(json!(""))),
            "name must not be empty",
        ),
        (
            "a JWKS URL and a ConfigMap",
            with(
                l(),
                "/spec/clients/2/jwt/jwksConfigMapKeyRef",
                Some(json!({"name": "jwks", "key": "k"})),
            ),
            "jwt needs exactly one of jwksUrl and jwksConfigMapKeyRef",
        ),
        (
            "no JWKS",
            with(l(), "/spec/clients/2/jwt/jwksUrl", None),
            "jwt needs exactly one of jwksUrl and jwksConfigMapKeyRef",
        ),
        (
            "a JWKS over plain http",
            with(
                l(),
                "/spec/clients/2/jwt/jwksUrl",
                Some(json!("http://idp.example/jwks")),
            ),
            "jwksUrl must be an https:// URL",
        ),
        (
            "empty issuer",
            with(l(), "/spec/clients/2/jwt/issuer", Some(json!(""))),
            "issuer must not be empty",
        ),
        (
            "empty audience",
            with(l(), "/spec/clients/2/jwt/audience", Some(json!(""))),
            "audience must not be empty",
        ),
        (
            "empty subject",
            with(l(), "/spec/clients/2/jwt/subject", Some(json!(""))),
            "subject must not be empty",
        ),
        (
            "empty certificate name",
            with(l(), "/spec/clients/4/certificate/name", Some(json!(""))),
            "name must not be empty",
        ),
        // DegradationPolicy
        (
            "duplicate level names",
            with(d(), "/spec/levels/1/name", Some(json!("conserve"))),
            "level names must be unique",
        ),
        (
            "EnterLevel without level",
            with(d(), "/spec/onMissingTelemetry", Some(json!("EnterLevel"))),
            "onMissingTelemetry EnterLevel requires missingTelemetryLevel within 1..number of levels",
        ),
        (
            "EnterLevel beyond ladder",
            with(
                with(d(), "/spec/onMissingTelemetry", Some(json!("EnterLevel"))),
                "/spec/missingTelemetryLevel",
                Some(json!(4)),
            ),
            "onMissingTelemetry EnterLevel requires missingTelemetryLevel within 1..number of levels",
        ),
        (
            "missingTelemetryLevel 0",
            with(d(), "/spec/missingTelemetryLevel", Some(json!(0))),
            "missingTelemetryLevel must be >= 1",
        ),
        (
            "empty policy profile",
            with(d(), "/spec/profile", Some(json!(""))),
            "profile must not be empty",
        ),
        (
            "negative stable window",
            with(d(), "/spec/hysteresis/stableForSeconds", Some(json!(-1))),
            "stableForSeconds must be >= 0",
        ),
        (
            "level without trigger",
            with(d(), "/spec/levels/1/enterWhen", Some(json!({}))),
            "enterWhen needs at least one trigger",
        ),
        (
            "overCapacity false is no trigger",
            with(
                d(),
                "/spec/levels/1/enterWhen",
                Some(json!({"overCapacity": false})),
            ),
            "enterWhen needs at least one trigger",
        ),
        (
            "utilization above 101",
            with(
                d(),
                "/spec/levels/0/enterWhen/utilizationPercentAbove",
                Some(json!(101)),
            ),
            "utilizationPercentAbove must be within 0..100",
        ),
        (
            "inFlightAbove negative",
            with(
                d(),
                "/spec/levels/0/enterWhen/inFlightAbove",
                Some(json!(-1)),
            ),
            "inFlightAbove must be >= 0",
        ),
        (
            "queueDepthAbove negative",
            with(
                d(),
                "/spec/levels/0/enterWhen/queueDepthAbove",
                Some(json!(-1)),
            ),
            "queueDepthAbove must be >= 0",
        ),
        (
            "enter error ratio > 1",
            with(
                d(),
                "/spec/levels/0/enterWhen/errorRatioAbove",
                Some(json!("2")),
            ),
            "errorRatioAbove must be within 0..1",
        ),
        (
            "utilization below -1",
            with(
                d(),
                "/spec/levels/0/exitWhen/utilizationPercentBelow",
                Some(json!(-1)),
            ),
            "utilizationPercentBelow must be within 0..100",
        ),
        (
            "inFlightBelow negative",
            with(
                d(),
                "/spec/levels/0/exitWhen/inFlightBelow",
                Some(json!(-1)),
            ),
            "inFlightBelow must be >= 0",
        ),
        (
            "queueDepthBelow negative",
            with(
                d(),
                "/spec/levels/0/exitWhen/queueDepthBelow",
                Some(json!(-1)),
            ),
            "queueDepthBelow must be >= 0",
        ),
        (
            "exit error ratio > 1",
            with(
                d(),
                "/spec/levels/0/exitWhen/errorRatioBelow",
                Some(json!("1.01")),
            ),
            "errorRatioBelow must be within 0..1",
        ),
        (
            "KV-cache trigger above 100 %",
            with(
                d(),
                "/spec/levels/0/enterWhen/kvCacheUsageAbove",
                Some(json!(101)),
            ),
            "kvCacheUsageAbove must be within 0..100",
        ),
        (
            "KV-cache exit below 0 %",
            with(
                d(),
                "/spec/levels/0/exitWhen/kvCacheUsageBelow",
                Some(json!(-1)),
            ),
            "kvCacheUsageBelow must be within 0..100",
        ),
        (
            "long-context limit of 0",
            with(
                d(),
                "/spec/levels/0/actions/limitLongContext",
                Some(json!(0)),
            ),
            "limitLongContext must be >= 1",
        ),
        (
            "empty pause selector",
            with(d(), "/spec/levels/1/actions/pause/0", Some(json!({}))),
            "a lane selector needs priorityAtLeast or lanes",
        ),
        (
            "negative pause priority",
            with(
                d(),
                "/spec/levels/1/actions/pause/0/priorityAtLeast",
                Some(json!(-1)),
            ),
            "priorityAtLeast must be >= 0",
        ),
        (
            "cap without selector",
            with(
                d(),
                "/spec/levels/1/actions/cap/0",
                Some(json!({"unitsPerSecond": "60"})),
            ),
            "a cap needs priorityAtLeast or lanes",
        ),
        (
            "read-only level entered unattended without saying so",
            with(d(), "/spec/levels/2/approval/allowUnattended", None),
            "a level that sets readOnly or staticFallback needs approval mode Manual (a person confirms what users will see), unless approval.allowUnattended is true",
        ),
        (
            "approval valid for 0 s",
            with(
                d(),
                "/spec/levels/2/approval/validForSeconds",
                Some(json!(0)),
            ),
            "validForSeconds must be >= 1",
        ),
        (
            "negative forSeconds",
            with(d(), "/spec/levels/0/enterWhen/forSeconds", Some(json!(-1))),
            "forSeconds must be >= 0",
        ),
        (
            "retry amplification below 1",
            with(
                d(),
                "/spec/levels/0/enterWhen/retryAmplificationAbove",
                Some(json!("0.5")),
            ),
            "retryAmplificationAbove must be >= 1",
        ),
        (
            "burn-rate trigger without lanes",
            with(
                d(),
                "/spec/levels/0/enterWhen/burnRateAbove/lanes",
                Some(json!([])),
            ),
            "burnRateAbove.lanes must name at least one lane",
        ),
        (
            "burn-rate trigger without windows",
            with(
                d(),
                "/spec/levels/0/enterWhen/burnRateAbove/windows",
                Some(json!([])),
            ),
            "burnRateAbove.windows must name at least one window",
        ),
        (
            "burn-rate factor 0",
            with(
                d(),
                "/spec/levels/0/enterWhen/burnRateAbove/factor",
                Some(json!("0")),
            ),
            "burnRateAbove.factor must be greater than 0",
        ),
        (
            "cool-down factor 101",
            with(d(), "/spec/hysteresis/cooldownFactor", Some(json!("101"))),
            "cooldownFactor must be within 0..100",
        ),
        (
            "recovery stage of 0 s",
            with(d(), "/spec/hysteresis/recovery/stepSeconds", Some(json!(0))),
            "stepSeconds must be >= 1",
        ),
        (
            "recovery stage of 0 %",
            with(
                d(),
                "/spec/hysteresis/recovery/stepsPercent",
                Some(json!([0, 10])),
            ),
            "stepsPercent must be within 1..100",
        ),
        (
            "recovery stage repeated",
            with(
                d(),
                "/spec/hysteresis/recovery/stepsPercent",
                Some(json!([10, 10])),
            ),
            "stepsPercent must not repeat a value",
        ),
        (
            "recovery stages decreasing",
            with(
                d(),
                "/spec/hysteresis/recovery/stepsPercent",
                Some(json!([10, 1])),
            ),
            "stepsPercent must increase: each stage larger than the one before",
        ),
        (
            "recovery stages decreasing at the tenth",
            with(
                d(),
                "/spec/hysteresis/recovery/stepsPercent",
                Some(json!([1, 2, 3, 4, 5, 6, 7, 8, 10, 9])),
            ),
            "stepsPercent must increase: each stage larger than the one before",
        ),
        (
            "Confirm without timeout",
            with(d(), "/spec/levels/2/approval/timeoutSeconds", None),
            "approval mode Confirm needs timeoutSeconds > 0",
        ),
        (
            "Confirm with timeout 0",
            with(
                d(),
                "/spec/levels/2/approval/timeoutSeconds",
                Some(json!(0)),
            ),
            "approval mode Confirm needs timeoutSeconds > 0",
        ),
    ]
}

/// Good objects besides the three above: boundary values that must pass.
fn good_variants() -> Vec<(&'static str, Value)> {
    vec![
        (
            "a cost of output tokens alone, and token limits of 1",
            with(
                with(
                    lane(),
                    "/spec/cost",
                    Some(json!({"perRequest": "0", "perOutputToken": "0.002"})),
                ),
                "/spec/tokens",
                Some(json!({"maxInputTokens": 1, "maxOutputTokens": 1})),
            ),
        ),
        (
            "recovery stages increasing, up to 100 %",
            with(
                policy(),
                "/spec/hysteresis/recovery/stepsPercent",
                Some(json!([1, 10, 100])),
            ),
        ),
        (
            "ten recovery stages, increasing",
            with(
                policy(),
                "/spec/hysteresis/recovery/stepsPercent",
                Some(json!([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])),
            ),
        ),
        (
            "a cost of input tokens alone",
            with(
                lane(),
                "/spec/cost",
                Some(json!({"perInputToken": "0.0001"})),
            ),
        ),
        (
            "a level entered by KV-cache pressure alone",
            with(
                policy(),
                "/spec/levels/1/enterWhen",
                Some(json!({"kvCacheUsageAbove": 95})),
            ),
        ),
        (
            "capOutputTokens by name and by priority",
            with(
                policy(),
                "/spec/levels/1/actions/capOutputTokens",
                Some(json!([{"lanes": ["p1-agent-assist"], "tokens": 1},
                            {"priorityAtLeast": 0, "tokens": 512}])),
            ),
        ),
        (
            "a level entered by a burn rate alone",
            with(
                policy(),
                "/spec/levels/1/enterWhen",
                Some(
                    json!({"burnRateAbove": {"lanes": ["p0-disruption-assist"], "factor": "6", "windows": ["6h", "30m"]}}),
                ),
            ),
        ),
        (
            "objective window of exactly an hour, in minutes",
            with(lane(), "/spec/objective/window", Some(json!("60m"))),
        ),
        (
            "objective window of exactly an hour",
            with(lane(), "/spec/objective/window", Some(json!("1h"))),
        ),
        (
            "objective just under 100 %",
            with(
                lane(),
                "/spec/objective/withinDeadlinePercent",
                Some(json!("99.999")),
            ),
        ),
        (
            "objective without a window (28d)",
            with(lane(), "/spec/objective/window", None),
        ),
        (
            "resumeAfterStableSeconds 0 (resume as soon as below resumeBelow)",
            with(
                profile(),
                "/spec/inFlight/resumeAfterStableSeconds",
                Some(json!(0)),
            ),
        ),
        (
            "no resumeAfterStableSeconds (the gateway's default, 300)",
            with(profile(), "/spec/inFlight/resumeAfterStableSeconds", None),
        ),
    ]
}

#[test]
fn good_objects_pass_every_rule() {
    for obj in [profile(), lane(), policy()] {
        let errs = cel_errors(&kind_of(&obj), &obj);
        assert!(errs.is_empty(), "{} rejected: {errs:?}", kind_of(&obj));
    }
    for (what, obj) in good_variants() {
        let errs = cel_errors(&kind_of(&obj), &obj);
        assert!(errs.is_empty(), "{what} rejected: {errs:?}");
    }
    // The INC-47 example as shipped.
    let loaded = lanekeeper::manifest::load(&[std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/inc-47"
    ))])
    .unwrap();
    assert_eq!(loaded.world.profiles.len(), 1);
    assert_eq!(loaded.world.lanes.len(), 5);
    assert_eq!(loaded.world.policies.len(), 1);
}

#[test]
fn bad_objects_are_rejected_with_the_rules_message() {
    let mut failures = Vec::new();
    for (what, obj, message) in bad_cases() {
        let errs = cel_errors(&kind_of(&obj), &obj);
        if !errs.iter().any(|(_, m)| m == message) {
            failures.push(format!("{what}: expected {message:?}, got {errs:?}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn every_rule_is_exercised_by_a_bad_case() {
    fn collect(v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::Array(rules)) = m.get("x-kubernetes-validations") {
                    for r in rules {
                        out.insert(
                            r["message"]
                                .as_str()
                                .expect("every rule has a message")
                                .to_owned(),
                        );
                    }
                }
                m.values().for_each(|c| collect(c, out));
            }
            Value::Array(a) => a.iter().for_each(|c| collect(c, out)),
            _ => {}
        }
    }
    let mut messages = BTreeSet::new();
    for crd in lanekeeper::api::crds() {
        collect(&serde_json::to_value(&crd).unwrap(), &mut messages);
    }
    let covered: BTreeSet<String> = bad_cases()
        .into_iter()
        .map(|(_, _, m)| m.to_owned())
        .collect();
    let untested: Vec<&String> = messages.difference(&covered).collect();
    assert!(
        untested.is_empty(),
        "CEL rules without a bad case: {untested:#?}"
    );
    assert!(
        messages.len() >= 40,
        "expected the full rule set, found {}",
        messages.len()
    );
}

#[test]
fn the_issues_examples_are_rejected_offline_too() {
    // replicas.min 9 > max 4: a CEL rule.
    let obj = with(
        with(profile(), "/spec/replicas/min", Some(json!(9))),
        "/spec/replicas/max",
        Some(json!(4)),
    );
    let errs = cel_errors("CapacityProfile", &obj);
    assert!(
        errs.iter().any(
            |(f, m)| f == "spec.replicas" && m.contains("replicas.min must be <= replicas.max")
        ),
        "{errs:?}"
    );
    // priority "high": the schema types priority as an integer, which the API
    // server's structural validation enforces before CEL runs.
    let crd = serde_json::to_value(lanekeeper::api::crds()[1].clone()).unwrap();
    let ty = crd.pointer(
        "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/priority/type",
    );
    assert_eq!(ty, Some(&json!("integer")));
}

/// Every case above, sent to a real API server (server-side dry run, so
/// nothing is stored): the server and the offline evaluator agree on accept
/// or reject for every one, and a rejection carries the rule's message.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_api_server_agrees_with_the_offline_evaluator() {
    use kube::api::{DynamicObject, PostParams};
    let Some(c) =
        support::cluster::connect("the_real_api_server_agrees_with_the_offline_evaluator").await
    else {
        return;
    };
    let _shared = crate::world::CLUSTER.read().await; // not during the restart test
    c.operator_release(); // installs the CRDs with the chart
    let ns = c.namespace("cel").await;
    let mut cases: Vec<(String, Value, Option<&'static str>)> = [profile(), lane(), policy()]
        .into_iter()
        .map(|o| (format!("good {}", kind_of(&o)), o, None))
        .collect();
    cases.extend(
        good_variants()
            .into_iter()
            .map(|(what, o)| (format!("good: {what}"), o, None)),
    );
    cases.extend(
        bad_cases()
            .into_iter()
            .map(|(what, o, m)| (what.to_owned(), o, Some(m))),
    );
    let dry_run = PostParams {
        dry_run: true,
        field_manager: None,
    };
    let mut disagreements = Vec::new();
    for (what, mut obj, message) in cases {
        obj["metadata"]["namespace"] = json!(ns.name);
        let offline = cel_errors(&kind_of(&obj), &obj);
        let api = support::cluster::dynamic(&c.client, &obj);
        let dynobj: DynamicObject = serde_json::from_value(obj.clone()).unwrap();
        let server = api.create(&dry_run, &dynobj).await;
        match (message, server) {
            (None, Ok(_)) if offline.is_empty() => {}
            (None, Ok(_)) => disagreements.push(format!(
                "{what}: offline rejects {offline:?}, the server accepts"
            )),
            (None, Err(e)) => {
                disagreements.push(format!("{what}: the server rejects a good object: {e}"))
            }
            (Some(m), Ok(_)) => {
                disagreements.push(format!("{what}: the server accepts (offline: {m:?})"))
            }
            (Some(m), Err(kube::Error::Api(s))) => {
                if s.code != 422 || !s.message.contains(m) {
                    disagreements.push(format!(
                        "{what}: the server rejects with {} {:?}, offline with {m:?}",
                        s.code, s.message
                    ));
                }
            }
            (Some(_), Err(e)) => disagreements.push(format!("{what}: {e}")),
        }
    }
    assert!(
        disagreements.is_empty(),
        "the real API server and the offline evaluator disagree:\n{}",
        disagreements.join("\n")
    );
}
