//! The profiles a changed CapacityProfile concerns besides itself: the
//! others in its namespace that name the workload it names now or named
//! before. Of several profiles on one workload only the oldest acts on it
//! (`reconcile::shared_target`); when that one is deleted or pointed at
//! another workload, the next takes over at once, not at the next resync.
//! A watch event carries only the new object, so the mapper remembers the
//! workload each profile last named.

use std::sync::Arc;

use kube::core::DeserializeGuard;
use kube::runtime::reflector::{ObjectRef, Store};

use super::rebind::{LastNamed, ProfileRef};
use super::reconcile::shared_target::same_workload;
use crate::api::{CapacityProfile, ObjectKey, ScaleTargetRef};

/// The workload each watched profile last named.
pub type LastTarget = LastNamed<ScaleTargetRef>;

impl LastTarget {
    /// The other profiles of `all` that name the workload `changed` names
    /// now or named before. `gone`: it was deleted (it is forgotten then,
    /// as is an invalid one).
    pub fn peers(
        &self,
        changed: &DeserializeGuard<CapacityProfile>,
        gone: bool,
        all: &[Arc<DeserializeGuard<CapacityProfile>>],
    ) -> Vec<ProfileRef> {
        let named = |p: &CapacityProfile| p.spec.pool.scale_target_ref.clone();
        let Some(n) = self.note(changed, named, gone) else {
            return Vec::new();
        };
        let targets: Vec<ScaleTargetRef> = n.now.into_iter().chain(n.before).collect();
        all.iter()
            .filter_map(|g| g.0.as_ref().ok())
            .filter(|p| p.namespace_str() == n.namespace && p.name_str() != n.name)
            .filter(|p| {
                let t = &p.spec.pool.scale_target_ref;
                targets.iter().any(|w| same_workload(t, w))
            })
            .map(|p| ObjectRef::new(p.name_str()).within(n.namespace))
            .collect()
    }
}

/// The mapper of the profiles' second watch: each change's peers, found
/// in that watch's `store` (which also says which profiles were deleted).
pub fn peers_of(
    store: Store<DeserializeGuard<CapacityProfile>>,
) -> impl Fn(DeserializeGuard<CapacityProfile>) -> Vec<ProfileRef> {
    let named = LastTarget::default();
    move |p: DeserializeGuard<CapacityProfile>| {
        let gone = store.get(&ObjectRef::from_obj(&p)).is_none();
        named.peers(&p, gone, &store.state())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn profile(name: &str, target: &str) -> DeserializeGuard<CapacityProfile> {
        serde_json::from_value(json!({
            "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "CapacityProfile",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {
                "pool": {
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
                    "podSelector": {"matchLabels": {"app": target}}
                },
                "capacity": {"safeUnitsPerSecond": "100", "unitsPerReplica": "10"},
                "replicas": {"min": 1, "max": 4}
            }
        }))
        .unwrap()
    }

    fn names(refs: Vec<ProfileRef>) -> Vec<String> {
        let mut n: Vec<String> = refs.into_iter().map(|r| r.name).collect();
        n.sort();
        n
    }

    #[test]
    fn the_profiles_on_the_workload_named_now_or_before_are_its_peers() {
        let last = LastTarget::default();
        let (a, b, c) = (profile("a", "w"), profile("b", "w"), profile("c", "v"));
        let all: Vec<_> = [&a, &b, &c].map(|p| Arc::new(p.clone())).to_vec();
        assert_eq!(names(last.peers(&a, false, &all)), ["b"]);
        // Pointed at v: the profiles of w (it acted there) and of v.
        let moved = profile("a", "v");
        assert_eq!(names(last.peers(&moved, false, &all)), ["b", "c"]);
        assert_eq!(names(last.peers(&moved, false, &all)), ["c"]);
        // Deleted: the profiles of the workload it named, and forgotten.
        assert_eq!(names(last.peers(&moved, true, &all)), ["c"]);
        assert_eq!(
            names(last.peers(&profile("a", "x"), false, &all)),
            Vec::<String>::new()
        );
    }
}
