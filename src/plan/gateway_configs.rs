//! `plan --emit-gateway-config DIR`: the `lanes.json` the controller would
//! publish for each profile at the last evaluated step, byte for byte.
//!
//! The configs are built step by step as the controller builds them (each
//! step's config is the next step's `prev`, which keeps borrowing expiries
//! stable), with the step's time as `now`, and the bytes are taken from the
//! very ConfigMap the controller would apply
//! ([`lanes_configmap::configmap`]), so the file and the ConfigMap's key
//! cannot differ.

use std::collections::BTreeMap;
use std::path::PathBuf;

use lanes::{CONFIG_KEY, GatewayConfig};

use crate::api::PolicyMode;
use crate::controller::lanes_configmap;
use crate::policy::{Binding, World, bind, gateway_config, key};

use super::Plan;

/// One profile's emitted config.
#[derive(Clone, Debug, PartialEq)]
pub struct EmittedConfig {
    /// Where it goes under the output directory:
    /// `<namespace>/<configmap name>/lanes.json`.
    pub path: PathBuf,
    /// The ConfigMap's `lanes.json` value.
    pub json: String,
}

/// The config of every profile at the plan's last step (none for a plan
/// without steps), in profile order.
pub fn emitted(world: &World, plan: &Plan) -> Vec<EmittedConfig> {
    let bound = bind(world);
    let mut published: BTreeMap<String, GatewayConfig> = BTreeMap::new();
    for step in &plan.steps {
        for d in &step.profiles {
            let Some(b) = binding_of(&bound.bindings, &d.namespace, &d.name) else {
                continue;
            };
            let k = key(&d.namespace, &d.name);
            let cfg = gateway_config::build(
                d,
                &b.lanes,
                b.policy,
                b.profile.metadata.generation.unwrap_or(0),
                published.get(&k),
                step.at,
            );
            published.insert(k, cfg);
        }
    }
    bound
        .bindings
        .iter()
        .filter_map(|b| {
            let ns = b.profile.metadata.namespace.clone().unwrap_or_default();
            let name = b.profile.metadata.name.clone().unwrap_or_default();
            let cfg = published.get(&key(&ns, &name))?;
            let observe = b.policy.is_some_and(|p| p.spec.mode == PolicyMode::Observe);
            let cm = lanes_configmap::configmap(b.profile, cfg, observe);
            let json = cm.data.and_then(|mut d| d.remove(CONFIG_KEY))?;
            let cm_name = cm.metadata.name.unwrap_or_default();
            Some(EmittedConfig {
                path: [ns.as_str(), cm_name.as_str(), CONFIG_KEY].iter().collect(),
                json,
            })
        })
        .collect()
}

fn binding_of<'a, 'w>(
    bindings: &'a [Binding<'w>],
    namespace: &str,
    name: &str,
) -> Option<&'a Binding<'w>> {
    bindings.iter().find(|b| {
        b.profile.metadata.namespace.as_deref().unwrap_or_default() == namespace
            && b.profile.metadata.name.as_deref().unwrap_or_default() == name
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::policy::Approvals;
    use crate::snapshot::SignalsFile;

    fn inc47() -> (World, SignalsFile) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/inc-47");
        let loaded = crate::manifest::load(&[root.join("inc-47.yaml")]).unwrap();
        let signals = SignalsFile::load(&root.join("signals.yaml")).unwrap();
        (loaded.world, signals)
    }

    /// What the controller's reconcile does with the last decision: read the
    /// published config back from its ConfigMap, build, wrap.
    fn controller_bytes(world: &World, plan: &Plan, published: Option<&str>) -> String {
        let bound = bind(world);
        let b = &bound.bindings[0];
        let last = plan.steps.last().unwrap();
        let prev_cm = published.map(|json| k8s_openapi::api::core::v1::ConfigMap {
            data: Some([(CONFIG_KEY.to_owned(), json.to_owned())].into()),
            ..Default::default()
        });
        let prev = prev_cm
            .as_ref()
            .and_then(|cm| lanes_configmap::from_configmap(cm).0);
        let cfg = gateway_config::build(
            &last.profiles[0],
            &b.lanes,
            b.policy,
            b.profile.metadata.generation.unwrap_or(0),
            prev.as_ref(),
            last.at,
        );
        let cm = lanes_configmap::configmap(b.profile, &cfg, false);
        cm.data.unwrap().remove(CONFIG_KEY).unwrap()
    }

    #[test]
    fn the_emitted_file_is_the_configmaps_key_byte_for_byte() {
        let (world, signals) = inc47();
        let n = signals.steps.len();
        assert!(n > 2);
        let before = SignalsFile {
            steps: signals.steps[..n - 1].to_vec(),
        };
        let plan_before = super::super::plan(&world, &before, &Approvals::new());
        let published = emitted(&world, &plan_before);
        let plan = super::super::plan(&world, &signals, &Approvals::new());
        let out = emitted(&world, &plan);
        assert_eq!(out.len(), 1);
        assert_eq!(
            out[0].path,
            Path::new("ai-platform/agent-assist-lanes/lanes.json")
        );
        assert_eq!(
            out[0].json,
            controller_bytes(&world, &plan, Some(&published[0].json))
        );
        // A gateway loads it as it is, and it carries its own hash.
        let cfg = GatewayConfig::from_json(out[0].json.as_bytes()).unwrap();
        assert_eq!(lanes::to_json(&cfg), out[0].json);
    }

    #[test]
    fn a_single_step_plan_emits_the_first_config_the_controller_writes() {
        let (world, signals) = inc47();
        let first = SignalsFile {
            steps: signals.steps[..1].to_vec(),
        };
        let plan = super::super::plan(&world, &first, &Approvals::new());
        let out = emitted(&world, &plan);
        assert_eq!(out[0].json, controller_bytes(&world, &plan, None));
        let none = super::super::plan(&world, &SignalsFile { steps: vec![] }, &Approvals::new());
        assert!(emitted(&world, &none).is_empty());
    }
}
