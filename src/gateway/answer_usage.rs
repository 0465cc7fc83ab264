//! A JSON answer's top-level `usage`, found as the answer streams past
//! without keeping the answer: a scan that follows the object's nesting
//! and strings byte by byte and keeps only the value of its top-level
//! `usage` key (at most [`MAX_USAGE_BYTES`]). An answer of any length is
//! settled with its usage: one made long on purpose (many choices, a long
//! `max_tokens`, `logprobs`) cannot escape its cost, and no answer is held
//! in memory to be read.
//!
//! Only an answer that is one JSON object, ended whole, with exactly one
//! top-level `usage` says what it cost; anything else (an array, an object
//! cut short, bytes after it, a usage given twice) says nothing and keeps
//! the reservation.

use lanes::Usage;

/// The most bytes of the `usage` value kept (a usage object is a few
/// hundred bytes, with its details).
const MAX_USAGE_BYTES: usize = 64 << 10;

/// Where the scan is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Before the answer's first byte that is not whitespace.
    Start,
    /// Inside the top-level object.
    Object,
    /// The top-level object closed: only whitespace may follow.
    Done,
    /// Not one JSON object (or a usage too long): says nothing.
    Broken,
}

/// The scan of one JSON answer.
#[derive(Debug)]
pub(super) struct UsageScan {
    phase: Phase,
    /// Open objects and arrays (1 inside the top-level object).
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// At depth 1, the next string is a key.
    expect_key: bool,
    /// The top-level key being read (None: not reading one; cut at 8
    /// bytes, more than `usage` has).
    key: Option<Vec<u8>>,
    /// The last top-level key read was `usage`.
    at_usage: bool,
    /// The top-level `usage` value being kept.
    value: Option<Vec<u8>>,
    /// The last `usage` value kept.
    kept: Option<Vec<u8>>,
    /// Top-level `usage` keys seen.
    usages: u32,
}

impl UsageScan {
    pub(super) fn new() -> UsageScan {
        UsageScan {
            phase: Phase::Start,
            depth: 0,
            in_string: false,
            escaped: false,
            expect_key: false,
            key: None,
            at_usage: false,
            value: None,
            kept: None,
            usages: 0,
        }
    }

    /// The next bytes of the answer.
    pub(super) fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            match self.phase {
                Phase::Broken => return,
                Phase::Start if b.is_ascii_whitespace() => {}
                Phase::Start if b == b'{' => {
                    self.phase = Phase::Object;
                    self.depth = 1;
                    self.expect_key = true;
                }
                Phase::Done if b.is_ascii_whitespace() => {}
                Phase::Start | Phase::Done => self.phase = Phase::Broken,
                Phase::Object => self.byte(b),
            }
        }
    }

    /// The usage of the answer, once it ended whole.
    pub(super) fn usage(&self) -> Option<Usage> {
        if self.phase != Phase::Done || self.usages != 1 {
            return None;
        }
        let value = self.kept.as_deref()?;
        let mut doc = Vec::with_capacity(value.len() + 10);
        doc.extend_from_slice(b"{\"usage\":");
        doc.extend_from_slice(value);
        doc.push(b'}');
        Usage::from_answer(&doc)
    }

    /// One byte inside the top-level object.
    fn byte(&mut self, b: u8) {
        if self.in_string {
            self.string_byte(b);
        } else {
            self.structure_byte(b);
        }
        if self
            .value
            .as_ref()
            .is_some_and(|v| v.len() > MAX_USAGE_BYTES)
        {
            self.phase = Phase::Broken;
        }
    }

    fn string_byte(&mut self, b: u8) {
        self.keep(b);
        if self.escaped {
            self.escaped = false;
            // A key written with escapes is not read as `usage`.
            self.key_byte(0);
        } else if b == b'\\' {
            self.escaped = true;
            self.key_byte(0);
        } else if b == b'"' {
            self.in_string = false;
            if let Some(key) = self.key.take() {
                self.at_usage = key == b"usage";
                self.expect_key = false;
            }
        } else {
            self.key_byte(b);
        }
    }

    fn structure_byte(&mut self, b: u8) {
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.key = Some(Vec::new());
                }
                self.keep(b);
            }
            b'{' | b'[' => {
                self.depth = self.depth.saturating_add(1);
                self.keep(b);
            }
            b'}' | b']' => {
                self.depth -= 1;
                if self.depth == 0 {
                    self.end_value();
                    self.phase = if b == b'}' {
                        Phase::Done
                    } else {
                        Phase::Broken
                    };
                } else {
                    self.keep(b);
                }
            }
            b':' if self.depth == 1 => {
                if std::mem::take(&mut self.at_usage) {
                    self.usages += 1;
                    self.value = Some(Vec::new());
                }
            }
            b',' if self.depth == 1 => {
                self.end_value();
                self.expect_key = true;
            }
            _ => self.keep(b),
        }
    }

    /// Keeps `b` when inside the `usage` value.
    fn keep(&mut self, b: u8) {
        if let Some(v) = self.value.as_mut() {
            v.push(b);
        }
    }

    /// A byte of the top-level key being read (0: one that makes it no
    /// plain `usage`).
    fn key_byte(&mut self, b: u8) {
        if let Some(key) = self.key.as_mut()
            && key.len() < 8
        {
            key.push(b);
        }
    }

    /// A top-level value ended: the `usage` value, if it was one, is kept.
    fn end_value(&mut self) {
        if let Some(v) = self.value.take() {
            self.kept = Some(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str, step: usize) -> Option<Usage> {
        let mut s = UsageScan::new();
        for piece in text.as_bytes().chunks(step) {
            s.feed(piece);
        }
        s.usage()
    }

    fn usage(p: u64, c: u64) -> Option<Usage> {
        Some(Usage {
            prompt_tokens: p,
            completion_tokens: c,
        })
    }

    #[test]
    fn the_top_level_usage_is_read_wherever_it_is() {
        for text in [
            r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}"#,
            r#" {"usage" : {"completion_tokens":2, "prompt_tokens":7, "details": {"x": [1, "}"]}} , "choices": [{"message": {"content": "a \"usage\": {\"prompt_tokens\": 0}"}}]} "#,
            r#"{"a": {"usage": {"prompt_tokens": 0, "completion_tokens": 0}}, "usage": {"prompt_tokens": 7, "completion_tokens": 2}}"#,
        ] {
            for step in [1, 3, 1000] {
                assert_eq!(scan(text, step), usage(7, 2), "{text}");
            }
        }
    }

    #[test]
    fn an_answer_that_is_not_one_whole_object_with_one_usage_says_nothing() {
        let u = r#""usage": {"prompt_tokens": 7, "completion_tokens": 2}"#;
        for text in [
            format!("{{{u}"),
            format!("{{{u}}} x"),
            format!("[{{{u}}}]"),
            format!("{{{u}, {u}}}"),
            r#"{"usage": null}"#.to_owned(),
            r#"{"usage": {"prompt_tokens": -1, "completion_tokens": 2}}"#.to_owned(),
            r#"{"choices": []}"#.to_owned(),
            format!("{{\"usage\": \"{}\"}}", "x".repeat(MAX_USAGE_BYTES + 1)),
            String::new(),
        ] {
            assert_eq!(scan(&text, 5), None, "{text}");
        }
    }

    #[test]
    fn a_long_answer_is_read_without_being_kept() {
        let mut s = UsageScan::new();
        s.feed(br#"{"choices": [{"message": {"content": ""#);
        let filler = vec![b'x'; 1 << 20];
        for _ in 0..8 {
            s.feed(&filler);
        }
        s.feed(br#""}}], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}"#);
        assert_eq!(s.usage(), usage(7, 2));
        assert!(s.kept.as_ref().is_some_and(|v| v.len() < 100));
    }
}
