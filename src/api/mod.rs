//! The custom resources of lanekeeper (`lanekeeper.dev/v1alpha1`).

pub mod common;
pub mod lane;
pub mod policy;
pub mod profile;

pub use common::Decimal;
pub use lane::*;
pub use policy::*;
pub use profile::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The API group of every lanekeeper resource.
pub const GROUP: &str = "lanekeeper.dev";

/// The three CRDs, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        CapacityProfile::crd(),
        LaneContract::crd(),
        DegradationPolicy::crd(),
    ]
}

/// Each CRD as `(file name, YAML)`, the way `crds/` holds them.
pub fn crd_files() -> Vec<(String, String)> {
    crds()
        .into_iter()
        .map(|crd| {
            let name = format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("crd"));
            let yaml = format!(
                "---\n{}",
                serde_yaml::to_string(&crd).expect("CRD serializes")
            );
            (name, yaml)
        })
        .collect()
}

/// The three CRDs as one multi-document YAML stream (what `crdgen` prints).
pub fn crds_yaml() -> String {
    crd_files().into_iter().map(|(_, y)| y).collect()
}
