//! Estimate, reserve, settle through the core: a priced request takes its
//! cost from its lane's bucket, the answer's usage corrects it (debt
//! included), a missing usage never refunds, and over a long run the lane
//! admits its units per second whatever the mix of sizes.

use proptest::prelude::*;

use crate::tests::{config, lane, req};
use crate::tokens::TokenCost;
use crate::{Core, RequestSize, Resolution, Usage, Verdict};

/// 1 unit per 1,000 input tokens and per 250 output tokens.
fn priced(rps: f64, burst: u64) -> crate::LaneConfig {
    let mut l = lane("a", rps, burst);
    l.cost = Some(TokenCost {
        per_request: None,
        per_input_token: Some(0.001),
        per_output_token: Some(0.004),
    });
    l
}

fn size(body_bytes: usize, max_tokens: u64) -> RequestSize {
    RequestSize {
        body_bytes,
        max_tokens: Some(max_tokens),
        input_tokens: None,
    }
}

fn core(l: crate::LaneConfig) -> Core {
    Core::new(config(vec![l]), 1.0, 0.0, 1_000_000.0).unwrap()
}

fn pass(v: Verdict) -> crate::Pass {
    match v {
        Verdict::Pass(p) => p,
        other => panic!("expected a pass, got {other:?}"),
    }
}

fn tokens(c: &Core) -> f64 {
    c.lanes[0].bucket.tokens
}

#[test]
fn a_lane_without_cost_charges_one_request_sized_or_not() {
    let mut c = core(lane("a", 10.0, 10));
    let passed = (0..15)
        .filter(|_| {
            matches!(
                c.admit_sized(&req("a"), size(400_000, 4000), 0.0),
                Verdict::Pass(_)
            )
        })
        .count();
    assert_eq!(passed, 10, "ten tokens, ten requests, whatever their size");
    let mut c = core(lane("a", 10.0, 10));
    let p = pass(c.admit_sized(&req("a"), size(4000, 10), 0.0));
    let charge = p.charge.expect("a sized request carries its charge");
    assert!(!charge.priced && charge.units == 1.0);
    // Settling an unpriced charge changes nothing, usage or not.
    let before = tokens(&c);
    let u = Usage {
        prompt_tokens: 1,
        completion_tokens: 1,
    };
    let s = c.settle(&charge, Some(u), 0.0).unwrap();
    assert_eq!((s.charged_units, tokens(&c)), (1.0, before));
    // An unsized request carries none.
    assert_eq!(pass(c.admit(&req("a"), 0.0)).charge, None);
}

#[test]
fn a_priced_request_reserves_its_estimate_and_settles_with_its_usage() {
    let mut c = core(priced(10.0, 10));
    // 4,000 bytes ≈ 1,000 input tokens (1 unit) + 250 output (1 unit).
    let p = pass(c.admit_sized(&req("a"), size(4000, 250), 0.0));
    let charge = p.charge.unwrap();
    assert!((charge.units - 2.0).abs() < 1e-9, "{}", charge.units);
    assert!((tokens(&c) - 8.0).abs() < 1e-9);
    // It used 500 input and 50 output tokens: 0.7 units, 1.3 come back.
    let used = Usage {
        prompt_tokens: 500,
        completion_tokens: 50,
    };
    let s = c.settle(&charge, Some(used), 0.0).unwrap();
    assert!((s.charged_units - 0.7).abs() < 1e-9);
    assert!((tokens(&c) - 9.3).abs() < 1e-9);
    // A credit never fills the bucket past its size.
    let p = pass(c.admit_sized(&req("a"), size(4000, 250), 0.0));
    let nothing = Usage {
        prompt_tokens: 0,
        completion_tokens: 0,
    };
    c.settle(&p.charge.unwrap(), Some(nothing), 0.0).unwrap();
    assert!((tokens(&c) - 9.3).abs() < 1e-9, "{}", tokens(&c));
}

#[test]
fn an_answer_without_usage_keeps_its_reservation() {
    let mut c = core(priced(10.0, 10));
    let p = pass(c.admit_sized(&req("a"), size(4000, 250), 0.0));
    let before = tokens(&c);
    let s = c.settle(&p.charge.unwrap(), None, 0.0).unwrap();
    assert_eq!(s.charged_units, s.reserved_units);
    assert_eq!(tokens(&c), before, "no refund without usage");
}

/// An upstream that reports garbage (`prompt_tokens` of 2^64 - 1) put a
/// lane of 10 units/s 1.8e16 tokens in debt at once: nothing of the lane
/// passed again until the gateway restarted (a config swap keeps the debt).
/// Counts above `MAX_REPORTED_TOKENS` are no cost: the reservation
/// stands, as without usage, and the estimator learns nothing from them.
#[test]
fn a_usage_no_answer_can_have_keeps_its_reservation() {
    let mut c = core(priced(10.0, 10));
    for garbage in [
        (u64::MAX, 0),
        (0, u64::MAX),
        (crate::settlement::MAX_REPORTED_TOKENS + 1, 1),
    ] {
        let p = pass(c.admit_sized(&req("a"), size(4000, 250), 0.0));
        let before = tokens(&c);
        let usage = Usage {
            prompt_tokens: garbage.0,
            completion_tokens: garbage.1,
        };
        let s = c.settle(&p.charge.unwrap(), Some(usage), 0.0).unwrap();
        assert_eq!((s.charged_units, s.usage), (s.reserved_units, None));
        assert_eq!(tokens(&c), before, "{garbage:?}");
    }
    assert!(matches!(
        c.admit_sized(&req("a"), size(4000, 250), 1.0),
        Verdict::Pass(_)
    ));
    // The most an answer may report is settled (into debt).
    let p = pass(c.admit_sized(&req("a"), size(4000, 250), 1.0));
    let most = Usage {
        prompt_tokens: crate::settlement::MAX_REPORTED_TOKENS,
        completion_tokens: 0,
    };
    let s = c.settle(&p.charge.unwrap(), Some(most), 1.0).unwrap();
    assert_eq!(s.usage, Some(most));
    assert!(tokens(&c) < -99_000.0, "{}", tokens(&c));
}

#[test]
fn an_answer_that_cost_more_leaves_the_bucket_in_debt_and_later_requests_wait() {
    let mut c = core(priced(10.0, 10));
    let p = pass(c.admit_sized(&req("a"), size(4000, 250), 0.0));
    // It cost 20 units: 18 more than reserved; the bucket owes 10.
    let big = Usage {
        prompt_tokens: 10_000,
        completion_tokens: 2_500,
    };
    c.settle(&p.charge.unwrap(), Some(big), 0.0).unwrap();
    assert!((tokens(&c) + 10.0).abs() < 1e-9, "{}", tokens(&c));
    // The next request (about 2 units: the ratio learned a little from
    // the answer) waits for the debt and its own tokens: about 12 tokens
    // at 10/s.
    let v = c.admit_sized(&req("a"), size(4000, 250), 0.0);
    assert!(matches!(v, Verdict::Queued { .. }), "{v:?}");
    let wake = c.next_wake(0.0).unwrap();
    assert!((wake - 1.2).abs() < 0.01, "{wake}");
    assert!(c.poll(1.1).is_empty());
    let r = c.poll(wake);
    assert!(matches!(r.as_slice(), [(_, Resolution::Pass(p))] if p.charge.is_some()));
}

#[test]
fn a_request_larger_than_the_bucket_passes_on_a_full_one_into_debt() {
    let mut c = core(priced(10.0, 10));
    // 400,000 bytes ≈ 100,000 input tokens: 100 units, ten times the burst.
    let p = pass(c.admit_sized(&req("a"), size(400_000, 1), 0.0));
    assert!(p.charge.unwrap().units > 100.0);
    assert!(tokens(&c) < -89.0);
    assert!(!matches!(
        c.admit_sized(&req("a"), size(40, 1), 1.0),
        Verdict::Pass(_)
    ));
}

#[test]
fn the_estimator_learns_from_settled_usage() {
    let mut c = core(priced(1000.0, 1000));
    // The answers say 2 bytes per input token and 40 output tokens.
    for _ in 0..200 {
        let p = pass(c.admit_sized(&req("a"), size(2000, 4000), 0.0));
        let u = Usage {
            prompt_tokens: 1000,
            completion_tokens: 40,
        };
        c.settle(&p.charge.unwrap(), Some(u), 0.0).unwrap();
    }
    let (e, units) = c.estimate(0, size(2000, 4000));
    assert!((999..=1001).contains(&e.input), "{e:?}");
    assert!(
        (40..=42).contains(&e.output),
        "the P95 of the answers: {e:?}"
    );
    assert!((units - (1.0 + 0.16)).abs() < 0.02, "{units}");
}

#[test]
fn a_counted_request_is_reserved_at_its_count_and_teaches_no_ratio() {
    let mut c = core(priced(1000.0, 1000));
    // 400 bytes would be 100 tokens by the default ratio; counted at 3,000
    // they reserve 3 units for the input.
    let counted = RequestSize {
        input_tokens: Some(3000),
        ..size(400, 250)
    };
    let p = pass(c.admit_sized(&req("a"), counted, 0.0));
    let charge = p.charge.unwrap();
    assert!(charge.input_counted);
    assert_eq!(charge.estimate.input, 3000);
    assert!((charge.units - 4.0).abs() < 1e-9, "{}", charge.units);
    // Its usage says 3,000 prompt tokens in 400 bytes (0.13 bytes a
    // token): the ratio, learned from bodies estimated by their bytes,
    // stays where it was.
    let before = c.lanes[0].estimator.bytes_per_token();
    let u = Usage {
        prompt_tokens: 3000,
        completion_tokens: 40,
    };
    let s = c.settle(&charge, Some(u), 0.0).unwrap();
    assert!((s.charged_units - 3.16).abs() < 1e-9, "{}", s.charged_units);
    assert_eq!(c.lanes[0].estimator.bytes_per_token(), before);
    // The same request estimated by its bytes would have reserved 100.
    let (e, _) = c.estimate(0, size(400, 250));
    assert_eq!(e.input, 100);
}

/// A request whose history was trimmed on its way upstream: its answer's
/// prompt tokens count the trimmed body, so the ratio learns from the
/// bytes sent, not from the larger body that was estimated.
#[test]
fn the_ratio_learns_from_the_bytes_sent_upstream() {
    let mut c = core(priced(1000.0, 1000));
    let answer = Usage {
        prompt_tokens: 250,
        completion_tokens: 40,
    };
    // 4,000 bytes admitted, 1,000 sent (4 bytes a token, as assumed).
    for _ in 0..50 {
        let mut charge = pass(c.admit_sized(&req("a"), size(4000, 250), 0.0))
            .charge
            .unwrap();
        assert_eq!(charge.body_bytes, 4000);
        charge.sent_upstream(1000);
        c.settle(&charge, Some(answer), 0.0).unwrap();
    }
    assert_eq!(c.lanes[0].estimator.bytes_per_token(), 4.0);
    // Learned from the 4,000 bytes instead, the ratio would drift towards
    // 16 and every later prompt would look a quarter of its size.
    let charge = pass(c.admit_sized(&req("a"), size(4000, 250), 0.0))
        .charge
        .unwrap();
    c.settle(&charge, Some(answer), 0.0).unwrap();
    assert!(c.lanes[0].estimator.bytes_per_token() > 4.5);
}

#[test]
fn a_config_swap_keeps_what_the_lane_learned() {
    let mut c = core(priced(1000.0, 1000));
    for _ in 0..50 {
        let p = pass(c.admit_sized(&req("a"), size(2000, 4000), 0.0));
        let u = Usage {
            prompt_tokens: 1000,
            completion_tokens: 40,
        };
        c.settle(&p.charge.unwrap(), Some(u), 0.0).unwrap();
    }
    let learned = c.estimate(0, size(2000, 4000));
    let mut next = config(vec![priced(500.0, 500)]);
    next.level = 1;
    c.swap(next, 1.0, 1.0, 1_000_001.0).unwrap();
    assert_eq!(c.estimate(0, size(2000, 4000)), learned);
}

#[test]
fn a_credit_never_lets_a_paused_lane_admit() {
    // Five requests reserve 2 units each and empty the bucket; a sixth
    // waits. The lane is paused while they run; they settle at 0.14 units
    // each: 9.3 units of credit, which must not pass the waiting one (nor
    // a newcomer) while the lane is paused.
    let mut l = priced(10.0, 10);
    l.queue.ttl_seconds = 1000;
    l.deadline_seconds = 10_000;
    let mut c = core(l.clone());
    let charges: Vec<_> = (0..5)
        .map(|_| {
            pass(c.admit_sized(&req("a"), size(4000, 250), 0.0))
                .charge
                .unwrap()
        })
        .collect();
    let v = c.admit_sized(&req("a"), size(4000, 250), 0.0);
    assert!(matches!(v, Verdict::Queued { .. }), "{v:?}");
    let mut paused = l;
    paused.state = crate::LaneState::Paused;
    let mut next = config(vec![paused]);
    next.level = 2;
    assert!(c.swap(next, 1.0, 0.1, 1_000_000.1).unwrap().is_empty());
    let small = Usage {
        prompt_tokens: 100,
        completion_tokens: 10,
    };
    for (i, ch) in charges.iter().enumerate() {
        let at = 0.2 + 0.1 * i as f64;
        let s = c.settle(ch, Some(small), at).unwrap();
        assert!((s.charged_units - 0.14).abs() < 1e-9);
        assert!(
            c.poll(at)
                .iter()
                .all(|(_, r)| !matches!(r, Resolution::Pass(_))),
            "a paused lane passed a waiting request after a credit"
        );
        assert!(!s.wake, "nothing may go in a paused lane");
    }
    assert!(tokens(&c) <= 0.0, "{}", tokens(&c));
    assert!(!matches!(
        c.admit_sized(&req("a"), size(40, 1), 1.0),
        Verdict::Pass(_)
    ));
}

#[test]
fn a_credit_pays_a_paused_lanes_debt_and_no_more() {
    // Two requests reserve 2 units each; the first costs 20: the bucket
    // owes 12 tokens, a debt the pause carries.
    let mut l = priced(10.0, 10);
    let mut c = core(l.clone());
    let a = pass(c.admit_sized(&req("a"), size(4000, 250), 0.0))
        .charge
        .unwrap();
    let b = pass(c.admit_sized(&req("a"), size(4000, 250), 0.0))
        .charge
        .unwrap();
    let big = Usage {
        prompt_tokens: 10_000,
        completion_tokens: 2_500,
    };
    c.settle(&a, Some(big), 0.0).unwrap();
    assert!((tokens(&c) + 12.0).abs() < 1e-9, "{}", tokens(&c));
    l.state = crate::LaneState::Paused;
    c.swap(config(vec![l]), 1.0, 0.0, 1_000_000.0).unwrap();
    assert!((tokens(&c) + 12.0).abs() < 1e-9, "{}", tokens(&c));
    // The second settles at 0.14: its credit of 1.86 pays part of the debt.
    let small = Usage {
        prompt_tokens: 100,
        completion_tokens: 10,
    };
    c.settle(&b, Some(small), 0.2).unwrap();
    assert!((tokens(&c) + 10.14).abs() < 1e-9, "{}", tokens(&c));
}

#[test]
fn the_fair_queue_charges_each_tenant_by_cost() {
    // Two tenants keep the queue full: one sends prompts 10x the other's.
    // Each is served about the same work units, not the same requests.
    let mut l = priced(10.0, 1);
    l.queue.max_depth = 1000;
    l.queue.ttl_seconds = 1000;
    l.deadline_seconds = 10_000;
    let mut c = core(l);
    let ask = |t: &'static str| crate::Request {
        lane: "a",
        tenant: Some(t),
        attempt: None,
        request_id: None,
    };
    let mut units = std::collections::HashMap::<&str, f64>::new();
    let mut tickets = std::collections::HashMap::new();
    let mut now = 0.0;
    // 400 units each: 40 long requests of 10 and 400 short ones of 1.
    for i in 0..400 {
        let sends: &[(&str, usize)] = if i % 10 == 0 {
            &[("long", 40_000), ("short", 4000)]
        } else {
            &[("short", 4000)]
        };
        for &(t, bytes) in sends {
            if let Verdict::Queued { ticket, .. } = c.admit_sized(&ask(t), size(bytes, 1), now) {
                tickets.insert(ticket, t);
            }
        }
    }
    // 40 s at 10 units/s: half of it, both tenants still waiting.
    while now < 40.0 {
        now += 0.1;
        for (ticket, r) in c.poll(now) {
            if let Resolution::Pass(p) = r {
                *units.entry(tickets[&ticket]).or_default() += p.charge.unwrap().units;
            }
        }
    }
    let (long, short) = (units["long"], units["short"]);
    assert!(
        (long - short).abs() <= 0.15 * long.max(short),
        "{long} vs {short}"
    );
}

/// A priced lane (1 unit per 1,000 input and per 250 output tokens) whose
/// answers used 20 output tokens 90 times in 100 and 1,000 the other 10:
/// a request of 4,000 bytes reserves 1 + 1,000 / 250 = 5 units (its
/// output at the P95) and is expected to cost 1 + 118 / 250 = 1.472.
fn learned(rps: f64, burst: u64) -> Core {
    let mut c = core(priced(rps, burst));
    for i in 0..100 {
        let out = if i < 90 { 20 } else { 1000 };
        c.lanes[0].estimator.learn(Some(4000), 1000, out);
    }
    c
}

fn used(out: u64) -> Usage {
    Usage {
        prompt_tokens: 1000,
        completion_tokens: out,
    }
}

#[test]
fn the_refunds_due_follow_the_reservations_in_flight() {
    let mut c = learned(1000.0, 1000);
    let charges: Vec<_> = (0..4)
        .map(|_| pass(c.admit_sized(&req("a"), size(4000, 4096), 0.0)))
        .map(|p| p.charge.unwrap())
        .collect();
    // The sketch reads the P95 as 1,034 tokens (its bucket's upper edge).
    let due = charges[0].refund_due;
    assert!((charges[0].units - 5.136).abs() < 1e-9, "{:?}", charges[0]);
    // Expected to cost 1.472 units: 5.136 - 1.472 come back.
    assert!(
        (charges[0].units - due - 1.472).abs() < 1e-9,
        "{:?}",
        charges[0]
    );
    assert!((c.lanes[0].refunds_due - 4.0 * due).abs() < 1e-9);
    // Settled with its usage or without (the reservation stands: nothing
    // comes back), a request's refund is no longer due.
    c.settle(&charges[0], Some(used(20)), 0.0).unwrap();
    c.settle(&charges[1], None, 0.0).unwrap();
    assert!((c.lanes[0].refunds_due - 2.0 * due).abs() < 1e-9);
    // A config swap keeps what is due; a charge settled twice never takes
    // it below nothing.
    let mut next = config(vec![priced(500.0, 500)]);
    next.level = 1;
    c.swap(next, 1.0, 0.0, 1_000_000.0).unwrap();
    assert!((c.lanes[0].refunds_due - 2.0 * due).abs() < 1e-9);
    for ch in charges.iter().chain(&charges) {
        c.settle(ch, Some(used(20)), 0.0).unwrap();
    }
    assert_eq!(c.lanes[0].refunds_due, 0.0);
    // An unpriced lane expects what it reserves: nothing is ever due.
    let mut plain = core(lane("a", 10.0, 10));
    pass(plain.admit_sized(&req("a"), size(4000, 4096), 0.0));
    assert_eq!(plain.lanes[0].refunds_due, 0.0);
}

/// [`learned`] at 1 unit/s, 5 s deep, 1 s of service, with one request in
/// flight: the bucket holds 5 - 5.136, and 3.664 units are due back when it
/// settles.
fn one_in_flight(deadline: i64, ttl: i64) -> (Core, crate::Charge) {
    let mut l = priced(1.0, 5);
    l.deadline_seconds = deadline;
    l.queue.ttl_seconds = ttl;
    l.expected_service_seconds = Some(1.0);
    let mut c = core(l);
    c.lanes[0].estimator = learned(1.0, 5).lanes[0].estimator.clone();
    let first = pass(c.admit_sized(&req("a"), size(4000, 4096), 0.0));
    assert!((tokens(&c) + 0.136).abs() < 1e-9, "{}", tokens(&c));
    (c, first.charge.unwrap())
}

fn rejected_deadline(v: &Verdict) -> bool {
    matches!(
        v,
        Verdict::Refuse(crate::Refusal {
            outcome: crate::Outcome::RejectedDeadline,
            ..
        })
    )
}

/// A priced lane's queue drains at its rate plus the excess its requests
/// in flight give back as they settle (over the expected service time);
/// what an answer without usage keeps is waited for.
#[test]
fn a_priced_wait_counts_the_refunds_due_as_they_come_back() {
    // The next needs 5.136 units and the 0.136 owed, at 1 unit/s plus the
    // 3.664 due over 1 s: 1.1 s, 2.1 s with its service. One more behind
    // it: 2.2 s, 3.2 s. At 1 unit/s alone the first would wait 5.3 s,
    // past a 5 s deadline.
    let (mut c, _) = one_in_flight(5, 4);
    for _ in 0..2 {
        let v = c.admit_sized(&req("a"), size(4000, 4096), 0.0);
        assert!(matches!(v, Verdict::Queued { .. }), "{v:?}");
    }
    // Once the one in flight settled without usage nothing is due: 5.3 s.
    let (mut c, first) = one_in_flight(5, 4);
    c.settle(&first, None, 0.0).unwrap();
    let v = c.admit_sized(&req("a"), size(4000, 4096), 0.0);
    assert!(rejected_deadline(&v), "{v:?}");
}

/// One request of a mix: (body bytes, output tokens it uses, whether its
/// answer reports usage).
fn request() -> impl Strategy<Value = (usize, u64, bool)> {
    (
        prop_oneof![Just(400usize), Just(32_000usize), 100usize..40_000],
        prop_oneof![Just(20u64), Just(800u64), 1u64..2_000],
        prop::bool::weighted(0.9),
    )
}

fn usage_of(bytes: usize, out: u64) -> Usage {
    Usage {
        prompt_tokens: (bytes as u64).div_ceil(4),
        completion_tokens: out,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn settled_cost_is_the_sum_of_actual_costs_and_no_usage_never_refunds(
        mix in prop::collection::vec(request(), 1..300),
    ) {
        let mut c = core(priced(1e9, 1_000_000_000));
        let cost = c.lane(0).cost.clone().unwrap();
        let (mut charged, mut expected) = (0.0, 0.0);
        for (i, (bytes, out, reports)) in mix.iter().enumerate() {
            let now = i as f64 * 0.001;
            let p = pass(c.admit_sized(&req("a"), size(*bytes, 4096), now));
            let charge = p.charge.unwrap();
            let u = usage_of(*bytes, *out);
            let s = c.settle(&charge, reports.then_some(u), now).unwrap();
            charged += s.charged_units;
            expected += if *reports {
                cost.of(u.prompt_tokens, u.completion_tokens)
            } else {
                prop_assert_eq!(s.charged_units, charge.units, "no refund without usage");
                charge.units
            };
        }
        prop_assert!((charged - expected).abs() <= 1e-6 * expected.max(1.0));
        prop_assert_eq!(c.lanes[0].refunds_due, 0.0, "nothing in flight, nothing due");
    }

    #[test]
    fn the_admitted_cost_rate_converges_to_the_lanes_units_per_second(
        mix in prop::collection::vec(request(), 20..80),
        rate in 20.0f64..200.0,
    ) {
        // Demand far above the rate (a request every 10 ms, cycling through
        // the mix, none waiting), for 300 s; each ends 0.5 s after it passed
        // and settles with its usage then.
        let mut l = priced(rate, rate.ceil() as u64);
        l.queue.ttl_seconds = 0;
        l.queue.max_depth = 0;
        let mut c = core(l);
        let cost = c.lane(0).cost.clone().unwrap();
        let mut pending = std::collections::VecDeque::new();
        let mut settled = 0.0;
        let horizon = 300.0;
        for step in 0..(horizon as usize * 100) {
            let now = step as f64 / 100.0;
            while pending.front().is_some_and(|(t, _, _)| *t <= now) {
                let (_, charge, u) = pending.pop_front().unwrap();
                settled += c.settle(&charge, Some(u), now).unwrap().charged_units;
            }
            let (bytes, out, _) = mix[step % mix.len()];
            if let Verdict::Pass(p) = c.admit_sized(&req("a"), size(bytes, 4096), now) {
                let u = usage_of(bytes, out);
                prop_assert!(cost.of(u.prompt_tokens, u.completion_tokens) > 0.0);
                pending.push_back((now + 0.5, p.charge.unwrap(), u));
            }
        }
        let got = settled / horizon;
        prop_assert!((got - rate).abs() <= 0.10 * rate, "{} units/s vs {}", got, rate);
        // What is due back follows the requests in flight: never below
        // nothing, and nothing once the last has settled.
        prop_assert!(c.lanes[0].refunds_due >= 0.0);
        for (_, charge, u) in pending.drain(..) {
            c.settle(&charge, Some(u), horizon).unwrap();
        }
        prop_assert!(c.lanes[0].refunds_due.abs() < 1e-6, "{}", c.lanes[0].refunds_due);
    }
}

#[test]
fn a_hinted_sized_admission_charges_as_the_plain_one_and_learns_the_ids_place() {
    let with_id = |id| crate::Request {
        request_id: Some(id),
        ..req("a")
    };
    let (mut plain, mut hinted) = (core(priced(1.0, 10)), core(priced(1.0, 10)));
    let mut hint = crate::IdHint::NONE;
    for (n, id) in ["r1", "r2", "r3"].into_iter().enumerate() {
        let now = n as f64;
        let a = plain.admit_sized(&with_id(id), size(4000, 250), now);
        let b = hinted.admit_sized_hinted(&with_id(id), size(4000, 250), &mut hint, now);
        assert_eq!(a, b, "{id}");
        assert_ne!(hint, crate::IdHint::NONE, "the id was written somewhere");
        assert_eq!(tokens(&plain), tokens(&hinted));
    }
    let charge = pass(hinted.admit_sized_hinted(&req("a"), size(4000, 250), &mut hint, 9.0))
        .charge
        .expect("sized");
    assert!(
        charge.priced && (charge.units - 2.0).abs() < 1e-9,
        "{charge:?}"
    );
    assert_eq!(hint, crate::IdHint::NONE, "no id, no hint");
}
