//! The flags of `lanekeeper gateway` and the errors that stop it starting.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::http::HeaderName;

use super::surface::{AllowedPath, parse_allowed};

/// Flags of `lanekeeper gateway`; each also from an environment variable.
/// A config source is required: `--config FILE` or `--configmap NS/NAME`.
#[derive(clap::Args, Debug, Clone)]
#[command(group(
    clap::ArgGroup::new("source")
        .required(true)
        .args(["config", "configmap"]),
))]
pub struct GatewayArgs {
    /// Address to serve requests on (loopback unless given: a pod passes
    /// `0.0.0.0:PORT`, as the chart does).
    #[arg(
        long,
        env = "LANEKEEPER_GATEWAY_LISTEN",
        default_value = "127.0.0.1:8080"
    )]
    pub listen: SocketAddr,
    /// Connections: timeouts, limits and the file-descriptor reserve.
    #[command(flatten)]
    pub conn: ConnArgs,
    /// TLS towards clients and towards the routes, and routes' credentials.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// A mounted `lanes.json`, reloaded when its contents change (this or
    /// `--configmap` is required).
    #[arg(long, env = "LANEKEEPER_GATEWAY_CONFIG", conflicts_with = "configmap")]
    pub config: Option<PathBuf>,
    /// The ConfigMap `NAMESPACE/NAME` holding `lanes.json`, watched through
    /// the API and reloaded on change (this or `--config` is required).
    #[arg(long, env = "LANEKEEPER_GATEWAY_CONFIGMAP")]
    pub configmap: Option<String>,
    /// `NAME=URL`: the upstream base URL of a route named in `lanes.json`
    /// (repeat the flag; the environment variable takes a comma-separated
    /// list).
    #[arg(long = "route", env = "LANEKEEPER_GATEWAY_ROUTES", value_delimiter = ',', value_parser = parse_route)]
    pub routes: Vec<(String, String)>,
    /// `ROUTE=FILE`: a model's `tokenizer.json` (Hugging Face's format) for
    /// the route named ROUTE (a `--route`): the input tokens of a request
    /// of a lane on that route are counted with it instead of estimated
    /// from the body's bytes (repeat the flag; the environment variable
    /// takes a comma-separated list). Loaded at start.
    #[arg(long = "tokenizer", env = "LANEKEEPER_GATEWAY_TOKENIZERS", value_delimiter = ',', value_parser = parse_tokenizer)]
    pub tokenizers: Vec<(String, PathBuf)>,
    /// Address of `/metrics`, `/healthz` and `/readyz` (loopback unless
    /// given).
    #[arg(
        long,
        env = "LANEKEEPER_GATEWAY_METRICS_ADDR",
        default_value = "127.0.0.1:9090"
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
    /// The most bytes all request bodies together may hold at once (503
    /// `body_memory_full` beyond; a quarter is kept for the lanes of the
    /// highest priority). At least `--max-body-bytes`.
    #[arg(long, env = "LANEKEEPER_GATEWAY_MAX_BODY_MEMORY_BYTES", default_value_t = 256 << 20)]
    pub max_body_memory_bytes: usize,
    /// How often a `--config` file is checked for changes, in milliseconds.
    #[arg(long, env = "LANEKEEPER_GATEWAY_RELOAD_MILLIS", default_value_t = 500)]
    pub reload_millis: u64,
    /// Another path to forward besides the OpenAI-compatible inference
    /// paths: `PATH` (POST) or `GET PATH` / `POST PATH`, matched exactly
    /// (repeat the flag; the environment variable takes a comma-separated
    /// list). Every other path is 404, every other method 405.
    #[arg(long = "allow-path", env = "LANEKEEPER_GATEWAY_ALLOW_PATHS", value_delimiter = ',', value_parser = parse_allowed)]
    pub allow_paths: Vec<AllowedPath>,
    /// Log one admission in N as a decision line (0: none).
    #[arg(
        long,
        env = "LANEKEEPER_GATEWAY_DECISION_LOG_SAMPLE",
        default_value_t = 100
    )]
    pub decision_log_sample: u64,
    /// Log at most this many refusals a second as decision lines; the rest
    /// are counted and the count is written on the next line.
    #[arg(
        long,
        env = "LANEKEEPER_GATEWAY_DECISION_LOG_REFUSALS_PER_SECOND",
        default_value_t = 50
    )]
    pub decision_log_refusals_per_second: u32,
    /// Tokio worker threads (default: one per core).
    #[arg(long, env = "LANEKEEPER_GATEWAY_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// Who may use a lane: credentials, or `--trust-lane-header`.
    #[command(flatten)]
    pub identity: super::identity::IdentityArgs,
    /// The fleet's shared state (`--shared-state`).
    #[command(flatten)]
    pub fleet: super::fleet_args::FleetArgs,
}

impl GatewayArgs {
    /// Client headers only the gateway may set besides `x-lanekeeper-*`:
    /// the lane and tenant headers' configured names.
    pub(super) fn private_headers(&self) -> Vec<HeaderName> {
        [&self.lane_header, &self.tenant_header]
            .into_iter()
            .filter_map(|h| HeaderName::try_from(h.as_str()).ok())
            .collect()
    }
}

/// How long each stage of a client connection may take, how many
/// connections may be open, and how many file descriptors stay in reserve.
#[derive(clap::Args, Debug, Clone)]
pub struct ConnArgs {
    /// Seconds a client has to send a request's headers, from the
    /// connection's start (TLS handshake included) or from the first byte of
    /// a later request; then the connection is closed.
    #[arg(long, env = "LANEKEEPER_GATEWAY_HEADER_READ_TIMEOUT_SECONDS", default_value = "10", value_parser = parse_seconds)]
    pub header_read_timeout_seconds: Duration,
    /// Seconds a keep-alive connection may wait for its next request.
    #[arg(long, env = "LANEKEEPER_GATEWAY_IDLE_TIMEOUT_SECONDS", default_value = "75", value_parser = parse_seconds)]
    pub idle_timeout_seconds: Duration,
    /// Seconds a client has to send a request's whole body once its headers
    /// are in (408 beyond).
    #[arg(long, env = "LANEKEEPER_GATEWAY_BODY_READ_TIMEOUT_SECONDS", default_value = "30", value_parser = parse_seconds)]
    pub body_read_timeout_seconds: Duration,
    /// The most client connections open at once (default, and upper bound:
    /// what the file-descriptor limit allows after `--fd-reserve`).
    #[arg(long, env = "LANEKEEPER_GATEWAY_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// File descriptors kept free for the config watcher, the Kubernetes
    /// client, the metrics listener and logging.
    #[arg(long, env = "LANEKEEPER_GATEWAY_FD_RESERVE", default_value_t = 64)]
    pub fd_reserve: u64,
    /// Seconds in-flight requests get to finish after SIGTERM.
    #[arg(long, env = "LANEKEEPER_GATEWAY_SHUTDOWN_GRACE_SECONDS", default_value = "25", value_parser = parse_seconds)]
    pub shutdown_grace_seconds: Duration,
}

/// TLS towards clients (with optional client certificates) and towards the
/// routes, and each route's own upstream credential.
#[derive(clap::Args, Debug, Clone)]
pub struct TlsArgs {
    /// PEM certificate chain served to clients (with `--tls-key`); re-read
    /// when it changes.
    #[arg(long, env = "LANEKEEPER_GATEWAY_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, env = "LANEKEEPER_GATEWAY_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle that client certificates must chain to (mTLS).
    #[arg(long, env = "LANEKEEPER_GATEWAY_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Whether a client certificate is required or optional with
    /// `--tls-client-ca`.
    #[arg(long, env = "LANEKEEPER_GATEWAY_TLS_CLIENT_CERT", value_enum, default_value_t = ClientCert::Required)]
    pub tls_client_cert: ClientCert,
    /// PEM CA bundle for `https://` routes (default: the public web roots).
    #[arg(long, env = "LANEKEEPER_GATEWAY_UPSTREAM_CA")]
    pub upstream_ca: Option<PathBuf>,
    /// `NAME=FILE`: a file holding a bearer token sent as `Authorization` to
    /// route NAME only; re-read when it changes (repeat the flag; the
    /// environment variable takes a comma-separated list).
    #[arg(long = "route-credential", env = "LANEKEEPER_GATEWAY_ROUTE_CREDENTIALS", value_delimiter = ',', value_parser = parse_credential)]
    pub route_credentials: Vec<(String, PathBuf)>,
}

/// Whether a client certificate is required with `--tls-client-ca`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCert {
    /// A handshake without a certificate chaining to the CA is refused.
    Required,
    /// A client may send none; one it sends must chain to the CA.
    Optional,
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(v > 0.0 && v <= 86_400.0) {
        return Err(format!("{s:?}: seconds must be above 0 and at most 86400"));
    }
    Ok(Duration::from_secs_f64(v))
}

/// `NAME=FILE` of a per-route flag (`what`: the flag, for its error).
fn parse_route_file(s: &str, what: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, file)) if !name.is_empty() && !file.is_empty() => {
            Ok((name.to_owned(), PathBuf::from(file)))
        }
        _ => Err(format!("{what} {s:?} is not NAME=FILE")),
    }
}

fn parse_credential(s: &str) -> Result<(String, PathBuf), String> {
    parse_route_file(s, "route credential")
}

fn parse_tokenizer(s: &str) -> Result<(String, PathBuf), String> {
    parse_route_file(s, "tokenizer")
}

fn parse_route(s: &str) -> Result<(String, String), String> {
    let (name, url) = s
        .split_once('=')
        .ok_or_else(|| format!("route {s:?} is not NAME=URL"))?;
    let url = url.trim_end_matches('/');
    if name.is_empty() || !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!(
            "route {s:?}: need a name and an http:// or https:// base URL"
        ));
    }
    url.parse::<axum::http::Uri>()
        .map_err(|e| format!("route {s:?}: {e}"))?;
    Ok((name.to_owned(), url.to_owned()))
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
    /// A TLS file (certificate, key, CA bundle) is unreadable or invalid.
    #[error("TLS: {0}")]
    Tls(String),
    /// A `--route-credential` names no `--route` or its file is unreadable.
    #[error("route credential: {0}")]
    Credential(String),
    /// The file-descriptor limit leaves too few connections after the
    /// reserve.
    #[error("file descriptors: {0}")]
    FdLimit(String),
    /// `--shared-state` or its password file is unusable.
    #[error("shared state: {0}")]
    SharedState(String),
    /// A `--tokenizer` names no `--route` or its file does not load.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// `--max-body-memory-bytes` below `--max-body-bytes`.
    #[error(
        "--max-body-memory-bytes {memory} is below --max-body-bytes {body}: no body of the largest size could be held"
    )]
    BodyMemory {
        /// `--max-body-memory-bytes`.
        memory: usize,
        /// `--max-body-bytes`.
        body: usize,
    },
}

impl GatewayError {
    /// Whether the error is in the flags (exit code 2), not the environment.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            GatewayError::NoConfigSource
                | GatewayError::NotNamespaced { .. }
                | GatewayError::Header(_)
                | GatewayError::Credential(_)
                | GatewayError::SharedState(_)
                | GatewayError::Tokenizer(_)
                | GatewayError::BodyMemory { .. }
        )
    }
}

/// `NAMESPACE/NAME` split, or the flag's error.
pub(super) fn split_namespaced(
    flag: &'static str,
    v: &str,
) -> Result<(String, String), GatewayError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse_as_name_equals_http_url() {
        assert_eq!(
            parse_route("pool=http://pool:8000/").unwrap(),
            ("pool".to_owned(), "http://pool:8000".to_owned())
        );
        assert!(parse_route("pool").is_err());
        assert!(parse_route("=http://x").is_err());
        assert_eq!(
            parse_route("pool=https://pool:8443").unwrap().1,
            "https://pool:8443"
        );
        assert!(parse_route("pool=ftp://x").is_err());
    }

    #[test]
    fn seconds_and_credentials_parse() {
        assert_eq!(parse_seconds("0.5").unwrap(), Duration::from_millis(500));
        for bad in ["0", "-1", "abc", "NaN", "inf", "100000"] {
            assert!(parse_seconds(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_credential("pool=/var/run/token").unwrap(),
            ("pool".to_owned(), PathBuf::from("/var/run/token"))
        );
        for bad in ["pool", "=f", "pool="] {
            assert!(parse_credential(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn namespaced_flags_need_a_slash() {
        assert!(split_namespaced("--configmap", "ns/name").is_ok());
        for bad in ["name", "/name", "ns/"] {
            assert!(split_namespaced("--configmap", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_config_source_is_required() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: GatewayArgs,
        }
        let err = Cli::try_parse_from(["gw", "--route", "p=http://x"])
            .err()
            .expect("no source is an error");
        assert!(err.to_string().contains("--config"), "{err}");
        assert!(Cli::try_parse_from(["gw", "--config", "lanes.json"]).is_ok());
    }
}
