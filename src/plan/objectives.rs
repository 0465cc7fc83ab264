//! What a `plan` timeline says about each lane's objective: the budget it
//! used from the first step to the last, the attainment over the
//! objective's window as of the last step, and the worst band it reached.

use serde::{Deserialize, Serialize};

use crate::api::{Band, LaneContract, ObjectKey};
use crate::policy::{Evaluation, round6};

/// One lane's objective over the timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectiveSummary {
    /// Namespace of the LaneContract.
    pub namespace: String,
    /// Name of the LaneContract.
    pub name: String,
    /// The objective, in percent of qualified outcomes.
    pub within_deadline_percent: f64,
    /// Budget left at the first step with known budget data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_remaining_percent: Option<f64>,
    /// Budget left at the last step with known budget data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_remaining_percent: Option<f64>,
    /// Percent of the budget the timeline used (first less last known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_used_percent: Option<f64>,
    /// Good ÷ qualified outcomes over the objective's window as of the last
    /// known step, in percent: 100 − (1 − remaining ÷ 100) × budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attainment_percent: Option<f64>,
    /// The band at the last step.
    pub final_band: Band,
    /// The worst band of any step.
    pub worst_band: Band,
}

/// The summaries of every lane with an objective that the steps decided
/// on, in the order of `lanes`.
pub fn summaries(lanes: &[LaneContract], steps: &[Evaluation]) -> Vec<ObjectiveSummary> {
    lanes
        .iter()
        .filter_map(|l| {
            let objective = l.spec.objective.as_ref()?;
            let per_step: Vec<_> = steps
                .iter()
                .flat_map(|s| &s.profiles)
                .flat_map(|p| &p.lanes)
                .filter(|d| d.namespace == l.namespace_str() && d.name == l.name_str())
                .filter_map(|d| d.objective.as_ref())
                .collect();
            let last = per_step.last()?;
            let known: Vec<f64> = per_step
                .iter()
                .filter_map(|o| o.remaining_percent)
                .collect();
            let (first, latest) = (known.first().copied(), known.last().copied());
            let budget = 100.0 - objective.within_deadline_percent.value();
            Some(ObjectiveSummary {
                namespace: l.namespace_str().to_owned(),
                name: l.name_str().to_owned(),
                within_deadline_percent: objective.within_deadline_percent.value(),
                first_remaining_percent: first,
                last_remaining_percent: latest,
                budget_used_percent: first.zip(latest).map(|(a, b)| round6(a - b)),
                attainment_percent: latest.map(|r| round6(100.0 - (1.0 - r / 100.0) * budget)),
                final_band: last.band,
                worst_band: per_step.iter().map(|o| o.band).max().unwrap_or(last.band),
            })
        })
        .collect()
}
