//! Prometheus metrics of the controller and its signal sources (a module of
//! its own, below both, so the signals never import the controller).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

/// The lanes whose series were last set, per (namespace, profile).
type LanesSet = HashMap<(String, String), Vec<String>>;

/// Every metric the controller exports.
#[derive(Clone)]
pub struct Metrics {
    /// The registry (served on /metrics).
    pub registry: Registry,
    /// Degradation level per profile.
    pub level: GaugeVec,
    /// Capacity per profile.
    pub capacity: GaugeVec,
    /// Demand per profile.
    pub demand: GaugeVec,
    /// Admitted per profile.
    pub admitted: GaugeVec,
    /// Utilization percent per profile.
    pub utilization: GaugeVec,
    /// Demand per lane.
    pub lane_demand: GaugeVec,
    /// Admitted per lane.
    pub lane_admitted: GaugeVec,
    /// Per lane: all attempts ÷ original requests (only while measured).
    pub lane_retry_amplification: GaugeVec,
    /// Per lane with an objective: percent of its error budget left (only
    /// while known).
    pub lane_error_budget_remaining: GaugeVec,
    /// Per lane with an objective: its band (0 Routine, 1 Cautious, 2
    /// Restricted, 3 Exhausted).
    pub lane_budget_band: GaugeVec,
    /// Desired replicas per profile.
    pub desired_replicas: GaugeVec,
    /// Ready replicas per profile.
    pub ready_replicas: GaugeVec,
    /// 1 when telemetry is known.
    pub telemetry_known: GaugeVec,
    /// Reconcile duration.
    pub reconcile_duration: HistogramVec,
    /// Reconcile errors by reason.
    pub reconcile_errors: IntCounterVec,
    /// API writes by kind of object and verb.
    pub api_writes: IntCounterVec,
    /// 1 while this instance leads.
    pub leader: IntGauge,
    /// Age of each live signal's newest sample, in seconds
    /// (`profile` is `namespace/name`).
    pub signal_age: GaugeVec,
    /// Signals found Unknown, by reason (`profile` is `namespace/name`).
    pub signal_errors: IntCounterVec,
    /// Pods carrying the drain label, per profile.
    pub drained_pods: GaugeVec,
    /// Drains by reason.
    pub drains: IntCounterVec,
    /// Undrains by reason.
    pub undrains: IntCounterVec,
    /// Drains the bound refused.
    pub drains_refused: IntCounterVec,
    /// The lanes whose series were last set, per (namespace, profile).
    lanes: Arc<Mutex<LanesSet>>,
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(c.clone()))
        .expect("registers once");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(g.clone()))
        .expect("registers once");
    g
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("valid metric");
    registry
        .register(Box::new(h.clone()))
        .expect("registers once");
    h
}

fn int_gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid metric");
    registry
        .register(Box::new(g.clone()))
        .expect("registers once");
    g
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let registry = Registry::new();
        let p = &["namespace", "profile"];
        let l = &["namespace", "profile", "lane"];
        Self {
            level: gauge(
                &registry,
                "lanekeeper_level",
                "Current degradation level (0 = normal).",
                p,
            ),
            capacity: gauge(
                &registry,
                "lanekeeper_capacity_units_per_second",
                "Pool capacity in work units/s (absent while unknown).",
                p,
            ),
            demand: gauge(
                &registry,
                "lanekeeper_demand_units_per_second",
                "Total demand of the bound lanes before shedding.",
                p,
            ),
            admitted: gauge(
                &registry,
                "lanekeeper_admitted_units_per_second",
                "Total admitted work units/s.",
                p,
            ),
            utilization: gauge(
                &registry,
                "lanekeeper_utilization_percent",
                "Demand divided by capacity, in percent.",
                p,
            ),
            lane_demand: gauge(
                &registry,
                "lanekeeper_lane_demand_units_per_second",
                "Demand per lane.",
                l,
            ),
            lane_admitted: gauge(
                &registry,
                "lanekeeper_lane_admitted_units_per_second",
                "Admitted work units/s per lane.",
                l,
            ),
            lane_retry_amplification: gauge(
                &registry,
                "lanekeeper_lane_retry_amplification",
                "Attempts per original request per lane (1 = no retries); absent while retries are not measured.",
                l,
            ),
            lane_error_budget_remaining: gauge(
                &registry,
                "lanekeeper_lane_error_budget_remaining_percent",
                "Percent of the lane's error budget left over its objective's window; absent while Unknown.",
                l,
            ),
            lane_budget_band: gauge(
                &registry,
                "lanekeeper_lane_budget_band",
                "The lane's error-budget band: 0 Routine, 1 Cautious, 2 Restricted, 3 Exhausted.",
                l,
            ),
            desired_replicas: gauge(
                &registry,
                "lanekeeper_desired_replicas",
                "Pool size lanekeeper wants.",
                p,
            ),
            ready_replicas: gauge(
                &registry,
                "lanekeeper_ready_replicas",
                "Ready replicas of the pool.",
                p,
            ),
            telemetry_known: gauge(
                &registry,
                "lanekeeper_telemetry_known",
                "1 when the pool's capacity is known, 0 when unknown.",
                p,
            ),
            signal_age: gauge(
                &registry,
                "lanekeeper_signal_age_seconds",
                "Age of the newest sample of each live signal at the last evaluation.",
                &["profile", "signal"],
            ),
            signal_errors: counter(
                &registry,
                "lanekeeper_signal_errors_total",
                "Live signals found Unknown (stale, NaN, empty, HTTP error, timeout, malformed, ...), by reason.",
                &["profile", "signal", "reason"],
            ),
            drained_pods: gauge(
                &registry,
                "lanekeeper_drained_pods",
                "Pods of the pool carrying the drain label.",
                p,
            ),
            drains: counter(
                &registry,
                "lanekeeper_drains_total",
                "Pods drained, by reason.",
                &["namespace", "profile", "reason"],
            ),
            undrains: counter(
                &registry,
                "lanekeeper_undrains_total",
                "Pods undrained, by reason.",
                &["namespace", "profile", "reason"],
            ),
            drains_refused: counter(
                &registry,
                "lanekeeper_drains_refused_total",
                "Drain candidates the bound refused.",
                p,
            ),
            reconcile_duration: histogram(
                &registry,
                "lanekeeper_reconcile_duration_seconds",
                "Duration of one reconcile of a profile.",
                &[
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ],
                p,
            ),
            reconcile_errors: counter(
                &registry,
                "lanekeeper_reconcile_errors_total",
                "Failed reconciles by reason.",
                &["reason"],
            ),
            api_writes: counter(
                &registry,
                "lanekeeper_api_writes_total",
                "Writes to the Kubernetes API by object kind and verb.",
                &["kind", "verb"],
            ),
            leader: int_gauge(
                &registry,
                "lanekeeper_leader",
                "1 while this instance holds the leader lease.",
            ),
            registry,
            lanes: Arc::default(),
        }
    }

    /// Counts one API write.
    pub fn write(&self, kind: &str, verb: &str) {
        self.api_writes.with_label_values(&[kind, verb]).inc();
    }

    /// Removes every series of a profile (it was deleted).
    pub fn forget_profile(&self, namespace: &str, profile: &str, lanes: &[String]) {
        for g in [
            &self.level,
            &self.capacity,
            &self.demand,
            &self.admitted,
            &self.utilization,
            &self.desired_replicas,
            &self.ready_replicas,
            &self.telemetry_known,
            &self.drained_pods,
        ] {
            let _ = g.remove_label_values(&[namespace, profile]);
        }
        self.forget_lanes(namespace, profile, lanes);
        let key = (namespace.to_owned(), profile.to_owned());
        let kept = self.lanes.lock().expect("not poisoned").remove(&key);
        self.forget_lanes(namespace, profile, &kept.unwrap_or_default());
    }

    /// The gauges with a series per lane.
    fn lane_gauges(&self) -> [&GaugeVec; 5] {
        [
            &self.lane_demand,
            &self.lane_admitted,
            &self.lane_retry_amplification,
            &self.lane_error_budget_remaining,
            &self.lane_budget_band,
        ]
    }

    /// Removes the series of the profile's lanes other than `lanes` (the
    /// lanes bound to it now, whose series the caller sets): a lane deleted,
    /// or moved to another profile, is no longer exported with its last
    /// value. Compares with the lanes it was last given for the profile.
    pub fn keep_lanes(&self, namespace: &str, profile: &str, lanes: &[String]) {
        let key = (namespace.to_owned(), profile.to_owned());
        let before = self
            .lanes
            .lock()
            .expect("not poisoned")
            .insert(key, lanes.to_vec());
        let gone: Vec<String> = before
            .unwrap_or_default()
            .into_iter()
            .filter(|l| !lanes.contains(l))
            .collect();
        self.forget_lanes(namespace, profile, &gone);
    }

    /// Removes the series of these lanes of the profile.
    fn forget_lanes(&self, namespace: &str, profile: &str, lanes: &[String]) {
        for lane in lanes {
            for g in self.lane_gauges() {
                let _ = g.remove_label_values(&[namespace, profile, lane]);
            }
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# encoding failed: {e}\n"))
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::core::Collector;

    #[test]
    fn every_metric_is_registered_under_its_name_and_type() {
        let m = Metrics::new();
        let p = &["ns", "pool"];
        let l = &["ns", "pool", "lane"];
        for g in [
            &m.level,
            &m.capacity,
            &m.demand,
            &m.admitted,
            &m.utilization,
            &m.desired_replicas,
            &m.ready_replicas,
            &m.telemetry_known,
            &m.drained_pods,
        ] {
            g.with_label_values(p).set(1.0);
        }
        for g in [
            &m.lane_demand,
            &m.lane_admitted,
            &m.lane_retry_amplification,
            &m.lane_error_budget_remaining,
            &m.lane_budget_band,
        ] {
            g.with_label_values(l).set(1.0);
        }
        m.signal_age.with_label_values(&["ns/pool", "s"]).set(1.0);
        m.signal_errors
            .with_label_values(&["ns/pool", "s", "stale"])
            .inc();
        m.drains.with_label_values(&["ns", "pool", "r"]).inc();
        m.undrains.with_label_values(&["ns", "pool", "r"]).inc();
        m.drains_refused.with_label_values(p).inc();
        m.reconcile_duration.with_label_values(p).observe(0.003);
        m.reconcile_errors.with_label_values(&["r"]).inc();
        m.write("Pod", "patch");
        m.leader.set(1);
        let text = m.render();
        let want = [
            ("level", "gauge"),
            ("capacity_units_per_second", "gauge"),
            ("demand_units_per_second", "gauge"),
            ("admitted_units_per_second", "gauge"),
            ("utilization_percent", "gauge"),
            ("lane_demand_units_per_second", "gauge"),
            ("lane_admitted_units_per_second", "gauge"),
            ("lane_retry_amplification", "gauge"),
            ("lane_error_budget_remaining_percent", "gauge"),
            ("lane_budget_band", "gauge"),
            ("desired_replicas", "gauge"),
            ("ready_replicas", "gauge"),
            ("telemetry_known", "gauge"),
            ("signal_age_seconds", "gauge"),
            ("signal_errors_total", "counter"),
            ("drained_pods", "gauge"),
            ("drains_total", "counter"),
            ("undrains_total", "counter"),
            ("drains_refused_total", "counter"),
            ("reconcile_duration_seconds", "histogram"),
            ("reconcile_errors_total", "counter"),
            ("api_writes_total", "counter"),
            ("leader", "gauge"),
        ];
        for (name, kind) in want {
            let line = format!("# TYPE lanekeeper_{name} {kind}\n");
            assert!(text.contains(&line), "missing {line:?} in\n{text}");
        }
        assert_eq!(text.matches("# TYPE ").count(), want.len(), "{text}");
        assert!(
            text.contains("le=\"0.0025\"") && text.contains("le=\"5\""),
            "{text}"
        );
    }

    #[test]
    fn a_lane_gone_from_its_profile_loses_its_series_and_only_it() {
        let m = Metrics::new();
        let set = |ns: &str, profile: &str, lanes: &[&str]| {
            let lanes: Vec<String> = lanes.iter().map(|l| l.to_string()).collect();
            m.keep_lanes(ns, profile, &lanes);
            for lane in &lanes {
                for g in m.lane_gauges() {
                    g.with_label_values(&[ns, profile, lane]).set(1.0);
                }
            }
        };
        set("ns", "pool", &["kept", "gone"]);
        set("ns", "other", &["gone"]);
        set("ns2", "pool", &["gone"]);
        set("ns", "pool", &["kept"]);
        let text = m.render();
        for g in m.lane_gauges() {
            let name = g.desc()[0].fq_name.clone();
            let series: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("{name}{{")))
                .collect();
            assert_eq!(series.len(), 3, "{series:?}");
            assert!(
                !series
                    .iter()
                    .any(|l| l.contains(r#"namespace="ns",profile="pool""#)
                        && l.contains(r#"lane="gone""#)),
                "{series:?}"
            );
        }
    }
}
