//! `lanekeeper gateway`: the data path. A reverse proxy for OpenAI-compatible
//! model servers that enforces a `lanes.json` with the admission core
//! ([`crate::admission`]) on every request.
//!
//! I/O only: reading the config (a file or a ConfigMap), counting the ready
//! gateway replicas, HTTP in and out, metrics. Every decision is the core's.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};

use crate::admission::{
    Attempt, Core, Outcome, Pass, Refusal, Request as AdmissionRequest, Resolution, Ticket,
    Verdict, trim_chat_history,
};
use crate::gateway::GatewayConfig;

/// Flags of `lanekeeper gateway`; each also from an environment variable.
#[derive(clap::Args, Debug, Clone)]
pub struct GatewayArgs {
    /// Address to serve requests on.
    #[arg(
        long,
        env = "LANEKEEPER_GATEWAY_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    pub listen: SocketAddr,
    /// A mounted `lanes.json`, reloaded when its contents change.
    #[arg(long, env = "LANEKEEPER_GATEWAY_CONFIG", conflicts_with = "configmap")]
    pub config: Option<PathBuf>,
    /// The ConfigMap `NAMESPACE/NAME` holding `lanes.json`, watched through
    /// the API and reloaded on change.
    #[arg(long, env = "LANEKEEPER_GATEWAY_CONFIGMAP")]
    pub configmap: Option<String>,
    /// `NAME=URL`: the upstream base URL of a route named in `lanes.json`
    /// (repeat the flag; the environment variable takes a comma-separated
    /// list).
    #[arg(long = "route", env = "LANEKEEPER_GATEWAY_ROUTES", value_delimiter = ',', value_parser = parse_route)]
    pub routes: Vec<(String, String)>,
    /// Address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(
        long,
        env = "LANEKEEPER_GATEWAY_METRICS_ADDR",
        default_value = "0.0.0.0:9090"
    )]
    pub metrics_addr: SocketAddr,
    /// The header naming a request's lane (the LaneContract's name).
    #[arg(
        long,
        env = "LANEKEEPER_GATEWAY_LANE_HEADER",
        default_value = "x-lanekeeper-lane"
    )]
    pub lane_header: String,
    /// The header naming a request's tenant (fair queueing inside a lane).
    #[arg(
        long,
        env = "LANEKEEPER_GATEWAY_TENANT_HEADER",
        default_value = "x-lanekeeper-tenant"
    )]
    pub tenant_header: String,
    /// Enforce 1/N of every rate, burst, floor, queue and watermark: the
    /// number of gateway replicas. Without it (and without
    /// `--endpoints-service`) a replica enforces the whole config.
    #[arg(long, env = "LANEKEEPER_GATEWAY_REPLICAS")]
    pub replicas: Option<u32>,
    /// `NAMESPACE/NAME` of the gateway's own Service: N is the number of its
    /// ready endpoints (EndpointSlices), followed as replicas come and go.
    #[arg(
        long,
        env = "LANEKEEPER_GATEWAY_ENDPOINTS_SERVICE",
        conflicts_with = "replicas"
    )]
    pub endpoints_service: Option<String>,
    /// The largest request body accepted, in bytes (413 beyond).
    #[arg(long, env = "LANEKEEPER_GATEWAY_MAX_BODY_BYTES", default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// How often a `--config` file is checked for changes, in milliseconds.
    #[arg(long, env = "LANEKEEPER_GATEWAY_RELOAD_MILLIS", default_value_t = 500)]
    pub reload_millis: u64,
}

fn parse_route(s: &str) -> Result<(String, String), String> {
    let (name, url) = s
        .split_once('=')
        .ok_or_else(|| format!("route {s:?} is not NAME=URL"))?;
    let url = url.trim_end_matches('/');
    if name.is_empty() || !(url.starts_with("http://")) {
        return Err(format!(
            "route {s:?}: need a name and an http:// base URL (TLS to the pool is not supported)"
        ));
    }
    url.parse::<axum::http::Uri>()
        .map_err(|e| format!("route {s:?}: {e}"))?;
    Ok((name.to_owned(), url.to_owned()))
}

/// The gateway's metric families.
struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    shadow: IntCounterVec,
    queue_depth: IntGaugeVec,
    in_flight: IntGauge,
    wait: HistogramVec,
    upstream: HistogramVec,
    deadline_misses: IntCounterVec,
    config_info: GaugeVec,
    config_loads: IntCounterVec,
    pressure: IntGaugeVec,
    replicas: IntGauge,
}

/// Registers a collector and hands it back.
fn registered<C: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    registry
        .register(Box::new(c.clone()))
        .expect("each metric is registered once");
    c
}

impl Metrics {
    fn new() -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            registered(
                &registry,
                IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
            )
        };
        let gauges = |name: &str, help: &str, labels: &[&str]| {
            registered(
                &registry,
                IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
            )
        };
        let gauge = |name: &str, help: &str| {
            registered(&registry, IntGauge::new(name, help).expect("valid metric"))
        };
        let hist = |name: &str, help: &str| {
            let opts = HistogramOpts::new(name, help).buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                120.0, 300.0,
            ]);
            registered(
                &registry,
                HistogramVec::new(opts, &["lane"]).expect("valid metric"),
            )
        };
        let requests = counter(
            "lanekeeper_gateway_requests_total",
            "Requests by lane, tenant class (default or named), attempt (original, retry, returning) and outcome.",
            &["lane", "tenant_class", "attempt", "outcome"],
        );
        let shadow = counter(
            "lanekeeper_gateway_shadow_requests_total",
            "Observe mode: what enforcing the config would have done, by lane, attempt and outcome (every request is admitted).",
            &["lane", "attempt", "outcome"],
        );
        let deadline_misses = counter(
            "lanekeeper_gateway_deadline_misses_total",
            "Requests that went upstream and ran past their lane's deadline.",
            &["lane"],
        );
        let config_loads = counter(
            "lanekeeper_gateway_config_loads_total",
            "Config loads by result (loaded, unchanged, invalid, unreadable).",
            &["result"],
        );
        let wait = hist(
            "lanekeeper_gateway_admission_wait_seconds",
            "Time a request waited in its lane's queue before going upstream.",
        );
        let upstream = hist(
            "lanekeeper_gateway_upstream_latency_seconds",
            "Time from sending a request upstream to its response headers.",
        );
        let queue_depth = gauges(
            "lanekeeper_gateway_queue_depth",
            "Requests waiting per lane.",
            &["lane"],
        );
        let in_flight = gauge(
            "lanekeeper_gateway_in_flight",
            "Requests this replica has in flight to the pool.",
        );
        let config_info = registered(
            &registry,
            GaugeVec::new(
                Opts::new(
                    "lanekeeper_gateway_config_info",
                    "The config in force (1): its profile, mode and contentHash.",
                ),
                &["profile", "mode", "hash"],
            )
            .expect("valid metric"),
        );
        let pressure = gauges(
            "lanekeeper_gateway_pressure",
            "The in-flight pressure state (1 for the state in force: normal, conserve, stop).",
            &["state"],
        );
        let replicas = gauge(
            "lanekeeper_gateway_replicas",
            "The number of gateway replicas this one shares the rates with (N of 1/N).",
        );
        Metrics {
            registry,
            requests,
            shadow,
            queue_depth,
            in_flight,
            wait,
            upstream,
            deadline_misses,
            config_info,
            config_loads,
            pressure,
            replicas,
        }
    }
}

/// What the handlers share.
struct Shared {
    args: GatewayArgs,
    start: Instant,
    state: Mutex<Admission>,
    wake: Notify,
    metrics: Metrics,
    client: Client<HttpConnector, Full<Bytes>>,
    routes: HashMap<String, String>,
}

/// The core and the waiters of its queued tickets, under one lock.
struct Admission {
    core: Option<Core>,
    waiters: HashMap<Ticket, oneshot::Sender<Resolution>>,
    replicas: u32,
    /// Whether `replicas` is known: always with `--replicas`; with
    /// `--endpoints-service` once the EndpointSlices have been listed.
    /// Until then the gateway is not ready.
    replicas_known: bool,
    /// The last good config, to rebuild the core when N changes.
    last_good: Option<GatewayConfig>,
}

impl Shared {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Errors that stop the gateway from starting.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// Neither `--config` nor `--configmap`.
    #[error("give the config: --config FILE or --configmap NAMESPACE/NAME")]
    NoConfigSource,
    /// A `NAMESPACE/NAME` flag without the slash.
    #[error("{flag} {value:?} is not NAMESPACE/NAME")]
    NotNamespaced {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
    },
    /// A bad header name flag.
    #[error("{0:?} is not a valid header name")]
    Header(String),
    /// Binding a socket or serving failed.
    #[error("{what} {addr}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The Kubernetes client could not be made.
    #[error("kubernetes client: {0}")]
    Kube(#[from] kube::Error),
}

fn split_namespaced(flag: &'static str, v: &str) -> Result<(String, String), GatewayError> {
    match v.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(GatewayError::NotNamespaced {
            flag,
            value: v.to_owned(),
        }),
    }
}

/// Runs the gateway until SIGTERM or Ctrl-C.
pub async fn run(args: GatewayArgs) -> Result<(), GatewayError> {
    if args.config.is_none() && args.configmap.is_none() {
        return Err(GatewayError::NoConfigSource);
    }
    for h in [&args.lane_header, &args.tenant_header] {
        HeaderName::try_from(h.as_str()).map_err(|_| GatewayError::Header(h.clone()))?;
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
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .build(connector);
    let replicas = args.replicas.unwrap_or(1).max(1);
    let shared = Arc::new(Shared {
        routes: args.routes.iter().cloned().collect(),
        start: Instant::now(),
        state: Mutex::new(Admission {
            core: None,
            waiters: HashMap::new(),
            replicas,
            replicas_known: endpoints.is_none(),
            last_good: None,
        }),
        wake: Notify::new(),
        metrics: Metrics::new(),
        client,
        args: args.clone(),
    });
    shared.metrics.replicas.set(i64::from(replicas));

    let bind = |what: &'static str, addr: SocketAddr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| GatewayError::Io { what, addr, source })
    };
    let listener = bind("listen on", args.listen).await?;
    let metrics_listener = bind("serve metrics on", args.metrics_addr).await?;
    let local = listener.local_addr().unwrap_or(args.listen);
    let metrics_local = metrics_listener.local_addr().unwrap_or(args.metrics_addr);
    tracing::info!(%local, metrics = %metrics_local, "gateway listening");
    // A line tests and scripts can wait for (port 0 picks a free port).
    println!("listening on {local} metrics on {metrics_local}");

    let mut tasks = Vec::new();
    tasks.push(tokio::spawn(drive(shared.clone())));
    if let Some(path) = args.config.clone() {
        tasks.push(tokio::spawn(watch_file(shared.clone(), path)));
    }
    if configmap.is_some() || endpoints.is_some() {
        let client = kube::Client::try_default().await?;
        if let Some((ns, name)) = configmap {
            tasks.push(tokio::spawn(watch_configmap(
                shared.clone(),
                client.clone(),
                ns,
                name,
            )));
        }
        if let Some((ns, name)) = endpoints {
            tasks.push(tokio::spawn(watch_endpoints(
                shared.clone(),
                client,
                ns,
                name,
            )));
        }
    }

    let metrics_router = Router::new()
        .route("/metrics", axum::routing::get(metrics_page))
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .route("/readyz", axum::routing::get(readyz))
        .with_state(shared.clone());
    tasks.push(tokio::spawn(async move {
        if let Err(e) = axum::serve(metrics_listener, metrics_router).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    }));
    let router = Router::new().fallback(handle).with_state(shared.clone());
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(shutdown_signal())
        .await;
    for t in tasks {
        t.abort();
    }
    served.map_err(|source| GatewayError::Io {
        what: "serve on",
        addr: local,
        source,
    })
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

/// Installs a config (the first, or a swap), or refuses it and keeps the
/// last good one. `source` names where it came from, for the log.
fn install(shared: &Shared, cfg: GatewayConfig, source: &str) {
    let now = shared.now();
    let mut st = shared.state.lock().expect("not poisoned");
    if st
        .last_good
        .as_ref()
        .is_some_and(|g| g.content_hash == cfg.content_hash && !cfg.content_hash.is_empty())
    {
        shared
            .metrics
            .config_loads
            .with_label_values(&["unchanged"])
            .inc();
        return;
    }
    let share = 1.0 / f64::from(st.replicas.max(1));
    let result = match st.core.as_mut() {
        Some(core) => core.swap(cfg.clone(), share, now, unix_now()),
        None => Core::new(cfg.clone(), share, now, unix_now()).map(|c| {
            st.core = Some(c);
            Vec::new()
        }),
    };
    match result {
        Ok(refused) => {
            for (ticket, r) in refused {
                if let Some(tx) = st.waiters.remove(&ticket) {
                    let _ = tx.send(r);
                }
            }
            let old_hash = st.last_good.as_ref().map(|g| g.content_hash.clone());
            shared.metrics.config_info.reset();
            shared
                .metrics
                .config_info
                .with_label_values(&[&cfg.profile, &cfg.mode, &cfg.content_hash])
                .set(1.0);
            shared
                .metrics
                .config_loads
                .with_label_values(&["loaded"])
                .inc();
            tracing::info!(
                source,
                profile = %cfg.profile,
                mode = %cfg.mode,
                level = cfg.level,
                hash = %cfg.content_hash,
                previous = ?old_hash,
                "gateway config loaded"
            );
            st.last_good = Some(cfg);
            drop(st);
            shared.wake.notify_one();
        }
        Err(e) => {
            shared
                .metrics
                .config_loads
                .with_label_values(&["invalid"])
                .inc();
            tracing::error!(source, error = %e, kept = ?st.last_good.as_ref().map(|g| &g.content_hash),
                "gateway config refused; keeping the last good one");
        }
    }
}

fn parse_config(shared: &Shared, bytes: &[u8], source: &str) -> Option<GatewayConfig> {
    match serde_json::from_slice::<GatewayConfig>(bytes) {
        Ok(c) => Some(c),
        Err(e) => {
            shared
                .metrics
                .config_loads
                .with_label_values(&["invalid"])
                .inc();
            tracing::error!(source, error = %e, "gateway config is not a lanes.json; keeping the last good one");
            None
        }
    }
}

async fn watch_file(shared: Arc<Shared>, path: PathBuf) {
    let source = path.display().to_string();
    let mut last: Option<Vec<u8>> = None;
    let mut reported_unreadable = false;
    loop {
        // A small file, read every reload interval: a blocking read is fine.
        match std::fs::read(&path) {
            Ok(bytes) => {
                reported_unreadable = false;
                if last.as_deref() != Some(&bytes[..]) {
                    if let Some(cfg) = parse_config(&shared, &bytes, &source) {
                        install(&shared, cfg, &source);
                    }
                    last = Some(bytes);
                }
            }
            Err(e) => {
                if !reported_unreadable {
                    shared
                        .metrics
                        .config_loads
                        .with_label_values(&["unreadable"])
                        .inc();
                    tracing::error!(source, error = %e, "gateway config unreadable; keeping the last good one");
                    reported_unreadable = true;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(shared.args.reload_millis.max(10))).await;
    }
}

async fn watch_configmap(shared: Arc<Shared>, client: kube::Client, ns: String, name: String) {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, &ns);
    let source = format!("configmap {ns}/{name}");
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(api, cfg).boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                match cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get(crate::gateway::CONFIG_KEY))
                {
                    Some(text) => {
                        if let Some(cfg) = parse_config(&shared, text.as_bytes(), &source) {
                            install(&shared, cfg, &source);
                        }
                    }
                    None => {
                        shared
                            .metrics
                            .config_loads
                            .with_label_values(&["invalid"])
                            .inc();
                        tracing::error!(
                            source,
                            "the ConfigMap has no lanes.json key; keeping the last good config"
                        );
                    }
                }
            }
            Ok(watcher::Event::Delete(_)) => {
                tracing::warn!(
                    source,
                    "the ConfigMap was deleted; keeping the last good config"
                );
            }
            Ok(_) => {}
            Err(e) => {
                shared
                    .metrics
                    .config_loads
                    .with_label_values(&["unreadable"])
                    .inc();
                tracing::warn!(source, error = %e, "watching the ConfigMap failed; retrying, keeping the last good config");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// The number of distinct ready endpoints in a Service's EndpointSlices. A
/// dual-stack Service has one slice per address family listing the same
/// pods, so an endpoint is its target (the pod) when it names one, else its
/// first address; a missing `ready` condition means ready (as the API
/// documents).
fn ready_endpoints<'a>(
    slices: impl Iterator<Item = &'a k8s_openapi::api::discovery::v1::EndpointSlice>,
) -> u32 {
    let mut seen = std::collections::HashSet::new();
    for e in slices.flat_map(|s| s.endpoints.iter()) {
        if !e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true) {
            continue;
        }
        let key = match &e.target_ref {
            Some(t) => format!(
                "{}/{}/{}",
                t.kind.as_deref().unwrap_or(""),
                t.namespace.as_deref().unwrap_or(""),
                t.name.as_deref().unwrap_or("")
            ),
            None => format!("address {}", e.addresses.first().map_or("", String::as_str)),
        };
        seen.insert(key);
    }
    seen.len() as u32
}

async fn watch_endpoints(shared: Arc<Shared>, client: kube::Client, ns: String, service: String) {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let api: kube::Api<EndpointSlice> = kube::Api::namespaced(client, &ns);
    let (reader, writer) = reflector::store();
    let cfg = watcher::Config::default().labels(&format!("kubernetes.io/service-name={service}"));
    let mut stream = reflector(writer, watcher(api, cfg))
        .default_backoff()
        .boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            // A (re)list reaches the store only when it is done: count then,
            // not on each of its objects (the store still holds the
            // previous list, empty at start-up).
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "watching the gateway's EndpointSlices failed; keeping the replica count");
                continue;
            }
            // InitDone, Apply, Delete: the store is whole.
            Ok(_) => {}
        }
        let ready = ready_endpoints(reader.state().iter().map(|s| s.as_ref()));
        // No ready endpoint (none yet, or no slices): this replica counts
        // itself; a Service routes only to ready endpoints.
        let n = ready.max(1);
        let now = shared.now();
        let mut st = shared.state.lock().expect("not poisoned");
        st.replicas_known = true;
        if st.replicas == n {
            continue;
        }
        tracing::info!(
            from = st.replicas,
            to = n,
            "gateway replicas changed; re-sharing the rates"
        );
        st.replicas = n;
        shared.metrics.replicas.set(i64::from(n));
        let share = 1.0 / f64::from(n);
        let last_good = st.last_good.clone();
        if let (Some(core), Some(cfg)) = (st.core.as_mut(), last_good) {
            match core.swap(cfg, share, now, unix_now()) {
                Ok(refused) => {
                    for (ticket, r) in refused {
                        if let Some(tx) = st.waiters.remove(&ticket) {
                            let _ = tx.send(r);
                        }
                    }
                }
                Err(e) => tracing::error!(error = %e, "re-sharing the config failed"),
            }
        }
        drop(st);
        shared.wake.notify_one();
    }
}

/// Resolves queued requests when their turn comes or their wait runs out.
async fn drive(shared: Arc<Shared>) {
    loop {
        let wake = {
            let now = shared.now();
            let mut st = shared.state.lock().expect("not poisoned");
            let Admission { core, waiters, .. } = &mut *st;
            match core.as_mut() {
                Some(core) => {
                    for (ticket, r) in core.poll(now) {
                        // A send fails only when the client went away as its
                        // turn came: nothing is started for it.
                        if let Some(tx) = waiters.remove(&ticket) {
                            let _ = tx.send(r);
                        }
                    }
                    for (i, name) in core.lane_names().enumerate() {
                        shared
                            .metrics
                            .queue_depth
                            .with_label_values(&[name])
                            .set(core.queue_depth(i) as i64);
                    }
                    for p in ["normal", "conserve", "stop"] {
                        shared
                            .metrics
                            .pressure
                            .with_label_values(&[p])
                            .set(i64::from(core.pressure().as_str() == p));
                    }
                    core.next_wake(now).map(|t| (t - now).max(0.0))
                }
                None => None,
            }
        };
        let sleep = wake.map_or(Duration::from_millis(250), |s| {
            Duration::from_secs_f64(s.min(0.25)).max(Duration::from_micros(200))
        });
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = shared.wake.notified() => {}
        }
    }
}

async fn metrics_page(State(shared): State<Arc<Shared>>) -> Response {
    let mut buf = Vec::new();
    let families = shared.metrics.registry.gather();
    if let Err(e) = TextEncoder::new().encode(&families, &mut buf) {
        return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            TextEncoder::new().format_type().to_owned(),
        )],
        buf,
    )
        .into_response()
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    let st = shared.state.lock().expect("not poisoned");
    if st.core.is_none() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no lanes.json loaded yet\n",
        )
            .into_response()
    } else if !st.replicas_known {
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

/// An OpenAI-style error response.
fn error(status: StatusCode, kind: &str, code: &str, message: String) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "code": code}});
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    )
        .into_response()
}

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// Gives a queued ticket back if the client goes away while it waits.
struct WaitGuard<'a> {
    shared: &'a Shared,
    ticket: Option<Ticket>,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.ticket {
            let mut st = self.shared.state.lock().expect("not poisoned");
            st.waiters.remove(&t);
            if let Some(core) = st.core.as_mut() {
                core.cancel(t);
            }
        }
    }
}

/// Counts a request in flight until its response body ends (or is dropped).
struct InFlightGuard {
    shared: Arc<Shared>,
    started: Instant,
    latency: Option<f64>,
    lane: String,
    deadline: Option<Instant>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let now = self.shared.now();
        let latency = self
            .latency
            .unwrap_or_else(|| self.started.elapsed().as_secs_f64());
        if self.deadline.is_some_and(|d| Instant::now() > d) {
            self.shared
                .metrics
                .deadline_misses
                .with_label_values(&[&self.lane])
                .inc();
        }
        self.shared.metrics.in_flight.dec();
        let mut st = self.shared.state.lock().expect("not poisoned");
        if let Some(core) = st.core.as_mut() {
            core.finished(now, latency);
        }
    }
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let arrived = Instant::now();
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let lane_header = shared.args.lane_header.as_str();

    // Which lane, and is there a config at all?
    let lane_name = header_str(headers, lane_header).map(str::to_owned);
    let known: Vec<String> = {
        let st = shared.state.lock().expect("not poisoned");
        match &st.core {
            None => {
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "lanekeeper_no_config",
                    "no_config",
                    "the gateway has no lanes.json loaded yet (see its log): it admits nothing until it has one".to_owned(),
                );
            }
            Some(core) => match &lane_name {
                Some(l) if core.lane_index(l).is_some() => Vec::new(),
                _ => core.lane_names().map(str::to_owned).collect(),
            },
        }
    };
    let Some(lane_name) = lane_name.filter(|_| known.is_empty()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "unknown_lane",
            format!(
                "the {lane_header} header must name a lane of this gateway; it was {}; known lanes: {}",
                header_str(headers, lane_header).map_or("missing".to_owned(), |v| format!("{v:?}")),
                known.join(", ")
            ),
        );
    };

    // The body, within the limit (before taking a token for it).
    let limit = shared.args.max_body_bytes;
    let body = match http_body_util::Limited::new(body, limit).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let too_big = e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some();
            return if too_big {
                error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    "body_too_large",
                    format!("lane {lane_name}: the request body is larger than {limit} bytes"),
                )
            } else {
                error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "body_unreadable",
                    format!("lane {lane_name}: the request body could not be read: {e}"),
                )
            };
        }
    };

    let tenant = header_str(headers, &shared.args.tenant_header).map(str::to_owned);
    let attempt_header =
        header_str(headers, "x-lanekeeper-attempt").and_then(|v| v.parse::<u32>().ok());
    let request_id = header_str(headers, "idempotency-key")
        .or_else(|| header_str(headers, "x-request-id"))
        .map(str::to_owned);
    let tenant_class = if tenant.is_some() { "named" } else { "default" };

    // Decide.
    let (verdict, rx, enforcing) = {
        let now = shared.now();
        let mut st = shared.state.lock().expect("not poisoned");
        let Admission { core, waiters, .. } = &mut *st;
        let core = core.as_mut().expect("checked above");
        let verdict = core.admit(
            &AdmissionRequest {
                lane: &lane_name,
                tenant: tenant.as_deref(),
                attempt: attempt_header,
                request_id: request_id.as_deref(),
            },
            now,
        );
        let enforcing = core.enforcing();
        let mut rx = None;
        if let Verdict::Queued { ticket, .. } = &verdict {
            if enforcing {
                let (tx, r) = oneshot::channel();
                waiters.insert(*ticket, tx);
                rx = Some((*ticket, r));
            } else {
                core.cancel(*ticket);
            }
        }
        (verdict, rx, enforcing)
    };
    if rx.is_some() {
        shared.wake.notify_one();
    }
    let count = |attempt: Attempt, outcome: Outcome| {
        if enforcing {
            shared
                .metrics
                .requests
                .with_label_values(&[&lane_name, tenant_class, attempt.as_str(), outcome.as_str()])
                .inc();
        } else {
            shared
                .metrics
                .shadow
                .with_label_values(&[&lane_name, attempt.as_str(), outcome.as_str()])
                .inc();
        }
    };
    // The lane went away with a config swap between the lookup and here.
    let lane_gone = || {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "unknown_lane",
            format!("lane {lane_name} is gone"),
        )
    };
    let pass = if !enforcing {
        // Observe: count what enforcing would have done, admit as before.
        let attempt = match &verdict {
            Verdict::Pass(p) => p.attempt,
            Verdict::Queued { attempt, .. } => *attempt,
            Verdict::Refuse(r) => r.attempt,
            Verdict::UnknownLane => Attempt::Original,
        };
        if let Some(o) = verdict.outcome() {
            count(attempt, o);
        }
        shared
            .metrics
            .requests
            .with_label_values(&[&lane_name, tenant_class, attempt.as_str(), "admitted"])
            .inc();
        let lane = {
            let st = shared.state.lock().expect("not poisoned");
            st.core.as_ref().and_then(|c| c.lane_index(&lane_name))
        };
        let Some(lane) = lane else {
            return lane_gone();
        };
        Pass {
            lane,
            attempt,
            history_turns: None,
            remaining_seconds: f64::INFINITY,
            waited_seconds: 0.0,
        }
    } else {
        match verdict {
            Verdict::Pass(p) => {
                count(p.attempt, Outcome::Admitted);
                p
            }
            Verdict::Refuse(r) => {
                count(r.attempt, r.outcome);
                return refusal(&lane_name, &r);
            }
            Verdict::UnknownLane => return lane_gone(),
            Verdict::Queued { attempt, .. } => {
                count(attempt, Outcome::Queued);
                let (ticket, rx) = rx.expect("a waiter for a queued request");
                let mut guard = WaitGuard {
                    shared: &shared,
                    ticket: Some(ticket),
                };
                let resolution = rx.await;
                guard.ticket = None;
                drop(guard);
                match resolution {
                    Ok(Resolution::Pass(p)) => {
                        count(p.attempt, Outcome::Admitted);
                        shared
                            .metrics
                            .wait
                            .with_label_values(&[&lane_name])
                            .observe(p.waited_seconds);
                        p
                    }
                    Ok(Resolution::Refuse(r)) => {
                        count(r.attempt, r.outcome);
                        return refusal(&lane_name, &r);
                    }
                    Err(_) => {
                        return error(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "lanekeeper_unavailable",
                            "queue_dropped",
                            format!(
                                "lane {lane_name}: the request's place in the queue was lost (config change)"
                            ),
                        );
                    }
                }
            }
        }
    };
    forward(
        shared.clone(),
        parts,
        body,
        pass,
        &lane_name,
        tenant_class,
        arrived,
    )
    .await
}

/// A 429 saying which limit of which lane, with `Retry-After` and, for a
/// deferral, `Lanekeeper-Deferred: true`.
fn refusal(lane: &str, r: &Refusal) -> Response {
    let (kind, message) = if r.deferred() {
        (
            "lanekeeper_deferred",
            format!(
                "lane {lane}: deferred; the work is wanted later, come back after Retry-After with the same request id"
            ),
        )
    } else {
        (
            "rate_limit_exceeded",
            format!(
                "lane {lane}: refused by {} ({})",
                r.limit,
                r.outcome.as_str()
            ),
        )
    };
    let mut resp = error(
        StatusCode::TOO_MANY_REQUESTS,
        kind,
        r.outcome.as_str(),
        message,
    );
    if let Some(s) = r.retry_after_seconds {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s.max(1)));
    }
    if r.deferred() {
        resp.headers_mut()
            .insert("lanekeeper-deferred", HeaderValue::from_static("true"));
    }
    resp
}

const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

async fn forward(
    shared: Arc<Shared>,
    parts: axum::http::request::Parts,
    body: Bytes,
    pass: Pass,
    lane_name: &str,
    tenant_class: &'static str,
    arrived: Instant,
) -> Response {
    let (route, flags, history_turns) = {
        let st = shared.state.lock().expect("not poisoned");
        let Some(core) = st.core.as_ref() else {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "lanekeeper_no_config",
                "no_config",
                "no config".to_owned(),
            );
        };
        let lane = core.lane(pass.lane);
        (
            lane.routes.first().cloned(),
            core.config().flags.clone(),
            pass.history_turns,
        )
    };
    let Some(route) = route else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "lanekeeper_no_route",
            "no_route",
            format!("lane {lane_name} has no route in lanes.json"),
        );
    };
    let Some(base) = shared.routes.get(&route) else {
        return error(
            StatusCode::BAD_GATEWAY,
            "lanekeeper_no_route",
            "unknown_route",
            format!("lane {lane_name}: route {route:?} has no --route {route}=URL on this gateway"),
        );
    };
    // Optional context: trim the chat history to the turns in force.
    let mut body = body;
    if let Some(turns) = history_turns
        && parts.uri.path().ends_with("/chat/completions")
        && let Ok(mut v) = serde_json::from_slice::<Value>(&body)
        && trim_chat_history(&mut v, turns)
    {
        body = Bytes::from(serde_json::to_vec(&v).expect("JSON serializes"));
    }
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri: axum::http::Uri = match format!("{base}{path}").parse() {
        Ok(u) => u,
        Err(e) => {
            return error(
                StatusCode::BAD_GATEWAY,
                "lanekeeper_bad_route",
                "bad_route",
                format!("lane {lane_name}: route {route}: {e}"),
            );
        }
    };
    let mut out = axum::http::Request::builder()
        .method(parts.method.clone())
        .uri(uri);
    let headers = out.headers_mut().expect("builder is fine");
    for (k, v) in &parts.headers {
        if !HOP_BY_HOP.contains(&k.as_str()) && k != header::CONTENT_LENGTH {
            headers.append(k.clone(), v.clone());
        }
    }
    headers.insert(
        "x-lanekeeper-attempt-kind",
        HeaderValue::from_static(pass.attempt.as_str()),
    );
    if flags.read_only {
        headers.insert("x-lanekeeper-read-only", HeaderValue::from_static("true"));
    }
    if flags.static_fallback {
        headers.insert(
            "x-lanekeeper-static-fallback",
            HeaderValue::from_static("true"),
        );
    }
    let out = match out.body(Full::new(body)) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "bad_request",
                e.to_string(),
            );
        }
    };

    let remaining = Duration::from_secs_f64(
        (pass.remaining_seconds - arrived.elapsed().as_secs_f64()).clamp(0.001, 86_400.0 * 7.0),
    );
    let deadline = pass
        .remaining_seconds
        .is_finite()
        .then(|| Instant::now() + remaining);
    {
        let now = shared.now();
        let mut st = shared.state.lock().expect("not poisoned");
        if let Some(core) = st.core.as_mut() {
            core.started(now);
        }
    }
    shared.metrics.in_flight.inc();
    let mut guard = InFlightGuard {
        shared: shared.clone(),
        started: Instant::now(),
        latency: None,
        lane: lane_name.to_owned(),
        deadline,
    };
    let upstream_error = || {
        shared
            .metrics
            .requests
            .with_label_values(&[
                lane_name,
                tenant_class,
                pass.attempt.as_str(),
                "upstream_error",
            ])
            .inc();
    };
    let sent = Instant::now();
    let response = match tokio::time::timeout(remaining, shared.client.request(out)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            upstream_error();
            return error(
                StatusCode::BAD_GATEWAY,
                "lanekeeper_upstream_error",
                "upstream_error",
                format!(
                    "lane {lane_name}: route {route} is unreachable: {e} (the gateway does not retry)"
                ),
            );
        }
        Err(_) => {
            upstream_error();
            return error(
                StatusCode::GATEWAY_TIMEOUT,
                "lanekeeper_upstream_timeout",
                "deadline",
                format!(
                    "lane {lane_name}: route {route} did not answer within the request's remaining deadline ({:.3} s)",
                    remaining.as_secs_f64()
                ),
            );
        }
    };
    let latency = sent.elapsed().as_secs_f64();
    guard.latency = Some(latency);
    shared
        .metrics
        .upstream
        .with_label_values(&[lane_name])
        .observe(latency);
    if response.status().is_server_error() {
        upstream_error();
    }
    let (mut head, incoming) = response.into_parts();
    for h in HOP_BY_HOP {
        head.headers.remove(h);
    }
    // Stream the body through unbuffered; stop at the deadline; the guard
    // counts the request in flight until the body ends or the client goes
    // away (dropping the stream drops the upstream connection: cancelled).
    let until = tokio::time::sleep_until(tokio::time::Instant::from_std(
        deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 7)),
    ));
    let stream = incoming
        .into_data_stream()
        .take_until(until)
        .map(move |chunk| {
            let _keep = &guard;
            chunk
        });
    Response::from_parts(head, Body::from_stream(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_endpoints_count_each_pod_once_across_address_families() {
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        let slice = |family: &str, eps: serde_json::Value| -> EndpointSlice {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("gw-{family}")},
                "addressType": family,
                "endpoints": eps,
            }))
            .unwrap()
        };
        let ep = |addr: &str, pod: Option<&str>, ready: Option<bool>| {
            let mut e = serde_json::json!({"addresses": [addr]});
            if let Some(p) = pod {
                e["targetRef"] = serde_json::json!({"kind": "Pod", "namespace": "ns", "name": p});
            }
            if let Some(r) = ready {
                e["conditions"] = serde_json::json!({"ready": r});
            }
            e
        };
        let v4 = slice(
            "IPv4",
            serde_json::json!([
                ep("10.0.0.1", Some("gw-a"), Some(true)),
                ep("10.0.0.2", Some("gw-b"), None),
                ep("10.0.0.3", Some("gw-c"), Some(false)),
                ep("10.0.0.9", None, Some(true)),
            ]),
        );
        let v6 = slice(
            "IPv6",
            serde_json::json!([
                ep("fd00::1", Some("gw-a"), Some(true)),
                ep("fd00::2", Some("gw-b"), Some(true)),
                ep("fd00::3", Some("gw-c"), Some(false)),
            ]),
        );
        // gw-a, gw-b (ready when the condition is missing) and the address
        // without a target; gw-c is not ready; each pod once over both
        // families.
        assert_eq!(ready_endpoints([&v4, &v6].into_iter()), 3);
        assert_eq!(ready_endpoints([&v4].into_iter()), 3);
        assert_eq!(ready_endpoints(std::iter::empty()), 0);
    }

    #[test]
    fn routes_parse_as_name_equals_http_url() {
        assert_eq!(
            parse_route("agent-large=http://127.0.0.1:8000/").unwrap(),
            ("agent-large".to_owned(), "http://127.0.0.1:8000".to_owned())
        );
        assert!(parse_route("agent-large").is_err());
        assert!(parse_route("=http://x").is_err());
        assert!(parse_route("a=https://x").is_err());
    }

    #[test]
    fn namespaced_flags_need_a_slash() {
        assert!(split_namespaced("--configmap", "ns/name").is_ok());
        assert!(split_namespaced("--configmap", "name").is_err());
        assert!(split_namespaced("--configmap", "/name").is_err());
    }
}
