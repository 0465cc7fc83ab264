#![forbid(unsafe_code)]
//! lanekeeper: traffic-lane contracts, capacity profiles and degradation
//! ladders for shared GPU inference pools, reconciled into gateway configs,
//! pool sizes, bounded drains and degradation levels.

pub mod api;
pub mod controller;
pub mod gateway;
pub mod manifest;
pub mod metrics;
pub mod plan;
pub mod policy;
pub mod scenario;
pub mod signals;
pub mod sim;
pub mod snapshot;
