//! What a request is estimated to cost before it runs: its input tokens
//! from its body at a bytes-per-token ratio learned from settled usage, and
//! its output tokens at the lane's P95 of settled output tokens (a
//! streaming quantile sketch), never above the request's own `max_tokens`.
//! The admission practice reserves at the class's P95, not its mean.

use crate::request_shape::DEFAULT_BYTES_PER_TOKEN;

/// Output tokens assumed before a lane has settled [`MIN_SAMPLES`] answers.
pub const DEFAULT_OUTPUT_TOKENS: u64 = 256;
/// Settled answers needed before the measured P95 replaces the default.
pub const MIN_SAMPLES: u64 = 20;
/// The quantile output tokens are reserved at.
pub const OUTPUT_QUANTILE: f64 = 0.95;
/// Weight of one settled answer in the learned bytes-per-token ratio.
const RATIO_WEIGHT: f64 = 0.05;
/// The learned ratio stays within these bounds (a body of base64 or of a
/// script that tokenises badly must not make every prompt look free).
const RATIO_BOUNDS: (f64, f64) = (1.0, 16.0);
/// Relative width of the sketch's buckets: a quantile is within 2 % of the
/// true value.
const GAMMA: f64 = 1.04;
/// Buckets of the sketch: `GAMMA^BUCKETS` is past a million tokens.
const BUCKETS: usize = 360;

/// A streaming quantile sketch of token counts: counts in buckets whose
/// bounds grow by `GAMMA` (4 %), so memory is fixed and a quantile's relative
/// error is bounded whatever the stream.
#[derive(Clone, Debug)]
pub struct TokenSketch {
    counts: Vec<u64>,
    total: u64,
    /// The sum of the observations (for their mean).
    sum: u64,
    /// The highest bucket with an observation (a high quantile is read
    /// from the top down: a few buckets, not all of them).
    top: usize,
}

impl Default for TokenSketch {
    fn default() -> Self {
        TokenSketch {
            counts: vec![0; BUCKETS],
            total: 0,
            sum: 0,
            top: 0,
        }
    }
}

impl TokenSketch {
    fn bucket(tokens: u64) -> usize {
        if tokens <= 1 {
            return 0;
        }
        ((tokens as f64).ln() / GAMMA.ln())
            .ceil()
            .min((BUCKETS - 1) as f64) as usize
    }

    /// Adds one observation.
    pub fn add(&mut self, tokens: u64) {
        let b = Self::bucket(tokens);
        self.counts[b] += 1;
        self.total += 1;
        self.sum = self.sum.saturating_add(tokens);
        self.top = self.top.max(b);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The mean observation; `None` when empty.
    pub fn mean(&self) -> Option<f64> {
        (self.total > 0).then(|| self.sum as f64 / self.total as f64)
    }

    /// The `q` quantile (the upper bound of its bucket, so never below the
    /// true value by more than one bucket); `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        // The bucket holding the rank-th smallest is the highest one with
        // more than `total - rank` observations at or above it.
        let above = self.total - rank.min(self.total);
        let mut seen = 0;
        for i in (0..=self.top).rev() {
            seen += self.counts[i];
            if seen > above {
                return Some(GAMMA.powi(i as i32).floor().max(1.0) as u64);
            }
        }
        None
    }
}

/// A request's estimated tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenEstimate {
    /// Input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
}

/// A lane's estimator: the learned ratio and the sketch of output tokens.
#[derive(Clone, Debug)]
pub struct Estimator {
    bytes_per_token: f64,
    output: TokenSketch,
}

impl Default for Estimator {
    fn default() -> Self {
        Estimator {
            bytes_per_token: DEFAULT_BYTES_PER_TOKEN as f64,
            output: TokenSketch::default(),
        }
    }
}

impl Estimator {
    /// The bytes-per-token ratio in use.
    pub fn bytes_per_token(&self) -> f64 {
        self.bytes_per_token
    }

    /// The estimate for a body of `body_bytes` asking for at most
    /// `max_tokens` output tokens.
    pub fn estimate(&self, body_bytes: usize, max_tokens: Option<u64>) -> TokenEstimate {
        let input = (body_bytes as f64 / self.bytes_per_token).ceil() as u64;
        let p95 = if self.output.count() >= MIN_SAMPLES {
            self.output.quantile(OUTPUT_QUANTILE)
        } else {
            None
        };
        let output = p95.unwrap_or(DEFAULT_OUTPUT_TOKENS);
        TokenEstimate {
            input,
            output: max_tokens.map_or(output, |m| output.min(m)),
        }
    }

    /// The output tokens a request asking for at most `max_tokens` is
    /// expected to use: the mean of settled answers (the default before
    /// [`MIN_SAMPLES`]), what a queue drains at once reservations settle.
    pub fn expected_output(&self, max_tokens: Option<u64>) -> u64 {
        let mean = if self.output.count() >= MIN_SAMPLES {
            self.output.mean().map(|m| m.round() as u64)
        } else {
            None
        };
        let output = mean.unwrap_or(DEFAULT_OUTPUT_TOKENS);
        max_tokens.map_or(output, |m| output.min(m))
    }

    /// Learns from a settled answer: the body's bytes per prompt token
    /// (`body_bytes` None: its input was counted, not estimated, so the
    /// ratio learns nothing) and the output tokens it used.
    pub fn learn(&mut self, body_bytes: Option<usize>, prompt_tokens: u64, completion_tokens: u64) {
        if let Some(body_bytes) = body_bytes.filter(|b| *b > 0)
            && prompt_tokens > 0
        {
            // Each answer is bounded before it enters the average: one
            // outlier (a huge unused field, an image sent as base64) moves
            // the ratio by at most RATIO_WEIGHT of the bounded gap.
            let seen =
                (body_bytes as f64 / prompt_tokens as f64).clamp(RATIO_BOUNDS.0, RATIO_BOUNDS.1);
            let next = self.bytes_per_token + RATIO_WEIGHT * (seen - self.bytes_per_token);
            self.bytes_per_token = next.clamp(RATIO_BOUNDS.0, RATIO_BOUNDS.1);
        }
        self.output.add(completion_tokens);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn before_enough_answers_the_default_holds_then_the_p95() {
        let mut e = Estimator::default();
        assert_eq!(
            e.estimate(4000, None),
            TokenEstimate {
                input: 1000,
                output: 256
            }
        );
        assert_eq!(
            e.estimate(4000, Some(100)).output,
            100,
            "max_tokens is the ceiling"
        );
        for i in 0..100 {
            // 95 short answers and 5 long ones: the P95 is short.
            e.learn(Some(400), 100, if i < 95 { 50 } else { 2000 });
        }
        let p95 = e.estimate(400, None).output;
        assert!((50..=53).contains(&p95), "{p95}");
        for _ in 0..10 {
            e.learn(Some(400), 100, 2000);
        }
        assert!(
            e.estimate(400, None).output >= 2000,
            "now over 5 % are long"
        );
    }

    #[test]
    fn the_expected_output_is_the_mean_of_settled_answers() {
        let mut e = Estimator::default();
        assert_eq!(e.expected_output(None), DEFAULT_OUTPUT_TOKENS);
        for i in 0..(MIN_SAMPLES - 1) {
            e.learn(None, 100, if i % 2 == 0 { 10 } else { 30 });
        }
        assert_eq!(
            e.expected_output(None),
            DEFAULT_OUTPUT_TOKENS,
            "the default until enough answers"
        );
        // 90 answers of 20 tokens and 10 of 1,000: the mean is 118, the
        // P95 about 1,000.
        let mut e = Estimator::default();
        for i in 0..100 {
            e.learn(None, 100, if i < 90 { 20 } else { 1000 });
        }
        assert_eq!(e.expected_output(None), 118);
        assert!(e.estimate(0, None).output >= 1000);
        assert_eq!(e.expected_output(Some(50)), 50, "max_tokens is the ceiling");
    }

    #[test]
    fn the_ratio_learns_from_usage_within_bounds() {
        let mut e = Estimator::default();
        for _ in 0..200 {
            e.learn(Some(3000), 1000, 10);
        }
        assert!(
            (e.bytes_per_token() - 3.0).abs() < 0.01,
            "{}",
            e.bytes_per_token()
        );
        // Many answers far above the bound take it to the bound, not past.
        for _ in 0..500 {
            e.learn(Some(100_000), 1, 10);
        }
        assert!(
            e.bytes_per_token() <= 16.0 && e.bytes_per_token() > 16.0 - 1e-6,
            "{}",
            e.bytes_per_token()
        );
        // No prompt tokens, nothing learned about the ratio.
        let before = e.bytes_per_token();
        e.learn(Some(1000), 0, 10);
        assert_eq!(e.bytes_per_token(), before);
        // A counted prompt (no bytes to learn from) teaches only the
        // output.
        let outputs = e.output.count();
        e.learn(None, 1, 10);
        assert_eq!(e.bytes_per_token(), before);
        assert_eq!(e.output.count(), outputs + 1);
    }

    /// One answer whose body is far larger than its prompt tokens say (a
    /// 64 KB unused field) moves the ratio by at most 5 % of the way to the
    /// upper bound, and one far smaller by at most 5 % of the way to the
    /// lower one; it takes many such answers to move it further.
    #[test]
    fn one_outlier_answer_moves_the_ratio_by_at_most_its_weight() {
        let mut e = Estimator::default();
        let start = e.bytes_per_token();
        e.learn(Some(64 * 1024), 1, 10);
        let most = start + RATIO_WEIGHT * (RATIO_BOUNDS.1 - start);
        assert!(
            e.bytes_per_token() <= most + 1e-12,
            "{}",
            e.bytes_per_token()
        );
        assert!(e.bytes_per_token() < 5.0, "{}", e.bytes_per_token());
        let mut e = Estimator::default();
        e.learn(Some(1), 1_000_000, 10);
        let least = start - RATIO_WEIGHT * (start - RATIO_BOUNDS.0);
        assert!(
            e.bytes_per_token() >= least - 1e-12,
            "{}",
            e.bytes_per_token()
        );
    }

    proptest! {
        #[test]
        fn a_quantile_is_within_the_sketchs_error(
            mut xs in prop::collection::vec(1u64..1_000_000, 1..400),
            q in 0.01f64..1.0,
        ) {
            let mut s = TokenSketch::default();
            for x in &xs {
                s.add(*x);
            }
            xs.sort_unstable();
            let rank = ((q * xs.len() as f64).ceil() as usize).max(1);
            let truth = xs[rank - 1] as f64;
            let got = s.quantile(q).unwrap() as f64;
            prop_assert!(got >= truth / GAMMA - 1.0 && got <= truth * GAMMA + 1.0, "{} vs {}", got, truth);
        }
    }
}
