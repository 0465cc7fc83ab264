//! The pool's model slots and long-context limit at their edges: each
//! refuses with its own reason and a Retry-After, holds the requests that
//! wait, and lets the others through.

use crate::config::GatewayConfig;
use crate::pool_limits::{LongContext, ModelSlots};
use crate::tests::{config, lane, req};
use crate::validate::{ConfigError, validate};
use crate::{Core, Limit, Outcome, RequestSize, Resolution, Verdict};

fn with_limits(slots: Option<u64>, long: Option<(u64, u64)>) -> GatewayConfig {
    let mut cfg = config(vec![lane("a", 1000.0, 1000)]);
    cfg.concurrency = slots.map(|max| ModelSlots { max });
    cfg.long_context = long.map(|(above, max)| LongContext {
        above_input_tokens: above,
        max_concurrency: max,
    });
    cfg
}

fn core(cfg: GatewayConfig) -> Core {
    Core::new(cfg, 1.0, 0.0, 1_000_000.0).unwrap()
}

/// A request of about `tokens` input tokens (4 bytes each).
fn sized(tokens: usize) -> RequestSize {
    RequestSize {
        body_bytes: tokens * 4,
        max_tokens: Some(16),
        input_tokens: None,
    }
}

fn refused_by(v: &Verdict) -> Option<(Limit, Option<i64>)> {
    match v {
        Verdict::Refuse(r) if r.outcome == Outcome::RejectedOverload => {
            Some((r.limit, r.retry_after_seconds))
        }
        _ => None,
    }
}

#[test]
fn model_slots_hold_every_lane_and_free_up_as_requests_finish() {
    let mut c = core(with_limits(Some(2), None));
    for _ in 0..2 {
        assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)));
        c.started(0.0);
    }
    let v = c.admit(&req("a"), 0.1);
    let (limit, retry) = refused_by(&v).expect("refused at the model slots");
    assert_eq!(limit, Limit::ModelSlots);
    assert!(retry.is_some_and(|s| s >= 1));
    c.finished(0.5, 0.5);
    assert!(matches!(c.admit(&req("a"), 0.6), Verdict::Pass(_)));
    // A lane that is never shed is held too: the slots are the model's.
    let mut cfg = with_limits(Some(1), None);
    cfg.lanes[0].sheddable = false;
    let mut c = core(cfg);
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)));
    c.started(0.0);
    let v = c.admit(&req("a"), 0.0);
    assert_eq!(refused_by(&v).map(|r| r.0), Some(Limit::ModelSlots));
}

#[test]
fn a_waiting_request_is_held_while_the_model_slots_are_taken() {
    let mut cfg = with_limits(Some(1), None);
    cfg.lanes[0].admitted_requests_per_second = 1.0;
    cfg.lanes[0].burst = 1;
    let mut c = core(cfg);
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)));
    c.started(0.0);
    // The slot frees at 0.5 s; an arrival then waits for its token (due
    // at 1 s) in the queue.
    c.finished(0.5, 0.5);
    assert!(matches!(c.admit(&req("a"), 0.6), Verdict::Queued { .. }));
    // Another request (one the gateway counts in flight the same way)
    // takes the slot before the token comes.
    c.started(0.7);
    assert!(
        c.poll(1.1).is_empty(),
        "the token is there, the slot is not"
    );
    assert!(c.finished(1.5, 0.8), "its slot freed: the driver is woken");
    assert!(matches!(c.poll(1.5).as_slice(), [(_, Resolution::Pass(_))]));
}

#[test]
fn long_requests_hold_at_most_their_places_while_short_ones_flow() {
    let mut c = core(with_limits(None, Some((1000, 2))));
    let mut charges = Vec::new();
    for _ in 0..2 {
        match c.admit_sized(&req("a"), sized(5000), 0.0) {
            Verdict::Pass(p) => charges.push(p.charge.unwrap()),
            v => panic!("{v:?}"),
        }
    }
    assert!(charges.iter().all(|c| c.long_context));
    let v = c.admit_sized(&req("a"), sized(5000), 0.0);
    let (limit, retry) = refused_by(&v).expect("refused at the long-context limit");
    assert_eq!(limit, Limit::LongContext);
    assert!(retry.is_some_and(|s| s >= 1));
    // Short ones (and unsized ones) pass.
    for _ in 0..50 {
        assert!(matches!(
            c.admit_sized(&req("a"), sized(900), 0.0),
            Verdict::Pass(_)
        ));
    }
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)));
    // A long one ends (with or without usage): one place is free again.
    c.settle(&charges.pop().unwrap(), None, 1.0).unwrap();
    assert!(matches!(
        c.admit_sized(&req("a"), sized(5000), 1.0),
        Verdict::Pass(_)
    ));
    assert!(refused_by(&c.admit_sized(&req("a"), sized(5000), 1.0)).is_some());
}

/// A priced lane learns its bytes-per-token ratio from its answers, and
/// its clients choose both: bodies padded with a field the model does not
/// read (a few prompt tokens in 60 KB) push it to its bound of 16 in a
/// few dozen cheap requests. Whether a request is long used to follow that
/// ratio, so a 12,000-token prompt (48 KB) then looked like 3,000 tokens
/// and a burst of them went past the long-context limit. A request is long
/// at least when its bytes ÷ 4 say so, as `maxInputTokens` reads them.
#[test]
fn a_trained_ratio_does_not_let_long_prompts_past_the_long_context_limit() {
    let mut cfg = with_limits(None, Some((8000, 1)));
    cfg.lanes[0].cost = Some(crate::tokens::TokenCost {
        per_request: Some(0.01),
        per_input_token: Some(0.0001),
        per_output_token: None,
    });
    let mut c = core(cfg);
    let padded = RequestSize {
        body_bytes: 60_000,
        max_tokens: Some(1),
        input_tokens: None,
    };
    let mut t = 0.0;
    for _ in 0..80 {
        t += 1.0;
        let charge = match c.admit_sized(&req("a"), padded, t) {
            Verdict::Pass(p) => p.charge.unwrap(),
            v => panic!("{v:?}"),
        };
        let usage = crate::Usage {
            prompt_tokens: 10,
            completion_tokens: 1,
        };
        c.settle(&charge, Some(usage), t).unwrap();
    }
    assert!(c.lanes[0].estimator.bytes_per_token() > 15.0);
    t += 1.0;
    let first = c.admit_sized(&req("a"), sized(12_000), t);
    assert!(
        matches!(&first, Verdict::Pass(p) if p.charge.as_ref().unwrap().long_context),
        "{first:?}"
    );
    let second = c.admit_sized(&req("a"), sized(12_000), t);
    assert_eq!(
        refused_by(&second).map(|r| r.0),
        Some(Limit::LongContext),
        "{second:?}"
    );
}

#[test]
fn a_waiting_long_request_whose_turn_comes_while_the_places_are_taken_is_refused() {
    let mut cfg = with_limits(None, Some((1000, 1)));
    cfg.lanes[0].admitted_requests_per_second = 1.0;
    cfg.lanes[0].burst = 1;
    let mut c = core(cfg);
    // Unsized first request takes the token.
    assert!(matches!(c.admit(&req("a"), 0.0), Verdict::Pass(_)));
    let long = c.admit_sized(&req("a"), sized(5000), 0.0);
    assert!(matches!(long, Verdict::Queued { .. }), "{long:?}");
    let short = c.admit_sized(&req("a"), sized(10), 0.0);
    assert!(matches!(short, Verdict::Queued { .. }));
    // Meanwhile a long one takes the only place (from another lane's view:
    // here, straight through the gate).
    c.pool.took(true);
    let r = c.poll(1.0);
    assert!(
        matches!(&r[0], (_, Resolution::Refuse(x)) if x.limit == Limit::LongContext && x.retry_after_seconds.is_some()),
        "{r:?}"
    );
    assert!(matches!(r[1], (_, Resolution::Pass(_))), "{r:?}");
}

#[test]
fn each_replica_enforces_its_share_and_a_swap_keeps_the_places_taken() {
    let mut c = Core::new(with_limits(Some(3), Some((1000, 3))), 0.5, 0.0, 1e6).unwrap();
    // ceil(3 / 2) = 2 of each.
    for _ in 0..2 {
        assert!(matches!(
            c.admit_sized(&req("a"), sized(5000), 0.0),
            Verdict::Pass(_)
        ));
        c.started(0.0);
    }
    assert_eq!(
        refused_by(&c.admit(&req("a"), 0.0)).map(|r| r.0),
        Some(Limit::ModelSlots)
    );
    c.swap(with_limits(None, Some((1000, 2))), 1.0, 0.0, 1e6)
        .unwrap();
    assert_eq!(
        refused_by(&c.admit_sized(&req("a"), sized(5000), 0.0)).map(|r| r.0),
        Some(Limit::LongContext),
        "the two long requests in flight keep their places"
    );
}

#[test]
fn a_limit_of_zero_is_refused() {
    for cfg in [
        with_limits(Some(0), None),
        with_limits(None, Some((0, 1))),
        with_limits(None, Some((1, 0))),
    ] {
        assert!(matches!(validate(&cfg), Err(ConfigError::Field { .. })));
    }
    assert!(validate(&with_limits(Some(1), Some((1, 1)))).is_ok());
}

#[test]
fn input_tokens_are_read_only_where_a_decision_needs_them() {
    // A plain lane in a pool without a long-context limit: no decision
    // reads a prompt's size.
    assert!(!core(with_limits(Some(10), None)).reads_input_tokens(0));
    // The pool's long-context limit reads it for every lane.
    assert!(core(with_limits(None, Some((100, 2)))).reads_input_tokens(0));
    // So do the lane's own input limit and its cost.
    let mut cfg = with_limits(None, None);
    cfg.lanes[0].tokens = Some(crate::TokenLimits {
        max_input_tokens: Some(10),
        max_output_tokens: None,
        cap_output_tokens: None,
    });
    assert!(core(cfg.clone()).reads_input_tokens(0));
    // An output limit alone does not.
    cfg.lanes[0].tokens = Some(crate::TokenLimits {
        max_input_tokens: None,
        max_output_tokens: Some(10),
        cap_output_tokens: None,
    });
    assert!(!core(cfg.clone()).reads_input_tokens(0));
    cfg.lanes[0].cost = Some(crate::tokens::TokenCost {
        per_request: Some(1.0),
        per_input_token: None,
        per_output_token: None,
    });
    assert!(core(cfg).reads_input_tokens(0));
}
