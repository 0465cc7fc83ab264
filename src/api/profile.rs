//! `CapacityProfile`: one GPU inference pool and what it can safely serve.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::common::Decimal;

/// The measured capacity of one GPU inference pool, how it may be scaled and
/// drained, and where its live signals come from.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "lanekeeper.dev",
    version = "v1alpha1",
    kind = "CapacityProfile",
    namespaced,
    doc = "A CapacityProfile describes one GPU inference pool: its measured safe capacity in work units per second, replica bounds, in-flight watermarks and the drain bound.",
    status = "CapacityProfileStatus",
    shortname = "capprof",
    category = "lanekeeper",
    printcolumn = r#"{"name":"Level","type":"string","jsonPath":".status.levelName","description":"Current degradation level"}"#,
    printcolumn = r#"{"name":"Capacity","type":"number","jsonPath":".status.capacityUnitsPerSecond","description":"Capacity in work units/s"}"#,
    printcolumn = r#"{"name":"Demand","type":"number","jsonPath":".status.demandUnitsPerSecond","description":"Demand in work units/s"}"#,
    printcolumn = r#"{"name":"Admitted","type":"number","jsonPath":".status.admittedUnitsPerSecond","description":"Admitted work units/s"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".status.desiredReplicas","description":"Desired replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas","description":"Ready replicas"}"#,
    printcolumn = r#"{"name":"Telemetry","type":"string","jsonPath":".status.telemetry","description":"Known or Unknown"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CapacityProfileSpec {
    /// The pool of model-server pods this profile describes.
    pub pool: PoolSpec,
    /// The pool's measured safe capacity.
    pub capacity: CapacitySpec,
    /// Bounds for the pool size that lanekeeper writes to the scale target.
    pub replicas: ReplicasSpec,
    /// How lanekeeper writes the pool size: directly, not at all, or through an
    /// existing HorizontalPodAutoscaler's minimum.
    #[serde(default)]
    pub scaling: ScalingSpec,
    /// In-flight watermarks: real-time admission reflexes that the gateway
    /// applies per request (passed through in the gateway config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<InFlightSpec>,
    /// The bound and the per-pod triggers for taking misbehaving pods out of
    /// rotation. Without it no pod is ever drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainSpec>,
    /// Where live signals come from besides the cluster itself: PromQL
    /// queries against a Prometheus server and scrapes of the pool's own
    /// model-server pods. Without it, capacity comes from ready replicas and
    /// lane demand from `expectedRequestsPerSecond`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signals: Option<SignalsSpec>,
    /// The circuit breaker the gateway keeps for each route (passed through
    /// in the gateway config). Without it every route gets the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breakers: Option<super::breakers::BreakersSpec>,
    /// The pool's model slots: most requests in flight to it at once,
    /// every lane's (passed through in the gateway config). Without it
    /// only the in-flight watermarks hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<super::pool_limits::ConcurrencySpec>,
    /// The pool's long-context limit: most requests above a number of
    /// input tokens in flight at once (passed through in the gateway
    /// config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub long_context: Option<super::pool_limits::LongContextSpec>,
}

/// The pool of model-server pods.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolSpec {
    /// The workload whose scale subresource sets the pool size (any kind with a
    /// scale subresource: Deployment, StatefulSet, LeaderWorkerSet, ...).
    pub scale_target_ref: ScaleTargetRef,
    /// Selects the pool's pods (same namespace). Used to count ready pods and
    /// to find drain candidates.
    pub pod_selector: LabelSelector,
}

/// A reference to a workload with a scale subresource.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleTargetRef {
    /// API version of the workload, e.g. `apps/v1`.
    #[x_kube(validation = Rule::new("self != ''").message("apiVersion must not be empty"))]
    pub api_version: String,
    /// Kind of the workload, e.g. `Deployment`.
    #[x_kube(validation = Rule::new("self != ''").message("kind must not be empty"))]
    pub kind: String,
    /// Name of the workload, in the profile's namespace.
    #[x_kube(validation = Rule::new("self != ''").message("name must not be empty"))]
    pub name: String,
}

/// Measured capacity of the pool.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("quantity(self.safeUnitsPerSecond).isGreaterThan(quantity('0'))").message("safeUnitsPerSecond must be greater than 0"))]
#[x_kube(validation = Rule::new("quantity(self.unitsPerReplica).isGreaterThan(quantity('0'))").message("unitsPerReplica must be greater than 0"))]
pub struct CapacitySpec {
    /// The pool's calibrated safe capacity in work units per second: the
    /// last load-test step at which every quality, tail-latency, error and
    /// memory gate still held. Never a live measurement: it is assumed only
    /// where nothing measures (admission before any capacity was ever known,
    /// `plan` without signals, `simulate` without a capacity curve).
    pub safe_units_per_second: Decimal,
    /// Work units per second one ready replica serves safely. Capacity from
    /// ready replicas is `readyReplicas × unitsPerReplica`; pool sizing divides
    /// demand by it.
    pub units_per_replica: Decimal,
    /// Utilization (demand ÷ capacity, in percent) above which the pool is
    /// considered hot. Also the target utilization for pool sizing.
    #[serde(default = "default_warning_utilization")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 100").message("warningUtilizationPercent must be within 1..100"))]
    pub warning_utilization_percent: i32,
    /// Where the capacity figures come from: the controller checks them
    /// against the pool's pod template and for expiry (the `Calibrated`
    /// condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<CalibrationSpec>,
    /// What a stale calibration (`Calibrated` False: `PoolChanged` or
    /// `Expired`) does. `Warn` (default): a condition and an event only.
    /// `Hold`: the capacity derived from calibration numbers (`readyReplicas
    /// × unitsPerReplica`, ready pods × `unitsPerReplica`, and
    /// `safeUnitsPerSecond` as admission's fallback) is Unknown; a measured
    /// `availableUnitsPerSecond` still counts.
    #[serde(default)]
    pub on_stale_calibration: StaleCalibrationMode,
}

/// What a stale calibration does.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum StaleCalibrationMode {
    /// Report it (the `Calibrated` condition and an event); decide as before.
    #[default]
    Warn,
    /// Treat the capacity derived from calibration numbers as Unknown.
    Hold,
}

fn default_warning_utilization() -> i32 {
    85
}

/// Calibration metadata of a capacity measurement.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CalibrationSpec {
    /// Hash of the pool's pod template that was measured (`sha256:<hex>`,
    /// what `lanekeeper calibration-hash -f <workload.yaml>` prints; the
    /// controller shows the current one as `status.observedConfigHash`).
    /// When they differ the profile reports `Calibrated` False, reason
    /// `PoolChanged`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
    /// When the measurement was taken (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_at: Option<String>,
    /// How long the measurement stays valid, in seconds after `measuredAt`.
    /// After that the profile reports `Calibrated` False, reason `Expired`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("validForSeconds must be at least 1"))]
    pub valid_for_seconds: Option<i64>,
}

/// Pool size bounds.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.min <= self.max").message("replicas.min must be <= replicas.max"))]
pub struct ReplicasSpec {
    /// Fewest replicas lanekeeper ever asks for.
    #[serde(default = "default_min_replicas")]
    #[x_kube(validation = Rule::new("self >= 0").message("min must be >= 0"))]
    pub min: i32,
    /// Most replicas lanekeeper ever asks for.
    #[x_kube(validation = Rule::new("self >= 1").message("max must be >= 1"))]
    pub max: i32,
    /// Most replicas added in one step above the currently ready replicas.
    #[serde(default = "default_max_scale_up_step")]
    #[x_kube(validation = Rule::new("self >= 1").message("maxScaleUpStep must be >= 1"))]
    pub max_scale_up_step: i32,
    /// How long demand must continuously want fewer replicas before the pool
    /// is made smaller, in seconds.
    #[serde(default = "default_scale_down_stabilization")]
    #[x_kube(validation = Rule::new("self >= 0").message("scaleDownStabilizationSeconds must be >= 0"))]
    pub scale_down_stabilization_seconds: i64,
}

fn default_min_replicas() -> i32 {
    1
}
fn default_max_scale_up_step() -> i32 {
    4
}
fn default_scale_down_stabilization() -> i64 {
    300
}

/// How the pool size is written.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ScalingSpec {
    /// `Direct` (default) patches the scale subresource of the scale target;
    /// `Disabled` only reports the desired replicas; `HPAMinReplicas` raises
    /// the `minReplicas` of the HorizontalPodAutoscaler that targets the same
    /// workload instead of fighting it.
    #[serde(default)]
    pub mode: ScalingMode,
}

/// How the pool size is written.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum ScalingMode {
    /// Patch the scale subresource (unless an HPA targets the workload).
    #[default]
    Direct,
    /// Never write replicas; only report them.
    Disabled,
    /// Raise the targeting HPA's `minReplicas` to the desired replicas.
    #[serde(rename = "HPAMinReplicas")]
    HpaMinReplicas,
}

/// In-flight watermarks, applied per request by the gateway.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.resumeBelow < self.conserveAt && self.conserveAt <= self.stopAt").message("inFlight watermarks must satisfy resumeBelow < conserveAt <= stopAt"))]
pub struct InFlightSpec {
    /// At this many requests in flight the gateway rejects optional long
    /// context (conserve).
    #[x_kube(validation = Rule::new("self >= 1").message("conserveAt must be >= 1"))]
    pub conserve_at: i64,
    /// The in-flight limit of the lanes that may be shed: at this many
    /// requests in flight their requests wait for a slot, which goes to the
    /// highest-priority lane waiting when a request finishes.
    #[x_kube(validation = Rule::new("self >= 1").message("stopAt must be >= 1"))]
    pub stop_at: i64,
    /// The gateway leaves conserve only below this many in flight.
    #[x_kube(validation = Rule::new("self >= 0").message("resumeBelow must be >= 0"))]
    pub resume_below: i64,
    /// Besides being below `resumeBelow`, the gateway leaves conserve only
    /// once the p95 latency it measures (over 10 s windows) has not been
    /// more than 25 % above its lowest of the minute before for this many
    /// seconds. Default 300 (applied by the gateway when absent); 0: as soon
    /// as in flight is below `resumeBelow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("resumeAfterStableSeconds must be >= 0"))]
    pub resume_after_stable_seconds: Option<i64>,
}

/// The bounded readiness drain.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// Most pods drained at once: an integer count or a percent of the ready
    /// pods (rounded down), like a PodDisruptionBudget.
    #[serde(
        default = "default_max_drained",
        deserialize_with = "null_as_default_max_drained"
    )]
    #[schemars(schema_with = "int_or_percent_schema")]
    #[x_kube(validation = Rule::new("string(self).matches('^([0-9]+|(100|[1-9]?[0-9])%)$')").message("maxDrained must be a non-negative integer or a percent within 0%..100%"))]
    pub max_drained: IntOrString,
    /// Fewest pods that must keep serving; no drain goes below it.
    #[serde(default = "default_min_serving")]
    #[x_kube(validation = Rule::new("self >= 0").message("minServing must be >= 0"))]
    pub min_serving: i32,
    /// A pod whose error ratio (0..1) is above this is a drain candidate.
    #[x_kube(validation = Rule::new("quantity(self).compareTo(quantity('1')) <= 0").message("errorRatioAbove must be within 0..1"))]
    pub error_ratio_above: Decimal,
    /// How long a drained pod must look healthy before it is undrained, in
    /// seconds.
    #[serde(default = "default_healthy_for")]
    #[x_kube(validation = Rule::new("self >= 0").message("healthyForSeconds must be >= 0"))]
    pub healthy_for_seconds: i64,
}

fn int_or_percent_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "default": "25%",
    })
}

impl DrainSpec {
    /// `maxDrained` resolved against a number of ready pods (a percentage
    /// rounds down). Malformed values allow nothing.
    pub fn max_drained_of(&self, ready: u32) -> u32 {
        match &self.max_drained {
            IntOrString::Int(n) => (*n).max(0) as u32,
            IntOrString::String(s) => s
                .strip_suffix('%')
                .and_then(|p| p.trim().parse::<u64>().ok())
                .map_or(0, |p| (p.min(100) * u64::from(ready) / 100) as u32),
        }
    }

    /// The drain bound: at most min(maxDrained of the ready pods, ready pods
    /// − minServing) pods drained at once, never negative. The one place the
    /// bound is computed: the engine, the controller's re-check before each
    /// drain write and status all call it.
    pub fn bound(&self, ready: u32) -> u32 {
        let by_share = self.max_drained_of(ready);
        let by_serving = i64::from(ready) - i64::from(self.min_serving.max(0));
        by_share.min(by_serving.max(0) as u32)
    }
}

/// The schema of an int-or-string field is nullable; a null `maxDrained`
/// means the default, as an absent one does.
fn null_as_default_max_drained<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<IntOrString, D::Error> {
    Ok(Option::<IntOrString>::deserialize(d)?.unwrap_or_else(default_max_drained))
}

fn default_max_drained() -> IntOrString {
    IntOrString::String("25%".to_owned())
}
fn default_min_serving() -> i32 {
    1
}
fn default_healthy_for() -> i64 {
    120
}

/// Live signal sources of a profile.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SignalsSpec {
    /// PromQL queries, one per signal, evaluated against a Prometheus server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusSignals>,
    /// Scrapes of the pool's own pods for model-server metrics in the
    /// Prometheus text format (per-pod evidence, pool in-flight and queue
    /// totals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape: Option<ScrapeSignals>,
}

/// PromQL queries against a Prometheus server (HTTP API `/api/v1/query`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusSignals {
    /// Base URL of the Prometheus HTTP API, e.g.
    /// `http://prometheus.monitoring:9090` (the `/api/v1/...` paths are
    /// appended).
    #[x_kube(validation = Rule::new("self.startsWith('http://') || self.startsWith('https://')").message("url must start with http:// or https://"))]
    pub url: String,
    /// How long one query may take, in seconds; a slower answer makes the
    /// signal Unknown (reason `timeout`).
    #[serde(default = "default_prom_timeout")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 60").message("timeoutSeconds must be between 1 and 60"))]
    pub timeout_seconds: i64,
    /// A sample older than this many seconds (at the time of evaluation) is
    /// stale: the signal is Unknown (reason `stale`), never its last value.
    #[serde(default = "default_staleness")]
    #[x_kube(validation = Rule::new("self > 0").message("stalenessSeconds must be > 0"))]
    pub staleness_seconds: i64,
    /// How often the controller asks, in seconds. The queries run on their
    /// own, one poll per interval; an answer that differs from the last one
    /// triggers the profile's reconcile at once (not at the next resync).
    #[serde(default = "default_prom_interval")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 3600").message("intervalSeconds must be between 1 and 3600"))]
    pub interval_seconds: i64,
    /// A bearer token sent as `Authorization: Bearer ...`, read from a key of
    /// a Secret in the profile's namespace. The Secret must carry the label
    /// `lanekeeper.dev/prometheus-credential: "true"`; without it the
    /// controller does not use the Secret and the queries are Unknown
    /// (reason `auth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_secret_ref: Option<KeyRef>,
    /// A PEM bundle of certificate authorities to trust for an `https://`
    /// URL, from a ConfigMap or a Secret in the profile's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundleRef>,
    /// The label of `laneRequestsPerSecond` samples whose value is the
    /// LaneContract's name.
    #[serde(default = "default_lane_label")]
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z_][a-zA-Z0-9_]*$')").message("laneLabel must be a Prometheus label name"))]
    pub lane_label: String,
    /// The label of `podErrorRatio` samples whose value is the pod's name.
    #[serde(default = "default_pod_label")]
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z_][a-zA-Z0-9_]*$')").message("podLabel must be a Prometheus label name"))]
    pub pod_label: String,
    /// One PromQL expression per signal; every query is optional.
    #[serde(default)]
    pub queries: PrometheusQueries,
}

fn default_prom_interval() -> i64 {
    5
}

fn default_prom_timeout() -> i64 {
    5
}
fn default_staleness() -> i64 {
    120
}
fn default_lane_label() -> String {
    "lane".into()
}
fn default_pod_label() -> String {
    "pod".into()
}

/// A key of a Secret or ConfigMap in the profile's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    /// Name of the object.
    #[x_kube(validation = Rule::new("self != ''").message("name must not be empty"))]
    pub name: String,
    /// Key within the object's data.
    #[x_kube(validation = Rule::new("self != ''").message("key must not be empty"))]
    pub key: String,
}

/// Where a CA bundle comes from: exactly one of a ConfigMap or a Secret.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.configMapKeyRef) != has(self.secretKeyRef)").message("caBundle needs exactly one of configMapKeyRef and secretKeyRef"))]
pub struct CaBundleRef {
    /// A ConfigMap key holding the PEM bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyRef>,
    /// A Secret key holding the PEM bundle. The Secret must carry the label
    /// `lanekeeper.dev/prometheus-credential: "true"`, as for
    /// `bearerTokenSecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeyRef>,
}

/// The label a Secret must carry, with the value `"true"`, for the
/// controller to use it as a Prometheus credential (`bearerTokenSecretRef`,
/// `caBundle.secretKeyRef`): only someone who may write the Secret can make
/// it usable, not everyone who may write a CapacityProfile.
pub const PROMETHEUS_CREDENTIAL_LABEL: &str = "lanekeeper.dev/prometheus-credential";

/// PromQL expressions, one per signal. Scalar signals must return exactly one
/// series (aggregate with `sum` or `max`); vectors one series per lane or pod.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusQueries {
    /// Capacity available now, in work units per second. When configured it
    /// is the capacity signal; when it is Unknown the profile's capacity
    /// falls back as the engine documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub available_units_per_second: Option<String>,
    /// The gateway's capacity evidence: work units per second the pool
    /// completed through the gateway while the gateway was saturated
    /// (every in-flight slot taken, requests waiting for one); `lanekeeper
    /// rules` records it as
    /// `lanekeeper:gateway_goodput_while_saturated:units_per_second`. One
    /// series while saturated, none otherwise (no series is no evidence,
    /// not Unknown). It only ever lowers the capacity: the engine uses the
    /// lower of it and the capacity signal, so a capacity drop shows within
    /// a scrape and an evaluation. A failed query makes the capacity
    /// Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub gateway_goodput_while_saturated: Option<String>,
    /// Requests in flight in the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub in_flight: Option<String>,
    /// Requests waiting in the pool's queues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub queue_depth: Option<String>,
    /// p95 request latency in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub p95_latency_seconds: Option<String>,
    /// Pool error ratio (0..1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub error_ratio: Option<String>,
    /// The pool's KV-cache usage in percent (0..100), e.g.
    /// `100 * avg(vllm:kv_cache_usage_perc{namespace="ai-platform"})`: the
    /// evidence of `kvCacheUsageAbove`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub kv_cache_usage_percent: Option<String>,
    /// Requests per second by lane: a vector with one series per lane, the
    /// lane's LaneContract name in the `laneLabel` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub lane_requests_per_second: Option<String>,
    /// Retries per second by lane (attempts after the first, not counted in
    /// `laneRequestsPerSecond`): a vector like `laneRequestsPerSecond`, one
    /// series per lane named in the `laneLabel` label. Not demand: it gives
    /// each lane's retry amplification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub lane_retry_requests_per_second: Option<String>,
    /// Error ratio (0..1) by pod: a vector with one series per pod, the pod's
    /// name in the `podLabel` label (per-pod evidence for drains).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub pod_error_ratio: Option<String>,
    /// Error budget remaining per lane, in percent of the budget over the
    /// lane's objective window (`lanekeeper rules` records it as
    /// `lanekeeper:lane_error_budget_remaining:percent`): one series per lane
    /// named in the `laneLabel` label. May be negative (overspent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub lane_error_budget_remaining_percent: Option<String>,
    /// Error-budget burn rate per lane over the last 5 minutes
    /// (`lanekeeper:lane_burn_rate:5m`): one series per lane named in the
    /// `laneLabel` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub lane_burn_rate_5m: Option<String>,
    /// Error-budget burn rate per lane over the last 30 minutes
    /// (`lanekeeper:lane_burn_rate:30m`): one series per lane named in the
    /// `laneLabel` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub lane_burn_rate_30m: Option<String>,
    /// Error-budget burn rate per lane over the last 1 hour
    /// (`lanekeeper:lane_burn_rate:1h`): one series per lane named in the
    /// `laneLabel` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub lane_burn_rate_1h: Option<String>,
    /// Error-budget burn rate per lane over the last 6 hours
    /// (`lanekeeper:lane_burn_rate:6h`): one series per lane named in the
    /// `laneLabel` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub lane_burn_rate_6h: Option<String>,
    /// The 95th percentile of the input tokens of a request, by lane (lanes
    /// with `cost`): one series per lane named in the `laneLabel` label,
    /// e.g. `histogram_quantile(0.95, sum by (le, lane)
    /// (rate(lanekeeper_gateway_lane_request_input_tokens_bucket[5m])))`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub lane_p95_input_tokens: Option<String>,
    /// The 95th percentile of the output tokens of a request, by lane (lanes
    /// with `cost`), from
    /// `lanekeeper_gateway_lane_request_output_tokens_bucket`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub lane_p95_output_tokens: Option<String>,
    /// The 95th percentile of the work units a request cost when settled,
    /// by lane (lanes with `cost`), from
    /// `lanekeeper_gateway_lane_request_cost_units_bucket`: compared with the
    /// lane's `workUnitsPerRequest` (more than 20 % above it, the lane is
    /// warned `CostUnderestimated`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("a query must not be empty"))]
    pub lane_p95_cost_units_per_request: Option<String>,
}

impl PrometheusQueries {
    /// Whether any query is configured.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// Scrapes of the pool's pods (by pod IP) for model-server metrics.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScrapeSignals {
    /// The pods' metrics port.
    #[x_kube(validation = Rule::new("self >= 1 && self <= 65535").message("port must be within 1..65535"))]
    pub port: i32,
    /// The HTTP path of the metrics page.
    #[serde(default = "default_scrape_path")]
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("path must start with /"))]
    pub path: String,
    /// Scrape each pod at most this often, in seconds; results are reused in
    /// between.
    #[serde(default = "default_scrape_interval")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 3600").message("intervalSeconds must be between 1 and 3600"))]
    pub interval_seconds: i64,
    /// How long one pod's scrape may take, in seconds (at most 60); a slower
    /// pod has no evidence this round (reason `timeout`). A reconcile waits
    /// for a round at most this long plus 1 s; a longer round goes on beside
    /// it and triggers the profile's reconcile when it ends.
    #[serde(default = "default_scrape_timeout")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 60").message("timeoutSeconds must be between 1 and 60"))]
    pub timeout_seconds: i64,
    /// Most pods scraped at the same time (at most 64: each may hold a page
    /// of up to 16 MiB).
    #[serde(default = "default_scrape_concurrency")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 64").message("maxConcurrency must be between 1 and 64"))]
    pub max_concurrency: i32,
    /// Metric names to read; the defaults are vLLM's.
    #[serde(default)]
    pub metrics: ScrapeMetrics,
}

fn default_scrape_path() -> String {
    "/metrics".into()
}
fn default_scrape_interval() -> i64 {
    15
}
fn default_scrape_timeout() -> i64 {
    2
}
fn default_scrape_concurrency() -> i32 {
    16
}

/// Model-server metric names (gauges). Requests running and waiting are
/// summed over their series (one per model or engine); the KV-cache usage is
/// the fullest series'; an error ratio with more than one series gives no
/// evidence (ambiguous), nor does a fraction over 1.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScrapeMetrics {
    /// Requests running on the pod (pool total: `inFlight`).
    #[serde(default = "default_running")]
    #[x_kube(validation = Rule::new("self != ''").message("metric names must not be empty"))]
    pub requests_running: String,
    /// Requests waiting on the pod (pool total: `queueDepth`).
    #[serde(default = "default_waiting")]
    #[x_kube(validation = Rule::new("self != ''").message("metric names must not be empty"))]
    pub requests_waiting: String,
    /// KV-cache usage (0..1), tried in order: the first name the pod exposes
    /// is used (vLLM renamed `gpu_cache_usage_perc` to `kv_cache_usage_perc`).
    #[serde(default = "default_kv_cache")]
    #[schemars(length(min = 1))]
    pub kv_cache_usage: Vec<String>,
    /// An error ratio (0..1) the pod exposes, read as the pod's error ratio
    /// (per-pod evidence for drains). Unset: none is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self != ''").message("metric names must not be empty"))]
    pub error_ratio: Option<String>,
}

impl Default for ScrapeMetrics {
    fn default() -> Self {
        Self {
            requests_running: default_running(),
            requests_waiting: default_waiting(),
            kv_cache_usage: default_kv_cache(),
            error_ratio: None,
        }
    }
}

fn default_running() -> String {
    "vllm:num_requests_running".into()
}
fn default_waiting() -> String {
    "vllm:num_requests_waiting".into()
}
fn default_kv_cache() -> Vec<String> {
    vec![
        "vllm:kv_cache_usage_perc".into(),
        "vllm:gpu_cache_usage_perc".into(),
    ]
}

/// Observed state of a CapacityProfile, written by the controller.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CapacityProfileStatus {
    /// The generation of the spec this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Current degradation level (0 = normal).
    #[serde(default)]
    pub level: u32,
    /// Name of the current level (`normal` at level 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level_name: Option<String>,
    /// `Known` or `Unknown`: whether the capacity could be had from telemetry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<String>,
    /// Capacity in work units per second (absent while unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_units_per_second: Option<f64>,
    /// Total demand of the bound lanes in work units per second, before shedding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demand_units_per_second: Option<f64>,
    /// Total admitted work units per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted_units_per_second: Option<f64>,
    /// Demand ÷ capacity in percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_percent: Option<f64>,
    /// The pool size lanekeeper wants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,
    /// Ready replicas of the pool as last observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Pods currently drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_pods: Option<i32>,
    /// Most pods that may be drained at once right now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_budget: Option<i32>,
    /// Signals that are unknown now, with the reason (signal → reason).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub unknown_signals: std::collections::BTreeMap<String, String>,
    /// The hash of the pool's pod template now (the scale target's
    /// `spec.template`), in the form of `capacity.calibration.configHash`.
    /// Absent when the scale target has no pod template or can't be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_config_hash: Option<String>,
    /// Standard conditions: `Ready`, `Degraded`, `TelemetryKnown`,
    /// `Overcommitted`, `Calibrated`, `DrainBudgetExhausted`,
    /// `PoolGrowthBlocked` (pods of the pool the scheduler cannot place),
    /// `ScalingConflict`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The change freeze of the profile's error budgets: what is frozen,
    /// which lanes cause it and the exceptions in force (absent while open
    /// with no exception).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze: Option<super::freeze::FreezeStatus>,
    /// The decision engine's state (hysteresis windows, approval gates,
    /// scale-down window, drained pods), so that a restarted or newly elected
    /// controller continues exactly where the last one stopped. Written by the
    /// controller; not meant to be edited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<super::state::ProfileState>,
}
