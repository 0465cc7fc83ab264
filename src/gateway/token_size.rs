//! The request side of tokens as the cost: what the gateway reads of a
//! request's size before admission ([`RequestSize`]: its body's bytes and
//! the output tokens it may get), and, for a lane with `cost`, how it makes
//! sure the answer reports its usage: a streamed request is forwarded with
//! `stream_options.include_usage: true`, and the usage chunk is taken out
//! of the answer again when the client did not ask for it (see
//! `usage_tap`). [`prepare`] applies the lane's token limits
//! (`request_shape`) in the same pass, so a body is parsed at most once.
//! An observe config changes nothing of the request.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::response::Response;
use lanes::request_shape::{self as shape, ShapeRefusal};
use lanes::{Core, RequestSize, TokenLimits};
use rustc_hash::FxBuildHasher;
use serde_json::{Map, Value};

use super::request_shape;
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
    /// The config's lanes, in its order; None before a config is loaded. A
    /// request's head is refused on them before its body is read.
    lanes: Option<Vec<KnownLane>>,
    /// Lane names are the config's own (a client's header only looks one
    /// up), so a cheap hasher will do.
    by_lane: HashMap<String, LaneRules, FxBuildHasher>,
}

impl RulesInForce {
    /// The rules of `core`'s config (none when it only observes).
    pub(super) fn of(core: &Core, tokenizers: &Tokenizers) -> RulesInForce {
        let lanes = Some(KnownLane::of(core));
        if !core.enforcing() {
            return RulesInForce {
                lanes,
                by_lane: HashMap::default(),
            };
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
        RulesInForce { lanes, by_lane }
    }

    /// The config's lanes; None before a config is loaded.
    pub(super) fn lanes(&self) -> Option<&[KnownLane]> {
        self.lanes.as_deref()
    }

    /// The rules of `lane` (none for an unknown lane or no lane).
    pub(super) fn of_lane(&self, lane: Option<&str>) -> LaneRules {
        lane.and_then(|lane| self.by_lane.get(lane).cloned())
            .unwrap_or_default()
    }
}

/// A lane of the config in force, as a request's head is checked against it.
#[derive(Debug)]
pub(super) struct KnownLane {
    pub(super) name: String,
    /// Whether it is of the config's highest priority (its bodies may use
    /// the memory kept for those lanes).
    pub(super) top: bool,
}

impl KnownLane {
    fn of(core: &Core) -> Vec<KnownLane> {
        let n = core.lane_names().count();
        let top = (0..n).map(|i| core.lane(i).priority).min();
        core.lane_names()
            .enumerate()
            .map(|(i, name)| KnownLane {
                name: name.to_owned(),
                top: Some(core.lane(i).priority) == top,
            })
            .collect()
    }
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

/// A request's body checked against its lane's token limits (see
/// `request_shape`: 413 over `maxInputTokens`, 400 for an output field
/// that is not a count, its output clamped) and sized for admission, with
/// its input tokens `counted` by its route's tokenizer when they were. The
/// body is parsed at most once (when an output limit applies or the lane is
/// priced) and written again at most once (when the limit or the usage
/// chunk changed it); otherwise it goes on as sent.
#[expect(
    clippy::result_large_err,
    reason = "the error is the answer for the client, made once per refused request"
)]
pub(super) fn prepare(
    rules: &LaneRules,
    lane: Option<&str>,
    path: &str,
    body: Bytes,
    counted: Option<u64>,
) -> Result<Sized, Response> {
    let refused = |r: &ShapeRefusal| request_shape::refusal(lane.unwrap_or_default(), r);
    let mut output_limit = None;
    if let Some(limits) = &rules.limits {
        shape::check_input(body.len(), limits, counted).map_err(|r| refused(&r))?;
        output_limit = limits
            .output_limit()
            .filter(|_| request_shape::takes_output_limit(path));
    }
    let plain = |body: Bytes| Sized {
        size: RequestSize {
            body_bytes: body.len(),
            max_tokens: None,
            input_tokens: counted,
        },
        body,
        metering: None,
    };
    if output_limit.is_none() && !rules.priced {
        return Ok(plain(body));
    }
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(&body) else {
        return match output_limit {
            Some(_) => Err(refused(&ShapeRefusal::NotJsonObject)),
            // Priced: a completion must be read to be metered (a lax
            // server reads bodies serde does not, `NaN` in them: one such
            // would stream unmetered, at the price of its reservation).
            None if request_shape::takes_output_limit(path) => {
                Err(request_shape::priced_not_json(lane.unwrap_or_default()))
            }
            // Another path (an operator's own, a multipart upload, or an
            // embedding): forwarded as sent, not metered.
            None => Ok(plain(body)),
        };
    };
    let mut changed = false;
    if let Some(limit) = output_limit {
        changed = shape::limit_output(&mut obj, limit)
            .map_err(|r| refused(&r))?
            .1;
    }
    if rules.priced {
        plain_flags(&obj).map_err(|(field, value)| {
            request_shape::not_a_flag(lane.unwrap_or_default(), field, &value)
        })?;
    }
    let metering = rules.priced.then(|| meter(&mut obj, &mut changed));
    let body = if changed {
        Bytes::from(serde_json::to_vec(&Value::Object(obj)).expect("JSON serializes"))
    } else {
        body
    };
    match metering {
        None => Ok(plain(body)),
        Some((max_tokens, metering)) => Ok(Sized {
            size: RequestSize {
                body_bytes: body.len(),
                max_tokens,
                input_tokens: counted,
            },
            body,
            metering: Some(metering),
        }),
    }
}

/// A priced request's output limit (the output field the server reads, see
/// [`shape::output_ceiling`], after the lane's limit lowered both) and how
/// its answer is read: a stream is asked for its usage chunk (`changed`),
/// to be taken out again when the client did not ask for it.
fn meter(obj: &mut Map<String, Value>, changed: &mut bool) -> (Option<u64>, Metering) {
    let max_tokens = shape::output_ceiling(obj);
    let strip = obj.get("stream").and_then(Value::as_bool) == Some(true) && !asks_usage(obj);
    if strip {
        ask_usage(obj);
        *changed = true;
    }
    (
        max_tokens,
        Metering {
            strip_usage_chunk: strip,
        },
    )
}

/// A priced request's `stream` and `stream_options.include_usage` are
/// booleans (or null): a lax server (vLLM's request models) reads `"true"`
/// or `1` as true, so a stream the gateway took for no stream would go
/// unmetered (no usage chunk asked for: the request would keep its
/// reservation, its output at the lane's P95, however long the answer),
/// and a usage chunk the client asked for would be taken out. The field
/// and its value when one is neither.
fn plain_flags(obj: &Map<String, Value>) -> Result<(), (&'static str, String)> {
    let include_usage = obj
        .get("stream_options")
        .and_then(|o| o.get("include_usage"));
    for (field, v) in [
        ("stream", obj.get("stream")),
        ("stream_options.include_usage", include_usage),
    ] {
        if let Some(v) = v.filter(|v| !(v.is_boolean() || v.is_null())) {
            return Err((field, v.to_string()));
        }
    }
    Ok(())
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

    const CHAT: &str = "/v1/chat/completions";

    fn rules(priced: bool, limits: Option<TokenLimits>) -> LaneRules {
        LaneRules {
            limits,
            priced,
            tokenizer: None,
        }
    }

    fn sized_as(priced: bool, body: Bytes, counted: Option<u64>) -> Sized {
        prepare(&rules(priced, None), Some("p1"), CHAT, body, counted).expect("no limits")
    }

    fn sized(priced: bool, body: Value) -> (Value, RequestSize, Option<Metering>) {
        let s = sized_as(priced, Bytes::from(body.to_string()), None);
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
        // Priced, not streamed: its output limit read as the server reads
        // it (max_completion_tokens when set), read back as JSON.
        let body = json!({"max_tokens": 50, "max_completion_tokens": 90});
        let (sent, size, metering) = sized(true, body.clone());
        assert_eq!(sent, body);
        assert_eq!(size.max_tokens, Some(90));
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
        // A counted figure goes to the core.
        let body = Bytes::from_static(b"{}");
        let s = sized_as(true, body, Some(7));
        assert_eq!(s.size.input_tokens, Some(7));
    }

    /// A completion body serde cannot read (`NaN`, which Python's JSON
    /// parser, and so vLLM, reads) went on unmetered: a stream of it was
    /// never asked for its usage chunk, and the request kept only its
    /// reservation however long its answer. A priced lane refuses it; on
    /// other paths it goes on as sent, unmetered.
    #[test]
    fn a_priced_completion_that_is_no_json_object_is_refused() {
        let nan =
            Bytes::from_static(br#"{"stream": true, "max_tokens": 100000, "temperature": NaN}"#);
        for (path, body) in [
            (CHAT, nan.clone()),
            ("/v1/completions", nan.clone()),
            (CHAT, Bytes::from_static(b"[1, 2]")),
        ] {
            let r = prepare(&rules(true, None), Some("p1"), path, body, None);
            assert_eq!(refusal(r), (400, "invalid_body".to_owned()), "{path}");
        }
        let s = prepare(
            &rules(true, None),
            Some("p1"),
            "/v1/embeddings",
            nan.clone(),
            Some(7),
        );
        let s = s.unwrap();
        assert_eq!((&s.body, s.metering), (&nan, None));
        assert_eq!(s.size.input_tokens, Some(7));
        // Unpriced and unlimited, nothing reads it.
        assert!(prepare(&rules(false, None), Some("p1"), CHAT, nan, None).is_ok());
    }

    /// A body that asks for 1 token in `max_tokens` and 4,096 in
    /// `max_completion_tokens` gets up to 4,096 from the server: it
    /// reserves 4,096, and a lane limit lowers what the server reads.
    #[test]
    fn a_low_max_tokens_beside_a_high_max_completion_tokens_reserves_the_high_one() {
        let hostile = json!({"max_tokens": 1, "max_completion_tokens": 4096});
        let (sent, size, _) = sized(true, hostile.clone());
        assert_eq!((sent, size.max_tokens), (hostile.clone(), Some(4096)));
        let limits = TokenLimits {
            max_input_tokens: None,
            max_output_tokens: Some(500),
            cap_output_tokens: None,
        };
        let body = Bytes::from(hostile.to_string());
        let s = prepare(&rules(true, Some(limits)), Some("p1"), CHAT, body, None).unwrap();
        let sent: Value = serde_json::from_slice(&s.body).unwrap();
        assert_eq!(sent["max_completion_tokens"], 500);
        assert_eq!(sent["max_tokens"], 1);
        assert_eq!(s.size.max_tokens, Some(500));
    }

    /// `"stream": "true"` is a stream to a lax server (vLLM reads it as
    /// true): taken for no stream, it went up without asking for the usage
    /// chunk and its answer was never settled, so a client could have long
    /// answers at the price of its reservation. A priced lane refuses such
    /// a flag; false and null go on as sent.
    #[test]
    fn a_priced_request_must_say_plainly_whether_it_streams() {
        for bad in [
            json!({"stream": "true"}),
            json!({"stream": 1}),
            json!({"stream": true, "stream_options": {"include_usage": "true"}}),
            json!({"stream": true, "stream_options": {"include_usage": 1}}),
        ] {
            let body = Bytes::from(bad.to_string());
            let r = prepare(&rules(true, None), Some("p1"), CHAT, body, None);
            assert_eq!(refusal(r), (400, "invalid_stream".to_owned()), "{bad}");
        }
        for fine in [
            json!({"stream": false}),
            json!({"stream": null}),
            json!({"stream": true, "stream_options": {"include_usage": null}}),
        ] {
            let body = Bytes::from(fine.to_string());
            assert!(prepare(&rules(true, None), Some("p1"), CHAT, body, None).is_ok());
        }
        // An unpriced lane reads nothing of it.
        let body = Bytes::from(json!({"stream": "true"}).to_string());
        assert!(prepare(&rules(false, None), Some("p1"), CHAT, body, None).is_ok());
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

    /// The status and error code of a refusal.
    fn refusal(r: Result<Sized, Response>) -> (u16, String) {
        let r = r.err().expect("refused");
        let status = r.status().as_u16();
        let code = r
            .extensions()
            .get::<super::super::decision::Reason>()
            .map_or("", |c| c.0)
            .to_owned();
        (status, code)
    }

    #[test]
    fn limits_and_a_price_read_the_body_once_and_write_it_once() {
        let limits = TokenLimits {
            max_input_tokens: Some(100),
            max_output_tokens: Some(50),
            cap_output_tokens: None,
        };
        let both = rules(true, Some(limits));
        let body = json!({"stream": true, "max_tokens": 90, "messages": []});
        let s = prepare(&both, Some("p1"), CHAT, Bytes::from(body.to_string()), None).unwrap();
        let sent: Value = serde_json::from_slice(&s.body).unwrap();
        // Clamped by the limit, sized at the clamp, asked for its usage.
        assert_eq!(sent["max_tokens"], 50);
        assert_eq!(sent["stream_options"]["include_usage"], true);
        assert_eq!(s.size.max_tokens, Some(50));
        assert_eq!(s.size.body_bytes, s.body.len());
        assert_eq!(s.metering.map(|m| m.strip_usage_chunk), Some(true));
        // Nothing to change: the body goes on as sent, byte for byte.
        let as_sent = Bytes::from_static(br#"{"max_tokens": 7,  "messages":[]}"#);
        let s = prepare(&both, Some("p1"), CHAT, as_sent.clone(), None).unwrap();
        assert_eq!((s.body, s.size.max_tokens), (as_sent, Some(7)));
        // Over maxInputTokens: refused before the body is read as JSON.
        let long = Bytes::from(vec![b'x'; 401]);
        assert_eq!(
            refusal(prepare(&both, Some("p1"), CHAT, long, None)),
            (413, "context_too_long".to_owned())
        );
        // An output limit on a body that is no JSON object: 400; a bad
        // count: 400.
        let junk = Bytes::from_static(b"[1, 2]");
        assert_eq!(
            refusal(prepare(&both, Some("p1"), CHAT, junk.clone(), None)),
            (400, "invalid_body".to_owned())
        );
        let bad = Bytes::from_static(br#"{"max_tokens": -1}"#);
        assert_eq!(
            refusal(prepare(&both, Some("p1"), CHAT, bad, None)),
            (400, "invalid_max_tokens".to_owned())
        );
        // A path without an output limit (embeddings) only has its input
        // checked; priced, it is still metered.
        let s = prepare(&both, Some("p1"), "/v1/embeddings", junk.clone(), None).unwrap();
        assert_eq!((s.body, s.metering), (junk, None));
        let emb = Bytes::from_static(br#"{"input": "x"}"#);
        let s = prepare(&both, Some("p1"), "/v1/embeddings", emb.clone(), None).unwrap();
        assert_eq!(s.body, emb);
        assert!(s.metering.is_some());
    }
}
