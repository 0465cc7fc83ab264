//! The budget's rules at their edges, and the properties issue 23 asks
//! for: settled cost over a long run is the sum of actual costs, the
//! admitted cost rate converges to the lane's units/s whatever the mix of
//! request sizes, and a missing usage never refunds.

use proptest::prelude::*;

use super::*;
use crate::token_estimate::Estimator;

fn per_token() -> TokenCost {
    TokenCost {
        per_request: Some(0.1),
        per_input_token: Some(0.001),
        per_output_token: Some(0.004),
    }
}

#[test]
fn usage_is_read_from_an_answer_or_a_usage_chunk() {
    let body = br#"{"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}"#;
    assert_eq!(
        Usage::from_answer(body),
        Some(Usage {
            prompt_tokens: 12,
            completion_tokens: 3
        })
    );
    for none in [
        &br#"{"choices": []}"#[..],
        br#"{"usage": {"prompt_tokens": 1.5, "completion_tokens": 3}}"#,
        br#"{"usage": {"prompt_tokens": -1, "completion_tokens": 3}}"#,
        br#"{"usage": null}"#,
        b"not json",
    ] {
        assert_eq!(Usage::from_answer(none), None);
    }
}

#[test]
fn a_budget_goes_into_debt_and_later_requests_wait_for_it() {
    let mut b = CostBudget::new(10.0, 10.0, 0.0);
    let r = b.reserve(5.0, 0.0).unwrap();
    // It cost 25: 20 more than reserved, the budget owes 15.
    assert_eq!(b.settle(r, Some(25.0), 0.0), 25.0);
    assert!((b.level(0.0) + 15.0).abs() < 1e-9);
    assert_eq!(b.reserve(1.0, 1.0), None, "still 5 in debt after 1 s");
    assert!((b.wait_for(1.0, 1.0) - 0.6).abs() < 1e-9);
    assert!(b.reserve(1.0, 1.6).is_some());
    // A request larger than the burst passes on a full budget, into debt.
    let mut b = CostBudget::new(1.0, 2.0, 0.0);
    assert!(b.reserve(50.0, 0.0).is_some());
    assert!(b.reserve(0.5, 10.0).is_none());
    // A credit never fills the budget past its burst.
    let mut b = CostBudget::new(1.0, 2.0, 0.0);
    let r = b.reserve(2.0, 0.0).unwrap();
    b.settle(r, Some(0.0), 0.0);
    assert_eq!(b.level(0.0), 2.0);
    // At rate 0 nothing comes back.
    let mut b = CostBudget::new(0.0, 1.0, 0.0);
    b.reserve(1.0, 0.0).unwrap();
    assert_eq!(b.wait_for(1.0, 100.0), f64::INFINITY);
}

#[test]
fn an_answer_without_usage_keeps_its_reservation() {
    let mut b = CostBudget::new(1.0, 10.0, 0.0);
    let r = b.reserve(4.0, 0.0).unwrap();
    assert_eq!(b.settle(r, None, 0.0), 4.0);
    assert!((b.level(0.0) - 6.0).abs() < 1e-9);
    // A garbage actual cost is no usage either.
    let r = b.reserve(4.0, 0.0).unwrap();
    assert_eq!(b.settle(r, Some(f64::NAN), 0.0), 4.0);
    assert_eq!(b.settle(r, Some(-1.0), 0.0), 4.0);
}

/// One request of the mix: (body bytes, output tokens it will use,
/// whether its answer reports usage).
fn request() -> impl Strategy<Value = (usize, u64, bool)> {
    (
        prop_oneof![Just(400usize), Just(32_000usize), 100usize..40_000],
        prop_oneof![Just(20u64), Just(800u64), 1u64..2_000],
        prop::bool::weighted(0.9),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn settled_cost_is_the_sum_of_actual_costs_and_no_usage_never_refunds(
        mix in prop::collection::vec(request(), 1..300),
    ) {
        let cost = per_token();
        let mut b = CostBudget::new(1e9, 1e9, 0.0);
        let mut e = Estimator::default();
        let (mut charged, mut actual_sum, mut reserved_unreported) = (0.0, 0.0, 0.0);
        for (i, (bytes, out, reports)) in mix.iter().enumerate() {
            let now = i as f64;
            let est = e.estimate(*bytes, None);
            let r = b.reserve(cost.of(est.input, est.output), now).unwrap();
            let usage = Usage { prompt_tokens: (*bytes as u64).div_ceil(4), completion_tokens: *out };
            let actual = cost.of(usage.prompt_tokens, usage.completion_tokens);
            let got = b.settle(r, actual_cost(&cost, reports.then_some(usage)), now);
            charged += got;
            if *reports {
                prop_assert!((got - actual).abs() < 1e-9);
                actual_sum += actual;
                e.learn(Some(*bytes), usage.prompt_tokens, usage.completion_tokens);
            } else {
                prop_assert_eq!(got, r.units, "no refund without usage");
                reserved_unreported += r.units;
            }
        }
        prop_assert!((charged - actual_sum - reserved_unreported).abs() < 1e-6 * charged.max(1.0));
    }

    #[test]
    fn the_admitted_cost_rate_converges_to_the_lanes_units_per_second(
        mix in prop::collection::vec(request(), 50..120),
        rate in 20.0f64..200.0,
    ) {
        // Demand far above the rate: a request is offered every 10 ms,
        // cycling through the mix, for 600 s; each ends 0.5 s after it
        // passed and settles then.
        let cost = per_token();
        let burst = rate;
        let mut b = CostBudget::new(rate, burst, 0.0);
        let mut e = Estimator::default();
        let mut pending: std::collections::VecDeque<(f64, Reservation, Usage, usize)> = Default::default();
        let mut settled = 0.0;
        let horizon = 600.0;
        for step in 0..(horizon as usize * 100) {
            let now = step as f64 / 100.0;
            while pending.front().is_some_and(|p| p.0 <= now) {
                let (_, r, u, bytes) = pending.pop_front().unwrap();
                settled += b.settle(r, actual_cost(&cost, Some(u)), now);
                e.learn(Some(bytes), u.prompt_tokens, u.completion_tokens);
            }
            let (bytes, out, _) = mix[step % mix.len()];
            let est = e.estimate(bytes, None);
            if let Some(r) = b.reserve(cost.of(est.input, est.output), now) {
                let u = Usage { prompt_tokens: (bytes as u64).div_ceil(4), completion_tokens: out };
                pending.push_back((now + 0.5, r, u, bytes));
            }
        }
        // Within 10 % of the lane's units/s over the run (what is in flight
        // or owed at the end is at most a burst and a few requests).
        let got = settled / horizon;
        prop_assert!((got - rate).abs() <= 0.10 * rate, "{} units/s vs {}", got, rate);
    }
}
