//! The end-to-end suite, in one test binary: the tests that run against a
//! real cluster when `LANEKEEPER_E2E=1` (and print SKIPPED without one).
//! `LANEKEEPER_E2E=1 cargo test --test e2e` runs the suite;
//! `cargo test --test e2e -- e2e_controller::` runs one file's tests.
//!
//! One process for the whole suite, so the locks of `world` hold across
//! its files: every test holds `CLUSTER` shared, the restart test and the
//! RBAC test hold it alone (the restarts, the shared leader Lease and the
//! audit log), and tests that place GPU pods take `GPU`.
//! `cel_rules` is here for its server half; its offline cases need no
//! cluster and always run.

#[path = "../prometheus_support/mod.rs"]
mod prometheus_support;
#[path = "../scratch.rs"]
mod scratch;
#[path = "../support/mod.rs"]
mod support;
#[path = "../support/world.rs"]
mod world;

mod cel_rules;
mod e2e;
mod e2e_controller;
mod e2e_cost;
mod e2e_freeze;
mod e2e_identity;
mod e2e_rbac;
mod e2e_tokens;
