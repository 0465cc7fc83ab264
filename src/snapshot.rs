//! The signal snapshot: what telemetry says at one moment.
//!
//! This is the one type that feeds the decision engine, whether the numbers
//! come from a `plan --signals` file, the cluster, or Prometheus. Every value
//! is optional: a missing value is *unknown*, never zero.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A timeline of snapshots (the `--signals FILE` format).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalsFile {
    /// Snapshots in time order.
    pub steps: Vec<Snapshot>,
}

/// Why a signals timeline cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimelineError {
    /// No step at all.
    #[error("the signals file has no steps")]
    NoSteps,
    /// A step is not later than the one before it.
    #[error("steps must be in increasing time: at {at} follows at {previous}")]
    NotIncreasing {
        /// The offending step's time.
        at: i64,
        /// The time of the step before it.
        previous: i64,
    },
}

/// Why a signals file could not be loaded; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum SignalsFileError {
    /// The file could not be read.
    #[error("{}: {source}", .path.display())]
    Read {
        /// The signals file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML for the format.
    #[error("{}: {at}: {source}", .path.display())]
    Parse {
        /// The signals file.
        path: PathBuf,
        /// Where in the document.
        at: serde_path_to_error::Path,
        /// The YAML error.
        #[source]
        source: serde_yaml::Error,
    },
    /// The steps are unusable.
    #[error("{}: {source}", .path.display())]
    Timeline {
        /// The signals file.
        path: PathBuf,
        /// Why.
        #[source]
        source: TimelineError,
    },
}

impl SignalsFile {
    /// Reads, parses and checks a `--signals` file (the one loader of
    /// `plan` and `diff`).
    pub fn load(path: &Path) -> Result<Self, SignalsFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| SignalsFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        let de = serde_yaml::Deserializer::from_str(&text);
        let file: SignalsFile =
            serde_path_to_error::deserialize(de).map_err(|e| SignalsFileError::Parse {
                path: path.to_owned(),
                at: e.path().clone(),
                source: e.into_inner(),
            })?;
        file.check().map_err(|source| SignalsFileError::Timeline {
            path: path.to_owned(),
            source,
        })?;
        Ok(file)
    }

    /// Checks the timeline: at least one step, steps in strictly increasing
    /// time.
    pub fn check(&self) -> Result<(), TimelineError> {
        if self.steps.is_empty() {
            return Err(TimelineError::NoSteps);
        }
        for w in self.steps.windows(2) {
            if w[1].at <= w[0].at {
                return Err(TimelineError::NotIncreasing {
                    at: w[1].at,
                    previous: w[0].at,
                });
            }
        }
        Ok(())
    }
}

/// The name of the gateway's capacity evidence
/// ([`ProfileSignals::gateway_goodput_while_saturated`]), as in
/// `spec.signals.prometheus.queries` and in `status.unknownSignals`.
pub const GOODPUT_SIGNAL: &str = "gatewayGoodputWhileSaturated";

/// The name of the pool's KV-cache usage signal (percent), as in
/// `spec.signals.prometheus.queries` and `status.unknownSignals`.
pub const KV_CACHE_SIGNAL: &str = "kvCacheUsagePercent";

/// What telemetry says at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Snapshot {
    /// Seconds: from the start of the timeline offline, Unix time live.
    pub at: i64,
    /// Per profile, keyed `namespace/name`. A profile without an entry has
    /// unknown telemetry in this step.
    #[serde(default)]
    pub profiles: BTreeMap<String, ProfileSignals>,
    /// Per lane, keyed `namespace/name`. A lane without an entry uses its
    /// `expectedRequestsPerSecond`.
    #[serde(default)]
    pub lanes: BTreeMap<String, LaneSignals>,
}

/// Pool-level signals of one profile.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProfileSignals {
    /// Capacity available now, in work units per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_units_per_second: Option<f64>,
    /// The work units per second the pool completed through the gateway
    /// while the gateway was saturated (every slot of its in-flight limit
    /// taken with requests waiting for one): capacity evidence that can
    /// only lower the capacity (see `policy::evidence`). Absent: the
    /// gateway was not saturated, or the source is not configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_goodput_while_saturated: Option<f64>,
    /// Ready replicas of the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<u32>,
    /// Requests in flight in the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<f64>,
    /// Requests waiting in the pool's queues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<f64>,
    /// p95 latency in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_latency_seconds: Option<f64>,
    /// Error ratio (0..1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_ratio: Option<f64>,
    /// The pool's KV-cache usage in percent (0..100): the mean over its
    /// replicas of vLLM's `vllm:kv_cache_usage_perc` × 100, or what the
    /// configured Prometheus query gives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_usage_percent: Option<f64>,
    /// Per-pod evidence, keyed by pod name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pods: BTreeMap<String, PodSignals>,
    /// The pool's calibration no longer describes it: `PoolChanged` (the
    /// pod template's hash differs from `capacity.calibration.configHash`)
    /// or `Expired` (past `measuredAt + validForSeconds`). Absent: valid, or
    /// nothing to check. With `capacity.onStaleCalibration: Hold` the
    /// capacity derived from calibration numbers is Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration_stale: Option<CalibrationStale>,
    /// The pool's workload is rolling out a new revision: no new drain.
    /// Absent: not known (drains are not held for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_in_progress: Option<bool>,
    /// The pool's current revision (Deployment: the newest ReplicaSet's
    /// `pod-template-hash`; StatefulSet: `status.updateRevision`). A drained
    /// pod whose `revision` differs is never undrained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_revision: Option<String>,
    /// Signals that a configured source failed to give, with the reason
    /// (signal name → reason). A configured capacity signal
    /// (`availableUnitsPerSecond`) listed here makes the capacity Unknown:
    /// lanekeeper does not fall back to ready replicas when the measurement
    /// it was told to trust is missing (in an incident like INC-47 every
    /// replica is ready while the provider is degraded).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unknown: BTreeMap<String, String>,
}

/// Per-pod evidence.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodSignals {
    /// The pod's own readiness (see [`PodSignals::is_ready`]). Absent counts
    /// as ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// The pod's error ratio (0..1); absent means no evidence this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_ratio: Option<f64>,
    /// Someone asked for this pod to be drained (the pod annotation
    /// `lanekeeper.dev/drain-request: "true"`). Honoured within the bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_requested: Option<bool>,
    /// The revision the pod was made from (Deployment: its
    /// `pod-template-hash` label; StatefulSet: its `controller-revision-hash`
    /// label), compared with the profile's `currentRevision`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

/// Why a pool's calibration no longer describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CalibrationStale {
    /// The pod template changed since the measurement (its hash differs from
    /// `capacity.calibration.configHash`).
    PoolChanged,
    /// The measurement is past `measuredAt + validForSeconds`.
    Expired,
}

impl CalibrationStale {
    /// The reason's code, as in the `Calibrated` condition.
    pub fn as_str(self) -> &'static str {
        match self {
            CalibrationStale::PoolChanged => "PoolChanged",
            CalibrationStale::Expired => "Expired",
        }
    }
}

/// Lane-level signals.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LaneSignals {
    /// Original requests per second: first attempts, deduplicated by request
    /// id at the gateway. Demand counts these only. `.nan` in a signals file
    /// means Unknown (as does an entry in `unknown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_second: Option<f64>,
    /// Extra attempts per second (retries of requests already counted in
    /// `requestsPerSecond`). Not demand: it gives the lane's retry
    /// amplification, (originals + retries) ÷ originals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_requests_per_second: Option<f64>,
    /// What is left of the lane's error budget over its objective's window,
    /// in percent of the budget (100: untouched, 0 or less: exhausted).
    /// Absent or `.nan`: Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_budget_remaining_percent: Option<f64>,
    /// How fast the lane burns its error budget over each window: bad ÷
    /// counted requests, divided by the budget's fraction (1: the budget
    /// lasts exactly the objective's window).
    #[serde(default, skip_serializing_if = "BurnRates::is_empty")]
    pub burn_rate: BurnRates,
    /// The 95th percentile of the input (prompt) tokens of the lane's
    /// requests, as the gateway measured them from the answers' usage.
    /// Absent or `.nan`: Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_input_tokens: Option<f64>,
    /// The 95th percentile of the output (completion) tokens of the lane's
    /// requests. Absent or `.nan`: Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_output_tokens: Option<f64>,
    /// The 95th percentile of the work units one request of the lane cost
    /// when settled (its `cost` applied to its usage). Compared with the
    /// lane's `workUnitsPerRequest` (the cost calibration). Absent or
    /// `.nan`: Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_cost_units_per_request: Option<f64>,
    /// Lane signals that a configured source failed to give, with the reason
    /// (`requestsPerSecond`, `retryRequestsPerSecond`,
    /// `errorBudgetRemainingPercent`, `burnRate.5m`, `p95InputTokens`,
    /// `p95OutputTokens`, `p95CostUnitsPerRequest`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unknown: BTreeMap<String, String>,
}

/// The windows burn rates are measured over.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub enum BurnWindow {
    /// Five minutes.
    #[serde(rename = "5m")]
    M5,
    /// Thirty minutes.
    #[serde(rename = "30m")]
    M30,
    /// One hour.
    #[serde(rename = "1h")]
    H1,
    /// Six hours.
    #[serde(rename = "6h")]
    H6,
}

impl BurnWindow {
    /// Every window, shortest first.
    pub const ALL: [BurnWindow; 4] = [
        BurnWindow::M5,
        BurnWindow::M30,
        BurnWindow::H1,
        BurnWindow::H6,
    ];

    /// The Prometheus duration (`5m`, `30m`, `1h`, `6h`).
    pub fn as_str(self) -> &'static str {
        match self {
            BurnWindow::M5 => "5m",
            BurnWindow::M30 => "30m",
            BurnWindow::H1 => "1h",
            BurnWindow::H6 => "6h",
        }
    }

    /// The window in seconds.
    pub fn seconds(self) -> i64 {
        match self {
            BurnWindow::M5 => 300,
            BurnWindow::M30 => 1800,
            BurnWindow::H1 => 3600,
            BurnWindow::H6 => 21600,
        }
    }
}

/// A lane's burn rate per window (a missing window is Unknown).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BurnRates {
    /// Over the last 5 minutes.
    #[serde(rename = "5m", default, skip_serializing_if = "Option::is_none")]
    pub m5: Option<f64>,
    /// Over the last 30 minutes.
    #[serde(rename = "30m", default, skip_serializing_if = "Option::is_none")]
    pub m30: Option<f64>,
    /// Over the last hour.
    #[serde(rename = "1h", default, skip_serializing_if = "Option::is_none")]
    pub h1: Option<f64>,
    /// Over the last 6 hours.
    #[serde(rename = "6h", default, skip_serializing_if = "Option::is_none")]
    pub h6: Option<f64>,
}

impl BurnRates {
    /// The burn rate over `w`, when known (a NaN is Unknown).
    pub fn get(&self, w: BurnWindow) -> Option<f64> {
        let v = match w {
            BurnWindow::M5 => self.m5,
            BurnWindow::M30 => self.m30,
            BurnWindow::H1 => self.h1,
            BurnWindow::H6 => self.h6,
        };
        v.filter(|v| v.is_finite())
    }

    /// Sets the burn rate over `w`.
    pub fn set(&mut self, w: BurnWindow, v: Option<f64>) {
        let slot = match w {
            BurnWindow::M5 => &mut self.m5,
            BurnWindow::M30 => &mut self.m30,
            BurnWindow::H1 => &mut self.h1,
            BurnWindow::H6 => &mut self.h6,
        };
        *slot = v;
    }

    /// No window known.
    pub fn is_empty(&self) -> bool {
        BurnWindow::ALL.iter().all(|w| self.get(*w).is_none())
    }
}

impl PodSignals {
    /// The signals of a pod as the cluster shows it.
    pub fn from_cluster(containers_ready: bool, terminating: bool, drain_requested: bool) -> Self {
        Self {
            ready: Some(containers_ready && !terminating),
            error_ratio: None,
            drain_requested: drain_requested.then_some(true),
            revision: None,
        }
    }

    /// Whether the pod counts as a ready pod of the pool: the one definition
    /// of "ready" that the engine (capacity from ready pods, the drain
    /// bound), the controller (status, the bound re-checked before each
    /// drain write) and the signal sources share.
    ///
    /// A pod is ready when its own containers are ready (its
    /// `ContainersReady` condition is True) and it is not being deleted.
    /// lanekeeper's readiness gate and drain label do not count, so a drained
    /// pod stays a ready pod (and in the base of the drain bound) until it is
    /// undrained or gone. In a signals file, a pod listed without `ready`
    /// counts as ready.
    pub fn is_ready(&self) -> bool {
        self.ready != Some(false)
    }
}

impl ProfileSignals {
    /// Whether a pod was made from an older revision than the pool's
    /// current one: both revisions known and different.
    pub fn is_outdated(&self, pod: &PodSignals) -> bool {
        matches!((&pod.revision, &self.current_revision), (Some(p), Some(c)) if p != c)
    }

    /// How many of the listed pods are ready ([`PodSignals::is_ready`]).
    pub fn ready_pods(&self) -> u32 {
        self.pods.values().filter(|p| p.is_ready()).count() as u32
    }

    /// `unknown`, and each figure given that is garbage (not a finite,
    /// non-negative number; a percentage outside 0..100) under the name the
    /// engine reads it by: garbage is a failed measurement, as a source's
    /// reported failure is, not a signal nobody provides (which would let a
    /// trigger clear, or the capacity fall back to ready replicas).
    fn unknown_with_garbage(&self) -> BTreeMap<String, String> {
        let mut u = self.unknown.clone();
        let figures = [
            ("availableUnitsPerSecond", self.available_units_per_second),
            (GOODPUT_SIGNAL, self.gateway_goodput_while_saturated),
            ("inFlight", self.in_flight),
            ("queueDepth", self.queue_depth),
            ("p95LatencySeconds", self.p95_latency_seconds),
            ("errorRatio", self.error_ratio),
        ];
        for (name, v) in figures {
            if let Some(v) = v
                && !(v.is_finite() && v >= 0.0)
            {
                u.entry(name.to_owned())
                    .or_insert_with(|| format!("{v} is not a finite, non-negative number"));
            }
        }
        if let Some(v) = self.kv_cache_usage_percent
            && !(v.is_finite() && (0.0..=100.0).contains(&v))
        {
            u.entry(KV_CACHE_SIGNAL.to_owned())
                .or_insert_with(|| format!("{v} is not a percentage (0..100)"));
        }
        u
    }

    /// Drops values that are not finite numbers or are negative: such a value
    /// is garbage and counts as Unknown (listed in `unknown`), never as zero
    /// and never as absent.
    pub fn sanitized(&self) -> Self {
        let clean = |v: Option<f64>| v.filter(|x| x.is_finite() && *x >= 0.0);
        Self {
            available_units_per_second: clean(self.available_units_per_second),
            gateway_goodput_while_saturated: clean(self.gateway_goodput_while_saturated),
            ready_replicas: self.ready_replicas,
            in_flight: clean(self.in_flight),
            queue_depth: clean(self.queue_depth),
            p95_latency_seconds: clean(self.p95_latency_seconds),
            error_ratio: clean(self.error_ratio),
            kv_cache_usage_percent: self
                .kv_cache_usage_percent
                .filter(|x| x.is_finite() && (0.0..=100.0).contains(x)),
            unknown: self.unknown_with_garbage(),
            calibration_stale: self.calibration_stale,
            rollout_in_progress: self.rollout_in_progress,
            current_revision: self.current_revision.clone(),
            pods: self
                .pods
                .iter()
                .map(|(k, p)| {
                    (
                        k.clone(),
                        PodSignals {
                            ready: p.ready,
                            error_ratio: clean(p.error_ratio),
                            drain_requested: p.drain_requested,
                            revision: p.revision.clone(),
                        },
                    )
                })
                .collect(),
        }
    }
}
