//! Profiles that name the same workload: one of them acts on it.
//!
//! Two CapacityProfiles whose `spec.pool.scaleTargetRef` names the same
//! workload would each write their own replica count (and drain its pods by
//! their own rules), undoing each other on every pass. The oldest of them
//! (by `creationTimestamp`, then name) sizes and drains the workload; the
//! others write neither and say so in `ScalingConflict`.

use std::sync::Arc;

use kube::core::DeserializeGuard;

use crate::api::{CapacityProfile, ObjectKey, ScaleTargetRef};

/// The API group of an `apiVersion` (`apps/v1` → `apps`, `v1` → ``).
fn group(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(g, _)| g)
}

/// Whether two references name the same workload (in one namespace): the
/// same group, kind and name (the version does not matter).
pub fn same_workload(a: &ScaleTargetRef, b: &ScaleTargetRef) -> bool {
    group(&a.api_version) == group(&b.api_version) && a.kind == b.kind && a.name == b.name
}

/// The profile that acts on `profile`'s workload when it is another one
/// (its name), or None when `profile` does: the oldest of the valid
/// profiles in its namespace that name the workload, by
/// `creationTimestamp`, then name. Profiles being deleted do not compete.
pub fn outranked_by(
    profile: &CapacityProfile,
    all: &[Arc<DeserializeGuard<CapacityProfile>>],
) -> Option<String> {
    let target = &profile.spec.pool.scale_target_ref;
    let rank = |p: &CapacityProfile| {
        (
            p.metadata.creation_timestamp.clone(),
            p.name_str().to_owned(),
        )
    };
    let winner = all
        .iter()
        .filter_map(|g| g.0.as_ref().ok())
        .filter(|p| p.namespace_str() == profile.namespace_str())
        .filter(|p| p.name_str() != profile.name_str())
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| same_workload(&p.spec.pool.scale_target_ref, target))
        .min_by_key(|p| rank(p))?;
    (rank(winner) < rank(profile)).then(|| winner.name_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn profile(name: &str, created: &str, kind: &str, target: &str) -> CapacityProfile {
        serde_json::from_value(json!({
            "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "CapacityProfile",
            "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
            "spec": {
                "pool": {
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": kind, "name": target},
                    "podSelector": {"matchLabels": {"app": target}}
                },
                "capacity": {"safeUnitsPerSecond": "100", "unitsPerReplica": "10"},
                "replicas": {"min": 1, "max": 4}
            }
        }))
        .unwrap()
    }

    fn store(ps: &[&CapacityProfile]) -> Vec<Arc<DeserializeGuard<CapacityProfile>>> {
        ps.iter()
            .map(|p| Arc::new(DeserializeGuard(Ok((*p).clone()))))
            .collect()
    }

    #[test]
    fn the_oldest_profile_on_a_workload_acts_then_the_first_by_name() {
        let a = profile("a", "2026-02-01T00:00:00Z", "Deployment", "pool");
        let b = profile("b", "2026-01-01T00:00:00Z", "Deployment", "pool");
        let c = profile("c", "2026-01-01T00:00:00Z", "Deployment", "pool");
        let all = store(&[&a, &b, &c]);
        assert_eq!(outranked_by(&a, &all).as_deref(), Some("b"));
        assert_eq!(outranked_by(&b, &all), None);
        assert_eq!(outranked_by(&c, &all).as_deref(), Some("b"));
    }

    #[test]
    fn profiles_on_other_workloads_or_being_deleted_do_not_compete() {
        let a = profile("a", "2026-02-01T00:00:00Z", "Deployment", "pool");
        let other_name = profile("b", "2026-01-01T00:00:00Z", "Deployment", "other");
        let other_kind = profile("c", "2026-01-01T00:00:00Z", "StatefulSet", "pool");
        let mut deleting = profile("d", "2026-01-01T00:00:00Z", "Deployment", "pool");
        deleting.metadata.deletion_timestamp = a.metadata.creation_timestamp.clone();
        let all = store(&[&a, &other_name, &other_kind, &deleting]);
        assert_eq!(outranked_by(&a, &all), None);
    }
}
