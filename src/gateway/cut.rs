//! Streaming an upstream's answer back, and cutting it honestly. A body
//! cut short by the request's deadline or by an upstream error never ends
//! as a clean response: an event stream gets an SSE error event
//! (`{"error": {"code": "deadline", …}}`) and then the connection is
//! aborted; any other body is aborted at once, so the client sees an
//! incomplete transfer instead of a truncated answer that looks whole.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use hyper::body::{Frame, Incoming};
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
    /// The error event went out; abort after one pending poll (so the
    /// server flushes the event first), then end.
    Abort { cut: Cut, yielded: bool },
    /// Done.
    Ended,
}

/// The answer on its way back, a body the client's connection polls
/// directly: the upstream body, the deadline, and the in-flight slot
/// (released when the body is dropped).
struct Stream {
    body: Incoming,
    until: Option<Pin<Box<Sleep>>>,
    sse: bool,
    relay: Relay,
    d: Dispatch,
}

/// The upstream's answer (its hop-by-hop headers already removed),
/// streamed through unbuffered until it ends, the deadline passes (`until`,
/// the timer that already ran while the answer's head was awaited) or the
/// upstream fails (the request stays in flight until then).
pub(super) fn stream_back(
    response: axum::http::Response<Incoming>,
    mut d: Dispatch,
    until: Option<Pin<Box<Sleep>>>,
) -> Response {
    let (mut head, body) = response.into_parts();
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
    let state = Stream {
        body,
        until,
        sse,
        relay: Relay::Open,
        d,
    };
    Response::from_parts(head, Body::new(state))
}

impl hyper::body::Body for Stream {
    type Data = Bytes;
    type Error = CutError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, CutError>>> {
        let s = self.get_mut();
        match s.relay {
            Relay::Ended => return Poll::Ready(None),
            Relay::Abort {
                yielded: false,
                cut,
            } => {
                s.relay = Relay::Abort { cut, yielded: true };
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Relay::Abort { yielded: true, cut } => {
                s.relay = Relay::Ended;
                return Poll::Ready(Some(Err(CutError(cut))));
            }
            Relay::Open => {}
        }
        // The deadline first: an upstream whose chunks are always ready
        // would otherwise never let it be seen.
        if let Some(until) = s.until.as_mut()
            && until.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(s.cut(Cut::Deadline));
        }
        loop {
            match Pin::new(&mut s.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers are not passed on; the usage tap may hold
                    // back part of an event.
                    let Ok(b) = frame.into_data() else { continue };
                    let b = s.d.tapped(b);
                    if !b.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(b))));
                    }
                }
                Poll::Ready(None) => {
                    s.relay = Relay::Ended;
                    return Poll::Ready(s.d.tap_end().map(|rest| Ok(Frame::data(rest))));
                }
                Poll::Ready(Some(Err(_))) => return Poll::Ready(s.cut(Cut::UpstreamError)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Stream {
    /// The answer is cut: counted, and what the client gets next (an
    /// event stream's error event, then the abort; any other body's abort).
    fn cut(&mut self, cut: Cut) -> Option<Result<Frame<Bytes>, CutError>> {
        self.d.meter().cut(cut);
        self.d.failed();
        if self.sse {
            self.relay = Relay::Abort {
                cut,
                yielded: false,
            };
            Some(Ok(Frame::data(error_event(cut))))
        } else {
            self.relay = Relay::Ended;
            Some(Err(CutError(cut)))
        }
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
