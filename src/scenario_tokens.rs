//! A lane's token distribution in a scenario (`lanes.<key>.tokens`): the
//! input and output tokens of its requests, each given by its median and
//! 95th percentile, and the draw of one request's tokens from it.
//!
//! Each count is log-normal, fitted to the two quantiles: `μ = ln(median)`,
//! `σ = (ln(p95) − μ) ÷ 1.6449` (the standard normal's 95th percentile), and
//! a draw is `exp(μ + σ·z)` rounded to the nearest whole token, at least 1,
//! with `z` a standard normal (Box–Muller on two uniforms hashed from the
//! seed and the request's id with SplitMix64).
//! Token counts are skewed to the right as log-normals are: most prompts
//! short, a few very long. A request's draw depends only on the scenario's
//! seed and the request's id (no generator state: a request's draw costs
//! two hashes, which matters for the millions of returns of a deferred
//! lane), so a retry or a return after a deferral carries the same prompt
//! and gets the same answer length, and no other draw of the run moves.
//! The mean of each count is `exp(μ + σ²/2)`: a request's service time is
//! scaled by its tokens over the mean request's.

use serde::{Deserialize, Serialize};

/// The standard normal's 95th percentile.
const Z95: f64 = 1.644_853_626_951_472_2;

/// The largest median or P95 a scenario may give (ten million tokens; no
/// model takes more).
pub const MAX_TOKENS: f64 = 10_000_000.0;

/// Mixed into the seed so that token draws share no stream with the
/// scenario's other draws (arrivals, service times, clients).
const TOKEN_KEY: u64 = 0x746f_6b65_6e73; // "tokens"

/// `lanes.<key>.tokens`: the input and output tokens of the lane's requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TokenDistribution {
    /// Input (prompt) tokens.
    pub input: TokenQuantiles,
    /// Output (completion) tokens the model would write, before any
    /// `max_tokens` stops it.
    pub output: TokenQuantiles,
}

/// A token count given by its median and 95th percentile.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TokenQuantiles {
    /// The median (> 0).
    pub median: f64,
    /// The 95th percentile (>= median).
    pub p95: f64,
}

/// Which count of a distribution is wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenSide {
    /// `input`.
    Input,
    /// `output`.
    Output,
}

impl TokenSide {
    /// The field's name.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenSide::Input => "input",
            TokenSide::Output => "output",
        }
    }
}

impl std::fmt::Display for TokenSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TokenQuantiles {
    /// `0 < median <= p95 <= MAX_TOKENS`, both finite.
    pub fn is_valid(&self) -> bool {
        self.median.is_finite()
            && self.median > 0.0
            && self.p95.is_finite()
            && self.p95 >= self.median
            && self.p95 <= MAX_TOKENS
    }

    fn log_normal(&self) -> LogNormal {
        let mu = self.median.ln();
        LogNormal {
            mu,
            sigma: (self.p95.ln() - mu) / Z95,
        }
    }
}

impl TokenDistribution {
    /// The first count that is not `0 < median <= p95 <= 10,000,000`.
    pub fn invalid_side(&self) -> Option<TokenSide> {
        if !self.input.is_valid() {
            return Some(TokenSide::Input);
        }
        (!self.output.is_valid()).then_some(TokenSide::Output)
    }

    /// The sampler of this distribution (check it first).
    pub fn sampler(&self) -> TokenSampler {
        TokenSampler {
            input: self.input.log_normal(),
            output: self.output.log_normal(),
            mean_total: self.input.log_normal().mean() + self.output.log_normal().mean(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct LogNormal {
    mu: f64,
    sigma: f64,
}

impl LogNormal {
    /// `exp(μ + σ²/2)`.
    fn mean(self) -> f64 {
        (self.mu + self.sigma * self.sigma / 2.0).exp()
    }

    fn tokens(self, z: f64) -> u64 {
        ((self.mu + self.sigma * z).exp().round() as u64).max(1)
    }
}

/// SplitMix64's output function of `x`.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform in (0, 1] from 64 hashed bits.
fn unit(bits: u64) -> f64 {
    ((bits >> 11) + 1) as f64 / (1u64 << 53) as f64
}

/// A uniform in (0, 1] for `id` under `key` (one hash).
pub(crate) fn unit_of(key: u64, id: u64) -> f64 {
    unit(mix(mix(key) ^ id))
}

/// Two independent standard normals for `id` under `key` (Box–Muller).
fn normals(key: u64, id: u64) -> (f64, f64) {
    let a = mix(mix(key) ^ id.wrapping_mul(2));
    let b = mix(mix(key) ^ id.wrapping_mul(2).wrapping_add(1));
    let r = (-2.0 * unit(a).ln()).sqrt();
    let theta = std::f64::consts::TAU * unit(b);
    (r * theta.cos(), r * theta.sin())
}

/// One request's tokens as drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrawnTokens {
    /// Input tokens.
    pub input: u64,
    /// Output tokens the model would write.
    pub output: u64,
}

/// Draws requests' tokens from a [`TokenDistribution`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenSampler {
    input: LogNormal,
    output: LogNormal,
    mean_total: f64,
}

impl TokenSampler {
    /// The tokens of request `id` of a run seeded `seed`: the same for the
    /// same pair, whatever else the run draws.
    pub fn draw(&self, seed: u64, id: u64) -> DrawnTokens {
        let (zi, zo) = normals(seed ^ TOKEN_KEY, id);
        DrawnTokens {
            input: self.input.tokens(zi),
            output: self.output.tokens(zo),
        }
    }

    /// The mean input plus the mean output of a request.
    pub fn mean_total(&self) -> f64 {
        self.mean_total
    }

    /// The same draws, with service times scaled against a mean request of
    /// `mean_total` tokens (a lane whose tenants' requests differ: the
    /// mean over its tenants).
    pub fn with_mean_total(self, mean_total: f64) -> TokenSampler {
        TokenSampler { mean_total, ..self }
    }

    /// How much longer than the lane's mean request a request of
    /// `input + output` tokens takes: its tokens ÷ the mean input plus the
    /// mean output of the distribution. Scaling the lane's `service` draw by
    /// it (an independent draw) keeps the lane's mean service time.
    pub fn service_factor(&self, input: u64, output: u64) -> f64 {
        (input + output) as f64 / self.mean_total
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn dist(im: f64, ip: f64, om: f64, op: f64) -> TokenDistribution {
        TokenDistribution {
            input: TokenQuantiles {
                median: im,
                p95: ip,
            },
            output: TokenQuantiles {
                median: om,
                p95: op,
            },
        }
    }

    fn quantile(xs: &mut [u64], q: f64) -> f64 {
        xs.sort_unstable();
        xs[((xs.len() as f64 * q).ceil() as usize).clamp(1, xs.len()) - 1] as f64
    }

    #[test]
    fn bad_quantiles_name_their_side() {
        let ok = dist(800.0, 3000.0, 200.0, 700.0);
        assert_eq!(ok.invalid_side(), None);
        assert_eq!(dist(800.0, 800.0, 1.0, 1.0).invalid_side(), None);
        for (bad, side) in [
            (dist(0.0, 3000.0, 200.0, 700.0), TokenSide::Input),
            (dist(-5.0, 3000.0, 200.0, 700.0), TokenSide::Input),
            (dist(800.0, 799.0, 200.0, 700.0), TokenSide::Input),
            (dist(f64::NAN, 3000.0, 200.0, 700.0), TokenSide::Input),
            (dist(800.0, f64::INFINITY, 200.0, 700.0), TokenSide::Input),
            (dist(800.0, 2e7, 200.0, 700.0), TokenSide::Input),
            (dist(800.0, 3000.0, 0.0, 700.0), TokenSide::Output),
            (dist(800.0, 3000.0, 200.0, 100.0), TokenSide::Output),
        ] {
            assert_eq!(bad.invalid_side(), Some(side), "{bad:?}");
        }
    }

    #[test]
    fn a_requests_tokens_depend_on_the_seed_and_its_id_only() {
        let s = dist(800.0, 3000.0, 200.0, 700.0).sampler();
        let a: Vec<DrawnTokens> = (0..50).map(|id| s.draw(47, id)).collect();
        let b: Vec<DrawnTokens> = (0..50).rev().map(|id| s.draw(47, id)).collect();
        assert!(
            a.iter().eq(b.iter().rev()),
            "the order of draws changes nothing"
        );
        assert_ne!(
            a,
            (0..50).map(|id| s.draw(48, id)).collect::<Vec<_>>(),
            "another seed, other tokens"
        );
        assert!(a.windows(2).any(|w| w[0] != w[1]), "requests differ");
    }

    #[test]
    fn a_degenerate_distribution_is_its_median() {
        let s = dist(1000.0, 1000.0, 1.0, 1.0).sampler();
        for id in 0..100 {
            assert_eq!(
                s.draw(1, id),
                DrawnTokens {
                    input: 1000,
                    output: 1
                }
            );
        }
        assert!((s.service_factor(1000, 1) - 1.0).abs() < 1e-12);
        assert!((s.service_factor(10_010, 0) - 10.0).abs() < 1e-12);
        // A spread distribution's mean request is above its median one.
        let s = dist(800.0, 3000.0, 200.0, 700.0).sampler();
        let mean: f64 = (0..20_000)
            .map(|id| {
                let d = s.draw(3, id);
                s.service_factor(d.input, d.output)
            })
            .sum::<f64>()
            / 20_000.0;
        assert!((mean - 1.0).abs() < 0.03, "the mean factor is 1: {mean}");
        assert!(s.service_factor(800, 200) < 0.8);
    }

    fn parsed(tokens: &str) -> Result<crate::scenario::Scenario, String> {
        let text = format!(
            "durationSeconds: 60\nlanes:\n  chat:\n    service: {{p50Seconds: 1, p95Seconds: 2}}\n    tokens: {tokens}\n"
        );
        let s: crate::scenario::Scenario =
            serde_yaml::from_str(&text).map_err(|e| e.to_string())?;
        crate::scenario::check(&s).map_err(|e| e.to_string())?;
        Ok(s)
    }

    #[test]
    fn a_scenario_parses_its_tokens_and_says_which_is_wrong() {
        let s =
            parsed("{input: {median: 800, p95: 3000}, output: {median: 200, p95: 700}}").unwrap();
        assert_eq!(
            s.lanes["chat"].tokens,
            Some(dist(800.0, 3000.0, 200.0, 700.0))
        );
        for (bad, says) in [
            (
                "{input: {median: 800, p95: 300}, output: {median: 200, p95: 700}}",
                "lanes.chat.tokens.input: need 0 < median <= p95",
            ),
            (
                "{input: {median: 800, p95: 3000}, output: {median: 0, p95: 700}}",
                "lanes.chat.tokens.output: need 0 < median <= p95",
            ),
            (
                "{input: {median: 800, p95: 3000}, output: {median: -1, p95: 700}}",
                "lanes.chat.tokens.output",
            ),
            (
                "{input: {median: 800, p95: .inf}, output: {median: 1, p95: 7}}",
                "lanes.chat.tokens.input",
            ),
            ("{input: {median: 800}, output: {median: 1, p95: 7}}", "p95"),
            ("{input: {median: 8, p95: 9}}", "output"),
            (
                "{input: {median: 8, p95: 9}, output: {median: 1, p95: 7}, mean: 3}",
                "unknown field `mean`",
            ),
            (
                "{input: {median: 8, p95: 9, p99: 20}, output: {median: 1, p95: 7}}",
                "unknown field `p99`",
            ),
            (
                "{input: {median: many, p95: 9}, output: {median: 1, p95: 7}}",
                "invalid type",
            ),
        ] {
            let err = parsed(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn drawn_medians_and_p95s_are_the_distributions(
            median in 20.0f64..20_000.0,
            spread in 1.0f64..8.0,
            seed in any::<u64>(),
        ) {
            let p95 = median * spread;
            let s = dist(median, p95, median, p95).sampler();
            let n = 20_000u64;
            let (mut ins, mut outs): (Vec<u64>, Vec<u64>) =
                (0..n).map(|id| { let d = s.draw(seed, id); (d.input, d.output) }).unzip();
            for xs in [&mut ins, &mut outs] {
                // 20,000 draws: the sample's quantiles are within a few
                // percent of the distribution's (and whole tokens).
                let m = quantile(xs, 0.5);
                let q = quantile(xs, 0.95);
                prop_assert!((m - median).abs() <= 0.05 * median + 1.0, "median {} vs {}", m, median);
                prop_assert!((q - p95).abs() <= 0.08 * p95 + 1.0, "p95 {} vs {}", q, p95);
                prop_assert!(xs.iter().all(|&x| x >= 1));
            }
        }
    }
}
