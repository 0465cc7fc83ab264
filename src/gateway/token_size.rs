//! The request side of tokens as the cost: what the gateway reads of a
//! request's size before admission ([`RequestSize`]: its body's bytes and
//! the output tokens it may get), and, for a lane with `cost`, how it makes
//! sure the answer reports its usage: a streamed request is forwarded with
//! `stream_options.include_usage: true`, and the usage chunk is taken out
//! of the answer again when the client did not ask for it (see
//! `usage_tap`). An observe config changes nothing of the request.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use lanes::{Core, RequestSize, TokenLimits};
use rustc_hash::FxBuildHasher;
use serde_json::{Map, Value};

use super::state::Gateway;
use super::tokenizer::{RouteTokenizer, Tokenizers};
use super::usage_tap::Metering;

/// What the request path needs of its lane before admission: its token
/// limits (`request_shape`) and whether it is priced. Nothing for an
/// observe config, which forwards every request as sent.
#[derive(Clone, Debug, Default)]
pub(super) struct LaneRules {
    /// The lane's `tokens`, when it sets any.
    pub(super) limits: Option<TokenLimits>,
    /// The lane has a `cost`.
    pub(super) priced: bool,
    /// The tokenizer of the first of the lane's routes that has one, when
    /// a decision reads the request's input tokens.
    pub(super) tokenizer: Option<Arc<RouteTokenizer>>,
}

/// Each lane's [`LaneRules`] in the config in force, made when a config is
/// installed and read without the core's lock: the admit path takes that
/// lock once, for the decision.
#[derive(Debug, Default)]
pub(super) struct RulesInForce {
    /// Lane names are the config's own (a client's header only looks one
    /// up), so a cheap hasher will do.
    by_lane: HashMap<String, LaneRules, FxBuildHasher>,
}

impl RulesInForce {
    /// The rules of `core`'s config (none when it only observes).
    pub(super) fn of(core: &Core, tokenizers: &Tokenizers) -> RulesInForce {
        if !core.enforcing() {
            return RulesInForce::default();
        }
        let by_lane = core
            .lane_names()
            .enumerate()
            .map(|(i, name)| {
                let l = core.lane(i);
                let rules = LaneRules {
                    limits: l.tokens.filter(|t| !t.is_empty()),
                    priced: l.cost.is_some(),
                    tokenizer: core
                        .reads_input_tokens(i)
                        .then(|| tokenizers.for_routes(&l.routes))
                        .flatten(),
                };
                (name.to_owned(), rules)
            })
            .collect();
        RulesInForce { by_lane }
    }
}

/// The rules of `lane` in the enforced config in force.
pub(super) fn rules(gw: &Gateway, lane: Option<&str>) -> LaneRules {
    lane.and_then(|lane| gw.rules.load().by_lane.get(lane).cloned())
        .unwrap_or_default()
}

/// A request sized for admission.
pub(super) struct Sized {
    /// The body to forward.
    pub(super) body: Bytes,
    /// What the core is told.
    pub(super) size: RequestSize,
    /// How its answer is read (None: it is not settled).
    pub(super) metering: Option<Metering>,
}

/// Sizes a request (its body after the shape check) of a lane that is
/// `priced` or not, with its input tokens `counted` by its route's
/// tokenizer when they were.
pub(super) fn size(priced: bool, body: Bytes, counted: Option<u64>) -> Sized {
    let plain = |body: Bytes| Sized {
        size: RequestSize {
            body_bytes: body.len(),
            max_tokens: None,
            input_tokens: counted,
        },
        body,
        metering: None,
    };
    if !priced {
        return plain(body);
    }
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(&body) else {
        return plain(body);
    };
    let max_tokens = ["max_tokens", "max_completion_tokens"]
        .iter()
        .filter_map(|f| obj.get(*f).and_then(Value::as_u64))
        .min();
    let mut strip = false;
    let mut body = body;
    if obj.get("stream").and_then(Value::as_bool) == Some(true) && !asks_usage(&obj) {
        ask_usage(&mut obj);
        strip = true;
        body = Bytes::from(serde_json::to_vec(&Value::Object(obj)).expect("JSON serializes"));
    }
    Sized {
        size: RequestSize {
            body_bytes: body.len(),
            max_tokens,
            input_tokens: counted,
        },
        body,
        metering: Some(Metering {
            strip_usage_chunk: strip,
        }),
    }
}

/// Whether the client asked for the stream's usage chunk.
fn asks_usage(obj: &Map<String, Value>) -> bool {
    obj.get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        == Some(true)
}

/// Sets `stream_options.include_usage: true`, keeping the other options.
fn ask_usage(obj: &mut Map<String, Value>) {
    let options = obj
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Map::new()));
    if !options.is_object() {
        *options = Value::Object(Map::new());
    }
    if let Value::Object(o) = options {
        o.insert("include_usage".to_owned(), Value::Bool(true));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sized(priced: bool, body: Value) -> (Value, RequestSize, Option<Metering>) {
        let s = size(priced, Bytes::from(body.to_string()), None);
        assert_eq!(s.size.body_bytes, s.body.len(), "the forwarded body's size");
        (
            serde_json::from_slice(&s.body).unwrap_or(Value::Null),
            s.size,
            s.metering,
        )
    }

    #[test]
    fn a_priced_request_is_sized_and_metered_and_an_unpriced_one_left_alone() {
        // Unpriced: as sent, sized by its bytes only, not metered.
        let body = json!({"stream": true, "max_tokens": 9});
        let (sent, size, metering) = sized(false, body.clone());
        assert_eq!((sent, size.max_tokens, metering), (body, None, None));
        // Priced, not streamed: its output limit read, read back as JSON.
        let body = json!({"max_tokens": 90, "max_completion_tokens": 50});
        let (sent, size, metering) = sized(true, body.clone());
        assert_eq!(sent, body);
        assert_eq!(size.max_tokens, Some(50));
        assert_eq!(
            metering,
            Some(Metering {
                strip_usage_chunk: false
            })
        );
        // Priced and streamed without asking for usage: asked for, and
        // taken out again.
        let (sent, _, metering) = sized(true, json!({"stream": true}));
        assert_eq!(sent["stream_options"]["include_usage"], true);
        assert_eq!(metering.map(|m| m.strip_usage_chunk), Some(true));
        // ... asking for it: left as sent, and kept.
        let body = json!({"stream": true, "stream_options": {"include_usage": true}});
        let (sent, _, metering) = sized(true, body.clone());
        assert_eq!(sent, body);
        assert_eq!(metering.map(|m| m.strip_usage_chunk), Some(false));
        // A body that is no JSON object goes on as sent, unmetered.
        let s = super::size(true, Bytes::from_static(b"not json"), Some(7));
        assert_eq!((&s.body[..], s.metering), (&b"not json"[..], None));
        // A counted figure goes to the core either way.
        assert_eq!(s.size.input_tokens, Some(7));
    }

    #[test]
    fn the_usage_chunk_is_asked_for_keeping_the_other_options() {
        for (before, after) in [
            (json!({"stream": true}), json!({"include_usage": true})),
            (
                json!({"stream": true, "stream_options": {"x": 1}}),
                json!({"x": 1, "include_usage": true}),
            ),
            (
                json!({"stream": true, "stream_options": "junk"}),
                json!({"include_usage": true}),
            ),
        ] {
            let Value::Object(mut obj) = before else {
                unreachable!()
            };
            assert!(!asks_usage(&obj));
            ask_usage(&mut obj);
            assert_eq!(obj["stream_options"], after);
            assert!(asks_usage(&obj));
        }
        let Value::Object(obj) = json!({"stream_options": {"include_usage": true}}) else {
            unreachable!()
        };
        assert!(asks_usage(&obj));
    }
}
