//! The recording rule of the gateway's capacity evidence: the work units
//! per second the pool completed through a profile's gateway while the
//! gateway was saturated (every slot of its in-flight limit taken, requests
//! waiting for one), from the gateway's
//! `lanekeeper_gateway_saturated_completed_units_total` and
//! `lanekeeper_gateway_saturated_seconds_total` counters.
//!
//! Per gateway replica, units completed while saturated ÷ seconds spent
//! saturated over the last minute (replicas saturated less than a second of
//! it are left out), averaged over the profile's replicas and multiplied by
//! the replica count they share the rates with. Only saturated seconds
//! count, so a drop shows in the first saturated scrape after it, not
//! diluted by the minute before. When no replica was saturated the rule
//! records nothing: no evidence, which the engine reads as "capacity as
//! measured", never as Unknown.

use crate::api::{CapacityProfile, ObjectKey};
use crate::policy::World;

use super::rules::{Rule, RuleGroup, leading_matchers, profile_gateway, profile_labels, quoted};

/// The recorded series.
pub const GOODPUT_WHILE_SATURATED: &str =
    "lanekeeper:gateway_goodput_while_saturated:units_per_second";
/// The gateway's counter of work units completed while saturated.
pub const SATURATED_UNITS: &str = "lanekeeper_gateway_saturated_completed_units_total";
/// The gateway's counter of seconds spent saturated.
pub const SATURATED_SECONDS: &str = "lanekeeper_gateway_saturated_seconds_total";

/// The query a profile's `gatewayGoodputWhileSaturated` reads the recorded
/// series with.
pub fn query(namespace: &str, profile: &str) -> String {
    format!(
        "{GOODPUT_WHILE_SATURATED}{{namespace={},profile={}}}",
        quoted(namespace),
        quoted(profile)
    )
}

/// The rule's expression for the gateway of `namespace/profile`;
/// `selector` adds matchers to every gateway series.
pub fn expr(namespace: &str, profile: &str, selector: Option<&str>) -> String {
    let sel = leading_matchers(selector);
    let mine = profile_gateway(namespace, profile, selector);
    let of = |series: &str| format!("{series}{{{}}}", sel.trim_end_matches(','));
    format!(
        "avg(increase({units}[1m]) / (increase({secs}[1m]) >= 1) * on (instance) group_left () {mine}) * scalar(max(lanekeeper_gateway_replicas{{{s}}} * on (instance) group_left () {mine}))",
        units = of(SATURATED_UNITS),
        secs = of(SATURATED_SECONDS),
        s = sel.trim_end_matches(','),
    )
}

/// One group per profile that reads the evidence (configures
/// `gatewayGoodputWhileSaturated`), in `namespace/name` order.
pub fn groups(world: &World, selector: Option<&str>) -> Vec<RuleGroup> {
    let mut profiles: Vec<&CapacityProfile> = world
        .profiles
        .iter()
        .filter(|p| {
            p.spec
                .signals
                .as_ref()
                .and_then(|s| s.prometheus.as_ref())
                .is_some_and(|p| p.queries.gateway_goodput_while_saturated.is_some())
        })
        .collect();
    profiles.sort_by_key(|p| p.key());
    profiles
        .into_iter()
        .map(|p| {
            let (ns, name) = (p.namespace_str(), p.name_str());
            RuleGroup {
                name: format!("lanekeeper-capacity-{ns}-{name}"),
                rules: vec![Rule::Record {
                    record: GOODPUT_WHILE_SATURATED.to_owned(),
                    expr: expr(ns, name, selector),
                    labels: profile_labels(ns, name),
                }],
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expression_scopes_every_series_to_the_profiles_gateway() {
        let e = expr("ai-platform", "agent-assist", Some("job=\"gw\""));
        assert!(e.contains("lanekeeper_gateway_saturated_completed_units_total{job=\"gw\"}[1m]"));
        assert!(e.contains("lanekeeper_gateway_saturated_seconds_total{job=\"gw\"}[1m]) >= 1"));
        assert_eq!(
            e.matches(
                "lanekeeper_gateway_config_info{job=\"gw\",profile=\"ai-platform/agent-assist\"}"
            )
            .count(),
            2
        );
        let bare = expr("a", "b", None);
        assert!(bare.contains("lanekeeper_gateway_replicas{}"));
        assert!(bare.contains("lanekeeper_gateway_config_info{profile=\"a/b\"}"));
        assert_eq!(
            query("a", "b"),
            "lanekeeper:gateway_goodput_while_saturated:units_per_second{namespace=\"a\",profile=\"b\"}"
        );
    }
}
