//! Optional context: the conversation turns a lane's requests may carry.

use serde_json::Value;

use crate::config::OptionalContext;
use crate::pressure::Pressure;

/// The turns to send under `pressure`: the degraded value while the gateway
/// conserves (unless the config already degrades), the configured one
/// otherwise.
pub(crate) fn history_turns(oc: Option<&OptionalContext>, pressure: Pressure) -> Option<i32> {
    let oc = oc?;
    if pressure >= Pressure::Conserve && !oc.degraded {
        Some(oc.degraded_history_turns.unwrap_or(oc.history_turns))
    } else {
        Some(oc.history_turns)
    }
}

/// Trims a `/v1/chat/completions` body to the system messages and the last
/// `turns` conversation turns (a turn: a user message and every message up
/// to the next user message). Returns whether anything was removed. A body
/// without a `messages` array is left as it is.
pub fn trim_chat_history(body: &mut Value, turns: i32) -> bool {
    let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) else {
        return false;
    };
    let turns = turns.max(0) as usize;
    let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_owned);
    let user_starts: Vec<usize> = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| role(m).as_deref() == Some("user"))
        .map(|(i, _)| i)
        .collect();
    if user_starts.len() <= turns {
        return false;
    }
    // Index of the first message of the kept turns; with no turn, at least
    // the last user message: the request itself.
    let keep_from = user_starts[user_starts.len() - turns.max(1)];
    let before = messages.len();
    let mut i = 0;
    messages.retain(|m| {
        let keep = i >= keep_from || matches!(role(m).as_deref(), Some("system" | "developer"));
        i += 1;
        keep
    });
    messages.len() != before
}
