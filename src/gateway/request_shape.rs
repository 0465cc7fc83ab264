//! The request's shape against its lane's token limits, before admission
//! (no token of any bucket is taken for a refused request, and it never
//! reaches the upstream): 413 `context_too_long` over `maxInputTokens`, 400
//! for an output field that is not a count, and the body forwarded with its
//! `max_tokens` lowered to (or set at) the limit in force. The rule itself
//! is the `lanes` crate's ([`lanes::request_shape`]), applied with the
//! sizing in `token_size::prepare` (one parse of the body for both); here
//! are which paths take an output limit and the answers to a refused shape.
//! An observe config checks nothing: it admits every request as sent.

use axum::http::StatusCode;
use axum::response::Response;
use lanes::request_shape::{DEFAULT_BYTES_PER_TOKEN, InputTokens, ShapeRefusal};

use super::respond;

/// Paths whose requests ask for output tokens: chat completions and
/// completions (not embeddings or paths an operator added).
pub(super) fn takes_output_limit(path: &str) -> bool {
    matches!(path, "/v1/chat/completions" | "/v1/completions")
}

/// The answer to a refused shape.
pub(super) fn refusal(lane: &str, r: &ShapeRefusal) -> Response {
    match r {
        ShapeRefusal::ContextTooLong { input, limit } => respond::error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "context_too_long",
            match input {
                InputTokens::Estimated(n) => format!(
                    "lane {lane}: the request carries about {n} input tokens (its body's bytes / {DEFAULT_BYTES_PER_TOKEN}); the lane's maxInputTokens is {limit}"
                ),
                InputTokens::Counted(n) => format!(
                    "lane {lane}: the request's prompt is {n} tokens (counted with its route's tokenizer); the lane's maxInputTokens is {limit}"
                ),
            },
        ),
        ShapeRefusal::NotJsonObject => respond::error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_body",
            format!(
                "lane {lane}: the request body must be a JSON object (the lane limits output tokens)"
            ),
        ),
        ShapeRefusal::BadOutputField { field, value } => respond::error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_max_tokens",
            format!(
                "{} must be an integer >= 1; it was {}",
                field.as_str(),
                respond::prefix(value, 64)
            ),
        ),
    }
}

/// The answer to a completion of a priced lane whose body is not a JSON
/// object: it could not be metered.
pub(super) fn priced_not_json(lane: &str) -> Response {
    respond::error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "invalid_body",
        format!(
            "lane {lane}: the request body must be a JSON object (the lane is priced by tokens and settles with the answer's usage)"
        ),
    )
}

/// The answer to a priced request whose `field` (`stream`,
/// `stream_options.include_usage`) is not a boolean: the gateway must know
/// whether the answer streams, and whether the client asked for its usage
/// chunk, to settle it.
pub(super) fn not_a_flag(lane: &str, field: &str, value: &str) -> Response {
    respond::error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "invalid_stream",
        format!(
            "lane {lane}: {field} must be true or false; it was {}",
            respond::prefix(value, 64)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_of(r: Response) -> (StatusCode, serde_json::Value) {
        let status = r.status();
        let bytes = http_body_util::BodyExt::collect(r.into_body())
            .await
            .unwrap()
            .to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn each_refusal_has_its_status_and_code() {
        let (s, b) = body_of(refusal(
            "p1",
            &ShapeRefusal::ContextTooLong {
                input: InputTokens::Estimated(9000),
                limit: 8000,
            },
        ))
        .await;
        assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(b["error"]["code"], "context_too_long");
        let msg = b["error"]["message"].as_str().unwrap();
        assert!(msg.contains("8000") && msg.contains("about 9000"), "{msg}");
        let (_, b) = body_of(refusal(
            "p1",
            &ShapeRefusal::ContextTooLong {
                input: InputTokens::Counted(9001),
                limit: 8000,
            },
        ))
        .await;
        let msg = b["error"]["message"].as_str().unwrap();
        assert!(msg.contains("9001 tokens (counted"), "{msg}");
        let (s, b) = body_of(refusal("p1", &ShapeRefusal::NotJsonObject)).await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_body"))
        );
        let (s, b) = body_of(refusal(
            "p1",
            &ShapeRefusal::BadOutputField {
                field: lanes::request_shape::OutputField::MaxTokens,
                value: "x".repeat(500),
            },
        ))
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert_eq!(b["error"]["code"], "invalid_max_tokens");
        // The client's value is echoed cut short.
        assert!(b["error"]["message"].as_str().unwrap().len() < 200);
    }

    #[test]
    fn only_completion_paths_take_an_output_limit() {
        assert!(takes_output_limit("/v1/chat/completions"));
        assert!(takes_output_limit("/v1/completions"));
        assert!(!takes_output_limit("/v1/embeddings"));
        assert!(!takes_output_limit("/v1/chat/completions/x"));
    }
}
