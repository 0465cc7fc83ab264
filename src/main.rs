#![forbid(unsafe_code)]
//! The `lanekeeper` command.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use lanekeeper::controller;
use lanekeeper::manifest;
use lanekeeper::plan;
use lanekeeper::policy::Approvals;
use lanekeeper::signals::prometheus::PrometheusError;
use lanekeeper::sim;
use lanekeeper::snapshot::SignalsFile;

/// mimalloc with `--features mimalloc`, for `benches/gateway_load.sh`'s
/// comparison; the system allocator by default (docs/performance.md, "The
/// gateway under load": mimalloc saved ~8 % of the gateway's CPU per
/// request but took ~1.5× the resident memory).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Why a command failed; [`CliError::exit_code`] is the process' exit code
/// and the Display text follows `error: ` on stderr.
#[derive(Debug, thiserror::Error)]
enum CliError {
    /// The manifests could not be loaded.
    #[error(transparent)]
    Manifests(#[from] manifest::LoadError),
    /// `--approve` without `NAMESPACE/PROFILE=`.
    #[error("--approve {item:?}: expected NAMESPACE/PROFILE=LEVEL or NAMESPACE/PROFILE=LEVEL@T")]
    ApproveSyntax { item: String },
    /// `--approve` with a LEVEL that is not a number.
    #[error("--approve {item:?}: LEVEL (and T) must be whole numbers")]
    ApproveLevel {
        item: String,
        #[source]
        source: std::num::ParseIntError,
    },
    /// `--signals` could not be read, parsed or used.
    #[error(transparent)]
    Signals(#[from] lanekeeper::snapshot::SignalsFileError),
    /// `--at`, `--from` or `--to` is not a time.
    #[error("--{flag} {value:?}: expected RFC 3339 or Unix seconds: {source}")]
    Time {
        flag: &'static str,
        value: String,
        #[source]
        source: k8s_openapi::jiff::Error,
    },
    /// `--step` has an unknown unit.
    #[error("--step {value:?}: expected e.g. 60s, 5m or 1h")]
    StepUnit { value: String },
    /// `--step` is not a positive number of units.
    #[error("--step {value:?}: expected a positive duration")]
    StepValue { value: String },
    /// `--step` in seconds does not fit in 64 bits.
    #[error("--step {value:?}: too large: a step is at most {} seconds", i64::MAX)]
    StepTooLarge { value: String },
    /// `plan --prometheus` could not set up its queries.
    #[error("--prometheus {url}: {source}")]
    Prometheus {
        url: String,
        #[source]
        source: PrometheusError,
    },
    /// `--metrics-addr` or `--health-addr` is not an address (the text is
    /// the controller's).
    #[error("--{flag}: {source}")]
    Addr {
        flag: &'static str,
        #[source]
        source: controller::http::AddrError,
    },
    /// The JSON output could not be produced.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The async runtime could not start.
    #[error(transparent)]
    Runtime(std::io::Error),
    /// No Kubernetes client.
    #[error("cannot reach the cluster (kubeconfig or in-cluster config): {0}")]
    Cluster(#[source] kube::Error),
    /// The operator stopped with an error.
    #[error(transparent)]
    Controller(#[from] controller::Error),
    /// `crdgen --out-dir` could not write.
    #[error("{}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `simulate` or `diff` failed.
    #[error(transparent)]
    Sim(#[from] sim::cli::CliError),
    /// `gateway` could not start or stopped with an error.
    #[error(transparent)]
    Gateway(#[from] lanekeeper::gateway::GatewayError),
    /// `calibration-hash -f` could not be read or parsed.
    #[error("{path}: {reason}")]
    HashInput { path: String, reason: String },
    /// `calibration-hash -f` holds no object with a pod template.
    #[error("{path}: no pod template to hash: {reasons}")]
    NoPodTemplate { path: String, reasons: String },
    /// The output could not be written to stdout.
    #[error("writing to stdout: {0}")]
    Stdout(#[source] std::io::Error),
}

impl CliError {
    /// 2 for bad input, 3 when the CRDs are not installed, 1 otherwise.
    fn exit_code(&self) -> u8 {
        match self {
            CliError::Manifests(_)
            | CliError::ApproveSyntax { .. }
            | CliError::ApproveLevel { .. }
            | CliError::Signals(_)
            | CliError::Time { .. }
            | CliError::StepUnit { .. }
            | CliError::StepValue { .. }
            | CliError::StepTooLarge { .. }
            | CliError::Prometheus { .. }
            | CliError::Addr { .. }
            | CliError::HashInput { .. }
            | CliError::NoPodTemplate { .. } => 2,
            CliError::Controller(controller::Error::CrdsMissing(_)) => 3,
            CliError::Json(_)
            | CliError::Runtime(_)
            | CliError::Cluster(_)
            | CliError::Controller(_)
            | CliError::Write { .. }
            | CliError::Stdout(_) => 1,
            CliError::Sim(e) => e.exit_code(),
            CliError::Gateway(e) if e.is_usage() => 2,
            CliError::Gateway(_) => 1,
        }
    }

    /// Whoever read stdout closed it (`lanekeeper crdgen | head -1`): not
    /// an error worth a word.
    fn is_broken_pipe(&self) -> bool {
        let io = match self {
            CliError::Stdout(e) | CliError::Sim(sim::cli::CliError::Stdout(e)) => e,
            _ => return false,
        };
        io.kind() == std::io::ErrorKind::BrokenPipe
    }
}

/// lanekeeper: traffic lanes, capacity profiles and degradation ladders for
/// shared GPU inference pools.
#[derive(Parser)]
#[command(name = "lanekeeper", version, about, long_about = None)]
struct Cli {
    /// Log format on stderr, for the commands that log (`run`, `gateway`):
    /// text (coloured only when stderr is a terminal) or JSON, one object
    /// a line.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "LANEKEEPER_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the three CustomResourceDefinitions as YAML (or write one file
    /// per CRD with --out-dir).
    Crdgen {
        /// Write `<crd-name>.yaml` files into this directory instead of
        /// printing.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Run the operator against a cluster (kubeconfig or in-cluster config).
    Run(RunArgs),
    /// Evaluate manifests offline against a signal timeline and print the
    /// decisions (no cluster needed).
    Plan(PlanArgs),
    /// Print the Prometheus recording and alerting rules (a rule file) for
    /// every lane with an objective: burn rates, budget remaining and
    /// multi-window burn-rate alerts.
    Rules(RulesArgs),
    /// Simulate traffic through a gateway enforcing the engine's decisions
    /// (or a baseline) and report per-lane outcomes.
    Simulate(lanekeeper::sim::cli::SimulateArgs),
    /// Compare base and head manifests on the same scenarios and signals.
    Diff(lanekeeper::sim::cli::DiffArgs),
    /// The data path: an OpenAI-compatible admission proxy in front of the
    /// pool, enforcing a profile's `lanes.json` (docs/gateway.md).
    Gateway(Box<lanekeeper::gateway::GatewayArgs>),
    /// Print the hash of a workload's pod template, the value of a
    /// CapacityProfile's `capacity.calibration.configHash` (the controller
    /// compares it with the same hash of the scale target).
    CalibrationHash(CalibrationHashArgs),
}

#[derive(clap::Args)]
struct CalibrationHashArgs {
    /// The workload manifest (Deployment, StatefulSet or any object with
    /// `spec.template`; multi-document YAML and `kind: List` are fine), or
    /// `-` for standard input (`kubectl get deploy NAME -o yaml | ...`).
    #[arg(short = 'f', long = "filename")]
    file: PathBuf,
    /// Print the canonical form that is hashed instead of the hash.
    #[arg(long)]
    canonical: bool,
}

/// `calibration-hash`: one line per workload; the hash alone when the input
/// holds one, `HASH  Kind/name` when it holds several.
fn run_calibration_hash(args: &CalibrationHashArgs, out: &mut dyn Write) -> Result<(), CliError> {
    use lanekeeper::api::calibration::{hash, workloads_in_yaml};
    let path = args.file.display().to_string();
    let input = |reason: String| CliError::HashInput {
        path: path.clone(),
        reason,
    };
    let text = if path == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|e| input(e.to_string()))?
    } else {
        std::fs::read_to_string(&args.file).map_err(|e| input(e.to_string()))?
    };
    let found = workloads_in_yaml(&text).map_err(|e| input(e.to_string()))?;
    let (ok, bad): (Vec<_>, Vec<_>) = found.into_iter().partition(|(_, c)| c.is_ok());
    if ok.is_empty() {
        let reasons = bad
            .iter()
            .map(|(w, e)| {
                format!(
                    "{w}: {}",
                    e.as_ref()
                        .err()
                        .map_or_else(String::new, ToString::to_string)
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        return Err(CliError::NoPodTemplate {
            path,
            reasons: if reasons.is_empty() {
                "no object".into()
            } else {
                reasons
            },
        });
    }
    let several = ok.len() > 1;
    for (workload, canonical) in ok {
        let canonical = canonical.unwrap_or_default();
        let value = if args.canonical {
            canonical
        } else {
            hash(&canonical)
        };
        let line = if several {
            format!("{value}  {workload}\n")
        } else {
            format!("{value}\n")
        };
        write_out(out, &line)?;
    }
    Ok(())
}

/// How `run` and `gateway` write their logs.
#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line (for log collectors).
    Json,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Namespace to watch (repeatable). Default: all namespaces.
    #[arg(long = "namespace", value_name = "NAMESPACE")]
    namespaces: Vec<String>,
    /// Address of the Prometheus metrics endpoint (/metrics): loopback
    /// unless given (`:PORT` is every interface, as the chart passes it).
    #[arg(long, default_value = "127.0.0.1:8080")]
    metrics_addr: String,
    /// Address of the health endpoints (/healthz, /readyz): loopback unless
    /// given (`:PORT` is every interface).
    #[arg(long, default_value = "127.0.0.1:8081")]
    health_addr: String,
    /// Seconds between periodic evaluations of every profile (lets
    /// time-based hysteresis advance without events).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..))]
    resync_seconds: u64,
    /// Take a coordination.k8s.io Lease before acting, so only one replica
    /// writes (`--leader-elect=false` to turn off).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Name of the leader Lease.
    #[arg(long, default_value = "lanekeeper")]
    lease_name: String,
    /// Namespace of the leader Lease: the controller's own.
    #[arg(long, env = "POD_NAMESPACE", default_value = "lanekeeper-system")]
    lease_namespace: String,
    /// Lease duration in seconds: a standby takes over within it when the
    /// leader stops renewing.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..))]
    lease_duration_seconds: u64,
    /// This instance's identity in the Lease.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(clap::Args)]
struct RulesArgs {
    /// Manifest files or directories, as `plan` takes them.
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    files: Vec<PathBuf>,
    /// Extra PromQL label matchers for the gateway's series, e.g.
    /// `job="lanekeeper-gateway"`.
    #[arg(long, value_name = "MATCHERS")]
    selector: Option<String>,
}

fn run_rules(args: &RulesArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let loaded = manifest::load(&args.files)?;
    for n in &loaded.notes {
        eprintln!("note: {n}");
    }
    let mut file = lanekeeper::signals::rules::rules(&loaded.world, args.selector.as_deref());
    let selector = args.selector.as_deref().filter(|s| !s.trim().is_empty());
    file.groups
        .extend(lanekeeper::signals::goodput_rule::groups(
            &loaded.world,
            selector,
        ));
    file.groups.extend(lanekeeper::signals::token_rules::groups(
        &loaded.world,
        selector,
    ));
    if file.groups.is_empty() {
        eprintln!(
            "note: no lane has an objective or a cost and no profile reads the gateway's evidence: no rules"
        );
    }
    write_out(out, &lanekeeper::signals::rules::to_yaml(&file))
}

#[derive(clap::Args)]
struct PlanArgs {
    /// Manifest files or directories (multi-document YAML, or a `kind: List`;
    /// other kinds and non-Kubernetes documents are skipped with a note).
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    files: Vec<PathBuf>,
    /// A signals timeline (YAML). Without it: one step at 0 with every
    /// profile at its safe capacity and every lane at its expected rate.
    #[arg(long)]
    signals: Option<PathBuf>,
    /// Read the signals from a live Prometheus at this base URL instead of a
    /// file: each profile's `spec.signals.prometheus.queries` are evaluated
    /// (this URL replaces the profile's own). Profiles without queries are
    /// read through the conventional recording rules (`pool:*`, `lane:*`,
    /// `pod:error_ratio`; see docs/telemetry.md). Signals that were Unknown
    /// are named on stderr.
    #[arg(long, value_name = "URL", conflicts_with = "signals")]
    prometheus: Option<String>,
    /// With --prometheus: evaluate once at this time (RFC 3339 or Unix
    /// seconds; default now).
    #[arg(long, value_name = "TIME", requires = "prometheus", conflicts_with_all = ["from", "to"])]
    at: Option<String>,
    /// With --prometheus: evaluate a range from this time (RFC 3339 or Unix
    /// seconds) ...
    #[arg(long, value_name = "TIME", requires_all = ["prometheus", "to"])]
    from: Option<String>,
    /// ... to this time, inclusive ...
    #[arg(long, value_name = "TIME", requires_all = ["prometheus", "from"])]
    to: Option<String>,
    /// ... every STEP (`60s`, `5m`, `1h` or seconds).
    #[arg(long, value_name = "STEP", default_value = "60s")]
    step: String,
    /// With --prometheus: timeout of one query, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    prometheus_timeout: u64,
    /// Grant approval: NAMESPACE/PROFILE=LEVEL (repeatable).
    #[arg(long = "approve", value_name = "NAMESPACE/PROFILE=LEVEL[@T]")]
    approve: Vec<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: Output,
    /// Also write, for each profile, the `lanes.json` the controller would
    /// publish at the last step (byte for byte its ConfigMap's key), as
    /// DIR/NAMESPACE/CONFIGMAP/lanes.json.
    #[arg(long, value_name = "DIR")]
    emit_gateway_config: Option<PathBuf>,
}

fn parse_approvals(items: &[String]) -> Result<Approvals, CliError> {
    let mut out = Approvals::new();
    for item in items {
        let syntax = || CliError::ApproveSyntax { item: item.clone() };
        let (k, v) = item.split_once('=').ok_or_else(syntax)?;
        if !k.contains('/') {
            return Err(syntax());
        }
        let (level, at) = match v.split_once('@') {
            Some((l, t)) => (l, Some(t)),
            None => (v, None),
        };
        let level: u32 = level.parse().map_err(|source| CliError::ApproveLevel {
            item: item.clone(),
            source,
        })?;
        let given_at = at
            .map(|t| {
                t.parse::<i64>().map_err(|source| CliError::ApproveLevel {
                    item: item.clone(),
                    source,
                })
            })
            .transpose()?;
        out.insert(k.to_owned(), lanekeeper::api::Approval { level, given_at });
    }
    Ok(out)
}

fn run_plan(args: &PlanArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let loaded = manifest::load(&args.files)?;
    for n in &loaded.notes {
        eprintln!("note: {n}");
    }
    let approvals = parse_approvals(&args.approve)?;
    let timeline = match &args.signals {
        Some(path) => SignalsFile::load(path)?,
        None => match &args.prometheus {
            Some(url) => prometheus_timeline(args, url, &loaded.world)?,
            None => {
                if !loaded.world.profiles.is_empty() {
                    eprintln!("{}", plan::DEFAULT_TIMELINE_NOTE);
                }
                plan::default_timeline(&loaded.world)
            }
        },
    };
    if loaded.world.profiles.is_empty() {
        eprintln!("note: no CapacityProfile found: nothing to evaluate");
    }
    for n in plan::unmatched_signal_keys(&loaded.world, &timeline) {
        eprintln!("note: {n}");
    }
    let p = plan::plan(&loaded.world, &timeline, &approvals);
    if let Some(dir) = &args.emit_gateway_config {
        emit_gateway_configs(dir, &plan::emitted(&loaded.world, &p))?;
    }
    let text = match args.output {
        Output::Table => plan::render_table(&p),
        Output::Json => format!("{}\n", serde_json::to_string_pretty(&p)?),
    };
    write_out(out, &text)
}

/// Writes `plan --emit-gateway-config`'s files under `dir`.
fn emit_gateway_configs(
    dir: &std::path::Path,
    configs: &[plan::EmittedConfig],
) -> Result<(), CliError> {
    for c in configs {
        let path = dir.join(&c.path);
        let write = |p: &std::path::Path| -> std::io::Result<()> {
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(p, c.json.as_bytes())
        };
        write(&path).map_err(|source| CliError::Write {
            path: path.clone(),
            source,
        })?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Parses RFC 3339 or Unix seconds.
fn parse_time(flag: &'static str, v: &str) -> Result<i64, CliError> {
    if let Ok(s) = v.parse::<i64>() {
        return Ok(s);
    }
    v.parse::<k8s_openapi::jiff::Timestamp>()
        .map(|t| t.as_second())
        .map_err(|source| CliError::Time {
            flag,
            value: v.to_owned(),
            source,
        })
}

/// Parses `60s`, `5m`, `1h` or plain seconds.
fn parse_step(v: &str) -> Result<i64, CliError> {
    let (n, unit) = match v.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => v.split_at(i),
        None => (v, "s"),
    };
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => {
            return Err(CliError::StepUnit {
                value: v.to_owned(),
            });
        }
    };
    let value = || v.to_owned();
    match n.parse::<i64>() {
        Ok(n) if n > 0 => n
            .checked_mul(mult)
            .ok_or_else(|| CliError::StepTooLarge { value: value() }),
        _ => Err(CliError::StepValue { value: value() }),
    }
}

/// `plan --prometheus`: the timeline read from Prometheus.
fn prometheus_timeline(
    args: &PlanArgs,
    url: &str,
    world: &lanekeeper::policy::World,
) -> Result<SignalsFile, CliError> {
    use lanekeeper::signals::prometheus::{Window, signals_file};
    let window = match (&args.from, &args.to) {
        (Some(f), Some(t)) => Window::Range {
            start: parse_time("from", f)?,
            end: parse_time("to", t)?,
            step: parse_step(&args.step)?,
        },
        _ => Window::At(match &args.at {
            Some(a) => parse_time("at", a)?,
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64),
        }),
    };
    let rt = tokio::runtime::Runtime::new().map_err(CliError::Runtime)?;
    let (t, notes) = rt
        .block_on(signals_file(
            world,
            Some(url),
            std::time::Duration::from_secs(args.prometheus_timeout.max(1)),
            &window,
        ))
        .map_err(|source| CliError::Prometheus {
            url: url.to_owned(),
            source,
        })?;
    for n in notes {
        eprintln!("note: {n}");
    }
    Ok(t)
}

/// Logs to stderr; colours only when stderr is a terminal, so a log file
/// or a collector gets no escape codes.
fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,kube=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = tokio::signal::ctrl_c() => {},
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutdown requested: finishing in-flight work");
}

fn run_operator(args: &RunArgs, log_format: LogFormat) -> Result<(), CliError> {
    use lanekeeper::controller::{Metrics, Readiness, Settings, http};
    init_logging(log_format);
    let addr =
        |flag, raw: &str| http::parse_addr(raw).map_err(|source| CliError::Addr { flag, source });
    let metrics_addr = addr("metrics-addr", &args.metrics_addr)?;
    let health_addr = addr("health-addr", &args.health_addr)?;
    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("lanekeeper-{}", std::process::id()));
    let settings = Settings {
        namespaces: args.namespaces.clone(),
        resync: std::time::Duration::from_secs(args.resync_seconds),
        leader_election: args.leader_elect,
        lease_name: args.lease_name.clone(),
        lease_namespace: args.lease_namespace.clone(),
        lease_duration_seconds: args.lease_duration_seconds,
        identity,
    };
    let rt = tokio::runtime::Runtime::new().map_err(CliError::Runtime)?;
    rt.block_on(async move {
        let client = kube::Client::try_default()
            .await
            .map_err(CliError::Cluster)?;
        let metrics = Metrics::new();
        let readiness = Readiness::default();
        let m = tokio::spawn(http::serve(metrics_addr, http::metrics_router(metrics.clone())));
        let h = tokio::spawn(http::serve(health_addr, http::health_router(readiness.clone())));
        tracing::info!(%metrics_addr, %health_addr, namespaces = ?settings.namespaces, "starting lanekeeper");
        // Live telemetry; both sources do nothing for profiles without
        // spec.signals.
        let extra_sources: Vec<std::sync::Arc<dyn lanekeeper::signals::SignalSource>> = vec![
            std::sync::Arc::new(lanekeeper::signals::prometheus::PrometheusSource::new(Some(client.clone()), Some(metrics.clone()))),
            std::sync::Arc::new(lanekeeper::signals::scrape_source::ScrapeSource::new(Some(metrics.clone()))),
        ];
        let operator = controller::Operator { client, settings, metrics, readiness, extra_sources };
        let result = operator.run(shutdown_signal()).await;
        m.abort();
        h.abort();
        result.map_err(CliError::from)
    })
}

fn run_gateway(
    args: lanekeeper::gateway::GatewayArgs,
    log_format: LogFormat,
) -> Result<(), CliError> {
    init_logging(log_format);
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.worker_threads {
        rt.worker_threads(n.max(1));
    }
    let rt = rt.enable_all().build().map_err(CliError::Runtime)?;
    Ok(rt.block_on(lanekeeper::gateway::run(args))?)
}

fn crdgen(out_dir: Option<&std::path::Path>, out: &mut dyn Write) -> Result<(), CliError> {
    match out_dir {
        None => write_out(out, &lanekeeper::api::crds_yaml()),
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|source| CliError::Write {
                path: dir.to_owned(),
                source,
            })?;
            for (name, yaml) in lanekeeper::api::crd_files() {
                let path = dir.join(name);
                std::fs::write(&path, yaml).map_err(|source| CliError::Write { path, source })?;
            }
            Ok(())
        }
    }
}

/// Writes a command's output; a failed write (a closed pipe among them) is
/// an error, not a panic as with `print!`.
fn write_out(out: &mut dyn Write, text: &str) -> Result<(), CliError> {
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(CliError::Stdout)
}

fn run(cli: Cli, out: &mut dyn Write) -> Result<(), CliError> {
    match cli.command {
        Command::Crdgen { out_dir } => crdgen(out_dir.as_deref(), out),
        Command::Plan(args) => run_plan(&args, out),
        Command::Rules(args) => run_rules(&args, out),
        Command::Run(args) => run_operator(&args, cli.log_format),
        Command::Simulate(args) => sim::cli::run_simulate(&args, out).map_err(CliError::from),
        Command::Diff(args) => sim::cli::run_diff(&args, out).map_err(CliError::from),
        Command::CalibrationHash(args) => run_calibration_hash(&args, out),
        Command::Gateway(args) => run_gateway(*args, cli.log_format),
    }
}

/// Exits 0 without a word when stdout is closed early
/// (`lanekeeper crdgen | head -1`).
fn main() -> ExitCode {
    match run(Cli::parse(), &mut std::io::stdout()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
