//! Test support shared by integration tests: `mod support;`, then
//! `support::cluster` (a real cluster: e2e/cluster.sh or any KUBECONFIG),
//! `support::apiserver` (the fault-injecting API double) and
//! `support::operator` (the controller against the double).
#![allow(dead_code)]

pub mod apiserver;
pub mod cluster;
pub mod operator;
