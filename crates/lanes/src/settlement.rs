//! What an answer reports it used: the `usage` a request's reservation is
//! settled with ([`crate::Core::settle`]). An answer without one keeps its
//! reservation: no refund on missing data.

use serde::Deserialize;
use serde::de::IgnoredAny;

/// Tokens an answer reported (`usage.prompt_tokens`,
/// `usage.completion_tokens`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Input tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
}

/// The most tokens of either kind an answer may report and be settled
/// with: a hundred million, ten times the longest context a model serves
/// and more than 128 choices of 128k tokens. A larger count is garbage (an
/// upstream's counter, an overflow), not a request's cost: settled, it
/// would leave the lane in debt for years.
pub const MAX_REPORTED_TOKENS: u64 = 100_000_000;

impl Usage {
    /// Whether it can be a request's cost: neither count is above
    /// [`MAX_REPORTED_TOKENS`]. An answer whose usage is not keeps its
    /// reservation, as one without usage does.
    pub fn plausible(&self) -> bool {
        self.prompt_tokens <= MAX_REPORTED_TOKENS && self.completion_tokens <= MAX_REPORTED_TOKENS
    }

    /// The `usage` object of an OpenAI-style answer (a JSON body or a
    /// stream's usage chunk); `None` without one or with counts that are not
    /// whole numbers.
    pub fn from_answer(body: &[u8]) -> Option<Usage> {
        Usage::with_choices(body).map(|(u, _)| u)
    }

    /// As [`Usage::from_answer`], and whether the answer carries nothing but
    /// its usage (no `choices`, or none in it: the chunk a stream's
    /// `stream_options.include_usage` adds).
    pub fn with_choices(body: &[u8]) -> Option<(Usage, bool)> {
        // An object only: serde would also read a struct from an array, by
        // position.
        if body.trim_ascii_start().first() != Some(&b'{') {
            return None;
        }
        let a: AnswerUsage = serde_json::from_slice(body).ok()?;
        let u = a.usage?;
        let usage_only = matches!(a.choices, Choices::Absent | Choices::Empty);
        Some((
            Usage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
            },
            usage_only,
        ))
    }
}

/// What settlement reads of an answer; the rest (its content) is skipped
/// as it is parsed, never built.
#[derive(Deserialize)]
struct AnswerUsage {
    #[serde(default)]
    usage: Option<UsageCounts>,
    #[serde(default)]
    choices: Choices,
}

#[derive(Deserialize)]
struct UsageCounts {
    prompt_tokens: u64,
    completion_tokens: u64,
}

/// An answer's `choices`: absent, an empty array, or anything else.
#[derive(Default)]
enum Choices {
    #[default]
    Absent,
    Empty,
    Some,
}

impl<'de> Deserialize<'de> for Choices {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Choices, D::Error> {
        d.deserialize_any(ChoicesVisitor)
    }
}

struct ChoicesVisitor;

impl<'de> serde::de::Visitor<'de> for ChoicesVisitor {
    type Value = Choices;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Choices, A::Error> {
        let mut any = false;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            any = true;
        }
        Ok(if any { Choices::Some } else { Choices::Empty })
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Choices, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Choices::Some)
    }

    fn visit_unit<E>(self) -> Result<Choices, E> {
        Ok(Choices::Some)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Choices, E> {
        Ok(Choices::Some)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Choices, E> {
        Ok(Choices::Some)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Choices, E> {
        Ok(Choices::Some)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Choices, E> {
        Ok(Choices::Some)
    }

    fn visit_str<E>(self, _: &str) -> Result<Choices, E> {
        Ok(Choices::Some)
    }
}

#[cfg(test)]
#[path = "settlement_tests.rs"]
mod tests;
