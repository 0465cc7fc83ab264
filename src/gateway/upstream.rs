//! The upstream side: the HTTP client and the routes, and sending a passed
//! request ([`Dispatch`]) to its route within its deadline, streaming the
//! answer back unbuffered.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Uri, header, request::Parts};
use axum::response::Response;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use lanes::trim_chat_history;
use serde_json::Value;

use super::args::{GatewayArgs, GatewayError};
use super::credential::RouteCredentials;
use super::dispatch::Dispatch;
use super::metrics::TenantClass;
use super::respond;
use super::upstream_tls::{self, Connector};

/// Headers that belong to one hop, never forwarded.
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

/// The HTTP client, the routes' base URLs and their credentials.
pub(super) struct Upstream {
    client: Client<Connector, Full<Bytes>>,
    routes: HashMap<String, String>,
    pub(super) credentials: Arc<RouteCredentials>,
}

impl Upstream {
    /// Whether `--upstream-ca` and `--route-credential` load (run checks
    /// before [`Upstream::new`], which cannot fail).
    pub(super) fn check(args: &GatewayArgs) -> Result<(), GatewayError> {
        upstream_tls::client_config(args.tls.upstream_ca.as_deref())?;
        RouteCredentials::new(&args.tls.route_credentials, &args.routes)?;
        Ok(())
    }

    pub(super) fn new(args: &GatewayArgs) -> Upstream {
        let tls = upstream_tls::client_config(args.tls.upstream_ca.as_deref())
            .or_else(|e| {
                tracing::error!(error = %e, "--upstream-ca no longer loads; using the public roots");
                upstream_tls::client_config(None)
            })
            .expect("the compiled-in roots load");
        let credentials = RouteCredentials::new(&args.tls.route_credentials, &args.routes)
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "route credentials no longer load; sending none");
                RouteCredentials::default()
            });
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(upstream_tls::connector(tls));
        Upstream {
            client,
            routes: args.routes.iter().cloned().collect(),
            credentials: Arc::new(credentials),
        }
    }
}

/// The upstream request: the client's method, path, headers (less the
/// hop-by-hop ones) and body, on the route's base URL, with the config's
/// flags as headers.
fn upstream_request(
    base: &str,
    parts: &Parts,
    body: Bytes,
    d: &Dispatch,
) -> Result<axum::http::Request<Full<Bytes>>, String> {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri: Uri = format!("{base}{path}")
        .parse()
        .map_err(|e| format!("{e}"))?;
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
        HeaderValue::from_static(d.attempt.as_str()),
    );
    if d.read_only {
        headers.insert("x-lanekeeper-read-only", HeaderValue::from_static("true"));
    }
    if d.static_fallback {
        headers.insert(
            "x-lanekeeper-static-fallback",
            HeaderValue::from_static("true"),
        );
    }
    out.body(Full::new(body)).map_err(|e| e.to_string())
}

/// Optional context: the chat history trimmed to the turns in force.
fn trimmed(parts: &Parts, body: Bytes, turns: Option<i32>) -> Bytes {
    if let Some(turns) = turns
        && parts.uri.path().ends_with("/chat/completions")
        && let Ok(mut v) = serde_json::from_slice::<Value>(&body)
        && trim_chat_history(&mut v, turns)
    {
        return Bytes::from(serde_json::to_vec(&v).expect("JSON serializes"));
    }
    body
}

/// Sends a passed request upstream within its remaining deadline and
/// streams the answer back; the request counts in flight until the body
/// ends or the client goes away (which drops the upstream connection).
pub(super) async fn forward(
    upstream: &Upstream,
    parts: Parts,
    body: Bytes,
    mut d: Dispatch,
    class: TenantClass,
    lane_name: &str,
    passed: Instant,
) -> Response {
    let Some(route) = d.route.clone() else {
        return respond::no_route(lane_name);
    };
    let Some(base) = upstream.routes.get(&route) else {
        return respond::unknown_route(lane_name, &route);
    };
    let body = trimmed(&parts, body, d.history_turns);
    let mut out = match upstream_request(base, &parts, body, &d) {
        Ok(r) => r,
        Err(e) => return respond::bad_route(lane_name, &route, &e),
    };
    upstream.credentials.apply(&route, out.headers_mut());
    let remaining = Duration::from_secs_f64(
        (d.remaining_seconds - passed.elapsed().as_secs_f64()).clamp(0.001, 86_400.0 * 7.0),
    );
    let deadline = d
        .remaining_seconds
        .is_finite()
        .then(|| Instant::now() + remaining);
    d.set_deadline(deadline);
    let sent = Instant::now();
    let response = match tokio::time::timeout(remaining, upstream.client.request(out)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            d.meter()
                .request(class, d.attempt, lanes::Outcome::UpstreamError);
            return respond::upstream_unreachable(lane_name, &route, &e.to_string());
        }
        Err(_) => {
            d.meter()
                .request(class, d.attempt, lanes::Outcome::UpstreamError);
            return respond::upstream_timeout(lane_name, &route, remaining.as_secs_f64());
        }
    };
    let latency = sent.elapsed().as_secs_f64();
    d.set_latency(latency);
    d.meter().upstream_latency(latency);
    if response.status().is_server_error() {
        d.meter()
            .request(class, d.attempt, lanes::Outcome::UpstreamError);
    }
    stream_back(response, d, deadline)
}

/// The upstream's answer, its body streamed through unbuffered until it
/// ends or the deadline passes (the request stays in flight until then).
fn stream_back(
    response: axum::http::Response<hyper::body::Incoming>,
    d: Dispatch,
    deadline: Option<Instant>,
) -> Response {
    let (mut head, incoming) = response.into_parts();
    for h in HOP_BY_HOP {
        head.headers.remove(h);
    }
    let until = tokio::time::sleep_until(tokio::time::Instant::from_std(
        deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 7)),
    ));
    let stream = incoming
        .into_data_stream()
        .take_until(until)
        .map(move |chunk| {
            let _in_flight = &d;
            chunk
        });
    Response::from_parts(head, Body::from_stream(stream))
}
