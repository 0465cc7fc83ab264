//! Starting and stopping: check the flags and files, bind both listeners,
//! start the config and replica sources, the TLS and credential watchers and
//! the driver, serve (`listen`) until SIGTERM or Ctrl-C, then drain.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::task::JoinHandle;

use super::args::{GatewayArgs, GatewayError, split_namespaced};
use super::conn::{Clocks, HeadCheck, Serves};
use super::fds;
use super::fleet_round::keep_leases;
use super::fleet_share::Fleet;
use super::identity::{follow_secrets, watch_credentials};
use super::listen::{self, Listener, Slots};
use super::request::{check_head, handle};
use super::sources::{watch_configmap, watch_endpoints, watch_file};
use super::state::{Gateway, drive};
use super::tls::ServerTls;
use super::tokenizer;
use super::upstream::Upstream;

/// The client routes: every path and method goes through [`handle`].
pub(super) fn proxy_router(gw: Arc<Gateway>) -> Router {
    Router::new().fallback(handle).with_state(gw)
}

/// The proxy's check of a request's head (its ids, its path, its caller),
/// run by the connection before the body is read.
pub(super) fn proxy_head_check(gw: Arc<Gateway>) -> HeadCheck {
    Arc::new(move |parts| Box::pin(check_head(gw.clone(), parts)))
}

fn admin_router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/metrics", axum::routing::get(metrics_page))
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .route("/readyz", axum::routing::get(readyz))
        .with_state(gw)
}

async fn bind(
    what: &'static str,
    addr: SocketAddr,
) -> Result<tokio::net::TcpListener, GatewayError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| GatewayError::Io { what, addr, source })
}

/// Runs the gateway until SIGTERM or Ctrl-C.
pub async fn run(args: GatewayArgs) -> Result<(), GatewayError> {
    let (configmap, endpoints) = check_flags(&args)?;
    let tls = ServerTls::from_args(&args.tls)?;
    Upstream::check(&args)?;
    let budget = fds::read(args.conn.fd_reserve, args.conn.max_connections)?;
    let tokenizers = tokenizer::load(&args.tokenizers, &args.routes)?;
    let mut gw = Gateway::new(args.clone(), endpoints.is_none());
    gw.tokenizers.install(tokenizers);
    let gw = Arc::new(gw);
    warn_if_trusting(&args);
    let listener = bind("listen on", args.listen).await?;
    let admin = bind("serve metrics on", args.metrics_addr).await?;
    let local = listener.local_addr().unwrap_or(args.listen);
    let admin_local = admin.local_addr().unwrap_or(args.metrics_addr);
    announce(&args, &budget, tls.as_deref(), local, admin_local);
    // A line tests and scripts can wait for (port 0 picks a free port); a
    // closed stdout is no reason to stop serving.
    let _ = writeln!(
        std::io::stdout(),
        "listening on {local} metrics on {admin_local}"
    );

    let mut tasks = start_sources(&gw, configmap, endpoints).await?;
    tasks.push(tokio::spawn(drive(gw.clone())));
    if let Some(fleet) = gw.fleet.clone() {
        tasks.push(tokio::spawn(keep_leases(gw.clone(), fleet)));
    }
    let every = Duration::from_millis(args.reload_millis.max(10));
    tasks.push(tokio::spawn(gw.upstream.credentials.clone().watch(every)));
    if let Some(t) = &tls {
        tasks.push(tokio::spawn(t.clone().watch(every)));
    }
    let clocks = Clocks {
        header_read: args.conn.header_read_timeout_seconds,
        idle: args.conn.idle_timeout_seconds,
        body_read: args.conn.body_read_timeout_seconds,
        max_body_bytes: args.max_body_bytes,
    };
    let grace = args.conn.shutdown_grace_seconds;
    let admin = Listener {
        tcp: admin,
        serves: Serves {
            router: admin_router(gw.clone()),
            head: None,
        },
        tls: None,
        clocks,
        slots: Slots::new(budget.admin),
    };
    tasks.push(tokio::spawn(listen::serve(
        admin,
        std::future::pending(),
        grace,
    )));
    let proxy = Listener {
        tcp: listener,
        serves: Serves {
            router: proxy_router(gw.clone()),
            head: Some(proxy_head_check(gw)),
        },
        tls,
        clocks,
        slots: Slots::new(budget.proxy),
    };
    listen::serve(proxy, shutdown_signal(), grace).await;
    for t in tasks {
        t.abort();
    }
    Ok(())
}

/// The log lines of a start: where it listens, with what limits.
fn announce(
    args: &GatewayArgs,
    budget: &fds::FdBudget,
    tls: Option<&ServerTls>,
    local: SocketAddr,
    admin_local: SocketAddr,
) {
    tracing::info!(
        %local,
        metrics = %admin_local,
        tls = tls.map_or("off", ServerTls::describe),
        "gateway listening"
    );
    tracing::info!(
        rlimit_nofile = budget.limit,
        open_at_start = budget.open,
        fd_reserve = budget.reserve,
        max_connections = budget.proxy,
        max_admin_connections = budget.admin,
        header_read_timeout_seconds = args.conn.header_read_timeout_seconds.as_secs_f64(),
        idle_timeout_seconds = args.conn.idle_timeout_seconds.as_secs_f64(),
        body_read_timeout_seconds = args.conn.body_read_timeout_seconds.as_secs_f64(),
        "connection limits"
    );
    if let Some(asked) = args.conn.max_connections
        && asked > budget.proxy
    {
        tracing::warn!(
            asked,
            allowed = budget.proxy,
            "--max-connections is more than the descriptor limit allows after --fd-reserve; using the lower figure"
        );
    }
}

/// The flags that clap cannot check: a config source, the body limits,
/// header names, `NAMESPACE/NAME` values.
#[expect(clippy::type_complexity, reason = "two optional NAMESPACE/NAME pairs")]
fn check_flags(
    args: &GatewayArgs,
) -> Result<(Option<(String, String)>, Option<(String, String)>), GatewayError> {
    if args.config.is_none() && args.configmap.is_none() {
        return Err(GatewayError::NoConfigSource);
    }
    if args.max_body_memory_bytes < args.max_body_bytes {
        return Err(GatewayError::BodyMemory {
            memory: args.max_body_memory_bytes,
            body: args.max_body_bytes,
        });
    }
    Fleet::check(&args.fleet).map_err(GatewayError::SharedState)?;
    for h in [&args.lane_header, &args.tenant_header]
        .into_iter()
        .chain(args.identity.api_key_header.as_ref())
    {
        axum::http::HeaderName::try_from(h.as_str())
            .map_err(|_| GatewayError::Header(h.clone()))?;
    }
    let configmap = args
        .configmap
        .as_deref()
        .map(|v| split_namespaced("--configmap", v))
        .transpose()?;
    let endpoints = args
        .endpoints_service
        .as_deref()
        .map(|v| split_namespaced("--endpoints-service", v))
        .transpose()?;
    Ok((configmap, endpoints))
}

/// The config source (a file or a ConfigMap) and the replica count.
async fn start_sources(
    gw: &Arc<Gateway>,
    configmap: Option<(String, String)>,
    endpoints: Option<(String, String)>,
) -> Result<Vec<JoinHandle<()>>, GatewayError> {
    let mut tasks = identity_sources(gw).await;
    if let Some(path) = gw.args.config.clone() {
        tasks.push(tokio::spawn(watch_file(gw.clone(), path)));
    }
    if configmap.is_none() && endpoints.is_none() {
        return Ok(tasks);
    }
    let client = kube::Client::try_default().await?;
    if let Some((ns, name)) = configmap {
        tasks.push(tokio::spawn(watch_configmap(
            gw.clone(),
            client.clone(),
            ns,
            name,
        )));
    }
    if let Some((ns, name)) = endpoints {
        tasks.push(tokio::spawn(watch_endpoints(gw.clone(), client, ns, name)));
    }
    Ok(tasks)
}

/// `--trust-lane-header` gives up the identity check: said loudly.
fn warn_if_trusting(args: &GatewayArgs) {
    if args.identity.trust_lane_header {
        tracing::warn!(
            "--trust-lane-header: the lane and tenant come from the request headers with NO credential; anyone who can reach this gateway may claim any lane, P0 included. Only run so behind a proxy that authenticates callers and sets these headers itself"
        );
    }
}

/// The credentials file and, with a Kubernetes client (a kubeconfig or the
/// pod's ServiceAccount), the API-key Secrets the config names.
async fn identity_sources(gw: &Arc<Gateway>) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    let id = &gw.identity;
    if id.trust {
        return tasks;
    }
    if let Some(path) = gw.args.identity.credentials.clone() {
        let every = std::time::Duration::from_millis(gw.args.reload_millis.max(10));
        tasks.push(tokio::spawn(watch_credentials(id.clone(), path, every)));
    }
    match kube::Client::try_default().await {
        Ok(client) => {
            id.connect(client.clone());
            tasks.push(tokio::spawn(follow_secrets(
                id.clone(),
                client,
                id.wanted_secrets(),
            )));
        }
        Err(e) => tracing::info!(error = %e,
            "no Kubernetes client: API-key Secrets, ServiceAccount tokens and JWKS ConfigMaps are not available (--credentials is)"),
    }
    tasks
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

async fn metrics_page(State(gw): State<Arc<Gateway>>) -> Response {
    match gw.metrics.encode() {
        Ok((content_type, body)) => ([(header::CONTENT_TYPE, content_type)], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn readyz(State(gw): State<Arc<Gateway>>) -> Response {
    let (loaded, replicas_known) = {
        let st = gw.lock();
        (st.core.is_some(), st.replicas_known)
    };
    if !loaded {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no lanes.json loaded yet\n",
        )
            .into_response()
    } else if !replicas_known {
        // Not knowing N, a replica would enforce the whole config: N times
        // what the pool may take with N replicas. Stay out of rotation.
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the EndpointSlices of --endpoints-service have not been read yet (see the log)\n",
        )
            .into_response()
    } else {
        (StatusCode::OK, "ready\n").into_response()
    }
}
