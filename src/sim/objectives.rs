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

use super::report::{LaneReport, SimReport};

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

/// The outcome of `lane`'s objective in `l` (None: no objective, or a
/// window that is not a duration).
pub fn outcome(lane: &LaneContract, l: &LaneReport) -> Option<ObjectiveOutcome> {
    let o = lane.spec.objective.as_ref()?;
    let window = o.window_seconds()? as f64;
    let good = l.within_deadline;
    let bad = l.late + l.failed + l.expired;
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

/// Adds each lane's objective outcome to a simulation report.
pub fn attach(report: &mut SimReport, world: &World) {
    for p in &mut report.profiles {
        for l in &mut p.lanes {
            let lane = world
                .lanes
                .iter()
                .find(|c| c.namespace_str() == l.namespace && c.name_str() == l.name);
            l.objective = lane.and_then(|c| outcome(c, l));
        }
    }
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

/// The lanes of a scenario whose band differs between base and head.
pub fn scenario_band_changes(
    file: &str,
    lanes: &[(String, Option<&LaneReport>, Option<&LaneReport>)],
) -> Vec<BandChange> {
    lanes
        .iter()
        .filter_map(|(lane, b, h)| {
            let bo = b.and_then(|l| l.objective.as_ref());
            let ho = h.and_then(|l| l.objective.as_ref());
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

/// One line per lane with an objective: attainment, budget used and band.
pub fn lines(lanes: &[LaneReport]) -> Vec<String> {
    use crate::api::common::format_number as n;
    lanes
        .iter()
        .filter_map(|l| {
            let o = l.objective.as_ref()?;
            Some(format!(
                "objective {} {}%: attainment {} ({} good, {} bad), budget used {}% of the window's {} bad outcomes, band {}",
                l.name,
                n(o.within_deadline_percent),
                o.attainment_percent.map_or_else(|| "-".to_owned(), |a| format!("{}%", n(a))),
                o.good,
                o.bad,
                n(o.budget_used_percent),
                n(o.budget_outcomes),
                o.band.as_str()
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(objective: Option<&str>) -> LaneContract {
        let mut v = serde_json::json!({
            "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "LaneContract",
            "metadata": {"name": "p0", "namespace": "ns"},
            "spec": {"profile": "pool", "priority": 0, "workUnitsPerRequest": "1",
                     "expectedRequestsPerSecond": "1", "shedding": {"mode": "Never"},
                     "deadlineSeconds": 10, "routes": {"primary": ["m"]}}
        });
        if let Some(p) = objective {
            v["spec"]["objective"] =
                serde_json::json!({"withinDeadlinePercent": p, "window": "1h"});
        }
        serde_json::from_value(v).unwrap()
    }

    fn report(good: u64, late: u64, failed: u64, expired: u64, rejected: u64) -> LaneReport {
        LaneReport {
            within_deadline: good,
            late,
            failed,
            expired,
            rejected,
            ..Default::default()
        }
    }

    #[test]
    fn bad_outcomes_spend_the_window_budget_and_set_the_band() {
        // 99 % over 1 h at 1 req/s: 36 bad outcomes allowed.
        let l = lane(Some("99"));
        let o = outcome(&l, &report(1000, 5, 4, 3, 500)).unwrap();
        assert_eq!((o.good, o.bad), (1000, 12), "rejections are not counted");
        assert!((o.budget_outcomes - 36.0).abs() < 1e-9);
        assert!((o.budget_used_percent - 33.333333).abs() < 1e-6);
        assert_eq!(o.band, Band::Cautious, "66.7 % left");
        assert!((o.attainment_percent.unwrap() - 98.814229).abs() < 1e-6);
        // Edges: 18 bad leave exactly 50 % (Cautious), 29 leave 19.4 %
        // (Restricted), 36 leave nothing (Exhausted), none leave it whole.
        let band_of = |bad| outcome(&l, &report(100, bad, 0, 0, 0)).unwrap().band;
        assert_eq!(band_of(17), Band::Routine);
        assert_eq!(band_of(18), Band::Cautious);
        assert_eq!(band_of(29), Band::Restricted);
        assert_eq!(band_of(36), Band::Exhausted);
        assert_eq!(band_of(0), Band::Routine);
        assert_eq!(
            outcome(&l, &report(0, 0, 0, 0, 9))
                .unwrap()
                .attainment_percent,
            None
        );
        assert!(
            outcome(&lane(None), &report(1, 1, 1, 1, 1)).is_none(),
            "no objective"
        );
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
        let l = lane(Some("99"));
        let mut a = report(100, 1, 0, 0, 0);
        a.objective = outcome(&l, &a);
        let mut b = report(100, 30, 0, 0, 0);
        b.objective = outcome(&l, &b);
        let lanes = vec![
            ("ns/p0".to_owned(), Some(&a), Some(&b)),
            ("ns/p1".to_owned(), Some(&a), Some(&a)),
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
