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
/// is missing, unreadable, invalid, or edited: a `contentHash` that is not
/// the document's hash).
pub fn from_configmap(cm: &ConfigMap) -> (Option<GatewayConfig>, Option<&str>) {
    let cfg = cm
        .data
        .as_ref()
        .and_then(|d| d.get(CONFIG_KEY))
        .and_then(|s| GatewayConfig::from_json(s.as_bytes()).ok())
        .filter(|c| lanes::hash(c) == c.content_hash);
    let hash = cm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HASH_ANNOTATION))
        .map(String::as_str);
    (cfg, hash)
}

/// Whether `cm` carries exactly `cfg`: its `lanes.json` is `cfg`'s
/// canonical bytes and its hash annotation `cfg`'s hash. An edit of the
/// data that kept the annotation does not pass.
pub fn carries(cm: &ConfigMap, cfg: &GatewayConfig) -> bool {
    let data = cm.data.as_ref().and_then(|d| d.get(CONFIG_KEY));
    from_configmap(cm).1 == Some(cfg.content_hash.as_str())
        && data.is_some_and(|d| *d == to_json(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// INC-47's config at 420 units/s, with a borrowing grant (a timestamp
    /// and a fraction, the fields most likely not to read back the same).
    fn config() -> GatewayConfig {
        let text = include_str!("../../examples/inc-47/lanes-420.json");
        let mut cfg = GatewayConfig::from_json(text.as_bytes()).expect("the example parses");
        let lender = cfg.lanes[0].name.clone();
        cfg.lanes[3].borrowing.push(lanes::Borrow {
            from: lender,
            units_per_second: 33.3,
            expires_at: lanes::jiff::Timestamp::from_second(1_785_542_417).unwrap(),
            release_within_seconds: 30,
        });
        cfg.with_hash()
    }

    fn carrying(cfg: &GatewayConfig, data: String) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([(
                    HASH_ANNOTATION.to_owned(),
                    cfg.content_hash.clone(),
                )])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(CONFIG_KEY.to_owned(), data)])),
            ..Default::default()
        }
    }

    #[test]
    fn a_config_reads_back_as_written_and_an_edit_under_the_same_annotation_does_not() {
        let cfg = config();
        let cm = carrying(&cfg, to_json(&cfg));
        assert_eq!(from_configmap(&cm).0.as_ref(), Some(&cfg));
        assert!(carries(&cm, &cfg));
        // Edited, still valid, the annotation kept.
        let edited = to_json(&cfg).replacen("33.3", "66.6", 1);
        let cm = carrying(&cfg, edited);
        assert!(!carries(&cm, &cfg));
        assert_eq!(
            from_configmap(&cm).0,
            None,
            "its contentHash is not its hash"
        );
        assert_eq!(from_configmap(&cm).1, Some(cfg.content_hash.as_str()));
        assert!(!carries(&carrying(&cfg, "{}".into()), &cfg));
    }
}
