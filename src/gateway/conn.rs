//! One client connection, served by hyper's HTTP/1 server under the
//! gateway's clocks: the headers of a request within
//! `--header-read-timeout-seconds` (from the connection's start, TLS
//! handshake included, or from the first byte of a later request), the body
//! within `--body-read-timeout-seconds` (408 beyond), the next request of a
//! keep-alive connection within `--idle-timeout-seconds`. A listener may
//! check each request's head before its body is read ([`HeadCheck`]: the
//! proxy's caller, path and request ids): a request it refuses is answered
//! without its body read and is never counted as served, and the check
//! runs on the header clock. A watchdog closes
//! the connection at the first deadline that passes; while a request is
//! being served there is none (the request's own deadline bounds it).
//!
//! hyper's own `header_read_timeout` also runs while a keep-alive
//! connection waits for its next request, so one clock would serve as both
//! the header and the idle timeout; hence the connection's [`Activity`]:
//! its reads say when a request head starts, its requests when they end.
//! Neither wakes the watchdog (that would cost every request a wake-up of
//! its connection's task and a new timer): it looks at the clocks at the
//! deadline in force and at least once per the shorter of the header and
//! idle clocks, which is soon enough to see each deadline exactly (see
//! [`Activity::next_look`]).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, watch};
use tower_service::Service;

use super::body_budget::BodyHold;
use super::peer::PeerCertificate;
use super::respond;

/// The clocks and the body limit of every connection of a listener.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clocks {
    pub(super) header_read: Duration,
    pub(super) idle: Duration,
    pub(super) body_read: Duration,
    pub(super) max_body_bytes: usize,
}

/// A request's head being checked: the head to go on with (what the check
/// found in its extensions), or the whole answer.
pub(super) type Checking = Pin<Box<dyn Future<Output = Result<Parts, Response<Body>>> + Send>>;

/// What a listener checks of every request from its head alone, before the
/// connection counts it as served and before a byte of its body is read
/// (the proxy: request ids, path, caller). While it runs the connection is
/// as one still sending its head: on the header clock, and evictable.
pub(super) type HeadCheck = Arc<dyn Fn(Parts) -> Checking + Send + Sync>;

/// What a listener's connections serve: each request's head checked by
/// `head` when there is one, then `router`.
#[derive(Clone)]
pub(super) struct Serves {
    pub(super) router: Router,
    pub(super) head: Option<HeadCheck>,
}

/// `head_since` between requests.
const NO_HEAD: u64 = u64::MAX;

/// What a connection is doing, shared by its reads, its requests, its
/// watchdog and the listener (which may evict it when it is idle).
pub(super) struct Activity {
    start: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds from `start` to the first byte of the request head now
    /// being read (0: the first request's clock starts with the
    /// connection); [`NO_HEAD`] between requests.
    head_since: AtomicU64,
    /// Milliseconds from `start` to the end of the last request.
    idle_since: AtomicU64,
    evicted: AtomicBool,
    changed: Notify,
}

impl Activity {
    pub(super) fn new() -> Activity {
        Activity {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            head_since: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            evicted: AtomicBool::new(false),
            changed: Notify::new(),
        }
    }

    fn millis(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(NO_HEAD - 1)
    }

    /// No request is being served (what the listener may evict).
    pub(super) fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// Whether the listener asked it to close.
    pub(super) fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    /// Completes once the listener asked the connection to close (used
    /// before the connection is served: during its TLS handshake).
    pub(super) async fn until_evicted(&self) {
        while !self.is_evicted() {
            self.changed.notified().await;
        }
    }

    /// Asks the connection to close if it is idle when it looks.
    pub(super) fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        self.changed.notify_one();
    }

    fn bytes_read(&self) {
        if self.is_idle() && self.head_since.load(Ordering::Acquire) == NO_HEAD {
            let _ = self.head_since.compare_exchange(
                NO_HEAD,
                self.millis(),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(NO_HEAD, Ordering::Release);
        // An eviction asked for while idle is stale once a request starts.
        self.evicted.store(false, Ordering::Release);
        InFlight(self.clone())
    }

    /// When the connection closes if nothing happens first; none while a
    /// request is served.
    fn deadline(&self, c: &Clocks) -> Option<Instant> {
        if !self.is_idle() {
            return None;
        }
        let at = |ms: u64| self.start + Duration::from_millis(ms);
        match self.head_since.load(Ordering::Acquire) {
            NO_HEAD => Some(at(self.idle_since.load(Ordering::Acquire)) + c.idle),
            head => Some(at(head) + c.header_read),
        }
    }

    /// When the watchdog looks next: at the deadline in force, and never
    /// later than the shorter clock from `now`. A head starting at `h` after
    /// a look at `l <= h` is seen by `l + min(header, idle) <= h + header`,
    /// its deadline; a request ending at `e` after a look at `l <= e`, by
    /// `l + min(header, idle) <= e + idle`, the idle deadline. So no
    /// deadline is missed though nothing wakes the watchdog when they start.
    fn next_look(&self, c: &Clocks, now: Instant) -> Instant {
        let cadence = now + c.header_read.min(c.idle);
        self.deadline(c).map_or(cadence, |d| d.min(cadence))
    }
}

/// A request being served: from its complete head until its response body
/// is done (or dropped).
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        a.idle_since.store(a.millis(), Ordering::Release);
        a.in_flight.fetch_sub(1, Ordering::AcqRel);
        // An eviction that raced with this request closes the connection
        // now that it is idle.
        if a.is_evicted() {
            a.changed.notify_one();
        }
    }
}

/// The connection's stream, telling its [`Activity`] when bytes arrive.
struct Watched<T> {
    io: T,
    activity: Arc<Activity>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.bytes_read();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, b)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A response body that keeps its request in flight until it is done.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// 408: the body did not arrive in time; the connection closes after it.
fn body_timeout(limit: Duration) -> Response<Body> {
    let mut r = respond::error(
        StatusCode::REQUEST_TIMEOUT,
        "invalid_request_error",
        "body_timeout",
        format!(
            "the request body did not arrive within {} s",
            limit.as_secs_f64()
        ),
    );
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// The whole body within the size limit and the body clock.
async fn read_body(body: Incoming, c: &Clocks) -> Result<Bytes, Response<Body>> {
    let collect = Limited::new(body, c.max_body_bytes).collect();
    match tokio::time::timeout(c.body_read, collect).await {
        Err(_) => Err(body_timeout(c.body_read)),
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(respond::body_too_large(c.max_body_bytes)),
        Ok(Err(e)) => Err(respond::body_unreadable(&e.to_string())),
    }
}

/// An answer to a request refused from its head. Its body is left unread:
/// hyper takes at most what already arrived and then closes the
/// connection, which the answer says. Counted in flight only while it is
/// written (the head is done; the idle clock runs from its end).
fn refused_at_head(
    activity: &Arc<Activity>,
    mut r: Response<Body>,
    body: &Incoming,
) -> Response<Tracked> {
    if !hyper::body::Body::is_end_stream(body) {
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let in_flight = activity.begin();
    r.map(|body| Tracked {
        body,
        _in_flight: in_flight,
    })
}

/// The request's share of body memory (when its head check took one) cut
/// to the body that arrived.
fn held_to(parts: Parts, bytes: usize) -> Parts {
    if let Some(hold) = parts.extensions.get::<BodyHold>() {
        hold.shrink_to(bytes);
    }
    parts
}

/// One request: the connection's client certificate attached, its head
/// checked (when the listener checks heads), then counted in flight, its
/// body read under the body clock, then the router.
async fn serve_request(
    mut router: Router,
    activity: Arc<Activity>,
    peer: Option<PeerCertificate>,
    clocks: Clocks,
    head: Option<HeadCheck>,
    request: Request<Incoming>,
) -> Response<Tracked> {
    let (mut parts, body) = request.into_parts();
    if let Some(p) = peer {
        parts.extensions.insert(p);
    }
    if let Some(check) = head {
        parts = match check(parts).await {
            Ok(p) => p,
            Err(r) => return refused_at_head(&activity, r, &body),
        };
    }
    let in_flight = activity.begin();
    let response = match read_body(body, &clocks).await {
        Ok(bytes) => match router
            .call(Request::from_parts(
                held_to(parts, bytes.len()),
                Body::from(bytes),
            ))
            .await
        {
            Ok(r) => r,
            Err(never) => match never {},
        },
        Err(r) => r,
    };
    response.map(|body| Tracked {
        body,
        _in_flight: in_flight,
    })
}

/// Serves one connection until it ends, a deadline passes, the listener
/// evicts it while idle, or (after `shutdown`) its last request is done.
pub(super) async fn serve<T>(
    io: T,
    activity: Arc<Activity>,
    serves: Serves,
    peer: Option<PeerCertificate>,
    clocks: Clocks,
    mut shutdown: watch::Receiver<bool>,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = {
        let activity = activity.clone();
        hyper::service::service_fn(move |req| {
            let Serves { router, head } = serves.clone();
            let fut = serve_request(router, activity.clone(), peer.clone(), clocks, head, req);
            async move { Ok::<_, Infallible>(fut.await) }
        })
    };
    let io = TokioIo::new(Watched {
        io,
        activity: activity.clone(),
    });
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, svc);
    tokio::pin!(conn);
    let mut draining = false;
    let look = tokio::time::sleep_until(activity.next_look(&clocks, Instant::now()).into());
    tokio::pin!(look);
    loop {
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(error = %e, "client connection ended with an error");
                }
                return;
            }
            () = &mut look => {
                let now = Instant::now();
                if activity.deadline(&clocks).is_some_and(|d| d <= now) {
                    tracing::debug!("closing a client connection at its header or idle deadline");
                    return;
                }
                look.as_mut().reset(activity.next_look(&clocks, now).into());
            }
            () = activity.changed.notified() => {
                if activity.is_evicted() && activity.is_idle() {
                    tracing::debug!("closing an idle client connection to make room");
                    return;
                }
            }
            _ = shutdown.changed(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn clocks(header: u64, idle: u64) -> Clocks {
        Clocks {
            header_read: Duration::from_secs(header),
            idle: Duration::from_secs(idle),
            body_read: Duration::from_secs(30),
            max_body_bytes: 1024,
        }
    }

    #[test]
    fn a_new_connection_is_looked_at_by_its_header_deadline() {
        let a = Activity::new();
        let c = clocks(10, 75);
        let now = Instant::now();
        let look = a.next_look(&c, now);
        assert!(look <= a.start + c.header_read, "{look:?}");
        assert!(look <= now + c.header_read);
    }

    #[test]
    fn while_a_request_is_served_the_watchdog_still_looks_once_per_the_shorter_clock() {
        // Nothing wakes the watchdog when the request ends: its next look
        // must come by the end plus the idle clock whenever the end comes.
        let a = Arc::new(Activity::new());
        for c in [clocks(10, 75), clocks(75, 10)] {
            let in_flight = a.begin();
            let looked = Instant::now();
            assert_eq!(a.deadline(&c), None);
            let next = a.next_look(&c, looked);
            assert_eq!(next, looked + c.header_read.min(c.idle));
            drop(in_flight);
            let ended = a.start + Duration::from_millis(a.idle_since.load(Ordering::Acquire));
            assert!(next <= ended + c.idle + Duration::from_millis(1));
            // Idle now: the look is by the idle deadline.
            let idle_deadline = a.deadline(&c).expect("idle");
            assert!(a.next_look(&c, Instant::now()) <= idle_deadline);
        }
    }

    #[test]
    fn a_head_starting_after_a_look_is_seen_by_its_header_deadline() {
        // Idle keep-alive with a long idle clock: a head starting just after
        // a look must not wait for the idle deadline.
        let a = Arc::new(Activity::new());
        let c = clocks(2, 600);
        drop(a.begin());
        let looked = Instant::now();
        let next = a.next_look(&c, looked);
        a.bytes_read();
        let head = a.start + Duration::from_millis(a.head_since.load(Ordering::Acquire));
        assert!(head + Duration::from_millis(1) >= looked);
        assert!(
            next <= head + c.header_read + Duration::from_millis(1),
            "{next:?}"
        );
        assert_eq!(a.deadline(&c), Some(head + c.header_read));
    }

    #[test]
    fn the_end_of_a_request_wakes_the_watchdog_only_for_an_eviction() {
        let a = Arc::new(Activity::new());
        drop(a.begin());
        // No permit stored: a waiter would not wake.
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut n = std::pin::pin!(a.changed.notified());
        assert!(n.as_mut().poll(&mut cx).is_pending());
        // An eviction that arrives while a request is served: the end of
        // the request wakes the watchdog (again) to close the connection.
        let in_flight = a.begin();
        a.evict();
        assert!(n.as_mut().poll(&mut cx).is_ready());
        let mut again = std::pin::pin!(a.changed.notified());
        assert!(again.as_mut().poll(&mut cx).is_pending());
        drop(in_flight);
        assert!(again.as_mut().poll(&mut cx).is_ready());
    }

    #[tokio::test]
    async fn a_head_being_checked_is_on_the_header_clock_and_may_be_evicted() {
        // A check that never ends (a caller whose credential cannot be
        // checked, say) must not make its connection a busy one: it is
        // closed at the header deadline, or when a new connection needs
        // its place, without an answer.
        let c = clocks(1, 75);
        for evict in [false, true] {
            let (mut client, server) = tokio::io::duplex(4096);
            let a = Arc::new(Activity::new());
            let (_stop, shutdown) = watch::channel(false);
            let never = |_| -> Checking { Box::pin(std::future::pending()) };
            let serves = Serves {
                router: Router::new(),
                head: Some(Arc::new(never)),
            };
            tokio::spawn(serve(server, a.clone(), serves, None, c, shutdown));
            let start = Instant::now();
            client
                .write_all(
                    b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-length: 9\r\n\r\n",
                )
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(a.is_idle(), "a head being checked is no request served");
            if evict {
                a.evict();
            }
            let mut got = Vec::new();
            tokio::time::timeout(Duration::from_secs(3), client.read_to_end(&mut got))
                .await
                .expect("the connection was never closed")
                .unwrap();
            assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
            let took = start.elapsed();
            if evict {
                assert!(took < Duration::from_millis(700), "evicted after {took:?}");
            } else {
                let ok = took >= Duration::from_millis(900) && took < Duration::from_secs(2);
                assert!(ok, "closed after {took:?}, not at the 1 s header clock");
            }
        }
    }

    /// Reads one answer with no body (its head only).
    async fn one_head(client: &mut tokio::io::DuplexStream) -> String {
        let mut got = Vec::new();
        while !got.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            let n = tokio::time::timeout(Duration::from_secs(2), client.read(&mut b))
                .await
                .expect("an answer")
                .unwrap();
            assert_eq!(n, 1, "closed: {}", String::from_utf8_lossy(&got));
            got.push(b[0]);
        }
        String::from_utf8_lossy(&got).into_owned()
    }

    #[tokio::test]
    async fn a_request_refused_from_its_head_ends_its_header_clock() {
        // Refused without a body, the connection is kept alive as after
        // any answer: on the idle clock, not on the refused head's.
        let (mut client, server) = tokio::io::duplex(4096);
        let (_stop, shutdown) = watch::channel(false);
        let refuse = |_| -> Checking {
            let mut r = Response::new(Body::empty());
            *r.status_mut() = StatusCode::UNAUTHORIZED;
            Box::pin(std::future::ready(Err(r)))
        };
        let serves = Serves {
            router: Router::new(),
            head: Some(Arc::new(refuse)),
        };
        let a = Arc::new(Activity::new());
        tokio::spawn(serve(server, a, serves, None, clocks(1, 75), shutdown));
        for _ in 0..2 {
            client
                .write_all(b"GET /v1/models HTTP/1.1\r\nhost: gw\r\n\r\n")
                .await
                .unwrap();
            let answer = one_head(&mut client).await;
            assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
            assert!(!answer.contains("connection: close"), "{answer}");
            // Past the 1 s header clock of the head just answered.
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
    }
}
