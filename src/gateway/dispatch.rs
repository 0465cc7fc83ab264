//! What a passed request takes upstream ([`Dispatch`]): made under the
//! core's lock from the config in force, it holds the request's place in
//! flight until its response body ends or is dropped, then reports the
//! latency (and a deadline miss) back.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use lanes::{Attempt, Charge, Core, LaneRoutes, Pass, Served, TenantSlot, Usage};

use super::metrics::LaneMeter;
use super::route_health::Taken;
use super::usage_tap::{Metering, UsageTap};

/// Where a finished request's latency goes (the core, under its lock).
pub(super) trait InFlightSink: Send + Sync {
    /// A request that went upstream finished.
    fn finished(&self, done: Finished);
}

/// What a request in flight reports when it ends.
pub(super) struct Finished {
    /// Its lane's name.
    pub(super) lane: Arc<str>,
    /// Seconds until the upstream's answer began (or until the end when
    /// there was none).
    pub(super) latency: f64,
    /// Seconds from its pass until its answer ended, when it was answered
    /// in full (the lane's service time).
    pub(super) served: Option<f64>,
    /// Its tenant's slot, to give back, when it held one.
    pub(super) tenant: Option<TenantSlot>,
    /// What it reserved, to settle.
    pub(super) charge: Option<Charge>,
    /// The usage its answer reported (None: the reservation stands).
    pub(super) usage: Option<Usage>,
    /// The route that answered a priced request in full: its units count
    /// as completed once settled.
    pub(super) completed_by: Option<Arc<str>>,
    /// Seconds from its pass until the first byte of the upstream's answer
    /// body (None: no byte came).
    pub(super) first_byte: Option<f64>,
}

/// A passed request's way upstream.
pub(super) struct Dispatch {
    pub(super) lane: usize,
    pub(super) meters: Arc<Vec<LaneMeter>>,
    pub(super) attempt: Attempt,
    /// The lane's routes, in order, and the fallbacks an open breaker may
    /// send it to.
    pub(super) routes: LaneRoutes,
    /// The route taken, held until the answer ends (its place in the
    /// route's pace).
    pub(super) route_hold: Option<Taken>,
    pub(super) read_only: bool,
    pub(super) static_fallback: bool,
    /// The lane's routes are its approved fallbacks (a level said so).
    pub(super) fallback_route: bool,
    pub(super) history_turns: Option<i32>,
    /// Seconds the request may still take, from when it passed.
    pub(super) remaining_seconds: f64,
    slot: InFlight,
}

impl Dispatch {
    /// Under the lock: what `pass` needs. The caller has counted it in
    /// flight (`core.started`); `sink` hears when it ends.
    pub(super) fn new(
        sink: Arc<dyn InFlightSink>,
        core: &Core,
        meters: &Arc<Vec<LaneMeter>>,
        pass: &Pass,
    ) -> Dispatch {
        let flags = &core.config().flags;
        Dispatch {
            lane: pass.lane,
            meters: Arc::clone(meters),
            attempt: pass.attempt,
            routes: core.routes(pass.lane).clone(),
            route_hold: None,
            read_only: flags.read_only,
            fallback_route: core.lane(pass.lane).fallback_routes,
            static_fallback: flags.static_fallback,
            history_turns: pass.history_turns,
            remaining_seconds: pass.remaining_seconds,
            slot: InFlight {
                sink,
                meters: Arc::clone(meters),
                lane: pass.lane,
                lane_name: core.lane_name(pass.lane),
                armed: true,
                started: Instant::now(),
                latency: None,
                first_byte: None,
                deadline: None,
                failed: false,
                answered_by: None,
                tenant: pass.tenant_slot.clone(),
                charge: pass.charge.clone(),
                metering: None,
                tap: None,
            },
        }
    }

    /// The client went away before it could be told: nothing is in flight
    /// for it (the caller undoes the count under the lock, and gives back
    /// the tenant's slot returned here).
    pub(super) fn disarm(mut self) -> (Option<TenantSlot>, Option<Charge>) {
        self.slot.armed = false;
        (self.slot.tenant.take(), self.slot.charge.take())
    }

    /// The body sent upstream had `bytes` (its history trimmed): what its
    /// lane's bytes-per-token ratio learns from when it settles.
    pub(super) fn sent_upstream(&mut self, bytes: usize) {
        if let Some(c) = self.slot.charge.as_mut() {
            c.sent_upstream(bytes);
        }
    }

    /// How its answer's usage is read (a request of a priced lane).
    pub(super) fn meter_usage(&mut self, metering: Option<Metering>) {
        self.slot.metering = metering;
    }

    /// Whether its answer is read for its usage (a priced request that is
    /// metered): it must come back as it is, not compressed.
    pub(super) fn reads_answer(&self) -> bool {
        self.slot.metering.is_some() && self.slot.charge.as_ref().is_some_and(|c| c.priced)
    }

    /// Its answer begins (an event stream or not): its usage is read on the
    /// way when it is metered and priced.
    pub(super) fn tap_answer(&mut self, sse: bool) {
        let priced = self.slot.charge.as_ref().is_some_and(|c| c.priced);
        if let Some(m) = self.slot.metering.filter(|_| priced) {
            self.slot.tap = Some(UsageTap::new(sse, m.strip_usage_chunk));
        }
    }

    /// A chunk of the answer on its way: what goes to the client. The
    /// first that is not empty marks the time to the first byte.
    pub(super) fn tapped(&mut self, b: Bytes) -> Bytes {
        if self.slot.first_byte.is_none() && !b.is_empty() {
            self.slot.first_byte = Some(self.slot.started.elapsed().as_secs_f64());
        }
        match self.slot.tap.as_mut() {
            Some(t) => t.chunk(b),
            None => b,
        }
    }

    /// The answer ended: what is left for the client, if anything.
    pub(super) fn tap_end(&mut self) -> Option<Bytes> {
        self.slot.tap.as_mut().and_then(UsageTap::end)
    }

    /// The lane's meters.
    pub(super) fn meter(&self) -> &LaneMeter {
        &self.meters[self.lane]
    }

    /// When it passed admission (its `remaining_seconds` count from here:
    /// a queued request's wait is already taken off them).
    pub(super) fn passed_at(&self) -> Instant {
        self.slot.started
    }

    /// When the request must be done by.
    pub(super) fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.slot.deadline = deadline;
    }

    /// The upstream failed (unreachable, a 5xx, a broken-off answer): the
    /// request counts as bad for the lane's objective.
    pub(super) fn failed(&mut self) {
        self.slot.failed = true;
    }

    /// No route could take it (breaker open, route paced): it never went
    /// upstream, and the lane was not served.
    pub(super) fn kept_off(&mut self) {
        self.slot.failed = true;
        self.slot.latency = Some(f64::NAN);
    }

    /// `route` answered with a 2xx: the lane's units count as completed
    /// once the body ends, unless it fails on the way.
    pub(super) fn answered_by(&mut self, route: Arc<str>) {
        self.slot.answered_by = Some(route);
    }

    /// The upstream answered with headers after `latency` seconds.
    pub(super) fn set_latency(&mut self, latency: f64) {
        self.slot.latency = Some(latency);
    }
}

/// Counts a request in flight until dropped, then reports its latency and
/// counts a deadline miss when it outlived its deadline.
struct InFlight {
    sink: Arc<dyn InFlightSink>,
    meters: Arc<Vec<LaneMeter>>,
    lane: usize,
    lane_name: Arc<str>,
    armed: bool,
    started: Instant,
    latency: Option<f64>,
    /// Seconds from `started` to the answer's first body byte.
    first_byte: Option<f64>,
    deadline: Option<Instant>,
    failed: bool,
    /// The route that answered with a 2xx.
    answered_by: Option<Arc<str>>,
    tenant: Option<TenantSlot>,
    charge: Option<Charge>,
    metering: Option<Metering>,
    tap: Option<UsageTap>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let priced = self.charge.as_ref().is_some_and(|c| c.priced);
        let completed = self.answered_by.take().filter(|_| !self.failed);
        if let Some(route) = completed.as_deref().filter(|_| !priced) {
            self.meters[self.lane].completed(route);
        }
        let late = self.deadline.is_some_and(|t| Instant::now() > t);
        if late {
            self.meters[self.lane].deadline_missed();
        }
        self.meters[self.lane].qualified(lanes::qualified::served(Served {
            answered: self.latency.is_some(),
            failed: self.failed,
            late,
        }));
        let elapsed = self.started.elapsed().as_secs_f64();
        let answered = self.latency.is_some_and(f64::is_finite) && !self.failed;
        if let Some(t) = self.tap.as_mut() {
            // A body with a length may be dropped without its end being
            // polled: read what came.
            t.end();
        }
        self.sink.finished(Finished {
            lane: Arc::clone(&self.lane_name),
            latency: self.latency.unwrap_or(elapsed),
            served: answered.then_some(elapsed),
            tenant: self.tenant.take(),
            charge: self.charge.take(),
            // Only an answer that ended whole says what it cost.
            usage: self
                .tap
                .as_ref()
                .filter(|_| answered)
                .and_then(UsageTap::usage),
            completed_by: completed.filter(|_| priced),
            first_byte: self.first_byte,
        });
    }
}
