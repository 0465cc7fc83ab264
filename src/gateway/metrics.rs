//! The gateway's metric families, typed: one method per event. The
//! per-lane series a request touches are resolved once per config (and per
//! label combination on first use), so the request path increments an
//! atomic without formatting or hashing labels.

use std::sync::{Arc, OnceLock};

use lanes::{Attempt, GatewayConfig, Outcome, Pressure, Qualified, Refusal};

use super::capacity_metrics::{self, CapacityMetrics};
use super::identity::AuthRefusal;
use super::token_metrics::TokenMetrics;
use prometheus::core::Collector;
use prometheus::{
    Counter, Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Whether a request named its tenant (the tenant itself is not a label:
/// it is unbounded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TenantClass {
    /// No tenant header: the lane's default tenant.
    Default,
    /// A tenant header.
    Named,
}

impl TenantClass {
    fn as_str(self) -> &'static str {
        match self {
            TenantClass::Default => "default",
            TenantClass::Named => "named",
        }
    }
}

/// Why an answer was cut after its headers went out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// The request's deadline passed.
    Deadline,
    /// The upstream failed mid-body.
    UpstreamError,
}

impl Cut {
    /// The label value and the error code of the event that ends the
    /// stream.
    pub fn as_str(self) -> &'static str {
        match self {
            Cut::Deadline => "deadline",
            Cut::UpstreamError => "upstream_error",
        }
    }
}

/// How a config load ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigLoad {
    /// A new config is in force.
    Loaded,
    /// The same content hash again.
    Unchanged,
    /// Not a valid `lanes.json`: the last good one stays.
    Invalid,
    /// The source could not be read: the last good one stays.
    Unreadable,
}

impl ConfigLoad {
    fn as_str(self) -> &'static str {
        match self {
            ConfigLoad::Loaded => "loaded",
            ConfigLoad::Unchanged => "unchanged",
            ConfigLoad::Invalid => "invalid",
            ConfigLoad::Unreadable => "unreadable",
        }
    }
}

const WAIT_BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// The registry and every family.
pub struct GatewayMetrics {
    registry: Registry,
    requests: IntCounterVec,
    shadow: IntCounterVec,
    queue_depth: IntGaugeVec,
    expected_service: GaugeVec,
    in_flight: IntGauge,
    wait: HistogramVec,
    upstream: HistogramVec,
    deadline_misses: IntCounterVec,
    config_info: GaugeVec,
    config_loads: IntCounterVec,
    pressure: IntGaugeVec,
    replicas: IntGauge,
    cuts: IntCounterVec,
    refused_before_admission: IntCounterVec,
    body_bytes_held: IntGauge,
    auth_refusals: IntCounterVec,
    qualified: IntCounterVec,
    /// Completed units, the in-flight limit and saturation.
    pub(super) capacity: Arc<CapacityMetrics>,
    /// Tokens, costs and refusals by limit.
    pub(super) tokens: Arc<TokenMetrics>,
}

fn registered<C: Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    registry
        .register(Box::new(c.clone()))
        .expect("each metric is registered once");
    c
}

fn counters(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    registered(
        r,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn gauges(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    registered(
        r,
        IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    registered(r, IntGauge::new(name, help).expect("valid metric"))
}

fn refused_before_admission(r: &Registry) -> IntCounterVec {
    counters(
        r,
        "lanekeeper_gateway_refused_before_admission_total",
        "Requests answered by the gateway before admission (no lane's bucket touched), by reason: not_found, method_not_allowed, invalid_attempt, invalid_request_id, unknown_lane, no_config, body_memory_full, body_too_large, body_unreadable, and the caller's and the request shape's refusals.",
        &["reason"],
    )
}

fn body_bytes_held(r: &Registry) -> IntGauge {
    gauge(
        r,
        "lanekeeper_gateway_body_bytes_held",
        "Bytes request bodies hold now (read, or promised by their content-length while read), against --max-body-memory-bytes.",
    )
}

fn expected_service(r: &Registry) -> GaugeVec {
    registered(
        r,
        GaugeVec::new(
            Opts::new(
                "lanekeeper_gateway_lane_expected_service_seconds",
                "The service time the lane's deadline check counts, as of its last request: expectedServiceSeconds, or the p95 of its answers of the last 10 s (once there are 20) when longer.",
            ),
            &["lane"],
        )
        .expect("valid metric"),
    )
}

fn pressure(r: &Registry) -> IntGaugeVec {
    gauges(
        r,
        "lanekeeper_gateway_pressure",
        "The in-flight pressure state (1 for the state in force: normal, conserve, stop).",
        &["state"],
    )
}

fn qualified(r: &Registry) -> IntCounterVec {
    counters(
        r,
        "lanekeeper_gateway_qualified_requests_total",
        "Requests that count for the lane's objective, by lane and outcome: good (answered within the deadline) or bad (failed, timed out, answered late, or refused inside the lane's floor).",
        &["lane", "outcome"],
    )
}

fn histograms(r: &Registry, name: &str, help: &str) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(WAIT_BUCKETS.to_vec());
    registered(r, HistogramVec::new(opts, &["lane"]).expect("valid metric"))
}

impl GatewayMetrics {
    /// Registers every family.
    pub fn new() -> GatewayMetrics {
        let r = Registry::new();
        GatewayMetrics {
            requests: counters(
                &r,
                "lanekeeper_gateway_requests_total",
                "Requests by lane, tenant class (default or named), attempt (original, retry, returning) and outcome.",
                &["lane", "tenant_class", "attempt", "outcome"],
            ),
            shadow: counters(
                &r,
                "lanekeeper_gateway_shadow_requests_total",
                "Observe mode: what enforcing the config would have done, by lane, attempt and outcome (every request is admitted).",
                &["lane", "attempt", "outcome"],
            ),
            deadline_misses: counters(
                &r,
                "lanekeeper_gateway_deadline_misses_total",
                "Requests that went upstream and ran past their lane's deadline.",
                &["lane"],
            ),
            config_loads: counters(
                &r,
                "lanekeeper_gateway_config_loads_total",
                "Config loads by result (loaded, unchanged, invalid, unreadable).",
                &["result"],
            ),
            wait: histograms(
                &r,
                "lanekeeper_gateway_admission_wait_seconds",
                "Time a request waited in its lane's queue before going upstream.",
            ),
            upstream: histograms(
                &r,
                "lanekeeper_gateway_upstream_latency_seconds",
                "Time from sending a request upstream to its response headers.",
            ),
            queue_depth: gauges(
                &r,
                "lanekeeper_gateway_queue_depth",
                "Requests waiting per lane.",
                &["lane"],
            ),
            expected_service: expected_service(&r),
            in_flight: gauge(
                &r,
                "lanekeeper_gateway_in_flight",
                "Requests this replica has in flight to the pool.",
            ),
            config_info: registered(
                &r,
                GaugeVec::new(
                    Opts::new(
                        "lanekeeper_gateway_config_info",
                        "The config in force (1): its profile, mode and contentHash.",
                    ),
                    &["profile", "mode", "hash"],
                )
                .expect("valid metric"),
            ),
            pressure: pressure(&r),
            replicas: gauge(
                &r,
                "lanekeeper_gateway_replicas",
                "The number of gateway replicas this one shares the rates with (N of 1/N).",
            ),
            cuts: counters(
                &r,
                "lanekeeper_gateway_responses_cut_total",
                "Answers cut short after their headers went out, by lane and reason (deadline, upstream_error); the client got an error event or an aborted body.",
                &["lane", "reason"],
            ),
            refused_before_admission: refused_before_admission(&r),
            body_bytes_held: body_bytes_held(&r),
            auth_refusals: auth_refusals(&r),
            qualified: qualified(&r),
            capacity: Arc::new(CapacityMetrics::new(&r)),
            tokens: Arc::new(TokenMetrics::new(&r)),
            registry: r,
        }
    }

    /// The registry, for the families other files own (the routes').
    pub(super) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The gauge of the bytes request bodies hold.
    pub(super) fn body_bytes_held(&self) -> IntGauge {
        self.body_bytes_held.clone()
    }

    /// Requests the gateway answered before the core saw them, by reason.
    pub fn refused_before_admission(&self, reason: &'static str) {
        self.refused_before_admission
            .with_label_values(&[reason])
            .inc();
    }

    /// A request refused by its identity (or for the lack of one), before
    /// admission.
    pub(crate) fn auth_refused(&self, why: AuthRefusal) {
        self.auth_refusals.with_label_values(&[why.as_str()]).inc();
    }

    /// The per-lane meters of a config, by lane index.
    pub fn lanes(&self, cfg: &GatewayConfig) -> Vec<LaneMeter> {
        cfg.lanes
            .iter()
            .map(|l| LaneMeter {
                lane: l.name.clone(),
                requests: Default::default(),
                shadow: Default::default(),
                queue_depth: self.queue_depth.with_label_values(&[&l.name]),
                expected_service: self.expected_service.with_label_values(&[&l.name]),
                wait: self.wait.with_label_values(&[&l.name]),
                upstream: self.upstream.with_label_values(&[&l.name]),
                deadline_misses: self.deadline_misses.with_label_values(&[&l.name]),
                cuts: [Cut::Deadline, Cut::UpstreamError]
                    .map(|c| self.cuts.with_label_values(&[&l.name, c.as_str()])),
                families: (self.requests.clone(), self.shadow.clone()),
                qualified: [Qualified::Good, Qualified::Bad].map(|q| {
                    self.qualified
                        .with_label_values(&[&l.name, q.label().expect("counted")])
                }),
                units: l.work_units_per_request,
                routes: l
                    .routes
                    .iter()
                    .chain(&l.breaker_fallbacks)
                    .map(|r| (r.clone(), OnceLock::new()))
                    .collect(),
                capacity: Arc::clone(&self.capacity),
                tokens: Arc::clone(&self.tokens),
            })
            .collect()
    }

    /// A config load ended so.
    pub fn config_load(&self, result: ConfigLoad) {
        self.config_loads
            .with_label_values(&[result.as_str()])
            .inc();
    }

    /// `cfg` is in force now.
    pub fn config_in_force(&self, cfg: &GatewayConfig) {
        self.config_info.reset();
        self.config_info
            .with_label_values(&[&cfg.profile, cfg.mode.as_str(), &cfg.content_hash])
            .set(1.0);
    }

    /// The pressure state in force.
    pub fn pressure(&self, now: Pressure) {
        for p in Pressure::ALL {
            self.pressure
                .with_label_values(&[p.as_str()])
                .set(i64::from(p == now));
        }
    }

    /// The replica count N.
    pub fn replicas(&self, n: u32) {
        self.replicas.set(i64::from(n));
    }

    /// A request went upstream (+1) or finished (-1).
    pub fn in_flight(&self, delta: i64) {
        self.in_flight.add(delta);
    }

    /// The text exposition: (content type, body).
    pub fn encode(&self) -> Result<(String, Vec<u8>), prometheus::Error> {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        encoder.encode(&self.registry.gather(), &mut buf)?;
        Ok((encoder.format_type().to_owned(), buf))
    }
}

/// Refusals by identity, each reason at 0 from the start.
fn auth_refusals(r: &Registry) -> IntCounterVec {
    let c = counters(
        r,
        "lanekeeper_gateway_auth_refusals_total",
        "Requests refused before admission by their identity, by reason (no_credential, unknown_api_key, rejected_token, invalid_jwt, unknown_certificate, lane_not_allowed, lane_not_named, identity_unavailable). None took a token.",
        &["reason"],
    );
    for why in AuthRefusal::ALL {
        c.with_label_values(&[why.as_str()]);
    }
    c
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        GatewayMetrics::new()
    }
}

const CLASSES: usize = 2;
const ATTEMPTS: usize = Attempt::ALL.len();
const OUTCOMES: usize = Outcome::ALL.len();

type Cells<const N: usize> = [OnceLock<IntCounter>; N];

/// One lane's series.
pub struct LaneMeter {
    lane: String,
    requests: [[Cells<OUTCOMES>; ATTEMPTS]; CLASSES],
    shadow: [Cells<OUTCOMES>; ATTEMPTS],
    queue_depth: IntGauge,
    expected_service: prometheus::Gauge,
    wait: Histogram,
    upstream: Histogram,
    deadline_misses: IntCounter,
    /// By [`Cut`]: deadline, upstream error.
    cuts: [IntCounter; 2],
    /// By [`Qualified`]: good, bad.
    qualified: [IntCounter; 2],
    families: (IntCounterVec, IntCounterVec),
    /// The lane's work units per request.
    units: f64,
    /// Its completed units by route, for its routes and breaker fallbacks
    /// (each made at its first completion).
    routes: Vec<(String, OnceLock<Counter>)>,
    capacity: Arc<CapacityMetrics>,
    tokens: Arc<TokenMetrics>,
}

fn index_of<T: PartialEq>(all: &[T], v: &T) -> usize {
    all.iter().position(|x| x == v).expect("a member of ALL")
}

impl LaneMeter {
    /// A request of this lane ended (or, for `Queued`, waited) so.
    pub fn request(&self, class: TenantClass, attempt: Attempt, outcome: Outcome) {
        let c = usize::from(class == TenantClass::Named);
        let (a, o) = (
            index_of(&Attempt::ALL, &attempt),
            index_of(&Outcome::ALL, &outcome),
        );
        self.requests[c][a][o]
            .get_or_init(|| {
                self.families.0.with_label_values(&[
                    &self.lane,
                    class.as_str(),
                    attempt.as_str(),
                    outcome.as_str(),
                ])
            })
            .inc();
    }

    /// A request was refused (or deferred, or expired): counted by outcome,
    /// and for the objective when the refusal broke a promise.
    pub fn refused(&self, class: TenantClass, r: &Refusal) {
        self.request(class, r.attempt, r.outcome);
        self.tokens.refused(&self.lane, r.limit);
        self.qualified(lanes::qualified::refused(r));
    }

    /// A request counted for the lane's objective (not counted: nothing).
    pub fn qualified(&self, q: Qualified) {
        match q {
            Qualified::Good => self.qualified[0].inc(),
            Qualified::Bad => self.qualified[1].inc(),
            Qualified::NotCounted => {}
        }
    }

    /// Observe mode: enforcing would have ended the request so.
    pub fn shadow(&self, attempt: Attempt, outcome: Outcome) {
        let (a, o) = (
            index_of(&Attempt::ALL, &attempt),
            index_of(&Outcome::ALL, &outcome),
        );
        self.shadow[a][o]
            .get_or_init(|| {
                self.families
                    .1
                    .with_label_values(&[&self.lane, attempt.as_str(), outcome.as_str()])
            })
            .inc();
    }

    /// Requests waiting now.
    pub fn queue_depth(&self, n: usize) {
        self.queue_depth.set(n as i64);
    }

    /// The service time the lane's deadline check counted at its last
    /// request.
    pub fn expected_service(&self, seconds: f64) {
        self.expected_service.set(seconds);
    }

    /// A queued request went upstream after `seconds`.
    pub fn waited(&self, seconds: f64) {
        self.wait.observe(seconds);
    }

    /// The upstream answered with headers after `seconds`.
    pub fn upstream_latency(&self, seconds: f64) {
        self.upstream.observe(seconds);
    }

    /// A request of this lane was answered in full by `route`.
    pub fn completed(&self, route: &str) {
        self.completed_units(route, self.units);
    }

    /// A priced request of this lane was answered in full by `route` and
    /// cost `units` work units.
    pub fn completed_units(&self, route: &str, units: f64) {
        if !capacity_metrics::counts(units) {
            // Nothing to count: no series is made for it.
            return;
        }
        let counter = match self.routes.iter().find(|(r, _)| **r == *route) {
            Some((_, c)) => c.get_or_init(|| self.capacity.completed_of(&self.lane, route)),
            // Not one of the lane's routes in this config: looked up.
            None => &self.capacity.completed_of(&self.lane, route),
        };
        self.capacity.completed(counter, units);
    }

    /// A request ran past its deadline upstream.
    pub fn deadline_missed(&self) {
        self.deadline_misses.inc();
    }

    /// An answer was cut after its headers went out.
    pub fn cut(&self, why: Cut) {
        self.cuts[usize::from(why == Cut::UpstreamError)].inc();
    }
}
