//! Streaming an upstream's answer back, and cutting it honestly. A body
//! cut short by the request's deadline or by an upstream error never ends
//! as a clean response: an event stream gets an SSE error event
//! (`{"error": {"code": "deadline", …}}`) and then the connection is
//! aborted; any other body is aborted at once, so the client sees an
//! incomplete transfer instead of a truncated answer that looks whole.

use std::pin::Pin;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use futures::StreamExt;
use futures::stream::{BoxStream, unfold};
use http_body_util::BodyExt;
use serde_json::json;
use tokio::time::Sleep;

use super::dispatch::Dispatch;
pub(super) use super::metrics::Cut;

fn message(cut: Cut) -> &'static str {
    match cut {
        Cut::Deadline => "the answer was cut at the request's deadline; it is incomplete",
        Cut::UpstreamError => "the upstream failed while answering; the answer is incomplete",
    }
}

/// The SSE event that ends a cut event stream.
pub(super) fn error_event(cut: Cut) -> Bytes {
    let e = json!({"error": {
        "message": message(cut),
        "type": "lanekeeper_truncated",
        "code": cut.as_str(),
    }});
    Bytes::from(format!("event: error\ndata: {e}\n\n"))
}

/// The error that aborts the client's connection after a cut.
#[derive(Debug, thiserror::Error)]
#[error("response cut: {}", .0.as_str())]
pub(super) struct CutError(Cut);

/// Where the relay is.
enum Relay {
    /// Passing chunks on.
    Open,
    /// The error event went out; abort next.
    Abort(Cut),
    /// Done.
    Ended,
}

/// Everything the relay holds: the upstream body, the deadline, and the
/// in-flight slot (released when the relay is dropped).
struct Stream {
    body: BoxStream<'static, Result<Bytes, hyper::Error>>,
    until: Pin<Box<Sleep>>,
    sse: bool,
    relay: Relay,
    d: Dispatch,
}

/// The upstream's answer (its hop-by-hop headers already removed),
/// streamed through unbuffered until it ends, the deadline passes or the
/// upstream fails (the request stays in flight until then).
pub(super) fn stream_back(
    response: axum::http::Response<hyper::body::Incoming>,
    mut d: Dispatch,
    deadline: Option<Instant>,
) -> Response {
    let (mut head, incoming) = response.into_parts();
    let sse = head
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    d.tap_answer(sse);
    if sse {
        // An error event may follow what the upstream announced (and the
        // usage chunk may be taken out of it).
        head.headers.remove(header::CONTENT_LENGTH);
    }
    let until = tokio::time::sleep_until(tokio::time::Instant::from_std(
        deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 7)),
    ));
    let state = Stream {
        body: incoming.into_data_stream().boxed(),
        until: Box::pin(until),
        sse,
        relay: Relay::Open,
        d,
    };
    Response::from_parts(head, Body::from_stream(unfold(state, next)))
}

/// The next item for the client.
async fn next(mut s: Stream) -> Option<(Result<Bytes, CutError>, Stream)> {
    match s.relay {
        Relay::Ended => return None,
        Relay::Abort(cut) => {
            // Pending once, so the server flushes the error event before
            // the abort drops the connection.
            tokio::task::yield_now().await;
            s.relay = Relay::Ended;
            return Some((Err(CutError(cut)), s));
        }
        Relay::Open => {}
    }
    let cut = loop {
        tokio::select! {
            chunk = s.body.next() => match chunk {
                Some(Ok(b)) => {
                    // The usage tap may hold back part of an event.
                    let b = s.d.tapped(b);
                    if b.is_empty() {
                        continue;
                    }
                    return Some((Ok(b), s));
                }
                None => {
                    s.relay = Relay::Ended;
                    return s.d.tap_end().map(|rest| (Ok(rest), s));
                }
                Some(Err(_)) => break Cut::UpstreamError,
            },
            () = &mut s.until => break Cut::Deadline,
        }
    };
    s.d.meter().cut(cut);
    s.d.failed();
    if s.sse {
        s.relay = Relay::Abort(cut);
        Some((Ok(error_event(cut)), s))
    } else {
        s.relay = Relay::Ended;
        Some((Err(CutError(cut)), s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_event_is_one_sse_event_with_an_openai_error() {
        let e = error_event(Cut::Deadline);
        let text = std::str::from_utf8(&e).unwrap();
        assert!(text.starts_with("event: error\ndata: ") && text.ends_with("\n\n"));
        let data = text
            .trim_end()
            .strip_prefix("event: error\ndata: ")
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["error"]["code"], "deadline");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(
                std::str::from_utf8(&error_event(Cut::UpstreamError))
                    .unwrap()
                    .trim_end()
                    .strip_prefix("event: error\ndata: ")
                    .unwrap()
            )
            .unwrap()["error"]["code"],
            "upstream_error"
        );
    }
}
