//! Why a request gets no lane from its identity, and what the client is
//! told: a pure mapping to 401 (with `WWW-Authenticate`), 403 (naming the
//! lane asked for, never which lanes exist), 400 or 503. None of them has
//! cost a token: the admission core is not called.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;

use super::super::respond;

/// Why a request was refused before admission, by its identity (the
/// metric's `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AuthRefusal {
    /// No credential at all.
    NoCredential,
    /// A key that no watched Secret and no credentials-file entry holds.
    UnknownApiKey,
    /// A ServiceAccount token the API server does not accept for the
    /// gateway's audience, or one of a ServiceAccount no lane lists.
    RejectedToken,
    /// A JWT whose signature, issuer, audience, times or subject failed.
    InvalidJwt,
    /// A client certificate whose names no lane lists.
    UnknownCertificate,
    /// An identity asking for a lane it may not use (or that does not
    /// exist).
    LaneNotAllowed,
    /// An identity of several lanes that named none.
    LaneNotNamed,
    /// The identity could not be checked (API server or JWKS unreachable).
    Unavailable,
}

impl AuthRefusal {
    /// Every reason, for the metric.
    pub(crate) const ALL: [AuthRefusal; 8] = [
        AuthRefusal::NoCredential,
        AuthRefusal::UnknownApiKey,
        AuthRefusal::RejectedToken,
        AuthRefusal::InvalidJwt,
        AuthRefusal::UnknownCertificate,
        AuthRefusal::LaneNotAllowed,
        AuthRefusal::LaneNotNamed,
        AuthRefusal::Unavailable,
    ];

    /// The name in metrics.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AuthRefusal::NoCredential => "no_credential",
            AuthRefusal::UnknownApiKey => "unknown_api_key",
            AuthRefusal::RejectedToken => "rejected_token",
            AuthRefusal::InvalidJwt => "invalid_jwt",
            AuthRefusal::UnknownCertificate => "unknown_certificate",
            AuthRefusal::LaneNotAllowed => "lane_not_allowed",
            AuthRefusal::LaneNotNamed => "lane_not_named",
            AuthRefusal::Unavailable => "identity_unavailable",
        }
    }
}

/// How much of the asked lane a 403 repeats.
const LANE_ECHO: usize = 64;

fn quoted(v: &str) -> String {
    if v.len() <= LANE_ECHO {
        return format!("{v:?}");
    }
    let mut end = LANE_ECHO;
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &v[..end], v.len())
}

fn unauthorized(challenge: &'static str, code: &'static str, message: String) -> Response {
    let mut r = respond::error(
        StatusCode::UNAUTHORIZED,
        "authentication_error",
        code,
        message,
    );
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    r
}

/// The answer to a refusal; `lane` is the lane header's value.
pub(crate) fn answer(why: AuthRefusal, lane_header: &str, lane: Option<&str>) -> Response {
    match why {
        AuthRefusal::NoCredential => unauthorized(
            r#"Bearer realm="lanekeeper""#,
            "missing_credential",
            "this gateway needs a credential: an API key or token as `Authorization: Bearer ...`, or a client certificate".to_owned(),
        ),
        AuthRefusal::UnknownApiKey
        | AuthRefusal::RejectedToken
        | AuthRefusal::InvalidJwt
        | AuthRefusal::UnknownCertificate => unauthorized(
            r#"Bearer realm="lanekeeper", error="invalid_token""#,
            "invalid_credential",
            "the credential is not valid here".to_owned(),
        ),
        AuthRefusal::LaneNotAllowed => respond::error(
            StatusCode::FORBIDDEN,
            "permission_error",
            "lane_not_allowed",
            match lane {
                Some(l) => format!("this identity may not send into lane {}", quoted(l)),
                None => "this identity may not send into any lane".to_owned(),
            },
        ),
        AuthRefusal::LaneNotNamed => respond::error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "lane_required",
            format!("this identity may use several lanes: name one in the {lane_header} header"),
        ),
        AuthRefusal::Unavailable => {
            let mut r = respond::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "lanekeeper_unavailable",
                "identity_unavailable",
                "the credential could not be checked now (see the gateway's log); try again".to_owned(),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(r: Response) -> serde_json::Value {
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn no_credential_is_a_401_with_a_bearer_challenge() {
        let r = answer(AuthRefusal::NoCredential, "x-lanekeeper-lane", Some("p1"));
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            r.headers()[header::WWW_AUTHENTICATE],
            r#"Bearer realm="lanekeeper""#
        );
        assert_eq!(body(r).await["error"]["code"], "missing_credential");
        for bad in [
            AuthRefusal::UnknownApiKey,
            AuthRefusal::RejectedToken,
            AuthRefusal::InvalidJwt,
            AuthRefusal::UnknownCertificate,
        ] {
            let r = answer(bad, "x-lanekeeper-lane", None);
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
            assert!(
                r.headers()[header::WWW_AUTHENTICATE]
                    .to_str()
                    .unwrap()
                    .contains("invalid_token")
            );
            assert_eq!(
                body(r).await["error"]["code"],
                "invalid_credential",
                "{bad:?}: the same answer for each kind"
            );
        }
    }

    #[tokio::test]
    async fn a_lane_not_allowed_is_a_403_naming_only_the_asked_lane_cut_short() {
        let r = answer(
            AuthRefusal::LaneNotAllowed,
            "x-lanekeeper-lane",
            Some("p0-disruption-assist"),
        );
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        let b = body(r).await;
        assert_eq!(b["error"]["code"], "lane_not_allowed");
        assert_eq!(
            b["error"]["message"],
            "this identity may not send into lane \"p0-disruption-assist\""
        );
        let huge = "p".repeat(420_000);
        let msg =
            body(answer(AuthRefusal::LaneNotAllowed, "h", Some(&huge))).await["error"]["message"]
                .as_str()
                .unwrap()
                .to_owned();
        assert!(msg.len() < 200 && msg.ends_with("(420000 bytes)"), "{msg}");
    }

    #[tokio::test]
    async fn an_unchecked_identity_is_a_503_to_retry() {
        let r = answer(AuthRefusal::Unavailable, "h", None);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r = answer(AuthRefusal::LaneNotNamed, "x-lanekeeper-lane", None);
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert!(
            body(r).await["error"]["message"]
                .as_str()
                .unwrap()
                .contains("x-lanekeeper-lane")
        );
    }
}
