//! Who may send into a lane: the `clients` of a lane in `lanes.json`, as
//! the controller copies them from the LaneContract's `spec.clients`. Each
//! rule names one kind of identity and the tenant its requests are counted
//! as. The gateway resolves the identities (Secrets, TokenReview, JWKS);
//! this crate only carries and checks the rules.

use serde::{Deserialize, Serialize};

use crate::config::LaneConfig;
use crate::validate::ConfigError;

/// One identity allowed into a lane, and its tenant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", try_from = "RawRule")]
pub struct ClientRule {
    /// The identity, one kind per rule.
    #[serde(flatten)]
    pub identity: ClientIdentity,
    /// The tenant the identity's requests are counted as (absent: see
    /// [`ClientRule::tenant_claim`], else the identity's own name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// For a JWT: the claim whose (string) value is the tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_claim: Option<String>,
}

/// A rule as written: exactly one kind, nothing unknown.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawRule {
    api_keys: Option<ApiKeySecret>,
    service_account: Option<ServiceAccountName>,
    jwt: Option<JwtIssuer>,
    certificate: Option<CertificateName>,
    tenant: Option<String>,
    tenant_claim: Option<String>,
}

impl TryFrom<RawRule> for ClientRule {
    type Error = &'static str;

    fn try_from(r: RawRule) -> Result<ClientRule, &'static str> {
        let mut kinds = [
            r.api_keys.map(ClientIdentity::ApiKeys),
            r.service_account.map(ClientIdentity::ServiceAccount),
            r.jwt.map(ClientIdentity::Jwt),
            r.certificate.map(ClientIdentity::Certificate),
        ]
        .into_iter()
        .flatten();
        let (Some(identity), None) = (kinds.next(), kinds.next()) else {
            return Err(
                "a client rule names exactly one of apiKeys, serviceAccount, jwt and certificate",
            );
        };
        Ok(ClientRule {
            identity,
            tenant: r.tenant,
            tenant_claim: r.tenant_claim,
        })
    }
}

/// The kinds of identity a rule can name (one key per rule in the JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ClientIdentity {
    /// Every value of a Secret is an API key.
    ApiKeys(ApiKeySecret),
    /// A Kubernetes ServiceAccount, proved by a token the API server
    /// accepts (TokenReview).
    ServiceAccount(ServiceAccountName),
    /// A JWT signed by an OIDC issuer.
    Jwt(JwtIssuer),
    /// A verified client certificate (mTLS) carrying this name.
    Certificate(CertificateName),
}

/// A Secret whose data values are API keys.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeySecret {
    /// The Secret's namespace (the lane's).
    pub namespace: String,
    /// The Secret's name.
    pub secret: String,
}

/// A ServiceAccount.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountName {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// An OIDC issuer's tokens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JwtIssuer {
    /// The `iss` the token must carry.
    pub issuer: String,
    /// The `aud` the token must carry.
    pub audience: String,
    /// Where the issuer's signing keys are.
    pub jwks: JwksSource,
    /// Only tokens with this `sub` (absent: any subject).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
}

/// Where a JWKS is read from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum JwksSource {
    /// Fetched over HTTP(S).
    Url(String),
    /// A ConfigMap key (air-gapped clusters).
    ConfigMap(ConfigMapKey),
}

/// A key of a ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKey {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The key holding the JWKS document.
    pub key: String,
}

/// A certificate name: the subject's common name or a DNS or URI subject
/// alternative name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateName {
    /// The name, exactly as written in the certificate.
    pub name: String,
}

impl ClientRule {
    fn names(&self) -> Vec<(&'static str, &str)> {
        match &self.identity {
            ClientIdentity::ApiKeys(s) => vec![
                ("clients[].apiKeys.namespace", &s.namespace),
                ("clients[].apiKeys.secret", &s.secret),
            ],
            ClientIdentity::ServiceAccount(s) => vec![
                ("clients[].serviceAccount.namespace", &s.namespace),
                ("clients[].serviceAccount.name", &s.name),
            ],
            ClientIdentity::Jwt(j) => vec![
                ("clients[].jwt.issuer", &j.issuer),
                ("clients[].jwt.audience", &j.audience),
            ],
            ClientIdentity::Certificate(c) => vec![("clients[].certificate.name", &c.name)],
        }
    }
}

/// A lane's rules: names not empty, a tenant given at most one way, a
/// tenant claim only for a JWT.
pub(crate) fn check_clients(l: &LaneConfig) -> Result<(), ConfigError> {
    let bad = |field: &'static str, value: &str, expected: &'static str| ConfigError::Field {
        lane: l.name.clone(),
        field,
        value: format!("{value:?}"),
        expected,
    };
    for r in &l.clients {
        for (field, v) in r.names() {
            if v.trim().is_empty() {
                return Err(bad(field, v, "must not be empty"));
            }
        }
        if let Some(t) = r.tenant.as_deref().filter(|t| t.trim().is_empty()) {
            return Err(bad("clients[].tenant", t, "must not be empty"));
        }
        if let Some(c) = &r.tenant_claim {
            if r.tenant.is_some() {
                return Err(bad(
                    "clients[].tenantClaim",
                    c,
                    "must not be given with tenant",
                ));
            }
            if !matches!(r.identity, ClientIdentity::Jwt(_)) {
                return Err(bad("clients[].tenantClaim", c, "is for jwt clients only"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_reads_and_writes_as_one_key() {
        let text = r#"[
            {"apiKeys": {"namespace": "ns", "secret": "keys"}, "tenant": "team-a"},
            {"serviceAccount": {"namespace": "ns", "name": "bot"}},
            {"jwt": {"issuer": "https://idp", "audience": "lk", "jwks": {"url": "https://idp/jwks"}}, "tenantClaim": "team"},
            {"jwt": {"issuer": "https://idp", "audience": "lk", "jwks": {"configMap": {"namespace": "ns", "name": "jwks", "key": "jwks.json"}}, "subject": "svc"}},
            {"certificate": {"name": "spiffe://cluster/ns/bot"}}
        ]"#;
        let rules: Vec<ClientRule> = serde_json::from_str(text).unwrap();
        assert_eq!(rules.len(), 5);
        assert_eq!(
            rules[0].identity,
            ClientIdentity::ApiKeys(ApiKeySecret {
                namespace: "ns".into(),
                secret: "keys".into()
            })
        );
        assert_eq!(rules[2].tenant_claim.as_deref(), Some("team"));
        let again: Vec<ClientRule> =
            serde_json::from_str(&serde_json::to_string(&rules).unwrap()).unwrap();
        assert_eq!(again, rules);
        let v = serde_json::to_value(&rules[1]).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"serviceAccount": {"namespace": "ns", "name": "bot"}})
        );
    }

    #[test]
    fn an_unknown_kind_or_two_kinds_do_not_parse() {
        for bad in [
            r#"{"password": {"name": "x"}}"#,
            r#"{"tenant": "a"}"#,
            r#"{"certificate": {"name": "a"}, "serviceAccount": {"namespace": "n", "name": "b"}}"#,
        ] {
            assert!(
                serde_json::from_str::<ClientRule>(bad).is_err(),
                "{bad} parsed"
            );
        }
    }

    fn example_with(rule: serde_json::Value) -> Result<crate::GatewayConfig, ConfigError> {
        let text = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/inc-47/lanes-420.json"
        ))
        .unwrap();
        let mut v: serde_json::Value = serde_json::from_slice(&text).unwrap();
        v["lanes"][0]["clients"] = serde_json::json!([rule]);
        crate::GatewayConfig::from_json(&serde_json::to_vec(&v).unwrap())
    }

    #[test]
    fn a_rule_with_an_empty_name_or_a_tenant_given_twice_is_refused() {
        let sa = serde_json::json!({"namespace": "ns", "name": "bot"});
        assert!(example_with(serde_json::json!({"serviceAccount": sa, "tenant": "t"})).is_ok());
        for (rule, field) in [
            (
                serde_json::json!({"serviceAccount": {"namespace": "", "name": "bot"}}),
                "clients[].serviceAccount.namespace",
            ),
            (
                serde_json::json!({"serviceAccount": sa, "tenant": " "}),
                "clients[].tenant",
            ),
            (
                serde_json::json!({"serviceAccount": sa, "tenantClaim": "team"}),
                "clients[].tenantClaim",
            ),
            (
                serde_json::json!({"jwt": {"issuer": "i", "audience": "a", "jwks": {"url": "u"}}, "tenant": "t", "tenantClaim": "team"}),
                "clients[].tenantClaim",
            ),
        ] {
            match example_with(rule.clone()) {
                Err(ConfigError::Field { field: f, .. }) => assert_eq!(f, field, "{rule}"),
                other => panic!("{rule}: {other:?}"),
            }
        }
    }
}
