//! A lane's tokens in the report (lanes whose tokens were in play): the
//! input and output tokens of its answered requests, how far its
//! reservations were from what they settled at, and the requests tokens
//! refused.

use serde::Serialize;

use super::engine::LaneTokens;

/// The tokens of one lane over the run.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenReport {
    /// Requests answered (whose usage is counted below).
    pub answered: u64,
    /// Input tokens of the answered requests.
    pub input: TokenCounts,
    /// Output tokens of the answered requests (after `max_tokens`).
    pub output: TokenCounts,
    /// Settled ÷ reserved work units (lanes with `cost`; None when nothing
    /// was settled with usage).
    pub estimate: Option<EstimateError>,
    /// Attempts refused before admission for `maxInputTokens` (413
    /// `context_too_long`).
    pub context_too_long: u64,
    /// Attempts refused by the pool's long-context limit.
    pub long_context_refusals: u64,
}

/// A token count over the answered requests.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenCounts {
    /// All of them.
    pub total: u64,
    /// The median request's.
    pub median_per_request: Option<u64>,
    /// The 95th percentile request's.
    pub p95_per_request: Option<u64>,
}

/// How far the reservations were from the settled cost.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EstimateError {
    /// Requests settled with usage.
    pub settled: u64,
    /// Mean of settled ÷ reserved (1: the estimate was right; below 1 it
    /// reserved more than the answer cost).
    pub mean_settled_to_reserved: f64,
    /// 95th percentile of settled ÷ reserved.
    pub p95_settled_to_reserved: f64,
}

fn nearest_rank<T: Copy + PartialOrd>(sorted: &[T], q: f64) -> Option<T> {
    let k = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len().max(1)) - 1;
    sorted.get(k).copied()
}

fn counts(v: &[u32]) -> TokenCounts {
    let mut sorted = v.to_vec();
    sorted.sort_unstable();
    TokenCounts {
        total: v.iter().map(|&x| u64::from(x)).sum(),
        median_per_request: nearest_rank(&sorted, 0.5).map(u64::from),
        p95_per_request: nearest_rank(&sorted, 0.95).map(u64::from),
    }
}

fn round4(v: f64) -> f64 {
    (v * 10_000.0).round() / 10_000.0
}

fn estimate(ratios: &[f32]) -> Option<EstimateError> {
    if ratios.is_empty() {
        return None;
    }
    let mut sorted = ratios.to_vec();
    sorted.sort_by(f32::total_cmp);
    let mean = ratios.iter().map(|&r| f64::from(r)).sum::<f64>() / ratios.len() as f64;
    Some(EstimateError {
        settled: ratios.len() as u64,
        mean_settled_to_reserved: round4(mean),
        p95_settled_to_reserved: round4(f64::from(nearest_rank(&sorted, 0.95)?)),
    })
}

/// The report of a lane's tokens.
pub fn token_report(t: &LaneTokens) -> TokenReport {
    TokenReport {
        answered: t.input.len() as u64,
        input: counts(&t.input),
        output: counts(&t.output),
        estimate: estimate(&t.settled_to_reserved),
        context_too_long: t.context_too_long,
        long_context_refusals: t.long_context_refusals,
    }
}

fn per_request(c: &TokenCounts) -> String {
    let n = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |x| x.to_string());
    format!(
        "{} (median {}, p95 {} a request)",
        c.total,
        n(c.median_per_request),
        n(c.p95_per_request)
    )
}

/// The report's line for a lane's tokens.
pub fn token_line(lane: &str, t: &TokenReport) -> String {
    let estimate = t.estimate.as_ref().map_or_else(
        || "no cost settled".to_owned(),
        |e| {
            format!(
                "settled/reserved mean {:.4}, p95 {:.4} over {} settled",
                e.mean_settled_to_reserved, e.p95_settled_to_reserved, e.settled
            )
        },
    );
    format!(
        "tokens {lane}: input {}, output {}; {estimate}; refused {} context_too_long, {} long_context",
        per_request(&t.input),
        per_request(&t.output),
        t.context_too_long,
        t.long_context_refusals
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_the_estimate_error_are_read_off_the_run() {
        let t = LaneTokens {
            input: (1..=100).collect(),
            output: vec![7; 100],
            settled_to_reserved: (1..=20).map(|i| i as f32 / 20.0).collect(),
            context_too_long: 3,
            long_context_refusals: 4,
        };
        let r = token_report(&t);
        assert_eq!(r.answered, 100);
        assert_eq!(r.input.total, 5050);
        assert_eq!(
            (r.input.median_per_request, r.input.p95_per_request),
            (Some(50), Some(95))
        );
        assert_eq!(r.output.total, 700);
        let e = r.estimate.clone().unwrap();
        assert_eq!(e.settled, 20);
        assert!((e.mean_settled_to_reserved - 0.525).abs() < 1e-9);
        assert!((e.p95_settled_to_reserved - 0.95).abs() < 1e-6);
        assert_eq!(
            token_line("chat", &r),
            "tokens chat: input 5050 (median 50, p95 95 a request), output 700 (median 7, p95 7 a request); settled/reserved mean 0.5250, p95 0.9500 over 20 settled; refused 3 context_too_long, 4 long_context"
        );
    }

    #[test]
    fn nothing_answered_is_no_percentile_and_no_estimate() {
        let r = token_report(&LaneTokens::default());
        assert_eq!(r.input.median_per_request, None);
        assert_eq!(r.estimate, None);
        assert!(token_line("x", &r).contains("input 0 (median -, p95 - a request)"));
        assert!(token_line("x", &r).contains("no cost settled"));
    }
}
