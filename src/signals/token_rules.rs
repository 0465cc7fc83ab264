//! The recording rules of the priced lanes' P95s per request:
//! `lane:p95_input_tokens`, `lane:p95_output_tokens` and
//! `lane:p95_cost_units_per_request`, from the gateway's per-request
//! histograms (`lanekeeper_gateway_lane_request_input_tokens`,
//! `..._output_tokens`, `..._cost_units`), which it keeps for the lanes
//! with a `cost` only.
//!
//! One group per profile with at least one priced lane: the 95th percentile
//! over the last 5 minutes of the buckets of every replica of the profile's
//! gateway (`lanekeeper_gateway_config_info`'s `profile`), by `lane`, each
//! series labelled with the profile's `namespace` and `profile`. These are
//! the series a profile without queries reads by convention
//! (`lane:p95_input_tokens{namespace="NS"}` by `lane`, see
//! [`conventional_queries`](super::prometheus::conventional_queries)).

use std::collections::BTreeSet;

use crate::api::ObjectKey;
use crate::policy::World;

use super::rules::{Rule, RuleGroup, leading_matchers, profile_gateway, profile_labels};

/// The recorded P95 of the input tokens of a request.
pub const P95_INPUT_TOKENS: &str = "lane:p95_input_tokens";
/// The recorded P95 of the output tokens of a request.
pub const P95_OUTPUT_TOKENS: &str = "lane:p95_output_tokens";
/// The recorded P95 of the work units a request cost when settled.
pub const P95_COST_UNITS: &str = "lane:p95_cost_units_per_request";

/// Each recorded series and the gateway histogram it reads, in the order
/// of the group's rules.
pub const SERIES: [(&str, &str); 3] = [
    (
        P95_INPUT_TOKENS,
        "lanekeeper_gateway_lane_request_input_tokens_bucket",
    ),
    (
        P95_OUTPUT_TOKENS,
        "lanekeeper_gateway_lane_request_output_tokens_bucket",
    ),
    (
        P95_COST_UNITS,
        "lanekeeper_gateway_lane_request_cost_units_bucket",
    ),
];

/// The expression recording the P95 of `buckets` for the lanes of the
/// gateway of `namespace/profile`; `selector` adds matchers to every
/// gateway series.
pub fn expr(buckets: &str, namespace: &str, profile: &str, selector: Option<&str>) -> String {
    let sel = leading_matchers(selector);
    let own = sel.trim_end_matches(',');
    let of = if own.is_empty() {
        buckets.to_owned()
    } else {
        format!("{buckets}{{{own}}}")
    };
    format!(
        "histogram_quantile(0.95, sum by (lane, le) (rate({of}[5m]) * on (instance) group_left () {}))",
        profile_gateway(namespace, profile, selector)
    )
}

/// One group per profile (`namespace/name` order) that at least one
/// LaneContract with `spec.cost` names; the profile need not be in the
/// manifests (its gateway exports the priced lanes' histograms anyway).
pub fn groups(world: &World, selector: Option<&str>) -> Vec<RuleGroup> {
    let profiles: BTreeSet<(&str, &str)> = world
        .lanes
        .iter()
        .filter(|l| l.spec.cost.is_some())
        .map(|l| (l.namespace_str(), l.spec.profile.as_str()))
        .collect();
    profiles
        .into_iter()
        .map(|(ns, name)| RuleGroup {
            name: format!("lanekeeper-tokens-{ns}-{name}"),
            rules: SERIES
                .iter()
                .map(|(record, buckets)| Rule::Record {
                    record: (*record).to_owned(),
                    expr: expr(buckets, ns, name, selector),
                    labels: profile_labels(ns, name),
                })
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expression_reads_the_profiles_gateway_only() {
        let e = expr(
            "lanekeeper_gateway_lane_request_cost_units_bucket",
            "ai-platform",
            "agent-assist",
            Some("job=\"gw\""),
        );
        assert_eq!(
            e,
            "histogram_quantile(0.95, sum by (lane, le) (rate(lanekeeper_gateway_lane_request_cost_units_bucket{job=\"gw\"}[5m]) * on (instance) group_left () lanekeeper_gateway_config_info{job=\"gw\",profile=\"ai-platform/agent-assist\"}))"
        );
        let bare = expr("x_bucket", "a", "b", None);
        assert!(bare.contains("rate(x_bucket[5m])"), "{bare}");
        assert!(
            bare.ends_with("lanekeeper_gateway_config_info{profile=\"a/b\"}))"),
            "{bare}"
        );
    }

    #[test]
    fn the_recorded_names_are_the_conventional_queries() {
        let world = crate::manifest::load(&[
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/inc-47-tokens")
        ])
        .unwrap()
        .world;
        let p = &world.profiles[0];
        let q = super::super::prometheus::conventional_queries(p);
        for (query, record) in [
            (q.lane_p95_input_tokens, P95_INPUT_TOKENS),
            (q.lane_p95_output_tokens, P95_OUTPUT_TOKENS),
            (q.lane_p95_cost_units_per_request, P95_COST_UNITS),
        ] {
            assert_eq!(
                query.unwrap(),
                format!("{record}{{namespace=\"ai-platform\"}}")
            );
        }
    }
}
