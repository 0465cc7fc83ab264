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

#[test]
fn a_usage_chunk_is_told_from_a_chunk_with_choices() {
    let usage = Some(Usage {
        prompt_tokens: 2,
        completion_tokens: 1,
    });
    let u = r#""usage": {"prompt_tokens": 2, "completion_tokens": 1}"#;
    for (choices, only) in [
        ("", true),
        (r#""choices": [], "#, true),
        (r#""choices": [{"delta": {"content": "ok"}}], "#, false),
        (r#""choices": null, "#, false),
        (r#""choices": {"a": [1, 2]}, "#, false),
        (r#""choices": "x", "#, false),
        (r#""choices": 3, "#, false),
    ] {
        let body = format!("{{{choices}{u}}}");
        assert_eq!(
            Usage::with_choices(body.as_bytes()),
            usage.map(|u| (u, only)),
            "{body}"
        );
        assert_eq!(Usage::from_answer(body.as_bytes()), usage, "{body}");
    }
    // Only an object: not an array read by position, not a duplicated
    // usage (no refund on an answer that says two things).
    for none in [
        &br#"[{"prompt_tokens": 2, "completion_tokens": 1}, []]"#[..],
        br#"{"usage": {"prompt_tokens": 2, "completion_tokens": 1}, "usage": {"prompt_tokens": 0, "completion_tokens": 0}}"#,
        br#"{"usage": {"prompt_tokens": 2}}"#,
    ] {
        assert_eq!(Usage::with_choices(none), None);
    }
    let spaced = format!("  \n{{{u}}}");
    assert_eq!(Usage::from_answer(spaced.as_bytes()), usage);
}
