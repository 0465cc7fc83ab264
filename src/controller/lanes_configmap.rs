//! The `<profile>-lanes` ConfigMap: `lanes.json` (built by
//! [`crate::policy::gateway_config`]) wrapped for the profile's gateways.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use kube::api::ObjectMeta;
use lanes::{CONFIG_KEY, GatewayConfig, to_json};

use crate::api::CapacityProfile;

/// Annotation carrying the content hash.
pub const HASH_ANNOTATION: &str = "lanekeeper.dev/config-hash";

/// The ConfigMap name for a profile (observe mode writes elsewhere so no
/// enforcing gateway loads it).
pub fn configmap_name(profile: &str, observe: bool) -> String {
    if observe {
        format!("{profile}-lanes-observe")
    } else {
        format!("{profile}-lanes")
    }
}

/// The ConfigMap that carries `cfg` to the profile's gateways: named by
/// [`configmap_name`], labelled with the profile and the mode, annotated
/// with the content hash, owned by the profile (deleted with it).
pub fn configmap(profile: &CapacityProfile, cfg: &GatewayConfig, observe: bool) -> ConfigMap {
    let name = profile.metadata.name.clone().unwrap_or_default();
    let labels = [
        ("app.kubernetes.io/managed-by", "lanekeeper"),
        ("lanekeeper.dev/profile", name.as_str()),
        (
            "lanekeeper.dev/mode",
            if observe { "Observe" } else { "Enforce" },
        ),
    ];
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(configmap_name(&name, observe)),
            namespace: profile.metadata.namespace.clone(),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            annotations: Some(BTreeMap::from([(
                HASH_ANNOTATION.to_owned(),
                cfg.content_hash.clone(),
            )])),
            owner_references: profile.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(CONFIG_KEY.to_owned(), to_json(cfg))])),
        ..Default::default()
    }
}

/// The config a ConfigMap carries and its hash annotation (`None` for what
/// is missing, unreadable or invalid).
pub fn from_configmap(cm: &ConfigMap) -> (Option<GatewayConfig>, Option<&str>) {
    let cfg = cm
        .data
        .as_ref()
        .and_then(|d| d.get(CONFIG_KEY))
        .and_then(|s| GatewayConfig::from_json(s.as_bytes()).ok());
    let hash = cm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HASH_ANNOTATION))
        .map(String::as_str);
    (cfg, hash)
}
