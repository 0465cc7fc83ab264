//! Outcomes of a run, per lane and per profile, and their renderings.

use std::fmt::Write as _;

use serde::Serialize;

use crate::api::common::format_number;

use super::engine::{LaneRun, Run};

/// The report of one run.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimReport {
    /// Scenario name.
    pub scenario: String,
    /// Policy.
    pub policy: String,
    /// Seed.
    pub seed: u64,
    /// Seconds simulated.
    pub duration_seconds: f64,
    /// Tick (seconds).
    pub tick_seconds: f64,
    /// Engine evaluations (lanekeeper only).
    pub evaluations: usize,
    /// Per profile.
    pub profiles: Vec<ProfileReport>,
    /// Set-up problems (unbound lanes, lanes without traffic).
    pub warnings: Vec<String>,
}

impl SimReport {
    /// The lane named `name` (the first, in profile order, when two
    /// profiles have one), None when no profile has it.
    pub fn lane(&self, name: &str) -> Option<&LaneReport> {
        self.profiles
            .iter()
            .flat_map(|p| &p.lanes)
            .find(|l| l.name == name)
    }
}

/// One profile.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfileReport {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Every level transition with its time and trigger (lanekeeper only).
    pub level_timeline: Vec<LevelChange>,
    /// Per lane, in priority order.
    pub lanes: Vec<LaneReport>,
    /// Capacity, demand and admitted over time, one point per interval.
    pub series: Vec<SeriesPoint>,
}

/// A level transition.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LevelChange {
    /// When (seconds).
    pub at: i64,
    /// Level before.
    pub from: u32,
    /// Level after.
    pub to: u32,
    /// Name of the level after.
    pub to_name: String,
    /// The engine's reason.
    pub reason: String,
}

/// Outcomes of one lane.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LaneReport {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Priority.
    pub priority: i32,
    /// Original requests (initial backlog included).
    pub offered: u64,
    /// Attempts dispatched to the pool.
    pub admitted: u64,
    /// Work units dispatched to the pool.
    pub admitted_units: f64,
    /// Requests completed within their deadline, end to end.
    pub within_deadline: u64,
    /// `withinDeadline ÷ (offered − pending)` in percent: the share of
    /// requests with an outcome that completed within their deadline.
    pub within_deadline_percent: Option<f64>,
    /// Requests completed after their deadline.
    pub late: u64,
    /// Requests whose last attempt expired in a queue.
    pub expired: u64,
    /// Requests whose last attempt was rejected (no retry followed).
    pub rejected: u64,
    /// Requests whose last attempt failed in the pool.
    pub failed: u64,
    /// Requests of a `Defer` lane whose last deferral told them to come back
    /// after their deadline (the client gave up).
    pub deferred_past_deadline: u64,
    /// Requests that ended without being served: `expired + rejected +
    /// failed + deferredPastDeadline`.
    pub lost: u64,
    /// Requests still queued, in the pool, waiting to retry or deferred and
    /// waiting to come back at the end.
    pub pending: u64,
    /// Deferrals: answers of a `Defer` lane telling a request to come back
    /// after Retry-After (not rejections: the request is kept).
    pub deferrals: u64,
    /// Requests deferred at least once.
    pub deferred_requests: u64,
    /// Requests that came back after a deferral (neither originals nor
    /// retries).
    pub returns: u64,
    /// Attempts rejected at the gateway, retried or not.
    pub rejected_attempts: u64,
    /// Attempts that expired in a queue, retried or not.
    pub expired_attempts: u64,
    /// Attempts after the first (returns after a deferral excluded).
    pub retries: u64,
    /// Attempts ÷ original requests.
    pub retry_amplification: Option<f64>,
    /// Attempts dispatched to the pool ÷ original requests: the load
    /// amplification the pool sees (retries rejected at the gateway by a
    /// retry budget don't count here).
    pub pool_amplification: Option<f64>,
    /// End-to-end latency percentiles of completed requests (seconds).
    pub latency_p50_seconds: Option<f64>,
    /// 95th percentile.
    pub latency_p95_seconds: Option<f64>,
    /// 99th percentile.
    pub latency_p99_seconds: Option<f64>,
    /// Backlog at the end: queued, plus deferred and waiting to come back.
    pub backlog_at_end: u64,
    /// Largest backlog (queued plus deferred) during the run.
    pub peak_backlog: u64,
    /// The last second at which the queue was at its peak.
    pub peak_backlog_at: Option<u64>,
    /// First second after the peak at which the backlog was down to at most
    /// one tick's original arrivals (None: never drained, or never backed
    /// up).
    pub drained_at: Option<u64>,
    /// `drainedAt − peakBacklogAt`.
    pub drain_seconds: Option<u64>,
    /// The closed form of the drain: peak backlog ÷ (requests served −
    /// original requests arriving), both per second and averaged over the
    /// drain. Equal to `drainSeconds` (within a tick's arrivals) when the
    /// backlog drains at the net rate; a shorter measured drain means work
    /// was dropped on the way.
    pub drain_closed_form_seconds: Option<f64>,
    /// Time to drain the backlog left at the end at the net rate of the last
    /// minute: 0 when there is none, None when it is not shrinking (never).
    pub drain_end_backlog_seconds: Option<f64>,
    /// The lane's objective over the scenario (lanes with one; see
    /// `sim::objectives`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objective: Option<super::objectives::ObjectiveOutcome>,
    /// Its tokens, for a lane whose tokens were in play (see
    /// `sim::token_report`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<super::token_report::TokenReport>,
    /// Its tenants, for a lane whose scenario has them (see
    /// `sim::tenant_report`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<super::tenant_report::TenantReport>,
}

/// One point of the profile's time series (averages over the interval).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SeriesPoint {
    /// Start of the interval (seconds).
    pub at: u64,
    /// Level in force at `at`.
    pub level: u32,
    /// Capacity, work units/s.
    pub capacity_units_per_second: f64,
    /// Offered work units/s (all attempts).
    pub demand_units_per_second: f64,
    /// What the gateway allowed: the admitted rate of the decision in force
    /// (lanekeeper) or the fixed limits (static); None for fifo and fair.
    pub admitted_units_per_second: Option<f64>,
    /// Work units/s dispatched to the pool.
    pub served_units_per_second: f64,
    /// Per lane, same order as `lanes`.
    pub lanes: Vec<LaneSeries>,
}

/// A lane's point of the series.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LaneSeries {
    /// Offered work units/s.
    pub demand: f64,
    /// Allowed work units/s (see [`SeriesPoint::admitted_units_per_second`]).
    pub admitted: Option<f64>,
    /// Dispatched work units/s.
    pub served: f64,
    /// Queued at `at`.
    pub queued: u32,
    /// Deferred and waiting to come back at `at`.
    pub deferred: u32,
    /// Original requests/s (first attempts).
    pub originals: f64,
    /// Retries/s (attempts after the first).
    pub retries: f64,
}

fn percentile(sorted: &[f32], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let k = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(round3(f64::from(sorted[k])))
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn lane_report(l: &LaneRun, tick: f64) -> LaneReport {
    let mut lat = l.latencies.clone();
    lat.sort_by(f32::total_cmp);
    // The backlog: queued, plus deferred and waiting to come back.
    let q: Vec<u32> = l
        .queued
        .iter()
        .zip(&l.deferred)
        .map(|(a, b)| a + b)
        .collect();
    let peak = q.iter().copied().max().unwrap_or(0);
    let threshold = |s: usize| {
        let rate = l.originals.get(s).copied().unwrap_or(0) as f64;
        (rate * tick).max(1.0)
    };
    let (peak_at, drained_at) = if f64::from(peak) > threshold(0).max(1.0) {
        let pa = q.iter().rposition(|&x| x == peak).unwrap_or(0);
        let da = (pa + 1..q.len()).find(|&s| f64::from(q[s]) <= threshold(s.min(q.len() - 2)));
        (Some(pa as u64), da.map(|d| d as u64))
    } else {
        (None, None)
    };
    let closed_form = match (peak_at, drained_at) {
        (Some(p), Some(d)) if d > p => {
            let (p, d) = (p as usize, d as usize);
            let n = (d - p) as f64;
            let served = l.served_units[p..d].iter().sum::<f64>() / l.units.max(1e-9) / n;
            let arriving = l.originals[p..d].iter().map(|&x| f64::from(x)).sum::<f64>() / n;
            (served - arriving > 1e-9).then(|| round3(f64::from(peak) / (served - arriving)))
        }
        _ => None,
    };
    let end = (l.queued_end + l.deferred_end) as f64;
    let drain_end = if end <= threshold(q.len().saturating_sub(2)) {
        Some(0.0)
    } else {
        let back = q.len().saturating_sub(61);
        let span = (q.len() - 1 - back) as f64;
        let net = if span > 0.0 {
            (end - f64::from(q[back])) / span
        } else {
            0.0
        };
        (net < -1e-9).then(|| round3(end / -net))
    };
    let lost = l.expired + l.rejected + l.failed + l.deferred_past_deadline;
    let finished = l.within_deadline + l.late + lost;
    LaneReport {
        namespace: l.namespace.clone(),
        name: l.name.clone(),
        priority: l.priority,
        offered: l.offered,
        admitted: l.admitted,
        admitted_units: round3(l.admitted_units),
        within_deadline: l.within_deadline,
        within_deadline_percent: (finished > 0).then(|| {
            (l.within_deadline as f64 / finished as f64 * 100.0 * 1000.0).round() / 1000.0
        }),
        late: l.late,
        expired: l.expired,
        rejected: l.rejected,
        failed: l.failed,
        deferred_past_deadline: l.deferred_past_deadline,
        lost,
        pending: l.offered.saturating_sub(finished),
        deferrals: l.deferrals,
        deferred_requests: l.deferred_requests,
        returns: l.returns,
        rejected_attempts: l.rejected_attempts,
        expired_attempts: l.expired_attempts,
        retries: l.attempts.saturating_sub(l.offered),
        retry_amplification: (l.offered > 0)
            .then(|| (l.attempts as f64 / l.offered as f64 * 10_000.0).round() / 10_000.0),
        pool_amplification: (l.offered > 0)
            .then(|| (l.admitted as f64 / l.offered as f64 * 10_000.0).round() / 10_000.0),
        latency_p50_seconds: percentile(&lat, 0.50),
        latency_p95_seconds: percentile(&lat, 0.95),
        latency_p99_seconds: percentile(&lat, 0.99),
        backlog_at_end: l.queued_end + l.deferred_end,
        peak_backlog: u64::from(peak),
        peak_backlog_at: peak_at,
        drained_at,
        drain_seconds: match (peak_at, drained_at) {
            (Some(p), Some(d)) => Some(d - p),
            _ => None,
        },
        drain_closed_form_seconds: closed_form,
        drain_end_backlog_seconds: drain_end,
        objective: None,
        tokens: l.tokens.as_ref().map(super::token_report::token_report),
        tenants: l
            .tenants
            .iter()
            .map(super::tenant_report::tenant_report)
            .collect(),
    }
}

/// Builds the report of a run; `interval` is the series' resolution.
pub fn report(run: &Run, interval: f64) -> SimReport {
    let interval = interval.max(1.0).round() as usize;
    let mut profiles = Vec::new();
    for (pi, p) in run.profiles.iter().enumerate() {
        let lanes: Vec<&LaneRun> = run.lanes.iter().filter(|l| l.profile == pi).collect();
        let mut timeline = Vec::new();
        for e in &run.evaluations {
            if let Some(d) = e.profiles.get(pi)
                && let Some(t) = &d.transition
            {
                timeline.push(LevelChange {
                    at: e.at,
                    from: t.from,
                    to: t.to,
                    to_name: p
                        .level_names
                        .get(t.to as usize)
                        .cloned()
                        .unwrap_or_default(),
                    reason: t.reason.clone(),
                });
            }
        }
        let nsec = p.capacity.len().saturating_sub(1).max(1);
        let mut series = Vec::new();
        let mut s0 = 0;
        while s0 < nsec {
            let s1 = (s0 + interval).min(nsec);
            let n = (s1 - s0) as f64;
            let avg = |f: &dyn Fn(usize) -> f64| (s0..s1).map(f).sum::<f64>() / n;
            let ls: Vec<LaneSeries> = lanes
                .iter()
                .map(|l| LaneSeries {
                    demand: round3(avg(&|s| f64::from(l.arrivals[s]) * l.units)),
                    admitted: {
                        let v = avg(&|s| l.limit[s]);
                        v.is_finite().then(|| round3(v))
                    },
                    served: round3(avg(&|s| l.served_units[s])),
                    queued: l.queued[s0],
                    deferred: l.deferred[s0],
                    originals: round3(avg(&|s| f64::from(l.originals[s]))),
                    retries: round3(avg(&|s| f64::from(l.retry_arrivals[s]))),
                })
                .collect();
            let admitted = ls.iter().map(|l| l.admitted).sum::<Option<f64>>();
            series.push(SeriesPoint {
                at: s0 as u64,
                level: p.level[s0],
                capacity_units_per_second: round3(avg(&|s| p.capacity[s])),
                demand_units_per_second: round3(ls.iter().map(|l| l.demand).sum()),
                admitted_units_per_second: admitted.map(round3),
                served_units_per_second: round3(ls.iter().map(|l| l.served).sum()),
                lanes: ls,
            });
            s0 = s1;
        }
        profiles.push(ProfileReport {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            level_timeline: timeline,
            lanes: lanes.iter().map(|l| lane_report(l, run.tick)).collect(),
            series,
        });
    }
    SimReport {
        scenario: run.scenario.clone(),
        policy: run.policy.as_str().to_owned(),
        seed: run.seed,
        duration_seconds: run.duration,
        tick_seconds: run.tick,
        evaluations: run.evaluations.len(),
        profiles,
        warnings: run.warnings.clone(),
    }
}

fn num(v: f64) -> String {
    format_number(v)
}

fn opt_s(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |x| format!("{x:.2}"))
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |x| format!("{x:.3}%"))
}

fn drain(l: &LaneReport) -> String {
    match l.drain_end_backlog_seconds {
        Some(0.0) => match l.drain_seconds {
            Some(d) => match l.drain_closed_form_seconds {
                Some(c) => format!(
                    "drained in {d}s (at {}s; closed form {c:.0}s)",
                    l.drained_at.unwrap_or_default()
                ),
                None => format!("drained in {d}s (at {}s)", l.drained_at.unwrap_or_default()),
            },
            None => "-".to_owned(),
        },
        Some(x) => format!("{:.0}s more", x.ceil()),
        None => "never".to_owned(),
    }
}

const HEADERS: [&str; 19] = [
    "LANE",
    "PRI",
    "OFFERED",
    "ADMITTED",
    "WITHIN-DL",
    "WITHIN-DL%",
    "LATE",
    "EXPIRED",
    "REJECTED",
    "FAILED",
    "LOST",
    "PENDING",
    "DEFERRALS",
    "RETRIES",
    "AMPL",
    "P50",
    "P95",
    "P99",
    "BACKLOG END / DRAIN",
];

fn lane_cells(l: &LaneReport) -> Vec<String> {
    vec![
        l.name.clone(),
        l.priority.to_string(),
        l.offered.to_string(),
        l.admitted.to_string(),
        l.within_deadline.to_string(),
        pct(l.within_deadline_percent),
        l.late.to_string(),
        l.expired.to_string(),
        l.rejected.to_string(),
        l.failed.to_string(),
        l.lost.to_string(),
        l.pending.to_string(),
        l.deferrals.to_string(),
        l.retries.to_string(),
        l.retry_amplification
            .map_or_else(|| "-".into(), |a| format!("{a:.3}")),
        opt_s(l.latency_p50_seconds),
        opt_s(l.latency_p95_seconds),
        opt_s(l.latency_p99_seconds),
        format!("{} / {}", l.backlog_at_end, drain(l)),
    ]
}

fn header_line(r: &SimReport) -> String {
    format!(
        "scenario {}  policy {}  seed {}  duration {}s  tick {}s  evaluations {}",
        r.scenario,
        r.policy,
        r.seed,
        num(r.duration_seconds),
        num(r.tick_seconds),
        r.evaluations
    )
}

fn peaks(p: &ProfileReport) -> String {
    let lanes: Vec<String> = p
        .lanes
        .iter()
        .filter(|l| l.peak_backlog > 0)
        .map(|l| {
            format!(
                "{} peak {}{}",
                l.name,
                l.peak_backlog,
                l.peak_backlog_at
                    .map(|a| format!(" at {a}s"))
                    .unwrap_or_default()
            )
        })
        .collect();
    lanes.join(", ")
}

/// Renders a human-readable table.
pub fn render_table(r: &SimReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", header_line(r));
    for w in &r.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    for p in &r.profiles {
        let _ = writeln!(out, "\nprofile {}/{}", p.namespace, p.name);
        let rows: Vec<Vec<String>> =
            std::iter::once(HEADERS.iter().map(|s| (*s).to_owned()).collect())
                .chain(p.lanes.iter().map(lane_cells))
                .collect();
        let widths: Vec<usize> = (0..HEADERS.len())
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        for row in &rows {
            let mut line = String::from("  ");
            for (c, cell) in row.iter().enumerate() {
                if c == 0 || c == HEADERS.len() - 1 {
                    let _ = write!(line, "{:<w$}  ", cell, w = widths[c]);
                } else {
                    let _ = write!(line, "{:>w$}  ", cell, w = widths[c]);
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        let pk = peaks(p);
        if !pk.is_empty() {
            let _ = writeln!(out, "  backlog: {pk}");
        }
        for line in objective_lines(&p.lanes)
            .into_iter()
            .chain(token_lines(&p.lanes))
        {
            let _ = writeln!(out, "  {line}");
        }
        if r.policy == "lanekeeper" {
            let _ = writeln!(out, "  level timeline:");
            if p.level_timeline.is_empty() {
                let _ = writeln!(out, "    (no transitions)");
            }
            for t in &p.level_timeline {
                let dir = if t.to > t.from { "UP  " } else { "DOWN" };
                let _ = writeln!(
                    out,
                    "    at {:>6}s  {dir} {} -> {} ({}): {}",
                    t.at, t.from, t.to, t.to_name, t.reason
                );
            }
        }
    }
    out
}

/// One line per lane with an objective: attainment, budget used and band.
fn objective_lines(lanes: &[LaneReport]) -> Vec<String> {
    use crate::api::common::format_number as n;
    lanes
        .iter()
        .filter_map(|l| {
            let o = l.objective.as_ref()?;
            Some(format!(
                "objective {} {}%: attainment {} ({} good, {} bad), budget used {}% of the window's {} bad outcomes, band {}",
                l.name,
                n(o.within_deadline_percent),
                o.attainment_percent.map_or_else(|| "-".to_owned(), |a| format!("{}%", n(a))),
                o.good,
                o.bad,
                n(o.budget_used_percent),
                n(o.budget_outcomes),
                o.band.as_str()
            ))
        })
        .collect()
}

/// One line per lane whose tokens were in play, then one per tenant of the
/// lanes with tenants.
fn token_lines(lanes: &[LaneReport]) -> Vec<String> {
    let tokens = lanes
        .iter()
        .filter_map(|l| Some(super::token_report::token_line(&l.name, l.tokens.as_ref()?)));
    let tenants = lanes.iter().flat_map(|l| {
        l.tenants
            .iter()
            .map(|t| super::tenant_report::tenant_line(&l.name, t))
    });
    tokens.chain(tenants).collect()
}

/// Renders markdown (for a pull-request comment).
pub fn render_markdown(r: &SimReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Simulation `{}` under `{}` (seed {}, {}s)\n",
        r.scenario,
        r.policy,
        r.seed,
        num(r.duration_seconds)
    );
    for w in &r.warnings {
        let _ = writeln!(out, "> warning: {w}\n");
    }
    for p in &r.profiles {
        let _ = writeln!(out, "#### Profile `{}/{}`\n", p.namespace, p.name);
        let _ = writeln!(out, "| {} |", HEADERS.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(HEADERS.len()));
        for l in &p.lanes {
            let _ = writeln!(out, "| {} |", lane_cells(l).join(" | "));
        }
        for line in objective_lines(&p.lanes)
            .into_iter()
            .chain(token_lines(&p.lanes))
        {
            let _ = writeln!(out, "\n- {line}");
        }
        if r.policy == "lanekeeper" {
            let _ = writeln!(out, "\nLevel timeline:\n");
            if p.level_timeline.is_empty() {
                let _ = writeln!(out, "- no transitions");
            }
            for t in &p.level_timeline {
                let _ = writeln!(
                    out,
                    "- at {}s: {} → {} (`{}`): {}",
                    t.at, t.from, t.to, t.to_name, t.reason
                );
            }
        }
        let _ = writeln!(out);
    }
    out
}
