//! The floor of `benches/gateway_load.sh`: the HTTP stack `lanekeeper
//! gateway` is built on (hyper's HTTP/1 server and hyper-util's pooled
//! client on a tokio runtime of `--worker-threads` threads) forwarding
//! every request to one upstream with no policy at all: no lane, tenant,
//! request id, token bucket, metrics or log. What lanekeeper costs above
//! this is its own work; what this costs above nginx is the stack's.
//!
//! Hop-by-hop headers are dropped both ways (RFC 9110 §7.6.1), as any
//! proxy must; nothing else is read or changed.
//!
//! `bare_proxy --listen ADDR --upstream http://HOST:PORT --worker-threads N`
//! prints `listening on ADDR` and serves until killed. Without `--listen`
//! (as `cargo bench` runs it) it prints a note and exits.

use std::convert::Infallible;
use std::net::SocketAddr;

use clap::Parser;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONNECTION, HOST, HeaderMap, HeaderName, TRANSFER_ENCODING};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

#[derive(Parser, Debug)]
#[command(name = "bare_proxy")]
struct Cli {
    /// Where to listen (`127.0.0.1:0` for any free port).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// The upstream's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    upstream: String,
    /// The runtime's worker threads.
    #[arg(long, default_value_t = 1)]
    worker_threads: usize,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

type Upstream = Client<HttpConnector, BoxBody<Bytes, hyper::Error>>;
type Answer = Response<BoxBody<Bytes, hyper::Error>>;

fn main() {
    let cli = Cli::parse();
    let Some(listen) = cli.listen else {
        println!("bare_proxy: the HTTP stack's floor for benches/gateway_load.sh (see its --help)");
        return;
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.worker_threads)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(serve(listen, cli.upstream));
}

async fn serve(listen: SocketAddr, base: String) {
    let listener = tokio::net::TcpListener::bind(listen).await.expect("bind");
    println!("listening on {}", listener.local_addr().expect("bound"));
    let client: Upstream = Client::builder(TokioExecutor::new()).build_http();
    let base: &'static str = Box::leak(base.into_boxed_str());
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let client = client.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| forward(client.clone(), base, req));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn strip_hop_by_hop(h: &mut HeaderMap) {
    const HOP: [HeaderName; 3] = [CONNECTION, TRANSFER_ENCODING, HOST];
    for name in &HOP {
        h.remove(name);
    }
}

async fn forward(
    client: Upstream,
    base: &'static str,
    req: Request<Incoming>,
) -> Result<Answer, Infallible> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("{base}{path}").parse::<Uri>() else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    parts.uri = uri;
    strip_hop_by_hop(&mut parts.headers);
    let up = Request::from_parts(parts, body.boxed());
    Ok(match client.request(up).await {
        Ok(r) => {
            let (mut parts, body) = r.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.boxed())
        }
        Err(_) => status(StatusCode::BAD_GATEWAY),
    })
}

fn status(code: StatusCode) -> Answer {
    let mut r = Response::new(Full::new(Bytes::new()).map_err(|e| match e {}).boxed());
    *r.status_mut() = code;
    r
}
