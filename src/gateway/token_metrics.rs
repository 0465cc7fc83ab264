//! The metric families of tokens as the cost, typed: one method per event.
//! Per lane: the input and output tokens the answers reported, the work
//! units reserved and charged, how far the estimate was from the settled
//! cost, settlements with and without usage; refusals by the limit that
//! refused (model slots and long context among them); and, per request,
//! histograms of its input and output tokens and settled cost (so
//! Prometheus computes their P95 over the replicas) and of its time to the
//! first byte of the answer.

use lanes::{Limit, Settled};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// Ratios of the settled cost to the reserved one.
const RATIO_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 4.0,
];

/// Tokens of one request (input or output), about 1.3 to 2 apart: a P95
/// read from them is interpolated within one bucket.
const TOKEN_BUCKETS: [f64; 28] = [
    10.0, 20.0, 30.0, 50.0, 70.0, 100.0, 150.0, 200.0, 300.0, 500.0, 700.0, 1e3, 1.5e3, 2e3, 3e3,
    5e3, 7e3, 1e4, 1.5e4, 2e4, 3e4, 5e4, 7e4, 1e5, 1.5e5, 2e5, 5e5, 1e6,
];

/// Work units one request cost, about 1.3 to 2 apart.
const COST_BUCKETS: [f64; 31] = [
    0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 1.0,
    1.5, 2.0, 3.0, 5.0, 7.0, 10.0, 15.0, 20.0, 30.0, 50.0, 70.0, 100.0, 200.0, 500.0, 1000.0,
];

/// Seconds to the first byte of an answer.
const TTFT_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
];

/// The families.
pub(super) struct TokenMetrics {
    tokens: IntCounterVec,
    units: prometheus::CounterVec,
    estimate: HistogramVec,
    settlements: IntCounterVec,
    refusals: IntCounterVec,
    /// Per settled request: `[input tokens, output tokens, cost units]`.
    per_request: [HistogramVec; 3],
    first_byte: HistogramVec,
}

/// A per-lane histogram, registered.
fn lane_histogram(r: &Registry, name: &str, help: &str, buckets: &[f64]) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        &["lane"],
    )
    .expect("valid metric");
    r.register(Box::new(h.clone())).expect("registered once");
    h
}

/// The per-request histograms, in the order of [`TokenMetrics::per_request`].
fn per_request(r: &Registry) -> [HistogramVec; 3] {
    [
        lane_histogram(
            r,
            "lanekeeper_gateway_lane_request_input_tokens",
            "Input (prompt) tokens of each priced request whose answer reported usage, by lane.",
            &TOKEN_BUCKETS,
        ),
        lane_histogram(
            r,
            "lanekeeper_gateway_lane_request_output_tokens",
            "Output (completion) tokens of each priced request whose answer reported usage, by lane.",
            &TOKEN_BUCKETS,
        ),
        lane_histogram(
            r,
            "lanekeeper_gateway_lane_request_cost_units",
            "Work units each priced request whose answer reported usage cost when settled (the lane's cost model applied to its usage), by lane.",
            &COST_BUCKETS,
        ),
    ]
}

/// The label of the limit that refused.
pub(super) fn limit_label(limit: Limit) -> &'static str {
    match limit {
        Limit::Rate => "rate",
        Limit::Paused => "paused",
        Limit::QueueTtl => "queue_ttl",
        Limit::QueueDepth => "queue_depth",
        Limit::Deadline => "deadline",
        Limit::MaxAttempts => "max_attempts",
        Limit::RetryBudget => "retry_budget",
        Limit::StopAt => "stop_at",
        Limit::Deferred => "deferred",
        Limit::LaneRemoved => "lane_removed",
        Limit::TenantConcurrency => "tenant_concurrency",
        Limit::ModelSlots => "model_slots",
        Limit::LongContext => "long_context",
    }
}

impl TokenMetrics {
    pub(super) fn new(r: &Registry) -> TokenMetrics {
        let counters = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            r.register(Box::new(c.clone())).expect("registered once");
            c
        };
        let units = prometheus::CounterVec::new(
            Opts::new(
                "lanekeeper_gateway_lane_cost_units_total",
                "Work units of priced requests by lane and stage: reserved at admission (the estimate), charged when settled (the actual cost with usage, the reservation without).",
            ),
            &["lane", "stage"],
        )
        .expect("valid metric");
        r.register(Box::new(units.clone()))
            .expect("registered once");
        let estimate = HistogramVec::new(
            HistogramOpts::new(
                "lanekeeper_gateway_lane_cost_estimate_ratio",
                "Settled cost ÷ reserved cost of the priced requests answered with usage, by lane (1 is a perfect estimate; above 1 the estimate was short).",
            )
            .buckets(RATIO_BUCKETS.to_vec()),
            &["lane"],
        )
        .expect("valid metric");
        r.register(Box::new(estimate.clone()))
            .expect("registered once");
        let first_byte = lane_histogram(
            r,
            "lanekeeper_gateway_lane_ttft_seconds",
            "Seconds from a request's dispatch (when it passed admission) to the first byte of the upstream's answer body (a stream's first chunk; the start of a JSON answer), by lane.",
            &TTFT_BUCKETS,
        );
        TokenMetrics {
            per_request: per_request(r),
            first_byte,
            tokens: counters(
                "lanekeeper_gateway_lane_tokens_total",
                "Tokens the answers of priced requests reported, by lane and kind (input, output).",
                &["lane", "kind"],
            ),
            units,
            estimate,
            settlements: counters(
                "lanekeeper_gateway_lane_settlements_total",
                "Priced requests settled, by lane and usage (reported; missing: the reservation stands).",
                &["lane", "usage"],
            ),
            refusals: counters(
                "lanekeeper_gateway_refusals_by_limit_total",
                "Requests refused (or deferred, or expired) by lane and the limit that refused them (rate, queue_depth, model_slots, long_context, ...).",
                &["lane", "limit"],
            ),
        }
    }

    /// A priced request of `lane` was settled.
    pub(super) fn settled(&self, lane: &str, s: &Settled) {
        self.units
            .with_label_values(&[lane, "reserved"])
            .inc_by(s.reserved_units);
        self.units
            .with_label_values(&[lane, "charged"])
            .inc_by(s.charged_units);
        let Some(u) = s.usage else {
            self.settlements.with_label_values(&[lane, "missing"]).inc();
            return;
        };
        self.settlements
            .with_label_values(&[lane, "reported"])
            .inc();
        self.tokens
            .with_label_values(&[lane, "input"])
            .inc_by(u.prompt_tokens);
        self.tokens
            .with_label_values(&[lane, "output"])
            .inc_by(u.completion_tokens);
        let [input, output, cost] = &self.per_request;
        input
            .with_label_values(&[lane])
            .observe(u.prompt_tokens as f64);
        output
            .with_label_values(&[lane])
            .observe(u.completion_tokens as f64);
        cost.with_label_values(&[lane]).observe(s.charged_units);
        if s.reserved_units > 0.0 {
            self.estimate
                .with_label_values(&[lane])
                .observe(s.charged_units / s.reserved_units);
        }
    }

    /// The first byte of the answer to a request of `lane` came `seconds`
    /// after its dispatch.
    pub(super) fn first_byte(&self, lane: &str, seconds: f64) {
        self.first_byte.with_label_values(&[lane]).observe(seconds);
    }

    /// A request of `lane` was refused by `limit`.
    pub(super) fn refused(&self, lane: &str, limit: Limit) {
        self.refusals
            .with_label_values(&[lane, limit_label(limit)])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_settlement_is_counted_with_its_tokens_and_its_error() {
        let r = Registry::new();
        let m = TokenMetrics::new(&r);
        let s = Settled {
            lane: 0,
            reserved_units: 2.0,
            charged_units: 3.0,
            usage: Some(lanes::Usage {
                prompt_tokens: 100,
                completion_tokens: 7,
            }),
            wake: false,
        };
        m.settled("p1", &s);
        m.settled(
            "p1",
            &Settled {
                usage: None,
                charged_units: 2.0,
                ..s
            },
        );
        m.refused("p1", Limit::LongContext);
        m.first_byte("p1", 0.3);
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&r.gather())
            .unwrap();
        for line in [
            r#"lanekeeper_gateway_lane_tokens_total{kind="input",lane="p1"} 100"#,
            r#"lanekeeper_gateway_lane_tokens_total{kind="output",lane="p1"} 7"#,
            r#"lanekeeper_gateway_lane_cost_units_total{lane="p1",stage="charged"} 5"#,
            r#"lanekeeper_gateway_lane_cost_units_total{lane="p1",stage="reserved"} 4"#,
            r#"lanekeeper_gateway_lane_settlements_total{lane="p1",usage="missing"} 1"#,
            r#"lanekeeper_gateway_lane_cost_estimate_ratio_bucket{lane="p1",le="1.5"} 1"#,
            r#"lanekeeper_gateway_refusals_by_limit_total{lane="p1",limit="long_context"} 1"#,
            // Per request, only the settlement with usage.
            r#"lanekeeper_gateway_lane_request_input_tokens_bucket{lane="p1",le="70"} 0"#,
            r#"lanekeeper_gateway_lane_request_input_tokens_bucket{lane="p1",le="100"} 1"#,
            r#"lanekeeper_gateway_lane_request_input_tokens_count{lane="p1"} 1"#,
            r#"lanekeeper_gateway_lane_request_output_tokens_bucket{lane="p1",le="10"} 1"#,
            r#"lanekeeper_gateway_lane_request_cost_units_bucket{lane="p1",le="2"} 0"#,
            r#"lanekeeper_gateway_lane_request_cost_units_bucket{lane="p1",le="3"} 1"#,
            r#"lanekeeper_gateway_lane_request_cost_units_sum{lane="p1"} 3"#,
            r#"lanekeeper_gateway_lane_ttft_seconds_bucket{lane="p1",le="0.25"} 0"#,
            r#"lanekeeper_gateway_lane_ttft_seconds_bucket{lane="p1",le="0.5"} 1"#,
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }
}
