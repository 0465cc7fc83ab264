//! The core's rules, each at its edge.

use super::*;
use crate::config::{
    Borrow, Deferral, Flags, Generations, InFlight, LaneState, Mode, OptionalContext, QueueLimits,
    RetryLimits, Telemetry,
};
use std::collections::HashMap;

use crate::validate::validate;
use serde_json::json;

pub(crate) fn lane(name: &str, rps: f64, burst: u64) -> LaneConfig {
    LaneConfig {
        name: name.to_owned(),
        priority: 0,
        state: LaneState::Admitted,
        sheddable: true,
        admitted_units_per_second: rps,
        admitted_requests_per_second: rps,
        work_units_per_request: 1.0,
        burst,
        queue: QueueLimits {
            max_depth: 10,
            ttl_seconds: 5,
        },
        deadline_seconds: 30,
        retry: RetryLimits {
            max_attempts: 3,
            budget_percent: 10,
        },
        retry_after_seconds: Some(5),
        deferral: None,
        routes: vec!["r".to_owned()],
        fallback_routes: false,
        breaker_fallbacks: Vec::new(),
        optional_context: None,
        borrowing: vec![],
        floor_units_per_second: None,
        ceiling_units_per_second: None,
        expected_service_seconds: None,
        spare_capacity: false,
        clients: Vec::new(),
        tenants: None,
        cost: None,
        tokens: None,
    }
}

pub(crate) fn config(lanes: Vec<LaneConfig>) -> GatewayConfig {
    GatewayConfig {
        schema_version: 1,
        profile: "ns/p".to_owned(),
        mode: Mode::Enforce,
        level: 0,
        level_name: "normal".to_owned(),
        pending_approval_level: None,
        telemetry: Telemetry::Known,
        capacity_units_per_second: Some(100.0),
        flags: Flags::default(),
        in_flight: None,
        breakers: None,
        concurrency: None,
        long_context: None,
        generations: Generations::default(),
        lanes,
        content_hash: String::new(),
    }
}

pub(crate) fn req(lane: &str) -> Request<'_> {
    Request {
        lane,
        tenant: None,
        attempt: None,
        request_id: None,
    }
}

fn core(lanes: Vec<LaneConfig>) -> Core {
    Core::new(config(lanes), 1.0, 0.0, 1_000_000.0).unwrap()
}

#[test]
fn the_bucket_admits_burst_then_rate() {
    let mut c = core(vec![lane("a", 10.0, 10)]);
    let passed = (0..15)
        .filter(|_| matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)))
        .count();
    assert_eq!(passed, 10);
    assert_eq!(c.queue_depth(0), 5);
    // 0.5 s later five tokens came: the five queued pass, in order.
    let r = c.poll(0.5);
    assert_eq!(r.len(), 5);
    assert!(r.iter().all(|(_, r)| matches!(r, Resolution::Pass(_))));
    let tickets: Vec<u64> = r.iter().map(|(t, _)| t.0).collect();
    assert_eq!(tickets, vec![1, 2, 3, 4, 5]);
}

#[test]
fn an_unknown_lane_is_refused() {
    let mut c = core(vec![lane("a", 10.0, 10)]);
    assert_eq!(c.admit(&req("b"), 0.0), Verdict::UnknownLane);
}

#[test]
fn a_paused_lane_admits_nothing_and_a_defer_lane_defers() {
    let mut p = lane("p", 10.0, 10);
    p.state = LaneState::Paused;
    p.retry_after_seconds = Some(300);
    let mut d = p.clone();
    d.name = "d".to_owned();
    d.deferral = Some(Deferral {
        retry_after_seconds: 300,
    });
    let mut c = core(vec![p, d]);
    match c.admit(&req("p"), 0.0) {
        Verdict::Refuse(r) => {
            assert_eq!(r.outcome, Outcome::RejectedRate);
            assert_eq!(r.retry_after_seconds, Some(300));
        }
        v => panic!("{v:?}"),
    }
    match c.admit(&req("d"), 0.0) {
        Verdict::Refuse(r) => {
            assert!(r.deferred());
            assert_eq!(r.retry_after_seconds, Some(300));
        }
        v => panic!("{v:?}"),
    }
}

#[test]
fn a_wait_past_the_deadline_is_refused_at_once() {
    let mut l = lane("a", 1.0, 1);
    l.deadline_seconds = 3;
    l.queue.ttl_seconds = 100;
    l.expected_service_seconds = Some(1.0);
    let mut c = core(vec![l]);
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)));
    // Waits 1 s + 1 s service: fits 3 s.
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Queued { .. }));
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Queued { .. }));
    // A third would wait 3 s + 1 s service > 3 s.
    match c.admit(&req("a"), 0.0) {
        Verdict::Refuse(r) => assert_eq!(r.outcome, Outcome::RejectedDeadline),
        v => panic!("{v:?}"),
    }
}

#[test]
fn a_measured_service_time_longer_than_configured_refuses_what_cannot_make_it() {
    let mut l = lane("a", 100.0, 100);
    l.deadline_seconds = 2;
    l.queue.ttl_seconds = 100;
    l.expected_service_seconds = Some(0.5);
    let mut c = core(vec![l]);
    // 2 s is time enough for the configured 0.5 s.
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)));
    // Answers now take 2.5 s (a capacity cut), measured over 20 answers.
    for _ in 0..crate::service_time::MIN_SERVICE_SAMPLES {
        c.served("a", 1.0, 2.5);
    }
    let e = c.expected_service_seconds(0, 2.0);
    assert!((2.5..2.7).contains(&e), "{e}");
    // A new request cannot be served within its 2 s: refused at once,
    // not cut at its deadline.
    match c.admit(&req("a"), 2.0) {
        Verdict::Refuse(r) => assert_eq!(r.outcome, Outcome::RejectedDeadline),
        v => panic!("{v:?}"),
    }
    // A lane the config no longer has is not measured.
    c.served("gone", 2.0, 100.0);
    assert!(c.expected_service_seconds(0, 3.0) < 2.7);
}

#[test]
fn a_full_queue_rejects_and_the_ttl_expires() {
    let mut l = lane("a", 0.1, 1);
    l.queue.max_depth = 2;
    l.queue.ttl_seconds = 25;
    let mut c = core(vec![l]);
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)));
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Queued { .. }));
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Queued { .. }));
    match c.admit(&req("a"), 0.0) {
        Verdict::Refuse(r) => assert_eq!(r.outcome, Outcome::RejectedQueueFull),
        v => panic!("{v:?}"),
    }
    // The first queued is served at 10 s; the second at 20 s.
    assert!(matches!(
        &c.poll(10.0)[..],
        [(Ticket(1), Resolution::Pass(_))]
    ));
    assert!(matches!(
        &c.poll(20.0)[..],
        [(Ticket(2), Resolution::Pass(_))]
    ));
    // One more waits for the token of 30 s (10 s, within the 25 s TTL);
    // then the rate drops tenfold: the token would come at 120 s, and at
    // 45 s its TTL has run out.
    assert!(matches!(
        c.admit(&req("a"), 20.0),
        Verdict::Queued {
            ticket: Ticket(3),
            ..
        }
    ));
    let mut slower = lane("a", 0.01, 1);
    slower.queue.max_depth = 2;
    slower.queue.ttl_seconds = 25;
    assert!(
        c.swap(config(vec![slower]), 1.0, 20.0, 0.0)
            .unwrap()
            .is_empty()
    );
    assert!(c.poll(44.9).is_empty());
    match &c.poll(45.1)[..] {
        [(Ticket(3), Resolution::Refuse(x))] => {
            assert_eq!(x.outcome, Outcome::Expired);
            assert_eq!(x.limit, Limit::QueueTtl);
        }
        r => panic!("{r:?}"),
    }
    assert_eq!(c.queue_depth(0), 0);
}

/// A request of lane "a" from tenant `t`.
fn from_tenant(t: &'static str) -> Request<'static> {
    Request {
        lane: "a",
        tenant: Some(t),
        attempt: None,
        request_id: None,
    }
}

#[test]
fn tenants_share_a_lane_fairly() {
    let mut l = lane("a", 1.0, 1);
    l.queue.max_depth = 1000;
    l.queue.ttl_seconds = 10_000;
    l.deadline_seconds = 10_000;
    let mut c = core(vec![l]);
    let at = from_tenant;
    // Tenant "loop" queues 100 first; "quiet" queues 5 after.
    let _ = c.admit(&at("loop"), 0.0);
    let mut owner = HashMap::new();
    for _ in 0..100 {
        if let Verdict::Queued { ticket, .. } = c.admit(&at("loop"), 0.0) {
            owner.insert(ticket, "loop");
        }
    }
    for _ in 0..5 {
        if let Verdict::Queued { ticket, .. } = c.admit(&at("quiet"), 0.0) {
            owner.insert(ticket, "quiet");
        }
    }
    let mut served = Vec::new();
    for s in 1..=10 {
        for (t, r) in c.poll(s as f64) {
            assert!(matches!(r, Resolution::Pass(_)));
            served.push(owner[&t]);
        }
    }
    let quiet = served.iter().filter(|t| **t == "quiet").count();
    assert_eq!(served.len(), 10);
    assert_eq!(
        quiet, 5,
        "the quiet tenant alternates with the loop: {served:?}"
    );
}

/// A tenant that fills a lane's queue does not keep the others out: a
/// newcomer of a tenant with fewer waiting takes the place of the fullest
/// tenant's newest request (refused as queue full by the next poll) until
/// the two are within one of each other; then the queue is full for both.
#[test]
fn a_tenant_that_fills_the_queue_gives_way_to_the_others() {
    let mut l = lane("a", 0.001, 1);
    l.queue.max_depth = 4;
    l.queue.ttl_seconds = 10_000;
    l.deadline_seconds = 10_000;
    let mut c = core(vec![l]);
    let at = from_tenant;
    assert!(matches!(c.admit(&at("loop"), 0.0), Verdict::Pass(_)));
    let mut loops = Vec::new();
    for i in 0..4 {
        match c.admit(&at("loop"), 0.1 * f64::from(i)) {
            Verdict::Queued { ticket, .. } => loops.push(ticket),
            v => panic!("{v:?}"),
        }
    }
    let full = |v: Verdict| matches!(v, Verdict::Refuse(r) if r.limit == Limit::QueueDepth && r.outcome == Outcome::RejectedQueueFull);
    assert!(
        full(c.admit(&at("loop"), 1.0)),
        "the loop's own fifth is refused"
    );
    for (quiet, evicted) in [(0, 3), (1, 2)] {
        assert!(
            matches!(c.admit(&at("quiet"), 1.0), Verdict::Queued { .. }),
            "quiet #{quiet}"
        );
        let out = c.poll(1.0);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].0, loops[evicted], "the loop's newest gives way");
        assert!(matches!(&out[0].1, Resolution::Refuse(r) if r.limit == Limit::QueueDepth));
    }
    // Two each: a third of the quiet tenant's would only move the
    // imbalance to the other side.
    assert!(full(c.admit(&at("quiet"), 1.0)));
    assert!(c.poll(1.0).is_empty());
}

#[test]
fn retries_are_counted_by_id_and_limited() {
    let mut l = lane("a", 1000.0, 1000);
    l.retry.max_attempts = 2;
    l.retry.budget_percent = 10;
    let mut c = core(vec![l]);
    let with_id = |id: &'static str, attempt: Option<u32>| Request {
        lane: "a",
        tenant: None,
        attempt,
        request_id: Some(id),
    };
    // 10 originals allow one retry.
    for i in 0..10 {
        let id: &'static str = Box::leak(format!("r{i}").into_boxed_str());
        assert!(
            matches!(c.admit(&with_id(id, None), 0.0), Verdict::Pass(p) if p.attempt == Attempt::Original)
        );
    }
    // r0 again without the header: a retry.
    assert!(
        matches!(c.admit(&with_id("r0", None), 0.1), Verdict::Pass(p) if p.attempt == Attempt::Retry)
    );
    // r0 a third time: beyond maxAttempts.
    match c.admit(&with_id("r0", None), 0.2) {
        Verdict::Refuse(r) => assert_eq!(r.limit, Limit::MaxAttempts),
        v => panic!("{v:?}"),
    }
    // r1's retry: beyond the budget (1 of 10 used).
    match c.admit(&with_id("r1", Some(2)), 0.3) {
        Verdict::Refuse(r) => assert_eq!(r.limit, Limit::RetryBudget),
        v => panic!("{v:?}"),
    }
    // Past the window, the originals no longer pay for retries.
    match c.admit(&with_id("new", Some(2)), 20.0) {
        Verdict::Refuse(r) => assert_eq!(r.outcome, Outcome::RejectedRetryBudget),
        v => panic!("{v:?}"),
    }
}

#[test]
fn a_deferred_request_returns_as_neither_and_keeps_its_arrival() {
    let mut l = lane("d", 1.0, 1);
    l.queue.max_depth = 1;
    l.queue.ttl_seconds = 100;
    l.deadline_seconds = 100;
    l.deferral = Some(Deferral {
        retry_after_seconds: 7,
    });
    let mut c = core(vec![l]);
    let r = |id: &'static str| Request {
        lane: "d",
        tenant: None,
        attempt: None,
        request_id: Some(id),
    };
    assert!(matches!(c.admit(&r("a"), 0.0), Verdict::Pass(_)));
    assert!(matches!(c.admit(&r("b"), 0.0), Verdict::Queued { .. }));
    match c.admit(&r("c"), 0.5) {
        Verdict::Refuse(x) => {
            assert!(x.deferred());
            // The expected wait, under the controller's 7 s: one waiting
            // and the newcomer, half a token at hand, at 1/s.
            assert_eq!(x.retry_after_seconds, Some(2));
        }
        v => panic!("{v:?}"),
    }
    // "b" is served at 1 s; "x" (new) queues at 1.2 s; "c" comes back and,
    // having arrived earlier, takes the place: "x" is deferred.
    assert_eq!(c.poll(1.0).len(), 1);
    assert!(matches!(c.admit(&r("x"), 1.2), Verdict::Queued { .. }));
    match c.admit(&r("c"), 1.3) {
        Verdict::Queued { attempt, .. } => assert_eq!(attempt, Attempt::Returning),
        v => panic!("{v:?}"),
    }
    let res = c.poll(1.3);
    assert!(
        matches!(&res[..], [(_, Resolution::Refuse(x))] if x.deferred()),
        "{res:?}"
    );
}

/// A return consumes its deferral: after a passed return, the id's next
/// arrivals are retries (against `maxAttempts` and the budget), and only
/// the first arrival after each deferral is a return again.
#[test]
fn a_return_consumes_its_deferral_and_later_arrivals_are_retries() {
    let mut l = lane("d", 100.0, 40);
    l.queue.ttl_seconds = 0;
    l.retry.max_attempts = 3;
    l.retry.budget_percent = 5;
    l.deferral = Some(Deferral {
        retry_after_seconds: 1,
    });
    let mut c = core(vec![l]);
    let r = |id: &'static str, attempt: Option<u32>| Request {
        lane: "d",
        tenant: None,
        attempt,
        request_id: Some(id),
    };
    let originals = |c: &mut Core, from: usize, n: usize, now: f64| {
        for i in from..from + n {
            let id: &'static str = Box::leak(format!("o{i}").into_boxed_str());
            assert!(matches!(c.admit(&r(id, None), now), Verdict::Pass(_)));
        }
    };
    let deferred = |v: Verdict, attempt: Attempt| {
        assert!(
            matches!(v, Verdict::Refuse(ref x) if x.deferred() && x.attempt == attempt),
            "{v:?}"
        );
    };
    // 40 originals take the bucket: "x" is deferred, then deferred again
    // on its return (still a return).
    originals(&mut c, 0, 40, 0.0);
    deferred(c.admit(&r("x", None), 0.0), Attempt::Original);
    deferred(c.admit(&r("x", Some(2)), 0.001), Attempt::Returning);
    // It returns and passes upstream.
    let v = c.admit(&r("x", Some(2)), 1.0);
    assert!(
        matches!(v, Verdict::Pass(ref p) if p.attempt == Attempt::Returning),
        "{v:?}"
    );
    // 80 originals in all ("x" one of them) allow 4 retries. The upstream
    // failed: the
    // client's retry is a retry (its second attempt), deferred here on an
    // empty bucket.
    originals(&mut c, 40, 39, 1.0);
    deferred(c.admit(&r("x", Some(2)), 1.0), Attempt::Retry);
    // Its return after that deferral is a return, and not counted.
    let v = c.admit(&r("x", Some(2)), 2.0);
    assert!(
        matches!(v, Verdict::Pass(ref p) if p.attempt == Attempt::Returning),
        "{v:?}"
    );
    // The next is its third attempt, and the one after beyond maxAttempts.
    let v = c.admit(&r("x", Some(3)), 2.1);
    assert!(
        matches!(v, Verdict::Pass(ref p) if p.attempt == Attempt::Retry),
        "{v:?}"
    );
    match c.admit(&r("x", Some(4)), 2.2) {
        Verdict::Refuse(x) => {
            assert_eq!((x.attempt, x.limit), (Attempt::Retry, Limit::MaxAttempts))
        }
        v => panic!("{v:?}"),
    }
    // x's two retries count against the budget: two more fit, not three.
    for (id, now) in [("o0", 2.3), ("o1", 2.35)] {
        let v = c.admit(&r(id, Some(2)), now);
        assert!(
            matches!(v, Verdict::Pass(ref p) if p.attempt == Attempt::Retry),
            "{v:?}"
        );
    }
    match c.admit(&r("o2", Some(2)), 2.4) {
        Verdict::Refuse(x) => assert_eq!(x.limit, Limit::RetryBudget),
        v => panic!("{v:?}"),
    }
}

#[test]
fn the_floor_is_there_at_once_and_borrowers_give_it_back() {
    // P0: admitted 20 req/s, floor 90; P3 borrows 60 of P0's floor.
    let mut p0 = lane("p0", 20.0, 20);
    p0.floor_units_per_second = Some(90.0);
    p0.sheddable = false;
    let mut p3 = lane("p3", 100.0, 100);
    p3.borrowing = vec![Borrow {
        from: "p0".to_owned(),
        units_per_second: 60.0,
        expires_at: "1970-01-12T13:50:00Z".parse().unwrap(), // 1,000,200 s
        release_within_seconds: 30,
    }];
    let mut c = core(vec![p0, p3]);
    assert_eq!(c.effective_rate(1, 0.0), 100.0);
    // A P0 burst of 90 at t=0 all pass: the floor's second is reserved.
    let passed = (0..90)
        .filter(|_| matches!(c.admit(&req("p0"), 0.0), Verdict::Pass(_)))
        .count();
    assert_eq!(passed, 90);
    // P0 used 90 req/s (70 above its rate): P3 gives back the 60 it borrowed.
    assert!((c.effective_rate(1, 0.5) - 40.0).abs() < 1e-9);
    assert!((c.effective_rate(0, 0.5) - 90.0).abs() < 1e-9);
}

#[test]
fn a_grant_lapses_at_expires_at_without_a_new_config() {
    let mut p0 = lane("p0", 20.0, 20);
    p0.floor_units_per_second = Some(90.0);
    let mut p3 = lane("p3", 100.0, 100);
    p3.borrowing = vec![Borrow {
        from: "p0".to_owned(),
        units_per_second: 60.0,
        expires_at: "1970-01-12T13:50:00Z".parse().unwrap(),
        release_within_seconds: 30,
    }];
    let c = core(vec![p0, p3]);
    // unix_now 1,000,000 at mono 0: expires at mono 200.
    assert_eq!(c.effective_rate(1, 199.0), 100.0);
    assert_eq!(c.effective_rate(1, 200.0), 40.0);
}

#[test]
fn the_limit_holds_sheddable_lanes_and_conserve_ends_after_a_stable_window() {
    // The never-shed lane keeps a reserve of one slot (its bucket's size):
    // the sheddable lane has nine.
    let mut cfg = config(vec![lane("shed", 1e6, 1_000_000), {
        let mut l = lane("never", 2.0, 1);
        l.sheddable = false;
        l
    }]);
    cfg.in_flight = Some(InFlight {
        conserve_at: 8,
        stop_at: 10,
        resume_below: 5,
        resume_after_stable_seconds: Some(30),
    });
    let mut c = Core::new(cfg, 1.0, 0.0, 0.0).unwrap();
    for _ in 0..9 {
        assert!(matches!(c.admit(&req("shed"), 0.0), Verdict::Pass(_)));
        c.started(0.0);
    }
    assert_eq!(c.pressure(), Pressure::Conserve);
    // At the limit a sheddable request waits for a slot; the never-shed
    // lane passes, into its reserve and past it.
    let Verdict::Queued { ticket, .. } = c.admit(&req("shed"), 0.0) else {
        panic!("a sheddable request waits at the limit");
    };
    for t in [0.0, 0.6] {
        assert!(matches!(c.admit(&req("never"), t), Verdict::Pass(_)));
        c.started(t);
    }
    assert_eq!(c.in_flight(), 11);
    assert_eq!(c.pressure(), Pressure::Stop);
    // Down to 5 in flight at t=1 with steady latency: the waiting request
    // passes at once, and the gateway conserves until 30 s of stability
    // below resumeBelow.
    for _ in 0..6 {
        c.finished(1.0, 0.2);
    }
    assert_eq!(c.pressure(), Pressure::Conserve);
    let r = c.poll(1.0);
    assert!(matches!(&r[..], [(t, Resolution::Pass(_))] if *t == ticket));
    c.started(1.0);
    assert!(matches!(c.admit(&req("shed"), 1.0), Verdict::Pass(_)));
    c.started(1.0);
    for _ in 0..6 {
        c.finished(1.0, 0.2);
    }
    assert_eq!(c.pressure(), Pressure::Conserve);
    c.finished(20.0, 0.2);
    assert_eq!(c.pressure(), Pressure::Conserve);
    c.finished(31.5, 0.2);
    assert_eq!(c.pressure(), Pressure::Normal);
}

#[test]
fn a_rising_latency_restarts_the_stable_window() {
    let mut cfg = config(vec![lane("a", 1e6, 1_000_000)]);
    cfg.in_flight = Some(InFlight {
        conserve_at: 2,
        stop_at: 3,
        resume_below: 2,
        resume_after_stable_seconds: Some(10),
    });
    let mut c = Core::new(cfg, 1.0, 0.0, 0.0).unwrap();
    for _ in 0..3 {
        c.started(0.0);
    }
    assert_eq!(c.pressure(), Pressure::Stop);
    for _ in 0..3 {
        c.finished(0.5, 0.1);
    }
    assert_eq!(c.pressure(), Pressure::Conserve);
    // One request a second, 0.1 s each until 8 s, then ten times
    // slower. Checked once a second, the p95 (of the 10 s before) is
    // 0.1 s up to the check at 8 s and 1 s from 9 s; it is more than 25 %
    // above the lowest of the last minute until the 0.1 s of second 8
    // leaves that minute at 69 s: the stable window runs from 68 s to
    // 78 s.
    for t in 1..=77 {
        c.started(f64::from(t));
        c.finished(f64::from(t) + 0.5, if t < 8 { 0.1 } else { 1.0 });
    }
    assert_eq!(c.pressure(), Pressure::Conserve, "68 s + 10 s not yet");
    c.started(78.0);
    assert_eq!(c.pressure(), Pressure::Normal);
}

#[test]
fn conserving_sends_the_degraded_history() {
    let mut l = lane("a", 1e6, 1_000_000);
    l.optional_context = Some(OptionalContext {
        history_turns: 20,
        degraded: false,
        degraded_history_turns: Some(8),
    });
    let mut cfg = config(vec![l]);
    cfg.in_flight = Some(InFlight {
        conserve_at: 2,
        stop_at: 100,
        resume_below: 1,
        resume_after_stable_seconds: None,
    });
    let mut c = Core::new(cfg, 1.0, 0.0, 0.0).unwrap();
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Pass(p) if p.history_turns == Some(20)));
    c.started(0.0);
    c.started(0.0);
    assert_eq!(c.pressure(), Pressure::Conserve);
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Pass(p) if p.history_turns == Some(8)));
}

#[test]
fn a_replica_enforces_its_share() {
    let cfg = config(vec![lane("a", 100.0, 100)]);
    let mut c = Core::new(cfg, 0.25, 0.0, 0.0).unwrap();
    let passed = (0..100)
        .filter(|_| matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)))
        .count();
    assert_eq!(passed, 25);
    assert_eq!(c.effective_rate(0, 0.0), 25.0);
}

#[test]
fn bad_configs_are_refused() {
    let mut cfg = config(vec![lane("a", 1.0, 1)]);
    cfg.schema_version = 2;
    assert_eq!(validate(&cfg), Err(ConfigError::SchemaVersion(2)));
    let mut cfg = config(vec![lane("a", 1.0, 1), lane("a", 1.0, 1)]);
    assert!(matches!(validate(&cfg), Err(ConfigError::DuplicateLane(_))));
    cfg.lanes.pop();
    cfg.lanes[0].admitted_requests_per_second = f64::NAN;
    assert!(matches!(
        validate(&cfg),
        Err(ConfigError::Field {
            field: "admittedRequestsPerSecond",
            ..
        })
    ));
    let mut cfg = config(vec![lane("a", 1.0, 1)]);
    cfg.lanes[0].borrowing = vec![Borrow {
        from: "ghost".to_owned(),
        units_per_second: 1.0,
        expires_at: "2026-01-01T00:00:00Z".parse().unwrap(),
        release_within_seconds: 1,
    }];
    assert!(matches!(validate(&cfg), Err(ConfigError::Grant { .. })));
    assert!(matches!(
        Core::new(config(vec![lane("a", 1.0, 1)]), 0.0, 0.0, 0.0),
        Err(ConfigError::Share(_))
    ));
}

#[test]
fn configs_that_would_cause_an_outage_are_refused() {
    assert_eq!(validate(&config(vec![])), Err(ConfigError::NoLanes));
    for bad in [0.0, -420.0, f64::NAN, f64::INFINITY] {
        let mut cfg = config(vec![lane("a", 1.0, 1)]);
        cfg.capacity_units_per_second = Some(bad);
        assert_eq!(
            validate(&cfg),
            Err(ConfigError::Capacity(bad.to_string())),
            "{bad}"
        );
        assert!(Core::new(cfg, 1.0, 0.0, 0.0).is_err(), "{bad}");
    }
    // Unknown capacity is not an outage: the core holds.
    let mut cfg = config(vec![lane("a", 1.0, 1)]);
    cfg.capacity_units_per_second = None;
    assert_eq!(validate(&cfg), Ok(()));
    let text = crate::to_json(&config(vec![lane("a", 1.0, 1)]));
    let negative = text.replace(
        "\"capacityUnitsPerSecond\": 100.0",
        "\"capacityUnitsPerSecond\": -420",
    );
    assert_ne!(negative, text);
    assert!(matches!(
        GatewayConfig::from_json(negative.as_bytes()),
        Err(ConfigError::Capacity(_))
    ));
}

#[test]
fn a_document_with_an_unknown_closed_set_value_does_not_parse() {
    let good = crate::to_json(&config(vec![lane("a", 1.0, 1)]));
    assert!(GatewayConfig::from_json(good.as_bytes()).is_ok());
    for (from, to) in [
        ("\"Enforce\"", "\"enforce\""),
        ("\"Admitted\"", "\"Open\""),
        ("\"Known\"", "\"Maybe\""),
        ("\"schemaVersion\": 1", "\"schemaVersion\": 2"),
    ] {
        let bad = good.replacen(from, to, 1);
        assert_ne!(bad, good, "{from} is in the document");
        let err = GatewayConfig::from_json(bad.as_bytes()).unwrap_err();
        assert!(
            matches!(err, ConfigError::Json(_) | ConfigError::SchemaVersion(2)),
            "{from} -> {to}: {err}"
        );
    }
    let mut cfg = config(vec![lane("a", 1.0, 1), lane("b", 1.0, 1)]);
    cfg.lanes[1].borrowing = vec![Borrow {
        from: "a".to_owned(),
        units_per_second: 1.0,
        expires_at: "2026-01-01T00:00:00Z".parse().unwrap(),
        release_within_seconds: 1,
    }];
    let text = crate::to_json(&cfg);
    assert!(
        text.contains("\"expiresAt\": \"2026-01-01T00:00:00Z\""),
        "{text}"
    );
    let bad = text.replace("2026-01-01T00:00:00Z", "next tuesday");
    assert!(matches!(
        GatewayConfig::from_json(bad.as_bytes()),
        Err(ConfigError::Json(_))
    ));
}

#[test]
fn a_swap_keeps_queues_and_refuses_removed_lanes() {
    let mut c = core(vec![lane("a", 1.0, 1), lane("b", 1.0, 1)]);
    let _ = c.admit(&req("a"), 0.0);
    let _ = c.admit(&req("b"), 0.0);
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Queued { .. }));
    assert!(matches!(c.admit(&req("b"), 0.0), Verdict::Queued { .. }));
    let refused = c
        .swap(config(vec![lane("a", 10.0, 10)]), 1.0, 0.1, 0.0)
        .unwrap();
    assert_eq!(refused.len(), 1);
    assert_eq!(c.queue_depth(0), 1);
    let r = c.poll(0.2);
    assert_eq!(r.len(), 1);
    // A bad config changes nothing.
    let mut bad = config(vec![lane("z", 1.0, 1)]);
    bad.schema_version = 9;
    assert!(c.swap(bad, 1.0, 0.3, 0.0).is_err());
    assert_eq!(c.lane_index("a"), Some(0));
}

#[test]
fn cancel_removes_a_waiting_request() {
    let mut c = core(vec![lane("a", 1.0, 1)]);
    let _ = c.admit(&req("a"), 0.0);
    let Verdict::Queued { ticket, .. } = c.admit(&req("a"), 0.0) else {
        panic!()
    };
    assert!(c.cancel(ticket));
    assert!(!c.cancel(ticket));
    assert!(c.poll(5.0).is_empty());
}

#[test]
fn chat_history_is_trimmed_to_system_and_last_turns() {
    let mut body = json!({"model": "m", "messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "u3"}
    ]});
    assert!(trim_chat_history(&mut body, 2));
    let contents: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, vec!["s", "u2", "a2", "u3"]);
    assert!(!trim_chat_history(&mut body, 5));
    assert!(!trim_chat_history(&mut json!({"prompt": "x"}), 1));
}

#[test]
fn spare_capacity_goes_to_lanes_that_may_use_it_in_priority_order() {
    // Capacity 100 units/s; the lanes claim 10 + 20 = 30 of 95: 65 spare.
    let mut a = lane("a", 10.0, 1);
    a.spare_capacity = true;
    a.queue.max_depth = 1000;
    let mut b = lane("b", 20.0, 1);
    b.queue.max_depth = 1000;
    let mut c = core(vec![a, b]);
    assert_eq!(c.spare_units_per_second(), 65.0);
    // Over 10 s of steady overload both lanes queue; a gets its 10/s
    // plus the 65 spare, b (spareCapacity false) its 20/s and no more.
    let mut passed = [0usize; 2];
    let mut t = 0.0;
    while t < 10.0 {
        for (i, name) in ["a", "b"].iter().enumerate() {
            if matches!(c.admit(&req(name), t), Verdict::Pass(_)) {
                passed[i] += 1;
            }
        }
        for (_, r) in c.poll(t) {
            if let Resolution::Pass(p) = r {
                passed[p.lane] += 1;
            }
        }
        t += 0.005;
    }
    // Rates plus each bucket's one-second burst (the spare's is 65).
    assert!((745..=830).contains(&passed[0]), "a passed {}", passed[0]);
    assert!((199..=222).contains(&passed[1]), "b passed {}", passed[1]);
}

/// Passes of each lane over `seconds` of steady overload (every lane
/// offered 200 requests/s, polled as often), and the passes of the last
/// `tail` seconds.
fn overload(c: &mut Core, names: &[&str], seconds: f64, tail: f64) -> (Vec<usize>, Vec<usize>) {
    let (mut all, mut late) = (vec![0; names.len()], vec![0; names.len()]);
    let mut t = 0.0;
    while t < seconds {
        let mut count = |li: usize| {
            all[li] += 1;
            if t >= seconds - tail {
                late[li] += 1;
            }
        };
        for (i, name) in names.iter().enumerate() {
            if matches!(c.admit(&req(name), t), Verdict::Pass(_)) {
                count(i);
            }
        }
        for (_, r) in c.poll(t) {
            if let Resolution::Pass(p) = r {
                count(p.lane);
            }
        }
        t += 0.005;
    }
    (all, late)
}

#[test]
fn spare_capacity_never_takes_a_lane_past_its_ceiling() {
    // 65 units/s spare, as above; a's ceiling is 30 units/s (its own rate
    // 10): spare may add 20/s and no more.
    let mut a = lane("a", 10.0, 1);
    a.spare_capacity = true;
    a.queue.max_depth = 1000;
    a.ceiling_units_per_second = Some(30.0);
    let mut c = core(vec![a.clone()]);
    let (all, late) = overload(&mut c, &["a"], 10.0, 5.0);
    // The ceiling over 10 s, plus its one second deep meter at the start.
    assert!((295..=331).contains(&all[0]), "a passed {}", all[0]);
    assert!((145..=151).contains(&late[0]), "the last 5 s: {}", late[0]);
    // What the meter holds, a new config keeps: a raised ceiling does not
    // hand the lane a fresh second of it.
    let mut raised = a.clone();
    raised.ceiling_units_per_second = Some(60.0);
    c.swap(config(vec![raised]), 1.0, 10.0, 0.0).unwrap();
    let at_once = c
        .poll(10.0)
        .into_iter()
        .filter(|(_, r)| matches!(r, Resolution::Pass(_)))
        .count();
    assert!(
        at_once <= 1,
        "{at_once} of its queue passed at once after the swap"
    );
    // Without the ceiling the same lane takes its rate plus the spare.
    a.ceiling_units_per_second = None;
    let (all, _) = overload(&mut core(vec![a]), &["a"], 10.0, 5.0);
    assert!(all[0] > 700, "without a ceiling: {}", all[0]);
}

#[test]
fn a_lane_held_at_its_ceiling_wakes_when_the_ceiling_refills() {
    let mut a = lane("a", 1.0, 1);
    a.spare_capacity = true;
    a.queue.max_depth = 10;
    a.queue.ttl_seconds = 60;
    a.ceiling_units_per_second = Some(2.0);
    let mut c = core(vec![a]);
    // Its own token and its ceiling's two units: two pass, the third
    // waits for the ceiling (spare alone would let it go at once).
    let passed = (0..3)
        .filter(|_| matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)))
        .count();
    assert_eq!(passed, 2);
    let wake = c.next_wake(0.0).expect("a request waits");
    assert!((wake - 0.5).abs() < 1e-6, "woken at {wake}");
}

#[test]
fn no_spare_capacity_without_known_capacity_nor_for_held_lanes() {
    let mut a = lane("a", 1.0, 1);
    a.spare_capacity = true;
    let mut cfg = config(vec![a.clone()]);
    cfg.telemetry = Telemetry::Unknown;
    let c = Core::new(cfg, 1.0, 0.0, 0.0).unwrap();
    assert_eq!(c.spare_units_per_second(), 0.0, "Unknown capacity: none");
    let mut cfg = config(vec![a.clone()]);
    cfg.capacity_units_per_second = None;
    let c = Core::new(cfg, 1.0, 0.0, 0.0).unwrap();
    assert_eq!(c.spare_units_per_second(), 0.0);
    // A paused lane never passes, spare or not.
    let mut p = a.clone();
    p.state = LaneState::Paused;
    let mut c = core(vec![p]);
    assert!(c.spare_units_per_second() > 0.0);
    assert!(!matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)));
    // Floors are claimed too; two replicas halve the spare.
    let mut f = a;
    f.floor_units_per_second = Some(50.0);
    let c = Core::new(config(vec![f]), 0.5, 0.0, 0.0).unwrap();
    assert_eq!(c.spare_units_per_second(), 100.0 * 0.5 * 0.95 - 25.0);
}

#[test]
fn a_swap_keeps_what_a_floor_accrued_since_the_last_refill() {
    // P0: admitted 20 req/s, floor 90: its bucket refills at 90/s. A burst
    // of 90 empties it at 0 s; half a second later a new config (the same
    // lane) comes: 45 tokens accrued at the floor's rate, not 10 at the
    // admitted rate.
    let mut p0 = lane("p0", 20.0, 20);
    p0.floor_units_per_second = Some(90.0);
    p0.sheddable = false;
    p0.queue.max_depth = 0;
    let mut c = core(vec![p0.clone()]);
    let burst = |c: &mut Core, now: f64| {
        (0..100)
            .filter(|_| matches!(c.admit(&req("p0"), now), Verdict::Pass(_)))
            .count()
    };
    assert_eq!(burst(&mut c, 0.0), 90);
    let mut next = config(vec![p0]);
    next.level = 1;
    c.swap(next, 1.0, 0.5, 1_000_000.5).unwrap();
    assert_eq!(burst(&mut c, 0.5), 45);
}

#[test]
fn a_request_whose_ttl_ran_out_is_told_when_to_come_back() {
    // At 0.1 req/s a second request waits 10 s for its token, within the
    // 25 s TTL; the rate then drops tenfold and its TTL runs out first.
    // Coming back can help (x-should-retry: true): it is told the
    // expected wait. One whose deadline can no longer be met is not.
    let mut l = lane("a", 0.1, 1);
    l.queue.ttl_seconds = 25;
    l.retry_after_seconds = Some(7);
    let mut c = core(vec![l.clone()]);
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)));
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Queued { .. }));
    let mut slower = l;
    slower.admitted_requests_per_second = 0.01;
    assert!(
        c.swap(config(vec![slower]), 1.0, 1.0, 0.0)
            .unwrap()
            .is_empty()
    );
    match &c.poll(25.5)[..] {
        [(_, Resolution::Refuse(x))] => {
            assert_eq!((x.outcome, x.limit), (Outcome::Expired, Limit::QueueTtl));
            // The lane's queue (now empty) at 0.01/s, less its tokens:
            // the next token's wait.
            assert!(x.retry_after_seconds.is_some_and(|s| s >= 1), "{x:?}");
        }
        r => panic!("{r:?}"),
    }
    // Past its deadline while waiting: no Retry-After.
    let mut d = lane("d", 0.1, 1);
    d.queue.ttl_seconds = 25;
    d.deadline_seconds = 12;
    let mut c = core(vec![d.clone()]);
    assert!(matches!(c.admit(&req("d"), 0.0), Verdict::Pass(_)));
    assert!(matches!(c.admit(&req("d"), 0.0), Verdict::Queued { .. }));
    d.deadline_seconds = 5;
    assert!(c.swap(config(vec![d]), 1.0, 1.0, 0.0).unwrap().is_empty());
    match &c.poll(5.5)[..] {
        [(_, Resolution::Refuse(x))] => {
            assert_eq!((x.outcome, x.limit), (Outcome::Expired, Limit::Deadline));
            assert_eq!(x.retry_after_seconds, None);
        }
        r => panic!("{r:?}"),
    }
}
