//! `lanekeeper gateway`: the data path. A reverse proxy for OpenAI-compatible
//! model servers that enforces a `lanes.json` with the admission core of the
//! [`lanes`] crate on every request.
//!
//! I/O only, one job per file: the flags ([`args`]), starting and serving
//! (`run`), the request path as named steps (`request`), the pure mapping
//! from a refusal or failure to the HTTP answer (`respond`), what a passed
//! request takes upstream (`dispatch`), the upstream client (`upstream`),
//! each route's circuit breaker and pace (`route_health`, metrics in
//! `route_metrics`), the config and replica sources (`sources`), what the connection proved
//! about the client (`peer`), who is calling and so which lane and tenant
//! a request gets (`identity`), the accept loop and its connection limit
//! (`listen`), one connection under its clocks (`conn`), the descriptor
//! budget (`fds`), TLS towards clients (`tls`) and towards the routes
//! (`upstream_tls`), the routes' upstream credentials (`credential`), the
//! shared state and the driver of queued requests (`state`), and typed
//! metrics (`metrics`); the fleet's shared lane budgets in Valkey/Redis
//! (`fleet_store`, leases of each lane's bucket; `fleet_store_slots`,
//! tenants' slots; `fleet_store_ids`, request ids; `fleet_share` keeps them
//! topped up and falls back to the local share, `fleet_slots` tenants'
//! slots around the core, `fleet_round` the lease round, `fleet_ids` request ids, `fleet_host` what it needs
//! of the gateway, `fleet_args` its flags,
//! `fleet_metrics` its metrics); the forwarded paths (`surface`), each decision's
//! record (`decision`) and honest ends of cut answers (`cut`). Every
//! decision is the core's.
#![deny(clippy::too_many_lines)]

mod answer_usage;
mod args;
mod body_budget;
mod capacity_metrics;
mod conn;
mod credential;
mod cut;
mod decision;
mod dispatch;
mod fds;
mod fleet_args;
mod fleet_counted;
mod fleet_host;
mod fleet_ids;
mod fleet_lease_calls;
mod fleet_metrics;
mod fleet_needs;
mod fleet_round;
mod fleet_share;
mod fleet_slots;
pub mod fleet_store;
pub mod fleet_store_ids;
pub mod fleet_store_replicas;
pub mod fleet_store_slots;
mod identity;
mod listen;
mod metrics;
mod peer;
mod prompt_text;
mod request;
mod request_shape;
mod respond;
mod route_health;
mod route_metrics;
mod run;
mod settle;
mod sources;
mod state;
mod surface;
mod tls;
mod token_metrics;
mod token_size;
mod tokenizer;
mod upstream;
mod upstream_tls;
mod usage_tap;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;

pub use args::{GatewayArgs, GatewayError};
pub use fleet_args::FleetArgs;
pub use identity::IdentityArgs;
pub use prompt_text::Uncountable;
pub use run::run;
pub use tokenizer::RouteTokenizer;
