//! What an answer reports it used: the `usage` a request's reservation is
//! settled with ([`crate::Core::settle`]). An answer without one keeps its
//! reservation: no refund on missing data.

/// Tokens an answer reported (`usage.prompt_tokens`,
/// `usage.completion_tokens`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Input tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
}

impl Usage {
    /// The `usage` object of an OpenAI-style answer (a JSON body or a
    /// stream's usage chunk); `None` without one or with counts that are not
    /// whole numbers.
    pub fn from_answer(body: &[u8]) -> Option<Usage> {
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        let u = v.get("usage")?;
        Some(Usage {
            prompt_tokens: u.get("prompt_tokens")?.as_u64()?,
            completion_tokens: u.get("completion_tokens")?.as_u64()?,
        })
    }
}

#[cfg(test)]
#[path = "settlement_tests.rs"]
mod tests;
