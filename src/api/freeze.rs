//! The change freeze as the API shows it: the freeze exception annotation
//! (its fields, parsed by the same rules the API server's admission policy
//! applies), and the freeze in a CapacityProfile's status.
//!
//! An exception is the annotation [`EXCEPTION_ANNOTATION`] on the changed
//! object: `; `-separated `field=value` pairs, every one of `reason`,
//! `risk`, `scope`, `rollback` and `expires` present and not empty,
//! `expires` an RFC 3339 time after now and at most 24 h ahead:
//!
//! ```text
//! reason=CVE-2026-1234 in the image; risk=low, image only; scope=vllm image;
//! rollback=kubectl rollout undo; expires=2026-12-03T18:00:00Z
//! ```

use serde::{Deserialize, Serialize};

use super::objective::Band;

/// The annotation that carries a freeze exception.
pub const EXCEPTION_ANNOTATION: &str = "lanekeeper.dev/freeze-exception";
/// How far ahead an exception may expire, in seconds (24 h).
pub const MAX_EXCEPTION_SECONDS: i64 = 86_400;

/// What a profile's freeze holds back.
#[derive(
    schemars::JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
)]
pub enum FreezeState {
    /// No freeze (every lane with an objective is Routine or Cautious, or
    /// no lane has one).
    #[default]
    Open,
    /// A lane is Restricted (or its budget is Unknown): the pool's pod
    /// template and the lanes' routes are frozen.
    Rollouts,
    /// A lane is Exhausted: every spec change to the profile, its lanes, its
    /// policy and the pool's pod template is frozen, and so are creating a
    /// lane or policy for the profile and deleting any of them.
    Everything,
}

impl FreezeState {
    /// The freeze a worst band gives.
    pub fn of(band: Band) -> Self {
        match band {
            Band::Routine | Band::Cautious => FreezeState::Open,
            Band::Restricted => FreezeState::Rollouts,
            Band::Exhausted => FreezeState::Everything,
        }
    }

    /// The state's name.
    pub fn as_str(self) -> &'static str {
        match self {
            FreezeState::Open => "Open",
            FreezeState::Rollouts => "Rollouts",
            FreezeState::Everything => "Everything",
        }
    }
}

/// The fields of an exception.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ExceptionField {
    /// Why the change cannot wait.
    Reason,
    /// What could go wrong.
    Risk,
    /// What the change touches.
    Scope,
    /// How it is undone.
    Rollback,
    /// When the exception lapses (RFC 3339, at most 24 h ahead).
    Expires,
}

impl ExceptionField {
    /// Every field, in the order the annotation lists them.
    pub const ALL: [ExceptionField; 5] = [
        ExceptionField::Reason,
        ExceptionField::Risk,
        ExceptionField::Scope,
        ExceptionField::Rollback,
        ExceptionField::Expires,
    ];

    /// The field's key in the annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            ExceptionField::Reason => "reason",
            ExceptionField::Risk => "risk",
            ExceptionField::Scope => "scope",
            ExceptionField::Rollback => "rollback",
            ExceptionField::Expires => "expires",
        }
    }
}

/// Why an exception is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExceptionProblem {
    /// Fields absent or empty.
    Missing(Vec<ExceptionField>),
    /// `expires` is not an RFC 3339 time.
    ExpiresNotRfc3339,
    /// `expires` is not after now.
    Expired,
    /// `expires` is more than 24 h ahead.
    TooFarAhead,
}

impl std::fmt::Display for ExceptionProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExceptionProblem::Missing(fields) => {
                let names: Vec<&str> = fields.iter().map(|x| x.as_str()).collect();
                write!(f, "missing {}", names.join(", "))
            }
            ExceptionProblem::ExpiresNotRfc3339 => write!(f, "expires is not an RFC 3339 time"),
            ExceptionProblem::Expired => write!(f, "expired"),
            ExceptionProblem::TooFarAhead => write!(f, "expires more than 24h ahead"),
        }
    }
}

/// An exception as a profile's status records it.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FreezeException {
    /// Kind of the annotated object.
    pub kind: String,
    /// Name of the annotated object (in the profile's namespace).
    pub name: String,
    /// Why the change cannot wait.
    pub reason: String,
    /// What could go wrong.
    pub risk: String,
    /// What the change touches.
    pub scope: String,
    /// How it is undone.
    pub rollback: String,
    /// When it lapses (RFC 3339).
    pub expires: String,
}

/// A profile's freeze in its status.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FreezeStatus {
    /// `Open`, `Rollouts` (pod template and routes frozen) or `Everything`
    /// (every spec change frozen).
    pub state: FreezeState,
    /// The worst band among the profile's lanes with an objective.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub band: Option<Band>,
    /// The lanes in that band (what causes the freeze).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<String>,
    /// Exceptions in force on the profile's objects (accepted by the API
    /// server's freeze policy, not expired).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exceptions: Vec<FreezeException>,
}

/// The value of `field` in an annotation (trimmed; None when absent or
/// empty).
fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// Whether `s` has the RFC 3339 shape the admission policy checks:
/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`.
pub fn rfc3339_shape(s: &str) -> bool {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    if !(digits(0..4) && at(4, b'-') && digits(5..7) && at(7, b'-') && digits(8..10))
        || !(at(10, b'T') && digits(11..13) && at(13, b':') && digits(14..16))
        || !(at(16, b':') && digits(17..19))
    {
        return false;
    }
    let mut i = 19;
    if at(i, b'.') {
        let frac = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if frac == 0 {
            return false;
        }
        i += 1 + frac;
    }
    match b.get(i) {
        Some(b'Z') => i + 1 == b.len(),
        Some(b'+' | b'-') => {
            i + 6 == b.len() && digits(i + 1..i + 3) && at(i + 3, b':') && digits(i + 4..i + 6)
        }
        _ => false,
    }
}

/// Parses an exception annotation on `kind`/`name` at `now` (Unix
/// seconds), by the rules the admission policy applies.
pub fn parse_exception(
    kind: &str,
    name: &str,
    text: &str,
    now: i64,
) -> Result<FreezeException, ExceptionProblem> {
    let missing: Vec<ExceptionField> = ExceptionField::ALL
        .into_iter()
        .filter(|f| field(text, f.as_str()).is_none())
        .collect();
    if !missing.is_empty() {
        return Err(ExceptionProblem::Missing(missing));
    }
    let get = |f: ExceptionField| field(text, f.as_str()).unwrap_or_default().to_owned();
    let expires = get(ExceptionField::Expires);
    let at = rfc3339_shape(&expires)
        .then(|| super::common::parse_rfc3339(&expires))
        .flatten()
        .ok_or(ExceptionProblem::ExpiresNotRfc3339)?;
    if at <= now {
        return Err(ExceptionProblem::Expired);
    }
    if at > now.saturating_add(MAX_EXCEPTION_SECONDS) {
        return Err(ExceptionProblem::TooFarAhead);
    }
    Ok(FreezeException {
        kind: kind.to_owned(),
        name: name.to_owned(),
        reason: get(ExceptionField::Reason),
        risk: get(ExceptionField::Risk),
        scope: get(ExceptionField::Scope),
        rollback: get(ExceptionField::Rollback),
        expires,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_796_300_000; // 2026-12-03T...

    fn text(expires: &str) -> String {
        format!(
            "reason=CVE fix; risk=low, image only; scope=vllm image; rollback=rollout undo; expires={expires}"
        )
    }

    fn at(secs: i64) -> String {
        super::super::common::rfc3339(secs)
    }

    #[test]
    fn a_complete_exception_within_24h_is_accepted() {
        let e = parse_exception("Deployment", "vllm", &text(&at(NOW + 3600)), NOW).unwrap();
        assert_eq!(e.reason, "CVE fix");
        assert_eq!(e.risk, "low, image only");
        assert_eq!(e.scope, "vllm image");
        assert_eq!(e.rollback, "rollout undo");
        assert_eq!(e.expires, at(NOW + 3600));
        assert_eq!((e.kind.as_str(), e.name.as_str()), ("Deployment", "vllm"));
        // The edge: exactly 24 h ahead is allowed, a second more is not.
        assert!(parse_exception("D", "x", &text(&at(NOW + 86_400)), NOW).is_ok());
        assert_eq!(
            parse_exception("D", "x", &text(&at(NOW + 86_401)), NOW),
            Err(ExceptionProblem::TooFarAhead)
        );
    }

    #[test]
    fn each_missing_or_empty_field_is_named() {
        for f in ExceptionField::ALL {
            let t = text(&at(NOW + 60));
            let without: Vec<&str> = t
                .split("; ")
                .filter(|p| !p.starts_with(&format!("{}=", f.as_str())))
                .collect();
            assert_eq!(
                parse_exception("D", "x", &without.join("; "), NOW),
                Err(ExceptionProblem::Missing(vec![f])),
                "{f:?} absent"
            );
            let empty = t.replace(&format!("{}=", f.as_str()), &format!("{}= ;x=", f.as_str()));
            assert!(
                matches!(parse_exception("D", "x", &empty, NOW), Err(ExceptionProblem::Missing(m)) if m == vec![f]),
                "{f:?} empty: {empty}"
            );
        }
        assert_eq!(
            parse_exception("D", "x", "", NOW),
            Err(ExceptionProblem::Missing(ExceptionField::ALL.to_vec()))
        );
        // A key with spaces around `=` is not the key.
        assert!(
            parse_exception(
                "D",
                "x",
                &text(&at(NOW + 60)).replace("risk=", "risk ="),
                NOW
            )
            .is_err()
        );
    }

    #[test]
    fn expires_must_be_rfc3339_and_in_the_future() {
        for bad in [
            "tomorrow",
            "2026-12-03",
            "2026-12-03 18:00:00Z",
            "2026-12-03T18:00:00",
            "1796300060",
        ] {
            assert_eq!(
                parse_exception("D", "x", &text(bad), NOW),
                Err(ExceptionProblem::ExpiresNotRfc3339),
                "{bad}"
            );
        }
        assert_eq!(
            parse_exception("D", "x", &text(&at(NOW)), NOW),
            Err(ExceptionProblem::Expired)
        );
        assert_eq!(
            parse_exception("D", "x", &text(&at(NOW - 60)), NOW),
            Err(ExceptionProblem::Expired)
        );
    }

    #[test]
    fn the_rfc3339_shape_takes_fractions_and_offsets() {
        for good in [
            "2026-12-03T18:00:00Z",
            "2026-12-03T18:00:00.5Z",
            "2026-12-03T18:00:00+01:00",
            "2026-12-03T18:00:00.123-05:30",
        ] {
            assert!(rfc3339_shape(good), "{good}");
        }
        for bad in [
            "2026-12-03T18:00:00.Z",
            "2026-12-03T18:00:00+0100",
            "2026-12-03T18:00:00Zx",
            "2026-12-3T18:00:00Z",
            "",
        ] {
            assert!(!rfc3339_shape(bad), "{bad}");
        }
    }

    #[test]
    fn the_freeze_follows_the_worst_band() {
        assert_eq!(FreezeState::of(Band::Routine), FreezeState::Open);
        assert_eq!(FreezeState::of(Band::Cautious), FreezeState::Open);
        assert_eq!(FreezeState::of(Band::Restricted), FreezeState::Rollouts);
        assert_eq!(FreezeState::of(Band::Exhausted), FreezeState::Everything);
    }
}
