//! A lane's token bucket with its floor reserved and its borrowing grants:
//! the bucket runs at the lane's admitted rate raised to its floor; a grant
//! adds a lender's idle floor until it lapses, and is cut back at once by
//! what the lender takes back.

use crate::config::LaneConfig;

/// A grant as the core enforces it.
#[derive(Clone, Debug)]
pub(crate) struct Grant {
    /// The lender's index.
    pub(crate) from: usize,
    /// Requests per second of the borrower (units ÷ the borrower's cost).
    pub(crate) requests_per_second: f64,
    pub(crate) units_per_second: f64,
    /// Monotonic time of `expiresAt`.
    pub(crate) expires: f64,
}

/// Tokens taken per second over the last two seconds (the lane's own use).
#[derive(Debug, Default)]
pub(crate) struct UseMeter {
    /// (second, tokens).
    slots: [(i64, f64); 2],
}

impl UseMeter {
    pub(crate) fn add(&mut self, now: f64) {
        self.add_n(now, 1.0);
    }

    /// Adds `n` tokens (a priced request's charge, see `charge`).
    pub(crate) fn add_n(&mut self, now: f64, n: f64) {
        let sec = now.floor() as i64;
        let i = sec.rem_euclid(2) as usize;
        if self.slots[i].0 != sec {
            self.slots[i] = (sec, 0.0);
        }
        self.slots[i].1 += n;
    }

    /// Requests over the last second (the current second's count plus the
    /// part of the previous second still inside the window, assumed even).
    pub(crate) fn rate(&self, now: f64) -> f64 {
        let sec = now.floor() as i64;
        let frac = now - sec as f64;
        let cur = self.slots[sec.rem_euclid(2) as usize];
        let prev = self.slots[(sec - 1).rem_euclid(2) as usize];
        let c = if cur.0 == sec { cur.1 } else { 0.0 };
        let p = if prev.0 == sec - 1 { prev.1 } else { 0.0 };
        c + p * (1.0 - frac)
    }
}

/// A lane's bucket, scaled to the replica's share.
#[derive(Debug)]
pub(crate) struct Bucket {
    /// Admitted requests per second.
    pub(crate) rate: f64,
    pub(crate) burst: f64,
    /// The floor in requests per second.
    pub(crate) floor_rps: f64,
    pub(crate) grants: Vec<Grant>,
    pub(crate) tokens: f64,
    pub(crate) last_refill: f64,
    pub(crate) used: UseMeter,
    /// Arrivals per second, admitted or not (the demand a lease follows).
    pub(crate) demand: UseMeter,
    pub(crate) paused: bool,
    /// Tokens come from the fleet's shared bucket in leases
    /// (`fleet_core`), not from the replica's own refill.
    pub(crate) leased: bool,
}

impl Bucket {
    pub(crate) fn new(cfg: &LaneConfig, paused: bool, share: f64, now: f64) -> Bucket {
        let (rate, burst, floor_rps) = if paused {
            (0.0, 0.0, 0.0)
        } else {
            (
                cfg.admitted_requests_per_second * share,
                (cfg.burst as f64 * share).ceil().max(1.0),
                cfg.floor_units_per_second.unwrap_or(0.0) / cfg.work_units_per_request * share,
            )
        };
        Bucket {
            rate,
            burst,
            floor_rps,
            grants: Vec::new(),
            tokens: burst.max(floor_rps.ceil()),
            last_refill: now,
            used: UseMeter::default(),
            demand: UseMeter::default(),
            paused,
            leased: false,
        }
    }

    /// The bucket's size: its burst, or its floor when that is larger;
    /// a leased bucket holds what its leases brought (their size bounds it).
    pub(crate) fn cap(&self) -> f64 {
        if self.leased {
            return f64::INFINITY;
        }
        self.burst.max(self.floor_rps.ceil())
    }

    /// Adds the tokens accrued since the last refill at `rate`. While
    /// `waiting` requests wait, each token is theirs the moment it accrues,
    /// so what accrued between two polls is kept up to the number waiting
    /// instead of being lost to the bucket's size; the poll serves them and
    /// trims the rest.
    pub(crate) fn refill(&mut self, now: f64, rate: f64, waiting: usize) {
        let rate = if self.leased { 0.0 } else { rate };
        let elapsed = (now - self.last_refill).max(0.0);
        let cap = self.cap().max(waiting as f64);
        self.tokens = (self.tokens + rate * elapsed).min(cap);
        self.last_refill = now.max(self.last_refill);
    }

    /// The tokens there would be at `now` at `rate` (no refill).
    pub(crate) fn tokens_at(&self, now: f64, rate: f64) -> f64 {
        let rate = if self.leased { 0.0 } else { rate };
        let elapsed = (now - self.last_refill).max(0.0);
        (self.tokens + rate * elapsed).min(self.cap())
    }

    /// Takes a token if there is one.
    pub(crate) fn take(&mut self) -> bool {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}
