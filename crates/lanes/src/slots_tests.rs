//! The in-flight limit at its edges: never more sheddable work in flight
//! than `stopAt`, a freed slot goes to the highest waiting priority, a
//! spike does not latch, the lowest lanes are refused first.

use proptest::prelude::*;

use crate::config::{Deferral, InFlight};
use crate::tests::{config, lane, req};
use crate::{Core, LaneConfig, Limit, Outcome, Pressure, Resolution, Verdict};

fn prio(name: &str, priority: i32, deadline: i64) -> LaneConfig {
    let mut l = lane(name, 1e6, 1_000_000);
    l.priority = priority;
    l.deadline_seconds = deadline;
    l.queue.max_depth = 1_000;
    l.queue.ttl_seconds = deadline.min(20);
    l
}

/// A core whose in-flight limit (and conserve mark) is `stop_at`.
pub(crate) fn limited(lanes: Vec<LaneConfig>, stop_at: i64) -> Core {
    let mut cfg = config(lanes);
    cfg.in_flight = Some(InFlight {
        conserve_at: stop_at,
        stop_at,
        resume_below: 0,
        resume_after_stable_seconds: Some(300),
    });
    Core::new(cfg, 1.0, 0.0, 0.0).unwrap()
}

/// Passes `n` requests of `lane` at `now`, each counted in flight.
fn fill(c: &mut Core, lane: &str, n: usize, now: f64) {
    for _ in 0..n {
        assert!(matches!(c.admit(&req(lane), now), Verdict::Pass(_)));
        c.started(now);
    }
}

fn ticket(v: Verdict) -> crate::Ticket {
    match v {
        Verdict::Queued { ticket, .. } => ticket,
        v => panic!("expected a place in the queue, got {v:?}"),
    }
}

#[test]
fn at_the_limit_a_sheddable_request_waits_and_the_reserve_passes() {
    // P0 is never shed: one second of its requests (2) is kept for it.
    let mut p0 = lane("p0", 2.0, 2);
    p0.sheddable = false;
    let mut c = limited(vec![p0, prio("p1", 1, 30)], 6);
    assert_eq!(c.in_flight_limit(), Some(6));
    fill(&mut c, "p1", 4, 0.0);
    let t = ticket(c.admit(&req("p1"), 0.0));
    // P0 is never held by the limit: into its reserve, then past it.
    fill(&mut c, "p0", 2, 0.0);
    assert_eq!(c.pressure(), Pressure::Stop);
    assert!(matches!(c.admit(&req("p0"), 0.6), Verdict::Pass(_)));
    c.started(0.6);
    assert_eq!(c.in_flight(), 7);
    // Three finish: P0's three still hold P1 at its four until one more
    // finishes.
    for _ in 0..3 {
        assert!(!c.finished(0.7, 0.5));
    }
    assert!(c.poll(0.7).is_empty(), "4 in flight: no slot yet");
    assert!(c.finished(0.8, 0.6), "a slot freed for a waiting request");
    let r = c.poll(0.8);
    assert_eq!(r.len(), 1);
    assert!(matches!(&r[0], (tk, Resolution::Pass(_)) if *tk == t));
}

#[test]
fn a_freed_slot_goes_to_the_highest_waiting_priority() {
    let mut c = limited(vec![prio("p1", 1, 30), prio("p2", 2, 120)], 2);
    fill(&mut c, "p2", 2, 0.0);
    // P2 waited first, P1 came later.
    let low = ticket(c.admit(&req("p2"), 0.1));
    let high = ticket(c.admit(&req("p1"), 0.2));
    assert!(c.finished(1.0, 1.0));
    let r = c.poll(1.0);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0, high, "P1 first though P2 waited longer");
    c.started(1.0);
    assert!(c.poll(1.0).is_empty(), "at the limit again: P2 waits");
    c.finished(2.0, 1.0);
    assert_eq!(c.poll(2.0)[0].0, low);
}

#[test]
fn an_arrival_of_a_lower_lane_leaves_the_slot_to_a_ready_higher_one() {
    let mut c = limited(vec![prio("p1", 1, 30), prio("p2", 2, 120)], 2);
    fill(&mut c, "p1", 2, 0.0);
    let high = ticket(c.admit(&req("p1"), 0.1));
    // A slot frees, and before any poll a P2 request arrives: it waits.
    c.finished(0.5, 0.5);
    let low = ticket(c.admit(&req("p2"), 0.5));
    let r = c.poll(0.5);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0, high);
    assert_ne!(r[0].0, low);
}

#[test]
fn a_spike_above_the_limit_does_not_latch() {
    let mut c = limited(vec![prio("p1", 1, 30)], 10);
    fill(&mut c, "p1", 10, 0.0);
    assert_eq!(c.pressure(), Pressure::Stop);
    // Five seconds later the spike is over, with a latency far from stable.
    for i in 0..10 {
        c.finished(5.0, 5.0 * f64::from(i + 1));
    }
    // Conserving (the stable window has not run) but admitting at once.
    assert!(matches!(c.admit(&req("p1"), 5.1), Verdict::Pass(_)));
    assert_eq!(c.pressure(), Pressure::Conserve);
    // And whenever in flight is under the limit, for as long as it is.
    c.started(5.1);
    for t in 6..300 {
        let now = f64::from(t);
        assert!(
            matches!(c.admit(&req("p1"), now), Verdict::Pass(_)),
            "refused at {now} s"
        );
        c.started(now);
        c.finished(now + 0.5, 0.5);
    }
}

/// Slots drain at under 2 a second (measured over the last five seconds)
/// and ten P1 requests wait: a P2 request would wait more than 5.5 s for a
/// slot, past its 4 s deadline, and is refused at once; P1's own wait fits
/// its 30 s.
#[test]
fn the_lowest_lanes_are_refused_first_when_the_wait_would_miss_their_deadline() {
    let mut p3 = prio("p3", 3, 7200);
    p3.deferral = Some(Deferral {
        retry_after_seconds: 60,
    });
    p3.queue.max_depth = 0;
    let mut c = limited(vec![prio("p1", 1, 30), prio("p2", 2, 4), p3], 5);
    fill(&mut c, "p1", 5, 0.0);
    for t in 1..=5 {
        for _ in 0..2 {
            c.finished(f64::from(t) - 0.5, 1.0);
        }
        c.poll(f64::from(t) - 0.5);
        fill(&mut c, "p1", 2, f64::from(t) - 0.5);
    }
    for _ in 0..10 {
        ticket(c.admit(&req("p1"), 5.0));
    }
    match c.admit(&req("p2"), 5.0) {
        Verdict::Refuse(r) => {
            assert_eq!(r.outcome, Outcome::RejectedOverload);
            assert_eq!(r.limit, Limit::StopAt);
            // Told the wait for a slot (more than 5.5 s), not its own
            // lane's empty-queue wait of 1 s.
            assert!(r.retry_after_seconds >= Some(6), "{r:?}");
        }
        v => panic!("{v:?}"),
    }
    ticket(c.admit(&req("p1"), 5.0));
    // A Defer lane that cannot wait is deferred, not refused.
    assert!(matches!(c.admit(&req("p3"), 5.0), Verdict::Refuse(r) if r.deferred()));
}

#[test]
fn without_in_flight_watermarks_nothing_is_limited() {
    let mut c = Core::new(config(vec![prio("p1", 1, 30)]), 1.0, 0.0, 0.0).unwrap();
    assert_eq!(c.in_flight_limit(), None);
    fill(&mut c, "p1", 10_000, 0.0);
    assert_eq!(c.pressure(), Pressure::Normal);
}

/// One step of a random run.
#[derive(Clone, Debug)]
enum Step {
    Arrive(usize),
    Finish,
    Poll,
    Tick,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0usize..3).prop_map(Step::Arrive),
        3 => Just(Step::Finish),
        1 => Just(Step::Poll),
        1 => Just(Step::Tick),
    ]
}

proptest! {
    /// Whatever arrives and finishes, a sheddable pass never takes in
    /// flight past the limit less P0's reserve (P0 may), and a poll hands
    /// out its passes highest priority first.
    #[test]
    fn sheddable_work_never_exceeds_the_limit(steps in prop::collection::vec(step(), 1..400)) {
        let mut p0 = lane("p0", 30.0, 5);
        p0.sheddable = false;
        let mut p1 = lane("p1", 20.0, 5);
        p1.priority = 1;
        p1.queue.max_depth = 50;
        let mut p2 = lane("p2", 20.0, 5);
        p2.priority = 2;
        p2.queue.max_depth = 50;
        let names = ["p0", "p1", "p2"];
        // A limit of 10, five kept for P0 (its bucket's size).
        let mut c = limited(vec![p0, p1, p2], 10);
        let mut now = 0.0;
        let mut flying: u64 = 0;
        for s in steps {
            let mut passed: Vec<usize> = Vec::new();
            match s {
                Step::Arrive(l) => {
                    if let Verdict::Pass(p) = c.admit(&req(names[l]), now) {
                        passed.push(p.lane);
                    }
                }
                Step::Finish if flying > 0 => {
                    c.finished(now, 0.3);
                    flying -= 1;
                }
                Step::Finish => {}
                Step::Poll => {
                    for (_, r) in c.poll(now) {
                        if let Resolution::Pass(p) = r {
                            passed.push(p.lane);
                        }
                    }
                }
                Step::Tick => now += 0.05,
            }
            let before = flying;
            for (k, &l) in passed.iter().enumerate() {
                c.started(now);
                flying += 1;
                if l != 0 {
                    prop_assert!(flying <= 5, "{} in flight after a pass of {}", flying, names[l]);
                }
                // Passes of one poll come highest priority first (here
                // the lane's index is its priority).
                if k > 0 {
                    prop_assert!(passed[k - 1] <= l, "{:?}", passed);
                }
            }
            prop_assert_eq!(c.in_flight(), before + passed.len() as u64);
        }
    }
}
