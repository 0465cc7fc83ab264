//! A route's circuit breaker: pure, the time and the jitter come from the
//! caller.
//!
//! **Closed**: every request goes to the route; the breaker opens after
//! `consecutiveFailures` failures in a row, or when at least `minRequests`
//! answers in the last `windowSeconds` include `failureRatioPercent` percent
//! failures or more. **Open**: nothing goes to the route until the reopen
//! time, `openSeconds` after opening plus up to `probeJitterPercent` percent
//! of it (so several gateway replicas do not probe in step). **Half-open**:
//! one probe at a time reaches the route, every other request is kept away;
//! `closeAfterSuccesses` successful probes close the breaker, a failed probe
//! opens it again.
//!
//! A failure is a 5xx (except a 503 with `Retry-After`, which is the
//! upstream asking to be paced, see [`crate::route_pace`]), a connect error
//! or a timeout; the gateway classifies, this module counts.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// The breaker's settings for one route (`lanes.json` `breakers`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BreakerSettings {
    /// Open after this many failures in a row (0: never on a streak).
    pub consecutive_failures: u32,
    /// Open when failures are at least this percent of the answers in the
    /// window (0 or over 100: never on a ratio).
    pub failure_ratio_percent: u32,
    /// ... counted only once the window holds this many answers.
    pub min_requests: u32,
    /// The ratio's window in seconds.
    pub window_seconds: u32,
    /// Seconds an opened breaker keeps every request away before a probe.
    pub open_seconds: f64,
    /// Up to this percent of `openSeconds` is added at random to each open
    /// time (jittered probes).
    pub probe_jitter_percent: u32,
    /// Successful probes in a row that close the breaker.
    pub close_after_successes: u32,
}

impl Default for BreakerSettings {
    fn default() -> BreakerSettings {
        BreakerSettings {
            consecutive_failures: 5,
            failure_ratio_percent: 50,
            min_requests: 20,
            window_seconds: 10,
            open_seconds: 5.0,
            probe_jitter_percent: 20,
            close_after_successes: 2,
        }
    }
}

/// The breaker's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Requests flow.
    Closed,
    /// Nothing reaches the route until the reopen time.
    Open,
    /// Only probes reach the route.
    HalfOpen,
}

impl BreakerState {
    /// Every state, in label order.
    pub const ALL: [BreakerState; 3] = [
        BreakerState::Closed,
        BreakerState::Open,
        BreakerState::HalfOpen,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// What the breaker says about one request for its route.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Gate {
    /// Send it.
    Pass,
    /// Send it as the half-open probe: report its answer with
    /// `probe: true` (or [`Breaker::probe_abandoned`]).
    Probe,
    /// Keep it away; the route may take requests again in this many
    /// seconds (its next probe, or the probe under way).
    Refuse {
        /// Seconds until the route may be tried again.
        retry_in: f64,
    },
}

/// How a request the route took ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upshot {
    /// Answered (any status that is not a failure).
    Success,
    /// A 5xx, a connect error or a timeout.
    Failure,
}

/// A change of state, for the metrics and the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// Before.
    pub from: BreakerState,
    /// After.
    pub to: BreakerState,
}

/// One route's breaker.
#[derive(Clone, Debug)]
pub struct Breaker {
    settings: BreakerSettings,
    state: BreakerState,
    /// Failures in a row (closed).
    streak: u32,
    /// (second, successes, failures), oldest first.
    window: VecDeque<(i64, u32, u32)>,
    /// When an open breaker lets a probe through.
    reopen_at: f64,
    /// A probe is under way.
    probing: bool,
    /// Successful probes in a row (half-open).
    successes: u32,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(settings: BreakerSettings) -> Breaker {
        Breaker {
            settings,
            state: BreakerState::Closed,
            streak: 0,
            window: VecDeque::new(),
            reopen_at: 0.0,
            probing: false,
            successes: 0,
        }
    }

    /// The state (an open breaker whose reopen time has come reads as
    /// half-open only once [`Breaker::gate`] has been asked).
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// The settings in force.
    pub fn settings(&self) -> &BreakerSettings {
        &self.settings
    }

    /// New settings; the state is kept.
    pub fn set_settings(&mut self, settings: BreakerSettings) {
        self.settings = settings;
    }

    /// May a request go to the route at `now`?
    pub fn gate(&mut self, now: f64) -> (Gate, Option<Transition>) {
        let mut moved = None;
        if self.state == BreakerState::Open && now >= self.reopen_at {
            moved = self.go(BreakerState::HalfOpen);
            self.successes = 0;
            self.probing = false;
        }
        let gate = match self.state {
            BreakerState::Closed => Gate::Pass,
            BreakerState::HalfOpen if !self.probing => {
                self.probing = true;
                Gate::Probe
            }
            // A probe is under way: its answer is due within a request's time;
            // tell the caller the open time again at most, at least 1 s.
            BreakerState::HalfOpen => Gate::Refuse {
                retry_in: self.settings.open_seconds.clamp(1.0, 3600.0),
            },
            BreakerState::Open => Gate::Refuse {
                retry_in: (self.reopen_at - now).max(0.0),
            },
        };
        (gate, moved)
    }

    /// A probe that never got an answer (the client went away): the next
    /// request may probe.
    pub fn probe_abandoned(&mut self) {
        self.probing = false;
    }

    /// How a request the route took ended at `now`; `probe` when
    /// [`Breaker::gate`] made it the probe; `jitter` is a random number in
    /// `[0, 1)` (used when the breaker opens).
    pub fn record(
        &mut self,
        now: f64,
        probe: bool,
        upshot: Upshot,
        jitter: f64,
    ) -> Option<Transition> {
        match self.state {
            BreakerState::Closed => self.record_closed(now, upshot, jitter),
            BreakerState::HalfOpen if probe => {
                self.probing = false;
                match upshot {
                    Upshot::Success => {
                        self.successes += 1;
                        if self.successes >= self.settings.close_after_successes.max(1) {
                            self.streak = 0;
                            self.window.clear();
                            return self.go(BreakerState::Closed);
                        }
                        None
                    }
                    Upshot::Failure => self.open(now, jitter),
                }
            }
            // Answers of requests sent before the breaker opened say nothing
            // about the route now.
            BreakerState::HalfOpen | BreakerState::Open => None,
        }
    }

    fn record_closed(&mut self, now: f64, upshot: Upshot, jitter: f64) -> Option<Transition> {
        let sec = now.floor() as i64;
        let span = i64::from(self.settings.window_seconds.max(1));
        while self
            .window
            .front()
            .is_some_and(|(s, _, _)| *s <= sec - span)
        {
            self.window.pop_front();
        }
        if self.window.back().is_none_or(|(s, _, _)| *s != sec) {
            self.window.push_back((sec, 0, 0));
        }
        let slot = self.window.back_mut().expect("pushed");
        match upshot {
            Upshot::Success => {
                slot.1 += 1;
                self.streak = 0;
                return None;
            }
            Upshot::Failure => {
                slot.2 += 1;
                self.streak += 1;
            }
        }
        let s = &self.settings;
        let on_streak = s.consecutive_failures > 0 && self.streak >= s.consecutive_failures;
        let (ok, bad) = self
            .window
            .iter()
            .fold((0u64, 0u64), |(o, b), (_, so, sb)| {
                (o + u64::from(*so), b + u64::from(*sb))
            });
        let total = ok + bad;
        let on_ratio = (1..=100).contains(&s.failure_ratio_percent)
            && total >= u64::from(s.min_requests.max(1))
            && bad * 100 >= u64::from(s.failure_ratio_percent) * total;
        if on_streak || on_ratio {
            return self.open(now, jitter);
        }
        None
    }

    fn open(&mut self, now: f64, jitter: f64) -> Option<Transition> {
        let s = &self.settings;
        let open = s.open_seconds.max(0.0);
        let spread = f64::from(s.probe_jitter_percent.min(100)) / 100.0;
        self.reopen_at = now + open * (1.0 + spread * jitter.clamp(0.0, 1.0));
        self.probing = false;
        self.successes = 0;
        self.streak = 0;
        self.go(BreakerState::Open)
    }

    fn go(&mut self, to: BreakerState) -> Option<Transition> {
        let from = self.state;
        self.state = to;
        (from != to).then_some(Transition { from, to })
    }

    /// Seconds until an open breaker lets a probe through (0 when it is
    /// not open).
    pub fn reopen_in(&self, now: f64) -> f64 {
        match self.state {
            BreakerState::Open => (self.reopen_at - now).max(0.0),
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn settings() -> BreakerSettings {
        BreakerSettings {
            consecutive_failures: 3,
            failure_ratio_percent: 50,
            min_requests: 10,
            window_seconds: 10,
            open_seconds: 5.0,
            probe_jitter_percent: 20,
            close_after_successes: 2,
        }
    }

    #[test]
    fn it_opens_on_a_streak_and_keeps_requests_away_until_the_jittered_reopen() {
        let mut b = Breaker::new(settings());
        for i in 0..2 {
            assert_eq!(b.gate(f64::from(i)).0, Gate::Pass);
            assert_eq!(b.record(f64::from(i), false, Upshot::Failure, 0.5), None);
        }
        let t = b.record(2.0, false, Upshot::Failure, 0.5);
        assert_eq!(
            t,
            Some(Transition {
                from: BreakerState::Closed,
                to: BreakerState::Open
            })
        );
        // 5 s plus half of 20 %: reopen at 2 + 5.5.
        match b.gate(3.0).0 {
            Gate::Refuse { retry_in } => assert!((retry_in - 4.5).abs() < 1e-9, "{retry_in}"),
            g => panic!("{g:?}"),
        }
        assert!(matches!(b.gate(7.49).0, Gate::Refuse { .. }));
        let (g, t) = b.gate(7.5);
        assert_eq!(g, Gate::Probe);
        assert_eq!(t.map(|t| t.to), Some(BreakerState::HalfOpen));
        // Only one probe at a time.
        assert!(matches!(b.gate(7.6).0, Gate::Refuse { .. }));
    }

    #[test]
    fn a_success_breaks_the_streak() {
        let mut b = Breaker::new(settings());
        for i in 0..20 {
            let upshot = if i % 3 == 2 {
                Upshot::Success
            } else {
                Upshot::Failure
            };
            // 2 of 3 fail (over the 50 % ratio) but never 3 in a row: the
            // ratio opens it once 10 answers are in the window.
            let t = b.record(f64::from(i) * 0.1, false, upshot, 0.0);
            if i < 9 {
                assert_eq!(t, None, "answer {i}");
            }
        }
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn the_ratio_needs_its_minimum_and_forgets_old_seconds() {
        let mut s = settings();
        s.consecutive_failures = 0;
        let mut b = Breaker::new(s);
        // 9 answers, all failures: under minRequests.
        for i in 0..9 {
            b.record(f64::from(i), false, Upshot::Failure, 0.0);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        // 20 s later the old failures are out of the window; 10 successes
        // and 9 failures (47 %) keep it closed.
        for i in 0..10 {
            b.record(30.0 + f64::from(i) * 0.01, false, Upshot::Success, 0.0);
        }
        for i in 0..9 {
            b.record(31.0 + f64::from(i) * 0.01, false, Upshot::Failure, 0.0);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        // The 10th failure makes it 50 %.
        b.record(31.5, false, Upshot::Failure, 0.0);
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn probes_close_it_after_successes_and_a_failed_probe_opens_it_again() {
        let mut b = Breaker::new(settings());
        for i in 0..3 {
            b.record(f64::from(i), false, Upshot::Failure, 0.0);
        }
        assert_eq!(b.gate(7.0).0, Gate::Probe);
        assert_eq!(b.record(7.1, true, Upshot::Success, 0.0), None);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        // An answer of a request sent before the breaker opened: ignored.
        assert_eq!(b.record(7.15, false, Upshot::Failure, 0.0), None);
        assert_eq!(b.gate(7.2).0, Gate::Probe);
        let t = b.record(7.3, true, Upshot::Success, 0.0);
        assert_eq!(t.map(|t| t.to), Some(BreakerState::Closed));
        assert_eq!(b.gate(7.4).0, Gate::Pass);
        // Open again, a failed probe: open for another open time.
        for _ in 0..3 {
            b.record(8.0, false, Upshot::Failure, 0.0);
        }
        assert_eq!(b.gate(13.0).0, Gate::Probe);
        let t = b.record(13.5, true, Upshot::Failure, 1.0);
        assert_eq!(t.map(|t| t.to), Some(BreakerState::Open));
        assert!((b.reopen_in(13.5) - 6.0).abs() < 1e-9);
    }

    #[test]
    fn an_abandoned_probe_lets_the_next_request_probe() {
        let mut b = Breaker::new(settings());
        for _ in 0..3 {
            b.record(0.0, false, Upshot::Failure, 0.0);
        }
        assert_eq!(b.gate(5.0).0, Gate::Probe);
        assert!(matches!(b.gate(5.0).0, Gate::Refuse { .. }));
        b.probe_abandoned();
        assert_eq!(b.gate(5.1).0, Gate::Probe);
    }

    #[derive(Clone, Debug)]
    enum Step {
        Ask(f64),
        Answer(f64, bool, f64),
        Abandon,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0.0..3.0f64).prop_map(Step::Ask),
            (0.0..3.0f64, any::<bool>(), 0.0..1.0f64).prop_map(|(d, ok, j)| Step::Answer(d, ok, j)),
            Just(Step::Abandon),
        ]
    }

    proptest! {
        /// Whatever happens: an open breaker passes nothing before its
        /// reopen time, which lies within the jittered open time; at most
        /// one probe is under way; Closed never goes straight to HalfOpen;
        /// a streak of `consecutiveFailures` opens a closed breaker.
        #[test]
        fn the_breaker_keeps_its_promises(steps in prop::collection::vec(step(), 1..200)) {
            let s = settings();
            let mut b = Breaker::new(s.clone());
            let mut now = 0.0;
            let mut probes: Vec<()> = Vec::new();
            let mut opened_at = None;
            for st in steps {
                match st {
                    Step::Ask(d) => {
                        now += d;
                        let before = b.state();
                        let (g, t) = b.gate(now);
                        if let Some(t) = t {
                            prop_assert!(t.from == BreakerState::Open && t.to == BreakerState::HalfOpen);
                            let at: f64 = opened_at.expect("opened before");
                            prop_assert!(now >= at + s.open_seconds - 1e-9);
                        }
                        match g {
                            Gate::Pass => prop_assert_eq!(b.state(), BreakerState::Closed),
                            Gate::Probe => {
                                prop_assert!(probes.is_empty(), "two probes under way");
                                probes.push(());
                            }
                            Gate::Refuse { retry_in } => {
                                prop_assert!(before != BreakerState::Closed);
                                prop_assert!(retry_in >= 0.0);
                                prop_assert!(retry_in <= s.open_seconds * 1.2 + 1e-9);
                            }
                        }
                    }
                    Step::Answer(d, ok, j) => {
                        now += d;
                        let probe = probes.pop().is_some();
                        let upshot = if ok { Upshot::Success } else { Upshot::Failure };
                        let before = b.state();
                        let streak_before = b.streak;
                        if let Some(t) = b.record(now, probe, upshot, j) {
                            prop_assert!(t.to != BreakerState::HalfOpen);
                            if t.to == BreakerState::Open {
                                opened_at = Some(now);
                                let r = b.reopen_in(now);
                                prop_assert!(r >= s.open_seconds - 1e-9 && r <= s.open_seconds * 1.2 + 1e-9);
                            }
                        }
                        if before == BreakerState::Closed && !ok && streak_before + 1 >= s.consecutive_failures {
                            prop_assert_eq!(b.state(), BreakerState::Open);
                        }
                    }
                    Step::Abandon => {
                        if probes.pop().is_some() {
                            b.probe_abandoned();
                        }
                    }
                }
            }
        }
    }
}
