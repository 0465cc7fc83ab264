//! The custom resources of lanekeeper (`lanekeeper.dev/v1alpha1`).

pub mod breakers;
pub mod calibration;
pub mod clients;
pub mod common;
pub mod freeze;
pub mod lane;
pub mod lane_freeze;
pub mod objective;
pub mod policy;
pub mod pool_limits;
pub mod profile;
pub mod state;
pub mod tenants;
pub mod tokens;

pub use breakers::*;
pub use clients::*;
pub use common::Decimal;
pub use freeze::{FreezeException, FreezeState, FreezeStatus};
pub use lane::*;
pub use lane_freeze::{Covered, FreezeLane, FrozenObject, LaneFreeze, LaneFreezeSpec};
pub use objective::{Band, ObjectiveSpec, ObjectiveStatus};
pub use policy::*;
pub use pool_limits::{ConcurrencySpec, LongContextSpec};
pub use profile::*;
pub use state::*;
pub use tenants::*;
pub use tokens::{CapOutputTokensAction, LaneCost, LaneTokens};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The namespace, name and `namespace/name` key of an object, for code that
/// must not depend on kube's traits (the engine).
pub trait ObjectKey {
    /// The namespace ("" for none).
    fn namespace_str(&self) -> &str;
    /// The name ("" for none).
    fn name_str(&self) -> &str;
    /// `namespace/name`.
    fn key(&self) -> String {
        format!("{}/{}", self.namespace_str(), self.name_str())
    }
    /// Whether the object is being deleted.
    fn deleting(&self) -> bool;
}

impl<K: kube::Resource> ObjectKey for K {
    fn namespace_str(&self) -> &str {
        self.meta().namespace.as_deref().unwrap_or_default()
    }
    fn name_str(&self) -> &str {
        self.meta().name.as_deref().unwrap_or_default()
    }
    fn deleting(&self) -> bool {
        self.meta().deletion_timestamp.is_some()
    }
}

/// The field manager of every write lanekeeper makes (what `managedFields`
/// shows).
pub const FIELD_MANAGER: &str = "lanekeeper";
/// Annotation on a DegradationPolicy that approves entering levels up to its
/// value.
pub const APPROVE_ANNOTATION: &str = "lanekeeper.dev/approve-level";

/// The API group of every lanekeeper resource.
pub const GROUP: &str = "lanekeeper.dev";

/// The four CRDs, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        CapacityProfile::crd(),
        LaneContract::crd(),
        DegradationPolicy::crd(),
        LaneFreeze::crd(),
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

/// The four CRDs as one multi-document YAML stream (what `crdgen` prints).
pub fn crds_yaml() -> String {
    crd_files().into_iter().map(|(_, y)| y).collect()
}
