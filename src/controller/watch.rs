//! One watch into a reflector store, run as a task, that triggers the
//! reconcile of the profile it serves on every change: the building block
//! of the pod index and of the scale-target index.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::JoinHandle;

use crate::api::CapacityProfile;
pub use crate::signals::Trigger;

/// One watch into a reflector store, run as a task: synced once the first
/// list is in, every later change sent to the trigger as the profile to
/// reconcile. Aborted when dropped.
pub struct Watch<K: Resource + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    store: Store<K>,
    synced: Arc<AtomicBool>,
    started: Instant,
    task: JoinHandle<()>,
}

/// How long a reconcile waits for the first list of a profile's watch
/// (pods, scale target) before it decides without it (what it could not
/// read is then Unknown, as it really is).
pub const FIRST_SYNC_GRACE: Duration = Duration::from_secs(30);

impl<K> Watch<K>
where
    K: Resource + Clone + Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Send + Sync,
{
    /// Starts a watch from a stream of watcher events (already modified as
    /// the caller wants them stored).
    pub fn start<S>(
        events: S,
        dyntype: K::DynamicType,
        what: &'static str,
        trigger: Trigger,
        key: ObjectRef<CapacityProfile>,
    ) -> Self
    where
        S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    {
        let writer = reflector::store::Writer::new(dyntype);
        let store = writer.as_reader();
        let synced = Arc::new(AtomicBool::new(false));
        let flag = synced.clone();
        let task = tokio::spawn(async move {
            let stream = events.default_backoff().reflect(writer);
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::InitDone) => {
                        flag.store(true, Ordering::Release);
                        let _ = trigger.unbounded_send(key.clone());
                    }
                    Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                        if flag.load(Ordering::Acquire) {
                            let _ = trigger.unbounded_send(key.clone());
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, watch = what, profile = %key, "watch error (retrying with backoff)")
                    }
                }
            }
        });
        Self {
            store,
            synced,
            started: Instant::now(),
            task,
        }
    }

    /// The objects, once the watch has synced (None before).
    pub fn state(&self) -> Option<Vec<Arc<K>>> {
        self.synced
            .load(Ordering::Acquire)
            .then(|| self.store.state())
    }

    /// While the first list has not come in and the watch started less
    /// than [`FIRST_SYNC_GRACE`] ago: how much of the grace is left. A
    /// decision waits for it rather than read an empty cache as missing
    /// data.
    pub fn first_sync_left(&self) -> Option<Duration> {
        if self.synced.load(Ordering::Acquire) {
            return None;
        }
        FIRST_SYNC_GRACE
            .checked_sub(self.started.elapsed())
            .filter(|left| !left.is_zero())
    }
}

impl<K: Resource + Clone + 'static> Drop for Watch<K>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}
