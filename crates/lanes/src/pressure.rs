//! In-flight pressure: `inFlight.stopAt` as a concurrency limit (the
//! slots the sheddable lanes share), `conserveAt` with hysteresis, and the
//! latency the gateway measures (its p95 decides when the pool is stable
//! enough to leave conserve). The limit is no latch: a slot is free again
//! the moment a request finishes.

use std::collections::VecDeque;

use crate::config::InFlight;
use crate::latency_window::LatencyWindow;

/// Latency is summarised (p95) over this sliding window.
pub const LATENCY_WINDOW_SECONDS: usize = 10;
/// The default `inFlight.resumeAfterStableSeconds`.
pub const DEFAULT_RESUME_AFTER_STABLE_SECONDS: f64 = 300.0;
/// A p95 more than this factor above the lowest p95 of the last
/// [`LATENCY_RISE_LOOKBACK_SECONDS`] restarts the stable window.
pub const LATENCY_RISE_FACTOR: f64 = 1.25;
/// How far back a rise of the p95 is measured from.
pub const LATENCY_RISE_LOOKBACK_SECONDS: i64 = 60;

/// Completions are counted over this many seconds for the rate at which
/// slots free up (the expected wait for one).
pub const DRAIN_WINDOW_SECONDS: usize = 5;

/// The in-flight pressure state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pressure {
    /// Below the watermarks, or back under `resumeBelow` with the latency
    /// stable.
    Normal,
    /// Entered at `conserveAt`: send degraded history; left only under
    /// `resumeBelow` with the p95 stable `resumeAfterStableSeconds`.
    Conserve,
    /// Every slot of `stopAt` taken now: sheddable lanes wait for one (and
    /// conserve). Left the moment a request finishes.
    Stop,
}

impl Pressure {
    /// Every state, in label order.
    pub const ALL: [Pressure; 3] = [Pressure::Normal, Pressure::Conserve, Pressure::Stop];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Pressure::Normal => "normal",
            Pressure::Conserve => "conserve",
            Pressure::Stop => "stop",
        }
    }
}

/// Watermarks scaled to the replica's share.
#[derive(Clone, Copy, Debug)]
struct Watermarks {
    conserve_at: f64,
    stop_at: f64,
    resume_below: f64,
    resume_after_stable: f64,
}

impl Watermarks {
    fn new(f: &InFlight, share: f64) -> Watermarks {
        Watermarks {
            conserve_at: f.conserve_at as f64 * share,
            stop_at: f.stop_at as f64 * share,
            resume_below: f.resume_below as f64 * share,
            resume_after_stable: f
                .resume_after_stable_seconds
                .map_or(DEFAULT_RESUME_AFTER_STABLE_SECONDS, |s| s as f64),
        }
    }

    /// The slots: `stopAt` (this replica's share), whole, at least one.
    fn limit(&self) -> u64 {
        self.stop_at.floor().max(1.0) as u64
    }
}

/// The slots of the fleet's `stopAt` held by this replica and by the
/// others, as the shared store last said.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FleetSlotsHeld {
    pub(crate) held: u64,
    pub(crate) others: u64,
}

/// Requests finished per second over the last [`DRAIN_WINDOW_SECONDS`]: the
/// rate at which slots free up.
#[derive(Debug, Default)]
struct DrainMeter {
    /// (second, finished).
    slots: [(i64, u32); DRAIN_WINDOW_SECONDS],
}

impl DrainMeter {
    fn add(&mut self, now: f64) {
        let sec = now.floor() as i64;
        let i = sec.rem_euclid(DRAIN_WINDOW_SECONDS as i64) as usize;
        if self.slots[i].0 != sec {
            self.slots[i] = (sec, 0);
        }
        self.slots[i].1 += 1;
    }

    fn rate(&self, now: f64) -> f64 {
        let sec = now.floor() as i64;
        let n: u32 = self
            .slots
            .iter()
            .filter(|(s, _)| *s <= sec && sec - s < DRAIN_WINDOW_SECONDS as i64)
            .map(|(_, c)| c)
            .sum();
        f64::from(n) / DRAIN_WINDOW_SECONDS as f64
    }
}

/// Requests in flight against the limit, the pressure state they put the
/// gateway in, and the measured latency that decides when it may leave
/// conserve.
#[derive(Debug)]
pub(crate) struct PressureGauge {
    watermarks: Option<Watermarks>,
    /// The fleet's own watermarks (unscaled), for the shared state.
    fleet_watermarks: Option<Watermarks>,
    /// With the fleet's shared state: the slots of `stopAt` this replica
    /// holds and the other replicas hold (see `fleet_pool`).
    pub(crate) fleet: Option<FleetSlotsHeld>,
    in_flight: u64,
    /// Entered at `conserveAt`, left under `resumeBelow` once stable.
    conserving: bool,
    drained: DrainMeter,
    latency: LatencyWindow,
    /// The p95 of each second of the last LATENCY_RISE_LOOKBACK_SECONDS.
    recent_p95: VecDeque<(i64, f64)>,
    checked_second: Option<i64>,
    stable_since: f64,
    below_since: Option<f64>,
}

impl PressureGauge {
    pub(crate) fn new(in_flight: Option<&InFlight>, share: f64, now: f64) -> PressureGauge {
        PressureGauge {
            watermarks: in_flight.map(|f| Watermarks::new(f, share)),
            fleet_watermarks: in_flight.map(|f| Watermarks::new(f, 1.0)),
            fleet: None,
            in_flight: 0,
            conserving: false,
            drained: DrainMeter::default(),
            latency: LatencyWindow::new(),
            recent_p95: VecDeque::new(),
            checked_second: None,
            stable_since: now,
            below_since: None,
        }
    }

    /// This gauge's measurements under `next`'s watermarks (a config swap).
    pub(crate) fn carry_into(self, next: &mut PressureGauge) {
        let (watermarks, fleet_watermarks) = (next.watermarks, next.fleet_watermarks);
        *next = PressureGauge {
            watermarks,
            fleet_watermarks,
            ..self
        };
    }

    pub(crate) fn state(&self) -> Pressure {
        let (n, w) = self.judged();
        match w {
            Some(w) if n >= w.limit() => Pressure::Stop,
            Some(_) if self.conserving => Pressure::Conserve,
            _ => Pressure::Normal,
        }
    }

    /// The in-flight limit in force (None: no `inFlight`).
    pub(crate) fn limit(&self) -> Option<u64> {
        match self.fleet {
            Some(f) => self.watermarks.map(|_| f.held),
            None => self.watermarks.map(|w| w.limit()),
        }
    }

    /// What the watermarks are judged on: this replica's in flight against
    /// its share of them, or, with the fleet's shared state, the fleet's in
    /// flight (this replica's and the slots the others hold) against the
    /// fleet's.
    fn judged(&self) -> (u64, Option<Watermarks>) {
        match self.fleet {
            Some(f) => (self.in_flight + f.others, self.fleet_watermarks),
            None => (self.in_flight, self.watermarks),
        }
    }

    /// Slots free now, once `taken` more passes are counted in flight
    /// (`u64::MAX` without a limit).
    pub(crate) fn free_slots(&self, taken: u64) -> u64 {
        self.limit().map_or(u64::MAX, |l| {
            l.saturating_sub(self.in_flight.saturating_add(taken))
        })
    }

    /// Requests finished per second lately: the rate slots free up at.
    pub(crate) fn drain_rate(&self, now: f64) -> f64 {
        self.drained.rate(now)
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight
    }

    pub(crate) fn started(&mut self, now: f64) {
        self.in_flight += 1;
        self.update(now);
    }

    pub(crate) fn finished(&mut self, now: f64, latency_seconds: f64) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.drained.add(now);
        if latency_seconds.is_finite() {
            self.latency.record(now, latency_seconds);
        }
        self.update(now);
    }

    pub(crate) fn latency_p95(&self, now: f64) -> Option<f64> {
        self.latency.p95(now)
    }

    /// Enters conserve at once at `conserveAt` (or at the limit); leaves
    /// it only below `resumeBelow` with the latency stable for
    /// `resumeAfterStableSeconds`. The limit itself needs no leaving: Stop
    /// is whether every slot is taken now.
    pub(crate) fn update(&mut self, now: f64) {
        let (in_flight, w) = self.judged();
        let Some(w) = w else {
            self.conserving = false;
            return;
        };
        self.check_latency(now);
        let n = in_flight as f64;
        if n >= w.conserve_at || in_flight >= w.limit() {
            self.conserving = true;
        }
        if n < w.resume_below {
            let since = *self.below_since.get_or_insert(now);
            let stable_from = since.max(self.stable_since);
            if self.conserving && now - stable_from >= w.resume_after_stable {
                self.conserving = false;
            }
        } else {
            self.below_since = None;
        }
    }

    /// The stable window of the latency, checked once a second: restarted
    /// whenever the p95 is more than LATENCY_RISE_FACTOR above the lowest
    /// p95 of the last LATENCY_RISE_LOOKBACK_SECONDS. A window without
    /// samples changes nothing.
    fn check_latency(&mut self, now: f64) {
        let sec = now.floor() as i64;
        if self.checked_second == Some(sec) {
            return;
        }
        self.checked_second = Some(sec);
        let Some(p95) = self.latency.p95(now) else {
            return;
        };
        while self
            .recent_p95
            .front()
            .is_some_and(|(s, _)| sec - s > LATENCY_RISE_LOOKBACK_SECONDS)
        {
            self.recent_p95.pop_front();
        }
        let lowest = self.recent_p95.iter().map(|(_, p)| *p).reduce(f64::min);
        if lowest.is_some_and(|low| p95 > low * LATENCY_RISE_FACTOR) {
            self.stable_since = now;
        }
        self.recent_p95.push_back((sec, p95));
    }
}
