//! The accept loop of a listener: at most its number of connections open at
//! once, each served by [`conn::serve`] (after a TLS handshake with
//! `--tls-cert`). At the limit a new connection takes the place of the
//! oldest idle one (no request being served: a keep-alive connection
//! between requests, or one still sending its headers); when every
//! connection is busy it gets an immediate 503 (plain HTTP) or is closed
//! (TLS), never left waiting. An accept that fails for want of descriptors
//! closes an idle connection and backs off instead of spinning.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use super::conn::{self, Activity, Clocks, Serves};
use super::fds;
use super::tls::ServerTls;

/// How long a new connection waits for an evicted idle one to close.
const EVICTION_WAIT: Duration = Duration::from_millis(100);

/// How long accepting pauses after running out of descriptors.
const EXHAUSTED_BACKOFF: Duration = Duration::from_millis(50);

/// The body of the immediate answer to a connection over the limit.
const OVER_LIMIT: &str = "{\"error\": {\"message\": \"too many open connections\", \
\"type\": \"server_error\", \"code\": \"connection_limit\"}}\n";

/// A listener's connections: a permit each, and the live ones oldest first
/// (to find an idle one to evict).
pub(super) struct Slots {
    permits: Arc<Semaphore>,
    max: usize,
    live: Mutex<BTreeMap<u64, Arc<Activity>>>,
    next: AtomicU64,
}

/// An open connection's place; freed when dropped.
pub(super) struct Slot {
    _permit: OwnedSemaphorePermit,
    id: u64,
    slots: Arc<Slots>,
    activity: Arc<Activity>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.lock().remove(&self.id);
    }
}

impl Slots {
    pub(super) fn new(max: usize) -> Arc<Slots> {
        Arc::new(Slots {
            permits: Arc::new(Semaphore::new(max)),
            max,
            live: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Activity>>> {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks the oldest idle connection not yet asked to close; whether
    /// there was one.
    fn evict_idle(&self) -> bool {
        let live = self.lock();
        let idle = live.values().find(|a| a.is_idle() && !a.is_evicted());
        idle.inspect(|a| a.evict()).is_some()
    }

    /// A place for a new connection, or none (refuse it).
    async fn admit(self: &Arc<Self>) -> Option<Slot> {
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) if self.evict_idle() => {
                let wait = self.permits.clone().acquire_owned();
                tokio::time::timeout(EVICTION_WAIT, wait).await.ok()?.ok()?
            }
            Err(_) => return None,
        };
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(Activity::new());
        self.lock().insert(id, activity.clone());
        Some(Slot {
            _permit: permit,
            id,
            slots: self.clone(),
            activity,
        })
    }

    /// Waits until every connection has closed, at most `grace`.
    async fn drained(&self, grace: Duration) -> bool {
        let all = u32::try_from(self.max).unwrap_or(u32::MAX);
        tokio::time::timeout(grace, self.permits.acquire_many(all))
            .await
            .is_ok()
    }
}

/// What one listener serves, and how.
pub(super) struct Listener {
    pub(super) tcp: TcpListener,
    pub(super) serves: Serves,
    pub(super) tls: Option<Arc<ServerTls>>,
    pub(super) clocks: Clocks,
    pub(super) slots: Arc<Slots>,
}

/// Accepts until `stop` completes, then lets the open connections finish
/// their requests for at most `grace`.
pub(super) async fn serve(l: Listener, stop: impl Future<Output = ()>, grace: Duration) {
    let (drain, draining) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            r = l.tcp.accept() => r,
            () = &mut stop => break,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                accept_failed(&e, &l.slots).await;
                continue;
            }
        };
        let Some(slot) = l.slots.admit().await else {
            refuse(&stream, l.tls.is_some());
            continue;
        };
        tokio::spawn(connection(
            stream,
            slot,
            l.tls.clone(),
            l.serves.clone(),
            l.clocks,
            draining.clone(),
        ));
    }
    drop(l.tcp);
    let _ = drain.send(true);
    if !l.slots.drained(grace).await {
        tracing::warn!(
            grace_seconds = grace.as_secs_f64(),
            "connections still open at the end of the shutdown grace; closing them"
        );
    }
}

async fn accept_failed(e: &std::io::Error, slots: &Slots) {
    if fds::is_exhaustion(e) {
        tracing::warn!(error = %e, "accept failed: out of descriptors; closing an idle connection and backing off");
        slots.evict_idle();
        tokio::time::sleep(EXHAUSTED_BACKOFF).await;
    } else {
        tracing::debug!(error = %e, "accept failed");
    }
}

/// Over the limit with every connection busy: a 503 written without
/// waiting (plain HTTP), then closed.
fn refuse(stream: &TcpStream, tls: bool) {
    tracing::debug!("refusing a connection: every connection is busy");
    if !tls {
        let answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
             retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{OVER_LIMIT}",
            OVER_LIMIT.len()
        );
        let _ = stream.try_write(answer.as_bytes());
    }
}

async fn connection(
    stream: TcpStream,
    slot: Slot,
    tls: Option<Arc<ServerTls>>,
    serves: Serves,
    clocks: Clocks,
    draining: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let activity = slot.activity.clone();
    match tls {
        None => conn::serve(stream, activity, serves, None, clocks, draining).await,
        Some(tls) => {
            // The handshake counts against the header clock, and a
            // connection still shaking hands may be evicted like an idle one.
            let handshake = tokio::time::timeout(clocks.header_read, tls.acceptor().accept(stream));
            let stream = tokio::select! {
                done = handshake => match done {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("TLS handshake timed out");
                        return;
                    }
                },
                () = activity.until_evicted() => return,
            };
            let peer = super::tls::peer_certificate(stream.get_ref().1);
            conn::serve(stream, activity, serves, peer, clocks, draining).await;
        }
    }
    drop(slot);
}
