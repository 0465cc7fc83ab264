//! Who sends a lane's requests in a scenario (`lanes.<key>.tenants`): each
//! tenant's name (what its requests carry as the gateway's tenant), its
//! share of the lane's arrivals and, optionally, its own token
//! distribution. A request's tenant depends only on the scenario's seed and
//! the request's id (one hash, no generator state, as its tokens), so a
//! retry or a return after a deferral comes from the same tenant and adding
//! tenants to a lane moves no other draw of the run.

use serde::{Deserialize, Serialize};

use super::tokens::{TokenDistribution, TokenSampler, TokenSide, unit_of};

/// Mixed into the seed so that tenant draws share no stream with the
/// scenario's other draws.
const TENANT_KEY: u64 = 0x7465_6e61_6e74; // "tenant"

/// Shares must add up to 1 within this.
const SHARE_TOLERANCE: f64 = 1e-6;

/// One tenant of a lane.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TenantScenario {
    /// The tenant's name, as its requests carry it.
    pub name: String,
    /// Its share of the lane's arrivals (> 0; the lane's shares add up to
    /// 1).
    pub share: f64,
    /// Its requests' tokens (absent: the lane's `tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenDistribution>,
}

/// What is wrong with a lane's tenants.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TenantError {
    /// A tenant without a name, or two with the same one.
    #[error("tenant names must be non-empty and distinct ({0:?})")]
    Name(String),
    /// A share that is not a positive number, or shares not adding up to 1.
    #[error("shares must be > 0 and add up to 1 (they add up to {0})")]
    Shares(f64),
    /// A tenant's token count out of range.
    #[error("tenant {tenant}: tokens.{side}: need 0 < median <= p95 <= 10000000")]
    Tokens {
        /// The tenant.
        tenant: String,
        /// Input or output.
        side: TokenSide,
    },
    /// Some requests would have tokens and others not.
    #[error(
        "tenant {0} has no tokens while another has: give every tenant tokens, or the lane's tokens"
    )]
    PartialTokens(String),
}

/// Checks a lane's tenants; `lane_tokens`: whether the lane has `tokens`.
pub fn check(tenants: &[TenantScenario], lane_tokens: bool) -> Result<(), TenantError> {
    let mut names = std::collections::BTreeSet::new();
    for t in tenants {
        if t.name.is_empty() || !names.insert(t.name.as_str()) {
            return Err(TenantError::Name(t.name.clone()));
        }
        if let Some(side) = t.tokens.as_ref().and_then(TokenDistribution::invalid_side) {
            return Err(TenantError::Tokens {
                tenant: t.name.clone(),
                side,
            });
        }
    }
    let sum: f64 = tenants.iter().map(|t| t.share).sum();
    let positive = tenants.iter().all(|t| t.share.is_finite() && t.share > 0.0);
    let shares_ok = positive && (sum - 1.0).abs() <= SHARE_TOLERANCE;
    if !tenants.is_empty() && !shares_ok {
        return Err(TenantError::Shares(sum));
    }
    let some = tenants.iter().any(|t| t.tokens.is_some());
    match tenants.iter().find(|t| t.tokens.is_none()) {
        Some(t) if some && !lane_tokens => Err(TenantError::PartialTokens(t.name.clone())),
        _ => Ok(()),
    }
}

/// A lane's tenants as the simulation draws them.
#[derive(Clone, Debug, PartialEq)]
pub struct Tenants {
    names: Vec<String>,
    /// The running sum of the shares, the last one 1.
    upto: Vec<f64>,
    samplers: Vec<Option<TokenSampler>>,
}

impl Tenants {
    /// The tenants of a checked list.
    pub fn new(tenants: &[TenantScenario]) -> Tenants {
        let mut sum = 0.0;
        let mut upto: Vec<f64> = tenants
            .iter()
            .map(|t| {
                sum += t.share;
                sum
            })
            .collect();
        if let Some(last) = upto.last_mut() {
            *last = 1.0;
        }
        Tenants {
            names: tenants.iter().map(|t| t.name.clone()).collect(),
            upto,
            samplers: tenants
                .iter()
                .map(|t| t.tokens.as_ref().map(TokenDistribution::sampler))
                .collect(),
        }
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// None.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The tenant of request `id` of a run seeded `seed` (None: the lane
    /// has no tenants).
    pub fn pick(&self, seed: u64, id: u64) -> Option<usize> {
        let last = self.upto.len().checked_sub(1)?;
        let u = unit_of(seed ^ TENANT_KEY, id);
        Some(self.upto.iter().position(|&x| u <= x).unwrap_or(last))
    }

    /// Tenant `i`'s name.
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// Tenant `i`'s own token sampler.
    pub fn sampler(&self, i: usize) -> Option<&TokenSampler> {
        self.samplers[i].as_ref()
    }

    /// The mean tokens (input plus output) of the lane's request, over its
    /// tenants by share; a tenant without its own tokens has the lane's
    /// (`lane`).
    pub fn mean_total(&self, lane: Option<&TokenSampler>) -> Option<f64> {
        let mut mean = 0.0;
        let mut share = 0.0;
        for (i, s) in self.samplers.iter().enumerate() {
            let w = self.upto[i] - share;
            share = self.upto[i];
            mean += w * s.as_ref().or(lane)?.mean_total();
        }
        Some(mean)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::TokenQuantiles;

    fn tenant(name: &str, share: f64, tokens: Option<(f64, f64)>) -> TenantScenario {
        TenantScenario {
            name: name.to_owned(),
            share,
            tokens: tokens.map(|(median, p95)| TokenDistribution {
                input: TokenQuantiles { median, p95 },
                output: TokenQuantiles { median, p95 },
            }),
        }
    }

    #[test]
    fn bad_tenants_say_what_is_wrong() {
        let ok = [tenant("a", 0.25, None), tenant("b", 0.75, None)];
        assert_eq!(check(&ok, false), Ok(()));
        assert_eq!(check(&[], false), Ok(()));
        let dup = [tenant("a", 0.5, None), tenant("a", 0.5, None)];
        assert_eq!(check(&dup, false), Err(TenantError::Name("a".into())));
        assert!(matches!(
            check(&[tenant("", 1.0, None)], false),
            Err(TenantError::Name(_))
        ));
        for shares in [[0.5, 0.4], [1.0, 0.0], [1.5, -0.5], [f64::NAN, 1.0]] {
            let t = [tenant("a", shares[0], None), tenant("b", shares[1], None)];
            assert!(
                matches!(check(&t, false), Err(TenantError::Shares(_))),
                "{shares:?}"
            );
        }
        let bad = [tenant("a", 1.0, Some((10.0, 5.0)))];
        assert!(matches!(
            check(&bad, false),
            Err(TenantError::Tokens { .. })
        ));
        let partial = [tenant("a", 0.5, Some((10.0, 20.0))), tenant("b", 0.5, None)];
        assert_eq!(
            check(&partial, false),
            Err(TenantError::PartialTokens("b".into()))
        );
        // The lane's tokens stand in for b's.
        assert_eq!(check(&partial, true), Ok(()));
    }

    fn parsed(tenants: &str) -> Result<crate::scenario::Scenario, String> {
        let text = format!(
            "durationSeconds: 60\nlanes:\n  chat:\n    service: {{p50Seconds: 1, p95Seconds: 2}}\n    tenants: {tenants}\n"
        );
        let s: crate::scenario::Scenario =
            serde_yaml::from_str(&text).map_err(|e| e.to_string())?;
        crate::scenario::check(&s).map_err(|e| e.to_string())?;
        Ok(s)
    }

    #[test]
    fn a_scenario_parses_its_tenants_and_names_the_lane_that_is_wrong() {
        let s = parsed("[{name: a, share: 0.5}, {name: b, share: 0.5}]").unwrap();
        assert_eq!(s.lanes["chat"].tenants.len(), 2);
        for (bad, says) in [
            (
                "[{name: a, share: 0.5}, {name: b, share: 0.4}]",
                "lanes.chat.tenants: shares must be > 0 and add up to 1 (they add up to 0.9)",
            ),
            (
                "[{name: a, share: 1, tokens: {input: {median: 9, p95: 1}, output: {median: 1, p95: 2}}}]",
                "lanes.chat.tenants: tenant a: tokens.input",
            ),
            (
                "[{name: a, share: 0.5, tokens: {input: {median: 1, p95: 2}, output: {median: 1, p95: 2}}}, {name: b, share: 0.5}]",
                "lanes.chat.tenants: tenant b has no tokens",
            ),
            ("[{name: a, share: 1, weight: 2}]", "unknown field `weight`"),
            ("[{share: 1}]", "missing field `name`"),
        ] {
            let e = parsed(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_requests_tenant_is_fixed_by_its_id_and_shares_hold() {
        let t = Tenants::new(&[tenant("a", 0.2, None), tenant("b", 0.8, None)]);
        let n = 100_000u64;
        let a = (0..n).filter(|id| t.pick(7, *id) == Some(0)).count() as f64 / n as f64;
        assert!((a - 0.2).abs() < 0.01, "{a}");
        // The same request, the same tenant; another seed, another draw.
        assert_eq!(t.pick(7, 42), t.pick(7, 42));
        assert!((0..64).any(|id| t.pick(7, id) != t.pick(8, id)));
        assert_eq!((t.name(1), t.len()), ("b", 2));
        assert_eq!(Tenants::new(&[]).pick(7, 42), None);
    }

    #[test]
    fn the_lanes_mean_request_weighs_each_tenants_by_its_share() {
        let t = Tenants::new(&[
            tenant("short", 0.75, Some((100.0, 100.0))),
            tenant("long", 0.25, Some((1000.0, 1000.0))),
        ]);
        // σ = 0: each mean is its median, input plus output.
        let mean = t.mean_total(None).unwrap();
        assert!(
            (mean - (0.75 * 200.0 + 0.25 * 2000.0)).abs() < 1e-6,
            "{mean}"
        );
        // A tenant without tokens and no lane tokens: no mean.
        let t = Tenants::new(&[tenant("a", 1.0, None)]);
        assert_eq!(t.mean_total(None), None);
    }
}
