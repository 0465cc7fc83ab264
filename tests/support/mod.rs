//! Test support shared by integration tests: `mod support; use support::apiserver::ApiServer;`.
#![allow(dead_code)]

pub mod apiserver;
pub mod operator;
