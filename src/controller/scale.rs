//! The pool's scale target: any kind with a scale subresource.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::{ApiCapabilities, pinned_kind};
use serde_json::json;

use super::error::Error;
use crate::api::ScaleTargetRef;

/// Resolves kinds to API resources through discovery, once per kind.
#[derive(Default)]
pub struct Resolver {
    cache: Mutex<HashMap<(String, String), (ApiResource, ApiCapabilities)>>,
}

impl Resolver {
    /// The API resource of `apiVersion`/`kind`, with its capabilities.
    pub async fn resolve(
        &self,
        client: &Client,
        r: &ScaleTargetRef,
    ) -> Result<(ApiResource, ApiCapabilities), Error> {
        let key = (r.api_version.clone(), r.kind.clone());
        if let Some(hit) = self.cache.lock().expect("not poisoned").get(&key) {
            return Ok(hit.clone());
        }
        let (group, version) = match r.api_version.split_once('/') {
            Some((g, v)) => (g.to_owned(), v.to_owned()),
            None => (String::new(), r.api_version.clone()),
        };
        let gvk = GroupVersionKind::gvk(&group, &version, &r.kind);
        let found = pinned_kind(client, &gvk).await.map_err(|e| {
            Error::ScaleTarget(format!(
                "cannot resolve {}/{} through discovery: {e}",
                r.api_version, r.kind
            ))
        })?;
        if !found
            .1
            .subresources
            .iter()
            .any(|(s, _)| s.plural == "scale" || s.plural.ends_with("/scale"))
        {
            return Err(Error::ScaleTarget(format!(
                "{} {} has no scale subresource",
                r.api_version, r.kind
            )));
        }
        self.cache
            .lock()
            .expect("not poisoned")
            .insert(key, found.clone());
        Ok(found)
    }
}

/// What the controller reads of the scale target.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TargetState {
    /// `spec.replicas` through the scale subresource.
    pub replicas: Option<i32>,
    /// `status.readyReplicas` of the workload, where the kind has one.
    pub ready_replicas: Option<u32>,
    /// The workload as read (its pod template and rollout status).
    pub workload: Option<DynamicObject>,
}

/// Sets the replicas through the scale subresource (server-side apply).
pub async fn write(
    client: &Client,
    resolver: &Resolver,
    ns: &str,
    r: &ScaleTargetRef,
    replicas: i32,
    manager: &str,
) -> Result<(), Error> {
    let (ar, _) = resolver.resolve(client, r).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    let patch = json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {"name": r.name, "namespace": ns},
        "spec": {"replicas": replicas},
    });
    api.patch_subresource(
        "scale",
        &r.name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| Error::kube("patch scale", e))?;
    Ok(())
}

/// Raises (or lowers) the HPA's `minReplicas` to `replicas`, within its
/// `maxReplicas` (server-side apply: lanekeeper owns only that field).
pub async fn write_hpa_min(
    client: &Client,
    ns: &str,
    hpa: &HorizontalPodAutoscaler,
    replicas: i32,
    manager: &str,
) -> Result<bool, Error> {
    let name = hpa.metadata.name.clone().unwrap_or_default();
    let max = hpa.spec.as_ref().map_or(replicas, |s| s.max_replicas);
    let want = replicas.clamp(1, max.max(1));
    if hpa.spec.as_ref().and_then(|s| s.min_replicas) == Some(want) {
        return Ok(false);
    }
    let api: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), ns);
    let patch = json!({
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"minReplicas": want},
    });
    api.patch(
        &name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| Error::kube("patch horizontalpodautoscaler", e))?;
    Ok(true)
}

/// The number of replicas to write, if a write is due: only when the
/// decision has an opinion that differs from the current value, and never
/// below the current value unless `may_shrink` (the pool is not degraded
/// and telemetry is known: rule 6).
pub fn write_due(desired: Option<i32>, current: Option<i32>, may_shrink: bool) -> Option<i32> {
    match (desired, current) {
        (Some(d), Some(c)) if d == c || (d < c && !may_shrink) => None,
        (Some(d), _) => Some(d),
        (None, _) => None,
    }
}

/// The key under which writes of the scale target's replicas are tracked.
pub fn target_key(ns: &str, r: &ScaleTargetRef) -> String {
    format!("{}/{ns}/{}", r.kind, r.name)
}

/// The key under which writes of an HPA's `minReplicas` are tracked.
pub fn hpa_key(ns: &str, hpa: &str) -> String {
    format!("HorizontalPodAutoscaler/{ns}/{hpa}")
}

#[cfg(test)]
mod tests {
    use super::write_due;

    #[test]
    fn a_write_is_due_when_the_value_differs_and_never_shrinks_unless_allowed() {
        assert_eq!(write_due(Some(9), Some(9), true), None);
        assert_eq!(write_due(Some(11), Some(9), false), Some(11));
        assert_eq!(write_due(Some(9), Some(14), false), None);
        assert_eq!(write_due(Some(9), Some(14), true), Some(9));
        assert_eq!(write_due(Some(9), None, false), Some(9));
        assert_eq!(write_due(None, Some(9), true), None);
    }
}
