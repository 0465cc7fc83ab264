//! Tokens in the simulation (lanes whose scenario entry has `tokens`, under
//! `lanekeeper`): what the gateway does with a request's size, and what the
//! pool does with its tokens.
//!
//! - **The request.** Each request's input and output tokens are drawn from
//!   its tenant's distribution, or else its lane's (`scenario::tokens`,
//!   `scenario::tenants`). Its body carries
//!   [`DEFAULT_BYTES_PER_TOKEN`] bytes per input token and no `max_tokens`.
//! - **Its shape**, as the gateway checks it before admission under an
//!   enforced config (`lanes::request_shape`): more input tokens than the
//!   lane's `maxInputTokens` is refused (413 `context_too_long`, never
//!   retried); the output limit in force (`maxOutputTokens`, lowered by a
//!   level's `capOutputTokens`) becomes its `max_tokens`, so its answer
//!   stops there.
//! - **Admission** goes through the core's sized path
//!   ([`lanes::Core::admit_sized_hinted`]), as the gateway's: a lane with
//!   `cost` reserves the estimate (input from the body at the learned
//!   bytes per token, output at the lane's learned P95 under `max_tokens`),
//!   and a long request counts against the pool's `longContext` limit.
//! - **The pool.** A request of a lane with `cost` takes its actual cost
//!   (its tokens priced by the lane's `cost`) of the pool's work units, not
//!   `workUnitsPerRequest`; its service time is the lane's `service` draw
//!   times its tokens ÷ the distribution's mean input plus mean output, so
//!   the lane's mean service time is the scenario's and a request twice as
//!   large as the mean takes twice as long.
//! - **Settlement.** An answered request settles its reservation with its
//!   usage (its input and its output after `max_tokens`); a request that
//!   failed or was timed out settles without usage (the reservation
//!   stands, as the gateway does).

use lanes::request_shape::{DEFAULT_BYTES_PER_TOKEN, check_input};
use lanes::{Charge, RequestSize, Usage};

use super::{Attempt, Sim};

/// A sized attempt while it lasts: what it uses and what it reserved.
#[derive(Clone, Debug)]
pub(super) struct TokenAttempt {
    /// Its usage if answered: input and output after `max_tokens`.
    usage: Usage,
    /// The work units it takes of the pool.
    pool_units: f64,
    /// What it reserved, once passed.
    charge: Option<Charge>,
}

/// What the gateway makes of an attempt's size before admission.
pub(super) enum Shape {
    /// Not sized (the lane has no tokens).
    Unsized,
    /// Over `maxInputTokens`: refused before admission.
    TooLong,
    /// Sized.
    Sized(RequestSize),
}

/// A lane's tokens over a run: the usage of its answered requests, the
/// estimate's error and the refusals tokens caused.
#[derive(Clone, Debug, Default)]
pub struct LaneTokens {
    /// Input tokens of each answered request.
    pub input: Vec<u32>,
    /// Output tokens of each answered request.
    pub output: Vec<u32>,
    /// Settled ÷ reserved work units of each request of a lane with `cost`
    /// settled with usage.
    pub settled_to_reserved: Vec<f32>,
    /// Attempts refused before admission for `maxInputTokens`.
    pub context_too_long: u64,
    /// Attempts refused for the pool's long-context limit.
    pub long_context_refusals: u64,
}

fn count(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

impl Sim<'_> {
    /// The shape of attempt `a` of lane `li` at profile `p`'s gateway (its
    /// core exists), recorded for the pool and the settlement.
    pub(super) fn shape(&mut self, a: &Attempt, li: usize, p: usize) -> Shape {
        let Some(sampler) = self.sampler_of(a) else {
            return Shape::Unsized;
        };
        let Some(core) = self.cores[p].as_ref() else {
            return Shape::Unsized;
        };
        let Some(cfg) = core.lane_index(&self.lanes[li].name).map(|i| core.lane(i)) else {
            return Shape::Unsized;
        };
        let drawn = sampler.draw(self.sc.seed, u64::from(a.id));
        let body_bytes = drawn.input.saturating_mul(DEFAULT_BYTES_PER_TOKEN);
        let body_bytes = usize::try_from(body_bytes).unwrap_or(usize::MAX);
        let limits = cfg.tokens.filter(|_| core.enforcing());
        // The gateway's own input check (an estimate from the body's size).
        if limits.is_some_and(|l| check_input(body_bytes, &l, None).is_err()) {
            return Shape::TooLong;
        }
        let limit = limits.and_then(|l| l.output_limit());
        let usage = Usage {
            prompt_tokens: drawn.input,
            completion_tokens: limit.map_or(drawn.output, |l| drawn.output.min(l)),
        };
        let pool_units = cfg.cost.as_ref().map_or(self.lanes[li].units, |c| {
            c.of(usage.prompt_tokens, usage.completion_tokens)
        });
        let priced = core.enforcing() && cfg.cost.is_some();
        let size = RequestSize {
            body_bytes,
            max_tokens: limit.filter(|_| priced),
            input_tokens: None,
        };
        let t = TokenAttempt {
            usage,
            pool_units,
            charge: None,
        };
        self.token_attempts.insert((a.id, a.n), t);
        Shape::Sized(size)
    }

    /// A sized attempt passed with `charge`.
    pub(super) fn charged(&mut self, a: &Attempt, charge: Option<&Charge>) {
        if let (Some(t), Some(c)) = (self.token_attempts.get_mut(&(a.id, a.n)), charge) {
            t.charge = Some(c.clone());
        }
    }

    /// The work units attempt `a` takes of the pool.
    pub(super) fn units_of(&self, a: &Attempt) -> f64 {
        let li = usize::from(a.lane);
        if self.lanes[li].tokens.is_none() {
            return self.lanes[li].units;
        }
        self.token_attempts
            .get(&(a.id, a.n))
            .map_or(self.lanes[li].units, |t| t.pool_units)
    }

    /// How much longer than the lane's mean request attempt `a` takes.
    pub(super) fn service_factor(&self, a: &Attempt) -> f64 {
        let li = usize::from(a.lane);
        let (Some(s), Some(t)) = (self.lanes[li].tokens, self.token_attempts.get(&(a.id, a.n)))
        else {
            return 1.0;
        };
        s.service_factor(t.usage.prompt_tokens, t.usage.completion_tokens)
    }

    /// Attempt `a` ended at `now` in profile `p`'s pool, answered or not:
    /// its reservation is settled (with its usage when answered) and its
    /// usage counted. Returns whether a waiting request may go now.
    pub(super) fn settle(&mut self, a: &Attempt, p: usize, answered: bool, now: f64) -> bool {
        let Some(t) = self.token_attempts.remove(&(a.id, a.n)) else {
            return false;
        };
        let li = usize::from(a.lane);
        let usage = answered.then_some(t.usage);
        let settled = match (t.charge.as_ref(), self.cores[p].as_mut()) {
            (Some(c), Some(core)) => core.settle(c, usage, now).map(|s| (c.priced, s)),
            _ => None,
        };
        let Some(lt) = self.out.lanes[li].tokens.as_mut() else {
            return false;
        };
        if let Some(u) = usage {
            lt.input.push(count(u.prompt_tokens));
            lt.output.push(count(u.completion_tokens));
        }
        match settled {
            Some((priced, s)) => {
                if priced && usage.is_some() && s.reserved_units > 0.0 {
                    lt.settled_to_reserved
                        .push((s.charged_units / s.reserved_units) as f32);
                }
                s.wake
            }
            None => false,
        }
    }

    /// The attempt ended before the pool (refused, expired, deferred):
    /// nothing of it is kept.
    pub(super) fn forget_tokens(&mut self, a: &Attempt) {
        if self.lanes[usize::from(a.lane)].tokens.is_some() {
            self.token_attempts.remove(&(a.id, a.n));
        }
    }

    /// Counts a refusal of lane `li` by the long-context limit.
    pub(super) fn count_long_context(&mut self, li: usize) {
        if let Some(t) = self.out.lanes[li].tokens.as_mut() {
            t.long_context_refusals += 1;
        }
    }
}
