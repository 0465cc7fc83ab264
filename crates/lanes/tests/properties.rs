//! Properties of the gateway's admission core over random arrival traces:
//! the bucket is never exceeded, queues stay within their depth, every
//! queued request is resolved exactly once and never served past its
//! deadline or TTL, and a paused lane passes nothing.

use std::collections::{HashMap, HashSet};

use lanekeeper_lanes::{Core, Outcome, Request, Resolution, Ticket, Verdict};
use lanekeeper_lanes::{GatewayConfig, LaneState};
use proptest::prelude::*;

fn config(
    rps: f64,
    burst: u64,
    depth: i64,
    ttl: i64,
    deadline: i64,
    paused: bool,
) -> GatewayConfig {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/inc-47/lanes-420.json"
    ))
    .unwrap();
    let mut cfg: GatewayConfig = serde_json::from_str(&text).unwrap();
    let mut l = cfg.lanes[2].clone();
    l.name = "lane".to_owned();
    l.state = if paused {
        LaneState::Paused
    } else {
        LaneState::Throttled
    };
    l.admitted_requests_per_second = rps;
    l.burst = burst;
    l.queue.max_depth = depth;
    l.queue.ttl_seconds = ttl;
    l.deadline_seconds = deadline;
    l.deferral = None;
    // No floor (it would raise the bucket above `rps`), no spare capacity
    // (the bucket alone is under test) and no service time.
    l.floor_units_per_second = None;
    l.spare_capacity = false;
    l.expected_service_seconds = None;
    cfg.lanes = vec![l];
    cfg.in_flight = None;
    cfg
}

/// How late the test's driver may poll after a wake-up is due.
const STEP: f64 = 1e-4;

#[derive(Debug, Clone)]
struct Arrival {
    gap_ms: u32,
    tenant: u8,
    cancel_after: Option<u8>,
}

fn arrivals() -> impl Strategy<Value = Vec<Arrival>> {
    prop::collection::vec(
        (0u32..400, 0u8..4, prop::option::weighted(0.1, 0u8..5)).prop_map(|(gap_ms, tenant, c)| {
            Arrival {
                gap_ms,
                tenant,
                cancel_after: c,
            }
        }),
        1..300,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn the_bucket_queue_and_deadlines_hold(
        rps in 0.5f64..50.0,
        burst in 1u64..20,
        depth in 0i64..30,
        ttl in 1i64..10,
        deadline in 1i64..20,
        paused in prop::bool::weighted(0.15),
        trace in arrivals(),
    ) {
        let tenants = ["a", "b", "c", "d"];
        let mut core = Core::new(config(rps, burst, depth, ttl, deadline, paused), 1.0, 0.0, 0.0).unwrap();
        let mut now = 0.0f64;
        let mut passed_at: Vec<f64> = Vec::new();
        // Ticket → (arrival time, cancel after this many later arrivals).
        let mut waiting: HashMap<Ticket, (f64, Option<u8>)> = HashMap::new();
        let mut resolved: HashSet<Ticket> = HashSet::new();
        let mut resolve = |now: f64, rs: Vec<(Ticket, Resolution)>,
                           waiting: &mut HashMap<Ticket, (f64, Option<u8>)>,
                           passed_at: &mut Vec<f64>| -> Result<(), TestCaseError> {
            for (t, r) in rs {
                prop_assert!(resolved.insert(t), "ticket {t:?} resolved twice");
                let (arrived, _) = waiting.remove(&t).expect("a resolved ticket was waiting");
                match r {
                    Resolution::Pass(p) => {
                        prop_assert!(now - arrived <= ttl as f64 + 1e-6, "served past its TTL");
                        prop_assert!(now - arrived <= deadline as f64 + 1e-6, "served past its deadline");
                        prop_assert!(p.remaining_seconds >= -1e-6);
                        passed_at.push(now);
                    }
                    Resolution::Refuse(x) => {
                        // Expired, or (on a full queue) the newest of the
                        // tenant with the most waiting gave way to another
                        // tenant's newcomer.
                        prop_assert!(
                            matches!(x.outcome, Outcome::Expired | Outcome::RejectedQueueFull),
                            "{x:?}"
                        );
                    }
                }
            }
            Ok(())
        };
        for a in &trace {
            // As the gateway does: poll whenever the core says something is
            // due (here at most STEP late), then take the arrival.
            let arrival = now + f64::from(a.gap_ms) / 1000.0;
            while let Some(t) = core.next_wake(now) {
                prop_assert!(t >= now - 1e-9, "a wake-up in the past");
                if t > arrival {
                    break;
                }
                now = t.max(now + STEP).min(arrival);
                let rs = core.poll(now);
                resolve(now, rs, &mut waiting, &mut passed_at)?;
                if now >= arrival {
                    break;
                }
            }
            now = arrival;
            let rs = core.poll(now);
            resolve(now, rs, &mut waiting, &mut passed_at)?;
            // Cancel requests whose client gave up.
            let gone: Vec<Ticket> = waiting
                .iter_mut()
                .filter_map(|(t, (_, c))| match c {
                    Some(0) => Some(*t),
                    Some(n) => { *n -= 1; None }
                    None => None,
                })
                .collect();
            for t in gone {
                prop_assert!(core.cancel(t));
                waiting.remove(&t);
            }
            let v = core.admit(&Request { lane: "lane", tenant: Some(tenants[a.tenant as usize]), attempt: None, request_id: None }, now);
            match v {
                Verdict::Pass(_) => {
                    prop_assert!(!paused, "a paused lane passed a request");
                    passed_at.push(now);
                }
                Verdict::Queued { ticket, .. } => {
                    prop_assert!(!paused);
                    waiting.insert(ticket, (now, a.cancel_after));
                }
                Verdict::Refuse(_) => {}
                Verdict::UnknownLane => prop_assert!(false, "the lane exists"),
            }
            // A request that gave way on a full queue is reported at once.
            let rs = core.poll(now);
            resolve(now, rs, &mut waiting, &mut passed_at)?;
            prop_assert!(core.queue_depth(0) as i64 <= depth, "queue over its depth");
            prop_assert_eq!(core.queue_depth(0), waiting.len());
        }
        // Drain: everything still waiting resolves by its TTL.
        let end = now + ttl as f64 + 1.0;
        while let Some(t) = core.next_wake(now) {
            prop_assert!(t >= now - 1e-9, "a wake-up in the past");
            now = t.max(now + STEP);
            if now > end { break; }
            let rs = core.poll(now);
            resolve(now, rs, &mut waiting, &mut passed_at)?;
        }
        let rs = core.poll(end);
        resolve(end, rs, &mut waiting, &mut passed_at)?;
        prop_assert!(waiting.is_empty(), "left waiting: {}", waiting.len());
        // The bucket: in any window [t, t + w], at most burst + rps·w passes
        // (a waiting request served up to STEP after its token accrued keeps
        // the rate: the next token is not delayed by it).
        passed_at.sort_by(f64::total_cmp);
        for (i, t0) in passed_at.iter().enumerate() {
            for (j, t1) in passed_at.iter().enumerate().skip(i) {
                let n = (j - i + 1) as f64;
                prop_assert!(
                    n <= burst as f64 + rps * (t1 - t0 + STEP) + 1e-6,
                    "{n} passes in {} s at {rps}/s with burst {burst}", t1 - t0
                );
            }
        }
    }
}
