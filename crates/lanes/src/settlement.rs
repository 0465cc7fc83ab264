//! Reserve, then settle: a lane's budget in work units, charged the
//! estimated cost of a request when it is admitted and corrected by the
//! actual cost from the answer's `usage` when it ends. The budget refills at
//! the lane's admitted units per second up to its burst and may go into
//! debt (an answer that cost more than reserved): later requests wait until
//! the debt is paid. An answer without usage keeps its reservation: no
//! refund on missing data.

use crate::tokens::TokenCost;

/// Tokens an answer reported (`usage.prompt_tokens`,
/// `usage.completion_tokens`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Input tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
}

impl Usage {
    /// The `usage` object of an OpenAI-style answer (a JSON body or a
    /// stream's usage chunk); `None` without one or with counts that are not
    /// whole numbers.
    pub fn from_answer(body: &[u8]) -> Option<Usage> {
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        let u = v.get("usage")?;
        Some(Usage {
            prompt_tokens: u.get("prompt_tokens")?.as_u64()?,
            completion_tokens: u.get("completion_tokens")?.as_u64()?,
        })
    }
}

/// What a request reserved.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reservation {
    /// Work units charged at admission.
    pub units: f64,
}

/// A lane's budget in work units.
#[derive(Clone, Debug)]
pub struct CostBudget {
    /// Work units per second.
    rate: f64,
    /// Most work units the budget holds.
    burst: f64,
    /// What it holds now (negative: debt).
    level: f64,
    last: f64,
}

impl CostBudget {
    /// A full budget of `burst` units refilling at `rate` units/s.
    pub fn new(rate: f64, burst: f64, now: f64) -> CostBudget {
        let burst = burst.max(0.0);
        CostBudget {
            rate: rate.max(0.0),
            burst,
            level: burst,
            last: now,
        }
    }

    fn refill(&mut self, now: f64) {
        let elapsed = (now - self.last).max(0.0);
        self.level = (self.level + self.rate * elapsed).min(self.burst);
        self.last = now.max(self.last);
    }

    /// What the budget holds at `now` (negative: debt).
    pub fn level(&mut self, now: f64) -> f64 {
        self.refill(now);
        self.level
    }

    /// Reserves `units` if the budget holds them (or is full, for a request
    /// larger than the burst, which then leaves the budget in debt).
    pub fn reserve(&mut self, units: f64, now: f64) -> Option<Reservation> {
        self.refill(now);
        let units = units.max(0.0);
        if self.level + 1e-9 >= units.min(self.burst) {
            self.level -= units;
            Some(Reservation { units })
        } else {
            None
        }
    }

    /// Seconds until a reservation of `units` could pass (0 when it can
    /// now; infinite at rate 0).
    pub fn wait_for(&mut self, units: f64, now: f64) -> f64 {
        self.refill(now);
        let missing = units.max(0.0).min(self.burst) - self.level;
        if missing <= 0.0 {
            0.0
        } else if self.rate > 0.0 {
            missing / self.rate
        } else {
            f64::INFINITY
        }
    }

    /// Settles a reservation with the answer's actual cost: the difference
    /// is credited (up to the burst) or debited (into debt). Without an
    /// actual cost the reservation stands. Returns the units charged in the
    /// end.
    pub fn settle(&mut self, r: Reservation, actual: Option<f64>, now: f64) -> f64 {
        self.refill(now);
        let Some(actual) = actual.filter(|a| a.is_finite() && *a >= 0.0) else {
            return r.units;
        };
        self.level = (self.level + r.units - actual).min(self.burst);
        actual
    }
}

/// The actual cost of an answer under a lane's cost model.
pub fn actual_cost(cost: &TokenCost, usage: Option<Usage>) -> Option<f64> {
    usage.map(|u| cost.of(u.prompt_tokens, u.completion_tokens))
}

#[cfg(test)]
#[path = "settlement_tests.rs"]
mod tests;
