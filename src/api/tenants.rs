//! `LaneContract.spec.tenants`: limits per tenant inside a lane. Each
//! gateway replica enforces its share of every maximum (rounded up); the
//! weights set each tenant's share of the lane when tenants wait.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Per-tenant limits inside the lane: a maximum of requests in flight per
/// tenant (a default and per-tenant overrides) and the tenants' weights in
/// the lane's fair queue.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LaneTenants {
    /// Most requests of one tenant in flight at once, for every tenant
    /// without its own in `overrides` (absent: no maximum). A tenant at its
    /// maximum waits in its own queue until one of its requests finishes,
    /// or is refused (429) when it cannot wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("maxConcurrency must be >= 1"))]
    pub max_concurrency: Option<i32>,
    /// A tenant's weight in the lane's fair queue, for every tenant without
    /// its own in `overrides` (absent: 1). While tenants wait, each is
    /// served work in proportion to its weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1000").message("weight must be within 1..1000"))]
    pub weight: Option<i32>,
    /// Tenants with their own maximum or weight, by name (at most 256,
    /// names unique).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub overrides: Vec<TenantOverrideSpec>,
}

/// One tenant's own limits.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TenantOverrideSpec {
    /// The tenant, as the lane's `clients` name it (the `tenant` of a
    /// client, its JWT claim, or its identity's own name).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Its maximum in flight (absent: the lane's `maxConcurrency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("maxConcurrency must be >= 1"))]
    pub max_concurrency: Option<i32>,
    /// Its weight (absent: the lane's `weight`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1000").message("weight must be within 1..1000"))]
    pub weight: Option<i32>,
}
