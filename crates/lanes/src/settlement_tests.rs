//! Reading what an answer reports it used. The budget's rules and the
//! properties issue 23 asks for (settled cost is the sum of actual costs,
//! the admitted cost rate converges to the lane's units/s, no refund without
//! usage) are tested against the core itself, in `charge_tests.rs`.

use super::*;

#[test]
fn usage_is_read_from_an_answer_or_a_usage_chunk() {
    let body = br#"{"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}"#;
    assert_eq!(
        Usage::from_answer(body),
        Some(Usage {
            prompt_tokens: 12,
            completion_tokens: 3
        })
    );
    for none in [
        &br#"{"choices": []}"#[..],
        br#"{"usage": {"prompt_tokens": 1.5, "completion_tokens": 3}}"#,
        br#"{"usage": {"prompt_tokens": -1, "completion_tokens": 3}}"#,
        br#"{"usage": null}"#,
        b"not json",
    ] {
        assert_eq!(Usage::from_answer(none), None);
    }
}
