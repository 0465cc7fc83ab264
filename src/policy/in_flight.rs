//! Checks of a profile's `inFlight` against its pool: `stopAt` below what a
//! full pool holds in flight (Little's law: the pool's capacity in requests
//! per second × their expected service time) leaves capacity idle while
//! work waits, and `resumeBelow >= conserveAt` would leave conserve the
//! moment it is entered.

use super::decision::{InFlightProblem, Warning};
use super::evidence::Evidence;
use crate::api::InFlightSpec;

/// What the profile's watermarks get wrong, as warnings.
pub(super) fn check(spec: Option<&InFlightSpec>, ev: &Evidence<'_>) -> Vec<Warning> {
    let Some(f) = spec else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(full) = full_pool_in_flight(ev)
        && (f.stop_at as f64) < full
    {
        out.push(Warning::InFlight(InFlightProblem::StopAtBelowFullPool {
            stop_at: f.stop_at,
            full_pool: (full / 10.0).floor() * 10.0,
            capacity: ev.capacity.unwrap_or_default(),
        }));
    }
    if f.resume_below >= f.conserve_at {
        out.push(Warning::InFlight(
            InFlightProblem::ResumeAtOrAboveConserve {
                resume_below: f.resume_below,
                conserve_at: f.conserve_at,
            },
        ));
    }
    out
}

/// Requests a pool serving its whole capacity holds in flight, by Little's
/// law: capacity (units/s) × the seconds of service per unit of work of the
/// lanes' demand mix (each lane's requests/s × its `expectedServiceSeconds`
/// over the units/s of every lane). A lane without an expected service time
/// adds its units and no service time, so this is a lower bound: a warning
/// from it is never a false alarm. None without a known capacity, demand,
/// or any expected service time.
pub(super) fn full_pool_in_flight(ev: &Evidence<'_>) -> Option<f64> {
    let capacity = ev.capacity?;
    let units: f64 = ev.demands.iter().map(|d| d.units).sum();
    let seconds: f64 = ev
        .lanes
        .iter()
        .zip(&ev.demands)
        .filter_map(|(l, d)| {
            let svc = l.spec.expected_service_seconds.as_ref()?.value();
            Some(d.rps * svc)
        })
        .sum();
    (units > 0.0 && seconds > 0.0 && capacity.is_finite()).then(|| capacity * seconds / units)
}
