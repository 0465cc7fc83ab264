//! The upstream side: the HTTP client and the routes, and sending a passed
//! request ([`Dispatch`]) to its route within its deadline, streaming the
//! answer back unbuffered.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::uri::{Authority, Scheme};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Uri, header, request::Parts};
use axum::response::Response;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use lanes::trim_chat_history;
use serde_json::Value;
use tokio::time::Sleep;

use super::args::{GatewayArgs, GatewayError};
use super::credential::RouteCredentials;
use super::cut::stream_back;
use super::decision::REQUEST_ID;
use super::dispatch::Dispatch;
use super::metrics::TenantClass;
use super::respond;
use super::route_health::{Ending, RouteHealth, ending_of};
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
    routes: HashMap<String, Base>,
    /// Client headers never forwarded besides the fixed ones (the lane and
    /// tenant headers' configured names).
    private: Vec<HeaderName>,
    pub(super) credentials: Arc<RouteCredentials>,
    /// Each route's breaker and pace.
    pub(super) health: Arc<RouteHealth>,
}

impl Upstream {
    /// Whether `--upstream-ca` and `--route-credential` load (run checks
    /// before [`Upstream::new`], which cannot fail).
    pub(super) fn check(args: &GatewayArgs) -> Result<(), GatewayError> {
        upstream_tls::client_config(args.tls.upstream_ca.as_deref())?;
        RouteCredentials::new(&args.tls.route_credentials, &args.routes)?;
        Ok(())
    }

    pub(super) fn new(args: &GatewayArgs, health: RouteHealth) -> Upstream {
        let private = args.private_headers();
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
            routes: args
                .routes
                .iter()
                .map(|(name, url)| (name.clone(), Base::new(url)))
                .collect(),
            credentials: Arc::new(credentials),
            health: Arc::new(health),
            private,
        }
    }
}

impl Upstream {
    /// The first lane route of `cfg` that no `--route` names, as (lane,
    /// route): such a config is refused at load, not discovered per request.
    pub(super) fn unrouted<'c>(&self, cfg: &'c lanes::GatewayConfig) -> Option<(&'c str, &'c str)> {
        cfg.lanes.iter().find_map(|l| {
            l.routes
                .iter()
                .find(|r| !self.routes.contains_key(r.as_str()))
                .map(|r| (l.name.as_str(), r.as_str()))
        })
    }
}

/// A route's base URL; a base that is only a scheme and an authority (the
/// usual `http://host:port`) is kept parsed, so a request's URL is put
/// together from parts instead of formatted and parsed again.
struct Base {
    url: String,
    parsed: Option<(Scheme, Authority)>,
}

impl Base {
    fn new(url: &str) -> Base {
        let parsed = url.parse::<Uri>().ok().and_then(|u| {
            let (scheme, authority) = (u.scheme()?.clone(), u.authority()?.clone());
            (format!("{scheme}://{authority}") == url).then_some((scheme, authority))
        });
        Base {
            url: url.to_owned(),
            parsed,
        }
    }

    /// The base followed by the client's path and query.
    fn join(&self, parts: &Parts) -> Result<Uri, String> {
        let path = parts.uri.path_and_query();
        match (&self.parsed, path) {
            (Some((scheme, authority)), Some(path)) => Uri::builder()
                .scheme(scheme.clone())
                .authority(authority.clone())
                .path_and_query(path.clone())
                .build()
                .map_err(|e| e.to_string()),
            _ => {
                let path = path.map_or("/", |p| p.as_str());
                format!("{}{path}", self.url)
                    .parse()
                    .map_err(|e| format!("{e}"))
            }
        }
    }
}

/// The headers the gateway sets on every request it forwards.
const LANE: HeaderName = HeaderName::from_static("x-lanekeeper-lane");
const ATTEMPT_KIND: HeaderName = HeaderName::from_static("x-lanekeeper-attempt-kind");
const READ_ONLY: HeaderName = HeaderName::from_static("x-lanekeeper-read-only");
const STATIC_FALLBACK: HeaderName = HeaderName::from_static("x-lanekeeper-static-fallback");
/// The only content coding a metered answer may come in.
const IDENTITY: HeaderValue = HeaderValue::from_static("identity");

/// Whether a client's header goes upstream: not a hop-by-hop one, not the
/// length (recomputed), not the client's credential, not the gateway's own
/// (`x-lanekeeper-*`, `lanekeeper-*` and the lane and tenant headers, which
/// only the gateway sets) and not the request id (set from the record).
fn from_client(name: &HeaderName, private: &[HeaderName]) -> bool {
    let n = name.as_str();
    !(HOP_BY_HOP.contains(&n)
        || name == header::CONTENT_LENGTH
        || name == header::AUTHORIZATION
        || n.starts_with("x-lanekeeper-")
        || n.starts_with("lanekeeper-")
        || n == REQUEST_ID
        || private.contains(name))
}

/// The upstream request: the client's method, path, headers (less those
/// [`from_client`] drops, taken out of `out`) and body, on the route's base
/// URL, with the lane, the request id and the config's flags set by the
/// gateway.
fn upstream_request(
    upstream: &Upstream,
    base: &Base,
    out: &mut Outgoing<'_>,
    body: Bytes,
    d: &Dispatch,
) -> Result<axum::http::Request<Full<Bytes>>, String> {
    let uri = base.join(&out.parts)?;
    let mut headers = std::mem::take(&mut out.parts.headers);
    keep_from_client(&mut headers, &upstream.private);
    if d.reads_answer() {
        // Its usage is read on the way back: a compressed answer (the
        // client's `Accept-Encoding: gzip` passed on) could not be read,
        // and would keep only its reservation.
        headers.insert(header::ACCEPT_ENCODING, IDENTITY);
    }
    if let Ok(v) = HeaderValue::from_str(out.lane) {
        headers.insert(LANE, v);
    }
    headers.insert(REQUEST_ID, out.request_id.clone());
    headers.insert(ATTEMPT_KIND, HeaderValue::from_static(d.attempt.as_str()));
    let yes = HeaderValue::from_static("true");
    if d.read_only {
        headers.insert(READ_ONLY, yes.clone());
    }
    if d.static_fallback {
        headers.insert(STATIC_FALLBACK, yes);
    }
    let mut req = axum::http::Request::builder()
        .method(out.parts.method.clone())
        .uri(uri)
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    *req.headers_mut() = headers;
    Ok(req)
}

/// Takes out of the client's headers those [`from_client`] does not let
/// upstream (every value of each).
fn keep_from_client(headers: &mut HeaderMap, private: &[HeaderName]) {
    let dropped: Vec<HeaderName> = headers
        .keys()
        .filter(|k| !from_client(k, private))
        .cloned()
        .collect();
    for name in dropped {
        headers.remove(name);
    }
}

/// Optional context: the chat history trimmed to the turns in force, and
/// whether anything was cut.
fn trimmed(parts: &Parts, body: Bytes, turns: Option<i32>) -> (Bytes, bool) {
    if let Some(turns) = turns
        && parts.uri.path().ends_with("/chat/completions")
        && let Ok(mut v) = serde_json::from_slice::<Value>(&body)
        && trim_chat_history(&mut v, turns)
    {
        return (
            Bytes::from(serde_json::to_vec(&v).expect("JSON serializes")),
            true,
        );
    }
    (body, false)
}

/// A passed request on its way upstream: what the client sent and what the
/// record says about it.
pub(super) struct Outgoing<'a> {
    pub(super) parts: Parts,
    pub(super) body: Bytes,
    pub(super) class: TenantClass,
    /// The lane (a lane of the config).
    pub(super) lane: &'a str,
    pub(super) request_id: &'a HeaderValue,
}

/// Sends a passed request upstream within its remaining deadline and
/// streams the answer back; the request counts in flight until the body
/// ends or the client goes away (which drops the upstream connection). The
/// route is the first of the lane's whose breaker and pace let it through
/// (else an approved fallback the config allows, else the answer says when
/// the route may be tried again).
pub(super) async fn forward(
    upstream: &Upstream,
    mut out: Outgoing<'_>,
    mut d: Dispatch,
) -> Response {
    let lane = out.lane;
    if d.routes.routes.is_empty() {
        return respond::no_route(lane);
    }
    // An approved fallback this gateway has no `--route` for is skipped.
    let known = |r: &str| upstream.routes.contains_key(r);
    let taken = match upstream.health.take(&d.routes, known) {
        Ok(t) => t,
        Err(k) => {
            d.kept_off();
            return respond::route_kept_off(lane, &k);
        }
    };
    let route = Arc::clone(&taken.route);
    d.fallback_route |= taken.fallback;
    let Some(base) = upstream.routes.get(&*route) else {
        return respond::unknown_route(lane, &route);
    };
    let (body, trimmed) = trimmed(&out.parts, out.body.clone(), d.history_turns);
    if trimmed {
        // The answer's prompt tokens count the trimmed body.
        d.sent_upstream(body.len());
    }
    let mut req = match upstream_request(upstream, base, &mut out, body, &d) {
        Ok(r) => r,
        Err(e) => return respond::bad_route(lane, &route, &e),
    };
    upstream.credentials.apply(&route, req.headers_mut());
    let remaining = Duration::from_secs_f64(
        (d.remaining_seconds - d.passed_at().elapsed().as_secs_f64()).clamp(0.001, 86_400.0 * 7.0),
    );
    let sent = Instant::now();
    let deadline = d.remaining_seconds.is_finite().then(|| sent + remaining);
    d.set_deadline(deadline);
    // One timer for the answer's head and, with a deadline, its body.
    let mut until = Box::pin(tokio::time::sleep_until((sent + remaining).into()));
    let answer = tokio::select! {
        biased;
        r = upstream.client.request(req) => Ok(r),
        () = &mut until => Err(()),
    };
    let response = match answer {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            taken.end(Ending::Failed);
            d.failed();
            d.meter()
                .request(out.class, d.attempt, lanes::Outcome::UpstreamError);
            return respond::upstream_unreachable(lane, &route, &e.to_string());
        }
        Err(_) => {
            taken.end(Ending::timed_out(remaining.as_secs_f64()));
            d.meter()
                .request(out.class, d.attempt, lanes::Outcome::UpstreamError);
            return respond::upstream_timeout(lane, &route, remaining.as_secs_f64());
        }
    };
    d.route_hold = Some(
        taken.classified(ending_of(
            response.status().as_u16(),
            response
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
        )),
    );
    let until = deadline.map(|_| until);
    answered(response, d, sent, until, trimmed, out.class)
}

/// An upstream answer on its way back: counted, cleaned of hop-by-hop
/// headers, streamed within the deadline, marked when degraded.
fn answered(
    response: axum::http::Response<hyper::body::Incoming>,
    mut d: Dispatch,
    sent: Instant,
    until: Option<Pin<Box<Sleep>>>,
    trimmed: bool,
    class: TenantClass,
) -> Response {
    let latency = sent.elapsed().as_secs_f64();
    d.set_latency(latency);
    d.meter().upstream_latency(latency);
    if response.status().is_success()
        && let Some(route) = d.route_hold.as_ref().map(|t| Arc::clone(&t.route))
    {
        d.answered_by(route);
    }
    if response.status().is_server_error() {
        d.failed();
        d.meter()
            .request(class, d.attempt, lanes::Outcome::UpstreamError);
    }
    let degraded = degraded(&d, trimmed);
    let mut response = response;
    for h in HOP_BY_HOP {
        response.headers_mut().remove(h);
    }
    let mut response = stream_back(response, d, until);
    if let Some(v) = degraded {
        response.headers_mut().insert(DEGRADED, v);
    }
    response
}

/// The header telling a client how it was served degraded.
const DEGRADED: HeaderName = HeaderName::from_static("x-lanekeeper-degraded");

/// What was degraded about a passed request's service, if anything:
/// `history-trimmed`, `fallback-route`, `read-only`, `static-fallback`.
fn degraded(d: &Dispatch, trimmed: bool) -> Option<HeaderValue> {
    let all = [
        (trimmed, "history-trimmed"),
        (d.fallback_route, "fallback-route"),
        (d.read_only, "read-only"),
        (d.static_fallback, "static-fallback"),
    ];
    let on: Vec<&str> = all.iter().filter(|(b, _)| *b).map(|(_, n)| *n).collect();
    (!on.is_empty()).then(|| HeaderValue::from_str(&on.join(", ")).expect("ASCII"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = axum::http::Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_request_url_is_the_base_and_the_clients_path_and_query() {
        let p = parts("/v1/chat/completions?x=1", &[]);
        for (base, want, kept_parsed) in [
            (
                "http://127.0.0.1:8000",
                "http://127.0.0.1:8000/v1/chat/completions?x=1",
                true,
            ),
            (
                "https://model.ns.svc",
                "https://model.ns.svc/v1/chat/completions?x=1",
                true,
            ),
            // A base with a path (or a trailing slash) is joined as text,
            // as it always was.
            (
                "http://h:1/prefix",
                "http://h:1/prefix/v1/chat/completions?x=1",
                false,
            ),
            ("http://h:1/", "http://h:1//v1/chat/completions?x=1", false),
        ] {
            let b = Base::new(base);
            assert_eq!(b.parsed.is_some(), kept_parsed, "{base}");
            assert_eq!(b.join(&p).unwrap().to_string(), want, "{base}");
        }
        assert!(Base::new("not a url").join(&p).is_err());
    }

    #[test]
    fn only_what_the_client_may_send_upstream_is_kept() {
        let private = vec![
            HeaderName::from_static("x-team-lane"),
            HeaderName::from_static("x-team-tenant"),
        ];
        let mut p = parts(
            "/v1/chat/completions",
            &[
                ("content-type", "application/json"),
                ("accept", "a"),
                ("accept", "b"),
                ("authorization", "Bearer sk-client"),
                ("proxy-authorization", "Basic x"),
                ("connection", "keep-alive"),
                ("content-length", "12"),
                ("x-request-id", "client-id"),
                ("x-lanekeeper-lane", "p0-claimed"),
                ("x-lanekeeper-tenant", "someone-else"),
                ("lanekeeper-anything", "1"),
                ("x-team-lane", "p0"),
                ("x-team-tenant", "t"),
                ("x-custom", "kept"),
            ],
        );
        keep_from_client(&mut p.headers, &private);
        let mut names: Vec<&str> = p.headers.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["accept", "content-type", "x-custom"]);
        assert_eq!(p.headers.get_all("accept").iter().count(), 2);
    }
}
