//! Tenants in the simulation (lanes whose scenario entry has `tenants`):
//! each request is of one tenant, drawn from the lane's shares by the
//! request's id (`scenario::tenants`), carries that tenant's name to the
//! gateway's core (its fair queue, its tenant limits) and, when the tenant
//! has its own tokens, is sized from them. Each tenant's outcomes are
//! counted apart: originals, answered within the deadline or late, and
//! lost (rejected, expired, failed, or deferred past the deadline).
//! The baselines have no tenants: they carry none, but the outcomes are
//! still counted by the tenant a request would be of.

use crate::scenario::tokens::TokenSampler;

use super::{Attempt, LaneSetup, Sim};

/// One tenant's outcomes over a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantRun {
    /// The tenant's name.
    pub name: String,
    /// Original requests.
    pub offered: u64,
    /// Answered within the lane's deadline (from the first attempt).
    pub within_deadline: u64,
    /// Answered after it.
    pub late: u64,
    /// Lost: the last attempt rejected, expired or failed, or deferred
    /// past the deadline.
    pub lost: u64,
}

/// What happened to a request, for its tenant's count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TenantOutcome {
    Offered,
    Answered { in_time: bool },
    Lost,
}

/// The tenant name attempt `a` of `lane` carries to the gateway (None:
/// the lane has no tenants) in a run seeded `seed`.
pub(super) fn tenant_name<'l>(lane: &'l LaneSetup, seed: u64, a: &Attempt) -> Option<&'l str> {
    let t = &lane.tenants;
    Some(t.name(t.pick(seed, u64::from(a.id))?))
}

impl Sim<'_> {
    /// The tenant of attempt `a`'s request (None: its lane has none).
    fn tenant_of(&self, a: &Attempt) -> Option<usize> {
        self.lanes[usize::from(a.lane)]
            .tenants
            .pick(self.sc.seed, u64::from(a.id))
    }

    /// The sampler attempt `a`'s tokens are drawn from: its tenant's own,
    /// else its lane's.
    pub(super) fn sampler_of(&self, a: &Attempt) -> Option<TokenSampler> {
        let lane = self.lanes[usize::from(a.lane)].tokens?;
        let own = self
            .tenant_of(a)
            .and_then(|t| self.lanes[usize::from(a.lane)].tenants.sampler(t).copied());
        Some(own.unwrap_or(lane))
    }

    /// Counts `what` for attempt `a`'s tenant.
    pub(super) fn count_tenant(&mut self, a: &Attempt, what: TenantOutcome) {
        let Some(t) = self.tenant_of(a) else {
            return;
        };
        let run = &mut self.out.lanes[usize::from(a.lane)].tenants[t];
        match what {
            TenantOutcome::Offered => run.offered += 1,
            TenantOutcome::Answered { in_time: true } => run.within_deadline += 1,
            TenantOutcome::Answered { in_time: false } => run.late += 1,
            TenantOutcome::Lost => run.lost += 1,
        }
    }
}
