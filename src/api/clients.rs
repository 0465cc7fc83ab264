//! `LaneContract.spec.clients`: who may send requests into a lane, and the
//! tenant each identity is counted as. The gateway resolves and checks the
//! identities; the API server checks the shape (one identity kind per
//! entry, a tenant given at most one way).

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// One identity allowed into the lane: exactly one of `apiKeys`,
/// `serviceAccount`, `jwt` and `certificate`, with the tenant its requests
/// are counted as.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.apiKeys) ? 1 : 0) + (has(self.serviceAccount) ? 1 : 0) + (has(self.jwt) ? 1 : 0) + (has(self.certificate) ? 1 : 0) == 1").message("a client names exactly one of apiKeys, serviceAccount, jwt and certificate"))]
#[x_kube(validation = Rule::new("!has(self.tenantClaim) || has(self.jwt)").message("tenantClaim is for jwt clients only").field_path(".tenantClaim"))]
#[x_kube(validation = Rule::new("!has(self.tenantClaim) || !has(self.tenant)").message("give tenant or tenantClaim, not both").field_path(".tenantClaim"))]
pub struct LaneClient {
    /// API keys: every data value of a Secret in the lane's namespace is a
    /// key, sent as `Authorization: Bearer <key>` (or in the gateway's
    /// `--api-key-header`). The gateway keeps only their SHA-256 hashes and
    /// follows changes to the Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_keys: Option<ApiKeysRef>,
    /// A Kubernetes ServiceAccount: its token (with the gateway's audience,
    /// `--token-audience`) as `Authorization: Bearer <token>`, checked with
    /// a TokenReview.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<ServiceAccountRef>,
    /// JWTs from an OIDC issuer, as `Authorization: Bearer <jwt>`: signature
    /// checked against the issuer's JWKS, `iss`, `aud`, `exp` and `nbf`
    /// checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt: Option<JwtClient>,
    /// A client certificate (mTLS) verified by the gateway's TLS listener,
    /// with this name as its subject's common name or a DNS or URI subject
    /// alternative name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<CertificateClient>,
    /// The tenant this identity's requests are counted as, for fair
    /// queueing inside the lane. Absent: the JWT's `tenantClaim`, else the
    /// identity's own name (the Secret's data key, `namespace/name` of the
    /// ServiceAccount, the JWT's `sub`, the certificate name). The client's
    /// tenant header is never used for an authenticated request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self != ''").message("tenant must not be empty"))]
    pub tenant: Option<String>,
    /// For `jwt`: the claim whose string value is the tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self != ''").message("tenantClaim must not be empty"))]
    pub tenant_claim: Option<String>,
}

/// A Secret of API keys, in the lane's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeysRef {
    /// Name of the Secret; each of its data values is one key (surrounding
    /// whitespace ignored; a value shorter than 16 bytes is not a key).
    #[x_kube(validation = Rule::new("self != ''").message("secretName must not be empty"))]
    pub secret_name: String,
}

/// A ServiceAccount, by namespace and name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountRef {
    /// Namespace of the ServiceAccount (absent: the lane's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self != ''").message("namespace must not be empty"))]
    pub namespace: Option<String>,
    /// Name of the ServiceAccount.
    #[x_kube(validation = Rule::new("self != ''").message("name must not be empty"))]
    pub name: String,
}

/// An OIDC issuer whose tokens are accepted.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.jwksUrl) != has(self.jwksConfigMapKeyRef)").message("jwt needs exactly one of jwksUrl and jwksConfigMapKeyRef"))]
pub struct JwtClient {
    /// The issuer, exactly as in the tokens' `iss` claim.
    #[x_kube(validation = Rule::new("self != ''").message("issuer must not be empty"))]
    pub issuer: String,
    /// The audience the tokens must carry in `aud`.
    #[x_kube(validation = Rule::new("self != ''").message("audience must not be empty"))]
    pub audience: String,
    /// The issuer's JWKS (its `jwks_uri`), an `https://` URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('https://')").message("jwksUrl must be an https:// URL"))]
    pub jwks_url: Option<String>,
    /// The issuer's JWKS document in a ConfigMap key of the lane's
    /// namespace, for clusters that cannot reach the issuer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_config_map_key_ref: Option<super::profile::KeyRef>,
    /// Only tokens with this `sub` (absent: any subject of the issuer with
    /// the audience).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self != ''").message("subject must not be empty"))]
    pub subject: Option<String>,
}

/// A client certificate name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CertificateClient {
    /// The name, exactly as in the certificate: its subject's common name,
    /// or one of its DNS or URI subject alternative names.
    #[x_kube(validation = Rule::new("self != ''").message("name must not be empty"))]
    pub name: String,
}
