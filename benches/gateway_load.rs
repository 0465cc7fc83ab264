//! The load generator of `benches/gateway_load.sh`: HTTP/1.1 chat
//! completions over a fixed number of keep-alive connections (one request at
//! a time on each), with exact latency percentiles.
//!
//! - `rate`: open loop at a fixed total rate; connection `i` sends its `n`-th
//!   request at `t0 + (i + n * connections) / rate`. A request is timed from
//!   its send, or from its planned send time when the connection was still
//!   busy with the previous answer then (so a slow server is not hidden by
//!   the generator waiting for it, and the generator's own timer lateness is
//!   not counted against the server). Requests planned in the window but
//!   never sent (`unsent`) and requests whose connection was still busy at
//!   their planned time (`late`: the open loop falling behind) are counted.
//! - `max`: closed loop, every connection sending its next request as soon as
//!   the previous answer ends; the achieved rate is the highest sustained one.
//! - `hold`: many connections, each with its own lane and a new tenant per
//!   request, each waiting for its answer: for the gateway's memory with its
//!   queues full.
//!
//! `rate` and `max` send what a real client sends: a unique `x-request-id`
//! and a tenant header (one of `--tenants`, spread evenly) on every request,
//! besides the lane header. Connections that could not be opened count as
//! `connect-error`, apart from the server's answers.
//!
//! Each mode prints one JSON line. Without a mode (as `cargo bench` runs it)
//! it prints a note and exits. Run the whole comparison with
//! `bash benches/gateway_load.sh`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::json;

#[derive(Parser, Debug)]
#[command(name = "gateway_load")]
struct Cli {
    #[command(subcommand)]
    mode: Option<Mode>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, global = true, hide = true)]
    bench: bool,
}

/// The connections and the measured window of the rate and max modes.
#[derive(Args, Debug, Clone, Copy)]
struct Window {
    /// Connections (one request in flight on each).
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Seconds measured, after the warm-up.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds sent but not measured.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Tenants the requests are spread over (one per request, drawn by a
    /// hash of the connection and the request's number).
    #[arg(long, default_value_t = 1000)]
    tenants: u64,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Open loop at a fixed total rate.
    Rate {
        #[command(flatten)]
        target: Target,
        /// Requests per second, over all connections.
        #[arg(long)]
        rate: f64,
        #[command(flatten)]
        window: Window,
    },
    /// Closed loop: as fast as the answers come.
    Max {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        window: Window,
    },
    /// Connection `k` sends on lane `{lane_prefix}{k % lanes}`, each request
    /// with a new tenant (`tenant-{k + j * clients}`), until `tenants`
    /// requests have been answered.
    Hold {
        #[command(flatten)]
        target: Target,
        /// Connections, each with one request waiting at a time.
        #[arg(long, default_value_t = 2000)]
        clients: usize,
        /// Lanes the connections are spread over.
        #[arg(long, default_value_t = 100)]
        lanes: usize,
        /// The lane names' prefix.
        #[arg(long, default_value = "lane-")]
        lane_prefix: String,
        /// Distinct tenants, one request each.
        #[arg(long, default_value_t = 10_000)]
        tenants: usize,
    },
}

#[derive(Args, Debug, Clone)]
struct Target {
    /// `http://HOST:PORT/PATH` (or `https://`) of the chat completions
    /// endpoint.
    #[arg(long)]
    url: String,
    /// PEM CA bundle an `https://` URL's certificate is verified against.
    #[arg(long)]
    ca: Option<std::path::PathBuf>,
    /// The lane header's name.
    #[arg(long, default_value = "x-lanekeeper-lane")]
    lane_header: String,
    /// The lane (the lane header's value) for `rate` and `max`.
    #[arg(long, default_value = "p1-agent-assist")]
    lane: String,
    /// The body's `model` (the lane when not given).
    #[arg(long)]
    model: Option<String>,
    /// `NAME: VALUE`, another header on every request (repeat the flag).
    #[arg(long = "header", value_parser = parse_header)]
    headers: Vec<(String, String)>,
    /// The tenant header, on every request.
    #[arg(long, default_value = "x-lanekeeper-tenant")]
    tenant_header: String,
    /// Worker threads of the generator (it shares the machine with what it
    /// measures).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

/// The per-request headers of `rate` and `max`: a request id unique to the
/// process (its start time and id, the connection, the request's number)
/// and a tenant.
#[derive(Clone)]
struct Identity {
    prefix: String,
    tenant_header: String,
    tenants: u64,
}

impl Identity {
    fn new(target: &Target, tenants: u64) -> Identity {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Identity {
            prefix: format!("{nanos:x}-{}", std::process::id()),
            tenant_header: target.tenant_header.clone(),
            tenants: tenants.max(1),
        }
    }

    /// The request id and tenant of connection `conn`'s `n`-th request.
    fn of(&self, conn: usize, n: u64) -> [(String, String); 2] {
        let tenant = splitmix(((conn as u64) << 40) ^ n) % self.tenants;
        [
            (
                "x-request-id".to_owned(),
                format!("{}-{conn}-{n}", self.prefix),
            ),
            (self.tenant_header.clone(), format!("tenant-{tenant}")),
        ]
    }
}

/// A 64-bit mix (SplitMix64's finaliser): tenants spread evenly.
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Where to connect and what to send; TLS (ALPN http/1.1) for `https://`.
#[derive(Clone)]
struct Endpoint {
    addr: String,
    host: String,
    path: String,
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
}

impl Endpoint {
    fn parse(target: &Target) -> Endpoint {
        let uri: hyper::Uri = target.url.parse().expect("--url is a URL");
        let authority = uri.authority().expect("--url has a host");
        let tls = match uri.scheme_str() {
            Some("http") => None,
            Some("https") => Some(tls_connector(target.ca.as_deref(), authority.host())),
            _ => panic!("--url must be http:// or https://"),
        };
        Endpoint {
            addr: authority.to_string(),
            host: authority.to_string(),
            path: uri.path_and_query().map_or("/", |p| p.as_str()).to_owned(),
            tls,
        }
    }
}

/// A TLS connector trusting `ca` (the compiled-in web roots without it), and
/// the server name to verify.
fn tls_connector(
    ca: Option<&std::path::Path>,
    host: &str,
) -> (
    tokio_rustls::TlsConnector,
    rustls::pki_types::ServerName<'static>,
) {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            for cert in rustls::pki_types::CertificateDer::pem_file_iter(path).expect("--ca reads")
            {
                roots
                    .add(cert.expect("--ca is PEM"))
                    .expect("--ca is a certificate");
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
        .expect("--url's host is a server name");
    (
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)),
        name,
    )
}

fn body(model: &str) -> Bytes {
    Bytes::from(
        json!({
            "model": model,
            "messages": [{"role": "user", "content": "Say ok."}],
            "max_tokens": 16
        })
        .to_string(),
    )
}

/// HTTP/1.1 over a connected stream; the connection driven by a task.
async fn handshake<T>(io: T) -> std::io::Result<SendRequest<Full<Bytes>>>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// One keep-alive connection, reopened when the server closes it.
struct Conn {
    endpoint: Endpoint,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Conn {
    fn new(endpoint: Endpoint) -> Conn {
        Conn {
            endpoint,
            sender: None,
        }
    }

    async fn sender(&mut self) -> std::io::Result<&mut SendRequest<Full<Bytes>>> {
        if let Some(s) = &mut self.sender
            && s.ready().await.is_err()
        {
            self.sender = None;
        }
        if self.sender.is_none() {
            let stream = tokio::net::TcpStream::connect(&self.endpoint.addr).await?;
            stream.set_nodelay(true)?;
            let sender = match &self.endpoint.tls {
                None => handshake(stream).await?,
                Some((connector, name)) => {
                    handshake(connector.connect(name.clone(), stream).await?).await?
                }
            };
            self.sender = Some(sender);
        }
        Ok(self.sender.as_mut().expect("just set"))
    }

    /// Sends one request and reads the whole answer: its status, or an
    /// error. `at` is set to the instant the request was handed to the
    /// connection.
    async fn call(
        &mut self,
        headers: &[(String, String)],
        own: &[(String, String)],
        body: Bytes,
        at: &mut Instant,
    ) -> Result<u16, String> {
        let endpoint = self.endpoint.clone();
        let sender = self
            .sender()
            .await
            .map_err(|e| format!("{CONNECT_ERROR}: {e}"))?;
        let mut req = hyper::Request::post(endpoint.path.as_str())
            .header(hyper::header::HOST, endpoint.host.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json");
        for (k, v) in headers.iter().chain(own) {
            req = req.header(k.as_str(), v.as_str());
        }
        let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
        *at = Instant::now();
        let result = async {
            let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            resp.into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?;
            Ok(status)
        }
        .await;
        if result.is_err() {
            self.sender = None;
        }
        result
    }
}

/// The result key (and error prefix) of a connection that could not be
/// opened.
const CONNECT_ERROR: &str = "connect-error";

/// What one connection saw: latencies in microseconds of the answered
/// requests inside the window, and every request by result.
#[derive(Default)]
struct Tally {
    micros: Vec<u32>,
    results: BTreeMap<String, u64>,
    measured: u64,
    /// Planned but not sent before the end of the window (`rate`).
    unsent: u64,
    /// Planned inside the window while the connection was still busy with
    /// the previous answer (`rate`: the open loop behind its schedule, timed
    /// from the plan).
    late: u64,
    /// Answered (2xx) inside the window, whenever planned (`rate`).
    done_in_window: u64,
}

impl Tally {
    fn record(&mut self, result: &Result<u16, String>, micros: Option<u32>) {
        let key = match result {
            Ok(s) => s.to_string(),
            Err(e) if e == "timeout" => "timeout".to_owned(),
            Err(e) if e.starts_with(CONNECT_ERROR) => CONNECT_ERROR.to_owned(),
            Err(_) => "error".to_owned(),
        };
        *self.results.entry(key).or_default() += 1;
        if let Some(us) = micros {
            self.measured += 1;
            if matches!(result, Ok(s) if (200..300).contains(s)) {
                self.micros.push(us);
            }
        }
    }

    fn merge(&mut self, other: Tally) {
        self.micros.extend(other.micros);
        self.measured += other.measured;
        self.unsent += other.unsent;
        self.late += other.late;
        self.done_in_window += other.done_in_window;
        for (k, v) in other.results {
            *self.results.entry(k).or_default() += v;
        }
    }
}

/// A request of `rate` or `max` that takes longer than this is an error.
const TIMEOUT: Duration = Duration::from_secs(30);

async fn timed(call: impl Future<Output = Result<u16, String>>) -> Result<u16, String> {
    tokio::time::timeout(TIMEOUT, call)
        .await
        .unwrap_or_else(|_| Err("timeout".to_owned()))
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

fn percentile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    f64::from(sorted[i]) / 1000.0
}

fn report(mode: &str, tally: Tally, window: f64, extra: serde_json::Value) {
    let mut us = tally.micros;
    us.sort_unstable();
    let ok = us.len() as u64;
    let mut out = json!({
        "mode": mode,
        "measured": tally.measured,
        "ok": ok,
        "errors": tally.measured - ok,
        "unsent": tally.unsent,
        "late": tally.late,
        "connect_errors": tally.results.get(CONNECT_ERROR).copied().unwrap_or(0),
        "throughput": tally.done_in_window as f64 / window,
        "results": tally.results,
        "window_s": window,
        "rate": ok as f64 / window,
        "p50_ms": percentile(&us, 0.50),
        "p90_ms": percentile(&us, 0.90),
        "p99_ms": percentile(&us, 0.99),
        "max_ms": us.last().map_or(f64::NAN, |m| f64::from(*m) / 1000.0),
    });
    if let (Some(o), serde_json::Value::Object(e)) = (out.as_object_mut(), extra) {
        o.extend(e);
    }
    println!("{out}");
}

fn parse_header(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not NAME: VALUE"))?;
    Ok((k.trim().to_owned(), v.trim().to_owned()))
}

fn headers(target: &Target) -> Vec<(String, String)> {
    let mut h = vec![(target.lane_header.clone(), target.lane.clone())];
    h.extend(target.headers.iter().cloned());
    h
}

async fn open_loop(target: Target, rate: f64, window: Window) {
    let Window {
        connections,
        duration,
        warmup,
        tenants,
    } = window;
    let endpoint = Endpoint::parse(&target);
    let body = body(target.model.as_deref().unwrap_or(&target.lane));
    let headers = headers(&target);
    let identity = Identity::new(&target, tenants);
    // Connect first, so the schedule does not start with connection set-up.
    let mut conns = Vec::new();
    for _ in 0..connections {
        let mut c = Conn::new(endpoint.clone());
        c.sender().await.expect("connect");
        conns.push(c);
    }
    let t0 = Instant::now() + Duration::from_millis(50);
    let measure_from = t0 + Duration::from_secs_f64(warmup);
    let end = measure_from + Duration::from_secs_f64(duration);
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, mut conn)| {
            let (body, headers, identity) = (body.clone(), headers.clone(), identity.clone());
            tokio::spawn(async move {
                let mut tally = Tally::default();
                let mut prev_done = t0;
                for n in 0.. {
                    let planned = t0 + Duration::from_secs_f64((i + n * connections) as f64 / rate);
                    if planned >= end {
                        break;
                    }
                    // A server that cannot keep up leaves requests unsent at
                    // the end of the window: counted, not sent late.
                    if Instant::now() >= end {
                        tally.unsent += 1;
                        continue;
                    }
                    tokio::time::sleep_until(planned.into()).await;
                    let own = identity.of(i, n as u64);
                    let mut sent = Instant::now();
                    let result = timed(conn.call(&headers, &own, body.clone(), &mut sent)).await;
                    let done = Instant::now();
                    // Late because the previous answer was late: from the
                    // plan; otherwise from the send.
                    let behind = prev_done > planned;
                    let from = if behind { planned } else { sent };
                    prev_done = done;
                    let in_window = planned >= measure_from;
                    if in_window && behind {
                        tally.late += 1;
                    }
                    tally.record(&result, in_window.then(|| micros(done - from)));
                    if done >= measure_from && done < end && matches!(result, Ok(200..300)) {
                        tally.done_in_window += 1;
                    }
                }
                tally
            })
        })
        .collect();
    let mut tally = Tally::default();
    for t in tasks {
        tally.merge(t.await.expect("task"));
    }
    report(
        "rate",
        tally,
        duration,
        json!({"target_rate": rate, "connections": connections}),
    );
}

async fn closed_loop(target: Target, window: Window) {
    let Window {
        connections,
        duration,
        warmup,
        tenants,
    } = window;
    let endpoint = Endpoint::parse(&target);
    let body = body(target.model.as_deref().unwrap_or(&target.lane));
    let headers = headers(&target);
    let identity = Identity::new(&target, tenants);
    let t0 = Instant::now();
    let measure_from = t0 + Duration::from_secs_f64(warmup);
    let end = measure_from + Duration::from_secs_f64(duration);
    let tasks: Vec<_> = (0..connections)
        .map(|i| {
            let (body, headers, endpoint) = (body.clone(), headers.clone(), endpoint.clone());
            let identity = identity.clone();
            tokio::spawn(async move {
                let mut conn = Conn::new(endpoint);
                let mut tally = Tally::default();
                for n in 0.. {
                    let own = identity.of(i, n);
                    let mut sent = Instant::now();
                    let result = timed(conn.call(&headers, &own, body.clone(), &mut sent)).await;
                    let done = Instant::now();
                    if done >= end {
                        break;
                    }
                    let in_window = sent >= measure_from;
                    tally.record(&result, in_window.then(|| micros(done - sent)));
                    if in_window && matches!(result, Ok(200..300)) {
                        tally.done_in_window += 1;
                    }
                    if result.is_err() {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                tally
            })
        })
        .collect();
    let mut tally = Tally::default();
    for t in tasks {
        tally.merge(t.await.expect("task"));
    }
    report("max", tally, duration, json!({"connections": connections}));
}

async fn hold(target: Target, clients: usize, lanes: usize, lane_prefix: String, tenants: usize) {
    let endpoint = Endpoint::parse(&target);
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|k| {
            let endpoint = endpoint.clone();
            let lane = format!("{lane_prefix}{}", k % lanes.max(1));
            let (lane_header, tenant_header) =
                (target.lane_header.clone(), target.tenant_header.clone());
            let body = body(target.model.as_deref().unwrap_or(&lane));
            let extra = target.headers.clone();
            tokio::spawn(async move {
                let mut conn = Conn::new(endpoint);
                let mut tally = Tally::default();
                for tenant in (k..tenants).step_by(clients) {
                    let mut headers = vec![
                        (lane_header.clone(), lane.clone()),
                        (tenant_header.clone(), format!("tenant-{tenant}")),
                    ];
                    headers.extend(extra.iter().cloned());
                    let mut sent = Instant::now();
                    let result = conn.call(&headers, &[], body.clone(), &mut sent).await;
                    tally.record(&result, Some(micros(sent.elapsed())));
                }
                tally
            })
        })
        .collect();
    let mut tally = Tally::default();
    for t in tasks {
        tally.merge(t.await.expect("task"));
    }
    let elapsed = t0.elapsed().as_secs_f64();
    report(
        "hold",
        tally,
        elapsed,
        json!({"clients": clients, "lanes": lanes, "tenants": tenants}),
    );
}

fn runtime(threads: usize) -> tokio::runtime::Runtime {
    if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    }
    .enable_all()
    .build()
    .expect("runtime")
}

fn main() {
    let cli = Cli::parse();
    let Some(mode) = cli.mode else {
        println!(
            "gateway_load: a load generator for `bash benches/gateway_load.sh` (modes: rate, max, hold); nothing to do"
        );
        return;
    };
    match mode {
        Mode::Rate {
            target,
            rate,
            window,
        } => runtime(target.threads).block_on(open_loop(target, rate, window)),
        Mode::Max { target, window } => {
            runtime(target.threads).block_on(closed_loop(target, window))
        }
        Mode::Hold {
            target,
            clients,
            lanes,
            lane_prefix,
            tenants,
        } => runtime(target.threads).block_on(hold(target, clients, lanes, lane_prefix, tenants)),
    }
}
