//! The scenario format: what traffic, capacity, clients and controller timing
//! a simulation runs against. `docs/simulate.md` describes it field by field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[path = "scenario_tokens.rs"]
pub mod tokens;

#[path = "scenario_tenants.rs"]
pub mod tenants;

pub use tokens::{TokenDistribution, TokenQuantiles, TokenSide};

/// A scenario file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Scenario {
    /// A name for reports.
    #[serde(default)]
    pub name: Option<String>,
    /// Seed of the random draws: same seed, same output.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// How long to simulate, in seconds.
    pub duration_seconds: f64,
    /// Gateway and pool tick in seconds (dispatch granularity).
    #[serde(default = "default_tick")]
    pub tick_seconds: f64,
    /// The controller: how often it evaluates and how stale its telemetry is.
    #[serde(default)]
    pub controller: ControllerSpec,
    /// Default client behaviour for every lane.
    #[serde(default)]
    pub clients: ClientSpec,
    /// Pool capacity per profile, keyed `namespace/name` (or `name` when
    /// unambiguous).
    #[serde(default)]
    pub profiles: BTreeMap<String, ProfileScenario>,
    /// Traffic per lane, keyed `namespace/name` (or `name` when unambiguous).
    /// A lane of the manifests with no entry here gets no traffic.
    pub lanes: BTreeMap<String, LaneScenario>,
}

fn default_seed() -> u64 {
    1
}
fn default_tick() -> f64 {
    0.1
}

/// Controller timing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ControllerSpec {
    /// Seconds between evaluations (the first is at 0).
    #[serde(default = "default_eval")]
    pub evaluation_interval_seconds: f64,
    /// How old the telemetry is when the controller reads it.
    #[serde(default = "default_lag")]
    pub telemetry_lag_seconds: f64,
    /// The window rates, p95 and error ratio are measured over.
    #[serde(default = "default_window")]
    pub window_seconds: f64,
    /// Periods in which the profiles' telemetry is missing (the controller
    /// sees no profile signals measured in them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub telemetry_outages: Vec<Outage>,
    /// Approvals granted during the run (as `plan --approve` does).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<ApprovalAt>,
    /// The gateway's capacity evidence as a signal source: the simulated
    /// gateway's goodput while saturated reaches the engine as
    /// `gatewayGoodputWhileSaturated`, one scrape old (absent: not used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_evidence: Option<GatewayEvidence>,
}

/// How the controller reads the gateway's goodput while saturated: scraped
/// every `scrapeIntervalSeconds` (the evaluation sees what was measured up
/// to one scrape ago, not `telemetryLagSeconds`), over the saturated
/// seconds of the last `windowSeconds` (the recording rule's minute).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GatewayEvidence {
    /// Seconds between scrapes of the gateway: how old the evidence is.
    #[serde(default = "default_scrape")]
    pub scrape_interval_seconds: f64,
    /// The window whose saturated seconds count.
    #[serde(default = "default_evidence_window")]
    pub window_seconds: f64,
}

fn default_scrape() -> f64 {
    15.0
}
fn default_evidence_window() -> f64 {
    60.0
}

fn default_eval() -> f64 {
    15.0
}
fn default_lag() -> f64 {
    30.0
}
fn default_window() -> f64 {
    30.0
}

impl Default for ControllerSpec {
    fn default() -> Self {
        Self {
            evaluation_interval_seconds: default_eval(),
            telemetry_lag_seconds: default_lag(),
            window_seconds: default_window(),
            telemetry_outages: Vec::new(),
            approvals: Vec::new(),
            gateway_evidence: None,
        }
    }
}

/// A telemetry outage `[from, to)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Outage {
    /// Start (seconds).
    pub from: f64,
    /// End (seconds).
    pub to: f64,
}

/// An approval granted at a time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ApprovalAt {
    /// When (seconds).
    pub at: f64,
    /// The profile, `namespace/name`.
    pub profile: String,
    /// Highest approved level.
    pub level: u32,
}

/// How clients retry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientSpec {
    /// Retries after the first attempt (0 = never retry).
    #[serde(default)]
    pub max_retries: u32,
    /// Backoff before the first retry, seconds.
    #[serde(default = "default_backoff")]
    pub backoff_seconds: f64,
    /// Each further retry waits this many times longer.
    #[serde(default = "default_multiplier")]
    pub backoff_multiplier: f64,
    /// Longest backoff, seconds.
    #[serde(default = "default_max_backoff")]
    pub max_backoff_seconds: f64,
    /// Jitter as a fraction of the backoff: the wait is drawn uniformly from
    /// `[backoff × (1 − jitter), backoff]`.
    #[serde(default = "default_jitter")]
    pub jitter: f64,
    /// Share of clients (0..1) that ignore Retry-After, the lane's retry
    /// budget and its maxAttempts: they retry on their own backoff no matter
    /// what the gateway says.
    #[serde(default)]
    pub ignore_retry_after_share: f64,
    /// Whether clients stop retrying once the request's deadline has passed.
    #[serde(default = "yes")]
    pub give_up_after_deadline: bool,
}

fn default_backoff() -> f64 {
    1.0
}
fn default_multiplier() -> f64 {
    2.0
}
fn default_max_backoff() -> f64 {
    30.0
}
fn default_jitter() -> f64 {
    0.5
}
fn yes() -> bool {
    true
}

impl Default for ClientSpec {
    fn default() -> Self {
        Self {
            max_retries: 0,
            backoff_seconds: default_backoff(),
            backoff_multiplier: default_multiplier(),
            max_backoff_seconds: default_max_backoff(),
            jitter: default_jitter(),
            ignore_retry_after_share: 0.0,
            give_up_after_deadline: true,
        }
    }
}

/// One profile's pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProfileScenario {
    /// Capacity in work units/s over time, piecewise constant. Without it
    /// the pool runs at the profile's `safeUnitsPerSecond` throughout.
    #[serde(default)]
    pub capacity: Vec<CapacityPoint>,
}

/// Capacity from `at` on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CapacityPoint {
    /// From this time on (seconds).
    pub at: f64,
    /// Work units per second the pool completes.
    pub units_per_second: f64,
}

/// One lane's traffic.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LaneScenario {
    /// Arrival rate over time, piecewise constant (Poisson arrivals).
    #[serde(default)]
    pub arrivals: Vec<RatePoint>,
    /// Alternatively, a CSV of `at,requestsPerSecond` rows (path relative to
    /// the scenario file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrivals_csv: Option<PathBuf>,
    /// Service time once dispatched to the pool (lognormal).
    pub service: ServiceSpec,
    /// Share of served attempts that fail (independently), 0..1.
    #[serde(default)]
    pub failure_ratio: f64,
    /// Requests already queued at time 0.
    #[serde(default)]
    pub initial_backlog: u64,
    /// Client behaviour for this lane (replaces the scenario's `clients`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients: Option<ClientSpec>,
    /// The input and output tokens of the lane's requests (absent: requests
    /// have no size, and each costs the lane's `workUnitsPerRequest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenDistribution>,
    /// Who sends the lane's requests, each tenant with its share and
    /// optionally its own tokens (absent: every request is of the default
    /// tenant).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<tenants::TenantScenario>,
}

/// A rate from `at` on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RatePoint {
    /// From this time on (seconds).
    pub at: f64,
    /// Requests per second.
    pub requests_per_second: f64,
}

/// Lognormal service time given by its median and 95th percentile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceSpec {
    /// Median, seconds.
    pub p50_seconds: f64,
    /// 95th percentile, seconds (≥ p50).
    pub p95_seconds: f64,
}

/// A piecewise-constant function of time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Steps {
    points: Vec<(f64, f64)>,
}

impl Steps {
    /// From `(at, value)` points in increasing time. Before the first point
    /// the value is the first point's.
    pub fn new(points: Vec<(f64, f64)>) -> Self {
        Self { points }
    }

    /// A constant.
    pub fn constant(v: f64) -> Self {
        Self {
            points: vec![(0.0, v)],
        }
    }

    /// The value at `t`.
    pub fn at(&self, t: f64) -> f64 {
        let i = self.points.partition_point(|(a, _)| *a <= t);
        match i {
            0 => self.points.first().map_or(0.0, |p| p.1),
            _ => self.points[i - 1].1,
        }
    }

    /// The first change strictly after `t`, if any.
    pub fn next_change(&self, t: f64) -> Option<f64> {
        let i = self.points.partition_point(|(a, _)| *a <= t);
        self.points.get(i).map(|p| p.0)
    }

    /// The points.
    pub fn points(&self) -> &[(f64, f64)] {
        &self.points
    }
}

/// Why a scenario (or a rates CSV) cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// A file could not be read.
    #[error("{}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The scenario is not valid YAML for the format.
    #[error("{}: {at}: {source}", .path.display())]
    Parse {
        /// The scenario file.
        path: PathBuf,
        /// Where in the document.
        at: serde_path_to_error::Path,
        /// The YAML error.
        #[source]
        source: serde_yaml::Error,
    },
    /// A lane gives both `arrivals` and `arrivalsCsv`.
    #[error("{}: lanes.{lane}: give arrivals or arrivalsCsv, not both", .path.display())]
    ArrivalsTwice {
        /// The scenario file.
        path: PathBuf,
        /// The lane's key in the scenario.
        lane: String,
    },
    /// An error in the content of a file (CSV rows or scenario numbers).
    #[error("{}: {source}", .path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        #[source]
        source: Box<ScenarioError>,
    },
    /// A CSV row without exactly two columns.
    #[error("line {line}: expected two columns: at,requestsPerSecond")]
    CsvColumns {
        /// 1-based line number.
        line: usize,
    },
    /// A CSV row whose columns are not numbers (past the header).
    #[error("line {line}: not numbers: {text:?}")]
    CsvNotNumbers {
        /// 1-based line number.
        line: usize,
        /// The row, without its comment.
        text: String,
    },
    /// `durationSeconds` is not positive.
    #[error("durationSeconds must be > 0")]
    Duration,
    /// `tickSeconds` is outside (0, 10].
    #[error("tickSeconds must be within (0, 10]")]
    Tick,
    /// More than 50 million ticks.
    #[error("durationSeconds / tickSeconds is too large (more than 50 million ticks)")]
    TooManyTicks,
    /// `durationSeconds` above [`MAX_DURATION_SECONDS`].
    #[error(
        "durationSeconds must be <= {} (7 days): a run keeps a series per second of every lane",
        MAX_DURATION_SECONDS
    )]
    DurationTooLong,
    /// More requests expected than [`MAX_EXPECTED_REQUESTS`].
    #[error(
        "{field}: the scenario expects {expected:.0} requests (every lane's arrivals over durationSeconds plus its initialBacklog), more than the {} a run may hold; {field} adds the most ({part:.0})",
        MAX_EXPECTED_REQUESTS
    )]
    TooManyRequests {
        /// The series or backlog that adds the most, e.g.
        /// `lanes.chat.arrivals`.
        field: String,
        /// Requests expected in all.
        expected: f64,
        /// Requests expected from `field`.
        part: f64,
    },
    /// `controller.evaluationIntervalSeconds` is below 1.
    #[error("controller.evaluationIntervalSeconds must be >= 1")]
    EvaluationInterval,
    /// `controller.telemetryLagSeconds` is negative.
    #[error("controller.telemetryLagSeconds must be >= 0")]
    TelemetryLag,
    /// `controller.windowSeconds` is below 1.
    #[error("controller.windowSeconds must be >= 1")]
    Window,
    /// `controller.gatewayEvidence` has a bad interval or window.
    #[error("controller.gatewayEvidence: scrapeIntervalSeconds must be > 0 and windowSeconds >= 1")]
    GatewayEvidence,
    /// An outage is not `0 <= from < to`.
    #[error("controller.telemetryOutages: each needs 0 <= from < to")]
    Outage,
    /// A time or value of a series is negative or not finite.
    #[error("{field}: times and values must be finite and >= 0")]
    PointValue {
        /// The series, e.g. `lanes.chat.arrivals`.
        field: String,
    },
    /// A series' times do not increase.
    #[error("{field}: points must be in increasing time (at {at} follows at {previous})")]
    PointOrder {
        /// The series, e.g. `lanes.chat.arrivals`.
        field: String,
        /// The offending time.
        at: f64,
        /// The time before it.
        previous: f64,
    },
    /// A lane's service times are not `0 < p50Seconds <= p95Seconds`.
    #[error("lanes.{lane}.service: need 0 < p50Seconds <= p95Seconds")]
    Service {
        /// The lane's key in the scenario.
        lane: String,
    },
    /// A lane's `failureRatio` is outside 0..1.
    #[error("lanes.{lane}.failureRatio must be within 0..1")]
    FailureRatio {
        /// The lane's key in the scenario.
        lane: String,
    },
    /// `maxRetries` above 20.
    #[error("{field}.maxRetries must be <= 20")]
    MaxRetries {
        /// The client settings, `clients` or `lanes.<key>.clients`.
        field: String,
    },
    /// Negative backoffs or a multiplier below 1.
    #[error("{field}: backoffSeconds, maxBackoffSeconds >= 0 and backoffMultiplier >= 1")]
    Backoff {
        /// The client settings, `clients` or `lanes.<key>.clients`.
        field: String,
    },
    /// A token count is not `0 < median <= p95 <= 10,000,000`.
    #[error("lanes.{lane}.tokens.{side}: need 0 < median <= p95 <= 10000000 (finite token counts)")]
    Tokens {
        /// The lane's key in the scenario.
        lane: String,
        /// Input or output.
        side: TokenSide,
    },
    /// A lane's `tenants` are wrong.
    #[error("lanes.{lane}.tenants: {why}")]
    Tenants {
        /// The lane's key in the scenario.
        lane: String,
        /// What is wrong.
        why: tenants::TenantError,
    },
    /// `jitter` or `ignoreRetryAfterShare` outside 0..1.
    #[error("{field}: jitter and ignoreRetryAfterShare must be within 0..1")]
    Share {
        /// The client settings, `clients` or `lanes.<key>.clients`.
        field: String,
    },
}

impl ScenarioError {
    fn in_file(path: &Path) -> impl FnOnce(ScenarioError) -> ScenarioError {
        move |e| ScenarioError::InFile {
            path: path.to_owned(),
            source: Box::new(e),
        }
    }
}

/// Reads and checks a scenario; CSV paths are resolved against its folder.
pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
        path: path.to_owned(),
        source,
    })?;
    let de = serde_yaml::Deserializer::from_str(&text);
    let mut s: Scenario =
        serde_path_to_error::deserialize(de).map_err(|e| ScenarioError::Parse {
            path: path.to_owned(),
            at: e.path().clone(),
            source: e.into_inner(),
        })?;
    let base = path.parent().unwrap_or(Path::new("."));
    for (k, lane) in &mut s.lanes {
        if let Some(csv) = lane.arrivals_csv.take() {
            if !lane.arrivals.is_empty() {
                return Err(ScenarioError::ArrivalsTwice {
                    path: path.to_owned(),
                    lane: k.clone(),
                });
            }
            let full = base.join(&csv);
            lane.arrivals = read_rates_csv(&full)?;
        }
    }
    check(&s).map_err(ScenarioError::in_file(path))?;
    Ok(s)
}

/// Parses a CSV of `at,requestsPerSecond` (a header line is allowed, `#`
/// starts a comment).
pub fn read_rates_csv(path: &Path) -> Result<Vec<RatePoint>, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_rates_csv(&text).map_err(ScenarioError::in_file(path))
}

/// Parses CSV text of `at,requestsPerSecond` rows.
pub fn parse_rates_csv(text: &str) -> Result<Vec<RatePoint>, ScenarioError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let mut cols = line.split(',').map(str::trim);
        let (Some(a), Some(r), None) = (cols.next(), cols.next(), cols.next()) else {
            return Err(ScenarioError::CsvColumns { line: n + 1 });
        };
        match (a.parse::<f64>(), r.parse::<f64>()) {
            (Ok(at), Ok(rps)) => out.push(RatePoint {
                at,
                requests_per_second: rps,
            }),
            _ if out.is_empty() && a.parse::<f64>().is_err() => continue, // header
            _ => {
                return Err(ScenarioError::CsvNotNumbers {
                    line: n + 1,
                    text: line.to_owned(),
                });
            }
        }
    }
    Ok(out)
}

fn finite_nonneg(v: f64) -> bool {
    v.is_finite() && v >= 0.0
}

/// Checks the scenario's numbers.
pub fn check(s: &Scenario) -> Result<(), ScenarioError> {
    if !(s.duration_seconds.is_finite() && s.duration_seconds > 0.0) {
        return Err(ScenarioError::Duration);
    }
    if !(s.tick_seconds.is_finite() && s.tick_seconds > 0.0 && s.tick_seconds <= 10.0) {
        return Err(ScenarioError::Tick);
    }
    if s.duration_seconds / s.tick_seconds > 50_000_000.0 {
        return Err(ScenarioError::TooManyTicks);
    }
    if s.duration_seconds > MAX_DURATION_SECONDS {
        return Err(ScenarioError::DurationTooLong);
    }
    let c = &s.controller;
    if !(c.evaluation_interval_seconds.is_finite() && c.evaluation_interval_seconds >= 1.0) {
        return Err(ScenarioError::EvaluationInterval);
    }
    if !finite_nonneg(c.telemetry_lag_seconds) {
        return Err(ScenarioError::TelemetryLag);
    }
    if !(c.window_seconds.is_finite() && c.window_seconds >= 1.0) {
        return Err(ScenarioError::Window);
    }
    if let Some(g) = &c.gateway_evidence
        && !(g.scrape_interval_seconds.is_finite()
            && g.scrape_interval_seconds > 0.0
            && g.window_seconds.is_finite()
            && g.window_seconds >= 1.0)
    {
        return Err(ScenarioError::GatewayEvidence);
    }
    for o in &c.telemetry_outages {
        if !(finite_nonneg(o.from) && o.to.is_finite() && o.to > o.from) {
            return Err(ScenarioError::Outage);
        }
    }
    check_clients("clients", &s.clients)?;
    for (k, p) in &s.profiles {
        check_points(
            &format!("profiles.{k}.capacity"),
            p.capacity.iter().map(|c| (c.at, c.units_per_second)),
        )?;
    }
    for (k, l) in &s.lanes {
        check_points(
            &format!("lanes.{k}.arrivals"),
            l.arrivals.iter().map(|r| (r.at, r.requests_per_second)),
        )?;
        let sv = &l.service;
        if !(sv.p50_seconds.is_finite()
            && sv.p50_seconds > 0.0
            && sv.p95_seconds.is_finite()
            && sv.p95_seconds >= sv.p50_seconds)
        {
            return Err(ScenarioError::Service { lane: k.clone() });
        }
        if !(0.0..=1.0).contains(&l.failure_ratio) {
            return Err(ScenarioError::FailureRatio { lane: k.clone() });
        }
        if let Some(cl) = &l.clients {
            check_clients(&format!("lanes.{k}.clients"), cl)?;
        }
        if let Some(side) = l.tokens.as_ref().and_then(TokenDistribution::invalid_side) {
            return Err(ScenarioError::Tokens {
                lane: k.clone(),
                side,
            });
        }
        tenants::check(&l.tenants, l.tokens.is_some()).map_err(|why| ScenarioError::Tenants {
            lane: k.clone(),
            why,
        })?;
    }
    check_requests(s)
}

/// The most seconds a scenario may simulate: 7 days (INC-47's is 4200).
/// A run keeps a series per second of every lane and profile.
pub const MAX_DURATION_SECONDS: f64 = 604_800.0;

/// The most requests a scenario may expect, arrivals and initial backlogs
/// of every lane together: 100 million (INC-47's is about 2.3 million). A
/// run holds every queued request and the latency of every served one.
pub const MAX_EXPECTED_REQUESTS: f64 = 100_000_000.0;

/// The requests `s` expects (every lane's arrivals over the run, as the
/// piecewise-constant rate gives them, plus its initial backlog) are at
/// most [`MAX_EXPECTED_REQUESTS`]; the error names the series or backlog
/// that adds the most. Needs the series checked (finite, in order).
fn check_requests(s: &Scenario) -> Result<(), ScenarioError> {
    let mut expected = 0.0;
    let mut most = (String::new(), 0.0);
    for (k, l) in &s.lanes {
        let arrivals = expected_arrivals(&l.arrivals, s.duration_seconds);
        let backlog = l.initial_backlog as f64;
        for (field, part) in [("arrivals", arrivals), ("initialBacklog", backlog)] {
            expected += part;
            if part > most.1 {
                most = (format!("lanes.{k}.{field}"), part);
            }
        }
    }
    if expected <= MAX_EXPECTED_REQUESTS {
        return Ok(());
    }
    Err(ScenarioError::TooManyRequests {
        field: most.0,
        expected,
        part: most.1,
    })
}

/// The integral over `[0, duration)` of a piecewise-constant rate (before
/// the first point, the first point's rate, as [`Steps::at`] reads it).
fn expected_arrivals(points: &[RatePoint], duration: f64) -> f64 {
    let mut total = 0.0;
    for (i, p) in points.iter().enumerate() {
        let from = if i == 0 { 0.0 } else { p.at.min(duration) };
        let to = points.get(i + 1).map_or(duration, |n| n.at.min(duration));
        total += (to - from).max(0.0) * p.requests_per_second;
    }
    total
}

fn check_points(field: &str, pts: impl Iterator<Item = (f64, f64)>) -> Result<(), ScenarioError> {
    let mut last: Option<f64> = None;
    for (at, v) in pts {
        if !finite_nonneg(at) || !finite_nonneg(v) {
            return Err(ScenarioError::PointValue {
                field: field.to_owned(),
            });
        }
        if let Some(previous) = last.filter(|&l| at <= l) {
            return Err(ScenarioError::PointOrder {
                field: field.to_owned(),
                at,
                previous,
            });
        }
        last = Some(at);
    }
    Ok(())
}

fn check_clients(field: &str, c: &ClientSpec) -> Result<(), ScenarioError> {
    let field = || field.to_owned();
    if c.max_retries > 20 {
        return Err(ScenarioError::MaxRetries { field: field() });
    }
    if !(finite_nonneg(c.backoff_seconds)
        && finite_nonneg(c.max_backoff_seconds)
        && c.backoff_multiplier.is_finite()
        && c.backoff_multiplier >= 1.0)
    {
        return Err(ScenarioError::Backoff { field: field() });
    }
    if !(0.0..=1.0).contains(&c.jitter) || !(0.0..=1.0).contains(&c.ignore_retry_after_share) {
        return Err(ScenarioError::Share { field: field() });
    }
    Ok(())
}
