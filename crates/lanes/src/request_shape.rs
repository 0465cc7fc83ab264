//! A request's shape against its lane's [`TokenLimits`], before admission:
//! its input tokens, counted by the gateway with its route's tokenizer or
//! else estimated from the body's size (more than `maxInputTokens` is
//! refused), and its requested output (`max_tokens`,
//! `max_completion_tokens`) lowered to the limit in force, or set to it
//! when the request asks for none.
//!
//! Pure, in two sides: [`check_input`] reads only the body's size (or the
//! tokenizer's count), [`limit_output`] works on the body already parsed as
//! a JSON object, so a caller that parses it for other reasons too (the
//! gateway sizes a priced request on the same parse) parses it once. A
//! rewritten body is the same JSON object with the clamped fields changed
//! and nothing else. The tests drive both sides together (`shape`).

use serde_json::{Map, Value};

use crate::tokens::TokenLimits;

/// Bytes of a request body counted as one input token before anything is
/// measured (English text averages about four bytes per token).
pub const DEFAULT_BYTES_PER_TOKEN: u64 = 4;

/// A request field that asks for output tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputField {
    /// `max_tokens` (completions, and chat completions of older clients).
    MaxTokens,
    /// `max_completion_tokens` (chat completions).
    MaxCompletionTokens,
}

impl OutputField {
    /// The field's name in the request.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputField::MaxTokens => "max_tokens",
            OutputField::MaxCompletionTokens => "max_completion_tokens",
        }
    }
}

const OUTPUT_FIELDS: [OutputField; 2] = [OutputField::MaxTokens, OutputField::MaxCompletionTokens];

/// The most output tokens the server will generate for the request `obj`,
/// as the server reads it: `max_completion_tokens` when it is set (OpenAI
/// deprecated `max_tokens` for it; vLLM reads it first and falls back to
/// `max_tokens` when it is absent, null or 0), else `max_tokens`. `None`
/// when neither is a count. Not the lower of the two: a request that asks
/// for 1 in `max_tokens` and 4,096 in `max_completion_tokens` gets 4,096.
pub fn output_ceiling(obj: &Map<String, Value>) -> Option<u64> {
    let count = |field: OutputField| obj.get(field.as_str()).and_then(Value::as_u64);
    count(OutputField::MaxCompletionTokens)
        .filter(|n| *n > 0)
        .or_else(|| count(OutputField::MaxTokens))
}

/// Why a request's shape is refused.
#[derive(Clone, Debug, PartialEq)]
pub enum ShapeRefusal {
    /// More input tokens than `maxInputTokens` (413 `context_too_long`).
    ContextTooLong {
        /// Its input tokens, and how they were found.
        input: InputTokens,
        /// The lane's limit.
        limit: u64,
    },
    /// An output limit applies but the body is not a JSON object (400).
    NotJsonObject,
    /// `max_tokens` or `max_completion_tokens` is not an integer >= 1
    /// (400).
    BadOutputField {
        /// The field.
        field: OutputField,
        /// Its value as sent (cut by the caller when echoed).
        value: String,
    },
}

/// A request's input tokens, and how the gateway found them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputTokens {
    /// Estimated from the body's bytes at [`DEFAULT_BYTES_PER_TOKEN`].
    Estimated(u64),
    /// Counted with the tokenizer of the lane's route.
    Counted(u64),
}

impl InputTokens {
    /// The figure itself.
    pub fn get(self) -> u64 {
        match self {
            InputTokens::Estimated(n) | InputTokens::Counted(n) => n,
        }
    }

    /// The figure for a body of `bytes`: `counted` when the gateway counted
    /// it, else estimated.
    pub fn of(bytes: usize, counted: Option<u64>) -> InputTokens {
        counted.map_or_else(
            || InputTokens::Estimated(estimate_input_tokens(bytes, DEFAULT_BYTES_PER_TOKEN)),
            InputTokens::Counted,
        )
    }
}

/// A request whose shape is within its lane's limits.
#[cfg(test)]
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Shaped {
    /// Its input tokens (counted, or estimated from the body).
    pub input_tokens: u64,
    /// The most output tokens it may get (the limit in force, or what it
    /// asked for when lower); `None` without an output limit.
    pub output_tokens: Option<u64>,
    /// The body to forward when it had to change (`None`: forward it as
    /// sent).
    pub rewritten: Option<Vec<u8>>,
}

/// The input tokens a body of `bytes` bytes is estimated to carry:
/// `ceil(bytes / bytes_per_token)`.
pub fn estimate_input_tokens(bytes: usize, bytes_per_token: u64) -> u64 {
    (bytes as u64).div_ceil(bytes_per_token.max(1))
}

/// Checks `body` against `limits`, with its input tokens `counted` by a
/// tokenizer or else estimated with [`DEFAULT_BYTES_PER_TOKEN`]; `output`
/// says whether the path takes an output limit (chat completions and
/// completions do, embeddings do not).
#[cfg(test)]
pub(crate) fn shape(
    body: &[u8],
    limits: &TokenLimits,
    output: bool,
    counted: Option<u64>,
) -> Result<Shaped, ShapeRefusal> {
    let input_tokens = check_input(body.len(), limits, counted)?;
    let Some(limit) = limits.output_limit().filter(|_| output) else {
        return Ok(Shaped {
            input_tokens,
            output_tokens: None,
            rewritten: None,
        });
    };
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(body) else {
        return Err(ShapeRefusal::NotJsonObject);
    };
    let (asked, changed) = limit_output(&mut obj, limit)?;
    Ok(Shaped {
        input_tokens,
        output_tokens: Some(asked),
        rewritten: changed
            .then(|| serde_json::to_vec(&Value::Object(obj)).expect("a JSON value serializes")),
    })
}

/// The input side, for a body of `body_bytes`: its input tokens, or the
/// refusal over `maxInputTokens`. Reads no byte of it.
pub fn check_input(
    body_bytes: usize,
    limits: &TokenLimits,
    counted: Option<u64>,
) -> Result<u64, ShapeRefusal> {
    let input = InputTokens::of(body_bytes, counted);
    match limits.max_input_tokens {
        Some(limit) if input.get() > limit => Err(ShapeRefusal::ContextTooLong { input, limit }),
        _ => Ok(input.get()),
    }
}

/// The output side, on a request already parsed as the JSON
/// object `obj`: each of its output fields lowered to `limit` (or
/// `max_tokens` set to it when it asks for none), so whichever the server
/// reads is within it. Returns the most output tokens it may get (its
/// [`output_ceiling`] once lowered) and whether `obj` changed.
pub fn limit_output(obj: &mut Map<String, Value>, limit: u64) -> Result<(u64, bool), ShapeRefusal> {
    let mut asked = false;
    let mut changed = false;
    for field in OUTPUT_FIELDS {
        let Some(v) = obj.get_mut(field.as_str()) else {
            continue;
        };
        if v.is_null() {
            continue;
        }
        let n = v
            .as_u64()
            .filter(|n| *n >= 1)
            .ok_or_else(|| ShapeRefusal::BadOutputField {
                field,
                value: v.to_string(),
            })?;
        if n > limit {
            *v = Value::from(limit);
            changed = true;
        }
        asked = true;
    }
    if !asked {
        obj.insert(
            OutputField::MaxTokens.as_str().to_owned(),
            Value::from(limit),
        );
        changed = true;
    }
    Ok((output_ceiling(obj).unwrap_or(limit), changed))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn limits(input: Option<u64>, output: Option<u64>) -> TokenLimits {
        TokenLimits {
            max_input_tokens: input,
            max_output_tokens: output,
            cap_output_tokens: None,
        }
    }

    fn forwarded(body: &[u8], s: &Shaped) -> Value {
        serde_json::from_slice(s.rewritten.as_deref().unwrap_or(body)).unwrap()
    }

    #[test]
    fn a_counted_figure_replaces_the_estimate_either_way() {
        let l = limits(Some(10), None);
        // 400 bytes would be estimated at 100 tokens: counted at 10, it
        // passes.
        let long = vec![b' '; 400];
        assert_eq!(shape(&long, &l, true, Some(10)).unwrap().input_tokens, 10);
        // 4 bytes would pass as 1 token: counted at 11, it is refused, and
        // the refusal says it was counted.
        assert_eq!(
            shape(b"    ", &l, true, Some(11)),
            Err(ShapeRefusal::ContextTooLong {
                input: InputTokens::Counted(11),
                limit: 10
            })
        );
        assert_eq!(InputTokens::of(41, None), InputTokens::Estimated(11));
        assert_eq!(InputTokens::of(41, Some(3)).get(), 3);
    }

    #[test]
    fn input_exactly_at_the_limit_passes_and_one_byte_more_is_refused() {
        let l = limits(Some(10), None);
        let at = vec![b' '; 40];
        assert_eq!(shape(&at, &l, true, None).unwrap().input_tokens, 10);
        let over = vec![b' '; 41];
        assert_eq!(
            shape(&over, &l, true, None),
            Err(ShapeRefusal::ContextTooLong {
                input: InputTokens::Estimated(11),
                limit: 10
            })
        );
        // An empty body is no tokens, and without limits nothing is parsed.
        assert_eq!(shape(b"", &l, true, None).unwrap().input_tokens, 0);
        assert_eq!(
            shape(b"not json", &limits(None, None), true, None)
                .unwrap()
                .rewritten,
            None
        );
    }

    #[test]
    fn max_tokens_is_clamped_at_the_limit_and_kept_below_it() {
        let l = limits(None, Some(100));
        for (asked, want, changed) in [(100, 100, false), (101, 100, true), (1, 1, false)] {
            let body = json!({"model": "m", "max_tokens": asked}).to_string();
            let s = shape(body.as_bytes(), &l, true, None).unwrap();
            assert_eq!(s.output_tokens, Some(want));
            assert_eq!(s.rewritten.is_some(), changed, "{asked}");
            assert_eq!(forwarded(body.as_bytes(), &s)["max_tokens"], want);
        }
        let both = json!({"max_tokens": 500, "max_completion_tokens": 50}).to_string();
        let s = shape(both.as_bytes(), &l, true, None).unwrap();
        let v = forwarded(both.as_bytes(), &s);
        assert_eq!(
            (v["max_tokens"].clone(), v["max_completion_tokens"].clone()),
            (json!(100), json!(50))
        );
        // The server reads max_completion_tokens: 50.
        assert_eq!(s.output_tokens, Some(50));
        // It reads max_completion_tokens over a lower max_tokens too.
        let hostile = json!({"max_tokens": 1, "max_completion_tokens": 4096}).to_string();
        let s = shape(hostile.as_bytes(), &l, true, None).unwrap();
        let v = forwarded(hostile.as_bytes(), &s);
        assert_eq!(
            (v["max_tokens"].clone(), v["max_completion_tokens"].clone()),
            (json!(1), json!(100))
        );
        assert_eq!(s.output_tokens, Some(100));
    }

    #[test]
    fn the_output_ceiling_is_the_field_the_server_reads() {
        for (body, want) in [
            (
                json!({"max_tokens": 1, "max_completion_tokens": 4096}),
                Some(4096),
            ),
            (
                json!({"max_tokens": 90, "max_completion_tokens": 50}),
                Some(50),
            ),
            (json!({"max_tokens": 90}), Some(90)),
            (json!({"max_completion_tokens": 7}), Some(7)),
            (
                json!({"max_tokens": 90, "max_completion_tokens": null}),
                Some(90),
            ),
            (
                json!({"max_tokens": 90, "max_completion_tokens": 0}),
                Some(90),
            ),
            (json!({"max_tokens": "9"}), None),
            (json!({}), None),
        ] {
            let Value::Object(obj) = body.clone() else {
                unreachable!()
            };
            assert_eq!(output_ceiling(&obj), want, "{body}");
        }
    }

    #[test]
    fn a_request_without_max_tokens_is_given_the_limit() {
        let l = limits(None, Some(64));
        for body in [
            json!({"model": "m"}),
            json!({"model": "m", "max_tokens": null}),
        ] {
            let text = body.to_string();
            let s = shape(text.as_bytes(), &l, true, None).unwrap();
            assert_eq!(forwarded(text.as_bytes(), &s)["max_tokens"], 64);
            assert_eq!(s.output_tokens, Some(64));
        }
        // The level's cap is lower than the contract's: it applies.
        let capped = TokenLimits {
            cap_output_tokens: Some(16),
            ..l
        };
        let s = shape(br#"{"max_tokens": 32}"#, &capped, true, None).unwrap();
        assert_eq!(forwarded(b"", &s)["max_tokens"], 16);
        // A path without an output limit (embeddings) is left alone.
        assert_eq!(
            shape(br#"{"input": "x"}"#, &l, false, None)
                .unwrap()
                .rewritten,
            None
        );
    }

    #[test]
    fn zero_negative_fractional_and_garbage_max_tokens_are_refused() {
        let l = limits(None, Some(64));
        for (bad, field) in [
            (json!({"max_tokens": 0}), OutputField::MaxTokens),
            (json!({"max_tokens": -1}), OutputField::MaxTokens),
            (json!({"max_tokens": 1.5}), OutputField::MaxTokens),
            (json!({"max_tokens": 10.0}), OutputField::MaxTokens),
            (json!({"max_tokens": "10"}), OutputField::MaxTokens),
            (
                json!({"max_completion_tokens": [1]}),
                OutputField::MaxCompletionTokens,
            ),
            (json!({"max_tokens": 1e30}), OutputField::MaxTokens),
        ] {
            let text = bad.to_string();
            match shape(text.as_bytes(), &l, true, None) {
                Err(ShapeRefusal::BadOutputField { field: f, .. }) => {
                    assert_eq!(f, field, "{text}")
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        for not_object in [&b"[1]"[..], b"garbage", b"\"text\"", b"{\"a\":"] {
            assert_eq!(
                shape(not_object, &l, true, None),
                Err(ShapeRefusal::NotJsonObject)
            );
        }
        // A body over the input limit is refused as too long before it is
        // parsed.
        let l = limits(Some(1), Some(64));
        assert!(matches!(
            shape(b"garbage", &l, true, None),
            Err(ShapeRefusal::ContextTooLong { .. })
        ));
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[a-z \\\\\"é]{0,12}".prop_map(Value::from),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn the_forwarded_body_is_the_same_object_with_only_the_output_fields_changed(
            fields in prop::collection::btree_map("[a-z_]{1,12}", value(), 0..8),
            max_tokens in prop::option::of(1u64..100_000),
            max_completion in prop::option::of(1u64..100_000),
            limit in 1u64..10_000,
        ) {
            let mut obj: serde_json::Map<String, Value> = fields.into_iter().collect();
            obj.remove("max_tokens");
            obj.remove("max_completion_tokens");
            if let Some(n) = max_tokens {
                obj.insert("max_tokens".into(), n.into());
            }
            if let Some(n) = max_completion {
                obj.insert("max_completion_tokens".into(), n.into());
            }
            let body = serde_json::to_vec(&Value::Object(obj.clone())).unwrap();
            let s = shape(&body, &limits(None, Some(limit)), true, None).unwrap();
            let out = forwarded(&body, &s);
            let out = out.as_object().expect("still an object");
            for (k, v) in &obj {
                if k == "max_tokens" || k == "max_completion_tokens" {
                    let n = out[k].as_u64().unwrap();
                    prop_assert_eq!(n, v.as_u64().unwrap().min(limit));
                } else {
                    prop_assert_eq!(&out[k], v);
                }
            }
            let added: Vec<&String> = out.keys().filter(|k| !obj.contains_key(*k)).collect();
            if max_tokens.is_none() && max_completion.is_none() {
                prop_assert_eq!(added, vec!["max_tokens"]);
                prop_assert_eq!(out["max_tokens"].as_u64(), Some(limit));
            } else {
                prop_assert!(added.is_empty());
            }
            prop_assert!(s.output_tokens.unwrap() <= limit);
            let read = max_completion.or(max_tokens).map_or(limit, |n| n.min(limit));
            prop_assert_eq!(s.output_tokens, Some(read));
        }
    }
}
