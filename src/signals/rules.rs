//! `lanekeeper rules`: the Prometheus recording and alerting rules of every
//! lane with an objective, built from the gateway's
//! `lanekeeper_gateway_qualified_requests_total` counters.
//!
//! Per lane: its burn rate over 5m, 30m, 1h and 6h (bad ÷ counted requests
//! over the window, divided by the error budget's fraction), what is left
//! of its error budget over the objective's window, in percent, and the
//! multi-window multi-burn-rate alerts of the SRE workbook: 14.4× on 1h and
//! 5m (2 % of a 30-day budget in an hour), 6× on 6h and 30m (5 % in six
//! hours). With `latencyP99Seconds`, the p99 upstream latency over 5m and
//! an alert when it stays above the objective. Every series carries the
//! lane's `namespace`, `profile` and `lane` labels.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::api::{LaneContract, ObjectKey, ObjectiveSpec};
use crate::policy::World;
use crate::snapshot::BurnWindow;

/// The gateway's counter of qualified outcomes (labels `lane`, `outcome`).
pub const QUALIFIED_REQUESTS: &str = "lanekeeper_gateway_qualified_requests_total";
/// The recorded error budget remaining, in percent.
pub const BUDGET_REMAINING: &str = "lanekeeper:lane_error_budget_remaining:percent";
/// The recorded p99 upstream latency over 5m.
pub const LATENCY_P99: &str = "lanekeeper:lane_upstream_latency_p99:5m";

/// The recorded burn rate over `w` (`lanekeeper:lane_burn_rate:5m`, ...).
pub fn burn_rate_series(w: BurnWindow) -> String {
    format!("lanekeeper:lane_burn_rate:{}", w.as_str())
}

/// A multi-window burn-rate alert: fires when both windows burn faster
/// than `factor`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BurnAlert {
    /// The alert's name.
    pub name: &'static str,
    /// The burn-rate factor.
    pub factor: f64,
    /// The long window (what the alert is about).
    pub long: BurnWindow,
    /// The short window (so the alert stops soon after the burn does).
    pub short: BurnWindow,
}

/// The two alerts of the SRE workbook, fastest first.
pub const BURN_ALERTS: [BurnAlert; 2] = [
    BurnAlert {
        name: "LanekeeperErrorBudgetFastBurn",
        factor: 14.4,
        long: BurnWindow::H1,
        short: BurnWindow::M5,
    },
    BurnAlert {
        name: "LanekeeperErrorBudgetSlowBurn",
        factor: 6.0,
        long: BurnWindow::H6,
        short: BurnWindow::M30,
    },
];

/// A Prometheus rule file.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RuleFile {
    /// The groups.
    pub groups: Vec<RuleGroup>,
}

/// One rule group.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RuleGroup {
    /// Its name.
    pub name: String,
    /// Its rules, evaluated in order.
    pub rules: Vec<Rule>,
}

/// A recording or an alerting rule.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Rule {
    /// Records `expr` as the series `record`.
    Record {
        /// The series' name.
        record: String,
        /// PromQL.
        expr: String,
        /// Labels added to the series.
        labels: BTreeMap<String, String>,
    },
    /// Fires `alert` while `expr` has a result.
    Alert {
        /// The alert's name.
        alert: String,
        /// PromQL.
        expr: String,
        /// How long `expr` must hold first (absent: at once).
        #[serde(rename = "for", skip_serializing_if = "Option::is_none")]
        for_: Option<String>,
        /// Labels of the alert.
        labels: BTreeMap<String, String>,
        /// Summary and description.
        annotations: BTreeMap<String, String>,
    },
}

/// A PromQL string literal.
pub(super) fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// `selector`'s matchers followed by a comma, to go before more matchers
/// (empty without a selector).
pub(super) fn leading_matchers(selector: Option<&str>) -> String {
    selector.map(|s| format!("{s},")).unwrap_or_default()
}

/// The config-info series (value 1) of every replica of the gateway of
/// `namespace/profile`, to join a gateway series `on (instance)` with so
/// that only that profile's replicas count.
pub(super) fn profile_gateway(namespace: &str, profile: &str, selector: Option<&str>) -> String {
    format!(
        "lanekeeper_gateway_config_info{{{}profile={}}}",
        leading_matchers(selector),
        quoted(&format!("{namespace}/{profile}"))
    )
}

/// The labels of a series recorded for a profile.
pub(super) fn profile_labels(namespace: &str, profile: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("namespace".to_owned(), namespace.to_owned()),
        ("profile".to_owned(), profile.to_owned()),
    ])
}

/// The budget fraction as PromQL writes it: 12 decimals at most, no float
/// noise (`0.001` for 99.9 %).
fn budget_literal(b: f64) -> String {
    let s = format!("{b:.12}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// One lane's rules.
struct LaneRules<'a> {
    lane: &'a LaneContract,
    objective: &'a ObjectiveSpec,
    /// Extra matchers for the gateway's series (`job="gw"`), if any.
    selector: Option<&'a str>,
}

impl LaneRules<'_> {
    fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("namespace".to_owned(), self.lane.namespace_str().to_owned()),
            ("profile".to_owned(), self.lane.spec.profile.clone()),
            ("lane".to_owned(), self.lane.name_str().to_owned()),
        ])
    }

    /// The selector of the lane's recorded series.
    fn recorded(&self) -> String {
        let l = self.labels();
        let m: Vec<String> = l
            .iter()
            .map(|(k, v)| format!("{k}={}", quoted(v)))
            .collect();
        format!("{{{}}}", m.join(","))
    }

    /// The selector of the gateway's series of the lane.
    fn gateway(&self, extra: &str) -> String {
        let mut m = vec![format!("lane={}", quoted(self.lane.name_str()))];
        m.extend(self.selector.map(str::to_owned));
        if !extra.is_empty() {
            m.push(extra.to_owned());
        }
        format!("{{{}}}", m.join(","))
    }

    /// Bad ÷ counted qualified outcomes over `range`.
    fn bad_ratio(&self, range: &str) -> String {
        format!(
            "sum(increase({QUALIFIED_REQUESTS}{}[{range}])) / sum(increase({QUALIFIED_REQUESTS}{}[{range}]))",
            self.gateway("outcome=\"bad\""),
            self.gateway(""),
        )
    }

    fn record(&self, record: String, expr: String) -> Rule {
        Rule::Record {
            record,
            expr,
            labels: self.labels(),
        }
    }

    fn recording(&self) -> Vec<Rule> {
        let budget = budget_literal(self.objective.budget_fraction());
        let mut out: Vec<Rule> = BurnWindow::ALL
            .iter()
            .map(|w| {
                let ratio = self.bad_ratio(w.as_str());
                self.record(burn_rate_series(*w), format!("({ratio}) / {budget}"))
            })
            .collect();
        let ratio = self.bad_ratio(&self.objective.window);
        out.push(self.record(
            BUDGET_REMAINING.to_owned(),
            format!("100 * (1 - ({ratio}) / {budget})"),
        ));
        if self.objective.latency_p99_seconds.is_some() {
            out.push(self.record(
                LATENCY_P99.to_owned(),
                format!(
                    "histogram_quantile(0.99, sum by (le) (rate(lanekeeper_gateway_upstream_latency_seconds_bucket{}[5m])))",
                    self.gateway("")
                ),
            ));
        }
        out
    }

    fn alerts(&self) -> Vec<Rule> {
        let who = format!("{}/{}", self.lane.namespace_str(), self.lane.name_str());
        let sel = self.recorded();
        let mut out: Vec<Rule> = BURN_ALERTS
            .iter()
            .map(|a| {
                let (long, short) = (a.long.as_str(), a.short.as_str());
                let mut labels = self.labels();
                labels.insert("severity".into(), "page".into());
                Rule::Alert {
                    alert: a.name.to_owned(),
                    expr: format!(
                        "{long_s}{sel} > {f} and {short_s}{sel} > {f}",
                        long_s = burn_rate_series(a.long),
                        short_s = burn_rate_series(a.short),
                        f = a.factor,
                    ),
                    for_: None,
                    labels,
                    annotations: BTreeMap::from([
                        ("summary".into(), format!("Lane {who} burns its error budget {}× too fast", a.factor)),
                        ("description".into(), format!(
                            "Over both {long} and {short}, lane {who} burns its error budget faster than {}× (objective {} % over {}).",
                            a.factor, self.objective.within_deadline_percent, self.objective.window
                        )),
                    ]),
                }
            })
            .collect();
        if let Some(p99) = &self.objective.latency_p99_seconds {
            let mut labels = self.labels();
            labels.insert("severity".into(), "ticket".into());
            out.push(Rule::Alert {
                alert: "LanekeeperLatencyObjectiveMissed".into(),
                expr: format!("{LATENCY_P99}{sel} > {p99}"),
                for_: Some("15m".into()),
                labels,
                annotations: BTreeMap::from([(
                    "summary".into(),
                    format!("Lane {who}: p99 upstream latency above its objective of {p99}s"),
                )]),
            });
        }
        out
    }
}

/// The rules of every lane with an objective in `world`, one group per
/// lane (its recording rules, then its alerts); `lanekeeper rules` adds
/// the groups of the gateway's capacity evidence. `selector`: extra PromQL
/// matchers for the gateway's series (`job="lanekeeper-gateway"`).
pub fn rules(world: &World, selector: Option<&str>) -> RuleFile {
    let mut lanes: Vec<&LaneContract> = world
        .lanes
        .iter()
        .filter(|l| l.spec.objective.is_some())
        .collect();
    lanes.sort_by_key(|l| l.key());
    let groups = lanes
        .into_iter()
        .map(|lane| {
            let r = LaneRules {
                lane,
                objective: lane.spec.objective.as_ref().expect("filtered"),
                selector: selector.filter(|s| !s.trim().is_empty()),
            };
            let mut rules = r.recording();
            rules.extend(r.alerts());
            RuleGroup {
                name: format!(
                    "lanekeeper-objective-{}-{}",
                    lane.namespace_str(),
                    lane.name_str()
                ),
                rules,
            }
        })
        .collect();
    RuleFile { groups }
}

/// The rule file as YAML.
pub fn to_yaml(f: &RuleFile) -> String {
    serde_yaml::to_string(f).expect("rules serialize")
}
