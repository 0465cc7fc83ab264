//! The what-if of the lanes' objectives: what a scenario does to each
//! lane's error budget (`simulate`), and which lanes a change moves across
//! a band (`diff`).
//!
//! The simulator counts qualified outcomes by the rules of
//! `lanes::qualified` as far as it can see them: good = completed within
//! the deadline; bad = completed late, failed in the pool, or expired in a
//! queue after admission; not counted = rejections and deferrals (the
//! simulator does not tell a refusal inside the floor from one the contract
//! allows, so a scenario's bad count is a lower bound when a lane is
//! refused inside its floor). The budget of the objective's window is
//! `(100 − withinDeadlinePercent) %` of the requests the lane sends over
//! the window at its `expectedRequestsPerSecond`; the budget used is the
//! scenario's bad outcomes against it, and the band is the one the lane
//! would be in had the scenario started with the whole budget left.

use serde::{Deserialize, Serialize};

use crate::api::{Band, LaneContract, ObjectKey};
use crate::plan::ObjectiveSummary;
use crate::policy::budget::band;
use crate::policy::{World, round6};

/// One lane's objective over a simulated scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectiveOutcome {
    /// The objective, in percent of qualified outcomes.
    pub within_deadline_percent: f64,
    /// Good outcomes in the scenario.
    pub good: u64,
    /// Bad outcomes in the scenario.
    pub bad: u64,
    /// Good ÷ (good + bad), in percent (absent: no qualified outcome).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attainment_percent: Option<f64>,
    /// Bad outcomes allowed over the objective's window.
    pub budget_outcomes: f64,
    /// Percent of the window's budget the scenario used.
    pub budget_used_percent: f64,
    /// The band after the scenario, from a whole budget.
    pub band: Band,
}

/// The outcome of `lane`'s objective over a scenario's counts (None: no
/// objective, or a window that is not a duration): requests completed
/// within the deadline, late, failed in the pool, and expired in a queue.
pub fn outcome(
    lane: &LaneContract,
    within_deadline: u64,
    late: u64,
    failed: u64,
    expired: u64,
) -> Option<ObjectiveOutcome> {
    let o = lane.spec.objective.as_ref()?;
    let window = o.window_seconds()? as f64;
    let good = within_deadline;
    let bad = late + failed + expired;
    let qualified = good + bad;
    let budget = o.budget_fraction() * lane.spec.expected_requests_per_second.value() * window;
    let used = if budget > 0.0 {
        bad as f64 / budget * 100.0
    } else if bad > 0 {
        f64::INFINITY
    } else {
        0.0
    };
    let used = if used.is_finite() { round6(used) } else { 1e9 };
    Some(ObjectiveOutcome {
        within_deadline_percent: o.within_deadline_percent.value(),
        good,
        bad,
        attainment_percent: (qualified > 0).then(|| round6(good as f64 / qualified as f64 * 100.0)),
        budget_outcomes: round6(budget),
        budget_used_percent: used,
        band: band(Some(100.0 - used), None),
    })
}

/// The objective of the lane `namespace/name` of `world` over a scenario's
/// counts.
pub fn of_lane(
    world: &World,
    namespace: &str,
    name: &str,
    counts: [u64; 4],
) -> Option<ObjectiveOutcome> {
    let lane = world
        .lanes
        .iter()
        .find(|c| c.namespace_str() == namespace && c.name_str() == name)?;
    let [within, late, failed, expired] = counts;
    outcome(lane, within, late, failed, expired)
}

/// A lane that a change moves across a band.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BandChange {
    /// The scenario or signals file.
    pub file: String,
    /// `namespace/name` of the lane.
    pub lane: String,
    /// The band under the base (None: no objective there).
    pub base: Option<Band>,
    /// The band under the head.
    pub head: Option<Band>,
    /// Budget used under the base, in percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_budget_used_percent: Option<f64>,
    /// Budget used under the head, in percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_budget_used_percent: Option<f64>,
}

impl std::fmt::Display for BandChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = |x: Option<Band>| x.map_or("no objective", Band::as_str);
        let u = |x: Option<f64>| {
            x.map_or_else(
                || "-".to_owned(),
                |v| format!("{}%", crate::api::common::format_number(v)),
            )
        };
        write!(
            f,
            "lane {} ({}): {} -> {} (budget used {} -> {})",
            self.lane,
            self.file,
            b(self.base),
            b(self.head),
            u(self.base_budget_used_percent),
            u(self.head_budget_used_percent)
        )
    }
}

/// The lanes of a scenario whose band differs between base and head:
/// (lane, base outcome, head outcome).
pub fn scenario_band_changes(
    file: &str,
    lanes: &[(String, Option<&ObjectiveOutcome>, Option<&ObjectiveOutcome>)],
) -> Vec<BandChange> {
    lanes
        .iter()
        .filter_map(|(lane, bo, ho)| {
            let (base, head) = (bo.map(|o| o.band), ho.map(|o| o.band));
            (base != head).then(|| BandChange {
                file: file.to_owned(),
                lane: lane.clone(),
                base,
                head,
                base_budget_used_percent: bo.map(|o| o.budget_used_percent),
                head_budget_used_percent: ho.map(|o| o.budget_used_percent),
            })
        })
        .collect()
}

/// The lanes of a signal timeline whose worst band differs between base and
/// head `plan`s.
pub fn plan_band_changes(
    file: &str,
    base: &[ObjectiveSummary],
    head: &[ObjectiveSummary],
) -> Vec<BandChange> {
    let key = |o: &ObjectiveSummary| format!("{}/{}", o.namespace, o.name);
    let mut lanes: Vec<String> = base.iter().chain(head).map(key).collect();
    lanes.sort();
    lanes.dedup();
    lanes
        .into_iter()
        .filter_map(|lane| {
            let b = base.iter().find(|o| key(o) == lane);
            let h = head.iter().find(|o| key(o) == lane);
            let (bb, hb) = (b.map(|o| o.worst_band), h.map(|o| o.worst_band));
            (bb != hb).then(|| BandChange {
                file: file.to_owned(),
                lane,
                base: bb,
                head: hb,
                base_budget_used_percent: b.and_then(|o| o.budget_used_percent),
                head_budget_used_percent: h.and_then(|o| o.budget_used_percent),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lane of the objectives example at 1 request/s, with `objective`
    /// percent over an hour.
    fn lane(objective: Option<&str>) -> LaneContract {
        let mut loaded = crate::manifest::Loaded::default();
        let text = include_str!("../../examples/objectives/manifests.yaml");
        crate::manifest::load_str(std::path::Path::new("m.yaml"), text, &mut loaded).unwrap();
        let mut l = loaded.world.lanes[0].clone();
        l.spec.expected_requests_per_second = crate::api::Decimal::parse("1").unwrap();
        l.spec.objective = objective.map(|p| crate::api::ObjectiveSpec {
            within_deadline_percent: crate::api::Decimal::parse(p).unwrap(),
            latency_p99_seconds: None,
            window: "1h".into(),
        });
        l
    }

    fn counts(good: u64, late: u64, failed: u64, expired: u64) -> Option<ObjectiveOutcome> {
        outcome(&lane(Some("99")), good, late, failed, expired)
    }

    #[test]
    fn bad_outcomes_spend_the_window_budget_and_set_the_band() {
        // 99 % over 1 h at 1 req/s: 36 bad outcomes allowed.
        let o = counts(1000, 5, 4, 3).unwrap();
        assert_eq!((o.good, o.bad), (1000, 12));
        assert!((o.budget_outcomes - 36.0).abs() < 1e-9);
        assert!((o.budget_used_percent - 33.333333).abs() < 1e-6);
        assert_eq!(o.band, Band::Routine, "66.7 % left");
        assert!((o.attainment_percent.unwrap() - 98.814229).abs() < 1e-6);
        // Edges: 18 bad leave exactly 50 % (Cautious), 29 leave 19.4 %
        // (Restricted), 36 leave nothing (Exhausted), none leave it whole.
        let band_of = |bad| counts(100, bad, 0, 0).unwrap().band;
        assert_eq!(band_of(17), Band::Routine);
        assert_eq!(band_of(18), Band::Cautious);
        assert_eq!(band_of(29), Band::Restricted);
        assert_eq!(band_of(36), Band::Exhausted);
        assert_eq!(band_of(0), Band::Routine);
        assert_eq!(counts(0, 0, 0, 0).unwrap().attainment_percent, None);
        assert!(outcome(&lane(None), 1, 1, 1, 1).is_none(), "no objective");
    }

    fn summary(name: &str, worst: Band, used: Option<f64>) -> ObjectiveSummary {
        ObjectiveSummary {
            namespace: "ns".into(),
            name: name.into(),
            within_deadline_percent: 99.9,
            first_remaining_percent: used.map(|_| 100.0),
            last_remaining_percent: used.map(|u| 100.0 - u),
            budget_used_percent: used,
            attainment_percent: None,
            final_band: worst,
            worst_band: worst,
        }
    }

    #[test]
    fn a_timeline_reports_lanes_whose_worst_band_moves_or_whose_objective_comes_or_goes() {
        let base = [
            summary("p0", Band::Cautious, Some(60.0)),
            summary("p1", Band::Routine, Some(1.0)),
            summary("p2", Band::Routine, None),
        ];
        let head = [
            summary("p0", Band::Exhausted, Some(120.0)),
            summary("p1", Band::Routine, Some(2.0)),
            summary("p3", Band::Restricted, None),
        ];
        let c = plan_band_changes("signals.yaml", &base, &head);
        let got: Vec<(&str, Option<Band>, Option<Band>)> = c
            .iter()
            .map(|c| (c.lane.as_str(), c.base, c.head))
            .collect();
        assert_eq!(
            got,
            [
                ("ns/p0", Some(Band::Cautious), Some(Band::Exhausted)),
                ("ns/p2", Some(Band::Routine), None),
                ("ns/p3", None, Some(Band::Restricted)),
            ]
        );
        assert_eq!(c[0].head_budget_used_percent, Some(120.0));
        assert!(
            c[1].to_string().contains("Routine -> no objective"),
            "{}",
            c[1]
        );
    }

    #[test]
    fn a_band_change_is_reported_only_when_the_band_moves() {
        let a = counts(100, 1, 0, 0);
        let b = counts(100, 30, 0, 0);
        let lanes = vec![
            ("ns/p0".to_owned(), a.as_ref(), b.as_ref()),
            ("ns/p1".to_owned(), a.as_ref(), a.as_ref()),
        ];
        let c = scenario_band_changes("s.yaml", &lanes);
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].base, c[0].head),
            (Some(Band::Routine), Some(Band::Restricted))
        );
        assert_eq!(
            c[0].to_string(),
            "lane ns/p0 (s.yaml): Routine -> Restricted (budget used 2.777778% -> 83.333333%)"
        );
    }
}
