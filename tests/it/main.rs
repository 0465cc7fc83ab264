//! The integration tests of the `lanekeeper` package that need no cluster,
//! in one test binary: each file here is a module, so the library and its
//! dependencies are linked once instead of once per file. The real-cluster
//! suite is the other binary, `tests/e2e/`.
//!
//! `cargo test --test it` runs them all; `cargo test --test it -- plan_cli::`
//! runs one file's tests. The shared helpers are declared once, here:
//! `support` (the API double and the controller against it) and
//! `prometheus_support` (a real Prometheus).

#[path = "../prometheus_support/mod.rs"]
mod prometheus_support;
#[path = "../scratch.rs"]
mod scratch;
#[path = "../support/mod.rs"]
mod support;

mod apiserver_double;
mod architecture;
mod calibration_cli;
mod chart;
mod cli;
mod cli_output;
mod controller;
mod controller_approval;
mod controller_cost;
mod controller_freeze;
mod controller_prometheus_credentials;
mod crds;
mod docker_context;
mod docs;
mod drain;
mod engine_calibration_rollout;
mod engine_evidence;
mod engine_in_flight;
mod engine_kv_cache;
mod engine_properties;
mod engine_rules;
mod fake_model;
mod fleet_store_redis;
mod gateway;
mod gateway_api_key_secrets;
mod gateway_body_memory;
mod gateway_breaker;
mod gateway_capacity;
mod gateway_ceiling;
mod gateway_conn;
mod gateway_cut;
mod gateway_doc;
mod gateway_fleet_demand;
mod gateway_floor_cap;
mod gateway_objective;
mod gateway_replay;
mod gateway_service_account;
mod gateway_service_time;
mod gateway_shared;
mod gateway_shared_auth;
mod gateway_shared_deferrals;
mod gateway_shared_fleet;
mod gateway_shared_late;
mod gateway_shared_partition;
mod gateway_shared_spare;
mod gateway_tenants;
mod gateway_tls;
mod gateway_tokenizer;
mod gateway_tokens;
mod gateway_tokens_metrics;
mod gateway_tokens_settle;
mod goodput_rule_promtool;
mod inc47_budget;
mod objectives_plan;
mod plan_cli;
mod plan_cost;
mod plan_emit;
mod plan_freeze;
mod prometheus_goodput;
mod prometheus_inc47;
mod prometheus_queries;
mod prometheus_scrape;
mod prometheus_tokens;
mod rules_cli;
mod rules_promtool;
mod scratch_dirs;
mod sim_cli;
mod sim_gateway_evidence;
mod sim_in_flight;
mod sim_inc47;
mod sim_inc47_tokens;
mod sim_long_context;
mod sim_model;
mod sim_tenant_tokens;
mod sim_tokens;
mod walkthrough;
