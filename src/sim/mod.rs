//! `lanekeeper simulate` and `lanekeeper diff`: traffic driven through a
//! gateway that enforces the latest decision of the same engine `plan` and
//! the controller use, measured against naive baselines.

pub mod chart;
pub mod cli;
pub mod diff;
pub mod engine;
pub mod objectives;
pub mod report;
pub mod tenant_report;
pub mod token_report;

pub use crate::scenario::Scenario;
pub use engine::{Run, SimError, Strategy, Trace, TracedArrival, run, run_traced};
pub use report::{SimReport, report};

/// Runs a scenario under a policy and reports it (the series at the
/// controller's evaluation interval).
pub fn simulate(
    world: &crate::policy::World,
    scenario: &Scenario,
    policy: Strategy,
) -> Result<(Run, SimReport), SimError> {
    let r = run(world, scenario, policy)?;
    let mut rep = report(&r, scenario.controller.evaluation_interval_seconds);
    for p in &mut rep.profiles {
        for l in &mut p.lanes {
            let counts = [l.within_deadline, l.late, l.failed, l.expired];
            l.objective = objectives::of_lane(world, &l.namespace, &l.name, counts);
        }
    }
    Ok((r, rep))
}
