//! Test support shared by integration tests (declared once in each test
//! binary's `main.rs`, `tests/it/` and `tests/e2e/`, and by a bench), then
//! `support::cluster` (a real cluster: e2e/cluster.sh or any KUBECONFIG),
//! `support::apiserver` (the fault-injecting API double) and
//! `support::operator` (the controller against the double).
#![allow(dead_code)]

pub mod apiserver;
pub mod cluster;
pub mod operator;
