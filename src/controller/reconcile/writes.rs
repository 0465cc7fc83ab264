//! Writes of status and annotations, and the cache of what they returned.
//!
//! The watch caches lag behind our own writes. Statuses accumulate
//! (transitions, condition times, the engine's windows), so a reconcile that
//! built on a stale copy would lose what the previous one just wrote; and an
//! approval annotation just consumed must not be read back and consumed
//! again. [`Writes::freshen`] gives the freshest of the cache's copy and our
//! own last write; every write goes through here and is remembered.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::Client;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::super::error::Error;
use crate::api::FIELD_MANAGER;
use crate::metrics::Metrics;

/// Writes with memory: per object uid, the resource version and the status
/// and annotations our last write returned.
pub struct Writes {
    client: Client,
    metrics: Metrics,
    last: Mutex<HashMap<String, (String, Value)>>,
}

/// Whether the status this leader wrote (at `written_rv`) is newer than the
/// store's copy (at `store_rv`). Resource versions are compared as numbers
/// when both are numeric (as every API server in practice makes them); when
/// they can't be ordered, what we wrote wins until the store shows the same
/// version.
fn written_is_newer(written_rv: &str, store_rv: Option<&str>) -> bool {
    match (written_rv.parse::<u64>(), store_rv.map(str::parse::<u64>)) {
        (Ok(w), Some(Ok(s))) => w > s,
        _ => store_rv != Some(written_rv),
    }
}

/// Objects whose status lanekeeper writes.
pub trait Written:
    Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + serde::Serialize
    + serde::de::DeserializeOwned
{
}

impl<K> Written for K where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned
{
}

impl Writes {
    /// No writes yet.
    pub fn new(client: Client, metrics: Metrics) -> Self {
        Self {
            client,
            metrics,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// The object with the freshest status and annotations we know: the
    /// store's, unless this leader wrote a newer one that the watch has not
    /// delivered yet.
    pub fn freshen<K>(&self, obj: &K) -> K
    where
        K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned,
    {
        let Some(uid) = obj.meta().uid.as_deref() else {
            return obj.clone();
        };
        let cached = self.last.lock().expect("not poisoned").get(uid).cloned();
        match cached {
            Some((rv, written))
                if written_is_newer(&rv, obj.meta().resource_version.as_deref()) =>
            {
                let Ok(mut v) = serde_json::to_value(obj) else {
                    return obj.clone();
                };
                v["status"] = written["status"].clone();
                v["metadata"]["annotations"] = written["annotations"].clone();
                serde_json::from_value(v).unwrap_or_else(|_| obj.clone())
            }
            _ => obj.clone(),
        }
    }

    /// Remembers the status and annotations an API write returned.
    fn remember<K: Resource + serde::Serialize>(&self, written: &K) {
        let (Some(uid), Some(rv)) = (
            written.meta().uid.clone(),
            written.meta().resource_version.clone(),
        ) else {
            return;
        };
        if let Ok(v) = serde_json::to_value(written) {
            let kept = json!({"status": v["status"], "annotations": v["metadata"]["annotations"]});
            self.last
                .lock()
                .expect("not poisoned")
                .insert(uid, (rv, kept));
        }
    }

    /// Counts a write in the metrics.
    pub fn count(&self, kind: &str, verb: &str) {
        self.metrics.write(kind, verb);
    }

    fn api<K: Written>(&self, obj: &K) -> Api<K> {
        Api::namespaced(
            self.client.clone(),
            obj.meta().namespace.as_deref().unwrap_or_default(),
        )
    }

    /// Server-side applies `status` to an object's status subresource as the
    /// `lanekeeper` field manager, unless it equals the freshest status known
    /// (`current`). Returns whether it wrote.
    pub async fn status<K, S>(
        &self,
        obj: &K,
        current: Option<&S>,
        status: &S,
    ) -> Result<bool, Error>
    where
        K: Written,
        S: serde::Serialize + PartialEq,
    {
        if current == Some(status) {
            return Ok(false);
        }
        let kind = K::kind(&());
        let patch = json!({"apiVersion": K::api_version(&()), "kind": kind, "status": status});
        let written = self
            .api(obj)
            .patch_status(
                obj.meta().name.as_deref().unwrap_or_default(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(|e| Error::kube("apply status", e))?;
        self.count(&kind, "apply-status");
        self.remember(&written);
        Ok(true)
    }

    /// Removes an annotation (a merge patch).
    pub async fn remove_annotation<K: Written>(&self, obj: &K, key: &str) -> Result<(), Error> {
        let patch = json!({"metadata": {"annotations": {key: null}}});
        let written = self
            .api(obj)
            .patch(
                obj.meta().name.as_deref().unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| Error::kube("remove annotation", e))?;
        self.count(&K::kind(&()), "merge");
        self.remember(&written);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::written_is_newer;

    #[test]
    fn our_write_wins_until_the_watch_catches_up() {
        assert!(written_is_newer("12", Some("11")));
        assert!(!written_is_newer("12", Some("12")));
        assert!(!written_is_newer("12", Some("13")));
        assert!(written_is_newer("12", None));
        // Versions that are not numbers: ours until the store shows the same.
        assert!(written_is_newer("b", Some("a")));
        assert!(!written_is_newer("b", Some("b")));
    }
}
