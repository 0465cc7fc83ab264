//! `lanes.json` `breakers`: each route's circuit-breaker settings, the
//! profile's defaults with per-route overrides (see [`crate::breaker`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::breaker::BreakerSettings;

/// The breakers' settings for every route.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Breakers {
    /// The settings of a route without its own (absent: the built-in
    /// defaults).
    #[serde(default)]
    pub default: BreakerSettings,
    /// Per-route settings, by route name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub routes: BTreeMap<String, BreakerSettings>,
}

impl Breakers {
    /// The settings of `route`.
    pub fn for_route(&self, route: &str) -> &BreakerSettings {
        self.routes.get(route).unwrap_or(&self.default)
    }

    /// The first setting that is out of range, as (route, field, why):
    /// `openSeconds` must be a finite number in [0, 3600], `windowSeconds`
    /// in [1, 3600], `closeAfterSuccesses` at least 1, percents at most 100.
    pub fn out_of_range(&self) -> Option<(String, &'static str, &'static str)> {
        std::iter::once(("*default*", &self.default))
            .chain(self.routes.iter().map(|(r, s)| (r.as_str(), s)))
            .find_map(|(route, s)| bad_setting(s).map(|(f, why)| (route.to_owned(), f, why)))
    }
}

fn bad_setting(s: &BreakerSettings) -> Option<(&'static str, &'static str)> {
    if !(s.open_seconds.is_finite() && (0.0..=3600.0).contains(&s.open_seconds)) {
        return Some(("openSeconds", "must be a number in [0, 3600]"));
    }
    if !(1..=3600).contains(&s.window_seconds) {
        return Some(("windowSeconds", "must be in [1, 3600]"));
    }
    if s.close_after_successes < 1 {
        return Some(("closeAfterSuccesses", "must be at least 1"));
    }
    if s.failure_ratio_percent > 100 {
        return Some(("failureRatioPercent", "must be at most 100 (0: off)"));
    }
    if s.probe_jitter_percent > 100 {
        return Some(("probeJitterPercent", "must be at most 100"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_without_its_own_settings_gets_the_default_and_absent_fields_their_defaults() {
        let b: Breakers = serde_json::from_str(
            r#"{"default": {"consecutiveFailures": 3}, "routes": {"slow": {"openSeconds": 30}}}"#,
        )
        .unwrap();
        assert_eq!(b.for_route("fast").consecutive_failures, 3);
        assert_eq!(b.for_route("fast").open_seconds, 5.0);
        assert_eq!(b.for_route("slow").open_seconds, 30.0);
        assert_eq!(b.for_route("slow").consecutive_failures, 5);
        assert_eq!(b.out_of_range(), None);
    }

    #[test]
    fn settings_out_of_range_are_named() {
        let mut b = Breakers::default();
        b.routes.insert(
            "r".into(),
            BreakerSettings {
                open_seconds: f64::INFINITY,
                ..BreakerSettings::default()
            },
        );
        assert_eq!(
            b.out_of_range().map(|(r, f, _)| (r, f)),
            Some(("r".to_owned(), "openSeconds"))
        );
        b.routes.clear();
        b.default.window_seconds = 0;
        assert_eq!(b.out_of_range().map(|(_, f, _)| f), Some("windowSeconds"));
        b.default.window_seconds = 10;
        b.default.close_after_successes = 0;
        assert_eq!(
            b.out_of_range().map(|(_, f, _)| f),
            Some("closeAfterSuccesses")
        );
        b.default.close_after_successes = 1;
        b.default.failure_ratio_percent = 101;
        assert_eq!(
            b.out_of_range().map(|(_, f, _)| f),
            Some("failureRatioPercent")
        );
    }
}
