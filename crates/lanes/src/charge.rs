//! Tokens as the cost, inside the core: estimate, reserve, settle.
//!
//! A request the gateway sized ([`RequestSize`]: its body's bytes and the
//! `max_tokens` it may get) is estimated by its lane
//! ([`crate::token_estimate`]: input from the body at the lane's learned
//! bytes per token, output at the lane's P95 of settled answers). In a lane
//! with `cost` it reserves `perRequest + perInputToken × input +
//! perOutputToken × output` work units instead of one request's
//! `workUnitsPerRequest`. The lane's bucket counts requests of
//! `workUnitsPerRequest` units, so the reservation takes `units ÷
//! workUnitsPerRequest` of its tokens: the bucket's rate in work units, the
//! floors, grants and spare capacity keep their one unit. A request larger
//! than the bucket passes when the bucket is full and leaves it in debt.
//!
//! When the answer ends, [`Core::settle`] corrects the reservation with the
//! answer's `usage`: the difference goes back to the bucket (a credit never
//! fills it past its size) or is taken from it (into debt: later requests
//! wait for it). An answer without usage keeps its reservation: never a
//! refund on missing data. The lane's estimator learns from every settled
//! usage. A lane without `cost` charges one token per request, as before.
//!
//! A priced request is also expected to cost its output at the lane's mean
//! (not its P95): the lane keeps what its requests in flight are expected
//! to give back ([`Lane::refunds_due`]), and a queue's wait counts that
//! flow next to the lane's rate (see `arrival::queue_wait`).

use std::sync::Arc;

use crate::bucket::Bucket;
use crate::core::Core;
use crate::lane::{Lane, effective_rate};
use crate::request_shape::{DEFAULT_BYTES_PER_TOKEN, estimate_input_tokens};
use crate::settlement::Usage;
use crate::token_estimate::TokenEstimate;

/// The least a priced request reserves, in work units (a cost model whose
/// terms come to 0 for an empty body still charges something).
const MIN_UNITS: f64 = 1e-6;

/// What the gateway read of a request before admission.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestSize {
    /// The bytes of the body forwarded upstream.
    pub body_bytes: usize,
    /// The most output tokens it may get (`max_tokens` after the lane's
    /// limits), when it says.
    pub max_tokens: Option<u64>,
    /// Its input tokens counted with its route's tokenizer (None: estimated
    /// from `body_bytes` at the lane's learned ratio).
    pub input_tokens: Option<u64>,
}

/// What an arriving request charges.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Sized {
    /// Work units.
    pub(crate) units: f64,
    /// Tokens of its lane's bucket (1 for an unpriced request).
    pub(crate) tokens: f64,
    /// Work units it is expected to give back when it settles: its
    /// reservation less what it is expected to cost (its output at the
    /// lane's mean, not its P95). 0 for an unpriced request.
    pub(crate) refund_due: f64,
    /// Its estimate, when the request was sized.
    pub(crate) estimate: Option<Estimated>,
}

/// A sized request's estimate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Estimated {
    pub(crate) tokens: TokenEstimate,
    pub(crate) body_bytes: usize,
    /// Its input tokens were counted, not estimated.
    pub(crate) input_counted: bool,
    /// The units come from the lane's `cost` (else `workUnitsPerRequest`).
    pub(crate) priced: bool,
    /// Above the pool's `longContext.aboveInputTokens`.
    pub(crate) long_context: bool,
}

impl Sized {
    /// One request of `units` work units, one token.
    pub(crate) fn flat(units: f64) -> Sized {
        Sized {
            units,
            tokens: 1.0,
            refund_due: 0.0,
            estimate: None,
        }
    }

    /// Whether it counts against the pool's long-context limit.
    pub(crate) fn long_context(&self) -> bool {
        self.estimate.is_some_and(|e| e.long_context)
    }
}

/// What a passed request reserved: hand it to [`Core::settle`] when its
/// answer ends (with or without usage).
#[derive(Clone, Debug, PartialEq)]
pub struct Charge {
    /// Its lane's name (the config may change while it runs).
    pub lane: Arc<str>,
    /// Work units reserved.
    pub units: f64,
    /// Work units it is expected to give back when it settles (its
    /// reservation less its output at the lane's mean), counted as due
    /// while it runs.
    pub refund_due: f64,
    /// The tokens it was estimated at.
    pub estimate: TokenEstimate,
    /// The bytes of its body (what the lane's ratio learns from).
    pub body_bytes: usize,
    /// Its input tokens were counted with a tokenizer (the ratio of bytes
    /// to tokens learns nothing from it).
    pub input_counted: bool,
    /// Whether the units come from the lane's `cost` (settled with usage).
    pub priced: bool,
    /// Whether it holds one of the pool's long-context places.
    pub long_context: bool,
}

impl Charge {
    /// The body that went upstream had `body_bytes` (fewer than were
    /// estimated when its chat history was trimmed): the answer's prompt
    /// tokens count that body, so the lane's bytes-per-token ratio learns
    /// from these bytes when it settles.
    pub fn sent_upstream(&mut self, body_bytes: usize) {
        self.body_bytes = body_bytes;
    }
}

/// What a settlement did, for the gateway's metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settled {
    /// The lane's index in the config in force.
    pub lane: usize,
    /// Work units reserved at admission.
    pub reserved_units: f64,
    /// Work units charged in the end (the actual cost with usage, the
    /// reservation without).
    pub charged_units: f64,
    /// The usage it was settled with.
    pub usage: Option<Usage>,
    /// A waiting request may go now (a credit or a freed long-context
    /// place): the caller wakes its driver.
    pub wake: bool,
}

impl Lane {
    /// What a request of `size` charges (a lane with `cost` prices it; an
    /// unsized request is one request). `long_above` is the pool's
    /// long-context threshold.
    pub(crate) fn size(&self, size: Option<RequestSize>, long_above: Option<u64>) -> Sized {
        let per_request = self.cfg.work_units_per_request;
        let Some(size) = size else {
            return Sized::flat(per_request);
        };
        let mut tokens = self.estimator.estimate(size.body_bytes, size.max_tokens);
        if let Some(counted) = size.input_tokens {
            tokens.input = counted;
        }
        let cost = self.cfg.cost.as_ref();
        let units = cost.map_or(per_request, |c| {
            c.of(tokens.input, tokens.output).max(MIN_UNITS)
        });
        let expected_units = cost.map_or(per_request, |c| {
            let output = self.estimator.expected_output(Some(tokens.output));
            c.of(tokens.input, output).max(MIN_UNITS)
        });
        Sized {
            units,
            refund_due: (units - expected_units).max(0.0),
            tokens: if cost.is_some() {
                units / per_request
            } else {
                1.0
            },
            estimate: Some(Estimated {
                tokens,
                body_bytes: size.body_bytes,
                input_counted: size.input_tokens.is_some(),
                priced: cost.is_some(),
                long_context: long_above.is_some_and(|a| long_input(&size, tokens.input) > a),
            }),
        }
    }

    /// The charge a pass of `sized` carries (None for an unsized request).
    pub(crate) fn charge(&self, sized: &Sized) -> Option<Charge> {
        let e = sized.estimate?;
        Some(Charge {
            lane: Arc::clone(&self.name),
            units: sized.units,
            refund_due: sized.refund_due,
            estimate: e.tokens,
            body_bytes: e.body_bytes,
            input_counted: e.input_counted,
            priced: e.priced,
            long_context: e.long_context,
        })
    }
}

/// The input tokens a request counts with against the pool's long-context
/// limit: its counted tokens, else the larger of the lane's estimate and
/// its body's bytes ÷ [`DEFAULT_BYTES_PER_TOKEN`] (the figure
/// `maxInputTokens` reads). The lane's learned ratio follows what its
/// clients send (bodies padded with fields the model does not read teach
/// it up to 16 bytes a token), so alone it could make a long prompt look
/// short to the limit.
fn long_input(size: &RequestSize, estimated: u64) -> u64 {
    size.input_tokens.unwrap_or_else(|| {
        estimated.max(estimate_input_tokens(
            size.body_bytes,
            DEFAULT_BYTES_PER_TOKEN,
        ))
    })
}

/// Takes `tokens` from `bucket` if it holds them, or if it is full when the
/// request is larger than the bucket (which then goes into debt). One token
/// is the plain rule of [`Bucket::take`]. A paused lane's bucket (size 0)
/// is never "full": it gives nothing.
fn take(bucket: &mut Bucket, tokens: f64) -> bool {
    if tokens == 1.0 {
        return bucket.take();
    }
    if bucket.paused {
        return false;
    }
    if bucket.tokens + 1e-9 >= tokens.min(bucket.cap()) {
        bucket.tokens -= tokens;
        true
    } else {
        false
    }
}

impl Core {
    /// Takes what a request of `sized` needs to pass in lane `li`: tokens
    /// of its own bucket or, for a lane that may, spare capacity within its
    /// ceiling. A pass is charged to the ceiling either way. False: nothing
    /// was taken.
    pub(crate) fn take_for(&mut self, li: usize, sized: &Sized, now: f64) -> bool {
        let lane = &mut self.lanes[li];
        let took = take(&mut lane.bucket, sized.tokens)
            || lane.draws_on_spare()
                && lane.below_ceiling(sized.units, now)
                && self.spare.take(now, sized.units);
        if took {
            lane.passed(sized.units, now);
            lane.refunds_due += sized.refund_due;
        }
        took
    }

    /// Decides on an arriving request of a known size at `now`: as
    /// [`Core::admit`], with the request charged its estimated cost in a
    /// lane with `cost` and counted against the pool's long-context limit
    /// when it is long. A pass carries its [`Charge`].
    pub fn admit_sized(
        &mut self,
        req: &crate::Request<'_>,
        size: RequestSize,
        now: f64,
    ) -> crate::Verdict {
        let mut none = crate::IdHint::NONE;
        self.admit_with(req, Some(size), &mut none, now)
    }

    /// [`Core::admit_sized`] for a client that carries where its request id
    /// was written (as [`Core::admit_hinted`]; `simulate` sizes its
    /// requests so).
    pub fn admit_sized_hinted(
        &mut self,
        req: &crate::Request<'_>,
        size: RequestSize,
        hint: &mut crate::IdHint,
        now: f64,
    ) -> crate::Verdict {
        self.admit_with(req, Some(size), hint, now)
    }

    /// A passed request's answer ended: its reservation is settled with the
    /// answer's `usage` (None, or one that is not [`Usage::plausible`]: the
    /// reservation stands) and its long-context place, if it held one, is
    /// given back. None when its lane left the config (its place is still
    /// given back).
    pub fn settle(&mut self, charge: &Charge, usage: Option<Usage>, now: f64) -> Option<Settled> {
        let usage = usage.filter(Usage::plausible);
        let mut wake = charge.long_context && self.pool.release_long();
        let li = self.lane_index(&charge.lane)?;
        let rate = effective_rate(&self.lanes, li, now);
        let lane = &mut self.lanes[li];
        let mut charged = charge.units;
        lane.refunds_due = (lane.refunds_due - charge.refund_due).max(0.0);
        if let Some(u) = usage {
            let bytes = (!charge.input_counted).then_some(charge.body_bytes);
            lane.estimator
                .learn(bytes, u.prompt_tokens, u.completion_tokens);
        }
        if let (true, Some(cost), Some(u)) = (charge.priced, lane.cfg.cost.as_ref(), usage) {
            charged = cost.of(u.prompt_tokens, u.completion_tokens);
            lane.refill(now, rate);
            if let Some(c) = lane.ceiling.as_mut() {
                c.settle(charge.units - charged, now);
            }
            let delta = (charge.units - charged) / lane.cfg.work_units_per_request;
            let b = &mut lane.bucket;
            let mut next = b.tokens + delta;
            if delta > 0.0 {
                // A credit fills the bucket up to its size (or what the
                // waiting requests keep), never past what it held. A paused
                // lane's bucket has no size: a credit pays its debt and no
                // more, so nothing passes while it is paused.
                let cap = if b.paused {
                    b.cap()
                } else {
                    b.cap().max(lane.queue.len() as f64)
                };
                next = next.min(cap.max(b.tokens));
                wake |= !b.paused && !lane.queue.is_empty();
            }
            b.tokens = next;
        }
        wake &= self.lanes.iter().any(|l| !l.queue.is_empty());
        Some(Settled {
            lane: li,
            reserved_units: charge.units,
            charged_units: charged,
            usage,
            wake,
        })
    }

    /// The estimate a request of `size` would get in lane `li` now: its
    /// input and output tokens and its work units.
    pub fn estimate(&self, li: usize, size: RequestSize) -> (TokenEstimate, f64) {
        let s = self.lanes[li].size(Some(size), None);
        let e = s.estimate.expect("a sized request has an estimate");
        (e.tokens, s.units)
    }
}

#[cfg(test)]
#[path = "charge_tests.rs"]
mod tests;
