//! What the client is told: a pure mapping from a refusal or a failure to
//! an OpenAI-style error response (`{"error": {message, type, code}}`).

use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use lanes::{Limit, Refusal, expected_wait};
use serde_json::json;

use super::decision::Reason;
use super::route_health::KeptOff;

/// How much of a client's header value an error message repeats.
const ECHO_LIMIT: usize = 64;

/// An OpenAI-style error response, its code kept as the decision's
/// [`Reason`].
pub(super) fn error(
    status: StatusCode,
    kind: &str,
    code: &'static str,
    message: String,
) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "code": code}});
    let mut r = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    )
        .into_response();
    r.extensions_mut().insert(Reason(code));
    r
}

fn bad_request(code: &'static str, message: String) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        code,
        message,
    )
}

/// A client's value, quoted, cut to [`ECHO_LIMIT`] bytes.
fn echo(v: &str) -> String {
    if v.len() <= ECHO_LIMIT {
        return format!("{v:?}");
    }
    format!("{:?}… ({} bytes)", prefix(v, ECHO_LIMIT), v.len())
}

/// At most `max` bytes of a client's value, cut on a character boundary
/// (for error messages and log lines).
pub(super) fn prefix(v: &str, max: usize) -> &str {
    let mut end = v.len().min(max);
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    &v[..end]
}

/// 503: no `lanes.json` yet.
pub(super) fn no_config() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "lanekeeper_no_config",
        "no_config",
        "the gateway has no lanes.json loaded yet (see its log): it admits nothing until it has one"
            .to_owned(),
    )
}

/// 400: the lane header is missing or names no lane of the config.
pub(super) fn unknown_lane(header: &str, value: Option<&str>, known: &[&str]) -> Response {
    bad_request(
        "unknown_lane",
        format!(
            "the {header} header must name a lane of this gateway; it was {}; known lanes: {}",
            value.map_or("missing".to_owned(), echo),
            known.join(", ")
        ),
    )
}

/// 404: a path the gateway does not forward.
pub(super) fn not_on_surface() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        "no such path on this gateway: it forwards only the OpenAI-compatible inference paths"
            .to_owned(),
    )
}

/// 405: a forwarded path, another method.
pub(super) fn method_not_allowed(allowed: &[axum::http::Method]) -> Response {
    let allowed: Vec<&str> = allowed.iter().map(axum::http::Method::as_str).collect();
    let allowed = allowed.join(", ");
    let mut r = error(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method_not_allowed",
        format!("this path takes {allowed}"),
    );
    if let Ok(v) = HeaderValue::from_str(&allowed) {
        r.headers_mut().insert(header::ALLOW, v);
    }
    r
}

/// 400: the attempt header is not an integer >= 1.
pub(super) fn invalid_attempt(header: &str, value: &str) -> Response {
    bad_request(
        "invalid_attempt",
        format!(
            "the {header} header must be an integer >= 1 (1 for the first attempt); it was {}",
            echo(value)
        ),
    )
}

/// 400: the request id is not short visible ASCII.
pub(super) fn invalid_request_id(header: &str, limit: usize) -> Response {
    bad_request(
        "invalid_request_id",
        format!("the {header} header must be 1 to {limit} visible ASCII characters"),
    )
}

/// 400: the lane went away with a config swap while the request waited.
pub(super) fn lane_gone(lane: &str) -> Response {
    bad_request("unknown_lane", format!("lane {lane} is gone"))
}

/// 503: the bodies held already fill `--max-body-memory-bytes` (or the
/// part of it this lane may use); come back in a second.
pub(super) fn body_memory_full(limit: usize) -> Response {
    let mut r = error(
        StatusCode::SERVICE_UNAVAILABLE,
        "lanekeeper_overloaded",
        "body_memory_full",
        format!(
            "the gateway holds as many request bodies as its memory for them allows ({limit} bytes, --max-body-memory-bytes); come back in about 1 s (Retry-After)"
        ),
    );
    let h = r.headers_mut();
    h.insert(header::RETRY_AFTER, HeaderValue::from(1));
    h.insert(SHOULD_RETRY, HeaderValue::from_static("true"));
    r
}

/// 413: the body is over `--max-body-bytes`.
pub(super) fn body_too_large(limit: usize) -> Response {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        "body_too_large",
        format!("the request body is larger than {limit} bytes (the gateway's --max-body-bytes)"),
    )
}

/// 400: the body could not be read.
pub(super) fn body_unreadable(why: &str) -> Response {
    bad_request(
        "body_unreadable",
        format!("the request body could not be read: {why}"),
    )
}

/// 503: a queued request's place was lost.
pub(super) fn queue_dropped(lane: &str) -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "lanekeeper_unavailable",
        "queue_dropped",
        format!("lane {lane}: the request's place in the queue was lost (config change)"),
    )
}

/// The header the OpenAI SDKs read before their own rules: `true` retries
/// (after `Retry-After`), `false` never.
pub(super) const SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

/// The header marking a deferral (the work is wanted later).
const DEFERRED: HeaderName = HeaderName::from_static("lanekeeper-deferred");

/// Whether coming back can help: not for a paused lane (until the
/// controller releases it), a deadline, or the retry limits.
fn should_retry(limit: Limit) -> bool {
    match limit {
        Limit::Rate
        | Limit::QueueTtl
        | Limit::QueueDepth
        | Limit::StopAt
        | Limit::Deferred
        | Limit::TenantConcurrency
        | Limit::ModelSlots
        | Limit::LongContext => true,
        Limit::Paused
        | Limit::Deadline
        | Limit::MaxAttempts
        | Limit::RetryBudget
        | Limit::LaneRemoved => false,
    }
}

/// Which limit refused, in words a caller understands, and when to come
/// back (`wait`: the `Retry-After` in seconds).
fn refusal_words(lane: &str, limit: Limit, wait: Option<i64>) -> String {
    let back = wait.map_or(String::new(), |s| {
        format!("; come back in about {s} s (Retry-After)")
    });
    let what = match limit {
        Limit::Rate => format!("lane {lane} is over its admitted rate"),
        Limit::Paused => {
            return format!(
                "lane {lane} is paused by the current degradation level: retrying does not help until it is released{}",
                wait.map_or(String::new(), |s| format!(", expected in about {s} s"))
            );
        }
        Limit::QueueTtl => {
            format!("lane {lane}: the wait for a turn is longer than its queue allows")
        }
        Limit::QueueDepth => format!("lane {lane}: its queue is full"),
        Limit::TenantConcurrency => format!(
            "lane {lane}: your tenant has its most requests in flight (tenants.maxConcurrency) and could not wait for one to finish"
        ),
        Limit::StopAt => format!("lane {lane}: the pool is at its in-flight limit"),
        Limit::ModelSlots => {
            format!("lane {lane}: every model slot of the pool is in use (concurrency.max)")
        }
        Limit::LongContext => format!(
            "lane {lane}: the pool has its most long-context requests in flight (longContext.maxConcurrency); shorter requests still pass"
        ),
        Limit::Deferred => format!(
            "lane {lane}: deferred; the work is wanted later, come back with the same request id"
        ),
        Limit::Deadline => {
            return format!(
                "lane {lane}: the request cannot be served within its deadline; retrying does not help"
            );
        }
        Limit::MaxAttempts => {
            return format!(
                "lane {lane}: this request has used all its attempts; retrying does not help"
            );
        }
        Limit::RetryBudget => {
            return format!(
                "lane {lane}: the lane's retries are over their budget; retrying now makes it worse"
            );
        }
        Limit::LaneRemoved => return format!("lane {lane} was removed from the config"),
    };
    format!("{what}{back}")
}

/// A 429 saying which limit of which lane in words and when to come back,
/// with `Retry-After` (the expected wait), `x-should-retry` and, for a
/// deferral, `Lanekeeper-Deferred: true`.
pub(super) fn refusal(lane: &str, r: &Refusal) -> Response {
    let kind = if r.deferred() {
        "lanekeeper_deferred"
    } else {
        "rate_limit_exceeded"
    };
    let wait = r.retry_after_seconds.map(|s| s.max(1));
    let message = format!(
        "{} (limit: {})",
        refusal_words(lane, r.limit, wait),
        r.limit.as_str()
    );
    let mut resp = error(
        StatusCode::TOO_MANY_REQUESTS,
        kind,
        r.outcome.as_str(),
        message,
    );
    if let Some(s) = wait {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    resp.headers_mut().insert(
        SHOULD_RETRY,
        HeaderValue::from_static(if should_retry(r.limit) {
            "true"
        } else {
            "false"
        }),
    );
    if r.deferred() {
        resp.headers_mut()
            .insert(DEFERRED, HeaderValue::from_static("true"));
    }
    resp
}

/// No route of the lane may take the request now: 503 naming the route
/// whose breaker is open, or 429 for a route its upstream asked to slow
/// down; either with `Retry-After` (when the route may be tried again) and
/// `x-should-retry: true`.
pub(super) fn route_kept_off(lane: &str, k: &KeptOff) -> Response {
    let (status, kind, code, wait, message) = match k {
        KeptOff::Open { route, retry_in } => {
            let s = expected_wait::whole(*retry_in);
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "lanekeeper_route_unavailable",
                "breaker_open",
                s,
                format!(
                    "lane {lane}: route {route} is failing (its circuit breaker is open); it is tried again in about {s} s: come back after Retry-After"
                ),
            )
        }
        KeptOff::Paced {
            route,
            limit,
            retry_in,
        } => {
            let s = expected_wait::whole(*retry_in);
            (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                "route_paced",
                s,
                format!(
                    "lane {lane}: route {route} asked the gateway to slow down; it takes {limit} requests at once now, a place is expected in about {s} s: come back after Retry-After"
                ),
            )
        }
    };
    let mut resp = error(status, kind, code, message);
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(wait));
    resp.headers_mut()
        .insert(SHOULD_RETRY, HeaderValue::from_static("true"));
    resp
}

/// 503: the lane has no route in `lanes.json`.
pub(super) fn no_route(lane: &str) -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "lanekeeper_no_route",
        "no_route",
        format!("lane {lane} has no route in lanes.json"),
    )
}

/// 502: the lane's route has no `--route NAME=URL`.
pub(super) fn unknown_route(lane: &str, route: &str) -> Response {
    error(
        StatusCode::BAD_GATEWAY,
        "lanekeeper_no_route",
        "unknown_route",
        format!("lane {lane}: route {route:?} has no --route {route}=URL on this gateway"),
    )
}

/// 502: the upstream URL could not be made.
pub(super) fn bad_route(lane: &str, route: &str, why: &str) -> Response {
    error(
        StatusCode::BAD_GATEWAY,
        "lanekeeper_bad_route",
        "bad_route",
        format!("lane {lane}: route {route}: {why}"),
    )
}

/// 502: the upstream could not be reached (never retried: generations are
/// not idempotent).
pub(super) fn upstream_unreachable(lane: &str, route: &str, why: &str) -> Response {
    error(
        StatusCode::BAD_GATEWAY,
        "lanekeeper_upstream_error",
        "upstream_error",
        format!("lane {lane}: route {route} is unreachable: {why} (the gateway does not retry)"),
    )
}

/// 504: no answer within the request's remaining deadline.
pub(super) fn upstream_timeout(lane: &str, route: &str, seconds: f64) -> Response {
    error(
        StatusCode::GATEWAY_TIMEOUT,
        "lanekeeper_upstream_timeout",
        "deadline",
        format!(
            "lane {lane}: route {route} did not answer within the request's remaining deadline ({seconds:.3} s)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use lanes::{Attempt, Outcome};

    async fn body(r: Response) -> serde_json::Value {
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    fn refused(outcome: Outcome, limit: Limit, retry_after: Option<i64>) -> Refusal {
        Refusal {
            lane: 0,
            attempt: Attempt::Original,
            outcome,
            limit,
            retry_after_seconds: retry_after,
            inside_floor: false,
        }
    }

    #[tokio::test]
    async fn a_refusal_is_a_429_naming_the_limit_with_retry_after() {
        let r = refusal("p3", &refused(Outcome::RejectedRate, Limit::Rate, Some(0)));
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1", "at least 1 s");
        assert_eq!(r.headers()[SHOULD_RETRY], "true");
        assert!(r.headers().get("lanekeeper-deferred").is_none());
        let b = body(r).await;
        assert_eq!(b["error"]["code"], "rejected_rate");
        assert_eq!(
            b["error"]["message"],
            "lane p3 is over its admitted rate; come back in about 1 s (Retry-After) (limit: admittedRequestsPerSecond)"
        );
    }

    #[tokio::test]
    async fn a_paused_lane_says_it_is_paused_and_not_to_retry() {
        let r = refusal(
            "p4",
            &refused(Outcome::RejectedRate, Limit::Paused, Some(300)),
        );
        assert_eq!(r.headers()[header::RETRY_AFTER], "300");
        assert_eq!(r.headers()[SHOULD_RETRY], "false");
        let msg = body(r).await["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(msg.starts_with("lane p4 is paused"), "{msg}");
        assert!(
            msg.contains("about 300 s") && !msg.contains("admittedRequestsPerSecond"),
            "{msg}"
        );
        for limit in [Limit::Deadline, Limit::MaxAttempts, Limit::RetryBudget] {
            let r = refusal("p1", &refused(Outcome::RejectedRetryBudget, limit, None));
            assert_eq!(r.headers()[SHOULD_RETRY], "false", "{limit:?}");
        }
        for limit in [Limit::QueueDepth, Limit::QueueTtl, Limit::StopAt] {
            let r = refusal("p1", &refused(Outcome::RejectedQueueFull, limit, Some(7)));
            assert_eq!(r.headers()[SHOULD_RETRY], "true", "{limit:?}");
            assert_eq!(r.headers()[header::RETRY_AFTER], "7");
        }
    }

    #[tokio::test]
    async fn a_route_kept_off_names_the_route_and_when_it_is_tried_again() {
        let r = route_kept_off(
            "p1",
            &KeptOff::Open {
                route: "vllm-main".into(),
                retry_in: 4.2,
            },
        );
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "5");
        assert_eq!(r.headers()[SHOULD_RETRY], "true");
        let b = body(r).await;
        assert_eq!(b["error"]["code"], "breaker_open");
        assert!(
            b["error"]["message"]
                .as_str()
                .unwrap()
                .contains("route vllm-main")
        );
        let r = route_kept_off(
            "p1",
            &KeptOff::Paced {
                route: "r".into(),
                limit: 2,
                retry_in: 0.1,
            },
        );
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        assert_eq!(body(r).await["error"]["code"], "route_paced");
    }

    #[tokio::test]
    async fn a_deferral_says_so_and_a_deadline_refusal_has_no_retry_after() {
        let r = refusal(
            "p4",
            &refused(Outcome::Deferred, Limit::Deferred, Some(150)),
        );
        assert_eq!(r.headers()[header::RETRY_AFTER], "150");
        assert_eq!(r.headers()["lanekeeper-deferred"], "true");
        assert_eq!(r.headers()[SHOULD_RETRY], "true");
        assert_eq!(body(r).await["error"]["type"], "lanekeeper_deferred");
        let r = refusal(
            "p1",
            &refused(Outcome::RejectedDeadline, Limit::Deadline, None),
        );
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
        assert_eq!(r.headers()[SHOULD_RETRY], "false");
    }

    #[tokio::test]
    async fn an_unknown_lane_echoes_at_most_a_short_prefix() {
        let huge = "x".repeat(420_000);
        let r = unknown_lane("x-lanekeeper-lane", Some(&huge), &["a", "b"]);
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let msg = body(r).await["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(msg.len() < 300, "{} bytes", msg.len());
        assert!(
            msg.contains("(420000 bytes)") && msg.ends_with("known lanes: a, b"),
            "{msg}"
        );
        let r = unknown_lane("x-lanekeeper-lane", None, &["a"]);
        let msg = body(r).await["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(msg.contains("it was missing"), "{msg}");
    }

    #[test]
    fn the_echo_cuts_on_a_character_boundary() {
        let v = "é".repeat(100);
        let e = echo(&v);
        assert!(e.starts_with('"') && e.contains("… (200 bytes)"), "{e}");
    }
}
