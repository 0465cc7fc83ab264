//! A lane's ceiling through the real `lanekeeper gateway`: a lane that may
//! use the pool's spare capacity is still held to its
//! `ceilingUnitsPerSecond` when it does, and the same lane without a
//! ceiling takes its rate plus the spare (so the first bound is the
//! ceiling's, not the load's).

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use crate::gateway::{client, config_file, gateway, lane_mut, model};
use crate::gateway_shared::{Answers, tally};
use crate::gateway_shared_spare::{self, CAPACITY, LANE, RATE, load};

const CEILING: f64 = 30.0;
/// Offered to each gateway: more than the lane's rate plus the spare.
const OFFERED: f64 = 150.0;

/// The spare-capacity lane of `gateway_shared_spare` (10 req/s of its own,
/// 85 units/s of spare in the pool) with `ceiling` as its
/// `ceilingUnitsPerSecond`.
fn config(ceiling: Option<f64>) -> Value {
    let mut cfg = gateway_shared_spare::config();
    lane_mut(&mut cfg, LANE)["ceilingUnitsPerSecond"] = json!(ceiling);
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spare_capacity_never_takes_a_lane_past_its_ceiling() {
    let m = model(&["--service-millis", "0"]);
    let capped_file = config_file("ceiling-capped", &config(Some(CEILING)));
    let capped = gateway(&capped_file, &m, &[]);
    let open_file = config_file("ceiling-open", &config(None));
    let open = gateway(&open_file, &m, &[]);
    let c = client();
    let (out_capped, out_open): (Answers, Answers) = (Arc::default(), Arc::default());
    let t0 = Instant::now();
    // Both at once for 10 s, measured over the last 8 (the buckets and the
    // ceiling's one second, full at the start, spent in the first two).
    tokio::join!(
        load(&c, &capped.addr, LANE, OFFERED, 10.0, t0, &out_capped),
        load(&c, &open.addr, LANE, OFFERED, 10.0, t0, &out_open),
    );
    let (ok, refused, other) = tally(&out_capped, 2.0, 10.0);
    let due = CEILING * 8.0;
    eprintln!("ceiling {CEILING}: {ok} admitted in 8 s ({refused} refused), {due} due");
    assert_eq!(other, 0, "no 5xx, no lost answer");
    assert!(
        (ok as f64 - due).abs() <= 0.10 * due,
        "with a ceiling of {CEILING} units/s: {ok} admitted in 8 s, {due} due"
    );
    let (ok, _, other) = tally(&out_open, 2.0, 10.0);
    let spare = CAPACITY * 0.95 - RATE;
    let due = (RATE + spare) * 8.0;
    eprintln!("no ceiling: {ok} admitted in 8 s, {due} due");
    assert_eq!(other, 0);
    assert!(
        (ok as f64 - due).abs() <= 0.10 * due,
        "without a ceiling: {ok} admitted in 8 s, its rate and the spare {due}"
    );
}
