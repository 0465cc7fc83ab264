//! The profiles a changed lane or policy concerns: the one its
//! `spec.profile` names now and, when that was edited, the one it named
//! before (which must drop it from its ConfigMap and status at once, not at
//! the next resync). A watch event carries only the new object, so the
//! mapper remembers the profile each object last named.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::Resource;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::CapacityProfile;

/// A profile to reconcile.
pub type ProfileRef = ObjectRef<DeserializeGuard<CapacityProfile>>;

/// What each watched object (by namespace and name) last named: a watch
/// event carries only the new object, so what it named before is kept
/// here.
pub struct LastNamed<T> {
    seen: Mutex<HashMap<(String, String), T>>,
}

impl<T> Default for LastNamed<T> {
    fn default() -> Self {
        LastNamed {
            seen: Mutex::new(HashMap::new()),
        }
    }
}

/// A touched object: where it is, what it names now (None when it is
/// invalid) and what it named before (None when nothing, or the same).
pub struct Noted<'a, T> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub now: Option<T>,
    pub before: Option<T>,
}

impl<T: Clone + PartialEq> LastNamed<T> {
    /// Notes what `obj` names now (by `named`); `gone`: it was deleted
    /// (it is forgotten then, as is an invalid one). None without a
    /// namespace and name.
    pub fn note<'a, K: Resource>(
        &self,
        obj: &'a DeserializeGuard<K>,
        named: impl Fn(&K) -> T,
        gone: bool,
    ) -> Option<Noted<'a, T>> {
        let meta = match &obj.0 {
            Ok(o) => o.meta(),
            Err(invalid) => &invalid.metadata,
        };
        let (Some(namespace), Some(name)) = (&meta.namespace, &meta.name) else {
            return None;
        };
        let now = obj.0.as_ref().ok().map(named);
        let key = (namespace.clone(), name.clone());
        let before = {
            let mut seen = self.seen.lock().expect("not poisoned");
            match (&now, gone) {
                (Some(t), false) => seen.insert(key, t.clone()),
                _ => seen.remove(&key),
            }
        };
        let before = before.filter(|b| Some(b) != now.as_ref());
        Some(Noted {
            namespace,
            name,
            now,
            before,
        })
    }
}

/// The profile each watched lane or policy last named.
pub type LastProfile = LastNamed<String>;

impl LastProfile {
    /// The profiles to reconcile for a touched object: the one it names now
    /// (none when it is invalid) and the one it named before, when that is
    /// another. `gone`: the object was deleted.
    pub fn touched<K>(
        &self,
        obj: &DeserializeGuard<K>,
        profile_of: impl Fn(&K) -> &str,
        gone: bool,
    ) -> Vec<ProfileRef>
    where
        K: Resource,
    {
        let Some(n) = self.note(obj, |o| profile_of(o).to_owned(), gone) else {
            return Vec::new();
        };
        n.now
            .into_iter()
            .chain(n.before)
            .map(|p| ObjectRef::new(&p).within(n.namespace))
            .collect()
    }
}

/// The mapper of a lane or policy watch: the profiles each change
/// concerns. `store` is the watch's own, which says which objects were
/// deleted (a watch updates its store before it passes the object on).
pub fn profiles_touched<K>(
    store: Store<DeserializeGuard<K>>,
    profile_of: fn(&K) -> &str,
) -> impl Fn(DeserializeGuard<K>) -> Vec<ProfileRef>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let named = LastProfile::default();
    move |obj: DeserializeGuard<K>| {
        let gone = store.get(&ObjectRef::from_obj(&obj)).is_none();
        named.touched(&obj, profile_of, gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LaneContract;
    use serde_json::json;

    fn lane(profile: &str) -> DeserializeGuard<LaneContract> {
        let l: DeserializeGuard<LaneContract> = serde_json::from_value(json!({
            "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "LaneContract",
            "metadata": {"name": "l", "namespace": "ns"},
            "spec": {
                "profile": profile, "priority": 1, "workUnitsPerRequest": "1",
                "expectedRequestsPerSecond": "1", "deadlineSeconds": 10,
                "queue": {"maxDepth": 10, "ttlSeconds": 5},
                "retry": {"maxAttempts": 1, "budgetPercent": 5},
                "routes": {"primary": ["m"]}
            }
        }))
        .unwrap();
        assert!(l.0.is_ok(), "{:?}", l.0.err());
        l
    }

    fn names(refs: Vec<ProfileRef>) -> Vec<String> {
        refs.into_iter().map(|r| r.name).collect()
    }

    #[test]
    fn a_lane_moved_to_another_profile_concerns_both_then_only_the_new_one() {
        let m = LastProfile::default();
        fn of(l: &LaneContract) -> &str {
            &l.spec.profile
        }
        assert_eq!(names(m.touched(&lane("a"), of, false)), ["a"]);
        assert_eq!(names(m.touched(&lane("a"), of, false)), ["a"]);
        assert_eq!(names(m.touched(&lane("b"), of, false)), ["b", "a"]);
        assert_eq!(names(m.touched(&lane("b"), of, false)), ["b"]);
        // Deleted: forgotten, so a lane made again under the name is new.
        assert_eq!(names(m.touched(&lane("b"), of, true)), ["b"]);
        assert_eq!(names(m.touched(&lane("c"), of, false)), ["c"]);
    }
}
