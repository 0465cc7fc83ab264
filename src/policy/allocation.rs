//! Allocation: who gets how much of the pool's capacity.
//!
//! Floors are reserved first in priority order; the rest of capacity is filled
//! in strict priority order up to each lane's cap; lanes of equal priority
//! share by weight. A floor that its lane does not use stays reserved (burst
//! headroom) except what a borrowing lane takes.

/// Tolerance for comparisons of work-unit rates.
pub const EPS: f64 = 1e-9;

/// One lane's claim on capacity, as allocation sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct LaneClaim {
    /// Priority, 0 most critical.
    pub priority: i32,
    /// Share among equal priorities (>= 1).
    pub weight: f64,
    /// Most the lane may be admitted: min(demand, ceiling, level cap), 0 if
    /// paused.
    pub cap: f64,
    /// What the lane's floor reserves: min(floor, ceiling, level cap), 0 if
    /// paused.
    pub reserve: f64,
    /// Lenders (indices into the same slice) and the most it may borrow in
    /// total; `None` if the lane may not borrow.
    pub borrowing: Option<(Vec<usize>, f64)>,
}

/// What allocation gives one lane.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Allocation {
    /// Admitted work units per second (borrowed included).
    pub admitted: f64,
    /// Capacity reserved for the lane's floor.
    pub reserved: f64,
    /// Borrowed from lenders' idle floors, per lender index.
    pub borrowed: Vec<(usize, f64)>,
}

impl Allocation {
    /// Total borrowed.
    pub fn borrowed_total(&self) -> f64 {
        self.borrowed.iter().map(|(_, b)| b).sum()
    }

    /// Admits at most `limit`: what is given up comes out of borrowed
    /// capacity first (the last grant first), then the lane's own share.
    pub fn hold_at(&mut self, limit: f64) {
        let limit = limit.max(0.0);
        let mut excess = self.admitted - limit;
        if excess <= EPS {
            return;
        }
        self.admitted = limit;
        while excess > EPS {
            let Some(last) = self.borrowed.last_mut() else {
                break;
            };
            let cut = last.1.min(excess);
            last.1 -= cut;
            excess -= cut;
            if last.1 <= EPS {
                self.borrowed.pop();
            }
        }
        self.reserved = self.reserved.min(limit);
    }
}

/// Shares `amount` among `wants` by weight, never giving a lane more than it
/// wants (water-filling). Returns what each gets; the sum is at most `amount`.
pub fn weighted_share(wants: &[f64], weights: &[f64], amount: f64) -> Vec<f64> {
    let mut got = vec![0.0; wants.len()];
    let mut left = amount.max(0.0);
    let mut open: Vec<usize> = (0..wants.len()).filter(|&i| wants[i] > EPS).collect();
    while left > EPS && !open.is_empty() {
        let total_weight: f64 = open.iter().map(|&i| weights[i]).sum();
        // The smallest amount, per unit of weight, that satisfies some lane.
        let step = open
            .iter()
            .map(|&i| (wants[i] - got[i]) / weights[i])
            .fold(f64::INFINITY, f64::min);
        let per_weight = step.min(left / total_weight);
        for &i in &open {
            got[i] += per_weight * weights[i];
        }
        left -= per_weight * total_weight;
        open.retain(|&i| wants[i] - got[i] > EPS);
        if per_weight < step {
            break; // capacity ran out before any lane was satisfied
        }
    }
    // Never hand out more than each wants, even by rounding.
    for (g, w) in got.iter_mut().zip(wants) {
        *g = g.min(*w);
    }
    got
}

/// Groups lane indices by priority, most critical first, in input order
/// within a priority.
fn priority_groups(lanes: &[LaneClaim]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lanes.len()).collect();
    order.sort_by_key(|&i| (lanes[i].priority, i));
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for i in order {
        match groups.last_mut() {
            Some(g) if lanes[g[0]].priority == lanes[i].priority => g.push(i),
            _ => groups.push(vec![i]),
        }
    }
    groups
}

/// Fills `avail` into the groups in order, each group sharing by weight.
fn fill(lanes: &[LaneClaim], groups: &[Vec<usize>], wants: &[f64], avail: &mut f64) -> Vec<f64> {
    let mut got = vec![0.0; lanes.len()];
    for group in groups {
        let w: Vec<f64> = group.iter().map(|&i| wants[i]).collect();
        let weights: Vec<f64> = group.iter().map(|&i| lanes[i].weight).collect();
        let share = weighted_share(&w, &weights, *avail);
        for (k, &i) in group.iter().enumerate() {
            got[i] = share[k];
            *avail -= share[k];
        }
    }
    got
}

/// Allocates `capacity` among the lanes. The admitted total never exceeds
/// capacity.
pub fn allocate(lanes: &[LaneClaim], capacity: f64) -> Vec<Allocation> {
    let groups = priority_groups(lanes);
    let mut avail = capacity.max(0.0);

    // 1. Reserve floors in priority order.
    let reserves: Vec<f64> = lanes.iter().map(|l| l.reserve.max(0.0)).collect();
    let reserved = fill(lanes, &groups, &reserves, &mut avail);
    let mut out: Vec<Allocation> = reserved
        .iter()
        .zip(lanes)
        .map(|(&r, l)| Allocation {
            admitted: l.cap.min(r).max(0.0),
            reserved: r,
            borrowed: Vec::new(),
        })
        .collect();
    let mut idle: Vec<f64> = out
        .iter()
        .map(|a| (a.reserved - a.admitted).max(0.0))
        .collect();

    // 2. Fill the rest in strict priority order up to each cap.
    let wants: Vec<f64> = lanes
        .iter()
        .zip(&out)
        .map(|(l, a)| (l.cap - a.admitted).max(0.0))
        .collect();
    let extra = fill(lanes, &groups, &wants, &mut avail);
    for (a, e) in out.iter_mut().zip(extra) {
        a.admitted += e;
    }

    // 3. Borrowing from lenders' idle floors, most critical borrower first.
    for group in &groups {
        for &i in group {
            let Some((lenders, max_borrow)) = &lanes[i].borrowing else {
                continue;
            };
            let mut budget = max_borrow.max(0.0);
            for &lender in lenders {
                if lender == i || lender >= lanes.len() {
                    continue;
                }
                let unmet = (lanes[i].cap - out[i].admitted).max(0.0);
                let take = idle[lender].min(budget).min(unmet);
                if take > EPS {
                    idle[lender] -= take;
                    budget -= take;
                    out[i].admitted += take;
                    out[i].borrowed.push((lender, take));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(priority: i32, cap: f64, reserve: f64) -> LaneClaim {
        LaneClaim {
            priority,
            weight: 1.0,
            cap,
            reserve,
            borrowing: None,
        }
    }

    #[test]
    fn weighted_share_water_fills() {
        let got = weighted_share(&[10.0, 100.0, 100.0], &[1.0, 1.0, 2.0], 100.0);
        assert!((got[0] - 10.0).abs() < 1e-9);
        assert!((got[1] - 30.0).abs() < 1e-9);
        assert!((got[2] - 60.0).abs() < 1e-9);
    }

    #[test]
    fn weighted_share_gives_everyone_their_want_when_there_is_enough() {
        let got = weighted_share(&[1.0, 2.0], &[1.0, 1.0], 100.0);
        assert_eq!(got, vec![1.0, 2.0]);
    }

    #[test]
    fn inc47_at_420() {
        // P0..P4 after level 2: P4 paused, P3 capped at 60.
        let lanes = vec![
            lane(0, 93.6, 93.6),
            lane(1, 180.0, 120.0),
            lane(2, 66.5, 40.0),
            lane(3, 60.0, 0.0),
            lane(4, 0.0, 0.0),
        ];
        let a = allocate(&lanes, 420.0);
        let got: Vec<f64> = a.iter().map(|x| x.admitted).collect();
        let want = [93.6, 180.0, 66.5, 60.0, 0.0];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-9, "{got:?}");
        }
    }

    #[test]
    fn strict_priority_when_short() {
        let lanes = vec![
            lane(0, 100.0, 0.0),
            lane(1, 100.0, 0.0),
            lane(2, 100.0, 0.0),
        ];
        let got: Vec<f64> = allocate(&lanes, 150.0).iter().map(|x| x.admitted).collect();
        assert_eq!(got, vec![100.0, 50.0, 0.0]);
    }

    #[test]
    fn floor_of_lower_priority_is_reserved_before_higher_fill() {
        let lanes = vec![lane(0, 200.0, 0.0), lane(1, 100.0, 40.0)];
        let got: Vec<f64> = allocate(&lanes, 150.0).iter().map(|x| x.admitted).collect();
        assert_eq!(got, vec![110.0, 40.0]);
    }

    #[test]
    fn idle_floor_stays_reserved_and_can_be_borrowed() {
        // Lender demand 50 of a 93.6 floor: 43.6 idle. P1 cannot use it;
        // a borrowing lane can take up to its max.
        let mut borrower = lane(3, 99.0, 0.0);
        borrower.borrowing = Some((vec![0], 60.0));
        let lanes = vec![lane(0, 50.0, 93.6), lane(1, 400.0, 0.0), borrower];
        let a = allocate(&lanes, 420.0);
        assert!((a[0].admitted - 50.0).abs() < 1e-9);
        assert!((a[1].admitted - (420.0 - 93.6)).abs() < 1e-9);
        assert!((a[2].admitted - 43.6).abs() < 1e-9);
        assert!((a[2].borrowed_total() - 43.6).abs() < 1e-9);
        let total: f64 = a.iter().map(|x| x.admitted).sum();
        assert!(total <= 420.0 + 1e-9);
    }

    #[test]
    fn floors_exceeding_capacity_go_by_priority() {
        let lanes = vec![lane(0, 300.0, 300.0), lane(1, 300.0, 300.0)];
        let got: Vec<f64> = allocate(&lanes, 400.0).iter().map(|x| x.admitted).collect();
        assert_eq!(got, vec![300.0, 100.0]);
    }
}
