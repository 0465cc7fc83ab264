//! Tenants inside one lane: the lane's `tenants` in `lanes.json` (a
//! maximum of requests in flight per tenant and the tenants' weights in the
//! lane's fair queue), and the live count of each tenant's requests in
//! flight (`TenantGate`).
//!
//! A request that passes in a lane with a concurrency limit carries a
//! [`TenantSlot`]; the caller gives it back with [`Core::release_tenant`]
//! when the request finishes. A tenant at its maximum waits in its own
//! queue: the fair queue skips it until one of its requests finishes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::LaneConfig;
use crate::core::Core;
use crate::validate::ConfigError;

/// Most tenants with their own limits in one lane.
pub const MAX_TENANT_OVERRIDES: usize = 256;
/// The largest weight of a tenant.
pub const MAX_TENANT_WEIGHT: i64 = 1000;

/// Per-tenant limits inside a lane (the contract's `spec.tenants`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantLimits {
    /// Most requests of one tenant in flight at once, for every tenant not
    /// listed in `overrides` with its own (absent: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<i64>,
    /// A tenant's weight in the lane's fair queue, for every tenant not
    /// listed with its own (absent: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i64>,
    /// Tenants with their own limits, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<TenantOverride>,
}

/// One tenant's own limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantOverride {
    /// The tenant, as its identity names it.
    pub name: String,
    /// Its maximum in flight (absent: the lane's `maxConcurrency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<i64>,
    /// Its weight (absent: the lane's `weight`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i64>,
}

/// Checks a lane's `tenants`: limits >= 1, weights within
/// 1..=[`MAX_TENANT_WEIGHT`], named tenants unique, non-empty and at most
/// [`MAX_TENANT_OVERRIDES`].
pub(crate) fn check_tenants(l: &LaneConfig) -> Result<(), ConfigError> {
    let Some(t) = &l.tenants else {
        return Ok(());
    };
    let bad = |field: &'static str, value: String, expected: &'static str| ConfigError::Field {
        lane: l.name.clone(),
        field,
        value,
        expected,
    };
    let check = |max: Option<i64>, weight: Option<i64>, max_field, weight_field| {
        if let Some(m) = max.filter(|m| *m < 1) {
            return Err(bad(max_field, m.to_string(), "must be >= 1"));
        }
        if let Some(w) = weight.filter(|w| !(1..=MAX_TENANT_WEIGHT).contains(w)) {
            return Err(bad(weight_field, w.to_string(), "must be within 1..1000"));
        }
        Ok(())
    };
    check(
        t.max_concurrency,
        t.weight,
        "tenants.maxConcurrency",
        "tenants.weight",
    )?;
    if t.overrides.len() > MAX_TENANT_OVERRIDES {
        return Err(bad(
            "tenants.overrides",
            format!("{} entries", t.overrides.len()),
            "must have at most 256 entries",
        ));
    }
    let mut names = HashSet::new();
    for o in &t.overrides {
        if o.name.is_empty() || !names.insert(o.name.as_str()) {
            return Err(bad(
                "tenants.overrides[].name",
                format!("{:?}", o.name),
                "must be non-empty and unique",
            ));
        }
        check(
            o.max_concurrency,
            o.weight,
            "tenants.overrides[].maxConcurrency",
            "tenants.overrides[].weight",
        )?;
    }
    Ok(())
}

/// A passed request's place in its tenant's concurrency: give it back with
/// [`Core::release_tenant`] when the request finishes (or is never sent).
/// Found by names, so it stays valid across config swaps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantSlot {
    lane: Arc<str>,
    tenant: Arc<str>,
}

impl TenantSlot {
    /// The tenant holding the slot.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }
}

/// One tenant's limits as this replica enforces them.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Limits {
    max: Option<u32>,
    weight: f64,
}

/// A lane's tenant limits (this replica's share) and its tenants' requests
/// in flight.
#[derive(Debug)]
pub(crate) struct TenantGate {
    lane: Arc<str>,
    default: Limits,
    overrides: HashMap<String, Limits>,
    /// Any tenant has a maximum: slots are counted.
    limited: bool,
    /// Requests in flight by tenant (only tenants with some).
    pub(crate) in_flight: HashMap<Arc<str>, u32>,
    /// With the fleet's shared state: the slots this replica holds of each
    /// tenant's fleet-wide maximum, which replace its 1/N share (see
    /// `fleet_tenants`).
    pub(crate) leased: Option<HashMap<Arc<str>, u32>>,
}

impl TenantGate {
    /// The gate of `cfg`'s tenants, with `share` (1/N for N replicas) of
    /// every maximum, rounded up.
    pub(crate) fn new(cfg: &LaneConfig, share: f64) -> TenantGate {
        let t = cfg.tenants.clone().unwrap_or_default();
        let scaled = |m: Option<i64>| m.map(|m| ((m as f64 * share).ceil().max(1.0)) as u32);
        let default = Limits {
            max: scaled(t.max_concurrency),
            weight: t.weight.unwrap_or(1) as f64,
        };
        let overrides: HashMap<String, Limits> = t
            .overrides
            .iter()
            .map(|o| {
                let limits = Limits {
                    max: scaled(o.max_concurrency).or(default.max),
                    weight: o.weight.map_or(default.weight, |w| w as f64),
                };
                (o.name.clone(), limits)
            })
            .collect();
        let limited = default.max.is_some() || overrides.values().any(|l| l.max.is_some());
        TenantGate {
            lane: Arc::from(cfg.name.as_str()),
            default,
            overrides,
            limited,
            in_flight: HashMap::new(),
            leased: None,
        }
    }

    fn limits(&self, tenant: &str) -> Limits {
        if self.overrides.is_empty() {
            return self.default;
        }
        self.overrides.get(tenant).copied().unwrap_or(self.default)
    }

    /// The tenant's weight in the fair queue.
    pub(crate) fn weight(&self, tenant: &str) -> f64 {
        self.limits(tenant).weight
    }

    /// The tenant has its maximum in flight: its requests wait.
    pub(crate) fn at_max(&self, tenant: &str) -> bool {
        if !self.limited {
            return false;
        }
        let Some(mut max) = self.limits(tenant).max else {
            return false;
        };
        if let Some(leased) = &self.leased {
            max = leased.get(tenant).copied().unwrap_or(0);
        }
        self.in_flight.get(tenant).copied().unwrap_or(0) >= max
    }

    /// Counts a passing request of `tenant` in flight (None: the lane
    /// counts nothing).
    pub(crate) fn take(&mut self, tenant: &str) -> Option<TenantSlot> {
        if !self.limited {
            return None;
        }
        let tenant = match self.in_flight.get_key_value(tenant) {
            Some((k, _)) => Arc::clone(k),
            None => Arc::from(tenant),
        };
        *self.in_flight.entry(Arc::clone(&tenant)).or_insert(0) += 1;
        Some(TenantSlot {
            lane: Arc::clone(&self.lane),
            tenant,
        })
    }

    /// A request of `tenant` finished; whether the tenant is below its
    /// maximum now.
    pub(crate) fn release(&mut self, tenant: &str) -> bool {
        if let Some(n) = self.in_flight.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.in_flight.remove(tenant);
            }
        }
        !self.at_max(tenant)
    }

    /// Requests of `tenant` in flight.
    pub(crate) fn in_flight(&self, tenant: &str) -> u32 {
        self.in_flight.get(tenant).copied().unwrap_or(0)
    }

    /// A lane that stays across a config swap keeps its count in flight
    /// under the new limits.
    pub(crate) fn carry(&mut self, old: &mut TenantGate) {
        self.in_flight = std::mem::take(&mut old.in_flight);
        self.leased = old.leased.take();
    }

    /// Whether `tenant` has a maximum in flight (its own or the lane's).
    pub(crate) fn has_max(&self, tenant: &str) -> bool {
        self.limited && self.limits(tenant).max.is_some()
    }
}

impl Core {
    /// A request that passed with `slot` finished (or was never sent): its
    /// tenant may have one more in flight. Returns whether a waiting
    /// request of the tenant may now be served (call [`Core::poll`]). A
    /// slot of a lane the config no longer has is dropped.
    pub fn release_tenant(&mut self, slot: &TenantSlot) -> bool {
        let Some(li) = self.lane_index(&slot.lane) else {
            return false;
        };
        let lane = &mut self.lanes[li];
        if !lane.tenants.release(&slot.tenant) {
            return false;
        }
        lane.queue.unpark(&slot.tenant, &lane.tenants)
    }

    /// Requests of `tenant` in flight in lane `lane`, as counted for its
    /// maximum (0 in a lane without tenant maximums).
    pub fn tenant_in_flight(&self, lane: usize, tenant: &str) -> u32 {
        self.lanes[lane].tenants.in_flight(tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GatewayConfig, LaneConfig};
    use crate::tests::{config, lane};
    use crate::verdict::{Limit, Outcome, Request, Resolution, Verdict};

    fn limited(name: &str, max: i64, overrides: Vec<TenantOverride>) -> LaneConfig {
        let mut l = lane(name, 100.0, 100);
        l.tenants = Some(TenantLimits {
            max_concurrency: Some(max),
            weight: None,
            overrides,
        });
        l
    }

    fn core(lanes: Vec<LaneConfig>) -> Core {
        Core::new(config(lanes), 1.0, 0.0, 1_000_000.0).unwrap()
    }

    fn of<'a>(lane: &'a str, tenant: &'a str) -> Request<'a> {
        Request {
            lane,
            tenant: Some(tenant),
            attempt: None,
            request_id: None,
        }
    }

    fn slot(v: Verdict) -> TenantSlot {
        match v {
            Verdict::Pass(p) => p.tenant_slot.expect("a slot in a limited lane"),
            v => panic!("not a pass: {v:?}"),
        }
    }

    #[test]
    fn a_tenant_at_its_maximum_waits_and_goes_when_one_finishes() {
        let mut c = core(vec![limited("l", 2, vec![])]);
        let s1 = slot(c.admit(&of("l", "a"), 0.0));
        let _s2 = slot(c.admit(&of("l", "a"), 0.0));
        assert_eq!(c.tenant_in_flight(0, "a"), 2);
        let Verdict::Queued { ticket, .. } = c.admit(&of("l", "a"), 0.0) else {
            panic!("a third request of a waits");
        };
        // Another tenant is not held back by a's waiting request.
        assert!(matches!(c.admit(&of("l", "b"), 0.0), Verdict::Pass(_)));
        assert!(c.poll(0.1).is_empty(), "a is at its maximum");
        assert_eq!(
            c.next_wake(0.1),
            Some(5.0 + 1e-6),
            "nothing to do before a finishes (or its TTL)"
        );
        assert!(c.release_tenant(&s1));
        let out = c.poll(0.2);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, ticket);
        let Resolution::Pass(p) = &out[0].1 else {
            panic!("{out:?}")
        };
        assert_eq!(p.tenant_slot.as_ref().map(TenantSlot::tenant), Some("a"));
        assert_eq!(c.tenant_in_flight(0, "a"), 2);
    }

    #[test]
    fn a_tenant_at_its_maximum_that_cannot_wait_is_refused_with_its_own_limit() {
        let mut l = limited("l", 1, vec![]);
        l.queue.max_depth = 1;
        let mut c = core(vec![l]);
        let _s = slot(c.admit(&of("l", "a"), 0.0));
        assert!(matches!(
            c.admit(&of("l", "a"), 0.0),
            Verdict::Queued { .. }
        ));
        let Verdict::Refuse(r) = c.admit(&of("l", "a"), 0.0) else {
            panic!("the queue is full")
        };
        assert_eq!(r.limit, Limit::TenantConcurrency);
        assert_eq!(r.outcome, Outcome::RejectedQueueFull);
        // With no wait allowed at all.
        let mut l = limited("l", 1, vec![]);
        l.queue.ttl_seconds = 0;
        let mut c = core(vec![l]);
        let _s = slot(c.admit(&of("l", "a"), 0.0));
        let Verdict::Refuse(r) = c.admit(&of("l", "a"), 0.0) else {
            panic!("no wait")
        };
        assert_eq!(
            (r.outcome, r.limit),
            (Outcome::RejectedRate, Limit::TenantConcurrency)
        );
        assert!(r.limit.as_str().contains("tenants.maxConcurrency"));
    }

    #[test]
    fn a_request_whose_tenant_stays_at_its_maximum_expires_with_the_tenant_limit() {
        let mut c = core(vec![limited("l", 1, vec![])]);
        let _s = slot(c.admit(&of("l", "a"), 0.0));
        assert!(matches!(
            c.admit(&of("l", "a"), 0.0),
            Verdict::Queued { .. }
        ));
        let out = c.poll(5.1);
        let [(_, Resolution::Refuse(r))] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert_eq!(
            (r.outcome, r.limit),
            (Outcome::Expired, Limit::TenantConcurrency)
        );
    }

    #[test]
    fn an_override_has_its_own_maximum_and_the_share_rounds_up() {
        let o = TenantOverride {
            name: "big".to_owned(),
            max_concurrency: Some(3),
            weight: None,
        };
        let mut c = core(vec![limited("l", 1, vec![o.clone()])]);
        for _ in 0..3 {
            slot(c.admit(&of("l", "big"), 0.0));
        }
        assert!(matches!(
            c.admit(&of("l", "big"), 0.0),
            Verdict::Queued { .. }
        ));
        slot(c.admit(&of("l", "small"), 0.0));
        assert!(matches!(
            c.admit(&of("l", "small"), 0.0),
            Verdict::Queued { .. }
        ));
        // Two replicas: ceil(3 / 2) = 2 each.
        let mut c = Core::new(config(vec![limited("l", 1, vec![o])]), 0.5, 0.0, 1e6).unwrap();
        slot(c.admit(&of("l", "big"), 0.0));
        slot(c.admit(&of("l", "big"), 0.0));
        assert!(matches!(
            c.admit(&of("l", "big"), 0.0),
            Verdict::Queued { .. }
        ));
    }

    #[test]
    fn a_lane_without_maximums_counts_nothing() {
        let mut c = core(vec![lane("l", 100.0, 100)]);
        let Verdict::Pass(p) = c.admit(&of("l", "a"), 0.0) else {
            panic!()
        };
        assert_eq!(p.tenant_slot, None);
        assert_eq!(c.tenant_in_flight(0, "a"), 0);
    }

    #[test]
    fn slots_follow_their_lane_across_a_swap_and_are_dropped_with_it() {
        let mut c = core(vec![limited("x", 1, vec![]), limited("l", 1, vec![])]);
        let s = slot(c.admit(&of("l", "a"), 0.0));
        assert!(matches!(
            c.admit(&of("l", "a"), 0.0),
            Verdict::Queued { .. }
        ));
        // The lane moves to index 0 and its maximum rises to 2: the waiting
        // request goes at the next poll.
        let swapped = config(vec![limited("l", 2, vec![]), limited("x", 1, vec![])]);
        c.swap(swapped, 1.0, 0.1, 1e6).unwrap();
        assert_eq!(c.tenant_in_flight(0, "a"), 1);
        assert_eq!(c.poll(0.2).len(), 1);
        assert_eq!(c.tenant_in_flight(0, "a"), 2);
        assert!(!c.release_tenant(&s), "nothing of a waits");
        assert_eq!(c.tenant_in_flight(0, "a"), 1);
        c.swap(config(vec![limited("x", 1, vec![])]), 1.0, 0.3, 1e6)
            .unwrap();
        assert!(!c.release_tenant(&s), "its lane is gone");
    }

    #[test]
    fn weights_share_a_rate_limited_lane() {
        let mut l = lane("l", 4.0, 1);
        l.queue.max_depth = 100;
        l.queue.ttl_seconds = 25;
        l.tenants = Some(TenantLimits {
            max_concurrency: None,
            weight: None,
            overrides: vec![TenantOverride {
                name: "heavy".to_owned(),
                max_concurrency: None,
                weight: Some(3),
            }],
        });
        let mut c = core(vec![l]);
        assert!(matches!(c.admit(&of("l", "heavy"), 0.0), Verdict::Pass(_)));
        let mut tenant_of = std::collections::HashMap::new();
        for t in ["heavy", "light"] {
            for _ in 0..40 {
                let Verdict::Queued { ticket, .. } = c.admit(&of("l", t), 0.0) else {
                    panic!()
                };
                tenant_of.insert(ticket, t);
            }
        }
        // 4 per second for 5 seconds: 20 served, 15 of them heavy's.
        let served: Vec<&str> = (1..=50)
            .flat_map(|i| c.poll(f64::from(i) * 0.1))
            .map(|(t, _)| tenant_of[&t])
            .collect();
        assert_eq!(served.len(), 20);
        assert_eq!(served.iter().filter(|t| **t == "heavy").count(), 15);
    }

    #[test]
    fn limits_out_of_range_are_refused_and_an_absent_one_is_not_written() {
        let mut l = limited("l", 1, vec![]);
        assert!(crate::validate::validate(&config(vec![l.clone()])).is_ok());
        let bad = |t: TenantLimits| {
            let mut l = lane("l", 1.0, 1);
            l.tenants = Some(t);
            crate::validate::validate(&config(vec![l])).unwrap_err()
        };
        let o = |name: &str, max: Option<i64>, weight: Option<i64>| TenantOverride {
            name: name.to_owned(),
            max_concurrency: max,
            weight,
        };
        let t = |max, weight, overrides| TenantLimits {
            max_concurrency: max,
            weight,
            overrides,
        };
        for (limits, field) in [
            (t(Some(0), None, vec![]), "tenants.maxConcurrency"),
            (t(None, Some(0), vec![]), "tenants.weight"),
            (t(None, Some(1001), vec![]), "tenants.weight"),
            (
                t(None, None, vec![o("a", Some(-1), None)]),
                "tenants.overrides[].maxConcurrency",
            ),
            (
                t(None, None, vec![o("a", None, Some(0))]),
                "tenants.overrides[].weight",
            ),
            (
                t(None, None, vec![o("a", None, None), o("a", None, None)]),
                "tenants.overrides[].name",
            ),
            (
                t(None, None, vec![o("", None, None)]),
                "tenants.overrides[].name",
            ),
            (
                t(
                    None,
                    None,
                    (0..257).map(|i| o(&i.to_string(), None, None)).collect(),
                ),
                "tenants.overrides",
            ),
        ] {
            let ConfigError::Field { field: f, .. } = bad(limits) else {
                panic!("{field}")
            };
            assert_eq!(f, field);
        }
        l.tenants = None;
        let text = crate::config::to_json(&config(vec![l]));
        assert!(!text.contains("tenants"));
        let back: GatewayConfig = serde_json::from_str(&text).unwrap();
        assert_eq!(back.lanes[0].tenants, None);
    }
}
