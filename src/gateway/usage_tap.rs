//! Reading an answer's `usage` on its way back to the client, to settle
//! what the request reserved: a JSON answer is scanned for its top-level
//! `usage` as it passes, whatever its length (`answer_usage`), and read
//! when it ends; an event stream is read event by event, and the usage chunk the gateway asked the server for
//! (`stream_options.include_usage`) is taken out again when the client did
//! not ask for it. An answer whose usage cannot be read settles nothing:
//! the reservation stands.

use axum::body::Bytes;
use lanes::Usage;

use super::answer_usage::UsageScan;
/// The most of one server-sent event kept while it is incomplete.
const MAX_EVENT_BYTES: usize = 1 << 20;

/// How a priced request's answer is read for its usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Metering {
    /// The gateway asked for the stream's usage chunk: take it out of the
    /// answer.
    pub(super) strip_usage_chunk: bool,
}

/// What the tap does with the answer.
#[derive(Debug)]
enum Kind {
    /// A JSON answer: scanned as it passes, read at the end.
    Json(UsageScan),
    /// An event stream: the incomplete event so far, and whether the usage
    /// chunk is taken out.
    Events { pending: Vec<u8>, strip: bool },
    /// Gave up (an answer or an event too long): passes through.
    Off,
}

/// Reads one answer's usage as it streams through.
#[derive(Debug)]
pub(super) struct UsageTap {
    kind: Kind,
    usage: Option<Usage>,
}

impl UsageTap {
    /// A tap for an answer that is an event stream (`sse`) or not; `strip`
    /// takes the usage chunk out of a stream.
    pub(super) fn new(sse: bool, strip: bool) -> UsageTap {
        UsageTap {
            kind: if sse {
                Kind::Events {
                    pending: Vec::new(),
                    strip,
                }
            } else {
                Kind::Json(UsageScan::new())
            },
            usage: None,
        }
    }

    /// The usage read so far.
    pub(super) fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// A chunk of the answer: what goes on to the client (the chunk itself,
    /// or, while taking the usage chunk out, the complete events in it).
    pub(super) fn chunk(&mut self, b: Bytes) -> Bytes {
        match &mut self.kind {
            Kind::Off => b,
            Kind::Json(scan) => {
                scan.feed(&b);
                b
            }
            Kind::Events { pending, strip } => {
                let strip = *strip;
                pending.extend_from_slice(&b);
                let out = self.events(false);
                if strip { out } else { b }
            }
        }
    }

    /// The answer ended: a JSON answer is read; what is left of a stream
    /// goes out (None: nothing left).
    pub(super) fn end(&mut self) -> Option<Bytes> {
        match &mut self.kind {
            Kind::Off => None,
            Kind::Json(scan) => {
                self.usage = scan.usage();
                self.kind = Kind::Off;
                None
            }
            Kind::Events { strip, .. } => {
                let strip = *strip;
                let out = self.events(true);
                self.kind = Kind::Off;
                (strip && !out.is_empty()).then_some(out)
            }
        }
    }

    /// Reads the complete events pending (all of them at the end) and,
    /// when stripping, returns them less a usage chunk (else nothing: the
    /// chunks went out as they came).
    fn events(&mut self, at_end: bool) -> Bytes {
        let Kind::Events { pending, strip } = &mut self.kind else {
            return Bytes::new();
        };
        let strip = *strip;
        let mut out = Vec::new();
        let mut start = 0;
        loop {
            let end = match event_end(&pending[start..]) {
                Some(e) => start + e,
                None if at_end && start < pending.len() => pending.len(),
                None => break,
            };
            let event = &pending[start..end];
            let usage = usage_of_event(event);
            if let Some((u, _)) = usage {
                self.usage = Some(u);
            }
            if strip && !usage.is_some_and(|(_, only)| only) {
                out.extend_from_slice(event);
            }
            start = end;
        }
        pending.drain(..start);
        if pending.len() > MAX_EVENT_BYTES {
            // An event this long is no usage chunk: let it through.
            if strip {
                out.append(pending);
            }
            self.kind = Kind::Off;
        }
        Bytes::from(out)
    }
}

/// Where the first event of `b` ends (after its blank line), if it does.
fn event_end(b: &[u8]) -> Option<usize> {
    let lf = b.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = b.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}

/// The usage an event carries, and whether that is all it carries (no
/// choices: the chunk `include_usage` adds).
fn usage_of_event(event: &[u8]) -> Option<(Usage, bool)> {
    // Cheap first: most events carry no usage at all.
    if !event.windows(7).any(|w| w == b"\"usage\"") {
        return None;
    }
    let text = std::str::from_utf8(event).ok()?;
    let data: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim_start)
        .collect::<Vec<_>>()
        .join("\n");
    Usage::with_choices(data.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"ok \"}}]}\n\n";
    const USAGE: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"total_tokens\":15}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    fn usage(p: u64, c: u64) -> Option<Usage> {
        Some(Usage {
            prompt_tokens: p,
            completion_tokens: c,
        })
    }

    /// Feeds `text` in pieces of `step` bytes; returns what went out.
    fn feed(tap: &mut UsageTap, text: &str, step: usize) -> String {
        let mut out = Vec::new();
        for piece in text.as_bytes().chunks(step) {
            out.extend_from_slice(&tap.chunk(Bytes::copy_from_slice(piece)));
        }
        if let Some(rest) = tap.end() {
            out.extend_from_slice(&rest);
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_json_answer_is_read_at_its_end() {
        let body = r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}"#;
        for step in [1, 5, 1000] {
            let mut tap = UsageTap::new(false, false);
            assert_eq!(feed(&mut tap, body, step), body);
            assert_eq!(tap.usage(), usage(7, 2));
        }
        let mut tap = UsageTap::new(false, false);
        feed(&mut tap, r#"{"choices":[]}"#, 3);
        assert_eq!(tap.usage(), None, "no usage, nothing settled");
    }

    /// A client that makes its answer long (a long `max_tokens`, many
    /// choices, `logprobs`) is charged what the answer says it used all the
    /// same: reading it used to stop at 4 MiB, and the request then kept
    /// only its reservation (its output at the lane's P95).
    #[test]
    fn a_long_json_answer_is_read_too() {
        let mut tap = UsageTap::new(false, false);
        let big = format!(
            r#"{{"x":"{}","usage":{{"prompt_tokens":7,"completion_tokens":2}}}}"#,
            "a".repeat(8 << 20)
        );
        assert_eq!(feed(&mut tap, &big, 1 << 16).len(), big.len());
        assert_eq!(tap.usage(), usage(7, 2));
    }

    #[test]
    fn the_usage_chunk_is_taken_out_when_the_client_did_not_ask() {
        let stream = format!("{CHUNK}{CHUNK}{USAGE}{DONE}");
        for step in [1, 7, 64, 10_000] {
            let mut tap = UsageTap::new(true, true);
            assert_eq!(
                feed(&mut tap, &stream, step),
                format!("{CHUNK}{CHUNK}{DONE}")
            );
            assert_eq!(tap.usage(), usage(12, 3));
            // Asked for: it stays, and is read all the same.
            let mut tap = UsageTap::new(true, false);
            assert_eq!(feed(&mut tap, &stream, step), stream);
            assert_eq!(tap.usage(), usage(12, 3));
        }
    }

    #[test]
    fn a_stream_without_usage_or_cut_short_passes_through_whole() {
        let stream = format!("{CHUNK}{CHUNK}{DONE}");
        let mut tap = UsageTap::new(true, true);
        assert_eq!(feed(&mut tap, &stream, 5), stream);
        assert_eq!(tap.usage(), None);
        // An unfinished last event goes out at the end as it came.
        let cut = format!("{CHUNK}data: {{\"cho");
        let mut tap = UsageTap::new(true, true);
        assert_eq!(feed(&mut tap, &cut, 4), cut);
        // Events with CRLF line ends.
        let crlf = USAGE.replace("\n\n", "\r\n\r\n") + &CHUNK.replace("\n\n", "\r\n\r\n");
        let mut tap = UsageTap::new(true, true);
        assert_eq!(feed(&mut tap, &crlf, 3), CHUNK.replace("\n\n", "\r\n\r\n"));
        assert_eq!(tap.usage(), usage(12, 3));
    }

    #[test]
    fn a_usage_inside_a_content_chunk_is_read_but_the_chunk_stays() {
        let both = "data: {\"choices\":[{\"delta\":{}}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n";
        let mut tap = UsageTap::new(true, true);
        assert_eq!(feed(&mut tap, both, 9), both);
        assert_eq!(tap.usage(), usage(1, 1));
    }

    #[test]
    fn an_endless_event_is_let_through() {
        let long = format!("data: {}", "x".repeat(MAX_EVENT_BYTES + 10));
        let mut tap = UsageTap::new(true, true);
        assert_eq!(feed(&mut tap, &long, 1 << 16).len(), long.len());
    }
}
