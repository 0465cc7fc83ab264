//! Binding: which lanes and which policy belong to each profile.
//!
//! The one binding rule, used by `plan`, the controller, the simulator and
//! the Prometheus source alike:
//!
//! - a lane or policy belongs to the profile its `spec.profile` names, in its
//!   own namespace;
//! - an object being deleted takes no part;
//! - when several policies name one profile, the oldest (by creation time;
//!   ties, such as manifests that have none, in the order given) governs and
//!   the others are ignored, each with a [`BindProblem::IgnoredPolicy`];
//! - lanes are ordered by name.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::api::{CapacityProfile, DegradationPolicy, LaneContract, ObjectKey};

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
    /// Lanes naming it, by name.
    pub lanes: Vec<&'a LaneContract>,
    /// The governing policy.
    pub policy: Option<&'a DegradationPolicy>,
    /// Policies naming it that an older one outranks.
    pub ignored: Vec<&'a DegradationPolicy>,
    /// Problems of this binding (one per ignored policy).
    pub warnings: Vec<BindProblem>,
}

/// The bound world.
#[derive(Clone, Debug)]
pub struct Bound<'a> {
    /// Per profile, by namespace then name.
    pub bindings: Vec<Binding<'a>>,
    /// Lanes or policies whose profile does not exist.
    pub warnings: Vec<BindProblem>,
}

/// A problem the binding rule finds. Rendered to text only at the edge
/// (`plan`, status messages, events).
#[derive(Clone, Debug, PartialEq)]
pub enum BindProblem {
    /// A lane names a profile that does not exist: it takes no part.
    UnboundLane {
        /// The lane's namespace.
        namespace: String,
        /// The lane.
        lane: String,
        /// The profile it names.
        profile: String,
    },
    /// A policy names a profile that does not exist.
    UnboundPolicy {
        /// The policy's namespace.
        namespace: String,
        /// The policy.
        policy: String,
        /// The profile it names.
        profile: String,
    },
    /// An older policy already governs the profile this one names.
    IgnoredPolicy {
        /// The namespace.
        namespace: String,
        /// The ignored policy.
        policy: String,
        /// The policy that governs.
        winner: String,
        /// The profile.
        profile: String,
    },
    /// A problem read back from text (JSON written by an older version).
    Text(String),
}

impl fmt::Display for BindProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindProblem::UnboundLane {
                namespace,
                lane,
                profile,
            } => write!(
                f,
                "lane {namespace}/{lane} names profile {profile:?}, which does not exist: it takes no part"
            ),
            BindProblem::UnboundPolicy {
                namespace,
                policy,
                profile,
            } => write!(
                f,
                "policy {namespace}/{policy} names profile {profile:?}, which does not exist"
            ),
            BindProblem::IgnoredPolicy {
                namespace,
                policy,
                winner,
                profile,
            } => write!(
                f,
                "policy {namespace}/{policy} is ignored: {winner} already governs profile {profile} (the older policy wins)"
            ),
            BindProblem::Text(t) => f.write_str(t),
        }
    }
}

impl Serialize for BindProblem {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for BindProblem {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(BindProblem::Text)
    }
}

/// Whether `o` belongs to `profile`: same namespace, names it, not being
/// deleted.
fn names<K: ObjectKey>(o: &K, target: &str, profile: &CapacityProfile) -> bool {
    !o.deleting() && o.namespace_str() == profile.namespace_str() && target == profile.name_str()
}

/// Binds one profile: the lanes and policies (from any set of objects) that
/// belong to it. The controller calls this with its watch caches; [`bind`]
/// calls it for every profile of a world.
pub fn bind_profile<'a>(
    profile: &'a CapacityProfile,
    lanes: impl IntoIterator<Item = &'a LaneContract>,
    policies: impl IntoIterator<Item = &'a DegradationPolicy>,
) -> Binding<'a> {
    let mut lanes: Vec<&LaneContract> = lanes
        .into_iter()
        .filter(|l| names(*l, &l.spec.profile, profile))
        .collect();
    lanes.sort_by(|a, b| a.name_str().cmp(b.name_str()));
    let mut policies: Vec<&DegradationPolicy> = policies
        .into_iter()
        .filter(|p| names(*p, &p.spec.profile, profile))
        .collect();
    // The oldest governs; objects with a creation time are older than ones
    // without; ties keep the order given (a stable sort).
    policies.sort_by_key(|p| {
        let t = p.metadata.creation_timestamp.as_ref().map(|t| t.0);
        (t.is_none(), t)
    });
    let mut rest = policies.into_iter();
    let policy = rest.next();
    let ignored: Vec<&DegradationPolicy> = rest.collect();
    let warnings = ignored
        .iter()
        .map(|p| BindProblem::IgnoredPolicy {
            namespace: p.namespace_str().to_owned(),
            policy: p.name_str().to_owned(),
            winner: policy.map(|w| w.name_str().to_owned()).unwrap_or_default(),
            profile: profile.name_str().to_owned(),
        })
        .collect();
    Binding {
        profile,
        lanes,
        policy,
        ignored,
        warnings,
    }
}

/// The problem of a lane whose profile does not exist (`exists` says which
/// `(namespace, name)` profiles do); `None` when it is bound or being
/// deleted.
pub fn unbound_lane(
    lane: &LaneContract,
    exists: impl Fn(&str, &str) -> bool,
) -> Option<BindProblem> {
    (!lane.deleting() && !exists(lane.namespace_str(), &lane.spec.profile)).then(|| {
        BindProblem::UnboundLane {
            namespace: lane.namespace_str().to_owned(),
            lane: lane.name_str().to_owned(),
            profile: lane.spec.profile.clone(),
        }
    })
}

/// The problem of a policy whose profile does not exist, as
/// [`unbound_lane`].
pub fn unbound_policy(
    policy: &DegradationPolicy,
    exists: impl Fn(&str, &str) -> bool,
) -> Option<BindProblem> {
    (!policy.deleting() && !exists(policy.namespace_str(), &policy.spec.profile)).then(|| {
        BindProblem::UnboundPolicy {
            namespace: policy.namespace_str().to_owned(),
            policy: policy.name_str().to_owned(),
            profile: policy.spec.profile.clone(),
        }
    })
}

/// Binds lanes and policies to their profiles.
pub fn bind(world: &World) -> Bound<'_> {
    let mut profiles: Vec<&CapacityProfile> = world.profiles.iter().collect();
    profiles
        .sort_by(|a, b| (a.namespace_str(), a.name_str()).cmp(&(b.namespace_str(), b.name_str())));
    let index: BTreeSet<(&str, &str)> = profiles
        .iter()
        .map(|p| (p.namespace_str(), p.name_str()))
        .collect();
    let bindings = profiles
        .iter()
        .map(|p| bind_profile(p, &world.lanes, &world.policies))
        .collect();
    let exists = |ns: &str, name: &str| index.contains(&(ns, name));
    let warnings = world
        .lanes
        .iter()
        .filter_map(|l| unbound_lane(l, exists))
        .chain(
            world
                .policies
                .iter()
                .filter_map(|p| unbound_policy(p, exists)),
        )
        .collect();
    Bound { bindings, warnings }
}
