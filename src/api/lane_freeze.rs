//! `LaneFreeze`: the parameters of the change freeze, one object per
//! CapacityProfile (same name, same namespace), written by the controller
//! only and read by the API server's ValidatingAdmissionPolicy
//! (`charts/lanekeeper/templates/freeze.yaml`) as its `paramKind`.
//!
//! It is a custom resource rather than a ConfigMap because the API server's
//! parameter informer for a built-in paramKind does not come back after the
//! policy binding is deleted and re-created (kubernetes/kubernetes#130887),
//! which a Helm reinstall does; a CRD paramKind is not affected.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::freeze::FreezeState;
use super::objective::Band;

/// The change freeze of one CapacityProfile as the API server enforces it:
/// its state, the lanes that cause it, the objects it covers and the
/// controller's clock. Written by the lanekeeper controller only (a second
/// admission policy denies every other writer).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "lanekeeper.dev",
    version = "v1alpha1",
    kind = "LaneFreeze",
    namespaced,
    doc = "A LaneFreeze holds the change freeze of one CapacityProfile (same name) as the API server's admission policy reads it. Written by the lanekeeper controller only.",
    shortname = "freeze",
    category = "lanekeeper",
    printcolumn = r#"{"name":"Profile","type":"string","jsonPath":".spec.profile","description":"CapacityProfile whose freeze this is"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".spec.state","description":"Open, Rollouts or Everything"}"#,
    printcolumn = r#"{"name":"Lanes","type":"string","jsonPath":".spec.lanes[*].name","description":"Lanes that cause the freeze"}"#,
    printcolumn = r#"{"name":"Clock","type":"string","jsonPath":".spec.clock","description":"The controller's clock exceptions are checked against"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct LaneFreezeSpec {
    /// Name of the CapacityProfile (same namespace) whose freeze this is.
    pub profile: String,
    /// `Open` (nothing frozen), `Rollouts` (the pool's pod template and the
    /// lanes' routes) or `Everything` (every spec change of the profile, its
    /// lanes and its policy, creating and deleting them included).
    #[serde(default)]
    pub state: FreezeState,
    /// The lanes that cause the freeze (those in the worst band) with their
    /// bands; empty while open.
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub lanes: Vec<FreezeLane>,
    /// The objects the freeze covers by name (the pool's workload, the
    /// profile, its lanes and its policy); empty while open. A LaneContract
    /// or DegradationPolicy not listed is covered when its `spec.profile`
    /// names this profile.
    #[serde(default)]
    #[schemars(length(max = 1024))]
    pub objects: Vec<FrozenObject>,
    /// The controller's time in whole minutes (RFC 3339), the "now" an
    /// exception's `expires` is checked against (admission CEL has no clock
    /// of its own); absent while open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<String>,
}

/// A lane that causes the freeze.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FreezeLane {
    /// The LaneContract's name.
    pub name: String,
    /// Its error-budget band.
    pub band: Band,
}

/// An object the freeze covers.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FrozenObject {
    /// Its kind (`Deployment`, `CapacityProfile`, `LaneContract`, ...).
    pub kind: String,
    /// Its name (in the profile's namespace).
    pub name: String,
    /// What it is to the profile.
    pub role: Covered,
}

/// What an object is to the profile whose freeze covers it.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord,
)]
pub enum Covered {
    /// The pool's workload (the scale target): its pod template is frozen.
    ScaleTarget,
    /// The CapacityProfile itself.
    Profile,
    /// One of its LaneContracts.
    Lane,
    /// Its DegradationPolicy.
    Policy,
}

impl Covered {
    /// The role's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Covered::ScaleTarget => "ScaleTarget",
            Covered::Profile => "Profile",
            Covered::Lane => "Lane",
            Covered::Policy => "Policy",
        }
    }
}
