//! Writes the API server refused.
//!
//! A refused write (an RBAC rule the chart left out, a webhook that denies
//! it, a server error) stops neither the rest of the reconcile nor the
//! report: it is carried as a [`Refused`] into the profile's `Ready`
//! condition and a `WriteRefused` event. Each write backs off on its own,
//! 1 s doubling up to 5 minutes, so a refusal that persists is not retried
//! on every resync tick and trigger; what it would write changing (another
//! replica count, another drain) tries again at once.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::super::error::Error;
use crate::metrics::Metrics;

/// A write the API server refused.
#[derive(Clone, Debug, PartialEq)]
pub struct Refused {
    /// What was to be written (`scale Deployment pool to 9 replicas`).
    pub write: String,
    /// What the API server answered.
    pub error: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.write, self.error)
    }
}

/// The last refusal of one object's write and when to try it again.
struct Entry {
    wanted: String,
    refused: Refused,
    failures: u32,
    retry_at: Instant,
}

/// Refused writes per object (`Kind/namespace/name`), with their backoff.
#[derive(Default)]
pub struct Refusals {
    last: Mutex<HashMap<String, Entry>>,
}

/// The wait after `failures` refusals in a row: 1 s doubling, at most 5
/// minutes.
fn backoff(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.saturating_sub(1).min(9)).min(Duration::from_secs(300))
}

impl Refusals {
    /// The refusal still in force for writing `wanted` to `object`: the
    /// same value refused before and its backoff not yet over.
    pub fn held(&self, object: &str, wanted: &str) -> Option<Refused> {
        let last = self.last.lock().expect("not poisoned");
        let e = last.get(object)?;
        (e.wanted == wanted && Instant::now() < e.retry_at).then(|| e.refused.clone())
    }

    fn refused(&self, object: &str, wanted: &str, refused: Refused) {
        let mut last = self.last.lock().expect("not poisoned");
        let failures = last
            .get(object)
            .filter(|e| e.wanted == wanted)
            .map_or(1, |e| e.failures.saturating_add(1));
        last.insert(
            object.to_owned(),
            Entry {
                wanted: wanted.to_owned(),
                refused,
                failures,
                retry_at: Instant::now() + backoff(failures),
            },
        );
    }

    /// Forgets the refusal of `object`'s write: it was applied.
    pub fn applied(&self, object: &str) {
        self.last.lock().expect("not poisoned").remove(object);
    }

    /// Runs `write` (writing `wanted` to `object`, described by `what`)
    /// unless a refusal of the same write is still backing off. A refusal,
    /// new or held, comes back as `Err`; a new one is logged and counted in
    /// `lanekeeper_reconcile_errors_total`.
    pub async fn attempt<T, F>(
        &self,
        metrics: &Metrics,
        (object, wanted): (&str, &str),
        what: impl FnOnce() -> String,
        write: F,
    ) -> Result<T, Refused>
    where
        F: Future<Output = Result<T, Error>>,
    {
        if let Some(r) = self.held(object, wanted) {
            return Err(r);
        }
        match write.await {
            Ok(v) => {
                self.applied(object);
                Ok(v)
            }
            Err(e) => Err(self.note(metrics, (object, wanted), what(), &e)),
        }
    }

    /// Records that writing `wanted` to `object` (described by `write`) was
    /// refused with `e`: logged, counted in
    /// `lanekeeper_reconcile_errors_total`, and backing off.
    pub fn note(
        &self,
        metrics: &Metrics,
        (object, wanted): (&str, &str),
        write: String,
        e: &Error,
    ) -> Refused {
        metrics
            .reconcile_errors
            .with_label_values(&[e.reason()])
            .inc();
        tracing::warn!(object, write, error = %e, "write refused; backing off");
        let refused = Refused {
            write,
            error: e.to_string(),
        };
        self.refused(object, wanted, refused.clone());
        refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_one_second_up_to_five_minutes() {
        let secs: Vec<u64> = (1..=10).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]);
    }

    #[tokio::test]
    async fn a_refusal_is_held_until_its_backoff_ends_or_the_value_changes() {
        let r = Refusals::default();
        let m = Metrics::new();
        let fail = || async { Err::<(), _>(Error::ScaleTarget("no".into())) };
        let first = r
            .attempt(&m, ("Scale/ns/a", "9"), || "scale a to 9".into(), fail())
            .await;
        assert_eq!(first.unwrap_err().write, "scale a to 9");
        // Held: the write is not made again (it would succeed now).
        let held = r
            .attempt(&m, ("Scale/ns/a", "9"), || "x".into(), async { Ok(()) })
            .await;
        assert_eq!(held.unwrap_err().error, "scale target: no");
        // Another value is tried at once, and success forgets the refusal.
        let other = r
            .attempt(&m, ("Scale/ns/a", "10"), || "x".into(), async { Ok(()) })
            .await;
        assert_eq!(other, Ok(()));
        let again = r
            .attempt(&m, ("Scale/ns/a", "9"), || "x".into(), async { Ok(()) })
            .await;
        assert_eq!(again, Ok(()));
        assert_eq!(
            m.reconcile_errors
                .with_label_values(&["scale_target"])
                .get(),
            1
        );
    }
}
