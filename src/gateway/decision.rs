//! Each decision leaves a record: the `x-request-id` and
//! `x-lanekeeper-decision` headers on every answer, and one structured log
//! line for every refusal (at most `--decision-log-refusals-per-second`,
//! the rest counted and reported) and for a sample of admissions (one in
//! `--decision-log-sample`).

use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;

/// The header carrying a request's id (the client's, or one the gateway
/// made). Header names are kept parsed: a name given as text is parsed
/// again at every insert.
pub(super) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// The header saying what the gateway decided.
pub(super) const DECISION: HeaderName = HeaderName::from_static("x-lanekeeper-decision");
/// The header a client names a request by for retry counting (before
/// `x-request-id`).
pub(super) const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The longest client request id accepted, in bytes.
pub(super) const MAX_REQUEST_ID: usize = 128;

/// Why the gateway answered itself: set on every response it makes (a
/// response extension), read back when the decision is recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Reason(pub(super) &'static str);

/// What was decided, as the decision header and the log say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Sent upstream (the upstream's answer follows, whatever its status).
    Admitted,
    /// Refused by the gateway (a limit, or a bad or unauthorised request).
    Refused,
    /// Told to come back later (a `Defer` lane).
    Deferred,
    /// Admitted, but the upstream could not be reached in time.
    Failed,
}

impl Verdict {
    /// The value in the header and the log.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Verdict::Admitted => "admitted",
            Verdict::Refused => "refused",
            Verdict::Deferred => "deferred",
            Verdict::Failed => "failed",
        }
    }

    /// The verdict behind a response: the gateway's own answers carry a
    /// [`Reason`]; anything else came from the upstream.
    pub(super) fn of(status: StatusCode, reason: Option<Reason>) -> Verdict {
        match reason {
            None => Verdict::Admitted,
            Some(Reason("deferred")) => Verdict::Deferred,
            Some(_)
                if status == StatusCode::BAD_GATEWAY || status == StatusCode::GATEWAY_TIMEOUT =>
            {
                Verdict::Failed
            }
            Some(_) => Verdict::Refused,
        }
    }
}

/// A client's request id in header `name` ([`REQUEST_ID`] or
/// [`IDEMPOTENCY_KEY`]) when it is short, visible ASCII; `Err` when the
/// client sent one that is not. One rule for both: either may become the id
/// the core, the shared store's keys and the logs hold.
pub(super) fn client_request_id<'a>(
    h: &'a HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'a HeaderValue>, ()> {
    let Some(v) = h.get(name) else {
        return Ok(None);
    };
    let ok = !v.is_empty()
        && v.len() <= MAX_REQUEST_ID
        && v.as_bytes().iter().all(|b| b.is_ascii_graphic());
    if ok { Ok(Some(v)) } else { Err(()) }
}

/// Makes request ids unique to this process: a random start, then a count.
pub(super) struct IdMaker {
    seed: u64,
    next: AtomicU64,
}

impl IdMaker {
    /// A maker seeded from the process's random hash keys.
    pub(super) fn new() -> IdMaker {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(std::process::id().into());
        IdMaker {
            seed: h.finish(),
            next: AtomicU64::new(0),
        }
    }

    /// A new id: 32 hex digits.
    pub(super) fn make(&self) -> HeaderValue {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        HeaderValue::try_from(format!("{:016x}{n:016x}", self.seed)).expect("hex digits")
    }
}

/// What the record says about one request.
#[derive(Clone, Debug)]
pub(super) struct Record {
    /// The request id on the answer and upstream (visible ASCII: the
    /// client's, checked, or one the gateway made), shared, not copied.
    pub(super) request_id: HeaderValue,
    /// The lane of the config the request was decided in (never a client's
    /// unknown value).
    pub(super) lane: Option<String>,
    /// The tenant it counted as.
    pub(super) tenant: Option<String>,
    /// How the caller was identified (`api_key`, `service_account`, `jwt`,
    /// `certificate`, `trusted_header`; empty before authentication). Never
    /// the credential.
    pub(super) identity: &'static str,
    /// Seconds it waited in its lane's queue.
    pub(super) waited_seconds: f64,
}

impl Default for Record {
    fn default() -> Record {
        Record {
            request_id: HeaderValue::from_static(""),
            lane: None,
            tenant: None,
            identity: "",
            waited_seconds: 0.0,
        }
    }
}

impl Record {
    /// The request id as text.
    pub(super) fn request_id(&self) -> &str {
        self.request_id.to_str().unwrap_or("-")
    }

    /// The decision header: `lane=…; verdict=…; reason=…`.
    pub(super) fn header(&self, verdict: Verdict, reason: &str) -> String {
        format!(
            "lane={}; verdict={}; reason={reason}",
            self.lane.as_deref().unwrap_or("-"),
            verdict.as_str()
        )
    }

    /// Puts the two headers on `response` and returns the verdict and
    /// reason.
    pub(super) fn stamp(&self, response: &mut Response) -> (Verdict, &'static str) {
        let reason = response.extensions().get::<Reason>().copied();
        let verdict = Verdict::of(response.status(), reason);
        let why = reason.map_or(
            if self.waited_seconds > 0.0 {
                "waited"
            } else {
                "within_rate"
            },
            |r| r.0,
        );
        let headers = response.headers_mut();
        headers.insert(REQUEST_ID, self.request_id.clone());
        // The text moves into the header as it is (`from_str` would copy it).
        if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(self.header(verdict, why))) {
            headers.insert(DECISION, v);
        }
        (verdict, why)
    }
}

/// Which decisions are logged: every refusal up to a rate, one admission in
/// N.
pub(super) struct DecisionLog {
    sample: u64,
    refusals_per_second: u32,
    admitted: AtomicU64,
    window: Mutex<Window>,
}

/// The current second's refusal lines.
#[derive(Debug, Default)]
struct Window {
    second: u64,
    logged: u32,
    suppressed: u64,
}

/// Whether to write a decision's line.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Line {
    /// Write it.
    Write,
    /// Write it, and say how many earlier lines were left out.
    WriteAfterSuppressing(u64),
    /// Leave it out.
    Skip,
}

impl DecisionLog {
    /// One admission in `sample` (0: none); refusals at most
    /// `refusals_per_second` lines a second.
    pub(super) fn new(sample: u64, refusals_per_second: u32) -> DecisionLog {
        DecisionLog {
            sample,
            refusals_per_second,
            admitted: AtomicU64::new(0),
            window: Mutex::new(Window::default()),
        }
    }

    /// Whether the decision at `now` (seconds) gets its line.
    pub(super) fn line(&self, verdict: Verdict, now: f64) -> Line {
        if verdict == Verdict::Admitted {
            let n = self.admitted.fetch_add(1, Ordering::Relaxed);
            return if self.sample > 0 && n.is_multiple_of(self.sample) {
                Line::Write
            } else {
                Line::Skip
            };
        }
        let second = now.max(0.0) as u64;
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if w.second != second {
            w.second = second;
            w.logged = 0;
        }
        if w.logged >= self.refusals_per_second {
            w.suppressed += 1;
            return Line::Skip;
        }
        w.logged += 1;
        match std::mem::take(&mut w.suppressed) {
            0 => Line::Write,
            n => Line::WriteAfterSuppressing(n),
        }
    }
}

/// Writes a decision's line.
pub(super) fn log(record: &Record, verdict: Verdict, reason: &str, line: Line) {
    let suppressed = match line {
        Line::Skip => return,
        Line::Write => 0,
        Line::WriteAfterSuppressing(n) => n,
    };
    tracing::info!(
        target: "lanekeeper::decision",
        request_id = record.request_id(),
        lane = record.lane.as_deref().unwrap_or("-"),
        tenant = record.tenant.as_deref().unwrap_or("-"),
        identity = if record.identity.is_empty() { "-" } else { record.identity },
        verdict = verdict.as_str(),
        reason,
        wait_seconds = record.waited_seconds,
        suppressed_before = suppressed,
        "decision"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_follows_the_gateways_reason() {
        let v = |s: u16, r: Option<&'static str>| {
            Verdict::of(StatusCode::from_u16(s).unwrap(), r.map(Reason))
        };
        assert_eq!(
            v(500, None),
            Verdict::Admitted,
            "an upstream 500 was admitted"
        );
        assert_eq!(v(429, Some("deferred")), Verdict::Deferred);
        assert_eq!(v(429, Some("rejected_rate")), Verdict::Refused);
        assert_eq!(v(401, Some("missing_credential")), Verdict::Refused);
        assert_eq!(v(502, Some("upstream_error")), Verdict::Failed);
        assert_eq!(v(504, Some("deadline")), Verdict::Failed);
    }

    #[test]
    fn request_ids_are_short_visible_ascii_or_refused() {
        for name in [REQUEST_ID, IDEMPOTENCY_KEY] {
            let mut h = HeaderMap::new();
            assert_eq!(client_request_id(&h, &name), Ok(None));
            h.insert(&name, HeaderValue::from_static("abc-123"));
            assert_eq!(
                client_request_id(&h, &name),
                Ok(Some(&HeaderValue::from_static("abc-123")))
            );
            for bad in [
                "a b".to_owned(),
                "x".repeat(MAX_REQUEST_ID + 1),
                String::new(),
            ] {
                h.insert(&name, HeaderValue::from_str(&bad).unwrap());
                assert_eq!(client_request_id(&h, &name), Err(()), "{bad:?}");
            }
            h.insert(&name, HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap());
            assert_eq!(client_request_id(&h, &name), Err(()));
        }
        let ids = IdMaker::new();
        let (a, b) = (ids.make(), ids.make());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(a.to_str().unwrap().bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn refusal_lines_are_bounded_per_second_and_the_gap_is_reported() {
        let log = DecisionLog::new(0, 2);
        assert_eq!(log.line(Verdict::Refused, 10.1), Line::Write);
        assert_eq!(log.line(Verdict::Refused, 10.2), Line::Write);
        for _ in 0..5 {
            assert_eq!(log.line(Verdict::Refused, 10.9), Line::Skip);
        }
        assert_eq!(
            log.line(Verdict::Deferred, 11.0),
            Line::WriteAfterSuppressing(5)
        );
        assert_eq!(log.line(Verdict::Admitted, 11.0), Line::Skip, "sample 0");
    }

    #[test]
    fn one_admission_in_n_is_logged() {
        let log = DecisionLog::new(4, 0);
        let written = (0..12)
            .filter(|_| log.line(Verdict::Admitted, 0.0) != Line::Skip)
            .count();
        assert_eq!(written, 3);
        assert_eq!(log.line(Verdict::Refused, 0.0), Line::Skip, "0 per second");
    }

    #[test]
    fn the_header_names_a_config_lane_or_none() {
        let mut r = Record {
            request_id: HeaderValue::from_static("r1"),
            ..Record::default()
        };
        assert_eq!(
            r.header(Verdict::Refused, "unknown_lane"),
            "lane=-; verdict=refused; reason=unknown_lane"
        );
        r.lane = Some("p1-agent-assist".to_owned());
        assert_eq!(
            r.header(Verdict::Admitted, "within_rate"),
            "lane=p1-agent-assist; verdict=admitted; reason=within_rate"
        );
    }
}
