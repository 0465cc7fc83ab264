//! Latency over a sliding window of whole seconds, as log-spaced
//! histograms (4 % apart): the p95 the in-flight pressure watches, and each
//! lane's service time.

use crate::pressure::LATENCY_WINDOW_SECONDS;

const LATENCY_BUCKETS: usize = 360;
/// The lower edge of bucket 1 (seconds); bucket 0 holds everything below.
const LATENCY_BASE: f64 = 0.000_5;
/// Bucket edges 4 % apart (finer than the rise factor), up to ~650 s.
const LATENCY_GROWTH: f64 = 1.04;

fn latency_bucket(seconds: f64) -> usize {
    if seconds <= LATENCY_BASE {
        return 0;
    }
    let i = ((seconds / LATENCY_BASE).ln() / LATENCY_GROWTH.ln()).floor() as usize + 1;
    i.min(LATENCY_BUCKETS - 1)
}

fn latency_upper(bucket: usize) -> f64 {
    LATENCY_BASE * LATENCY_GROWTH.powi(bucket as i32)
}

/// The latency the gateway measures, per second, as log-spaced histograms.
#[derive(Debug)]
pub(crate) struct LatencyWindow {
    /// (second, counts).
    slots: Vec<(i64, [u32; LATENCY_BUCKETS])>,
}

impl LatencyWindow {
    pub(crate) fn new() -> LatencyWindow {
        LatencyWindow {
            slots: vec![(i64::MIN, [0; LATENCY_BUCKETS]); LATENCY_WINDOW_SECONDS],
        }
    }

    pub(crate) fn record(&mut self, now: f64, seconds: f64) {
        let sec = now.floor() as i64;
        let i = sec.rem_euclid(LATENCY_WINDOW_SECONDS as i64) as usize;
        if self.slots[i].0 != sec {
            self.slots[i] = (sec, [0; LATENCY_BUCKETS]);
        }
        self.slots[i].1[latency_bucket(seconds.max(0.0))] += 1;
    }

    /// The p95 over the window (the upper edge of its bucket); None without
    /// samples.
    pub(crate) fn p95(&self, now: f64) -> Option<f64> {
        self.p95_of_at_least(now, 1)
    }

    /// The p95 over the window when it holds at least `min` samples.
    pub(crate) fn p95_of_at_least(&self, now: f64, min: u64) -> Option<f64> {
        let sec = now.floor() as i64;
        let mut merged = [0u64; LATENCY_BUCKETS];
        for (s, counts) in &self.slots {
            if *s <= sec && sec.saturating_sub(*s) < LATENCY_WINDOW_SECONDS as i64 {
                for (m, c) in merged.iter_mut().zip(counts) {
                    *m += u64::from(*c);
                }
            }
        }
        let total: u64 = merged.iter().sum();
        if total < min.max(1) {
            return None;
        }
        let want = (total as f64 * 0.95).ceil() as u64;
        let mut acc = 0;
        for (i, c) in merged.iter().enumerate() {
            acc += c;
            if acc >= want {
                return Some(latency_upper(i));
            }
        }
        Some(latency_upper(LATENCY_BUCKETS - 1))
    }
}
