//! The flags of `lanekeeper gateway` and the errors that stop it starting.

use std::net::SocketAddr;
use std::path::PathBuf;

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
    /// Address to serve requests on.
    #[arg(
        long,
        env = "LANEKEEPER_GATEWAY_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    pub listen: SocketAddr,
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

impl GatewayError {
    /// Whether the error is in the flags (exit code 2), not the environment.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            GatewayError::NoConfigSource
                | GatewayError::NotNamespaced { .. }
                | GatewayError::Header(_)
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
        assert!(parse_route("pool=https://x").is_err());
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
