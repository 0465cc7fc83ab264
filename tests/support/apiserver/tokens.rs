//! ServiceAccount tokens as the API server issues and reviews them: signed
//! with the double's own key (Ed25519, made at start), the key served as
//! the cluster's ServiceAccount key set at `/openid/v1/jwks` (issuer
//! discovery), and checked by `POST
//! /apis/authentication.k8s.io/v1/tokenreviews`: the signature, `exp` (no
//! leeway) and the audiences asked for.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{Map, Value, json};

/// The issuer of the double's tokens.
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The API server's own audience (a review that asks for none).
const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// The double's ServiceAccount token key.
pub(crate) struct Signer {
    pkcs8: Vec<u8>,
    public: Vec<u8>,
    pub(crate) kid: String,
}

impl Signer {
    pub(crate) fn new() -> Signer {
        let rng = ring::rand::SystemRandom::new();
        let doc = Ed25519KeyPair::generate_pkcs8(&rng).expect("an Ed25519 key");
        let pair = Ed25519KeyPair::from_pkcs8(doc.as_ref()).expect("the key just made");
        let public = pair.public_key().as_ref().to_vec();
        let kid = URL_SAFE_NO_PAD.encode(&public[..8]);
        Signer {
            pkcs8: doc.as_ref().to_vec(),
            public,
            kid,
        }
    }

    /// The key set as `/openid/v1/jwks` serves it.
    pub(crate) fn jwks(&self) -> Value {
        json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "use": "sig", "alg": "EdDSA",
                         "kid": self.kid, "x": URL_SAFE_NO_PAD.encode(&self.public)}]})
    }

    /// A token of `namespace/name` for `audiences`, valid for `ttl`.
    pub(crate) fn issue(
        &self,
        namespace: &str,
        name: &str,
        audiences: &[&str],
        ttl: Duration,
    ) -> String {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let claims = json!({
            "iss": ISSUER,
            "sub": format!("system:serviceaccount:{namespace}:{name}"),
            "aud": audiences,
            "iat": now.as_secs(),
            "nbf": now.as_secs(),
            "exp": (now + ttl).as_secs(),
            "jti": format!("{:x}", now.as_nanos()),
        });
        let mut h = Header::new(Algorithm::EdDSA);
        h.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&h, &claims, &EncodingKey::from_ed_der(&self.pkcs8))
            .expect("a signed token")
    }

    /// The answer to a TokenReview (its body as posted).
    pub(crate) fn review(&self, body: &Value) -> Value {
        let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
        let token = spec
            .get("token")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let asked: Vec<String> = match spec.get("audiences").and_then(Value::as_array) {
            Some(a) if !a.is_empty() => a
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            _ => vec![API_AUDIENCE.to_owned()],
        };
        let status = match self.check(token, &asked) {
            Ok((user, audiences)) => json!({
                "authenticated": true,
                "user": {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]},
                "audiences": audiences,
            }),
            Err(e) => json!({"authenticated": false, "error": e}),
        };
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
               "metadata": {"creationTimestamp": null}, "spec": spec, "status": status})
    }

    /// The user and the audiences (of those asked) a token is valid for.
    fn check(&self, token: &str, asked: &[String]) -> Result<(String, Vec<String>), String> {
        let mut v = Validation::new(Algorithm::EdDSA);
        v.leeway = 0;
        v.validate_aud = false;
        v.set_issuer(&[ISSUER]);
        v.set_required_spec_claims(&["exp", "iss", "sub"]);
        let key = DecodingKey::from_ed_der(&self.public);
        let claims = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &v)
            .map_err(|e| format!("invalid bearer token: {e}"))?
            .claims;
        let aud: Vec<String> = match claims.get("aud") {
            Some(Value::String(a)) => vec![a.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        };
        let audiences: Vec<String> = asked.iter().filter(|a| aud.contains(a)).cloned().collect();
        if audiences.is_empty() {
            return Err("token audiences do not intersect the audiences asked for".to_owned());
        }
        let user = claims
            .get("sub")
            .and_then(Value::as_str)
            .unwrap_or_default();
        Ok((user.to_owned(), audiences))
    }
}
