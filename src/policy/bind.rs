//! Binding: which lanes and which policy belong to each profile.

use std::collections::BTreeMap;

use kube::ResourceExt;

use crate::api::{CapacityProfile, DegradationPolicy, LaneContract};

/// Every object the engine looks at.
#[derive(Clone, Debug, Default)]
pub struct World {
    /// CapacityProfiles.
    pub profiles: Vec<CapacityProfile>,
    /// LaneContracts.
    pub lanes: Vec<LaneContract>,
    /// DegradationPolicies. When several name one profile, the oldest (by
    /// creation time, then by order here) governs.
    pub policies: Vec<DegradationPolicy>,
}

/// One profile with what belongs to it.
#[derive(Clone, Debug)]
pub struct Binding<'a> {
    /// The profile.
    pub profile: &'a CapacityProfile,
    /// Lanes naming it.
    pub lanes: Vec<&'a LaneContract>,
    /// The governing policy.
    pub policy: Option<&'a DegradationPolicy>,
    /// Problems of this binding (duplicate policies).
    pub warnings: Vec<String>,
}

/// The bound world.
#[derive(Clone, Debug)]
pub struct Bound<'a> {
    /// Per profile, by namespace then name.
    pub bindings: Vec<Binding<'a>>,
    /// Lanes or policies whose profile does not exist.
    pub warnings: Vec<String>,
}

fn ns(o: &impl ResourceExt) -> String {
    o.namespace().unwrap_or_default()
}

/// Policies that lose to an older one naming the same profile, with the
/// winner's name: `(loser, winner)`.
pub fn losing_policies(
    policies: &[DegradationPolicy],
) -> Vec<(&DegradationPolicy, &DegradationPolicy)> {
    let mut by_profile: BTreeMap<(String, &str), Vec<(usize, &DegradationPolicy)>> =
        BTreeMap::new();
    for (i, p) in policies.iter().enumerate() {
        by_profile
            .entry((ns(p), p.spec.profile.as_str()))
            .or_default()
            .push((i, p));
    }
    let mut out = Vec::new();
    for (_, mut ps) in by_profile {
        ps.sort_by(|a, b| {
            let ta = a.1.metadata.creation_timestamp.as_ref().map(|t| t.0);
            let tb = b.1.metadata.creation_timestamp.as_ref().map(|t| t.0);
            // Objects with a timestamp are older than ones without.
            (ta.is_none(), ta, a.0).cmp(&(tb.is_none(), tb, b.0))
        });
        let winner = ps[0].1;
        for (_, p) in ps.into_iter().skip(1) {
            out.push((p, winner));
        }
    }
    out
}

/// Binds lanes and policies to their profiles.
pub fn bind(world: &World) -> Bound<'_> {
    let mut profiles: Vec<&CapacityProfile> = world.profiles.iter().collect();
    profiles.sort_by_key(|p| (ns(*p), p.name_any()));
    let index: BTreeMap<(String, String), usize> = profiles
        .iter()
        .enumerate()
        .map(|(i, p)| ((ns(*p), p.name_any()), i))
        .collect();
    let mut bindings: Vec<Binding<'_>> = profiles
        .iter()
        .map(|p| Binding {
            profile: p,
            lanes: Vec::new(),
            policy: None,
            warnings: Vec::new(),
        })
        .collect();
    let mut warnings = Vec::new();
    for lane in &world.lanes {
        match index.get(&(ns(lane), lane.spec.profile.clone())) {
            Some(&i) => bindings[i].lanes.push(lane),
            None => warnings.push(format!(
                "lane {}/{} names profile {:?}, which does not exist: it takes no part",
                ns(lane),
                lane.name_any(),
                lane.spec.profile
            )),
        }
    }
    let losers = losing_policies(&world.policies);
    for policy in &world.policies {
        let Some(&i) = index.get(&(ns(policy), policy.spec.profile.clone())) else {
            warnings.push(format!(
                "policy {}/{} names profile {:?}, which does not exist",
                ns(policy),
                policy.name_any(),
                policy.spec.profile
            ));
            continue;
        };
        if let Some((_, winner)) = losers.iter().find(|(l, _)| std::ptr::eq(*l, policy)) {
            bindings[i].warnings.push(format!(
                "policy {}/{} is ignored: {} already governs profile {}",
                ns(policy),
                policy.name_any(),
                winner.name_any(),
                policy.spec.profile
            ));
        } else {
            bindings[i].policy = Some(policy);
        }
    }
    Bound { bindings, warnings }
}
