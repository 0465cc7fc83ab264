//! JWTs from an OIDC issuer: the signature checked against the issuer's
//! JWKS (asymmetric keys only), then `iss`, `aud`, `exp` and `nbf`, by
//! jsonwebtoken. The key sets themselves are fetched and kept by `jwks`.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{DecodingKey, Validation, decode, decode_header};
use lanes::JwtIssuer;
use serde_json::{Map, Value};

/// Clock skew allowed on `exp` and `nbf`, in seconds.
const LEEWAY_SECONDS: u64 = 30;

/// A token's claims, before any check: only to pick the rules to check it
/// against (the issuer, the ServiceAccount it claims to be).
pub(super) fn unverified_claims(token: &str) -> Option<Map<String, Value>> {
    let mut parts = token.split('.');
    let (_, payload, _, None) = (parts.next()?, parts.next()?, parts.next()?, parts.next()) else {
        return None;
    };
    let bytes = URL_SAFE_NO_PAD.decode(payload).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Why a token is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum JwtRefusal {
    /// No key of the set has the token's key id (or fits its algorithm).
    UnknownKey,
    /// The check failed: signature, issuer, audience, time, subject.
    Invalid(String),
}

/// What a token must carry besides a good signature.
pub(super) struct Expect<'a> {
    /// Its `iss`; `None`: any (the cluster's own ServiceAccount keys sign
    /// only the cluster's tokens).
    pub(super) issuer: Option<&'a str>,
    /// One of its `aud`.
    pub(super) audience: &'a str,
}

/// Checks a token against one rule with its issuer's key set: the claims
/// when it passes.
pub(super) fn verify(
    token: &str,
    rule: &JwtIssuer,
    keys: &JwkSet,
) -> Result<Map<String, Value>, JwtRefusal> {
    let expect = Expect {
        issuer: Some(rule.issuer.as_str()),
        audience: rule.audience.as_str(),
    };
    subject_matches(rule, verify_signed(token, keys, &expect)?)
}

/// Checks a token's signature against a key set, then its audience, `exp`
/// (required), `nbf` and, when expected, its issuer: the claims when it
/// passes.
pub(super) fn verify_signed(
    token: &str,
    keys: &JwkSet,
    expect: &Expect<'_>,
) -> Result<Map<String, Value>, JwtRefusal> {
    let header = decode_header(token).map_err(|e| JwtRefusal::Invalid(e.to_string()))?;
    let candidates = keys
        .keys
        .iter()
        .filter(|k| header.kid.is_none() || k.common.key_id.as_deref() == header.kid.as_deref());
    let mut last = JwtRefusal::UnknownKey;
    for jwk in candidates {
        // Symmetric keys never: a public key set must not become an HMAC
        // secret (algorithm confusion).
        if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
            continue;
        }
        if jwk
            .common
            .key_algorithm
            .is_some_and(|a| format!("{a:?}") != format!("{:?}", header.alg))
        {
            continue;
        }
        let Ok(key) = DecodingKey::from_jwk(jwk) else {
            continue;
        };
        match decode::<Map<String, Value>>(token, &key, &validation(header.alg, expect)) {
            Ok(data) => return Ok(data.claims),
            Err(e) => last = JwtRefusal::Invalid(e.to_string()),
        }
    }
    Err(last)
}

fn validation(alg: jsonwebtoken::Algorithm, expect: &Expect<'_>) -> Validation {
    let mut v = Validation::new(alg);
    v.leeway = LEEWAY_SECONDS;
    v.validate_nbf = true;
    v.set_audience(&[expect.audience]);
    match expect.issuer {
        Some(iss) => {
            v.set_issuer(&[iss]);
            v.set_required_spec_claims(&["exp", "iss", "aud"]);
        }
        None => v.set_required_spec_claims(&["exp", "aud"]),
    }
    v
}

/// A verified token's `exp`, in seconds since the epoch.
pub(super) fn expiry(claims: &Map<String, Value>) -> Option<u64> {
    claims
        .get("exp")
        .and_then(|v| v.as_u64().or_else(|| v.as_f64().map(|f| f.max(0.0) as u64)))
}

fn subject_matches(
    rule: &JwtIssuer,
    claims: Map<String, Value>,
) -> Result<Map<String, Value>, JwtRefusal> {
    match &rule.subject {
        Some(s) if claims.get("sub").and_then(Value::as_str) != Some(s.as_str()) => Err(
            JwtRefusal::Invalid("the subject is not the rule's".to_owned()),
        ),
        _ => Ok(claims),
    }
}
