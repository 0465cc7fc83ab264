//! A client that carries where its request id was written
//! ([`Core::admit_hinted`]) gets the verdicts a client without one gets,
//! whatever the hint: its own from the last attempt, another request's, a
//! stale one or none.

use lanekeeper_lanes::{
    Attempt, Core, GatewayConfig, IdHint, Outcome, Request, Resolution, Ticket, Verdict,
};
use proptest::prelude::*;

/// A deferring lane with a small queue, so that deferrals, returns and
/// evictions to make room all happen.
fn config(rps: f64, depth: i64) -> GatewayConfig {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/inc-47/lanes-420.json"
    ))
    .unwrap();
    let mut cfg: GatewayConfig = serde_json::from_str(&text).unwrap();
    let mut l = cfg.lanes[3].clone();
    assert!(l.deferral.is_some(), "the example's P3 lane defers");
    l.name = "lane".to_owned();
    l.admitted_requests_per_second = rps;
    l.burst = 2;
    l.queue.max_depth = depth;
    l.queue.ttl_seconds = 5;
    l.deadline_seconds = 30;
    l.floor_units_per_second = None;
    l.spare_capacity = false;
    l.borrowing = Vec::new();
    cfg.lanes = vec![l];
    cfg.in_flight = None;
    cfg
}

/// How an attempt's hint is chosen.
#[derive(Clone, Copy, Debug)]
enum Hint {
    /// The one its id's last attempt was given.
    Carried,
    /// The one another id was given.
    Other(u8),
    None,
}

fn hint() -> impl Strategy<Value = Hint> {
    prop_oneof![
        6 => Just(Hint::Carried),
        1 => (0u8..16).prop_map(Hint::Other),
        1 => Just(Hint::None),
    ]
}

type Resolved = Vec<(Ticket, Resolution)>;

fn req(id: &str) -> Request<'_> {
    Request {
        lane: "lane",
        tenant: None,
        attempt: None,
        request_id: Some(id),
    }
}

#[test]
fn a_deferred_request_returns_with_its_hint_as_it_would_without() {
    let mut cfg = config(0.01, 1);
    // Time enough to wait 100 s for a token: deferred (by the TTL), not
    // refused (by the deadline).
    cfg.lanes[0].deadline_seconds = 7200;
    let mut core = Core::new(cfg, 1.0, 0.0, 0.0).unwrap();
    let mut hints = [IdHint::NONE; 4];
    // At 0.01/s, what the burst does not pass would wait past the TTL:
    // deferred.
    for (i, hint) in hints.iter_mut().enumerate() {
        let v = core.admit_hinted(&req(&format!("r{i}")), hint, 0.0);
        assert_ne!(*hint, IdHint::NONE, "an id is written where the hint says");
        if i == 3 {
            assert!(
                matches!(v, Verdict::Refuse(ref r) if r.outcome == Outcome::Deferred),
                "{v:?}"
            );
        }
    }
    let kept = hints[3];
    let back = core.admit_hinted(&req("r3"), &mut hints[3], 1.0);
    assert_eq!(hints[3], kept, "a return writes nothing new");
    match back {
        Verdict::Refuse(r) => assert_eq!(r.attempt, Attempt::Returning),
        v => panic!("{v:?}"),
    }
    // Another id's hint, or none: the same count.
    for mut wrong in [hints[0], IdHint::NONE] {
        match core.admit_hinted(&req("r3"), &mut wrong, 2.0) {
            Verdict::Refuse(r) => assert_eq!(r.attempt, Attempt::Returning),
            v => panic!("{v:?}"),
        }
        assert_eq!(wrong, kept, "the id's own write is handed back");
    }
    // No request id: no hint.
    let mut none = kept;
    let anonymous = Request {
        request_id: None,
        ..req("")
    };
    core.admit_hinted(&anonymous, &mut none, 3.0);
    assert_eq!(none, IdHint::NONE);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn a_hint_never_changes_a_verdict(
        rps in 0.5f64..20.0,
        depth in 1i64..6,
        trace in prop::collection::vec((0u32..300, 0u8..16, hint()), 1..300),
    ) {
        let mut plain = Core::new(config(rps, depth), 1.0, 0.0, 0.0).unwrap();
        let mut hinted = Core::new(config(rps, depth), 1.0, 0.0, 0.0).unwrap();
        let mut carried = [IdHint::NONE; 16];
        let mut now = 0.0;
        for (gap_ms, id, how) in trace {
            now += f64::from(gap_ms) / 1000.0;
            let polled: (Resolved, Resolved) = (plain.poll(now), hinted.poll(now));
            prop_assert_eq!(polled.0, polled.1);
            let name = format!("req-{id}");
            let req = req(&name);
            let mut h = match how {
                Hint::Carried => carried[usize::from(id)],
                Hint::Other(o) => carried[usize::from(o)],
                Hint::None => IdHint::NONE,
            };
            let v: (Verdict, Verdict) = (plain.admit(&req, now), hinted.admit_hinted(&req, &mut h, now));
            prop_assert_eq!(v.0, v.1);
            carried[usize::from(id)] = h;
        }
    }
}
