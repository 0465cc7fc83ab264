//! What goes into the core (a [`Request`]) and what comes out (a
//! [`Verdict`] on arrival, a [`Resolution`] for a request that waited).

/// What happened to a request, one label value of the gateway's request
/// metric each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// Sent upstream at once.
    Admitted,
    /// Waited in the lane's queue (it later resolves to another outcome).
    Queued,
    /// No token (or the lane is paused) and nowhere to wait.
    RejectedRate,
    /// The lane's queue was full.
    RejectedQueueFull,
    /// Could not be served within its deadline.
    RejectedDeadline,
    /// Beyond `retry.maxAttempts` or the lane's retry budget.
    RejectedRetryBudget,
    /// Refused at the in-flight `stopAt` watermark (sheddable lanes).
    RejectedOverload,
    /// Deferred: come back after `Retry-After` (lanes with `deferral`).
    Deferred,
    /// Waited in the queue past its TTL.
    Expired,
    /// The upstream failed (counted by the proxy, never by the core).
    UpstreamError,
}

impl Outcome {
    /// Every outcome, in label order.
    pub const ALL: [Outcome; 10] = [
        Outcome::Admitted,
        Outcome::Queued,
        Outcome::RejectedRate,
        Outcome::RejectedQueueFull,
        Outcome::RejectedDeadline,
        Outcome::RejectedRetryBudget,
        Outcome::RejectedOverload,
        Outcome::Deferred,
        Outcome::Expired,
        Outcome::UpstreamError,
    ];

    /// The label value (`rejected_queue_full`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Admitted => "admitted",
            Outcome::Queued => "queued",
            Outcome::RejectedRate => "rejected_rate",
            Outcome::RejectedQueueFull => "rejected_queue_full",
            Outcome::RejectedDeadline => "rejected_deadline",
            Outcome::RejectedRetryBudget => "rejected_retry_budget",
            Outcome::RejectedOverload => "rejected_overload",
            Outcome::Deferred => "deferred",
            Outcome::Expired => "expired",
            Outcome::UpstreamError => "upstream_error",
        }
    }
}

/// How a request counts for the retry rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Attempt {
    /// The first attempt of a request.
    Original,
    /// A later attempt after a failure.
    Retry,
    /// Back after a deferral: neither, and it keeps its first arrival.
    Returning,
}

impl Attempt {
    /// Every kind, in label order.
    pub const ALL: [Attempt; 3] = [Attempt::Original, Attempt::Retry, Attempt::Returning];

    /// The metric label value (`original`, `retry`, `returning`).
    pub fn as_str(self) -> &'static str {
        match self {
            Attempt::Original => "original",
            Attempt::Retry => "retry",
            Attempt::Returning => "returning",
        }
    }
}

/// The limit that refused a request, named as in `lanes.json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// The lane's token bucket (`admittedRequestsPerSecond`).
    Rate,
    /// The lane is paused (`state: Paused`): retrying before the controller
    /// releases it does not help.
    Paused,
    /// The wait would be longer than `queue.ttlSeconds`.
    QueueTtl,
    /// The queue is full (`queue.maxDepth`).
    QueueDepth,
    /// The request cannot be served within `deadlineSeconds`.
    Deadline,
    /// Beyond `retry.maxAttempts`.
    MaxAttempts,
    /// Beyond `retry.budgetPercent` of the recent originals.
    RetryBudget,
    /// In flight reached `inFlight.stopAt`.
    StopAt,
    /// Deferred (a `Defer` lane's answer to any of the above).
    Deferred,
    /// The lane was removed from the config while the request waited.
    LaneRemoved,
    /// The request's tenant has its `tenants.maxConcurrency` in flight and
    /// it could not wait (the queue was full, or its wait ran out).
    TenantConcurrency,
    /// The pool's model slots (`concurrency.max`) are all in flight.
    ModelSlots,
    /// The pool's long-context requests (`longContext.maxConcurrency`) are
    /// all in flight and this request is one.
    LongContext,
}

impl Limit {
    /// The limit in words, for an error body.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Rate => "admittedRequestsPerSecond",
            Limit::Paused => "state: Paused",
            Limit::QueueTtl => "queue.ttlSeconds",
            Limit::QueueDepth => "queue.maxDepth",
            Limit::Deadline => "deadlineSeconds",
            Limit::MaxAttempts => "retry.maxAttempts",
            Limit::RetryBudget => "retry.budgetPercent",
            Limit::StopAt => "inFlight.stopAt",
            Limit::Deferred => "deferred",
            Limit::LaneRemoved => "lane removed from the config",
            Limit::TenantConcurrency => "tenants.maxConcurrency of the tenant",
            Limit::ModelSlots => "concurrency.max",
            Limit::LongContext => "longContext.maxConcurrency",
        }
    }
}

/// One arriving request, as the proxy read it from the headers.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The lane header's value.
    pub lane: &'a str,
    /// The tenant header's value (None: the default tenant).
    pub tenant: Option<&'a str>,
    /// `x-lanekeeper-attempt` (1 = original; None when absent).
    pub attempt: Option<u32>,
    /// `Idempotency-Key` or `x-request-id`.
    pub request_id: Option<&'a str>,
}

/// A request that may go upstream now.
#[derive(Clone, Debug, PartialEq)]
pub struct Pass {
    /// Index of the lane in the config.
    pub lane: usize,
    /// How the request counted.
    pub attempt: Attempt,
    /// The conversation turns to send, when the lane has optional context
    /// (degraded while the gateway conserves).
    pub history_turns: Option<i32>,
    /// Seconds the request may still take end to end (the upstream timeout).
    pub remaining_seconds: f64,
    /// Seconds it waited in the queue.
    pub waited_seconds: f64,
    /// Its tenant's place in flight, in a lane with a maximum per tenant:
    /// give it back with [`crate::Core::release_tenant`] when the request
    /// finishes.
    pub tenant_slot: Option<crate::TenantSlot>,
    /// What it reserved, for a request the core was told the size of
    /// ([`crate::Core::admit_sized`]): hand it to [`crate::Core::settle`]
    /// when the answer ends.
    pub charge: Option<crate::Charge>,
}

/// A request that may not go upstream.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// Index of the lane in the config.
    pub lane: usize,
    /// How the request counted.
    pub attempt: Attempt,
    /// Which limit (one of the rejected outcomes, `Deferred` or `Expired`).
    pub outcome: Outcome,
    /// The limit, for the error body.
    pub limit: Limit,
    /// `Retry-After` seconds, when there is one.
    pub retry_after_seconds: Option<i64>,
    /// The lane was admitted less than its floor over the last second when
    /// refused (see [`crate::qualified`]).
    pub inside_floor: bool,
}

impl Refusal {
    /// Whether the client is told to come back (`Lanekeeper-Deferred`).
    pub fn deferred(&self) -> bool {
        self.outcome == Outcome::Deferred
    }
}

/// A queued request's place; [`crate::Core::poll`] resolves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// The core's answer to an arriving request.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Go upstream now.
    Pass(Pass),
    /// Wait: [`crate::Core::poll`] resolves the ticket (a Pass or a
    /// Refusal).
    Queued {
        /// Index of the lane.
        lane: usize,
        /// How the request counted.
        attempt: Attempt,
        /// Its place.
        ticket: Ticket,
    },
    /// Refused (or deferred).
    Refuse(Refusal),
    /// The lane header names no lane of the config.
    UnknownLane,
}

impl Verdict {
    /// The outcome label of the verdict on arrival.
    pub fn outcome(&self) -> Option<Outcome> {
        match self {
            Verdict::Pass(_) => Some(Outcome::Admitted),
            Verdict::Queued { .. } => Some(Outcome::Queued),
            Verdict::Refuse(r) => Some(r.outcome),
            Verdict::UnknownLane => None,
        }
    }

    /// The lane's index (None: the request named no lane of the config).
    pub fn lane(&self) -> Option<usize> {
        match self {
            Verdict::Pass(p) => Some(p.lane),
            Verdict::Queued { lane, .. } => Some(*lane),
            Verdict::Refuse(r) => Some(r.lane),
            Verdict::UnknownLane => None,
        }
    }

    /// How the request counted (Original for an unknown lane).
    pub fn attempt(&self) -> Attempt {
        match self {
            Verdict::Pass(p) => p.attempt,
            Verdict::Queued { attempt, .. } => *attempt,
            Verdict::Refuse(r) => r.attempt,
            Verdict::UnknownLane => Attempt::Original,
        }
    }
}

/// A queued request resolved by [`crate::Core::poll`] (or by a config swap).
#[derive(Clone, Debug, PartialEq)]
pub enum Resolution {
    /// Its turn came: go upstream.
    Pass(Pass),
    /// Its wait ran out, or it was deferred to make room.
    Refuse(Refusal),
}
