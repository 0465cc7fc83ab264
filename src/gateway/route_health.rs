//! Which route a passed request may go to now: each route's circuit breaker
//! and pace (the pure machines of [`lanes::breaker`] and
//! [`lanes::route_pace`]), driven by the upstream's answers. A taken route
//! is held by a [`Taken`] until its answer is classified ([`Taken::end`]);
//! dropped without one (the client went away), it gives back its place and
//! any probe.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use lanes::{Breaker, Breakers, Gate, LaneRoutes, Paced, RoutePace, Upshot};
use prometheus::Gauge;

use super::route_metrics::{KeptAway, RouteMetrics};

/// How an upstream answer counts for its route.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Ending {
    /// An answer that is not a failure.
    Answered,
    /// A 5xx (but a 503 with Retry-After), a connect error or a timeout.
    Failed,
    /// 429, or 503 with Retry-After: the route is paced. (status, seconds)
    PushedBack(u16, Option<f64>),
    /// Says nothing about the route: a timeout of a request that had less
    /// than [`TIMEOUT_COUNTS_FROM_SECONDS`] left when sent.
    Inconclusive,
}

/// A timeout counts as the route's failure only when the request gave the
/// route at least this long (a request that arrives with milliseconds of
/// its deadline left times out on any route).
pub(super) const TIMEOUT_COUNTS_FROM_SECONDS: f64 = 1.0;

impl Ending {
    /// A timeout after `given` seconds.
    pub(super) fn timed_out(given: f64) -> Ending {
        if given >= TIMEOUT_COUNTS_FROM_SECONDS {
            Ending::Failed
        } else {
            Ending::Inconclusive
        }
    }
}

/// Why no route of a lane may take a request now (about its first route).
#[derive(Clone, Debug, PartialEq)]
pub(super) enum KeptOff {
    /// The route's breaker is open: it may be tried in `retry_in` seconds.
    Open { route: String, retry_in: f64 },
    /// The route is paced and full.
    Paced {
        route: String,
        limit: usize,
        retry_in: f64,
    },
}

struct Route {
    breaker: Breaker,
    pace: RoutePace,
    in_flight: usize,
    /// Its `lanekeeper_gateway_route_share` (set on every request: held
    /// here, not looked up by name each time).
    share: Gauge,
}

/// Every route's breaker and pace.
pub(super) struct RouteHealth {
    start: Instant,
    /// The breakers' jitter, seeded from the wall clock (replicas differ).
    jitter: Mutex<ChaCha8Rng>,
    routes: Mutex<HashMap<Arc<str>, Route>>,
    settings: Mutex<Breakers>,
    metrics: RouteMetrics,
}

impl RouteHealth {
    pub(super) fn new(metrics: RouteMetrics) -> RouteHealth {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id());
        RouteHealth {
            start: Instant::now(),
            jitter: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
            routes: Mutex::new(HashMap::new()),
            settings: Mutex::new(Breakers::default()),
            metrics,
        }
    }

    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Route>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A config's breaker settings are in force (a route keeps its state).
    pub(super) fn configure(&self, breakers: Option<&Breakers>) {
        let b = breakers.cloned().unwrap_or_default();
        for (name, r) in self.lock().iter_mut() {
            r.breaker.set_settings(b.for_route(name).clone());
        }
        *self.settings.lock().unwrap_or_else(|e| e.into_inner()) = b;
    }

    fn settings_of(&self, route: &str) -> lanes::BreakerSettings {
        self.settings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .for_route(route)
            .clone()
    }

    /// The first of a lane's routes, then of its breaker fallbacks that
    /// are `known` (this gateway has a `--route` for them), that may take a
    /// request now; else why the first route may not.
    pub(super) fn take(
        self: &Arc<Self>,
        lane: &LaneRoutes,
        known: impl Fn(&str) -> bool,
    ) -> Result<Taken, KeptOff> {
        let now = self.now();
        let mut first = None;
        let routes = &lane.routes;
        let fallbacks = lane.breaker_fallbacks.iter().filter(|r| known(r));
        for (i, name) in routes.iter().chain(fallbacks).enumerate() {
            match self.try_route(name, now) {
                Ok(probe) => {
                    let fallback = i >= routes.len();
                    if fallback {
                        self.metrics.fallback(name);
                    }
                    return Ok(Taken {
                        health: Arc::clone(self),
                        route: Arc::clone(name),
                        probe,
                        fallback,
                        heard: false,
                    });
                }
                Err(k) => {
                    first.get_or_insert(k);
                }
            }
        }
        Err(first.expect("a lane has at least one route"))
    }

    /// The route's breaker, then its pace: Ok(probe) or why not.
    fn try_route(&self, route: &Arc<str>, now: f64) -> Result<bool, KeptOff> {
        let name: &str = route;
        let mut routes = self.lock();
        let r = routes.entry(Arc::clone(route)).or_insert_with(|| {
            self.metrics.state(name, lanes::BreakerState::Closed);
            Route {
                breaker: Breaker::new(self.settings_of(name)),
                pace: RoutePace::default(),
                in_flight: 0,
                share: self.metrics.share_of(name),
            }
        });
        let (gate, moved) = r.breaker.gate(now);
        if let Some(t) = moved {
            self.metrics.transition(name, t);
            tracing::info!(
                route = name,
                from = t.from.as_str(),
                to = t.to.as_str(),
                "route breaker"
            );
        }
        let probe = match gate {
            Gate::Pass => false,
            Gate::Probe => true,
            Gate::Refuse { retry_in } => {
                self.metrics.kept_away(name, KeptAway::BreakerOpen);
                return Err(KeptOff::Open {
                    route: name.to_owned(),
                    retry_in,
                });
            }
        };
        if let Paced::Full { limit, retry_in } = r.pace.admit(now, r.in_flight) {
            if probe {
                r.breaker.probe_abandoned();
            }
            self.metrics.kept_away(name, KeptAway::Paced);
            return Err(KeptOff::Paced {
                route: name.to_owned(),
                limit,
                retry_in,
            });
        }
        r.share.set(r.pace.share(now));
        r.in_flight += 1;
        Ok(probe)
    }

    /// The route's answer for a request it took: the breaker and the pace
    /// hear it.
    fn heard(&self, route: &str, probe: bool, ending: Ending) {
        let now = self.now();
        let mut routes = self.lock();
        let Some(r) = routes.get_mut(route) else {
            return;
        };
        let upshot = match ending {
            Ending::Inconclusive => {
                if probe {
                    r.breaker.probe_abandoned();
                }
                return;
            }
            Ending::Failed => Upshot::Failure,
            Ending::Answered => Upshot::Success,
            Ending::PushedBack(status, retry_after) => {
                r.pace.pushed_back(now, retry_after, r.in_flight);
                self.metrics.push_back(route, status);
                r.share.set(r.pace.share(now));
                Upshot::Success
            }
        };
        let jitter = self
            .jitter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .random::<f64>();
        if let Some(t) = r.breaker.record(now, probe, upshot, jitter) {
            self.metrics.transition(route, t);
            tracing::warn!(
                route,
                from = t.from.as_str(),
                to = t.to.as_str(),
                "route breaker"
            );
        }
    }

    /// A request the route took is over: its place is free; a probe that
    /// was never answered lets the next request probe.
    fn left(&self, route: &str, unanswered_probe: bool) {
        let mut routes = self.lock();
        if let Some(r) = routes.get_mut(route) {
            r.in_flight = r.in_flight.saturating_sub(1);
            if unanswered_probe {
                r.breaker.probe_abandoned();
            }
        }
    }
}

/// A route taken for one request, held until its answer ends.
pub(super) struct Taken {
    health: Arc<RouteHealth>,
    pub(super) route: Arc<str>,
    probe: bool,
    /// The route is one of the lane's approved fallbacks.
    pub(super) fallback: bool,
    heard: bool,
}

impl Taken {
    /// The route's answer (or failure) for this request, heard; the place
    /// is kept until the returned hold is dropped.
    pub(super) fn classified(mut self, ending: Ending) -> Taken {
        self.heard = true;
        self.health.heard(&self.route, self.probe, ending);
        self
    }

    /// The request failed before any answer: heard, and its place freed.
    pub(super) fn end(self, ending: Ending) {
        drop(self.classified(ending));
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        self.health.left(&self.route, self.probe && !self.heard);
    }
}

/// How an upstream status counts: 429, and 503 with `Retry-After`, push
/// back; other 5xx fail; the rest are answers. `retry_after` is the
/// header's value in seconds (delay-seconds; an HTTP date is not read).
pub(super) fn ending_of(status: u16, retry_after: Option<&str>) -> Ending {
    let seconds = retry_after.and_then(|v| v.trim().parse::<f64>().ok());
    match status {
        429 => Ending::PushedBack(status, seconds),
        503 if seconds.is_some() => Ending::PushedBack(status, seconds),
        500..=599 => Ending::Failed,
        _ => Ending::Answered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lane's routes and breaker fallbacks.
    fn lane(routes: &[&str], fallbacks: &[&str]) -> LaneRoutes {
        let shared = |names: &[&str]| names.iter().map(|&n| Arc::from(n)).collect();
        LaneRoutes {
            routes: shared(routes),
            breaker_fallbacks: shared(fallbacks),
        }
    }

    /// Every route is one this gateway has.
    fn any(_: &str) -> bool {
        true
    }

    fn health() -> Arc<RouteHealth> {
        Arc::new(RouteHealth::new(RouteMetrics::new(
            &prometheus::Registry::new(),
        )))
    }

    #[test]
    fn statuses_count_as_the_breaker_and_the_pace_read_them() {
        assert_eq!(ending_of(200, None), Ending::Answered);
        assert_eq!(ending_of(404, None), Ending::Answered);
        assert_eq!(ending_of(500, Some("5")), Ending::Failed);
        assert_eq!(ending_of(503, None), Ending::Failed);
        assert_eq!(
            ending_of(503, Some("5")),
            Ending::PushedBack(503, Some(5.0))
        );
        assert_eq!(ending_of(429, None), Ending::PushedBack(429, None));
        assert_eq!(
            ending_of(429, Some(" 2.5 ")),
            Ending::PushedBack(429, Some(2.5))
        );
        // An HTTP date is not a number of seconds.
        assert_eq!(
            ending_of(429, Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            Ending::PushedBack(429, None)
        );
    }

    #[test]
    fn only_a_timeout_with_time_to_answer_is_the_routes_failure() {
        assert_eq!(Ending::timed_out(30.0), Ending::Failed);
        assert_eq!(Ending::timed_out(0.004), Ending::Inconclusive);
        let h = health();
        let mut s = Breakers::default();
        s.default.consecutive_failures = 1;
        h.configure(Some(&s));
        let routes = lane(&["r"], &[]);
        for _ in 0..10 {
            h.take(&routes, any).unwrap().end(Ending::timed_out(0.01));
        }
        assert!(h.take(&routes, any).is_ok(), "still closed");
        h.take(&routes, any).unwrap().end(Ending::timed_out(5.0));
        assert!(matches!(h.take(&routes, any), Err(KeptOff::Open { .. })));
    }

    #[test]
    fn an_open_breaker_keeps_requests_off_and_sends_them_to_a_fallback() {
        let h = health();
        let mut s = Breakers::default();
        s.default.consecutive_failures = 2;
        s.default.open_seconds = 60.0;
        h.configure(Some(&s));
        let primary = lane(&["main"], &[]);
        let with_spare = lane(&["main"], &["spare"]);
        for _ in 0..2 {
            h.take(&primary, any).unwrap().end(Ending::Failed);
        }
        match h.take(&primary, any) {
            Err(KeptOff::Open { route, retry_in }) => {
                assert_eq!(route, "main");
                assert!(retry_in > 59.0 && retry_in <= 72.0, "{retry_in}");
            }
            other => panic!("{:?}", other.map(|t| t.route.clone())),
        }
        // A fallback this gateway has no route for is skipped.
        let unknown = h.take(&with_spare, |r| r != "spare");
        assert!(matches!(unknown, Err(KeptOff::Open { .. })));
        let t = h.take(&with_spare, any).unwrap();
        assert_eq!((&*t.route, t.fallback), ("spare", true));
    }

    #[test]
    fn a_push_back_paces_the_route_and_a_dropped_request_gives_its_place_back() {
        let h = health();
        let routes = lane(&["r"], &[]);
        let held: Vec<Taken> = (0..4).map(|_| h.take(&routes, any).unwrap()).collect();
        let mut held = held.into_iter();
        held.next()
            .unwrap()
            .end(Ending::PushedBack(429, Some(30.0)));
        // Peak 4 at the push-back, share 0.5: 2 at once; 3 still in flight.
        match h.take(&routes, any) {
            Err(KeptOff::Paced {
                limit, retry_in, ..
            }) => {
                assert_eq!(limit, 2);
                assert!(retry_in > 29.0, "{retry_in}");
            }
            other => panic!("{:?}", other.map(|t| t.route.clone())),
        }
        drop(held);
        // All gone (dropped without an answer): two may go at once.
        let a = h.take(&routes, any).unwrap();
        let _b = h.take(&routes, any).unwrap();
        assert!(h.take(&routes, any).is_err());
        drop(a);
        assert!(h.take(&routes, any).is_ok());
    }
}
