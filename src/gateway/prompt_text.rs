//! The text of a request's prompt, as a tokenizer counts it: what the
//! model reads of the body of a chat completion (its messages' text, the
//! names and arguments of tool calls, the tools offered), a completion
//! (`prompt`) or an embedding (`input`). A prompt already given as token
//! ids is counted as it stands. Anything that is not text the tokenizer can
//! read (an image, an audio part, an unknown field shape) makes the prompt
//! [`Uncountable`]: the gateway then estimates from the body's bytes, which
//! for a base64 image is the larger figure, so a part it cannot count never
//! makes a request look cheaper.

use serde_json::Value;

/// What a tokenizer is given of one request.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Prompt<'a> {
    /// Texts the model reads as one sequence (the special tokens of the
    /// sequence are counted once).
    pub(super) texts: Vec<&'a str>,
    /// Texts that are sequences of their own (each prompt of a batched
    /// completion or embedding request gets its special tokens).
    pub(super) sequences: Vec<&'a str>,
    /// Tokens given as ids.
    pub(super) ids: u64,
    /// Serialised JSON the model reads as text (tools offered).
    pub(super) json: Vec<String>,
}

/// Why a prompt cannot be counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uncountable {
    /// The body is not a JSON object.
    NotJson,
    /// A path whose body carries no prompt the gateway knows.
    OtherPath,
    /// A part that is not text (an image, audio, a file) or a field of a
    /// shape the API does not define.
    NotText,
    /// The tokenizer could not encode the text.
    TokenizerFailed,
}

impl Uncountable {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Uncountable::NotJson => "not_json",
            Uncountable::OtherPath => "other_path",
            Uncountable::NotText => "not_text",
            Uncountable::TokenizerFailed => "tokenizer_failed",
        }
    }
}

/// The prompt of a request to `path` with `body`.
pub(super) fn prompt<'a>(path: &str, body: &'a Value) -> Result<Prompt<'a>, Uncountable> {
    let Value::Object(obj) = body else {
        return Err(Uncountable::NotJson);
    };
    let mut p = Prompt::default();
    match path {
        "/v1/chat/completions" => {
            let messages = obj.get("messages").and_then(Value::as_array);
            for m in messages.ok_or(Uncountable::NotText)? {
                message(m, &mut p)?;
            }
            // Offered tools and documents are rendered into the prompt.
            for field in ["tools", "documents"] {
                if let Some(v) = obj.get(field).filter(|v| !v.is_null()) {
                    p.json.push(v.to_string());
                }
            }
            // A template of the client's own (or arguments to one) may
            // render anything.
            if ["chat_template", "chat_template_kwargs"]
                .iter()
                .any(|f| obj.get(*f).is_some_and(|v| !v.is_null()))
            {
                return Err(Uncountable::NotText);
            }
        }
        "/v1/completions" => sequences(obj.get("prompt"), &mut p)?,
        "/v1/embeddings" => sequences(obj.get("input"), &mut p)?,
        _ => return Err(Uncountable::OtherPath),
    }
    Ok(p)
}

/// A chat message's fields that chat templates render as text besides
/// its `content`: counted when they are strings.
const MESSAGE_TEXTS: [&str; 4] = ["name", "tool_call_id", "reasoning_content", "reasoning"];

/// One chat message: its content (a string or text parts), its name, the
/// id of the tool call it answers, its reasoning, its tool calls' names
/// and arguments. Any other field (or one of another shape) makes the
/// prompt uncountable: a template may render it, and text the count left
/// out would make the prompt look shorter than the model reads it.
fn message<'a>(m: &'a Value, p: &mut Prompt<'a>) -> Result<(), Uncountable> {
    let m = m.as_object().ok_or(Uncountable::NotText)?;
    for (key, v) in m {
        match (key.as_str(), v) {
            (_, Value::Null) | ("role", Value::String(_)) => {}
            ("content", Value::String(s)) => p.texts.push(s),
            ("content", Value::Array(parts)) => {
                for part in parts {
                    p.texts.push(text_part(part)?);
                }
            }
            ("tool_calls", Value::Array(calls)) => {
                for call in calls {
                    tool_call(call, p)?;
                }
            }
            (k, Value::String(s)) if MESSAGE_TEXTS.contains(&k) => p.texts.push(s),
            _ => return Err(Uncountable::NotText),
        }
    }
    Ok(())
}

/// A tool call's function name and arguments (strings, as the API
/// defines them).
fn tool_call<'a>(call: &'a Value, p: &mut Prompt<'a>) -> Result<(), Uncountable> {
    let f = call.get("function").ok_or(Uncountable::NotText)?;
    for field in ["name", "arguments"] {
        match f.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => p.texts.push(s),
            Some(_) => return Err(Uncountable::NotText),
        }
    }
    Ok(())
}

/// A content part that is text (`{"type": "text", "text": ...}`).
fn text_part(part: &Value) -> Result<&str, Uncountable> {
    match (part.get("type").and_then(Value::as_str), part.get("text")) {
        (Some("text"), Some(Value::String(s))) => Ok(s),
        _ => Err(Uncountable::NotText),
    }
}

/// A completion's `prompt` or an embedding's `input`: a string, an array
/// of strings, an array of token ids or an array of such arrays.
fn sequences<'a>(v: Option<&'a Value>, p: &mut Prompt<'a>) -> Result<(), Uncountable> {
    match v {
        Some(Value::String(s)) => p.sequences.push(s),
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => {
            p.ids += items.len() as u64;
        }
        Some(Value::Array(items)) => {
            for item in items {
                match item {
                    Value::String(s) => p.sequences.push(s),
                    Value::Array(ids) if ids.iter().all(Value::is_u64) => {
                        p.ids += ids.len() as u64;
                    }
                    _ => return Err(Uncountable::NotText),
                }
            }
        }
        _ => return Err(Uncountable::NotText),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const CHAT: &str = "/v1/chat/completions";

    #[test]
    fn a_chat_prompt_is_its_messages_text_names_tool_calls_and_tools() {
        let body = json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "name": "ana", "content": [
                    {"type": "text", "text": "hello"},
                    {"type": "text", "text": "world"}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "lookup", "arguments": "{\"q\":1}"}}
                ]}
            ],
            "tools": [{"type": "function", "function": {"name": "lookup"}}],
            "max_tokens": 5
        });
        let p = prompt(CHAT, &body).unwrap();
        assert_eq!(
            p.texts,
            ["be brief", "hello", "world", "ana", "lookup", "{\"q\":1}"]
        );
        assert_eq!(p.json.len(), 1);
        assert!(p.json[0].contains("lookup"));
        assert!(p.sequences.is_empty());
        assert_eq!(p.ids, 0);
    }

    #[test]
    fn a_part_that_is_not_text_makes_the_prompt_uncountable() {
        for body in [
            json!({"messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
            ]}]}),
            json!({"messages": [{"role": "user", "content": 7}]}),
            json!({"messages": ["not an object"]}),
            json!({"messages": "hi"}),
            json!({"prompt": "missing messages"}),
            json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]}),
        ] {
            assert_eq!(prompt(CHAT, &body), Err(Uncountable::NotText), "{body}");
        }
        assert_eq!(prompt(CHAT, &json!([1, 2])), Err(Uncountable::NotJson));
        assert_eq!(
            prompt("/v1/models", &json!({})),
            Err(Uncountable::OtherPath)
        );
    }

    /// Text the model reads but the count left out made a prompt look
    /// short to `maxInputTokens`, the long-context limit and a priced
    /// reservation: a message's reasoning, the id of the tool call it
    /// answers, an object given as a tool call's arguments, documents, a
    /// template of the client's own. Each is counted now, or makes the
    /// prompt uncountable (estimated from the body's bytes).
    #[test]
    fn text_the_model_reads_is_counted_or_the_prompt_is_not_counted() {
        let long = "x".repeat(1000);
        let body = json!({"messages": [
            {"role": "assistant", "content": "a", "reasoning_content": long},
            {"role": "tool", "content": "b", "tool_call_id": "c1"}
        ], "documents": [{"text": "d"}]});
        let p = prompt(CHAT, &body).unwrap();
        assert_eq!(p.texts, ["a", long.as_str(), "b", "c1"]);
        assert_eq!(p.json, [r#"[{"text":"d"}]"#]);
        for body in [
            json!({"messages": [{"role": "user", "content": "a", "extra": long}]}),
            json!({"messages": [{"role": "user", "content": "a", "name": {"x": long}}]}),
            json!({"messages": [{"role": "assistant", "tool_calls": [
                {"function": {"name": "f", "arguments": {"q": long}}}
            ]}]}),
            json!({"messages": [{"role": "user", "content": "a"}], "chat_template": "{{ x }}"}),
            json!({"messages": [], "chat_template_kwargs": {"context": long}}),
        ] {
            assert_eq!(prompt(CHAT, &body), Err(Uncountable::NotText), "{body}");
        }
    }

    #[test]
    fn completion_and_embedding_prompts_are_sequences_or_ids() {
        let check = |path: &str, body: Value, sequences: &[&str], ids: u64| {
            let p = prompt(path, &body).unwrap();
            assert_eq!((p.sequences.as_slice(), p.ids), (sequences, ids), "{body}");
        };
        check(
            "/v1/completions",
            json!({"prompt": "once upon"}),
            &["once upon"],
            0,
        );
        check(
            "/v1/completions",
            json!({"prompt": ["a", "b c"]}),
            &["a", "b c"],
            0,
        );
        check("/v1/completions", json!({"prompt": [1, 2, 3]}), &[], 3);
        check(
            "/v1/embeddings",
            json!({"input": [[1, 2], [3], "x"]}),
            &["x"],
            3,
        );
        for bad in [
            json!({"prompt": [1, "a", {"x": 1}]}),
            json!({"prompt": [[1, -2]]}),
            json!({"prompt": 5}),
            json!({}),
        ] {
            assert_eq!(
                prompt("/v1/completions", &bad),
                Err(Uncountable::NotText),
                "{bad}"
            );
        }
    }
}
