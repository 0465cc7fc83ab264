//! `/metrics`, `/healthz` and `/readyz`.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use super::context::Readiness;
use crate::metrics::Metrics;

/// An address that is not `:port` or `host:port`.
#[derive(Debug, thiserror::Error)]
#[error("{raw:?} is not an address like :8080 or 127.0.0.1:8080: {source}")]
pub struct AddrError {
    /// What was given.
    pub raw: String,
    /// Why it does not parse.
    #[source]
    pub source: std::net::AddrParseError,
}

/// Parses `:8080` or `host:port`.
pub fn parse_addr(s: &str) -> Result<SocketAddr, AddrError> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_owned()
    };
    full.parse().map_err(|source| AddrError {
        raw: s.to_owned(),
        source,
    })
}

/// The metrics router.
pub fn metrics_router(metrics: Metrics) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Metrics>| async move { m.render() }),
        )
        .with_state(metrics)
}

/// The health router: `/healthz` answers while the process runs, `/readyz`
/// once the caches have synced (a standby waiting for the lease is ready).
pub fn health_router(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(r): State<Readiness>| async move {
                if r.get() {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
                }
            }),
        )
        .with_state(readiness)
}

/// Serves a router on an address until the process ends.
pub async fn serve(addr: SocketAddr, router: Router) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, router).await
}
