//! The rules a `lanes.json` must keep before a gateway enforces it. A config
//! that breaks one is refused whole and the gateway keeps its last good one.

use std::collections::HashSet;

use thiserror::Error;

use crate::config::{GatewayConfig, LaneConfig, SCHEMA_VERSION};

/// A config the core refuses (the caller keeps its last good one).
#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    /// Not JSON, or JSON that is not a `lanes.json` (a missing field, a
    /// wrong type, an unknown `mode`, `state` or `telemetry`, a bad
    /// `expiresAt`).
    #[error("not a lanes.json: {0}")]
    Json(String),
    /// A `schemaVersion` other than the one this build knows.
    #[error("unknown schemaVersion {0} (this gateway knows {SCHEMA_VERSION})")]
    SchemaVersion(u32),
    /// No lane at all: every request would be refused as an unknown lane.
    #[error("the config has no lanes: every request would be refused")]
    NoLanes,
    /// A known capacity that is zero, negative or not a number: the pool
    /// could take nothing.
    #[error("capacityUnitsPerSecond is {0}, must be a finite number > 0 (or null while unknown)")]
    Capacity(String),
    /// Two lanes with one name.
    #[error("lane {0:?} appears twice")]
    DuplicateLane(String),
    /// A number that is negative, NaN or infinite, or a limit below 1.
    #[error("lane {lane:?}: {field} is {value}, {expected}")]
    Field {
        /// The lane.
        lane: String,
        /// The field (as in `lanes.json`).
        field: &'static str,
        /// What it was.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A borrowing grant whose lender is not another lane of the config, or
    /// whose rate is not a number >= 0.
    #[error("lane {lane:?}: borrowing grant from {from:?}: {why}")]
    Grant {
        /// The borrower.
        lane: String,
        /// The lender named.
        from: String,
        /// What is wrong.
        why: &'static str,
    },
    /// Watermarks out of order.
    #[error("inFlight: need resumeBelow <= conserveAt <= stopAt, got {0}")]
    Watermarks(String),
    /// A breaker setting out of range.
    #[error("breakers: route {route}: {field} {why}")]
    Breaker {
        /// The route (`*default*` for the default settings).
        route: String,
        /// The field.
        field: &'static str,
        /// What it must be.
        why: &'static str,
    },
    /// The replica share is not in (0, 1].
    #[error("replica share {0} is not in (0, 1]")]
    Share(f64),
}

/// Checks a config the way [`crate::Core::new`] does, without building one.
pub fn validate(cfg: &GatewayConfig) -> Result<(), ConfigError> {
    if cfg.schema_version != SCHEMA_VERSION {
        return Err(ConfigError::SchemaVersion(cfg.schema_version));
    }
    if cfg.lanes.is_empty() {
        return Err(ConfigError::NoLanes);
    }
    if let Some(c) = cfg.capacity_units_per_second
        && !(c.is_finite() && c > 0.0)
    {
        return Err(ConfigError::Capacity(c.to_string()));
    }
    let mut names = HashSet::new();
    for l in &cfg.lanes {
        if !names.insert(l.name.as_str()) {
            return Err(ConfigError::DuplicateLane(l.name.clone()));
        }
    }
    for l in &cfg.lanes {
        check_numbers(l)?;
        check_limits(l)?;
        check_grants(l, &names)?;
        crate::clients::check_clients(l)?;
        crate::tenants::check_tenants(l)?;
        crate::tokens::check_tokens(l)?;
    }
    if let Some(f) = &cfg.in_flight
        && !(f.resume_below <= f.conserve_at && f.conserve_at <= f.stop_at && f.resume_below >= 0)
    {
        return Err(ConfigError::Watermarks(format!(
            "resumeBelow {} conserveAt {} stopAt {}",
            f.resume_below, f.conserve_at, f.stop_at
        )));
    }
    if let Some((route, field, why)) = cfg.breakers.as_ref().and_then(|b| b.out_of_range()) {
        return Err(ConfigError::Breaker { route, field, why });
    }
    crate::pool_limits::check_pool(cfg)
}

fn field_error(
    l: &LaneConfig,
    field: &'static str,
    value: String,
    expected: &'static str,
) -> ConfigError {
    ConfigError::Field {
        lane: l.name.clone(),
        field,
        value,
        expected,
    }
}

/// Rates, costs and times: finite and not negative (a cost above 0).
fn check_numbers(l: &LaneConfig) -> Result<(), ConfigError> {
    let non_negative = |name: &'static str, v: f64| {
        if v.is_finite() && v >= 0.0 {
            Ok(())
        } else {
            Err(field_error(
                l,
                name,
                v.to_string(),
                "must be a finite number >= 0",
            ))
        }
    };
    non_negative("admittedRequestsPerSecond", l.admitted_requests_per_second)?;
    non_negative("admittedUnitsPerSecond", l.admitted_units_per_second)?;
    if !(l.work_units_per_request.is_finite() && l.work_units_per_request > 0.0) {
        return Err(field_error(
            l,
            "workUnitsPerRequest",
            l.work_units_per_request.to_string(),
            "must be > 0",
        ));
    }
    if let Some(f) = l.floor_units_per_second {
        non_negative("floorUnitsPerSecond", f)?;
    }
    if let Some(c) = l.ceiling_units_per_second {
        non_negative("ceilingUnitsPerSecond", c)?;
    }
    if let Some(s) = l.expected_service_seconds {
        non_negative("expectedServiceSeconds", s)?;
    }
    Ok(())
}

/// Queue, deadline and retry limits.
fn check_limits(l: &LaneConfig) -> Result<(), ConfigError> {
    let at_least = |name: &'static str, v: i64, min: i64, expected: &'static str| {
        if v >= min {
            Ok(())
        } else {
            Err(field_error(l, name, v.to_string(), expected))
        }
    };
    at_least("queue.maxDepth", l.queue.max_depth, 0, "must be >= 0")?;
    at_least("queue.ttlSeconds", l.queue.ttl_seconds, 0, "must be >= 0")?;
    at_least("deadlineSeconds", l.deadline_seconds, 1, "must be >= 1")?;
    at_least(
        "retry.maxAttempts",
        i64::from(l.retry.max_attempts),
        1,
        "must be >= 1",
    )?;
    if !(0..=100).contains(&l.retry.budget_percent) {
        return Err(field_error(
            l,
            "retry.budgetPercent",
            l.retry.budget_percent.to_string(),
            "must be within 0..100",
        ));
    }
    Ok(())
}

/// Grants name another lane of the config and lend a rate >= 0.
fn check_grants(l: &LaneConfig, names: &HashSet<&str>) -> Result<(), ConfigError> {
    for g in &l.borrowing {
        let why = if !names.contains(g.from.as_str()) || g.from == l.name {
            "the lender is not another lane of this config"
        } else if !(g.units_per_second.is_finite() && g.units_per_second >= 0.0) {
            "unitsPerSecond must be a finite number >= 0"
        } else {
            continue;
        };
        return Err(ConfigError::Grant {
            lane: l.name.clone(),
            from: g.from.clone(),
            why,
        });
    }
    Ok(())
}
